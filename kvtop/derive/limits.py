"""What limits an engine: one word for what holds its queue back, from the reasons the
server gives for waiting, its KV usage and preemptions, and its scheduler limits.

In order, the first that applies (docs/kv-anatomy.md, "What limits this engine"):

* **sleeping** - vLLM's sleep mode: weights offloaded or the KV pool discarded.
* **unknown** - no waiting count is exported.
* **none** - nothing waits.
* **KV transfer** - most waiting requests are deferred, and at least half of those wait on
  an async KV load (disaggregated serving).
* **deferred** - most waiting requests are deferred (LoRA budget, a blocked status).
* **max sequences** - llama.cpp requests wait for a free slot; or (waiting for capacity)
  the running count is at the known ``max_num_seqs``, or has held one value for
  ``plateau_scrapes`` scrapes with requests waiting, while the pool has room.
* **KV capacity** - requests wait for capacity and the pool is at least ``kv_full`` used,
  or requests were preempted in the window, or the free KV is less than a mean prompt.
* **token budget** - requests wait for capacity with KV room and the running count moving:
  the step's token budget (``max_num_batched_tokens``), by elimination.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LimitVerdict


@dataclass(frozen=True)
class LimitParams:
    kv_full: float = 0.90  # usage from which waiting for capacity is the KV pool's doing
    plateau_scrapes: int = 3  # running held this long with a queue: at max_num_seqs
    max_num_seqs: int | None = None  # the scheduler's, when the config names it


@dataclass(frozen=True)
class _Counts:
    waiting: float
    capacity: float
    deferred: float
    fetching: float
    slots: float
    reasons_known: bool


def _counts(stats: EngineStats, waiting: float) -> _Counts:
    reasons = stats.waiting_by_reason
    fetching = sum((stats.kv_fetch_by_stage or {}).values())
    if reasons is None:  # no reasons exported: every waiting request waits for capacity
        return _Counts(waiting, waiting, 0.0, fetching, 0.0, False)
    return _Counts(waiting, reasons.get("capacity", 0.0), reasons.get("deferred", 0.0),
                   fetching, reasons.get("slots", 0.0), True)


def _usage(stats: EngineStats) -> float | None:
    if stats.kv_usage is not None:
        return stats.kv_usage
    if stats.blocks_used is not None and stats.blocks_total:
        return stats.blocks_used / stats.blocks_total
    return None


class LimitDetector:
    """Feed one :class:`EngineStats` per scrape, in time order."""

    def __init__(self, params: LimitParams | None = None) -> None:
        self.params = params or LimitParams()
        self._running: deque[float | None] = deque(maxlen=self.params.plateau_scrapes)

    def update(self, stats: EngineStats) -> LimitVerdict:
        waiting = stats.waiting
        self._running.append(stats.running if waiting else None)
        if stats.sleep_state not in (None, "awake"):
            what = ("weights offloaded, KV pool discarded" if stats.sleep_state ==
                    "weights_offloaded" else "all GPU memory discarded")
            return LimitVerdict("sleeping", f"asleep ({what})",
                                {"sleep_state": stats.sleep_state})
        if waiting is None:
            return LimitVerdict("unknown", "the server exports no waiting count")
        if waiting <= 0:
            return LimitVerdict("none", "nothing waits", {"waiting": 0.0})
        counts = _counts(stats, waiting)
        evidence: dict[str, float | str] = {"waiting": waiting}
        if counts.reasons_known:
            evidence |= {"capacity": counts.capacity, "deferred": counts.deferred}
        if counts.deferred > counts.capacity:
            return self._deferred(counts, evidence)
        if counts.slots > 0:
            return LimitVerdict("max_sequences",
                                f"{counts.slots:.0f} requests wait for a free slot", evidence)
        return self._capacity(stats, counts, evidence)

    def _deferred(self, counts: _Counts, evidence: dict[str, float | str]) -> LimitVerdict:
        if counts.fetching and counts.fetching * 2 >= counts.deferred:
            evidence["kv_fetching"] = counts.fetching
            return LimitVerdict("kv_transfer", f"{counts.fetching:.0f} of {counts.waiting:.0f} "
                                "waiting requests wait on a KV transfer", evidence)
        return LimitVerdict("deferred", f"{counts.deferred:.0f} of {counts.waiting:.0f} waiting "
                            "requests are deferred (LoRA budget, KV transfer, blocked)", evidence)

    def _capacity(self, stats: EngineStats, counts: _Counts,
                  evidence: dict[str, float | str]) -> LimitVerdict:
        p, usage, waits = self.params, _usage(stats), f"{counts.capacity:.0f} waiting"
        if not counts.reasons_known:
            evidence["reasons"] = "not exported: all waiting read as capacity"
        if usage is not None:
            evidence["kv_usage"] = usage
        if usage is not None and usage >= p.kv_full:
            return LimitVerdict("kv_capacity", f"KV pool {usage:.0%} used, {waits}", evidence)
        if stats.preemptions_per_s:
            evidence["preemptions_per_s"] = stats.preemptions_per_s
            return LimitVerdict("kv_capacity", f"preempting {stats.preemptions_per_s:.2g}/s, "
                                f"{waits}", evidence)
        free, prompt = self._free_tokens(stats, usage), stats.mean_prompt_tokens
        if free is not None and prompt is not None and free < prompt:
            evidence |= {"free_tokens": free, "mean_prompt_tokens": prompt}
            return LimitVerdict("kv_capacity", f"{free:,.0f} tokens of KV free, less than a "
                                f"mean prompt ({prompt:,.0f}), {waits}", evidence)
        ceiling = self._ceiling(stats)
        if ceiling is not None:
            evidence["running"] = ceiling
            return LimitVerdict("max_sequences", f"{ceiling:.0f} running (held there), {waits}",
                                evidence)
        if usage is None:
            return LimitVerdict("unknown", f"{waits}; the server exports no KV usage", evidence)
        return LimitVerdict("token_budget", f"KV pool {usage:.0%} used and the running count "
                            f"moving, {waits}: the step's token budget", evidence)

    @staticmethod
    def _free_tokens(stats: EngineStats, usage: float | None) -> float | None:
        if stats.tokens_total is None or usage is None:
            return None
        return max(0.0, (1.0 - usage) * stats.tokens_total)

    def _ceiling(self, stats: EngineStats) -> float | None:
        """The running count when it is at the scheduler's limit: the known max_num_seqs, or
        one value held for plateau_scrapes scrapes with requests waiting."""
        running, most = stats.running, self.params.max_num_seqs
        if running is None or running <= 0:
            return None
        if most is not None:
            return running if running >= most else None
        held = self._running
        if len(held) == held.maxlen and all(r == running for r in held):
            return running
        return None

