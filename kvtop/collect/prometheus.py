"""Prometheus as a data source: the inference servers a Prometheus already scrapes, read
through its HTTP API and turned into the same :class:`Scrape` objects the poller makes.

Every instance (``job``/``instance`` labels) with a vLLM/SGLang/llama.cpp/TRT-LLM series, or a
GPU exporter's (dcgm-exporter, nvidia_gpu_exporter), is one :class:`Target`
``<prometheus url>#<job>/<instance>``; the exporters' GPU series come in the same queries.
Each refresh costs two queries for the whole fleet, never one per host:

* ``{__name__=~"<adapters' WANTED names>", <selector>}[Δ]``: the raw samples Prometheus
  stored since the last refresh, with their own scrape timestamps. The samples of one
  instance sharing a timestamp are one scrape of it, handed on as parsed samples (no text
  to write and parse again), so the same adapters, trackers and leak detector run
  unchanged, on exactly the scrapes Prometheus made (rates use its timestamps, not kvtop's
  refresh clock).
* ``up{<selector>, job=~"<jobs seen>"}[Δ]``: ``up == 0`` is a failed scrape (``down``).

An instance with no fresh series for a while fails with a reason (``stale``). On start,
:meth:`PrometheusSource.backfill` replays the detector's window from one range query over
only the families the detector and the history need. docs/prometheus.md has the details.

Answers are read as untrusted: one over ``MAX_ANSWER_BYTES``, or not shaped like the API's
(``data`` not an object, a series that is not ``{"metric": {str: str}, "values": [[t,
"v"], ...]}``, a time that is not a finite number) fails every instance of that refresh
with ``bad_payload`` and the reason; the source goes on with the next refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from kvtop.collect.adapters import WANTED
from kvtop.collect.adapters.sglang import COUNTERS as SGLANG_COUNTERS
from kvtop.collect.adapters.sglang import GAUGES as SGLANG_GAUGES
from kvtop.collect.adapters.vllm import ITL_NEW, V0_ONLY
from kvtop.collect.bounded import BoundedCache
from kvtop.collect.exposition import Exposition, Sample, new_sample
from kvtop.collect.http import Failed, bearer, classify_exception, make_session, read_capped, within
from kvtop.collect.source import OnScrape, read_scrape
from kvtop.collect.target import (
    FailureKind,
    Scrape,
    Secret,
    Target,
    check_no_credentials,
    redact,
    redact_bytes,
)

log = logging.getLogger(__name__)

InstanceKey = tuple[str, str]  # (job, instance)

# What the leak detector and the history plots read, and the series the vLLM adapter infers
# the release from (it decides the pool's size); latency histograms (most series) are left
# out of the backfill and come with the first live refresh.
BACKFILL_NAMES = frozenset({
    *V0_ONLY, f"{ITL_NEW}_count",
    "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cache_config_info",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
    *SGLANG_GAUGES, *SGLANG_COUNTERS,
})
_INSTANCE_LABELS = frozenset({"__name__", "job", "instance"})
MAX_CACHED_HEADS = 50_000  # a refresh of 500 engines names ~45,000 series
MAX_CACHED_HEAD_CHARS = 32 << 20  # ~300 characters each
# Per series' label pairs: its name and labels without the instance's own (shared dicts).
_heads = BoundedCache(MAX_CACHED_HEADS, MAX_CACHED_HEAD_CHARS)
# The largest answer read (docs/prometheus.md, "Answer sizes"): a refresh names ~85 series
# per vLLM engine, ~22 KB, and the 30-min backfill at a 15-s step ~53 KB per engine, so this
# holds the refresh of ~2,500 engines and the backfill of ~1,200; decoded, an answer takes
# ~6x its size in memory (~400 MB here).
MAX_ANSWER_BYTES = 64 << 20
# Answers and results this large are decoded and grouped in a worker thread, so the event
# loop (the keys, the screen) never waits for them.
OFF_LOOP_BYTES = 1 << 20
OFF_LOOP_SERIES = 2_000
BACKFILL_TIMEOUT_FACTOR = 6
MAX_POINTS = 11_000  # Prometheus refuses range queries with more points per series
DEFAULT_BACKFILL_STEP_S = 15.0
# Prometheus stores a sample per scrape_interval (15 s by default): re-reading it every
# second shows nothing new.
PROMETHEUS_INTERVAL_S = 5.0
# A scrape in flight lands with its start time, a little late: a refresh reads up to this
# long before now, and the next one starts there, so every sample is read once (re-reading
# an overlap each time cost 40 % more decoding and grouping). Only the first read, which has
# nothing before it, goes up to now; the next one reads its last seconds again.
INGEST_LAG_S = 2.0
QUOTE_CHARS = 200  # of Prometheus's own error messages
TARGETS_CACHE_S = 30.0  # /api/v1/targets (for down instances' errors) at most this often


def quote(said: object, token: Secret | None) -> str:
    """A short quote of what Prometheus said (an ``error``, a ``lastError``): one line,
    masked (a header echoed in JSON escapes, or cut by a proxy) and only then cut to
    ``QUOTE_CHARS``."""
    return redact(" ".join(str(said).split()), token)[:QUOTE_CHARS]


class PrometheusError(Exception):
    """Prometheus could not be read, or knows no inference server; the message says why."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    url: str  # http(s)://host:9090[/prefix]
    selector: str = ""  # '{namespace="prod"}': matchers added to every query
    token: Secret | None = field(default=None, repr=False)
    backfill_step_s: float | None = None  # default: the refresh interval, at least 15 s

    @property
    def base(self) -> str:
        return self.url.rstrip("/")


