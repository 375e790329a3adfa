"""One figure against the baseline (kvtop/baseline/judge.py): changed only when the rank test,
the noise margin and the change that matters agree; SAME only with the power to have seen a
change that matters; UNKNOWN with the minutes it needs; the relevance threshold from the
baseline; the rank-direction check."""

from __future__ import annotations

import math

import pytest

from kvtop.baseline import judge as judging
from kvtop.baseline.figures import SPECS, FigureSpec
from kvtop.baseline.judge import judge
from kvtop.baseline.model import Figure

KV = SPECS["kv_usage"]  # higher is worse; 10 % of the baseline, at least 3 points
RUNNING = SPECS["running"]  # a load figure
IDLE = SPECS["idle_kv_usage"]  # steady: the baseline's spread alone


def figure(values: list[float], value: float | None = None) -> Figure:
    return Figure(sum(values) / len(values) if value is None else value, tuple(values))


def steady(level: float, n: int, wobble: float = 0.002) -> list[float]:
    return [level + wobble * ((i % 3) - 1) for i in range(n)]


def test_a_clear_rise_is_worse_and_a_fall_better() -> None:
    base, up, down = steady(0.30, 10), steady(0.50, 10), steady(0.10, 10)
    assert judge(KV, figure(base), figure(up)).verdict == "worse"
    assert judge(KV, figure(base), figure(down)).verdict == "better"
    assert judge(RUNNING, figure(steady(5, 10, 0.1)), figure(steady(9, 10, 0.1))).verdict == \
        "higher"


def test_the_same_with_power_is_same_and_says_what_it_could_see() -> None:
    result = judge(KV, figure(steady(0.30, 10)), figure(steady(0.301, 10)))
    assert result.verdict == "same"
    assert result.matters == pytest.approx(0.03)  # 10 % of 0.30 is 0.03, the floor
    assert result.detectable is not None and result.detectable <= result.matters


@pytest.mark.parametrize(("n", "reachable"), [(4, False), (5, True)])
def test_the_rank_test_must_be_able_to_reach_alpha(n: int, reachable: bool) -> None:
    """n a side: the least p is 2 / C(2n, n): 0.029 at 4, 0.0079 at 5."""
    assert (judging._least_p(n, n) < judging.ALPHA) is reachable
    result = judge(KV, figure(steady(0.30, n)), figure(steady(0.30, n)))
    assert result.verdict == ("same" if reachable else "unknown")
    if not reachable:
        assert result.detectable == math.inf
        assert "can never reach the rank test's p < 0.01" in (result.note or "")
        assert result.minutes_needed == 2  # 6 against the baseline's 4: 2 / C(10, 4) < 0.01


def test_too_noisy_to_see_the_change_that_matters_is_unknown_with_the_minutes() -> None:
    base = [0.30, 0.40, 0.20, 0.35, 0.25, 0.30, 0.45, 0.15, 0.30, 0.30]
    now = [0.31, 0.41, 0.19, 0.36, 0.24, 0.31, 0.44, 0.16, 0.31, 0.29]
    result = judge(KV, figure(base), figure(now))
    assert result.verdict == "unknown"
    assert result.detectable is not None and result.matters is not None
    assert result.detectable > result.matters
    assert result.note is not None and result.note.startswith(
        "could not have seen a change of 0.03 fraction: the smallest change these runs "
        "could show is ")


def test_a_minute_that_is_not_a_number_adds_no_minutes_and_never_raises() -> None:
    base = steady(0.30, 20, 0.001)
    now = [0.30, math.nan, 0.31]
    ranks = judging.minutes_needed(KV, base, [0.30, 0.31, 0.32], 0.03, judging.ALPHA)
    assert judging.minutes_needed(KV, base, now, 0.03, judging.ALPHA) == ranks


def test_the_minutes_needed_follow_the_noise_margin() -> None:
    """The noise margin narrows as the square root of the minutes: with a quiet baseline,
    the run needs (its spread / the budget the baseline leaves) minutes."""
    base = steady(0.30, 20, 0.001)
    now = [0.30 + 0.05 * (-1) ** i for i in range(10)]
    needed = judging.minutes_needed(KV, base, now, 0.03, judging.ALPHA)
    budget = 0.03 ** 2 / (judging.NOISE_Z ** 2 * judging.DESIGN_EFFECT) - \
        (sum((v - 0.30) ** 2 for v in base) / 19) / 20
    variance = sum((v - 0.30) ** 2 for v in now) / 9
    assert needed == math.ceil(variance / budget) - 10
    result = judge(KV, figure(base), figure(now))
    assert result.verdict == "unknown" and result.minutes_needed == needed
    assert f"needs about {needed} more minutes in this run" in (result.note or "")


