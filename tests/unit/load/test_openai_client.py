"""The OpenAI client: what it refuses, how it times a stream, what it does with bad answers."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import ClientTimeout, web

from kvtop import __version__
from kvtop.collect.http import KEEPALIVE_S
from kvtop.load.openai_client import (
    MAX_EVENT_LINE,
    CompletionResult,
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
        result = await stream_completion(session, fleet.urls[0] + "/v1" + path, body,
                                           timeout_s=30)
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
        result = await stream_completion(session, server.url + "/v1" + path, body,
                                         timeout_s=10)
    assert result.status == "ok" and result.completion_tokens == 5
    assert result.prompt_tokens is None


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (503, True), (429, True)])
async def test_an_http_error_is_an_error_with_the_servers_message(status: int,
                                                                   retryable: bool) -> None:
    async with FakeOpenAI(fail_status={1: status}) as server, make_session() as session:
        path, body = completion_request(MODEL, "x", 2)
        result = await stream_completion(session, server.url + "/v1" + path, body,
                                         timeout_s=10)
    assert result.status == "error" and result.http_status == status
    assert result.error == f"HTTP {status}: refused 1"
    assert result.retryable is retryable


async def test_a_cut_stream_and_a_hanging_server() -> None:
    async with FakeOpenAI(tokens=5, cut_after=2) as server, make_session() as session:
        path, body = completion_request(MODEL, "x", 5)
        cut = await stream_completion(session, server.url + "/v1" + path, body, timeout_s=10)
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
                                          + path, body, timeout_s=10)
    assert refused.status == "error" and refused.retryable
    assert refused.error is not None and "connection refused" in refused.error


def test_a_request_asks_for_exact_lengths_and_usage() -> None:
    usage = {"include_usage": True, "continuous_usage_stats": True}
    assert completion_request("m", [1, 2, 3], 7) == ("/completions", {
        "model": "m", "max_tokens": 7, "stream": True, "stream_options": usage,
        "ignore_eos": True, "prompt": [1, 2, 3]})
    assert completion_request("m", "hello", 3, chat=True, ignore_eos=False) == (
        "/chat/completions", {"model": "m", "max_tokens": 3, "stream": True,
                              "stream_options": usage,
                              "messages": [{"role": "user", "content": "hello"}]})
    with pytest.raises(ValueError) as refused:
        completion_request("m", [1], 3, chat=True)
    assert str(refused.value) == "a chat request takes text, not token ids"


# -- a server whose every byte the test says --------------------------------------------


HANG = b""  # a chunk that never comes: the server waits for ever there


class Ticks:
    """A clock that reads the given times in turn."""

    def __init__(self, *times: float) -> None:
        self.times = iter(times)

    def __call__(self) -> float:
        return next(self.times)


@dataclass
class Scripted:
    """An OpenAI-shaped server on 127.0.0.1 that answers each POST with ``chunks`` (written
    one at a time) or, unless ``status`` is 200, with ``status`` and ``body``; it keeps each
    request's headers and body."""

    chunks: Sequence[bytes] = ()
    status: int = 200
    body: bytes = b""
    models: bytes = b'{"data": [{"id": "m"}]}'
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def _post(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((dict(request.headers), await request.read()))
        if self.status != 200:
            return web.Response(status=self.status, body=self.body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in self.chunks:
            if chunk == HANG:
                await asyncio.Event().wait()
            await response.write(chunk)
            await asyncio.sleep(0.001)  # each chunk its own read, as a server's tokens come
        return response

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), b""))
        return web.Response(body=self.models, headers={"Set-Cookie": "session=1; Path=/"})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Scripted]:
        app = web.Application()
        app.router.add_post("/v1/completions", self._post)
        app.router.add_post("/v1/chat/completions", self._post)
        app.router.add_get("/v1/models", self._models)
        # a client that goes away cancels its handler (one waiting at HANG too)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        try:
            yield self
        finally:
            await runner.cleanup()


def events(*payloads: object) -> list[bytes]:
    """Server-sent events, one chunk each, then the end."""
    return [b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]


