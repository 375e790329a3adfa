"""Process-wide settings every kvtop command runs with."""

from __future__ import annotations

import subprocess
import sys

from kvtop.runtime import GEN0_THRESHOLD

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