def test_a_baseline_too_noisy_for_any_run_asks_for_minutes_in_each() -> None:
    base = [0.30 + 0.2 * (-1) ** i for i in range(6)]
    result = judge(KV, figure(base), figure(steady(0.30, 6)))
    assert result.verdict == "unknown" and result.minutes_needed is None
    assert result.minutes_each is not None and result.minutes_each > 6
    assert f"needs about {result.minutes_each} minutes in each run (a longer baseline too)" \
        in (result.note or "")


def test_the_change_that_matters_comes_from_the_baseline() -> None:
    """10 % of the baseline's 0.60 is 0.06: a rise of 0.05 to 0.65 does not count, though
    10 % of the run's 0.65 would be 0.065 and of a baseline of 0.40 only 0.04."""
    base, now = steady(0.60, 20, 0.001), steady(0.65, 20, 0.001)
    result = judge(KV, figure(base), figure(now))
    assert result.matters == pytest.approx(0.06, abs=1e-4)
    assert result.verdict == "same" and result.note == (
        "p < 0.01, but smaller than the change that matters")
    assert judge(KV, figure(steady(0.40, 20, 0.001)), figure(steady(0.45, 20, 0.001))
                 ).verdict == "worse"


def test_a_rise_the_rank_test_sees_within_the_noise_is_unknown_never_same() -> None:
    """p < 0.01, but the runs' noise margin (0.07) is wider than the change that matters
    (0.03): the rise of 0.05 can't be told from how runs differ, and a SAME would claim a
    power the runs lacked."""
    base = [0.30 + 0.0424 * ((i % 5) - 2) for i in range(30)]
    now = [v + 0.05 for v in base]
    result = judge(KV, figure(base), figure(now))
    assert result.p_value is not None and result.p_value < 0.01
    assert result.verdict == "unknown" and result.threshold is not None
    assert result.threshold > 0.05 > result.matters  # type: ignore[operator]


def test_ranks_and_headline_moving_opposite_ways_is_no_change() -> None:
    """Most minutes higher, the headline (a median of the samples) lower: not a change."""
    base, now = steady(0.30, 10), steady(0.50, 10)
    result = judge(KV, figure(base), figure(now, value=0.20))
    assert result.verdict == "same"
    assert result.note == "the minutes' ranks and the headline moved opposite ways"


def test_unknown_on_either_side_is_unknown_never_same() -> None:
    missing = Figure(None)
    assert judge(KV, missing, figure(steady(0.3, 10))).note == "not known in the baseline"
    assert judge(KV, figure(steady(0.3, 10)), missing).note == "not known in this run"
    assert judge(KV, missing, missing).note == "not known in either run"
    few = judge(KV, figure(steady(0.3, 10)), figure(steady(0.3, 2)))
    assert few.verdict == "unknown" and few.minutes_needed == 1  # 3 reach p < 0.01 vs 10
    thin = judge(KV, figure(steady(0.3, 2)), figure(steady(0.3, 10)))
    assert thin.minutes_needed is None and thin.minutes_each is not None


def test_a_steady_figure_is_judged_on_the_baselines_spread() -> None:
    """The idle floor of a leaking run climbs: its own spread must not widen the margin."""
    base = [0.0] * 10
    now = [0.01 * i for i in range(10)]
    assert judge(IDLE, figure(base), figure(now)).verdict == "worse"


def test_the_json_carries_the_power() -> None:
    result = judge(KV, figure(steady(0.30, 10)), figure(steady(0.301, 10)))
    doc = result.to_json()
    assert doc["matters"] == pytest.approx(0.03) and doc["detectable"] is not None
    assert doc["minutes_needed"] is None and doc["matched_load"] is False
    assert "minutes_each" in doc


def test_a_spec_floor_of_zero_still_works() -> None:
    spec = FigureSpec("x", "x", "count", "higher", 0.0, 0.0)
    assert judge(spec, figure([1.0] * 6), figure([1.0] * 6)).verdict == "same"


