"""The real command as a user runs it: `kvtop --demo` in a detached tmux pane at 80x24.

A private tmux socket keeps the test away from the user's sessions; every process is found
again by the test's unique temporary folder in its command line, so none can survive."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scenarios.app import write_recording
from tests.support.tmux import Tmux, processes_with, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed: the tmux test needs it"
)


DEMO_ROWS = ("leaky", "mooncake", "prefix-heavy", "restarts")


def _rows_up(screen: str) -> bool:
    lines = screen.splitlines()
    return "hosts 4/4" in screen and all(
        any(line.split()[:2] == [name, "up"] for line in lines if line.strip())
        for name in DEMO_ROWS
    )


def test_demo_in_tmux_snapshot_and_quit(tmux: Tmux, tmp_path: Path) -> None:
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    exit_code = tmp_path / "exit-code"
    # the shell records kvtop's exit status itself: tmux's pane_dead_status can lag under load
    command = (f"sh -c '{sys.executable} -m kvtop --demo --no-gpu --snapshot-dir {snaps}; "
               f"echo $? > {exit_code}'")
    tmux("new-session", "-d", "-x", "80", "-y", "24", "-s", "kv", "-c", os.getcwd(), command,
         ";", "set-option", "-t", "kv", "remain-on-exit", "on")
    wait_for(lambda: _rows_up(tmux.screen()), 60, "the four demo rows, up")
    header = next(line for line in tmux.screen().splitlines() if line.startswith(" NAME"))
    assert "LEAK" in header  # the indicator's column at 80 columns
    assert "KV [" in tmux.screen().splitlines()[0]  # the header's meter

    tmux("send-keys", "-t", "kv", "s")
    wait_for(lambda: list(snaps.glob("kvtop-snapshot-*")), 30, "the snapshot folder")
    [folder] = snaps.glob("kvtop-snapshot-*")
    document = json.loads((folder / f"{folder.name}.json").read_text())
    assert document["kvtop_snapshot"] == 1
    assert len(document["targets"]) == 4
    assert len(list((folder / "metrics").glob("*.txt"))) == 4
    assert "vllm:" in next((folder / "metrics").glob("*.txt")).read_text()
    assert (folder / "screen.svg").read_text().startswith("<svg")

    tmux("send-keys", "-t", "kv", "q")
    wait_for(exit_code.exists, 60, "kvtop to exit after q")
    assert exit_code.read_text().strip() == "0"
    wait_for(lambda: not processes_with(str(snaps), tmux_too=False), 30,
             "the kvtop process to be gone")

    tmux("kill-server")
    wait_for(lambda: not processes_with(str(tmp_path)), 30, "no process left after kill-server")


def test_a_leaking_host_is_flagged_in_its_row(tmux: Tmux, tmp_path: Path) -> None:
    # The real command on a recording whose idle host holds 828 of 1000 blocks: its row, not
    # just the column header, must say LEAK at 80 columns (the demo takes two minutes to).
    recording = write_recording(tmp_path / "rec.jsonl")
    command = (f"{sys.executable} -m kvtop replay {recording} --speed 1000 "
               f"--snapshot-dir {tmp_path}")
    tmux("new-session", "-d", "-x", "80", "-y", "24", "-s", "kv", "-c", os.getcwd(), command)

    def flagged() -> list[str]:
        return [line for line in tmux.screen().splitlines()
                if line.split()[:2] == ["10.0.0.5:8001", "up"] and "LEAK" in line]

    wait_for(flagged, 60, "the idle host's row flagged LEAK")
    assert not [line for line in tmux.screen().splitlines()
                if line.split()[:1] == ["10.0.0.5:8000"] and "LEAK" in line]  # the loaded one
    tmux("send-keys", "-t", "kv", "q")
    wait_for(lambda: not processes_with(str(tmp_path), tmux_too=False), 60, "kvtop to exit")


GREYS = {0, 7, 8, 15, 16, 231, *range(232, 256)}  # black, white and the 256-colour grey ramp


def _colours(screen_with_escapes: str) -> set[int]:
    """Every 256-colour index the pane uses for text or background."""
    return {int(n) for n in re.findall(r"\x1b\[(?:[0-9;]*;)?[34]8;5;(\d+)", screen_with_escapes)}


@pytest.mark.parametrize("no_color", [True, False])
def test_no_color_gives_a_grey_screen(tmux: Tmux, tmp_path: Path, no_color: bool) -> None:
    env = "NO_COLOR=1 " if no_color else ""
    command = f"{env}{sys.executable} -m kvtop --demo --no-gpu --snapshot-dir {tmp_path}"
    tmux("new-session", "-d", "-x", "80", "-y", "24", "-s", "kv", "-c", os.getcwd(), command)
    wait_for(lambda: _rows_up(tmux.screen()), 60, "the four demo rows, up")
    colours = _colours(tmux("capture-pane", "-e", "-p", "-t", "kv"))
    assert colours  # tmux is a 256-colour terminal: the app speaks 256 colours to it
    if no_color:
        assert colours <= GREYS, colours - GREYS
    else:
        assert colours - GREYS  # the same screen in colour: the check above can fail
    tmux("send-keys", "-t", "kv", "q")
    wait_for(lambda: not processes_with(str(tmp_path), tmux_too=False), 60, "kvtop to exit")


def _start(tmux: Tmux, tmp_path: Path, args: str, size: tuple[int, int] = (80, 24)) -> Path:
    """kvtop with ``args`` in the pane; returns the file its exit status lands in."""
    exit_code = tmp_path / "exit-code"
    # Under pytest the pane's environment says COLUMNS=80 LINES=24, which every terminal
    # program (shutil.get_terminal_size, so Textual) believes over the pane's real size.
    command = (f"sh -c 'unset COLUMNS LINES; {sys.executable} -m kvtop {args} "
               f"--snapshot-dir {tmp_path}; echo $? > {exit_code}'")
    tmux("new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), "-s", "kv", "-c",
         os.getcwd(), command, ";", "set-option", "-t", "kv", "remain-on-exit", "on")
    return exit_code


@pytest.mark.parametrize("key", ["C-c", "F10"])
def test_ctrl_c_and_f10_quit_at_once_with_exit_0(tmux: Tmux, tmp_path: Path, key: str) -> None:
    exit_code = _start(tmux, tmp_path, "--demo --no-gpu")
    wait_for(lambda: _rows_up(tmux.screen()), 20, "the four demo rows, up")
    tmux("send-keys", "-t", "kv", "/")  # a search being typed does not hold it back
    tmux("send-keys", "-t", "kv", key)
    wait_for(exit_code.exists, 20, f"kvtop to exit after {key}")
    assert exit_code.read_text().strip() == "0"
    wait_for(lambda: not processes_with(str(tmp_path), tmux_too=False), 5, "kvtop gone")


@contextlib.contextmanager
def _sim(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real `kvtop sim` in its own process on an ephemeral port, and its URL."""
    process = subprocess.Popen([sys.executable, "-m", "kvtop", "sim", "--port", "0", *args],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield process, url
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def sim_server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    with _sim("--rate", "4") as server:
        yield server


def _status_of(screen: str, name: str) -> str:
    for line in screen.splitlines():
        if line.startswith(f" {name} "):
            return line.split()[1]
    return ""


def test_a_killed_server_is_down_at_the_next_scrape(tmux: Tmux, tmp_path: Path,
                                                     sim_server: tuple[subprocess.Popen[str],
                                                                       str]) -> None:
    process, url = sim_server
    name = url.removeprefix("http://").removesuffix("/metrics")
    _start(tmux, tmp_path, f"{url} --no-gpu --interval 1", size=(120, 40))
    wait_for(lambda: _status_of(tmux.screen(), name) == "up", 20, "the server, up")
    process.kill()
    process.wait()
    killed = time.monotonic()
    # the next scrape is refused (within one interval) and the next draw says so
    wait_for(lambda: _status_of(tmux.screen(), name) == "down", 10, "the row to say down")
    assert time.monotonic() - killed < 1.0 + 1.0 + 3.0  # interval + redraw + a loaded box
    screen = tmux.screen()
    assert "hosts 0/1 up" in screen
    assert "last good" in screen  # the panes say how old the numbers are
    assert "KV blocks" in screen, screen  # and keep its history


def _row(screen: str, name: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(f" {name} ")), "")


def test_a_wedged_server_shows_stalled_within_10_s_of_the_first_frame(tmux: Tmux,
                                                                      tmp_path: Path) -> None:
    # wedged from its start: every free block taken, requests queueing, no token coming out
    with _sim("--rate", "4", "--wedge-at", "0") as (_, url):
        name = url.removeprefix("http://").removesuffix("/metrics")
        _start(tmux, tmp_path, f"{url} --no-gpu --interval 1", size=(120, 40))
        wait_for(lambda: _row(tmux.screen(), name), 20, "the first frame with the server's row")
        first_frame = time.monotonic()
        # no leak detector warm-up: the stall verdict needs a few scrapes, no more
        wait_for(lambda: "STALL" in _row(tmux.screen(), name), 10,
                 "STALL in the server's row within 10 s of the first frame")
        assert time.monotonic() - first_frame <= 10
        screen = tmux.screen()
        assert "STALL 1" in screen.splitlines()[0], screen  # the header's count
        assert "STALLED" in screen, screen  # the engine's pane says it, with the reason
        assert "KV pool" in screen and "full" in screen, screen
