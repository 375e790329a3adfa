"""The load-explained witness (derive/leak_load.py) for a server that never goes idle, each
rule at its boundary: exactly at the threshold and a hair either side, scrape by scrape
(issue 30).

Constructed series: one scrape every 10 s on a minute boundary, so every bucket's mean is
exact; a steady load (requests finishing, tokens flowing) unless said. Thresholds are read
from LeakParams, never restated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from kvtop.derive import leak as leak_module
from kvtop.derive import leak_load
from kvtop.derive.leak_load import (
    MIN_AFTER,
    TAU_EVERY,
    LoadBucket,
    _features,
    _fit_levels,
    comparable,
    explain,
)
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.stats import EngineStats
from tests.scenarios.leak_buckets import (
    BLOCK,
    FLOOR_POOL,
    PER_BUCKET,
    closes,
    floor_verdicts,
    loaded,
    swinging,
)

T0M = 1_700_000_040.0  # on a minute: buckets start with the series


STEP = 10


def test_a_lump_the_load_does_not_explain_is_watch_then_leak() -> None:
    # the load's coefficients come from a fit with a hinge, which a lump does not fit
    # exactly: they, the rise and the estimate are right within 1 %
    p = LeakParams()
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 20)))
    watch = next(i for i, v in enumerate(found) if v.state == "watch")
    leak = next(i for i, v in enumerate(found) if v.state == "leak")
    assert found[watch].evidence["unexplained_rise"] == pytest.approx(40.0, rel=0.01)
    assert found[watch].evidence["blocks_per_token"] == pytest.approx(1 / BLOCK, rel=0.01)
    assert "40 blocks (4.0% of the pool) held beyond what the load explains" in (
        found[watch].reason)
    assert (leak - watch) * 60 == pytest.approx(p.leak_persist_s, abs=p.bucket_s)
    assert found[leak].leaked_blocks == pytest.approx(40.0, rel=0.01)
    # the floor's trend does not speak where tokens in flight are known
    assert all("floor" not in v.reason for v in found)


def _supports(evidence: dict[str, float | str], p: LeakParams) -> bool:
    """The witness's WATCH rule, on the figures the verdict carries."""
    rise = float(evidence["unexplained_rise"])
    return (float(evidence["unexplained_z"]) >= p.explain_z
            and evidence["unexplained_still_up"] == "yes"
            and rise >= p.watch_rise_frac * FLOOR_POOL
            and rise >= p.explain_noise * float(evidence["unexplained_noise"]))


def _judged(series: list[EngineStats], p: LeakParams) -> tuple[bool, bool]:
    """Check the witness's rules at every bucket close, exactly on the figures it measured:
    a close that meets WATCH's rule has evidence, evidence begins only at such a close,
    LEAK begins only with LEAK's rise after leak_persist_s of evidence and always then.
    Returns whether evidence and LEAK ever began, for the caller to see both sides of each
    boundary."""
    begun = leaked = False
    before: float | str | None = None
    for v in closes(floor_verdicts(series, p)):
        e = v.evidence
        if "unexplained_rise" not in e:
            continue
        held = e.get("unexplained_evidence_s")
        if _supports(e, p):
            assert held is not None
        if held is not None and before is None:
            assert _supports(e, p)
            begun = True
        due = (held is not None and float(held) >= p.leak_persist_s
               and float(e["unexplained_rise"]) >= p.leak_rise_frac * FLOOR_POOL)
        assert due == (v.state == "leak") or leaked  # once LEAK, it holds for leak_hold_s
        leaked = leaked or v.state == "leak"
        before = held
    return begun, leaked


@pytest.mark.parametrize("rule", ["watch", "leak"])
def test_unexplained_blocks_are_watch_from_watchs_rise_and_leak_from_leaks(rule: str) -> None:
    # lumps a little either side of the threshold: the rules hold exactly on the rise
    # measured at every close, and both sides of the boundary occur
    p = LeakParams()
    threshold = p.watch_rise_frac if rule == "watch" else p.leak_rise_frac
    outcomes = set()
    for tenth in range(-6, 7, 2):
        lump = FLOOR_POOL * threshold + tenth / 10
        begun, leaked = _judged(swinging([0.0] * 20 + [lump] * 25), p)
        outcomes.add(begun if rule == "watch" else leaked)
    assert outcomes == {True, False}


def test_watch_stays_below_leaks_rise() -> None:
    # a lump between WATCH's and LEAK's rise is WATCH for good, never LEAK
    p = LeakParams()
    lump = FLOOR_POOL * (p.watch_rise_frac + p.leak_rise_frac) / 2
    found = closes(floor_verdicts(swinging([0.0] * 20 + [lump] * 30)))
    assert found[-1].state == "watch"
    assert "LEAK from 1.5% of the pool" in found[-1].reason
    assert all(v.state != "leak" for v in found)


def test_the_step_counts_from_explain_z_on() -> None:
    # a clean step: the rank statistic grows with each bucket after it; WATCH at the first
    # close where it reaches explain_z, none before
    p = LeakParams()
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 12)))
    watch = next(i for i, v in enumerate(found) if v.state == "watch")
    assert found[watch].evidence["unexplained_z"] >= p.explain_z
    assert found[watch - 1].evidence["unexplained_z"] < p.explain_z
    assert found[watch - 1].state == "ok"


