"""A real KV-cache leak inside vLLM's own free path, for the twin.

``KVCacheManager.free`` returns early for a random fraction of *finished* requests, so their
blocks keep a reference count above zero and never return to the free queue; frees on
preemption still happen. vLLM's own ``kv_cache_usage_perc`` then stays above zero at idle and
climbs after every burst, as with the leaks reported against real servers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from twin.model import use_vllm_environment

use_vllm_environment(quiet=True)  # before vllm is imported (when this module comes first)

from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402


class FreeLeak:
    """Patches ``KVCacheManager.free`` for the whole process while installed."""

    def __init__(self, fraction: float = 0.0, *, seed: int = 0,
                 on_leak: Callable[[list[Any]], None] | None = None) -> None:
        self.fraction = fraction  # may change while installed (calibrated leaks)
        self.on_leak = on_leak  # told the blocks of each request that leaks
        self.lump_blocks = 0  # a lump: the next finished requests leak until this many blocks
        # ...only those holding at most this times what the lump still lacks (None: any)
        self.lump_slack: float | None = None
        self.rng = random.Random(seed)
        self.leaked: list[str] = []  # request ids whose blocks were never freed
        self.ended_blocks = 0  # blocks finished requests held alone (ref_cnt 1) when they ended
        self._original = KVCacheManager.free

    def install(self) -> FreeLeak:
        original, leak = self._original, self

        def free(manager: KVCacheManager, request: Any) -> None:
            if request.is_finished():
                held = _blocks_of(manager).get(request.request_id, [])
                alone = sum(block.ref_cnt == 1 for block in held)
                leak.ended_blocks += alone
                fits = leak.lump_slack is None or alone <= leak.lump_slack * leak.lump_blocks
                if leak.lump_blocks > 0 and fits:  # whole requests: a lump ends a little over
                    leak.lump_blocks = max(0, leak.lump_blocks - alone)
                    leak.leaked.append(request.request_id)
                    leak.told(held)
                    return
                if leak.rng.random() < leak.fraction:
                    leak.leaked.append(request.request_id)
                    leak.told(held)
                    return
            original(manager, request)

        KVCacheManager.free = free  # type: ignore[method-assign]
        return self

    def told(self, blocks: list[Any]) -> None:
        if self.on_leak is not None:
            self.on_leak(blocks)

    def uninstall(self) -> None:
        KVCacheManager.free = self._original  # type: ignore[method-assign]

    def leaked_blocks(self, manager: KVCacheManager, live: Any) -> int:
        """Blocks held by leaked requests and by none of the ``live`` request ids."""
        held = _blocks_of(manager)
        leaked = {b.block_id for rid in self.leaked for b in held.get(rid, [])}
        in_use = {b.block_id for rid in live for b in held.get(rid, [])}
        return len(leaked - in_use)


def _blocks_of(manager: KVCacheManager) -> dict[str, list[Any]]:
    """Request id -> its blocks, in the one full-attention KV group the twin has."""
    return manager.coordinator.single_type_managers[0].req_to_blocks
