"""KV events: how fast kvtop reads them on one core, and what its block index costs.

Run: ``python -m benchmarks.bench_kv_events [--quick]``. Prints

* events decoded per second (``decode_batch`` alone) and decoded *and* folded into an
  engine's anatomy (the index, reuse, ages), on one core, for batches shaped as vLLM 0.33
  publishes them (the map form, 16 token ids per block, one to four blocks per event, a
  store and a removal for every block once the pool is full). vLLM publishes a batch per
  engine step; kvtop must keep up with at least 50,000 events a second;
* the block index's memory at 1,000,000 blocks (tracemalloc: the dict, its keys and the
  packed values), and the time of one scan of it (leak evidence and hot prefixes).

The whole run through the ZeroMQ socket is tests/hostile/test_kv_events.py's; this one
measures the CPU.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc

import msgspec

from kvtop.collect.kv_events import KvEventBatch, decode_batch
from kvtop.derive.kv_anatomy import KvAnatomy
from kvtop.derive.kv_index import BlockIndex

EVENTS_PER_BATCH = 64  # stores a busy step makes (each 1-4 blocks), and as many evictions
NEEDED_PER_S = 50_000


def batches(count: int, seed: int = 0) -> list[bytes]:
    """``count`` payloads of a pool turning over: each block stored on top of the one
    before it in its chain, and evicted once 20,000 newer ones were stored."""
    rng = random.Random(seed)
    encoder = msgspec.msgpack.Encoder()
    live: list[int] = []
    out = []
    parent = None
    for step in range(count):
        events = []
        for _ in range(EVENTS_PER_BATCH // 2):
            blocks = [rng.getrandbits(64) for _ in range(rng.randint(1, 4))]
            parent = None if rng.random() < 0.1 else parent
            events.append({"type": "BlockStored", "block_hashes": blocks,
                           "parent_block_hash": parent, "token_ids": [7] * (16 * len(blocks)),
                           "block_size": 16, "lora_id": None, "medium": "GPU",
                           "lora_name": None, "group_idx": 0})
            parent = blocks[-1]
            live += blocks
            if len(live) > 20_000:
                gone, live = live[:len(blocks)], live[len(blocks):]
                events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU",
                               "group_idx": 0})
        out.append(encoder.encode([float(step), events, 0]))
    return out


def events_per_s(payloads: list[bytes], fold: bool) -> tuple[float, int]:
    anatomy = KvAnatomy()
    gc.disable()
    try:
        events = 0
        start = time.process_time()
        for seq, payload in enumerate(payloads):
            decoded = decode_batch(payload)
            events += len(decoded.events)
            if fold:
                anatomy.fold(KvEventBatch(t=float(seq), rank=0, seq=seq, ts=decoded.ts,
                                          events=tuple(decoded.events)))
        seconds = time.process_time() - start
    finally:
        gc.enable()
    return events / seconds, events


def index_memory(blocks: int) -> tuple[float, float]:
    """(bytes per block, seconds per scan) of an index holding ``blocks`` blocks in chains
    of 20."""
    rng = random.Random(1)
    gc.collect()
    tracemalloc.start()
    index = BlockIndex(cap=blocks + 1)
    parent = None
    for i in range(blocks):
        key = rng.getrandbits(64)
        index.store(key, parent if i % 20 else None, i // 100, 64)
        parent = key
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.perf_counter()
    index.scan(blocks // 2, 5)
    return used / blocks, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller run (CI, a laptop)")
    args = parser.parse_args()
    count, blocks = (300, 100_000) if args.quick else (3_000, 1_000_000)
    payloads = batches(count)
    print(f"Python {sys.version.split()[0]}, {count} batches, one core (process time)\n")
    print("| what | events/s | events | blocks an event |")
    print("|---|---|---|---|")
    for label, fold in (("decode", False), ("decode + fold into the anatomy", True)):
        rate, events = events_per_s(payloads, fold)
        verdict = "" if rate >= NEEDED_PER_S else f" (below the {NEEDED_PER_S:,} needed)"
        print(f"| {label} | {rate:,.0f}{verdict} | {events:,} | 2.5 |")
    per_block, scan_s = index_memory(blocks)
    print(f"\nblock index at {blocks:,} blocks: {per_block:.0f} bytes a block, "
          f"{per_block * blocks / 2**20:.0f} MiB; one scan {scan_s * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
