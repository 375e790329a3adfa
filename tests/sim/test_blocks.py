"""The block pool and KV-cache manager follow vLLM V1's accounting."""

from __future__ import annotations

import pytest

from kvtop.sim.blocks import BlockPool, KVCacheManager, chain_hash


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
