"""KV anatomy against a real `vllm serve` with `--kv-cache-metrics` and `--kv-events-config`:

* kvtop's KV-event subscriber counts exactly the blocks vLLM's block pool stored and removed
  (counted inside the engine core by twin/kv_counts.py), and caches the same hashes;
* the residency quantiles kvtop shows are those of the server's own histograms;
* on a twin whose free path leaks (twin/leak.py), the leaked full blocks become kvtop's
  exact leak evidence within a few pool turnovers, and nothing else does.

kvtop listens (vLLM's endpoint names 127.0.0.1, so vLLM connects) and reads the replay
socket vLLM binds on the next port.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.collect.adapters import read_exposition
from kvtop.collect.kv_endpoint import parse_endpoint
from kvtop.collect.kv_events import KvEventBatch, block_key
from kvtop.collect.kv_subscriber import KvEventsSubscriber
from kvtop.derive.cache import residency
from kvtop.derive.kv_anatomy import AnatomyParams, KvAnatomy
from kvtop.derive.stats import KvEventStats
from tests.twin.client import SUMMARY, Load, http_get, wait_until_idle
from tests.twin.conftest import TwinSetup
from twin.serve import TwinServer, TwinSpec, free_port_pair

POOL = {"kv": 300, "kv_leaking": 400}  # KVTOP_TWIN_BLOCKS; vLLM's usable pool is one less
CATCH_UP_S = 60.0


class Listening:
    """kvtop's subscriber and anatomy for one twin, in a thread with its own event loop."""

    def __init__(self, port: int) -> None:
        self.endpoint = parse_endpoint(f"tcp://127.0.0.1:{port}",
                                       replay=f"tcp://127.0.0.1:{port + 1}", bind=True)
        self.anatomy = KvAnatomy(AnatomyParams(scan_every_s=0.0))  # every stats a fresh scan
        self.lock = threading.Lock()
        self.subscriber = KvEventsSubscriber(self.endpoint, self._fold)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _fold(self, batch: KvEventBatch) -> None:
        with self.lock:
            self.anatomy.fold(batch)

    def _run(self) -> None:
        self._loop.run_until_complete(self.subscriber.run(self._stop))

    def stats(self, pool: int) -> KvEventStats:
        with self.lock:
            return self.anatomy.stats(time.time(), pool)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def read_counts(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def wait_for(ok: Callable[[], bool], what: str, timeout_s: float = CATCH_UP_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def kv_twins(twin_setup: TwinSetup) -> Iterator[dict[str, tuple[TwinServer, Listening, Path]]]:
    started: dict[str, tuple[TwinServer, Listening, Path]] = {}
    try:
        for name, leak in (("kv", 0.0), ("kv_leaking", 0.05)):
            port, counts = free_port_pair(), twin_setup.work / f"{name}-counts.json"
            listening = Listening(port)
            spec = TwinSpec(num_blocks=POOL[name], step_delay_s=0.0, leak_frac=leak,
                            kv_cache_metrics=True, kv_events_port=port, kv_counts=counts)
            server = TwinServer.launch(name, spec, twin_setup.python, twin_setup.model_dir,
                                       twin_setup.work)
            started[name] = (server, listening, counts)
        for server, _, _ in started.values():
            server.wait_ready()
        yield started
    finally:
        for server, listening, _ in started.values():
            server.stop()
            listening.stop()


def test_kvtop_counts_every_block_the_pool_stored_and_removed(kv_twins: dict) -> None:
    server, listening, counts_file = kv_twins["kv"]
    load = Load(server.base_url, requests=80, concurrency=16, seed=7, shared_frac=0.5,
                max_tokens=(16, 96)).start()
    load.wait(timeout_s=300)
    assert not load.errors, load.errors[:3]
    wait_until_idle(server.base_url)
    pool = POOL["kv"] - 1

    def caught_up() -> bool:
        counts = read_counts(counts_file)
        stats = listening.stats(pool)
        return (stats.stored_total, stats.removed_total) == (counts["stored"], counts["removed"])

    wait_for(caught_up, "kvtop to have every batch the pool emitted")
    counts, stats = read_counts(counts_file), listening.stats(pool)
    assert stats.removed_total > pool, "not even one turnover: nothing was evicted"
    assert stats.population == counts["cached"]  # the same hashes cached, to the block
    assert (stats.lost_batches, stats.malformed, stats.unknown_events) == (0, 0, 0)
    assert stats.removed_unknown == 0  # joined from seq 0: every removed block was known
    assert stats.reuses > 0 and stats.hot  # half the prompts share a 256-token prefix
    SUMMARY.append(f"kv events: stored {stats.stored_total}, removed {stats.removed_total}, "
                   f"cached {stats.population} = the pool's own counts; "
                   f"{stats.reuses} reuses, hottest {stats.hot[0]}")


def promql_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile, written out independently of kvtop's."""
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("no bucket holds the rank")


def test_residency_quantiles_are_those_of_the_servers_histograms(kv_twins: dict) -> None:
    server, _, _ = kv_twins["kv"]
    wait_until_idle(server.base_url)
    body = http_get(server.metrics_url)
    reading = read_exposition(body, version="0.33.0").engines[0]
    shown = residency(reading, None)
    assert shown is not None and shown.state == "on"
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for name, quantiles in (("vllm:kv_block_lifetime_seconds", shown.lifetime),
                            ("vllm:kv_block_idle_before_evict_seconds", shown.idle)):
        buckets = sorted((float(s.labels["le"]), s.value) for s in families[name].samples
                         if s.name.endswith("_bucket"))
        assert buckets[-1][1] > 0, f"{name}: no block evicted"
        assert quantiles is not None and quantiles.samples == buckets[-1][1]
        for q, value in ((0.5, quantiles.p50), (0.9, quantiles.p90), (0.99, quantiles.p99)):
            assert value == pytest.approx(promql_quantile(q, buckets), rel=1e-9), (name, q)
    SUMMARY.append(f"kv residency: lifetime p50 {shown.lifetime.p50:.3f} s over "
                   f"{shown.lifetime.samples:.0f} evictions, as the histogram says")


def test_leaked_blocks_become_exact_evidence_within_a_few_turnovers(kv_twins: dict) -> None:
    server, listening, counts_file = kv_twins["kv_leaking"]
    pool = POOL["kv_leaking"] - 1
    early: set[int] = set()  # blocks leaked before the last three turnovers
    turnovers_then = 0.0
    for wave in range(12):
        load = Load(server.base_url, requests=24, concurrency=12, seed=200 + wave,
                    max_tokens=(16, 64)).start()
        load.wait(timeout_s=300)
        assert not load.errors, load.errors[:3]
        wait_until_idle(server.base_url)
        counts = read_counts(counts_file)
        wait_for(lambda counts=counts: listening.stats(pool).removed_total == counts["removed"],
                 "kvtop to catch up")
        stats = listening.stats(pool)
        if not early and counts["leaked_hashes"]:
            early = {block_key(h) for h in counts["leaked_hashes"]}
            turnovers_then = stats.turnovers or 0.0
        if early and (stats.turnovers or 0.0) - turnovers_then >= 3.5:
            break
    else:
        pytest.fail(f"the pool did not turn over 3.5 times after the first leak: {stats}")
    leaked = {block_key(h) for h in read_counts(counts_file)["leaked_hashes"]}
    with listening.lock:
        found = listening.anatomy.index.scan(math.ceil(3 * pool), 0, sample=10_000)
    assert stats.leak == "evidence" and stats.leaked_blocks == found.stale
    assert set(found.sample) <= leaked, "a block that did not leak was called leaked"
    assert early <= set(found.sample), "a block leaked 3.5 turnovers ago is not evidence"
    SUMMARY.append(f"kv leak evidence: {found.stale} of {len(leaked)} leaked blocks after "
                   f"{stats.turnovers:.1f} turnovers (the {len(early)} of the first leaks all "
                   "in it), no other block")