def test_unexplained_blocks_count_only_while_half_the_step_stays_up() -> None:
    # the step falls back towards half of itself: "still up" exactly while the latest
    # buckets' median is at least half the step over the level before it
    seen = set()
    for latest in (17.0, 19.0, 19.8, 20.0, 20.2, 21.0, 23.0):
        found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 10 + [latest] * 6)))
        e = found[-1].evidence
        step = float(e["unexplained_step"])
        up = step > 0 and float(e["unexplained_now"]) - float(e["unexplained_base"]) >= step / 2
        assert e["unexplained_still_up"] == ("yes" if up else "no")
        seen.add(up)
    assert seen == {True, False}


def test_a_step_already_falling_back_below_half_is_no_evidence() -> None:
    # a bump of 60 blocks for 5 buckets, then 25 for good: with explain_z at 4.0 the
    # split is first sure where the latest buckets already hold under half the step
    # (25 < 30). Its rise, 25, clears WATCH's and the noise's: only "still up" keeps it OK
    # (a bump already gone would read as a stepped level). Later the step itself falls to
    # the 25 that stayed, and that is WATCH.
    p = LeakParams(explain_z=4.0)
    found = closes(floor_verdicts(swinging([0.0] * 20 + [60.0] * 5 + [25.0] * 6), p))
    judged = [v for v in found if "unexplained_z" in v.evidence]
    sure = next(v for v in judged if float(v.evidence["unexplained_z"]) >= p.explain_z)
    e = sure.evidence
    assert e["unexplained_still_up"] == "no"
    assert float(e["unexplained_rise"]) >= max(p.watch_rise_frac * FLOOR_POOL,
                                              p.explain_noise * float(e["unexplained_noise"]))
    assert sure.state == "ok"
    assert judged[-1].evidence["unexplained_still_up"] == "yes"
    assert judged[-1].state == "watch"


def _knocked_out(monkeypatch: pytest.MonkeyPatch, bucket: int) -> None:
    """The witness finds no step (z 0) at the close that judges bucket `bucket` last."""
    judge = leak_module.explain

    def without(buckets: Sequence[LoadBucket], *args: Any, **kwargs: Any) -> Any:
        found = judge(buckets, *args, **kwargs)
        if found is not None and buckets[-1].t == T0M + bucket * 60 + 30:
            return replace(found, z=0.0)
        return found

    monkeypatch.setattr(leak_module, "explain", without)


@pytest.mark.parametrize("gap", ["none", "usable", "preempted"])
def test_leak_needs_the_evidence_at_every_close_that_can_speak_for_leak_persist_s(
        monkeypatch: pytest.MonkeyPatch, gap: str) -> None:
    # a lump of 4 %: WATCH at close w, LEAK leak_persist_s later. One usable close without
    # the evidence, two after w, restarts the clock: LEAK leak_persist_s after the close
    # after it (a grace for gaps let evidence at every other close count as sustained: a
    # load ramp reached LEAK so, last-ramp-up-08). A bucket with a preemption there
    # (the ledger cannot speak for it, nor for the one after) neither breaks nor builds it.
    p = LeakParams()
    series = swinging([0.0] * 20 + [40.0] * 30)
    states = [v.state for v in closes(floor_verdicts(series))]
    watch, persist = states.index("watch"), round(p.leak_persist_s / p.bucket_s)
    assert states.index("leak") == watch + persist
    if gap == "usable":
        _knocked_out(monkeypatch, watch + 1)  # judged at close watch + 2
    if gap == "preempted":
        series = [replace(s, preemptions_per_s=0.1)
                  if (watch + 1) * 60 <= s.t - T0M < (watch + 2) * 60 else s for s in series]
    states = [v.state for v in closes(floor_verdicts(series))]
    assert states[watch:watch + 3] == ["watch"] * 3  # WATCH holds through the gap
    restarted = watch + 3 if gap == "usable" else watch
    assert states.index("leak") == restarted + persist


def test_unexplained_blocks_must_clear_their_own_noise() -> None:
    # before the lump the unexplained level wanders (-2d..2d in a cycle of 5 the load,
    # which swings in cycles of 2 and 3, cannot explain): its noise is 1.4826 x its median
    # absolute deviation, d. Lumps around explain_noise times that: evidence exactly when
    # the rise reaches it, at every close (the rules' check), both sides occurring
    p, d = LeakParams(), 10.0
    wander = [d * (m % 5 - 2) for m in range(20)]
    seen = set()
    for tenth in range(-8, 9, 2):
        level = p.explain_noise * 1.4826 * d + tenth / 10
        series = swinging(wander + [level] * 20)
        found = closes(floor_verdicts(series))
        assert found[-1].evidence["unexplained_noise"] == pytest.approx(1.4826 * d, rel=0.05)
        seen.add(_judged(series, p)[0])
    assert seen == {True, False}


