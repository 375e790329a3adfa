"""The leak detector's rules for a server that never goes idle, each at its boundary: exactly
at the threshold and a hair either side, scrape by scrape (issue 30).

Constructed series: one scrape every 10 s on a minute boundary, so every bucket's mean is
exact; a steady load (requests finishing, tokens flowing) unless said. Thresholds are read
from LeakParams, never restated.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.adapters.vllm import NAMES as VLLM_NAMES
from kvtop.derive.leak import LeakDetector, LeakParams
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LeakVerdict

T0 = 1_700_000_040.0  # on a minute: buckets start with the series
STEP = 10
POOL = 1000
PER_BUCKET = 60 // STEP


def scrape(t: float, used: float, *, running: float = 5.0, preemptions: float = 0.0
           ) -> EngineStats:
    """One scrape of an engine under a steady load, without tokens in flight (the floor
    rules): a server that does not export the finished requests' token histograms."""
    return EngineStats(model="m", engine="0", t=T0 + t, blocks_total=POOL, blocks_used=used,
                       kv_usage=used / POOL, running=running, waiting=0.0, window_s=STEP,
                       prompt_tps=500.0, generation_tps=100.0, finished_per_s={"stop": 0.5},
                       preemptions_per_s=preemptions)


def by_bucket(levels: list[float], **kw: float) -> list[EngineStats]:
    """A series whose every bucket (a minute) holds one level at all its scrapes."""
    return [scrape((minute * PER_BUCKET + i) * STEP, level, **kw)
            for minute, level in enumerate(levels) for i in range(PER_BUCKET)]


def run(series: list[EngineStats], params: LeakParams | None = None) -> list[LeakVerdict]:
    detector = LeakDetector(params)
    return [detector.update(s) for s in series]


def closes(found: list[LeakVerdict]) -> list[LeakVerdict]:
    """The verdict at each bucket's first scrape: the one after the previous bucket closed."""
    return found[::PER_BUCKET]


# -- the floor's step (a lump) and WATCH's rise -------------------------------------------

@pytest.mark.parametrize(("lump", "worst"), [
    (POOL * LeakParams().watch_rise_frac, "watch"),  # exactly WATCH's rise
    (POOL * LeakParams().watch_rise_frac - 0.01, "ok"),  # a hair under it
    (POOL * LeakParams().leak_rise_frac - 0.01, "watch"),  # a hair under LEAK's
    (POOL * LeakParams().leak_rise_frac, "leak"),  # exactly LEAK's
], ids=["at-watch", "under-watch", "under-leak", "at-leak"])
def test_a_lump_is_watch_from_watchs_rise_and_leak_from_leaks(lump: float, worst: str) -> None:
    # 10 buckets at 300 blocks, then 25 a lump higher: a clean step, found by the rank test
    found = run(by_bucket([300.0] * 10 + [300.0 + lump] * 25))
    states = {v.state for v in found}
    assert max(states, key=["warmup", "ok", "watch", "leak"].index) == worst
    if worst != "ok":
        stepped = next(v for v in found if v.state == "watch")
        assert stepped.evidence["floor_step"] == pytest.approx(lump)
        assert "floor stepped up" in stepped.reason


def test_watch_from_a_rising_floor_starts_at_watchs_rise() -> None:
    # the step test off, so that only the trend speaks: WATCH at the first bucket close
    # whose rise reaches watch_rise_frac of the pool, not LEAK's (a hair under stays OK)
    p = LeakParams(step_z=math.inf)
    found = closes(run(by_bucket([300.0] * 10 + [300.0 + 0.5 * m for m in range(40)]), p))
    watch = next(i for i, v in enumerate(found) if v.state == "watch")
    needed = p.watch_rise_frac * POOL
    assert found[watch].evidence["floor_rise"] >= needed
    assert found[watch - 1].state == "ok"
    assert found[watch - 1].evidence["floor_rise"] < needed
    assert found[watch].evidence["floor_rise"] < p.leak_rise_frac * POOL


