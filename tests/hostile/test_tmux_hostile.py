"""The real `kvtop` in a tmux pane beside a hostile server: nothing the server sends reaches
the terminal as a control sequence. tmux interprets what the app writes as a terminal
would, so an OSC 52 in a model name would land in tmux's paste buffers (set-clipboard is
on) and `capture-pane -e` shows every escape the screen holds: only colours may be there,
and the server's escapes show as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.hostile import foreign_controls
from tests.support.tmux import Tmux, processes_with, wait_for

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "tmux"], capture_output=True, check=False).returncode != 0,
    reason="tmux is not installed: the tmux test needs it")


@pytest.fixture
def servers() -> Iterator[dict[str, str]]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.hostile.serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


DETAIL = "server  vllm 0.33.0"  # a line only the detail screen has


def _rows_up(screen: str) -> bool:
    return "hosts 2/2" in screen and sum(" up " in line for line in screen.splitlines()) >= 2


def test_no_escape_from_a_server_reaches_the_terminal(tmux: Tmux, tmp_path: Path,
                                                      servers: dict[str, str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(  # a config name is outside text too
        f'[[targets]]\nurl = "{servers["hostile"]}"\nname = "cfg\\u001b]52;c;Q0ZH\\u0007"\n'
        f'[[targets]]\nurl = "{servers["healthy"]}"\nname = "healthy"\n')
    exit_code = tmp_path / "exit-code"
    # the pane's own size, not a COLUMNS/LINES the test session may carry (Textual obeys them)
    command = (f"sh -c 'env -u COLUMNS -u LINES {sys.executable} -m kvtop --config {config} "
               f"--no-gpu --interval 0.5 --snapshot-dir {tmp_path}; echo $? > {exit_code}'")
    tmux("new-session", "-d", "-x", "200", "-y", "50", "-s", "kv", "-c", os.getcwd(), command,
         ";", "set-option", "-s", "set-clipboard", "on",
         ";", "set-option", "-t", "kv", "remain-on-exit", "on")
    wait_for(lambda: _rows_up(tmux.screen()), 30, "both rows, up")

    def check_screen() -> str:
        """The screen's text, once its escapes are checked."""
        with_escapes = tmux("capture-pane", "-e", "-p", "-t", "kv")
        assert foreign_controls(with_escapes) == []  # colours (SGR) only
        assert tmux("list-buffers") == ""  # no OSC 52 reached tmux's clipboard
        return tmux.screen()

    shown = check_screen()  # both rows up: the healthy target beside it is read too
    assert "cfg\\x1b]52;c;Q0ZH\\x07" in shown  # the config name, written out
    assert "evil\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in shown  # the model, in the panel title

    tmux("send-keys", "-t", "kv", "Home", "Enter")  # the hostile row ("cfg…" sorts first)
    wait_for(lambda: DETAIL in tmux.screen(), 20, "the detail of the hostile row")
    shown = check_screen()
    assert " model   evil\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in shown  # written out
    assert "\\x0aFAKE ROW" in shown  # the newline too: no line of its own
    assert not any(line.lstrip().startswith("FAKE ROW") for line in shown.splitlines())

    tmux("send-keys", "-t", "kv", "Escape")  # back to the table first: "ESC q" reads as alt+q
    wait_for(lambda: DETAIL not in tmux.screen(), 20, "the fleet table again")
    tmux("send-keys", "-t", "kv", "q")
    wait_for(exit_code.exists, 20, "kvtop to exit after q")
    assert exit_code.read_text().strip() == "0"
    wait_for(lambda: not processes_with(str(config), tmux_too=False), 10, "kvtop to be gone")
