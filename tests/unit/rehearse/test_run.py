"""`kvtop rehearse` end to end against `kvtop sim` (a real server process) in accelerated time.

Each scenario runs the simulator at 10x and the rehearsal on the simulator's clock
(`--time-scale 10`), so a 100 s rehearsal takes about 10 s. Scenario sizes are chosen so the
verdict does not hinge on how fast this machine is: the healthy server has room to spare,
the leak fills its pool within the run, the overloaded server gets twice what it was just
measured to serve, and its clients give up after 25 s (so it fails requests, as an overloaded
server does, beside growing slower).

The second half runs whole rehearsals in this process in about a second each, against servers
on 127.0.0.1 whose answers each test sets: the report to the letter, the files, stopping
early or not, Ctrl-C, refusals, and the terminal line (the mutation runs use these)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import json
import locale
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import kvtop
from kvtop.collect.exposition import parse
from kvtop.collect.nvml import GpuReading
from kvtop.collect.target import Target
from kvtop.derive.leak_params import LeakParams
from kvtop.load.prompts import PromptMaker
from kvtop.rehearse.report import render_text
from kvtop.rehearse.run import BadUsage, CannotRun, RehearsalSettings, rehearse
from kvtop.safe_text import Secret, file_text
from kvtop.store.recording import read_recording
from tests.fakes.fake_nvml import GIB, FakeGpuReader, sample_gpus
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.faultserver import FaultServer
from tests.scenarios.check_runs import body as idle_body
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


# -- in this process, against servers on 127.0.0.1 whose answers the test sets ------------
# A rehearsal of 30 s at 40x takes under a second; the API is tests/fakes/fake_openai.py (it
# answers at once) and /metrics a FaultServer that serves its bodies in turn (the last one
# on), so what the run sees before, during and after the load is the test's to choose. Each
# run's report is checked whole where it can be: its layout, and its files against it.

FAST = 40.0


def fast(api: str, metrics: str, out: Path, *, duration_s: float = 30.0,
         **extra: Any) -> RehearsalSettings:
    return RehearsalSettings(metrics=Target(url=metrics), api_base=api + "/v1",
                             duration_s=duration_s, out_dir=out,
                             **{"rate": 4.0, "interval_s": 1.0, "time_scale": FAST, **extra})


def vllm(usage: float, *, running: float = 0.0, tokens: float = 0.0) -> bytes:
    """One vLLM engine of 1000 blocks (tests/scenarios/check_runs.py)."""
    return idle_body(usage, running=running, tokens=tokens).encode()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def layout(value: Any) -> Any:
    """A document's keys, nested; a list by its first item; "" for any other value."""
    if isinstance(value, dict):
        return {key: layout(item) for key, item in value.items()}
    if isinstance(value, list):
        return [layout(item) for item in value[:1]]
    return ""


CRITERION = {"title": "", "state": "", "reason": "", "figures": layout(None)}
KV_STATE = {"used_blocks": "", "blocks_total": "", "usage": "", "idle": ""}
REQUESTS = {"first_attempts": "", "sent": "", "ok": "", "failed": "", "timeouts": "",
            "dropped": "", "cut": "", "error_rate": "", "errors": None,
            "retries": {"sent": "", "ok": ""},
            "tokens": {"answered_requests": "", "prompt": "", "completion": ""}, "classes": None}


def assert_reported(doc: dict[str, Any], out: Path) -> None:
    """The report's layout (docs/rehearse.md), its times in UTC, and its two files saying
    what it returned. Values a run sets are the tests' own business."""
    shaped = layout(doc)
    shaped["run"]["restarts_s"] = ""
    for criterion in shaped["criteria"].values():
        criterion["figures"] = ""
    if shaped["requests"]:
        shaped["requests"]["errors"] = shaped["requests"]["classes"] = None
    for engine in shaped["kv"]["engines"]:
        engine["before"] = engine["before"] and KV_STATE
        engine["after"] = engine["after"] and KV_STATE
    assert shaped == {
        "kvtop_rehearse": "", "started_at": "", "ended_at": "",
        "target": {"api": "", "metrics": "", "model": "", "max_model_len": "",
                   "server": {"kind": "", "version": "", "version_inferred": ""}},
        "settings": dict.fromkeys(
            ("workload", "rate", "concurrency", "duration_s", "interval_s",
             "request_timeout_s", "retries", "strict", "watch_only", "api", "token_ids",
             "time_scale", "max_error_rate", "full_duration"), ""),
        "run": dict.fromkeys(("load_s", "stopped", "stopped_reason", "restarts_s",
                              "failed_across_restarts", "scrapes", "failed_scrapes"), ""),
        "verdict": "", "rule": "", "failed": shaped["failed"], "reasons": shaped["reasons"],
        "evidence": shaped["evidence"], "missing": shaped["missing"],
        "stall": {"state": "", "reason": "", "engine": "", "first_s": ""},
        "criteria": {"gpu_memory": CRITERION, "kv_free": CRITERION, "latency": CRITERION},
        "requests": shaped["requests"] and REQUESTS,
        "server": dict.fromkeys(("pinned_share", "usage_max", "preemptions",
                                 "preemptions_per_min", "waiting_p90", "running_max",
                                 "hit_rate", "prompt_p90", "expected_hit_rate"), ""),
        "kv": {"engines": [{"model": "", "engine": "", "before": shaped["kv"]["engines"][0][
            "before"], "after": shaped["kv"]["engines"][0]["after"], "peak_usage": ""}]},
        "advice": shaped["advice"],
        "files": dict.fromkeys(("recording", "requests", "gpus", "report_json",
                                "report_text"), "")}
    load_s = doc["run"]["load_s"]
    assert isinstance(load_s, float) and load_s == round(load_s, 3)  # to the millisecond
    assert all(t == round(t, 3) for t in doc["run"]["restarts_s"])
    started, ended = (datetime.fromisoformat(doc[k]) for k in ("started_at", "ended_at"))
    assert started <= ended and started.utcoffset() == timedelta(0)
    assert doc["started_at"].endswith("+00:00") and len(doc["started_at"]) == 25  # seconds
    assert doc["ended_at"].endswith("+00:00") and len(doc["ended_at"]) == 25
    assert json.loads((out / "report.json").read_bytes()) == doc
    assert (out / "report.json").read_bytes().startswith(b'{\n  "kvtop_rehearse": 1,\n')
    assert (out / "report.txt").read_text(encoding="utf-8") == file_text(render_text(doc))


# 3 idle reads with 1.2 blocks held, a busy load (31 % used, 4 running, tokens flowing), then
# idle with the same 1.2 blocks (vLLM 0.33 counts 999 of them): the load lasts 45 s, the busy
# bodies 10 scrapes of it
BUSY = [vllm(0.00123)] * 3 + [vllm(0.31234, running=4, tokens=100.0 * i)
                              for i in range(1, 11)] + [vllm(0.00123, tokens=1000.0)]