@pytest.mark.parametrize(("latest", "step"), [
    (310.0, 20.0),  # exactly half the step still up: leaked blocks never come back
    (309.99, 0.0),  # a hair under half: a bump going away, no step
], ids=["half-up", "under-half"])
def test_a_step_counts_only_while_the_latest_buckets_hold_half_of_it(
        latest: float, step: float) -> None:
    # 10 buckets at 300, 10 at 320, then 5 at `latest`: the split is where it rose
    levels = [300.0] * 10 + [320.0] * 10 + [latest] * 5
    found = closes(run(by_bucket([*levels, latest])))
    assert found[-1].evidence["floor_step"] == step


# -- preemptions up at the same load: late > 2 x early + 1e-3 per second ------------------

EARLY = 0.125  # preemptions per second in the first half


@pytest.mark.parametrize(("late", "counted"), [
    (2 * EARLY + 1e-3 + 1e-6, True),  # a hair over twice as many (and one in 1000 s)
    (2 * EARLY + 1e-3 - 1e-6, False),  # a hair under
    (2 * EARLY, False),  # twice as many
    (1.5 * EARLY, False),  # more, but not twice as many
], ids=["over", "under", "twice", "more"])
def test_preemptions_up_count_from_twice_as_many_at_the_same_load(
        late: float, counted: bool) -> None:
    # 19 buckets; the first is partial and left out, so at the close of the 19th the
    # window's halves are buckets 1-9 (EARLY) and 10-18 (late) exactly
    series = [replace(s, preemptions_per_s=EARLY if s.t - T0 < 600 else late)
              for s in by_bucket([300.0 + 20 * (m % 2) for m in range(20)])]
    found = closes(run(series))
    consequences = found[19].evidence["consequences"]
    assert (consequences == "preemptions up at the same load") == counted


# -- the level the load does not explain (tokens in flight) --------------------------------

BLOCK = 16


