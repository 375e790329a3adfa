"""The rehearsal's GPU criterion: **GPU memory stable**.

Per GPU, the median memory used in the last third against the first; *fail* when it rose by
more than max(1 % of the GPU, 512 MiB) and the Theil-Sen trend over the windows is rising
(99 % lower bound above 0); *watch* on half that rise with a positive trend (docs/rehearse.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from kvtop.derive.samples import median, theil_sen
from kvtop.rehearse.criteria import (
    STATE_RANK,
    TITLES,
    WINDOWS,
    Criterion,
    Span,
    State,
    Z,
    rounded,
    signed,
)
from kvtop.rehearse.watch import GpuPoint

GPU_RISE_FRAC = 0.01
GPU_RISE_MIN_BYTES = 512 * 2**20
GPU_MIN_POINTS = 3  # per third
GIB = 2**30


def judge_gpu(points: list[GpuPoint], span: Span, unavailable: str | None) -> Criterion:
    by_gpu: dict[int, list[GpuPoint]] = defaultdict(list)
    for point in points:
        if span.holds(point.t):
            by_gpu[point.index].append(point)
    if not by_gpu:
        why = unavailable or "no GPU memory readings under load"
        return Criterion("gpu_memory", TITLES["gpu_memory"], "not_judged",
                         f"not judged: {why}")
    results = [_one_gpu(index, series, span) for index, series in sorted(by_gpu.items())]
    judged = [r for r in results if r[0] != "not_judged"]
    figures = {"gpus": [r[2] for r in results]}
    if not judged:
        return Criterion("gpu_memory", TITLES["gpu_memory"], "not_judged",
                         "not judged: too few GPU readings in the first or last third", figures)
    worst = max(judged, key=lambda r: STATE_RANK[r[0]])
    return Criterion("gpu_memory", TITLES["gpu_memory"], worst[0], worst[1], figures)


def _one_gpu(index: int, series: list[GpuPoint], span: Span
             ) -> tuple[State, str, dict[str, Any]]:
    thirds: list[list[float]] = [[], [], []]
    windows: list[list[float]] = [[] for _ in range(WINDOWS)]
    for point in series:
        thirds[span.third(point.t)].append(point.used)
        windows[span.window(point.t)].append(point.used)
    total = series[-1].total
    figures: dict[str, Any] = {"index": index, "name": series[-1].name,
                               "total_gib": rounded(total / GIB, 2)}
    if len(thirds[0]) < GPU_MIN_POINTS or len(thirds[2]) < GPU_MIN_POINTS:
        return "not_judged", f"GPU {index}: too few readings", figures
    first, last = median(thirds[0]), median(thirds[2])
    limit = max(GPU_RISE_FRAC * total, GPU_RISE_MIN_BYTES)
    xs = [span.window_hours(w) for w in range(WINDOWS) if windows[w]]
    ys = [median(windows[w]) for w in range(WINDOWS) if windows[w]]
    slope, lower, _ = theil_sen(xs, ys, Z) if len(xs) >= 3 else (0.0, -math.inf, math.inf)
    rise = last - first
    figures.update({"first_gib": rounded(first / GIB, 3), "last_gib": rounded(last / GIB, 3),
                    "rise_gib": rounded(rise / GIB, 3), "limit_gib": rounded(limit / GIB, 3),
                    "trend_gib_per_hour": rounded(slope / GIB, 3)})
    said = (f"GPU {index}: {first / GIB:.2f} GiB used in the first third, {last / GIB:.2f} "
            f"in the last ({signed(rise / GIB, '.2f')} GiB; limit {limit / GIB:.2f})")
    if rise > limit and lower > 0:
        return "fail", "growing: " + said, figures
    if rise > limit / 2 and slope > 0:
        return "watch", "creeping up: " + said, figures
    return "ok", "stable: " + said, figures
