"""The help screen's text: every key's line whole at 80 columns, live and in a replay, and
one name per leak state as the table says it."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text
from textual.app import App
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Static

import kvtop.ui
from kvtop.ui.keys import LIVE_BINDINGS, REPLAY_BINDINGS
from kvtop.ui.replay import ReplayApp
from kvtop.ui.screens.help import (
    KEYS,
    LEGEND,
    MORE_KEYS,
    TERM_W,
    WIDTH,
    HelpScreen,
    Keys,
    help_text,
)
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.view.cells import COLUMNS, DELTA_COLUMN, GPU_COLUMN


@pytest.mark.parametrize("keys", [KEYS, ReplayApp.HELP_KEYS], ids=["live", "replay"])
def test_every_key_is_said_whole_within_80_columns(keys) -> None:
    text = help_text(keys).plain
    for key, what in keys:
        assert f"{key} {what}" in text, (key, what)  # never "step one scrape (pauses fi"
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_the_replay_help_says_its_keys_and_no_interval() -> None:
    keys = dict(ReplayApp.HELP_KEYS)
    assert keys["."] == "step a round of scrapes" and "< >" in keys and "+ -" not in keys
    assert not any("→" in key for key in keys if key != "← →")  # → opens a group, as live


def test_the_legend_names_each_leak_state_as_the_table_does() -> None:
    text = help_text(KEYS).plain
    assert "WARMUP" in text and "… warming up" not in text


# The screen itself, pushed in a small app with kvtop's stylesheet (Pilot), and the text
# laid out exactly: two key columns filled down first, each key right-aligned to the longest,
# the left column's words cut and padded to the column, the legend's terms in their own column.
STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
ODD_KEYS = (("a", "one"), ("bb", "a what far too long for its column of the two"),
            ("[b]c[/b]", "x [i]y[/i] z"))
LEGEND_TEXT = """\
NAME   the server (its config name or host:port); e0 e1: its engines
MODEL  the model it serves, as it names it
STATUS up · restarted (counters reset in the last 5m) · unknown: not LLM
       down/timeout/auth/not found/bad data 12s: no answer for 12 s; the
       numbers dimmed are the last good ones, dashes after a minute
KV     ████▉ 588/599 blocks used/pool, in eighths; amber ≥80%, red ≥95%
RUN    requests running: in the batch now
WAIT   requests waiting for a place in the batch
PRE/s  preemptions a second: the pool ran out, requests were evicted
HIT    prefix-cache hits over the last scrape window; (38%) dimmed is the
       lifetime rate, while no lookup came in the window
PP     PP t/s: prompt tokens read a second (prefill), last window
GEN    GEN t/s: tokens generated a second (decode), last window
TTFT   time to first token p50/p99, last window, estimated from buckets
LEAK   WARMUP (too early to say) · OK · WATCH some evidence · LEAK strong;
       +N/h: the floor's rise in blocks an hour
STALL  requests held, no token for a few scrapes; SATURATED: full, moving
LIMIT  what holds the queue: KV cap · max seqs · budget (tokens a step) ·
       deferred · KV xfer · asleep; none: nothing waits; header: held by
GPU    GPU MEM: used/total memory of the server's GPUs, as nvidia-smi
Δ      Δ KV/TTFT: against --baseline, KV p50 (points) and TTFT p99 (%)
exact  KV events: blocks unused 3+ pool turnovers (own witness, not LEAK)"""
LIVE_TEXT = """\
kvtop · keys and legend  (escape closes)
q F10 ^C quit                              F5 groups: config/model/label
    F1 ? this help                       F6 o sort menu / next sort
  ↑↓ j k select (the panes follow)      click header: sort, again: reverse
   enter detail / open a group              p pause display (collects)
     ← → close / open a group               s snapshot JSON+metrics+SVG
    F3 / search every host                  g GPU pane on / off
  escape clear the search                 + - longer / shorter interval
