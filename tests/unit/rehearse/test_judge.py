"""The judge on made-up runs whose answer is known: each criterion, the rule, the advice."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from kvtop.derive.leak import LeakParams
from kvtop.derive.verdicts import LeakVerdict
from kvtop.derive.worst import EngineVerdict
from kvtop.load.driver import RequestRecord
from kvtop.rehearse import judge
from kvtop.rehearse.requests import RequestTable
from kvtop.rehearse.watch import EnginePoint, GpuPoint, WatchData

SPAN = judge.Span(0.0, 3600.0)
GIB = 2**30


def table_of(ttft_at: Callable[[float], float], *, n: int = 900,
             fail_at: Callable[[float], bool] = lambda t: False, seed: int = 0) -> RequestTable:
    """n requests evenly over SPAN in two classes; TTFT drawn around ttft_at(t)."""
    rng = random.Random(seed)
    table = RequestTable()
    for i in range(n):
        t = SPAN.length * i / n
        cls = "short" if i % 2 else "long"
        base = ttft_at(t) * (3 if cls == "long" else 1)
        failed = fail_at(t)
        table.add(RequestRecord(
            i + 1, 1, cls, t, 0.0, "timeout" if failed else "ok", 100, 10,
            ttft_s=None if failed else base * rng.lognormvariate(0, 0.3),
            tpot_s=None if failed else 0.01 * rng.lognormvariate(0, 0.2),
            total_s=30.0 if failed else base + 0.1, prompt_tokens=100, completion_tokens=10))
    return table


def test_steady_latency_is_ok() -> None:
    criterion = judge.judge_latency(table_of(lambda t: 0.2), SPAN)
    assert criterion.state == "ok", criterion.reason
    share = criterion.figures["slow_share"]
    assert 0.1 <= share["first"] <= 0.3 and abs(share["last"] - share["first"]) < 0.1
    assert set(criterion.figures["slow_thresholds"]) == {"short", "long"}


def test_rising_latency_fails_with_its_figures() -> None:
    criterion = judge.judge_latency(table_of(lambda t: 0.2 * (1 + 3 * t / 3600)), SPAN)
    assert criterion.state == "fail"
    assert criterion.reason.startswith("rising: ")
    figures = criterion.figures
    assert figures["slow_share"]["last"] > 0.8 and figures["z"] > 2.33
    assert figures["held_to_the_end"] is True and figures["trend_per_hour"] > 0
    assert figures["ttft_s"]["last"]["p50"] > 2 * figures["ttft_s"]["first"]["p50"]


def test_a_rise_that_saturates_in_failures_still_fails() -> None:
    table = table_of(lambda t: 0.2, fail_at=lambda t: t > 1500)
    criterion = judge.judge_latency(table, SPAN)
    assert criterion.state == "fail", criterion.reason
    assert criterion.figures["slow_share"]["last"] == 1.0


def test_a_bump_that_went_away_is_not_a_rise() -> None:
    table = table_of(lambda t: 2.0 if 1300 < t < 2300 else 0.2)
    assert judge.judge_latency(table, SPAN).state != "fail"


def test_one_bad_stretch_at_the_end_is_not_a_rise() -> None:
    table = table_of(lambda t: 5.0 if 2500 < t < 2950 else 0.2)  # one window of the last
    criterion = judge.judge_latency(table, SPAN)
    assert criterion.state != "fail" and criterion.figures["held_to_the_end"] is False


def test_cut_requests_are_left_out_and_few_requests_are_not_judged() -> None:
    table = table_of(lambda t: 0.2, n=60)
    criterion = judge.judge_latency(table, SPAN)
    assert criterion.state == "not_judged" and "too few requests" in criterion.reason
    full = table_of(lambda t: 0.2)
    before = judge.judge_latency(full, SPAN).figures["compared"]["last"]
    for i in range(50):  # cut before anything showed: left out
        full.add(RequestRecord(2000 + i, 1, "short", 3599.0, 0.0, "cut", 100, 10,
                               total_s=0.01))
    assert judge.judge_latency(full, SPAN).figures["compared"]["last"] == before
    for i in range(50):  # cut after waiting longer than any answer took: slow
        full.add(RequestRecord(3000 + i, 1, "short", 3000.0, 0.0, "cut", 100, 10,
                               total_s=100.0))
    figures = judge.judge_latency(full, SPAN).figures
    assert figures["compared"]["last"] == before + 50


def histograms(rate_at: Callable[[float], float], slow_share_at: Callable[[float], float]
               ) -> list[tuple[float, list]]:
    """Cumulative TTFT buckets every 60 s: `rate_at` observations a second, 10 % of them
    between 1 and 5 s, and a share `slow_share_at` over 5 s."""
    bounds = (0.1, 0.5, 1.0, 5.0, math.inf)
    counts = [0.0] * len(bounds)
    series = []
    for step in range(61):
        t = step * 60.0
        n = rate_at(t) * 60
        slow = n * slow_share_at(t)
        counts[0] += (n - slow) * 0.45
        counts[1] += (n - slow) * 0.45
        counts[3] += (n - slow) * 0.1
        counts[4] += slow
        cumulative, total = [], 0.0
        for bound, count in zip(bounds, counts, strict=True):
            total += count
            cumulative.append((bound, total))
        series.append((t, cumulative))
    return series


def test_watch_only_judges_the_servers_histogram() -> None:
    steady = judge.judge_latency_histograms(histograms(lambda t: 5, lambda t: 0.05), SPAN)
    assert steady.state == "ok", steady.reason
    rising = judge.judge_latency_histograms(histograms(lambda t: 5, lambda t: t / 3600), SPAN)
    assert rising.state == "fail", rising.reason
    assert rising.figures["source"] == "the server's TTFT histogram"
    empty = judge.judge_latency_histograms([], SPAN)
    assert empty.state == "not_judged"


def test_a_restart_in_the_histograms_counts_from_zero() -> None:
    series = histograms(lambda t: 5, lambda t: 0.05)
    restarted = [(t, [(b, c / 1000) for b, c in buckets]) if t > 1800 else (t, buckets)
                 for t, buckets in series]
    deltas = judge._histogram_deltas(restarted, SPAN)
    assert all(d[-1][1] > 0 for _, d in deltas)
    assert judge.judge_latency_histograms(restarted, SPAN).state != "fail"


def gpu_series(used_at: Callable[[float], float], total: int = 80 * GIB) -> list[GpuPoint]:
    return [GpuPoint(t, 0, "H100", int(used_at(t)), total) for t in range(0, 3601, 30)]


def test_gpu_memory() -> None:
    flat = judge.judge_gpu(gpu_series(lambda t: 72 * GIB + (t % 90) * 2**20), SPAN, None)
    assert flat.state == "ok" and flat.figures["gpus"][0]["rise_gib"] < 0.2
    growing = judge.judge_gpu(gpu_series(lambda t: 72 * GIB + 3 * GIB * t / 3600), SPAN, None)
    assert growing.state == "fail" and "growing" in growing.reason
    assert growing.figures["gpus"][0]["rise_gib"] == pytest.approx(2.0, abs=0.1)
    missing = judge.judge_gpu([], SPAN, "NVML init failed: no driver")
    assert missing.state == "not_judged" and "no driver" in missing.reason


def engine_points(before: float, after: float, *, idle_after: bool = True) -> list[EnginePoint]:
    def point(t: float, phase: str, used: float, idle: bool) -> EnginePoint:
        return EnginePoint(t, phase, used, 1000, used / 999, 0 if idle else 4,
                           0 if idle else 2, 0.0, 0.0, 0.0, 0)

    return ([point(-2.0 + i, "before", before, True) for i in range(3)]
            + [point(60.0 * i, "load", 500, False) for i in range(60)]
            + [point(3600 + i, "after", after, idle_after) for i in range(3)])


def watch_data(points: list[EnginePoint], state: str | None = None) -> WatchData:
    data = WatchData(points={("m", "0"): points})
    verdict = EngineVerdict("m", "0")
    if state is not None:
        verdict.observe(100.0, LeakVerdict(state, f"made-up {state}", 12.0, 30.0, 20.0))
    data.verdicts[("m", "0")] = verdict
    return data


def test_free_kv() -> None:
    params = LeakParams()
    ok = judge.judge_kv(watch_data(engine_points(0, 0), "ok"), params, SPAN)
    assert ok.state == "ok"
    kept = judge.judge_kv(watch_data(engine_points(0, 40), "ok"), params, SPAN)
    assert kept.state == "fail" and "0 blocks used at idle before the load, 40 after" in \
        kept.reason
    assert kept.figures["engines"][0]["idle_used_rise"] == 40
    leak = judge.judge_kv(watch_data(engine_points(0, 0), "leak"), params, SPAN)
    assert leak.state == "fail" and "LEAK" in leak.reason
    watch = judge.judge_kv(watch_data(engine_points(0, 1), "watch"), params, SPAN)
    assert watch.state == "watch"
    busy = judge.judge_kv(watch_data(engine_points(0, 300, idle_after=False)), params, SPAN)
    assert busy.state == "not_judged" and "did not go idle" in busy.reason
    assert judge.judge_kv(WatchData(), params, SPAN).state == "not_judged"


def crit(name: str, state: str) -> judge.Criterion:
    return judge.Criterion(name, judge.TITLES[name], state, "")  # type: ignore[arg-type]


@pytest.mark.parametrize(("states", "strict", "errors", "verdict"), [
    (("ok", "ok", "ok"), False, 0.0, "go"),
    (("ok", "fail", "ok"), False, 0.0, "go"),
    (("fail", "fail", "ok"), False, 0.0, "no-go"),
    (("ok", "fail", "ok"), True, 0.0, "no-go"),
    (("ok", "ok", "ok"), False, 0.02, "no-go"),
    (("not_judged", "ok", "watch"), False, 0.005, "go"),
    (("ok", "not_judged", "not_judged"), False, None, "no-verdict"),
])
def test_the_rule(states: tuple[str, str, str], strict: bool, errors: float | None,
                  verdict: str) -> None:
    criteria = [crit(n, s) for n, s in zip(("gpu_memory", "kv_free", "latency"), states,
                                           strict=True)]
    decision = judge.decide(criteria, strict=strict, error_rate=errors, max_error_rate=0.01)
    assert decision.verdict == verdict
    assert decision.failed == [c.name for c in criteria if c.state == "fail"]


def test_the_advice_table() -> None:
    pinned = judge.LoadFigures(pinned_share=0.6, prompt_p90=3000)
    levers = lambda advice: [a.lever for a in advice]  # noqa: E731
    advice = judge.advise({}, pinned, model_len=4096, expected_hit_rate=None,
                          error_rate=None, errors={})
    assert levers(advice) == ["max-model-len"]
    assert advice[0].figures == {"pinned_share": 0.6, "prompt_p90_tokens": 3000,
                                 "max_model_len": 4096}
    queued = judge.LoadFigures(pinned_share=0.0, preemptions_per_min=4.0, waiting_p90=12,
                               running_max=64, prompt_p90=300)
    assert levers(judge.advise({}, queued, model_len=4096, expected_hit_rate=None,
                               error_rate=None, errors={})) == ["max-num-seqs"]
    cold = judge.LoadFigures(hit_rate=0.05)
    advice = judge.advise({}, cold, model_len=4096, expected_hit_rate=0.9, error_rate=0.2,
                          errors={"HTTP 500": 3, "timeout": 9})
    assert levers(advice) == ["prefix-caching", "errors"]
    assert advice[1].figures == {"error_rate": 0.2, "most_common": "timeout"}
    kv = judge.judge_kv(watch_data(engine_points(0, 40), "leak"), LeakParams(), SPAN)
    advice = judge.advise({"kv_free": kv}, pinned, model_len=4096, expected_hit_rate=None,
                          error_rate=None, errors={})
    assert levers(advice) == ["leak"]  # the leak explains the pinned pool
    assert advice[0].figures["idle_used_after"] == 40
    assert advice[0].figures["leak_verdict"] == "leak"
