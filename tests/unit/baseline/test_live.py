"""Live runs: `kvtop baseline save` and `kvtop compare` as processes against simulated
servers on ephemeral ports, in accelerated time (`--time-scale` = the servers' speed), with
the probe sent to the simulator's OpenAI API; and the GPU readings of a live run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks.baseline_eval.scenarios import COST
from kvtop.baseline.compare import compare
from kvtop.baseline.live import CannotProbe, LiveSettings, collect_live
from kvtop.baseline.probe import PROBE_MAX_TOKENS, ProbeSettings
from kvtop.collect.gpu import GpuReading
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Target
from kvtop.derive.leak_params import LeakParams
from kvtop.safe_text import Secret
from kvtop.sim.engine import EngineConfig
from kvtop.sim.server import SimConfig, SimFleet
from tests.fakes.fake_nvml import GIB, FakeGpuReader
from tests.fakes.fake_openai import FakeOpenAI
from tests.support.paths import fixture_text

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


# -- collect_live in this process: the server's time, the probes' turns, GPUs, Ctrl-C ------

def settings_for(url: str, duration_s: float, probes: int | None = None) -> LiveSettings:
    return LiveSettings([Target.from_spec(url)], duration_s=duration_s, interval_s=5.0,
                        time_scale=SPEED, probe=None if probes is None else ProbeSettings(
                            count=probes))


async def test_a_live_run_is_timed_in_the_servers_time() -> None:
    """60 s of the simulator's time (2 s of ours): scrapes every 5 s of it, the GPU read as
    often, and each probe's timings in its time: no first token before one 50 ms step."""
    async with SimFleet([sim(600, 3)]) as fleet:
        collector = await collect_live(settings_for(fleet.urls[0], 60.0, probes=2),
                                       FakeGpuReader([gpu("NVIDIA H100", 70)]))
    run = collector.baseline(name=None, source={}, interval_s=5.0)
    assert 50.0 <= run.duration_s <= 65.0
    (target,) = run.targets
    assert 10 <= target.scrapes <= 14
    (summary,) = run.gpus
    assert 10 <= summary.memory_used.summary["samples"] <= 14  # type: ignore[operator]
    (gpu_run,) = collector.gpus.values()
    assert min(gpu_run.minutes) == 0  # read at the run's own times, from its start
    probe = target.probe
    assert probe is not None and (probe.requests, probe.failed) == (2, 0)
    assert probe.model == "sim-llama-3-8b"
    assert min(probe.figures["ttft"].values) >= COST.base_ms / 1000
    assert min(probe.figures["total"].values) >= PROBE_MAX_TOKENS * COST.base_ms / 1000


async def test_probes_that_do_not_fit_in_the_run_are_sent_after_it() -> None:
    """10 probes in 5 s of the server's time, each 16 steps of 50 ms: most go after the
    watching ends, one at a time; a baseline needs all 10."""
    async with SimFleet([sim(600, 4)]) as fleet:
        collector = await collect_live(settings_for(fleet.urls[0], 5.0, probes=10), None)
    probe = collector.targets[fleet.urls[0] + "/metrics"].probe
    assert probe is not None and (probe.requests, probe.failed) == (10, 0)
    assert collector.gpus == {}


class BrokenGpuReader:
    def read(self) -> list[GpuReading]:
        raise RuntimeError("driver hiccup")


