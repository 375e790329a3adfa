"""A small client for OpenAI-compatible servers (vLLM, SGLang, llama.cpp, ``kvtop sim``).

* :func:`list_models` reads ``GET /v1/models`` and refuses, with a reason a person can act
  on, anything that does not answer like an OpenAI server.
* :func:`stream_completion` sends one streamed completion (or chat completion) and times it
  from the client's side: time to the first token, the gaps between tokens, the total. Token
  counts come from the server's usage (``stream_options.include_usage`` and vLLM's
  ``continuous_usage_stats``, which says how many tokens each chunk carries); a server that
  sends no usage is counted one token per chunk. It never raises on a bad server: every
  outcome is a :class:`CompletionResult`.

Text is never kept: only lengths, timings, statuses and the server's error message. What is
kept from a server (its error messages, model names, a finish reason) is masked
(:func:`kvtop.safe_text.mask`: the token, and whatever follows an echoed ``Bearer``) before
it is cut, and bounded: a line of the event stream is at most ``MAX_EVENT_LINE`` bytes (a
stream whose line never ends fails the request instead of growing), a model list at most
``MODELS_BODY_BYTES`` and ``MAX_MODELS`` models of ``MAX_MODEL_ID`` characters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from kvtop import __version__
from kvtop.collect.http import (
    KEEPALIVE_S,
    bearer,
    classify_exception,
    read_capped,
    verified_context,
    within,
)
from kvtop.safe_text import mask

Status = Literal["ok", "error", "timeout"]
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})  # the server asks to come back later
ERROR_BODY_BYTES = 8192
MODELS_BODY_BYTES = 1024 * 1024
MAX_MODELS = 1024  # a server serves a few; more is not a model list
MAX_MODEL_ID = 512  # characters: a model id longer than this is not one
# One server-sent event: a completion chunk is ~0.3-2 KB (with logprobs a few KB more); a
# line that reaches this has no end coming, and its buffer must not grow for the whole
# request timeout (it reached 1.5 GB in 42 s at 4 requests a second).
MAX_EVENT_LINE = 1 << 20
QUOTE_CHARS = 200  # of a server's error message
FINISH_REASON_CHARS = 40  # "stop", "length", "abort"...


class NotOpenAI(Exception):
    """The target does not answer like an OpenAI-compatible server; the message says why."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    max_model_len: int | None  # vLLM and kvtop sim say; None where the server doesn't


def make_session(*, insecure: bool = False, limit: int = 0) -> aiohttp.ClientSession:
    """A session for API traffic (make it inside the loop that uses it): at most ``limit``
    connections (0: no cap), TLS verified unless ``insecure``, no proxies or cookies from
    the environment, and no deadline of its own (each request has one)."""
    connector = aiohttp.TCPConnector(limit=limit, ssl=False if insecure else verified_context(),
                                     keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, trust_env=False,
                                 headers={"User-Agent": f"kvtop/{__version__}"},
                                 cookie_jar=aiohttp.DummyCookieJar(),
                                 timeout=aiohttp.ClientTimeout(total=None))


async def list_models(session: aiohttp.ClientSession, api_base: str, *,
                      token: str | None = None, timeout_s: float = 10.0) -> list[ServedModel]:
    """The models ``GET {api_base}/models`` lists; :class:`NotOpenAI` when it can't say."""
    url = f"{api_base}/models"
    try:
        status, data = await within(timeout_s, _get(session, url, token))
    except Exception as exc:
        reason = mask(classify_exception(exc, timeout_s)[1])
        raise NotOpenAI(f"cannot read {url}: {reason}") from None
    if status in (401, 403):
        raise NotOpenAI(f"{url} answered HTTP {status}: the API wants a bearer token "
                        "(--token-env / --token-file)")
    if status != 200:
        raise NotOpenAI(f"{url} answered HTTP {status}: not an OpenAI-compatible server "
                        "(one lists its models there)")
    try:
        listed = orjson.loads(data)["data"]
        models = [ServedModel(mask(m["id"]), _model_len(m)) for m in listed[:MAX_MODELS]
                  if isinstance(m["id"], str) and 0 < len(m["id"]) <= MAX_MODEL_ID]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise NotOpenAI(f"{url} did not answer with an OpenAI model list "
                        '({"data": [{"id": ...}]}): not an OpenAI-compatible server') from None
    if not models:
        raise NotOpenAI(f"{url} lists no models (of ids up to {MAX_MODEL_ID} characters): "
                        "nothing to send requests to")
    return models


async def _get(session: aiohttp.ClientSession, url: str, token: str | None
               ) -> tuple[int, bytes]:
    async with session.get(url, headers=bearer(token)) as response:
        return response.status, bytes(await read_capped(response, MODELS_BODY_BYTES))


def _model_len(model: dict[str, Any]) -> int | None:
    value = model.get("max_model_len")
    return value if type(value) is int and value > 0 else None


def completion_request(model: str, prompt: str | list[int], max_tokens: int, *,
                       chat: bool = False, ignore_eos: bool = True) -> tuple[str, dict[str, Any]]:
    """(path under the API base, JSON body) of one streamed request for exactly
    ``max_tokens`` tokens (``ignore_eos``, which vLLM, SGLang and llama.cpp accept)."""
    body: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        if not isinstance(prompt, str):
            raise ValueError("a chat request takes text, not token ids")
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/chat/completions", body
    body["prompt"] = prompt
    return "/completions", body