def chunk(text: str = " x", *, usage: int | None = None, finish: str | None = None
          ) -> dict[str, object]:
    """A completions chunk carrying ``text`` (and vLLM's running usage count)."""
    out: dict[str, object] = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = {"prompt_tokens": 5, "completion_tokens": usage}
    return out


async def streamed(chunks: Sequence[bytes], *, clock: Callable[[], float] | None = None,
                   **kwargs: Any) -> CompletionResult:
    """What stream_completion makes of ``chunks``."""
    async with Scripted(chunks).serving() as server, make_session() as session:
        path, body = completion_request("m", "x", 8)
        return await stream_completion(session, server.url + path, body, timeout_s=10,
                                       clock=clock or Ticks(*range(100)), **kwargs)


async def test_a_stream_is_timed_by_its_token_carrying_chunks() -> None:
    usage_only = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}
    result = await streamed(events(chunk(usage=1), chunk(usage=2), chunk(usage=4, finish="length"),
                                   usage_only),
                            clock=Ticks(10.0, 11.0, 13.0, 13.5, 20.0))
    # the longest gap came first
    assert result == CompletionResult(
        status="ok", http_status=200, ttft_s=1.0, total_s=10.0, itl_max_s=2.0,
        prompt_tokens=5, completion_tokens=4, finish_reason="length",
        _first_t=11.0, _last_t=13.5)
    assert result.tpot_s == 2.5 / 3


def test_the_time_per_output_token_needs_two_tokens() -> None:
    assert CompletionResult(completion_tokens=2, _first_t=1.0, _last_t=4.0).tpot_s == 3.0
    assert CompletionResult(completion_tokens=3, _first_t=1.0, _last_t=4.0).tpot_s == 1.5
    assert CompletionResult(completion_tokens=1, _first_t=1.0, _last_t=1.0).tpot_s is None
    assert CompletionResult(completion_tokens=2, _last_t=4.0).tpot_s is None
    assert CompletionResult(completion_tokens=2, _first_t=1.0).tpot_s is None
    assert CompletionResult() == CompletionResult(
        status="error", http_status=None, error=None, retryable=False, ttft_s=None,
        total_s=None, itl_max_s=None, prompt_tokens=None, completion_tokens=0,
        finish_reason=None, _first_t=None, _last_t=None)


async def test_a_chat_stream_counts_chunks_with_content_when_there_is_no_usage() -> None:
    def delta(**fields: str) -> dict[str, object]:
        return {"choices": [{"index": 0, "delta": fields}]}

    result = await streamed(events(delta(role="assistant"), delta(content="a"),
                                   delta(content=""), delta(content="b"),
                                   {"choices": [{"delta": {"content": "c"},
                                                 "finish_reason": "stop"}]}),
                            clock=Ticks(0.0, 2.0, 3.0, 7.0, 9.0))
    assert (result.status, result.completion_tokens, result.prompt_tokens) == ("ok", 3, None)
    assert (result.ttft_s, result.itl_max_s, result.finish_reason) == (2.0, 4.0, "stop")
    assert result.total_s == 9.0


async def test_what_is_not_a_token_in_the_stream_is_passed_over() -> None:
    result = await streamed([
        b": keep-alive\n\n", b"event: ping\n", b"event[DONE]\n",
        b': ok {"choices": [{"text": "not data"}]}\n', b"data: not json\n\n", b"data: [1, 2]\n\n",
        b"data: 7\n\n", b'data: {"choices": null, "usage": "many"}\n\n',
        b'data: {"error": null, "choices": [{"text": "a"}]}\n\n',
        b'data:{"choices": [{"text": "b"}]}\r\n\r\n',  # no space, CRLF
        b'data: {"choices": ["c"], "usage": {"prompt_tokens": "5"}}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": "9"}}\n\n',
        b'data: {"choices": [{"text": "d", "finish_reason": ""}]}\n\n',
        b"data:[DONE]\r\n"], clock=Ticks(0.0, 1.0, 2.0, 3.0, 4.0, 5.0))
    assert result == CompletionResult(status="ok", http_status=200, ttft_s=1.0, total_s=5.0,
                                      itl_max_s=1.0, prompt_tokens=6, completion_tokens=4,
                                      _first_t=1.0, _last_t=4.0)


