"""The figures a baseline keeps and ``kvtop compare`` judges, and what counts as a change.

Each figure has a headline value (what a person reads: a median, a rate over the whole
run, a latency quantile over the whole run) and per-minute values (what the rank test
compares). A change is judged only when it is both beyond run-to-run noise (the rank test)
and large enough to matter (``rel`` of the baseline's value and at least ``floor``):
a 0.3 % rise in KV usage can be significant over hours and still mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Unit = Literal["fraction", "count", "per_min", "per_s", "tokens_per_s", "seconds", "bytes"]
# Which way is worse; "load" figures (throughput, requests running) describe the workload
# more than the server, so they are marked higher/lower, never worse: they explain the rest.
Worse = Literal["higher", "lower", "load"]


@dataclass(frozen=True, slots=True)
class FigureSpec:
    key: str
    label: str
    unit: Unit
    worse: Worse
    rel: float  # smallest change that counts, as a fraction of the baseline's value...
    floor: float  # ...and at least this much, in the figure's unit
    # A healthy server holds it steady (the idle floor comes back to the same blocks every
    # time): the run-to-run noise is the baseline's spread alone, not the spread of a run
    # whose rise is the very change (a leak's floor climbing).
    steady: bool = False


def _latency(name: str, label: str, floor: float) -> tuple[FigureSpec, ...]:
    return tuple(FigureSpec(f"{name}_{q}", f"{label} {q}", "seconds", "higher", 0.2, floor)
                 for q in ("p50", "p99"))


ENGINE_FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("kv_usage", "KV usage p50", "fraction", "higher", 0.1, 0.03),
    FigureSpec("idle_kv_usage", "KV used at idle", "fraction", "higher", 0.0, 0.005,
               steady=True),
    FigureSpec("preemptions_per_min", "preemptions/min", "per_min", "higher", 0.5, 1.0),
    FigureSpec("waiting", "waiting (mean)", "count", "higher", 0.25, 0.5),
    FigureSpec("running", "running (mean)", "count", "load", 0.1, 1.0),
    FigureSpec("hit_rate", "prefix hit rate", "fraction", "lower", 0.0, 0.05),
    FigureSpec("prompt_tps", "prompt tokens/s", "tokens_per_s", "load", 0.1, 1.0),
    FigureSpec("generation_tps", "generation tokens/s", "tokens_per_s", "load", 0.1, 1.0),
    *_latency("ttft", "TTFT", 0.005),
    *_latency("itl", "ITL", 0.002),
    *_latency("e2e", "E2E", 0.05),
    # KV anatomy (docs/kv-anatomy.md): how much prompt KV was found cached, how long blocks
    # lived before eviction (shorter: the pool churns), how often the pool held the queue
    FigureSpec("reuse_share", "prefix reuse share", "fraction", "lower", 0.0, 0.05),
    *(FigureSpec(f"block_lifetime_{q}", f"block lifetime {q}", "seconds", "lower", 0.2, 0.01)
      for q in ("p50", "p99")),
    FigureSpec("kv_limited", "limited by KV capacity", "fraction", "higher", 0.0, 0.1),
)
GPU_MEMORY = FigureSpec("memory_used_bytes", "GPU memory used", "bytes", "load", 0.02,
                        256 * 2**20)
PROBE_FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("ttft", "probe TTFT", "seconds", "higher", 0.2, 0.005),
    FigureSpec("total", "probe total", "seconds", "higher", 0.2, 0.01),
)
SPECS: dict[str, FigureSpec] = {spec.key: spec for spec in ENGINE_FIGURES}
