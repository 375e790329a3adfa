"""Memory a server cannot grow: engines per target, the trackers' per-engine state, the
check report, and the parsers' caches (docs/security.md, "Memory").

A server that invented model names every scrape grew ``check`` from 135 to 486 MB in 86 s
(history and detectors were never evicted); one with 150,000 model names took 974 MB."""

from __future__ import annotations

import asyncio
from itertools import count

from kvtop.collect import exposition
from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.exposition import parse
from kvtop.collect.poller import Poller
from kvtop.collect.prometheus import answers, group_scrapes
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import MAX_TRACKED_ENGINES, TargetTracker
from kvtop.derive.worst import CheckRun
from tests.fakes.faultserver import FaultServer, Request, mode
from tests.scenarios import bodies

NEW_PER_SCRAPE = 300
_scrapes_served = count()


@mode("new_models_every_scrape")
async def _new_models(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = bodies.many_models(NEW_PER_SCRAPE, tag=f"s{next(_scrapes_served)}-")
    return await srv.respond(w, 200, body.encode())


async def test_a_server_inventing_model_names_costs_bounded_memory() -> None:
    """Through the poller into check's trackers, as ``kvtop check`` reads it."""
    run = CheckRun()
    scrapes: list[Scrape] = []
    stop = asyncio.Event()

    def on_scrape(scrape: Scrape) -> None:
        run.feed(scrape)
        scrapes.append(scrape)
        if len(scrapes) >= 6:
            stop.set()

    async with FaultServer(mode="new_models_every_scrape") as server:
        target = Target(server.url())
        run.add_target(target)
        async with Poller([target], interval_s=0.05, timeout_s=10) as poller:
            await asyncio.wait_for(poller.run(on_scrape, stop=stop), 120)
    assert all(s.ok for s in scrapes), [s.error for s in scrapes]
    tracker = run.trackers[target.url]
    assert len(tracker.state.engines) == MAX_ENGINES
    assert tracker.state.engines_over_cap == NEW_PER_SCRAPE - MAX_ENGINES
    # 6 scrapes named 1,800 engines; at most 512 keep a history and a detector
    assert len(tracker.history) == len(tracker.detectors) == MAX_TRACKED_ENGINES
    assert len(run.engines[target.url]) <= MAX_TRACKED_ENGINES + MAX_ENGINES


def test_an_engine_gone_for_the_history_span_is_forgotten() -> None:
    target = Target("http://127.0.0.1:9/metrics")
    tracker = TargetTracker(target, history_s=600)
    tracker.update(read_scrape(Scrape(target, 1000.0, body=bodies.vllm_body(model="old"))))
    tracker.update(read_scrape(Scrape(target, 1300.0, body=bodies.vllm_body(model="new"))))
    assert set(tracker.history) == {("old", "0"), ("new", "0")}  # gone 300 s: kept
    tracker.update(read_scrape(Scrape(target, 1700.0, body=bodies.vllm_body(model="new"))))
    assert set(tracker.history) == set(tracker.detectors) == {("new", "0")}


def test_the_parser_caches_hold_a_bounded_number_of_characters() -> None:
    long_label = "x" * 2000
    for n in range(12):  # 4 MB of new label blocks each time, 48 MB in all
        text = "".join(f'm{{a="{n}-{i}",b="{long_label}"}} 1\n' for i in range(2000))
        assert len(parse(text).samples) == 2000
    for cache in (exposition._label_cache, exposition._sample_heads):
        assert cache.chars <= cache.max_chars < 12 * 2000 * len(long_label)
        assert len(cache) <= cache.max_entries


def test_the_prometheus_head_cache_holds_a_bounded_number_of_characters() -> None:
    pad = "x" * 100_000
    for n in range(400):  # 40 MB of new label sets
        metric = {"__name__": "vllm:num_requests_running", "job": "j", "instance": "a:1",
                  "model_name": f"{n}{pad}"}
        assert group_scrapes([{"metric": metric, "values": [[1.0, "1"]]}])
    heads = answers._heads
    assert heads.chars <= heads.max_chars < 400 * len(pad)
