"""The load and the figures it drives (kvtop/baseline/matched_load.py): arrivals per minute
where both runs kept them (else tokens/s), the range both runs covered, the minutes in it,
and what follows the load when there are too few."""

from __future__ import annotations

import pytest

from kvtop.baseline import matched_load as matching
from kvtop.baseline.figures import SPECS
from kvtop.baseline.judge import judge
from kvtop.baseline.model import EngineSummary, Figure

KV = SPECS["kv_usage"]


def engine(load: list[float], kv: list[float], *, arrivals: bool = True) -> EngineSummary:
    minutes = tuple(range(len(load)))
    figures = {"kv_usage": Figure(sum(kv) / len(kv), tuple(kv))}
    index = {"kv_usage": minutes}
    if arrivals:
        figures["arrivals_per_s"] = Figure(sum(load) / len(load), tuple(load))
        index["arrivals_per_s"] = minutes
    else:  # tokens only: the prompt carries the load, generation a tenth of it
        figures["prompt_tps"] = Figure(None, tuple(v * 1000 for v in load))
        figures["generation_tps"] = Figure(None, tuple(v * 100 for v in load))
        index["prompt_tps"] = index["generation_tps"] = minutes
    return EngineSummary("m", "0", figures=figures, minute_index=index)


def compared(base: EngineSummary, now: EngineSummary) -> tuple[object, object]:
    spec = matching.load_spec(base, now)
    base_load, now_load = matching.load_per_minute(base, spec), matching.load_per_minute(now,
                                                                                          spec)
    load = judge(spec, matching.load_figure(base_load), matching.load_figure(now_load))
    window = matching.common_range(base_load, now_load)
    return load, matching.at_matched_load(KV, base, now, base_load, now_load, window,
                                          load, 0.01)


def wobble(level: float, n: int, step: float) -> list[float]:
    return [level + step * ((i % 5) - 2) for i in range(n)]


def test_arrivals_are_the_load_where_both_runs_have_them() -> None:
    base, now = engine([1.0] * 6, [0.3] * 6), engine([1.0] * 6, [0.3] * 6)
    assert matching.load_spec(base, now) is matching.ARRIVALS
    assert matching.load_spec(base, engine([1.0] * 6, [0.3] * 6, arrivals=False)) is \
        matching.TOKENS
    tokens = engine([1.0, 2.0], [0.3, 0.3], arrivals=False)
    assert matching.load_per_minute(tokens, matching.TOKENS) == {0: 1100.0, 1: 2200.0}


def test_the_range_both_runs_covered() -> None:
    assert matching.common_range({0: 1.0, 1: 3.0}, {0: 2.0, 1: 5.0}) == (2.0, 3.0)
    assert matching.common_range({0: 1.0, 1: 2.0}, {0: 2.0}) == (2.0, 2.0)  # a bound counts
    assert matching.common_range({0: 1.0}, {0: 2.5}) is None
    assert matching.common_range({}, {0: 1.0}) is None


def test_at_matched_load_a_worse_figure_is_worse() -> None:
    """The run is busier, but over the load both saw its pool is fuller: a regression."""
    base = engine(wobble(1.0, 20, 0.1) + wobble(1.5, 20, 0.1), [0.30] * 40)
    now = engine(wobble(1.5, 20, 0.1) + wobble(2.0, 20, 0.1), [0.60] * 40)
    load, kv = compared(base, now)
    assert load.verdict == "higher"  # type: ignore[attr-defined]
    assert kv.verdict == "worse" and kv.matched_load  # type: ignore[attr-defined]
    assert kv.note.startswith("at matched load: 20 and 20 minutes of ")  # type: ignore


def test_at_matched_load_what_only_followed_the_load_is_the_same() -> None:
    base = engine(wobble(1.0, 20, 0.1) + wobble(1.5, 20, 0.1), [0.2] * 20 + [0.4] * 20)
    now = engine(wobble(1.5, 20, 0.1) + wobble(2.0, 20, 0.1), [0.4] * 20 + [0.6] * 20)
    _, kv = compared(base, now)
    assert kv.verdict == "same" and kv.matched_load  # type: ignore[attr-defined]


@pytest.mark.parametrize(("now_load", "verdict", "note"), [
    (3.0, "higher", "follows the load (1.00 -> 3.00 arrivals/s); too few minutes at matched "
                    "load to compare"),
    (0.4, "worse", "higher though the load went down (1.00 -> 0.40 arrivals/s): beyond what "
                   "the load explains"),
])
def test_without_matched_minutes_only_a_move_against_the_load_counts(
        now_load: float, verdict: str, note: str) -> None:
    base = engine(wobble(1.0, 20, 0.05), wobble(0.3, 20, 0.002))
    now = engine(wobble(now_load, 20, 0.05), wobble(0.6, 20, 0.002))
    load, kv = compared(base, now)
    assert load.verdict in ("higher", "lower")  # type: ignore[attr-defined]
    assert (kv.verdict, kv.note, kv.matched_load) == (verdict, note, False)  # type: ignore


def test_two_minutes_a_side_at_matched_load_are_too_few() -> None:
    base = engine([*wobble(1.0, 20, 0.05), 1.5, 1.5], [0.3] * 20 + [0.31, 0.31])
    now = engine([1.5, 1.5, *wobble(3.0, 20, 0.05)], [0.6] * 22)
    _, kv = compared(base, now)
    assert not kv.matched_load and kv.verdict == "higher"  # type: ignore[attr-defined]


