"""What the server did under load (the report's figures) and the levers they point to:
docs/rehearse.md's advice table. A leak or a stall stands alone; otherwise the capacity
levers, a low prefix-cache hit rate and failed requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from kvtop.derive.samples import percentile
from kvtop.derive.worst import LEAK_NEXT_STEP, describe_size, leak_size
from kvtop.rehearse.criteria import Criterion, Span, rounded
from kvtop.rehearse.requests import RequestTable
from kvtop.rehearse.verdict import Stall
from kvtop.rehearse.watch import WatchData

PINNED_USAGE = 0.95
PINNED_SHARE = 0.25  # of the scrapes under load, for "the pool is pinned"
LONG_PROMPT_FRAC = 0.25  # prompt p90 / context length from which prompts count as long
PREEMPTIONS_PER_MIN = 1.0
HIT_RATE_SHORTFALL = 0.5  # hit rate below this share of the workload's expected one


@dataclass
class Advice:
    lever: str
    action: str
    figures: dict[str, Any]


@dataclass
class LoadFigures:
    """What the server did under load, for the advice table and the report."""

    pinned_share: float | None = None  # scrapes with KV usage >= PINNED_USAGE
    usage_max: float | None = None
    preemptions: float | None = None
    preemptions_per_min: float | None = None
    waiting_p90: float | None = None
    running_max: float | None = None
    hit_rate: float | None = None  # prefix-cache hits / queries under load
    prompt_p90: float | None = None  # tokens, as the server counted them


def load_figures(data: WatchData, span: Span, table: RequestTable | None) -> LoadFigures:
    figures = LoadFigures()
    load = [p for points in data.points.values() for p in points if span.holds(p.t)]
    usages = [p.usage for p in load if p.usage is not None]
    if usages:
        figures.pinned_share = sum(u >= PINNED_USAGE for u in usages) / len(usages)
        figures.usage_max = max(usages)
    waiting = [p.waiting for p in load if p.waiting is not None]
    figures.waiting_p90 = percentile(waiting, 0.9)
    running = [p.running for p in load if p.running is not None]
    figures.running_max = max(running) if running else None
    preempted = _counter_rise(data, span, "preemptions")
    if preempted is not None:
        figures.preemptions = preempted
        figures.preemptions_per_min = preempted / (span.length / 60)
    hits, queries = _counter_rise(data, span, "prefix_hits"), _counter_rise(data, span,
                                                                            "prefix_queries")
    if hits is not None and queries:
        figures.hit_rate = hits / queries
    if table is not None and len(table):
        figures.prompt_p90 = percentile(list(table.prompt), 0.9)
    return figures


def _counter_rise(data: WatchData, span: Span, name: str) -> float | None:
    """A counter's increase over the load, summed over engines; restarts (a drop) count
    from zero."""
    total, seen = 0.0, False
    for points in data.points.values():
        values = [getattr(p, name) for p in points if span.holds(p.t)]
        values = [v for v in values if v is not None]
        for before, now in pairwise(values):
            total += now - before if now >= before else now
            seen = True
    return total if seen else None


def advise(criteria: dict[str, Criterion], figures: LoadFigures, *, model_len: int | None,
           expected_hit_rate: float | None, error_rate: float | None,
           errors: dict[str, int], stall: Stall | None = None) -> list[Advice]:
    """The levers the evidence points to (docs/rehearse.md's table), each with its figures.
    A leak or a stall explains a pinned pool and the queues behind it, so they stand alone
    then."""
    out: list[Advice] = []
    kv = criteria.get("kv_free")
    if kv is not None and kv.state == "fail":
        leak = _leak_figures(kv)
        out.append(Advice("leak", f"the idle floor rises: a KV leak of "
                          f"{describe_size(leak['size'])}; {LEAK_NEXT_STEP}",
                          {k: v for k, v in leak.items() if k != "size"}))
    if stall is not None and stall.state == "stalled":
        out.append(Advice("stall", f"the engine stopped making progress: {stall.reason}; its "
                          "log says why (a hung worker, a wedged scheduler); record it "
                          "(kvtop record), report it upstream, restart the server",
                          {"engine": stall.engine, "reason": stall.reason}))
    if not out:
        out += _capacity_advice(figures, model_len)
    if (expected_hit_rate and figures.hit_rate is not None
            and figures.hit_rate < HIT_RATE_SHORTFALL * expected_hit_rate):
        out.append(Advice("prefix-caching", "a low hit rate on a shared-prefix workload: "
                          "prefix caching is off (--enable-prefix-caching) or the prompts "
                          "do not share a prefix",
                          {"hit_rate": rounded(figures.hit_rate, 3),
                           "expected_hit_rate": rounded(expected_hit_rate, 3)}))
    if error_rate:
        common = max(errors.items(), key=lambda kv: kv[1])[0] if errors else None
        out.append(Advice("errors", "requests failed: the server's log says why",
                          {"error_rate": rounded(error_rate, 4), "most_common": common}))
    return out


def _capacity_advice(figures: LoadFigures, model_len: int | None) -> list[Advice]:
    long_prompts = (figures.prompt_p90 is not None and model_len is not None
                    and figures.prompt_p90 >= LONG_PROMPT_FRAC * model_len)
    pinned = figures.pinned_share is not None and figures.pinned_share >= PINNED_SHARE
    prompt = {"prompt_p90_tokens": rounded(figures.prompt_p90, 0), "max_model_len": model_len}
    if pinned and long_prompts:
        return [Advice("max-model-len", "the pool is pinned by long prompts: lower "
                       "--max-model-len or split long tasks",
                       {"pinned_share": rounded(figures.pinned_share, 3), **prompt})]
    queued = ((figures.preemptions_per_min or 0) >= PREEMPTIONS_PER_MIN
              or (figures.waiting_p90 or 0) >= 1)
    if queued:
        return [Advice("max-num-seqs", "queues and preemptions at moderate context: cap "
                       "--max-num-seqs (or the clients' concurrency), or raise "
                       "--gpu-memory-utilization",
                       {"preemptions_per_min": rounded(figures.preemptions_per_min, 2),
                        "waiting_p90": rounded(figures.waiting_p90, 1),
                        "running_max": figures.running_max, **prompt})]
    return []


def _leak_figures(kv: Criterion) -> dict[str, Any]:
    worst = max(kv.figures.get("engines", []),
                key=lambda e: ((e.get("leak_size") or {}).get("blocks") or 0,
                               e.get("idle_used_rise") or 0), default={})
    detector = worst.get("leak_detector") or {}
    size = worst.get("leak_size") or leak_size(None, None, None)
    return {"idle_used_before": worst.get("idle_used_before"),
            "idle_used_after": worst.get("idle_used_after"),
            "leak_verdict": detector.get("verdict"),
            "leaked_blocks": size["blocks"], "leaked_tokens": size["tokens"],
            "leaked_gib": size["gib"],
            "slope_blocks_per_hour": detector.get("slope_blocks_per_hour"), "size": size}