async def test_a_driven_run_reports_what_it_sent_and_what_the_server_showed(
        tmp_path: Path) -> None:
    """Also the line on a terminal, redrawn every second (of ours): the criteria so far,
    provisional ("ok?") until the load ends; GPU memory not judged yet (too few readings)."""
    gpus, terminal = FakeGpuReader(sample_gpus()[:1]), Terminal()
    async with FakeOpenAI() as api, FaultServer(bodies=BUSY) as metrics:
        metrics_url = metrics.url()
        doc = await rehearse(fast(api.url, metrics_url, tmp_path / "runs/out", duration_s=45.0),
                             gpu_reader=gpus, progress=terminal)
    out = tmp_path / "runs/out"  # its parent made too
    assert_reported(doc, out)
    assert doc["kvtop_rehearse"] == 1 and doc["verdict"] == "go", doc["reasons"]
    assert doc["target"] == {"api": api.url + "/v1", "metrics": metrics_url,
                             "model": "fake-model", "max_model_len": 2048,
                             "server": {"kind": "vllm", "version": "0.33.0",
                                        "version_inferred": False}}
    assert doc["settings"] == {
        "workload": "mixed", "rate": 4.0, "concurrency": 256, "duration_s": 45.0,
        "interval_s": 1.0, "request_timeout_s": 300.0, "retries": 1, "strict": False,
        "watch_only": False, "api": "completions", "token_ids": False, "time_scale": FAST,
        "max_error_rate": 0.01, "full_duration": False}
    run_ = doc["run"]
    assert 45.0 <= run_["load_s"] < 50.0 and run_["failed_scrapes"] == 0
    assert run_["scrapes"] >= 3 + 10 + 3  # before, the busy bodies, after
    assert {k: v for k, v in run_.items() if k not in ("load_s", "scrapes", "failed_scrapes")
            } == {"stopped": "duration", "stopped_reason": None, "restarts_s": [],
                  "failed_across_restarts": 0}
    # one line per request: a request sent every 0.25 s (one may fall either side of the end,
    # and a loaded machine sends fewer in time)
    logged = [json.loads(line) for line in (out / "requests.jsonl").read_bytes().splitlines()]
    sent = len(logged)
    assert 150 <= sent <= 181 and {line["status"] for line in logged} == {"ok"}
    assert doc["requests"] == {
        "first_attempts": sent, "sent": sent, "ok": sent, "failed": 0, "timeouts": 0,
        "dropped": 0, "cut": 0, "error_rate": 0.0, "errors": {},
        "retries": {"sent": 0, "ok": 0},
        "tokens": {"answered_requests": sent, "prompt": 3 * sent, "completion": 4 * sent},
        "classes": classes(logged)}
    assert doc["kv"] == {"engines": [{
        "model": "m", "engine": "0",
        "before": {"used_blocks": 1.2, "blocks_total": 999, "usage": 0.0012, "idle": True},
        "after": {"used_blocks": 1.2, "blocks_total": 999, "usage": 0.0012, "idle": True},
        "peak_usage": 0.3123}]}
    assert doc["server"]["usage_max"] == 0.3123 and doc["server"]["running_max"] == 4.0
    assert doc["server"]["expected_hit_rate"] is None  # the mixed workload expects none
    assert doc["advice"] == []
    assert doc["files"] == {key: str(out / name) for key, name in (
        ("recording", "recording.jsonl.gz"), ("requests", "requests.jsonl"),
        ("gpus", "gpus.jsonl"), ("report_json", "report.json"), ("report_text", "report.txt"))}
    # what the server was sent, a line per GPU reading, and every scrape in the recording
    assert [body["model"] for body in api.bodies] == ["fake-model"] * sent
    readings = [json.loads(line) for line in (out / "gpus.jsonl").read_bytes().splitlines()]
    assert len(readings) == gpus.reads >= 6  # every 5 s (of the server's time), no sooner
    assert [{k: v for k, v in r.items() if k != "t"} for r in readings] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "used": 74 * GIB, "total": 80 * GIB}
    ] * len(readings)
    gaps = sorted(b["t"] - a["t"] for a, b in itertools.pairwise(readings))
    assert gaps[0] >= 5.0 and gaps[len(gaps) // 2] < 5.5  # the next read 5 s after the last
    recording = read_recording(out / "recording.jsonl.gz")
    assert len(recording.scrapes) == run_["scrapes"] and recording.interval_s == 1.0
    lines = terminal.getvalue()
    # the answers and their first tokens counted as they come (the rate and TTFT need them)
    assert re.search(r"\r[^|]+ \| [1-9]\d* done, 0 failed, 0 dropped, (?!0\.00)[\d.]+ req/s \| "
                     r"TTFT p50 \d+ms p99 \d+ms \| KV \d+% \| GPU \S+ KV ok\? "
                     r"latency (ok|watch|fail)\?\x1b\[K",
                     lines), repr(lines)
    assert "LEAK" not in lines and "STALL" not in lines


def classes(logged: list[dict[str, Any]]) -> dict[str, int]:
    """First attempts per request class, from requests.jsonl, in the mixed workload's order."""
    first = [line["cls"] for line in logged if line["attempt"] == 1]
    return {name: first.count(name) for name in ("long-prompt", "long-output", "short")}


async def test_failed_requests_beyond_the_limit_are_no_go_with_the_servers_own_words(
        tmp_path: Path) -> None:
    """3 of 119 first attempts fail (2.5 % > 1 %); the one a retry saved still counts."""
    async with FakeOpenAI(metrics=idle_body(0.0), fail_status={1: 500, 2: 500, 7: 429}) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out"),
                             gpu_reader=None, progress=None)
    assert_reported(doc, tmp_path / "out")
    logged = [json.loads(line) for line in
              (tmp_path / "out/requests.jsonl").read_bytes().splitlines()]
    first = sum(1 for line in logged if line["attempt"] == 1)
    # about 120 (a loaded machine sends fewer in time), one retry
    assert 100 <= first <= 121 and len(logged) == len(api.bodies) == first + 1
    rate = round(3 / first, 4)
    assert (doc["verdict"], doc["reasons"]) == ("no-go", [
        f"{rate:.1%} of the requests failed (limit 1.0%)"])
    assert doc["requests"] == {
        "first_attempts": first, "sent": first, "ok": first - 3, "failed": 3,
        "timeouts": 0, "dropped": 0, "cut": 0, "error_rate": rate,
        "errors": {"HTTP 500: refused 1": 1, "HTTP 500: refused 2": 1,
                   "HTTP 429: refused 7": 1},
        "retries": {"sent": 1, "ok": 1},
        "tokens": {"answered_requests": first - 2, "prompt": 3 * (first - 2),
                   "completion": 4 * (first - 2)},
        "classes": classes(logged)}
    assert doc["advice"] == [{"lever": "errors",
                              "action": "requests failed: the server's log says why",
                              "figures": {"error_rate": rate,
                                          "most_common": "HTTP 500: refused 1"}}]
    assert doc["run"]["failed_across_restarts"] == 0  # no restart: none failed across one
    assert doc["files"]["gpus"] is None and not (tmp_path / "out/gpus.jsonl").exists()
    assert doc["criteria"]["gpu_memory"]["reason"] == "not judged: GPUs not read (--no-gpu)"
    assert doc["target"]["server"] == {"kind": "vllm", "version": "0.9.2+",
                                       "version_inferred": True}  # no /version: guessed
    lenient = await _rehearse_with(tmp_path / "lenient", fail_status={1: 500, 2: 500, 7: 429},
                                   max_error_rate=0.03)
    assert lenient["verdict"] == "go" and lenient["settings"]["max_error_rate"] == 0.03
    assert lenient["advice"] == []  # advice only for a NO-GO


