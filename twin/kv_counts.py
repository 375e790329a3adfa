"""What vLLM's block pool did, counted from inside the twin's engine core: the ground truth
kvtop's KV-event subscriber must agree with (tests/twin/test_kv_anatomy.py).

``BlockPool.take_events`` hands the engine core each step's KV events for publishing; the
patch counts the block hashes stored and removed there, before any of them leaves the
process, and writes the counts with the number of hashes the pool caches now to a JSON
file (replaced whole, so a reader never sees half of it). A leak (twin/leak.py) adds the
hashes of the full blocks each leaked request holds, as vLLM publishes them.

    {"stored": 1445, "removed": 1445, "cleared": 0, "cached": 0, "leaked_hashes": [...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twin.model import use_vllm_environment

use_vllm_environment(quiet=True)

from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash  # noqa: E402


class KvCounts:
    """Patches ``BlockPool.take_events`` for the whole process while installed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: dict[str, Any] = {"stored": 0, "removed": 0, "cleared": 0, "cached": 0,
                                       "leaked_hashes": []}
        self._original = BlockPool.take_events

    def install(self) -> KvCounts:
        original, counts = self._original, self

        def take_events(pool: BlockPool) -> list[Any]:
            events = original(pool)
            if events:
                counts.count(pool, events)
            return events

        BlockPool.take_events = take_events  # type: ignore[method-assign]
        self.write()
        return self

    def count(self, pool: BlockPool, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.counts["stored"] += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.counts["removed"] += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.counts["cleared"] += 1
        self.counts["cached"] = len(pool.cached_block_hash_to_block)
        self.write()

    def leaked(self, blocks: list[Any]) -> None:
        """Blocks a leaked request holds: the full ones, as their hashes are published."""
        self.counts["leaked_hashes"] += [
            maybe_convert_block_hash(get_block_hash(block.block_hash))
            for block in blocks if block.block_hash is not None]
        self.write()

    def write(self) -> None:
        partial = self.path.with_name(self.path.name + ".part")
        partial.write_text(json.dumps(self.counts, default=lambda b: b.hex()))
        os.replace(partial, self.path)
