"""From scrapes (live or recorded), GPU readings and probe answers to a :class:`Baseline`.

Scrapes go through the same :class:`TargetTracker` as the app, so KV usage, blocks and the
leak verdict are computed as everywhere else. Counters and latency histograms are taken as
deltas between successive good scrapes of an engine (a restart's window is skipped) and
summed per minute of the run (minute 0 starts at the first scrape), so every figure has a
value over the whole run and one per minute. A minute counts when scrape windows cover at
least half of it. A figure the server does not export stays unknown: missing is not 0.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from kvtop import __version__
from kvtop.baseline.model import (
    Baseline,
    ConfigValue,
    EngineSummary,
    Figure,
    GpuSummary,
    ProbeSummary,
    TargetSummary,
)
from kvtop.baseline.stats import mean
from kvtop.collect.gpu import GpuReading
from kvtop.collect.reading import EngineReading
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.quantiles import bucket_delta, quantile
from kvtop.derive.samples import percentile
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey, TargetTracker
from kvtop.derive.worst import EngineVerdict

MINUTE_S = 60.0
MIN_LATENCY_OBSERVATIONS = 5  # fewer requests in a minute say nothing about its p99
COUNTERS = ("preemptions_total", "prompt_tokens_total", "generation_tokens_total",
            "prefix_queries_total", "prefix_hits_total")
HISTOGRAMS = ("ttft", "itl", "e2e", "block_lifetime")
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
GAUGES = ("usage", "running", "waiting", "idle_usage", "idle_blocks", "kv_limited")
# bucket sets one histogram keeps apart in a window; a further set is folded into the fullest
MAX_BUCKET_SETS = 4
COMPUTED = "local_compute"  # vLLM's prompt_tokens_by_source label for KV computed afresh


def _step_down(bounds: tuple[float, ...], counts: list[float], onto: tuple[float, ...]
               ) -> list[float]:
    """Cumulative counts at ``onto``'s bounds: at each, the count at the highest of ``bounds``
    not above it, the observations certainly under it (a bucket's are not split)."""
    return [counts[i - 1] if (i := bisect.bisect_right(bounds, bound)) else 0.0
            for bound in onto]


def _fullest(sets: dict[tuple[float, ...], list[float]]) -> tuple[float, ...]:
    return max(sets, key=lambda bounds: sets[bounds][-1])


@dataclass(slots=True)
class _Window:
    """Sums over scrape windows: counter deltas with the seconds they cover, gauge samples,
    and latency histogram deltas (cumulative counts per bucket set)."""

    seconds: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    counted_s: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, list[float]] = field(default_factory=dict)
    # per histogram, its deltas summed per bucket set: a server may change its bounds (a new
    # version, no restart seen), and counts at different bounds cannot be added bound by bound
    histograms: dict[str, dict[tuple[float, ...], list[float]]] = field(default_factory=dict)

    def count(self, name: str, delta: float, dt: float) -> None:
        self.counts[name] = self.counts.get(name, 0.0) + delta
        self.counted_s[name] = self.counted_s.get(name, 0.0) + dt

    def gauge(self, name: str, value: float) -> None:
        self.gauges.setdefault(name, []).append(value)

    def samples(self, name: str) -> list[float]:
        return self.gauges.get(name, [])

    def histogram(self, name: str, delta: list[tuple[float, float]]) -> None:
        sets = self.histograms.setdefault(name, {})
        bounds = tuple(bound for bound, _ in delta)
        counts = [count for _, count in delta]
        if bounds not in sets and len(sets) == MAX_BUCKET_SETS:  # a server that keeps changing
            fullest = _fullest(sets)
            bounds, counts = fullest, _step_down(bounds, counts, fullest)
        summed = sets.setdefault(bounds, [0.0] * len(bounds))
        for i, count in enumerate(counts):
            summed[i] += count

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """The histogram's cumulative buckets, its bucket sets merged on all their bounds."""
        sets = self.histograms.get(name, {})
        union = sorted({bound for bounds in sets for bound in bounds})
        merged = [0.0] * len(union)
        for bounds, counts in sets.items():
            for i, count in enumerate(_step_down(bounds, counts, tuple(union))):
                merged[i] += count
        return list(zip(union, merged, strict=True))

    def rate(self, name: str, per_s: float = 1.0) -> float | None:
        seconds = self.counted_s.get(name)
        return self.counts[name] / seconds * per_s if seconds else None

    def reuse_share(self) -> float | None:
        """Prompt tokens whose KV was found cached, of those whose source was said."""
        total = self.counts.get("prompt_sourced")
        if not total:
            return None
        return max(0.0, 1.0 - self.counts["prompt_computed"] / total)  # counted together

    def hit_rate(self, caching_off: bool) -> float | None:
        if caching_off:  # the server says it reuses nothing: 0 wherever prompts came in
            prompts = self.counts.get("prompt_tokens_total", self.counts.get(
                "prefix_queries_total"))
            return 0.0 if prompts else None
        queries = self.counts.get("prefix_queries_total")
        if not queries:
            return None
        return self.counts["prefix_hits_total"] / queries  # adapters read both or neither

    def latency(self, name: str, q: float, min_observations: float = 1.0) -> float | None:
        buckets = self.buckets(name)
        if not buckets or buckets[-1][1] < min_observations:
            return None
        return quantile(q, buckets)


