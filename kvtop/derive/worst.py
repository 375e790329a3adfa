"""The worst verdict each engine reached over a run, and when: what ``kvtop check`` reports
and what ``baseline`` and ``rehearse`` keep of the leak and stall detectors while they watch.

A verdict says what it rests on: a leak its size (blocks, and tokens and GiB where the
block size and the bytes a block holds are known) and the next step; no verdict (UNKNOWN)
what the detector still needs before it can say anything."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kvtop.collect.kv_events import KvEventBatch
from kvtop.collect.target import Scrape, Target
from kvtop.contract import json_number
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitParams
from kvtop.derive.stats import KvEventStats
from kvtop.derive.tracker import MAX_TRACKED_ENGINES, EngineKey, TargetTracker
from kvtop.derive.verdicts import (
    KV_LEAK_RANK,
    STALL_RANK,
    VERDICT_RANK,
    LeakVerdict,
    StallState,
    StallVerdict,
    Verdict,
)
from kvtop.exits import EXIT_INTERRUPTED, EXIT_LEAK, EXIT_NO_DATA, EXIT_OK, EXIT_STALLED

# Targets with a tracker at once: a Prometheus whose instances churn names new ones every
# refresh; past this (and an eighth more, so the trim is rare), those fed least recently
# lose their tracker, and their engines without a verdict are dropped (a verdict stays).
MAX_TRACKED_TARGETS = 2048
GIB = 2**30
LEAK_NEXT_STEP = ("record it (kvtop record), report it upstream with the recording, and "
                  "restart the server to get the blocks back")


def kv_bytes_per_block(cache_config: dict[str, str]) -> float | None:
    """The bytes one KV block holds, where the server says (vLLM's ``cache_config_info``):
    the KV memory over its GPU blocks, or the CPU swap space over its CPU blocks."""
    for memory, blocks in (("kv_cache_memory_bytes", "num_gpu_blocks"),
                           ("cpu_kvcache_space_bytes", "num_cpu_blocks")):
        size, count = _number(cache_config.get(memory)), _number(cache_config.get(blocks))
        if size and count:
            return size / count
    return None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


def leak_size(blocks: float | None, block_size: int | None,
              bytes_per_block: float | None) -> dict[str, float | None]:
    """A leak's size in blocks, tokens (with the block size) and GiB (with the bytes a
    block holds); None where unknown."""
    if blocks is None:
        return {"blocks": None, "tokens": None, "gib": None}
    return {"blocks": json_number(blocks, 1),
            "tokens": json_number(blocks * block_size, 0) if block_size else None,
            "gib": json_number(blocks * bytes_per_block / GIB, 3) if bytes_per_block else None}


def describe_size(size: dict[str, float | None]) -> str:
    """"120 blocks (1,920 tokens, 0.23 GiB)": what is known of a leak's size."""
    if size["blocks"] is None:
        return "size unknown"
    extra = [f"{size['tokens']:,.0f} tokens" if size["tokens"] is not None else None,
             f"{size['gib']:.2f} GiB" if size["gib"] is not None else None]
    known = [part for part in extra if part]
    return f"{size['blocks']:,.0f} blocks" + (f" ({', '.join(known)})" if known else "")


def warmup_needs(params: LeakParams, first_t: float | None, last_t: float | None) -> str:
    """What the leak detector still needs to leave warm-up, in words: the time under load
    its floor trend takes, or one idle period (the pool drained to its floor)."""
    left = (max(params.trend_min_span_s, params.trend_min_buckets * params.bucket_s)
            - seen_span(first_t, last_t))
    idle = (f"one idle period (nothing running or waiting for {params.idle_min_s:.0f} s, "
            f"{params.idle_min_scrapes} scrapes)")
    if left <= 0:
        return f"needs more scrapes under steady load, or {idle}"
    return f"needs {math.ceil(left / 60)} more minutes of scrapes under load, or {idle}"


def seen_span(first_t: float | None, last_t: float | None) -> float:
    """Seconds from an engine's first to its last good scrape (0 before two)."""
    return 0.0 if first_t is None or last_t is None else max(0.0, last_t - first_t)


def block_hash_text(key: int) -> str:
    """A block's 64-bit key as people and files read it: 16 hex digits."""
    return f"{key:016x}"


