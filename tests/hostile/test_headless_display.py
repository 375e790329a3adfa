"""Headless commands on hostile servers: JSON keeps the exact value, text for a terminal shows
it written out (never interpreted, never read as markup), and the healthy target beside it
is still read."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from kvtop.collect.target import Scrape, Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.report.snapshot import snapshot_document
from kvtop.safe_text import display_text
from kvtop.store.recording import RecordingWriter
from kvtop.view.table import table_text
from tests.fakes.faultserver import FaultServer
from tests.hostile.hostile import (
    EVIL_ENGINE,
    EVIL_MODEL,
    OSC52,
    foreign_controls,
    healthy_body,
    hostile_body,
    run_in_pty,
)

T0 = 1_767_225_600.0


async def run_kvtop(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


def _shown(text: str) -> str:
    """What a terminal shows of ``text`` printed through the pty (no line-end translation)."""
    return text.replace("\r\n", "\n")


async def test_snapshot_json_is_exact_and_the_table_written_out() -> None:
    async with FaultServer(bodies=[hostile_body()]) as evil, \
            FaultServer(bodies=[healthy_body()]) as good:
        evil_url, good_url = evil.url(), good.url()
        args = ("snapshot", evil_url, good_url, "--samples", "1", "--no-gpu")
        code, out, err = await run_kvtop(*args, "--json")
        table = await asyncio.to_thread(run_in_pty, *args)
    assert code == 0, err
    targets = {t["target"]: t for t in json.loads(out)["targets"]}
    (engine,) = targets[evil_url]["engines"]
    assert (engine["model"], engine["engine"]) == (EVIL_MODEL, EVIL_ENGINE)  # exact
    (healthy,) = targets[good_url]["engines"]
    assert targets[good_url]["status"] == "up" and healthy["model"] == "twin-llama"

    assert table.code == 0, table.err
    assert foreign_controls(table.out) == []  # colours only, nothing from the server
    shown = _shown(table.out)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown  # written out where the name is
    assert "[/]oops[/bold]" in shown  # markup stays literal (it used to raise MarkupError)
    assert "\x1b]8;" not in table.out  # and never became a hyperlink (OSC 8)
    assert not any(line.lstrip("│┃ ").startswith("FAKE ROW") for line in shown.splitlines())
    assert "twin-llama" in shown and "up" in shown


def test_the_table_never_reads_labels_as_markup() -> None:
    """The snapshot table of states with markup and escapes in every string field."""
    leak = LeakVerdict("leak", "idle floor rose", 1.0, 10.0, 3.0)
    engine = EngineStats("[/]oops[/bold]", "[/x]", T0, blocks_used=1, blocks_total=2,
                         running=1, waiting=0, leak=leak)
    up = TargetState(Target(url="http://10.0.0.1:8000/metrics", name="[/]h"), "up",
                     kind="vllm", engines=[engine], last_good_t=T0)
    down = TargetState(Target(url="http://10.0.0.2:8000/metrics", name="down[/]"), "down",
                       error=f"HTTP 500 ({OSC52}[/nope])", last_good_t=T0)
    taken_at = datetime.fromtimestamp(T0, tz=timezone.utc)
    text = table_text([up, down], snapshot_document([up, down], [], taken_at=taken_at))
    assert "[/]oops[/bold]" in text and "[/]h" in text and "[/nope]" in text
    assert "\x1b]52" not in text and "\\x1b]52" in text


async def test_check_text_shows_names_written_out() -> None:
    async with FaultServer(bodies=[hostile_body()]) as evil, \
            FaultServer(bodies=[healthy_body()]) as good:
        run = await asyncio.to_thread(run_in_pty, "check", evil.url(), good.url(),
                                      "--duration", "2s", "--interval", "0.5")
    assert run.code in (0, 3), run.err  # no verdict yet in 2 s: "no usable data" is fine
    assert foreign_controls(run.out) == []
    shown = _shown(run.out)
    assert display_text(EVIL_MODEL) in shown
    assert "twin-llama" in shown  # the healthy engine is judged too
    assert not any(line.lstrip().startswith("FAKE ROW") for line in shown.splitlines())


def test_check_replay_of_a_hostile_recording(tmp_path: Path) -> None:
    """A recording's target URL, version and bodies are outside text too."""
    evil = Target(url=f"http://10.0.0.9:8000/metrics{OSC52}")
    good = Target(url="http://10.0.0.1:8000/metrics")
    path = tmp_path / "evil.jsonl"
    with RecordingWriter(path, interval_s=5.0, targets=[evil, good]) as writer:
        for t in range(0, 30, 5):
            writer.write(Scrape(evil, T0 + t, hostile_body().decode(), version=f"0.9{OSC52}"))
            writer.write(Scrape(good, T0 + t, healthy_body().decode()))
    with path.open("a") as file:
        file.write('{"t": 1, "tar')  # a cut-off line: a warning on stderr
    run = run_in_pty("check", "--replay", str(path))
    # The same bodies every 5 s: requests held and no token counted for 25 s is a stall (4)
    assert run.code in (0, 3, 4), run.err
    assert foreign_controls(run.out) == [] and foreign_controls(run.err) == []
    assert "10.0.0.9:8000/metrics\\x1b]52" in _shown(run.out)
    assert "twin-llama" in run.out
    assert "not JSON" in run.err
