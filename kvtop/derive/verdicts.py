"""The verdicts the detectors give, below the detectors and the stats that carry them: an
engine's stats hold its leak and stall verdicts, and the detectors read those stats.

Each kind of state has one order of severity here, used wherever states are compared (the
detectors' hysteresis, the worst verdict a run reached, the fleet's sort and alerts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LeakState = Literal["warmup", "ok", "watch", "leak"]
StallState = Literal["unknown", "ok", "saturated", "stalled"]
# What holds an engine's queue back (docs/kv-anatomy.md, "What limits this engine")
Limit = Literal["kv_capacity", "max_sequences", "token_budget", "deferred", "kv_transfer",
                "sleeping", "none", "unknown"]
Verdict = Literal["unknown", "ok", "watch", "leak"]  # the worst leak state of a run (check)

# Warm-up says nothing yet: it is no more news than OK (its end is not told as a change).
LEAK_RANK: dict[LeakState, int] = {"warmup": 0, "ok": 0, "watch": 1, "leak": 2}
# The exact leak evidence of KV events (docs/kv-anatomy.md), a witness of its own
KvLeakState = Literal["unknown", "too_early", "none", "evidence"]
KV_LEAK_RANK: dict[KvLeakState, int] = {"unknown": 0, "too_early": 1, "none": 2, "evidence": 3}
STALL_RANK: dict[StallState, int] = {"unknown": 0, "ok": 1, "saturated": 2, "stalled": 3}
# A verdict, once reached, outranks none: an engine judged OK is worse news than no verdict.
VERDICT_RANK: dict[Verdict, int] = {"unknown": 0, "ok": 1, "watch": 2, "leak": 3}
# Where a stall sits among leak states for a person: a saturated pool needs a look as WATCH
# does, a stalled engine is an outage now as LEAK is.
STALL_AS_LEAK: dict[StallState, LeakState] = {"saturated": "watch", "stalled": "leak"}


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
