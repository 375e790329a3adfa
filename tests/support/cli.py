"""kvtop as a user runs it: the installed command (or `python -m kvtop`) in a subprocess, and
`kvtop sim` serving only its OpenAI API on an ephemeral port."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.waiting import DEADLINE_S


async def run_kvtop(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=2 * DEADLINE_S)
    return proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started


SCALE = 10.0


def kvtop_command() -> list[str]:
    """The installed `kvtop` next to this interpreter, else `python -m kvtop`."""
    script = Path(sys.executable).parent / "kvtop"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvtop"]


@contextmanager
def kvtop_sim(*flags: str) -> Iterator[str]:
    """`kvtop sim` serving only its API at 10x on an ephemeral port; yields its base URL."""
    process = subprocess.Popen(
        [*kvtop_command(), "sim", "--port", "0", "--workload", "none", "--speed", str(SCALE),
         *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("http://"), process.stderr.read() if process.stderr else line
        yield line.strip().removesuffix("/metrics")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
