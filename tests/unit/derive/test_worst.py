"""The worst verdict each engine reached over a run and when (derive/worst.py): WATCH before
LEAK, STALLED and SATURATED with their first times, engines a server invents forgotten
unless judged, the span judged, and the exit code a leak, a stall or no data give."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive import worst
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitParams
from kvtop.derive.tracker import MAX_TRACKED_ENGINES
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.derive.worst import CheckRun, EngineVerdict
from kvtop.exits import EXIT_INTERRUPTED, EXIT_LEAK, EXIT_NO_DATA, EXIT_OK, EXIT_STALLED
from tests.scenarios import bodies
from tests.scenarios.check_runs import (
    STEP,
    T0,
    TARGET,
    body,
    engine,
    idle_holding,
    judged,
    leak,
    quiet,
    stalling,
    warmup,
)
from tests.scenarios.kv_cache import kv_event_stats


def test_blocks_held_at_idle_are_a_leak_with_when_watch_and_leak_began() -> None:
    run = judged(idle_holding(12))
    assert run.verdict() == "leak" and run.leak_found and run.exit_code() == EXIT_LEAK == 1
    document = run.to_json()
    assert (document["verdict"], document["stall"]) == ("leak", "ok")
    assert document["started_at"] == "2026-01-01T00:00:00.000+00:00"
    assert document["ended_at"] == "2026-01-01T00:01:50.000+00:00"
    assert document["duration_s"] == 110.0
    entry = engine(run)
    assert (entry["model"], entry["engine"], entry["verdict"]) == ("m", "0", "leak")
    assert (entry["watch_first_t"], entry["leak_first_t"]) == (T0 + 20, T0 + 60)
    assert entry["leaked_blocks"] == 39.0 and entry["slope_blocks_per_hour"] is None
    assert "39 blocks held" in entry["reason"]
    assert entry["stall"] == {"verdict": "ok", "stalled_first_t": None,
                              "saturated_first_t": None, "reason": "no requests"}


def test_the_detectors_thresholds_are_the_ones_asked_for() -> None:
    patient = LeakParams(idle_leak_s=1000.0)
    run = judged(idle_holding(12), patient)
    assert run.verdict() == "watch" and not run.leak_found
    assert run.exit_code() == EXIT_OK
    assert engine(run)["leak_first_t"] is None and engine(run)["watch_first_t"] == T0 + 20


def test_a_healthy_engine_is_ok_and_exits_0() -> None:
    run = judged(quiet(12))
    assert (run.verdict(), run.stall_verdict(), run.exit_code()) == ("ok", "ok", EXIT_OK)
    entry = engine(run)
    assert entry["verdict"] == "ok" and entry["watch_first_t"] is None
    assert entry["leaked_blocks"] is None


def test_a_stalled_engine_exits_4_with_when_it_stalled() -> None:
    run = judged(stalling(9))
    assert run.stall_verdict() == "stalled" and run.exit_code() == EXIT_STALLED == 4
    stall = engine(run)["stall"]
    assert stall["verdict"] == "stalled" and stall["saturated_first_t"] is None
    assert stall["stalled_first_t"] == T0 + 8 * STEP
    assert stall["reason"] != "not enough data for a verdict"


def test_a_leak_outranks_a_stall_in_the_exit_code() -> None:
    run = judged(idle_holding(12))
    other = Target.from_spec("127.0.0.1:8001")
    for scrape in stalling(9, target=other):
        run.feed(scrape)
    assert (run.verdict(), run.stall_verdict()) == ("leak", "stalled")
    assert run.exit_code() == EXIT_LEAK
    assert [t["target"] for t in run.to_json()["targets"]] == [TARGET.url, other.url]


def test_no_engine_read_is_no_data_exit_3() -> None:
    run = CheckRun()
    run.add_target(TARGET)
    document = run.to_json()
    assert (run.verdict(), run.stall_verdict(), run.exit_code()) == (
        "unknown", "unknown", EXIT_NO_DATA)
    assert document == {"verdict": "unknown", "stall": "unknown", "started_at": None,
                        "ended_at": None, "duration_s": None, "interrupted": False,
                        "needs": "needs a target that answers with an inference server's "
                                 "metrics",
                        "targets": [{"target": TARGET.url, "engines": []}]}


def test_failed_reads_count_in_the_span_but_judge_no_engine() -> None:
    run = judged([Scrape(TARGET, T0 + 5, failure="down", error="refused"),
                  Scrape(TARGET, T0 + 65, failure="timeout", error="slow")])
    assert run.engines_seen() == 0 and run.exit_code() == EXIT_NO_DATA
    assert run.to_json()["duration_s"] == 60.0
    assert run.to_json()["started_at"] == "2026-01-01T00:00:05.000+00:00"


def test_the_span_is_first_to_last_scrape_whatever_order_they_come_in() -> None:
    scrapes = idle_holding(4)
    run = judged([scrapes[2], scrapes[0], scrapes[3], scrapes[1]])
    document = run.to_json()
    assert (document["started_at"], document["duration_s"]) == (
        "2026-01-01T00:00:00.000+00:00", 30.0)


def test_a_scrape_older_than_the_last_read_is_not_judged_again() -> None:
    run = judged(idle_holding(3))
    late = read_scrape(Scrape(TARGET, T0 + 5, body=body(0.04, model="late")))
    run.feed(late)
    assert [e["model"] for t in run.to_json()["targets"] for e in t["engines"]] == ["m"]


def test_an_engines_verdict_is_the_worst_it_reached_with_the_latest_figures_at_it() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe(1.0, warmup())
    assert verdict.verdict == "unknown" and verdict.to_json()["reason"] == (
        "not enough data for a verdict")
    verdict.observe(2.0, leak("ok"))
    verdict.observe(3.0, leak("leak", 10.0, "first"))
    verdict.observe(4.0, leak("leak", 12.0, "second"))
    verdict.observe(5.0, leak("watch", 1.0))
    verdict.observe(6.0, leak("ok"))
    verdict.observe(7.0, warmup())
    assert (verdict.verdict, verdict.watch_first_t, verdict.leak_first_t) == ("leak", 3.0, 3.0)
    document = verdict.to_json()
    assert (document["leaked_blocks"], document["reason"]) == (12.0, "second")


def test_watch_is_first_reached_before_a_later_leak() -> None:
    verdict = EngineVerdict("m", "0")
    for t, state in ((1.0, "ok"), (2.0, "watch"), (3.0, "watch"), (4.0, "leak")):
        verdict.observe(t, leak(state))
    assert (verdict.watch_first_t, verdict.leak_first_t) == (2.0, 4.0)


def test_stall_states_are_kept_at_their_worst_with_when_each_began() -> None:
    verdict = EngineVerdict("m", "0")
    for t, state in ((1.0, "unknown"), (2.0, "ok"), (3.0, "saturated"), (4.0, "saturated"),
                     (5.0, "stalled"), (6.0, "stalled"), (7.0, "ok"), (8.0, "unknown")):
        verdict.observe_stall(t, StallVerdict(state, f"{state} at {t:g}", t))  # type: ignore[arg-type]
    document = verdict.to_json()["stall"]
    assert document == {"verdict": "stalled", "stalled_first_t": 5.0, "saturated_first_t": 3.0,
                        "reason": "stalled at 6"}


def test_unknown_stall_is_no_verdict() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe_stall(1.0, StallVerdict("unknown", "no scrape yet", None))
    assert verdict.to_json()["stall"] == {
        "verdict": "unknown", "stalled_first_t": None, "saturated_first_t": None,
        "reason": "not enough data for a verdict"}


def test_engines_a_server_invents_are_forgotten_unless_judged() -> None:
    run = judged(idle_holding(12))  # ("m", "0"): a leak, which stays in the report
    for i in range(MAX_TRACKED_ENGINES + 20):
        run.feed(read_scrape(Scrape(TARGET, T0 + 200 + i, body=body(0.04, model=f"invented-{i}"))))
    models = [e["model"] for e in run.to_json()["targets"][0]["engines"]]
    assert "m" in models and len(models) <= MAX_TRACKED_ENGINES + 1
    assert f"invented-{MAX_TRACKED_ENGINES + 19}" in models  # the one read now stays


def test_an_engine_with_a_stall_verdict_stays_in_the_report_when_names_are_invented() -> None:
    run = judged(stalling(2))  # ("m", "0"): stall OK, no leak verdict yet
    for i in range(MAX_TRACKED_ENGINES + 20):
        run.feed(read_scrape(Scrape(TARGET, T0 + 200 + i, body=body(0.04, model=f"invented-{i}"))))
    kept = {(e["model"], e["stall"]["verdict"]) for e in run.to_json()["targets"][0]["engines"]}
    assert ("m", "ok") in kept


def test_leak_figures_are_rounded_to_a_tenth_of_a_block() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe(T0, LeakVerdict("leak", "held", 12.3456, 3.14159, 2.0))
    document = verdict.to_json()
    assert (document["leaked_blocks"], document["slope_blocks_per_hour"]) == (12.3, 3.1)


def test_an_engine_gone_without_a_verdict_stays_listed_while_under_the_cap() -> None:
    run = CheckRun()
    for i in range(MAX_TRACKED_ENGINES):  # each scrape names another engine, judged by none
        run.feed(read_scrape(Scrape(TARGET, T0 + i, body=body(0.04, model=f"m{i}"))))
    models = [e["model"] for e in run.to_json()["targets"][0]["engines"]]
    assert models == [f"m{i}" for i in range(MAX_TRACKED_ENGINES)]


def test_the_worst_stall_over_engines_is_the_runs() -> None:
    run = judged(stalling(9))
    never = EngineVerdict("never", "0")
    never.observe_stall(T0, StallVerdict("unknown", "no scrape yet", None))
    run.engines[TARGET.url][("never", "0")] = never
    assert run.stall_verdict() == "stalled" and run.exit_code() == EXIT_STALLED


def test_the_span_judged_is_rounded_to_the_millisecond() -> None:
    run = judged([Scrape(TARGET, T0, failure="down", error="x"),
                  Scrape(TARGET, T0 + 1.2345678, failure="down", error="x")])
    assert run.to_json()["duration_s"] == 1.235


def test_targets_that_churn_keep_a_bounded_number_of_trackers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Prometheus naming new instances every refresh: every target kept a tracker."""
    monkeypatch.setattr(worst, "MAX_TRACKED_TARGETS", 16)
    run = CheckRun()
    judged = Target("http://10.9.9.9:8000/metrics")
    run.feed(read_scrape(Scrape(judged, 0.0, body=bodies.vllm_body(model="kept"))))
    run.engines[judged.url][("kept", "0")].verdict = "leak"  # a verdict, once reached, stays
    for i in range(200):
        run.feed(read_scrape(Scrape(Target(f"http://10.0.{i // 200}.{i % 200}:8000/metrics"),
                                    1.0 + i, body=bodies.vllm_body())))
    assert len(run.trackers) <= 16 + 16 // 8
    assert "http://10.0.0.199:8000/metrics" in run.trackers  # the most recent are kept
    assert judged.url not in run.trackers and run.verdict() == "leak"
    assert len(run.engines) <= 16 + 16 // 8 + 1


