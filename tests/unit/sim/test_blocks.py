"""The block pool and KV-cache manager follow vLLM V1's accounting.

The simulator's block pool behaves like vLLM V1's where kvtop's readings depend on it: the
null block is block 0, the smallest pool works, blocks computed twice stay hits until both
are evicted, prefix hits that sit in the free queue are counted once, and the admission gate
refuses a prompt the pool cannot hold whole."""

from __future__ import annotations

import pytest

from kvtop.sim.blocks import BlockPool, KVCacheManager, Residency, chain_hash


def test_null_block_is_taken_and_idle_usage_is_exactly_zero() -> None:
    pool = BlockPool(10)
    assert pool.usable_blocks == 9
    assert pool.num_free_blocks == 9
    assert pool.usage() == 0.0
    blocks = pool.allocate(3)
    assert pool.null_block not in blocks
    assert pool.usage() == pytest.approx(3 / 9)
    pool.free_blocks(blocks)
    assert pool.usage() == 0.0


def test_cannot_allocate_more_than_free() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(ValueError):
        pool.allocate(1)
    with pytest.raises(ValueError):
        BlockPool(1)


def test_freed_block_keeps_its_hash_counts_as_free_and_is_reusable() -> None:
    pool = BlockPool(8)
    (block,) = pool.allocate(1)
    pool.cache_full_blocks([block], [42], 0, 1)
    pool.free_blocks([block])
    assert pool.usage() == 0.0  # free-but-cached counts as free
    assert pool.num_cached_free_blocks() == 1
    assert pool.get_cached_block(42) is block
    pool.touch([block])  # a prefix hit takes it out of the free queue
    assert not pool.is_free(block)
    assert block.ref_cnt == 1
    assert pool.num_used_blocks == 1


def test_cached_blocks_are_evicted_lru() -> None:
    pool = BlockPool(4)  # 3 usable
    a, b, c = pool.allocate(3)
    pool.cache_full_blocks([a, b, c], [1, 2, 3], 0, 3)
    pool.free_blocks([b, a, c])  # free order b, a, c: b is least recently used
    assert pool.free_order() == [b.block_id, a.block_id, c.block_id]
    (new,) = pool.allocate(1)
    assert new is b
    assert pool.get_cached_block(2) is None  # evicted with its hash
    assert pool.get_cached_block(1) is a and pool.get_cached_block(3) is c
    pool.touch([a])  # re-used: leaves the queue; freed again, it goes to the tail
    pool.free_blocks([a])
    assert pool.free_order() == [c.block_id, a.block_id]


def test_manager_shares_prefix_blocks_and_frees_tail_first() -> None:
    pool = BlockPool(20)
    kv = KVCacheManager(pool, block_size=4)
    hashes = [chain_hash(None, "a")]
    hashes.append(chain_hash(hashes[0], "b"))
    assert kv.allocate_slots(1, hashes, 9, 0, 9) is not None  # 9 tokens: 3 blocks, 2 full
    assert pool.num_used_blocks == 3
    computed, n_hit = kv.get_computed_blocks(hashes, 9)
    assert n_hit == 8 and computed == kv.req_blocks[1][:2]
    assert kv.allocate_slots(2, hashes, 9, n_hit, 1, computed) is not None
    assert pool.num_used_blocks == 4  # two shared, one private each
    assert [b.ref_cnt for b in kv.req_blocks[2]] == [2, 2, 1]
    first, second, tail1 = (b.block_id for b in kv.req_blocks[1])
    tail2 = kv.req_blocks[2][2].block_id
    kv.free(1)
    kv.free(2)
    assert pool.usage() == 0.0
    assert len(kv.get_computed_blocks(hashes, 9)[0]) == 2  # still cached after both freed
    # Tables are freed in reverse, so a prefix is evicted after the blocks that extend it;
    # the unhashed (partial) tails go to the head of the queue, to be reused first.
    assert pool.free_order()[:2] == [tail2, tail1]
    assert pool.free_order()[-2:] == [second, first]


def test_freed_blocks_without_a_hash_are_reused_before_cached_ones() -> None:
    # vLLM's BlockPool.free_blocks: LIFO for unhashed blocks, LRU for cached ones.
    pool = BlockPool(6)  # 5 usable
    a, b, c, d, _ = pool.allocate(5)
    pool.cache_full_blocks([a, b], [1, 2], 0, 2)
    pool.free_blocks([a, b])
    pool.free_blocks([c, d])
    assert pool.free_order() == [c.block_id, d.block_id, a.block_id, b.block_id]
    x, y = pool.allocate(2)
    assert (x, y) == (c, d)
    assert pool.get_cached_block(1) is a and pool.get_cached_block(2) is b


