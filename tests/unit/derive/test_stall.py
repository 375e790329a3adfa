"""The stall verdict on simulator recordings (vLLM 0.33's /metrics text, read by the same
tracker as every command): a wedge and a stall say STALLED at once, a pool under pressure says
SATURATED, healthy load never STALLED, and missing metrics are unknown, never 0.

When kvtop says a server is STALLED or SATURATED, and when it must not (docs/leak-detector.md,
"The stall verdict"): scrape by scrape, the numbers a person sees in the table, with each
threshold met exactly and missed by a hair. A missing metric is never read as 0."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import pytest

from kvtop.collect.source import read_scrape
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
from kvtop.view.cells import leak_cell

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
        scrape = read_scrape(Scrape(TARGET, T0 + t, body=body, version="0.33.0"))
        (stats,) = tracker.update(scrape).engines
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


@pytest.mark.slow
def test_healthy_load_and_bursts_are_never_stalled() -> None:
    for params in (BUSY, BURSTS):
        points = record(params, seconds=300)
        states = {p.stall.state for p in points}
        assert states <= {"unknown", "ok"}, (params, states)
        assert "ok" in states
    idle = [p for p in record(BURSTS, seconds=300) if p.truth.running == p.truth.waiting == 0]
    assert idle and all(p.stall.reason == "no requests" for p in idle)


@pytest.mark.slow
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


def test_a_restart_starts_the_count_again_on_a_simulated_wedge() -> None:
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


def reading(t: float, *, running: float | None = 3.0, waiting: float | None = 0.0,
            tokens: float | None = 0.0, prompt: float | None = 0.0, usage: float | None = 0.5,
            window: float | None = 1.0, preempting: float | None = 0.0,
            finished: dict[str, float] | None = None, **more: object) -> EngineStats:
    """One engine's numbers after a scrape at T0 + t: rates over the ``window`` before it."""
    return EngineStats(model="m", engine="0", t=T0 + t, running=running, waiting=waiting,
                       generation_tps=tokens, prompt_tps=prompt, kv_usage=usage,
                       window_s=window, preemptions_per_s=preempting,
                       finished_per_s=finished or {}, **more)  # type: ignore[arg-type]


def fed(readings: Iterable[EngineStats], detector: StallDetector | None = None,
        ) -> list[StallVerdict]:
    detector = detector or StallDetector()
    return [detector.update(r) for r in readings]


def still(times: Iterable[float], window: float = 1.0, **numbers: object) -> list[EngineStats]:
    """Requests held and nothing coming out, one scrape at each time."""
    return [reading(t, window=window, **numbers) for t in times]  # type: ignore[arg-type]


def test_a_queue_with_no_token_is_stalled_after_five_seconds_of_one_second_scrapes() -> None:
    verdicts = fed([reading(0, window=None), *still(range(1, 7), waiting=2.0)])
    assert verdicts[0].state == "unknown" and verdicts[0].reason == "rates need another scrape"
    assert [v.state for v in verdicts[1:]] == ["ok"] * 4 + ["stalled"] * 2
    first = verdicts[5]
    assert first.reason == ("no token generated for 5 s with 3 running, 2 waiting; "
                            "KV pool 50% used")
    assert first.since_t == T0  # the last scrape with progress
    assert first.evidence == {"running": 3.0, "waiting": 2.0, "kv_usage": 0.5,
                              "no_progress_s": 5.0}
    assert verdicts[6].since_t == T0 and verdicts[6].evidence["no_progress_s"] == 6.0


def test_slow_scrapes_need_three_windows_without_progress() -> None:
    verdicts = fed([reading(0, window=None), *still((10, 20, 30), window=10.0, waiting=2.0)])
    assert [v.state for v in verdicts] == ["unknown", "ok", "ok", "stalled"]
    assert verdicts[-1].reason.startswith("no token generated for 30 s")


def test_a_token_a_prompt_or_a_finished_request_ends_a_stall_at_once() -> None:
    stalled = still(range(1, 7), waiting=2.0)
    for moved in ({"tokens": 0.5}, {"prompt": 20.0}, {"finished": {"stop": 0.2}}):
        detector = StallDetector()
        assert fed(stalled, detector)[-1].state == "stalled"
        verdict = detector.update(reading(7, waiting=2.0, **moved))  # type: ignore[arg-type]
        assert (verdict.state, verdict.reason, verdict.since_t) == (
            "ok", "making progress", T0 + 7), moved
        # and the count starts again from there
        assert [v.state for v in fed(still(range(8, 13), waiting=2.0), detector)] == [
            "ok"] * 4 + ["stalled"]


def test_zero_rates_and_no_finished_request_are_no_progress() -> None:
    verdicts = fed(still(range(1, 6), waiting=2.0, finished={"stop": 0.0, "length": 0.0}))
    assert verdicts[-1].state == "stalled"