@dataclass
class _EngineRun:
    model: str | None
    engine: str | None
    first_t: float
    last_t: float = field(init=False)  # add() sets it and caching_off, as it comes first
    samples: int = 0
    restarts: int = 0
    total: _Window = field(default_factory=_Window)
    minutes: dict[int, _Window] = field(default_factory=dict)
    previous: tuple[float, EngineReading] | None = None  # the last good scrape's time, reading
    config: dict[str, ConfigValue] = field(default_factory=dict)
    caching_off: bool = field(init=False)
    verdict: EngineVerdict = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = EngineVerdict(self.model, self.engine)

    def add(self, t: float, minute: int, stats: EngineStats, reading: EngineReading) -> None:
        self.samples += 1
        self.last_t = t
        self.config = engine_config(stats)
        self.caching_off = stats.prefix_caching is False
        windows = (self.total, self.minutes.setdefault(minute, _Window()))
        _add_gauges(windows, stats)
        before, self.previous = self.previous, (t, reading)
        if stats.restarted:
            self.restarts += 1
            return
        if before is None or t <= before[0]:
            return
        dt = t - before[0]
        for window in windows:
            window.seconds += dt
        _add_deltas(windows, reading, before[1], dt)

    def summary(self, minute_s: float) -> EngineSummary:
        full = [(m, w) for m, w in sorted(self.minutes.items()) if w.seconds >= minute_s / 2]
        figures, minute_index = _engine_figures(self.total, full, self.caching_off)
        worst = self.verdict.at_worst
        return EngineSummary(
            model=self.model, engine=self.engine, config=self.config, figures=figures,
            samples=self.samples, minutes=max(len(f.values) for f in figures.values()),
            duration_s=self.last_t - self.first_t, leak=self.verdict.verdict,
            leak_reason=worst.reason if worst else "not enough data for a verdict",
            restarts=self.restarts, minute_index=minute_index)


def _add_gauges(windows: Iterable[_Window], stats: EngineStats) -> None:
    values = {"usage": stats.kv_usage, "running": stats.running, "waiting": stats.waiting}
    if stats.limit is not None and stats.limit.limit != "unknown":
        limit = stats.limit.limit
        values["kv_limited"] = float(limit == "kv_capacity")
        for window in windows:
            window.gauge(f"limit:{limit}", 1.0)
    if stats.running == 0 and stats.waiting == 0:
        values["idle_usage"] = stats.kv_usage
        values["idle_blocks"] = stats.blocks_used
    for window in windows:
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                window.gauge(name, value)