@dataclass(slots=True)
class EngineVerdict:
    """The worst state one engine reached, and when each state was first reached."""

    model: str | None
    engine: str | None
    verdict: Verdict = "unknown"
    leak_first_t: float | None = None
    watch_first_t: float | None = None
    at_worst: LeakVerdict | None = None  # the latest verdict while at the worst state
    stall: StallState = "unknown"  # the worst stall state reached
    stall_at_worst: StallVerdict | None = None
    stall_first_t: float | None = None  # first STALLED
    saturated_first_t: float | None = None  # first SATURATED
    limits: dict[str, int] = field(default_factory=dict)  # scrapes per limit word (8 words)
    kv_events: KvEventStats | None = None  # the KV-event witness at its worst state
    kv_evidence_first_t: float | None = None  # first exact leak evidence
    first_t: float | None = None  # the engine's first and last good scrape
    last_t: float | None = None
    block_size: int | None = None  # tokens per block, where the server says
    bytes_per_block: float | None = None  # where the server says (kv_bytes_per_block)

    def observe_limit(self, limit: str) -> None:
        self.limits[limit] = self.limits.get(limit, 0) + 1

    def observe_kv_events(self, t: float, events: KvEventStats) -> None:
        """The exact leak evidence, kept apart from the leak verdict (never merged)."""
        if events.leak == "evidence" and self.kv_evidence_first_t is None:
            self.kv_evidence_first_t = t
        worst = self.kv_events
        if worst is None or KV_LEAK_RANK[events.leak] >= KV_LEAK_RANK[worst.leak]:
            self.kv_events = events

    def seen(self, t: float, block_size: int | None = None,
             cache_config: dict[str, str] | None = None) -> None:
        """One good scrape of the engine at ``t``, with what it says of its blocks."""
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        if block_size:
            self.block_size = block_size
        if cache_config:
            self.bytes_per_block = kv_bytes_per_block(cache_config) or self.bytes_per_block

    @property
    def leak_size(self) -> dict[str, float | None]:
        worst = self.at_worst
        return leak_size(worst.leaked_blocks if worst else None, self.block_size,
                         self.bytes_per_block)

    def observe_stall(self, t: float, stall: StallVerdict) -> None:
        if stall.state == "stalled" and self.stall_first_t is None:
            self.stall_first_t = t
        if stall.state == "saturated" and self.saturated_first_t is None:
            self.saturated_first_t = t
        if STALL_RANK[stall.state] >= STALL_RANK[self.stall] and stall.state != "unknown":
            self.stall, self.stall_at_worst = stall.state, stall

    def observe(self, t: float, leak: LeakVerdict) -> None:
        state: Verdict = "unknown" if leak.state == "warmup" else leak.state
        if state == "leak" and self.leak_first_t is None:
            self.leak_first_t = t
        if state in ("watch", "leak") and self.watch_first_t is None:
            self.watch_first_t = t
        if VERDICT_RANK[state] >= VERDICT_RANK[self.verdict] and state != "unknown":
            self.verdict, self.at_worst = state, leak

    def needs(self, params: LeakParams | None) -> str | None:
        """What an engine without a verdict still needs; None once it has one."""
        if self.verdict != "unknown":
            return None
        return warmup_needs(params or LeakParams(), self.first_t, self.last_t)

    def next_step(self) -> str | None:
        return LEAK_NEXT_STEP if self.verdict == "leak" else None

    def to_json(self, params: LeakParams | None = None) -> dict[str, Any]:
        worst = self.at_worst
        size = self.leak_size
        return {
            "model": self.model, "engine": self.engine, "verdict": self.verdict,
            "leak_first_t": self.leak_first_t, "watch_first_t": self.watch_first_t,
            "leaked_blocks": json_number(worst.leaked_blocks if worst else None, 1),
            "leaked_tokens": size["tokens"], "leaked_gib": size["gib"],
            "slope_blocks_per_hour": json_number(worst.slope_blocks_per_hour if worst else None, 1),
            "reason": worst.reason if worst else "not enough data for a verdict",
            "needs": self.needs(params), "next_step": self.next_step(),
            "stall": {
                "verdict": self.stall, "stalled_first_t": self.stall_first_t,
                "saturated_first_t": self.saturated_first_t,
                "reason": (self.stall_at_worst.reason if self.stall_at_worst
                           else "not enough data for a verdict")},
            "limits": dict(self.limits),
            "kv_events": self._kv_events_json(),
        }

    def _kv_events_json(self) -> dict[str, Any] | None:
        events = self.kv_events
        if events is None:
            return None
        return {"leak": events.leak, "reason": events.leak_reason,
                "evidence_first_t": self.kv_evidence_first_t,
                "leaked_blocks": events.leaked_blocks,
                "leaked_sample": [block_hash_text(k) for k in events.leaked_sample],
                "turnovers": json_number(events.turnovers, 2),
                "stored_total": events.stored_total, "removed_total": events.removed_total,
                "lost_batches": events.lost_batches, "malformed": events.malformed,
                "restarts": events.restarts}