async def _rehearse_with(out: Path, *, fail_status: dict[int, int] | None = None,
                         **extra: Any) -> dict[str, Any]:
    async with FakeOpenAI(metrics=idle_body(0.0), fail_status=fail_status or {}) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", out, **extra),
                             gpu_reader=None, progress=None)
    assert_reported(doc, out)
    return doc


async def test_the_model_named_is_driven_and_one_not_served_is_refused(tmp_path: Path) -> None:
    async with FakeOpenAI(metrics=idle_body(0.0), models=("small", "large")) as api:
        named = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "a",
                                    model="large", duration_s=5.0),
                               gpu_reader=None, progress=None)
        sent_named = [body["model"] for body in api.bodies]
        api.bodies.clear()
        first = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "a",
                                    duration_s=5.0), gpu_reader=None, progress=None)
        with pytest.raises(BadUsage) as refused:
            await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "c", model="tiny"),
                           gpu_reader=None, progress=None)
    assert named["target"]["model"] == "large" and set(sent_named) == {"large"}
    assert first["target"]["model"] == "small" and {b["model"] for b in api.bodies} == {"small"}
    # the second run into the same folder replaced the first one's files
    assert_reported(first, tmp_path / "a")
    assert len((tmp_path / "a/requests.jsonl").read_bytes().splitlines()) == len(api.bodies)
    assert str(refused.value) == "--model 'tiny' is not served there; it serves 'small', 'large'"
    assert not (tmp_path / "c/requests.jsonl").exists()


async def test_what_cannot_be_rehearsed_is_refused_with_the_reason(tmp_path: Path) -> None:
    async with FaultServer() as not_openai, FakeOpenAI() as api, FaultServer(
            bodies=[b"up 1\n"]) as other, FaultServer(mode="auth", token="t") as locked:
        refusals, took = {}, {}
        for name, config in {
            "api": fast(not_openai.base_url, not_openai.url(), tmp_path / "a"),
            "metrics": fast(api.url, other.url("garbage"), tmp_path / "b"),
            "kind": fast(api.url, other.url(), tmp_path / "c"),
            "auth": fast(api.url, locked.url("auth"), tmp_path / "d"),
        }.items():
            started = time.monotonic()
            with pytest.raises(CannotRun) as error:
                await rehearse(config, gpu_reader=None, progress=None)
            refusals[name] = str(error.value)
            took[name] = time.monotonic() - started
        base, other_url, locked_url = not_openai.base_url, other.url(), locked.url("auth")
        garbage_url = other.url("garbage")
        asked = (len(locked.requests),
                 sum(1 for r in other.requests if r.path == "/m/garbage/metrics"))
    assert refusals == {
        "api": f"{base}/v1/models did not answer with an OpenAI model list "
               '({"data": [{"id": ...}]}): not an OpenAI-compatible server',
        "metrics": f"cannot read {garbage_url}: binary data, not Prometheus text",
        "kind": f"{other_url} is not an inference server's /metrics (no vLLM, SGLang, "
                "llama.cpp or TensorRT-LLM metrics)",
        "auth": f"cannot read {locked_url}: HTTP 401: the server wants a bearer token; set it "
                "with token_env/token_file in the config or --token-env/--token-file "
                "(llama.cpp's --api-key also guards /metrics)",
    }
    # a refused token or a body that is no exposition is not asked again (for 15 s): a
    # /version and a /metrics request, one /metrics request; and not waited on either: the
    # refusal comes at once, not when the 15 s (of ours) for a first read have passed
    assert asked == (2, 1)
    assert took["metrics"] < 7.5 and took["auth"] < 7.5
    assert api.bodies == []  # nothing was sent to a server whose metrics can't be read


async def test_a_workload_or_folder_that_cannot_be_used_is_a_usage_error(
        tmp_path: Path) -> None:
    bad_trace = tmp_path / "trace.csv"
    bad_trace.write_text("not,a,trace\n")
    taken = tmp_path / "file"
    taken.write_text("")
    async with FakeOpenAI(metrics=idle_body(0.0)) as api:
        with pytest.raises(BadUsage) as trace:
            await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                workload=f"trace:{bad_trace}"), gpu_reader=None, progress=None)
        with pytest.raises(BadUsage) as folder:
            await rehearse(fast(api.url, api.url + "/metrics", taken), gpu_reader=None,
                           progress=None)
    assert str(trace.value) == f"trace {bad_trace} holds no requests"
    assert str(folder.value) == f"cannot write to {taken}: File exists"


LEAK_REASON = ("m 0: LEAK confirmed (39 blocks held (idle floor 1 block assumed: server "
               "version not known exactly) with nothing running or waiting)")


async def test_a_confirmed_leak_ends_the_load_early_then_drains_and_reads_the_floor(
        tmp_path: Path) -> None:
    """40 blocks held with nothing running: LEAK after a minute of the server's time, NO-GO
    whatever follows, so the 10-minute load stops there (at 100x: under a second)."""
    said = io.StringIO()
    # each answer takes 8 s of the server's time: some are in flight when the load stops
    async with FakeOpenAI(metrics=idle_body(0.04), token_gap_s=0.02) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=600.0, rate=1.0, interval_s=2.0, time_scale=100.0),
                             gpu_reader=None, progress=said)
    assert_reported(doc, tmp_path / "out")
    assert said.getvalue() == f"stopping early: {LEAK_REASON} (--full-duration runs on)\n"
    assert doc["verdict"] == "no-go" and doc["reasons"][0].startswith("a leak: ")
    run_ = doc["run"]
    assert (run_["stopped"], run_["stopped_reason"]) == ("leak", LEAK_REASON)
    assert run_["load_s"] < 120.0  # of 600
    requests = doc["requests"]
    assert requests["ok"] == requests["first_attempts"] > 0 and requests["cut"] == 0  # drained
    (engine,) = doc["kv"]["engines"]
    assert engine["after"] == {"used_blocks": 40.0, "blocks_total": 1000, "usage": 0.04,
                               "idle": True}  # read again after the load
    assert [a["lever"] for a in doc["advice"]] == ["leak"]


async def test_with_full_duration_a_leak_runs_on_and_the_terminal_line_says_leak(
        tmp_path: Path) -> None:
    terminal = Terminal()
    async with FakeOpenAI(metrics=idle_body(0.04)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=200.0, rate=1.0, interval_s=2.0, time_scale=150.0,
                                  full_duration=True), gpu_reader=None, progress=terminal)
    assert_reported(doc, tmp_path / "out")
    run_ = doc["run"]
    assert (run_["stopped"], run_["stopped_reason"]) == ("duration", None)
    assert run_["load_s"] >= 200.0 and doc["settings"]["full_duration"] is True
    assert doc["verdict"] == "no-go" and doc["requests"]["first_attempts"] > 100
    assert [reason.partition(":")[0] for reason in doc["reasons"]] == ["a leak"]  # all answered
    lines = terminal.getvalue()
    assert "stopping early" not in lines
    assert re.search(r"\| KV 4% \| GPU - KV LEAK latency \w+\?\x1b\[K", lines), repr(lines)


