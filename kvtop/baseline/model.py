"""A baseline in memory, and its file format, version 1 (docs/baseline-format.md).

The same structure describes a saved baseline and the run it is compared with, so every
input of ``kvtop compare`` (a live run, a recording, another baseline) is compared by one
function. Reading a file checks every value's type on the way in: a truncated, hand-edited
or hostile file is refused with a message naming the bad field, never a crash later.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from kvtop.contract import json_number
from kvtop.safe_text import json_text

FORMAT, VERSION = "kvtop-baseline", 1
ConfigValue = str | int | float | bool | None


class BaselineError(ValueError):
    """A file that is not a usable kvtop baseline; the message says why."""


@dataclass(frozen=True, slots=True)
class Figure:
    """A headline value, the values the rank test compares (per minute, or per probe
    request) and summary numbers (p5, p50, p95, max, mean...). None: not known."""

    value: float | None
    values: tuple[float, ...] = ()
    summary: dict[str, float | None] = field(default_factory=dict)

    def to_json(self, series: str = "per_minute") -> dict[str, Any]:
        return {"value": json_number(self.value), **{k: json_number(v) for k, v in
                                                      self.summary.items()},
                series: [json_number(v) for v in self.values]}


MISSING = Figure(None)


@dataclass(slots=True)
class EngineSummary:
    model: str | None
    engine: str | None
    config: dict[str, ConfigValue] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    samples: int = 0  # good scrapes of this engine
    minutes: int = 0  # per-minute values behind the figures (the most any figure has)
    duration_s: float = 0.0
    leak: str = "unknown"  # the leak detector's worst state: unknown, ok, watch, leak
    leak_reason: str = ""
    restarts: int = 0
    # per figure, the minute (0 = the run's first) of each per-minute value: what lines a
    # figure up with the load of its minute; empty in baselines saved before it was kept
    minute_index: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def figure(self, key: str) -> Figure:
        return self.figures.get(key, MISSING)


@dataclass(slots=True)
class ProbeSummary:
    """The fixed request, sent ``requests`` times; the figures hold one value per answer."""

    model: str
    prompt: str  # "text" or "token_ids": the form the server took
    max_tokens: int
    prompt_tokens: int | None
    requests: int
    failed: int
    figures: dict[str, Figure] = field(default_factory=dict)
    error: str | None = None  # the last failure's reason


@dataclass(slots=True)
class TargetSummary:
    target: str
    kind: str | None = None
    version: str | None = None
    version_inferred: bool = False  # guessed from the metric names, not read from /version
    scrapes: int = 0
    failed_scrapes: int = 0
    engines: list[EngineSummary] = field(default_factory=list)
    probe: ProbeSummary | None = None


@dataclass(slots=True)
class GpuSummary:
    """One GPU of the run: local (NVML) or from an exporter a target serves."""

    index: int | None
    name: str
    memory_total_bytes: int | None
    memory_used: Figure = MISSING
    uuid: str = ""
    host: str | None = None  # an exporter's host label; None: the machine kvtop ran on
    source: str = "nvml"

    @property
    def place(self) -> tuple[str | None, str]:
        """Where the GPU sits (host, slot): what a swap keeps and a new UUID doesn't."""
        return self.host, f"#{self.index}" if self.index is not None else self.uuid


@dataclass(slots=True)
class Baseline:
    name: str | None
    created: str  # ISO-8601
    kvtop_version: str
    source: dict[str, ConfigValue]  # kind: live | recording; recording; time_scale
    interval_s: float
    duration_s: float
    minute_s: float
    targets: list[TargetSummary] = field(default_factory=list)
    gpus: list[GpuSummary] = field(default_factory=list)

    def engines(self) -> list[tuple[TargetSummary, EngineSummary]]:
        return [(target, engine) for target in self.targets for engine in target.engines]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "name": self.name,
                "created": self.created, "kvtop_version": self.kvtop_version,
                "source": self.source, "interval_s": self.interval_s,
                "duration_s": json_number(self.duration_s, 3), "minute_s": self.minute_s,
                "targets": [_target_json(t) for t in self.targets],
                "gpus": [_gpu_json(g) for g in self.gpus]}

    def dumps(self) -> str:
        """The file's text: compact (``kvtop baseline show --json`` pretty-prints it)."""
        return json_text(self.to_json(), separators=(",", ":"), allow_nan=False) + "\n"