async def test_gpus_that_cannot_be_read_are_noted_and_the_run_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """15 s of the server's time with scrapes every 5 s: the scrapes' times moved into it;
    no GPU reader, no note; one that fails, a note (and the traceback in the debug log)."""
    caplog.set_level(logging.DEBUG, logger="kvtop.baseline.live")
    async with SimFleet([sim(600, 5)]) as fleet:
        unavailable = settings_for(fleet.urls[0], 15.0)
        await collect_live(unavailable, FakeGpuReader(unavailable="no NVIDIA driver"))
        broken = settings_for(fleet.urls[0], 15.0)
        collector = await collect_live(broken, BrokenGpuReader())  # type: ignore[arg-type]
        without = settings_for(fleet.urls[0], 15.0)
        await collect_live(without, None)
    assert unavailable.notes == ["GPUs not read: no NVIDIA driver"]
    assert broken.notes == ["reading GPUs failed: driver hiccup"] and without.notes == []
    (record,) = [r for r in caplog.records if r.name == "kvtop.baseline.live"]
    assert record.getMessage() == "reading GPUs failed"
    assert record.exc_info and isinstance(record.exc_info[1], RuntimeError)
    assert collector.good_scrapes >= 2 and collector.gpus == {}
    run = collector.baseline(name=None, source={}, interval_s=5.0)
    assert 9.0 <= run.duration_s <= 16.0  # not the half second it took here


async def test_the_run_ends_on_time_whatever_the_gpu_reader_was_waiting_for() -> None:
    """GPUs read every 300 s of the server's time (10 s here) in a 30 s run: the reader's
    wait ends with the run (1 s), not at its next turn."""
    async with SimFleet([sim(600, 7)]) as fleet:
        settings = LiveSettings([Target.from_spec(fleet.urls[0])], duration_s=30.0,
                                interval_s=300.0, time_scale=SPEED)
        started = time.monotonic()
        collector = await collect_live(settings, FakeGpuReader([gpu("NVIDIA H100", 70)]))
    assert time.monotonic() - started < 5
    assert len(collector.gpus) == 1


async def test_a_server_that_cannot_be_probed_is_refused_before_watching() -> None:
    from tests.fakes.faultserver import FaultServer

    async with FaultServer() as server:
        settings = settings_for(server.url(), 600.0, probes=1)
        started = time.monotonic()
        with pytest.raises(CannotProbe, match=r"^--probe: .*/v1/models"):
            await collect_live(settings, None)
    assert time.monotonic() - started < 10  # not after 600 s / 30 of watching


async def test_ctrl_c_ends_the_run_with_what_it_has_and_sends_no_more_probes() -> None:
    """SIGINT 1 s (30 s of the server's) into a 600 s run with 2 probes due at 150 s and
    450 s: the run ends then, no probe sent, the scrapes so far kept."""
    async with SimFleet([sim(600, 6)]) as fleet:
        asyncio.get_running_loop().call_later(1.0, os.kill, os.getpid(), signal.SIGINT)
        started = time.monotonic()
        collector = await collect_live(settings_for(fleet.urls[0], 600.0, probes=2), None)
    assert time.monotonic() - started < 10
    probe = collector.targets[fleet.urls[0] + "/metrics"].probe
    assert probe is not None and probe.requests == 0
    assert collector.good_scrapes >= 3


async def test_probes_go_at_even_turns_through_the_run() -> None:
    """A server loaded only by the probes, 180 s of its time: probe i goes at (i + ½)/N of
    the run, so its 16 tokens land in that minute (2 probes: 45 s and 135 s, minutes 0 and
    2; one probe: 90 s, minute 1)."""
    idle = SimConfig(engine=EngineConfig(num_gpu_blocks=600, cost=COST), workload="none",
                     speed=4 * SPEED)
    minutes = []
    async with SimFleet([idle]) as fleet:
        for count in (2, 1):
            settings = dataclasses.replace(settings_for(fleet.urls[0], 180.0, probes=count),
                                           time_scale=4 * SPEED)
            collector = await collect_live(settings, None)
            (_, engine), = collector.baseline(name=None, source={}, interval_s=5.0).engines()
            minutes.append([v > 0 for v in engine.figure("generation_tps").values])
    assert minutes == [[True, False, True], [False, True, False]]


