"""The alert command (docs/alerts.md): an argv list run without a shell, the event as JSON
on its stdin, a failing, missing or hanging command reported, rate-limited per engine and
in all."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvtop.alerts import AlertEvent, AlertRunner
from kvtop.config import AlertSettings, ConfigError, load_config
from kvtop.derive.tracker import TargetState
from tests.scenarios.alerts import SHELLISH, TOKEN, copy_stdin_to, leaking_state
from tests.scenarios.app import LEAKING, T0, WEDGED

MISSING_DIR = "/kvtop-no-such-dir"
NO_SUCH_FILE = ": No such file or directory"


def _event(state: TargetState) -> AlertEvent:
    return AlertEvent("leak", "key", state, state.engines[0], T0)


async def test_the_command_reads_the_event_as_json(tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    runner = AlertRunner(AlertSettings(command=copy_stdin_to(out)))
    assert await runner.run(_event(leaking_state())) is None
    document = json.loads(out.read_text())
    assert document == {
        "kvtop_alert": 1, "event": "leak", "at": "2026-01-01T00:00:00+00:00",
        "target": "http://10.0.0.5:8000/metrics", "name": "llama-a", "group": "prod",
        "model": SHELLISH,  # exact, and never through a shell
        "engine": "0", "reason": LEAKING.reason,
        "kv": {"usage": 0.9, "blocks_used": 900, "blocks_total": 1000},
        "requests": {"running": 3, "waiting": 7},
        "leak": {"state": "leak", "reason": LEAKING.reason, "leaked_blocks": 2140.0,
                 "slope_blocks_per_hour": 4200.0, "hours_to_full": 4.3},
        "stall": None,  # no stall verdict yet
    }
    assert TOKEN not in out.read_text()
    assert not Path("/tmp/kvtop-pwned").exists()


def test_a_stall_event_carries_the_stall_verdict_and_its_reason() -> None:
    state = leaking_state()
    stats = replace(state.engines[0], stall=WEDGED)
    document = AlertEvent("stall", "key", state, stats, T0 + 292).document()
    assert (document["event"], document["at"]) == ("stall", "2026-01-01T00:04:52+00:00")
    assert document["reason"] == WEDGED.reason
    assert document["stall"] == {"state": "stalled", "reason": WEDGED.reason, "since_t": T0 + 292}


async def test_a_failing_missing_or_hanging_command_is_reported(tmp_path: Path) -> None:
    event = _event(leaking_state())
    failing = (sys.executable, "-c", "import sys; sys.stderr.write('no route\\n'); sys.exit(3)")
    said = await AlertRunner(AlertSettings(command=failing)).run(event)
    assert said is not None and said.endswith("exit status 3: no route")
    missing = (str(tmp_path / "no-such-program"),)
    said = await AlertRunner(AlertSettings(command=missing)).run(event)
    assert said is not None and "No such file or directory" in said
    hanging = (sys.executable, "-c", "import time; time.sleep(600)")
    said = await AlertRunner(AlertSettings(command=hanging, timeout_s=0.5)).run(event)
    assert said == f"alert command {sys.executable}: no exit after 0.5 s: killed"


async def test_a_failing_commands_last_stderr_line_is_quoted_even_undecodable_or_none() -> None:
    event = _event(leaking_state())
    silent = (sys.executable, "-c", "raise SystemExit(3)")
    said = await AlertRunner(AlertSettings(command=silent)).run(event)
    assert said == f"alert command {sys.executable}: exit status 3"
    garbled = (sys.executable, "-c",
               "import sys; sys.stderr.buffer.write(b'first\\n\\xffbad\\n'); sys.exit(1)")
    said = await AlertRunner(AlertSettings(command=garbled)).run(event)
    assert said == f"alert command {sys.executable}: exit status 1: \ufffdbad"
    wordy = ("sh", "-c", f"printf '%s\\n' {'e' * 250} >&2; exit 1")
    said = await AlertRunner(AlertSettings(command=wordy)).run(event)
    assert said == f"alert command sh: exit status 1: {'e' * 200}"  # its first 200 characters


async def test_what_is_said_is_whole_up_to_300_characters_and_cut_past_them() -> None:
    event = _event(leaking_state())
    name = "p" * (300 - len(f"alert command {MISSING_DIR}/{NO_SUCH_FILE}"))
    said = await AlertRunner(AlertSettings(command=(f"{MISSING_DIR}/{name}",))).run(event)
    assert said == f"alert command {MISSING_DIR}/{name}{NO_SUCH_FILE}" and len(said) == 300
    longer = f"{MISSING_DIR}/{name}p"
    said = await AlertRunner(AlertSettings(command=(longer,))).run(event)
    assert said == f"alert command {longer}{NO_SUCH_FILE}"[:299] + "…"


async def test_what_the_command_prints_never_reaches_kvtops_terminal(
        capfd: pytest.CaptureFixture[str]) -> None:
    chatty = (sys.executable, "-c", "print('\\x1b[2J over the screen')")
    assert await AlertRunner(AlertSettings(command=chatty)).run(_event(leaking_state())) is None
    assert capfd.readouterr().out == ""


def test_rate_limited_per_engine_and_in_all() -> None:
    now = [0.0]
    runner = AlertRunner(AlertSettings(command=("true",), min_interval_s=300,
                                       max_per_minute=3), clock=lambda: now[0])
    state = leaking_state()
    first = _event(state)
    assert runner.due(first)
    assert not runner.due(first)  # the same engine again within min_interval_s
    now[0] = 301.0
    assert runner.due(first)
    others = [replace(first, key=f"k{i}") for i in range(3)]
    assert [runner.due(e) for e in others] == [True, True, False]  # 3 a minute in all
    now[0] = 362.0
    assert runner.due(others[2])
    assert runner.dropped == 2
    assert AlertRunner(AlertSettings()).due(first) is False  # no command configured


def test_an_engine_is_told_again_exactly_min_interval_s_after_its_last_run() -> None:
    now = [200.0]
    runner = AlertRunner(AlertSettings(command=("true",), min_interval_s=300,
                                       max_per_minute=100), clock=lambda: now[0])
    event = _event(leaking_state())
    assert runner.due(event) is True
    for at in (250.0, 499.999):
        now[0] = at
        assert runner.due(event) is False
    now[0] = 500.0
    assert runner.due(event) is True
    assert runner.due(replace(event, kind="stall")) is True  # per engine and verdict
    assert runner.dropped == 2


def test_a_run_counts_against_the_minute_until_exactly_60_s_later() -> None:
    now = [1000.0]
    runner = AlertRunner(AlertSettings(command=("true",), min_interval_s=1,
                                       max_per_minute=2), clock=lambda: now[0])
    a, b, c = (replace(_event(leaking_state()), key=key) for key in "abc")
    assert (runner.due(a), runner.due(b)) == (True, True)
    now[0] = 1059.999
    assert runner.due(c) is False
    now[0] = 1060.0
    assert runner.due(c) is True


def test_alerts_config_is_an_argv_list(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[alerts]\nbell = false\ncommand = ["notify-send", "kvtop"]\n'
                    'min_interval_s = 60\n')
    assert load_config(path).alerts == AlertSettings(bell=False,
                                                      command=("notify-send", "kvtop"),
                                                      min_interval_s=60.0)
    for bad, said in (('command = "notify-send kvtop"', "list of strings"),
                      ("bell = 1", "true or false"),
                      ("min_interval_s = -1", "finite number > 0"),
                      ("colour = 'red'", "unknown key")):
        path.write_text(f"[alerts]\n{bad}\n")
        with pytest.raises(ConfigError, match=said):
            load_config(path)