def _engine_json(engine: EngineSummary) -> dict[str, Any]:
    return {"model": engine.model, "engine": engine.engine, "samples": engine.samples,
            "minutes": engine.minutes, "duration_s": json_number(engine.duration_s, 3),
            "restarts": engine.restarts, "config": engine.config,
            "leak": {"verdict": engine.leak, "reason": engine.leak_reason},
            "figures": {k: f.to_json() for k, f in engine.figures.items()},
            "minute_index": {k: list(v) for k, v in engine.minute_index.items()}}


def _probe_json(probe: ProbeSummary) -> dict[str, Any]:
    return {"model": probe.model, "prompt": probe.prompt, "max_tokens": probe.max_tokens,
            "prompt_tokens": probe.prompt_tokens, "requests": probe.requests,
            "failed": probe.failed, "error": probe.error,
            "figures": {k: f.to_json("per_request") for k, f in probe.figures.items()}}


def _target_json(target: TargetSummary) -> dict[str, Any]:
    return {"target": target.target, "server": {"kind": target.kind, "version": target.version,
                                                "version_inferred": target.version_inferred},
            "scrapes": target.scrapes, "failed_scrapes": target.failed_scrapes,
            "engines": [_engine_json(e) for e in target.engines],
            "probe": None if target.probe is None else _probe_json(target.probe)}


def _gpu_json(gpu: GpuSummary) -> dict[str, Any]:
    return {"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "host": gpu.host,
            "source": gpu.source, "memory_total_bytes": gpu.memory_total_bytes,
            "memory_used_bytes": gpu.memory_used.to_json()}


# -- reading ------------------------------------------------------------------------------


class _Reader:
    """Typed access to a parsed document; every failure names the field."""

    def __init__(self, data: Any, where: str = "") -> None:
        if not isinstance(data, dict):  # the document itself is checked before
            raise BaselineError(f"{where}: expected an object")
        self.data, self.where = data, where

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, kinds: tuple[type, ...], what: str, optional: bool) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        # True is an int to Python, not to a reader of this format
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise BaselineError(f"{self._name(key)}: expected {what}")
        return value

    def text(self, key: str, optional: bool = False) -> str | None:
        return self._get(key, (str,), "text", optional)

    def number(self, key: str, optional: bool = False) -> float | None:
        value = self._get(key, (int, float), "a number", optional)
        if value is not None and not math.isfinite(value):
            raise BaselineError(f"{self._name(key)}: expected a finite number")
        return None if value is None else float(value)

    def integer(self, key: str, optional: bool = False) -> int | None:
        return self._get(key, (int,), "a whole number", optional)

    def items(self, key: str) -> list[_Reader]:
        values = self._get(key, (list,), "a list", optional=True) or []
        return [_Reader(v, f"{self._name(key)}[{i}]") for i, v in enumerate(values)]

    def child(self, key: str, optional: bool = False) -> _Reader | None:
        value = self._get(key, (dict,), "an object", optional)
        return None if value is None else _Reader(value, self._name(key))

    def numbers(self, key: str) -> tuple[float, ...]:
        values = self._get(key, (list,), "a list of numbers", optional=True) or []
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) for v in values):
            raise BaselineError(f"{self._name(key)}: expected a list of numbers")
        return tuple(float(v) for v in values)

    def scalars(self, key: str) -> dict[str, ConfigValue]:
        table = self._get(key, (dict,), "an object", optional=True) or {}
        bad = [k for k, v in table.items()
               if not isinstance(v, (str, int, float, bool, type(None)))
               or (isinstance(v, float) and not math.isfinite(v))]
        if bad:
            raise BaselineError(f"{self._name(key)}.{bad[0]}: expected a plain value")
        return dict(table)


def _figure(reader: _Reader, series: str) -> Figure:
    summary = {k: reader.number(k, optional=True) for k in reader.data
               if k not in ("value", series)}
    return Figure(reader.number("value", optional=True), reader.numbers(series), summary)


def _figures(reader: _Reader, series: str = "per_minute") -> dict[str, Figure]:
    table = reader.child("figures", optional=True)
    if table is None:
        return {}
    return {key: _figure(sub, series) for key in table.data
            if (sub := table.child(key)) is not None}


