"""`kvtop rehearse` end to end against `kvtop sim` (a real server process) in accelerated time.

Each scenario runs the simulator at 10x and the rehearsal on the simulator's clock
(`--time-scale 10`), so a 100 s rehearsal takes about 10 s. Scenario sizes are chosen so the
verdict does not hinge on how fast this machine is: the healthy server has room to spare,
the leak fills its pool within the run, the overloaded server gets twice what it was just
measured to serve, and its clients give up after 25 s (so it fails requests, as an overloaded
server does, beside growing slower)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from kvtop.collect.exposition import parse
from kvtop.collect.nvml import GpuReading
from kvtop.collect.target import Target
from kvtop.rehearse.run import RehearsalSettings, rehearse
from kvtop.store.recording import read_recording
from tests.fakes.fake_nvml import GIB, FakeGpuReader, sample_gpus
from tests.support.cli import SCALE, kvtop_command, kvtop_sim


def settings(url: str, out: Path, *, duration_s: float, rate: float | None = 1.0,
             **extra: Any) -> RehearsalSettings:
    return RehearsalSettings(metrics=Target(url=url + "/metrics"), api_base=url + "/v1",
                             duration_s=duration_s, out_dir=out, rate=rate,
                             interval_s=2.0, time_scale=SCALE, **extra)


def run(config: RehearsalSettings, gpus: FakeGpuReader | None = None) -> dict[str, Any]:
    return asyncio.run(rehearse(config, gpu_reader=gpus, progress=None))


def last_counters(recording: Path) -> dict[str, float]:
    """The server's own request and token counters in the last scrape of the recording."""
    body = next(s.body for s in reversed(read_recording(recording).scrapes) if s.ok)
    out: dict[str, float] = {}
    for sample in parse(body or "").samples:
        if sample.name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            out[sample.name] = sample.value
        elif sample.name == "vllm:request_success_total":
            out["requests"] = out.get("requests", 0.0) + sample.value
    return out


def test_a_healthy_server_is_go_and_its_log_agrees_with_its_counters(tmp_path: Path) -> None:
    gpus = FakeGpuReader(sample_gpus()[:1])
    with kvtop_sim() as url:
        doc = run(settings(url, tmp_path / "out", duration_s=70.0, rate=1.5), gpus)
    assert doc["verdict"] == "go", doc["reasons"]
    criteria = doc["criteria"]
    assert criteria["gpu_memory"]["state"] == "ok"
    assert criteria["gpu_memory"]["figures"]["gpus"][0]["first_gib"] == 74.0
    assert criteria["kv_free"]["state"] == "ok"
    # judged, but its state is not asserted: on a loaded machine the simulator itself can
    # slow down mid-run, which a client rightly sees as slower answers
    assert criteria["latency"]["state"] != "not_judged"
    requests = doc["requests"]
    assert requests["failed"] == requests["cut"] == requests["dropped"] == 0
    assert requests["ok"] >= 100 and set(requests["classes"]) == {"short", "long-prompt",
                                                                   "long-output"}
    kv = doc["kv"]["engines"][0]
    assert kv["before"]["idle"] and kv["after"]["idle"] and kv["peak_usage"] > 0
    # the per-request log agrees with what the server counted
    lines = [json.loads(line) for line in (tmp_path / "out/requests.jsonl").read_text(
        encoding="utf-8").splitlines()]
    counters = last_counters(tmp_path / "out/recording.jsonl.gz")
    assert len(lines) == counters["requests"] == requests["ok"]
    assert sum(line["prompt_tokens"] for line in lines) == counters["vllm:prompt_tokens_total"]
    assert sum(line["completion_tokens"] for line in lines) == \
        counters["vllm:generation_tokens_total"]
    assert doc["files"]["gpus"] and (tmp_path / "out/gpus.jsonl").stat().st_size > 0
    text = (tmp_path / "out/report.txt").read_text(encoding="utf-8")
    assert text.startswith("kvtop rehearse: GO\n")


