"""F1 / `?`: every key, and what each column and state means; at 80x24 the keys and the
first columns fit, the rest scrolls (↓, PgDn, the wheel)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

Keys = tuple[tuple[str, str], ...]

KEYS: Keys = (
    ("q F10 ^C", "quit"),
    ("F1 ?", "this help"),
    ("↑↓ j k", "select (the panes follow)"),
    ("enter", "detail / open a group"),
    ("← →", "close / open a group"),
    ("F3 /", "search every host"),
    ("escape", "clear the search"),
    ("F5", "groups: config/model/label"),
    ("F6 o", "sort menu / next sort"),
    ("click", "header: sort, again: reverse"),
    ("p", "pause display (collects)"),
    ("s", "snapshot JSON+metrics+SVG"),
    ("g", "GPU pane on / off"),
    ("+ -", "longer / shorter interval"),
)
# Bound too, but left out of the help for room at 80x24 (the man page's KEYS lists them)
MORE_KEYS: Keys = (
    ("tab", "next pane"),
    ("PgUp PgDn", "a page up / down"),
    ("Home End", "first / last row"),
)

# (term, lines): every column of the table, in its order, then the states and panes
LEGEND: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("NAME", ("the server (its config name or host:port); e0 e1: its engines",)),
    ("MODEL", ("the model it serves, as it names it",)),
    ("STATUS", ("up · restarted (counters reset in the last 5m) · unknown: not LLM",
                "down/timeout/auth/not found/bad data 12s: no answer for 12 s; the",
                "numbers dimmed are the last good ones, dashes after a minute")),
    ("KV", ("████▉ 588/599 blocks used/pool, in eighths; amber ≥80%, red ≥95%",)),
    ("RUN", ("requests running: in the batch now",)),
    ("WAIT", ("requests waiting for a place in the batch",)),
    ("PRE/s", ("preemptions a second: the pool ran out, requests were evicted",)),
    ("HIT", ("prefix-cache hits over the last scrape window; (38%) dimmed is the",
             "lifetime rate, while no lookup came in the window")),
    ("PP", ("PP t/s: prompt tokens read a second (prefill), last window",)),
    ("GEN", ("GEN t/s: tokens generated a second (decode), last window",)),
    ("TTFT", ("time to first token p50/p99, last window, estimated from buckets",)),
    ("LEAK", ("WARMUP (too early to say) · OK · WATCH some evidence · LEAK strong;",
              "+N/h: the floor's rise in blocks an hour")),
    ("STALL", ("requests held, no token for a few scrapes; SATURATED: full, moving",)),
    ("LIMIT", ("what holds the queue: KV cap · max seqs · budget (tokens a step) ·",
               "deferred · KV xfer · asleep; none: nothing waits; header: held by")),
    ("GPU", ("GPU MEM: used/total memory of the server's GPUs, as nvidia-smi",)),
    ("Δ", ("Δ KV/TTFT: against --baseline, KV p50 (points) and TTFT p99 (%)",)),
    ("exact", ("KV events: blocks unused 3+ pool turnovers (own witness, not LEAK)",)),
)
KEY_COLUMNS = 2
TERM_W = 7
WIDTH = 74  # inside the box at 80 columns


def help_text(keys: Keys) -> Text:
    """The keys in two columns, then the legend; no markup is parsed."""
    text = Text(no_wrap=True)
    text.append("kvtop · keys and legend", "bold")
    text.append("  (escape closes)\n", "dim")
    key_w = max(len(k) for k, _ in keys)
    what_w = WIDTH // KEY_COLUMNS - key_w - 1
    rows = (len(keys) + KEY_COLUMNS - 1) // KEY_COLUMNS
    for row in range(rows):
        for column in range(KEY_COLUMNS):
            index = column * rows + row
            if index < len(keys):
                key, what = keys[index]
                text.append(f"{key:>{key_w}} ", "bold")
                text.append(f"{what[:what_w]:<{what_w}}" if column < KEY_COLUMNS - 1 else what)
        text.append("\n")
    for term, lines in LEGEND:
        for number, line in enumerate(lines):
            text.append(f"{term if number == 0 else '':<{TERM_W}}", "bold")
            text.append(line + "\n")
    text.rstrip()
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape,q,question_mark,f1", "dismiss", "Close"),
    ]

    def __init__(self, keys: Keys = KEYS) -> None:
        super().__init__()
        self._keys = keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(help_text(self._keys), id="help-body")