def test_admission_can_require_the_full_sequence_to_fit() -> None:
    # vLLM's scheduler_reserve_full_isl: a 12-block prompt is not admitted into 9 free
    # blocks even though its first 4-token chunk would fit.
    pool = BlockPool(10, enable_caching=False)
    kv = KVCacheManager(pool, block_size=4)
    assert kv.allocate_slots(1, [], 48, 0, 4, full_sequence_must_fit=True) is None
    assert pool.num_free_blocks == 9
    assert kv.allocate_slots(1, [], 48, 0, 4) is not None
    assert pool.num_free_blocks == 8


def test_last_token_is_always_recomputed() -> None:
    pool = BlockPool(10)
    kv = KVCacheManager(pool, block_size=4)
    hashes = [chain_hash(None, 1), chain_hash(chain_hash(None, 1), 2)]
    kv.allocate_slots(1, hashes, 8, 0, 8)
    kv.free(1)
    # An identical 8-token prompt may hit only the first block: one token must be computed.
    assert kv.get_computed_blocks(hashes, 8)[1] == 4


def test_hash_chaining_makes_position_part_of_the_key() -> None:
    assert chain_hash(None, "x") != chain_hash(chain_hash(None, "y"), "x")


def test_allocation_failure_changes_nothing() -> None:
    pool = BlockPool(4)
    kv = KVCacheManager(pool, block_size=4)
    assert kv.allocate_slots(1, [], 20, 0, 20) is None
    assert pool.num_free_blocks == 3 and 1 not in kv.req_blocks


def test_leaked_table_keeps_blocks_referenced() -> None:
    pool = BlockPool(6, enable_caching=False)
    kv = KVCacheManager(pool, block_size=4)
    kv.allocate_slots(7, [], 8, 0, 8)
    leaked = kv.forget(7)
    assert len(leaked) == 2 and all(b.ref_cnt == 1 for b in leaked)
    assert pool.usage() == 2 / 5


def hashes_of(*keys: str) -> list[int]:
    out: list[int] = []
    for key in keys:
        out.append(chain_hash(out[-1] if out else None, key))
    return out


def test_the_null_block_is_block_zero_and_allocation_starts_after_it() -> None:
    pool = BlockPool(5)
    assert pool.null_block.block_id == 0
    assert [b.block_id for b in pool.allocate(2)] == [1, 2]


def test_the_smallest_pool_has_one_usable_block() -> None:
    pool = BlockPool(2)
    assert (pool.usable_blocks, pool.num_free_blocks) == (1, 1)
    (block,) = pool.allocate(1)
    assert pool.usage() == 1.0
    with pytest.raises(ValueError, match=r"^cannot allocate 1 blocks, 0 free$"):
        pool.allocate(1)
    pool.free_blocks([block])
    assert pool.usage() == 0.0


def test_a_pool_without_room_for_the_null_block_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError,
                       match=r"^num_gpu_blocks must be at least 2 \(one is the null block\)$"):
        BlockPool(1)


def test_a_hash_computed_twice_stays_a_hit_until_both_blocks_are_evicted() -> None:
    pool = BlockPool(4)  # 3 usable
    a, b, c = pool.allocate(3)
    # two requests computed the same block at once: both carry its hash
    pool.cache_full_blocks([a], [7], 0, 1)
    pool.cache_full_blocks([b], [7], 0, 1)
    pool.free_blocks([a, b, c])  # c (no hash) goes to the head, then a, then b
    pool.allocate(2)  # evicts c and a
    assert pool.get_cached_block(7) is b
    pool.allocate(1)  # evicts b
    assert pool.get_cached_block(7) is None


def test_evicted_hashes_are_forgotten_so_a_long_run_stays_bounded() -> None:
    pool = BlockPool(3)  # 2 usable
    for key in range(200):  # every request a new prompt
        blocks = pool.allocate(2)
        pool.cache_full_blocks(blocks, hashes_of(f"{key}a", f"{key}b"), 0, 2)
        pool.free_blocks(blocks)
    assert len(pool._cached) <= pool.usable_blocks


def test_new_full_blocks_after_a_prefix_hit_are_cached_too() -> None:
    pool = BlockPool(20)
    kv = KVCacheManager(pool, block_size=4)
    first = hashes_of("system", "question-1", "answer")
    assert kv.allocate_slots(1, first, 12, 0, 12) is not None
    computed, n_hit = kv.get_computed_blocks(first, 13)
    assert n_hit == 12
    second = hashes_of("system", "question-2", "more")
    computed, n_hit = kv.get_computed_blocks(second, 13)
    assert n_hit == 4  # the shared system block
    assert kv.allocate_slots(2, second, 13, n_hit, 13 - n_hit, computed) is not None
    # a third request repeating the second one hits all three of its full blocks
    assert kv.get_computed_blocks(second, 13)[1] == 12


