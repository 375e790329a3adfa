"""Invariant checks shared by the simulator tests."""

from __future__ import annotations

from collections import Counter

from kvtop.sim.engine import Engine


def check_pool_invariants(engine: Engine) -> None:
    """Every block is either free (ref 0) or referenced, never both; counts add up."""
    pool = engine.pool
    holders: Counter[int] = Counter()
    for blocks in engine.kv.req_blocks.values():
        holders.update(b.block_id for b in blocks)
    for _, blocks in engine.leaked:
        holders.update(b.block_id for b in blocks)
    for block in pool.blocks:
        if block is pool.null_block:
            assert not pool.is_free(block)
            continue
        assert block.ref_cnt == holders[block.block_id], block
        assert pool.is_free(block) == (block.ref_cnt == 0), block
        if block.block_hash is not None:
            assert pool.get_cached_block(block.block_hash) is not None
    used = sum(1 for b in pool.blocks if b.ref_cnt > 0)
    assert used == pool.num_used_blocks
    assert pool.num_used_blocks + pool.num_free_blocks == pool.num_gpu_blocks - 1
    assert pool.usage() == 1.0 - pool.num_free_blocks / (pool.num_gpu_blocks - 1)
    assert len(engine.running) <= engine.config.max_num_seqs
