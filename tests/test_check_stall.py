"""`kvtop check` (the real command) on a simulated server that wedges: the pool fills, the
queue grows and no token comes out. STALLED within 10 s of the wedge, exit code 4, and the
recording it wrote gives the same document."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from tests.test_check import engine_verdict, kvtop

WEDGE_AT = 20.0  # simulated seconds: some healthy load first
BUSY = {"rate": 6.0}


async def _wedged_at(server: SimServer) -> float:
    """Wall time at which the simulator wedged (its own truth, never /metrics)."""
    while not server.truth().stalled:
        await asyncio.sleep(0.05)
    return time.time()


async def test_check_says_stalled_within_10_s_of_a_wedge(tmp_path: Path) -> None:
    config = SimConfig(engine=EngineConfig(num_gpu_blocks=1000, max_num_seqs=32),
                       workload_params=BUSY, seed=3, faults=plan(wedge_at=WEDGE_AT))
    recording = tmp_path / "wedge.jsonl.gz"
    async with SimFleet([config]) as fleet:
        url = fleet.urls[0] + "/metrics"
        check = asyncio.create_task(kvtop(
            "check", url, "--interval", "1", "--duration", f"{WEDGE_AT + 20:g}s", "--json",
            "--record", str(recording)))
        wedged = await _wedged_at(fleet.servers[0])
        code, document, err = await check
        truth = fleet.servers[0].truth()
    assert code == 4, err
    assert document is not None and document["stall"] == "stalled"
    assert document["verdict"] != "leak"  # too short a run for the leak detector's verdict
    stall = engine_verdict(document)["stall"]
    assert stall["verdict"] == "stalled"
    assert 0 < stall["stalled_first_t"] - wedged <= 10
    assert "KV pool 100% full" in stall["reason"] and "waiting" in stall["reason"]
    assert truth.kv_usage == 1.0 and truth.waiting > 0

    replayed_code, replayed, err = await kvtop("check", "--replay", str(recording), "--json")
    assert (replayed_code, replayed) == (code, document), err
