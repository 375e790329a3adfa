"""The GPU memory criterion on made-up series whose answer is known: flat, growing,
no readings, and the limit either side of max(1 %, 512 MiB).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtop.rehearse.criteria import WINDOWS, Criterion, Span
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


MIB = 2**20
TITLE = "GPU memory stable"


def by_window(used: list[float], *, total: float, index: int = 0, name: str = "H100",
              span: Span = SPAN, per_window: int = 1) -> list[GpuPoint]:
    """``per_window`` readings in each window of ``span`` whose ``used`` is given (one value
    per window, None for a window with no reading), at the window's centre and spread around
    it."""
    width = span.length / WINDOWS
    return [GpuPoint(span.start + width * (w + (k + 1) / (per_window + 1)), index, name,
                     int(value), int(total))
            for w, value in enumerate(used) if value is not None for k in range(per_window)]


def steps(step: float, *, base: float = 10 * GIB) -> list[float]:
    return [base + w * step for w in range(WINDOWS)]


def test_a_growing_gpu_in_figures_and_words() -> None:
    # 1.2353 GiB an hour, one reading a window at its centre: the thirds' medians are at
    # 600 s and 3000 s, 0.2059 and 1.0294 GiB above the 10 GiB start
    series = by_window([10 * GIB + 1.2353 * GIB * (w + 0.5) / WINDOWS for w in range(WINDOWS)],
                       total=80.4567 * GIB, index=3, name="H100 80GB HBM3")
    assert judge_gpu(series, SPAN, None) == Criterion(
        "gpu_memory", TITLE, "fail",
        "growing: GPU 3: 10.21 GiB used in the first third, 11.03 in the last (+0.82 GiB; "
        "limit 0.80)",
        {"gpus": [{"index": 3, "name": "H100 80GB HBM3", "total_gib": 80.46,
                   "first_gib": 10.206, "last_gib": 11.029, "rise_gib": 0.824,
                   "limit_gib": 0.805, "trend_gib_per_hour": 1.235}]})


def test_no_reading_under_load_is_not_judged_in_words() -> None:
    outside = [GpuPoint(-10.0, 0, "H100", 10 * GIB, 80 * GIB),
               GpuPoint(3601.0, 0, "H100", 10 * GIB, 80 * GIB)]  # before and after the load
    for points in ([], outside):
        assert judge_gpu(points, SPAN, None) == Criterion(
            "gpu_memory", TITLE, "not_judged", "not judged: no GPU memory readings under load")


@pytest.mark.parametrize(("first", "last", "judged"), [
    (3, 3, True), (2, 3, False), (3, 2, False)])
def test_each_third_needs_three_readings(first: int, last: int, judged: bool) -> None:
    used = [10 * GIB] * first + [None] * (4 - first) + [10 * GIB] * 4 \
        + [None] * (4 - last) + [10 * GIB] * last
    criterion = judge_gpu(by_window(used, total=80 * GIB), SPAN, None)
    if judged:
        assert criterion.state == "ok"
        assert criterion.reason.startswith("stable: GPU 0: 10.00 GiB used in the first third")
    else:
        assert criterion == Criterion(
            "gpu_memory", TITLE, "not_judged",
            "not judged: too few GPU readings in the first or last third",
            {"gpus": [{"index": 0, "name": "H100", "total_gib": 80.0}]})


def test_the_worst_judged_gpu_speaks_for_all_in_index_order() -> None:
    growing = by_window(steps(200 * MIB), total=80 * GIB, index=2)
    flat = by_window(steps(0), total=80 * GIB, index=0)
    sparse = by_window([10 * GIB] * 2 + [None] * 10, total=80 * GIB, index=1)
    criterion = judge_gpu(growing + sparse + flat, SPAN, None)
    assert criterion.state == "fail" and criterion.reason.startswith("growing: GPU 2: ")
    assert [gpu["index"] for gpu in criterion.figures["gpus"]] == [0, 1, 2]
    quiet = judge_gpu(flat + sparse, SPAN, None)
    assert (quiet.state, quiet.title) == ("ok", TITLE)
    assert quiet.reason == ("stable: GPU 0: 10.00 GiB used in the first third, 10.00 in the "
                            "last (+0.00 GiB; limit 0.80)")


def test_a_step_whose_trend_may_be_flat_is_watch_not_fail() -> None:
    # a third at 10, 11 and 12 GiB: 18 of the 66 window pairs are flat, which puts the
    # trend's 99 % lower bound at exactly 0, and 0 is not rising
    used = [10 * GIB] * 4 + [11 * GIB] * 4 + [12 * GIB] * 4
    criterion = judge_gpu(by_window(used, total=80 * GIB), SPAN, None)
    assert criterion.state == "watch"
    assert criterion.reason == ("creeping up: GPU 0: 10.00 GiB used in the first third, 12.00 "
                                "in the last (+2.00 GiB; limit 0.80)")


def test_a_rise_with_no_trend_is_stable() -> None:
    # 0.6 GiB is over half the 0.8 GiB limit, but 34 of the 66 window pairs are flat: the
    # trend (their median slope) is 0
    used = [10 * GIB] * 8 + [10.6 * GIB] * 4
    criterion = judge_gpu(by_window(used, total=80 * GIB), SPAN, None)
    assert criterion.state == "ok" and criterion.figures["gpus"][0]["trend_gib_per_hour"] == 0


@pytest.mark.parametrize(("step", "state"), [
    (64 * MIB, "watch"),  # rises 8 steps: exactly the 512 MiB limit is not over it
    (64 * MIB + 1, "fail"),
    (32 * MIB, "ok"),  # exactly half the limit is not over half
    (32 * MIB + 1, "watch"),
])
def test_the_limit_and_half_of_it_are_not_over_them(step: float, state: str) -> None:
    criterion = judge_gpu(by_window(steps(step), total=16 * GIB), SPAN, None)
    assert criterion.state == state, criterion.reason


@pytest.mark.parametrize(("step", "state"), [(40 * MIB, "watch"), (80 * MIB, "fail")])
def test_a_trend_counts_from_above_zero_however_slow(step: float, state: str) -> None:
    # a run so long that a window's step is half a byte an hour: rising all the same
    span = Span(0.0, 2 * step * WINDOWS * 3600)
    criterion = judge_gpu(by_window(steps(step), total=16 * GIB, span=span), span, None)
    assert criterion.state == state, criterion.reason


def test_two_windows_give_no_trend_and_three_do() -> None:
    # three readings in one window of the first third and one of the last, 2 GiB apart
    two = [10 * GIB] + [None] * 10 + [12 * GIB]
    assert judge_gpu(by_window(two, total=80 * GIB, per_window=3), SPAN, None).state == "ok"
    three = [10 * GIB] + [None] * 5 + [11 * GIB] + [None] * 4 + [12 * GIB]
    assert judge_gpu(by_window(three, total=80 * GIB, per_window=3), SPAN, None).state \
        == "watch"  # three windows: a trend, too few for a lower bound above 0


def test_the_gpus_size_is_its_latest_reading() -> None:
    series = by_window(steps(0), total=80 * GIB)
    series[-1] = GpuPoint(series[-1].t, 0, "H100 (MIG 1g.10gb)", 10 * GIB, 10 * GIB)
    (gpu,) = judge_gpu(series, SPAN, None).figures["gpus"]
    assert (gpu["name"], gpu["total_gib"], gpu["limit_gib"]) == ("H100 (MIG 1g.10gb)", 10.0,
                                                                 0.5)
