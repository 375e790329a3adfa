"""One engine's KV events folded: counts and rates, age at eviction, reuse per chain, hot
prefixes in tokens, and the exact leak evidence at its threshold (a block unused for
exactly three turnovers of the pool, and one removal fewer); an index that could miss a
removal (lost batches, a malformed one, a restart) starts over instead of accusing."""

from __future__ import annotations

import pytest

from kvtop.collect.kv_events import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch
from kvtop.derive.kv_anatomy import AnatomyParams, KvAnatomy


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
    feed = Feed(KvAnatomy(AnatomyParams(scan_every_s=5.0)))
    feed.batch(stored(1))
    feed.churn(300)
    assert feed.anatomy.stats(10.0, 100).leak == "evidence"
    feed.batch(stored(2, parent=1))  # 1 used again
    assert feed.anatomy.stats(14.9, 100).leak == "evidence"  # the scan of 10.0
    assert feed.anatomy.stats(15.0, 100).leak == "none"
