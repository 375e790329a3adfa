"""The keys of the terminal app, as Textual binds them: the live app's and the replay's
(which adds its own to the live ones). What each does is said to a person by the help
screen: ``KEYS`` in kvtop/ui/screens/help.py and ``REPLAY_KEYS`` in kvtop/ui/replay.py."""

from __future__ import annotations

from textual.binding import Binding, BindingType

LIVE_BINDINGS: list[BindingType] = [
    # The footer shows the few keys a newcomer needs at 80 columns; F1 lists them all.
    # htop's keys work too: F1 help, F3 search, F5 groups, F6 sort, F10 quit.
    Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # at once, as htop
    Binding("q", "quit", "Quit"),
    Binding("f10", "quit", "Quit", show=False),
    Binding("f1", "help", "Help", key_display="F1"),
    Binding("question_mark", "help", "Help", key_display="?", show=False),
    Binding("slash", "filter", "Search", key_display="/"),
    Binding("f3", "filter", "Search", show=False),
    Binding("f5", "group", "Groups", key_display="F5"),
    Binding("f6", "sort_menu", "Sort", key_display="F6"),
    Binding("o", "sort", "Sort", show=False),
    Binding("s", "snapshot", "Snapshot"),
    Binding("p", "pause", "Pause"),
    Binding("enter", "detail", "Detail", show=False),  # from the GPU pane too
    Binding("g", "toggle_gpu", "GPU", show=False),
    Binding("tab", "focus_next", "Pane", priority=True, show=False),
    Binding("plus,equals_sign", "interval(1)", "Interval+", key_display="+", show=False),
    Binding("minus", "interval(-1)", "Interval-", key_display="-", show=False),
    Binding("escape", "close_filter", show=False),
]

REPLAY_BINDINGS: list[BindingType] = [
    # The live footer's p, / and o give way to the replay keys (all still work; see ?).
    Binding("p", "pause", "Pause", show=False),
    Binding("slash", "filter", "Filter", show=False),
    Binding("o", "sort", "Sort", show=False),
    Binding("space", "play_pause", "Pause", key_display="space"),
    Binding("full_stop", "step", "Step", key_display="."),  # → keeps its meaning: a group
    Binding("left_square_bracket", "seek(-1)", "Seek", key_display="[ ]"),
    Binding("right_square_bracket", "seek(1)", "Seek", show=False),
    Binding("left_curly_bracket", "seek(-10)", show=False),
    Binding("right_curly_bracket", "seek(10)", show=False),
    Binding("less_than_sign", "speed(0.5)", "Speed", key_display="< >"),
    Binding("greater_than_sign", "speed(2)", "Speed", show=False),
]
