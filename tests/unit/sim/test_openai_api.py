"""The simulator's OpenAI routes: vLLM 0.33's answers, requests run by the engine, streams
timed by its steps, and /metrics counting what the API was sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.load.openai_client import completion_request, make_session, stream_completion
from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import Fault
from kvtop.sim.openai_api import Output, chat_tokens, prompt_tokens, text_tokens
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


async def test_a_restart_drops_open_streams_and_requests_after_it_run() -> None:
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
            assert 3 < lost.completion_tokens < 5000
            path, body = completion_request(server.config.model_name, "a b c", 8)
            after = await stream_completion(session, server.url + "/v1" + path, body,
                                            timeout_s=30)
            assert after.status == "ok" and after.completion_tokens == 8
            assert server.truth().restarts == 1


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
