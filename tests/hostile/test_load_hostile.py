"""The commands that send load (``rehearse``, ``baseline save --probe``, ``compare``) against an
OpenAI API that quotes the token back or never ends a line of its stream: no token byte in
any output or file, no raw control byte on the terminal, exit codes as documented (never
70), and memory bounded while the stream goes on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.hostile.hostile import TOKEN, TOKEN_HEAD, foreign_controls, run_in_pty
from tests.hostile.hostile_api import HostileAPI

ENV = {"HOSTILE_TOKEN": TOKEN}
# rehearse: 0 GO, 1 NO-GO, 3 no verdict / cannot run (docs/rehearse.md); never 70
REHEARSE_CODES = {0, 1, 3}
RSS_BOUND_MB = 250  # the endless stream took 1.1 GB in 30 s


@contextmanager
def served(api: HostileAPI) -> Iterator[HostileAPI]:
    """The server in its own thread and loop, so the command under test runs as a user's."""
    ready, stop = threading.Event(), None
    loop = asyncio.new_event_loop()

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with api:
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(20)
    try:
        yield api
    finally:
        loop.call_soon_threadsafe(stop.set)  # type: ignore[union-attr]
        thread.join(20)


def no_token(*texts: str) -> bool:
    return not any(TOKEN_HEAD in text for text in texts)


def files_of(folder: Path) -> dict[str, str]:
    return {p.name: p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*")
            if p.is_file()}


def test_rehearse_never_writes_an_echoed_token_anywhere(tmp_path: Path) -> None:
    """The load client never masked: the token went to requests.jsonl, report.json,
    report.txt and stdout."""
    out = tmp_path / "out"
    with served(HostileAPI("echo")) as api:
        run = run_in_pty("rehearse", api.url, "--duration", "20s", "--time-scale", "10",
                         "--rate", "4", "--out", str(out), "--no-gpu", "--token-env",
                         "HOSTILE_TOKEN", env=ENV)
        assert api.requests >= 3 and api.seen_auth[0] == f"Bearer {TOKEN}"
    assert run.code in REHEARSE_CODES, run.err
    files = files_of(out)
    assert {"requests.jsonl", "report.json", "report.txt"} <= set(files)
    assert no_token(run.out, run.err, *files.values())
    requests = [json.loads(line) for line in files["requests.jsonl"].splitlines()]
    errors = [r["error"] for r in requests if r.get("error")]
    assert any("you sent Bearer ***" in e and "(token ***)" in e for e in errors), errors
    assert foreign_controls(run.out) == [] and foreign_controls(run.err) == []
    assert foreign_controls(files["report.txt"]) == []


def test_baseline_probe_never_keeps_an_echoed_token(tmp_path: Path) -> None:
    env = {**ENV, "XDG_DATA_HOME": str(tmp_path)}
    with served(HostileAPI("echo")) as api:
        run = run_in_pty("baseline", "save", "echoed", api.url, "--duration", "40s",
                         "--time-scale", "20", "--interval", "0.5", "--no-gpu", "--probe",
                         "--token-env", "HOSTILE_TOKEN", env=env)
    saved = tmp_path / "kvtop" / "baselines" / "echoed.json"
    assert run.code in (0, 3), run.err  # saved, or (no engine read) nothing to save
    texts = [run.out, run.err, *([saved.read_text()] if saved.exists() else [])]
    assert no_token(*texts)
    assert foreign_controls(run.out) == [] and foreign_controls(run.err) == []
    if saved.exists():
        show = run_in_pty("baseline", "show", str(saved), env=env)
        assert show.code == 0 and no_token(show.out) and foreign_controls(show.out) == []


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_stream_line_that_never_ends_costs_bounded_memory(tmp_path: Path) -> None:
    """One ``data:`` line without end at --rate 4: 41 MB -> 1.1 GB in 30 s before."""
    with served(HostileAPI("endless")) as api:
        proc = subprocess.Popen(
            # --full-duration: the fake's static /metrics reads as a stall, which would
            # stop the run early; the memory is measured over the whole 25 s
            [sys.executable, "-m", "kvtop", "rehearse", api.url, "--duration", "25s",
             "--rate", "4", "--out", str(tmp_path / "out"), "--no-gpu", "--quiet",
             "--full-duration"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
        samples = []
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            samples.append(_rss_mb(proc.pid))
            time.sleep(1)
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode in REHEARSE_CODES, err
    assert len(samples) >= 20 and max(samples) < RSS_BOUND_MB, samples
    requests = [json.loads(line) for line in
                (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert any("a line of the event stream over 1,048,576 bytes" in (r.get("error") or "")
               for r in requests)
