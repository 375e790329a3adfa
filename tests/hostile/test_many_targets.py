"""Thousands of targets: refused ports are reported as refused (10,000 of them once read as
6,891 'timeouts': quoting every target's narrowed URL, a second connection per target and
all attempts at once ran the deadlines out on the event loop's own work), and the app
quits on q and when its terminal goes away."""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import sys
from pathlib import Path

import pytest

from kvtop.collect.poller import Gate, Poller
from kvtop.collect.target import Target
from tests.fakes.faultserver import closed_port
from tests.support.tmux import Tmux, processes_with, wait_for

TARGETS = 5_000


async def test_thousands_of_refused_ports_are_all_reported_refused() -> None:
    port = closed_port()  # one closed port, many targets (one connection attempt each)
    targets = [Target(f"http://127.0.0.1:{port}/metrics?n={n}") for n in range(TARGETS)]
    async with Poller(targets, narrow=True, timeout_s=5.0) as poller:
        scrapes = await poller.poll_once()
    said = collections.Counter((s.failure, s.error) for s in scrapes)
    assert said == {("down", "connection refused: nothing listens on that port"): TARGETS}


def _config(tmp_path: Path, count: int) -> Path:
    port = closed_port()
    path = tmp_path / "many.toml"
    path.write_text("".join(f'[[targets]]\nurl = "http://127.0.0.1:{port}/metrics?n={n}"\n'
                            for n in range(count)))
    return path


@pytest.mark.skipif(shutil.which("tmux") is None, reason="the tmux test needs tmux")
@pytest.mark.parametrize("leave", ["q", "terminal gone"])
def test_the_app_with_thousands_of_targets_quits_and_goes_with_its_terminal(
        tmux: Tmux, tmp_path: Path, leave: str) -> None:
    """Measured with 10,000 on a loaded 2-core machine (docs/security.md): first frame
    3.6-8.4 s, q 3.9-6.2 s, terminal gone 3.1-4.7 s. Here 3,000 and bounds far above
    those: with the terminal gone, Textual's shutdown could block for good writing to it."""
    config = _config(tmp_path, 3_000)
    command = f"{sys.executable} -m kvtop --config {config} --no-gpu"
    tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "kv", "-c", os.getcwd(), command)
    wait_for(lambda: "hosts" in tmux.screen(), 60, "the first frame")
    wait_for(lambda: "down" in tmux.screen(), 60, "the first refused port shown")
    assert processes_with(str(config), tmux_too=False)
    if leave == "q":
        tmux("send-keys", "-t", "kv", "q")
    else:
        tmux("kill-server")
    wait_for(lambda: not processes_with(str(config), tmux_too=False), 20, "kvtop to exit")


async def test_the_gate_lets_through_at_most_its_size_and_skips_those_that_left() -> None:
    gate = Gate(2)
    inside, most, release = 0, 0, asyncio.Event()

    async def hold() -> None:
        nonlocal inside, most
        async with gate:
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1

    tasks = [asyncio.create_task(hold()) for _ in range(6)]
    while inside < 2:
        await asyncio.sleep(0)
    for task in tasks[2:4]:  # two waiters leave before their turn
        task.cancel()
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert most == 2 and inside == 0
    assert [isinstance(r, asyncio.CancelledError) for r in results] == [False] * 2 + [True] * 2 \
        + [False] * 2

    async def both_places() -> None:
        async with gate, gate:
            pass

    await asyncio.wait_for(both_places(), 10)  # every place came back