async def test_a_stall_cuts_the_requests_in_flight_and_reads_no_floor_after(
        tmp_path: Path) -> None:
    """The fixture's engine holds 30 requests and 149 waiting without a token: STALLED. The
    API never answers, so what was sent is cut at once, not waited for."""
    said = io.StringIO()
    async with FakeOpenAI(hang=True) as api, FaultServer() as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=600.0,
                                  rate=1.0), gpu_reader=None, progress=said)
    assert_reported(doc, tmp_path / "out")
    run_ = doc["run"]
    assert run_["stopped"] == "stalled" and run_["load_s"] < 60.0
    assert run_["stopped_reason"].startswith("twin-llama 0: STALLED (KV pool 98% full with "
                                             "149 requests waiting: no token generated for ")
    assert said.getvalue() == (f"stopping early: {run_['stopped_reason']} "
                               "(--full-duration runs on)\n")
    requests = doc["requests"]
    assert requests["cut"] == requests["first_attempts"] > 0 and requests["ok"] == 0
    # cut when the load stopped, not after the 60 s drain: each ended within the load
    # (the first was sent on the first arrival after its start)
    lines = logged(tmp_path / "out")
    assert {line["status"] for line in lines} == {"cut"}
    ended = max(line["t"] + line["total_s"] for line in lines) - min(line["t"] for line in lines)
    assert ended <= run_["load_s"] + 10.0  # a quarter second of ours for the cutting
    (engine,) = doc["kv"]["engines"]
    assert engine["after"] is None and engine["before"]["idle"] is False
    stall = doc["stall"]
    assert (stall["state"], stall["engine"]) == ("stalled", "twin-llama 0")
    assert 0.0 < stall["first_s"] <= run_["load_s"]  # since the load began
    assert (doc["verdict"], doc["reasons"]) == ("no-go", [
        f"stalled: twin-llama 0: {stall['reason']}"])
    assert doc["advice"] == [{
        "lever": "stall",
        "action": f"the engine stopped making progress: {stall['reason']}; its log says why "
                  "(a hung worker, a wedged scheduler); record it (kvtop record), report it "
                  "upstream, restart the server",
        "figures": {"engine": "twin-llama 0", "reason": stall["reason"]}}]
    assert kvtop_tasks() == []


async def test_with_full_duration_a_stall_runs_on_and_the_terminal_line_says_stall(
        tmp_path: Path) -> None:
    terminal = Terminal()
    async with FakeOpenAI(hang=True) as api, FaultServer() as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=100.0,
                                  rate=1.0, time_scale=150.0, drain_s=0.0, full_duration=True),
                             gpu_reader=None, progress=terminal)
    assert_reported(doc, tmp_path / "out")
    assert doc["run"]["stopped"] == "duration" and doc["run"]["load_s"] >= 100.0
    assert doc["verdict"] == "no-go" and doc["reasons"][0].startswith("stalled: ")
    # and after a minute of load with no answer, that is a reason of its own
    assert doc["reasons"][1:] == [
        f"the server answered none of the {doc['requests']['first_attempts']} requests in "
        f"{doc['run']['load_s'] / 60:.1f} min of load"]
    lines = terminal.getvalue()
    assert re.search(r"\| KV 98% \| GPU - KV \S+ latency \S+ STALL\x1b\[K", lines), repr(lines)


async def test_ctrl_c_cuts_the_load_and_reports_what_was_gathered(tmp_path: Path) -> None:
    """Ctrl-C once requests.jsonl shows 5 answers (it is written as they come): what is in
    flight then (each answer takes 8 s of the server's time) is cut, not waited for."""
    log = tmp_path / "out/requests.jsonl"

    async def press_ctrl_c() -> None:
        while not log.exists() or len(log.read_bytes().splitlines()) < 5:
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    async with FakeOpenAI(metrics=idle_body(0.0), token_gap_s=0.05) as api:
        pressing = asyncio.create_task(press_ctrl_c())
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=3600.0, rate=4.0), gpu_reader=None, progress=None)
        await pressing
    assert_reported(doc, tmp_path / "out")
    run_ = doc["run"]
    assert (run_["stopped"], run_["stopped_reason"]) == ("interrupted", None)
    assert run_["load_s"] < 600
    requests = doc["requests"]
    assert requests["ok"] >= 5 and requests["cut"] > 0
    assert requests["ok"] + requests["cut"] == requests["first_attempts"]
    (engine,) = doc["kv"]["engines"]
    assert engine["after"] is None  # no floor read after an interruption


async def test_watch_only_sends_nothing_and_reports_the_servers_own_view(
        tmp_path: Path) -> None:
    """An idle server watched: its floor before and after, no request of ours, no latency
    seen (the server exported none), so no verdict that says what is missing. It exports no
    KV gauge either: the terminal line shows a dash for it."""
    no_gauge = b"".join(line + b"\n" for line in vllm(0.0).splitlines()
                        if not line.startswith(b"vllm:kv_cache_usage_perc"))
    terminal = Terminal()
    async with FaultServer(bodies=[no_gauge]) as metrics:
        url = metrics.url()
        doc = await rehearse(RehearsalSettings(
            metrics=Target(url=url), api_base=None, duration_s=45.0, out_dir=tmp_path / "out",
            watch_only=True, interval_s=1.0, time_scale=FAST), gpu_reader=None,
            progress=terminal)
        scrapes = metrics.hits
    assert_reported(doc, tmp_path / "out")
    assert doc["verdict"] == "no-verdict" and doc["requests"] is None
    assert doc["missing"][-1] == "the server exported no TTFT observations in the first third"
    assert doc["target"] == {"api": None, "metrics": url, "model": None, "max_model_len": None,
                             "server": {"kind": "vllm", "version": "0.33.0",
                                        "version_inferred": False}}
    assert doc["settings"] == {
        "workload": None, "rate": None, "concurrency": None, "duration_s": 45.0,
        "interval_s": 1.0, "request_timeout_s": 300.0, "retries": 1, "strict": False,
        "watch_only": True, "api": "completions", "token_ids": False, "time_scale": FAST,
        "max_error_rate": 0.01, "full_duration": False}
    run_ = doc["run"]
    assert run_["failed_across_restarts"] is None
    assert scrapes - 1 <= run_["scrapes"] <= scrapes  # the last may be cut by the end
    assert 45.0 <= run_["load_s"] < 50.0 and run_["stopped"] == "duration"
    (engine,) = doc["kv"]["engines"]
    assert engine["before"] is not None and engine["after"] is not None
    assert doc["files"]["requests"] is None and doc["files"]["gpus"] is None
    assert not (tmp_path / "out/requests.jsonl").exists()
    assert doc["server"]["expected_hit_rate"] is None and doc["advice"] == []
    lines = terminal.getvalue()
    assert re.search(r"\r[^|]+ \| KV - \| GPU - KV - latency -\x1b\[K", lines), repr(lines)


async def test_the_settings_in_the_report_are_the_ones_the_run_used(tmp_path: Path) -> None:
    """A chat run with its own numbers: the report says them, and every request went to
    the chat API."""
    out = tmp_path / "out"
    async with FakeOpenAI(metrics=idle_body(0.0)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", out, duration_s=5.0,
                                  chat=True, retries=0, concurrency=3,
                                  workload="shared-prefix", strict=True,
                                  request_timeout_s=20.0, max_error_rate=0.5),
                             gpu_reader=None, progress=None)
    assert_reported(doc, out)
    assert doc["settings"] == {
        "workload": "shared-prefix", "rate": 4.0, "concurrency": 3, "duration_s": 5.0,
        "interval_s": 1.0, "request_timeout_s": 20.0, "retries": 0, "strict": True,
        "watch_only": False, "api": "chat", "token_ids": False, "time_scale": FAST,
        "max_error_rate": 0.5, "full_duration": False}
    assert doc["requests"]["ok"] > 0 and set(api.paths) == {"/v1/chat/completions"}
    assert doc["server"]["expected_hit_rate"] > 0  # the shared prefixes' expected hits
    token_ids = await _rehearse_with(tmp_path / "ids", duration_s=5.0, token_ids=True)
    assert token_ids["settings"]["token_ids"] is True
    assert token_ids["requests"]["ok"] == token_ids["requests"]["first_attempts"] > 0