def test_it_judges_from_explain_min_buckets_usable_buckets() -> None:
    p = LeakParams()
    found = closes(floor_verdicts(swinging([0.0] * (p.explain_min_buckets + 3))))
    counts = [v.evidence.get("load_buckets") for v in found]
    first = next(i for i, n in enumerate(counts) if n is not None)
    assert counts[first] == p.explain_min_buckets


def test_buckets_with_a_preemption_and_the_one_after_are_left_out() -> None:
    # preempted requests wait with their tokens counted and no blocks
    series = [replace(s, preemptions_per_s=0.1) if 20 * 60 <= s.t - T0M < 21 * 60 else s
              for s in swinging([0.0] * 30)]
    found = closes(floor_verdicts(series))
    plain = closes(floor_verdicts(swinging([0.0] * 30)))
    assert plain[-1].evidence["load_buckets"] - found[-1].evidence["load_buckets"] == 2


def test_a_pinned_bucket_is_left_out() -> None:
    p = LeakParams()
    full = p.pinned_frac * FLOOR_POOL
    series = [replace(s, blocks_used=full, kv_usage=full / FLOOR_POOL)
              if 20 * 60 <= s.t - T0M < 21 * 60 else s for s in swinging([0.0] * 30)]
    under = [replace(s, blocks_used=full - 0.01, kv_usage=(full - 0.01) / FLOOR_POOL)
             if 20 * 60 <= s.t - T0M < 21 * 60 else s for s in swinging([0.0] * 30)]
    assert (closes(floor_verdicts(under))[-1].evidence["load_buckets"]
            - closes(floor_verdicts(series))[-1].evidence["load_buckets"]) == 1


@pytest.mark.parametrize(("waiting", "lost"), [(1.0, True), (0.0, False)],
                         ids=["while-waiting", "none-waiting"])
def test_aborts_while_requests_wait_are_counted_as_lost_tokens(waiting: float,
                                                               lost: bool) -> None:
    # an abort before the first token leaves its prompt counted as finished, never as
    # processed; only a request still waiting (or prefilling) can be aborted so
    series = [replace(s, waiting=waiting, finished_per_s={"stop": 0.5, "abort": 0.1})
              if 20 * 60 <= s.t - T0M < 21 * 60 else s for s in swinging([0.0] * 30)]
    found = closes(floor_verdicts(series))
    assert (found[-1].evidence["ledger_lost_tokens"] > 0) == lost


def test_a_scrape_without_tokens_in_flight_starts_the_level_over() -> None:
    series = [replace(s, tokens_in_flight=None) if s.t - T0M == 20 * 60 else s
              for s in swinging([0.0] * 30)]
    found = closes(floor_verdicts(series))
    assert found[20].evidence.get("load_buckets") is not None
    assert found[22].evidence.get("load_buckets") is None


def test_after_a_clean_point_the_estimate_counts_from_the_buckets_before_it() -> None:
    # 20 healthy buckets, one drained to nothing (a clean point: the window starts over),
    # then 8 buckets leaking 10 blocks and a lump to 40: the window after the clean point
    # starts with the leak under way; the buckets before it say where zero was
    series = swinging([0.0] * 20)
    series += [replace(s, t=s.t + 20 * 60, blocks_used=0.0, kv_usage=0.0, running=0.0,
                       tokens_in_flight=0.0) for s in series[:PER_BUCKET]]
    series += [replace(s, t=s.t + 21 * 60) for s in swinging([10.0] * 8 + [40.0] * 30)]
    found = floor_verdicts(series)
    leak = next(v for v in found if v.state == "leak")
    assert leak.leaked_blocks == pytest.approx(40.0, abs=0.5)


def test_a_smooth_leak_counts_from_where_it_began() -> None:
    # a leak of 2 blocks a minute from bucket 20 under a load that climbs with it: the fit's
    # hinge finds where it began, so the load is not asked to explain it (blocks per token
    # exact) and the drift is all of it, where the split, inside the leak, sees only part
    p = LeakParams()
    series = [loaded((minute * PER_BUCKET + i) * STEP, 2.0 * max(0, minute - 20),
                     running=4.0 + (minute * 3) % 6 + minute / 10)
              for minute in range(40) for i in range(PER_BUCKET)]
    found = closes(floor_verdicts(series))
    e = found[-1].evidence
    # τ is tried at every TAU_EVERY-th bucket: within one bucket of the leak's start
    assert e["blocks_per_token"] == pytest.approx(1 / BLOCK, rel=1e-3)
    # the last bucket closed is minute 38: 18 minutes of leak since the hinge's bucket
    assert e["unexplained_drift"] == pytest.approx(2.0 * 18, abs=2.0)
    rise = float(e["unexplained_rise"])
    assert rise > float(e["unexplained_now"]) - float(e["unexplained_base"])
    assert found[-1].state in ("watch", "leak") and rise >= p.watch_rise_frac * FLOOR_POOL


