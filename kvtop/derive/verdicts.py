"""The verdicts the detectors give, below the detectors and the stats that carry them: an
engine's stats hold its leak and stall verdicts, and the detectors read those stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LeakState = Literal["warmup", "ok", "watch", "leak"]
StallState = Literal["unknown", "ok", "saturated", "stalled"]
# What holds an engine's queue back (docs/kv-anatomy.md, "What limits this engine")
Limit = Literal["kv_capacity", "max_sequences", "token_budget", "deferred", "kv_transfer",
                "sleeping", "none", "unknown"]
STALL_RANK: dict[StallState, int] = {"unknown": 0, "ok": 1, "saturated": 2, "stalled": 3}


@dataclass(frozen=True)
class LeakVerdict:
    """The figures (leaked blocks, slope, time to full) are None unless the state is WATCH
    or LEAK: an OK verdict never carries a leak estimate (docs/check-json.md)."""

    state: LeakState
    reason: str  # one line a person understands
    leaked_blocks: float | None  # estimated blocks held by no live request
    slope_blocks_per_hour: float | None
    hours_to_full: float | None  # at the current slope, until the pool is full
    evidence: dict[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True)
class StallVerdict:
    state: StallState
    reason: str  # one line a person understands
    since_t: float | None  # when this state began (STALLED: the last scrape with progress)
    evidence: dict[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True)
class LimitVerdict:
    limit: Limit
    reason: str  # one line a person understands: the numbers behind the word
    evidence: dict[str, float | str] = field(default_factory=dict)
