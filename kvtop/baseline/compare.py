"""Judge a run against a baseline: config changes first, then each figure better, same or
worse, beyond run-to-run noise (docs/baseline-format.md, "How compare judges").

A figure is judged from its per-minute values in both runs. It changed when all three hold:

* the Mann–Whitney rank test says one run's values tend to be higher (p < ``ALPHA``), and
  the headline values moved the same way;
* the move is beyond run-to-run noise: at least ``NOISE_Z`` standard errors of the
  difference of the per-minute means, their variance multiplied by ``DESIGN_EFFECT``
  because runs of one server differ by more than their minutes suggest (slow swings of the
  load: the means of healthy reruns of the simulated server vary 2 to 2.7 times as much as
  their minutes predict, most for KV usage; benchmarks/baseline_eval);
* the move matters: at least the figure's ``FigureSpec.rel`` of the baseline and ``floor``.

Fewer than ``MIN_VALUES`` values on either side, or a value not exported on one side,
leaves the figure unknown: never "same", never 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvtop.baseline.figures import ENGINE_FIGURES, GPU_MEMORY, PROBE_FIGURES, FigureSpec
from kvtop.baseline.model import (
    Baseline,
    BaselineError,
    ConfigValue,
    EngineSummary,
    Figure,
    ProbeSummary,
    TargetSummary,
)
from kvtop.baseline.stats import mann_whitney
from kvtop.contract import json_number
from kvtop.exits import EXIT_NO_DATA, EXIT_OK, EXIT_WORSE

ALPHA = 0.01
NOISE_Z = 2.576  # two-sided 1 %, as ALPHA
DESIGN_EFFECT = 3.0
MIN_VALUES = 3
COMPARE_VERSION = 1
Verdict = Literal["better", "same", "worse", "higher", "lower", "unknown"]
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
class FigureResult:
    spec: FigureSpec
    baseline: float | None
    now: float | None
    verdict: Verdict
    p_value: float | None = None
    n_baseline: int = 0
    n_now: int = 0
    note: str | None = None
    threshold: float | None = None  # the smallest change that would have counted

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.now is None:
            return None
        return self.now - self.baseline

    @property
    def delta_pct(self) -> float | None:
        delta = self.delta
        if delta is None or self.baseline is None or self.baseline == 0:
            return None
        return 100 * delta / abs(self.baseline)

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.spec.key, "label": self.spec.label, "unit": self.spec.unit,
                "worse_when": self.spec.worse, "baseline": json_number(self.baseline),
                "now": json_number(self.now), "delta": json_number(self.delta),
                "delta_pct": json_number(self.delta_pct, 1),
                "p_value": json_number(self.p_value, 6),
                "values": [self.n_baseline, self.n_now],
                "threshold": json_number(self.threshold), "verdict": self.verdict,
                "note": self.note}


def judge(spec: FigureSpec, base: Figure, now: Figure, *, alpha: float = ALPHA,
          min_values: int = MIN_VALUES) -> FigureResult:
    """One figure, baseline vs now."""
    counts = {"n_baseline": len(base.values), "n_now": len(now.values)}
    if base.value is None or now.value is None:
        side = ("either run" if base.value is None and now.value is None
                else "the baseline" if base.value is None else "this run")
        return FigureResult(spec, base.value, now.value, "unknown",
                            note=f"not known in {side}", **counts)
    if min(len(base.values), len(now.values)) < min_values:
        return FigureResult(spec, base.value, now.value, "unknown",
                            note=f"too few minutes to judge (needs {min_values} each)",
                            **counts)
    u, p = mann_whitney(base.values, now.values)
    effect = now.value - base.value
    ranks_up = u > len(base.values) * len(now.values) / 2
    spread = noise(base.values, base.values if spec.steady else now.values, len(now.values))
    threshold = max(spec.floor, spec.rel * abs(base.value), spread)
    if p >= alpha or abs(effect) < threshold or ranks_up != (effect > 0):
        return FigureResult(spec, base.value, now.value, "same", p, threshold=threshold,
                            **counts)
    direction: Verdict = "higher" if effect > 0 else "lower"
    if spec.worse == "load":
        verdict = direction
    else:
        verdict = "worse" if spec.worse == direction else "better"
    return FigureResult(spec, base.value, now.value, verdict, p, threshold=threshold,
                        **counts)


def noise(base: Sequence[float], now: Sequence[float], n_now: int) -> float:
    """The change two runs of one server show without a cause: ``NOISE_Z`` standard errors
    of the difference of their per-minute means (``n_now`` of them now, with the spread of
    ``now``), the variance times ``DESIGN_EFFECT``."""
    variance = statistics.variance(base) / len(base) + statistics.variance(now) / n_now
    return NOISE_Z * math.sqrt(DESIGN_EFFECT * variance)


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
                       "minute_s": self.baseline.minute_s, "min_values": MIN_VALUES},
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
    base_config = {"kind": bt.kind, "version": bt.version, **be.config}
    now_config = {"kind": nt.kind, "version": nt.version, **ne.config}
    figures = [judge(spec, be.figure(spec.key), ne.figure(spec.key), alpha=alpha)
               for spec in ENGINE_FIGURES]
    return EngineComparison(nt.target, bt.target, ne.model, ne.engine,
                            config_changes(base_config, now_config), figures,
                            be.leak, ne.leak, ne.leak_reason)


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
