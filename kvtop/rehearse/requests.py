"""The requests a rehearsal sent, as the judge needs them: first attempts in columns (a few
dozen bytes each, so hours at hundreds of requests a second fit), retries counted apart.
Every attempt also goes to the per-request log (JSON Lines) as it ends."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field

from kvtop.load.driver import RequestRecord

OUTCOMES = ("ok", "error", "timeout", "dropped", "cut")
CODE = {name: i for i, name in enumerate(OUTCOMES)}
NAN = math.nan


@dataclass
class RequestTable:
    """First attempts (``attempt == 1``): planned time, class, outcome and timings."""

    t: array = field(default_factory=lambda: array("d"))
    cls: array = field(default_factory=lambda: array("B"))
    outcome: array = field(default_factory=lambda: array("B"))
    ttft: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    total: array = field(default_factory=lambda: array("d"))
    prompt: array = field(default_factory=lambda: array("l"))  # tokens the server counted
    classes: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)  # later attempts by outcome
    errors: Counter[str] = field(default_factory=Counter)  # first attempts' error messages
    # tokens of every attempt the server answered in full (what its counters also count)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answered: int = 0

    def add(self, record: RequestRecord) -> None:
        if record.status == "ok":
            self.answered += 1
            self.prompt_tokens += record.prompt_tokens or 0
            self.completion_tokens += record.completion_tokens or 0
        if record.attempt > 1:
            self.retries[record.status] += 1
            return
        self.statuses[record.status] += 1
        if record.status in ("error", "timeout"):
            self.errors[(record.error or record.status)[:120]] += 1
        if record.cls not in self.classes:
            self.classes.append(record.cls)
        self.t.append(record.t)
        self.cls.append(self.classes.index(record.cls))
        self.outcome.append(CODE[record.status])
        self.ttft.append(_num(record.ttft_s))
        self.tpot.append(_num(record.tpot_s))
        self.total.append(_num(record.total_s))
        self.prompt.append(record.prompt_tokens if record.prompt_tokens is not None
                           else record.planned_prompt_tokens)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def failed(self) -> int:
        return self.statuses["error"] + self.statuses["timeout"]

    @property
    def sent(self) -> int:
        """First attempts that reached the wire and were not cut by the end of the run."""
        return sum(self.statuses[s] for s in ("ok", "error", "timeout"))

    def error_rate(self) -> float | None:
        return self.failed / self.sent if self.sent else None


def _num(value: float | None) -> float:
    return NAN if value is None else value
