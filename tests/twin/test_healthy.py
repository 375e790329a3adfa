"""Healthy twin (600 blocks): kvtop reads what the server itself says, under load and at idle.

Under load the numbers move every engine step, so kvtop reads the server through a
`MetricsTap` and is compared with the very bodies it read; at idle kvtop reads the server
directly, between two readings of our own that must agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from kvtop.collect.adapters import WANTED
from kvtop.collect.poller import narrowed_url
from tests.twin.client import (
    SUMMARY,
    Load,
    Metrics,
    MetricsTap,
    http_get,
    json_num,
    kvtop_snapshot,
    only_engine,
    read_metrics,
    wait_until_busy,
    wait_until_idle,
)
from twin.serve import TwinServer


@dataclass
class Tapped:
    """One `kvtop snapshot --samples 2` through the tap, with the two bodies it read."""

    target: dict[str, Any]
    first: Metrics
    second: Metrics


@dataclass
class HealthyRun:
    fresh: dict[str, Any]          # kvtop on the fresh server
    fresh_metrics: Metrics         # our reading right after it
    version: str                   # GET /version
    loaded: list[Tapped]           # kvtop under load, through the tap
    idle_before: Metrics           # our reading right before kvtop at idle
    idle: dict[str, Any]
    idle_after: Metrics            # and right after


def tapped_snapshot(tap: MetricsTap) -> Tapped:
    tap.bodies.clear()
    tap.paths.clear()
    target = kvtop_snapshot(tap.metrics_url, samples=2, interval_s=0.5)
    assert len(tap.bodies) == 2, f"kvtop read /metrics {len(tap.bodies)} times, expected 2"
    # vLLM filters: kvtop's reads were narrowed ones, never retried at the plain URL.
    assert all(path.startswith("/metrics/?name%5B%5D=") for path in tap.paths), tap.paths
    return Tapped(target, Metrics.parse(tap.bodies[0]), Metrics.parse(tap.bodies[1]))


@pytest.fixture(scope="module")
def run(twin_healthy: TwinServer) -> HealthyRun:
    base = twin_healthy.base_url
    fresh = kvtop_snapshot(twin_healthy.metrics_url)
    fresh_metrics = read_metrics(base)
    version = json.loads(http_get(base + "/version"))["version"]
    # 192 requests (a load that outlasts two snapshots on a busy machine), half sharing a
    # 256-token prefix (prefix hits), 48 in flight (32 run).
    load = Load(base, requests=192, concurrency=48, seed=1, shared_frac=0.5).start()
    loaded = []
    try:
        wait_until_busy(base)
        with MetricsTap(base) as tap:
            while len(loaded) < 2 and not load.done():
                tapped = tapped_snapshot(tap)
                # A window in which no request was admitted has no hit rate to check; on a
                # loaded machine the engine can step slowly enough for that: read again.
                if tapped.second.queries > tapped.first.queries:
                    loaded.append(tapped)
    finally:
        load.wait(timeout_s=120)
    assert not load.errors, load.errors[:3]
    idle_before = wait_until_idle(base)
    idle = kvtop_snapshot(twin_healthy.metrics_url, samples=2, interval_s=0.3)
    idle_after = read_metrics(base)
    rates = [only_engine(t.target)["prefix_cache"]["hit_rate"] for t in loaded]
    SUMMARY.append(f"healthy: {len(loaded)} tapped snapshots under load, window hit rates "
                   f"{rates}, idle usage {idle_after.usage}")
    return HealthyRun(fresh, fresh_metrics, version, loaded, idle_before, idle, idle_after)


def test_version_is_the_servers(run: HealthyRun) -> None:
    assert run.version == "0.33.0"
    assert run.fresh["server"] == {"kind": "vllm", "version": run.version,
                                   "version_inferred": False}
    assert run.idle["server"]["version"] == run.version


def test_pool_geometry_from_cache_config_info(run: HealthyRun) -> None:
    info = run.fresh_metrics.labels("vllm:cache_config_info")
    kv = only_engine(run.fresh)["kv"]
    assert int(info["num_gpu_blocks"]) == 600
    assert kv["blocks_total"] == int(info["num_gpu_blocks"]) - 1  # vLLM >= 0.10.2: null block
    assert kv["block_size"] == int(info["block_size"]) == 16
    assert kv["tokens_total"] == int(info["kv_cache_size_tokens"]) == 9600


def test_fresh_server_reads_idle(run: HealthyRun) -> None:
    engine = only_engine(run.fresh)
    assert (engine["model"], engine["engine"]) == ("twin-llama", "0")
    assert engine["kv"]["usage"] == run.fresh_metrics.usage == 0.0
    assert engine["requests"]["running"] == engine["requests"]["waiting"] == 0


def test_under_load_equals_the_bodies_kvtop_read(run: HealthyRun) -> None:
    assert run.loaded, "the load finished before kvtop could read it"
    for tapped in run.loaded:
        engine, last = only_engine(tapped.target), tapped.second
        assert last.running > 0, "not under load"
        assert engine["kv"]["usage"] == json_num(last.usage)
        assert engine["kv"]["blocks_used"] == json_num(last.usage * 599, 3)
        assert engine["requests"]["running"] == last.running
        assert engine["requests"]["waiting"] == last.waiting
        assert engine["preemptions_total"] == last.preemptions
        prefix = engine["prefix_cache"]
        assert (prefix["queries_total"], prefix["hits_total"]) == (last.queries, last.hits)


def test_hit_rate_is_delta_hits_over_delta_queries(run: HealthyRun) -> None:
    assert run.loaded, "the load finished before kvtop could read it"
    for tapped in run.loaded:
        queries = tapped.second.queries - tapped.first.queries
        hits = tapped.second.hits - tapped.first.hits
        assert queries > 0, "no prefix-cache queries between kvtop's two scrapes"
        prefix = only_engine(tapped.target)["prefix_cache"]
        assert prefix["hit_rate_scope"] == "window"
        assert prefix["hit_rate"] == json_num(hits / queries)
    assert any(t.second.hits > t.first.hits for t in run.loaded), "no prefix hits at all"


def test_idle_matches_the_server_and_is_empty(run: HealthyRun) -> None:
    before, after = run.idle_before, run.idle_after
    assert before.key_values() == after.key_values(), "server moved while idle"
    engine = only_engine(run.idle)
    assert engine["kv"]["usage"] == after.usage == 0.0
    assert engine["kv"]["blocks_used"] == 0
    assert engine["requests"]["running"] == engine["requests"]["waiting"] == 0
    assert engine["preemptions_total"] == after.preemptions
    prefix = engine["prefix_cache"]
    assert (prefix["queries_total"], prefix["hits_total"]) == (after.queries, after.hits)
    # No queries between the two idle scrapes: kvtop falls back to the lifetime rate.
    assert prefix["hit_rate_scope"] == "lifetime"
    assert prefix["hit_rate"] == json_num(after.hits / after.queries)


def test_the_server_renders_only_what_kvtop_asks_for(run: HealthyRun,
                                                     twin_healthy: TwinServer) -> None:
    """vLLM's own prometheus_client handler honours `name[]`: at idle the narrowed body holds
    exactly the full body's samples of the names kvtop reads."""
    base = twin_healthy.base_url
    wait_until_idle(base)
    full_text = http_get(base + "/metrics")
    narrowed_text = http_get(narrowed_url(twin_healthy.metrics_url, WANTED))
    full, narrowed = Metrics.parse(full_text), Metrics.parse(narrowed_text)
    assert narrowed.samples == {name: series for name, series in full.samples.items()
                                if name in WANTED}
    assert len(narrowed.samples) >= 15
    SUMMARY.append(f"healthy: full /metrics {len(full_text):,} bytes, narrowed "
                   f"{len(narrowed_text):,} bytes ({len(narrowed.samples)} sample names)")