def _add_deltas(windows: Iterable[_Window], now: EngineReading, before: EngineReading,
                dt: float) -> None:
    deltas = {}
    for name in COUNTERS:
        value, previous = getattr(now, name), getattr(before, name)
        if value is not None and previous is not None:
            deltas[name] = max(0.0, value - previous)
    arrived = _arrivals(now, before)
    if arrived is not None:
        deltas["arrivals"] = arrived
    histograms = {}
    for name in HISTOGRAMS:
        value, previous = getattr(now, name), getattr(before, name)
        if value is not None and previous is not None:
            delta = bucket_delta(value, previous)
            if delta:
                histograms[name] = delta
    deltas |= _reuse_deltas(now, before)
    for window in windows:
        for name, delta in deltas.items():
            window.count(name, delta, dt)
        for name, buckets in histograms.items():
            window.histogram(name, buckets)


def _reuse_deltas(now: EngineReading, before: EngineReading) -> dict[str, float]:
    """Prompt tokens whose source is said, and of them those computed afresh: vLLM's
    prompt_tokens_by_source, else its computed-KV and prompt-length histograms."""
    sources, earlier = now.prompt_tokens_by_source_total, before.prompt_tokens_by_source_total
    if sources is not None and earlier is not None:
        total = sum(sources.values()) - sum(earlier.values())
        computed = sources.get(COMPUTED, 0.0) - earlier.get(COMPUTED, 0.0)
    elif (now.kv_computed and before.kv_computed and now.prompt_lengths
          and before.prompt_lengths):
        total = (now.prompt_lengths.sum or 0.0) - (before.prompt_lengths.sum or 0.0)
        computed = (now.kv_computed.sum or 0.0) - (before.kv_computed.sum or 0.0)
    else:
        return {}
    return {"prompt_sourced": max(0.0, total), "prompt_computed": max(0.0, computed)}


def _arrivals(now: EngineReading, before: EngineReading) -> float | None:
    """Requests that arrived between two scrapes: those finished, and the change in those
    running or waiting (the load offered, which a slower server does not lower). Not
    clipped here: the gauges and counters of one scrape may lag each other by a step, which
    the next window gives back."""
    if not now.finished_total or not before.finished_total:
        return None
    held = [r.running + r.waiting if r.running is not None and r.waiting is not None else None
            for r in (now, before)]
    if held[0] is None or held[1] is None:
        return None
    finished = sum(now.finished_total.values()) - sum(before.finished_total.values())
    return max(0.0, finished) + held[0] - held[1]


def engine_config(stats: EngineStats) -> dict[str, ConfigValue]:
    """The cache configuration a baseline keeps: what a change of explains most."""
    labels = stats.cache_config
    return {
        "num_gpu_blocks": _int(labels.get("num_gpu_blocks")),
        "blocks_total": stats.blocks_total, "block_size": stats.block_size,
        "kv_tokens_total": stats.tokens_total, "prefix_caching": stats.prefix_caching,
        "cache_dtype": labels.get("cache_dtype"),
        "gpu_memory_utilization": _float(labels.get("gpu_memory_utilization")),
    }


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _at_least_0(value: float | None) -> float | None:
    return None if value is None else max(0.0, value)


def _distribution(samples: list[float]) -> dict[str, float | None]:
    return {"p5": percentile(samples, 0.05), "p50": percentile(samples, 0.5),
            "p95": percentile(samples, 0.95), "max": max(samples, default=None),
            "mean": mean(samples), "samples": float(len(samples))}