def waiting_on_room(running: int) -> str:
    """vLLM 0.33 with requests waiting for capacity while the pool has room."""
    labels = 'engine="0",model_name="m"'
    return (f"vllm:num_requests_running{{{labels}}} {running}.0\n"
            f"vllm:num_requests_waiting{{{labels}}} 3.0\n"
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} 3.0\n'
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.2\n"
            f'vllm:cache_config_info{{{labels},block_size="16",num_gpu_blocks="101"}} 1.0\n')


@pytest.mark.parametrize(("limits", "seen"), [
    ({}, {"token_budget": 1}),  # one scrape: no plateau yet, so by elimination
    ({TARGET.url: LimitParams(max_num_seqs=8)}, {"max_sequences": 1}),  # at the ceiling
    ({TARGET.url: LimitParams(max_num_seqs=9)}, {"token_budget": 1}),  # one under it
])
def test_a_targets_configured_max_num_seqs_reaches_its_tracker(
        limits: dict[str, LimitParams], seen: dict[str, int]) -> None:
    run = CheckRun(limits=limits)
    run.feed(read_scrape(Scrape(TARGET, T0, body=waiting_on_room(running=8))))
    assert run.to_json()["targets"][0]["engines"][0]["limits"] == seen


def test_unknown_says_what_the_detector_still_needs() -> None:
    run = judged(stalling(3))  # busy, making progress: the detector is warming up
    assert run.verdict() == "unknown"
    assert run.first_t is not None and run.last_t is not None
    seen = run.last_t - run.first_t
    left = math.ceil((600 - seen) / 60)
    needs = run.to_json()["needs"]
    assert needs == (f"needs {left} more minutes of scrapes under load, or one idle period "
                     "(nothing running or waiting for 20 s, 3 scrapes)")
    assert engine(run)["needs"] == needs
    assert judged(quiet(12)).to_json()["needs"] is None


