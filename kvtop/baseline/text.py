"""Baselines and comparisons as text for a terminal. Every string that came from outside
(target URLs, model and engine names, config values, baseline names, servers' errors) goes
through :func:`display_text` here, at the one place text is printed."""

from __future__ import annotations

from typing import Any

from kvtop.baseline.figures import ENGINE_FIGURES, GPU_MEMORY, PROBE_FIGURES, Unit
from kvtop.baseline.model import Baseline, EngineSummary, Figure
from kvtop.baseline.store import Listed
from kvtop.safe_text import display_text

DASH = "—"
GIB = 2**30


def number(value: float | None, unit: str) -> str:
    """A figure's value in its unit, for people."""
    if value is None:
        return DASH
    if unit == "fraction":
        return f"{value * 100:.1f} %"
    if unit == "seconds":
        if abs(value) < 0.01:
            return f"{value * 1000:.1f} ms"
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "per_min":
        return f"{value:.2f}/min"
    if unit == "per_s":
        return f"{value:.2f}/s"
    if unit == "tokens_per_s":
        return f"{value:.1f}/s" if abs(value) < 10 else f"{value:.0f}/s"
    if unit == "bytes":
        return f"{value / GIB:.2f} GiB"
    return f"{value:.2f}"


def change(delta: float | None, pct: float | None, unit: str) -> str:
    if delta is None:
        return ""
    if unit == "fraction":
        return f"{delta * 100:+.1f} pts"
    text = number(delta, unit)
    text = text if text.startswith("-") else "+" + text
    return f"{text} ({pct:+.0f} %)" if pct is not None and unit != "fraction" else text


def _p(value: float | None) -> str:
    if value is None:
        return ""
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _source(run: dict[str, Any]) -> str:
    source = run.get("source") or {}
    kind = source.get("kind")
    where = source.get("recording") or source.get("baseline")
    text = f"{kind}" + (f" {where}" if where else "")
    name = f"'{run['name']}' " if run.get("name") else ""
    return display_text(f"{name}{_minutes(run.get('duration_s') or 0.0)}, {text}, "
                        f"taken {run.get('created') or '?'}")


def _engine_name(target: str, model: str | None, engine: str | None) -> str:
    parts = [target, f"model {model}" if model is not None else "",
             f"engine {engine}" if engine is not None else ""]
    return display_text("  ".join(p for p in parts if p))


def _gpu_name(index: int | None, host: str | None) -> str:
    where = f" on {host}" if host else ""
    return display_text(f"GPU {index if index is not None else '?'}{where}")


def _config_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return display_text(value, 80)


def _figure_rows(figures: list[dict[str, Any]]) -> list[str]:
    rows = [f"  {'figure':24} {'baseline':>12} {'now':>12} {'change':>20} {'counts at':>12} "
            f"{'p':>7}  verdict"]
    for f in figures:
        verdict = _verdict(f["verdict"])
        note = f"  ({display_text(f['note'], 120)})" if f.get("note") else ""
        rows.append(f"  {f['label']:24} {number(f['baseline'], f['unit']):>12} "
                    f"{number(f['now'], f['unit']):>12} "
                    f"{change(f['delta'], f['delta_pct'], f['unit']):>20} "
                    f"{_threshold(f):>12} {_p(f['p_value']):>7}  {verdict}{note}")
    return rows


def _threshold(figure: dict[str, Any]) -> str:
    """The smallest change that would have counted, as a move either way."""
    value = figure.get("threshold")
    if value is None:
        value = figure.get("matters")
    if value is None:
        return ""
    if figure["unit"] == "fraction":
        return f"±{value * 100:.1f} pts"
    return "±" + number(value, figure["unit"])


def _verdict(verdict: str) -> str:
    return verdict.upper() if verdict in ("worse", "better") else verdict


def _leak_row(leak: dict[str, Any]) -> str:
    reason = f"  ({display_text(leak['reason'], 160)})" if leak["now"] == "leak" else ""
    return (f"  {'leak detector':24} {leak['baseline']:>12} {leak['now']:>12} {'':>20} "
            f"{'':>7}  {_verdict(leak['verdict'])}{reason}")


def _load_lines(load: dict[str, Any] | None) -> list[str]:
    if not load or not load.get("changed"):
        return []
    matched = load.get("matched_range")
    how = (f"load-driven figures are compared on the minutes both runs spent at "
           f"{matched[0]:.4g}-{matched[1]:.4g}" if matched else
           "no minute of one run saw the other's load: what follows the load is marked "
           "higher or lower, not worse")
    unit = "arrivals/s" if load["figure"] == "arrivals_per_s" else "tokens/s"
    return [f"  the load changed: {load['baseline']:.4g} -> {load['now']:.4g} {unit} "
            f"({load['verdict']}); {how}"]


