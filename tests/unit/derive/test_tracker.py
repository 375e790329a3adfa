"""What a target's row shows as its scrapes come and go: the last error only while it
fails, a restart of any of its engines, the last values for ``stale_after_s`` after a
failed read, and a history as long as asked for (15 minutes unless told).

The tracker's statuses: stale then down, a late older scrape ignored, a restart between
scrapes, an inferred version never read back as exact."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.exposition import parse
from kvtop.collect.kv_events import BlockStored, KvEventBatch
from kvtop.collect.source import ScrapeReader, read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.kv_anatomy import AnatomyParams
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.tracker import MAX_KV_EVENT_RANKS, TargetTracker
from tests.scenarios.bodies import many_models
from tests.scenarios.derived import vllm_08_idle
from tests.support.paths import fixture_text

TARGET = Target.from_spec("127.0.0.1:8000")


def body(finished: dict[str, int]) -> str:
    """A vLLM server with one engine per key, each with its finished-request count."""
    lines = []
    for engine, count in finished.items():
        labels = f'engine="{engine}",model_name="m"'
        lines += [f"vllm:num_requests_running{{{labels}}} 1.0",
                  f"vllm:kv_cache_usage_perc{{{labels}}} 0.25",
                  f'vllm:request_success_total{{{labels},finished_reason="stop"}} {count}.0']
    return "\n".join(lines) + "\n"


def good(t: float, **finished: int) -> Scrape:
    return read_scrape(Scrape(TARGET, t, body=body(finished or {"0": 10})))


def failed(t: float) -> Scrape:
    return Scrape(TARGET, t, failure="down", error="connection refused")


def test_the_error_goes_when_the_target_answers_again() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=5)
    tracker.update(good(100.0))
    state = tracker.update(failed(200.0))
    assert (state.status, state.error) == ("down", "connection refused")
    state = tracker.update(good(210.0))
    assert (state.status, state.error) == ("up", None)


def test_a_restart_of_any_engine_is_the_target_restarting() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update(read_scrape(Scrape(TARGET, 1.0, body=body({"0": 50, "1": 50, "2": 50}))))
    # engine 0's counter went back (restarted); engines 1 and 2, read after it, did not
    state = tracker.update(read_scrape(Scrape(TARGET, 2.0, body=body({"0": 1, "1": 60, "2": 60}))))
    assert [e.restarted for e in state.engines] == [True, False, False]
    assert state.restarted_at == 2.0
    # and only the middle one
    tracker.update(read_scrape(Scrape(TARGET, 3.0, body=body({"0": 2, "1": 1, "2": 70}))))
    assert tracker.state.restarted_at == 3.0


def test_the_last_values_stay_up_to_stale_after_s_after_a_failed_read() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    tracker.update(good(100.0))
    state = tracker.update(failed(130.0))  # exactly stale_after_s later: still shown
    assert state.status == "stale" and state.engines
    state = tracker.update(failed(130.5))
    assert state.status == "down" and state.engines == []


def test_history_keeps_the_span_asked_for() -> None:
    tracker = TargetTracker(TARGET, history_s=120)
    for t in range(0, 600, 10):
        tracker.update(good(float(t), **{"0": t}))
    times = [s.t for s in tracker.history[("m", "0")]]
    assert times[0] == 590.0 - 120 and times[-1] == 590.0


def test_history_is_fifteen_minutes_unless_told() -> None:
    tracker = TargetTracker(TARGET)
    for t in range(0, 3600, 60):
        tracker.update(good(float(t), **{"0": t}))
    times = [s.t for s in tracker.history[("m", "0")]]
    assert times[-1] - times[0] == 15 * 60


# vLLM's cache config naming a pool no GPU has: the adapters refuse the whole answer
IMPOSSIBLE_POOL = ('vllm:cache_config_info{num_gpu_blocks="1e300",block_size="16"} 1.0\n'
                   + body({"0": 10}))


DCGM = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-abc",modelName="Tesla T4",Hostname="h"} 25\n'


def test_a_refused_answer_is_bad_payload_with_its_reason() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    tracker.update(good(100.0))
    state = tracker.update(read_scrape(Scrape(TARGET, 110.0, body=IMPOSSIBLE_POOL)))
    # the last good values stay on screen, and the row says why the new answer was not used
    assert (state.status, state.failure) == ("stale", "bad_payload") and state.engines
    assert state.error == "vllm:cache_config_info num_gpu_blocks='1e300' is not a usable count"
    state = tracker.update(read_scrape(Scrape(TARGET, 140.5, body=IMPOSSIBLE_POOL)))
    assert (state.status, state.failure, state.engines) == ("bad_payload", "bad_payload", [])


def test_the_failure_kind_shows_while_stale_and_goes_with_a_good_read() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    tracker.update(good(100.0))
    state = tracker.update(Scrape(TARGET, 105.0, failure="timeout", error="timed out"))
    assert (state.status, state.failure, state.error) == ("stale", "timeout", "timed out")
    state = tracker.update(good(110.0))
    assert (state.status, state.failure, state.error) == ("up", None, None)


def test_an_answer_with_no_body_and_no_reason_is_down() -> None:
    state = TargetTracker(TARGET).update(Scrape(TARGET, 1.0))
    assert (state.status, state.failure) == ("down", "down")


def test_a_failure_at_the_instant_of_the_last_read_still_counts() -> None:
    # only an *older* scrape is ignored (a late answer); one at the same second is news
    tracker = TargetTracker(TARGET)
    tracker.update(good(100.0))
    state = tracker.update(failed(100.0))
    assert (state.status, state.error) == ("stale", "connection refused")


def test_the_last_values_stay_a_minute_unless_told() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update(good(100.0))
    assert tracker.update(failed(160.0)).status == "stale"
    assert tracker.update(failed(160.5)).status == "down"


def test_gpus_are_shown_while_read_and_gone_with_the_target() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    state = tracker.update(read_scrape(Scrape(TARGET, 100.0, body=DCGM)))
    assert [(g.uuid, g.temperature_c) for g in state.gpus] == [("GPU-abc", 25.0)]
    assert tracker.update(failed(110.0)).gpus == state.gpus  # stale: last values kept
    assert tracker.update(failed(200.0)).gpus == []


def test_the_last_good_body_and_its_age_are_kept_through_failures() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    state = tracker.update(good(100.0))
    assert state.last_body == body({"0": 10}) and state.age_s(100.0) == 0.0
    state = tracker.update(failed(200.0))
    assert state.last_body == body({"0": 10}) and state.age_s(250.0) == 150.0
    assert state.age_s(99.0) == 0.0  # a clock stepped back never gives a negative age


def test_an_exact_version_stays_exact_when_later_scrapes_do_not_ask_again() -> None:
    # a recording's scrapes after the one /version answered may carry none: read as a stream
    tracker = TargetTracker(Target.from_spec("127.0.0.1:8000"))
    target = tracker.state.target
    read = ScrapeReader()
    tracker.update(read(Scrape(target, 1.0, body=vllm_08_idle(), version="0.8.2")))
    for t in (2.0, 3.0):
        state = tracker.update(read(Scrape(target, t, body=vllm_08_idle())))
        assert (state.version, state.version_inferred) == ("0.8.2", False)
        assert state.engines[0].idle_floor_blocks == 0  # 0.8.2 had no null block


def test_parsed_samples_are_read_with_the_servers_exact_version() -> None:
    # Prometheus hands samples over parsed: the same reading as the body, the same version rule
    tracker = TargetTracker(Target.from_spec("127.0.0.1:8000"))
    target = tracker.state.target
    samples = parse(vllm_08_idle())
    state = tracker.update(read_scrape(Scrape(target, 1.0, samples=samples)))
    assert (state.engines[0].blocks_total, state.engines[0].idle_floor_blocks) == (600, 1)
    assert (state.version, state.version_inferred) == ("0.7+", True)
    state = tracker.update(read_scrape(Scrape(target, 2.0, samples=samples, version="0.8.2")))
    assert state.engines[0].idle_floor_blocks == 0


def test_a_good_scrape_that_came_unread_is_a_bug_said_loudly() -> None:
    tracker = TargetTracker(TARGET)
    with pytest.raises(ValueError, match="came unread"):
        tracker.update(Scrape(TARGET, 1.0, body=body({"0": 10})))
    assert tracker.state.status == "pending"  # nothing folded


def test_a_reading_made_by_the_poller_is_used_as_it_is() -> None:
    reading = read_exposition(body({"0": 10, "1": 20}))
    state = TargetTracker(TARGET).update(Scrape(TARGET, 1.0, body="", reading=reading))
    assert [e.engine for e in state.engines] == ["0", "1"]


def test_rates_are_over_the_time_between_scrapes() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update(good(1000.0, **{"0": 10}))
    (engine,) = tracker.update(good(1010.0, **{"0": 40})).engines
    assert engine.window_s == 10.0 and engine.finished_per_s == {"stop": 3.0}


def test_the_leak_detector_follows_each_engine_with_the_params_asked_for() -> None:
    leaking = fixture_text("vllm-0.33.0-v1-twin-leaking-idle.txt")

    def states(params: LeakParams | None) -> list[str]:
        tracker = TargetTracker(TARGET, leak_params=params)
        return [tracker.update(read_scrape(Scrape(TARGET, float(t), body=leaking)))
                .engines[0].leak.state for t in range(0, 70, 10)]

    # blocks held at idle: WATCH once the idle run counts, LEAK after idle_leak_s (60 s)
    assert states(None) == ["warmup", "warmup", "watch", "watch", "watch", "watch", "leak"]
    assert states(LeakParams(idle_leak_s=20.0, idle_min_s=10.0))[2] == "leak"


def test_a_wedged_engine_reads_stalled_beside_an_idle_one() -> None:
    # engine 0 full, with requests waiting and no token made; engine 1 idle beside it
    wedged = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    idle = fixture_text("vllm-0.33.0-v1-twin-idle.txt").replace('engine="0"', 'engine="1"')
    both = wedged + "".join(line + "\n" for line in idle.splitlines()
                            if not line.startswith("#"))
    tracker = TargetTracker(TARGET)
    for t in range(0, 50, 10):
        state = tracker.update(read_scrape(Scrape(TARGET, float(t), body=both)))
    assert [(e.engine, e.stall and e.stall.state) for e in state.engines] == [
        ("0", "stalled"), ("1", "ok")]


def test_an_engine_unseen_for_forget_after_s_is_forgotten_and_not_before() -> None:
    tracker = TargetTracker(TARGET, history_s=600, forget_after_s=30)
    tracker.update(good(0.0, a=1))
    tracker.update(good(10.0, b=1))
    tracker.update(good(20.0, a=2))  # a seen again: b is now the longest unseen
    tracker.update(good(40.0, a=3))  # b unseen exactly 30 s: kept
    assert set(tracker.history) == set(tracker.detectors) == {("m", "a"), ("m", "b")}
    tracker.update(good(41.0, a=4))
    assert set(tracker.history) == set(tracker.detectors) == {("m", "a")}
    assert set(tracker.stall_detectors) == {("m", "a")}


def test_too_many_engines_is_said_while_it_lasts_and_never_of_an_unread_target() -> None:
    tracker = TargetTracker(TARGET)
    assert (tracker.state.engines_over_cap, tracker.state.impossible_values) == (0, 0)
    assert tracker.update(failed(1.0)).engines_over_cap == 0  # down from the start
    state = tracker.update(read_scrape(Scrape(TARGET, 2.0, body=many_models(MAX_ENGINES + 3))))
    assert (len(state.engines), state.engines_over_cap) == (MAX_ENGINES, 3)
    assert any(note.startswith("too many engines: 259") for note in state.notes)
    state = tracker.update(good(3.0))
    assert (state.engines_over_cap, state.notes) == (0, [])


def test_impossible_values_are_counted_and_named_per_answer() -> None:
    tracker = TargetTracker(TARGET)
    over_full = body({"0": 10}).replace("kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25",
                                        "kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 1.7")
    state = tracker.update(read_scrape(Scrape(TARGET, 1.0, body=over_full)))
    assert state.impossible_values == 1 and state.notes[0].startswith("impossible values left out")
    state = tracker.update(good(2.0))
    assert (state.impossible_values, state.notes) == (0, [])


def test_tracker_stale_then_down() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    body = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    assert tracker.update(read_scrape(Scrape(TARGET, 100.0, body=body))).status == "up"
    state = tracker.update(Scrape(TARGET, 110.0, failure="timeout", error="timed out"))
    assert state.status == "stale" and state.engines and state.error == "timed out"
    assert state.age_s(115.0) == 15.0
    state = tracker.update(Scrape(TARGET, 140.0, failure="timeout", error="timed out"))
    assert state.status == "timeout" and state.engines == []


def test_tracker_ignores_a_late_older_scrape() -> None:
    tracker = TargetTracker(TARGET)
    idle = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    load = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    tracker.update(read_scrape(Scrape(TARGET, 200.0, body=idle)))
    state = tracker.update(read_scrape(Scrape(TARGET, 190.0, body=load)))
    assert state.engines[0].running == 0  # the newer scrape stays on screen


def test_tracker_marks_restart_between_scrapes() -> None:
    tracker = TargetTracker(TARGET)
    idle = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    tracker.update(read_scrape(Scrape(TARGET, 1.0, body=idle)))
    state = tracker.update(
        read_scrape(Scrape(TARGET, 2.0, body=fixture_text("vllm-0.33.0-v1-twin-under-load.txt")))
    )
    assert state.restarted_at == 2.0 and state.engines[0].restarted
    assert state.engines[0].prompt_tps is None
    assert len(tracker.history[("twin-llama", "0")]) == 2


def test_an_inferred_version_is_never_read_back_as_exact() -> None:
    # "0.7+" read as exactly 0.7.0 once dropped the null block from the second scrape on
    tracker = TargetTracker(Target.from_spec("127.0.0.1:8000"))
    body = vllm_08_idle()
    for t in (1.0, 2.0, 3.0):
        state = tracker.update(read_scrape(Scrape(tracker.state.target, t, body=body)))
        (engine,) = state.engines
        assert (engine.blocks_total, engine.idle_floor_blocks) == (600, 1), t
        assert (state.version, state.version_inferred) == ("0.7+", True)
    # the server's own /version wins, and is exact: 0.8.2 had no null block
    exact = read_scrape(Scrape(tracker.state.target, 4.0, body=body, version="0.8.2"))
    state = tracker.update(exact)
    assert (state.version, state.version_inferred) == ("0.8.2", False)
    assert state.engines[0].idle_floor_blocks == 0


# -- KV anatomy: limits, sleep, KV events -------------------------------------------------

def anatomy_body(engine: str = "0", sleep: str = "awake", waiting: int = 0,
                 usage: float = 0.25, running: int = 2) -> str:
    labels = f'engine="{engine}",model_name="m"'
    states = "".join(f'vllm:engine_sleep_state{{{labels},sleep_state="{s}"}} '
                     f'{1.0 if s == sleep else 0.0}\n'
                     for s in ("awake", "weights_offloaded", "discard_all"))
    return (f"vllm:num_requests_running{{{labels}}} {running}.0\n"
            f"vllm:num_requests_waiting{{{labels}}} {waiting}.0\n"
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {waiting}.0\n'
            f"vllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
            f'vllm:cache_config_info{{{labels},block_size="16",num_gpu_blocks="101"}} 1.0\n'
            + states)


def test_each_engine_says_what_limits_it() -> None:
    tracker = TargetTracker(TARGET)
    body = anatomy_body(waiting=3, usage=0.95)
    state = tracker.update(read_scrape(Scrape(TARGET, 1.0, body=body)))
    assert state.engines[0].limit is not None and state.engines[0].limit.limit == "kv_capacity"
    state = tracker.update(read_scrape(Scrape(TARGET, 2.0, body=anatomy_body(waiting=0))))
    assert state.engines[0].limit is not None and state.engines[0].limit.limit == "none"


def test_an_engine_asleep_keeps_its_leak_evidence_unfed() -> None:
    tracker = TargetTracker(TARGET, leak_params=LeakParams(idle_min_s=1, idle_min_scrapes=2,
                                                           idle_leak_s=2))
    for t in range(1, 8):  # 25 blocks held with nothing running is a leak
        tracker.update(read_scrape(Scrape(TARGET, float(t), body=anatomy_body(running=0))))
    leak = tracker.state.engines[0].leak
    assert leak is not None and leak.state == "leak"
    state = tracker.update(read_scrape(Scrape(TARGET, 8.0, body=anatomy_body(
        sleep="discard_all", usage=0.0))))
    asleep = state.engines[0].leak
    assert asleep is not None and asleep.state == "leak"  # the pool let go: not cleared
    assert asleep.reason.startswith("engine asleep (discard_all): the leak evidence so far")
    assert state.engines[0].limit is not None and state.engines[0].limit.limit == "sleeping"


def events_batch(seq: int, rank: int = 0, *events: object) -> KvEventBatch:
    return KvEventBatch(t=float(seq), rank=rank, seq=seq, ts=float(seq),
                        events=events)  # type: ignore[arg-type]


def test_kv_events_reach_the_engine_of_their_rank() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update_kv_events(events_batch(0, 1, BlockStored((1, 2), None, 32, 16, "GPU")))
    tracker.update_kv_events(events_batch(0, 0, BlockStored((3,), None, 16, 16, "GPU")))
    body = anatomy_body("0") + anatomy_body("1") + anatomy_body("x")
    state = tracker.update(read_scrape(Scrape(TARGET, 1.0, body=body)))
    by_engine = {e.engine: e.kv_events for e in state.engines}
    assert by_engine["0"] is not None and by_engine["0"].population == 1
    assert by_engine["1"] is not None and by_engine["1"].population == 2
    assert by_engine["1"].pool_blocks == state.engines[1].blocks_total == 101  # a turnover
    assert by_engine["x"] is None  # not a rank number: no events to match


def test_kv_events_of_too_many_ranks_are_left_out() -> None:
    tracker = TargetTracker(TARGET)
    for rank in range(MAX_KV_EVENT_RANKS + 5):
        tracker.update_kv_events(events_batch(0, rank))
    assert len(tracker.kv_events) == MAX_KV_EVENT_RANKS


def test_the_ranks_of_a_target_share_its_block_index_cap() -> None:
    """Each rank had the whole cap: 64 ranks could hold 64 times the bytes documented. A
    flood on two ranks keeps the target's index within its cap."""
    tracker = TargetTracker(TARGET, anatomy_params=AnatomyParams(index_cap=1000))
    for seq in range(30):
        for rank in (0, 1):
            hashes = tuple(range(10_000 * rank + 100 * seq, 10_000 * rank + 100 * (seq + 1)))
            tracker.update_kv_events(events_batch(seq, rank, BlockStored(hashes, None, 1600,
                                                                         16, "GPU")))
    assert [a.index.cap for a in tracker.kv_events.values()] == [500, 500]
    assert sum(len(a.index) for a in tracker.kv_events.values()) <= 1000
    assert all(a.index.dropped > 0 for a in tracker.kv_events.values())