def loaded(t: float, leaked: float, *, running: float, preemptions: float = 0.0,
           waiting: float = 0.0, aborted: float = 0.0, used: float | None = None
           ) -> EngineStats:
    """A scrape whose used blocks are exactly what its tokens in flight hold (a block per
    BLOCK tokens, half a block rounded up per request) plus `leaked`."""
    in_flight = running * (600.0 + 200.0 * (t // 60 % 3))  # contexts cycle, running swings
    level = in_flight / BLOCK + running / 2 + leaked if used is None else used
    return replace(scrape(t, level, running=running, preemptions=preemptions),
                   tokens_in_flight=in_flight, waiting=waiting,
                   finished_per_s={"stop": 0.5, "abort": aborted})


def swinging(leaks: list[float], **kw: float) -> list[EngineStats]:
    """One bucket per entry, holding that many leaked blocks, under a load that swings
    between 4 and 9 running from bucket to bucket (an explained working set of 200–450)."""
    return [loaded((minute * PER_BUCKET + i) * STEP, leaked,
                   running=4.0 + (minute * 3) % 6, **kw)
            for minute, leaked in enumerate(leaks) for i in range(PER_BUCKET)]


def test_a_lump_the_load_does_not_explain_is_watch_then_leak() -> None:
    p = LeakParams()
    found = closes(run(swinging([0.0] * 20 + [40.0] * 20)))
    watch = next(i for i, v in enumerate(found) if v.state == "watch")
    leak = next(i for i, v in enumerate(found) if v.state == "leak")
    assert found[watch].evidence["unexplained_rise"] == pytest.approx(40.0, abs=1e-6)
    assert found[watch].evidence["blocks_per_token"] == pytest.approx(1 / BLOCK, rel=1e-4)
    assert "40 blocks (4.0% of the pool) held beyond what the load explains" in (
        found[watch].reason)
    assert (leak - watch) * 60 == pytest.approx(p.leak_persist_s, abs=p.bucket_s)
    assert found[leak].leaked_blocks == pytest.approx(40.0, abs=1e-3)
    # the floor's trend does not speak where tokens in flight are known
    assert all("floor" not in v.reason for v in found)


@pytest.mark.parametrize(("lump", "worst"), [
    (POOL * LeakParams().watch_rise_frac + 0.01, "watch"),  # a hair over WATCH's rise
    (POOL * LeakParams().watch_rise_frac - 0.01, "ok"),  # a hair under
    (POOL * LeakParams().leak_rise_frac - 0.01, "watch"),  # a hair under LEAK's
    (POOL * LeakParams().leak_rise_frac + 0.01, "leak"),  # a hair over
], ids=["over-watch", "under-watch", "under-leak", "over-leak"])
def test_unexplained_blocks_are_watch_from_watchs_rise_and_leak_from_leaks(
        lump: float, worst: str) -> None:
    found = run(swinging([0.0] * 20 + [lump] * 25))
    states = {v.state for v in found}
    assert max(states, key=["warmup", "ok", "watch", "leak"].index) == worst


def test_the_step_counts_from_explain_z_on() -> None:
    # a clean step: the rank statistic grows with each bucket after it; WATCH at the first
    # close where it reaches explain_z, none before
    p = LeakParams()
    found = closes(run(swinging([0.0] * 20 + [40.0] * 12)))
    watch = next(i for i, v in enumerate(found) if v.state == "watch")
    assert found[watch].evidence["unexplained_z"] >= p.explain_z
    assert found[watch - 1].evidence["unexplained_z"] < p.explain_z
    assert found[watch - 1].state == "ok"


@pytest.mark.parametrize(("latest", "held"), [
    (20.0, True),  # half the step still up
    (19.99, False),  # a hair under half: a bump going away
], ids=["half-up", "under-half"])
def test_unexplained_blocks_count_only_while_half_the_step_stays_up(
        latest: float, held: bool) -> None:
    found = closes(run(swinging([0.0] * 20 + [40.0] * 10 + [latest] * 6)))
    assert found[-1].evidence["unexplained_still_up"] == ("yes" if held else "no")


def test_unexplained_blocks_must_clear_their_own_noise() -> None:
    # before the lump the unexplained level wanders (-2d..2d in a cycle of 5 the load,
    # which swings in cycles of 2 and 3, cannot explain): its noise is 1.4826 x its median
    # absolute deviation, d. Lumps around explain_noise times that: evidence exactly when
    # the rise reaches it (the fit moves the rise by a few tenths, so both sides occur)
    p, d = LeakParams(), 10.0
    wander = [d * (m % 5 - 2) for m in range(20)]
    held = set()
    for tenth in range(-8, 9, 2):
        found = closes(run(swinging(wander + [p.explain_noise * 1.4826 * d + tenth / 10] * 20)))
        evidence = found[-1].evidence
        assert evidence["unexplained_noise"] == pytest.approx(1.4826 * d, rel=0.01)
        needed = p.explain_noise * float(evidence["unexplained_noise"])
        clears = float(evidence["unexplained_rise"]) >= needed
        assert ("unexplained_evidence_s" in evidence) == clears
        held.add(clears)
    assert held == {True, False}


def test_it_judges_from_explain_min_buckets_usable_buckets() -> None:
    p = LeakParams()
    found = closes(run(swinging([0.0] * (p.explain_min_buckets + 3))))
    counts = [v.evidence.get("load_buckets") for v in found]
    first = next(i for i, n in enumerate(counts) if n is not None)
    assert counts[first] == p.explain_min_buckets


def test_buckets_with_a_preemption_and_the_one_after_are_left_out() -> None:
    # preempted requests wait with their tokens counted and no blocks
    series = [replace(s, preemptions_per_s=0.1) if 20 * 60 <= s.t - T0 < 21 * 60 else s
              for s in swinging([0.0] * 30)]
    found = closes(run(series))
    plain = closes(run(swinging([0.0] * 30)))
    assert plain[-1].evidence["load_buckets"] - found[-1].evidence["load_buckets"] == 2


def test_a_pinned_bucket_is_left_out() -> None:
    p = LeakParams()
    full = p.pinned_frac * POOL
    series = [replace(s, blocks_used=full, kv_usage=full / POOL)
              if 20 * 60 <= s.t - T0 < 21 * 60 else s for s in swinging([0.0] * 30)]
    under = [replace(s, blocks_used=full - 0.01, kv_usage=(full - 0.01) / POOL)
             if 20 * 60 <= s.t - T0 < 21 * 60 else s for s in swinging([0.0] * 30)]
    assert (closes(run(under))[-1].evidence["load_buckets"]
            - closes(run(series))[-1].evidence["load_buckets"]) == 1


@pytest.mark.parametrize(("waiting", "lost"), [(1.0, True), (0.0, False)],
                         ids=["while-waiting", "none-waiting"])
def test_aborts_while_requests_wait_are_counted_as_lost_tokens(waiting: float,
                                                               lost: bool) -> None:
    # an abort before the first token leaves its prompt counted as finished, never as
    # processed; only a request still waiting (or prefilling) can be aborted so
    series = [replace(s, waiting=waiting, finished_per_s={"stop": 0.5, "abort": 0.1})
              if 20 * 60 <= s.t - T0 < 21 * 60 else s for s in swinging([0.0] * 30)]
    found = closes(run(series))
    assert (found[-1].evidence["ledger_lost_tokens"] > 0) == lost


def test_a_scrape_without_tokens_in_flight_starts_the_level_over() -> None:
    series = [replace(s, tokens_in_flight=None) if s.t - T0 == 20 * 60 else s
              for s in swinging([0.0] * 30)]
    found = closes(run(series))
    assert found[20].evidence.get("load_buckets") is not None
    assert found[22].evidence.get("load_buckets") is None


# -- tokens in flight, from what vLLM exports ----------------------------------------------

LABELS = '{model_name="m",engine="0"}'


def exposition(*, finished_prompt: str | None = "1200", deferred: str = "2") -> str:
    lines = [f"vllm:num_requests_running{LABELS} 3", f"vllm:num_requests_waiting{LABELS} 5",
             'vllm:num_requests_waiting_by_reason{model_name="m",engine="0",reason="capacity"}'
             " 3",
             f'vllm:num_requests_waiting_by_reason{{model_name="m",engine="0",reason="deferred"}}'
             f" {deferred}",
             f"vllm:prompt_tokens_total{LABELS} 5000", f"vllm:generation_tokens_total{LABELS} 900",
             f"vllm:request_generation_tokens_sum{LABELS} 300"]
    if finished_prompt is not None:
        lines.append(f"vllm:request_prompt_tokens_sum{LABELS} {finished_prompt}")
    return "\n".join(lines) + "\n"


def engine_stats(body: str) -> EngineStats:
    (engine,) = read_exposition(body, version="0.33.0").engines
    return derive_engine_stats(engine, None, T0, None)


def test_tokens_in_flight_are_the_tokens_counted_less_those_of_finished_requests() -> None:
    stats = engine_stats(exposition())
    assert stats.tokens_in_flight == 5000 + 900 - 1200 - 300
    assert stats.waiting_deferred == 2


def test_without_a_finished_requests_sum_there_are_no_tokens_in_flight() -> None:
    assert engine_stats(exposition(finished_prompt=None)).tokens_in_flight is None


def test_an_impossible_finished_sum_is_left_out() -> None:
    assert engine_stats(exposition(finished_prompt="-5")).tokens_in_flight is None
    assert engine_stats(exposition(deferred="-1")).waiting_deferred is None


def test_the_narrowed_scrape_asks_for_the_sums_not_the_buckets() -> None:
    # ~10 KB for the families kvtop reads: the sums are one sample each, the buckets ~20
    assert {"vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_sum",
            "vllm:num_requests_waiting_by_reason"} <= VLLM_NAMES
    assert "vllm:request_prompt_tokens_bucket" not in VLLM_NAMES


def test_after_a_clean_point_the_estimate_counts_from_the_buckets_before_it() -> None:
    # 20 healthy buckets, one drained to nothing (a clean point: the window starts over),
    # then 8 buckets leaking 10 blocks and a lump to 40: the window after the clean point
    # starts with the leak under way; the buckets before it say where zero was
    series = swinging([0.0] * 20)
    series += [replace(s, t=s.t + 20 * 60, blocks_used=0.0, kv_usage=0.0, running=0.0,
                       tokens_in_flight=0.0) for s in series[:PER_BUCKET]]
    series += [replace(s, t=s.t + 21 * 60) for s in swinging([10.0] * 8 + [40.0] * 30)]
    found = run(series)
    leak = next(v for v in found if v.state == "leak")
    assert leak.leaked_blocks == pytest.approx(40.0, abs=0.5)