async def test_a_line_split_across_reads_is_read_once() -> None:
    event = b'data: {"choices": [{"text": "a"}], "usage": {"prompt_tokens": 2, ' \
            b'"completion_tokens": 1}}\n\ndata: [DO'
    result = await streamed([event[:9], event[9:30], event[30:], b"NE]\n\n"])
    assert (result.status, result.prompt_tokens, result.completion_tokens) == ("ok", 2, 1)


async def test_the_usage_count_says_how_many_tokens_a_chunk_carries() -> None:
    final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}
    result = await streamed(events(chunk(usage=2), chunk(usage=2), chunk(usage=3), final),
                            clock=Ticks(0.0, 1.0, 2.0, 4.0, 5.0))
    # the second chunk carries no new token: not a token's arrival
    assert (result.completion_tokens, result.ttft_s, result.itl_max_s) == (5, 1.0, 1.0)
    assert result.tpot_s == (2.0 - 1.0) / 4
    # a final count below what was counted does not take tokens back
    fewer = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    result = await streamed(events(chunk(), chunk(), chunk(), fewer))
    assert (result.completion_tokens, result.prompt_tokens) == (3, 5)


async def test_an_error_in_the_stream_is_the_servers_message_masked_and_cut() -> None:
    said = "  out of\n memory  Authorization: Bearer sk-0123456789abcdef "
    result = await streamed(events(chunk(), {"error": {"message": said}}))
    assert (result.status, result.completion_tokens) == ("error", 1)  # [DONE] does not undo it
    assert result.error == "server error: out of memory Authorization: Bearer ***"
    result = await streamed(events({"error": "overloaded"}))
    assert (result.status, result.error) == ("error", "server error: overloaded")
    result = await streamed(events({"error": {"message": "y" * 300}}))
    assert result.error == "server error: " + "y" * 200
    result = await streamed(events({"error": {"code": 500}}))
    assert result.error == "server error: None"


async def test_a_finish_reason_is_masked_and_cut() -> None:
    result = await streamed(events(chunk(finish="Bearer sk-0123456789abcdef " + "z" * 60)))
    assert result.finish_reason == ("Bearer *** " + "z" * 60)[:40]


async def test_a_stream_that_ends_before_done_failed_mid_answer() -> None:
    result = await streamed(events(chunk(usage=1), chunk(usage=2))[:-1])
    assert (result.status, result.error, result.retryable, result.completion_tokens) == (
        "error", "the server closed the stream mid-answer", False, 2)


@pytest.mark.parametrize(("status", "body", "error", "retryable"), [
    (429, b'{"error": {"message": "slow down"}}', "HTTP 429: slow down", True),
    (502, b"", "HTTP 502", True),
    (503, b'{"error": "busy"}', "HTTP 503: busy", True),
    (504, b'{"message": "gateway\\n  timed out"}', "HTTP 504: gateway timed out", True),
    (500, b"[1]", "HTTP 500", False),
    (501, b'{"error": {"message": " \\n "}}', "HTTP 501", False),
    (400, b'{"error": {"message": 7}}', "HTTP 400", False),
    (401, b'{"error": {"message": "bad key Bearer sk-0123456789abcdef"}}',
     "HTTP 401: bad key Bearer ***", False),
    (413, b'{"error": {"message": "' + b"y" * 300 + b'"}}', "HTTP 413: " + "y" * 200, False),
    # the error body is read up to 8 KiB: a longer one is not quoted
    (500, b'{"message": "fits"}'.ljust(8192), "HTTP 500: fits", False),
    (500, b'{"message": "fits"}'.ljust(8193), "HTTP 500", False),
    (201, b"", "HTTP 201", False),
])
async def test_an_http_error_says_the_servers_message_and_whether_to_retry(
        status: int, body: bytes, error: str, retryable: bool) -> None:
    async with Scripted(status=status, body=body).serving() as server, \
            make_session() as session:
        path, request = completion_request("m", "x", 8)
        result = await stream_completion(session, server.url + path, request, timeout_s=10,
                                         clock=Ticks(1.0, 3.5))
    assert result == CompletionResult(status="error", http_status=status, error=error,
                                      retryable=retryable, total_s=2.5)


