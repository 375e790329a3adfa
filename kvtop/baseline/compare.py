"""Judge a run against a baseline: config changes first, then each figure better, same or
worse beyond run-to-run noise (``kvtop.baseline.judge``), the figures the load drives at
matched load when the load changed (``kvtop.baseline.matched_load``), and the leak detector
(docs/baseline-format.md, "How compare judges")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtop.baseline.figures import ENGINE_FIGURES, GPU_MEMORY, PROBE_FIGURES
from kvtop.baseline.judge import (
    ALPHA,
    DESIGN_EFFECT,
    MIN_VALUES,
    NOISE_Z,
    FigureResult,
    Verdict,
    judge,
)
from kvtop.baseline.matched_load import (
    LOAD_DRIVEN,
    at_matched_load,
    common_range,
    load_figure,
    load_per_minute,
    load_spec,
)
from kvtop.baseline.model import (
    Baseline,
    BaselineError,
    ConfigValue,
    EngineSummary,
    Figure,
    ProbeSummary,
    TargetSummary,
)
from kvtop.contract import json_number
from kvtop.exits import EXIT_NO_DATA, EXIT_OK, EXIT_WORSE

COMPARE_VERSION = 1
CONFIG_LABELS: dict[str, str] = {
    "kind": "server", "version": "server version", "num_gpu_blocks": "KV blocks (num_gpu_blocks)",
    "blocks_total": "usable KV blocks", "kv_tokens_total": "KV capacity (tokens)",
    "block_size": "block size (tokens)", "prefix_caching": "prefix caching",
    "cache_dtype": "KV cache dtype", "gpu_memory_utilization": "gpu_memory_utilization",
    "name": "GPU", "memory_total_bytes": "GPU memory (bytes)",
}
# Follow from num_gpu_blocks and block size: listed only when those did not change.
DERIVED = {"blocks_total": "num_gpu_blocks", "kv_tokens_total": "num_gpu_blocks"}


class ModelMismatch(BaselineError):
    """The run serves none of the baseline's models: comparing them would mean nothing."""


@dataclass(frozen=True, slots=True)
class ConfigChange:
    key: str
    baseline: ConfigValue
    now: ConfigValue

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": CONFIG_LABELS.get(self.key, self.key),
                "baseline": self.baseline, "now": self.now}


def config_changes(base: dict[str, ConfigValue],
                   now: dict[str, ConfigValue]) -> list[ConfigChange]:
    """Settings known on both sides that differ (unknown on one side is not a change)."""
    changed = [ConfigChange(key, base[key], now[key]) for key in CONFIG_LABELS
               if base.get(key) is not None and now.get(key) is not None
               and base[key] != now[key]]
    moved = {change.key for change in changed}
    return [c for c in changed if DERIVED.get(c.key) not in moved]


@dataclass(slots=True)
class EngineComparison:
    target: str
    baseline_target: str
    model: str | None
    engine: str | None
    config_changes: list[ConfigChange]
    figures: list[FigureResult]
    leak_baseline: str
    leak_now: str
    leak_reason: str
    load: FigureResult | None = None  # the token throughput, judged as a load figure
    load_range: tuple[float, float] | None = None  # the load both runs covered

    @property
    def leak_verdict(self) -> Verdict:
        if self.leak_now == "leak" and self.leak_baseline != "leak":
            return "worse"
        if self.leak_baseline == "leak" and self.leak_now in ("ok", "watch"):
            return "better"
        return "unknown" if "unknown" in (self.leak_now, self.leak_baseline) else "same"

    def verdicts(self) -> list[Verdict]:
        return [f.verdict for f in self.figures] + [self.leak_verdict]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "baseline_target": self.baseline_target,
                "model": self.model, "engine": self.engine,
                "verdict": overall(self.verdicts()),
                "config_changes": [c.to_json() for c in self.config_changes],
                "leak": {"baseline": self.leak_baseline, "now": self.leak_now,
                         "verdict": self.leak_verdict, "reason": self.leak_reason},
                "load": None if self.load is None else {
                    **self.load.to_json(), "changed": self.load.verdict in ("higher", "lower"),
                    "matched_range": (None if self.load_range is None
                                      else [json_number(v, 1) for v in self.load_range])},
                "figures": [f.to_json() for f in self.figures]}


@dataclass(slots=True)
class ProbeComparison:
    target: str
    model: str
    figures: list[FigureResult]
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "model": self.model, "note": self.note,
                "verdict": overall([f.verdict for f in self.figures]),
                "figures": [f.to_json() for f in self.figures]}


@dataclass(slots=True)
class GpuComparison:
    index: int | None
    host: str | None
    name: str
    config_changes: list[ConfigChange]
    memory: FigureResult

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "host": self.host, "name": self.name,
                "config_changes": [c.to_json() for c in self.config_changes],
                "figures": [self.memory.to_json()]}


