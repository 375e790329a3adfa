"""Process-wide settings every kvtop command runs with."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvtop.runtime import GEN0_THRESHOLD, tune_gc

PROBE = """
import contextlib, gc, io
from kvtop.cli import main
before = gc.get_threshold()[0]
with contextlib.redirect_stdout(io.StringIO()):
    main(["rules"])
print(before, gc.get_threshold()[0], gc.get_freeze_count())
"""


def test_a_command_collects_the_young_generation_less_often() -> None:
    # In a child process: the settings are process-wide, and pytest's own must not change.
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=60, check=True)
    before, after, frozen = (int(word) for word in done.stdout.split())
    assert before < GEN0_THRESHOLD <= after
    assert frozen > 1000  # the modules imported before the command ran


@pytest.fixture
def gc_settings() -> Iterator[None]:
    """The collector's settings put back after a test that changes them in this process."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("gc_settings")
@pytest.mark.parametrize(("gen0", "kept"), [(700, GEN0_THRESHOLD),
                                            (GEN0_THRESHOLD - 1, GEN0_THRESHOLD),
                                            (GEN0_THRESHOLD + 1, GEN0_THRESHOLD + 1)])
def test_the_young_threshold_is_raised_never_lowered(gen0: int, kept: int) -> None:
    gc.set_threshold(gen0, 11, 12)
    gc.unfreeze()
    tune_gc()
    assert gc.get_threshold() == (kept, 11, 12)
    assert gc.get_freeze_count() > 0
