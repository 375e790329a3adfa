"""The probe (kvtop/baseline/probe.py) against a real HTTP server on 127.0.0.1 speaking the
OpenAI API (tests/fakes/fake_openai.py): the API root beside /metrics, the model asked
for, the fixed request, token ids once (and only once) a server refuses text, the count
and the stop, and the summary's figures in the server's time."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvtop.baseline import probe as probe_module
from kvtop.baseline.model import Figure
from kvtop.baseline.probe import (
    PROBE_MAX_TOKENS,
    PROBE_TEXT,
    PROBE_TOKEN_IDS,
    Prober,
    ProbeSettings,
    api_base,
)
from kvtop.load.openai_client import NotOpenAI
from tests.fakes.fake_openai import MODEL, FakeOpenAI


@pytest.mark.parametrize(("metrics", "base"), [
    ("http://h:8000/metrics", "http://h:8000/v1"),
    ("http://h:8000/metrics/", "http://h:8000/v1"),
    ("https://h/vllm/metrics?x=1#y", "https://h/vllm/v1"),
    ("http://h:8000/", "http://h:8000/v1"),
    ("http://h:8000/proxy/BOX", "http://h:8000/proxy/BOX/v1"),  # not /metrics: kept whole
])
def test_the_api_sits_beside_metrics(metrics: str, base: str) -> None:
    assert api_base(metrics) == base


async def probe(server: FakeOpenAI, settings: ProbeSettings | None = None, *,
                count: int = 0, token: str | None = None) -> Prober:
    """A prober of ``server``, identified, after ``count`` sends."""
    session = aiohttp.ClientSession()
    prober = Prober(session, f"{server.url}/metrics", settings or ProbeSettings(), token)
    try:
        await prober.identify()
        for _ in range(count):
            await prober.send()
    finally:
        await session.close()
    return prober


async def test_the_model_asked_is_the_one_named_else_the_first_listed() -> None:
    async with FakeOpenAI(models=(MODEL, "second")) as server:
        assert (await probe(server)).model == MODEL
        assert (await probe(server, ProbeSettings(model="second"))).model == "second"
        with pytest.raises(NotOpenAI, match=(
                rf"^{server.url}/v1/models does not list the baseline's probe model 'other' "
                rf"\(it lists {MODEL}, second\)$")):
            await probe(server, ProbeSettings(model="other"))


async def test_before_it_asks_a_prober_names_the_model_it_was_given() -> None:
    async with aiohttp.ClientSession() as session:
        given = Prober(session, "http://h/metrics", ProbeSettings(model="m"), None)
        unnamed = Prober(session, "http://h/metrics", ProbeSettings(), None)
    assert (given.summary().model, unnamed.summary().model) == ("m", "")


async def test_the_request_is_the_fixed_text_streamed_with_the_token() -> None:
    async with FakeOpenAI(tokens=100) as server:
        prober = await probe(server, count=1, token="s3cret")
    (body,) = server.bodies
    assert (body["model"], body["prompt"], body["max_tokens"]) == (
        MODEL, PROBE_TEXT, PROBE_MAX_TOKENS)
    assert body["stream"] is True and body["ignore_eos"] is True
    assert server.authorizations == ["Bearer s3cret"] * 2  # the models, the request
    assert prober.form == "text" and prober.results[0].completion_tokens == PROBE_MAX_TOKENS


@pytest.mark.parametrize("status", [400, 422])
async def test_a_server_refusing_text_gets_token_ids_from_then_on(status: int) -> None:
    async with FakeOpenAI(fail_status={1: status}) as server:
        prober = await probe(server, count=2, token="t")
    assert [b["prompt"] for b in server.bodies] == [PROBE_TEXT, PROBE_TOKEN_IDS,
                                                    PROBE_TOKEN_IDS]
    assert server.authorizations == ["Bearer t"] * 4
    assert prober.form == "token_ids" and [r.status for r in prober.results] == ["ok", "ok"]


async def test_a_probe_that_gets_no_answer_gives_up_at_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes the request and never answers (the retry in token ids too):
    the probe gives up after PROBE_TIMEOUT_S (here 0.2 s), not the client's 300 s."""
    monkeypatch.setattr(probe_module, "PROBE_TIMEOUT_S", 0.2)
    for refusal in ({}, {1: 400}):
        async with FakeOpenAI(hang=True, fail_status=refusal) as server, \
                aiohttp.ClientSession() as session:
            prober = Prober(session, f"{server.url}/metrics", ProbeSettings(), None)
            await prober.identify()
            result = await asyncio.wait_for(prober.send(), 10)
        assert result is prober.results[-1] and result.status == "timeout"