@dataclass(slots=True)
class CheckRun:
    """Feeds scrapes through trackers and keeps each engine's worst verdict."""

    params: LeakParams | None = None
    limits: dict[str, LimitParams] = field(default_factory=dict)  # by target URL (config)
    trackers: dict[str, TargetTracker] = field(default_factory=dict)
    engines: dict[str, dict[EngineKey, EngineVerdict]] = field(default_factory=dict)
    first_t: float | None = None  # the span judged: first and last scrape fed, read or not
    last_t: float | None = None
    interrupted: bool = False  # Ctrl-C or SIGTERM ended the run: the verdict is so far

    def add_target(self, target: Target) -> None:
        if target.url not in self.trackers:
            self.trackers[target.url] = TargetTracker(target, leak_params=self.params,
                                                      limit_params=self.limits.get(target.url))
            self.engines[target.url] = {}

    def feed(self, scrape: Scrape) -> None:
        self.add_target(scrape.target)
        self.first_t = scrape.t if self.first_t is None else min(self.first_t, scrape.t)
        self.last_t = scrape.t if self.last_t is None else max(self.last_t, scrape.t)
        state = self.trackers[scrape.target.url].update(scrape)
        if len(self.trackers) > MAX_TRACKED_TARGETS + MAX_TRACKED_TARGETS // 8:
            self._forget_targets()
        if not scrape.ok or state.last_good_t != scrape.t:
            return
        verdicts = self.engines[scrape.target.url]
        for stats in state.engines:
            key = (stats.model, stats.engine)
            entry = verdicts.setdefault(key, EngineVerdict(stats.model, stats.engine))
            entry.seen(scrape.t, stats.block_size, stats.cache_config)
            if stats.leak is not None:
                entry.observe(scrape.t, stats.leak)
            if stats.stall is not None:
                entry.observe_stall(scrape.t, stats.stall)
            if stats.limit is not None:
                entry.observe_limit(stats.limit.limit)
            if stats.kv_events is not None:
                entry.observe_kv_events(scrape.t, stats.kv_events)
        if len(verdicts) > MAX_TRACKED_ENGINES:
            _forget_unjudged(verdicts, {(s.model, s.engine) for s in state.engines})

    def feed_kv_events(self, target: Target, batch: KvEventBatch) -> None:
        """A KV event batch of ``target`` (its engines' stats carry them from the next scrape)."""
        self.add_target(target)
        self.trackers[target.url].update_kv_events(batch)

    def _forget_targets(self) -> None:
        by_age = sorted(self.trackers, key=lambda url: self.trackers[url].state.last_attempt_t
                        or -math.inf)
        for url in by_age[:len(self.trackers) - MAX_TRACKED_TARGETS]:
            del self.trackers[url]
            judged = {key: entry for key, entry in self.engines[url].items()
                      if entry.verdict != "unknown" or entry.stall != "unknown"}
            if judged:
                self.engines[url] = judged
            else:
                del self.engines[url]

    @property
    def leak_found(self) -> bool:
        return self.verdict() == "leak"

    def verdict(self) -> Verdict:
        verdicts = [e.verdict for per in self.engines.values() for e in per.values()]
        return max(verdicts, key=VERDICT_RANK.__getitem__, default="unknown")

    def stall_verdict(self) -> StallState:
        states = [e.stall for per in self.engines.values() for e in per.values()]
        return max(states, key=STALL_RANK.__getitem__, default="unknown")

    def engines_seen(self) -> int:
        return sum(len(per) for per in self.engines.values())

    def to_json(self) -> dict[str, Any]:
        span = None if self.first_t is None or self.last_t is None else self.last_t - self.first_t
        return {"verdict": self.verdict(), "stall": self.stall_verdict(),
                "started_at": _iso(self.first_t), "ended_at": _iso(self.last_t),
                "duration_s": json_number(span, 3), "needs": self.needs(),
                "interrupted": self.interrupted,
                "targets": [{"target": url, "engines": [e.to_json(self.params)
                                                        for e in per.values()]}
                            for url, per in self.engines.items()]}

    def needs(self) -> str | None:
        """With no verdict (UNKNOWN): what it would take, in words; None otherwise."""
        if self.verdict() != "unknown":
            return None
        if not self.engines_seen():
            return "needs a target that answers with an inference server's metrics"
        waiting = [e for per in self.engines.values() for e in per.values()]
        closest = max(waiting, key=lambda e: seen_span(e.first_t, e.last_t))
        return closest.needs(self.params)

    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        verdict = self.verdict()
        if verdict == "leak":
            return EXIT_LEAK
        if self.stall_verdict() == "stalled":
            return EXIT_STALLED
        return EXIT_NO_DATA if verdict == "unknown" else EXIT_OK


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds")


def _forget_unjudged(verdicts: dict[EngineKey, EngineVerdict], current: set[EngineKey]) -> None:
    """Drop engines gone from the target that never got a verdict (a server inventing model
    names every scrape would otherwise grow the report without bound); a verdict, leak or
    stall, once reached, is the report and stays."""
    for key in [k for k, v in verdicts.items()
                if v.verdict == "unknown" and v.stall == "unknown" and k not in current]:
        del verdicts[key]