@dataclass(slots=True)
class CompletionResult:
    """One request as the client saw it. Times in the ``clock``'s seconds."""

    status: Status = "error"
    http_status: int | None = None
    error: str | None = None
    retryable: bool = False  # failed before any answer, or the server said "later"
    ttft_s: float | None = None
    total_s: float | None = None
    itl_max_s: float | None = None  # the longest gap between two token-carrying chunks
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    finish_reason: str | None = None
    _first_t: float | None = None
    _last_t: float | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM bench's TPOT)."""
        if self._first_t is None or self._last_t is None or self.completion_tokens < 2:
            return None
        return (self._last_t - self._first_t) / (self.completion_tokens - 1)


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], *,
    timeout_s: float, token: str | None = None,
    clock: Callable[[], float] = time.perf_counter, result: CompletionResult | None = None,
) -> CompletionResult:
    """POST a streamed request to ``url`` and time it; never raises. It can be cancelled:
    pass ``result`` to keep what had arrived by then (the first token's time, tokens)."""
    result = CompletionResult() if result is None else result
    started = clock()
    try:
        await within(timeout_s, _exchange(session, url, body, token, result, clock, started))
    except (TimeoutError, aiohttp.ServerTimeoutError):
        result.status, result.error = "timeout", "no complete answer in time"
    except EventTooLong as exc:
        result.status, result.error = "error", str(exc)
    except Exception as exc:
        answered = result.http_status is not None
        result.status, result.retryable = "error", not answered
        result.error = ("the server closed the stream mid-answer" if answered
                        else mask(classify_exception(exc)[1]))
    result.total_s = clock() - started
    return result


async def _exchange(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                    token: str | None, result: CompletionResult, clock: Callable[[], float],
                    started: float) -> None:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    headers.update(bearer(token) or {})
    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
        result.http_status = response.status
        if response.status != 200:
            result.error = f"HTTP {response.status}{await _said(response)}"
            result.retryable = response.status in RETRYABLE_HTTP
            return
        stream = _Stream(result, clock, started)
        buffer = bytearray()
        async for data in response.content.iter_any():
            buffer += data
            if b"\n" in data:
                *lines, rest = buffer.split(b"\n")
                for line in lines:
                    if stream.line(bytes(line)):
                        return
                buffer = bytearray(rest)
            if len(buffer) > MAX_EVENT_LINE:
                raise EventTooLong(f"a line of the event stream over {MAX_EVENT_LINE:,} bytes "
                                   "with no end: not server-sent events")
        raise ConnectionResetError  # the stream ended before data: [DONE]: mid-answer


class EventTooLong(Exception):
    """A line of the event stream that never ends (the message says so)."""


class _Stream:
    """Folds server-sent events into a result as they arrive."""

    __slots__ = ("clock", "counted", "result", "started")

    def __init__(self, result: CompletionResult, clock: Callable[[], float],
                 started: float) -> None:
        self.result, self.clock, self.started = result, clock, started
        self.counted = 0

    def line(self, line: bytes) -> bool:
        """One line of the stream; True at ``data: [DONE]``."""
        if not line.startswith(b"data:"):
            return False  # blank separators, comments, other fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            result = self.result
            if result.error is None:
                result.status = "ok"
            return True
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        if isinstance(event, dict):
            self._event(event)
        return False

    def _event(self, event: dict[str, Any]) -> None:
        result = self.result
        error = event.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            said = mask(" ".join(str(message).split()))[:QUOTE_CHARS]
            result.status, result.error = "error", f"server error: {said}"
            return
        choices = event.get("choices") or []
        usage = event.get("usage") if isinstance(event.get("usage"), dict) else None
        if usage is not None and isinstance(usage.get("prompt_tokens"), int):
            result.prompt_tokens = usage["prompt_tokens"]
        if not choices:
            if usage is not None and isinstance(usage.get("completion_tokens"), int):
                result.completion_tokens = max(result.completion_tokens,
                                               usage["completion_tokens"])
            return
        choice = choices[0] if isinstance(choices[0], dict) else {}
        tokens = self._tokens(choice, usage)
        if choice.get("finish_reason"):
            result.finish_reason = mask(str(choice["finish_reason"]))[:FINISH_REASON_CHARS]
        if tokens > 0:
            self._tokens_arrived(tokens)

    def _tokens(self, choice: dict[str, Any], usage: dict[str, Any] | None) -> int:
        """Tokens in this chunk: by the running usage count, else one per chunk with text
        (a completions chunk always carries one: vLLM sends no empty ones)."""
        if usage is not None and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"] - self.counted
            self.counted = usage["completion_tokens"]
            return tokens
        delta = choice.get("delta")
        if isinstance(delta, dict):  # chat: the first chunk only names the role
            return 1 if delta.get("content") else 0
        return 1

    def _tokens_arrived(self, tokens: int) -> None:
        result, now = self.result, self.clock()
        if result._last_t is None:  # the first token (the two times are set together)
            result._first_t = now
            result.ttft_s = now - self.started
        else:
            gap = now - result._last_t
            result.itl_max_s = gap if result.itl_max_s is None else max(result.itl_max_s, gap)
        result._last_t = now
        result.completion_tokens += tokens


async def _said(response: aiohttp.ClientResponse) -> str:
    """': <the server's message>' from an error body (OpenAI's {"error": {"message"}})."""
    try:
        raw = await read_capped(response, ERROR_BODY_BYTES)
        parsed = orjson.loads(raw)
    except Exception:
        return ""
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message.strip():
        return ""
    return ": " + mask(" ".join(message.split()))[:QUOTE_CHARS]  # masked before it is cut