def test_the_json_row_exactly() -> None:
    """Every key and its rounding: delta and the rest to 6 places, delta_pct to 1, p to 6."""
    result = judging.FigureResult(KV, 0.3, 0.4123456789, "worse", p_value=0.0012345678,
                                  n_baseline=10, n_now=12, note="n", threshold=0.0312345678,
                                  matters=0.03, detectable=0.0212345678, minutes_needed=4,
                                  minutes_each=9)
    assert result.to_json() == {
        "figure": "kv_usage", "label": "KV usage p50", "unit": "fraction",
        "worse_when": "higher", "baseline": 0.3, "now": 0.412346, "delta": 0.112346,
        "delta_pct": 37.4, "p_value": 0.001235, "values": [10, 12], "threshold": 0.031235,
        "matters": 0.03, "detectable": 0.021235, "minutes_needed": 4, "minutes_each": 9,
        "matched_load": False, "verdict": "worse", "note": "n"}


def test_the_change_in_percent_is_of_the_baselines_size() -> None:
    assert judging.FigureResult(KV, -2.0, -1.0, "same").delta_pct == 50.0  # not -50
    assert judging.FigureResult(KV, 0.0, 1.0, "same").delta_pct is None
    assert judging.FigureResult(KV, None, 1.0, "unknown").delta is None


def test_a_figure_not_known_keeps_what_is_known_and_the_counts() -> None:
    assert judge(KV, Figure(None, (0.3,) * 4), Figure(0.3, (0.3,) * 10)) == \
        judging.FigureResult(KV, None, 0.3, "unknown", n_baseline=4, n_now=10,
                             note="not known in the baseline")


def test_too_few_minutes_exactly() -> None:
    """Two minutes in this run against a baseline of three: the run needs 9 (2 / C(12, 3)
    < 0.01), 7 more; with a baseline of two, both runs need more."""
    three, two = Figure(0.3, (0.3,) * 3), Figure(0.3, (0.3,) * 2)
    assert judge(KV, three, two) == judging.FigureResult(
        KV, 0.3, 0.3, "unknown", n_baseline=3, n_now=2, matters=0.03, minutes_needed=7,
        note="too few minutes to judge (needs 3 each); needs about 7 more minutes in this run")
    assert judge(KV, two, Figure(0.3, (0.3,) * 10)) == judging.FigureResult(
        KV, 0.3, 0.3, "unknown", n_baseline=2, n_now=10, matters=0.03, minutes_each=9,
        note="too few minutes to judge (needs 3 each); needs about 9 minutes in each run (a "
             "longer baseline too)")


def test_a_long_baseline_still_needs_three_minutes_of_this_run() -> None:
    """Against 200 minutes the rank test could reach p < 0.01 with one (2 / 201), but a
    figure is judged on 3 a side: 2 minutes need 1 more, never "0 more" (a bug: the minutes
    for the rank test alone)."""
    result = judge(KV, Figure(0.3, (0.3,) * 200), Figure(0.3, (0.3,) * 2))
    assert result.minutes_needed == 1
    assert result.note == ("too few minutes to judge (needs 3 each); needs about 1 more "
                           "minutes in this run")


def test_three_minutes_a_side_are_judged() -> None:
    """Exactly MIN_VALUES a side passes the count (and then lacks the rank test's power)."""
    result = judge(KV, Figure(0.3, (0.3,) * 3), Figure(0.3, (0.3,) * 3))
    assert result.p_value == 1.0 and result.minutes_needed == 6 and result.minutes_each is None
    assert result.note == ("could not have seen a change of 0.03 fraction: these few minutes "
                           "can never reach the rank test's p < 0.01; needs about 6 more "
                           "minutes in this run")


def test_unknown_for_want_of_power_keeps_both_values() -> None:
    result = judge(KV, Figure(0.3, (0.3,) * 4), Figure(0.31, (0.3,) * 4))
    assert (result.spec, result.baseline, result.now, result.verdict) == (KV, 0.3, 0.31,
                                                                           "unknown")
    assert result.note == ("could not have seen a change of 0.03 fraction: these few minutes "
                           "can never reach the rank test's p < 0.01; needs about 2 more "
                           "minutes in this run")
    assert result.minutes_needed == 2 and result.minutes_each is None


