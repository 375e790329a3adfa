"""The stall verdict on simulator recordings (vLLM 0.33's /metrics text, read by the same
tracker as every command): a wedge and a stall say STALLED at once, a pool under pressure says
SATURATED, healthy load never STALLED, and missing metrics are unknown, never 0."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvtop.collect.target import Scrape, Target
from kvtop.derive.stall import StallDetector
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetTracker
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.sim.engine import EngineConfig, RequestSpec, StepCost
from kvtop.sim.exposition import render
from kvtop.sim.faults import Fault, plan
from kvtop.sim.simulation import Simulation, Truth
from kvtop.sim.workloads import make_workload
from kvtop.view.fleet import leak_cell

T0 = 1_767_225_600.0
TARGET = Target.from_spec("http://127.0.0.1:8000")
BUSY = {"rate": 8.0}
PRESSURE = {"rate": 1.5, "prompt_mean": 3000.0, "output_mean": 500.0, "shared_frac": 0.2}
BURSTS = {"rate": 2.0, "arrival": "bursty", "burst_len": 20.0, "burst_factor": 3.0}


@dataclass
class Point:
    stats: EngineStats
    truth: Truth

    @property
    def stall(self) -> StallVerdict:
        assert self.stats.stall is not None
        return self.stats.stall


def record(params: dict[str, float | str] | None = None, faults: Iterable[Fault] = (), *,
           seconds: int = 120, interval: float = 1.0, blocks: int = 2000,
           requests: list[RequestSpec] | None = None, config: EngineConfig | None = None,
           seed: int = 1) -> list[Point]:
    """Scrape a simulated server every `interval` simulated seconds through a tracker."""
    stream = requests if requests is not None else make_workload(
        "synthetic", seed=seed, **(params or {}))
    config = config or EngineConfig(num_gpu_blocks=blocks)
    sim = Simulation(config, stream, faults, seed=seed)
    tracker, points = TargetTracker(TARGET), []
    t = 0.0
    while t < seconds:
        t += interval
        sim.advance_to(t)
        body = render(sim.engine, model_name="m")
        (stats,) = tracker.update(Scrape(TARGET, T0 + t, body=body, version="0.33.0")).engines
        points.append(Point(stats, sim.truth()))
    return points


def first(points: list[Point], state: str) -> Point | None:
    return next((p for p in points if p.stall.state == state), None)


def test_a_wedge_is_stalled_within_seconds_and_names_the_full_pool() -> None:
    points = record(BUSY, plan(wedge_at=60.0))
    assert all(p.stall.state != "stalled" for p in points if p.truth.sim_time <= 60)
    found = first(points, "stalled")
    assert found is not None and found.stats.t - (T0 + 60) <= 10
    assert found.truth.kv_usage == 1.0 and found.truth.waiting > 0
    assert "KV pool 100% full" in found.stall.reason
    assert f"{found.truth.waiting} requests waiting" in found.stall.reason
    assert found.stall.since_t is not None and found.stall.since_t <= T0 + 61
    # it stays STALLED while nothing moves, and the reason follows the growing queue
    last = points[-1]
    assert last.stall.state == "stalled" and f"{last.truth.waiting} requests" in last.stall.reason
    assert last.truth.waiting > found.truth.waiting


def test_a_stall_on_a_free_pool_is_stalled_without_blaming_the_pool() -> None:
    points = record(BUSY, plan(stall_at=60.0, stall_for=30.0))
    found = first(points, "stalled")
    assert found is not None and found.stats.t - (T0 + 60) <= 10
    assert found.truth.kv_usage < 0.95 and "full with" not in found.stall.reason
    assert "no token generated" in found.stall.reason
    # progress again once it resumes: OK at once
    after = [p for p in points if p.truth.sim_time >= 95]
    assert after and all(p.stall.state == "ok" for p in after)


def test_healthy_load_and_bursts_are_never_stalled() -> None:
    for params in (BUSY, BURSTS):
        points = record(params, seconds=300)
        states = {p.stall.state for p in points}
        assert states <= {"unknown", "ok"}, (params, states)
        assert "ok" in states
    idle = [p for p in record(BURSTS, seconds=300) if p.truth.running == p.truth.waiting == 0]
    assert idle and all(p.stall.reason == "no requests" for p in idle)


def test_a_pool_under_pressure_is_saturated_not_stalled() -> None:
    points = record(PRESSURE, seconds=600)
    states = [p.stall.state for p in points]
    assert "stalled" not in states
    saturated = first(points, "saturated")
    assert saturated is not None and "preempted" in saturated.stall.reason
    assert saturated.truth.preemptions > 0


def test_one_long_prefill_alone_is_not_stalled_at_once() -> None:
    # One huge prompt on an otherwise idle server: no token for a while, nothing waiting.
    huge = [RequestSpec(arrival=0.5, prompt_len=30000, max_tokens=20)]
    slow = EngineConfig(num_gpu_blocks=4000, cost=StepCost(prefill_token_ms=1.0))  # ~30 s
    stats = [p.stats for p in record(requests=huge, seconds=40, config=slow)]
    still = [s for s in stats if s.running and s.generation_tps == 0]
    assert len(still) > 20, "the prefill took no time"
    assert {s.stall.state for s in stats if s.stall} <= {"unknown", "ok"}
    # the same windows with a queue behind it are a stall
    detector, verdicts = StallDetector(), []
    for s in stats:
        queued = replace(s, waiting=3.0) if s.running and not s.generation_tps else s
        verdicts.append(detector.update(queued).state)
    assert "stalled" in verdicts


def test_missing_counters_are_unknown_never_zero() -> None:
    points = record(BUSY, plan(wedge_at=30.0), seconds=60)
    detector = StallDetector()
    no_tokens = [detector.update(replace(p.stats, generation_tps=None)) for p in points]
    assert {v.state for v in no_tokens} == {"unknown"}
    assert "generated-token counter" in no_tokens[-1].reason
    detector = StallDetector()
    no_counts = [detector.update(replace(p.stats, running=None, waiting=None)) for p in points]
    assert {v.state for v in no_counts} == {"unknown"}


def test_a_restart_starts_the_count_again() -> None:
    points = record(BUSY, plan(wedge_at=30.0), seconds=45)
    detector = StallDetector()
    for p in points[:-1]:
        detector.update(p.stats)
    assert detector.verdict.state == "stalled"
    restarted = replace(points[-1].stats, restarted=True, window_s=None, generation_tps=None)
    assert detector.update(restarted).state == "unknown"
    assert detector.update(replace(points[-1].stats, t=points[-1].stats.t + 1)).state == "ok"


def test_the_fleet_table_says_stall_unless_a_leak_explains_it() -> None:
    stalled = StallVerdict("stalled", "KV pool 100% full with 9 requests waiting", T0)
    quiet = LeakVerdict("ok", "no rising floor under load over the window", None, None, None)
    leaking = LeakVerdict("leak", "999 blocks held with nothing running", 999.0, None, None)
    assert (leak_cell(quiet, stalled).text, leak_cell(quiet, stalled).level) == ("STALL",
                                                                                  "alarm")
    assert leak_cell(None, stalled).text == "STALL"
    assert leak_cell(leaking, stalled).text == "LEAK"
    saturated = StallVerdict("saturated", "KV pool pinned full", T0)
    # issue 12: a saturated pool that still moves shows as such, unless a floor says more
    assert (leak_cell(quiet, saturated).text, leak_cell(quiet).text) == ("SATURATED", "OK")
    watching = LeakVerdict("watch", "floor rising", 100.0, 50.0, None)
    assert leak_cell(watching, saturated).text.startswith("WATCH")
