"""The simulator's OpenAI-compatible API: `/v1/completions` and `/v1/chat/completions`.

A request enters the simulated engine when it arrives and its tokens leave as the engine
makes them, so streams keep the engine's timing (at `--speed S`, S times faster than wall
time). Answers follow vLLM 0.33's OpenAI server: `data: {json}` events, a usage chunk when
`stream_options.include_usage` is set (usage on every chunk with `continuous_usage_stats`),
`data: [DONE]`; the same JSON body when not streamed; vLLM's errors (404 for an unknown
model, 400 for a prompt that does not fit, `max_tokens` clamped to what fits).

Tokens made within one stepping tick leave in one chunk (vLLM's `--stream-interval` batches
the same way); the usage counts say how many. Requests run to `max_tokens` (the simulated
model never says EOS), so `finish_reason` is "length". A client that disconnects aborts its
request; a restart drops every open connection, as a real restart would.

Prompt length (the simulator has no tokenizer; `docs/rehearse.md`): a prompt given as token
ids counts one token per id. Text counts one token per started 6 characters of each
whitespace-separated word ("the" 1, "tokenizer" 2); a chat adds 2 tokens per message (its
role marker and end) and 1 for the reply's marker. Full 16-token blocks are keyed by their
content, so prompts that share a prefix share KV blocks in the prefix cache.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web

from kvtop.sim.engine import EngineConfig, Request
from kvtop.sim.simulation import Simulation

PIECE_CHARS = 6  # characters per token within a word, in the approximate tokenizer
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default
OUTPUT_WORDS = (" the", " cache", " holds", " blocks", " of", " keys", " and", " values")
DONE = b"data: [DONE]\n\n"
SEND_SLACK_S = 0.002  # tokens due this soon leave with the ones due now


class ApiError(Exception):
    """An error answer in vLLM's shape: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}
        return web.json_response(body, status=self.status)


def text_tokens(text: str) -> list[str]:
    """The approximate tokenizer: each word split into pieces of up to 6 characters."""
    return [word[i:i + PIECE_CHARS] for word in text.split()
            for i in range(0, len(word), PIECE_CHARS)]


def chat_tokens(messages: Any) -> list[Hashable]:
    """A chat's tokens: per message its role marker, its text, an end marker; then the
    reply's role marker."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    tokens: list[Hashable] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message needs a role", param="messages")
        tokens.append(f"<|{message['role']}|>")
        tokens.extend(text_tokens(_content_text(message.get("content"))))
        tokens.append("<|end|>")
    tokens.append("<|assistant|>")
    return tokens


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part["text"] for part in content
                        if isinstance(part, dict) and isinstance(part.get("text"), str))
    raise ApiError(400, "message content must be a string or a list of parts",
                   param="messages")


def prompt_tokens(prompt: Any) -> list[Hashable]:
    """A completion prompt's tokens: text, token ids, or a batch holding one of them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(text_tokens(prompt))
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    raise ApiError(400, "prompt must be a string or a list of token ids (one prompt; the "
                        "simulator serves no batches)", param="prompt")


def block_keys(tokens: list[Hashable], block_size: int) -> tuple[Hashable, ...]:
    """One content key per full block, so equal prefixes share cached blocks."""
    return tuple(hash(tuple(tokens[i:i + block_size]))
                 for i in range(0, len(tokens) - block_size + 1, block_size))


@dataclass
class Output:
    """What the engine has made for one request and not yet sent, and a wake-up for its
    handler."""

    pending: deque[float] = field(default_factory=deque)  # simulated times of tokens
    sent: int = 0
    finish: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, req: Request, reason: str | None) -> None:
        if reason is None:
            self.pending.append(req.last_token_at or 0.0)
        else:
            self.finish = reason
        self.changed.set()

    @property
    def lost(self) -> bool:
        """The request ended without its answer: the server restarted (or it was aborted)."""
        return self.finish in ("lost", "abort")

    @property
    def done(self) -> bool:
        return self.finish is not None and not self.pending

    async def next_tokens(self, due_at: Callable[[float], float]) -> int:
        """Wait for the next tokens to be due (`due_at` maps a token's simulated time to
        loop time) and take every one due by then; 0 when the request has ended."""
        while not self.pending and self.finish is None:
            self.changed.clear()
            await self.changed.wait()
        if not self.pending or self.lost:
            return 0
        loop = asyncio.get_running_loop()
        wait = due_at(self.pending[0]) - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        now = loop.time() + SEND_SLACK_S
        count = 0
        while self.pending and due_at(self.pending[0]) <= now:
            self.pending.popleft()
            count += 1
        self.sent += count
        return count


@dataclass(frozen=True)
class Call:
    """One validated API request."""

    chat: bool
    tokens: int
    keys: tuple[Hashable, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.id}"

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.tokens, "total_tokens": self.tokens + completion_tokens,
                "completion_tokens": completion_tokens}


