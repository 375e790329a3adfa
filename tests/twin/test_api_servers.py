"""A twin with two API server processes (`--api-server-count 2`): vLLM then exports through
prometheus_client's multiprocess collector, which answers a narrowed read (`name[]`) with
nothing, so kvtop must read the plain `/metrics` and still get every number right."""

from __future__ import annotations

from kvtop.collect.adapters import WANTED
from kvtop.collect.poller import narrowed_url
from tests.twin.client import (
    SUMMARY,
    Load,
    Metrics,
    MetricsTap,
    http_get,
    kvtop_snapshot,
    only_engine,
    wait_until_idle,
)
from twin.serve import TwinServer

REQUESTS = 12


def test_kvtop_reads_a_multiprocess_server_whole(twin_api_servers: TwinServer) -> None:
    base = twin_api_servers.base_url
    assert http_get(narrowed_url(twin_api_servers.metrics_url, WANTED)) == ""
    load = Load(base, requests=REQUESTS, concurrency=6, seed=3, shared_frac=0.5).start()
    load.wait(timeout_s=120)
    assert not load.errors, load.errors[:3]
    wait_until_idle(base)
    with MetricsTap(base) as tap:
        target = kvtop_snapshot(tap.metrics_url, samples=1)
    # Asked narrowed, got nothing, then read the URL as given within the same attempt.
    assert tap.paths[0].startswith("/metrics/?name%5B%5D=") and tap.bodies[0] == ""
    assert tap.paths[1:] == ["/metrics"]
    server = Metrics.parse(tap.bodies[1])  # the server's own numbers in what kvtop read
    assert target["status"] == "up" and target["server"]["kind"] == "vllm"
    engine = only_engine(target)
    assert engine["kv"]["blocks_total"] == 299 and engine["kv"]["usage"] == server.usage
    assert engine["requests"]["running"] == server.running == 0
    assert engine["prefix_cache"]["queries_total"] == server.queries > 0
    assert engine["prefix_cache"]["hits_total"] == server.hits > 0
    assert engine["latency_s"]["e2e"]["samples"] == REQUESTS
    SUMMARY.append(f"api_servers: narrowed read empty, plain /metrics "
                   f"{len(tap.bodies[1]):,} bytes, {server.queries:.0f} prefix queries")