async def test_a_targets_token_goes_with_the_probe_and_reads_are_narrowed() -> None:
    """A server on 127.0.0.1 with /metrics (a real vLLM body) and the OpenAI API: the
    target's token on /v1/models and the probe; /metrics asked for kvtop's samples only,
    unless full_metrics."""
    async with FakeOpenAI(metrics=fixture_text("vllm-0.33.0-v1-twin-under-load.txt")) as server:
        target = Target.from_spec(f"{server.url}/metrics", token=Secret("s3cret"))
        settings = LiveSettings([target], duration_s=1.0, interval_s=0.5,
                                probe=ProbeSettings(count=1))
        collector = await collect_live(settings, None)
        narrowed = list(server.metrics_requests)
        server.metrics_requests.clear()
        await collect_live(LiveSettings([target], duration_s=0.5, interval_s=0.25,
                                        full_metrics=True), None)
    assert server.authorizations == ["Bearer s3cret"] * 2
    probe = collector.targets[target.url].probe
    assert probe is not None and probe.requests == 1
    assert narrowed and all(path.startswith("/metrics/?") for path, _ in narrowed)
    assert server.metrics_requests and all(
        path == "/metrics" for path, _ in server.metrics_requests)


async def test_insecure_reaches_a_self_signed_server_for_scrapes_and_probes(
        self_signed: ssl.SSLContext) -> None:
    async with FakeOpenAI(metrics=fixture_text("vllm-0.33.0-v1-twin-under-load.txt"),
                          ssl_context=self_signed) as server:
        target = Target.from_spec(f"{server.url}/metrics")
        collector = await collect_live(LiveSettings(
            [target], duration_s=1.0, interval_s=0.25, insecure=True,
            probe=ProbeSettings(count=1)), None)
    probe = collector.targets[target.url].probe
    assert probe is not None and (probe.requests, probe.failed) == (1, 0)
    assert collector.good_scrapes >= 2


async def test_a_scrape_gives_up_at_the_timeout_asked_for() -> None:
    """A server that never answers, scraped every 0.25 s with a 0.2 s timeout for 1.5 s:
    failed scrapes, each in its time (not the default timeout's)."""
    from tests.fakes.faultserver import FaultServer

    async with FaultServer() as server:
        target = Target.from_spec(server.url("hang"))
        collector = await collect_live(LiveSettings(
            [target], duration_s=1.5, interval_s=0.25, timeout_s=0.2), None)
    assert collector.targets[target.url].failed >= 2


async def test_ctrl_c_cancels_a_probe_in_flight() -> None:
    """The probe (16 tokens, 0.5 s apart here) goes at 1 s of a 2 s run; SIGINT at 1.5 s
    cancels it rather than waiting 8 s for its answer."""
    async with FakeOpenAI(metrics=fixture_text("vllm-0.33.0-v1-twin-under-load.txt"),
                          tokens=16, token_gap_s=0.5) as server:
        target = Target.from_spec(f"{server.url}/metrics")
        asyncio.get_running_loop().call_later(1.5, os.kill, os.getpid(), signal.SIGINT)
        started = time.monotonic()
        collector = await collect_live(LiveSettings(
            [target], duration_s=2.0, interval_s=0.5, probe=ProbeSettings(count=1)), None)
    assert time.monotonic() - started < 5
    probe = collector.targets[target.url].probe
    assert probe is not None and probe.requests == 0 and len(server.bodies) == 1


async def test_the_leak_detectors_parameters_are_the_runs() -> None:
    """vLLM's twin holding 827 blocks at idle, scraped for 2 s: a LEAK once a residual held
    0.5 s counts (the defaults need a minute)."""
    params = LeakParams(idle_min_s=0.2, idle_min_scrapes=3, idle_leak_s=0.5)
    async with FakeOpenAI(metrics=fixture_text("vllm-0.33.0-v1-twin-leaking-idle.txt")
                          ) as server:
        target = Target.from_spec(f"{server.url}/metrics")
        collector = await collect_live(LiveSettings(
            [target], duration_s=2.0, interval_s=0.1, leak_params=params), None)
    (_, engine), = collector.baseline(name=None, source={}, interval_s=0.1).engines()
    assert engine.leak == "leak"
