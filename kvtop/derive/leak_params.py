"""Every threshold of the KV-leak detector in one frozen record: the config file, rules,
check, baseline and rehearse pass it down. Why each default: docs/leak-detector.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeakParams:
    """Every threshold of :class:`LeakDetector`; docs/leak-detector.md says why each default."""

    bucket_s: float = 60.0  # floor = min of used blocks per bucket of this length
    window_s: float = 1800.0  # trend window (buckets kept); bounds memory and the slope's lag
    max_gap_s: float = 120.0  # a longer silence breaks an idle run and the evidence under load
    idle_min_s: float = 20.0  # an idle run counts once it spans this long...
    idle_min_scrapes: int = 3  # ...over at least this many scrapes (step-end stats lag)
    idle_leak_s: float = 60.0  # a residual held this long at idle (or twice) is a LEAK
    residual_min_blocks: float = 2.0  # blocks above the idle floor that count as held
    residual_min_frac: float = 0.001  # ...or this fraction of the pool, the larger
    trend_min_buckets: int = 10  # buckets needed before the floor trend is judged
    trend_min_span_s: float = 600.0  # and the time they must span
    z: float = 2.33  # one-sided 99 % normal quantile for the Theil–Sen lower bound
    watch_rise_frac: float = 0.01  # adjusted floor rise (of the pool) for WATCH
    leak_rise_frac: float = 0.015  # and for LEAK
    max_hours_to_full: float = 24.0  # slower trends are not the kind this detector reports
    max_load_share: float = 0.5  # the load may explain at most this share of the floor slope
    turnover_min: float = 3.0  # finished requests in the window / most running, at least
    leak_persist_s: float = 300.0  # a rising floor must hold this long to become LEAK...
    support_persist_s: float = 180.0  # ...or this long with a consequence alongside
    floor_grace_s: float = 180.0  # a floor evidence gap shorter than this keeps its age
    leak_hold_s: float = 1800.0  # LEAK stays this long after its last evidence
    watch_hold_s: float = 600.0  # WATCH likewise
    ref_buckets: int = 5  # buckets behind "the level now", "at the start", "lately"
    pinned_frac: float = 0.95  # usage counted as a full pool
    history_s: float = 3600.0  # buckets kept before the floor evidence: the leak's baseline
    estimate_buckets: int = 4  # latest buckets averaged into the leaked-block estimate
    step_z: float = 3.5  # a lump: the level after a split above the level before, this sure
    step_min_buckets: int = 5  # buckets on each side of the split
    explain_window_s: float = 3600.0  # the level the load does not explain: over this long
    explain_min_buckets: int = 15  # usable buckets (no preemption, not pinned) it needs
    explain_z: float = 3.5  # its step up (before/after split), at least this sure
    explain_noise: float = 2.0  # and at least this many times its own noise
