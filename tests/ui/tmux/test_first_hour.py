"""A newcomer's first hour, on the real command in tmux: the README's demo at 80x24 to
200x60 (every row of a small terminal says something; the fleet's hit rate and tokens/s on
screen at every size; a search leaves the header the fleet's), and docs/tour.md replayed
step by step."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support.tmux import Tmux, processes_with, wait_for
from tests.support.tour import Step, tour_steps

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed: the tmux test needs it"
)

SIZES = [(80, 24), (120, 40), (160, 48), (200, 60)]
DEMO_ROWS = ("leaky", "mooncake", "prefix-heavy", "restarts")
FRAME = re.compile(r"[\s─│╭╮╰╯┤├└┘┌┐┴┬┼━┄\u2800]*")  # borders, axes, blank braille


def without_information(screen: str) -> list[int]:
    """The rows that say nothing: blank, or only borders and an empty chart's axis."""
    return [number for number, line in enumerate(screen.splitlines())
            if FRAME.fullmatch(line)]


def _start(tmux: Tmux, tmp_path: Path, size: tuple[int, int], session: str = "kv",
           args: str = "--demo") -> Path:
    """``kvtop ARGS`` in a pane of ``size``; returns the file its exit status lands in."""
    exit_code = tmp_path / f"exit-code-{session}"
    # unset: under pytest the pane's environment says COLUMNS=80 LINES=24, which Textual
    # believes over the pane's real size
    command = (f"sh -c 'unset COLUMNS LINES; {sys.executable} -m kvtop {args} "
               f"--snapshot-dir {tmp_path}; echo $? > {exit_code}'")
    tmux("new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), "-s", session, "-c",
         os.getcwd(), command, ";", "set-option", "-t", session, "remain-on-exit", "on")
    return exit_code


def _screen(tmux: Tmux, session: str = "kv") -> str:
    return tmux("capture-pane", "-p", "-t", session)


def _rows_up(screen: str) -> bool:
    """Every demo server's row says up (wide terminals put its model between)."""
    lines = screen.splitlines()
    return "hosts 4/4 up" in screen and all(
        any(line.split()[:1] == [name] and " up " in line for line in lines)
        for name in DEMO_ROWS)


def test_the_demo_at_every_size_shows_the_fleet_s_hit_rate_and_tokens(
        tmux: Tmux, tmp_path: Path) -> None:
    sessions = {f"s{w}x{h}": (w, h) for w, h in SIZES}
    for session, size in sessions.items():
        _start(tmux, tmp_path, size, session)
    for session, size in sessions.items():
        wait_for(lambda s=session: _rows_up(_screen(tmux, s)), 60, f"the demo at {size}")
        # the header's second line: the hit rate and tokens/s once a window has lookups
        wait_for(lambda s=session: re.search(r"hit \d+%  tok/s [\d.k]+ in [\d.k]+ out",
                                             _screen(tmux, s).splitlines()[1]),
                 30, f"the fleet's hit rate and tokens/s at {size}")
        assert "NVML" not in _screen(tmux, session).splitlines()[1] or size[0] > 80


def test_at_80x24_every_row_says_something_after_20_s_of_the_demo(
        tmux: Tmux, tmp_path: Path) -> None:
    _start(tmux, tmp_path, (80, 24))
    wait_for(lambda: _rows_up(_screen(tmux)), 60, "the demo's rows, up")
    time.sleep(20)
    screen = _screen(tmux)
    assert len(without_information(screen)) <= 2, screen
    # each selected engine in turn: a quiet one (leaky idles) as much as a busy one
    for _ in DEMO_ROWS[1:]:
        tmux("send-keys", "-t", "kv", "j")
        time.sleep(1.5)
        screen = _screen(tmux)
        assert len(without_information(screen)) <= 2, screen


def test_a_search_leaves_the_header_the_fleet_s(tmux: Tmux, tmp_path: Path) -> None:
    _start(tmux, tmp_path, (120, 40))
    wait_for(lambda: _rows_up(_screen(tmux)), 60, "the demo's rows, up")
    before = _screen(tmux).splitlines()[0]
    tmux("send-keys", "-t", "kv", "/")
    time.sleep(0.5)  # the search box takes the keys once it is open
    tmux("send-keys", "-t", "kv", "-l", "qwen")  # prefix-heavy serves qwen2.5-7b
    tmux("send-keys", "-t", "kv", "Enter")
    wait_for(lambda: "1 of 4 shown" in _screen(tmux), 20, "the search to say what it shows")
    after = _screen(tmux).splitlines()[0]
    pool = re.compile(r"/(\d+) blocks .*(hosts \d+/\d+ up).*(LEAK \d+)")
    assert pool.search(after).groups() == pool.search(before).groups(), (before, after)
    assert "no engine selected" not in _screen(tmux)


def _replay(tmux: Tmux, tmp_path: Path, steps: list[Step]) -> Path | None:
    exit_code = None
    for step in steps:
        where = f"docs/tour.md:{step.line} ({step.action} {step.argument})"
        if step.action == "start":
            exit_code = _start(tmux, tmp_path, (80, 24), args=step.argument)
        elif step.action == "press":
            tmux("send-keys", "-t", "kv", *step.keys)
            time.sleep(0.5)  # a key's effect is drawn before the next one is sent
        elif step.action == "type":
            tmux("send-keys", "-t", "kv", "-l", step.argument)
        elif step.action in ("see", "wait"):
            wait_for(lambda s=step: s.text in _screen(tmux), step.deadline_s, where)
        elif step.action == "pause":
            time.sleep(step.seconds)
        elif step.action == "quit":
            tmux("send-keys", "-t", "kv", "q")
            assert exit_code is not None
            wait_for(exit_code.exists, 30, where)
            assert exit_code.read_text().strip() == "0"
    return exit_code


@pytest.mark.slow
def test_the_tour_replays_step_by_step(tmux: Tmux, tmp_path: Path) -> None:
    steps = tour_steps()
    assert steps[0].action == "start" and steps[-1].action == "quit"
    assert {"press", "type", "see", "wait", "pause", "shot"} <= {s.action for s in steps}
    _replay(tmux, tmp_path, steps)
    # the snapshot the tour took is where it said, whole
    assert list(tmp_path.glob("kvtop-snapshot-*/screen.svg"))
    wait_for(lambda: not processes_with(str(tmp_path), tmux_too=False), 30, "kvtop gone")


def test_a_row_of_borders_or_an_empty_axis_says_nothing() -> None:
    screen = "\n".join(["KV [███] 10/20", "", "│    │  ⠀⠀ │", "╰────────╯", "run 3"])
    assert without_information(screen) == [1, 2, 3]
