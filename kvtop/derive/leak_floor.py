"""The rising-floor evidence of the leak detector: over the buckets in the trend window, the
floor's level with the load's share taken out, its Theil–Sen slope and bound, a lump (a step
up that stays), the batch's turnover and the consequences that only confirm a floor. Method
and thresholds: docs/leak-detector.md."""

from __future__ import annotations

from dataclasses import dataclass

from kvtop.derive.leak_buckets import Bucket, known, loads, mean, per_load, preempt_rate, turnover
from kvtop.derive.leak_load import best_split
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.samples import median, theil_sen


@dataclass(frozen=True, slots=True)
class FloorTrend:
    """The rising-floor analysis of the buckets in the window."""

    slope: float  # load-adjusted floor, blocks per hour
    lower: float  # its lower confidence bound
    raw_slope: float  # the floor's own slope
    load_slope: float  # the load's slope, in load units per hour
    per_load: float  # blocks per unit of load (robust ratio)
    rise: float  # adjusted level now minus at the window's start, blocks
    floor_now: float
    turnover: float | None  # finished / most running (recent part x turnover_min); None: unknown
    load_measure: str  # "tokens", "running" or "none"
    consequences: tuple[str, ...]
    step: float = 0.0  # a lump: adjusted level after the split minus before, blocks (0: none)


def enough(buckets: list[Bucket], p: LeakParams) -> bool:
    """Enough buckets, spanning long enough, for a trend to be judged."""
    return (len(buckets) >= max(p.trend_min_buckets, 3)
            and buckets[-1].t - buckets[0].t >= p.trend_min_span_s)


def floor_trend(all_buckets: list[Bucket], p: LeakParams, total: float) -> FloorTrend | None:
    """The trend over the buckets not spent pinned full; None when too few are left."""
    bucket_loads, measure = loads(all_buckets, p.ref_buckets)
    # A bucket spent pinned full is censored: its level is the pool's size, whatever the
    # working set and the leak, and "level − k × load" rises whenever the load the
    # finished requests suggest falls (overload: short requests finish, long ones are
    # preempted). Such buckets carry no floor evidence either way.
    cap = p.pinned_frac * total
    kept = [i for i, b in enumerate(all_buckets) if b.used_sum / b.scrapes < cap]
    buckets, kept_loads = [all_buckets[i] for i in kept], [bucket_loads[i] for i in kept]
    if not enough(buckets, p):
        return None
    floors = [b.used_sum / b.scrapes for b in buckets]  # bucket level, see docs
    xs = [(b.t - buckets[0].t) / 3600 for b in buckets]
    blocks_per_load = per_load(floors, kept_loads, p.z)
    adjusted = [f - blocks_per_load * load for f, load in zip(floors, kept_loads, strict=True)]
    slope, lower, _ = theil_sen(xs, adjusted, p.z)
    raw_slope = theil_sen(xs, floors, p.z)[0]
    load_slope = theil_sen(xs, kept_loads, p.z)[0]
    refs = buckets[-p.ref_buckets:]
    floor_now = median([b.floor for b in refs])
    # Rise within the window: both ends use the same per_load, so load drift cancels.
    rise = median(adjusted[-p.ref_buckets:]) - median(adjusted[:p.ref_buckets])
    # The batch must have turned over in the window and lately, so that the raised level
    # is not the same requests sitting there (a stall, one long generation).
    window, recent = turnover(buckets), turnover(refs)
    turned = None if window is None or recent is None else min(window, p.turnover_min * recent)
    all_xs = [(b.t - all_buckets[0].t) / 3600 for b in all_buckets]
    return FloorTrend(slope, lower, raw_slope, load_slope, blocks_per_load, rise, floor_now,
                      turned, measure, consequences(all_buckets, all_xs, p, total),
                      step(adjusted, floors, p))


def step(adjusted: list[float], levels: list[float], p: LeakParams) -> float:
    """A lump: the adjusted level stepped up and stayed up (leaked blocks never come
    back). The split that separates the levels best by a rank test, when it is sure at
    `step_z` (many splits are tried), most of the step is not load, and the latest
    buckets are still up; 0.0 otherwise."""
    best = best_split(adjusted, p.step_min_buckets)
    if best is None or best[1] < p.step_z:
        return 0.0
    k = best[0]
    before = median(adjusted[:k])
    rise = median(adjusted[k:]) - before
    raw_rise = median(levels[k:]) - median(levels[:k])
    still_up = median(adjusted[-p.ref_buckets:]) - before >= rise / 2
    return rise if rise >= (1 - p.max_load_share) * max(raw_rise, 0.0) and still_up else 0.0


def consequences(buckets: list[Bucket], xs: list[float], p: LeakParams,
                 total: float) -> tuple[str, ...]:
    """What a leak does to the server besides the floor: they confirm one, never alone."""
    found = []
    waiting = known([mean(b.waiting) for b in buckets])
    throughput = known([b.generated / b.seconds
                        if b.generated is not None and b.seconds else None
                        for b in buckets])
    if waiting is not None and throughput is not None:
        w_lower = theil_sen(xs, waiting, p.z)[1]
        if w_lower > 0 and theil_sen(xs, throughput, p.z)[0] <= 0:
            found.append("queue growing at flat throughput")
    half = len(buckets) // 2
    early, late = preempt_rate(buckets[:half]), preempt_rate(buckets[half:])
    run_early = mean([r for b in buckets[:half] for r in b.running])
    run_late = mean([r for b in buckets[half:] for r in b.running])
    if (early is not None and late is not None and run_early and run_late
            and late > 2 * early + 1e-3 and run_late <= 1.1 * run_early):
        found.append("preemptions up at the same load")
    running = known([mean(b.running) for b in buckets])
    pinned = median([b.used_max for b in buckets[-p.ref_buckets:]]) >= p.pinned_frac * total
    if pinned and running is not None and theil_sen(xs, running, p.z)[2] < 0:
        found.append("pool pinned full while running falls")
    return tuple(found)


def floor_ok(trend: FloorTrend, p: LeakParams, total: float) -> bool:
    """Watch-level floor evidence: significant, big, fast (or a lump), not load, batch
    turned over."""
    free = max(total - trend.floor_now, 0.0)
    turned = trend.turnover is None or trend.turnover >= p.turnover_min
    rising = (trend.lower > 0 and trend.slope > 0
              and trend.rise >= p.watch_rise_frac * total
              and free / trend.slope <= p.max_hours_to_full
              and trend.slope >= (1 - p.max_load_share) * max(trend.raw_slope, 0.0))
    return turned and (rising or trend.step >= p.watch_rise_frac * total)
