"""The Prometheus source: every inference server and GPU exporter a Prometheus scrapes, read
through its API and turned into the same :class:`Scrape` objects the poller makes (the
package's docstring says how).

Instances come and go (pods rescheduled): an instance with no sample for
``FORGET_AFTER_S`` is forgotten, and at most ``MAX_INSTANCES`` are known at once (past it,
those heard from least recently go first), so a fleet that churns costs what its live
instances cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtop.collect.adapters import WANTED
from kvtop.collect.adapters.sglang import COUNTERS as SGLANG_COUNTERS
from kvtop.collect.adapters.sglang import GAUGES as SGLANG_GAUGES
from kvtop.collect.adapters.vllm import ITL_NEW, V0_ONLY
from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.prometheus.answers import (
    InstanceKey,
    PrometheusError,
    group_scrapes,
    last_errors,
    parse_retention,
    query_result,
    series_points,
)
from kvtop.collect.prometheus.api import PrometheusAPI, PrometheusSettings
from kvtop.collect.prometheus.promql import duration, one_of, selector_matchers, vector_selector
from kvtop.collect.source import OnScrape, read_scrape
from kvtop.collect.target import Scrape, Target

log = logging.getLogger(__name__)


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
OFF_LOOP_SERIES = 2_000  # results this large are grouped in a worker thread
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
TARGETS_CACHE_S = 30.0  # /api/v1/targets (for down instances' errors) at most this often
# Instances known at once: a fleet of 2,000 servers; a refresh answer holds ~2,500
# engines at its cap, and each instance known costs ~50 KB with its tracker.
MAX_INSTANCES = 2048
# An instance with no sample (good or `up`) for this long is forgotten: its row goes stale
# first (after a few scrape intervals), then away.
FORGET_AFTER_S = 900.0


def target_for(settings: PrometheusSettings, job: str, instance: str) -> Target:
    """A stable identity per instance: one tracker per (job, instance), whatever its port."""
    return Target(url=f"{settings.base}#{job}/{instance}", name=instance, group=job)


@dataclass(slots=True)
class _Instance:
    target: Target
    last_t: float | None = None  # newest scrape delivered (good or up == 0)
    spacing: float | None = None  # seconds between its last two scrapes
    up_t: float | None = None  # newest `up` sample seen
    up: bool = False  # its value: 1, Prometheus reads it (0 is a failed scrape, `down`)
    heard_t: float = 0.0  # our clock when a query last named it


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
        entry.heard_t = self.clock()
        return entry

    def _forget(self, now: float) -> None:
        """Instances not named by any query for ``FORGET_AFTER_S`` are forgotten, and past
        ``MAX_INSTANCES`` those heard from least recently: pods rescheduled every refresh
        once grew ``check`` from 60 to 321 MB in 80 s, and each refresh re-reported every
        instance ever seen."""
        gone = [key for key, entry in self._instances.items()
                if now - entry.heard_t > FORGET_AFTER_S]
        over = len(self._instances) - len(gone) - MAX_INSTANCES
        if over > 0:
            kept = sorted((entry.heard_t, key) for key, entry in self._instances.items()
                          if now - entry.heard_t <= FORGET_AFTER_S)
            gone += [key for _, key in kept[:over]]
        for key in gone:
            del self._instances[key]

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
        since = self._since
        until = now if since is None else now - INGEST_LAG_S
        span = self.lookback_s if since is None else until - since
        try:
            scrapes = await self._refresh(until, max(span, 0.001))
        except Exception as exc:
            failed = exc if isinstance(exc, PrometheusError) else _internal_error(exc)
            if not self._instances:
                raise failed from None
            return [Scrape(e.target, now, failure=failed.kind, error=str(failed))
                    for e in self._instances.values()]
        self._since = now - INGEST_LAG_S
        self._forget(now)
        return scrapes + self._stale(now)

    async def _refresh(self, until: float, span: float) -> list[Scrape]:
        """The samples in (until − span, until]."""
        query = f"{vector_selector(WANTED, self.settings.selector)}[{duration(span)}]"
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
        matchers = ", ".join(m for m in (selector_matchers(self.settings.selector),
                                         one_of("job", jobs)) if m)
        samples = []
        for series in await self.api.matrix(f"up{{{matchers}}}[{duration(span)}]", now):
            metric, values = series_points(series)
            known = (metric.get("job", ""), metric.get("instance", "")) in self._instances
            if not known and all(value != "0" for _, value in values):
                continue  # an exporter beside the inference servers, not one of them
            entry = self._known(metric)
            for t, value in values:
                # the newest sample decides; at one moment a failed scrape outweighs a
                # good one (two jobs relabelled into one instance), whatever the order
                if entry.up_t is None or t > entry.up_t or (t == entry.up_t and value == "0"):
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
        self._errors = last_errors(data, self.settings.token)
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


async def _deliver(on_scrape: OnScrape, scrape: Scrape) -> None:
    try:
        result = on_scrape(scrape)
        if asyncio.iscoroutine(result):
            await result
    except Exception:  # the consumer's bug must not stop the source
        log.exception("on_scrape failed for %s", scrape.target.label)