def test_the_drift_counts_only_as_far_as_the_estimate() -> None:
    # a line overshoots a lump at its end: the rise is the larger of the split's step and
    # the drift capped at the leaked-block estimate, never the drift alone
    checked = 0
    for lump in (20.0, 40.0):
        for v in closes(floor_verdicts(swinging([0.0] * 20 + [lump] * 20))):
            e = v.evidence
            if "unexplained_drift" not in e:
                continue
            step_rise = float(e["unexplained_now"]) - float(e["unexplained_base"])
            capped = min(float(e["unexplained_drift"]), float(e["unexplained_leaked"]))
            sure = float(e["unexplained_drift_z"]) >= leak_load.HINGE_Z
            rise = max(step_rise, capped) if sure else step_rise
            assert e["unexplained_rise"] == pytest.approx(rise, abs=1e-9)
            checked += 1
    assert checked



def test_a_lump_while_the_load_ramps_is_not_taken_for_load() -> None:
    # a lump of 60 blocks at bucket 8 while running climbs steadily: in levels the lump
    # and the ramp look alike, in bucket-to-bucket changes the lump is one change the
    # load's changes do not explain; fitted as a step, the load's coefficients stay right
    series = [loaded((minute * PER_BUCKET + i) * STEP, 60.0 if minute >= 8 else 0.0,
                     running=4.0 + minute / 3 + (minute * 3) % 4)
              for minute in range(30) for i in range(PER_BUCKET)]
    found = closes(floor_verdicts(series))
    e = found[-1].evidence
    assert e["blocks_per_token"] == pytest.approx(1 / BLOCK, rel=1e-3)
    assert e["unexplained_rise"] == pytest.approx(60.0, rel=0.01)
    assert found[-1].state == "leak"


def test_a_lump_right_after_the_pool_drained_counts_from_before_the_drain() -> None:
    # 20 healthy buckets, one drained to nothing (a clean point: the window starts over),
    # then a lump of 40 from the first bucket after it: the window holds no bucket without
    # it, so the buckets before the drain are the split's "before"
    series = swinging([0.0] * 20)
    series += [replace(s, t=s.t + 20 * 60, blocks_used=0.0, kv_usage=0.0, running=0.0,
                       tokens_in_flight=0.0) for s in series[:PER_BUCKET]]
    series += [replace(s, t=s.t + 21 * 60) for s in swinging([40.0] * 25)]
    found = closes(floor_verdicts(series))
    e = found[-1].evidence
    assert e["unexplained_rise"] == pytest.approx(40.0, rel=0.01)
    assert found[-1].state == "leak"


def test_buckets_before_a_drain_at_a_load_the_window_never_saw_are_no_baseline() -> None:
    # 20 buckets at 2–4 running, then a drain, then 30 at 6–11 running; before the drain
    # the pool held 30 blocks fewer than the line through the loads after it says (the
    # level is not linear in the load over so wide a range, as on a ramp). Judged by the
    # window's fit, they would open a 30-block step (3 % of the pool): none of them lies
    # within the loads the window spans, so none is its "before", and nothing leaked
    def bucket(minute: int, running: float, offset: float) -> list[EngineStats]:
        return [loaded((minute * PER_BUCKET + i) * STEP, offset, running=running)
                for i in range(PER_BUCKET)]

    series = [s for m in range(20) for s in bucket(m, 2.0 + m % 3, -30.0)]
    series += [replace(s, t=s.t + 20 * 60, blocks_used=0.0, kv_usage=0.0, running=0.0,
                       tokens_in_flight=0.0) for s in series[:PER_BUCKET]]
    series += [s for m in range(21, 51) for s in bucket(m, 6.0 + (m * 3) % 6, 0.0)]
    found = floor_verdicts(series)
    assert {v.state for v in found[21 * PER_BUCKET:]} == {"ok"}
    assert closes(found)[-1].evidence["unexplained_rise"] == pytest.approx(0.0, abs=1.0)


WINDOW = [LoadBucket(60.0 * i, 300.0 + 10 * i, 4000.0 + 500 * i, 4.0 + i, 100.0 * i,
                     800.0 + 50 * i, 0.0, 0.0, True) for i in range(5)]


@pytest.mark.parametrize(("field", "value", "kept"), [
    ("in_flight", 4000.0, True), ("in_flight", 4000.0 - 1e-6, False),
    ("in_flight", 6000.0, True), ("in_flight", 6000.0 + 1e-6, False),
    ("running", 4.0, True), ("running", 4.0 - 1e-9, False),
    ("prompt_rate", 1000.0, True), ("prompt_rate", 1000.0 + 1e-6, False),
    ("deferred", 0.0, True), ("deferred", 1e-9, False),
])
def test_a_clean_bucket_is_comparable_within_the_windows_loads_bounds_included(
        field: str, value: float, kept: bool) -> None:
    # the middle bucket of the window, one feature moved to the window's bound or a hair
    # beyond it (a feature that never moves in the window, such as deferred, bounds at
    # its one value)
    rows = [_features(b, 0.0) for b in WINDOW]
    clean = [replace(WINDOW[2], **{field: value})]
    assert comparable(clean, rows) == (clean if kept else [])


def _smooth_leak_buckets() -> list[LoadBucket]:
    """40 buckets under a swinging load leaking 2 blocks a bucket throughout (the split
    lands inside the leak), and a little deterministic noise (so that the hinge's error
    is not zero)."""
    out = []
    for i in range(40):
        running = 4.0 + (i * 3) % 6
        in_flight = running * (600.0 + 200.0 * (i % 3))
        level = (in_flight / BLOCK + running / 2 + 2.0 * i
                 + ((i * 7) % 5 - 2) * 0.8)
        out.append(LoadBucket(60.0 * i + 30, level, in_flight, running, 0.0, 500.0, 0.0,
                              0.0, True))
    return out