async def test_requests_failing_around_a_restart_are_counted_as_failing_across_it(
        tmp_path: Path) -> None:
    """The server restarts (its counters start again) during the load, and no request is
    ever answered: each times out after 2 s. Those sent from 3 s before the restart (their
    2 s and a scrape interval's 1 s) to 1 s after it count: 4 s of requests at 4 a second."""
    bodies = ([vllm(0.0, tokens=500.0)] * 3
              + [vllm(0.1, running=1, tokens=600.0 + 100 * i) for i in range(6)]
              + [vllm(0.1, running=1, tokens=100.0 * i) for i in range(1, 11)]
              + [vllm(0.0, tokens=1000.0)])
    async with FakeOpenAI(hang=True) as api, FaultServer(bodies=bodies) as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=40.0,
                                  request_timeout_s=2.0, retries=0), gpu_reader=None,
                             progress=None)
    assert_reported(doc, tmp_path / "out")
    (restart,) = doc["run"]["restarts_s"]
    assert 4.0 <= restart <= 36.0 and isinstance(restart, float)  # to the ms, not the second
    # seconds from the load's start (when the first request was sent) to the read that saw
    # the counters start again (the tenth; the recording stamps it in the server's time)
    first = min(logged(tmp_path / "out"), key=lambda line: line["t"])
    run_start = first["time"] - (first["t"] + first["queued_s"]) / FAST  # unix seconds
    read = read_recording(tmp_path / "out/recording.jsonl.gz").scrapes[9].t - run_start
    assert restart == pytest.approx(read - first["t"], abs=2.0)  # 50 ms of ours
    requests = doc["requests"]
    assert requests["timeouts"] > 100 and requests["ok"] == 0
    assert 14 <= doc["run"]["failed_across_restarts"] <= 18, doc["run"]


async def test_the_targets_token_goes_with_every_request_and_nowhere_else(
        tmp_path: Path) -> None:
    async with FakeOpenAI(metrics=idle_body(0.0)) as api:
        config = dataclasses.replace(
            fast(api.url, api.url + "/metrics", tmp_path / "out", duration_s=5.0),
            metrics=Target(url=api.url + "/metrics", token=Secret("tok-Zq9")))
        doc = await rehearse(config, gpu_reader=None, progress=None)
    assert_reported(doc, tmp_path / "out")
    assert doc["requests"]["ok"] > 0
    assert set(api.authorizations) == {"Bearer tok-Zq9"}  # /v1/models and each completion
    assert {auth for _, auth in api.metrics_requests} == {"Bearer tok-Zq9"}
    for path in (tmp_path / "out").iterdir():
        assert b"tok-Zq9" not in path.read_bytes(), path


async def test_a_stall_stops_the_load_early_without_a_progress_line_too(tmp_path: Path) -> None:
    """--quiet (no progress stream): the stop does not wait on a line to say it."""
    async with FakeOpenAI(hang=True) as api, FaultServer() as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=600.0,
                                  rate=1.0), gpu_reader=None, progress=None)
    assert doc["run"]["stopped"] == "stalled" and doc["run"]["load_s"] < 60.0


# -- what the reports above leave open: each setting reaching the part that uses it, the
# boundaries of the waits, the terminal line after the load, and what the run leaves behind


def kvtop_tasks() -> list[str]:
    """kvtop's own tasks still pending in this loop: a finished run leaves none. (Their code
    lies in the package's folder: a checkout named kvtop holds the tests' code too.)"""
    package = str(Path(kvtop.__file__).parent) + os.sep
    return sorted(getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks()
                  if not task.done() and getattr(getattr(task.get_coro(), "cr_code", None),
                                                 "co_filename", "").startswith(package))


def logged(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_bytes().splitlines()]


async def test_at_most_the_concurrency_is_in_flight_and_the_rest_is_dropped(
        tmp_path: Path) -> None:
    """3 in flight at most, at 4 a second to a server that never answers: the first 3 are
    sent (and cut at the end: no drain asked), every later one dropped, none queued."""
    async with FakeOpenAI(hang=True, metrics=idle_body(0.0)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=10.0, concurrency=3, drain_s=0.0),
                             gpu_reader=None, progress=None)
        held = (api.max_in_flight, len(api.bodies))
    assert_reported(doc, tmp_path / "out")
    assert held == (3, 3)
    requests = doc["requests"]
    assert requests["first_attempts"] > 10
    assert (requests["cut"], requests["dropped"]) == (3, requests["first_attempts"] - 3)
    assert doc["settings"]["concurrency"] == 3 and kvtop_tasks() == []
    # none answered, and 10 s are too short to call that a NO-GO: not enough evidence
    assert (doc["verdict"], doc["missing"][-1]) == (
        "no-verdict", f"no request was answered yet ({requests['first_attempts']} sent)")


async def _driven(out: Path, **extra: Any) -> tuple[dict[str, Any], list[Any]]:
    """A short run against an idle server that answers at once: its report and the prompts
    the server was sent."""
    async with FakeOpenAI(metrics=idle_body(0.0)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", out, **extra),
                             gpu_reader=None, progress=None)
    assert_reported(doc, out)
    return doc, [body["prompt"] for body in api.bodies]


def planned(out: Path) -> list[tuple[Any, ...]]:
    """Each request as the workload planned it, by id: its class, its arrival after the
    first one's, its prompt and answer lengths."""
    lines = sorted((line for line in logged(out) if line["attempt"] == 1),
                   key=lambda line: line["id"])
    return [(line["cls"], round(line["t"] - lines[0]["t"], 3), line["planned_prompt_tokens"],
             line["max_tokens"]) for line in lines]


async def test_the_seed_chooses_the_requests_and_their_prompts(tmp_path: Path) -> None:
    """Two runs of seed 7 plan the same requests (how many fit in the time may differ),
    seed 0 (the default) others; and the words of seed 7's first prompt are seed 7's."""
    (_, first), _, _ = [await _driven(tmp_path / name, duration_s=8.0, **seed)
                        for name, seed in (("a", {"seed": 7}), ("b", {"seed": 7}), ("c", {}))]
    plans = [planned(tmp_path / name) for name in "abc"]
    common = min(len(plan) for plan in plans)
    assert common >= 20
    assert plans[0][:common] == plans[1][:common] != plans[2][:common]
    assert PromptMaker(seed=7).make(plans[0][0][2]) in first


async def test_prompts_go_as_token_ids_when_asked(tmp_path: Path) -> None:
    doc, prompts = await _driven(tmp_path / "out", duration_s=5.0, token_ids=True)
    assert doc["settings"]["token_ids"] is True and len(prompts) == doc["requests"]["sent"] > 0
    assert all(isinstance(p, list) and p and all(isinstance(i, int) for i in p)
               for p in prompts)
    _, text = await _driven(tmp_path / "text", duration_s=5.0)
    assert all(isinstance(p, str) for p in text)


