"""One engine's KV events folded into what a person reads: blocks stored and removed per
second, the cached population, age at eviction, reuse, the hottest prefixes, and the exact
leak evidence (method and thresholds: docs/kv-anatomy.md).

**Exact leak evidence** is a witness of its own, beside the leak detector's verdict and
never merged into it: the blocks that have gone unused (not removed, not stored again, no
block stored on top of them or of any block after them) for ``leak_turnovers`` full
turnovers of the pool. vLLM evicts free cached blocks in the order they were freed, so after
one turnover (``pool`` blocks removed) every free block nobody used is gone; a block that
outlives several is held, and held by a request that stores nothing: leaked (or a prefix hit
by requests that store no new block, the blind spot the docs name).

The index only vouches for what it saw whole: a gap that replay could not fill, a malformed
batch or a publisher restart empties it (a missed removal would otherwise leave a block that
is long gone), and ``AllBlocksCleared`` does too, as vLLM's cache did.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from dataclasses import dataclass

from kvtop.collect.kv_events import AllCleared, BlockRemoved, BlockStored, KvEventBatch
from kvtop.collect.reading import Histogram
from kvtop.derive.kv_index import DEFAULT_CAP, BlockIndex, Scan
from kvtop.derive.quantiles import quantiles
from kvtop.derive.stats import HotPrefix, KvEventStats
from kvtop.derive.verdicts import KvLeakState

# Age at eviction, seconds: vLLM's residency buckets, so both can be read side by side.
AGE_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0,
              30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, math.inf)
POOL_MEDIA = frozenset({"GPU", None})  # blocks of the device pool; other tiers are counted only
MAX_MEDIA = 8  # media named in by_medium; the rest are counted under "other"


@dataclass(frozen=True)
class AnatomyParams:
    leak_turnovers: float = 3.0  # full pool turnovers a block must go unused to be evidence
    scan_every_s: float = 5.0  # the leak/hot scan reads the whole index at most this often,
    scan_share: float = 0.05  # and takes at most this share of a core (1M blocks: ~0.5 s)
    hot_prefixes: int = 5
    index_cap: int = DEFAULT_CAP  # blocks per target: its ranks share it (derive/tracker.py)
    slack_fraction: float = 1 / 16  # a prefix used within this share of a turnover: not walked


@dataclass(slots=True)
class _Mark:
    """The counters at the last stats, for rates and the window's ages."""

    t: float
    stored: int
    removed: int
    reuses: int
    ages: tuple[int, ...]