def test_a_change_of_nothing_that_matters_is_never_within_reach() -> None:
    """rel and floor 0: no run is long enough for the noise margin to fall to 0."""
    spec = FigureSpec("x", "x", "count", "higher", 0.0, 0.0)
    result = judge(spec, figure([1.0, 2.0, 3.0] * 2), figure([1.0, 2.0, 3.0] * 2))
    assert result.verdict == "unknown" and result.matters == 0.0
    assert (result.minutes_needed, result.minutes_each) == (None, judging.MAX_MINUTES)
    assert result.note == ("could not have seen a change of 0 count: the smallest change these "
                           "runs could show is 2.3 count; not within 10,000 minutes a run: too "
                           "noisy to judge at the change that matters")


@pytest.mark.parametrize(("n_base", "minutes"), [(199, 2), (200, 1)])
def test_the_minutes_the_rank_test_needs_at_its_boundary(n_base: int, minutes: int) -> None:
    """One minute against 199: 2 / 200 is exactly 0.01, not below; against 200 it is."""
    assert judging._minutes_for_ranks(n_base, 0.01) == minutes


def test_no_length_of_run_reaches_an_impossible_alpha() -> None:
    assert judging._minutes_for_ranks(3, 1e-12) == judging.MAX_MINUTES
    assert judging.minutes_needed(SPECS["waiting"], [1.0] * 3, [1.0] * 3, 1.0, 1e-12) is None
    assert judging._least_p(0, 5) == 1.0  # no values on a side: no evidence at all


@pytest.mark.parametrize(("spread", "matters", "longest", "each"), [
    (3.0, 1.0, 10, 90),  # the noise margin: 10 minutes x (3 / 1) ** 2
    (0.1, 1.0, 3, 9),  # the rank test: 9 against 3
    (0.1, 1.0, 250, 250),  # neither: as long as the longer run already is
    (100.0, 1.0, 10, judging.MAX_MINUTES),  # 100 000: capped
    (0.1, 0.0, 10, judging.MAX_MINUTES),  # nothing matters: never
])
def test_the_minutes_each_run_needs(spread: float, matters: float, longest: int,
                                    each: int) -> None:
    assert judging._minutes_each([0.0] * longest, [0.0] * 3, spread, matters, 0.01) == each


@pytest.mark.parametrize(("ratio", "needed"), [(9999.5, None), (9998.5, 9999 - 10)])
def test_the_minutes_needed_stop_at_ten_thousand(ratio: float, needed: int | None) -> None:
    """A quiet baseline: the run needs ceil(its variance / the budget) minutes; 10 000 is
    beyond reach, 9 999 is not."""
    now = [0.0, 2.0] * 5  # variance 10 / 9
    matters = math.sqrt(10 / 9 / ratio * judging.NOISE_Z ** 2 * judging.DESIGN_EFFECT)
    assert judging.minutes_needed(SPECS["waiting"], [1.0] * 10, now, matters, 0.01) == needed


def test_the_minutes_needed_at_a_budget_of_exactly_nothing() -> None:
    """A flat baseline and nothing that matters leaves no budget: None, not a division by 0;
    a hair above, a number; a run already long enough needs 0 more."""
    now = [0.0, 2.0] * 5
    assert judging.minutes_needed(SPECS["waiting"], [1.0] * 10, now, 0.0, 0.01) is None
    assert judging.minutes_needed(SPECS["waiting"], [1.0] * 10, now, 0.1, 0.01) == 2202
    assert judging.minutes_needed(KV, [0.3] * 20, [0.3] * 20, 0.03, 0.01) == 0


def test_a_steady_figures_minutes_needed_use_the_baselines_spread() -> None:
    base, now = [0.010, 0.011, 0.009] * 7, [0.0, 0.03] * 10
    assert judging.minutes_needed(IDLE, base, now, 0.005, 0.01) == 0
    assert judging.minutes_needed(KV, base, now, 0.005, 0.01) == 174  # the run's own spread


def test_a_steady_figure_ignores_the_runs_spread_in_the_margin() -> None:
    """A quarter of this run's minutes at 0.2: with its spread the margin (0.062) would
    swallow the rise of 0.05; on the flat baseline's it is worse."""
    base, now = [0.0] * 40, [0.0] * 30 + [0.2] * 10
    assert judging.noise(base, now, 40) > 0.05
    result = judge(IDLE, figure(base), figure(now))
    assert result.verdict == "worse" and result.threshold == IDLE.floor


