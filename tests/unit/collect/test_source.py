"""What every source is to its consumers: a good scrape arrives read (the one place a body
or Prometheus's samples become a reading, with the server's exact version, a refused answer
made a bad_payload failure), a stream of scrapes keeps each server's exact version, the
newest scrapes per target, a consumer's bug never stops a source, and a source closed after
use."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.exposition import parse
from kvtop.collect.source import (
    ALL,
    ScrapeReader,
    Source,
    deliver,
    latest_per_target,
    opened,
    read_scrape,
)
from kvtop.collect.target import Scrape, Target
from tests.scenarios.derived import vllm_08_idle
from tests.support.paths import fixture_text

TARGET = Target.from_spec("127.0.0.1:8000")
OTHER = Target.from_spec("127.0.0.1:8001")
LOAD = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
IMPOSSIBLE_POOL = ('vllm:cache_config_info{num_gpu_blocks="1e300",block_size="16"} 1.0\n'
                   'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n')


def test_a_good_body_is_read_where_it_arrives() -> None:
    scrape = read_scrape(Scrape(TARGET, 1.0, body=LOAD))
    assert scrape.ok and scrape.reading == read_exposition(LOAD)
    assert [e.running for e in scrape.reading.engines] == [30.0]


def test_parsed_samples_read_as_their_body_would() -> None:
    samples = read_scrape(Scrape(TARGET, 1.0, samples=parse(LOAD)))
    assert samples.reading == read_scrape(Scrape(TARGET, 1.0, body=LOAD)).reading


def test_a_failure_and_a_reading_made_already_are_left_as_they_are() -> None:
    failed = Scrape(TARGET, 1.0, failure="down", error="connection refused")
    assert read_scrape(failed).reading is None and failed.error == "connection refused"
    made = read_exposition(LOAD)
    assert read_scrape(Scrape(TARGET, 1.0, body="", reading=made)).reading is made


def test_a_refused_answer_becomes_bad_payload_with_its_reason() -> None:
    scrape = read_scrape(Scrape(TARGET, 1.0, body=IMPOSSIBLE_POOL))
    assert (scrape.ok, scrape.failure, scrape.reading) == (False, "bad_payload", None)
    assert scrape.error == "vllm:cache_config_info num_gpu_blocks='1e300' is not a usable count"


def test_the_exact_version_decides_the_pool_and_an_inferred_one_never_does() -> None:
    # vLLM 0.8.2 had no null block; the names alone say "0.7+", read as holding one
    inferred = read_scrape(Scrape(TARGET, 1.0, body=vllm_08_idle())).reading
    exact = read_scrape(Scrape(TARGET, 1.0, body=vllm_08_idle(), version="0.8.2")).reading
    given = read_scrape(Scrape(TARGET, 1.0, samples=parse(vllm_08_idle())), "0.8.2").reading
    assert inferred is not None and exact is not None and given is not None
    assert (inferred.version, inferred.engines[0].idle_floor_blocks) == ("0.7+", 1)
    assert exact.engines[0].idle_floor_blocks == given.engines[0].idle_floor_blocks == 0


def test_a_stream_keeps_each_servers_exact_version_for_the_scrapes_without_one() -> None:
    # the poller asks /version once; a recording's scrapes after it may carry none
    read = ScrapeReader()
    read(Scrape(TARGET, 1.0, body=vllm_08_idle(), version="0.8.2"))
    later = [read(Scrape(TARGET, t, body=vllm_08_idle())) for t in (2.0, 3.0)]
    assert [s.reading.engines[0].idle_floor_blocks for s in later if s.reading] == [0, 0]
    other = read(Scrape(OTHER, 2.0, body=vllm_08_idle())).reading  # not another's version
    assert other is not None and other.engines[0].idle_floor_blocks == 1
    fresh = ScrapeReader()(Scrape(TARGET, 4.0, body=vllm_08_idle())).reading  # a new pass
    assert fresh is not None and fresh.engines[0].idle_floor_blocks == 1


def test_the_newest_scrapes_of_each_target_in_time_order() -> None:
    a, b = Target.from_spec("a:1"), Target.from_spec("b:1")
    scrapes = [Scrape(a, 3.0, ""), Scrape(b, 1.0, ""), Scrape(a, 1.0, ""), Scrape(a, 2.0, ""),
               Scrape(b, 4.0, "")]
    kept = latest_per_target(scrapes, 2)
    assert [(s.target.url, s.t) for s in kept] == [
        (b.url, 1.0), (a.url, 2.0), (a.url, 3.0), (b.url, 4.0)]
    assert [s.t for s in latest_per_target(scrapes, 1)] == [3.0, 4.0]


async def test_a_consumers_bug_is_logged_and_the_source_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(scrape: Scrape) -> None:
        raise RuntimeError("a bug")

    got: list[Scrape] = []

    async def later(scrape: Scrape) -> None:
        await asyncio.sleep(0)
        got.append(scrape)

    scrape = Scrape(TARGET, 1.0, failure="down")
    with caplog.at_level(logging.ERROR):
        await deliver(broken, scrape)
    await deliver(later, scrape)
    assert got == [scrape]
    assert [r.getMessage() for r in caplog.records] == [f"on_scrape failed for {TARGET.label}"]


class Stored(Source):
    """A source with a stored past and nothing live (as a recording)."""

    def __init__(self, scrapes: list[Scrape]) -> None:
        super().__init__([TARGET])
        self.scrapes = scrapes
        self.closed = 0

    async def stored(self, span_s: float | None) -> tuple[list[Scrape], float]:
        return self.scrapes, ALL

    async def aclose(self) -> None:
        self.closed += 1
        await super().aclose()


async def test_a_source_is_closed_after_use_even_when_its_user_fails() -> None:
    source = Stored([])
    with pytest.raises(RuntimeError):
        async with opened(source):
            raise RuntimeError("the consumer failed")
    assert source.closed == 1


async def test_a_source_with_nothing_live_has_its_latest_from_what_it_stored() -> None:
    scrapes = [Scrape(TARGET, float(t), failure="down") for t in range(5)]
    source = Stored(scrapes)
    assert [s.t for s in await source.latest(2)] == [3.0, 4.0]
    assert source.live() is None and await source.discover() == [TARGET]
    assert await Source().stored(60) == ((), 0.0) and Source().warnings == []


def test_kv_events_live_only_where_a_target_names_an_endpoint() -> None:
    from kvtop.collect.kv_endpoint import KvEventsEndpoint
    from kvtop.collect.live import DirectSource

    a, b = Target.from_spec("a:1"), Target.from_spec("b:1")
    assert DirectSource([a, b]).kv_live() is None
    source = DirectSource([a, b], kv_events={b.url: KvEventsEndpoint("tcp://b:5557")})
    feed = source.kv_live()
    assert feed is not None and feed is source.kv_live()  # made once
    assert [t.url for t in feed.targets] == [b.url]
    assert feed.channels[b.url].state == "connecting"


async def test_a_consumer_that_returns_nothing_is_not_awaited(
        caplog: pytest.LogCaptureFixture) -> None:
    got: list[Scrape] = []
    scrape = Scrape(TARGET, 1.0, failure="down")
    with caplog.at_level(logging.ERROR):
        await deliver(got.append, scrape)
    assert got == [scrape] and caplog.records == []


class Closing:
    """What delivers scrapes, holding a connection until closed."""

    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_closing_a_source_closes_what_it_made_live() -> None:
    live = Closing()

    class Live(Source):
        def _make_live(self) -> Closing:  # type: ignore[override]
            return live

    source = Live([TARGET])
    await source.aclose()  # nothing live made yet: nothing to close
    assert source.live() is live and live.closed == 0
    await source.aclose()
    assert live.closed == 1
