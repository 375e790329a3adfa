"""The detail view's KV cache lines (view/cache_detail.py): the limit with the numbers behind
it, every family's absence said, the hottest prefixes and the exact evidence's blocks as 16
hex digits with token counts (never token text), the evidence told as its own witness, and
the channel's counts."""

from __future__ import annotations

from dataclasses import replace

from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, RankStatus
from kvtop.derive.stats import EngineStats, HotPrefix, Residency
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