def overall(verdicts: list[Verdict]) -> Verdict:
    """worse if anything is worse; else better if anything is; else same if anything
    was judged at all; else unknown."""
    for verdict in ("worse", "better"):
        if verdict in verdicts:
            return verdict  # type: ignore[return-value]
    judged = [v for v in verdicts if v != "unknown"]
    return "same" if judged else "unknown"


@dataclass(slots=True)
class Comparison:
    baseline: Baseline
    now: Baseline
    engines: list[EngineComparison] = field(default_factory=list)
    probes: list[ProbeComparison] = field(default_factory=list)
    gpus: list[GpuComparison] = field(default_factory=list)
    unmatched_baseline: list[tuple[str, EngineSummary]] = field(default_factory=list)
    unmatched_now: list[tuple[str, EngineSummary]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alpha: float = ALPHA

    def verdicts(self) -> list[Verdict]:
        verdicts = [v for e in self.engines for v in e.verdicts()]
        verdicts += [f.verdict for p in self.probes for f in p.figures]
        return verdicts + [g.memory.verdict for g in self.gpus]

    @property
    def verdict(self) -> Verdict:
        return overall(self.verdicts()) if self.engines else "unknown"

    def exit_code(self) -> int:
        verdict = self.verdict
        if verdict == "worse":
            return EXIT_WORSE
        return EXIT_NO_DATA if verdict == "unknown" else EXIT_OK

    def all_config_changes(self) -> list[dict[str, Any]]:
        changes = [{"target": e.target, "model": e.model, "engine": e.engine, **c.to_json()}
                   for e in self.engines for c in e.config_changes]
        changes += [{"gpu": g.index, "host": g.host, **c.to_json()} for g in self.gpus
                    for c in g.config_changes]
        return changes

    def to_json(self) -> dict[str, Any]:
        return {
            "kvtop_compare": COMPARE_VERSION, "verdict": self.verdict,
            "regression": self.verdict == "worse",
            "method": {"test": "mann-whitney-u", "alpha": self.alpha,
                       "noise_z": NOISE_Z, "design_effect": DESIGN_EFFECT,
                       "minute_s": self.baseline.minute_s, "min_values": MIN_VALUES,
                       "load": "arrivals/s per minute (else prompt + generation tokens/s); "
                               "when it changed, load-driven figures are judged on the "
                               "minutes both runs share a load range in",
                       "load_driven": sorted(LOAD_DRIVEN)},
            "baseline": _run_json(self.baseline), "now": _run_json(self.now),
            "config_changes": self.all_config_changes(),
            "engines": [e.to_json() for e in self.engines],
            "probes": [p.to_json() for p in self.probes],
            "gpus": [g.to_json() for g in self.gpus],
            "unmatched": {"baseline": [_engine_id(t, e) for t, e in self.unmatched_baseline],
                          "now": [_engine_id(t, e) for t, e in self.unmatched_now]},
            "notes": self.notes,
        }


def _run_json(run: Baseline) -> dict[str, Any]:
    return {"name": run.name, "created": run.created, "source": run.source,
            "duration_s": json_number(run.duration_s, 3)}


def _engine_id(target: str, engine: EngineSummary) -> dict[str, Any]:
    return {"target": target, "model": engine.model, "engine": engine.engine}


# -- matching -----------------------------------------------------------------------------


def _closeness(base: tuple[TargetSummary, EngineSummary], target: TargetSummary,
               engine: EngineSummary) -> int:
    """3: same model, engine label and target; 2: same model and label; 1: same model."""
    bt, be = base
    if be.model != engine.model:
        return 0
    if be.engine != engine.engine:
        return 1
    return 3 if bt.target == target.target else 2


def _match(base: Baseline, now: Baseline
           ) -> tuple[list[tuple[TargetSummary, EngineSummary, TargetSummary, EngineSummary]],
                      list[tuple[TargetSummary, EngineSummary]]]:
    """Pairs (baseline engine, engine now), closest first (:func:`_closeness`); and the
    engines of now that no baseline engine matches."""
    free = base.engines()
    pairs, unmatched = [], []
    for target, engine in now.engines():
        best = max(free, key=lambda pair: _closeness(pair, target, engine), default=None)
        if best is None or _closeness(best, target, engine) == 0:
            unmatched.append((target, engine))
            continue
        free.remove(best)
        pairs.append((*best, target, engine))
    return pairs, unmatched


def match_engine(base: Baseline, url: str, model: str | None, engine: str | None
                 ) -> tuple[TargetSummary, EngineSummary] | None:
    """The baseline engine that an engine (model, label) of target ``url`` compares with:
    the closest (:func:`_closeness`), or None when the baseline holds no such model."""
    probe = TargetSummary(url)
    wanted = EngineSummary(model, engine)
    best = max(base.engines(), key=lambda pair: _closeness(pair, probe, wanted), default=None)
    return best if best is not None and _closeness(best, probe, wanted) else None


def _check_models(base: Baseline, now: Baseline) -> None:
    base_models = {e.model for _, e in base.engines()}
    now_models = {e.model for _, e in now.engines()}
    if base_models and now_models and not base_models & now_models:
        raise ModelMismatch(
            f"the baseline {base.name or ''} is of model(s) {_names(base_models)}, this run "
            f"serves {_names(now_models)}: a comparison across models would mean nothing; "
            "save a baseline of this model first")


def _names(models: set[str | None]) -> str:
    return ", ".join(repr(m) if m is not None else "(unnamed)" for m in sorted(
        models, key=lambda m: m or ""))


def _compare_engine(bt: TargetSummary, be: EngineSummary, nt: TargetSummary,
                    ne: EngineSummary, alpha: float) -> EngineComparison:
    base_version, now_version = _versions(bt, nt)
    base_config = {"kind": bt.kind, "version": base_version, **be.config}
    now_config = {"kind": nt.kind, "version": now_version, **ne.config}
    spec = load_spec(be, ne)
    base_load, now_load = load_per_minute(be, spec), load_per_minute(ne, spec)
    load = judge(spec, load_figure(base_load), load_figure(now_load), alpha=alpha)
    changed = load.verdict in ("higher", "lower")
    window = common_range(base_load, now_load) if changed else None
    figures = []
    for figure in ENGINE_FIGURES:
        if changed and figure.key in LOAD_DRIVEN:
            figures.append(at_matched_load(figure, be, ne, base_load, now_load, window, load,
                                           alpha))
        else:
            figures.append(judge(figure, be.figure(figure.key), ne.figure(figure.key),
                                 alpha=alpha))
    return EngineComparison(nt.target, bt.target, ne.model, ne.engine,
                            config_changes(base_config, now_config), figures,
                            be.leak, ne.leak, ne.leak_reason, load=load, load_range=window)


def _versions(base: TargetSummary, now: TargetSummary) -> tuple[str | None, str | None]:
    """The versions to compare: an era guessed from the metric names ("0.10.2+") says
    nothing against an exact one, so one inferred side makes both unknown (no change);
    both inferred are compared, and marked so."""
    if base.version_inferred != now.version_inferred:
        return None, None
    if base.version_inferred:
        return (None if base.version is None else f"{base.version} (inferred)",
                None if now.version is None else f"{now.version} (inferred)")
    return base.version, now.version


def _compare_probe(base: ProbeSummary, now: ProbeSummary | None, target: str,
                   alpha: float) -> ProbeComparison:
    empty = ProbeSummary(base.model, base.prompt, base.max_tokens, None, 0, 0)
    current = now or empty
    figures = [judge(spec, base.figures.get(spec.key, Figure(None)),
                     current.figures.get(spec.key, Figure(None)), alpha=alpha)
               for spec in PROBE_FIGURES]
    note = None if now is not None else "not probed in this run (--probe sends the request)"
    if now is not None and now.failed:
        note = f"{now.failed} of {now.requests} probe requests failed: {now.error}"
    return ProbeComparison(target, base.model, figures, note)


def compare(base: Baseline, now: Baseline, *, alpha: float = ALPHA) -> Comparison:
    """Compare ``now`` with ``base``; ModelMismatch when they share no model."""
    _check_models(base, now)
    result = Comparison(base, now, alpha=alpha)
    pairs, unmatched = _match(base, now)
    result.unmatched_now = [(t.target, e) for t, e in unmatched]
    matched = {id(be) for _, be, _, _ in pairs}
    result.unmatched_baseline = [(t.target, e) for t, e in base.engines()
                                 if id(e) not in matched]
    probed: set[str] = set()
    for bt, be, nt, ne in pairs:
        result.engines.append(_compare_engine(bt, be, nt, ne, alpha))
        if bt.probe is not None and nt.target not in probed:
            probed.add(nt.target)
            result.probes.append(_compare_probe(bt.probe, nt.probe, nt.target, alpha))
    now_gpus = {g.place: g for g in now.gpus}
    for gpu in base.gpus:
        other = now_gpus.get(gpu.place)
        if other is None:
            continue
        changes = config_changes({"name": gpu.name, "memory_total_bytes": gpu.memory_total_bytes},
                                 {"name": other.name,
                                  "memory_total_bytes": other.memory_total_bytes})
        result.gpus.append(GpuComparison(other.index, other.host, other.name, changes,
                                         judge(GPU_MEMORY, gpu.memory_used, other.memory_used,
                                               alpha=alpha)))
    if base.gpus and not now.gpus:
        result.notes.append("the baseline has GPU readings, this run none")
    return result
