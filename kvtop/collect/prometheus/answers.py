"""Prometheus's answers, read as untrusted: shape checked where they are read, quotes of what
it said masked before they are cut, and the samples of a query grouped per instance and
scrape.

An answer not shaped like the API's (``data`` not an object, a series that is not
``{"metric": {str: str}, "values": [[t, "v"], ...]}``, a time that is not a finite number)
is a :class:`PrometheusError` (``bad_payload``) with the reason; label names and values are
kept as sent (any string: they are shown only through ``kvtop/safe_text.py``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from kvtop.collect.bounded import BoundedCache
from kvtop.collect.exposition import Sample, new_sample
from kvtop.collect.target import FailureKind, Secret
from kvtop.safe_text import mask

InstanceKey = tuple[str, str]  # (job, instance)
_INSTANCE_LABELS = frozenset({"__name__", "job", "instance"})
MAX_CACHED_HEADS = 50_000  # a refresh of 500 engines names ~45,000 series
MAX_CACHED_HEAD_CHARS = 32 << 20  # ~300 characters each
# Per series' label pairs: its name and labels without the instance's own (shared dicts).
_heads = BoundedCache(MAX_CACHED_HEADS, MAX_CACHED_HEAD_CHARS)
QUOTE_CHARS = 200  # of Prometheus's own error messages


def quote(said: object, token: Secret | None) -> str:
    """A short quote of what Prometheus said (an ``error``, a ``lastError``): one line,
    masked (a header echoed in JSON escapes, or cut by a proxy) and only then cut to
    ``QUOTE_CHARS``."""
    return mask(" ".join(str(said).split()), token)[:QUOTE_CHARS]


class PrometheusError(Exception):
    """Prometheus could not be read, or knows no inference server; the message says why."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


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


def last_errors(data: Any, token: Secret | None) -> dict[InstanceKey, str]:
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


