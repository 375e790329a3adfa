"""The load-explained witness (derive/leak_load.py) for a server that never goes idle, each
rule at its boundary: exactly at the threshold and a hair either side, scrape by scrape
(issue 30).

Constructed series: one scrape every 10 s on a minute boundary, so every bucket's mean is
exact; a steady load (requests finishing, tokens flowing) unless said. Thresholds are read
from LeakParams, never restated."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtop.derive.leak import LeakParams
from kvtop.derive.stats import EngineStats
from tests.scenarios.leak_buckets import (
    FLOOR_POOL,
    PER_BUCKET,
    closes,
    floor_scrape,
    floor_verdicts,
)

T0M = 1_700_000_040.0  # on a minute: buckets start with the series


STEP = 10


BLOCK = 16


def loaded(t: float, leaked: float, *, running: float, preemptions: float = 0.0,
           waiting: float = 0.0, aborted: float = 0.0, used: float | None = None
           ) -> EngineStats:
    """A scrape whose used blocks are exactly what its tokens in flight hold (a block per
    BLOCK tokens, half a block rounded up per request) plus `leaked`."""
    in_flight = running * (600.0 + 200.0 * (t // 60 % 3))  # contexts cycle, running swings
    level = in_flight / BLOCK + running / 2 + leaked if used is None else used
    return replace(floor_scrape(t, level, running=running, preemptions=preemptions),
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
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 20)))
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
    (FLOOR_POOL * LeakParams().watch_rise_frac + 0.01, "watch"),  # a hair over WATCH's rise
    (FLOOR_POOL * LeakParams().watch_rise_frac - 0.01, "ok"),  # a hair under
    (FLOOR_POOL * LeakParams().leak_rise_frac - 0.01, "watch"),  # a hair under LEAK's
    (FLOOR_POOL * LeakParams().leak_rise_frac + 0.01, "leak"),  # a hair over
], ids=["over-watch", "under-watch", "under-leak", "over-leak"])
def test_unexplained_blocks_are_watch_from_watchs_rise_and_leak_from_leaks(
        lump: float, worst: str) -> None:
    found = floor_verdicts(swinging([0.0] * 20 + [lump] * 25))
    states = {v.state for v in found}
    assert max(states, key=["warmup", "ok", "watch", "leak"].index) == worst


def test_the_step_counts_from_explain_z_on() -> None:
    # a clean step: the rank statistic grows with each bucket after it; WATCH at the first
    # close where it reaches explain_z, none before
    p = LeakParams()
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 12)))
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
    found = closes(floor_verdicts(swinging([0.0] * 20 + [40.0] * 10 + [latest] * 6)))
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
        level = p.explain_noise * 1.4826 * d + tenth / 10
        found = closes(floor_verdicts(swinging(wander + [level] * 20)))
        evidence = found[-1].evidence
        assert evidence["unexplained_noise"] == pytest.approx(1.4826 * d, rel=0.01)
        needed = p.explain_noise * float(evidence["unexplained_noise"])
        clears = float(evidence["unexplained_rise"]) >= needed
        assert ("unexplained_evidence_s" in evidence) == clears
        held.add(clears)
    assert held == {True, False}


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
