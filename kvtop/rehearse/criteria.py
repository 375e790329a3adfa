"""What the rehearsal's three criteria share: a criterion's state and figures, the load's
span cut into thirds and windows, and how figures are rounded for the report.

The criteria themselves are in latency.py, gpu_memory.py and kv_free.py; the verdict over
them in verdict.py; docs/rehearse.md documents every rule and number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from kvtop.derive.verdicts import VERDICT_RANK
from kvtop.derive.verdicts import Verdict as CheckVerdict

State = Literal["ok", "watch", "fail", "not_judged"]

WINDOWS = 12
Z = 2.33  # one-sided 99 %: the two-proportion test and the trend's lower bound

TITLES = {"gpu_memory": "GPU memory stable", "kv_free": "free KV not falling",
          "latency": "slow-request share not rising"}


@dataclass
class Criterion:
    name: str
    title: str
    state: State
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """The load phase, in target seconds since the start."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return max(self.end - self.start, 1e-9)

    def third(self, t: float) -> int:
        return min(2, max(0, int(3 * (t - self.start) / self.length)))

    def window(self, t: float) -> int:
        return min(WINDOWS - 1, max(0, int(WINDOWS * (t - self.start) / self.length)))

    def window_hours(self, index: int) -> float:
        return (index + 0.5) * self.length / WINDOWS / 3600

    def holds(self, t: float) -> bool:
        return self.start <= t <= self.end


# A criterion's states in the order of check's verdicts: none yet, fine, watch, bad.
_AS_VERDICT: dict[State, CheckVerdict] = {"not_judged": "unknown", "ok": "ok", "watch": "watch",
                                         "fail": "leak"}
STATE_RANK = {state: VERDICT_RANK[verdict] for state, verdict in _AS_VERDICT.items()}


def rounded(value: float | None, digits: int = 6) -> float | None:
    """A figure for the report: None where there is no finite value."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def signed(value: float | None, fmt: str = ".1%") -> str:
    """A change with its sign, "?" where there is none."""
    if value is None:
        return "?"
    return format(value, "+" + fmt)