async def test_a_request_says_what_it_sends_and_accepts() -> None:
    async with Scripted(events(chunk())).serving() as server, make_session() as session:
        path, body = completion_request("m", "x", 8)
        await stream_completion(session, server.url + path, body, token="s3cret-token",
                                timeout_s=10)
        await stream_completion(session, server.url + path, body, timeout_s=10)
    (headers, sent), (anonymous, _) = server.requests
    assert (headers["Content-Type"], headers["Accept"]) == ("application/json",
                                                            "text/event-stream")
    assert headers["Authorization"] == "Bearer s3cret-token"
    assert headers["User-Agent"] == f"kvtop/{__version__}"
    assert orjson.loads(sent) == body
    assert "Authorization" not in anonymous and anonymous["Accept"] == "text/event-stream"


@pytest.mark.parametrize(("pad", "status"), [(MAX_EVENT_LINE, "ok"), (MAX_EVENT_LINE + 1, "error")])
async def test_a_line_that_never_ends_fails_the_request_past_1_mib(pad: int, status: str) -> None:
    line = b":" + b"p" * (pad - 1)  # a comment line, read in 64 KiB pieces, then its end
    pieces = [line[i:i + 65536] for i in range(0, len(line), 65536)]
    result = await streamed([*pieces, b"\n\n", *events(chunk())])
    assert result.status == status
    assert result.error == (None if status == "ok" else
                            "a line of the event stream over 1,048,576 bytes with no end: "
                            "not server-sent events")
    assert result.retryable is False


async def test_a_cancelled_request_keeps_what_had_arrived() -> None:
    async with Scripted([events(chunk(usage=1))[0], HANG]).serving() as server, \
            make_session() as session:
        path, body = completion_request("m", "x", 8)
        kept = CompletionResult()
        task = asyncio.create_task(stream_completion(
            session, server.url + path, body, timeout_s=10, clock=Ticks(0.0, 0.5), result=kept))
        while kept.completion_tokens == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (kept.ttft_s, kept.completion_tokens, kept.http_status) == (0.5, 1, 200)


async def test_no_answer_in_time_is_a_timeout_and_a_closed_port_may_be_retried() -> None:
    async with Scripted([HANG]).serving() as server, make_session() as session:
        path, body = completion_request("m", "x", 8)
        late = await stream_completion(session, server.url + path, body, timeout_s=0.2,
                                       clock=Ticks(0.0, 0.2))
        refused = await stream_completion(session, f"http://127.0.0.1:{closed_port()}/v1"
                                          + path, body, timeout_s=5, clock=Ticks(0.0, 0.1))
    assert late == CompletionResult(status="timeout", http_status=200, total_s=0.2,
                                    error="no complete answer in time")
    assert refused == CompletionResult(
        status="error", retryable=True, total_s=0.1,
        error="connection refused: nothing listens on that port")


async def models_of(answer: bytes, **kwargs: Any) -> list[ServedModel]:
    async with Scripted(models=answer).serving() as server, make_session() as session:
        return await list_models(session, server.url, **kwargs)


async def test_a_model_list_keeps_ids_a_model_can_have_and_lengths_that_are_lengths() -> None:
    listed = [{"id": "a", "max_model_len": 2048}, {"id": "b", "max_model_len": 0},
              {"id": "c", "max_model_len": 1}, {"id": "d", "max_model_len": True},
              {"id": "e", "max_model_len": 2048.0}, {"id": "f"}, {"id": 7}, {"id": ""},
              {"id": "x" * 512}, {"id": "y" * 513}, {"id": "Bearer sk-0123456789abcdef"}]
    assert await models_of(orjson.dumps({"data": listed})) == [
        ServedModel("a", 2048), ServedModel("b", None), ServedModel("c", 1),
        ServedModel("d", None), ServedModel("e", None), ServedModel("f", None),
        ServedModel("x" * 512, None), ServedModel("Bearer ***", None)]


async def test_a_model_list_is_read_up_to_1024_models_and_1_mib() -> None:
    many = await models_of(orjson.dumps({"data": [{"id": f"m{n}"} for n in range(1025)]}))
    assert len(many) == 1024 and many[-1] == ServedModel("m1023", None)
    one = b'{"data": [{"id": "m"}]}'
    assert await models_of(one.ljust(1024 * 1024)) == [ServedModel("m", None)]
    with pytest.raises(NotOpenAI) as refused:
        await models_of(one.ljust(1024 * 1024 + 1))
    assert str(refused.value).endswith(
        "/v1/models: cannot read the server: the body is over the 1,048,576-byte size cap; "
        "dropped (a guard against broken or hostile servers)")


