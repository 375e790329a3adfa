"""A paged KV-cache block pool with vLLM V1 semantics (vllm/v1/core/block_pool.py).

Blocks are reference counted. A block whose count drops to 0 goes to the tail of the
free queue *keeping its hash*, so it stays a prefix-cache hit until it is popped from
the head for a new allocation (LRU eviction); a freed block without a hash goes to the
head instead, so it is reused before any cached block. Free-but-cached blocks therefore count as
free in `usage()`, and one "null block" is taken out at start-up and never returned,
which is why usage divides by `num_gpu_blocks - 1` (vLLM >= 0.10.2).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

BlockHash = int
MASK64 = (1 << 64) - 1
# What the pool did, as vLLM's KV events say it: ("S", hashes, parent) for blocks entering
# the prefix cache, ("R", hash) for one leaving it.
PoolEvent = tuple


class Residency:
    """vLLM's ``KVCacheMetricsCollector`` sampling every block: a block's life starts when
    it is allocated and ends when it is popped for another; its idle time runs from its
    last use (or birth), and the gaps are between its last four uses (prefix hits)."""

    def __init__(self, clock: Callable[[], float],
                 observe: Callable[[str, float], None]) -> None:
        self.clock, self.observe = clock, observe
        self._born: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._uses: dict[int, deque[float]] = {}

    def allocated(self, block_id: int) -> None:
        self._born[block_id] = self._last[block_id] = self.clock()
        self._uses[block_id] = deque(maxlen=4)

    def used(self, block_id: int) -> None:
        uses = self._uses.get(block_id)
        if uses is not None:
            self._last[block_id] = now = self.clock()
            uses.append(now)

    def evicted(self, block_id: int) -> None:
        born = self._born.pop(block_id, None)
        if born is None:
            return
        now, last, uses = self.clock(), self._last.pop(block_id), self._uses.pop(block_id)
        self.observe("kv_block_lifetime_seconds", now - born)
        self.observe("kv_block_idle_before_evict_seconds", now - last)
        for earlier, later in pairwise(uses):
            self.observe("kv_block_reuse_gap_seconds", later - earlier)


def chain_hash(parent: BlockHash | None, key: Hashable) -> BlockHash:
    """Hash of a full block: its parent's hash plus its own content key, as in vLLM."""
    return hash((parent, key))


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Fixed set of blocks, a LRU free queue and the prefix-cache map hash -> blocks."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_gpu_blocks)]
        # OrderedDict as the free queue: O(1) pop from the head, append and removal.
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        # Several blocks may carry the same hash when two requests computed it at once.
        self._cached: dict[BlockHash, dict[int, KVBlock]] = {}
        self.null_block = self._free.popitem(last=False)[1]
        self.events: list[PoolEvent] | None = None  # a list: record KV events into it
        self.stored_blocks = self.removed_blocks = 0  # into and out of the prefix cache
        self.residency: Residency | None = None

    @property
    def usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.usable_blocks - len(self._free)

    def usage(self) -> float:
        """`BlockPool.get_usage()` of vLLM >= 0.10.2: exactly 0.0 when nothing is referenced."""
        return 1.0 - self.num_free_blocks / self.usable_blocks

    def num_cached_hashes(self) -> int:
        """Distinct hashes in the prefix cache (in use or free)."""
        return len(self._cached)

    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self._free.values() if b.block_hash is not None)

    def is_free(self, block: KVBlock) -> bool:
        return block.block_id in self._free

    def free_order(self) -> list[int]:
        """Block ids of the free queue, next to be evicted first."""
        return list(self._free)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        blocks = self._cached.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-cache hits, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1
            if self.residency is not None:
                self.residency.used(block.block_id)

    def allocate(self, n: int) -> list[KVBlock]:
        """Pop `n` blocks from the head of the free queue, evicting their cached hashes."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            block = self._free.popitem(last=False)[1]
            self._evict(block)
            if self.residency is not None:
                self.residency.evicted(block.block_id)
                self.residency.allocated(block.block_id)
            block.ref_cnt = 1
            out.append(block)
        return out

    def cache_full_blocks(
        self, blocks: Sequence[KVBlock], hashes: Sequence[BlockHash], start: int, end: int
    ) -> None:
        """Register blocks[start:end] (full blocks) under their hashes; one KV event for the
        blocks newly registered, on top of the block before the first of them."""
        new: list[BlockHash] = []
        first = None
        for i in range(start, end):
            block = blocks[i]
            if block.block_hash is not None:
                continue  # a prefix-cache hit, already registered
            block.block_hash = hashes[i]
            self._cached.setdefault(hashes[i], {})[block.block_id] = block
            first = i if first is None else first
            new.append(hashes[i] & MASK64)
        self.stored_blocks += len(new)
        if self.events is not None and first is not None:
            parent = hashes[first - 1] & MASK64 if first > 0 else None
            self.events.append(("S", tuple(new), parent))

    def free_blocks(self, ordered: Iterable[KVBlock]) -> None:
        """Drop one reference each, as vLLM's `BlockPool.free_blocks`: blocks reaching 0
        that carry a hash join the tail of the free queue (LRU: they stay hits longest);
        blocks without one go to its head, in the given order, to be reused first."""
        uncached: list[KVBlock] = []
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    uncached.append(block)
                else:
                    self._free[block.block_id] = block
        for block in reversed(uncached):
            self._free[block.block_id] = block
            self._free.move_to_end(block.block_id, last=False)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        same_hash = self._cached[block.block_hash]
        del same_hash[block.block_id]
        if not same_hash:
            del self._cached[block.block_hash]
        self.removed_blocks += 1
        if self.events is not None:
            self.events.append(("R", block.block_hash & MASK64))
        block.block_hash = None


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Per-request block tables on top of a `BlockPool` (vllm/v1/core/kv_cache_manager.py)."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.req_blocks: dict[int, list[KVBlock]] = {}
        self._num_cached: dict[int, int] = {}

    def get_computed_blocks(
        self, hashes: Sequence[BlockHash], num_tokens: int
    ) -> tuple[list[KVBlock], int]:
        """Longest cached prefix; the last token is always recomputed, as in vLLM."""
        if not self.pool.enable_caching:
            return [], 0
        max_blocks = (num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        req_id: int,
        hashes: Sequence[BlockHash],
        num_tokens: int,
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        full_sequence_must_fit: bool = False,
    ) -> list[KVBlock] | None:
        """Blocks for `num_new_tokens` more tokens, or None when the pool cannot supply them.

        `num_computed_tokens` includes the prefix-cache hits in `new_computed_blocks`;
        `num_tokens` is how many tokens of the request are known (prompt + output so far).
        `full_sequence_must_fit` is vLLM's admission gate (`scheduler_reserve_full_isl`):
        all `num_tokens` must fit now, not only this step's chunk.
        """
        blocks = self.req_blocks.get(req_id, [])
        # Hits sitting in the free queue stop being free once touched.
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        held = len(blocks) + len(new_computed_blocks)
        if full_sequence_must_fit and (cdiv(num_tokens, self.block_size) - held
                                       > self.pool.num_free_blocks - evictable):
            return None
        to_allocate = cdiv(num_computed_tokens + num_new_tokens, self.block_size) - held
        new_blocks: list[KVBlock] = []
        if new_computed_blocks or to_allocate > 0:
            if to_allocate > self.pool.num_free_blocks - evictable:
                return None
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            new_blocks = self.pool.allocate(max(to_allocate, 0))
            blocks.extend(new_blocks)
            self.req_blocks[req_id] = blocks
        if self.pool.enable_caching:
            full = min(num_computed_tokens + num_new_tokens, num_tokens) // self.block_size
            start = self._num_cached.get(req_id, 0)
            if full > start:
                self.pool.cache_full_blocks(blocks, hashes, start, full)
                self._num_cached[req_id] = full
        return new_blocks

    def free(self, req_id: int) -> None:
        """Free in reverse order so that a request's tail blocks are evicted first."""
        blocks = self.req_blocks.pop(req_id, [])
        self._num_cached.pop(req_id, None)
        self.pool.free_blocks(reversed(blocks))

    def forget(self, req_id: int) -> list[KVBlock]:
        """Drop a request's table without freeing its blocks: the leak fault."""
        self._num_cached.pop(req_id, None)
        return self.req_blocks.pop(req_id, [])