def test_one_running_request_alone_counts_as_held() -> None:
    verdicts = fed(still(range(1, 6), running=1.0, waiting=None, usage=0.96))
    assert verdicts[-1].state == "stalled"
    assert verdicts[-1].evidence["waiting"] == 0.0
    assert verdicts[-1].reason == ("no token generated for 5 s with 1 running, 0 waiting; "
                                   "KV pool 96% used")


def test_a_waiting_request_alone_counts_as_held() -> None:
    verdicts = fed(still(range(1, 6), running=None, waiting=1.0))
    assert verdicts[-1].state == "stalled" and verdicts[-1].evidence["running"] == 0.0
    assert verdicts[-1].reason.endswith("with 0 running, 1 waiting; KV pool 50% used")


def test_a_full_pool_with_a_queue_is_named_as_the_reason() -> None:
    verdicts = fed(still(range(1, 6), running=4.0, waiting=7.0, usage=0.95))
    assert verdicts[-1].reason == ("KV pool 95% full with 7 requests waiting: no token "
                                   "generated for 5 s (4 running)")


def test_a_lone_long_prefill_is_stalled_only_after_a_minute() -> None:
    # requests running, nothing waiting, pool not full: one huge prompt can take this long
    verdicts = fed(still(range(1, 62), usage=0.94))
    assert [v.state for v in verdicts[:59]] == ["ok"] * 59
    assert [v.state for v in verdicts[59:]] == ["stalled", "stalled"]
    assert verdicts[59].reason == ("no token generated for 60 s with 3 running, 0 waiting; "
                                   "KV pool 94% used")


def test_a_full_pool_without_a_queue_is_not_a_lone_prefill() -> None:
    assert fed(still(range(1, 6), usage=0.95))[-1].state == "stalled"
    assert fed(still(range(1, 6), usage=0.949))[-1].state == "ok"


def test_the_pool_is_read_from_blocks_when_no_usage_gauge() -> None:
    verdicts = fed(still(range(1, 6), waiting=2.0, usage=None, blocks_used=960.0,
                         blocks_total=1000))
    assert verdicts[-1].reason.startswith("KV pool 96% full with 2 requests waiting")
    assert verdicts[-1].evidence["kv_usage"] == 0.96


def test_an_unknown_pool_is_left_out_of_the_reason_never_read_as_empty() -> None:
    for pool in ({"usage": None}, {"usage": None, "blocks_used": 5.0, "blocks_total": 0},
                 {"usage": None, "blocks_used": None, "blocks_total": 1000}):
        verdict = fed(still(range(1, 6), waiting=2.0, **pool))[-1]  # type: ignore[arg-type]
        assert verdict.reason == "no token generated for 5 s with 3 running, 2 waiting", pool
        assert "kv_usage" not in verdict.evidence


def test_an_idle_server_is_ok_with_no_requests() -> None:
    verdicts = fed(still(range(1, 100), running=0.0, waiting=0.0))
    assert {(v.state, v.reason) for v in verdicts} == {("ok", "no requests")}
    assert verdicts[-1].since_t == T0 + 1  # OK since the first scrape said so
    assert verdicts[-1].evidence == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.5}


def test_tokens_coming_out_are_ok() -> None:
    verdicts = fed(still(range(1, 100), waiting=5.0, tokens=1.0, usage=0.99))
    assert {(v.state, v.reason) for v in verdicts} == {("ok", "making progress")}


def test_missing_counts_or_token_counter_are_unknown_never_zero() -> None:
    counts = fed(still(range(1, 10), running=None, waiting=None))
    assert {(v.state, v.reason) for v in counts} == {
        ("unknown", "the server exports no running or waiting count")}
    tokens = fed(still(range(1, 10), waiting=2.0, tokens=None))
    assert {(v.state, v.reason) for v in tokens} == {
        ("unknown", "the server exports no generated-token counter")}
    no_window = fed(still(range(1, 10), waiting=2.0, window=0.0))
    assert {v.reason for v in no_window} == {"rates need another scrape"}


def test_the_first_scrape_has_no_rates_and_is_not_blamed_on_the_server() -> None:
    # no window yet, so no rate of any kind: the counter may well be there
    first = fed([reading(0, window=None, tokens=None, prompt=None, waiting=2.0)])[0]
    assert (first.state, first.reason) == ("unknown", "rates need another scrape")


def test_unknown_is_dated_from_the_scrape_that_lost_the_numbers() -> None:
    # snapshot JSON's since_t: when the state began
    for lost in ({"running": None, "waiting": None}, {"tokens": None},
                 {"restarted": True, "window": None, "tokens": None}):
        detector = StallDetector()
        fed(still(range(1, 4), waiting=2.0, tokens=5.0), detector)
        verdicts = fed(still((4, 5), **{"waiting": 2.0, **lost}), detector)
        assert [(v.state, v.since_t) for v in verdicts] == [("unknown", T0 + 4)] * 2, lost