@pytest.mark.parametrize(("seen_s", "minutes"), [(0.0, 10), (539.0, 2), (540.0, 1),
                                                  (599.0, 1)])
def test_the_minutes_needed_count_up_to_the_trend_span(seen_s: float, minutes: int) -> None:
    needs = worst.warmup_needs(LeakParams(), T0, T0 + seen_s)
    assert needs.startswith(f"needs {minutes} more minutes")


def test_past_the_trend_span_it_needs_steady_load_or_idle() -> None:
    params = LeakParams(trend_min_buckets=12)  # 12 buckets of 60 s outlast the 600 s span
    assert worst.warmup_needs(params, T0, T0 + 700).startswith("needs 1 more minutes")
    assert worst.warmup_needs(LeakParams(), T0, T0 + 600).startswith(
        "needs more scrapes under steady load, or one idle period")


def test_a_leak_gives_its_size_in_blocks_tokens_and_gib_and_the_next_step() -> None:
    run = judged(idle_holding(12))
    entry = engine(run)
    assert entry["leaked_blocks"] == 39.0
    assert entry["leaked_tokens"] == 39 * 16  # the scenario's block size
    assert entry["leaked_gib"] is None  # the bytes a block holds are not said
    assert entry["next_step"] == worst.LEAK_NEXT_STEP
    assert engine(judged(quiet(12)))["next_step"] is None


