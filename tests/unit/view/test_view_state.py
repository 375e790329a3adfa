"""The view state's rules without a terminal: the default sort by fleet size, choosing and
turning a sort, the `o` cycle, the sort marker and label, groups and their cycle, closing
and opening a group, and the search."""

from __future__ import annotations

import pytest

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.view.fleet import FleetRow, build_rows
from kvtop.view.groups import NONE
from kvtop.view.sort_keys import LARGE_FLEET, SORT_CYCLE
from kvtop.view.view_state import ViewState

NOW = 1000.0


def _rows(count: int) -> list[FleetRow]:
    """``count`` servers, the fuller the later its name; every tenth serves model b."""
    return build_rows([
        TargetState(Target.from_spec(f"h{i:03d}:1", group="east" if i % 2 else "west"), "up",
                    kind="vllm", last_good_t=NOW,
                    engines=[EngineStats("b" if i % 10 == 0 else "a", None, NOW,
                                         kv_usage=i / (count + 1))])
        for i in range(count)], NOW)


@pytest.mark.parametrize(("count", "key"), [
    (LARGE_FLEET, "name"), (LARGE_FLEET + 1, "worst"),
])
def test_until_a_sort_is_chosen_a_large_fleet_is_sorted_worst_first(count: int,
                                                                     key: str) -> None:
    view = ViewState()
    view.shown(_rows(count))
    assert view.sort_key == key
    view.sort_by("kv")
    view.shown(_rows(LARGE_FLEET + 1))
    assert view.sort_key == "kv"  # a chosen sort sticks, whatever the size


def test_the_same_sort_again_turns_the_order_round_and_another_starts_natural() -> None:
    view = ViewState()
    view.sort_by("kv")
    assert (view.sort_key, view.sort_reverse, view.ascending) == ("kv", False, False)
    assert view.sort_label == "KV use ▼"  # the column's marker: biggest first
    view.sort_by("kv")
    assert (view.sort_reverse, view.ascending, view.sort_label) == (True, True, "KV use ▲")
    view.sort_by("name")
    assert (view.sort_reverse, view.ascending, view.sort_label) == (False, True, "name ▲")
    view.sort_by("name")
    assert view.sort_label == "name ▼"
    view.sort_by("name", reverse=False)
    assert view.sort_reverse is False


def test_o_cycles_the_usual_keys_each_in_its_natural_order() -> None:
    view = ViewState(sort_key="kv", sort_reverse=True)
    seen = []
    for _ in SORT_CYCLE:
        view.next_sort()
        seen.append(view.sort_key)
        assert view.sort_reverse is False
    assert seen == [*SORT_CYCLE[2:], *SORT_CYCLE[:2]]
    view.sort_by("ttft")  # not in the cycle: `o` starts it again
    view.next_sort()
    assert view.sort_key == SORT_CYCLE[0]


def test_worst_first_is_marked_on_the_status_column() -> None:
    view = ViewState()
    view.sort_by("worst")
    assert view.sort_column == "status"
    view.sort_by("kv")
    assert view.sort_column == "kv"


def test_a_sort_by_waiting_is_marked_on_wait_though_a_limit_click_asks_for_it() -> None:
    view = ViewState()
    view.sort_by("waiting")
    assert view.sort_column == "waiting"  # the queue's own column, not LIMIT's


def test_the_search_narrows_the_rows_and_the_arranged_rows_follow_the_sort() -> None:
    view = ViewState()
    rows = _rows(12)
    view.search("  h01  ")
    assert view.filter_text == "h01"
    shown = view.shown(rows)
    assert [r.name for r in shown] == [f"h{i:03d}:1" for i in range(10, 12)]
    view.sort_by("kv")
    assert [r.name for r in view.arrange(shown)] == ["h011:1", "h010:1"]


def test_groups_cycle_through_the_modes_and_a_closed_group_hides_its_members() -> None:
    view = ViewState()
    rows = _rows(4)
    modes = []
    for _ in range(4):
        view.next_group_mode(rows)
        modes.append(view.group_label)
    assert modes == ["group", "model", "", "group"]  # no labels on direct servers: 3 modes
    arranged = view.arrange(view.shown(rows))
    heads = [r for r in arranged if r.is_group]
    assert [h.name for h in heads] == ["▾ east (2)", "▾ west (2)"]
    assert len(arranged) == 6
    assert view.toggle_group(heads[0].key, None)  # the other way round: closed
    assert [r.name for r in view.arrange(view.shown(rows))][:2] == ["▸ east (2)", "▾ west (2)"]


@pytest.mark.parametrize(("closed", "open_", "changes"), [
    (False, None, True), (True, None, True), (False, True, False), (False, False, True),
    (True, True, True), (True, False, False),
])
def test_a_group_is_opened_or_closed_only_when_it_is_not_already(closed: bool,
                                                                  open_: bool | None,
                                                                  changes: bool) -> None:
    view = ViewState(collapsed={"g"} if closed else set())
    assert view.toggle_group("g", open_) is changes
    assert ("g" in view.collapsed) is (closed != changes)


def test_without_groups_the_rows_are_only_ordered() -> None:
    view = ViewState(group_mode=NONE)
    rows = _rows(3)
    view.sort_by("kv")
    assert [r.name for r in view.arrange(rows)] == ["h002:1", "h001:1", "h000:1"]
    assert view.group_label == ""


def test_groups_and_their_members_follow_the_sort_and_its_direction() -> None:
    view = ViewState()
    rows = build_rows([  # the west group is the fuller: by name it would come second
        TargetState(Target.from_spec(f"{name}:1", group=group), "up", kind="vllm",
                    last_good_t=NOW, engines=[EngineStats("a", None, NOW, kv_usage=kv,
                                                          blocks_used=int(kv * 100),
                                                          blocks_total=100)])
        for name, group, kv in (("e1", "east", 0.1), ("w1", "west", 0.6),
                                ("w2", "west", 0.8), ("e2", "east", 0.2))], NOW)
    view.next_group_mode(rows)
    view.sort_by("kv")  # fullest first
    assert [r.name for r in view.arrange(rows)] == [
        "▾ west (2)", "w2:1", "w1:1", "▾ east (2)", "e2:1", "e1:1"]
    view.sort_by("kv")  # emptiest first
    assert [r.name for r in view.arrange(rows)] == [
        "▾ east (2)", "e1:1", "e2:1", "▾ west (2)", "w1:1", "w2:1"]


def test_a_group_mode_the_rows_no_longer_carry_starts_the_cycle_again() -> None:
    view = ViewState(group_mode="label:gone")
    view.next_group_mode(_rows(4))
    assert view.group_mode == NONE


def test_an_explicit_direction_is_kept_for_the_key_already_sorted_by() -> None:
    view = ViewState()
    view.sort_by("kv")
    view.sort_by("kv", reverse=False)
    assert (view.sort_key, view.sort_reverse) == ("kv", False)
    view.sort_by("kv", reverse=True)
    assert view.sort_reverse is True
