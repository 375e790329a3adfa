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
