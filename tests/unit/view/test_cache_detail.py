"""The detail view's KV cache lines (view/cache_detail.py): the limit with the numbers behind
it, every family's absence said, the hottest prefixes and the exact evidence's blocks as 16
hex digits with token counts (never token text), the evidence told as its own witness, and
the channel's counts."""

from __future__ import annotations

from dataclasses import replace

from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, RankStatus
from kvtop.derive.stats import EngineStats, HotPrefix, Quantiles, Residency, Reuse
from kvtop.derive.verdicts import LimitVerdict
from kvtop.view.cache_detail import cache_detail_lines
from tests.scenarios.kv_cache import kv_event_stats as events

NOW = 10_000.0


def test_a_server_exporting_none_of_it_says_so_line_by_line() -> None:
    lines = cache_detail_lines(EngineStats("m", "0", NOW), None)
    assert lines == [
        "limit   not judged for this server",
        "reuse   not exported (vLLM 0.16+: prompt tokens by source)",
        "resid.  not exported (vLLM 0.12+ with --kv-cache-metrics)",
        "events  KV events off (no kv_events endpoint)"]
    off = cache_detail_lines(EngineStats("m", "0", NOW, residency=Residency("off")), None)
    assert "resid.  off: start vLLM with --kv-cache-metrics" in off
    none_yet = cache_detail_lines(EngineStats("m", "0", NOW, residency=Residency("on")), None)
    assert none_yet[2] == ("resid.  p50/p90/p99  lifetime none evicted yet   idle before evict "
                           "none evicted yet   reuse gap none evicted yet")


def test_the_limit_its_numbers_and_why_requests_wait() -> None:
    stats = EngineStats("m", "0", NOW, limit=LimitVerdict(
        "kv_capacity", "3 wait, pool 96% used", {"waiting": 3.0, "kv_usage": 0.96}),
        waiting_by_reason={"capacity": 3.0, "deferred": 0.0}, sleep_state="awake")
    limit, numbers, waiting, *_ = cache_detail_lines(stats, None)
    assert limit == "limit   KV capacity  3 wait, pool 96% used"
    assert numbers == "        waiting=3  kv_usage=0.96"
    assert waiting == ("waiting by reason capacity 3  deferred 0   KV fetch not exported   "
                       "refused/s not exported   sleep awake")


def test_the_events_name_blocks_by_hash_and_the_evidence_is_its_own_witness() -> None:
    found = events(leak="evidence", leak_reason="31 blocks unused for 3+ turnovers",
                   leaked_blocks=31, leaked_sample=(7, 0xDEADBEEF), turnovers=3.5,
                   hot=(HotPrefix(0x8107D90E7954426B, 2048, 50),))
    channel = KvChannel(KvEventsEndpoint("tcp://gpu-1:5557"),
                        [RankStatus(0, "connected", gaps=2, recovered=2)])
    lines = cache_detail_lines(replace(EngineStats("m", "0", NOW), kv_events=found), channel)
    events_at = next(i for i, line in enumerate(lines) if line.startswith("events"))
    stored, ages, hot, exact, named, channel_line = lines[events_at:]
    assert stored == ("events  stored 500 (+12/s)  removed 400 (−11/s)  cached 100  reuses 5 "
                      "(10% of chains)  cleared 0")
    assert ages == "        age at eviction no block evicted yet   media GPU +500/−400"
    assert hot == "        hot prefixes 8107d90e7954426b 2048 tok ×50"
    assert exact == ("exact   EVIDENCE  31 blocks unused for 3+ turnovers   pool 999   "
                     "turnovers 3.50")
    assert named == ("        longest unused 0000000000000007  00000000deadbeef   (its own "
                     "witness: the leak verdict above does not count it)")
    assert channel_line.startswith("channel tcp://gpu-1:5557 connected  seq 9 (first 0)  lost 0")
    assert channel_line.endswith("gaps 2 recovered 2  bad frames 0")


ENDPOINT = KvEventsEndpoint("tcp://gpu-1:5557")


def test_an_engine_exporting_every_family_reads_line_by_line() -> None:
    stats = EngineStats(
        "m", "0", NOW,
        limit=LimitVerdict("token_budget", "budget spent", {"budget": 2048.0, "phase": "prefill"}),
        waiting_by_reason={"capacity": 1.0, "deferred": 4.0}, kv_fetch_by_stage={},
        admission_rejections_per_s={"max_num_queued_reqs": 0.5},
        reuse=Reuse("lifetime", 12_000.0, {"local_cache_hit": 0.25, "external_kv": 0.05},
                    {"device": 0.2, "host": 0.3}, 0.3, 0.1),
        residency=Residency("on", Quantiles(2.0, 8.0, 30.0, 40, "window"),
                            Quantiles(0.5, 1.0, 2.0, 40, "window"),
                            Quantiles(1.0, 2.0, 4.0, 40, "lifetime")))
    assert cache_detail_lines(stats, KvChannel(ENDPOINT)) == [
        "limit   token budget  budget spent",
        "        budget=2048  phase=prefill",
        "waiting by reason deferred 4  capacity 1   KV fetch none   refused/s "
        "max_num_queued_reqs 0.5   sleep not exported",
        "reuse   30% of 12.0k prompt tokens not computed (since start)   by source "
        "local_cache_hit 25%  external_kv 5%",
        "        by tier host 30%  device 20%   connector hits 10%",
        "resid.  p50/p90/p99  lifetime 2.0s/8.0s/30.0s   idle before evict "
        "500ms/1.0s/2.0s   reuse gap 1.0s/2.0s/4.0s (since start)",
        "events  KV events: waiting for tcp://gpu-1:5557"]