def _sse(columns: list[list[float]], y: list[float]) -> float:
    """The residual sum of squares of least squares on these columns (Gauss–Jordan)."""
    size = len(columns)
    aug = [[sum(a * b for a, b in zip(ci, cj, strict=True)) for cj in columns]
           + [sum(a * b for a, b in zip(ci, y, strict=True))] for ci in columns]
    for c in range(size):
        p = max(range(c, size), key=lambda r: abs(aug[r][c]))
        aug[c], aug[p] = aug[p], aug[c]
        aug[c] = [v / aug[c][c] for v in aug[c]]
        for r in range(size):
            if r != c:
                aug[r] = [a - aug[r][c] * b for a, b in zip(aug[r], aug[c], strict=True)]
    coef = [row[-1] for row in aug]
    return sum((v - sum(k * col[j] for k, col in zip(coef, columns, strict=True))) ** 2
               for j, v in enumerate(y))


def test_the_hinges_sureness_is_its_slope_over_its_standard_error() -> None:
    # against a brute-force least squares at every τ the fit tries: z² = (SSE without the
    # hinge − SSE with it at the best τ) × dof / SSE with it, dof = n − 3 (intercept,
    # tokens in flight, hinge)
    buckets = _smooth_leak_buckets()
    hours = [(b.t - buckets[0].t) / 3600 for b in buckets]
    levels, x = [b.level for b in buckets], [b.in_flight for b in buckets]
    n, ones = len(buckets), [1.0] * len(buckets)
    taus = [hours[k - 1] for k in range(n - 1, 0, -1)
            if n - k >= MIN_AFTER and (n - k - MIN_AFTER) % TAU_EVERY == 0]
    with_hinge = min(_sse([ones, x, [max(0.0, h - tau) for h in hours]], levels)
                     for tau in taus)
    without = _sse([ones, x], levels)
    expected = math.sqrt((without - with_hinge) * (n - 3) / with_hinge)
    fit = _fit_levels(levels, [[v] for v in x], hours)
    assert fit.drift_z == pytest.approx(expected, rel=1e-3)
    assert fit.drift == pytest.approx(2.0 * 39, rel=0.05)


