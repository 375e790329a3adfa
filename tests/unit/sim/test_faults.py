"""The simulator's faults: the state each one leaves, their order in time, the `kvtop sim`
flags' plan and the broken exposition. The leak and stall evaluations rely on these doing
exactly what they say (tests/unit/sim/test_simulation.py runs them in a simulation)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.sim.faults import Fault, FaultSchedule, FaultState, malform, plan

HEALTHY = FaultState()


def after(*faults: Fault, state: FaultState | None = None) -> dict[str, object]:
    """The fields of the state the faults leave, applied in order."""
    state = state if state is not None else FaultState()
    for fault in faults:
        state.apply(fault)
    return dataclasses.asdict(state)


def healthy(**changes: object) -> dict[str, object]:
    return dataclasses.asdict(dataclasses.replace(HEALTHY, **changes))


def test_a_new_state_is_healthy_and_open() -> None:
    assert dataclasses.asdict(FaultState()) == {
        "leak_frac": 0.0, "stalled": False, "metrics_delay": 0.0, "metrics_hang": False,
        "malformed": False, "token": None}


@pytest.mark.parametrize(("fault", "state"), [
    (Fault(0, "leak", 0.25), healthy(leak_frac=0.25)),
    (Fault(0, "leak", "0.5"), healthy(leak_frac=0.5)),
    (Fault(0, "stall", 30.0), healthy(stalled=True)),
    (Fault(0, "stall"), healthy(stalled=True)),
    (Fault(0, "wedge"), healthy(stalled=True)),
    (Fault(0, "slow", 1.5), healthy(metrics_delay=1.5)),
    (Fault(0, "hang"), healthy(metrics_hang=True)),
    (Fault(0, "malformed"), healthy(malformed=True)),
    (Fault(0, "auth", "s3cret"), healthy(token="s3cret")),
    (Fault(0, "auth", 42), healthy(token="42")),
    (Fault(0, "lump", 50.0), healthy()),  # the engine's business: the state has no lump
    (Fault(0, "restart"), healthy()),
    (Fault(0, "resume"), healthy()),
    (Fault(0, "heal"), healthy()),
])
def test_each_fault_changes_only_its_own_part_of_a_healthy_state(
        fault: Fault, state: dict[str, object]) -> None:
    assert after(fault) == state


def test_a_leak_of_none_or_zero_stops_leaking() -> None:
    assert after(Fault(0, "leak", 0.3), Fault(1, "leak")) == healthy()
    assert after(Fault(0, "leak", 0.3), Fault(1, "leak", 0.0)) == healthy()


def test_a_slow_of_none_or_zero_answers_at_once_again() -> None:
    assert after(Fault(0, "slow", 2.0), Fault(1, "slow")) == healthy()
    assert after(Fault(0, "slow", 2.0), Fault(1, "slow", 0)) == healthy()


def test_auth_of_none_opens_the_server_again() -> None:
    assert after(Fault(0, "auth", "t"), Fault(1, "auth")) == healthy()


@pytest.mark.parametrize("ending", ["resume", "restart"])
@pytest.mark.parametrize("stopper", ["stall", "wedge"])
def test_a_resume_or_restart_ends_a_stall_or_wedge_but_not_a_leak(
        stopper: str, ending: str) -> None:
    faults = (Fault(0, "leak", 0.4), Fault(1, stopper), Fault(2, ending))  # type: ignore[arg-type]
    assert after(*faults) == healthy(leak_frac=0.4)


def test_heal_ends_the_metrics_faults_but_not_the_engine_or_auth_ones() -> None:
    broken = (Fault(0, "leak", 0.1), Fault(0, "stall"), Fault(0, "slow", 3.0), Fault(0, "hang"),
              Fault(0, "malformed"), Fault(0, "auth", "t"))
    assert after(*broken) == {"leak_frac": 0.1, "stalled": True, "metrics_delay": 3.0,
                              "metrics_hang": True, "malformed": True, "token": "t"}
    assert after(*broken, Fault(1, "heal")) == healthy(leak_frac=0.1, stalled=True, token="t")


def test_a_lump_leaves_the_state_to_the_engine_and_heals_nothing() -> None:
    broken = (Fault(0, "slow", 3.0), Fault(0, "hang"), Fault(0, "malformed"))
    assert after(*broken, Fault(1, "lump", 64.0)) == after(*broken)


def test_the_schedule_gives_faults_in_time_order_and_equal_times_in_given_order() -> None:
    given = [Fault(5, "hang"), Fault(1, "slow", 0.5), Fault(5, "heal"), Fault(3, "stall"),
             Fault(5, "malformed")]
    schedule = FaultSchedule(given)
    assert schedule.next_time() == 1
    assert schedule.pop_due(0.999) == []
    assert schedule.pop_due(1.0) == [given[1]]  # due exactly at its time
    assert schedule.next_time() == 3
    assert schedule.pop_due(4.999) == [given[3]]
    assert schedule.pop_due(5.0) == [given[0], given[2], given[4]]
    assert schedule.next_time() == float("inf")
    assert schedule.pop_due(1e9) == []


def test_a_fault_added_later_takes_its_place_in_time() -> None:
    schedule = FaultSchedule([Fault(10, "hang")])
    schedule.add(Fault(2, "slow", 1.0))
    schedule.add(Fault(10, "heal"))
    assert schedule.next_time() == 2
    assert [f.kind for f in schedule.pop_due(10)] == ["slow", "hang", "heal"]


def test_an_empty_schedule_has_nothing_due_ever() -> None:
    schedule = FaultSchedule()
    assert schedule.next_time() == float("inf")
    assert schedule.pop_due(float("inf")) == []


def test_no_flags_plan_no_faults() -> None:
    assert plan() == []


def test_every_flag_plans_its_fault_at_its_time_in_order() -> None:
    assert plan(leak_frac=0.2, leak_at=60.0, restart_at=(30.0, 90.0), stall_at=120.0,
                stall_for=15.0, lumps=[(40.0, 64.0), (80.0, 8.0)], wedge_at=200.0,
                slow_metrics=2.5, hang_at=150.0, malformed_at=170.0, token="s3cret") == [
        Fault(30.0, "restart"), Fault(90.0, "restart"), Fault(60.0, "leak", 0.2),
        Fault(120.0, "stall", 15.0), Fault(40.0, "lump", 64.0), Fault(80.0, "lump", 8.0),
        Fault(200.0, "wedge"), Fault(0.0, "slow", 2.5), Fault(150.0, "hang"),
        Fault(170.0, "malformed"), Fault(0.0, "auth", "s3cret")]


def test_a_leak_without_a_time_starts_at_once_and_a_stall_without_a_length_never_ends() -> None:
    assert plan(leak_frac=0.01) == [Fault(0.0, "leak", 0.01)]
    assert plan(stall_at=5.0) == [Fault(5.0, "stall", None)]


def test_zero_leak_and_zero_slowness_plan_nothing_but_time_zero_faults_do() -> None:
    assert plan(leak_frac=0.0, leak_at=10.0, slow_metrics=0.0) == []
    assert plan(stall_at=0.0, wedge_at=0.0, hang_at=0.0, malformed_at=0.0, token="") == [
        Fault(0.0, "stall", None), Fault(0.0, "wedge"), Fault(0.0, "hang"),
        Fault(0.0, "malformed"), Fault(0.0, "auth", "")]


def test_the_smallest_leak_and_slowness_are_planned() -> None:
    assert plan(leak_frac=1e-9, slow_metrics=1e-9) == [
        Fault(0.0, "leak", 1e-9), Fault(0.0, "slow", 1e-9)]


EXPOSITION = (
    "# HELP a_total A.\n"
    "# TYPE a_total counter\n"
    'a_total{model="m"} 1.0\n'
    "# HELP b B.\n"
    "# TYPE b gauge\n"
    'b{model="m",le="}"} 2.0\n'
    'c{model="m"} 3.0\n'
)


def test_malform_cuts_the_first_sample_of_the_second_half_inside_its_labels() -> None:
    assert malform(EXPOSITION) == (
        "# HELP a_total A.\n"
        "# TYPE a_total counter\n"
        'a_total{model="m"} 1.0\n'
        "# HELP b B.\n"
        "# TYPE b gauge\n"
        'b{model="m",le=" 0.5 garbage\x00\n'
        "{{not a metric\n")


def test_malform_of_a_short_exposition_cuts_its_only_sample() -> None:
    assert malform('x{a="1"} 1\n') == 'x{a="1" 0.5 garbage\x00\n{{not a metric\n'
    assert malform('# HELP x X.\nx{a="1"} 1\n') == (
        '# HELP x X.\nx{a="1" 0.5 garbage\x00\n{{not a metric\n')


def test_malform_of_comments_only_breaks_the_last_line() -> None:
    assert malform("# HELP x X.\n# TYPE x gauge\n") == (
        "# HELP x X.\n# TYPE x gauge 0.5 garbage\x00\n{{not a metric\n")


def test_a_malformed_exposition_does_not_parse() -> None:
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(malform(EXPOSITION)))
