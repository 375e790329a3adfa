"""Issue 13's cases on recordings of vLLM 0.33's real scheduler (the twin, level A).

`benchmarks/leak_eval/twin_driver.py` steps vLLM's own Scheduler/KVCacheManager in
simulated time and writes the `/metrics` text of vLLM's PrometheusStatLogger with the
ground truth (blocks used and leaked, running, waiting); each scrape goes through
`CheckRun`, the code of `kvtop check --replay`. The leak is twin/leak.py's: vLLM's own
`KVCacheManager.free` skips finished requests. Each recording takes about a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.derive.worst import CheckRun
from kvtop.exits import EXIT_LEAK, EXIT_STALLED

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "benchmarks" / "leak_eval" / "twin_driver.py"
TARGET = Target.from_spec("http://twin.invalid:8000/metrics")
T0 = 1_767_225_600.0
BLOCKS = 1000  # the twin's pool; vLLM keeps one (the null block) for itself
USABLE = BLOCKS - 1


@dataclass(frozen=True)
class Point:
    """One scrape: what kvtop said, and what the scheduler really held."""

    t: float  # simulated seconds
    leak: LeakVerdict
    stall: StallVerdict
    used: int
    leaked: int
    running: int
    waiting: int


@dataclass
class Run:
    points: list[Point]
    check: CheckRun
    leak_start_s: float | None


def record(python: Path, tmp_path: Path, **spec: Any) -> Run:
    """Drive the twin with `spec` and replay what it exposed through `kvtop check`'s code."""
    spec_path, raw_path = tmp_path / "spec.json", tmp_path / "raw.jsonl"
    spec_path.write_text(json.dumps({"step_s": 0.02, "seed": 1, "blocks": BLOCKS,
                                     "max_num_seqs": 64, "interval_s": 2.0, **spec}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([str(python), str(DRIVER), str(spec_path), str(raw_path)], env=env,
                   check=True, timeout=1800, capture_output=True)
    check, points, leak_start = CheckRun(), [], None
    for text in raw_path.read_text().splitlines():
        line = json.loads(text)
        if "leak_start_s" in line:
            leak_start = line["leak_start_s"]
            continue
        check.feed(read_scrape(Scrape(TARGET, T0 + line["t"], body=line["body"], version="0.33.0")))
        (stats,) = check.trackers[TARGET.url].state.engines
        assert stats.leak is not None and stats.stall is not None
        points.append(Point(line["t"], stats.leak, stats.stall, line["used"], line["leaked"],
                            line["running"], line["waiting"]))
    return Run(points, check, leak_start)


def figures(verdict: LeakVerdict) -> tuple[float | None, ...]:
    return verdict.leaked_blocks, verdict.slope_blocks_per_hour, verdict.hours_to_full


@pytest.fixture(scope="module")
def bursty_leak(twin_interpreter: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    # 40 s bursts, 80 s idle; the leak begins 3 min in and would fill the pool in 30 min.
    return record(twin_interpreter, tmp_path_factory.mktemp("bursty"), rate=3.0,
                  burst_len=40.0, burst_factor=3.0, warmup_s=60.0, duration_s=600.0,
                  leak_fill_h=0.5, leak_at_s=240.0)


@pytest.fixture(scope="module")
def wedge(twin_interpreter: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    # Under steady load every finished request leaks from 60 s on: the pool fills and the
    # scheduler can admit nothing more, the way a leak ends.
    return record(twin_interpreter, tmp_path_factory.mktemp("wedge"), rate=4.0,
                  warmup_s=30.0, duration_s=150.0, leak_fill_h=0.001, leak_at_s=60.0)


def test_leak_figures_only_while_watch_or_leak(bursty_leak: Run) -> None:
    states = {p.leak.state for p in bursty_leak.points}
    assert {"ok", "leak"} <= states, states
    for point in bursty_leak.points:
        if point.leak.state in ("ok", "warmup"):
            assert figures(point.leak) == (None, None, None), (point.t, point.leak)
        else:
            assert point.leak.leaked_blocks is not None, (point.t, point.leak)
    engine = bursty_leak.check.to_json()["targets"][0]["engines"][0]
    assert engine["verdict"] == "leak" and engine["leaked_blocks"] > 0


def test_healthy_before_the_leak_is_ok_with_no_figures(bursty_leak: Run) -> None:
    assert bursty_leak.leak_start_s is not None
    before = [p for p in bursty_leak.points if p.t < bursty_leak.leak_start_s]
    assert any(p.leak.state == "ok" for p in before)
    assert all(p.leak.state in ("ok", "warmup") and figures(p.leak) == (None, None, None)
               for p in before)


def test_first_idle_after_the_leak_never_reads_drained(bursty_leak: Run) -> None:
    # vLLM 0.33's idle floor is 0 (its version says so): blocks held at idle are leaked
    # blocks from the first idle on, never a floor learned from that idle.
    held_idle = [p for p in bursty_leak.points
                 if p.running == 0 and p.waiting == 0 and p.used > 0]
    assert held_idle, "the twin never went idle holding blocks"
    assert all(p.leaked == p.used for p in held_idle)  # only leaked blocks at idle
    for point in held_idle:
        assert "drained" not in point.leak.reason, (point.t, point.leak.reason)
        assert point.leak.reason.startswith(f"{point.used} blocks held"), (
            point.t, point.leak.reason)
    first_gap_end = next(p.t for p in bursty_leak.points
                         if p.t > held_idle[0].t and p.running > 0)
    confirmed = [p for p in held_idle if p.t < first_gap_end and p.leak.state == "leak"]
    assert confirmed, "the first idle holding leaked blocks did not reach LEAK"
    assert confirmed[-1].leak.leaked_blocks == pytest.approx(confirmed[-1].used)


def test_a_wedge_is_stalled_at_once_naming_the_full_pool(wedge: Run) -> None:
    # The wedge: the first scrape from which nothing runs and requests wait, to the end.
    stuck = 0
    for i, point in enumerate(wedge.points):
        if point.running > 0 or point.waiting == 0:
            stuck = i + 1
    assert stuck < len(wedge.points) - 10, "the twin never wedged"
    wedged = wedge.points[stuck]
    assert wedged.used / USABLE >= 0.95
    stalled = next(p for p in wedge.points if p.stall.state == "stalled")
    assert wedged.t <= stalled.t <= wedged.t + 10
    assert "KV pool" in stalled.stall.reason and "waiting" in stalled.stall.reason
    assert all(p.stall.state == "stalled" for p in wedge.points if p.t >= stalled.t)
    document = wedge.check.to_json()
    assert document["stall"] == "stalled"
    expected = EXIT_LEAK if document["verdict"] == "leak" else EXIT_STALLED
    assert wedge.check.exit_code() == expected