class KvAnatomy:
    """Feed an engine's batches in order (:meth:`fold`); read :meth:`stats` per scrape."""

    def __init__(self, params: AnatomyParams | None = None) -> None:
        self.params = params or AnatomyParams()
        self.index = BlockIndex(self.params.index_cap)
        self.batches = self.stored = self.removed = self.cleared = self.reuses = 0
        self.stored_events = self.removed_unknown = self.lost = self.malformed = 0
        self.unknown = self.restarts = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.peak = 0  # most blocks cached at once: the pool, when the metrics say nothing
        self.block_size: int | None = None  # tokens a block, as the events say
        self.media: dict[str | None, list[int]] = {}
        self._ages = [0] * len(AGE_BOUNDS)
        self._epoch: float | None = None  # publisher time of born_ms 0
        self._generation = 0  # bumped when the index empties: a cached scan is stale
        self._scan: tuple[float, int, Scan] | None = None  # (next due, generation, scan)
        self._mark: _Mark | None = None

    # -- folding ---------------------------------------------------------------------

    def fold(self, batch: KvEventBatch) -> None:
        if batch.restart:
            self.restarts += 1
            self._empty()
            self._epoch = None
        if batch.lost:
            self.lost += batch.lost
            self._empty()
        self.batches += 1
        self.unknown += batch.unknown
        if self.first_seq is None:
            self.first_seq = batch.seq
        self.last_seq = batch.seq
        if batch.malformed:
            self.malformed += 1
            self._empty()
            return
        clock = batch.ts if batch.ts is not None and math.isfinite(batch.ts) else batch.t
        if self._epoch is None:
            self._epoch = clock
        born = max(0, int((clock - self._epoch) * 1000))
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event, born)
            elif isinstance(event, BlockRemoved):
                self._removed(event, born)
            elif isinstance(event, AllCleared):
                self.cleared += 1
                self._empty()

    def _medium(self, medium: str | None) -> list[int]:
        counts = self.media.get(medium)
        if counts is None:
            key = medium if len(self.media) < MAX_MEDIA - 1 else "other"
            counts = self.media.setdefault(key, [0, 0])
        return counts

    def _stored(self, event: BlockStored, born: int) -> None:
        count = len(event.hashes)
        self.stored += count
        self.stored_events += 1
        self._medium(event.medium)[0] += count
        if event.medium not in POOL_MEDIA:
            return
        index, parent, slack, reused = self.index, event.parent, self._slack(), False
        for key in event.hashes:
            reused |= index.store(key, parent, born, slack)
            parent = key
        self.reuses += reused  # one chain, one reuse: however many of its blocks were hits
        self.peak = max(self.peak, len(index))
        if event.block_size > 0:
            self.block_size = event.block_size

    def _removed(self, event: BlockRemoved, now: int) -> None:
        count = len(event.hashes)
        self.removed += count
        self._medium(event.medium)[1] += count
        if event.medium not in POOL_MEDIA:
            return
        ages = self._ages
        for key in event.hashes:
            if key not in self.index:
                self.removed_unknown += 1
                continue
            born = self.index.remove(key)
            if born is not None:
                ages[bisect_left(AGE_BOUNDS, max(0, now - born) / 1000)] += 1

    def _slack(self) -> int:
        return max(1, int(self.peak * self.params.slack_fraction))

    def _empty(self) -> None:
        self.index.clear()
        self.index.removals = 0
        self._generation += 1

    # -- reading ---------------------------------------------------------------------

    def stats(self, t: float, pool_blocks: int | None) -> KvEventStats:
        """The numbers now; rates and ages over the time since the last call."""
        mark, ages = self._mark, tuple(self._ages)
        window = t - mark.t if mark is not None else 0.0
        histogram = _histogram(ages)
        rates: tuple[float | None, float | None, float | None]
        if mark is not None and window > 0:
            age = quantiles(histogram, _histogram(mark.ages), "window") or quantiles(
                histogram, None, "lifetime")
            rates = ((self.stored - mark.stored) / window, (self.removed - mark.removed) / window,
                     (self.reuses - mark.reuses) / window)
        else:
            age, rates = quantiles(histogram, None, "lifetime"), (None, None, None)
        self._mark = _Mark(t, self.stored, self.removed, self.reuses, ages)
        pool = pool_blocks or self.peak or None
        scan = self._scanned(t, pool)
        leak, reason = self._leak(pool, scan)
        return KvEventStats(
            batches=self.batches, stored_total=self.stored, removed_total=self.removed,
            cleared=self.cleared, population=len(self.index),
            index_dropped=self.index.dropped, removed_unknown=self.removed_unknown,
            reuses=self.reuses, stored_events=self.stored_events, stored_per_s=rates[0],
            removed_per_s=rates[1], reuses_per_s=rates[2], age_at_eviction=age,
            hot=self._hot(scan), leak=leak, leak_reason=reason,
            leaked_blocks=scan.stale if leak in ("none", "evidence") and scan else None,
            leaked_sample=scan.sample if leak == "evidence" and scan else (),
            turnovers=self.index.removals / pool if pool else None, pool_blocks=pool,
            lost_batches=self.lost, malformed=self.malformed, unknown_events=self.unknown,
            restarts=self.restarts, last_seq=self.last_seq, first_seq=self.first_seq,
            by_medium={str(m): (c[0], c[1]) for m, c in self.media.items()})

    def _scanned(self, t: float, pool: int | None) -> Scan | None:
        """The index scan, made again after scan_every_s or after 1/scan_share times its
        own length, whichever is later (at once when the index emptied since)."""
        if pool is None:
            return None
        cached, p = self._scan, self.params
        if cached is not None and cached[1] == self._generation and t < cached[0]:
            return cached[2]
        started = time.perf_counter()
        scan = self.index.scan(math.ceil(p.leak_turnovers * pool), p.hot_prefixes)
        spent = time.perf_counter() - started
        self._scan = (t + max(p.scan_every_s, spent / p.scan_share), self._generation, scan)
        return scan

    def _leak(self, pool: int | None, scan: Scan | None) -> tuple[KvLeakState, str]:
        turnovers = self.params.leak_turnovers
        if pool is None or scan is None:
            return "unknown", "the pool's size is not known yet (no block cached, no scrape)"
        needed = math.ceil(turnovers * pool)
        if self.index.removals < needed:
            return "too_early", (f"{self.index.removals:,} of the {needed:,} removals "
                                 f"({turnovers:g} turnovers of {pool:,} blocks) it takes")
        if not scan.stale:
            return "none", f"every cached block was used within {turnovers:g} pool turnovers"
        outlived = scan.oldest_removals / pool
        return "evidence", (f"{scan.stale:,} blocks unused for {turnovers:g}+ turnovers of the "
                            f"pool (the oldest {outlived:.1f})")

    def _hot(self, scan: Scan | None) -> tuple[HotPrefix, ...]:
        if scan is None:
            return ()
        size = self.block_size
        return tuple(HotPrefix(key, depth * size if size and depth else None, reuses)
                     for key, reuses, depth in scan.hot)


def _histogram(counts: tuple[int, ...]) -> Histogram:
    total, buckets = 0, []
    for bound, count in zip(AGE_BOUNDS, counts, strict=True):
        total += count
        buckets.append((bound, float(total)))
    return Histogram(tuple(buckets), float(total))
