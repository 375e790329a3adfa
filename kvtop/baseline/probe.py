"""The probe: one fixed short completion sent to the server's OpenAI-compatible API a few
times, one at a time, and timed from the client (time to first token, total).

The request is always the same: 32 common words (each one token in current tokenizers),
16 tokens out with ``ignore_eos``, streamed. A server without a tokenizer (vLLM's
``--skip-tokenizer-init``) refuses text; it then gets 32 fixed token ids instead, and the
baseline says which form was sent so ``kvtop compare`` sends the same. Nothing the server
answers is kept but timings and token counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from kvtop.baseline.model import Figure, ProbeSummary
from kvtop.derive.samples import percentile
from kvtop.load.openai_client import (
    CompletionResult,
    NotOpenAI,
    completion_request,
    list_models,
    stream_completion,
)
from kvtop.load.prompts import WORDS

PromptForm = Literal["text", "token_ids"]
PROMPT_WORDS = 32
PROBE_TEXT = " ".join(WORDS[:PROMPT_WORDS])
PROBE_TOKEN_IDS = list(range(1000, 1000 + PROMPT_WORDS))
PROBE_MAX_TOKENS = 16
DEFAULT_PROBES = 5
PROBE_TIMEOUT_S = 60.0
# A server that can't take text answers 400 (vLLM without a tokenizer); anything else
# (auth, not found, overload) is not about the prompt's form.
TEXT_REFUSED = frozenset({400, 422})


def api_base(metrics_url: str) -> str:
    """The OpenAI API root (.../v1) of the server whose /metrics is ``metrics_url``."""
    parts = urlsplit(metrics_url)
    path = parts.path.rstrip("/").removesuffix("/metrics")
    return urlunsplit((parts.scheme, parts.netloc, path + "/v1", "", ""))


@dataclass(slots=True)
class ProbeSettings:
    count: int = DEFAULT_PROBES
    model: str | None = None  # None: the first one /v1/models lists
    form: PromptForm | None = None  # None: text, or token ids if the server refuses text
    time_scale: float = 1.0  # the server's clock runs this many times wall time


class Prober:
    """Sends the probe to one server; :meth:`identify` first, then :meth:`send` N times."""

    def __init__(self, session: aiohttp.ClientSession, metrics_url: str,
                 settings: ProbeSettings, token: str | None) -> None:
        self.session, self.settings, self.token = session, settings, token
        self.base = api_base(metrics_url)
        self.model = settings.model or ""
        self.form: PromptForm = settings.form or "text"
        self.results: list[CompletionResult] = []

    async def identify(self) -> None:
        """Find the model to ask; NotOpenAI when the server can't be probed."""
        models = await list_models(self.session, self.base, token=self.token)
        names = [m.id for m in models]
        if self.settings.model is not None and self.settings.model not in names:
            raise NotOpenAI(f"{self.base}/models does not list the baseline's probe model "
                            f"{self.settings.model!r} (it lists {', '.join(names)})")
        self.model = self.settings.model or names[0]

    def _request(self) -> tuple[str, dict[str, object]]:
        prompt = PROBE_TEXT if self.form == "text" else PROBE_TOKEN_IDS
        return completion_request(self.model, prompt, PROBE_MAX_TOKENS)

    async def send(self) -> CompletionResult:
        path, body = self._request()
        result = await stream_completion(self.session, self.base + path, body,
                                         token=self.token, timeout_s=PROBE_TIMEOUT_S)
        if (result.http_status in TEXT_REFUSED and self.form == "text"
                and self.settings.form is None and not self.results):
            self.form = "token_ids"  # no tokenizer there: the fixed ids from now on
            path, body = self._request()
            result = await stream_completion(self.session, self.base + path, body,
                                             token=self.token, timeout_s=PROBE_TIMEOUT_S)
        self.results.append(result)
        return result

    async def run(self, wait_turn: Callable[[int], Awaitable[bool]]) -> ProbeSummary:
        """Send the probe ``count`` times, each once ``wait_turn(i)`` says go (False: the
        run is over, stop)."""
        for i in range(self.settings.count):
            if not await wait_turn(i):
                break
            await self.send()
        return self.summary()

    def summary(self) -> ProbeSummary:
        ok = [r for r in self.results if r.status == "ok" and r.ttft_s is not None]
        failed = [r for r in self.results if r not in ok]
        scale = self.settings.time_scale
        figures = {name: _figure([getattr(r, f"{name}_s") * scale for r in ok])
                   for name in ("ttft", "total")}
        prompt_tokens = next((r.prompt_tokens for r in ok if r.prompt_tokens), None)
        return ProbeSummary(model=self.model, prompt=self.form, max_tokens=PROBE_MAX_TOKENS,
                            prompt_tokens=prompt_tokens, requests=len(self.results),
                            failed=len(failed), figures=figures,
                            error=failed[-1].error if failed else None)


def _figure(values: list[float]) -> Figure:
    return Figure(percentile(values, 0.5), tuple(values),
                  {"min": min(values, default=None), "max": max(values, default=None)})
