"""Every key the app and the replay bind, with what it does: a key or an action renamed,
dropped or misspelt fails here (tests/unit/test_cli.py checks the man page names the same
keys, but a key shown as another, "+" for "plus,equals_sign", or a renamed action passes it).
The footer at 80 columns shows only the few keys a newcomer needs."""

from __future__ import annotations

from textual.actions import parse
from textual.binding import Binding, BindingType
from textual.keys import Keys, _character_to_key

from kvtop.ui.app import KvtopApp
from kvtop.ui.keys import LIVE_BINDINGS, REPLAY_BINDINGS
from kvtop.ui.replay import ReplayApp

# key as Textual names it -> (action, shown in the footer, before the focused widget's)
LIVE = {
    "ctrl+c": ("quit", False, True), "q": ("quit", True, False), "f10": ("quit", False, False),
    "f1": ("help", True, False), "question_mark": ("help", False, False),
    "slash": ("filter", True, False), "f3": ("filter", False, False),
    "f5": ("group", True, False), "f6": ("sort_menu", True, False),
    "o": ("sort", False, False), "s": ("snapshot", True, False), "p": ("pause", True, False),
    "enter": ("detail", False, False), "g": ("toggle_gpu", False, False),
    "tab": ("focus_next", False, True), "plus": ("interval(1)", False, False),
    "equals_sign": ("interval(1)", False, False), "minus": ("interval(-1)", False, False),
    "escape": ("close_filter", False, False),
}
# the replay's own, and the live footer's p, / and o, which give way to them
REPLAY = {
    "p": ("pause", False, False), "slash": ("filter", False, False), "o": ("sort", False, False),
    "space": ("play_pause", True, False), "full_stop": ("step", True, False),
    "left_square_bracket": ("seek(-1)", True, False),
    "right_square_bracket": ("seek(1)", False, False),
    "left_curly_bracket": ("seek(-10)", False, False),
    "right_curly_bracket": ("seek(10)", False, False),
    "less_than_sign": ("speed(0.5)", True, False),
    "greater_than_sign": ("speed(2)", False, False),
}


def table(bindings: list[BindingType]) -> dict[str, tuple[str, bool, bool]]:
    out = {}
    for binding in bindings:
        assert isinstance(binding, Binding)
        for key in binding.key.split(","):
            assert key not in out, f"{key} bound twice"
            out[key] = (binding.action, binding.show, binding.priority)
    return out


def test_every_key_does_what_the_help_and_the_man_page_say() -> None:
    assert table(LIVE_BINDINGS) == LIVE
    assert table(REPLAY_BINDINGS) == REPLAY


def test_every_action_bound_is_one_the_app_that_binds_it_has() -> None:
    for app, bindings in ((KvtopApp, LIVE_BINDINGS), (ReplayApp, REPLAY_BINDINGS)):
        for binding in bindings:
            assert isinstance(binding, Binding)
            _, name, _ = parse(binding.action)
            assert callable(getattr(app, f"action_{name}", None)), binding.action


def test_every_key_is_one_textual_sends() -> None:
    named = {key.value for key in Keys}
    for key in {*LIVE, *REPLAY}:
        characters = [c for c in map(chr, range(32, 127)) if _character_to_key(c) == key]
        assert key in named or characters, key


def test_the_keys_shown_are_named_as_the_help_names_them() -> None:
    shown = [(b.key, b.key_display, b.description) for b in (*LIVE_BINDINGS, *REPLAY_BINDINGS)
             if isinstance(b, Binding) and (b.show or b.key_display)]
    assert shown == [
        ("q", None, "Quit"), ("f1", "F1", "Help"), ("question_mark", "?", "Help"),
        ("slash", "/", "Search"), ("f5", "F5", "Groups"), ("f6", "F6", "Sort"),
        ("s", None, "Snapshot"), ("p", None, "Pause"),
        ("plus,equals_sign", "+", "Interval+"), ("minus", "-", "Interval-"),
        ("space", "space", "Pause"), ("full_stop", ".", "Step"),
        ("left_square_bracket", "[ ]", "Seek"), ("less_than_sign", "< >", "Speed"),
    ]