async def test_a_trace_is_replayed_at_the_rate_asked_within_the_models_context(
        tmp_path: Path) -> None:
    """5 requests a second apart (1.25 a second over their 4 s), replayed at 2.5 a second:
    twice as fast, 0.5 s apart. The 3000-token prompts are cut to fit the model's 2048 tokens
    with their answers (100 tokens, and one spare): 1947."""
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{40 + i}.0000000,3000,100\n" for i in range(5)))
    doc, _ = await _driven(tmp_path / "out", duration_s=5.0, workload=f"trace:{trace}",
                           rate=2.5)
    plan = planned(tmp_path / "out")
    assert len(plan) >= 7 and doc["settings"]["workload"] == f"trace:{trace}"
    # a lap of the trace lasts its 4 s and a mean gap (0.8 s): at twice the speed, 2.4 s
    assert [at for _, at, _, _ in plan[:7]] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.4, 2.9]
    assert {(cls, prompt, answer) for cls, _, prompt, answer in plan} == {
        ("trace-medium", 1947, 100)}


async def test_the_shared_prefix_expects_the_hits_the_models_context_allows(
        tmp_path: Path) -> None:
    """Half of the 2048-token context is shared (1024 tokens) before questions of 16 to 128
    tokens: 1024 of 1096 prompt tokens a hit on average."""
    doc, _ = await _driven(tmp_path / "out", duration_s=5.0, workload="shared-prefix")
    assert doc["server"]["expected_hit_rate"] == round(1024 / 1096, 4) == 0.9343


async def test_with_no_retries_a_failed_request_is_not_asked_again(tmp_path: Path) -> None:
    """(By default a 503 is asked once more.)"""
    async with FakeOpenAI(metrics=idle_body(0.0), fail_status={2: 500, 5: 503}) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=10.0, retries=0), gpu_reader=None, progress=None)
        sent = len(api.bodies)
    requests = doc["requests"]
    assert (requests["failed"], requests["retries"]) == (2, {"sent": 0, "ok": 0})
    assert requests["sent"] == requests["first_attempts"] == sent == len(logged(tmp_path / "out"))


async def test_metrics_are_read_narrowed_unless_all_are_asked_for(tmp_path: Path) -> None:
    """The watcher asks for the families it reads (the narrowed /metrics/?name[]=...), or
    for the whole page with full_metrics."""
    paths = {}
    for name, full in (("narrow", False), ("full", True)):
        async with FakeOpenAI(metrics=idle_body(0.0)) as api:
            doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / name,
                                      duration_s=5.0, full_metrics=full),
                                 gpu_reader=None, progress=None)
            paths[name] = {path.partition("?")[0] for path, _ in api.metrics_requests}
        assert doc["run"]["scrapes"] > 3
    assert paths == {"narrow": {"/metrics/"}, "full": {"/metrics"}}


async def test_insecure_reaches_a_self_signed_server_for_the_api_and_its_metrics(
        tmp_path: Path, self_signed: ssl.SSLContext) -> None:
    async with FakeOpenAI(metrics=idle_body(0.0), ssl_context=self_signed) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=5.0, insecure=True), gpu_reader=None, progress=None)
    assert api.url.startswith("https://")
    assert doc["requests"]["ok"] == doc["requests"]["sent"] > 0
    assert doc["run"]["failed_scrapes"] == 0 and doc["run"]["scrapes"] > 3


async def test_the_leak_detectors_settings_decide_what_counts_as_held(tmp_path: Path) -> None:
    """40 blocks held at idle are a LEAK by default (above), not with 50 blocks the least
    that counts: the run goes its whole time, and the free-KV criterion judged by the same
    numbers says the threshold it used."""
    async with FakeOpenAI(metrics=idle_body(0.04)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=200.0, rate=1.0, interval_s=2.0, time_scale=100.0,
                                  leak_params=LeakParams(residual_min_blocks=50.0)),
                             gpu_reader=None, progress=None)
    assert (doc["run"]["stopped"], doc["run"]["stopped_reason"]) == ("duration", None)
    kv = doc["criteria"]["kv_free"]
    assert kv["state"] != "fail" and "leak" not in [a["lever"] for a in doc["advice"]]
    assert kv["figures"]["engines"][0]["residual_threshold_blocks"] == 50.0


async def test_an_engine_without_a_name_is_named_engine_when_the_run_stops(
        tmp_path: Path) -> None:
    said = io.StringIO()
    async with FakeOpenAI(metrics=idle_body(0.04, model="", engine="")) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=600.0, rate=1.0, interval_s=2.0, time_scale=100.0),
                             gpu_reader=None, progress=said)
    reason = LEAK_REASON.replace("m 0: ", "engine: ")
    assert (doc["run"]["stopped"], doc["run"]["stopped_reason"]) == ("leak", reason)
    assert said.getvalue() == f"stopping early: {reason} (--full-duration runs on)\n"


async def test_strict_makes_gpu_memory_growing_alone_no_go(tmp_path: Path) -> None:
    """GPU memory growing is one soft signal: GO by default (two are needed), NO-GO with
    --strict (GPU or latency alone)."""
    verdicts = {}
    for strict in (False, True):
        async with FakeOpenAI(metrics=idle_body(0.0)) as api:
            doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / str(strict),
                                      duration_s=60.0, strict=strict),
                                 gpu_reader=GrowingGpu(sample_gpus()[:1]), progress=None)
        assert doc["criteria"]["gpu_memory"]["state"] == "fail"
        verdicts[strict] = (doc["verdict"], doc["failed"], doc["settings"]["strict"])
    # a machine loaded enough to slow the fake server's answers fails latency too: two soft
    # signals, NO-GO whether strict or not, and the run says both
    both = ["gpu_memory", "latency"]
    alone = ("go", ["gpu_memory"], False)
    lenient = ("no-go", both, False) if verdicts[False][1] == both else alone
    assert verdicts[False] == lenient
    assert verdicts[True][0::2] == ("no-go", True) and verdicts[True][1][0] == "gpu_memory"


def busy_for_ever(count: int) -> list[bytes]:
    """3 idle reads, then one request running for ever, answering tokens at every read."""
    return [vllm(0.0)] * 3 + [vllm(0.1, running=1, tokens=10.0 * i) for i in range(1, count)]


async def test_after_the_load_the_terminal_line_says_what_the_run_waits_for(
        tmp_path: Path) -> None:
    """Requests that never finish are waited for 60 s (the drain): the line says how many
    and for how long at most; then the server, busy for ever, for 65 s more: the line says
    so. (At 40x: a second and a half each, a line every second.)"""
    terminal = Terminal()
    async with FakeOpenAI(hang=True) as api, FaultServer(bodies=busy_for_ever(400)) as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=10.0,
                                  concurrency=3), gpu_reader=None, progress=terminal)
        written = terminal.getvalue()
        await asyncio.sleep(1.5)  # no line after the report
    assert terminal.getvalue() == written and kvtop_tasks() == []
    assert doc["requests"]["cut"] == 3 and doc["kv"]["engines"][0]["after"]["idle"] is False
    lines = written.split("\r")
    assert any(re.fullmatch(r"load done \(0:00:10\); draining 3 in flight, "
                            r"(0:00:(?!00)[0-5]\d|0:01:00) at most"
                            r" \| 0 done, 0 failed, \d+ dropped, 0\.00 req/s \| .*\x1b\[K",
                            line) for line in lines), lines
    assert any(line.startswith("load done; waiting for the server to go idle for the last "
                               "reading | 0 done, 0 failed, ") for line in lines), lines


