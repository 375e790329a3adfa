"""A baseline in the live app: what each engine's baseline was (the band and lines the views
draw) and how the last minutes compare with it (the table's Δ column).

The app hands every folded scrape to :meth:`BaselineOverlay.observe`; it keeps, per engine,
KV usage and the TTFT histogram over the last ``window_s`` (10 minutes, the length of a
default baseline), so "now" is a median and a quantile over a window like the baseline's,
not one noisy scrape. The views ask for :meth:`band` and :meth:`delta`; no widget computes
anything. Engines are matched to the baseline's as ``kvtop compare`` matches them; an engine
of a model the baseline does not hold gets no band.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from kvtop.baseline import store
from kvtop.baseline.compare import match_engine
from kvtop.baseline.figures import SPECS, FigureSpec
from kvtop.baseline.model import Baseline, BaselineError
from kvtop.collect.reading import EngineReading, Histogram
from kvtop.config import ConfigError
from kvtop.derive.quantiles import bucket_delta, quantile
from kvtop.derive.samples import percentile
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey

WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class Band:
    """One engine's baseline, as the views draw it. Usage is a fraction of the pool; the
    rest in the figures' units. None: the baseline does not know it."""

    name: str
    kv_p5: float | None
    kv_p50: float | None
    kv_p95: float | None
    blocks_total: int | None
    running: float | None
    waiting: float | None
    hit_rate: float | None
    prompt_tps: float | None
    generation_tps: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None

    def blocks(self, usage: float | None, pool: int | None = None) -> float | None:
        """A usage as blocks of ``pool`` (the pool now; else the baseline's): the same
        fullness, on the axis of a plot that counts blocks. A pool resized since the
        baseline is a config change; its fullness is what compares."""
        size = pool or self.blocks_total
        return None if usage is None or size is None else usage * size


@dataclass(frozen=True, slots=True)
class Delta:
    """The last window against the baseline: KV p50 in points, TTFT p99 relative."""

    kv_p50: float | None
    kv_points: float | None  # now - baseline, in fractions of the pool
    ttft_p99: float | None
    ttft_change: float | None  # now / baseline - 1
    kv_worse: bool = False  # beyond the smallest change that matters (figures.SPECS)
    ttft_worse: bool = False
    kv_better: bool = False
    ttft_better: bool = False


@dataclass(slots=True)
class _Window:
    times: deque[float] = field(default_factory=deque)
    usage: deque[float | None] = field(default_factory=deque)
    ttft: deque[Histogram | None] = field(default_factory=deque)
    restarts: deque[float] = field(default_factory=deque)
    cached: tuple[float, Delta] | None = None

    def add(self, t: float, stats: EngineStats, reading: EngineReading | None,
            window_s: float) -> None:
        self.times.append(t)
        self.usage.append(stats.kv_usage)
        self.ttft.append(reading.ttft if reading is not None else None)
        if stats.restarted:
            self.restarts.append(t)
        while self.times and t - self.times[0] > window_s:
            self.times.popleft()
            self.usage.popleft()
            self.ttft.popleft()
        while self.restarts and self.restarts[0] < self.times[0]:
            self.restarts.popleft()

    def kv_p50(self) -> float | None:
        return percentile([u for u in self.usage if u is not None], 0.5)

    def ttft_p99(self) -> float | None:
        """p99 of the TTFTs observed in the window (since the last restart in it)."""
        start = bisect.bisect_left(list(self.times), self.restarts[-1]) if self.restarts else 0
        first = next((h for h in list(self.ttft)[start:] if h is not None), None)
        last = self.ttft[-1]
        if first is None or last is None or first is last:
            return None
        # no buckets (they changed) or no answer in them: quantile says None
        return quantile(0.99, bucket_delta(last, first) or [])


def baseline_overlay(default: str | None,
                     per_target: dict[str, str]) -> BaselineOverlay | None:
    """The baselines the app draws: ``default`` (--baseline) for every target, the config's
    per target; None when there are none. ConfigError, before the app starts, when one can't
    be read."""
    if default is None and not per_target:
        return None
    try:
        return BaselineOverlay.load(per_target, default)
    except BaselineError as exc:
        raise ConfigError(f"baseline: {exc}") from None