@pytest.mark.parametrize(("answer", "said"), [
    (b'{"data": 5}', "did not answer with an OpenAI model list"),
    (b'{"data": [{"name": "m"}]}', "did not answer with an OpenAI model list"),
    (b'{"models": []}', "did not answer with an OpenAI model list"),
    (b'{"data": [{"id": 7}]}', "lists no models (of ids up to 512 characters): "
                               "nothing to send requests to"),
])
async def test_what_is_not_a_model_list_is_refused(answer: bytes, said: str) -> None:
    with pytest.raises(NotOpenAI) as refused:
        await models_of(answer)
    url = str(refused.value).split(" ")[0]
    assert url.endswith("/v1/models")
    if said.startswith("did not"):
        said += ' ({"data": [{"id": ...}]}): not an OpenAI-compatible server'
    assert str(refused.value) == f"{url} {said}"


@pytest.mark.parametrize(("status", "said"), [
    (401, "answered HTTP 401: the API wants a bearer token (--token-env / --token-file)"),
    (403, "answered HTTP 403: the API wants a bearer token (--token-env / --token-file)"),
    (404, "answered HTTP 404: not an OpenAI-compatible server (one lists its models there)"),
    (201, "answered HTTP 201: not an OpenAI-compatible server (one lists its models there)"),
])
async def test_a_model_list_refused_says_why(status: int, said: str) -> None:
    runner = await serve_text(b'{"data": [{"id": "m"}]}', status)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        async with make_session() as session:
            with pytest.raises(NotOpenAI) as refused:
                await list_models(session, url)
    finally:
        await runner.cleanup()
    assert str(refused.value) == f"{url}/models {said}"


async def test_a_model_list_is_asked_for_with_the_token_within_the_time_given() -> None:
    async with FakeOpenAI() as server, make_session() as session:
        await list_models(session, server.url + "/v1", token="s3cret-token")
        await list_models(session, server.url + "/v1")
    assert server.authorizations == ["Bearer s3cret-token", None]
    async with FaultServer() as hanging, make_session() as session:
        url = hanging.url("hang").removesuffix("/metrics")
        with pytest.raises(NotOpenAI) as refused:
            await list_models(session, url, timeout_s=0.2)
    assert str(refused.value) == f"cannot read {url}/models: no complete answer within 0.2 s"


async def test_a_session_sends_no_cookies_and_has_no_deadline_of_its_own() -> None:
    async with Scripted().serving() as server, make_session() as session:
        # by name: aiohttp's own cookie jar keeps no cookie an IP address sets
        by_name = server.url.replace("127.0.0.1", "localhost")
        await list_models(session, by_name)
        await list_models(session, by_name)  # the first answer set a cookie
        assert (session.trust_env, session.timeout) == (False, ClientTimeout(total=None))
        assert session.connector is not None and session.connector.limit == 0
        # an idle connection is closed in 4 s, as kvtop's scrapes' are (aiohttp's: 15 s)
        assert session.connector._keepalive_timeout == KEEPALIVE_S == 4.0
    assert [headers.get("Cookie") for headers, _ in server.requests] == [None, None]
    assert server.requests[0][0]["User-Agent"] == f"kvtop/{__version__}"
    async with make_session(limit=3) as session:
        assert session.connector is not None and session.connector.limit == 3


async def test_a_self_signed_server_is_read_only_when_insecure(
        self_signed: ssl.SSLContext) -> None:
    async with FakeOpenAI(ssl_context=self_signed) as server:
        async with make_session(insecure=True) as session:
            assert await list_models(session, server.url + "/v1") == [ServedModel(MODEL, 2048)]
        async with make_session() as session:
            with pytest.raises(NotOpenAI) as refused:
                await list_models(session, server.url + "/v1")
    assert str(refused.value).startswith(f"cannot read {server.url}/v1/models: ")
    assert "certificate" in str(refused.value)
