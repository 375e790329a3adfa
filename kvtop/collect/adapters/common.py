"""Helpers shared by the engine adapters: grouping series by engine, histograms, and the
conversions that refuse a number no server sends."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping

from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.reading import EngineReading, Histogram

EngineKey = tuple[str | None, str | None]  # (model, engine)
KeyOf = Callable[[Sample], EngineKey]

# Engines (KV pools) one target may have: vLLM's largest data-parallel deployments behind
# one API server have 64-128; a server naming more is broken or hostile, and the rest are
# left out (``ServerReading.engines_over_cap`` counts them).
MAX_ENGINES = 256
# A block or token count past this is no KV pool (a large one holds ~10**7 tokens).
MAX_COUNT = 2**40
# Label values kept per engine in a by-label family (reasons, tiers, stages): servers send
# 2-5; a server inventing more has the rest summed under OTHER, each name cut to LABEL_CHARS.
MAX_LABEL_VALUES = 8
LABEL_CHARS = 40
OTHER = "other"


class BadValue(ValueError):
    """A value no working server sends (an infinite pool, 10**308 blocks): the target's
    answer is refused with this message, which names the value."""


def whole_number(value: float, what: str) -> int | None:
    """A count (blocks, tokens) from a float: None for NaN ("no value", as everywhere) or
    less than 1 (not set, as vLLM writes before it has profiled); BadValue when it is
    infinite or past MAX_COUNT."""
    if math.isnan(value) or value < 1:
        return None
    if value > MAX_COUNT:  # +Inf too
        raise BadValue(f"{what} is not a usable count")
    return int(value)


def histogram_names(base: str) -> tuple[str, str, str]:
    return f"{base}_bucket", f"{base}_count", f"{base}_sum"


def finite(value: float) -> float | None:
    """NaN or ±Inf from a server is "no value", not a number to show."""
    return value if math.isfinite(value) else None


# The reducers run a dozen times per scrape: one pass each, no lists in between.


def summed(expo: Exposition, name: str, key_of: KeyOf) -> dict[EngineKey, float]:
    """A counter or gauge summed per engine over its other labels (ranks, reasons…);
    NaN and ±Inf are left out, and an engine with nothing else gets no entry."""
    totals: dict[EngineKey, float] = {}
    for sample in expo.series(name):
        value = sample.value
        if math.isfinite(value):
            key = key_of(sample)
            totals[key] = totals.get(key, 0.0) + value
    return totals


def maxed(expo: Exposition, name: str, key_of: KeyOf) -> dict[EngineKey, float]:
    """A gauge per engine; several series of one engine (TP ranks) give their maximum."""
    out: dict[EngineKey, float] = {}
    for sample in expo.series(name):
        value = sample.value
        if math.isfinite(value):
            key = key_of(sample)
            known = out.get(key)
            out[key] = value if known is None or value > known else known
    return out


def by_label(expo: Exposition, name: str, key_of: KeyOf,
             label: str) -> dict[EngineKey, dict[str, float]]:
    """A family summed per engine and per value of ``label`` (at most MAX_LABEL_VALUES
    names per engine, the rest under OTHER); NaN and ±Inf are left out."""
    out: dict[EngineKey, dict[str, float]] = {}
    for sample in expo.series(name):
        if not math.isfinite(sample.value):
            continue
        values = out.setdefault(key_of(sample), {})
        value = (sample.labels.get(label) or "")[:LABEL_CHARS]
        if value not in values and len(values) >= MAX_LABEL_VALUES - 1 and value != OTHER:
            value = OTHER
        values[value] = values.get(value, 0.0) + sample.value
    return out


def histograms(expo: Exposition, base: str, key_of: KeyOf) -> dict[EngineKey, Histogram]:
    """Cumulative histograms per engine, buckets summed over any other labels."""
    bucket_name, count_name, sum_name = histogram_names(base)
    buckets: dict[EngineKey, dict[float, float]] = {}
    for sample in expo.series(bucket_name):
        bound = _bound(sample.labels.get("le"))
        if bound is None:
            continue
        per_key = buckets.get(key := key_of(sample))
        if per_key is None:
            per_key = buckets[key] = {}
        per_key[bound] = per_key.get(bound, 0.0) + sample.value
    counts = summed(expo, count_name, key_of)
    sums = summed(expo, sum_name, key_of)
    return {
        key: Histogram(tuple(sorted(per_key.items())), counts.get(key), sums.get(key))
        for key, per_key in buckets.items()
    }


def histogram_totals(expo: Exposition, base: str, key_of: KeyOf) -> dict[EngineKey, Histogram]:
    """A histogram's count and sum per engine, without its buckets (a narrowed read need not
    ask for them when only a mean is wanted)."""
    _, count_name, sum_name = histogram_names(base)
    counts, sums = summed(expo, count_name, key_of), summed(expo, sum_name, key_of)
    return {key: Histogram((), counts[key], sums[key]) for key in counts.keys() & sums.keys()}


@functools.lru_cache(maxsize=1024)
def _bound(le: str | None) -> float | None:
    """A bucket's upper bound; servers repeat the same few dozen every scrape."""
    if le is None:
        return None
    try:
        return float(le)
    except ValueError:
        return None


class EngineReadings(dict[EngineKey, EngineReading]):
    """The readings of one scrape's first MAX_ENGINES engines; ``over_cap`` counts the
    engines left out."""

    over_cap: int = 0


def _order(key: EngineKey) -> tuple[str, int, str]:
    """Model, then engine number ("10" after "9"; a non-number such as "²" or one of
    thousands of digits sorts first)."""
    model, engine = key
    number = -1
    if engine is not None and engine.isascii() and engine.isdigit() and len(engine) <= 18:
        number = int(engine)
    return (model or "", number, engine or "")


def engine_readings(keys: Iterable[EngineKey]) -> EngineReadings:
    """One empty reading per engine key, in a stable order, at most MAX_ENGINES of them."""
    ordered = sorted(set(keys), key=_order)
    readings = EngineReadings(
        (key, EngineReading(model=key[0], engine=key[1])) for key in ordered[:MAX_ENGINES])
    readings.over_cap = max(0, len(ordered) - MAX_ENGINES)
    return readings


def assign(readings: dict[EngineKey, EngineReading], field: str,
           values: Mapping[EngineKey, float] | Mapping[EngineKey, Histogram]) -> None:
    for key, value in values.items():
        if key in readings:
            setattr(readings[key], field, value)


Reducer = Callable[[Exposition, str, KeyOf], dict[EngineKey, float]]


def assign_all(readings: dict[EngineKey, EngineReading], expo: Exposition, key_of: KeyOf,
               table: Iterable[tuple[str, Reducer, str]]) -> None:
    """Fill reading fields from (field, summed or maxed, metric name) rows."""
    for field, reduce, name in table:
        assign(readings, field, reduce(expo, name, key_of))