class BaselineOverlay:
    """Baselines by target URL (and one for every other target); see the module's notes."""

    def __init__(self, baselines: dict[str, Baseline] | None = None,
                 default: Baseline | None = None, *, window_s: float = WINDOW_S) -> None:
        self.baselines = baselines or {}
        self.default = default
        self.window_s = window_s
        self._bands: dict[tuple[str, EngineKey], Band | None] = {}
        self._windows: dict[tuple[str, EngineKey], _Window] = {}

    @classmethod
    def load(cls, per_target: dict[str, str], default: str | None) -> BaselineOverlay:
        """Read the baselines named (``--baseline NAME``, a target's ``baseline`` in the
        config); BaselineError, before the app starts, when one can't be used."""
        loaded: dict[str, Baseline] = {}
        for name in {*per_target.values(), *([default] if default else [])}:
            loaded[name] = store.load(name)
        return cls({url: loaded[name] for url, name in per_target.items()},
                   loaded[default] if default else None)

    def __bool__(self) -> bool:
        return bool(self.baselines) or self.default is not None

    def baseline_for(self, url: str) -> Baseline | None:
        return self.baselines.get(url, self.default)

    def band(self, url: str, key: EngineKey) -> Band | None:
        if (url, key) not in self._bands:
            self._bands[(url, key)] = self._make_band(url, key)
        return self._bands[(url, key)]

    def _make_band(self, url: str, key: EngineKey) -> Band | None:
        baseline = self.baseline_for(url)
        matched = match_engine(baseline, url, *key) if baseline is not None else None
        if baseline is None or matched is None:
            return None
        engine = matched[1]
        kv = engine.figure("kv_usage")
        figure = engine.figure
        blocks = engine.config.get("blocks_total")
        return Band(
            name=baseline.name or "baseline", kv_p5=kv.summary.get("p5"),
            kv_p50=kv.value, kv_p95=kv.summary.get("p95"),
            blocks_total=blocks if isinstance(blocks, int) else None,
            running=figure("running").value, waiting=figure("waiting").value,
            hit_rate=figure("hit_rate").value, prompt_tps=figure("prompt_tps").value,
            generation_tps=figure("generation_tps").value,
            ttft_p50=figure("ttft_p50").value, ttft_p99=figure("ttft_p99").value,
            itl_p50=figure("itl_p50").value)

    def observe(self, url: str, t: float, engines: list[EngineStats],
                readings: dict[EngineKey, EngineReading]) -> None:
        """One good scrape of ``url``, after its tracker folded it."""
        if self.baseline_for(url) is None:
            return
        for stats in engines:
            key = (stats.model, stats.engine)
            window = self._windows.setdefault((url, key), _Window())
            window.add(t, stats, readings.get(key), self.window_s)

    def delta(self, url: str, key: EngineKey) -> Delta | None:
        band = self.band(url, key)
        window = self._windows.get((url, key))
        if band is None or window is None or not window.times:
            return None
        if window.cached is not None and window.cached[0] == window.times[-1]:
            return window.cached[1]  # one computation per scrape, however often it's drawn
        delta = _delta(band, window.kv_p50(), window.ttft_p99())
        window.cached = (window.times[-1], delta)
        return delta

    def clear(self) -> None:
        """Forget the windows (a replay rewound); the bands stay."""
        self._windows.clear()


def _delta(band: Band, kv_now: float | None, ttft_now: float | None) -> Delta:
    kv_points = None if kv_now is None or band.kv_p50 is None else kv_now - band.kv_p50
    ttft_change = None
    if ttft_now is not None and band.ttft_p99:
        ttft_change = ttft_now / band.ttft_p99 - 1
    kv_spec, ttft_spec = SPECS["kv_usage"], SPECS["ttft_p99"]

    def beyond(change: float | None, base: float | None, spec: FigureSpec, sign: int) -> bool:
        """The change matters (the smallest change compare counts), in direction ``sign``."""
        if change is None or base is None:
            return False
        limit = max(spec.floor, spec.rel * abs(base))
        return sign * change >= limit - 1e-9 * limit  # at the limit, whatever the float says

    ttft_abs = None if ttft_now is None or band.ttft_p99 is None else ttft_now - band.ttft_p99
    return Delta(
        kv_p50=kv_now, kv_points=kv_points, ttft_p99=ttft_now, ttft_change=ttft_change,
        kv_worse=beyond(kv_points, band.kv_p50, kv_spec, 1),
        ttft_worse=beyond(ttft_abs, band.ttft_p99, ttft_spec, 1),
        kv_better=beyond(kv_points, band.kv_p50, kv_spec, -1),
        ttft_better=beyond(ttft_abs, band.ttft_p99, ttft_spec, -1))