def test_before_any_scrape_the_verdict_is_unknown() -> None:
    assert StallDetector().verdict == StallVerdict("unknown", "no scrape yet", None, {})


def test_a_restart_starts_the_count_again() -> None:
    detector = StallDetector()
    fed(still(range(1, 5), waiting=2.0), detector)  # four windows, one short of STALLED
    verdict = detector.update(reading(5, waiting=2.0, restarted=True))
    assert verdict.state == "ok"
    assert [v.state for v in fed(still(range(6, 10), waiting=2.0), detector)] == [
        "ok", "ok", "ok", "stalled"]


def test_a_scrape_without_counts_keeps_the_count() -> None:
    # a server that dropped its gauges for one scrape: no verdict then, the stall still counts
    detector = StallDetector()
    fed(still(range(1, 4), waiting=2.0), detector)
    assert detector.update(reading(4, running=None, waiting=None)).state == "unknown"
    assert detector.update(reading(5, waiting=2.0)).state == "stalled"


def pressed(times: Iterable[float], *, usage: float = 0.97, waiting: float = 4.0,
            preempting: float = 0.0, **more: object) -> list[EngineStats]:
    """A pool near full with a queue, tokens still coming out."""
    return [reading(t, usage=usage, waiting=waiting, tokens=300.0, preempting=preempting,
                    **more) for t in times]  # type: ignore[arg-type]


def test_a_pinned_pool_with_a_queue_and_preemptions_is_saturated_after_54_s() -> None:
    verdicts = fed([*pressed([0], preempting=0.5), *pressed(range(1, 60))])
    assert {v.state for v in verdicts[:54]} == {"ok"}
    assert {v.state for v in verdicts[54:]} == {"saturated"}
    assert verdicts[54].reason == ("KV pool pinned full (median 97% over 60 s), requests "
                                   "waiting and being preempted; still making progress")
    assert verdicts[-1].since_t == T0 + 54
    assert verdicts[-1].evidence == {"running": 3.0, "waiting": 4.0, "kv_usage": 0.97}


def test_a_preemption_counts_for_a_minute_then_is_forgotten() -> None:
    verdicts = fed([*pressed([0], preempting=0.5), *pressed(range(1, 62))])
    assert [v.state for v in verdicts[59:]] == ["saturated", "saturated", "ok"]


def test_no_preemption_is_not_saturated() -> None:
    assert {v.state for v in fed(pressed(range(0, 120)))} == {"ok"}


def test_a_median_at_the_pinned_mark_is_saturated_and_below_it_is_not() -> None:
    for usage, state in ((0.9, "saturated"), (0.899, "ok")):
        assert fed(pressed(range(0, 60), usage=usage, preempting=1.0))[-1].state == state


def test_the_median_not_the_mean_of_usage_counts() -> None:
    # a third of the scrapes read the pool at 0 (a freed batch): still pinned most of the time
    dips = [reading(t, usage=0.97 if t % 3 else 0.0, waiting=4.0, tokens=300.0,
                    preempting=1.0) for t in range(0, 60)]
    assert fed(dips)[-1].state == "saturated"


def test_a_queue_at_half_the_scrapes_is_enough_and_less_is_not() -> None:
    for every, state in ((2, "saturated"), (3, "ok")):
        scrapes = [reading(t, usage=0.97, waiting=4.0 if t % every == 0 else 0.0,
                           tokens=300.0, preempting=1.0) for t in range(0, 60)]
        assert fed(scrapes)[-1].state == state, every


def test_a_pool_not_known_for_a_scrape_restarts_the_minute() -> None:
    scrapes = [*pressed(range(0, 30), preempting=1.0),
               reading(30, usage=None, waiting=4.0, tokens=300.0, preempting=1.0),
               *pressed(range(31, 90), preempting=1.0)]
    verdicts = fed(scrapes)
    assert verdicts[84].state == "ok" and verdicts[85].state == "saturated"


def test_a_restart_forgets_the_pressure_seen_before() -> None:
    detector = StallDetector()
    fed(pressed(range(0, 60), preempting=1.0), detector)
    assert detector.verdict.state == "saturated"
    assert detector.update(pressed([60], preempting=1.0, restarted=True)[0]).state == "ok"


def test_a_stall_on_a_pinned_pool_is_stalled_not_saturated() -> None:
    detector = StallDetector()
    fed(pressed(range(0, 60), preempting=1.0), detector)
    verdicts = fed(still(range(60, 66), usage=0.97, waiting=4.0), detector)
    assert verdicts[-1].state == "stalled" and verdicts[-1].since_t == T0 + 59
