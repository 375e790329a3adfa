"""The few Prometheus HTTP API calls kvtop makes, and the settings they are made with."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from kvtop.collect.http import Failed, bearer, classify_exception, make_session, read_capped, within
from kvtop.collect.prometheus.answers import PrometheusError, query_result, quote
from kvtop.collect.prometheus.promql import selector_matchers
from kvtop.collect.target import Secret, check_no_credentials
from kvtop.safe_text import mask_bytes

# The largest answer read (docs/prometheus.md, "Answer sizes"): a refresh names ~85 series
# per vLLM engine, ~22 KB, and the 30-min backfill at a 15-s step ~53 KB per engine, so this
# holds the refresh of ~2,500 engines and the backfill of ~1,200; decoded, an answer takes
# ~6x its size in memory (~400 MB here).
MAX_ANSWER_BYTES = 64 << 20
# Answers this large are decoded in a worker thread, so the event loop (the keys, the
# screen) never waits for them (source.py groups large results there too).
OFF_LOOP_BYTES = 1 << 20
BACKFILL_TIMEOUT_FACTOR = 6


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    url: str  # http(s)://host:9090[/prefix]
    selector: str = ""  # '{namespace="prod"}': matchers added to every query
    token: Secret | None = field(default=None, repr=False)
    backfill_step_s: float | None = None  # default: the refresh interval, at least 15 s

    @property
    def base(self) -> str:
        return self.url.rstrip("/")


class PrometheusAPI:
    """The few Prometheus HTTP API calls kvtop makes; errors become :class:`PrometheusError`."""

    def __init__(self, settings: PrometheusSettings, *, timeout_s: float, insecure: bool) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.insecure = insecure
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    async def call(self, path: str, form: dict[str, str] | None = None, *,
                   timeout_s: float | None = None) -> Any:
        """POST (queries: a fleet-wide regex is long) or GET; the ``data`` of the answer,
        within ``timeout_s`` in all (default: the API's)."""
        if self._session is None:
            self._session = make_session(insecure=self.insecure)
        self.requests += 1
        timeout_s = timeout_s or self.timeout_s
        try:
            status, body = await within(timeout_s, self._request(self._session, path, form))
        except Failed as failed:
            raise PrometheusError(failed.kind, f"Prometheus {self.settings.base}: "
                                  f"{failed.message}") from None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            kind, reason = classify_exception(exc, timeout_s)
            raise PrometheusError(kind, f"Prometheus {self.settings.base}: {reason}") from None
        try:
            if len(body) > OFF_LOOP_BYTES:
                payload = await asyncio.to_thread(orjson.loads, body)
            else:
                payload = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            payload = {}
        return self._data(status, payload)

    async def _request(self, session: aiohttp.ClientSession, path: str,
                       form: dict[str, str] | None) -> tuple[int, bytearray]:
        token = self.settings.token.reveal() if self.settings.token is not None else None
        method = "GET" if form is None else "POST"
        async with session.request(method, f"{self.settings.base}/api/v1/{path}",
                                   data=form, headers=bearer(token)) as response:
            body = await read_capped(response, MAX_ANSWER_BYTES)
        # A Prometheus or proxy may echo the Authorization header anywhere in its answer
        # (an error, a label): masked before anything reads or quotes it.
        return response.status, mask_bytes(body, self.settings.token)

    def _data(self, status: int, payload: Any) -> Any:
        where = f"Prometheus {self.settings.base}"
        if status in (401, 403):
            hint = "check the token" if self.settings.token else "it needs a bearer token " \
                   "(token_env / token_file under [prometheus])"
            raise PrometheusError("auth", f"{where}: HTTP {status}: {hint}")
        if not isinstance(payload, dict) or payload.get("status") != "success":
            said = payload.get("error") if isinstance(payload, dict) else None
            said = quote(said, self.settings.token) if said else "not a Prometheus API answer"
            raise PrometheusError("bad_payload" if status < 500 else "down",
                                  f"{where}: HTTP {status}: {said}")
        return payload.get("data")

    async def matrix(self, query: str, at: float) -> list[Any]:
        """The unchecked series of a query (group_scrapes / series_points check them)."""
        data = await self.call("query", {"query": query, "time": f"{at:.3f}"})
        return query_result(data)

    async def query_range(self, query: str, start: float, end: float,
                          step: float) -> list[Any]:
        # A backfill of a large fleet is one big answer: it gets more time than a refresh.
        data = await self.call("query_range", {"query": query, "start": f"{start:.3f}",
                                               "end": f"{end:.3f}", "step": f"{step:g}"},
                               timeout_s=BACKFILL_TIMEOUT_FACTOR * self.timeout_s)
        return query_result(data)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def load_settings(url: str, *, selector: str = "", token: Secret | None = None,
                  backfill_step_s: float | None = None) -> PrometheusSettings:
    """Validated settings: an http(s) URL without credentials, a well-formed selector."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"not a Prometheus URL: {url!r}")
    check_no_credentials(url)  # user:pass@ or ?token=: say where the token goes instead
    selector_matchers(selector)
    if backfill_step_s is not None and backfill_step_s <= 0:
        raise ValueError("backfill_step must be > 0 seconds")
    return PrometheusSettings(url.rstrip("/"), selector.strip(), token, backfill_step_s)

