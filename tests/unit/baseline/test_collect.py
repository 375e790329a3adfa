"""The KV-anatomy figures a baseline keeps (docs/baseline-format.md): the share of prompt
tokens found cached, block lifetimes from the residency histogram's deltas, and how often
the KV pool held the queue back, each over the run and per minute; unknown where the
server does not say."""

from __future__ import annotations

import pytest

from kvtop.baseline.collect import summarise
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target

TARGET = Target.from_spec("127.0.0.1:8000")
LABELS = 'engine="0",model_name="m"'


def body(t: int, *, sources: bool = True, lifetime: bool = True) -> str:
    """Second ``t`` of a run: 100 prompt tokens a second, 25 of them found cached; 2
    blocks evicted a second after 3 s; the pool 95 % used with a queue in odd seconds."""
    full = t % 2 == 1
    lines = [f"vllm:num_requests_running{{{LABELS}}} 4.0",
             f"vllm:num_requests_waiting{{{LABELS}}} {3.0 if full else 0.0}",
             f'vllm:num_requests_waiting_by_reason{{{LABELS},reason="capacity"}} '
             f"{3.0 if full else 0.0}",
             f"vllm:kv_cache_usage_perc{{{LABELS}}} {0.95 if full else 0.5}",
             f"vllm:prompt_tokens_total{{{LABELS}}} {100.0 * t}"]
    if sources:
        lines += [f'vllm:prompt_tokens_by_source_total{{{LABELS},source="local_compute"}} '
                  f"{75.0 * t}",
                  f'vllm:prompt_tokens_by_source_total{{{LABELS},source="local_cache_hit"}} '
                  f"{25.0 * t}"]
    if lifetime:
        evicted = 2.0 * t
        lines += [f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="1.0"}} 0.0',
                  f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="5.0"}} {evicted}',
                  f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="+Inf"}} {evicted}',
                  f"vllm:kv_block_lifetime_seconds_count{{{LABELS}}} {evicted}",
                  f"vllm:kv_block_lifetime_seconds_sum{{{LABELS}}} {3.0 * evicted}"]
    return "\n".join(lines) + "\n"


def figures(**kwargs: bool) -> dict:
    scrapes = [read_scrape(Scrape(TARGET, 1000.0 + t, body=body(t, **kwargs)))
               for t in range(1, 181)]
    run = summarise(scrapes, name="b", source={"kind": "recording"}, interval_s=1.0)
    return run.targets[0].engines[0].figures


def test_the_reuse_share_is_the_cached_part_of_the_prompts() -> None:
    got = figures()["reuse_share"]
    assert got.value == pytest.approx(0.25)
    assert got.values == pytest.approx((0.25, 0.25, 0.25))  # one a minute


def test_block_lifetimes_are_of_the_blocks_evicted_in_the_run() -> None:
    got = figures()
    assert 1.0 < got["block_lifetime_p50"].value <= 5.0  # every one in (1, 5]
    assert got["block_lifetime_p99"].value == pytest.approx(4.96)


def test_how_often_kv_capacity_held_the_queue_and_the_other_limits() -> None:
    got = figures()["kv_limited"]
    assert got.value == pytest.approx(0.5)  # odd seconds: 95 % used with 3 waiting
    assert got.summary == {"limit_kv_capacity": pytest.approx(0.5),
                           "limit_none": pytest.approx(0.5)}


def test_figures_the_server_does_not_export_stay_unknown() -> None:
    got = figures(sources=False, lifetime=False)
    assert got["reuse_share"].value is None and got["reuse_share"].values == ()
    assert got["block_lifetime_p50"].value is None
