"""The F6 sort menu pushed in a small app with kvtop's stylesheet (Pilot): every sort key by
its label in SORT_LABELS' order, the current one alone with the header's marker and
highlighted, its title, and what it gives back: the key chosen (enter or a click), or None
(escape, F6 or q)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import OptionList, Static

import kvtop.ui
from kvtop.ui.screens.sort_menu import SortMenu
from kvtop.view.sort_keys import SORT_LABELS

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
SIZE = (80, 24)


class MenuApp(App[None]):
    """Pushes the menu as kvtop does and keeps what it gives back."""

    CSS_PATH = STYLESHEET

    def __init__(self, current: str, ascending: bool) -> None:
        super().__init__()
        self.menu = SortMenu(current, ascending)
        self.answers: list[str | None] = []

    def on_mount(self) -> None:
        self.push_screen(self.menu, self.answers.append)


def prompts(menu: OptionList) -> list[str]:
    return [str(menu.get_option_at_index(i).prompt) for i in range(menu.option_count)]


async def test_every_key_by_its_label_the_current_one_marked_biggest_first() -> None:
    app = MenuApp("kv", ascending=False)
    async with app.run_test(size=SIZE):
        menu = app.menu.query_one("#sort-options", OptionList)
        assert prompts(menu) == ["name", "model", "worst first", "KV use ▼", "leak/stall",
                                 "running", "queue", "preemptions", "hit rate",
                                 "prompt tok/s", "generation", "TTFT p99"]
        assert [menu.get_option_at_index(i).id for i in range(menu.option_count)] == list(
            SORT_LABELS)
        assert menu.highlighted == 3 and menu.has_focus
        title = app.menu.query_one("#sort-body #sort-title", Static)
        assert str(title.render()) == "Sort by  (the same again: the other way round)"


@pytest.mark.parametrize(("current", "ascending", "marked", "highlighted"), [
    ("name", True, "name ▲", 0),  # the first
    ("ttft", False, "TTFT p99 ▼", 11),  # the last
    ("waiting", True, "queue ▲", 6),
])
async def test_the_current_key_alone_is_marked_and_highlighted(
        current: str, ascending: bool, marked: str, highlighted: int) -> None:
    app = MenuApp(current, ascending)
    async with app.run_test(size=SIZE):
        menu = app.menu.query_one(OptionList)
        assert [p for p in prompts(menu) if p.endswith(("▲", "▼"))] == [marked]
        assert prompts(menu)[highlighted] == marked
        assert menu.highlighted == highlighted


async def test_enter_gives_the_highlighted_key_back_and_closes() -> None:
    app = MenuApp("name", ascending=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "down", "enter")
        await pilot.pause()
        assert app.answers == ["kv"]
        assert not isinstance(app.screen, SortMenu)


async def test_enter_on_the_current_key_gives_it_back_to_turn_the_order_round() -> None:
    app = MenuApp("preempt", ascending=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        assert app.answers == ["preempt"]


async def test_a_click_on_a_label_gives_its_key_back() -> None:
    app = MenuApp("name", ascending=True)
    async with app.run_test(size=SIZE) as pilot:
        menu = app.menu.query_one(OptionList)
        assert await pilot.click(menu, offset=(3, 1 + 8))  # border, then the 9th: hit rate
        await pilot.pause()
        assert app.answers == ["hit"]


@pytest.mark.parametrize("key", ["escape", "f6", "q"])
async def test_escape_f6_and_q_close_it_choosing_nothing(key: str) -> None:
    app = MenuApp("kv", ascending=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", key)
        await pilot.pause()
        assert app.answers == [None]
        assert not isinstance(app.screen, SortMenu)


async def test_other_keys_choose_nothing_and_leave_it_open() -> None:
    app = MenuApp("kv", ascending=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("x", "a", "space")
        await pilot.pause()
        assert app.answers == []
        assert isinstance(app.screen, SortMenu)
