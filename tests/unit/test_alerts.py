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
from tests.scenarios.app import LEAKING, T0


def _event(state: TargetState) -> AlertEvent:
    return AlertEvent("leak", "key", "llama-a", state, state.engines[0], T0)


async def test_the_command_reads_the_event_as_json(tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    runner = AlertRunner(AlertSettings(command=copy_stdin_to(out)))
    assert await runner.run(_event(leaking_state())) is None
    document = json.loads(out.read_text())
    assert document["kvtop_alert"] == 1 and document["event"] == "leak"
    assert document["model"] == SHELLISH  # exact, and never through a shell
    assert (document["name"], document["group"]) == ("llama-a", "prod")
    assert document["reason"] == LEAKING.reason
    assert document["leak"]["state"] == "leak"
    assert document["kv"] == {"usage": 0.9, "blocks_used": 900, "blocks_total": 1000}
    assert document["at"] == "2026-01-01T00:00:00+00:00"
    assert TOKEN not in out.read_text()
    assert not Path("/tmp/kvtop-pwned").exists()


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
    assert said is not None and "killed" in said


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
    assert not AlertRunner(AlertSettings()).due(first)  # no command configured


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
