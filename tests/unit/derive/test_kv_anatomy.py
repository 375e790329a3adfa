"""One engine's KV events folded: counts and rates, age at eviction, reuse per chain, hot
prefixes in tokens, and the exact leak evidence at its threshold (a block unused for
exactly three turnovers of the pool, and one removal fewer); an index that could miss a
removal (lost batches, a malformed one, a restart) starts over instead of accusing."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from kvtop.collect.kv_events import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch
from kvtop.derive.kv_anatomy import AnatomyParams, KvAnatomy
from kvtop.derive.stats import KvEventStats, Quantiles


class Feed:
    """Batches for one rank, numbered in order, at one publisher second each."""

    def __init__(self, anatomy: KvAnatomy | None = None) -> None:
        self.anatomy = anatomy or KvAnatomy(AnatomyParams(scan_every_s=0.0))
        self.seq = 0

    def batch(self, *events: KvEvent, ts: float | None = None, **marks: object) -> None:
        ts = float(self.seq) if ts is None else ts
        self.anatomy.fold(KvEventBatch(t=ts, rank=0, seq=self.seq, ts=ts, events=events,
                                       **marks))  # type: ignore[arg-type]
        self.seq += 1

    def churn(self, count: int, start: int = 10_000) -> None:
        """``count`` blocks stored and removed in one batch."""
        keys = tuple(range(start, start + count))
        self.batch(BlockStored(keys, None, 16 * count, 16, "GPU"), BlockRemoved(keys, "GPU"))


def stored(*keys: int, parent: int | None = None, medium: str | None = "GPU") -> BlockStored:
    return BlockStored(keys, parent, 16 * len(keys), 16, medium)


def test_counts_population_and_rates_over_the_window() -> None:
    feed = Feed()
    first = feed.anatomy.stats(100.0, None)
    assert first.stored_per_s is None  # no window yet
    feed.batch(stored(1, 2, 3), stored(4, parent=3))
    feed.batch(BlockRemoved((4, 99), "GPU"))
    got = feed.anatomy.stats(102.0, 1000)
    assert (got.stored_total, got.removed_total, got.population) == (4, 2, 3)
    assert (got.stored_per_s, got.removed_per_s) == (2.0, 1.0)
    assert got.removed_unknown == 1  # 99 was stored before kvtop listened
    assert (got.batches, got.first_seq, got.last_seq) == (2, 0, 1)


def test_age_at_eviction_from_the_publishers_clock() -> None:
    feed = Feed()
    feed.batch(stored(1), ts=10.0)
    feed.batch(BlockRemoved((1,), "GPU"), ts=13.5)
    age = feed.anatomy.stats(0.0, 100).age_at_eviction
    assert age is not None and age.samples == 1 and 2.0 < age.p50 <= 5.0  # bucket (2, 5]


def test_reuse_is_one_per_chain_however_many_blocks_it_hit() -> None:
    feed = Feed()
    feed.batch(stored(1, 2, 3))
    feed.batch(stored(4, parent=3))  # continues 1-2-3: no reuse
    feed.batch(stored(5, 6, parent=3))  # a second chain from 3: a reuse
    feed.batch(stored(1, 2, 3, 4))  # vLLM's "full" report of a hit: one more reuse
    got = feed.anatomy.stats(0.0, 100)
    assert (got.reuses, got.stored_events, got.reuse_share) == (2, 4, 0.5)


def test_the_hottest_prefix_is_its_block_and_its_tokens() -> None:
    feed = Feed()
    feed.batch(stored(1, 2))
    for branch in range(4):
        feed.batch(stored(10 + branch, parent=2))
    hot = feed.anatomy.stats(0.0, 100).hot
    assert [(h.block_hash, h.tokens, h.reuses) for h in hot] == [(2, 32, 3)]


@pytest.mark.parametrize("churned, state", [(300, "evidence"), (299, "none")])
def test_a_block_unused_for_three_turnovers_is_evidence(churned: int, state: str) -> None:
    """Pool of 100 blocks: 300 removals since block 1 was last used make it evidence."""
    feed = Feed()
    feed.churn(1, start=50_000)  # so that 300 removals have passed in both cases
    feed.batch(stored(1))
    feed.batch(stored(2))
    feed.churn(churned)
    feed.batch(stored(3, parent=2))  # 2 is in use: a block was stored on top of it
    got = feed.anatomy.stats(0.0, 100)
    assert got.leak == state
    if state == "evidence":
        assert (got.leaked_blocks, got.leaked_sample) == (1, (1,))
        assert got.leak_reason == ("1 blocks unused for 3+ turnovers of the pool "
                                   "(the oldest 3.0)")
    else:
        assert got.leaked_blocks == 0 and got.leaked_sample == ()
    assert got.turnovers == (churned + 1) / 100


def test_too_early_until_three_turnovers_have_passed() -> None:
    feed = Feed()
    feed.batch(stored(1))
    feed.churn(299)
    got = feed.anatomy.stats(0.0, 100)
    assert got.leak == "too_early" and got.leaked_blocks is None
    assert got.leak_reason == "299 of the 300 removals (3 turnovers of 100 blocks) it takes"


def test_without_a_pool_size_the_most_blocks_cached_stand_for_it() -> None:
    feed = Feed()
    assert feed.anatomy.stats(0.0, None).leak == "unknown"
    feed.batch(stored(*range(1, 11)))  # 10 cached at once
    got = feed.anatomy.stats(0.0, None)
    assert got.pool_blocks == 10 and got.leak == "too_early"


@pytest.mark.parametrize("marks", [{"lost": 2}, {"malformed": True}, {"restart": True}])
def test_an_index_that_may_have_missed_a_removal_starts_over(marks: dict) -> None:
    feed = Feed()
    feed.batch(stored(1))
    feed.churn(300)
    feed.batch(**marks)
    got = feed.anatomy.stats(0.0, 100)
    assert got.population == 0 and got.leak == "too_early"
    assert (got.lost_batches, got.malformed, got.restarts) == (
        marks.get("lost", 0), int(bool(marks.get("malformed"))), int(bool(marks.get("restart"))))


def test_all_blocks_cleared_empties_the_cache() -> None:
    feed = Feed()
    feed.batch(stored(1, 2))
    feed.batch(AllCleared())
    got = feed.anatomy.stats(0.0, 100)
    assert (got.cleared, got.population, got.stored_total) == (1, 0, 2)


def test_other_media_are_counted_not_indexed() -> None:
    feed = Feed()
    feed.batch(stored(1, medium="CPU"), stored(2, medium="GPU"), stored(3, medium=None))
    feed.batch(BlockRemoved((1,), "CPU"))
    got = feed.anatomy.stats(0.0, 100)
    assert got.population == 2 and got.removed_unknown == 0
    assert got.by_medium == {"CPU": (1, 1), "GPU": (1, 0), "None": (1, 0)}


def test_a_publisher_inventing_media_costs_eight_names() -> None:
    feed = Feed()
    feed.batch(*(stored(i, medium=f"M{i}") for i in range(50)))
    media = feed.anatomy.stats(0.0, 100).by_medium
    assert len(media) == 8 and media["other"] == (43, 0)


def test_the_scan_is_made_again_only_after_scan_every_s() -> None:
    feed = Feed(KvAnatomy())  # docs/kv-anatomy.md: every 5 s
    feed.batch(stored(1))
    feed.churn(300)
    assert feed.anatomy.stats(10.0, 100).leak == "evidence"
    feed.batch(stored(2, parent=1))  # 1 used again
    assert feed.anatomy.stats(14.9, 100).leak == "evidence"  # the scan of 10.0
    assert feed.anatomy.stats(15.0, 100).leak == "none"


def test_an_anatomy_that_has_read_nothing_says_so() -> None:
    assert KvAnatomy().stats(0.0, None) == KvEventStats(
        batches=0, stored_total=0, removed_total=0, cleared=0, population=0, index_dropped=0,
        removed_unknown=0, reuses=0, stored_events=0, stored_per_s=None, removed_per_s=None,
        reuses_per_s=None, age_at_eviction=None, hot=(), leak="unknown",
        leak_reason="the pool's size is not known yet (no block cached, no scrape)",
        leaked_blocks=None, leaked_sample=(), turnovers=None, pool_blocks=None, lost_batches=0,
        malformed=0, unknown_events=0, restarts=0, last_seq=None, first_seq=None, by_medium={})


def test_every_count_adds_up_across_batches() -> None:
    feed = Feed()
    feed.batch(stored(1, 2, 3), stored(4, medium="CPU"))
    feed.batch(BlockRemoved((98, 1, 99), "GPU"), BlockRemoved((2,), "GPU"),
               BlockRemoved((4,), "CPU"), BlockRemoved((4,), "CPU"))
    feed.batch(lost=2)
    feed.batch(AllCleared(), AllCleared(), lost=3, restart=True)
    feed.batch(restart=True)
    got = feed.anatomy.stats(0.0, 100)
    assert (got.removed_total, got.removed_unknown, got.cleared) == (6, 2, 2)
    assert (got.lost_batches, got.restarts) == (5, 2)
    assert got.by_medium == {"GPU": (3, 4), "CPU": (1, 2)}


def test_a_publisher_inventing_media_still_counts_the_ones_it_named_first() -> None:
    feed = Feed()
    feed.batch(stored(1, medium="GPU"), *(stored(i, medium=f"M{i}") for i in range(2, 50)))
    feed.batch(stored(100, medium="GPU"), BlockRemoved((100,), "GPU"))
    media = feed.anatomy.stats(0.0, 100).by_medium
    assert media["GPU"] == (2, 1) and media["other"] == (42, 0)


def test_one_copy_of_two_leaving_is_no_eviction() -> None:
    feed = Feed()
    feed.batch(stored(1), stored(1))
    feed.batch(BlockRemoved((1,), "GPU"))
    got = feed.anatomy.stats(0.0, 100)
    assert got.population == 1 and got.age_at_eviction is None


def test_two_evictions_in_one_bucket_count_two() -> None:
    feed = Feed()
    feed.batch(stored(1, 2), ts=10.0)
    feed.batch(BlockRemoved((1, 2), "GPU"), ts=13.5)
    age = feed.anatomy.stats(0.0, 100).age_at_eviction
    assert age is not None and age.samples == 2 and 2.0 < age.p50 <= 5.0  # type: ignore[operator]


def age_of(*stamps: tuple[float, float]) -> Quantiles | None:
    """The age at eviction of block 1, stored and removed at these publisher (ts, t)."""
    feed = Feed()
    (stored_ts, stored_t), (removed_ts, removed_t) = stamps
    feed.anatomy.fold(KvEventBatch(t=stored_t, rank=0, seq=0, ts=stored_ts,
                                   events=(stored(1),)))
    feed.anatomy.fold(KvEventBatch(t=removed_t, rank=0, seq=1, ts=removed_ts,
                                   events=(BlockRemoved((1,), "GPU"),)))
    return feed.anatomy.stats(0.0, 100).age_at_eviction


@pytest.mark.parametrize("stamps, low, high", [
    (((10.0, 100.0), (13.5, 200.0)), 2.0, 5.0),  # the publisher's clock, not kvtop's
    (((None, 10.0), (None, 13.5)), 2.0, 5.0),  # no publisher clock: kvtop's
    (((math.nan, 10.0), (math.nan, 10.5)), 0.2, 0.5),
    (((0.0, 0.0), (1.0, 0.0)), 0.5, 1.0),  # exactly 1 s: the bucket up to 1 s
    (((0.0, 0.0), (1.00146484375, 0.0)), 1.0, 2.0),  # 1001 ms: the next bucket
])
def test_age_at_eviction_by_the_clock_each_batch_has(stamps: tuple, low: float,
                                                     high: float) -> None:
    age = age_of(*stamps)
    assert age is not None and age.samples == 1 and low < age.p50 <= high  # type: ignore[operator]


def test_ages_count_from_each_blocks_own_birth() -> None:
    feed = Feed()
    feed.batch(stored(1), ts=0.0)
    feed.batch(stored(2), ts=10.0)
    feed.batch(BlockRemoved((2,), "GPU"), ts=10.5)
    age = feed.anatomy.stats(0.0, 100).age_at_eviction
    assert age is not None and 0.2 < age.p50 <= 0.5  # type: ignore[operator]


def test_a_publisher_clock_before_its_first_batch_counts_as_that_batch() -> None:
    feed = Feed()
    feed.batch(stored(1), ts=10.0)
    feed.batch(stored(2), ts=5.0)
    feed.batch(BlockRemoved((2,), "GPU"), ts=7.0)
    age = feed.anatomy.stats(0.0, 100).age_at_eviction
    assert age is not None and age.p50 is not None and age.p50 <= 0.001


def approx(age: Quantiles | None) -> tuple[object, ...] | None:
    """Scope, samples and the quantiles (interpolated in their bucket: floats)."""
    return None if age is None else (age.scope, age.samples, (age.p50, age.p90, age.p99))


def test_rates_and_ages_are_over_each_window_between_stats() -> None:
    feed = Feed()
    feed.batch(stored(1), stored(2), ts=0.0)
    feed.batch(BlockRemoved((1,), "GPU"), ts=3.5)
    first = feed.anatomy.stats(100.0, 1000)
    assert (first.stored_per_s, first.removed_per_s, first.reuses_per_s) == (None, None, None)
    assert approx(first.age_at_eviction) == ("lifetime", 1, pytest.approx((3.5, 4.7, 4.97)))
    feed.batch(stored(3, parent=2), stored(5, parent=2), stored(6, parent=2), ts=4.0)
    feed.batch(BlockRemoved((3,), "GPU"), ts=4.5)
    second = feed.anatomy.stats(100.5, 1000)
    assert (second.stored_per_s, second.removed_per_s, second.reuses_per_s) == (6.0, 2.0, 4.0)
    assert approx(second.age_at_eviction) == ("window", 1, pytest.approx((0.35, 0.47, 0.497)))
    third = feed.anatomy.stats(102.5, 1000)
    assert (third.stored_per_s, third.removed_per_s, third.reuses_per_s) == (0.0, 0.0, 0.0)
    assert approx(third.age_at_eviction) == ("lifetime", 2, pytest.approx((0.5, 4.4, 4.94)))


def test_a_block_size_of_one_token_counts_and_none_sent_keeps_the_last() -> None:
    feed = Feed()
    feed.batch(BlockStored((1, 2), None, 2, 1, "GPU"))
    feed.batch(BlockStored((3,), 2, 1, 1, "GPU"), BlockStored((4,), 2, 1, 1, "GPU"))
    assert [h.tokens for h in feed.anatomy.stats(0.0, 100).hot] == [2]
    feed.batch(BlockStored((5,), 2, 0, 0, "GPU"))  # a publisher that does not say
    assert [h.tokens for h in feed.anatomy.stats(0.0, 100).hot] == [2]


def test_a_hot_prefix_without_a_block_size_has_no_tokens() -> None:
    feed = Feed()
    feed.batch(*(BlockStored((key,), None if key == 1 else 1, 0, 0, "GPU") for key in (1, 2, 3)))
    assert [(h.block_hash, h.tokens, h.reuses) for h in feed.anatomy.stats(0.0, 100).hot] == [
        (1, None, 1)]


def test_the_five_most_reused_prefixes_are_shown() -> None:
    feed = Feed()
    for root in range(1, 8):  # root k is reused k times
        feed.batch(stored(root), *(stored(100 * root + b, parent=root) for b in range(root + 1)))
    hot = feed.anatomy.stats(0.0, 1000).hot
    assert [(h.block_hash, h.reuses) for h in hot] == [(7, 7), (6, 6), (5, 5), (4, 4), (3, 3)]


def test_an_index_emptied_twice_is_scanned_afresh_each_time() -> None:
    feed = Feed(KvAnatomy())  # a scan every 5 s
    feed.batch(restart=True)
    feed.batch(stored(1))
    feed.churn(300)
    assert feed.anatomy.stats(10.0, 100).leak == "evidence"
    feed.batch(AllCleared())
    feed.churn(300)
    got = feed.anatomy.stats(11.0, 100)
    assert (got.leak, got.leaked_blocks, got.turnovers) == ("none", 0, 3.0)


def test_an_emptied_index_counts_removals_from_zero() -> None:
    feed = Feed()
    feed.churn(10)
    feed.batch(restart=True)
    got = feed.anatomy.stats(0.0, 100)
    assert got.turnovers == 0.0
    assert got.leak_reason == "0 of the 300 removals (3 turnovers of 100 blocks) it takes"


def test_a_slow_scan_is_made_again_after_twenty_times_its_length(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At most 5 % of a core: a scan that took 1 s is due again 20 s later, not 5 s."""
    clock: Iterator[float] = iter(range(0, 100, 1))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    feed = Feed(KvAnatomy())
    feed.batch(stored(1))
    feed.churn(300)
    assert feed.anatomy.stats(10.0, 100).leak == "evidence"
    feed.batch(stored(2, parent=1))  # 1 used again
    assert feed.anatomy.stats(29.9, 100).leak == "evidence"  # the scan of 10.0
    assert feed.anatomy.stats(30.0, 100).leak == "none"


@pytest.mark.parametrize("peak, churned, state", [
    (1, 1, "evidence"),  # a pool under 32 blocks: slack 1, the walk stops at 1 removal
    (1, 2, "none"),
    (64, 4, "evidence"),  # 64 blocks: slack 4 (1/16)
    (64, 5, "none"),
])
def test_a_prefix_used_within_a_sixteenth_of_a_turnover_is_not_walked(
        peak: int, churned: int, state: str) -> None:
    """Block 3 was last used ``churned`` removals before a block is stored on it: within
    the slack its ancestors keep their old stamps (they were stamped with it); beyond, the
    walk refreshes them."""
    feed = Feed()
    feed.churn(peak, start=50_000)  # the most blocks cached at once: the slack's base
    feed.batch(stored(1, 2, 3))
    feed.churn(churned)
    feed.batch(stored(4, parent=3))
    # a pool of 2 blocks: 6 removals unused make evidence; 1 and 2 were last used at
    # ``peak`` removals if the walk stopped, at ``peak + churned`` if not
    feed.churn(6 - churned, start=60_000)
    assert feed.anatomy.stats(0.0, 2).leak == state