def test_the_change_that_counts_at_its_boundary() -> None:
    """Flat runs (no noise) a whole unit apart, the change that matters 1.0: a move of
    exactly 1.0 counts, a hair less is the same."""
    spec = FigureSpec("x", "x", "count", "higher", 0.0, 1.0)
    base = figure([1.0] * 10)
    assert judge(spec, base, figure([2.0] * 10)).verdict == "worse"
    hair = judge(spec, base, figure([2.0] * 10, value=1.999))
    assert hair.verdict == "same"
    assert hair.note == "p < 0.01, but smaller than the change that matters"
    assert (hair.spec, hair.baseline, hair.now, hair.p_value) == (spec, 1.0, 1.999,
                                                                  pytest.approx(1.7e-5, rel=0.1))


def test_the_rank_test_at_alpha_exactly() -> None:
    """p equal to alpha is no change, and the same carries no note; a hair above p it is."""
    base, now = figure(steady(0.30, 10)), figure(steady(0.50, 10))
    p = judge(KV, base, now).p_value
    assert p is not None
    at = judge(KV, base, now, alpha=p)
    assert at.verdict == "same" and at.note is None
    assert judge(KV, base, now, alpha=math.nextafter(p, 1)).verdict == "worse"


def test_the_least_p_at_alpha_exactly_is_out_of_reach() -> None:
    """Five a side: the least p is 2 / 252; alpha exactly that can't be reached."""
    least = 2 / math.comb(10, 5)
    base, now = figure([0.3] * 5), figure([0.3] * 5)
    assert judge(KV, base, now, alpha=least).detectable == math.inf
    assert judge(KV, base, now, alpha=math.nextafter(least, 1)).verdict == "same"


def test_the_same_without_a_rank_difference_has_no_note() -> None:
    result = judge(KV, Figure(0.3, (0.3,) * 10), Figure(0.3, (0.3,) * 10))
    assert (result.verdict, result.note, result.baseline, result.now) == ("same", None, 0.3,
                                                                          0.3)


def test_minutes_higher_and_an_unmoved_headline_is_no_change() -> None:
    """Every minute higher, the headline level: the ranks moved, the headline did not."""
    result = judge(KV, figure(steady(0.30, 10), value=0.30), figure(steady(0.32, 10),
                                                                     value=0.30))
    assert result.verdict == "same"
    assert result.note == "the minutes' ranks and the headline moved opposite ways"
    flat = FigureSpec("x", "x", "count", "higher", 0.0, 0.0)  # nothing to clear but the ranks
    level = judge(flat, figure([1.0] * 10), figure([2.0] * 10, value=1.0))
    assert level.verdict == "same"


def test_a_fall_the_ranks_see_below_half_the_pairs() -> None:
    """60 minutes a side, this run's 9.5 lower: U = 1275 of 3600 pairs (above a third,
    below half), p = 0.006; the headline down 20 beyond the margin of 14.2: better."""
    spec = FigureSpec("x", "x", "count", "higher", 0.0, 1.0)
    base = [float(i) for i in range(60)]
    result = judge(spec, figure(base), figure([v - 9.5 for v in base], value=9.5))
    assert (result.verdict, result.spec, result.baseline, result.now) == ("better", spec, 29.5,
                                                                          9.5)
    assert result.n_baseline == result.n_now == 60


def test_a_load_figure_keeps_what_the_rank_test_found() -> None:
    result = judge(RUNNING, figure([5.0] * 10), figure([9.0] * 10))
    assert result.verdict == "higher" and result.p_value is not None
    assert (result.n_baseline, result.n_now, result.matters) == (10, 10, 1.0)


def test_the_minutes_needed_leave_minutes_each_unset() -> None:
    base = steady(0.30, 20, 0.001)
    now = [0.30 + 0.05 * (-1) ** i for i in range(10)]
    result = judge(KV, figure(base), figure(now))
    assert result.minutes_needed is not None and result.minutes_each is None
    assert (result.spec, result.baseline, result.now) == (KV, figure(base).value,
                                                           figure(now).value)


def test_a_run_that_did_not_export_the_figure_keeps_the_baselines_value() -> None:
    assert judge(KV, Figure(0.3, (0.3,) * 10), Figure(None)) == judging.FigureResult(
        KV, 0.3, None, "unknown", n_baseline=10, note="not known in this run")