def test_the_bytes_a_block_holds_come_from_the_cache_config() -> None:
    assert worst.kv_bytes_per_block({"kv_cache_memory_bytes": "2147483648",
                                     "num_gpu_blocks": "1024"}) == 2 * 2**20
    assert worst.kv_bytes_per_block({"kv_cache_memory_bytes": "None", "num_gpu_blocks": "8",
                                     "cpu_kvcache_space_bytes": "4096",
                                     "num_cpu_blocks": "2"}) == 2048
    assert worst.kv_bytes_per_block({"cpu_kvcache_space_bytes": "4294967296",
                                     "num_cpu_blocks": "None"}) is None
    assert worst.kv_bytes_per_block({"kv_cache_memory_bytes": "0",
                                     "num_gpu_blocks": "10"}) is None
    assert worst.kv_bytes_per_block({"kv_cache_memory_bytes": "inf",
                                     "num_gpu_blocks": "10"}) is None


def test_a_leaks_size_in_words() -> None:
    size = worst.leak_size(120.04, 16, 2 * 2**20)
    assert size == {"blocks": 120.0, "tokens": 1921.0, "gib": 0.234}
    assert worst.describe_size(size) == "120 blocks (1,921 tokens, 0.23 GiB)"
    assert worst.describe_size(worst.leak_size(1200, None, None)) == "1,200 blocks"
    assert worst.describe_size(worst.leak_size(None, 16, 1.0)) == "size unknown"


