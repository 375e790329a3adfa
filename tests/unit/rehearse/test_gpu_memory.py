"""The GPU memory criterion on made-up series whose answer is known: flat, growing,
no readings, and the limit either side of max(1 %, 512 MiB).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtop.rehearse.gpu_memory import judge_gpu
from kvtop.rehearse.watch import GpuPoint
from tests.scenarios.rehearse_runs import GIB, SPAN


def gpu_series(used_at: Callable[[float], float], total: int = 80 * GIB) -> list[GpuPoint]:
    return [GpuPoint(t, 0, "H100", int(used_at(t)), total) for t in range(0, 3601, 30)]


def test_gpu_memory() -> None:
    flat = judge_gpu(gpu_series(lambda t: 72 * GIB + (t % 90) * 2**20), SPAN, None)
    assert flat.state == "ok" and flat.figures["gpus"][0]["rise_gib"] < 0.2
    growing = judge_gpu(gpu_series(lambda t: 72 * GIB + 3 * GIB * t / 3600), SPAN, None)
    assert growing.state == "fail" and "growing" in growing.reason
    assert growing.figures["gpus"][0]["rise_gib"] == pytest.approx(2.0, abs=0.1)
    missing = judge_gpu([], SPAN, "NVML init failed: no driver")
    assert missing.state == "not_judged" and "no driver" in missing.reason


@pytest.mark.parametrize(("total_gib", "rise_gib", "state"), [
    (80, 0.79, "watch"),  # the limit is 1 % of an 80 GiB GPU: 0.8 GiB
    (80, 0.82, "fail"),
    (16, 0.45, "watch"),  # and 512 MiB on a 16 GiB one, where 1 % is less
    (16, 0.52, "fail"),
])
def test_the_gpu_limit_is_the_larger_of_1_percent_and_512_mib(total_gib: int, rise_gib: float,
                                                              state: str) -> None:
    # flat through the first third, up through the second, flat again through the last
    series = gpu_series(lambda t: 10 * GIB + rise_gib * GIB * min(1.0, max(
        0.0, 3 * t / 3600 - 1)), total=total_gib * GIB)
    criterion = judge_gpu(series, SPAN, None)
    assert criterion.state == state, criterion.reason
    limit = max(0.01 * total_gib, 0.5)
    assert criterion.figures["gpus"][0]["limit_gib"] == pytest.approx(limit, abs=1e-3)