def selector_matchers(selector: str) -> str:
    """``{a="b", c=~"d"}`` -> ``a="b", c=~"d"`` (checked loosely; Prometheus checks the rest)."""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"a label selector looks like {{namespace=\"prod\"}}, not {selector!r}")
    inner = text[1:-1].strip().rstrip(",")
    if "__name__" in inner:
        raise ValueError("the selector picks instances by their labels; leave out __name__")
    return inner


def names_regex(names: Iterable[str]) -> str:
    # metric names are [a-zA-Z0-9_:]: nothing to escape
    return "|".join(sorted(names))


def vector_selector(names: Iterable[str], selector: str, extra: str = "") -> str:
    matchers = [f'__name__=~"{names_regex(names)}"', selector_matchers(selector), extra]
    return "{" + ", ".join(m for m in matchers if m) + "}"


def _ms(seconds: float) -> str:
    """A PromQL range: whole milliseconds (2.x rejects fractional durations)."""
    return f"{max(1, round(seconds * 1000))}ms"


def target_for(settings: PrometheusSettings, job: str, instance: str) -> Target:
    """A stable identity per instance: one tracker per (job, instance), whatever its port."""
    return Target(url=f"{settings.base}#{job}/{instance}", name=instance, group=job)


def _series_head(metric: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(name, labels) of one series, without the instance's own labels."""
    labels = {k: v for k, v in metric.items() if k not in _INSTANCE_LABELS}
    return metric.get("__name__", ""), labels


def _value(text: Any) -> float:
    """A sample value as the API writes it ("0.25", "NaN", "+Inf"); anything else is NaN."""
    try:
        return float(text)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def malformed(what: str) -> PrometheusError:
    return PrometheusError("bad_payload", f"not a Prometheus query answer: {what}")


def query_result(data: Any) -> list[Any]:
    """The ``result`` list of a query's ``data``."""
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise malformed("'data' holds no 'result' list")
    return data["result"]


def _labels(metric: Any) -> dict[str, str]:
    if type(metric) is not dict or not all(
            type(k) is str and type(v) is str for k, v in metric.items()):
        raise malformed("a series' 'metric' is not an object of strings")
    return metric


def _time(t: Any) -> float:
    if type(t) not in (int, float) or not math.isfinite(t):
        raise malformed(f"a sample time is {str(t)[:40]!r}, not a number")
    return t


def series_points(series: Any, key: str = "values") -> tuple[dict[str, str], list[Any]]:
    """(labels, [[t, value], ...]) of one series of a matrix (``values``) or a vector
    (``value``, one point), checked."""
    if type(series) is not dict:
        raise malformed("a series is not an object")
    points = series.get(key)
    if key == "value":
        points = [points]
    if type(points) is not list or not all(
            type(p) is list and len(p) == 2 and _time(p[0]) is not None for p in points):
        raise malformed(f"a series' {key!r} are not [time, value] pairs")
    return _labels(series.get("metric")), points


def group_scrapes(result: Any) -> dict[InstanceKey, dict[float, list[Sample]]]:
    """Matrix result -> samples per instance per timestamp (one scrape each). Raises
    PrometheusError (bad_payload) for an answer not shaped like one.

    A 500-engine fleet returns ~20 k series per refresh, naming the same series each time,
    so heads are cached by the label pairs (Prometheus sends them in a fixed order); a
    series' labels are checked once, when its head is made."""
    if not isinstance(result, list):
        raise malformed("'result' is not a list")
    out: dict[InstanceKey, dict[float, list[Sample]]] = {}
    heads = _heads
    for series in result:
        metric = series.get("metric") if type(series) is dict else None
        pairs = tuple(metric.items()) if type(metric) is dict else ()
        try:
            head = heads.get(pairs) if pairs else None
        except TypeError:  # a value that is not a string (a list does not hash): checked below
            head = None
        if head is None:
            labels, values = series_points(series)
            head = _series_head(labels)
            heads.put(pairs, head, sum(len(k) + len(v) for k, v in pairs))
        else:
            values = series.get("values")
            if type(values) is not list:
                raise malformed("a series' 'values' is not a list")
        name, labels = head
        key = (metric.get("job", ""), metric.get("instance", ""))  # type: ignore[union-attr]
        per_t = out.get(key)
        if per_t is None:
            per_t = out[key] = {}
        for point in values:
            if type(point) is not list or len(point) != 2:
                raise malformed("a series' 'values' are not [time, value] pairs")
            t, value = point
            t = _time(t)
            samples = per_t.get(t)
            if samples is None:
                samples = per_t[t] = []
            samples.append(new_sample((name, labels, _value(value), None)))
    return out


@dataclass(slots=True)
class _Instance:
    target: Target
    last_t: float | None = None  # newest scrape delivered (good or up == 0)
    spacing: float | None = None  # seconds between its last two scrapes
    up_t: float | None = None  # newest `up` sample seen
    up: bool = False  # its value: 1, Prometheus reads it (0 is a failed scrape, `down`)


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
        return response.status, redact_bytes(body, self.settings.token)

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


class PrometheusSource:
    """A ScrapeSource (``interval_s``, ``run``) over Prometheus, plus one-shot reads."""

    def __init__(self, settings: PrometheusSettings, *, interval_s: float = 1.0,
                 timeout_s: float | None = None, insecure: bool = False,
                 window_s: float = 1800.0, lookback_s: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.interval_s = interval_s
        self.window_s = window_s  # backfill span: the leak detector's window
        self.lookback_s = lookback_s  # first refresh without a backfill reads this far back
        self.api = PrometheusAPI(settings, timeout_s=timeout_s or max(5.0, 2 * interval_s),
                                 insecure=insecure)
        self.clock = clock
        self._instances: dict[InstanceKey, _Instance] = {}
        self._since: float | None = None  # evaluation time of the last refresh
        self._errors: dict[InstanceKey, str] = {}
        self._errors_t = -math.inf

    @property
    def targets(self) -> list[Target]:
        """Every instance found so far, in (job, instance) order."""
        return [self._instances[k].target for k in sorted(self._instances)]

    # -- discovery ----------------------------------------------------------------------

    async def discover(self) -> list[Target]:
        """The inference servers Prometheus knows now (one cheap query), and the down
        instances of their jobs. Raises :class:`PrometheusError` when there are none."""
        now = self.clock()
        query = f"count by (job, instance) ({vector_selector(WANTED, self.settings.selector)})"
        data = await self.api.call("query", {"query": query, "time": f"{now:.3f}"})
        for series in query_result(data):
            self._known(series_points(series, "value")[0])
        await self._up_samples(now, self.lookback_s)
        if not self._instances:
            where = f" matching {self.settings.selector}" if self.settings.selector else ""
            raise PrometheusError("bad_payload", f"Prometheus {self.settings.base} has no "
                                  f"vLLM/SGLang/llama.cpp/TRT-LLM or GPU exporter series{where}")
        return self.targets

    def _known(self, metric: dict[str, str]) -> _Instance:
        key = (metric.get("job", ""), metric.get("instance", ""))
        entry = self._instances.get(key)
        if entry is None:
            entry = _Instance(target_for(self.settings, *key))
            self._instances[key] = entry
        return entry

    # -- backfill -----------------------------------------------------------------------

    def backfill_step(self, span_s: float | None = None) -> float:
        step = self.settings.backfill_step_s or max(self.interval_s, DEFAULT_BACKFILL_STEP_S)
        return max(step, (span_s or self.window_s) / MAX_POINTS)

    async def retention_s(self) -> float | None:
        """How far back Prometheus keeps samples (its time-based retention), or None when it
        does not say (a size-only limit, or an API without ``status/runtimeinfo``)."""
        try:
            info = await self.api.call("status/runtimeinfo")
        except PrometheusError:
            return None
        retention = info.get("storageRetention") if isinstance(info, dict) else None
        return parse_retention(retention) if isinstance(retention, str) else None

    async def backfill(self, span_s: float | None = None) -> list[Scrape]:
        """The last ``span_s`` (default: the detector's window), as scrapes in time order
        (one range query)."""
        end = self.clock()
        query = vector_selector(BACKFILL_NAMES, self.settings.selector)
        span_s = span_s or self.window_s
        result = await self.api.query_range(query, end - span_s, end,
                                            self.backfill_step(span_s))
        scrapes = self._scrapes(await _grouped(result))
        self._since = end - INGEST_LAG_S
        return scrapes

    # -- refresh ------------------------------------------------------------------------

    async def poll_once(self) -> list[Scrape]:
        """Everything Prometheus stored since the last call (first call: ``lookback_s``), as
        scrapes in time order, plus a failed one per instance that is down or stale. When
        Prometheus can't be read, every known instance fails with the reason."""
        now = self.clock()
        first = self._since is None
        until = now if first else now - INGEST_LAG_S
        span = self.lookback_s if first else until - self._since
        try:
            scrapes = await self._refresh(until, max(span, 0.001))
        except Exception as exc:
            failed = exc if isinstance(exc, PrometheusError) else _internal_error(exc)
            if not self._instances:
                raise failed from None
            return [Scrape(e.target, now, failure=failed.kind, error=str(failed))
                    for e in self._instances.values()]
        self._since = now - INGEST_LAG_S
        return scrapes + self._stale(now)

    async def _refresh(self, until: float, span: float) -> list[Scrape]:
        """The samples in (until − span, until]."""
        query = f"{vector_selector(WANTED, self.settings.selector)}[{_ms(span)}]"
        good = self._scrapes(await _grouped(await self.api.matrix(query, until)))
        down = await self._read_up(until, span)
        return sorted(good + down, key=lambda s: s.t)

    def _scrapes(self, grouped: dict[InstanceKey, dict[float, list[Sample]]]) -> list[Scrape]:
        scrapes = []
        for (job, instance), per_t in grouped.items():
            entry = self._known({"job": job, "instance": instance})
            for t in sorted(per_t):
                if entry.last_t is not None and t <= entry.last_t:
                    continue  # delivered already (a sample on the edge of two reads)
                self._advance(entry, t)
                scrapes.append(read_scrape(Scrape(entry.target, t, samples=Exposition(per_t[t]))))
        scrapes.sort(key=lambda s: s.t)
        return scrapes

    @staticmethod
    def _advance(entry: _Instance, t: float) -> None:
        if entry.last_t is not None:
            entry.spacing = t - entry.last_t
        entry.last_t = t

    async def _up_samples(self, now: float, span: float) -> list[tuple[_Instance, float, str]]:
        """(instance, t, value) of the ``up`` samples of known instances, and of down
        instances in the same jobs (a server that never came up has no vLLM series)."""
        jobs = sorted({job for job, _ in self._instances})
        if not jobs:
            return []
        extra = 'job=~"' + "|".join(re.escape(j).replace("\\", "\\\\") for j in jobs) + '"'
        matchers = ", ".join(m for m in (selector_matchers(self.settings.selector), extra) if m)
        samples = []
        for series in await self.api.matrix(f"up{{{matchers}}}[{_ms(span)}]", now):
            metric, values = series_points(series)
            known = (metric.get("job", ""), metric.get("instance", "")) in self._instances
            if not known and all(value != "0" for _, value in values):
                continue  # an exporter beside the inference servers, not one of them
            entry = self._known(metric)
            for t, value in values:
                if entry.up_t is None or t >= entry.up_t:
                    entry.up_t, entry.up = t, value != "0"
                samples.append((entry, t, value))
        return samples

    async def _read_up(self, now: float, span: float) -> list[Scrape]:
        """A failed scrape (``down``) for each new ``up == 0`` sample."""
        failed: list[tuple[_Instance, float]] = []
        for entry, t, value in await self._up_samples(now, span):
            if value == "0" and (entry.last_t is None or t > entry.last_t):
                self._advance(entry, t)
                failed.append((entry, t))
        if not failed:
            return []
        errors = await self._scrape_errors(now)
        return [Scrape(e.target, t, failure="down", error=self._down_reason(e, errors))
                for e, t in failed]

    async def _scrape_errors(self, now: float) -> dict[InstanceKey, str]:
        """Prometheus's own scrape errors (lastError), cached: only down instances need it."""
        if now - self._errors_t < TARGETS_CACHE_S:
            return self._errors
        self._errors_t = now
        try:
            data = await self.api.call("targets?state=active")
        except PrometheusError:
            return self._errors
        self._errors = _last_errors(data, self.settings.token)
        return self._errors

    def _down_reason(self, entry: _Instance, errors: dict[InstanceKey, str]) -> str:
        target = entry.target
        said = errors.get((target.group or "", target.name or ""))
        detail = f": {said}" if said else ""
        return f"Prometheus reports up == 0 (its scrape of {target.name} failed){detail}"

    def _stale(self, now: float) -> list[Scrape]:
        """Instances whose newest series are older than a few of their scrape intervals."""
        out = []
        for entry in self._instances.values():
            spacing = max(entry.spacing or 0.0, self.interval_s)
            limit = max(3 * spacing, 10.0)
            newest = entry.last_t if entry.last_t is not None else -math.inf
            up_fresh = entry.up_t is not None and now - entry.up_t <= limit
            # read lately, or down (its failures come from `up == 0`): not stale; a fresh
            # `up == 1` alone is no reading, only the reason there is none
            if now - newest <= limit or (up_fresh and not entry.up):
                continue
            if up_fresh:
                error = ("Prometheus scrapes it (up == 1) but has no vLLM/SGLang series for "
                         "it: metrics off (--disable-log-stats) or dropped by relabelling?")
            else:
                age = "" if newest == -math.inf else f" for {now - newest:.0f} s"
                error = (f"no fresh series in Prometheus{age}: target removed, or "
                         "Prometheus not scraping it")
            out.append(Scrape(entry.target, now, failure="bad_payload", error=error))
        return out

    # -- ScrapeSource -------------------------------------------------------------------

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event | None = None,
                  backfill: bool = True) -> None:
        """Backfill (unless told not to), then refresh every ``interval_s`` until ``stop``."""
        stop = stop or asyncio.Event()
        if backfill and self._since is None:
            try:
                for scrape in await self.backfill():
                    await _deliver(on_scrape, scrape)
            except PrometheusError:
                pass  # the first refresh reports Prometheus's trouble per instance
        while not stop.is_set():
            started = time.monotonic()
            try:
                scrapes = await self.poll_once()
            except PrometheusError:
                scrapes = []  # nothing known yet: try again next period
            for scrape in scrapes:
                await _deliver(on_scrape, scrape)
            wait = max(0.0, self.interval_s - (time.monotonic() - started))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def aclose(self) -> None:
        await self.api.aclose()

    async def __aenter__(self) -> PrometheusSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _grouped(result: list[Any]) -> dict[InstanceKey, dict[float, list[Sample]]]:
    if len(result) > OFF_LOOP_SERIES:
        return await asyncio.to_thread(group_scrapes, result)
    return group_scrapes(result)


def _internal_error(exc: Exception) -> PrometheusError:
    """An answer kvtop failed on in a way nobody foresaw: the instances fail, the source
    goes on."""
    log.error("reading a Prometheus answer failed", exc_info=exc)
    return PrometheusError("bad_payload", f"kvtop could not read Prometheus's answer "
                           f"({type(exc).__name__}); a bug in kvtop, please report it")


def _last_errors(data: Any, token: Secret | None) -> dict[InstanceKey, str]:
    """Prometheus's own last scrape error per (job, instance) from /api/v1/targets, quoted
    (masked, then cut); what is not shaped like it is passed over (these errors only add
    detail to 'down')."""
    targets = data.get("activeTargets") if isinstance(data, dict) else None
    errors = {}
    for target in targets if isinstance(targets, list) else ():
        labels = target.get("labels") if isinstance(target, dict) else None
        error = target.get("lastError") if isinstance(target, dict) else None
        if isinstance(labels, dict) and isinstance(error, str) and error:
            key = (labels.get("job", ""), labels.get("instance", ""))
            if all(isinstance(part, str) for part in key):
                errors[key] = quote(error, token)
    return errors


async def _deliver(on_scrape: OnScrape, scrape: Scrape) -> None:
    try:
        result = on_scrape(scrape)
        if asyncio.iscoroutine(result):
            await result
    except Exception:  # the consumer's bug must not stop the source
        log.exception("on_scrape failed for %s", scrape.target.label)


_RETENTION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                    "w": 7 * 86400.0, "y": 365 * 86400.0}
_RETENTION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_retention(text: str) -> float | None:
    """Prometheus's ``storageRetention`` ("15d", "1w2d", "15d or 10GiB") -> seconds of its
    time limit; None when it has none ("10GiB")."""
    for part in text.split(" or "):
        part = part.strip()
        if part and _RETENTION_PART.sub("", part) == "":
            return sum(int(n) * _RETENTION_UNITS[u] for n, u in _RETENTION_PART.findall(part))
    return None


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