""" + LEGEND_TEXT


def styled(text: Text) -> list[tuple[str, str]]:
    return [(text.plain[span.start:span.end], str(span.style)) for span in text.spans]


def test_the_live_help_word_for_word() -> None:
    text = help_text(KEYS)
    assert text.plain == LIVE_TEXT
    assert text.no_wrap


def test_keys_fill_the_left_column_first_cut_to_it_and_markup_is_shown_as_written() -> None:
    text = help_text(ODD_KEYS)
    assert text.plain == (
        "kvtop · keys and legend  (escape closes)\n"
        "       a one                         [b]c[/b] x [i]y[/i] z\n"
        "      bb a what far too long for its \n" + LEGEND_TEXT)
    assert styled(text) == [
        ("kvtop · keys and legend", "bold"), ("  (escape closes)\n", "dim"),
        ("       a ", "bold"), ("[b]c[/b] ", "bold"), ("      bb ", "bold"),
        *((line[:TERM_W], "bold") for line in LEGEND_TEXT.splitlines())]


def test_the_left_column_is_cut_to_its_half_the_right_one_never() -> None:
    what = "w" * 60
    assert help_text((("k", what),)).plain.splitlines()[1] == "k " + "w" * (WIDTH // 2 - 2)
    assert help_text((("k", "x"), ("key", what))).plain.splitlines()[1:2] == [
        f"  k {'x':<{WIDTH // 2 - 4}}key {what}"]


class HelpApp(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self, screen: HelpScreen) -> None:
        super().__init__()
        self.help = screen

    def on_mount(self) -> None:
        self.push_screen(self.help)


async def test_the_screen_shows_the_live_keys_unless_given_others_within_80x24() -> None:
    app = HelpApp(HelpScreen())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        body = app.help.query_one("#help-body", Static)
        assert body.render().plain == LIVE_TEXT  # type: ignore[union-attr]
        # 74 cells and padding, beside the scroll bar within the border: no cut; the box
        # fills 80x24 and scrolls the rest (End reaches the last line)
        assert body.region == Region(1, 1, 76, len(LIVE_TEXT.splitlines()))
        box = app.help.query_one("#help-box", VerticalScroll)
        assert box.region == Region(0, 0, 80, 24) and app.help.focused is box
        await pilot.press("end")
        await pilot.pause()
        assert box.scroll_offset.y == len(LIVE_TEXT.splitlines()) - 22
    app = HelpApp(HelpScreen(ODD_KEYS))
    async with app.run_test(size=(80, 24)):
        assert app.help.query_one("#help-body", Static).render().plain == help_text(  # type: ignore[union-attr]
            ODD_KEYS).plain


@pytest.mark.parametrize("key", ["escape", "q", "question_mark", "f1"])
async def test_escape_q_question_mark_and_f1_close_it(key: str) -> None:
    app = HelpApp(HelpScreen())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("x", "j", "enter")
        assert app.screen is app.help  # other keys leave it open
        await pilot.press(key)
        await pilot.pause()
        assert app.screen is not app.help


# Textual's key names as the help writes them
SAID = {"ctrl+c": "^C", "f10": "F10", "f1": "F1", "question_mark": "?", "slash": "/",
        "f3": "F3", "f5": "F5", "f6": "F6", "plus": "+", "equals_sign": "+", "minus": "-",
        "up": "↑", "down": "↓", "left": "←", "right": "→", "pageup": "PgUp",
        "pagedown": "PgDn", "home": "Home", "end": "End", "full_stop": ".",
        "left_square_bracket": "[", "right_square_bracket": "]", "left_curly_bracket": "{",
        "right_curly_bracket": "}", "less_than_sign": "<", "greater_than_sign": ">"}


def said_keys(keys: Keys) -> set[str]:
    words = {word for key, _ in keys for word in key.split()}
    return words | {char for word in words if set(word) <= set("↑↓←→") for char in word}


def bound_keys(*bindings: object) -> set[str]:
    return {SAID.get(key, key) for binding in bindings if isinstance(binding, Binding)
            for key in binding.key.split(",")}


def test_every_key_the_app_binds_is_said_by_the_help_or_the_man_page() -> None:
    """The help names each key bound on the app and the fleet table; MORE_KEYS, left out
    of the 80x24 screen for room, are the man page's (tab, PgUp PgDn, Home End)."""
    live = bound_keys(*LIVE_BINDINGS, *FleetTable.BINDINGS)
    assert live - said_keys(KEYS) == {"tab", "PgUp", "PgDn", "Home", "End"}
    assert live <= said_keys(KEYS + MORE_KEYS)
    replay = bound_keys(*LIVE_BINDINGS, *REPLAY_BINDINGS, *FleetTable.BINDINGS)
    assert replay - said_keys(ReplayApp.HELP_KEYS) == {"tab", "PgUp", "PgDn", "Home", "End",
                                                       "+", "-"}  # the interval is fixed


def test_every_column_of_the_table_is_explained() -> None:
    terms = {term for term, _ in LEGEND}
    labels = [c.label for c in (*COLUMNS, GPU_COLUMN, DELTA_COLUMN)]
    assert [label for label in labels if label.split()[0] not in terms] == []