class _ServedModel(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def engine(self) -> EngineConfig: ...


class ApiHost(Protocol):
    """What the routes need of the server they are mounted on (sim/server.py's SimServer)."""

    simulation: Simulation

    @property
    def config(self) -> _ServedModel: ...

    def authorized(self, request: web.Request) -> bool: ...

    def due_at(self, sim_t: float) -> float: ...


class OpenAIRoutes:
    """The `/v1/completions` and `/v1/chat/completions` handlers of one SimServer."""

    def __init__(self, server: ApiHost, fingerprint: str | None) -> None:
        self.server = server
        self.fingerprint = fingerprint

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if not self.server.authorized(request):
            return ApiError(401, "Unauthorized", "AuthenticationError").response()
        try:
            call = self._parse(await _json_body(request), chat=chat)
            output = Output()
            req = self.server.simulation.submit(call.tokens, call.max_tokens, call.keys, output)
            if req is None:
                raise ApiError(400, "the prompt does not fit the model", param="input_tokens")
        except ApiError as error:
            return error.response()
        try:
            if call.stream:
                return await self._stream(request, call, output)
            return await self._whole(request, call, output)
        finally:
            if output.finish is None:  # the client went away (or the server is stopping)
                self.server.simulation.abort(req)

    def _parse(self, body: Any, *, chat: bool) -> Call:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", "Bad Request")
        model = self.server.config.model_name
        asked = body.get("model")
        if asked is not None and asked != model:
            raise ApiError(404, f"The model `{asked}` does not exist. Valid aliases: {model}.",
                           "NotFoundError", "model")
        tokens = chat_tokens(body.get("messages")) if chat else prompt_tokens(body.get("prompt"))
        model_len = self.server.config.engine.model_len
        if len(tokens) >= model_len:
            raise ApiError(400, f"This model's maximum context length is {model_len} tokens. "
                                f"However, your prompt contains {len(tokens)} input tokens, "
                                "which exceeds this limit even without any output tokens.",
                           param="input_tokens")
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        return Call(chat=chat, tokens=len(tokens),
                    keys=block_keys(tokens, self.server.config.engine.block_size),
                    max_tokens=_max_tokens(body, chat, model_len, len(tokens)),
                    stream=body.get("stream") is True,
                    include_usage=options.get("include_usage") is True,
                    continuous_usage=options.get("continuous_usage_stats") is True,
                    model=model)

    async def _stream(self, request: web.Request, call: Call,
                      output: Output) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        chunks = _Chunks(call, self.fingerprint)
        while not output.done:
            count = await output.next_tokens(self.server.due_at)
            if output.lost:
                _drop(request)  # a restarted server closes its connections mid-answer
                return response
            if count or output.done:
                finish = output.finish if output.done else None
                await response.write(chunks.tokens(count, output.sent, finish))
        if call.include_usage:
            await response.write(chunks.usage(output.sent))
        await response.write(DONE)
        await response.write_eof()
        return response

    async def _whole(self, request: web.Request, call: Call, output: Output) -> web.Response:
        while not output.done and not output.lost:
            await output.next_tokens(self.server.due_at)
        if output.lost:
            _drop(request)
            return web.Response(status=503)
        return web.json_response(_whole_body(call, output, self.fingerprint),
                                 dumps=_dumps_text)


def _max_tokens(body: dict[str, Any], chat: bool, model_len: int, prompt: int) -> int:
    """vLLM's rule: an explicit value above the model length is an error, and what does not
    fit after the prompt is clamped; chat defaults to whatever fits, completions to 16."""
    value = body.get("max_completion_tokens") if chat else None
    value = body.get("max_tokens") if value is None else value
    if value is None:
        return model_len - prompt if chat else min(COMPLETION_DEFAULT_MAX_TOKENS,
                                                   model_len - prompt)
    if type(value) is not int or value < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {value!r}.",
                       param="max_tokens")
    if value > model_len:
        raise ApiError(400, f"max_tokens={value} cannot be greater than "
                            f"max_model_len={model_len}.", param="max_tokens")
    return min(value, model_len - prompt)


class _Chunks:
    """The SSE events of one streamed answer, shaped like vLLM 0.33's."""

    def __init__(self, call: Call, fingerprint: str | None) -> None:
        self.call = call
        self.fingerprint = fingerprint
        self.started = False

    def _head(self) -> dict[str, Any]:
        call = self.call
        kind = "chat.completion.chunk" if call.chat else "text_completion"
        return {"id": call.response_id, "object": kind, "created": call.created,
                "model": call.model}

    def tokens(self, delta: int, emitted: int, finish: str | None) -> bytes:
        text = _text(emitted - delta, delta)
        out = b""
        if self.call.chat and not self.started:
            out += self._event({**self._head(), "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "logprobs": None, "finish_reason": None}]}, 0)
        self.started = True
        if self.call.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": finish, "stop_reason": None, "token_ids": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None, "prompt_token_ids": None, "token_ids": None,
                      "weight_versions": None}
        chunk = {**self._head(), "choices": [choice]}
        if finish is not None and not self.call.include_usage and self.fingerprint:
            chunk["system_fingerprint"] = self.fingerprint
        return out + self._event(chunk, emitted)

    def _event(self, chunk: dict[str, Any], emitted: int) -> bytes:
        if self.call.continuous_usage:
            chunk["usage"] = self.call.usage(emitted)
        chunk["kv_transfer_params"] = None
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def usage(self, emitted: int) -> bytes:
        chunk = {**self._head(), "choices": [], "usage": self.call.usage(emitted)}
        if self.fingerprint:
            chunk["system_fingerprint"] = self.fingerprint
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _whole_body(call: Call, output: Output, fingerprint: str | None) -> dict[str, Any]:
    text = _text(0, output.sent)
    if call.chat:
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None, "finish_reason": output.finish, "stop_reason": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": output.finish,
                  "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                  "prompt_token_ids": None}
    return {"id": call.response_id,
            "object": "chat.completion" if call.chat else "text_completion",
            "created": call.created, "model": call.model, "choices": [choice],
            "system_fingerprint": fingerprint,
            "usage": {**call.usage(output.sent), "prompt_tokens_details": None},
            "kv_transfer_params": None}


def _text(start: int, count: int) -> str:
    words = OUTPUT_WORDS
    return "".join(words[(start + i) % len(words)] for i in range(count))


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


def _dumps_text(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _json_body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"JSON decode error: {exc}", "Bad Request") from None