def test_an_interrupted_run_exits_130_with_its_verdict_so_far() -> None:
    run = judged(idle_holding(12))
    run.interrupted = True
    assert run.exit_code() == EXIT_INTERRUPTED == 130
    assert run.to_json()["interrupted"] is True and run.to_json()["verdict"] == "leak"


def test_the_kv_event_witness_in_json_is_the_worst_it_reached() -> None:
    verdict = EngineVerdict("m", "0")
    evidence = kv_event_stats(leak="evidence", leak_reason="3 blocks unused", leaked_blocks=3,
                              leaked_sample=(0xAB, 2**64 - 1), turnovers=4.236,
                              lost_batches=1, malformed=2, restarts=3)
    verdict.observe_kv_events(T0, kv_event_stats(leak="too_early"))
    verdict.observe_kv_events(T0 + 10, evidence)
    verdict.observe_kv_events(T0 + 20, kv_event_stats(leak="none"))  # lower: not the worst
    assert verdict.to_json()["kv_events"] == {
        "leak": "evidence", "reason": "3 blocks unused", "evidence_first_t": T0 + 10,
        "leaked_blocks": 3, "leaked_sample": ["00000000000000ab", "ffffffffffffffff"],
        "turnovers": 4.24, "stored_total": 500, "removed_total": 400, "lost_batches": 1,
        "malformed": 2, "restarts": 3}
    same_rank = kv_event_stats(leak="evidence", leaked_blocks=5)
    verdict.observe_kv_events(T0 + 30, same_rank)  # as bad: the latest figures
    assert verdict.kv_events is same_rank and verdict.kv_evidence_first_t == T0 + 10
    assert EngineVerdict("m", "0").to_json()["kv_events"] is None


def test_an_engine_keeps_its_span_block_size_and_block_bytes_across_scrapes() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.seen(T0 + 50, 16, {"kv_cache_memory_bytes": "1600", "num_gpu_blocks": "100"})
    verdict.seen(T0 + 10, None, None)  # an older scrape, saying nothing of the blocks
    verdict.seen(T0 + 30, 0, {"num_gpu_blocks": "100"})
    assert (verdict.first_t, verdict.last_t) == (T0 + 10, T0 + 50)
    assert (verdict.block_size, verdict.bytes_per_block) == (16, 16.0)
    verdict.seen(T0 + 60, 32, {"kv_cache_memory_bytes": "6400", "num_gpu_blocks": "100"})
    assert (verdict.block_size, verdict.bytes_per_block) == (32, 64.0)


def with_block_bytes(text: str) -> str:
    return text.replace('num_gpu_blocks="1000"',
                        'num_gpu_blocks="1000",kv_cache_memory_bytes="2097152000"')


def test_a_leak_read_from_scrapes_gives_its_size_in_gib_where_the_server_says() -> None:
    scrapes = [read_scrape(Scrape(TARGET, T0 + STEP * i, body=with_block_bytes(body(0.04))))
               for i in range(12)]
    entry = engine(judged(scrapes))
    assert (entry["leaked_blocks"], entry["leaked_tokens"]) == (39.0, 624.0)
    assert entry["leaked_gib"] == round(39 * 2 * 2**20 / 2**30, 3)


def test_the_size_keeps_a_tenth_of_a_block() -> None:
    assert worst.leak_size(12.34, None, None) == {"blocks": 12.3, "tokens": None, "gib": None}


def test_a_value_of_exactly_one_is_a_number_of_bytes_or_blocks() -> None:
    assert worst.kv_bytes_per_block({"kv_cache_memory_bytes": "1", "num_gpu_blocks": "1"}) == 1