def test_the_drift_counts_in_the_rise_from_hinge_z_on(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    # exactly at HINGE_Z the drift counts (a smooth leak's split sees only its part after
    # the split); a hair below it, the rise is the split's alone
    buckets = _smooth_leak_buckets()
    found = explain(buckets, 5, 5, 15)
    assert found is not None
    split_only = found.now - found.base
    assert min(found.drift, found.leaked) > split_only + 5.0  # the drift would matter
    monkeypatch.setattr(leak_load, "HINGE_Z", found.drift_z)
    at = explain(buckets, 5, 5, 15)
    monkeypatch.setattr(leak_load, "HINGE_Z", math.nextafter(found.drift_z, math.inf))
    above = explain(buckets, 5, 5, 15)
    assert at is not None and above is not None
    assert at.rise == pytest.approx(min(found.drift, found.leaked))
    assert above.rise == pytest.approx(split_only)


@pytest.mark.parametrize(("values", "ranks"), [
    ([3.0, 1.0, 2.0], [3.0, 1.0, 2.0]),
    ([3.0, 1.0, 3.0, 2.0, 3.0], [4.0, 1.0, 4.0, 2.0, 4.0]),  # three ties share 3, 4 and 5
    ([1.0, 1.0, 2.0, 2.0], [1.5, 1.5, 3.5, 3.5]),
    ([5.0, 5.0, 5.0], [2.0, 2.0, 2.0]),
], ids=["distinct", "ties-last", "two-ties", "all-tied"])
def test_ranks_start_at_1_and_ties_share_their_mean_rank(values: list[float],
                                                         ranks: list[float]) -> None:
    assert leak_load._ranks(values) == ranks


@pytest.mark.parametrize(("values", "side", "split"), [
    # ranks 1-4; a split at 2: U = 7 - 3 = 4 of 4 pairs, z = (4 - 2) / sqrt(4 x 5 / 12)
    ([0.0, 1.0, 2.0, 3.0], 1, (2, math.sqrt(2.4))),
    # the best split is the last one allowed (one value after it): z = 2 / sqrt(2)
    ([0.0, 0.0, 0.0, 0.0, 1.0], 1, (4, math.sqrt(2))),
    ([0.0, 1.0, 2.0], 2, None),  # fewer than two sides' worth
    ([0.0, 1.0, 2.0, 3.0], 2, (2, math.sqrt(2.4))),  # exactly two sides' worth
    # splits at 1 and at 3 tie (U = 2.5 of 3 pairs each, z = 1 / sqrt(1.25)): the first
    ([0.0, 1.0, 0.0, 1.0], 1, (1, 1 / math.sqrt(1.25))),
], ids=["middle", "last", "too-few", "just-enough", "tie"])
def test_the_best_split_is_the_surest_rank_test_of_later_above_earlier(
        values: list[float], side: int, split: tuple[int, float] | None) -> None:
    found = leak_load.best_split(values, side)
    assert found == (split if split is None else (split[0], pytest.approx(split[1])))


@pytest.mark.parametrize(("matrix", "inverse"), [
    # the intercept's diagonal bare, the others ridged by RIDGE x the count (here 1)
    ([[1.0, 2.0], [3.0, 4.0]], [[-2.0, 1.0], [1.5, -0.5]]),
    ([[0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]),  # a zero pivot: rows swapped
    ([[0.0, 0.0], [0.0, 0.0]], None),  # singular, no count to ridge it with
], ids=["pivoted", "swapped", "singular"])
def test_the_inverse_is_gauss_jordan_with_a_ridge_off_the_intercept(
        matrix: list[list[float]], inverse: list[list[float]] | None) -> None:
    found = leak_load._inverse(matrix)
    if inverse is None:
        assert found is None
    else:
        assert found is not None
        assert [v for row in found for v in row] == pytest.approx(
            [v for row in inverse for v in row], rel=1e-5, abs=1e-9)


def test_a_ridge_keeps_a_feature_that_never_moves_invertible() -> None:
    # [[1, 1], [1, 1]] is singular; ridged by 1e-6 it is not, its inverse ~ 1e6
    found = leak_load._inverse([[1.0, 1.0], [1.0, 1.0]])
    assert found is not None and found[1][1] == pytest.approx(1 / leak_load.RIDGE, rel=1e-3)


def _stairs(jumps: dict[int, float], count: int = 60) -> list[float]:
    levels, level = [], 0.0
    for i in range(count):
        level += jumps.get(i, 0.0)
        levels.append(level)
    return levels


@pytest.mark.parametrize("load_moves", [False, True], ids=["steady-load", "swinging-load"])
def test_lumps_are_the_max_lumps_largest_jumps_the_load_does_not_explain(
        load_moves: bool) -> None:
    # four jumps into buckets 10, 20, 30 and 40 (100, 60, 200 and 80 blocks); a load that
    # swings adds 30 blocks a unit, which the fit of changes takes out
    rows = [[float(i % 2) if load_moves else 1.0] for i in range(60)]
    levels = [v + 30 * row[0] for v, row in zip(_stairs({10: 100.0, 20: 60.0, 30: 200.0,
                                                           40: 80.0}), rows, strict=True)]
    assert leak_load._lumps(levels, rows) == [10, 30, 40]


def test_a_lump_is_a_jump_over_trim_sigmas_of_the_changes_spread() -> None:
    # 59 changes: one jump into bucket 6, the rest 0: the intercept takes 50/59 of the
    # jump from each, so the spread is 1.4826 x 50/59, and the jump stands out
    assert leak_load._lumps(_stairs({6: 50.0}), [[1.0]] * 60) == [6]
    assert leak_load._lumps(_stairs({}), [[1.0]] * 60) == []  # no jump, no lump


@pytest.mark.parametrize(("usable", "min_side", "min_buckets", "judged"), [
    (15, 5, 15, True), (14, 5, 15, False),  # explain_min_buckets
    (10, 5, 1, True), (9, 5, 1, False),  # two sides of step_min_buckets
    (4, 1, 1, True), (3, 1, 1, False),  # never under four
], ids=["min-buckets", "under-min-buckets", "two-sides", "under-two-sides", "four",
        "under-four"])
def test_the_level_is_judged_from_the_most_of_min_buckets_two_sides_and_four(
        usable: int, min_side: int, min_buckets: int, judged: bool) -> None:
    # the usable buckets, and one left out (a preemption) that never counts
    buckets = _smooth_leak_buckets()[:usable]
    buckets.insert(1, replace(buckets[1], usable=False))
    found = explain(buckets, 3, min_side, min_buckets)
    assert (found is not None) == judged
    assert found is None or found.buckets == usable


OFFSET = 100.0


def _exact(i: int, leaked: float) -> LoadBucket:
    """Bucket i of a load that swings (4-9 running, 600-1000 tokens each), its level
    exactly a block per BLOCK tokens in flight and half a block a request, over 100 blocks
    the load never frees (OFFSET), plus `leaked`."""
    running = 4.0 + (i * 3) % 6
    in_flight = running * (600.0 + 200.0 * (i % 3))
    return LoadBucket(60.0 * i + 30, OFFSET + in_flight / BLOCK + running / 2 + leaked, in_flight,
                      running, 0.0, 500.0, 0.0, 0.0, True)


def test_a_lump_after_a_clean_point_is_judged_against_the_buckets_before_it() -> None:
    # 30 clean buckets before the window's 30, a 40-block lump at the window's 6th: the
    # "before" of the split is the clean buckets and the window's first 5, all at 0
    clean = [_exact(i, 0.0) for i in range(30)]
    window = [_exact(i, 40.0 if i >= 35 else 0.0) for i in range(30, 60)]
    found = explain(window, 5, 5, 15, clean)
    assert found is not None
    latest = window[-5:]
    assert found.split_t == window[5].t  # the lump's first bucket
    # a perfect separation of 35 before from 25 after: U = 35 x 25, z = U/2 / its σ
    assert found.z == pytest.approx(35 * 25 / 2 / math.sqrt(35 * 25 * 61 / 12))
    assert (found.base, found.noise) == (pytest.approx(OFFSET, abs=1e-3),
                                         pytest.approx(0.0, abs=1e-3))
    assert (found.now, found.step, found.rise, found.leaked) == (
        pytest.approx(OFFSET + 40.0, abs=1e-3), pytest.approx(40.0, abs=1e-3),
        pytest.approx(40.0, abs=1e-3), pytest.approx(40.0, abs=1e-3))
    assert found.still_up and found.buckets == 30 and found.lost_tokens == 0.0
    assert found.per_token == pytest.approx(1 / BLOCK, rel=1e-4)
    assert found.in_flight_now == sum(b.in_flight for b in latest) / 5
    assert found.explained_now == pytest.approx(
        sum(b.in_flight / BLOCK + b.running / 2 for b in latest) / 5, abs=1e-3)


def test_the_leaked_blocks_are_the_mean_of_the_latest_four_buckets_by_default() -> None:
    # 40 blocks leaked into the last 4 of 30 buckets: their mean is 40 (the last 5's, 32)
    found = explain([_exact(i, 40.0 if i >= 26 else 0.0) for i in range(30)], 5, 5, 15)
    assert found is not None and found.leaked == pytest.approx(40.0, abs=1e-3)


def test_tokens_the_ledger_lost_are_added_back_to_the_tokens_in_flight() -> None:
    # from bucket 10 on the ledger counts 1600 tokens fewer than are in flight (a request
    # aborted before its first token): added back, the load explains the level exactly
    buckets = [_exact(i, 0.0) for i in range(30)]
    buckets = [replace(b, in_flight=b.in_flight - (1600.0 if i >= 10 else 0.0),
                       lost=1600.0 if i == 10 else 0.0) for i, b in enumerate(buckets)]
    found = explain(buckets, 5, 5, 15)
    assert found is not None and found.lost_tokens == 1600.0
    assert (found.now, found.rise, found.leaked) == (pytest.approx(OFFSET, abs=1e-3),
                                                     pytest.approx(0.0, abs=1e-3),
                                                     pytest.approx(0.0, abs=1e-3))


def test_a_feature_on_a_small_scale_is_fitted_as_surely_as_a_large_one() -> None:
    # deferred requests swing by a hundredth and hold 1000 blocks each: standardised, the
    # ridge (1e-6 of a column's variance) leaves its coefficient whole
    deferred = [0.01 * ((i * 7) % 11) / 10 for i in range(30)]
    levels = [b.level + 1000 * d for b, d in zip((_exact(i, 0.0) for i in range(30)), deferred,
                                                  strict=True)]
    rows = [[_exact(i, 0.0).in_flight, _exact(i, 0.0).running, d]
            for i, d in enumerate(deferred)]
    fit = _fit_levels(levels, rows, [i / 60 for i in range(30)])
    assert fit.per_unit == pytest.approx([1 / BLOCK, 0.5, 1000.0], rel=1e-3)


def test_a_feature_that_never_moves_is_left_out_of_the_fit_and_its_degrees_of_freedom() -> None:
    # no deferred requests and no prefix hits: the same fit, 0 blocks for each, and the
    # hinge's sureness over the same n − 3 degrees of freedom
    buckets = _smooth_leak_buckets()
    hours = [(b.t - buckets[0].t) / 3600 for b in buckets]
    levels = [b.level for b in buckets]
    alone = _fit_levels(levels, [[b.in_flight] for b in buckets], hours)
    steady = _fit_levels(levels, [[b.in_flight, 0.0, 7.0] for b in buckets], hours)
    assert steady.drift_z == pytest.approx(alone.drift_z, rel=1e-9)
    assert steady.drift == pytest.approx(alone.drift, rel=1e-9)
    assert steady.per_unit == [pytest.approx(alone.per_unit[0], rel=1e-9), 0.0, 0.0]



def _steady(level: float) -> LoadBucket:
    """A bucket of a load that never changes: nothing to fit, its level is all unexplained."""
    return LoadBucket(0.0, level, 4000.0, 5.0, 0.0, 500.0, 0.0, 0.0, True)


@pytest.mark.parametrize(("levels", "step", "still_up"), [
    ([300.0] * 20, 0.0, False),  # no step: nothing to stay up
    ([300.0] * 10 + [300.5] * 10, 0.5, True),  # half a block, still up
    ([300.0] * 10 + [302.0] * 10 + [301.0] * 5, 2.0, True),  # exactly half of it still up
    ([300.0] * 10 + [302.0] * 10 + [300.75] * 5, 2.0, False),  # under half
], ids=["none", "half-a-block", "exactly-half-up", "under-half-up"])
def test_a_step_is_still_up_while_the_latest_buckets_hold_half_of_it(
        levels: list[float], step: float, still_up: bool) -> None:
    buckets = [replace(_steady(level), t=60.0 * i) for i, level in enumerate(levels)]
    found = explain(buckets, 5, 5, 15)
    assert found is not None and (found.step, found.still_up) == (step, still_up)


def _hinged(slope: float, noise: float = 0.0, n: int = 40) -> tuple[list[float],
                                                                     list[list[float]],
                                                                     list[float]]:
    """n buckets a minute apart, 5 blocks a unit of a load that swings, and a hinge of
    `slope` blocks an hour from the middle bucket on, plus `noise` (deterministic)."""
    hours = [i / 60 for i in range(n)]
    rows = [[float((i * 3) % 6)] for i in range(n)]
    levels = [100 + 5 * row[0] + slope * max(0.0, h - hours[n // 2]) + noise * ((i * 7) % 5 - 2)
              for i, (h, row) in enumerate(zip(hours, rows, strict=True))]
    return levels, rows, hours


def test_the_hinge_is_placed_where_the_drift_began_and_counts_from_there() -> None:
    # 60 blocks an hour from bucket 20 to 39: 19 blocks, the load's 5 a unit apart
    fit = _fit_levels(*_hinged(60.0))
    assert fit.drift == pytest.approx(19.0, rel=1e-6)
    assert fit.per_unit == [pytest.approx(5.0, rel=1e-5)]


def test_a_level_falling_from_some_time_on_is_no_drift() -> None:
    assert _fit_levels(*_hinged(-60.0)).drift == 0.0  # a leak only adds


def test_too_few_buckets_for_a_hinge_give_no_drift_and_no_sureness() -> None:
    # 3 buckets: the hinge needs MIN_AFTER after its τ and one before
    fit = _fit_levels([1.0, 2.0, 4.0], [[1.0], [3.0], [2.0]], [0.0, 1 / 60, 2 / 60])
    assert (fit.drift, fit.drift_z) == (0.0, 0.0)


@pytest.mark.parametrize(("n", "dof"), [(5, 1), (40, 37)])
def test_the_hinges_sureness_over_few_degrees_of_freedom_and_little_noise(
        n: int, dof: int) -> None:
    # two columns and the intercept (a hair of noise, an SSE far under 1): z² = the
    # hinge's SSE gain x dof / the SSE left, against a brute-force least squares
    levels, rows, hours = _hinged(60.0, noise=0.01, n=n)
    rows = [[row[0], float((i * 7) % 4)] for i, row in enumerate(rows)]
    ones = [1.0] * n
    cols = [ones, [r[0] for r in rows], [r[1] for r in rows]]
    taus = [hours[k - 1] for k in range(n - MIN_AFTER, 0, -TAU_EVERY)]
    with_hinge = min(_sse([*cols, [max(0.0, h - tau) for h in hours]], levels) for tau in taus)
    without = _sse(cols, levels)
    assert with_hinge < 1
    fit = _fit_levels(levels, rows, hours)
    assert fit.drift_z == pytest.approx(math.sqrt((without - with_hinge) * dof / with_hinge),
                                        rel=1e-2)  # the ridge's share, at an SSE this small


def test_no_degree_of_freedom_left_is_sure_of_the_hinge() -> None:
    # 4 buckets, the intercept and two columns: the hinge fits the rest exactly
    fit = _fit_levels([1.0, 3.0, 4.0, 3.0], [[float(i % 2), float((i * 2) % 3)] for i in range(4)],
                      [i / 60 for i in range(4)])
    assert fit.drift_z == math.inf


def test_a_pivot_of_exactly_1e_12_is_still_inverted() -> None:
    found = leak_load._inverse([[1e-12]])
    assert found is not None and found[0][0] == pytest.approx(1e12)


def test_lumps_are_found_over_a_load_on_a_small_scale() -> None:
    # the load swings by a thousandth of a unit at 30000 blocks a unit (30 blocks):
    # standardised, the ridge leaves that whole and only the four jumps' largest three stand out
    rows = [[0.001 * (i % 2)] for i in range(60)]
    levels = [v + 30000 * row[0] for v, row in zip(_stairs({10: 100.0, 20: 60.0, 30: 200.0,
                                                           40: 80.0}), rows, strict=True)]
    assert leak_load._lumps(levels, rows) == [10, 30, 40]


@pytest.mark.parametrize(("close", "state", "ending"), [
    (29, "watch", " (confirming, 3 min)"),  # 180 s since the evidence began, at close 26
    (36, "leak", ", for 10 min"),  # 600 s
], ids=["watch", "leak"])
def test_the_reason_says_what_the_load_leaves_unexplained_and_for_how_long(
        close: int, state: str, ending: str) -> None:
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 20)))[close]
    evidence = found.evidence
    # what the load explains: a block per BLOCK tokens in flight and half a block for each
    # of the 4 or 7 requests running (5.2 or 5.8 on average over the latest five buckets)
    assert isinstance(evidence["tokens_in_flight"], float)
    assert evidence["explained_blocks"] - evidence["tokens_in_flight"] / BLOCK in (
        pytest.approx(5.2 / 2, abs=0.01), pytest.approx(5.8 / 2, abs=0.01))
    assert (found.state, found.reason) == (state, (
        "40 blocks (4.0% of the pool) held beyond what the load explains "
        f"({evidence['tokens_in_flight']:.0f} tokens in flight: "
        f"{evidence['explained_blocks']:.0f}){ending}"))
