"""The rehearsal's verdict over its criteria (docs/rehearse.md, "The verdict").

A confirmed leak (free KV failed), a STALLED engine, more than ``max_error_rate`` of the
requests failed, or a server that answered none of its requests is NO-GO by itself; so are
two of the softer signals (GPU memory growing, the slow share rising, free KV suspect at
WATCH; ``--strict``: GPU or latency failing alone). Otherwise GO needs its evidence: free KV
and latency both judged. Without it the verdict is ``no-verdict``, with what is missing in
words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvtop.derive.verdicts import STALL_RANK, StallState
from kvtop.rehearse.criteria import TITLES, Criterion, rounded
from kvtop.rehearse.watch import WatchData

Verdict = Literal["go", "no-go", "no-verdict"]

DEFAULT_MAX_ERROR_RATE = 0.01
SILENT_S = 60.0  # target seconds of load with no answer at all after which that is a NO-GO


@dataclass
class Judgement:
    verdict: Verdict
    rule: str
    failed: list[str]
    reasons: list[str]
    evidence: list[str] = field(default_factory=list)  # what a GO rests on
    missing: list[str] = field(default_factory=list)  # what a no-verdict lacks


@dataclass(frozen=True)
class Stall:
    """The worst stall state any engine reached, in the stall verdict's own words."""

    state: StallState
    reason: str
    engine: str | None = None  # "model engine" of the worst engine
    first_t: float | None = None  # target seconds since the start: first STALLED / SATURATED

    def to_json(self, load_start: float) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "engine": self.engine,
                "first_s": rounded(None if self.first_t is None else self.first_t - load_start,
                                   3)}


def judge_stall(data: WatchData) -> Stall:
    """The worst stall verdict of the run over every engine (STALLED > SATURATED > OK)."""
    worst = max(data.verdicts.values(), key=lambda v: STALL_RANK[v.stall], default=None)
    if worst is None or worst.stall == "unknown":
        return Stall("unknown", "the stall verdict had too little to go on")
    reason = worst.stall_at_worst.reason if worst.stall_at_worst else worst.stall
    first = {"stalled": worst.stall_first_t, "saturated": worst.saturated_first_t}
    name = " ".join(part for part in (worst.model, worst.engine) if part) or None
    return Stall(worst.stall, reason, name, first.get(worst.stall))


@dataclass(frozen=True)
class Requests:
    """What the judge needs of the requests: how many went out and how many were answered."""

    first_attempts: int
    answered: int
    error_rate: float | None


RULE = ("NO-GO on a confirmed leak (free KV failed), a STALLED engine, more than {errors} "
        "of the requests failed, or a server that answered none; or when {soft} of GPU "
        "memory growing, the slow share rising and free KV at WATCH hold. GO needs free KV "
        "and latency judged; without them, no-verdict")


def decide(criteria: list[Criterion], *, strict: bool, error_rate: float | None,
           max_error_rate: float, stall: Stall | None = None,
           requests: Requests | None = None, load_s: float = 0.0) -> Judgement:
    """The verdict from the criteria, the stall, the requests' errors and answers
    (docs/rehearse.md, "The verdict")."""
    rule = RULE.format(errors=f"{max_error_rate:.1%}",
                       soft="any one" if strict else "two (--strict: GPU or latency alone)")
    by_name = {c.name: c for c in criteria}
    failed = [c.name for c in criteria if c.state == "fail"]
    reasons = _hard_reasons(by_name, stall, error_rate, max_error_rate, requests, load_s)
    soft = _soft_signals(by_name, strict)
    if len(soft) >= (1 if strict else 2):
        reasons += soft
    if reasons:
        return Judgement("no-go", rule, failed, reasons)
    missing = [by_name[name].figures.get("needs") or by_name[name].reason
               for name in ("kv_free", "latency")
               if name in by_name and by_name[name].state == "not_judged"]
    if requests is not None and requests.answered == 0:
        missing.append(f"no request was answered yet ({requests.first_attempts} sent)")
    if missing:
        return Judgement("no-verdict", rule, failed,
                         ["not enough evidence for GO: " + "; ".join(missing)],
                         missing=missing)
    evidence = [f"{c.title}: {c.state.upper()} ({c.reason})" for c in criteria
                if c.state != "not_judged"]
    return Judgement("go", rule, failed, [f"{TITLES[n]}: failed" for n in failed] or
                     ["free KV and latency judged, no criterion failed"], evidence)


def _hard_reasons(by_name: dict[str, Criterion], stall: Stall | None,
                  error_rate: float | None, max_error_rate: float,
                  requests: Requests | None, load_s: float) -> list[str]:
    """What makes a NO-GO by itself, each in words."""
    reasons = []
    kv = by_name.get("kv_free")
    if kv is not None and kv.state == "fail":
        reasons.append(f"a leak: {kv.title}: failed ({kv.reason})")
    if stall is not None and stall.state == "stalled":
        where = f"{stall.engine}: " if stall.engine else ""
        reasons.append(f"stalled: {where}{stall.reason}")
    if error_rate is not None and error_rate > max_error_rate:
        reasons.append(f"{error_rate:.1%} of the requests failed (limit {max_error_rate:.1%})")
    if (requests is not None and requests.first_attempts and not requests.answered
            and load_s >= SILENT_S):
        reasons.append(f"the server answered none of the {requests.first_attempts} requests "
                       f"in {load_s / 60:.1f} min of load")
    return reasons


def _soft_signals(by_name: dict[str, Criterion], strict: bool) -> list[str]:
    """The softer signals that hold: GPU memory or latency failing, free KV at WATCH (the
    last only counts toward two of three, never alone)."""
    signals = [f"{by_name[n].title}: failed ({by_name[n].reason})"
               for n in ("gpu_memory", "latency") if n in by_name and by_name[n].state == "fail"]
    kv = by_name.get("kv_free")
    if not strict and kv is not None and kv.state == "watch":
        signals.append(f"{kv.title}: WATCH ({kv.reason})")
    return signals