def _engine_figures(total: _Window, minutes: list[tuple[int, _Window]], caching_off: bool
                    ) -> tuple[dict[str, Figure], dict[str, tuple[int, ...]]]:
    """The figures, and for each the minute of each of its per-minute values."""
    index: dict[str, tuple[int, ...]] = {}

    def series(key: str, value_of: Callable[[_Window], float | None]) -> tuple[float, ...]:
        values = [(m, value_of(w)) for m, w in minutes]
        index[key] = tuple(m for m, v in values if v is not None)
        return tuple(v for _, v in values if v is not None)

    usage, idle = total.samples("usage"), total.samples("idle_usage")
    figures = {
        "kv_usage": Figure(percentile(usage, 0.5), series(
            "kv_usage", lambda m: mean(m.samples("usage"))), _distribution(usage)),
        "idle_kv_usage": Figure(percentile(idle, 0.5), series(
            "idle_kv_usage", lambda m: percentile(m.samples("idle_usage"), 0.5)),
            {"max": max(idle, default=None), "samples": float(len(idle)),
             "blocks": percentile(total.samples("idle_blocks"), 0.5)}),
        "preemptions_per_min": Figure(
            total.rate("preemptions_total", MINUTE_S),
            series("preemptions_per_min", lambda m: m.rate("preemptions_total", MINUTE_S)),
            {"total": total.counts.get("preemptions_total")}),
        "hit_rate": Figure(total.hit_rate(caching_off),
                           series("hit_rate", lambda m: m.hit_rate(caching_off))),
        "reuse_share": Figure(total.reuse_share(), series("reuse_share",
                                                          lambda m: m.reuse_share())),
        "kv_limited": Figure(mean(total.samples("kv_limited")), series(
            "kv_limited", lambda m: mean(m.samples("kv_limited"))), _limits(total)),
        "prompt_tps": Figure(total.rate("prompt_tokens_total"),
                             series("prompt_tps", lambda m: m.rate("prompt_tokens_total"))),
        "generation_tps": Figure(total.rate("generation_tokens_total"), series(
            "generation_tps", lambda m: m.rate("generation_tokens_total"))),
        # the load offered, requests/s: what compare matches runs on (never judged alone)
        "arrivals_per_s": Figure(_at_least_0(total.rate("arrivals")), series(
            "arrivals_per_s", lambda m: _at_least_0(m.rate("arrivals")))),
    }
    for name in ("running", "waiting"):
        samples = total.samples(name)
        figures[name] = Figure(mean(samples), series(name, _gauge_mean(name)),
                               _distribution(samples))
    for name in HISTOGRAMS:
        observed = total.buckets(name)
        summary: dict[str, float | None] = (
            {"observations": observed[-1][1]} if observed else {})
        for label, q in QUANTILES:
            key = f"{name}_{label}"
            figures[key] = Figure(total.latency(name, q), series(key, _latency(name, q)),
                                  summary)
    return figures, index


def _gauge_mean(name: str) -> Callable[[_Window], float | None]:
    return lambda window: mean(window.samples(name))


def _latency(name: str, q: float) -> Callable[[_Window], float | None]:
    return lambda window: window.latency(name, q, MIN_LATENCY_OBSERVATIONS)


def _limits(window: _Window) -> dict[str, float | None]:
    """The share of scrapes each limit held the queue (docs/kv-anatomy.md)."""
    counts = {name.removeprefix("limit:"): float(len(values))
              for name, values in window.gauges.items() if name.startswith("limit:")}
    total = sum(counts.values())
    return {f"limit_{name}": count / total for name, count in sorted(counts.items())}


@dataclass
class _TargetRun:
    tracker: TargetTracker
    scrapes: int = 0
    failed: int = 0
    engines: dict[EngineKey, _EngineRun] = field(default_factory=dict)
    probe: ProbeSummary | None = None


@dataclass
class _GpuRun:
    reading: GpuReading  # the latest: name, total, where it is
    used: _Window = field(default_factory=_Window)
    minutes: dict[int, _Window] = field(default_factory=dict)