def test_a_limit_said_by_its_word_alone_has_no_numbers_line() -> None:
    quiet = EngineStats("m", "0", NOW, limit=LimitVerdict("none", "nothing waits",
                                                          {"waiting": 0.0}))
    assert cache_detail_lines(quiet, None)[:2] == [
        "limit   nothing waits",
        "waiting by reason not exported   KV fetch not exported   refused/s not exported   "
        "sleep not exported"]
    held = EngineStats("m", "0", NOW, limit=LimitVerdict("kv_capacity", "full"))
    assert cache_detail_lines(held, None)[1].startswith("waiting by reason")  # no evidence


def test_labels_biggest_first_at_most_eight_names_cut_at_24() -> None:
    names = {f"reason_{i}": float(i) for i in range(1, 10)}
    long = {"r" * 24: 2.0, "s" * 25: 1.0}
    for waiting, said in [(names, "  ".join(f"reason_{i} {i}" for i in range(9, 1, -1))),
                          (long, f"{'r' * 24} 2  {'s' * 23}… 1")]:
        stats = EngineStats("m", "0", NOW, limit=LimitVerdict("none", "nothing waits"),
                            waiting_by_reason=waiting)
        assert cache_detail_lines(stats, None)[1] == (
            f"waiting by reason {said}   KV fetch not exported   refused/s not exported   "
            "sleep not exported")


def test_reuse_over_the_window_without_a_connector() -> None:
    reuse = Reuse("window", 500.0, {}, None, 0.5, None)
    stats = EngineStats("m", "0", NOW, reuse=reuse)
    assert cache_detail_lines(stats, None)[1:3] == [
        "reuse   50% of 500 prompt tokens not computed (window)   by source none",
        "        by tier not exported"]


def test_the_events_lines_before_the_exact_witness_can_judge() -> None:
    seen = events(leak="too_early", turnovers=None, index_dropped=12_000, removed_unknown=1500,
                  age_at_eviction=Quantiles(1.0, 2.0, 3.0, 5, "window"),
                  hot=(HotPrefix(1, 16, 2), HotPrefix(2, 32, 3)),
                  by_medium={"GPU": (500, 400), "twelve_chars": (7, 0),
                             "CPU_offload_tier": (5, 1)})
    lines = cache_detail_lines(replace(EngineStats("m", "0", NOW), kv_events=seen), None)
    assert lines[3:] == [
        "events  stored 500 (+12/s)  removed 400 (−11/s)  cached 100  reuses 5 "
        "(10% of chains)  cleared 0",
        "        age at eviction p50 1.0s p99 3.0s   media GPU +500/−400  twelve_chars +7/−0  "
        "CPU_offload… +5/−1",
        "        hot prefixes 0000000000000001 16 tok ×2  0000000000000002 32 tok ×3",
        "exact   too early  every cached block was used within 3 pool turnovers   pool 999   "
        "turnovers –",
        "channel seq 9 (first 0)  lost 0  malformed 0  unknown events 0  restarts 0  "
        "index dropped 12.0k  removed unknown 1500"]


def test_the_exact_head_in_each_state_and_no_blocks_named_without_evidence() -> None:
    def exact(**changes: object) -> list[str]:
        lines = cache_detail_lines(replace(EngineStats("m", "0", NOW),
                                           kv_events=events(**changes)), None)
        return [line for line in lines if line.startswith("exact") or "longest" in line]

    reason = "every cached block was used within 3 pool turnovers"
    assert exact() == [f"exact   none  {reason}   pool 999   turnovers 4.20"]
    assert exact(leak="unknown") == [f"exact   unknown  {reason}   pool 999   turnovers 4.20"]
    hot = cache_detail_lines(replace(EngineStats("m", "0", NOW), kv_events=events()), None)
    assert "        hot prefixes none yet" in hot


def test_a_long_endpoint_is_cut_at_60_in_the_channel_line() -> None:
    url = "tcp://" + "g" * 49 + ":5557"  # 60 characters: whole
    for endpoint, said in [(url, url), (url + "7", url[:59] + "…")]:
        channel = KvChannel(KvEventsEndpoint(endpoint), [RankStatus(0, "connected")])
        lines = cache_detail_lines(replace(EngineStats("m", "0", NOW), kv_events=events()),
                                   channel)
        assert lines[-1].startswith(f"channel {said} connected  seq 9")


def test_the_evidence_names_its_first_four_blocks() -> None:
    found = events(leak="evidence", leaked_blocks=5, leaked_sample=(1, 2, 3, 4, 5))
    lines = cache_detail_lines(replace(EngineStats("m", "0", NOW), kv_events=found), None)
    assert lines[-2] == ("        longest unused 0000000000000001  0000000000000002  "
                         "0000000000000003  0000000000000004   (its own witness: the leak "
                         "verdict above does not count it)")