async def test_an_answer_cut_off_after_its_first_token_is_a_failure() -> None:
    async with FakeOpenAI(cut_after=2) as server:
        prober = await probe(server, count=1)
    (result,) = prober.results
    assert result.status == "error" and result.ttft_s is not None
    summary = prober.summary()
    assert (summary.failed, summary.figures["ttft"].values) == (1, ())


@pytest.mark.parametrize(("fail", "settings"), [
    ({1: 500}, ProbeSettings()),  # not about the prompt's form
    ({1: 429}, ProbeSettings()),
    ({1: 400}, ProbeSettings(form="text")),  # the baseline sent text: compare sends text
    ({2: 400}, ProbeSettings()),  # text was taken before: this refusal is of something else
])
async def test_other_refusals_keep_the_text(fail: dict[int, int],
                                            settings: ProbeSettings) -> None:
    async with FakeOpenAI(fail_status=fail) as server:
        prober = await probe(server, settings, count=2)
    assert [b["prompt"] for b in server.bodies] == [PROBE_TEXT, PROBE_TEXT]
    assert prober.form == "text"


async def test_a_baseline_of_token_ids_sends_token_ids() -> None:
    async with FakeOpenAI() as server:
        prober = await probe(server, ProbeSettings(form="token_ids"), count=1)
    assert [b["prompt"] for b in server.bodies] == [PROBE_TOKEN_IDS]
    assert prober.summary().prompt == "token_ids"


async def test_the_probe_is_sent_count_times_each_when_its_turn_comes() -> None:
    turns: list[int] = []

    async def until_2(i: int) -> bool:
        turns.append(i)
        return i < 2

    async with FakeOpenAI() as server, aiohttp.ClientSession() as session:
        prober = Prober(session, f"{server.url}/metrics", ProbeSettings(count=3), None)
        await prober.identify()
        assert (await prober.run(lambda i: _yes())).requests == 3
        stopped = Prober(session, f"{server.url}/metrics", ProbeSettings(count=5), None)
        summary = await stopped.run(until_2)
    assert turns == [0, 1, 2] and summary.requests == 2 and len(server.bodies) == 5


async def _yes() -> bool:
    return True


async def test_the_summary_counts_failures_and_times_answers_in_the_servers_time() -> None:
    """Answers 1 and 3 fail: 2 of 4 answered, each timing times the server's speed (10)."""
    async with FakeOpenAI(fail_status={1: 503, 3: 500}, tokens=4, token_gap_s=0.01
                          ) as server:
        prober = await probe(server, ProbeSettings(time_scale=10.0), count=4)
    summary = prober.summary()
    assert (summary.model, summary.prompt, summary.max_tokens) == (MODEL, "text",
                                                                   PROBE_MAX_TOKENS)
    assert (summary.requests, summary.failed, summary.prompt_tokens) == (4, 2, 3)
    assert summary.error is not None and "refused 3" in summary.error
    ok = [r for r in prober.results if r.status == "ok"]
    for name in ("ttft", "total"):
        times = tuple(getattr(r, f"{name}_s") * 10.0 for r in ok)
        figure = summary.figures[name]
        assert figure.values == pytest.approx(times)
        assert figure.value == pytest.approx(sum(times) / 2)  # the median of two
        assert figure.summary == {"min": pytest.approx(min(times)),
                                  "max": pytest.approx(max(times))}
    assert min(summary.figures["total"].values) > max(summary.figures["ttft"].values) > 0.0


async def test_a_probe_never_answered_has_no_figures_and_says_why() -> None:
    async with FakeOpenAI(fail_status={1: 503}, usage=False) as server:
        prober = await probe(server, count=1)
    summary = prober.summary()
    assert (summary.requests, summary.failed, summary.prompt_tokens) == (1, 1, None)
    assert summary.figures["ttft"] == Figure(None, (), {"min": None, "max": None})
    assert summary.error is not None and "503" in summary.error
    async with FakeOpenAI(usage=False) as server:
        answered = (await probe(server, count=1)).summary()
    assert answered.failed == 0 and answered.error is None and answered.prompt_tokens is None
