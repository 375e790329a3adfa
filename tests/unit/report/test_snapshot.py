"""The snapshot JSON as scripts read it (docs/snapshot-json.md): every key carries its own
number with the documented rounding, unknown is null, and the document's frame is exact."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.stats import (
    EngineStats,
    HotPrefix,
    KvEventStats,
    Quantiles,
    Residency,
    Reuse,
)
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.derive.verdicts import LeakVerdict, LimitVerdict, StallVerdict
from kvtop.report.snapshot import (
    SNAPSHOT_MINOR,
    SNAPSHOT_VERSION,
    engine_json,
    history_json,
    snapshot_document,
    target_json,
)
from tests.support.paths import fixture_text

TARGET = Target.from_spec("127.0.0.1:8000")


def full_stats() -> EngineStats:
    """An engine with every number set, each with more decimals than the contract keeps."""
    return EngineStats(
        model="twin-llama", engine="0", t=1000.0, kv_usage=0.98163606010, cpu_kv_usage=0.1234567,
        blocks_total=599, blocks_used=588.1234567, block_size=16, tokens_total=9600,
        tokens_used=9423.777, running=30.0, waiting=149.0, swapped=2.0,
        preemptions_total=68.0, prefix_queries_total=65720.0, prefix_hits_total=24320.0,
        prefix_unit="tokens", hit_rate=0.36812345678, hit_rate_scope="window",
        prompt_tps=4870.44444, generation_tps=2352.98765, preemptions_per_s=6.234567,
        finished_per_s={"length": 17.987654, "stop": 0.0}, window_s=1.2344999,
        ttft=Quantiles(0.2412345678, 0.4512345678, 0.4912345678, 149.0, "window"),
        itl=Quantiles(0.0112345678, None, math.nan, 3000.0, "lifetime"),
        restarted=True, idle_floor_blocks=1, prefix_caching=True,
        leak=LeakVerdict("LEAK", "the idle floor holds 172 blocks", 172.345, 3.14159, 2.34567),
        stall=StallVerdict("stalled", "no tokens for 12 s with 149 waiting", 1234.5,
                           {"running": 30.0}),
        waiting_by_reason={"capacity": 149.0, "deferred": 0.0},
        kv_fetch_by_stage=None, sleep_state="awake",
        admission_rejections_per_s={"max_num_queued_reqs": 0.123456},
        evicted_tokens_per_s=None, mean_prompt_tokens=326.6912,
        reuse=Reuse("window", 4870.444, {"local_compute": 0.63123456, "local_cache_hit":
                                         0.36876544}, None, 0.36876544, None),
        residency=Residency("on", Quantiles(1.23456789, 2.0, 4.0, 20.0, "window")),
        limit=LimitVerdict("kv_capacity", "KV pool 98% used, 149 waiting",
                           {"waiting": 149.0, "kv_usage": 0.98163606010, "reasons": "x"}),
        kv_events=KvEventStats(
            batches=10, stored_total=40, removed_total=30, cleared=1, population=10,
            index_dropped=0, removed_unknown=2, reuses=3, stored_events=12,
            stored_per_s=4.12345, removed_per_s=3.0, reuses_per_s=None,
            age_at_eviction=None, hot=(HotPrefix(255, 256, 3),), leak="evidence",
            leak_reason="1 blocks unused", leaked_blocks=1, leaked_sample=(1 << 63,),
            turnovers=3.14159, pool_blocks=599, lost_batches=0, malformed=0,
            unknown_events=4, restarts=0, last_seq=9, first_seq=0, by_medium={"GPU": (40, 30)}),
    )


def test_every_engine_number_has_its_key_and_its_rounding() -> None:
    assert engine_json(full_stats()) == {
        "model": "twin-llama",
        "engine": "0",
        "kv": {"usage": 0.981636, "blocks_total": 599, "blocks_used": 588.123,
               "block_size": 16, "tokens_total": 9600, "tokens_used": 9423.8,
               "idle_floor_blocks": 1, "cpu_usage": 0.123457},
        "requests": {"running": 30.0, "waiting": 149.0, "swapped": 2.0},
        "prefix_cache": {"hit_rate": 0.368123, "hit_rate_scope": "window",
                         "queries_total": 65720.0, "hits_total": 24320.0, "unit": "tokens"},
        "preemptions_total": 68.0,
        "rates": {"window_s": 1.234, "prompt_tokens_per_s": 4870.444,
                  "generation_tokens_per_s": 2352.988, "preemptions_per_s": 6.2346,
                  "finished_per_s": {"length": 17.9877, "stop": 0.0}},
        "latency_s": {
            "ttft": {"p50": 0.241235, "p90": 0.451235, "p99": 0.491235, "samples": 149.0,
                     "scope": "window", "estimate": True},
            "itl": {"p50": 0.011235, "p90": None, "p99": None, "samples": 3000.0,
                    "scope": "lifetime", "estimate": True},
            "e2e": None,
        },
        "restarted": True,
        "leak": {"state": "LEAK", "reason": "the idle floor holds 172 blocks",
                 "leaked_blocks": 172.3, "slope_blocks_per_hour": 3.1, "hours_to_full": 2.35},
        "stall": {"state": "stalled", "reason": "no tokens for 12 s with 149 waiting",
                  "since_t": 1234.5},  # its evidence stays inside kvtop
        "cache": {
            "waiting_by_reason": {"capacity": 149.0, "deferred": 0.0},
            "kv_fetch_by_stage": None, "sleep_state": "awake",
            "admission_rejections_per_s": {"max_num_queued_reqs": 0.1235},
            "evicted_tokens_per_s": None, "mean_prompt_tokens": 326.7,
            "reuse": {"scope": "window", "prompt_tokens": 4870.4,
                      "by_source": {"local_compute": 0.631235, "local_cache_hit": 0.368765},
                      "by_tier": None, "reuse_share": 0.368765, "external_hit_rate": None},
            "residency": {"state": "on",
                          "lifetime_s": {"p50": 1.234568, "p90": 2.0, "p99": 4.0,
                                         "samples": 20.0, "scope": "window", "estimate": True},
                          "idle_s": None, "reuse_gap_s": None},
        },
        "limit": {"limit": "kv_capacity", "reason": "KV pool 98% used, 149 waiting",
                  "evidence": {"waiting": 149.0, "kv_usage": 0.981636, "reasons": "x"}},
        "kv_events": {
            "batches": 10, "first_seq": 0, "last_seq": 9, "stored_total": 40,
            "removed_total": 30, "cleared": 1, "population": 10, "stored_per_s": 4.123,
            "removed_per_s": 3.0, "reuses": 3, "reuses_per_s": None, "reuse_share": 0.25,
            "age_at_eviction_s": None,
            "hot_prefixes": [{"block_hash": "00000000000000ff", "tokens": 256, "reuses": 3}],
            "leak": {"state": "evidence", "reason": "1 blocks unused", "leaked_blocks": 1,
                     "leaked_sample": ["8000000000000000"], "turnovers": 3.14,
                     "pool_blocks": 599},
            "completeness": {"lost_batches": 0, "malformed": 0, "unknown_events": 4,
                             "restarts": 0, "removed_unknown": 2, "index_dropped": 0},
            "by_medium": {"GPU": {"stored": 40, "removed": 30}},
        },
    }


def test_an_engine_with_nothing_known_is_all_null_not_zero() -> None:
    doc = engine_json(EngineStats(model=None, engine=None, t=0.0, kv_usage=math.inf))
    assert doc["kv"]["usage"] is None
    assert doc["requests"] == {"running": None, "waiting": None, "swapped": None}
    assert doc["rates"]["prompt_tokens_per_s"] is None and doc["leak"] is None
    assert doc["stall"] is None
    assert doc["restarted"] is False
    assert doc["limit"] is None and doc["kv_events"] is None
    assert doc["cache"] == {"waiting_by_reason": None, "kv_fetch_by_stage": None,
                            "sleep_state": None, "admission_rejections_per_s": None,
                            "evicted_tokens_per_s": None, "mean_prompt_tokens": None,
                            "reuse": None, "residency": None}


def test_target_entry_of_a_read_server() -> None:
    tracker = TargetTracker(TARGET)
    idle = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    tracker.update(read_scrape(Scrape(TARGET, 100.0, body=idle, version="0.33.0")))
    entry = target_json(tracker.state, now=102.25)
    assert {k: v for k, v in entry.items() if k != "engines"} == {
        "target": "http://127.0.0.1:8000/metrics", "name": None, "label": "127.0.0.1:8000",
        "status": "up", "error": None,
        "server": {"kind": "vllm", "version": "0.33.0", "version_inferred": False},
        "last_good_age_s": 2.25, "restarted_at": None, "notes": [],
        "engines_over_cap": 0, "impossible_values": 0,
    }
    assert [(e["model"], e["engine"]) for e in entry["engines"]] == [("twin-llama", "0")]


def test_a_target_never_read_is_down_with_no_age_and_unknown_server() -> None:
    entry = target_json(TargetState(target=TARGET), now=5.0)
    assert (entry["status"], entry["last_good_age_s"], entry["server"]) == (
        "down", None, {"kind": "unknown", "version": None, "version_inferred": False})
    assert entry["engines"] == []


def test_the_age_is_rounded_to_milliseconds() -> None:
    state = TargetState(target=TARGET, status="stale", last_good_t=100.0)
    assert target_json(state, now=101.23456)["last_good_age_s"] == 1.235


def test_history_is_columns_per_engine() -> None:
    rows = [EngineStats("m", "0", t, kv_usage=0.1234567 * t, blocks_used=10.12345 * t,
                        running=t, waiting=2 * t, hit_rate=0.5, generation_tps=1.23456 * t)
            for t in (1.0, 2.0)]
    assert history_json({("m", "0"): rows}) == [{
        "model": "m", "engine": "0", "t": [1.0, 2.0],
        "kv_usage": [0.123457, 0.246913], "blocks_used": [10.123, 20.247],
        "running": [1.0, 2.0], "waiting": [2.0, 4.0], "hit_rate": [0.5, 0.5],
        "generation_tokens_per_s": [1.235, 2.469],
    }]


def test_the_document_frame() -> None:
    taken = datetime(2026, 11, 30, 3, 4, 6, 373000, tzinfo=timezone.utc)
    read, other = TargetState(target=TARGET), TargetState(target=Target.from_spec("h:9"))
    rows = [EngineStats("m", "0", 1.0)]
    doc = snapshot_document([read, other], [{"name": "gpu"}], taken_at=taken,
                            history={TARGET.url: {("m", "0"): rows}})
    assert doc["kvtop_snapshot"] == SNAPSHOT_VERSION == 1
    assert doc["kvtop_snapshot_minor"] == SNAPSHOT_MINOR == 1  # the cache, limit, KV events
    assert doc["taken_at"] == "2026-11-30T03:04:06.373+00:00"
    assert doc["gpus"] == [{"name": "gpu"}] and doc["gpu_sources"] == []
    assert [t["target"] for t in doc["targets"]] == [TARGET.url, "http://h:9/metrics"]
    assert doc["targets"][0]["history"][0]["t"] == [1.0]
    assert "history" not in doc["targets"][1]  # only the targets the app kept history for
    assert "history" not in snapshot_document([read], [], taken_at=taken)["targets"][0]
    sources = [{"source": "nvml", "status": "unavailable"}]
    assert snapshot_document([], [], taken_at=taken, gpu_sources=sources)["gpu_sources"] == sources
