"""One figure of a run against the baseline's: changed (worse, better, higher, lower), the
same, or unknown, and the power behind a "same" (docs/baseline-format.md, "How compare
judges").

A figure is judged from its per-minute values in both runs. It changed when all three hold:

* the Mann-Whitney rank test says one run's values tend to be higher (p < ``ALPHA``), and
  the headline values moved the same way;
* the move is beyond run-to-run noise: at least ``NOISE_Z`` standard errors of the
  difference of the per-minute means, their variance multiplied by ``DESIGN_EFFECT``
  because runs of one server differ by more than their minutes suggest (slow swings of the
  load: the means of healthy reruns of the simulated server vary 2 to 2.7 times as much as
  their minutes predict, most for KV usage; benchmarks/baseline_eval);
* the move matters: at least the figure's ``FigureSpec.rel`` of the baseline and ``floor``.

Fewer than ``MIN_VALUES`` values on either side, or a value not exported on one side,
leaves the figure unknown: never "same", never 0. A figure that did not change is **same**
only where the two runs could have seen a change that matters: the rank test can reach
``ALPHA`` with their minutes (2 / C(n + m, n) < ALPHA, ties aside), and the noise margin is
below the change that matters; otherwise it is unknown, with the minutes it would need.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from kvtop.baseline.figures import FigureSpec
from kvtop.baseline.model import Figure
from kvtop.baseline.stats import mann_whitney
from kvtop.contract import json_number

ALPHA = 0.01
NOISE_Z = 2.576  # two-sided 1 %, as ALPHA
DESIGN_EFFECT = 3.0
MIN_VALUES = 3
MAX_MINUTES = 10_000  # the most minutes a "needs N more minutes" is worked out to
Verdict = Literal["better", "same", "worse", "higher", "lower", "unknown"]


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
    matters: float | None = None  # the smallest change that matters (spec.rel, spec.floor)
    detectable: float | None = None  # the smallest change these runs could show (inf: none)
    minutes_needed: int | None = None  # more minutes in this run for power, where known
    minutes_each: int | None = None  # else: minutes each run needs (a longer baseline too)
    matched_load: bool = False  # judged on the minutes at matched load only

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
                "threshold": json_number(self.threshold), "matters": json_number(self.matters),
                "detectable": json_number(self.detectable),
                "minutes_needed": self.minutes_needed, "minutes_each": self.minutes_each,
                "matched_load": self.matched_load,
                "verdict": self.verdict, "note": self.note}


class _Counts(TypedDict):
    """How many per-minute values each run had: in every result."""

    n_baseline: int
    n_now: int


class _Found(_Counts):
    """What the rank test and the noise found: in every result past the counting."""

    p_value: float
    threshold: float
    matters: float
    detectable: float


def judge(spec: FigureSpec, base: Figure, now: Figure, *, alpha: float = ALPHA,
          min_values: int = MIN_VALUES) -> FigureResult:
    """One figure, baseline vs now: changed (worse, better, higher, lower), same where the
    runs could have seen a change that matters, else unknown with what it needs."""
    counts: _Counts = {"n_baseline": len(base.values), "n_now": len(now.values)}
    if base.value is None or now.value is None:
        side = ("either run" if base.value is None and now.value is None
                else "the baseline" if base.value is None else "this run")
        return FigureResult(spec, base.value, now.value, "unknown",
                            note=f"not known in {side}", **counts)
    matters = max(spec.floor, spec.rel * abs(base.value))
    if min(len(base.values), len(now.values)) < min_values:
        # a baseline long enough (so this run is the short one): at least min_values here
        more = max(min_values, _minutes_for_ranks(len(base.values), alpha))
        needed = more - len(now.values) if len(base.values) >= min_values else None
        each = None if needed is not None else _minutes_for_ranks(min_values, alpha)
        return FigureResult(spec, base.value, now.value, "unknown",
                            note=f"too few minutes to judge (needs {min_values} each); "
                                 + _needs(needed, each),
                            matters=matters, minutes_needed=needed, minutes_each=each,
                            **counts)
    u, p = mann_whitney(base.values, now.values)
    effect = now.value - base.value
    ranks_up = u > len(base.values) * len(now.values) / 2
    spread = noise(base.values, base.values if spec.steady else now.values, len(now.values))
    threshold = max(matters, spread)
    reachable = _least_p(len(base.values), len(now.values)) < alpha
    detectable = spread if reachable else math.inf
    found: _Found = {"p_value": p, "threshold": threshold, "matters": matters,
                     "detectable": detectable, **counts}
    if p < alpha and abs(effect) >= threshold and ranks_up == (effect > 0):
        direction: Verdict = "higher" if effect > 0 else "lower"
        if spec.worse == "load":
            return FigureResult(spec, base.value, now.value, direction, **found)
        verdict: Verdict = "worse" if spec.worse == direction else "better"
        return FigureResult(spec, base.value, now.value, verdict, **found)
    if detectable <= matters:
        return FigureResult(spec, base.value, now.value, "same",
                            note=_why_same(p, alpha, effect, ranks_up),
                            **found)
    needed = minutes_needed(spec, base.values, now.values, matters, alpha)
    each = None if needed is not None else _minutes_each(base.values, now.values, spread,
                                                         matters, alpha)
    return FigureResult(spec, base.value, now.value, "unknown",
                        note=_why_unknown(spec, reachable, matters, detectable, needed, each),
                        minutes_needed=needed, minutes_each=each, **found)


def _least_p(n: int, m: int) -> float:
    """The smallest two-sided p the rank test can give on n and m values (no ties)."""
    return min(1.0, 2 / math.comb(n + m, n))


def _minutes_for_ranks(n_base: int, alpha: float) -> int:
    """The fewest values this run needs for the rank test to reach ``alpha`` against
    ``n_base`` values of the baseline (MAX_MINUTES if none will do)."""
    return next((m for m in range(1, MAX_MINUTES) if _least_p(n_base, m) < alpha),
                MAX_MINUTES)


def minutes_needed(spec: FigureSpec, base: Sequence[float], now: Sequence[float],
                   matters: float, alpha: float) -> int | None:
    """More per-minute values this run needs (the baseline as it is) before a change of
    ``matters`` would count: the rank test able to reach ``alpha`` and the noise margin
    below it. None when no length of this run will do: the baseline is too short or too
    noisy for it."""
    spread_now = statistics.variance(base if spec.steady else now)
    budget = matters ** 2 / (NOISE_Z ** 2 * DESIGN_EFFECT) - statistics.variance(base) / len(
        base)
    ranks = _minutes_for_ranks(len(base), alpha)
    if budget <= 0 or ranks >= MAX_MINUTES:
        return None
    # budget > 0 here; a spread that is not a number (a NaN minute) adds no minutes
    for_noise = math.ceil(spread_now / budget) if spread_now > 0 else 0
    if for_noise >= MAX_MINUTES:
        return None
    return max(0, max(for_noise, ranks) - len(now))


def _minutes_each(base: Sequence[float], now: Sequence[float], spread: float, matters: float,
                  alpha: float) -> int:
    """Minutes each run needs, both as long, for the noise margin (which narrows as the
    square root of the minutes) to fall below ``matters`` and the rank test to reach
    ``alpha``."""
    longest = max(len(base), len(now))
    scale = (spread / matters) ** 2 if matters > 0 else math.inf
    for_noise = math.ceil(longest * scale) if math.isfinite(scale) else MAX_MINUTES
    return min(MAX_MINUTES, max(for_noise, _minutes_for_ranks(longest, alpha), longest))


def _needs(needed: int | None, each: int | None) -> str:
    if needed is not None:
        return f"needs about {needed} more minutes in this run"
    if each is None or each >= MAX_MINUTES:
        return (f"not within {MAX_MINUTES:,} minutes a run: too noisy to judge at the change "
                "that matters")
    return f"needs about {each} minutes in each run (a longer baseline too)"


def _why_same(p: float, alpha: float, effect: float, ranks_up: bool) -> str | None:
    """Why a difference the rank test found is still the same (None when it found none).
    With the power to call it same, the noise margin is below the change that matters, so
    a move that passed the rank test is either too small to matter or against the ranks;
    a move within a wider noise margin is unknown, not same."""
    if p >= alpha:
        return None
    if ranks_up != (effect > 0):
        return "the minutes' ranks and the headline moved opposite ways"
    return f"p < {alpha:g}, but smaller than the change that matters"


def _why_unknown(spec: FigureSpec, reachable: bool, matters: float, detectable: float,
                 needed: int | None, each: int | None) -> str:
    if not reachable:
        seen = "these few minutes can never reach the rank test's p < 0.01"
    else:
        seen = f"the smallest change these runs could show is {detectable:.3g} {spec.unit}"
    return (f"could not have seen a change of {matters:.3g} {spec.unit}: {seen}; "
            + _needs(needed, each))


def noise(base: Sequence[float], now: Sequence[float], n_now: int) -> float:
    """The change two runs of one server show without a cause: ``NOISE_Z`` standard errors
    of the difference of their per-minute means (``n_now`` of them now, with the spread of
    ``now``), the variance times ``DESIGN_EFFECT``."""
    variance = statistics.variance(base) / len(base) + statistics.variance(now) / n_now
    return NOISE_Z * math.sqrt(DESIGN_EFFECT * variance)
