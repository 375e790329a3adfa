"""`kvtop snapshot` (the real command) against `kvtop sim` servers with each fault: what it
reports equals the simulator's ground truth at the moment /metrics was rendered."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from kvtop.sim.simulation import Truth
from tests.test_snapshot_cli import run_kvtop
from tests.waiting import DEADLINE_S

TOKEN = "sim-token-for-tests"
ENGINE = EngineConfig(num_gpu_blocks=1000, max_num_seqs=32)
BUSY = {"rate": 6.0}
SHORT_BURST = [RequestSpec(arrival=0.1 * i, prompt_len=300, max_tokens=40) for i in range(30)]


def configs() -> dict[str, SimConfig]:
    return {
        "healthy": SimConfig(engine=ENGINE, workload_params=BUSY, seed=1),
        "v0": SimConfig(engine=ENGINE, workload_params=BUSY, seed=2, names="v0"),
        "sglang": SimConfig(engine=ENGINE, workload_params=BUSY, seed=3, names="sglang"),
        "leaking": SimConfig(engine=ENGINE, requests=SHORT_BURST, speed=20.0, seed=4,
                             faults=plan(leak_frac=0.5, leak_at=0.0)),
        "stalled": SimConfig(engine=ENGINE, workload_params=BUSY, seed=5,
                             faults=plan(stall_at=0.0)),
        "slow": SimConfig(engine=ENGINE, workload_params=BUSY, seed=6,
                          faults=plan(slow_metrics=0.5)),
        "hanging": SimConfig(engine=ENGINE, seed=7, faults=plan(hang_at=0.0)),
        "malformed": SimConfig(engine=ENGINE, seed=8, faults=plan(malformed_at=0.0)),
        "auth": SimConfig(engine=ENGINE, seed=9, faults=plan(token=TOKEN)),
    }


def assert_matches(engine: dict, truth: Truth, *, tokens: bool = False,
                   v0: bool = False) -> None:
    if tokens:  # SGLang counts tokens, not blocks
        assert engine["kv"]["tokens_used"] == truth.used_blocks * truth.block_size
    else:
        assert engine["kv"]["blocks_used"] == pytest.approx(truth.used_blocks, abs=1e-3)
    # V0 has no null block: its usage divides by num_gpu_blocks, V1's by one less
    usage = truth.used_blocks / truth.num_gpu_blocks if v0 else truth.kv_usage
    assert engine["kv"]["usage"] == pytest.approx(usage, abs=1e-6)
    assert engine["requests"]["running"] == truth.running
    assert engine["requests"]["waiting"] == truth.waiting


async def test_snapshot_equals_simulator_truth_for_every_fault() -> None:
    named = configs()
    async with SimFleet(list(named.values())) as fleet:
        await _wait_until_idle(fleet.servers[list(named).index("leaking")])
        urls = {name: server.url + "/metrics" for name, server in zip(named, fleet.servers,
                                                                         strict=True)}
        code, out, err, _ = await run_kvtop("snapshot", *urls.values(), "--json", "--no-gpu",
                                            "--interval", "0.5", "--timeout", "2")
        truths = {name: server.last_scrape for name, server in zip(named, fleet.servers,
                                                                   strict=True)}
    assert code == 3, err  # the faulty ones could not be read
    targets = {t["target"]: t for t in json.loads(out)["targets"]}
    status = {name: targets[url]["status"] for name, url in urls.items()}
    assert status == {"healthy": "up", "v0": "up", "sglang": "up", "leaking": "up",
                      "stalled": "up", "slow": "up", "hanging": "timeout",
                      "malformed": "bad_payload", "auth": "auth"}

    healthy = targets[urls["healthy"]]["engines"][0]
    assert_matches(healthy, truths["healthy"])
    assert healthy["prefix_cache"]["queries_total"] == truths["healthy"].prefix_queries
    assert healthy["prefix_cache"]["hits_total"] == truths["healthy"].prefix_hits
    assert healthy["preemptions_total"] == truths["healthy"].preemptions
    assert healthy["kv"]["blocks_total"] == ENGINE.num_gpu_blocks - 1
    assert_matches(targets[urls["v0"]]["engines"][0], truths["v0"], v0=True)
    assert_matches(targets[urls["slow"]]["engines"][0], truths["slow"])
    assert_matches(targets[urls["sglang"]]["engines"][0], truths["sglang"], tokens=True)

    leaking, truth = targets[urls["leaking"]]["engines"][0], truths["leaking"]
    assert truth.running == truth.waiting == 0 and truth.leaked_blocks > 0
    assert leaking["kv"]["blocks_used"] == pytest.approx(truth.leaked_blocks, abs=1e-3)

    stalled, truth = targets[urls["stalled"]]["engines"][0], truths["stalled"]
    assert truth.stalled and truth.waiting > 0
    assert_matches(stalled, truth)
    assert stalled["rates"]["generation_tokens_per_s"] == 0


async def _wait_until_idle(server: SimServer, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        truth = server.truth()
        if truth.steps and truth.running == truth.waiting == 0 and truth.sim_time > 3:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the leaking simulator never went idle")