class Collector:
    """Folds a run into per-engine figures; :meth:`baseline` writes them up."""

    def __init__(self, *, leak_params: LeakParams | None = None,
                 minute_s: float = MINUTE_S) -> None:
        self.leak_params = leak_params
        self.minute_s = minute_s
        self.targets: dict[str, _TargetRun] = {}
        self.gpus: dict[tuple[str, str | None, str | None], _GpuRun] = {}
        self.span: tuple[float, float] | None = None  # the first and the last time seen

    def add_target(self, target: Target) -> None:
        if target.url not in self.targets:
            self.targets[target.url] = _TargetRun(TargetTracker(target,
                                                                leak_params=self.leak_params))

    def _minute(self, t: float) -> int:
        first, last = self.span or (t, t)
        self.span = (first, max(last, t))
        return math.floor((t - first) / self.minute_s)

    @property
    def good_scrapes(self) -> int:
        return sum(run.scrapes for run in self.targets.values())

    def feed(self, scrape: Scrape) -> None:
        self.add_target(scrape.target)
        run = self.targets[scrape.target.url]
        state = run.tracker.update(scrape)
        if not scrape.ok or state.last_good_t != scrape.t:
            run.failed += 1
            return
        run.scrapes += 1
        minute = self._minute(scrape.t)
        self.feed_gpus(scrape.t, state.gpus)  # a GPU exporter's count like the local ones
        readings = run.tracker.readings
        for stats in state.engines:
            key = (stats.model, stats.engine)
            engine = run.engines.get(key)
            if engine is None:
                engine = run.engines[key] = _EngineRun(stats.model, stats.engine, scrape.t)
            engine.add(scrape.t, minute, stats, readings[key])
            if stats.leak is not None:
                engine.verdict.observe(scrape.t, stats.leak)

    def feed_gpus(self, t: float, readings: Iterable[GpuReading]) -> None:
        """GPU readings (NVML, or an exporter's) at time t."""
        minute = self._minute(t)
        for gpu in readings:
            run = self.gpus.setdefault(gpu.key, _GpuRun(gpu))
            run.reading = gpu
            if gpu.memory_used_bytes is not None:
                for window in (run.used, run.minutes.setdefault(minute, _Window())):
                    window.gauge("used", float(gpu.memory_used_bytes))

    def set_probe(self, target: Target, probe: ProbeSummary) -> None:
        self.add_target(target)
        self.targets[target.url].probe = probe

    def baseline(self, *, name: str | None, source: dict[str, ConfigValue],
                 interval_s: float) -> Baseline:
        targets = []
        for url, run in self.targets.items():
            state = run.tracker.state
            targets.append(TargetSummary(
                target=url, kind=state.kind, version=state.version,
                version_inferred=state.version_inferred, scrapes=run.scrapes,
                failed_scrapes=run.failed, probe=run.probe,
                engines=[e.summary(self.minute_s) for e in run.engines.values()]))
        duration = self.span[1] - self.span[0] if self.span else 0.0
        return Baseline(
            name=name, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            kvtop_version=__version__, source=source, interval_s=interval_s,
            duration_s=duration, minute_s=self.minute_s, targets=targets,
            gpus=[self._gpu_summary(g) for g in self.gpus.values()])

    def _gpu_summary(self, run: _GpuRun) -> GpuSummary:
        used = run.used.samples("used")
        per_minute = tuple(v for _, w in sorted(run.minutes.items())
                           if (v := mean(w.samples("used"))) is not None)
        figure = Figure(percentile(used, 0.5), per_minute,
                        {"max": max(used, default=None), "samples": float(len(used))})
        gpu = run.reading
        return GpuSummary(gpu.index, gpu.name, gpu.memory_total_bytes, figure, uuid=gpu.uuid,
                          host=gpu.host, source=gpu.source)


def summarise(scrapes: Iterable[Scrape], *, targets: Iterable[Target] = (),
              name: str | None, source: dict[str, ConfigValue], interval_s: float,
              leak_params: LeakParams | None = None, in_time_order: bool = False) -> Baseline:
    """Recorded scrapes summarised as ``baseline save --from`` does: sorted first unless
    ``in_time_order`` (a streamed recording, never held whole)."""
    collector = Collector(leak_params=leak_params)
    for target in targets:
        collector.add_target(target)
    for scrape in scrapes if in_time_order else sorted(scrapes, key=lambda s: s.t):
        collector.feed(scrape)
    return collector.baseline(name=name, source=source, interval_s=interval_s)
