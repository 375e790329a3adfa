"""The OpenAI client: what it refuses, how it times a stream, what it does with bad answers."""

from __future__ import annotations

import pytest
from aiohttp import web

from kvtop.load.openai_client import (
    NotOpenAI,
    ServedModel,
    completion_request,
    list_models,
    make_session,
    stream_completion,
)
from kvtop.sim.engine import EngineConfig
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.fake_openai import MODEL, FakeOpenAI
from tests.fakes.faultserver import FaultServer, closed_port


async def test_lists_the_simulators_models() -> None:
    config = SimConfig(workload="none", engine=EngineConfig(num_gpu_blocks=101))
    async with SimFleet([config]) as fleet, make_session() as session:
        models = await list_models(session, fleet.urls[0] + "/v1")
    assert models == [ServedModel(config.model_name, 100 * 16)]


async def serve_text(body: bytes, status: int = 200) -> web.AppRunner:
    async def models(_: web.Request) -> web.Response:
        return web.Response(body=body, status=status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize(("body", "status", "said"), [
    (b"<html><title>Grafana</title></html>", 200, "did not answer with an OpenAI model list"),
    (b'{"data": []}', 200, "lists no models"),
    (b'{"error": "no"}', 404, "answered HTTP 404: not an OpenAI-compatible server"),
    (b"", 401, "wants a bearer token"),
])
async def test_refuses_what_is_not_an_openai_server(body: bytes, status: int, said: str) -> None:
    runner = await serve_text(body, status)
    try:
        port = runner.addresses[0][1]
        async with make_session() as session:
            with pytest.raises(NotOpenAI, match=said):
                await list_models(session, f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()


async def test_refuses_a_metrics_only_server_and_a_closed_port() -> None:
    async with FaultServer() as metrics_only, make_session() as session:
        with pytest.raises(NotOpenAI, match="did not answer with an OpenAI model list"):
            await list_models(session, f"http://127.0.0.1:{metrics_only.port}/v1")
        with pytest.raises(NotOpenAI, match="connection refused"):
            await list_models(session, f"http://127.0.0.1:{closed_port()}/v1", timeout_s=5)


async def test_times_a_simulated_stream() -> None:
    async with SimFleet([SimConfig(workload="none", speed=2.0)]) as fleet, \
            make_session() as session:
        path, body = completion_request(fleet.servers[0].config.model_name,
                                        "alpha beta gamma", 30)
        result = await stream_completion(session, fleet.urls[0] + "/v1" + path, body)
    assert result.status == "ok" and result.error is None
    assert result.prompt_tokens == 3 and result.completion_tokens == 30
    assert result.finish_reason == "length"
    assert result.ttft_s is not None and result.total_s is not None
    assert 0 < result.ttft_s <= result.total_s
    assert result.tpot_s is not None and result.tpot_s > 0
    assert result.itl_max_s is not None and result.itl_max_s >= result.tpot_s


async def test_counts_a_chunk_per_token_without_usage() -> None:
    async with FakeOpenAI(tokens=5, usage=False) as server, make_session() as session:
        path, body = completion_request(MODEL, "x", 5)
        result = await stream_completion(session, server.url + "/v1" + path, body)
    assert result.status == "ok" and result.completion_tokens == 5
    assert result.prompt_tokens is None


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (503, True), (429, True)])
async def test_an_http_error_is_an_error_with_the_servers_message(status: int,
                                                                   retryable: bool) -> None:
    async with FakeOpenAI(fail_status={1: status}) as server, make_session() as session:
        path, body = completion_request(MODEL, "x", 2)
        result = await stream_completion(session, server.url + "/v1" + path, body)
    assert result.status == "error" and result.http_status == status
    assert result.error == f"HTTP {status}: refused 1"
    assert result.retryable is retryable


async def test_a_cut_stream_and_a_hanging_server() -> None:
    async with FakeOpenAI(tokens=5, cut_after=2) as server, make_session() as session:
        path, body = completion_request(MODEL, "x", 5)
        cut = await stream_completion(session, server.url + "/v1" + path, body)
        assert cut.status == "error" and not cut.retryable
        assert cut.error == "the server closed the stream mid-answer"
        assert cut.completion_tokens == 2
    async with FakeOpenAI(hang=True) as server, make_session() as session:
        result = await stream_completion(session, server.url + "/v1" + path, body,
                                         timeout_s=0.3)
        assert result.status == "timeout" and result.total_s is not None
        assert result.total_s >= 0.3
    async with make_session() as session:
        refused = await stream_completion(session, f"http://127.0.0.1:{closed_port()}/v1"
                                          + path, body)
    assert refused.status == "error" and refused.retryable
    assert refused.error is not None and "connection refused" in refused.error


def test_a_request_asks_for_exact_lengths_and_usage() -> None:
    path, body = completion_request("m", [1, 2, 3], 7)
    assert path == "/completions" and body["prompt"] == [1, 2, 3]
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    path, body = completion_request("m", "hello", 3, chat=True, ignore_eos=False)
    assert path == "/chat/completions" and "ignore_eos" not in body
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    with pytest.raises(ValueError):
        completion_request("m", [1], 3, chat=True)
