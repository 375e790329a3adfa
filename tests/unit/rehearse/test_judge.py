"""The judge on made-up runs whose answer is known: each criterion, the rule, the advice."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import pytest

from kvtop.derive.leak import LeakParams
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
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
    (("ok", "fail", "ok"), False, 0.0, "no-go"),  # a leak is NO-GO by itself
    (("fail", "ok", "ok"), False, 0.0, "go"),  # one soft signal of three
    (("ok", "ok", "fail"), False, 0.0, "go"),
    (("fail", "ok", "fail"), False, 0.0, "no-go"),  # two soft signals
    (("fail", "watch", "ok"), False, 0.0, "no-go"),  # WATCH counts toward two...
    (("ok", "watch", "fail"), False, 0.0, "no-go"),
    (("ok", "watch", "watch"), False, 0.0, "go"),  # ...a latency WATCH does not
    (("ok", "watch", "ok"), True, 0.0, "go"),  # ...and never alone, even --strict
    (("ok", "ok", "fail"), True, 0.0, "no-go"),
    (("fail", "ok", "ok"), True, 0.0, "no-go"),
    (("ok", "ok", "ok"), False, 0.02, "no-go"),
    (("ok", "ok", "ok"), False, 0.01, "go"),  # exactly the limit is not over it
    (("ok", "ok", "ok"), False, 0.0101, "no-go"),
    (("not_judged", "ok", "watch"), False, 0.005, "go"),
    (("ok", "not_judged", "ok"), False, 0.0, "no-verdict"),  # GO needs free KV judged...
    (("ok", "ok", "not_judged"), False, 0.0, "no-verdict"),  # ...and latency
    (("ok", "not_judged", "not_judged"), False, None, "no-verdict"),
    (("fail", "not_judged", "fail"), False, 0.0, "no-go"),  # a NO-GO needs no more
])
def test_the_rule(states: tuple[str, str, str], strict: bool, errors: float | None,
                  verdict: str) -> None:
    criteria = [crit(n, s) for n, s in zip(("gpu_memory", "kv_free", "latency"), states,
                                           strict=True)]
    decision = judge.decide(criteria, strict=strict, error_rate=errors, max_error_rate=0.01)
    assert decision.verdict == verdict, decision.reasons
    assert decision.failed == [c.name for c in criteria if c.state == "fail"]


def test_a_go_says_what_it_rests_on_and_a_no_verdict_what_is_missing() -> None:
    judged = [crit("gpu_memory", "not_judged"), crit("kv_free", "ok"), crit("latency", "ok")]
    go = judge.decide(judged, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert go.verdict == "go" and go.missing == []
    assert [line.split(":")[0] for line in go.evidence] == ["free KV not falling",
                                                          "slow-request share not rising"]
    short = [crit("gpu_memory", "ok"), crit("kv_free", "ok"),
             judge.Criterion("latency", judge.TITLES["latency"], "not_judged", "too few",
                             {"needs": "needs about 12 more minutes of load at this rate"})]
    none = judge.decide(short, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert none.verdict == "no-verdict" and none.evidence == []
    assert none.missing == ["needs about 12 more minutes of load at this rate"]
    assert none.reasons == ["not enough evidence for GO: needs about 12 more minutes of "
                            "load at this rate"]


def all_ok() -> list[judge.Criterion]:
    return [crit(name, "ok") for name in ("gpu_memory", "kv_free", "latency")]


def test_a_stalled_engine_is_no_go_by_itself_in_the_detectors_words() -> None:
    stall = judge.Stall("stalled", "no token generated for 162 s with 4 running", "m 0", 30.0)
    decision = judge.decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                            stall=stall)
    assert decision.verdict == "no-go"
    assert decision.reasons == ["stalled: m 0: no token generated for 162 s with 4 running"]
    saturated = judge.Stall("saturated", "KV pool pinned full", "m 0", 30.0)
    assert judge.decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                        stall=saturated).verdict == "go"


@pytest.mark.parametrize(("answered", "load_s", "verdict"), [
    (0, 60.0, "no-go"), (0, 59.9, "no-verdict"), (1, 600.0, "go")])
def test_a_server_that_answers_nothing_is_never_go(answered: int, load_s: float,
                                                   verdict: str) -> None:
    requests = judge.Requests(40, answered, 0.0)
    decision = judge.decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                            requests=requests, load_s=load_s)
    assert decision.verdict == verdict
    if verdict == "no-go":
        assert decision.reasons == ["the server answered none of the 40 requests in 1.0 min "
                                    "of load"]


def test_the_worst_stall_of_the_run_is_the_one_judged() -> None:
    data = WatchData()
    assert judge.judge_stall(data).state == "unknown"
    calm, stuck = EngineVerdict("m", "0"), EngineVerdict("m", "1")
    calm.observe_stall(10.0, StallVerdict("ok", "making progress", 10.0))
    stuck.observe_stall(40.0, StallVerdict("saturated", "pinned", 40.0))
    stuck.observe_stall(50.0, StallVerdict("stalled", "no token generated for 12 s", 38.0))
    data.verdicts = {("m", "0"): calm, ("m", "1"): stuck}
    stall = judge.judge_stall(data)
    assert stall == judge.Stall("stalled", "no token generated for 12 s", "m 1", 50.0)
    assert stall.to_json(20.0) == {"state": "stalled", "reason": "no token generated for 12 s",
                                   "engine": "m 1", "first_s": 30.0}


def shares(first: tuple[int, int], last: tuple[int, int],
           last_windows: list[tuple[int, int]] | None = None) -> judge._Shares:
    """(slow, count) in the first and last thirds; the last spread over its four windows
    (or as given, per window, in window order 8 to 11)."""
    found = judge._Shares()
    for i in range(first[1]):
        found.add(SPAN, 100.0 + i * 1000 / first[1], 1.0 if i < first[0] else 0.0)
    per_window = last_windows or [(last[0] // 4 + (w < last[0] % 4), last[1] // 4
                                   + (w < last[1] % 4)) for w in range(4)]
    for w, (slow, count) in enumerate(per_window):
        start = SPAN.length * (8 + w) / judge.WINDOWS
        for i in range(count):
            found.add(SPAN, start + 1 + i * 250 / max(count, 1), 1.0 if i < slow else 0.0)
    return found


def rising(found: judge._Shares) -> judge.Criterion:
    return judge._rising("requests", found, SPAN, {})


@pytest.mark.parametrize(("last_slow", "state"), [
    (200, "fail"),  # 10 % -> 20 %: exactly ten points
    (199, "watch"),  # a hair under: a creep, not a failure
    (150, "watch"),  # 10 % -> 15 %: exactly five points, z 1.86
    (149, "ok"),
])
def test_the_latency_boundaries(last_slow: int, state: str) -> None:
    criterion = rising(shares((100, 1000), (last_slow, 1000)))
    assert criterion.state == state, criterion.reason


def test_a_creep_of_five_to_ten_points_is_watch_not_fail() -> None:
    criterion = rising(shares((100, 1000), (170, 1000)))
    assert criterion.state == "watch" and criterion.reason.startswith("creeping up: ")
    assert criterion.figures["z"] >= judge.Z_WATCH


def test_a_rise_not_significant_is_not_a_creep() -> None:
    criterion = rising(shares((3, 30), (6, 30)))  # 10 % -> 20 % on 30 each: z 1.1
    assert criterion.state == "ok"


@pytest.mark.parametrize(("windows", "held"), [
    ([(30, 100)] * 4, True),
    ([(30, 100), (30, 100), (30, 100), (5, 100)], False),  # one window at or under
    ([(30, 100), (30, 100), (30, 100), (1, 4)], True),  # a thin window is left out...
    ([(30, 100), (30, 100), (1, 4), (1, 4)], False),  # ...at most one
    ([(0, 0), (0, 0), (0, 0), (120, 400)], False),  # one window never passes it
])
def test_the_sign_test_over_the_last_thirds_windows(windows: list[tuple[int, int]],
                                                    held: bool) -> None:
    slow = sum(s for s, _ in windows)
    count = sum(c for _, c in windows)
    criterion = rising(shares((10, 100), (slow, count), windows))
    assert criterion.figures["held_to_the_end"] is held
    assert (criterion.state == "fail") is held


@pytest.mark.parametrize(("first", "last", "judged"), [
    (30, 30, True), (29, 300, False), (300, 29, False)])
def test_each_third_needs_thirty_requests(first: int, last: int, judged: bool) -> None:
    criterion = rising(shares((0, first), (0, last)))
    assert (criterion.state != "not_judged") is judged
    if not judged:
        assert "needs 30 each" in criterion.reason
        assert criterion.figures["needs"].startswith("needs about ")


def test_the_minutes_a_short_run_needs() -> None:
    span = judge.Span(0.0, 120.0)  # 2 minutes: 40 s a third
    assert judge._latency_needs("requests", 10, span) == (
        "needs about 4 more minutes of load at this rate (15.0 requests/min in the sparser "
        "third)")  # 90 at 0.25/s take 360 s, 240 more
    assert judge._latency_needs("requests", 0, span) == (
        "needs requests in every third of the load; none came in one")


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
    criterion = judge.judge_gpu(series, SPAN, None)
    assert criterion.state == state, criterion.reason
    limit = max(0.01 * total_gib, 0.5)
    assert criterion.figures["gpus"][0]["limit_gib"] == pytest.approx(limit, abs=1e-3)


def test_the_idle_floor_is_the_least_used_at_idle() -> None:
    points = engine_points(0, 0)
    after = [EnginePoint(3600 + i, "after", used, 1000, used / 999, 0, 0, 0.0, 0.0, 0.0, 2)
             for i, used in enumerate((32.0, 22.0, 27.0))]
    busy = EnginePoint(3604, "after", 5.0, 1000, 0.005, 1, 0, 0.0, 0.0, 0.0, 2)
    assert judge.idle_floor([*points[:-3], *after, busy], "after") == 20.0  # less its floor 2


@pytest.mark.parametrize(("pool", "rise", "state"), [
    (10_000, 10.0, "ok"),  # 0.1 % of the pool: held within the allowance
    (10_000, 10.5, "fail"),
    (1000, 2.0, "ok"),  # a small pool: at least 2 blocks
    (1000, 2.5, "fail"),
])
def test_the_block_allowance_is_the_larger_of_2_blocks_and_0_1_percent(
        pool: int, rise: float, state: str) -> None:
    points = [dataclasses.replace(p, total=pool) for p in engine_points(0, rise)]
    criterion = judge.judge_kv(watch_data(points, "ok"), LeakParams(), SPAN)
    assert criterion.state == state, criterion.reason


def test_a_leak_gives_its_size_and_the_next_step() -> None:
    data = watch_data(engine_points(0, 40), "ok")
    data.verdicts[("m", "0")].seen(0.0, 16, {"kv_cache_memory_bytes": "1073741824",
                                            "num_gpu_blocks": "1000"})
    kv = judge.judge_kv(data, LeakParams(), SPAN)
    size = kv.figures["engines"][0]["leak_size"]
    assert size == {"blocks": 40.0, "tokens": 640.0, "gib": 0.04}
    assert "leaked 40 blocks (640 tokens, 0.04 GiB)" in kv.reason
    (advice,) = judge.advise({"kv_free": kv}, judge.LoadFigures(), model_len=4096,
                             expected_hit_rate=None, error_rate=None, errors={})
    assert advice.lever == "leak" and "a KV leak of 40 blocks (640 tokens, 0.04 GiB)" in \
        advice.action and "record it (kvtop record)" in advice.action
    assert (advice.figures["leaked_blocks"], advice.figures["leaked_tokens"],
            advice.figures["leaked_gib"]) == (40.0, 640.0, 0.04)


def test_free_kv_not_judged_says_what_it_needs() -> None:
    data = watch_data(engine_points(0, 300, idle_after=False))
    data.verdicts[("m", "0")].seen(0.0)
    data.verdicts[("m", "0")].seen(120.0)
    kv = judge.judge_kv(data, LeakParams(), SPAN)
    assert kv.state == "not_judged"
    assert kv.figures["needs"] == (
        "needs an idle floor before and after the load, or the leak detector past its "
        "warm-up (needs 8 more minutes of scrapes under load, or one idle period (nothing "
        "running or waiting for 20 s, 3 scrapes))")


def test_counters_across_a_restart_count_from_zero() -> None:
    values = (10.0, 20.0, 5.0, 15.0)  # a restart between 20 and 5
    points = [EnginePoint(600.0 * i, "load", 0.0, 1000, 0.0, 1, 0, v, None, None, 0)
              for i, v in enumerate(values)]
    data = WatchData(points={("m", "0"): points})
    assert judge._counter_rise(data, SPAN, "preemptions") == 10 + 5 + 10
    assert judge._counter_rise(data, SPAN, "prefix_hits") is None  # not exported


def test_a_stall_is_named_in_the_advice_with_no_capacity_lines() -> None:
    queued = judge.LoadFigures(pinned_share=0.0, preemptions_per_min=0.02, waiting_p90=12,
                               running_max=64, prompt_p90=300)
    stall = judge.Stall("stalled", "no token generated for 162 s with 4 running", "m 0", 9.0)
    (advice,) = judge.advise({}, queued, model_len=4096, expected_hit_rate=None,
                             error_rate=None, errors={}, stall=stall)
    assert advice.lever == "stall"
    assert advice.action.startswith("the engine stopped making progress: no token generated "
                                    "for 162 s with 4 running; its log says why")
    assert advice.figures == {"engine": "m 0", "reason": stall.reason}


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