async def test_the_floor_before_is_the_third_idle_read_and_the_peak_is_the_loads(
        tmp_path: Path) -> None:
    """Three reads before the load (the wait allows five intervals, 20 s), each holding one
    block more: the floor before is the third. Busy for 15 reads (the load has 6 at most),
    then idle holding half its pool and more at each read: the floor after is the third idle
    read after the load, and the peak is the load's, not the idle floor's above it."""
    bodies = ([vllm(0.001), vllm(0.002), vllm(0.003)]
              + [vllm(0.31234, running=4, tokens=100.0 * i) for i in range(1, 16)]
              + [vllm(usage, tokens=1600.0) for usage in (0.5, 0.6, 0.7, 0.8)])
    async with FakeOpenAI() as api, FaultServer(bodies=bodies) as metrics:
        metrics_url = metrics.url()
        doc = await rehearse(fast(api.url, metrics_url, tmp_path / "out", duration_s=20.0,
                                  interval_s=4.0), gpu_reader=None, progress=None)
    header = read_recording(tmp_path / "out/recording.jsonl.gz").header
    assert (header["interval_s"], header["targets"]) == (4.0, [metrics_url])
    assert doc["kv"] == {"engines": [{
        "model": "m", "engine": "0",
        "before": {"used_blocks": 3.0, "blocks_total": 999, "usage": 0.003, "idle": True},
        "after": {"used_blocks": 699.3, "blocks_total": 999, "usage": 0.7, "idle": True},
        "peak_usage": 0.3123}]}


async def test_slow_first_reads_are_waited_for_in_wall_seconds(tmp_path: Path) -> None:
    """Each read takes 0.2 s: 8 s of the server's time at 40x, more than the whole wait
    for the first read if it were in the server's time (15 s of ours)."""
    async with FakeOpenAI() as api, FaultServer(bodies=[vllm(0.0)]) as metrics:
        doc = await rehearse(fast(api.url, metrics.url("slow", "s=0.2"), tmp_path / "out",
                                  duration_s=20.0), gpu_reader=None, progress=None)
    assert doc["run"]["scrapes"] >= 3 and doc["run"]["failed_scrapes"] == 0
    assert doc["kv"]["engines"][0]["before"]["idle"] is True


async def test_reads_slower_than_the_scrape_timeout_fail(tmp_path: Path) -> None:
    """Once the load is under way the server takes 0.5 s to answer /metrics: past the 0.2 s
    asked for (the default would wait 2 s)."""
    async with FakeOpenAI() as api, FaultServer(bodies=[vllm(0.0)]) as metrics:
        async def slow_down() -> None:
            while metrics.hits < 5:
                await asyncio.sleep(0.005)
            metrics.mode = "slow"

        slowing = asyncio.create_task(slow_down())
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=20.0,
                                  scrape_timeout_s=0.2), gpu_reader=None, progress=None)
        await slowing
    assert doc["run"]["scrapes"] >= 5 and doc["run"]["failed_scrapes"] > 0
    assert doc["kv"]["engines"][0]["after"] is None  # no read after the load


async def test_the_ten_most_common_errors_are_reported(tmp_path: Path) -> None:
    """12 requests refused, each in words of its own: ten of them in the report."""
    failing = {number: 500 for number in range(1, 13)}
    async with FakeOpenAI(metrics=idle_body(0.0), fail_status=failing) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=10.0, retries=0), gpu_reader=None, progress=None)
    errors = doc["requests"]["errors"]
    assert doc["requests"]["failed"] == 12 and len(errors) == 10
    assert set(errors.items()) < {(f"HTTP 500: refused {n}", 1) for n in failing}


def queued(step: int) -> bytes:
    """A busy engine with 2 requests waiting, its tokens flowing, and its prefix cache
    hitting 1 query in 10 (counters at their ``step``-th reading)."""
    labels = 'engine="0",model_name="m"'
    body = vllm(0.5, running=8, tokens=100.0 * step).replace(
        f"vllm:num_requests_waiting{{{labels}}} 0.0".encode(),
        f"vllm:num_requests_waiting{{{labels}}} 2.0".encode())
    return body + (f"vllm:prefix_cache_queries_total{{{labels}}} {1000.0 * step}\n"
                   f"vllm:prefix_cache_hits_total{{{labels}}} {100.0 * step}\n").encode()


async def test_a_no_go_run_advises_on_its_queues_and_its_prefix_cache(tmp_path: Path) -> None:
    """Failed requests make it NO-GO; the advice also names the queue (with the model's
    context) and a hit rate of 10 % where the shared-prefix workload expects 93 %."""
    bodies = [vllm(0.0)] * 3 + [queued(step) for step in range(1, 300)]
    async with FakeOpenAI(fail_status={1: 500, 2: 500, 3: 500}) as api, FaultServer(
            bodies=bodies) as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=20.0,
                                  workload="shared-prefix", retries=0),
                             gpu_reader=None, progress=None)
    server = doc["server"]
    assert doc["verdict"] == "no-go" and doc["stall"]["state"] != "stalled"
    assert doc["advice"] == [
        {"lever": "max-num-seqs",
         "action": "queues and preemptions at moderate context: cap --max-num-seqs (or the "
                   "clients' concurrency), or raise --gpu-memory-utilization",
         "figures": {"preemptions_per_min": None, "waiting_p90": 2.0, "running_max": 8.0,
                     "prompt_p90_tokens": 3.0, "max_model_len": 2048}},
        {"lever": "prefix-caching",
         "action": "a low hit rate on a shared-prefix workload: prefix caching is off "
                   "(--enable-prefix-caching) or the prompts do not share a prefix",
         "figures": {"hit_rate": 0.1, "expected_hit_rate": 0.934}},
        {"lever": "errors", "action": "requests failed: the server's log says why",
         "figures": {"error_rate": doc["requests"]["error_rate"],
                     "most_common": "HTTP 500: refused 1"}}]
    # the prompts' length as the server counted it in its answers (3 tokens each)
    assert (server["hit_rate"], server["waiting_p90"], server["prompt_p90"],
            server["expected_hit_rate"]) == (0.1, 2.0, 3.0, 0.9343)


async def test_an_api_that_never_lists_its_models_is_refused_after_ten_seconds(
        tmp_path: Path) -> None:
    """Ten seconds of ours, whatever the time scale: a hung server is not waited on for
    ever, and nothing is sent."""
    async with FaultServer(mode="hang") as hung:
        with pytest.raises(CannotRun) as refused:
            await rehearse(fast(hung.base_url, hung.url(), tmp_path / "out"),
                           gpu_reader=None, progress=None)
        asked, base = [request.path for request in hung.requests], hung.base_url
    assert str(refused.value) == (f"cannot read {base}/v1/models: "
                                  "no complete answer within 10 s")
    assert asked == ["/v1/models"]