def _minute_index(reader: _Reader, figures: dict[str, Figure]) -> dict[str, tuple[int, ...]]:
    """Each figure's minute numbers; one that does not line up with its values (a hand-edited
    file) is refused, since a comparison at matched load would pair the wrong minutes."""
    table = reader.child("minute_index", optional=True)
    if table is None:
        return {}
    out = {}
    for key in table.data:
        minutes = table.numbers(key)
        if any(m != int(m) or m < 0 for m in minutes) or len(minutes) != len(
                figures.get(key, MISSING).values):
            raise BaselineError(f"{table._name(key)}: expected a minute (a whole number >= 0) "
                                "for each per-minute value")
        out[key] = tuple(int(m) for m in minutes)
    return out


def _engine(reader: _Reader) -> EngineSummary:
    leak = reader.child("leak", optional=True)
    figures = _figures(reader)
    return EngineSummary(
        model=reader.text("model", optional=True), engine=reader.text("engine", optional=True),
        config=reader.scalars("config"), figures=figures,
        samples=reader.integer("samples", optional=True) or 0,
        minutes=reader.integer("minutes", optional=True) or 0,
        duration_s=reader.number("duration_s", optional=True) or 0.0,
        leak=(leak.text("verdict", optional=True) if leak else None) or "unknown",
        leak_reason=(leak.text("reason", optional=True) if leak else None) or "",
        restarts=reader.integer("restarts", optional=True) or 0,
        minute_index=_minute_index(reader, figures))


def _probe(reader: _Reader | None) -> ProbeSummary | None:
    if reader is None:
        return None
    return ProbeSummary(
        model=reader.text("model") or "", prompt=reader.text("prompt") or "text",
        max_tokens=reader.integer("max_tokens") or 0,
        prompt_tokens=reader.integer("prompt_tokens", optional=True),
        requests=reader.integer("requests") or 0, failed=reader.integer("failed") or 0,
        figures=_figures(reader, "per_request"), error=reader.text("error", optional=True))


def _target(reader: _Reader) -> TargetSummary:
    server = reader.child("server", optional=True)
    return TargetSummary(
        target=reader.text("target") or "",
        kind=server.text("kind", optional=True) if server else None,
        version=server.text("version", optional=True) if server else None,
        version_inferred=bool(server.data.get("version_inferred") is True) if server else False,
        scrapes=reader.integer("scrapes", optional=True) or 0,
        failed_scrapes=reader.integer("failed_scrapes", optional=True) or 0,
        engines=[_engine(e) for e in reader.items("engines")],
        probe=_probe(reader.child("probe", optional=True)))


def _gpu(reader: _Reader) -> GpuSummary:
    used = reader.child("memory_used_bytes", optional=True)
    return GpuSummary(
        index=reader.integer("index", optional=True), name=reader.text("name") or "",
        memory_total_bytes=reader.integer("memory_total_bytes", optional=True),
        memory_used=_figure(used, "per_minute") if used else MISSING,
        uuid=reader.text("uuid", optional=True) or "",
        host=reader.text("host", optional=True),
        source=reader.text("source", optional=True) or "nvml")


def baseline_from_json(data: Any) -> Baseline:
    """A parsed document as a :class:`Baseline`; :class:`BaselineError` if it is not one
    this kvtop reads."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(f"not a kvtop baseline (no \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BaselineError(f"baseline format version {version!r} is not one kvtop writes")
    if version > VERSION:
        raise BaselineError(f"baseline format version {version} is newer than this kvtop "
                            f"reads ({VERSION}); upgrade kvtop, or save the baseline again")
    reader = _Reader(data)
    return Baseline(
        name=reader.text("name", optional=True), created=reader.text("created") or "",
        kvtop_version=reader.text("kvtop_version", optional=True) or "?",
        source=reader.scalars("source"), interval_s=reader.number("interval_s") or 0.0,
        duration_s=reader.number("duration_s") or 0.0,
        minute_s=reader.number("minute_s", optional=True) or 60.0,
        targets=[_target(t) for t in reader.items("targets")],
        gpus=[_gpu(g) for g in reader.items("gpus")])


def loads(text: str) -> Baseline:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BaselineError(f"not a complete JSON document (cut off?): {exc}") from None
    return baseline_from_json(data)
