"""An engine entering LEAK, and an alert command that copies the event it reads on stdin to a
file: what the alert tests of the module and of the app both start from."""

from __future__ import annotations

import sys
from pathlib import Path

from kvtop.collect.target import Secret, Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from tests.scenarios.app import LEAKING, T0

SHELLISH = "llama; touch /tmp/kvtop-pwned $(id)"  # a model name no shell may ever see


TOKEN = "alert-token-never-shown"


def copy_stdin_to(path: Path) -> tuple[str, ...]:
    """argv of a real program that writes what it reads on stdin to ``path``."""
    code = "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())"
    return (sys.executable, "-c", code, str(path))


def leaking_state() -> TargetState:
    target = Target.from_spec("10.0.0.5:8000", name="llama-a", group="prod",
                              token=Secret(TOKEN))
    stats = EngineStats(SHELLISH, "0", T0, kv_usage=0.9, blocks_total=1000, blocks_used=900,
                        running=3, waiting=7, leak=LEAKING)
    return TargetState(target, "up", kind="vllm", engines=[stats], last_good_t=T0)
