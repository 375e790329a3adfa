"""The app's pure rules, without running it: its layout classes at the terminal sizes where
they change, and the `+`/`-` steps through the poll intervals. (The app itself is driven
through Pilot in tests/ui/pilot.)"""

from __future__ import annotations

import pytest

from kvtop.ui.app import INTERVALS, layout_classes, next_interval


@pytest.mark.parametrize(("size", "low_bandwidth", "shown"), [
    ((100, 30), False, {"-charts", "compact"}),  # the smallest terminal with charts
    ((99, 30), False, {"-sparks", "compact"}),
    ((100, 29), False, {"-sparks", "compact"}),
    ((200, 60), True, {"-sparks"}),  # --low-bandwidth: never charts
    ((119, 44), False, {"-charts", "compact"}),
    ((120, 44), False, {"-charts"}),
    ((119, 45), False, {"-charts", "compact", "-grid2"}),  # narrow and tall: two by two
    ((120, 45), False, {"-charts"}),
])
def test_the_layout_classes_change_exactly_at_their_sizes(size: tuple[int, int],
                                                          low_bandwidth: bool,
                                                          shown: set[str]) -> None:
    classes = layout_classes(*size, low_bandwidth=low_bandwidth)
    assert {name for name, on in classes.items() if on} == shown
    assert set(classes) == {"compact", "-sparks", "-charts", "-grid2"}  # each set or unset


@pytest.mark.parametrize(("interval_s", "step", "new"), [
    (1.0, 1, 2.0), (1.0, -1, 0.5), (0.25, -1, 0.25), (60.0, 1, 60.0),
    (1.4, 1, 2.0), (1.6, 1, 5.0), (7.0, -1, 2.0),  # from the nearest of the list
])
def test_plus_and_minus_step_through_the_intervals_and_stop_at_the_ends(
        interval_s: float, step: int, new: float) -> None:
    assert next_interval(interval_s, step) == new
    assert new in INTERVALS