def test_a_figure_without_minutes_is_not_matched() -> None:
    figure = Figure(0.5, (0.5, 0.6))
    assert matching._matched(figure, None, {0: 1.0}, (0.0, 2.0)).values == ()
    assert matching._matched(figure, (0,), {0: 1.0}, (0.0, 2.0)).values == ()  # misaligned
    kept = matching._matched(figure, (0, 1), {0: 1.0, 1: 3.0}, (0.0, 2.0))
    assert kept.values == (0.5,) and kept.value == 0.5


def test_arrivals_need_both_their_values_and_their_minutes() -> None:
    with_arrivals = engine([1.0] * 6, [0.3] * 6)
    no_minutes = engine([1.0] * 6, [0.3] * 6)
    del no_minutes.minute_index["arrivals_per_s"]
    no_values = engine([1.0] * 6, [0.3] * 6)
    no_values.figures["arrivals_per_s"] = Figure(None)
    assert matching.load_spec(with_arrivals, no_minutes) is matching.TOKENS
    assert matching.load_spec(no_values, with_arrivals) is matching.TOKENS


def test_tokens_per_minute_need_both_kinds_lined_up() -> None:
    tokens = engine([1.0, 2.0], [0.3, 0.3], arrivals=False)
    del tokens.minute_index["generation_tps"]
    assert matching.load_per_minute(tokens, matching.TOKENS) == {}
    misaligned = engine([1.0, 2.0], [0.3, 0.3], arrivals=False)
    misaligned.minute_index["prompt_tps"] = (0,)
    assert matching.load_per_minute(misaligned, matching.TOKENS) == {}


def test_no_minutes_of_load_have_no_headline() -> None:
    assert matching.load_figure({}) == Figure(None, ())
    assert matching.load_figure({0: 1.0, 3: 2.0}) == Figure(1.5, (1.0, 2.0))


def test_matched_minutes_take_their_own_mean_and_none_keep_the_headline() -> None:
    figure = Figure(0.9, (0.5, 0.6))
    load = {0: 1.0, 1: 3.0}
    assert matching._matched(figure, (0, 1), load, (0.0, 2.0)) == Figure(0.5, (0.5,))
    assert matching._matched(figure, (0, 1), load, (5.0, 6.0)) == Figure(0.9, ())
    assert matching._matched(figure, (0, 1), load, None) == Figure(0.9, ())


def test_three_minutes_a_side_at_matched_load_are_judged_there() -> None:
    """Exactly MIN_VALUES a side in 1.40-1.50 arrivals/s: judged on them (and too few for
    the rank test to reach p < 0.01)."""
    base = engine([*wobble(1.0, 20, 0.05), 1.4, 1.45, 1.5], [0.3] * 23)
    now = engine([1.4, 1.45, 1.5, *wobble(3.0, 20, 0.05)], [0.3] * 23)
    _, kv = compared(base, now)
    assert kv.matched_load and kv.verdict == "unknown"  # type: ignore[attr-defined]
    assert kv.note == (  # type: ignore[attr-defined]
        "at matched load: 3 and 3 minutes of 1.40-1.50 arrivals/s; could not have seen a "
        "change of 0.03 fraction: these few minutes can never reach the rank test's p < 0.01; "
        "needs about 6 more minutes in this run")


@pytest.mark.parametrize("matched", [True, False])
def test_the_alpha_given_is_the_one_used(matched: bool) -> None:
    """Four minutes a side reach p = 2 / 70 = 0.029: same at alpha 0.05, unknown at 0.01;
    at matched load and, with loads that never meet, on every minute."""
    base = engine([1.0, 1.1, 1.2, 1.3], [0.3] * 4)
    now = engine([1.0, 1.1, 1.2, 1.3] if matched else [5.0] * 4, [0.3] * 4)
    spec = matching.load_spec(base, now)
    base_load, now_load = (matching.load_per_minute(e, spec) for e in (base, now))
    load = judge(spec, matching.load_figure(base_load), matching.load_figure(now_load))
    window = matching.common_range(base_load, now_load)
    kv = matching.at_matched_load(KV, base, now, base_load, now_load, window, load, 0.05)
    assert (kv.verdict, kv.matched_load) == ("same", matched)
    assert kv.note == ("at matched load: 4 and 4 minutes of 1.00-1.30 arrivals/s"
                       if matched else None)


@pytest.mark.parametrize(("base_load", "now_load", "kv_now", "verdict", "note"), [
    (1.0, 3.0, 0.1, "better", "lower though the load went up (1.00 -> 3.00 arrivals/s): "
                              "beyond what the load explains"),
    (3.0, 1.0, 0.1, "lower", "follows the load (3.00 -> 1.00 arrivals/s); too few minutes at "
                             "matched load to compare"),
    (0.0, 3.0, 0.6, "higher", "follows the load (0.00 -> 3.00 arrivals/s); too few minutes at "
                              "matched load to compare"),
    (1.0, 0.0, 0.6, "worse", "higher though the load went down (1.00 -> 0.00 arrivals/s): "
                             "beyond what the load explains"),
])
def test_each_way_the_figure_and_the_load_can_move(base_load: float, now_load: float,
                                                   kv_now: float, verdict: str,
                                                   note: str) -> None:
    base = engine([base_load] * 20, wobble(0.3, 20, 0.002))
    now = engine([now_load] * 20, wobble(kv_now, 20, 0.002))
    _, kv = compared(base, now)
    assert (kv.verdict, kv.note, kv.matched_load) == (verdict, note, False)  # type: ignore


def test_tokens_are_said_in_tokens() -> None:
    base = engine(wobble(1.0, 20, 0.05), wobble(0.3, 20, 0.002), arrivals=False)
    now = engine(wobble(3.0, 20, 0.05), wobble(0.6, 20, 0.002), arrivals=False)
    _, kv = compared(base, now)
    assert kv.note == ("follows the load (1100 -> 3300 tokens/s); too few minutes at "  # type: ignore
                       "matched load to compare")
