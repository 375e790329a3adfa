"""Live runs: `kvtop baseline save` and `kvtop compare` as processes against simulated
servers on ephemeral ports, in accelerated time (`--time-scale` = the servers' speed), with
the probe sent to the simulator's OpenAI API; and the GPU readings of a live run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.baseline_eval.scenarios import COST
from kvtop.baseline.compare import compare
from kvtop.baseline.live import LiveSettings, collect_live
from kvtop.baseline.probe import PROBE_MAX_TOKENS
from kvtop.collect.gpu import GpuReading
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Target
from kvtop.sim.engine import EngineConfig
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.fake_nvml import GIB, FakeGpuReader

SPEED = 30.0
LOAD = {"rate": 1.0, "output_mean": 100.0}


async def kvtop(*args: str, env: dict[str, str], timeout: float = 180
                ) -> tuple[int, dict[str, Any] | None, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    document = json.loads(out) if out.strip().startswith(b"{") else None
    return proc.returncode or 0, document, err.decode()


def sim(blocks: int, seed: int) -> SimConfig:
    return SimConfig(engine=EngineConfig(num_gpu_blocks=blocks, cost=COST),
                     workload_params=LOAD, speed=SPEED, seed=seed)


async def test_save_then_compare_a_smaller_pool_live(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    timing = ["--duration", "6m", "--interval", "5", "--time-scale", str(SPEED), "--no-gpu"]
    async with SimFleet([sim(600, 1), sim(300, 2)]) as fleet:
        healthy, small = (url + "/metrics" for url in fleet.urls)
        code, _, err = await kvtop("baseline", "save", "live", healthy, *timing, "--probe",
                                   env=env)
        assert code == 0, err
        code, doc, err = await kvtop("compare", "live", small, *timing, "--probe", "--json",
                                     env=env)
    assert code == 1, err
    assert doc is not None and doc["verdict"] == "worse"
    assert [(c["key"], c["baseline"], c["now"]) for c in doc["config_changes"]] == [
        ("num_gpu_blocks", 600, 300)]
    (engine,) = doc["engines"]
    figures = {f["figure"]: f for f in engine["figures"]}
    assert figures["kv_usage"]["verdict"] == "worse"
    assert figures["kv_usage"]["values"][0] >= 5  # minutes of the server's time
    (probe,) = doc["probes"]
    assert probe["model"] == "sim-llama-3-8b" and probe["note"] is None
    assert [f["values"] for f in probe["figures"]] == [[5, 5], [5, 5]]
    saved = json.loads((tmp_path / "kvtop/baselines/live.json").read_text())
    target = saved["targets"][0]
    assert saved["source"] == {"kind": "live", "time_scale": SPEED}
    assert target["probe"]["requests"] == 5 and target["probe"]["failed"] == 0
    assert target["probe"]["prompt"] == "text"
    assert target["probe"]["max_tokens"] == PROBE_MAX_TOKENS
    assert all(t > 0 for t in target["probe"]["figures"]["ttft"]["per_request"])


@contextmanager
def kvtop_sim(*flags: str) -> Iterator[str]:
    """The `kvtop sim` command serving only its API (no workload of its own); its /metrics."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kvtop", "sim", "--port", "0", "--workload", "none",
         "--speed", "10", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("http://"), process.stderr.read() if process.stderr else line
        yield line.strip()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_probe_against_the_kvtop_sim_command(tmp_path: Path) -> None:
    """Only the probe loads the server: its requests are the server's requests."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    timing = ["--duration", "60s", "--interval", "5", "--time-scale", "10", "--no-gpu"]
    with kvtop_sim() as url:
        code, _, err = await kvtop("baseline", "save", "probed", url, *timing, "--probe",
                                   "--probes", "3", env=env)
        assert code == 0, err
        code, doc, err = await kvtop("compare", "probed", url, *timing, "--probe", "--json",
                                     env=env)
    assert code in (0, 1), err
    saved = json.loads((tmp_path / "kvtop/baselines/probed.json").read_text())
    probe = saved["targets"][0]["probe"]
    assert probe["requests"] == 3 and probe["failed"] == 0 and probe["prompt_tokens"] == 32
    (engine,) = saved["targets"][0]["engines"]
    # three 16-token requests in 60 s of server time: the counters saw no more than them
    generated = engine["figures"]["generation_tps"]["value"] * engine["duration_s"]
    assert 0 < generated <= 3 * 16 + 0.01  # the rate is kept to 6 digits
    assert doc is not None
    (compared,) = doc["probes"]
    assert [f["values"] for f in compared["figures"]] == [[3, 3], [3, 3]]


def gpu(name: str, used_gib: int) -> GpuReading:
    return GpuReading(index=0, name=name, uuid="GPU-0", memory_used_bytes=used_gib * GIB,
                      memory_total_bytes=80 * GIB, util_percent=None, temperature_c=None,
                      power_w=None)


async def test_a_live_run_keeps_gpu_memory_and_names_a_gpu_swap() -> None:
    async with SimFleet([sim(600, 3)]) as fleet:
        settings = LiveSettings([Target.from_spec(fleet.urls[0])], duration_s=360.0,
                                interval_s=10.0, time_scale=SPEED)
        before = (await collect_live(settings, FakeGpuReader([gpu("NVIDIA H100", 70)])))
        after = await collect_live(settings, FakeGpuReader([gpu("NVIDIA H200", 76)]))
    base = before.baseline(name="gpu", source={"kind": "live"}, interval_s=10.0)
    now = after.baseline(name=None, source={"kind": "live"}, interval_s=10.0)
    (summary,) = base.gpus
    assert summary.name == "NVIDIA H100" and summary.memory_total_bytes == 80 * GIB
    assert summary.memory_used.value == 70 * GIB and len(summary.memory_used.values) >= 3
    result = compare(base, now)
    assert [(c["key"], c["baseline"], c["now"]) for c in result.all_config_changes()] == [
        ("name", "NVIDIA H100", "NVIDIA H200")]
    (gpu_result,) = result.gpus
    assert gpu_result.memory.verdict == "higher"  # a load figure: never "worse" by itself


async def test_an_api_that_cannot_be_probed_is_refused_before_watching(
        tmp_path: Path) -> None:
    """A /metrics server without an OpenAI API: --probe exits 3 and says why, at once."""
    from tests.fakes.faultserver import FaultServer

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    async with FaultServer() as server:
        code, _, err = await kvtop("baseline", "save", "x", server.url(), "--probe",
                                   "--duration", "10m", "--no-gpu", env=env, timeout=60)
    assert code == 3 and "--probe" in err and "/v1/models" in err
    assert not (tmp_path / "kvtop/baselines/x.json").exists()


def test_gpus_from_an_exporter_target_land_in_the_baseline() -> None:
    """A recording with an nvidia_gpu_exporter target beside the server: its GPU is kept
    (any GPU source kvtop reads counts, not only NVML)."""
    from benchmarks.baseline_eval.scenarios import HEALTHY, scrapes
    from kvtop.baseline.collect import summarise
    from kvtop.collect.target import Scrape
    from tests.scenarios.gpu import NVIDIA_SMI_H100, gpu_fixture

    exporter = Target(url="http://gpu-host:9835/metrics")
    server = list(scrapes(HEALTHY.but(minutes=4)))
    body = gpu_fixture(NVIDIA_SMI_H100)
    gpu_scrapes = [read_scrape(Scrape(exporter, s.t + 0.5, body=body)) for s in server]
    run = summarise([*server, *gpu_scrapes], name="x", source={"kind": "recording"},
                    interval_s=10.0)
    (gpu_summary,) = run.gpus
    assert gpu_summary.source == "nvidia_gpu_exporter" and "H100" in gpu_summary.name
    assert gpu_summary.memory_total_bytes and gpu_summary.memory_used.value
    assert len(gpu_summary.memory_used.values) == 4
    exporter_target = next(t for t in run.targets if t.target == exporter.url)
    assert exporter_target.engines == [] and exporter_target.kind == "nvidia_gpu_exporter"