def test_a_slow_leak_only_free_kv_sees_is_no_go_naming_the_leak(tmp_path: Path) -> None:
    """5 % of requests keep their blocks in a pool of 4000: about a quarter of it held by
    the end, never full, so the requests keep flowing and only the free-KV criterion sees
    it. That alone is NO-GO, and the report names the leak with its size."""
    with kvtop_sim("--blocks", "4000", "--leak-frac", "0.05") as url:
        done = subprocess.run(
            [*kvtop_command(), "rehearse", url, "--duration", "120s", "--rate", "1.5",
             "--time-scale", str(SCALE), "--interval", "2", "--request-timeout", "60",
             "--out", str(tmp_path / "out"), "--no-gpu", "--quiet", "--json"],
            capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "no-go" and "kv_free" in doc["failed"], doc["reasons"]
    assert doc["reasons"][0].startswith("a leak: free KV not falling: failed (falling: ")
    assert doc["criteria"]["latency"]["state"] != "fail" and doc["stall"]["state"] != "stalled"
    kv = doc["criteria"]["kv_free"]["figures"]["engines"][0]
    assert kv["leak_size"]["blocks"] > kv["residual_threshold_blocks"]
    assert kv["leak_size"]["tokens"] == kv["leak_size"]["blocks"] * 16
    (advice,) = doc["advice"]
    assert advice["lever"] == "leak" and "record it (kvtop record)" in advice["action"]
    assert advice["figures"]["leaked_blocks"] == kv["leak_size"]["blocks"]
    assert json.loads((tmp_path / "out/report.json").read_text()) == doc


def test_a_leak_that_wedges_the_pool_is_no_go_naming_the_stall_and_stops_early(
        tmp_path: Path) -> None:
    """30 % of requests keep their blocks in a pool of 600: it wedges within a minute, the
    waiting requests no longer fit and no token comes out: STALLED, NO-GO by itself, in the
    stall verdict's words, and the load stops there."""
    with kvtop_sim("--blocks", "600", "--leak-frac", "0.3") as url:
        doc = run(settings(url, tmp_path / "out", duration_s=300.0, request_timeout_s=20.0))
    assert doc["verdict"] == "no-go" and doc["stall"]["state"] == "stalled"
    assert any(r.startswith("stalled: ") and "no token generated" in r
               for r in doc["reasons"]), doc["reasons"]
    assert doc["run"]["stopped"] == "stalled" and doc["run"]["load_s"] < 200
    assert "stall" in [a["lever"] for a in doc["advice"]]
    assert not {"max-num-seqs", "max-model-len"} & {a["lever"] for a in doc["advice"]}


def test_a_stall_is_no_go_naming_it_and_the_run_stops_early(tmp_path: Path) -> None:
    with kvtop_sim("--stall-at", "40") as url:
        doc = run(settings(url, tmp_path / "out", duration_s=600.0, request_timeout_s=60.0))
    assert doc["verdict"] == "no-go"
    assert doc["reasons"][0].startswith("stalled: ") and "no token generated" in \
        doc["reasons"][0]
    assert doc["run"]["stopped"] == "stalled" and 40 < doc["run"]["load_s"] < 120
    assert doc["run"]["stopped_reason"].startswith("sim-llama-3-8b 0: STALLED (no token ")
    (advice,) = doc["advice"]
    assert advice["lever"] == "stall" and doc["stall"]["reason"] in advice["action"]
    text = (tmp_path / "out/report.txt").read_text(encoding="utf-8")
    assert "stopped early: stalled" in text and "STALLED stall verdict: " in text


def test_a_server_that_answers_nothing_is_never_go(tmp_path: Path) -> None:
    """Stalled from its first second, run to the end all the same: nothing answered."""
    with kvtop_sim("--stall-at", "1") as url:
        doc = run(settings(url, tmp_path / "out", duration_s=70.0, request_timeout_s=30.0,
                           full_duration=True, drain_s=0.0))
    assert doc["verdict"] == "no-go" and doc["requests"]["ok"] == 0
    assert doc["run"]["stopped"] == "duration"
    assert any(r.startswith("the server answered none of the ") for r in doc["reasons"])


def test_an_overloaded_server_is_no_go_on_latency(tmp_path: Path) -> None:
    with kvtop_sim("--blocks", "600", "--max-num-seqs", "4") as url:
        # what it serves on this machine now, then twice that
        capacity = run(settings(url, tmp_path / "probe", duration_s=20.0, rate=None,
                                concurrency=16, drain_s=0.0))
        served = capacity["requests"]["ok"] / capacity["run"]["load_s"]
        doc = run(settings(url, tmp_path / "out", duration_s=120.0, rate=2 * served,
                           request_timeout_s=25.0, drain_s=5.0))
    assert doc["verdict"] == "no-go", doc["criteria"]["latency"]["reason"]
    assert "latency" in doc["failed"]
    latency = doc["criteria"]["latency"]["figures"]
    assert latency["slow_share"]["last"] > latency["slow_share"]["first"] + 0.1
    assert doc["criteria"]["kv_free"]["state"] != "fail"


def test_a_restart_mid_run_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    with kvtop_sim("--restart-at", "35") as url:
        doc = run(settings(url, tmp_path / "out", duration_s=60.0))
    restarts = doc["run"]["restarts_s"]
    assert len(restarts) == 1 and 0 < restarts[0] < doc["run"]["load_s"]
    assert doc["verdict"] in ("go", "no-go")
    lines = [json.loads(line) for line in (tmp_path / "out/requests.jsonl").read_text(
        encoding="utf-8").splitlines()]
    after = [line for line in lines if line["t"] > restarts[0] + 5 and line["status"] == "ok"]
    assert after, "requests after the restart were answered"
    assert doc["run"]["failed_across_restarts"] == doc["requests"]["failed"]


def test_ctrl_c_stops_early_and_still_writes_the_report(tmp_path: Path) -> None:
    with kvtop_sim() as url:
        process = subprocess.Popen(
            [*kvtop_command(), "rehearse", url, "--duration", "3h", "--rate", "1",
             "--time-scale", str(SCALE), "--out", str(tmp_path / "out"), "--no-gpu",
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        log = tmp_path / "out/requests.jsonl"
        try:
            wait_for_lines(log, 5, process)
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode in (0, 1, 3), stderr
    doc = json.loads(stdout)
    assert doc["run"]["stopped"] == "interrupted"
    assert doc["run"]["load_s"] < 3600
    assert (tmp_path / "out/report.txt").exists()


def wait_for_lines(path: Path, count: int, process: subprocess.Popen[str]) -> None:
    """Until the file has `count` lines (the run is under way), or the process ended."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and len(path.read_bytes().splitlines()) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {count} requests logged; exit {process.poll()}")


class GrowingGpu(FakeGpuReader):
    """One GPU whose memory grows by 256 MiB at every read."""

    def read(self) -> list[GpuReading]:
        (gpu,) = super().read()
        grown = (gpu.memory_used_bytes or 0) + self.reads * GIB // 4
        return [dataclasses.replace(gpu, memory_used_bytes=grown)]


def test_gpu_memory_growing_alone_fails_its_criterion_but_is_go(tmp_path: Path) -> None:
    with kvtop_sim() as url:
        doc = run(settings(url, tmp_path / "out", duration_s=60.0, rate=2.0),
                  GrowingGpu(sample_gpus()[:1]))
    gpu = doc["criteria"]["gpu_memory"]
    assert gpu["state"] == "fail" and gpu["figures"]["gpus"][0]["rise_gib"] > 1
    assert doc["verdict"] == "go" and doc["failed"] == ["gpu_memory"]  # one of three
