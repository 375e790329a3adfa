"""Narrowed reads: the poller asks a server for only the samples kvtop reads (``name[]`` at
``/metrics/``), and reads the URL as given wherever that does not work."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from kvtop.collect.adapters import WANTED, read_exposition, vllm
from kvtop.collect.poller import Poller, narrowed_url
from kvtop.collect.target import Target
from kvtop.sim.server import SimConfig, SimFleet
from tests.faultserver import FaultServer

TIMEOUT = 1.0


def test_narrowed_url_names_every_wanted_sample_after_a_trailing_slash() -> None:
    url = narrowed_url("http://gpu-1:8000/metrics", ["vllm:b_total", "vllm:a"])
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "gpu-1:8000", "/metrics/")
    assert parts.query == "name%5B%5D=vllm%3Aa&name%5B%5D=vllm%3Ab_total"  # sorted, escaped
    assert parse_qs(parts.query) == {"name[]": ["vllm:a", "vllm:b_total"]}


def test_narrowed_url_keeps_the_path_prefix_and_the_query_given() -> None:
    url = narrowed_url("https://proxy/llm-a/metrics/?tenant=x", ["vllm:a"])
    parts = urlsplit(url)
    assert parts.path == "/llm-a/metrics/"
    assert parse_qs(parts.query) == {"tenant": ["x"], "name[]": ["vllm:a"]}


async def test_a_vllm_server_is_read_narrowed_with_the_same_numbers() -> None:
    async with SimFleet([SimConfig(autostep=False)]) as fleet:
        target = Target(fleet.urls[0] + "/metrics")
        async with Poller([target], narrow=True, timeout_s=TIMEOUT) as narrowing:
            (narrowed,) = await narrowing.poll_once()
            assert narrowing.state(target).narrows is True
        async with Poller([target], timeout_s=TIMEOUT) as plain:
            (full,) = await plain.poll_once()
        assert fleet.servers[0].scrapes == 2  # one request each: no retry was needed
    assert narrowed.ok and full.ok
    assert narrowed.body is not None and full.body is not None
    assert len(narrowed.body) < len(full.body) / 3
    names = {line.split("{")[0].split(" ")[0] for line in narrowed.body.splitlines()
             if not line.startswith("#")}
    assert names <= WANTED
    assert read_exposition(narrowed.body).engines == read_exposition(full.body).engines


@pytest.mark.parametrize("names", ["v0", "sglang"])
async def test_a_multiprocess_server_answers_nothing_and_is_read_whole(names: str) -> None:
    async with SimFleet([SimConfig(names=names, autostep=False)]) as fleet:  # type: ignore[arg-type]
        server = fleet.servers[0]
        target = Target(fleet.urls[0] + "/metrics")
        async with Poller([target], narrow=True, timeout_s=TIMEOUT) as poller:
            first = await poller.poll_once()
            assert server.scrapes == 2  # the empty narrowed answer, then the retry
            second = await poller.poll_once()
            assert server.scrapes == 3  # from then on, only the URL given
            assert poller.state(target).narrows is False
    for (scrape,) in (first, second):
        assert scrape.ok, scrape.error
        assert read_exposition(scrape.body or "").kind == ("sglang" if names == "sglang"
                                                           else "vllm")


# No route there, a server error there, a proxy that only lets /metrics through.
@pytest.mark.parametrize("slash_mode", ["notfound", "error500", "forbidden"])
async def test_a_server_without_the_route_is_read_at_its_url(slash_mode: str) -> None:
    async with FaultServer(slash_mode=slash_mode) as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=TIMEOUT) as poller:
            (first,) = await poller.poll_once()
            (second,) = await poller.poll_once()
            assert poller.state(target).narrows is False
    assert first.ok and second.ok
    paths = [r.path for r in server.requests if not r.path.endswith("/version")]
    assert paths == ["/metrics/", "/metrics", "/metrics"]


async def test_once_the_server_is_known_only_its_adapters_names_are_asked_for(
    fault_server: FaultServer,
) -> None:
    async with Poller([Target(fault_server.url())], narrow=True, timeout_s=TIMEOUT) as poller:
        for _ in range(3):
            await poller.poll_once()
    asked = [set(parse_qs(urlsplit(r.target).query)["name[]"])
             for r in fault_server.requests if r.path == "/metrics/"]
    assert asked == [set(WANTED), set(vllm.NAMES), set(vllm.NAMES)]
    assert len(vllm.NAMES) < len(WANTED)


async def test_a_server_that_ignores_the_names_is_read_whole_without_a_retry(
    fault_server: FaultServer,
) -> None:
    target = Target(fault_server.url())
    async with Poller([target], narrow=True, timeout_s=TIMEOUT) as poller:
        (result,) = await poller.poll_once()
        assert poller.state(target).narrows is True
    assert result.ok and read_exposition(result.body or "").kind == "vllm"
    assert [r.path for r in fault_server.requests if r.path.endswith("/")] == ["/metrics/"]
    assert fault_server.hits == 1


async def test_a_narrowed_timeout_is_reported_without_asking_again() -> None:
    async with FaultServer(slash_mode="hang") as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=0.3) as poller:
            (result,) = await poller.poll_once()
            assert poller.state(target).narrows is None
    assert result.failure == "timeout"
    assert server.hits == 0  # a slow server is not asked twice in one attempt


async def test_a_server_that_stops_filtering_is_read_whole_again() -> None:
    async with FaultServer() as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=TIMEOUT) as poller:
            await poller.poll_once()
            assert poller.state(target).narrows is True
            server.slash_mode = "empty"  # e.g. restarted with several API servers
            (result,) = await poller.poll_once()
            assert result.ok, result.error
            assert poller.state(target).narrows is False


async def test_a_failure_makes_the_next_attempt_ask_again() -> None:
    async with FaultServer(slash_mode="notfound") as server:
        target = Target(server.url())
        async with Poller([target], narrow=True, timeout_s=TIMEOUT) as poller:
            await poller.poll_once()
            assert poller.state(target).narrows is False
            server.mode = "error500"
            (failed,) = await poller.poll_once()
            assert failed.failure == "down" and "HTTP 500" in (failed.error or "")
            assert poller.state(target).narrows is None  # the server may have changed
            server.mode, server.slash_mode = "ok", None
            (result,) = await poller.poll_once()
            assert result.ok and poller.state(target).narrows is True


async def test_without_narrow_only_the_url_given_is_read(fault_server: FaultServer) -> None:
    async with Poller([Target(fault_server.url())], timeout_s=TIMEOUT) as poller:
        await poller.poll_once()
    assert not any(r.path.endswith("/") for r in fault_server.requests)