def render_comparison(doc: dict[str, Any]) -> str:
    """The compare JSON document (docs/compare-json.md) as text."""
    lines = [f"kvtop compare: {doc['verdict'].upper()}",
             f"  baseline {_source(doc['baseline'])}", f"  now      {_source(doc['now'])}"]
    if doc["config_changes"]:
        lines += ["", "Config changes (they explain most differences):"]
        for c in doc["config_changes"]:
            where = (_gpu_name(c["gpu"], c["host"]) if "gpu" in c
                     else _engine_name(c["target"], c["model"], c["engine"]))
            lines.append(f"  {where}: {c['label']} {_config_value(c['baseline'])} -> "
                         f"{_config_value(c['now'])}")
    for engine in doc["engines"]:
        lines += ["", f"{_engine_name(engine['target'], engine['model'], engine['engine'])}: "
                      f"{engine['verdict'].upper()}"]
        lines += _load_lines(engine.get("load"))
        lines += _figure_rows(engine["figures"])
        lines.append(_leak_row(engine["leak"]))
        unjudged = [f["label"] for f in engine["figures"]
                    if f["verdict"] == "unknown" and f.get("matters") is not None]
        if unjudged:
            lines.append(f"  not judged (too little evidence: see each row): "
                         f"{', '.join(unjudged)}")
    for probe in doc["probes"]:
        lines += ["", f"probe {display_text(probe['target'])} (model "
                      f"{display_text(probe['model'])}): {probe['verdict'].upper()}"]
        if probe.get("note"):
            lines.append(f"  {display_text(probe['note'], 300)}")
        lines += _figure_rows(probe["figures"])
    for gpu in doc["gpus"]:
        lines += ["", f"{_gpu_name(gpu['index'], gpu['host'])} {display_text(gpu['name'], 80)}"]
        lines += _figure_rows(gpu["figures"])
    unmatched = doc["unmatched"]
    for side, label in (("baseline", "in the baseline only"), ("now", "in this run only")):
        for e in unmatched[side]:
            lines.append(f"{label}: {_engine_name(e['target'], e['model'], e['engine'])}")
    lines += [f"note: {display_text(note, 300)}" for note in doc.get("notes", [])]
    method = doc["method"]
    lines += ["", f"Judged on per-minute values: Mann-Whitney rank test, p < {method['alpha']}, "
                  "beyond run-to-run noise and large enough to matter (the 'counts at' "
                  "column); SAME only where the runs could have seen such a change, else "
                  "unknown (docs/baseline-format.md)."]
    return "\n".join(lines) + "\n"


def _summary(figure: Figure, unit: Unit) -> str:
    keys = [k for k in ("p5", "p50", "p95", "max") if figure.summary.get(k) is not None]
    if not keys:
        return ""
    return "  (" + ", ".join(f"{k} {number(figure.summary[k], unit)}" for k in keys) + ")"


def _engine_lines(engine: EngineSummary) -> list[str]:
    config = ", ".join(f"{k} {_config_value(v)}" for k, v in engine.config.items()
                       if v is not None)
    lines = [f"  config: {config or DASH}",
             f"  {engine.samples} scrapes, {engine.minutes} minutes, leak detector: "
             f"{engine.leak}" + (f", {engine.restarts} restart(s)" if engine.restarts else "")]
    for spec in ENGINE_FIGURES:
        figure = engine.figure(spec.key)
        lines.append(f"  {spec.label:24} {number(figure.value, spec.unit):>12}"
                     f"{_summary(figure, spec.unit)}")
    return lines


def render_baseline(baseline: Baseline, path: str) -> str:
    """``kvtop baseline show``: what a baseline holds."""
    source = baseline.source
    where = source.get("recording")
    name = f"{baseline.name} " if baseline.name else ""
    lines = [display_text(f"baseline {name}({path})"),
             display_text(f"  saved {baseline.created} by kvtop {baseline.kvtop_version}, "
                          f"{_minutes(baseline.duration_s)} {source.get('kind')}"
                          + (f" {where}" if where else ""))]
    for target in baseline.targets:
        version = (f"{target.version} (inferred)" if target.version and target.version_inferred
                   else target.version)
        server = " ".join(str(v) for v in (target.kind, version) if v)
        lines += ["", display_text(f"{target.target}  {server}  ({target.scrapes} scrapes, "
                                   f"{target.failed_scrapes} failed)")]
        for engine in target.engines:
            lines.append(_engine_name("", engine.model, engine.engine).strip() or "engine")
            lines += _engine_lines(engine)
        if target.probe is not None:
            probe = target.probe
            lines.append(display_text(f"  probe: {probe.requests} x {probe.prompt} prompt of "
                                      f"{probe.prompt_tokens or '?'} tokens, "
                                      f"{probe.max_tokens} out, model {probe.model}, "
                                      f"{probe.failed} failed"))
            for spec in PROBE_FIGURES:
                figure = probe.figures.get(spec.key, Figure(None))
                lines.append(f"  {spec.label:24} {number(figure.value, spec.unit):>12}")
    for gpu in baseline.gpus:
        lines.append(display_text(f"{_gpu_name(gpu.index, gpu.host)} {gpu.name}: "
                                  f"{number(gpu.memory_used.value, GPU_MEMORY.unit)} used of "
                                  f"{number(gpu.memory_total_bytes, 'bytes')}"))
    return "\n".join(lines) + "\n"


def render_list(listed: list[Listed]) -> str:
    if not listed:
        return "no saved baselines\n"
    lines = [f"{'NAME':24} {'SAVED':25} {'LENGTH':>9}  MODELS"]
    for entry in listed:
        if entry.baseline is None:
            lines.append(display_text(f"{entry.name:24} unreadable: {entry.error}"))
            continue
        baseline = entry.baseline
        models = sorted({str(e.model) for _, e in baseline.engines()})
        lines.append(display_text(f"{entry.name:24} {baseline.created:25} "
                                  f"{_minutes(baseline.duration_s):>9}  {', '.join(models)}"))
    return "\n".join(lines) + "\n"