def with_ttft(step: int) -> bytes:
    """A busy engine whose TTFT histogram gains 10 answers a read: half within 0.1 s, 9 in
    10 within 0.5 s, all within 1 s."""
    labels = 'engine="0",model_name="m"'
    count = 10.0 * step
    buckets = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {count * share}\n'
        for le, share in (("0.1", 0.5), ("0.5", 0.9), ("1.0", 1.0), ("+Inf", 1.0)))
    return vllm(0.1, running=2, tokens=100.0 * step) + (
        buckets + f"vllm:time_to_first_token_seconds_sum{{{labels}}} {count * 0.2}\n"
        f"vllm:time_to_first_token_seconds_count{{{labels}}} {count}\n").encode()


async def test_watch_only_judges_latency_by_the_servers_ttft_histogram(tmp_path: Path) -> None:
    """The same 10 % of answers slower than 0.5 s throughout: not rising."""
    async with FaultServer(bodies=[with_ttft(step) for step in range(1, 500)]) as metrics:
        doc = await rehearse(RehearsalSettings(
            metrics=Target(url=metrics.url()), api_base=None, duration_s=45.0,
            out_dir=tmp_path / "out", watch_only=True, interval_s=1.0, time_scale=FAST),
            gpu_reader=None, progress=None)
    latency = doc["criteria"]["latency"]
    assert (latency["state"], latency["figures"]["source"]) == (
        "ok", "the server's TTFT histogram")
    assert latency["figures"]["ttft_s"] == {"first": {"p50": 0.1, "p90": 0.5, "p99": 0.95},
                                            "last": {"p50": 0.1, "p90": 0.5, "p99": 0.95}}
    assert latency["figures"]["slow_share"]["first"] == latency["figures"]["slow_share"][
        "last"] == 0.1


async def test_watch_only_reads_three_times_after_the_load_busy_or_not(tmp_path: Path) -> None:
    """A busy server watched, its pool one block fuller at every read: the peak of the load
    is its last read, the floor after the third read after it (however busy: watching waits
    for three reads, not for idle ones)."""
    bodies = [vllm(step / 1000, running=2, tokens=100.0 * step) for step in range(1, 200)]
    async with FaultServer(bodies=bodies) as metrics:
        doc = await rehearse(RehearsalSettings(
            metrics=Target(url=metrics.url()), api_base=None, duration_s=20.0,
            out_dir=tmp_path / "out", watch_only=True, interval_s=2.0, time_scale=FAST),
            gpu_reader=None, progress=None)
    (engine,) = doc["kv"]["engines"]
    assert engine["before"]["usage"] == 0.003
    assert engine["after"]["idle"] is False
    assert round((engine["after"]["usage"] - engine["peak_usage"]) * 1000) == 3


async def test_a_report_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    """The --out folder is removed while the load runs: the run ends in a clear message."""
    out = tmp_path / "out"

    async def remove_the_folder() -> None:
        while not (out / "requests.jsonl").exists():
            await asyncio.sleep(0.005)
        shutil.rmtree(out)

    async with FakeOpenAI(metrics=idle_body(0.0)) as api:
        removing = asyncio.create_task(remove_the_folder())
        with pytest.raises(BadUsage) as refused:
            await rehearse(fast(api.url, api.url + "/metrics", out, duration_s=5.0),
                           gpu_reader=None, progress=None)
        await removing
    assert str(refused.value) == f"cannot write the report to {out}: No such file or directory"


async def test_one_read_is_enough_to_start_and_failing_reads_do_not_stop_the_run(
        tmp_path: Path) -> None:
    """The server answers /metrics once, then only with errors: the run starts on that one
    read (the first wait asks for no more), goes its time and reports the failed reads."""
    async with FakeOpenAI() as api, FaultServer(bodies=[vllm(0.0)]) as metrics:
        async def break_down() -> None:
            while metrics.hits < 1:
                await asyncio.sleep(0.001)
            metrics.mode = "error500"

        breaking = asyncio.create_task(break_down())
        started = time.monotonic()
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=20.0),
                             gpu_reader=None, progress=None)
        took = time.monotonic() - started
        await breaking
    run_ = doc["run"]
    assert (run_["scrapes"], run_["stopped"]) == (1, "duration") and run_["failed_scrapes"] > 0
    # about 2 s: not the 15 s (of ours) the first wait allows for a read, which waiting for
    # a second read would have taken
    assert took < 7.5


async def test_metrics_that_never_answer_are_refused_after_fifteen_seconds(
        tmp_path: Path) -> None:
    """Read with a 30 s timeout, a /metrics that never answers has not even failed when the
    15 s (of ours) for a first read are up: the refusal says there was no answer."""
    async with FakeOpenAI() as api, FaultServer(mode="hang") as metrics:
        url = metrics.url()
        with pytest.raises(CannotRun) as refused:
            await rehearse(fast(api.url, url, tmp_path / "out", scrape_timeout_s=30.0),
                           gpu_reader=None, progress=None)
    assert str(refused.value) == f"cannot read {url}: no answer"
    assert api.bodies == []


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """The C locale's ASCII as the default encoding of text files (where a system is set up
    so), for this test only."""
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


async def test_the_text_report_is_utf_8_whatever_the_locale(tmp_path: Path,
                                                            ascii_locale: None) -> None:
    """A model named in letters ASCII lacks, on a system whose default encoding is ASCII."""
    async with FakeOpenAI(metrics=idle_body(0.0), models=("modèle",)) as api:
        doc = await rehearse(fast(api.url, api.url + "/metrics", tmp_path / "out",
                                  duration_s=5.0), gpu_reader=None, progress=None)
    text = (tmp_path / "out/report.txt").read_bytes().decode("utf-8")
    assert doc["target"]["model"] == "modèle" and ", model modèle" in text
    assert text == file_text(render_text(doc))


async def test_a_server_that_never_goes_idle_is_read_for_a_minute_and_five_intervals_after(
        tmp_path: Path) -> None:
    """Busy for ever, its pool one block fuller at every read (every 20 s): after the load
    the run waits 60 s and five intervals (160 s) for it to go idle, 8 reads, then reports
    the last of them as the floor after."""
    bodies = [vllm(step / 1000, running=2, tokens=100.0 * step) for step in range(1, 100)]
    async with FakeOpenAI() as api, FaultServer(bodies=bodies) as metrics:
        doc = await rehearse(fast(api.url, metrics.url(), tmp_path / "out", duration_s=40.0,
                                  rate=0.5, interval_s=20.0, time_scale=100.0),
                             gpu_reader=None, progress=None)
    (engine,) = doc["kv"]["engines"]
    assert engine["before"]["usage"] == 0.003 and engine["after"]["idle"] is False
    # 8 reads, or 7 where the reads fall a little later than every 20 s on a loaded machine
    assert round((engine["after"]["usage"] - engine["peak_usage"]) * 1000) in (7, 8)


async def test_watching_a_stalled_server_is_no_go_with_its_advice(tmp_path: Path) -> None:
    """No request of ours, so no errors to advise on: the stall alone."""
    async with FaultServer() as metrics:
        doc = await rehearse(RehearsalSettings(
            metrics=Target(url=metrics.url()), api_base=None, duration_s=600.0,
            out_dir=tmp_path / "out", watch_only=True, interval_s=1.0, time_scale=FAST),
            gpu_reader=None, progress=None)
    assert (doc["verdict"], doc["run"]["stopped"], doc["requests"]) == ("no-go", "stalled", None)
    assert [advice["lever"] for advice in doc["advice"]] == ["stall"]
