"""The simulator's OpenAI routes: vLLM 0.33's answers, requests run by the engine, streams
timed by its steps, and /metrics counting what the API was sent."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable

import httpx
import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from kvtop.load.openai_client import completion_request, make_session, stream_completion
from kvtop.sim.engine import EngineConfig, Request
from kvtop.sim.faults import Fault
from kvtop.sim.openai_api import (
    ApiError,
    Call,
    Output,
    _Chunks,
    _drop,
    _max_tokens,
    _whole_body,
    block_keys,
    chat_tokens,
    prompt_tokens,
    text_tokens,
)
from kvtop.sim.server import SimConfig, SimFleet, SimServer

# Key sets of vLLM 0.33.0's streamed completion chunks, as its twin sent them
# (`vllm serve --skip-tokenizer-init`, stream_options include_usage + continuous_usage_stats).
VLLM_CHUNK_KEYS = {"id", "object", "created", "model", "choices", "usage", "kv_transfer_params"}
VLLM_CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason",
                    "prompt_token_ids", "token_ids", "weight_versions"}
VLLM_USAGE_CHUNK_KEYS = {"id", "object", "created", "model", "choices", "usage",
                         "system_fingerprint"}


def api_config(**engine: int) -> SimConfig:
    return SimConfig(workload="none", speed=5.0, engine=EngineConfig(**engine))


def events(text: str) -> list[str]:
    """The data payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def metrics(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                out[f"success_{sample.labels['finished_reason']}"] = sample.value
            elif not sample.labels.get("le"):
                out.setdefault(sample.name, sample.value)
    return out


def test_approximate_tokenizer() -> None:
    assert text_tokens("the tokenizer  of\nkvtop") == ["the", "tokeni", "zer", "of", "kvtop"]
    assert prompt_tokens("a b c") == ["a", "b", "c"]
    assert prompt_tokens([5, 6, 7]) == [5, 6, 7]
    assert prompt_tokens([[5, 6]]) == [5, 6]
    chat = chat_tokens([{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hi there"}]}])
    assert len(chat) == (2 + 2) + (2 + 2) + 1


async def test_streamed_completion_is_vllm_shaped_and_counted() -> None:
    async with SimFleet([api_config()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        server = fleet.servers[0]
        body = {"model": server.config.model_name, "prompt": "one two three four five",
                "max_tokens": 40, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        answer = await client.post(f"{server.url}/v1/completions", json=body)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        payloads = events(answer.text)
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        *token_chunks, usage_chunk = chunks
        for chunk in token_chunks:
            assert set(chunk) == VLLM_CHUNK_KEYS
            assert set(chunk["choices"][0]) == VLLM_CHOICE_KEYS
            assert chunk["object"] == "text_completion"
        assert set(usage_chunk) == VLLM_USAGE_CHUNK_KEYS and usage_chunk["choices"] == []
        counts = [c["usage"]["completion_tokens"] for c in token_chunks]
        assert counts == sorted(counts) and counts[-1] == 40
        assert token_chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert usage_chunk["usage"] == {"prompt_tokens": 5, "total_tokens": 45,
                                        "completion_tokens": 40}
        # every token's text arrived, one word per token
        text = "".join(c["choices"][0]["text"] for c in token_chunks)
        assert len(text.split()) == 40
        counted = metrics((await client.get(f"{server.url}/metrics")).text)
        truth = server.truth()
        assert counted["vllm:prompt_tokens_total"] == truth.prompt_tokens == 5
        assert counted["vllm:generation_tokens_total"] == truth.generation_tokens == 40
        assert counted["success_length"] == 1
        assert counted["vllm:time_to_first_token_seconds_count"] == 1


async def test_chat_stream_and_whole_answers() -> None:
    async with SimFleet([api_config()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        url = fleet.urls[0]
        messages = [{"role": "user", "content": "how many blocks"}]
        streamed = await client.post(f"{url}/v1/chat/completions", json={
            "messages": messages, "max_tokens": 6, "stream": True})
        chunks = [json.loads(p) for p in events(streamed.text)[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert len(content.split()) == 6
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        whole = (await client.post(f"{url}/v1/chat/completions", json={
            "messages": messages, "max_tokens": 3})).json()
        assert whole["object"] == "chat.completion"
        assert whole["usage"]["prompt_tokens"] == 2 + 3 + 1
        assert whole["usage"]["completion_tokens"] == 3
        assert whole["choices"][0]["message"]["role"] == "assistant"
        completion = (await client.post(f"{url}/v1/completions", json={
            "prompt": [11, 12, 13, 14]})).json()
        assert completion["usage"] == {"prompt_tokens": 4, "total_tokens": 20,
                                       "completion_tokens": 16, "prompt_tokens_details": None}


@pytest.mark.parametrize(("body", "status", "said"), [
    ({"model": "other", "prompt": "x"}, 404, "The model `other` does not exist"),
    ({"prompt": "x", "max_tokens": 100_000}, 400, "cannot be greater than max_model_len"),
    ({"prompt": "word " * 4000}, 400, "maximum context length"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be at least 1"),
    ({"prompt": ["a", "b"]}, 400, "one prompt"),
    ({"prompt": 7}, 400, "prompt must be"),
])
async def test_bad_requests_get_vllm_errors(body: dict, status: int, said: str) -> None:
    config = api_config(num_gpu_blocks=200)  # model_len (200 - 1) * 16 = 3184
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{fleet.urls[0]}/v1/completions", json=body)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert said in error["message"] and error["code"] == status
        garbage = await client.post(f"{fleet.urls[0]}/v1/completions", content=b"{nope")
        assert garbage.status_code == 400


async def test_max_tokens_is_clamped_to_what_fits() -> None:
    config = api_config(num_gpu_blocks=200)
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=30) as client:
        answer = (await client.post(f"{fleet.urls[0]}/v1/completions", json={
            "prompt": list(range(3180)), "max_tokens": 100})).json()
        assert answer["usage"]["completion_tokens"] == 3184 - 3180


async def test_api_requires_the_token_when_configured() -> None:
    config = SimConfig(workload="none", faults=[Fault(0.0, "auth", "s3cret")])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=10) as client:
        body = {"prompt": "x", "max_tokens": 1}
        url = f"{fleet.urls[0]}/v1/completions"
        assert (await client.post(url, json=body)).status_code == 401
        ok = await client.post(url, json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll for a state (never a fixed sleep); fail after a generous deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "the state never came"
        await asyncio.sleep(0.02)


async def test_a_client_that_hangs_up_aborts_its_request() -> None:
    async with SimFleet([SimConfig(workload="none", speed=1.0)]) as fleet:
        server = fleet.servers[0]
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
                "POST", f"{server.url}/v1/completions",
                json={"prompt": "a b c", "max_tokens": 5000, "stream": True}) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    break  # the first tokens came: hang up
        await wait_until(lambda: server.truth().finished["abort"] == 1)
        assert server.truth().running == 0


def handler_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What aiohttp logged of the handlers' failures (a handler that raised or returned no
    response): a dropped answer is no failure."""
    return [record.getMessage() for record in caplog.records
            if record.name.startswith("aiohttp") and record.levelno >= logging.ERROR]


async def test_a_restart_drops_open_streams_and_requests_after_it_run(
        caplog: pytest.LogCaptureFixture) -> None:
    async with SimFleet([SimConfig(workload="none", speed=1.0)]) as fleet:
        server = fleet.servers[0]
        async with make_session() as session:
            path, body = completion_request(server.config.model_name, "a b c", 5000)
            streaming = asyncio.create_task(stream_completion(session, server.url + "/v1" + path,
                                                              body, timeout_s=30))
            await wait_until(lambda: server.truth().generation_tokens > 3)
            server.simulation.inject("restart")
            lost = await streaming
            assert lost.status == "error"
            assert lost.error == "the server closed the stream mid-answer"
            # the server had made 4 tokens; the client may have read fewer before the restart
            # (its chunks still on the way on a loaded machine), never none and never all
            assert 0 < lost.completion_tokens < 5000
            path, body = completion_request(server.config.model_name, "a b c", 8)
            after = await stream_completion(session, server.url + "/v1" + path, body,
                                            timeout_s=30)
            assert after.status == "ok" and after.completion_tokens == 8
            assert server.truth().restarts == 1
    assert handler_errors(caplog) == []


async def test_prompts_sharing_a_prefix_share_cached_blocks() -> None:
    async with SimFleet([api_config()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        server = fleet.servers[0]
        prefix = " ".join(f"w{i}" for i in range(64))  # four full blocks
        for question in ("what now", "and then"):
            answer = await client.post(f"{server.url}/v1/completions",
                                       json={"prompt": f"{prefix} {question}", "max_tokens": 2})
            assert answer.status_code == 200
        assert server.truth().prefix_hits == 64


async def test_tokens_leave_when_the_engine_makes_them() -> None:
    """Clock driven by hand: a stream carries exactly the tokens made so far."""
    async with SimFleet([SimConfig(workload="none", autostep=False)]) as fleet:
        server: SimServer = fleet.servers[0]
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
                "POST", f"{server.url}/v1/completions",
                json={"prompt": "a b", "max_tokens": 50, "stream": True,
                      "stream_options": {"continuous_usage_stats": True}}) as answer:
            lines = answer.aiter_lines()
            await wait_until(lambda: server.truth().waiting == 1)
            server.simulation.advance_to(server.simulation.clock + 0.05)
            made = server.truth().generation_tokens
            assert 0 < made < 50
            seen = 0
            while seen < made:
                line = await anext(lines)
                if line.startswith("data: "):
                    seen = json.loads(line[6:])["usage"]["completion_tokens"]
            assert seen == made  # nothing the engine had not made yet
            server.simulation.advance_to(server.simulation.clock + 10)
            rest = [line async for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]"


async def test_output_paces_tokens_by_their_simulated_time() -> None:
    """Tokens made in one tick leave when each falls due, not all at once."""
    loop = asyncio.get_running_loop()
    offset = {"s": loop.time()}  # loop time of simulated time 0

    def due_at(sim_t: float) -> float:
        return offset["s"] + sim_t

    output = Output()
    output.pending.extend([0.0, 0.0, 3600.0, 3600.0])  # simulated times of four tokens
    output.finish = "length"
    assert await output.next_tokens(due_at) == 2  # the later two are not due for an hour
    assert not output.done
    offset["s"] = loop.time() - 3600.0 + 0.05  # now they fall due in 50 ms
    started = loop.time()
    assert await output.next_tokens(due_at) == 2
    assert loop.time() - started >= 0.05 - 0.002  # it waited for them
    assert output.done and output.sent == 4


# --- the parts, pure: tokenizer, limits, chunks and bodies, byte for byte --------------------

def test_a_word_is_a_token_per_started_six_characters() -> None:
    assert text_tokens("abcdef abcdefg abcdefghijkl abcdefghijklm") == [
        "abcdef", "abcdef", "g", "abcdef", "ghijkl", "abcdef", "ghijkl", "m"]
    assert text_tokens("  \n\t ") == []


def test_a_chat_is_each_role_its_text_and_an_end_then_the_replys_role() -> None:
    assert chat_tokens([{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [
                            {"type": "text", "text": "hi"}, {"type": "image_url"},
                            {"type": "text", "text": 5}, "loose", {"text": "there"}]},
                        {"role": "assistant", "content": None}]) == [
        "<|system|>", "be", "brief", "<|end|>", "<|user|>", "hi", "there", "<|end|>",
        "<|assistant|>", "<|end|>", "<|assistant|>"]
    assert chat_tokens([{"role": "user"}]) == ["<|user|>", "<|end|>", "<|assistant|>"]


@pytest.mark.parametrize(("messages", "message"), [
    (None, "messages must be a non-empty list"),
    ([], "messages must be a non-empty list"),
    ({"role": "user"}, "messages must be a non-empty list"),
    (["hi"], "each message needs a role"),
    ([{"content": "hi"}], "each message needs a role"),
    ([{"role": 1, "content": "hi"}], "each message needs a role"),
    ([{"role": "user", "content": 7}], "message content must be a string or a list of parts"),
])
def test_a_chat_that_is_not_one_is_a_400_naming_messages(messages: object, message: str) -> None:
    with pytest.raises(ApiError) as raised:
        chat_tokens(messages)
    error = raised.value
    assert (error.status, error.message, error.kind, error.param, str(error)) == (
        400, message, "BadRequestError", "messages", message)


def test_a_prompt_is_text_token_ids_or_a_batch_of_one() -> None:
    assert prompt_tokens("ab abcdefg") == ["ab", "abcdef", "g"]
    assert prompt_tokens(["ab cd"]) == ["ab", "cd"]
    assert prompt_tokens([5]) == [5]
    assert prompt_tokens([[5, 6]]) == [5, 6]
    assert prompt_tokens([0]) == [0]


@pytest.mark.parametrize("prompt", [
    None, 7, [], [[]], ["a", "b"], [[5], [6]], [5, "6"], [True], [5.0], [[True]], {"a": 1}])
def test_anything_else_is_not_a_prompt(prompt: object) -> None:
    message = ("prompt must be a string or a list of token ids (one prompt; the simulator "
               "serves no batches)")
    with pytest.raises(ApiError) as raised:
        prompt_tokens(prompt)
    assert (raised.value.status, raised.value.message, raised.value.param) == (
        400, message, "prompt")


def test_each_full_block_of_tokens_is_keyed_by_its_content() -> None:
    tokens = list(range(40))
    assert block_keys(tokens[:15], 16) == ()
    assert block_keys(tokens[:16], 16) == (hash(tuple(range(16))),)
    assert block_keys(tokens[:31], 16) == (hash(tuple(range(16))),)
    assert block_keys(tokens[:32], 16) == (hash(tuple(range(16))), hash(tuple(range(16, 32))))
    assert block_keys(tokens[:6], 3) == (hash((0, 1, 2)), hash((3, 4, 5)))


@pytest.mark.parametrize(("body", "chat", "prompt", "expected"), [
    ({}, True, 10, 90),  # a chat: whatever fits
    ({}, False, 10, 16),  # a completion: vLLM's 16
    ({}, False, 84, 16),
    ({}, False, 85, 15),  # ... or what fits, when less
    ({"max_tokens": 1}, False, 10, 1),
    ({"max_tokens": 100}, False, 10, 90),  # the model's length is allowed, and clamped
    ({"max_tokens": 89}, False, 10, 89),
    ({"max_tokens": 91}, False, 10, 90),
    ({"max_completion_tokens": 5, "max_tokens": 7}, True, 10, 5),
    ({"max_completion_tokens": None, "max_tokens": 7}, True, 10, 7),
    ({"max_completion_tokens": 5, "max_tokens": 7}, False, 10, 7),
    ({"max_completion_tokens": 5}, False, 10, 16),  # a completion has no such field
])
def test_max_tokens_is_vllms_default_or_the_value_clamped_to_what_fits(
        body: dict, chat: bool, prompt: int, expected: int) -> None:
    assert _max_tokens(body, chat, 100, prompt) == expected


@pytest.mark.parametrize(("value", "message"), [
    (0, "max_tokens must be at least 1, got 0."),
    (-1, "max_tokens must be at least 1, got -1."),
    (True, "max_tokens must be at least 1, got True."),
    (2.0, "max_tokens must be at least 1, got 2.0."),
    ("2", "max_tokens must be at least 1, got '2'."),
    (101, "max_tokens=101 cannot be greater than max_model_len=100."),
])
def test_max_tokens_below_one_not_an_integer_or_above_the_model_is_a_400(
        value: object, message: str) -> None:
    for body, chat in (({"max_tokens": value}, False), ({"max_completion_tokens": value}, True)):
        with pytest.raises(ApiError) as raised:
            _max_tokens(body, chat, 100, 10)
        assert (raised.value.status, raised.value.message, raised.value.kind,
                raised.value.param) == (400, message, "BadRequestError", "max_tokens")


def call(*, chat: bool = False, usage: bool = False, continuous: bool = False) -> Call:
    return Call(chat=chat, tokens=7, keys=(), max_tokens=5, stream=True, include_usage=usage,
                continuous_usage=continuous, model="m", created=1_700_000_000,
                id="0123456789abcdef")


def sse(raw: bytes) -> list[dict]:
    """The events of SSE bytes, each `data: {json}` and a blank line, nothing else."""
    *events, rest = raw.split(b"\n\n")
    assert rest == b"" and all(e.startswith(b"data: ") for e in events)
    return [json.loads(e[len(b"data: "):]) for e in events]


HEAD = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1_700_000_000,
        "model": "m"}
CHAT_HEAD = {**HEAD, "id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk"}


def text_choice(text: str, finish: str | None) -> dict:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
            "stop_reason": None, "prompt_token_ids": None, "token_ids": None,
            "weight_versions": None}


def test_a_call_counts_its_usage_and_is_made_now_with_a_fresh_id() -> None:
    assert call().usage(3) == {"prompt_tokens": 7, "total_tokens": 10, "completion_tokens": 3}
    before = int(time.time())
    made = Call(chat=False, tokens=1, keys=(), max_tokens=1, stream=False,
                include_usage=False, continuous_usage=False, model="m")
    again = Call(chat=True, tokens=1, keys=(), max_tokens=1, stream=False,
                 include_usage=False, continuous_usage=False, model="m")
    assert before <= made.created <= int(time.time())
    assert len(made.id) == 16 and int(made.id, 16) >= 0 and made.id != again.id
    assert (made.response_id, again.response_id) == (f"cmpl-{made.id}", f"chatcmpl-{again.id}")


def test_completion_chunks_carry_the_tokens_words_and_the_fingerprint_at_the_end() -> None:
    chunks = _Chunks(call(), "fp")
    assert sse(chunks.tokens(2, 2, None)) == [
        {**HEAD, "choices": [text_choice(" the cache", None)], "kv_transfer_params": None}]
    assert sse(chunks.tokens(7, 9, "length")) == [
        {**HEAD, "choices": [text_choice(" holds blocks of keys and values the", "length")],
         "system_fingerprint": "fp", "kv_transfer_params": None}]
    assert sse(_Chunks(call(), None).tokens(1, 1, "length")) == [
        {**HEAD, "choices": [text_choice(" the", "length")], "kv_transfer_params": None}]
    assert sse(_Chunks(call(), "").tokens(1, 1, "length")) == [
        {**HEAD, "choices": [text_choice(" the", "length")], "kv_transfer_params": None}]


def test_with_a_usage_chunk_the_fingerprint_goes_there_instead() -> None:
    chunks = _Chunks(call(usage=True), "fp")
    assert sse(chunks.tokens(1, 1, "length")) == [
        {**HEAD, "choices": [text_choice(" the", "length")], "kv_transfer_params": None}]
    assert sse(chunks.usage(4)) == [{**HEAD, "choices": [], "usage": {
        "prompt_tokens": 7, "total_tokens": 11, "completion_tokens": 4},
        "system_fingerprint": "fp"}]
    assert sse(_Chunks(call(usage=True), None).usage(0)) == [{**HEAD, "choices": [], "usage": {
        "prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0}}]


def test_continuous_usage_is_on_every_chunk_counting_what_was_sent_by_then() -> None:
    chunks = _Chunks(call(continuous=True), "fp")
    assert sse(chunks.tokens(2, 5, None)) == [{**HEAD, "choices": [
        text_choice(" blocks of", None)], "usage": {"prompt_tokens": 7, "total_tokens": 12,
                                                    "completion_tokens": 5},
        "kv_transfer_params": None}]


def test_a_chat_stream_opens_with_the_assistants_role_once() -> None:
    chunks = _Chunks(call(chat=True, continuous=True), "fp")
    role = {**CHAT_HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}],
            "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0},
            "kv_transfer_params": None}

    def content(text: str, finish: str | None) -> dict:
        return {"index": 0, "delta": {"content": text}, "logprobs": None,
                "finish_reason": finish, "stop_reason": None, "token_ids": None}

    assert sse(chunks.tokens(1, 1, None)) == [role, {**CHAT_HEAD, "choices": [
        content(" the", None)], "usage": {"prompt_tokens": 7, "total_tokens": 8,
                                              "completion_tokens": 1},
        "kv_transfer_params": None}]
    assert sse(chunks.tokens(1, 2, "length")) == [{**CHAT_HEAD, "choices": [
        content(" cache", "length")], "usage": {"prompt_tokens": 7, "total_tokens": 9,
                                                   "completion_tokens": 2},
        "system_fingerprint": "fp", "kv_transfer_params": None}]


def test_whole_answers_are_vllms_bodies() -> None:
    output = Output(sent=3, finish="length")
    usage = {"prompt_tokens": 7, "total_tokens": 10, "completion_tokens": 3,
             "prompt_tokens_details": None}
    assert _whole_body(call(), output, "fp") == {
        **HEAD, "choices": [{"index": 0, "text": " the cache holds", "logprobs": None,
                             "finish_reason": "length", "stop_reason": None, "token_ids": None,
                             "prompt_logprobs": None, "prompt_token_ids": None}],
        "system_fingerprint": "fp", "usage": usage, "kv_transfer_params": None}
    assert _whole_body(call(chat=True), output, None) == {
        **CHAT_HEAD, "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": " the cache holds",
                                    "tool_calls": []},
            "logprobs": None, "finish_reason": "length", "stop_reason": None}],
        "system_fingerprint": None, "usage": usage, "kv_transfer_params": None}


def test_an_error_answer_is_vllms_shape() -> None:
    response = ApiError(404, "no such model", "NotFoundError", "model").response()
    assert response.status == 404 and response.content_type == "application/json"
    assert json.loads(response.body) == {"error": {
        "message": "no such model", "type": "NotFoundError", "param": "model", "code": 404}}
    assert json.loads(ApiError(400, "bad").response().body) == {"error": {
        "message": "bad", "type": "BadRequestError", "param": None, "code": 400}}


def test_the_output_takes_the_engines_tokens_and_its_end() -> None:
    output = Output()
    req = Request(0, 10, 5, 5, (), 0.0)
    output(req, None)
    req.last_token_at = 2.5
    output(req, None)
    assert (list(output.pending), output.finish, output.changed.is_set()) == ([0.0, 2.5], None,
                                                                              True)
    output.changed.clear()
    output(req, "length")
    assert (list(output.pending), output.finish, output.changed.is_set()) == ([0.0, 2.5],
                                                                              "length", True)


# --- over HTTP, the clock driven by hand: whole answers, byte for byte ------------------------

FINGERPRINT = "vllm-0.33.0-kvtopsim"


def by_hand(**engine: int) -> SimConfig:
    return SimConfig(workload="none", autostep=False, engine=EngineConfig(**engine))


async def answered(server: SimServer, path: str, body: object, *,
                   run: bool = True) -> httpx.Response:
    """POST ``body``; once the engine holds the request, run it to its end at once (every
    token made in one go, so the stream's chunks are known)."""
    async with httpx.AsyncClient(timeout=30) as client:
        posted = asyncio.create_task(client.post(f"{server.url}{path}", json=body))
        if run:
            await wait_until(lambda: server.truth().waiting == 1 or posted.done())
            server.simulation.advance_to(server.simulation.clock + 100.0)
        return await posted


def stamped(chunks: list[dict], chat: bool, started: int) -> list[dict]:
    """The chunks without their id and creation time, which are checked here: one id, made
    now, for the whole answer."""
    ids = {chunk.pop("id") for chunk in chunks}
    created = {chunk.pop("created") for chunk in chunks}
    (answer_id,) = ids
    prefix, hex_id = answer_id.split("-")
    assert prefix == ("chatcmpl" if chat else "cmpl") and len(hex_id) == 16
    (when,) = created
    assert started <= when <= time.time()
    return chunks


def streamed(raw: bytes, chat: bool, started: int) -> list[dict]:
    assert raw.endswith(b"data: [DONE]\n\n")
    return stamped(sse(raw.removesuffix(b"data: [DONE]\n\n")), chat, started)


async def test_a_whole_completion_is_vllms_body_and_is_counted() -> None:
    async with SimFleet([by_hand()]) as fleet:
        server, started = fleet.servers[0], int(time.time())
        answer = await answered(server, "/v1/completions", {
            "model": "sim-llama-3-8b", "prompt": "a b c", "max_tokens": 3, "stream": 1})
        assert (answer.status_code, answer.headers["content-type"]) == (
            200, "application/json; charset=utf-8")
        assert answer.content == orjson.dumps(answer.json())  # compact, as vLLM's
        assert stamped([answer.json()], False, started) == [{
            "object": "text_completion", "model": "sim-llama-3-8b", "choices": [{
                "index": 0, "text": " the cache holds", "logprobs": None,
                "finish_reason": "length", "stop_reason": None, "token_ids": None,
                "prompt_logprobs": None, "prompt_token_ids": None}],
            "system_fingerprint": FINGERPRINT, "usage": {
                "prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3,
                "prompt_tokens_details": None}, "kv_transfer_params": None}]
        truth = server.truth()
        assert (truth.prompt_tokens, truth.generation_tokens, dict(truth.finished)) == (
            3, 3, {"length": 1, "stop": 0, "abort": 0, "error": 0, "repetition": 0})


async def test_a_streamed_completion_is_its_chunks_the_usage_and_done() -> None:
    async with SimFleet([by_hand()]) as fleet:
        server, started = fleet.servers[0], int(time.time())
        answer = await answered(server, "/v1/completions", {
            "prompt": [1, 2], "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}})
        assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
        head = {"object": "text_completion", "model": "sim-llama-3-8b"}
        assert streamed(answer.content, False, started) == [
            {**head, "choices": [text_choice(" the cache", "length")],
             "kv_transfer_params": None},
            {**head, "choices": [], "usage": {
                "prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2},
             "system_fingerprint": FINGERPRINT}]


async def test_usage_is_sent_only_when_asked_with_true() -> None:
    async with SimFleet([by_hand()]) as fleet:
        server, started = fleet.servers[0], int(time.time())
        answer = await answered(server, "/v1/completions", {
            "prompt": "x", "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": 1, "continuous_usage_stats": "true"}})
        assert streamed(answer.content, False, started) == [
            {"object": "text_completion", "model": "sim-llama-3-8b",
             "choices": [text_choice(" the", "length")], "system_fingerprint": FINGERPRINT,
             "kv_transfer_params": None}]
        answer = await answered(server, "/v1/completions", {
            "prompt": "x", "max_tokens": 1, "stream": True, "stream_options": [True]})
        assert len(streamed(answer.content, False, started)) == 1


async def test_a_streamed_chat_with_continuous_usage() -> None:
    async with SimFleet([by_hand()]) as fleet:
        server, started = fleet.servers[0], int(time.time())
        answer = await answered(server, "/v1/chat/completions", {
            "model": None, "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2, "stream": True,
            "stream_options": {"continuous_usage_stats": True}})
        head = {"object": "chat.completion.chunk", "model": "sim-llama-3-8b"}
        assert streamed(answer.content, True, started) == [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}],
             "usage": {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0},
             "kv_transfer_params": None},
            {**head, "choices": [{"index": 0, "delta": {"content": " the cache"},
                                  "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None, "token_ids": None}],
             "system_fingerprint": FINGERPRINT,
             "usage": {"prompt_tokens": 4, "total_tokens": 6, "completion_tokens": 2},
             "kv_transfer_params": None}]


async def test_a_prompt_one_token_short_of_the_model_gets_one_token() -> None:
    async with SimFleet([by_hand(num_gpu_blocks=3)]) as fleet:  # model_len (3 - 1) * 16
        answer = await answered(fleet.servers[0], "/v1/completions",
                                {"prompt": list(range(31))})
        assert answer.json()["usage"]["completion_tokens"] == 1


def error(status: int, message: str, kind: str = "BadRequestError",
          param: str | None = None) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": kind, "param": param, "code": status}}


@pytest.mark.parametrize(("body", "expected"), [
    ([], error(400, "the request body must be a JSON object", "Bad Request")),
    ({"model": "other", "prompt": "x"}, error(
        404, "The model `other` does not exist. Valid aliases: sim-llama-3-8b.",
        "NotFoundError", "model")),
    ({"prompt": list(range(32))}, error(
        400, "This model's maximum context length is 32 tokens. However, your prompt contains "
             "32 input tokens, which exceeds this limit even without any output tokens.",
        param="input_tokens")),
    ({"prompt": ""}, error(400, "the prompt does not fit the model", param="input_tokens")),
    ({"prompt": "x", "max_tokens": 33}, error(
        400, "max_tokens=33 cannot be greater than max_model_len=32.", param="max_tokens")),
])
async def test_a_request_vllm_refuses_is_its_error_and_never_runs(
        body: object, expected: tuple[int, dict]) -> None:
    async with SimFleet([by_hand(num_gpu_blocks=3)]) as fleet:
        server = fleet.servers[0]
        answer = await answered(server, "/v1/completions", body, run=False)
        assert (answer.status_code, answer.json()) == expected
        assert (server.truth().waiting, server.simulation.engine.requests) == (0, {})


async def test_a_body_that_is_not_json_is_a_400_saying_why() -> None:
    async with SimFleet([by_hand()]) as fleet, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{fleet.urls[0]}/v1/chat/completions", content=b"{nope")
        assert (answer.status_code, answer.json()) == error(
            400, "JSON decode error: unexpected character, expected a string key: line 1 "
                 "column 2 (char 1)", "Bad Request")


async def test_without_the_token_the_api_answers_401_and_runs_nothing() -> None:
    config = dataclasses.replace(by_hand(), faults=[Fault(0.0, "auth", "s3cret")])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=10) as client:
        for path in ("/v1/completions", "/v1/chat/completions"):
            answer = await client.post(f"{fleet.urls[0]}{path}", json={"prompt": "x"})
            assert (answer.status_code, answer.json()) == error(
                401, "Unauthorized", "AuthenticationError")
        assert fleet.servers[0].simulation.engine.requests == {}


async def test_a_restart_drops_a_whole_answer_that_was_under_way(
        caplog: pytest.LogCaptureFixture) -> None:
    async with SimFleet([by_hand()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        server = fleet.servers[0]
        posted = asyncio.create_task(client.post(f"{server.url}/v1/completions",
                                                 json={"prompt": "x", "max_tokens": 50}))
        await wait_until(lambda: server.truth().waiting == 1)
        server.simulation.advance_to(server.simulation.clock + 0.05)
        assert 0 < server.truth().generation_tokens < 50
        server.simulation.inject("restart")
        with pytest.raises(httpx.RemoteProtocolError):
            await posted
    assert handler_errors(caplog) == []


@pytest.mark.parametrize("finish", ["lost", "abort"])
async def test_a_request_that_ended_without_its_answer_has_no_tokens_to_send(finish: str) -> None:
    def never(sim_t: float) -> float:
        raise AssertionError("nothing is sent, so nothing is timed")

    for pending in ([], [0.0, 0.0]):
        output = Output(pending=deque(pending), finish=finish)
        assert await output.next_tokens(never) == 0
        assert (list(output.pending), output.sent, output.lost) == (pending, 0, True)


async def test_the_output_waits_for_the_engine_to_make_or_end_something() -> None:
    output = Output()
    waiting = asyncio.create_task(output.next_tokens(lambda sim_t: 0.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    output(Request(0, 10, 5, 5, (), 0.0), "lost")
    assert await asyncio.wait_for(waiting, 5) == 0


def test_dropping_an_answer_closes_its_connection_if_it_still_has_one() -> None:
    gone = make_mocked_request("POST", "/v1/completions")
    gone.protocol.transport = None  # the client hung up first: nothing to close
    assert gone.transport is None
    _drop(gone)
    open_one = make_mocked_request("POST", "/v1/completions")
    _drop(open_one)
    open_one.transport.close.assert_called_once_with()  # type: ignore[union-attr]


async def test_a_stream_sends_tokens_as_they_fall_due_and_finishes_only_the_last() -> None:
    """The engine makes all eight tokens at once, a step (5 ms) apart in simulated time; at
    speed 1 they leave over ~40 ms, in several chunks, and only the last says "length"."""
    async with SimFleet([by_hand()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        server = fleet.servers[0]
        posted = asyncio.create_task(client.post(f"{server.url}/v1/completions", json={
            "prompt": "x", "max_tokens": 8, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}))
        await wait_until(lambda: server.truth().waiting == 1)
        server._anchor = (asyncio.get_running_loop().time(), server.simulation.clock)
        server.simulation.advance_to(server.simulation.clock + 100.0)
        chunks = streamed((await posted).content, False, 0)
    sent = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert len(chunks) > 1 and sent == sorted(sent) and sent[-1] == 8
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [
        *[None] * (len(chunks) - 1), "length"]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == (
        " the cache holds blocks of keys and values")


async def test_tokens_put_off_by_a_slower_clock_leave_later_with_no_empty_chunk() -> None:
    """The stepping re-anchors its clock when it falls behind, so a token can fall due later
    than its handler woke for: the handler waits again and sends nothing meanwhile."""
    async with SimFleet([by_hand()]) as fleet, httpx.AsyncClient(timeout=30) as client:
        server = fleet.servers[0]
        posted = asyncio.create_task(client.post(f"{server.url}/v1/completions", json={
            "prompt": "x", "max_tokens": 2, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}))
        await wait_until(lambda: server.truth().waiting == 1)
        loop, clock = asyncio.get_running_loop(), server.simulation.clock
        server._anchor = (loop.time() + 0.5, clock)  # the tokens fall due in half a second
        server.simulation.advance_to(clock + 100.0)
        await asyncio.sleep(0.1)  # the handler sleeps until then
        server._anchor = (loop.time() + 0.7, clock)  # ... and wakes to find them 0.3 s off
        chunks = streamed((await posted).content, False, 0)
    texts = [chunk["choices"][0]["text"] for chunk in chunks]
    assert "".join(texts) == " the cache" and "" not in texts  # one chunk or two, none empty


async def test_tokens_due_within_two_milliseconds_leave_together_and_later_ones_do_not() -> None:
    base = asyncio.get_running_loop().time()
    output = Output(pending=deque([0.0, 0.001, 0.015]))
    assert await output.next_tokens(lambda sim_t: base + sim_t) == 2  # 15 ms later: not yet
    assert list(output.pending) == [0.015] and output.sent == 2
