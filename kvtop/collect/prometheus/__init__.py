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

The parts: ``promql`` (every query, values quoted as PromQL strings), ``api`` (the HTTP
calls and settings), ``answers`` (the shape checks, grouping and quotes of what Prometheus
said) and ``source`` (discovery, backfill, refresh, and the bounds on instances).
"""

from kvtop.collect.prometheus.answers import (
    MAX_CACHED_HEAD_CHARS,
    MAX_CACHED_HEADS,
    QUOTE_CHARS,
    InstanceKey,
    PrometheusError,
    group_scrapes,
    parse_retention,
    series_points,
)
from kvtop.collect.prometheus.api import (
    MAX_ANSWER_BYTES,
    OFF_LOOP_BYTES,
    PrometheusAPI,
    PrometheusSettings,
    load_settings,
)
from kvtop.collect.prometheus.promql import selector_matchers, vector_selector
from kvtop.collect.prometheus.source import (
    BACKFILL_NAMES,
    DEFAULT_BACKFILL_STEP_S,
    FORGET_AFTER_S,
    INGEST_LAG_S,
    MAX_INSTANCES,
    MAX_POINTS,
    OFF_LOOP_SERIES,
    PROMETHEUS_INTERVAL_S,
    TARGETS_CACHE_S,
    PrometheusSource,
    target_for,
)

__all__ = [
    "BACKFILL_NAMES", "DEFAULT_BACKFILL_STEP_S", "FORGET_AFTER_S", "INGEST_LAG_S",
    "MAX_ANSWER_BYTES", "MAX_CACHED_HEADS", "MAX_CACHED_HEAD_CHARS", "MAX_INSTANCES",
    "MAX_POINTS", "OFF_LOOP_BYTES", "OFF_LOOP_SERIES", "PROMETHEUS_INTERVAL_S", "QUOTE_CHARS",
    "TARGETS_CACHE_S", "InstanceKey", "PrometheusAPI", "PrometheusError",
    "PrometheusSettings", "PrometheusSource", "group_scrapes", "load_settings",
    "parse_retention", "selector_matchers", "series_points", "target_for",
    "vector_selector",
]
