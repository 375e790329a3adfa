"""Pressure: a 120-block pool under 48 concurrent requests; vLLM preempts, usage pins near 1."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.twin.client import (
    SUMMARY,
    Load,
    Metrics,
    kvtop_snapshot,
    only_engine,
    read_metrics,
    wait_until_busy,
    wait_until_idle,
)
from twin.serve import TwinServer

MAX_POLLS = 8


@dataclass
class PressureRun:
    polls: list[dict[str, Any]]  # kvtop's engine, read while loaded
    idle_before: Metrics
    idle: dict[str, Any]
    idle_after: Metrics


@pytest.fixture(scope="module")
def run(twin_pressure: TwinServer) -> PressureRun:
    base = twin_pressure.base_url
    # Each request needs ~10-40 blocks; 32 running want several times the 119 usable.
    load = Load(base, requests=64, concurrency=48, seed=2, max_tokens=(64, 256)).start()
    polls = []
    try:
        wait_until_busy(base)
        deadline = time.monotonic() + 60
        while not load.done() and len(polls) < MAX_POLLS and time.monotonic() < deadline:
            polls.append(only_engine(kvtop_snapshot(twin_pressure.metrics_url)))
    finally:
        load.wait(timeout_s=120)
    assert not load.errors, load.errors[:3]
    idle_before = wait_until_idle(base)
    idle = only_engine(kvtop_snapshot(twin_pressure.metrics_url))
    SUMMARY.append(f"pressure: usage polled {[p['kv']['usage'] for p in polls]}, "
                   f"preemptions {idle['preemptions_total']}")
    return PressureRun(polls, idle_before, idle, read_metrics(base))


def test_kvtop_saw_the_pool_nearly_full(run: PressureRun) -> None:
    assert run.polls, "the load finished before kvtop could read it"
    peak = max(poll["kv"]["usage"] for poll in run.polls)
    assert peak >= 0.9, [poll["kv"]["usage"] for poll in run.polls]
    assert all(poll["kv"]["blocks_total"] == 119 for poll in run.polls)


def test_kvtop_reports_the_servers_preemptions(run: PressureRun) -> None:
    assert run.idle_before.key_values() == run.idle_after.key_values(), "server moved at idle"
    assert run.idle["preemptions_total"] == run.idle_after.preemptions > 0
    during = [poll["preemptions_total"] for poll in run.polls]
    assert during == sorted(during), f"a counter went backwards: {during}"
    assert max(during) > 0, "no preemption seen while loaded"


def test_pool_drains_to_zero_without_a_leak(run: PressureRun) -> None:
    assert run.idle["kv"]["usage"] == run.idle_after.usage == 0.0
    assert run.idle["kv"]["blocks_used"] == 0
    assert run.idle["requests"]["running"] == run.idle["requests"]["waiting"] == 0
