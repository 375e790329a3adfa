"""Figures the load drives, compared at matched load (docs/baseline-format.md, "Load").

The load is the arrival rate per minute (requests finished plus the change in those running
or waiting: what clients offered, which a slower or saturated server does not lower), or
where a baseline lacks it the token throughput (prompt + generation tokens/s), judged like
a figure. When it changed, the figures the load drives (``LOAD_DRIVEN``: KV usage, queues,
how often KV capacity held them, preemptions, latency) are judged on the minutes of each
run whose load lies in the range both runs covered. Where fewer than ``MIN_VALUES`` minutes
a side match, a change the same way as the load follows the load (``higher``/``lower``,
never worse); one against it (the load fell, latency rose) is beyond what the load
explains, and stands.
"""

from __future__ import annotations

import dataclasses
import statistics

from kvtop.baseline.figures import FigureSpec
from kvtop.baseline.judge import MIN_VALUES, FigureResult, Verdict, judge
from kvtop.baseline.model import EngineSummary, Figure

# What the load drives: compared at matched load when the load changed.
LOAD_DRIVEN = frozenset({"kv_usage", "preemptions_per_min", "waiting", "kv_limited",
                         "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99"})
ARRIVALS = FigureSpec("arrivals_per_s", "load (arrivals/s)", "per_s", "load", 0.1, 0.01)
TOKENS = FigureSpec("tokens_per_s", "load (prompt + generation tokens/s)", "tokens_per_s",
                    "load", 0.1, 1.0)


def load_spec(base: EngineSummary, now: EngineSummary) -> FigureSpec:
    """Arrivals where both runs have them, else tokens/s."""
    both = all(e.figure("arrivals_per_s").values and "arrivals_per_s" in e.minute_index
               for e in (base, now))
    return ARRIVALS if both else TOKENS


def load_per_minute(engine: EngineSummary, spec: FigureSpec) -> dict[int, float]:
    """The load by minute: arrivals/s, or prompt + generation tokens/s where both are
    known."""
    if spec is ARRIVALS:
        figure = engine.figure("arrivals_per_s")
        return dict(zip(engine.minute_index["arrivals_per_s"], figure.values, strict=True))
    out: dict[int, float] = {}
    for key in ("prompt_tps", "generation_tps"):
        minutes = engine.minute_index.get(key)
        values = engine.figure(key).values
        if minutes is None or len(minutes) != len(values):
            return {}
        found = dict(zip(minutes, values, strict=True))
        out = found if key == "prompt_tps" else {m: out[m] + v for m, v in found.items()
                                                  if m in out}
    return out


def load_figure(load: dict[int, float]) -> Figure:
    values = tuple(load.values())
    return Figure(statistics.fmean(values) if values else None, values)


def common_range(base: dict[int, float], now: dict[int, float]) -> tuple[float, float] | None:
    """The load both runs covered (None when their ranges do not meet)."""
    if not base or not now:
        return None
    low, high = max(min(base.values()), min(now.values())), min(max(base.values()),
                                                                  max(now.values()))
    return (low, high) if low <= high else None


def _matched(figure: Figure, minutes: tuple[int, ...] | None, load: dict[int, float],
             window: tuple[float, float] | None) -> Figure:
    """The figure's per-minute values whose minute's load lies in ``window``; the headline
    their mean."""
    if window is None or minutes is None or len(minutes) != len(figure.values):
        return Figure(figure.value, ())
    kept = tuple(v for m, v in zip(minutes, figure.values, strict=True)
                 if m in load and window[0] <= load[m] <= window[1])
    return Figure(statistics.fmean(kept) if kept else figure.value, kept)


def at_matched_load(spec: FigureSpec, be: EngineSummary, ne: EngineSummary,
                     base_load: dict[int, float], now_load: dict[int, float],
                     window: tuple[float, float] | None, load: FigureResult,
                     alpha: float) -> FigureResult:
    """A load-driven figure when the load changed: judged on the minutes at matched load;
    without enough of them, a change that follows the load is no regression."""
    base, now = be.figure(spec.key), ne.figure(spec.key)
    matched_base = _matched(base, be.minute_index.get(spec.key), base_load, window)
    matched_now = _matched(now, ne.minute_index.get(spec.key), now_load, window)
    if min(len(matched_base.values), len(matched_now.values)) >= MIN_VALUES and window:
        found = judge(spec, matched_base, matched_now, alpha=alpha)
        said = (f"at matched load: {found.n_baseline} and {found.n_now} minutes of "
                f"{_amount(window[0], load)}-{_amount(window[1], load)} {_unit(load)}")
        return dataclasses.replace(found, matched_load=True, note="; ".join(
            n for n in (said, found.note) if n))
    found = judge(spec, base, now, alpha=alpha)
    if found.verdict not in ("worse", "better"):
        return found
    moved: Verdict = "higher" if (found.delta or 0) > 0 else "lower"
    if moved == load.verdict:
        return dataclasses.replace(found, verdict=moved, note=(
            f"follows the load ({_load_words(load)}); too few minutes at matched load to "
            "compare"))
    went = "up" if load.verdict == "higher" else "down"
    return dataclasses.replace(found, note=(f"{moved} though the load went {went} "
                                            f"({_load_words(load)}): beyond what the load "
                                            "explains"))


def _load_words(load: FigureResult) -> str:
    return (f"{_amount(load.baseline or 0, load)} -> {_amount(load.now or 0, load)} "
            f"{_unit(load)}")


def _unit(load: FigureResult) -> str:
    return "arrivals/s" if load.spec is ARRIVALS else "tokens/s"


def _amount(value: float, load: FigureResult) -> str:
    return f"{value:.2f}" if load.spec is ARRIVALS else f"{value:.0f}"
