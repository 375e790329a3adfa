"""The leak detector's buckets: one bucket of scrapes (its floor, level and the load and
counts behind it) and what is read off a run of them: the load at the floor, the point the
leaked-block estimate fits, the bucket the load-explained level judges, turnover and
preemption rates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

from kvtop.derive.leak_estimate import LoadPoint
from kvtop.derive.leak_load import LoadBucket
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.samples import theil_sen
from kvtop.derive.stats import EngineStats


@dataclass(slots=True)
class Bucket:
    """One bucket's summary: the floor and the load and counts behind it."""

    index: int
    t: float  # time of the floor
    floor: float
    used_max: float
    first: bool = False  # first after a reset: partial, rates still warming up
    used_sum: float = 0.0
    scrapes: int = 0
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    seconds: float = 0.0  # scrape windows summed, for counts from rates
    finished: float | None = None
    tokens: float | None = None  # prompt + generated tokens processed
    generated: float | None = None
    preemptions: float | None = None
    in_flight: list[float] = field(default_factory=list)  # tokens in flight per scrape
    deferred: float = 0.0  # waiting requests deferred, summed over scrapes
    aborted: float = 0.0  # requests aborted
    prompt: float = 0.0  # prompt tokens
    prefix_queries: float = 0.0  # prefix-cache lookups and hits, tokens
    prefix_hits: float = 0.0

    def add(self, t: float, used: float, stats: EngineStats) -> None:
        if used < self.floor:
            self.t, self.floor = t, used
        self.used_max = max(self.used_max, used)
        self.used_sum += used
        self.scrapes += 1
        if stats.running is not None:
            self.running.append(stats.running)
        if stats.waiting is not None:
            self.waiting.append(stats.waiting)
        if stats.tokens_in_flight is not None:
            self.in_flight.append(stats.tokens_in_flight)
        self.deferred += stats.waiting_deferred or 0.0
        dt = stats.window_s
        if not dt or dt <= 0:
            return
        self.seconds += dt
        if stats.finished_per_s:
            self.finished = (self.finished or 0.0) + sum(stats.finished_per_s.values()) * dt
        if stats.prompt_tps is not None and stats.generation_tps is not None:
            self.tokens = (self.tokens or 0.0) + (stats.prompt_tps + stats.generation_tps) * dt
        if stats.generation_tps is not None:
            self.generated = (self.generated or 0.0) + stats.generation_tps * dt
        if stats.preemptions_per_s is not None:
            self.preemptions = (self.preemptions or 0.0) + stats.preemptions_per_s * dt
        self.aborted += (stats.finished_per_s or {}).get("abort", 0.0) * dt
        self.prompt += (stats.prompt_tps or 0.0) * dt
        if stats.prefix_queries_per_s and stats.hit_rate is not None:
            self.prefix_queries += stats.prefix_queries_per_s * dt
            self.prefix_hits += stats.hit_rate * stats.prefix_queries_per_s * dt


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def known(values: list[float | None]) -> list[float] | None:
    """The values when every one is known; None when any is missing."""
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None


def pool(stats: EngineStats) -> tuple[float, float, bool] | None:
    """(used, total, in_blocks); usage alone is taken as a fraction of a pool of 1."""
    usage = stats.kv_usage if stats.kv_usage is None or math.isfinite(stats.kv_usage) else None
    total = stats.blocks_total
    if stats.blocks_used is not None and math.isfinite(stats.blocks_used) and total:
        return stats.blocks_used, float(total), True
    if usage is not None and total:
        return usage * total, float(total), True
    if usage is not None:
        return usage, 1.0, False
    return None


def load_point(buckets: list[Bucket], p: LeakParams) -> LoadPoint:
    """The last bucket's level and load: running, and running × tokens per request."""
    last = buckets[-1]
    running = mean(last.running)
    loads: tuple[float, ...] = ()
    if running is not None:
        per_request = tokens_per_request(buckets[-p.ref_buckets:])
        loads = (running,) if per_request is None else (running, running * per_request)
    middle = (last.index + 0.5) * p.bucket_s  # the level is the whole bucket's mean
    return LoadPoint(middle, last.used_sum / last.scrapes, loads)


def load_bucket(buckets: list[Bucket], p: LeakParams, total: float) -> LoadBucket | None:
    """The last bucket for the load-explained level; None without tokens in flight at
    every scrape, or when requests were aborted while others waited and the tokens they
    may have taken from the ledger are not known."""
    last = buckets[-1]
    running = mean(last.running)
    if len(last.in_flight) < last.scrapes or running is None:
        return None
    lost = 0.0
    if last.aborted and any(last.waiting):  # aborted before their first token, at worst
        per_request = tokens_per_request(buckets[-p.ref_buckets:])
        if per_request is None:
            return None
        lost = last.aborted * per_request
    in_flight = sum(last.in_flight) / len(last.in_flight)
    hit_rate = last.prefix_hits / last.prefix_queries if last.prefix_queries else 0.0
    level = last.used_sum / last.scrapes
    # Preempted requests wait with their tokens still counted and no blocks, until resumed.
    calm = [b.preemptions == 0 for b in buckets[-2:]]
    usable = all(calm) and level < p.pinned_frac * total
    return LoadBucket((last.index + 0.5) * p.bucket_s, level, in_flight, running,
                      in_flight * hit_rate, last.prompt / max(last.seconds, 1e-9),
                      last.deferred / last.scrapes, lost, usable)


def tokens_per_request(recent: list[Bucket]) -> float | None:
    """Tokens per finished request over these buckets; None without both counters or
    without a finished request."""
    tokens = known([b.tokens for b in recent])
    finished = known([b.finished for b in recent])
    if tokens is None or finished is None or not sum(finished):
        return None
    return sum(tokens) / sum(finished)


def loads(buckets: list[Bucket], span: int) -> tuple[list[float], str]:
    """Per-bucket load at the floor: running × tokens per request when known, else running."""
    running = known([mean(b.running) for b in buckets])
    if running is None:
        return [0.0] * len(buckets), "none"
    out = []
    for i, r in enumerate(running):
        per_request = tokens_per_request(buckets[max(0, i - span + 1):i + 1])
        if per_request is None:
            return [float(r) for r in running], "running"
        out.append(r * per_request)
    return out, "tokens"


def per_load(levels: list[float], loads: list[float], z: float) -> float:
    """Blocks per unit of load, from bucket-to-bucket changes: a leak adds blocks at a pace
    unrelated to the load's ups and downs, so it barely biases this slope."""
    # a load steady but for float rounding (rates like 2/300 a second) has changes of ~1e-12
    # of itself: read as changes, the slope over them comes out at ~1e10 blocks per unit
    noise = 1e-9 * max((abs(load) for load in loads), default=0.0)
    d_load = [0.0 if abs(b - a) <= noise else b - a for a, b in pairwise(loads)]
    d_level = [b - a for a, b in pairwise(levels)]
    if not any(d_load):
        return 0.0
    return max(theil_sen(d_load, d_level, z)[0], 0.0)


def turnover(buckets: list[Bucket]) -> float | None:
    finished = [b.finished for b in buckets if b.finished is not None]
    if not finished:
        return None
    most = max((max(b.running) for b in buckets if b.running), default=0.0)
    return sum(finished) / max(most, 1.0)


def preempt_rate(buckets: list[Bucket]) -> float | None:
    counts = known([b.preemptions for b in buckets])
    seconds = sum(b.seconds for b in buckets)
    if counts is None or not seconds:
        return None
    return sum(counts) / seconds