def free_but_cached_prefix(pool_blocks: int) -> tuple[BlockPool, KVCacheManager, list[int]]:
    """A pool whose two cached prefix blocks sit free in the queue, the rest partly taken."""
    pool = BlockPool(pool_blocks)
    kv = KVCacheManager(pool, block_size=4)
    prefix = hashes_of("p0", "p1")
    assert kv.allocate_slots(1, prefix, 8, 0, 8) is not None
    kv.free(1)  # both blocks stay cached, and free
    kv.allocate_slots(2, hashes_of("x0", "x1"), 8, 0, 8)  # takes the two uncached blocks
    return pool, kv, prefix


def test_prefix_hits_in_the_free_queue_are_not_counted_as_room_twice() -> None:
    pool, kv, prefix = free_but_cached_prefix(6)  # 5 usable: 2 taken, 3 free (2 cached)
    hashes = [*prefix, chain_hash(prefix[-1], "p2")]
    computed, n_hit = kv.get_computed_blocks(hashes, 12)
    assert n_hit == 8
    # touching the 2 hits leaves 1 free block: exactly the one more block needed
    assert kv.allocate_slots(3, hashes, 12, n_hit, 4, computed, True) is not None
    assert pool.num_free_blocks == 0


def test_the_admission_gate_refuses_a_prompt_that_cannot_fit_whole() -> None:
    pool, kv, prefix = free_but_cached_prefix(6)
    hashes = [*prefix, chain_hash(prefix[-1], "p2"), chain_hash(prefix[-1], "p3")]
    computed, n_hit = kv.get_computed_blocks(hashes, 16)
    assert n_hit == 8
    # the first chunk would fit in the one free block, the whole prompt (2 more) would not
    assert kv.allocate_slots(3, hashes, 16, n_hit, 4, computed, True) is None
    assert pool.num_free_blocks == 3 and 3 not in kv.req_blocks
    # without the gate (chunked prefill as vLLM had it before), the chunk is admitted
    assert kv.allocate_slots(3, hashes, 16, n_hit, 4, computed, False) is not None


def test_a_request_holding_blocks_needs_only_the_rest_to_fit() -> None:
    pool = BlockPool(4)  # 3 usable
    kv = KVCacheManager(pool, block_size=4)
    tokens = hashes_of("a", "b")
    assert kv.allocate_slots(1, tokens, 8, 0, 4, (), True) is not None  # first chunk
    # it holds 1 block; 3 blocks of 12 tokens need 2 more, and 2 are free
    assert kv.allocate_slots(1, [*tokens, chain_hash(tokens[-1], "c")], 12, 4, 4, (), True) \
        is not None


def test_without_prefix_caching_nothing_is_ever_a_hit() -> None:
    pool = BlockPool(10, enable_caching=False)
    kv = KVCacheManager(pool, block_size=4)
    hashes = hashes_of("a", "b")
    assert kv.allocate_slots(1, hashes, 9, 0, 9) is not None
    kv.free(1)
    assert kv.get_computed_blocks(hashes, 9) == ([], 0)


def test_the_pool_records_kv_events_as_vllms_block_pool_emits_them() -> None:
    pool = BlockPool(5)
    pool.events = []
    manager = KVCacheManager(pool, block_size=2)
    manager.allocate_slots(0, [11, 12, 13], num_tokens=6, num_computed_tokens=0,
                           num_new_tokens=6)
    assert pool.events == [("S", (11, 12, 13), None)]  # three full blocks, a new prefix
    manager.free(0)
    manager.allocate_slots(1, [21], num_tokens=2, num_computed_tokens=0, num_new_tokens=2)
    assert pool.events[1:] == [("S", (21,), None)]  # the never-used block: no eviction
    pool.events.clear()
    hits = [pool.get_cached_block(11), pool.get_cached_block(12)]
    manager.allocate_slots(2, [11, 12, -5], num_tokens=6, num_computed_tokens=4,
                           num_new_tokens=2, new_computed_blocks=hits)  # type: ignore[list-item]
    # 13, freed first, makes room; the hits are not stored again; the new block extends
    # 12; hashes are 64-bit
    assert pool.events == [("R", 13), ("S", ((-5) & ((1 << 64) - 1),), 12)]


def test_residency_is_observed_when_a_block_is_popped_for_another() -> None:
    now = [0.0]
    seen: list[tuple[str, float]] = []
    pool = BlockPool(3)
    pool.residency = Residency(lambda: now[0], lambda name, v: seen.append((name, v)))
    (block,) = pool.allocate(1)  # born at 0
    now[0] = 2.0
    pool.cache_full_blocks([block], [7], 0, 1)
    pool.free_blocks([block])
    for t in (3.0, 3.5):  # two prefix hits
        now[0] = t
        pool.touch([block])
        pool.free_blocks([block])
    now[0] = 10.0
    pool.allocate(2)  # the free queue: the never-used block, then ours
    assert seen == [("kv_block_lifetime_seconds", 10.0),
                    ("kv_block_idle_before_evict_seconds", 6.5),
                    ("kv_block_reuse_gap_seconds", 0.5)]
