"""Faults a simulated server can suffer, scheduled in simulated time so a demo tells a story.

Engine faults: a KV leak (a fraction of finished or aborted requests never free their
blocks), a lump (the next requests to end keep their blocks until a given number has
leaked at once), a restart (state and counters reset, `_created` timestamps change), a
stall (the engine stops stepping while requests keep arriving) and a wedge (the end of a
leak: every free block is taken and the engine makes no progress while the queue grows).
HTTP faults: a slow or hanging `/metrics`, a malformed exposition, and 401 unless a bearer
token is sent.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal[
    "leak",       # value: fraction of finished/aborted requests that leak (0 stops leaking)
    "lump",       # value: blocks the next requests to end leak, whole requests, at once
    "restart",
    "stall",      # value: seconds until it resumes by itself, or None for ever
    "resume",
    "wedge",      # every free block is taken and the engine stops: pool full, no progress
    "slow",       # value: seconds /metrics waits before answering (0 heals)
    "hang",       # /metrics never answers
    "malformed",  # /metrics answers with a broken exposition
    "auth",       # value: the bearer token /metrics and /v1/models require (None: open)
    "heal",       # ends hang, slow and malformed
]


@dataclass(frozen=True)
class Fault:
    at: float  # simulated seconds since the server started
    kind: FaultKind
    value: float | str | None = None


@dataclass
class FaultState:
    """The faults in force right now."""

    leak_frac: float = 0.0
    stalled: bool = False
    metrics_delay: float = 0.0
    metrics_hang: bool = False
    malformed: bool = False
    token: str | None = None

    def apply(self, fault: Fault) -> None:
        """Update the state; restart and stall durations are the caller's business."""
        kind, value = fault.kind, fault.value
        if kind == "leak":
            self.leak_frac = float(value or 0.0)
        elif kind in ("stall", "wedge"):
            self.stalled = True
        elif kind in ("resume", "restart"):
            self.stalled = False  # a restart cures a stall, not a leak: the bug stays
        elif kind == "slow":
            self.metrics_delay = float(value or 0.0)
        elif kind == "hang":
            self.metrics_hang = True
        elif kind == "malformed":
            self.malformed = True
        elif kind == "auth":
            self.token = None if value is None else str(value)
        elif kind == "heal":
            self.metrics_delay, self.metrics_hang, self.malformed = 0.0, False, False


class FaultSchedule:
    """Faults ordered by time; equal times keep the order they were given in."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, Fault]] = []
        for fault in faults:
            self.add(fault)

    def add(self, fault: Fault) -> None:
        heapq.heappush(self._heap, (fault.at, next(self._seq), fault))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def pop_due(self, now: float) -> list[Fault]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due


def plan(
    *,
    leak_frac: float = 0.0,
    leak_at: float = 0.0,
    restart_at: Iterable[float] = (),
    stall_at: float | None = None,
    stall_for: float | None = None,
    lumps: Iterable[tuple[float, float]] = (),
    wedge_at: float | None = None,
    slow_metrics: float = 0.0,
    hang_at: float | None = None,
    malformed_at: float | None = None,
    token: str | None = None,
) -> list[Fault]:
    """The faults of the `kvtop sim` flags, as a list for `Simulation`."""
    faults = [Fault(at, "restart") for at in restart_at]
    if leak_frac > 0:
        faults.append(Fault(leak_at, "leak", leak_frac))
    if stall_at is not None:
        faults.append(Fault(stall_at, "stall", stall_for))
    faults += [Fault(at, "lump", blocks) for at, blocks in lumps]
    if wedge_at is not None:
        faults.append(Fault(wedge_at, "wedge"))
    if slow_metrics > 0:
        faults.append(Fault(0.0, "slow", slow_metrics))
    if hang_at is not None:
        faults.append(Fault(hang_at, "hang"))
    if malformed_at is not None:
        faults.append(Fault(malformed_at, "malformed"))
    if token is not None:
        faults.append(Fault(0.0, "auth", token))
    return faults


def malform(text: str) -> str:
    """Cut the exposition inside a sample line and leave a label set unclosed."""
    lines = text.splitlines()
    cut = next((i for i in range(len(lines) // 2, len(lines)) if not lines[i].startswith("#")),
               len(lines) - 1)
    broken = lines[cut].split("}", 1)[0] + " 0.5 garbage\x00"
    return "\n".join([*lines[:cut], broken, "{{not a metric"]) + "\n"
