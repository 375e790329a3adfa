"""`kvtop check` as users run it: live against simulated vLLM servers (one leaking, one
healthy), then on the recordings it wrote, which must give the same verdicts."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet
from tests.faultserver import FaultServer, closed_port

# Shorter idle confirmation than the defaults, so the test runs in well under a minute; the
# defaults are exercised by tests/test_leak.py on constructed series.
FAST = "[thresholds]\nidle_min_s = 4\nidle_leak_s = 12\n"
BURSTS = {"rate": 0.4, "arrival": "bursty", "burst_factor": 8.0, "burst_len": 4.0,
          "output_mean": 60.0}


async def kvtop(*args: str, timeout: float = 120) -> tuple[int, dict[str, Any] | None, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    document = json.loads(out) if out.strip() else None
    return proc.returncode or 0, document, err.decode()


def engine_verdict(document: dict[str, Any]) -> dict[str, Any]:
    (target,) = document["targets"]
    (engine,) = target["engines"]
    return engine


async def test_live_check_finds_the_leak_and_replay_agrees(tmp_path: Path) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text(FAST)
    engine = EngineConfig(num_gpu_blocks=800, max_num_seqs=32)
    leaky = SimConfig(engine=engine, workload_params=BURSTS, seed=5,
                      faults=plan(leak_frac=0.3, leak_at=0.0))
    healthy = SimConfig(engine=engine, workload_params=BURSTS, seed=6)
    async with SimFleet([leaky, healthy]) as fleet:
        leak_run, ok_run = await asyncio.gather(
            # --until-leak ends it at the verdict (~30 s); the duration is only "never"
            kvtop("check", fleet.urls[0] + "/metrics", "--config", str(config), "--interval",
                  "0.5", "--duration", "5m", "--until-leak", "--json",
                  "--record", str(tmp_path / "leaky.jsonl.gz"), timeout=330),
            kvtop("check", fleet.urls[1] + "/metrics", "--config", str(config), "--interval",
                  "0.5", "--duration", "30s", "--json",
                  "--record", str(tmp_path / "healthy.jsonl")))
        truth = fleet.servers[0].truth()
    code, document, err = leak_run
    assert code == 1, err
    assert document["verdict"] == "leak"
    verdict = engine_verdict(document)
    assert verdict["verdict"] == "leak" and verdict["leak_first_t"] is not None
    assert verdict["watch_first_t"] <= verdict["leak_first_t"]
    assert truth.leaked_blocks > 0
    # The estimate is the larger of the idle residual (never above the truth read later: the
    # leak only grows) and the load-separated fit, which is held to 20 % (issue 13's goal;
    # on a loaded CI box the fit has led, 317 blocks against 285). Counting a live request's
    # blocks as leaked would put it far above.
    assert 0 < verdict["leaked_blocks"] <= 1.2 * truth.leaked_blocks + 1

    code, document, err = ok_run
    assert code == 0, err
    assert document["verdict"] == "ok" and engine_verdict(document)["leak_first_t"] is None

    for name, live in (("leaky.jsonl.gz", leak_run), ("healthy.jsonl", ok_run)):
        code, replayed, err = await kvtop("check", "--replay", str(tmp_path / name),
                                          "--config", str(config), "--json")
        assert code == live[0], err
        assert replayed == live[1]


async def test_no_usable_data_exits_3_and_bad_recording_exits_2(tmp_path: Path) -> None:
    code, document, _ = await kvtop("check", f"127.0.0.1:{closed_port()}", "--duration", "2s",
                                    "--json")
    assert code == 3 and document["verdict"] == "unknown"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("hello\n")
    code, document, err = await kvtop("check", "--replay", str(bad))
    assert code == 2 and document is None and "not a kvtop recording" in err


async def test_non_inference_endpoint_gives_no_verdict(tmp_path: Path) -> None:
    async with FaultServer(bodies=[b"# TYPE up gauge\nup 1\n"]) as server:
        code, document, _ = await kvtop("check", server.url(), "--duration", "2s", "--json")
    assert code == 3 and document["targets"][0]["engines"] == []
