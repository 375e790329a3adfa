"""Each hostile input of issue #27 through the real command, as a user runs it (a
pseudo-terminal for text): no raw control byte reaches the terminal, exit codes as
documented (never 70), and the healthy target beside the hostile one is still read."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kvtop.baseline.model import Baseline, EngineSummary, Figure, TargetSummary
from kvtop.safe_text import cells
from tests.fakes.faultserver import FaultServer, Request, mode
from tests.hostile.hostile import (
    EVIL_CONFIG,
    EVIL_ENGINE,
    EVIL_ERROR,
    EVIL_MODEL,
    OSC52,
    foreign_controls,
    healthy_body,
    hostile_body,
    run_in_pty,
)

EXIT_USAGE = 2


def hostile_baseline(name: str) -> Baseline:
    """A baseline file whose every outside string carries escapes, markup and C1 bytes."""
    engine = EngineSummary(model=EVIL_MODEL, engine=EVIL_ENGINE,
                           config={"cache_dtype": EVIL_CONFIG, f"k{OSC52}": "v\x9b2J"},
                           figures={"kv_usage_p50": Figure(0.5, (0.5, 0.5))}, samples=10,
                           minutes=2, duration_s=120.0, leak="leak",
                           leak_reason=EVIL_ERROR)
    target = TargetSummary(target=f"http://10.0.0.9:8000/metrics{OSC52}", kind="vllm",
                           version=f"0.9{OSC52}", scrapes=10, engines=[engine])
    return Baseline(name=name, created=f"2026-01-01{OSC52}", kvtop_version="x\x1b[2J",
                    source={"kind": "live", "recording": f"r{OSC52}"}, interval_s=1.0,
                    duration_s=120.0, minute_s=60.0, targets=[target])


def test_baseline_show_and_compare_write_a_hostile_file_out(tmp_path: Path) -> None:
    """OSC 52, ESC[2J and C1 bytes in a leak verdict or config key were printed raw."""
    base, other = tmp_path / "base.json", tmp_path / "other.json"
    base.write_text(hostile_baseline("base").dumps())
    other.write_text(hostile_baseline("other").dumps())
    show = run_in_pty("baseline", "show", str(base))
    assert show.code == 0, show.err
    assert foreign_controls(show.out) == [] and "\\x1b]52" in show.out
    compare = run_in_pty("compare", str(base), str(other))
    assert compare.code not in (70, EXIT_USAGE), compare.err
    assert foreign_controls(compare.out) == [] and foreign_controls(compare.err) == []
    assert "\\x1b]52" in compare.out


def test_a_fifo_baseline_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO given as a baseline blocked `baseline show` for good."""
    fifo = tmp_path / "stuck.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kvtop", "baseline", "show", str(fifo)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE and "not a regular file" in done.stderr
    listed = subprocess.run([sys.executable, "-m", "kvtop", "baseline", "list"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")})
    assert listed.returncode == 0
    assert time.monotonic() - started < 30


def test_a_config_nested_5000_deep_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    done = subprocess.run([sys.executable, "-m", "kvtop", "snapshot", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "nested deeper than a config is" in done.stderr


async def test_the_table_lines_up_a_cjk_model_in_terminal_cells() -> None:
    """`snapshot --table` padded by characters: a CJK name shifted its row by 20 cells."""
    cjk = "模型" * 10
    async with FaultServer(bodies=[hostile_body(model=cjk)]) as wide, \
            FaultServer(bodies=[healthy_body()]) as good:
        run = await asyncio.to_thread(run_in_pty, "snapshot", wide.url(), good.url(),
                                      "--samples", "1", "--no-gpu")
    assert run.code == 0, run.err
    lines = [line for line in run.out.replace("\r\n", "\n").splitlines() if "up" in line]
    rows = [line for line in lines if cjk in line or "twin-llama" in line]
    assert len(rows) == 2
    ends = {cells(line[:line.index(" up")]) for line in rows}  # the STATUS column
    assert len(ends) == 1, rows
    assert foreign_controls(run.out) == []


@mode("two_gzip_members")
async def _two_members(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    body = healthy_body()
    cut = body.index(b"vllm:kv_cache_usage_perc")
    return await srv.respond(w, 200, gzip.compress(body[:cut]) + gzip.compress(body[cut:]),
                             headers={"Content-Encoding": "gzip"})


@mode("a_thousand_new_gpus")
async def _new_gpus(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    tag = time.monotonic_ns()
    body = "".join(f'nvidia_smi_memory_used_bytes{{uuid="{tag}-{i}"}} 1024\n'
                   for i in range(1000))
    return await srv.respond(w, 200, body.encode())


async def test_a_gzip_body_of_two_members_is_read_whole() -> None:
    """The second member was dropped with status up: its KV usage never read."""
    async with FaultServer(bodies=[healthy_body()]) as server:
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvtop", "snapshot", server.url("two_gzip_members"),
            "--samples", "1", "--no-gpu", "--json", "--full-metrics",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 60)
    assert done.returncode == 0, err
    (target,) = json.loads(out)["targets"]
    (engine,) = target["engines"]
    assert engine["kv"]["usage"] is not None and engine["kv"]["blocks_total"] == 599


async def test_an_exporter_naming_a_thousand_new_gpus_is_capped() -> None:
    async with FaultServer(bodies=[healthy_body()]) as server:
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvtop", "snapshot", server.url("a_thousand_new_gpus"),
            server.url(), "--samples", "2", "--interval", "0.2", "--no-gpu", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 60)
    assert done.returncode == 0, err
    document = json.loads(out)
    exporter, healthy = document["targets"]
    assert any("1,000 GPUs; the first 256" in note for note in exporter["notes"])
    assert healthy["status"] == "up"