def test_the_warm_up_counts_from_the_first_good_scrape_to_the_last() -> None:
    params = LeakParams(trend_min_span_s=600.5)  # 10 min and half a second
    assert "needs 11 more minutes" in worst.warmup_needs(params, T0, T0)
    assert "needs 11 more minutes" in worst.warmup_needs(params, None, T0)
    assert "needs 11 more minutes" in worst.warmup_needs(params, T0, None)
    assert "needs 10 more minutes" in worst.warmup_needs(params, T0, T0 + 0.5)
    assert worst.seen_span(T0 + 5, T0) == 0.0 and worst.seen_span(T0, T0 + 2.5) == 2.5


def test_what_unknown_needs_follows_the_runs_own_thresholds_and_closest_engine() -> None:
    params = LeakParams(trend_min_span_s=3600.0)
    run = CheckRun(params)
    short = Target.from_spec("127.0.0.1:8001")  # listed first, seen for a minute only
    run.feed(read_scrape(Scrape(short, T0, body=body(0.5, running=2, model="short"))))
    run.feed(read_scrape(Scrape(short, T0 + 60, body=body(0.5, running=2, model="short"))))
    run.feed(read_scrape(Scrape(TARGET, T0, body=body(0.5, running=2, model="long"))))
    run.feed(read_scrape(Scrape(TARGET, T0 + 600, body=body(0.5, running=2, model="long")
                                + body(0.5, running=2, model="new"))))
    run.feed(read_scrape(Scrape(TARGET, T0 + 660, body=body(0.5, running=2, model="long")
                                + body(0.5, running=2, model="new"))))
    assert run.verdict() == "unknown"
    assert run.needs() is not None and run.needs().startswith("needs 49 more minutes")
    entries = {e["model"]: e["needs"] for t in run.to_json()["targets"] for e in t["engines"]}
    assert entries["long"].startswith("needs 49 more minutes")
    assert entries["new"].startswith("needs 59 more minutes")


def test_a_judged_run_or_engine_needs_nothing() -> None:
    run = judged(quiet(12))
    other = Target.from_spec("127.0.0.1:8001")
    run.feed(read_scrape(Scrape(other, T0, body=body(0.5, running=2))))
    run.feed(read_scrape(Scrape(other, T0 + 300, body=body(0.5, running=2))))
    assert run.verdict() == "ok" and run.needs() is None
    assert engine(judged(quiet(12)))["needs"] is None


def test_a_failed_or_older_scrape_does_not_stretch_an_engines_span() -> None:
    older = judged(idle_holding(3))  # T0 .. T0 + 20; the tracker keeps its engines
    older.feed(read_scrape(Scrape(TARGET, T0 - 100, body=body(0.04))))
    entry = older.engines[TARGET.url][("m", "0")]
    assert (entry.first_t, entry.last_t) == (T0, T0 + 20)
    assert (older.first_t, older.last_t) == (T0 - 100, T0 + 20)
    failed = judged(idle_holding(3))
    failed.feed(Scrape(TARGET, T0 + 90, failure="down", error="refused"))
    entry = failed.engines[TARGET.url][("m", "0")]
    assert (entry.first_t, entry.last_t) == (T0, T0 + 20)
    assert (failed.first_t, failed.last_t) == (T0, T0 + 90)


def test_trackers_are_trimmed_only_past_the_cap_and_an_eighth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worst, "MAX_TRACKED_TARGETS", 16)
    run = CheckRun()
    for i in range(18):  # 16 + 16 // 8: kept
        run.feed(Scrape(Target(f"http://10.0.0.{i}:8000/metrics"), T0 + i, failure="down"))
    assert len(run.trackers) == 18
    run.feed(Scrape(Target("http://10.0.1.0:8000/metrics"), T0 + 18, failure="down"))
    assert len(run.trackers) == 16
    assert "http://10.0.0.2:8000/metrics" not in run.trackers
    assert "http://10.0.0.3:8000/metrics" in run.trackers
    assert run.trackers["http://10.0.1.0:8000/metrics"].state.target.url == (
        "http://10.0.1.0:8000/metrics")
