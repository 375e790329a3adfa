"""Headless commands as a script runs them, in this process (so the mutation runs see them):
JSON unless a person is at a terminal, the exit code of ``kvtop snapshot``, a long command
stopped by SIGTERM or its duration.

`kvtop snapshot` as a user runs it (a subprocess) against real HTTP servers on 127.0.0.1
that serve real scrapes and faults, all in one run: each target is reported right, in
bounded time, and the healthy ones are still right.

`kvtop snapshot` (the real command) against `kvtop sim` servers with each fault: what it
reports equals the simulator's ground truth at the moment /metrics was rendered.

`kvtop snapshot` (a subprocess, as a user runs it) on GPU exporters served on 127.0.0.1
with real bodies, beside a vLLM server on the same host: no flag tells kvtop what they are,
every GPU says where it is and whose it is, and a source that failed says so."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from typing import Any

import certifi
import pytest

from kvtop.cli import build_command_parser, main
from kvtop.collect.gpu import MIB
from kvtop.collect.live import DirectSource, PrometheusFeed
from kvtop.collect.prometheus import load_settings
from kvtop.collect.target import Target
from kvtop.commands.snapshot import (
    _watch_seconds,
    print_snapshot,
    read_states,
    snapshot,
    snapshot_exit_code,
    stream,
)
from kvtop.derive.tracker import TargetState
from kvtop.exits import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE
from kvtop.report import gpus
from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from kvtop.sim.simulation import Truth
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_prometheus import INSTANCES, FakePrometheus, answer
from tests.fakes.faultserver import FaultServer, closed_port, fixture, served_in_thread
from tests.scenarios.derived import vllm_08_idle
from tests.scenarios.gpu import DCGM_MIG, NVIDIA_SMI_H100, gpu_fixture
from tests.support.cli import kvtop_command, run_kvtop
from tests.support.paths import IDLE, LOAD
from tests.support.waiting import DEADLINE_S, eventually


def direct(targets: list[Target], *, interval_s: float, timeout_s: float | None,
           insecure: bool, full_metrics: bool = False) -> DirectSource:
    return DirectSource(targets, interval_s=interval_s, timeout_s=timeout_s,
                        insecure=insecure, narrow=not full_metrics)


async def collect_states(targets: list[Target], *, samples: int, **reading: Any
                         ) -> list[TargetState]:
    """The targets read as `kvtop snapshot` reads them."""
    return await read_states(direct(targets, **reading), samples=samples)


def run_snapshot(targets: list[Target], *, samples: int, as_json: bool | None,
                 with_gpus: bool, **reading: Any) -> int:
    """`kvtop snapshot` on these targets: what it prints, its exit code."""
    return snapshot(direct(targets, **reading), samples=samples, as_json=as_json,
                    with_gpus=with_gpus)

async def test_snapshot_reads_twice_for_rates_and_exits_0_when_all_are_up(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with FaultServer() as server:
        target = Target.from_spec(server.url())
        states = await collect_states([target], samples=2, interval_s=2.0, timeout_s=10,
                                      insecure=False)
    assert server.hits == 2
    [state] = states
    # the window is the reads' interval (2 s) less the load-dependent latency
    assert state.status == "up" and state.engines[0].window_s >= 1.0
    assert print_snapshot(states, as_json=True, with_gpus=False) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    [entry] = document["targets"]
    assert entry["status"] == "up" and entry["engines"][0]["rates"]["window_s"] > 0
    assert document["gpu_sources"] == []  # --no-gpu: NVML was not asked


async def test_one_unreadable_target_makes_the_exit_code_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with FaultServer() as server:
        targets = [Target.from_spec(server.url()),
                   Target.from_spec(f"127.0.0.1:{closed_port()}")]
        states = await collect_states(targets, samples=1, interval_s=0.05, timeout_s=10,
                                      insecure=False)
    assert [s.status for s in states] == ["up", "down"]
    assert snapshot_exit_code(states) == EXIT_UNREADABLE == 3
    assert snapshot_exit_code(states[:1]) == EXIT_OK == 0
    assert print_snapshot(states, as_json=True, with_gpus=False) == 3
    assert [t["status"] for t in json.loads(capsys.readouterr().out)["targets"]] == [
        "up", "down"]


async def test_one_read_gives_values_but_no_rates_and_no_wait() -> None:
    started = time.monotonic()
    async with FaultServer(bodies=[fixture()]) as server:
        states = await collect_states([Target.from_spec(server.url())], samples=1,
                                      interval_s=60.0, timeout_s=10, insecure=False)
    assert time.monotonic() - started < 30  # no interval after the last read
    assert server.hits == 1
    assert states[0].engines[0].running == 30 and states[0].engines[0].window_s is None


def test_kvtop_snapshot_prints_what_it_read_and_its_exit_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer()) as server:
        targets = [Target.from_spec(server.url()),
                   Target.from_spec(f"127.0.0.1:{closed_port()}")]
        code = run_snapshot(targets, samples=2, interval_s=0.5, timeout_s=10, insecure=False,
                            as_json=True, with_gpus=False)
        hits = server.hits
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_UNREADABLE and hits == 2
    up, down = document["targets"]
    assert (up["status"], down["status"]) == ("up", "down")
    assert up["engines"][0]["rates"]["window_s"] > 0  # read twice: rates filled in
    assert document["kvtop_snapshot"] == 1 and document["gpu_sources"] == []


def test_kvtop_snapshot_reads_every_metric_only_when_asked() -> None:
    with served_in_thread(FaultServer()) as server:
        target = Target.from_spec(server.url())
        for full in (False, True):
            asyncio.run(collect_states([target], samples=1, interval_s=1.0, timeout_s=10,
                                       insecure=False, full_metrics=full))
        reads = [r for r in server.requests if r.path.startswith("/metrics")]
    assert ["name[]" in r.query for r in reads] == [True, False]


def test_kvtop_snapshot_for_a_person_is_the_table_and_its_time_is_utc(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer()) as server:
        target = Target.from_spec(server.url(), name="gpu-one")
        assert run_snapshot([target], samples=1, interval_s=0.5, timeout_s=10, insecure=False,
                            as_json=False, with_gpus=False) == EXIT_OK
        table = capsys.readouterr().out
        assert "gpu-one" in table and not table.lstrip().startswith("{")
        states = asyncio.run(collect_states([target], samples=1, interval_s=0.5,
                                            timeout_s=10, insecure=False))
    print_snapshot(states, as_json=True, with_gpus=False)
    document = json.loads(capsys.readouterr().out)
    assert document["taken_at"].endswith("+00:00")


def test_kvtop_snapshot_asks_for_its_series_only_unless_told() -> None:
    with served_in_thread(FaultServer()) as server:
        target = Target.from_spec(server.url())
        asyncio.run(collect_states([target], samples=1, interval_s=0.5, timeout_s=10,
                                   insecure=False))
        run_snapshot([target], samples=1, interval_s=0.5, timeout_s=10, insecure=False,
                     as_json=True, with_gpus=False)
        run_snapshot([target], samples=1, interval_s=0.5, timeout_s=10, insecure=False,
                     as_json=True, with_gpus=False, full_metrics=True)
        reads = [r for r in server.requests if r.path.startswith("/metrics")]
    assert ["name[]" in r.query for r in reads] == [True, True, False]


def test_kvtop_snapshot_keeps_to_the_timeout_given_or_twice_the_interval(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(mode="slow", delay_s=3.0)) as server:
        target = Target.from_spec(server.url())
        assert run_snapshot([target], samples=1, interval_s=0.5, timeout_s=0.2, insecure=False,
                            as_json=True, with_gpus=False) == EXIT_UNREADABLE
        assert json.loads(capsys.readouterr().out)["targets"][0]["status"] == "timeout"
        assert run_snapshot([target], samples=1, interval_s=0.5, timeout_s=10.0,
                            insecure=False, as_json=True, with_gpus=False) == EXIT_OK
        capsys.readouterr()
        # no timeout given: twice the interval (4 s here), so a 3 s answer is read
        [state] = asyncio.run(collect_states([target], samples=1, interval_s=2.0,
                                             timeout_s=None, insecure=False))
    assert state.status == "up"


def test_kvtop_snapshot_reads_a_self_signed_server_only_when_insecure(
        self_signed: ssl.SSLContext, capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(ssl_context=self_signed)) as server:
        target = Target.from_spec(server.url().replace("http://", "https://"))
        codes = [run_snapshot([target], samples=1, interval_s=0.5, timeout_s=10,
                              insecure=insecure, as_json=True, with_gpus=False)
                 for insecure in (False, True)]
        states = asyncio.run(collect_states([target], samples=1, interval_s=0.5, timeout_s=10,
                                            insecure=True))
    assert codes == [EXIT_UNREADABLE, EXIT_OK] and states[0].status == "up"
    capsys.readouterr()


TOKEN = "s3cret-token-for-tests"


LOADED_SLACK_S = 5.0  # what a busy 2-core machine may add to a kept deadline


def by_url(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {target["target"]: target for target in document["targets"]}


async def test_snapshot_reports_every_fault_and_keeps_healthy_targets_right() -> None:
    async with FaultServer(bodies=[fixture(LOAD), fixture(IDLE)]) as healthy, \
            FaultServer(bodies=[fixture(IDLE), fixture(LOAD)]) as restarting, \
            FaultServer() as faults:
        modes = ["hang", "auth", "error500", "garbage", "truncated", "big", "html", "notfound"]
        refused = f"http://127.0.0.1:{closed_port()}/metrics"
        urls = [healthy.url(), restarting.url(), faults.url("slow", "s=0.3"), refused,
                *(faults.url(m) for m in modes)]
        expected = dict(zip(urls[2:], ["up", "down", "timeout", "auth", "down", "bad_payload",
                                       "bad_payload", "bad_payload", "bad_payload",
                                       "bad_payload"], strict=True))
        code, out, err, _ = await run_kvtop(
            "snapshot", *urls, "--json", "--interval", "0.5", "--timeout", "2", "--no-gpu")
        reads = [r.at for r in healthy.requests if not r.path.endswith("/version")]
    assert code == 3, err  # some targets could not be read
    # The hung target held round 1 for its 2 s deadline, no longer: the healthy server's
    # second read came within deadline + interval (+ slack for a loaded machine).
    assert len(reads) == 2
    assert reads[1] - reads[0] < 2 + 0.5 + LOADED_SLACK_S, reads
    doc = json.loads(out)
    assert doc["kvtop_snapshot"] == 1 and doc["gpus"] == []
    targets = by_url(doc)
    statuses = {url: targets[url]["status"] for url in urls[2:]}
    assert statuses == expected
    assert "token" in targets[urls[5]]["error"]  # says what to do
    assert targets[urls[4]]["error"] == "no complete answer within 2 s"  # --timeout 2

    first = targets[urls[0]]
    assert first["status"] == "up" and first["error"] is None
    assert first["server"] == {"kind": "vllm", "version": "0.33.0",  # from /version
                               "version_inferred": False}
    (engine,) = first["engines"]
    # second scrape is the idle file: its values, rates between the two files' counters
    assert engine["kv"] == {"usage": 0.0, "blocks_total": 599, "blocks_used": 0.0,
                            "block_size": 16, "tokens_total": 9600, "tokens_used": 0.0,
                            "idle_floor_blocks": 0, "cpu_usage": None}
    assert engine["requests"] == {"running": 0.0, "waiting": 0.0, "swapped": None}
    window = engine["rates"]["window_s"]
    assert 0.4 < window < 3
    assert engine["rates"]["prompt_tokens_per_s"] == pytest.approx((65720 - 17016) / window,
                                                                   rel=1e-3)
    hit = engine["prefix_cache"]
    assert hit["hit_rate"] == pytest.approx((24320 - 6400) / (65720 - 17016))
    assert hit["hit_rate_scope"] == "window" and hit["unit"] == "tokens"
    assert engine["preemptions_total"] == 68
    assert engine["latency_s"]["ttft"]["scope"] == "window"

    reset = targets[urls[1]]
    assert reset["status"] == "up" and reset["restarted_at"] is not None
    (engine,) = reset["engines"]
    assert engine["restarted"] and engine["rates"]["prompt_tokens_per_s"] is None


async def test_a_server_without_version_keeps_its_inferred_version_inferred() -> None:
    # no /version route (a 404): the names say "0.7+", and every scrape is read that way
    async with FaultServer(bodies=[vllm_08_idle().encode()], version=None) as server:
        code, out, err, _ = await run_kvtop("snapshot", server.url(), "--json", "--no-gpu",
                                            "--interval", "0.2")
        assert sum(r.path.endswith("/version") for r in server.requests) == 1
    assert code == 0, err
    (target,) = json.loads(out)["targets"]
    assert target["server"] == {"kind": "vllm", "version": "0.7+", "version_inferred": True}
    (engine,) = target["engines"]
    assert (engine["kv"]["blocks_total"], engine["kv"]["idle_floor_blocks"]) == (600, 1)


async def test_token_from_env_is_sent_and_never_printed() -> None:
    async with FaultServer(mode="auth", token=TOKEN) as server:
        code, out, err, _ = await run_kvtop(
            "snapshot", server.url(), "--samples", "1", "--json", "--no-gpu",
            "--token-env", "MY_VLLM_TOKEN", env={"MY_VLLM_TOKEN": TOKEN})
        assert code == 0, out + err
        assert server.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
        url = server.url()
    assert TOKEN not in out and TOKEN not in err
    assert by_url(json.loads(out))[url]["status"] == "up"


async def test_stale_when_second_scrape_fails() -> None:
    async with FaultServer() as server:
        task = asyncio.create_task(run_kvtop("snapshot", server.url(), "--json", "--no-gpu",
                                             "--interval", "1", "--timeout", "1"))
        # first scrape served, then the server starts to hang
        await eventually(lambda: server.hits, "the first scrape", timeout_s=DEADLINE_S)
        server.mode = "hang"
        code, out, _, _ = await task
    target = json.loads(out)["targets"][0]
    assert code == 3
    assert target["status"] == "stale" and "no complete answer" in target["error"]
    assert target["engines"][0]["requests"]["running"] == 30  # last good values kept


async def test_table_output_and_bad_target_usage_error() -> None:
    async with FaultServer() as server:
        code, out, err, _ = await run_kvtop("snapshot", server.url(), "--table", "--samples",
                                            "1", "--no-gpu", env={"COLUMNS": "200"})
    assert code == 0, err
    assert "588/599" in out and "twin-llama" in out
    code, _, err, _ = await run_kvtop("snapshot", "http://[::1", "--no-gpu")
    assert code == 2 and "not a host:port or URL" in err


async def test_table_rows_go_to_stdout_and_a_down_targets_whole_error_to_stderr() -> None:
    async with FaultServer() as server:
        down = f"127.0.0.1:{closed_port()}"
        code, out, err, _ = await run_kvtop("snapshot", server.url(), down, "--table",
                                            "--samples", "1", "--no-gpu")
    assert code == EXIT_UNREADABLE
    rows = out.splitlines()
    assert len(rows) == 3 and rows[0].startswith("NAME ") and "twin-llama" in out
    assert err.startswith(f"kvtop: {down}: ") and "kvtop" not in out  # notes only on stderr


SIM_TOKEN = "sim-token-for-tests"


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
        "auth": SimConfig(engine=ENGINE, seed=9, faults=plan(token=SIM_TOKEN)),
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


def exporter(name: str) -> FaultServer:
    return FaultServer(bodies=[gpu_fixture(name).encode()], version=None)


def by_target(document: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for gpu in document["gpus"]:
        out.setdefault(gpu["target"], []).append(gpu)
    return out


async def test_exporters_are_recognised_and_their_gpus_owned() -> None:
    async with exporter(DCGM_MIG) as dcgm, exporter(NVIDIA_SMI_H100) as smi, \
            FaultServer() as vllm:
        urls = vllm_url, dcgm_url, smi_url = vllm.url(), dcgm.url(), smi.url()
        code, out, err, _ = await run_kvtop("snapshot", *urls, "--json", "--interval", "0.3")
    assert code == 0, err
    document = json.loads(out)
    kinds = {t["target"]: t["server"]["kind"] for t in document["targets"]}
    assert kinds == {vllm_url: "vllm", dcgm_url: "dcgm", smi_url: "nvidia_gpu_exporter"}
    gpus = by_target(document)
    whole, instance = gpus[dcgm_url]
    assert (whole["source"], whole["host"], whole["mig"]) == ("dcgm", "ub20-a100-k8s", None)
    assert instance["mig"] == {"instance": "13", "profile": "1g.5gb"}
    assert instance["memory_used_bytes"] is None  # not exported for the instance: null
    assert whole["memory_used_bytes"] == 4845 * MIB
    (h100,) = gpus[smi_url]
    assert (h100["name"], h100["host"], h100["source"]) == (
        "NVIDIA H100 80GB HBM3", "127.0.0.1", "nvidia_gpu_exporter")
    # the vLLM server runs on the exporters' host (127.0.0.1): it owns their GPUs
    owner = {"target": vllm_url, "label": vllm_url.split("//")[1].split("/")[0], "by": "host"}
    assert whole["owners"] == instance["owners"] == h100["owners"] == [owner]
    sources = {s["target"]: s for s in document["gpu_sources"]}
    assert sources[dcgm_url] == {"source": "dcgm", "target": dcgm_url,
                                   "host": "127.0.0.1", "status": "ok", "error": None,
                                   "gpus": 2}
    nvml = sources[None]
    assert nvml["source"] == "nvml"
    if nvml["status"] != "ok":  # this machine has no NVIDIA driver: the reason, not []
        assert nvml["error"] and nvml["gpus"] == 0


async def test_an_exporter_that_fails_says_so() -> None:
    async with exporter(NVIDIA_SMI_H100) as smi:
        run = asyncio.ensure_future(run_kvtop("snapshot", smi.url(), "--json", "--no-gpu",
                                              "--interval", "1"))
        while smi.hits < 1 and not run.done():
            await asyncio.sleep(0.02)
        smi.mode = "error500"  # the second read fails
        code, out, err, _ = await run
    assert code == 3, err
    document = json.loads(out)
    (source,) = document["gpu_sources"]  # --no-gpu: NVML not asked, not listed
    assert source["status"] == "failed" and "HTTP 500" in source["error"]
    assert source["gpus"] == 1  # the last values are still shown, marked stale
    assert document["targets"][0]["status"] == "stale"
    assert len(document["gpus"]) == 1


async def test_no_gpu_exporter_no_gpu_sources_but_nvml() -> None:
    async with FaultServer(bodies=[fixture()]) as vllm:
        code, out, err, _ = await run_kvtop("snapshot", vllm.url(), "--json", "--no-gpu",
                                            "--samples", "1")
    assert code == 0, err
    document = json.loads(out)
    assert document["gpus"] == [] and document["gpu_sources"] == []


# -- --watch: one document per interval, one per line -----------------------------------


class Tape(io.StringIO):
    """stdout as a pipe sees it: what had been flushed at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_watch_prints_a_flushed_line_per_interval_until_ctrl_c(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tape = Tape()
    monkeypatch.setattr(sys, "stdout", tape)
    monkeypatch.setattr(gpus, "read_gpus", FakeGpuReader().read)
    with served_in_thread(FaultServer(bodies=[fixture(LOAD), fixture(IDLE)])) as server:
        down = f"127.0.0.1:{closed_port()}"
        ctrl_c = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        try:
            code = main(["snapshot", server.url(), down, "--watch", "0.25"])
        finally:
            ctrl_c.cancel()
    assert code == EXIT_INTERRUPTED
    lines = tape.getvalue().splitlines()
    # one a beat (0.25 s) until Ctrl-C at 2 s (+1: a late one is printed, the beat goes
    # on from it), never a burst of the beats missed
    assert 3 <= len(lines) <= 2.0 / 0.25 + 1, lines
    # every line was in the pipe before the next was written (a reader gets it at once)
    assert all("".join(f"{line}\n" for line in lines[:n]) in tape.flushed
               for n in range(1, len(lines) + 1))
    documents = [json.loads(line) for line in lines]
    # a line each, with no spaces between its items (NDJSON as compact as it goes)
    assert lines == [json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
                     for doc in documents]
    assert all(doc["kvtop_snapshot"] == 1 for doc in documents)
    # this machine's GPUs (fake NVML) in every document: no --no-gpu
    assert {len(doc["gpus"]) for doc in documents} == {2}
    taken = [doc["taken_at"] for doc in documents]
    assert taken == sorted(set(taken))
    for doc in documents:  # the down target is in every document, never holding one back
        assert [t["status"] for t in doc["targets"]] == ["up", "down"]
    assert documents[-1]["targets"][0]["engines"][0]["rates"]["window_s"] > 0


def test_watch_waits_for_every_target_to_be_tried_before_its_first_document(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tape = Tape()
    monkeypatch.setattr(sys, "stdout", tape)
    with served_in_thread(FaultServer()) as server, \
            served_in_thread(FaultServer(mode="hang")) as hung:
        ctrl_c = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        try:
            code = main(["snapshot", server.url(), hung.url(), "--watch", "0.2",
                         "--timeout", "0.6", "--no-gpu"])
        finally:
            ctrl_c.cancel()
    assert code == EXIT_INTERRUPTED
    documents = [json.loads(line) for line in tape.getvalue().splitlines()]
    # the hung target held the first document back for its 0.6 s deadline, no "pending"
    assert 1 <= len(documents) <= 2.0 / 0.2, documents
    for doc in documents:
        assert [t["status"] for t in doc["targets"]] == ["up", "timeout"]


def test_a_watch_prints_nothing_before_its_first_beat_and_closes_its_connections(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer()) as server:
        source = direct([Target.from_spec(server.url())], interval_s=0.1, timeout_s=10,
                        insecure=False)
        ctrl_c = threading.Timer(0.7, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        try:
            code = stream(source, every_s=1.5, with_gpus=False)
        finally:
            ctrl_c.cancel()
        hits = server.hits
    # the target was read (every 0.1 s), but the first beat (1.5 s) never came
    assert (code, capsys.readouterr(), hits >= 2) == (EXIT_INTERRUPTED, ("", ""), True)
    assert source.live()._session is None  # the poller's HTTP session was closed


def test_watch_through_prometheus_shows_an_instance_its_discovery_missed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tape = Tape()
    monkeypatch.setattr(sys, "stdout", tape)
    listed, missed = INSTANCES
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        prom.hostile["discover"] = answer(
            [{"metric": {"job": "vllm", "instance": listed}, "value": [0, "85"]}], "vector")
        ctrl_c = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        try:
            code = main(["snapshot", "--prometheus", prom.url, "--watch", "0.2",
                         "--interval", "0.2", "--no-gpu"])
        finally:
            ctrl_c.cancel()
    documents = [json.loads(line) for line in tape.getvalue().splitlines()]
    assert code == EXIT_INTERRUPTED and documents
    assert [(t["label"], t["status"], t["engines"][0]["model"])
            for t in documents[-1]["targets"]] == [
        (listed, "up", "twin-llama"), (missed, "up", "twin-llama")]


async def test_watch_into_head_1_ends_quietly() -> None:
    async with FaultServer() as server:
        done = await asyncio.to_thread(
            subprocess.run, ["bash", "-c", '"$@" | head -1; exit "${PIPESTATUS[0]}"', "kvtop",
                             *kvtop_command(), "snapshot", server.url(), "--watch", "0.2",
                             "--no-gpu"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert done.stderr == ""
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["targets"][0]["status"] == "up"


def test_watch_is_json_lines_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--watch", "--table", "--no-gpu"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "kvtop: --watch prints JSON lines; --table is for one snapshot\n")
    assert main(["snapshot", "--watch", "0", "--no-gpu"]) == EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kvtop snapshot: error: argument --watch: must be a finite number > 0 (got '0')")


def test_snapshot_is_listed_with_its_summary() -> None:
    listing = build_command_parser().format_help().splitlines()
    assert [line for line in listing if "snapshot" in line] == [
        "    snapshot  read the targets once and print JSON or a table"]


# -- --header and --cacert: every request to the target carries them -------------------------


SHORT_KEY, TENANT = "k3y-9z", "tenant-secret-7731"  # under and over safe_text's 8 characters
HEADERS = ("--header", "X-Api-Key:$GW_KEY", "--header", "X-Tenant:@{tenant}",
           "--header", "Accept: text/plain;q=0.9")


def echoing_keys(request: Any) -> tuple[int, bytes]:
    """A gateway that quotes the headers it was sent in its error."""
    said = f"bad key {request.headers.get('x-api-key')} for {request.headers.get('x-tenant')}"
    return 500, json.dumps({"error": {"message": said}}).encode()


async def test_headers_reach_every_request_and_their_secrets_never_show(tmp_path: Any) -> None:
    tenant = tmp_path / "tenant"
    tenant.write_text(TENANT + "\n")
    flags = [flag.format(tenant=tenant) for flag in HEADERS]
    async with FaultServer() as server, FaultServer(mode="api", api=echoing_keys) as echo:
        code, out, err, _ = await run_kvtop(
            "snapshot", server.url(), echo.url(), "--samples", "1", "--json", "--no-gpu",
            *flags, env={"GW_KEY": SHORT_KEY})
        seen = [(request.path, request.headers) for request in server.requests]
        echo_url = echo.url()
    assert code == EXIT_UNREADABLE, err
    paths = {path for path, _ in seen}
    assert "/version" in paths and any(path.startswith("/metrics") for path in paths)
    for path, headers in seen:  # the scrape and the version probe alike
        assert (headers.get("x-api-key"), headers.get("x-tenant"),
                headers.get("accept")) == (SHORT_KEY, TENANT, "text/plain;q=0.9"), path
    echoed = by_url(json.loads(out))[echo_url]
    assert echoed["status"] == "down" and "bad key *** for ***" in echoed["error"]
    assert SHORT_KEY not in out + err and TENANT not in out + err


async def test_a_private_ca_verifies_the_target_only_when_given(
        private_ca: tuple[ssl.SSLContext, Any]) -> None:
    context, ca = private_ca
    other = certifi.where()  # a real CA bundle that does not hold this server's CA
    async with FaultServer(ssl_context=context) as server:
        url = server.url()
        runs = [await run_kvtop("snapshot", url, "--samples", "1", "--json", "--no-gpu", *flag)
                for flag in ([], ["--cacert", str(ca)], ["--cacert", str(other)])]
    default, trusted, wrong = (by_url(json.loads(out))[url] for _, out, _, _ in runs)
    assert [code for code, *_ in runs] == [EXIT_UNREADABLE, EXIT_OK, EXIT_UNREADABLE]
    assert trusted["status"] == "up" and trusted["server"]["version"] == "0.33.0"
    for failed in (default, wrong):
        assert failed["status"] == "down" and "TLS certificate not trusted" in failed["error"]


async def test_a_config_targets_headers_and_ca_and_insecure_over_them(
        private_ca: tuple[ssl.SSLContext, Any], tmp_path: Any) -> None:
    context, ca = private_ca
    async with FaultServer(ssl_context=context) as server:
        url = server.url()
        config = tmp_path / "kvtop.toml"
        runs = []
        for cacert, flags in ((ca, []), (certifi.where(), ["--insecure"])):
            config.write_text(f'[[targets]]\nurl = "{url}"\ncacert = "{cacert}"\n'
                              '[targets.headers]\n"X-Api-Key" = "$GW_KEY"\n'
                              'Accept = "text/plain"\n')
            runs.append(await run_kvtop("snapshot", "--config", str(config), "--samples", "1",
                                        "--json", "--no-gpu", *flags,
                                        env={"GW_KEY": SHORT_KEY}))
        sent = {(r.headers.get("x-api-key"), r.headers.get("accept")) for r in server.requests}
    # its own CA verifies it; --insecure verifies nothing, whatever CA bundle a target names
    assert [code for code, *_ in runs] == [EXIT_OK, EXIT_OK], runs
    assert sent == {(SHORT_KEY, "text/plain")}


# -- the command's run() in this process (main), against real servers on 127.0.0.1 ------------


def in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`kvtop ARGV` through main() in this process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_kvtop_snapshot_in_this_process_is_json_to_a_pipe_and_its_notes_only_with_a_table(
        capsys: pytest.CaptureFixture[str]) -> None:
    down = f"127.0.0.1:{closed_port()}"
    with served_in_thread(FaultServer()) as server:
        url = server.url()
        runs = {form: in_process(capsys, "snapshot", url, down, "--samples", "1", "--no-gpu",
                                 *form)
                for form in ((), ("--json",), ("--table",))}
    (piped, piped_out, piped_err), (json_code, json_out, json_err) = runs[()], runs[("--json",)]
    # stdout is not a terminal: JSON, the same as --json, and no notes beside it
    assert (piped, json_code, piped_err, json_err) == (EXIT_UNREADABLE, EXIT_UNREADABLE, "", "")
    for out in (piped_out, json_out):
        document = json.loads(out)
        assert [(t["target"], t["status"]) for t in document["targets"]] == [
            (url, "up"), (f"http://{down}/metrics", "down")]
        assert (document["gpus"], document["gpu_sources"]) == ([], [])
    table_code, table_out, table_err = runs[("--table",)]
    assert table_code == EXIT_UNREADABLE
    assert table_out.splitlines()[0].startswith("NAME ") and "twin-llama" in table_out
    [note] = table_err.splitlines()  # the down target's whole error, on stderr alone
    assert note.startswith(f"kvtop: {down}: ") and note != f"kvtop: {down}: "


def test_kvtop_snapshot_shows_this_machines_gpus_unless_told_not_to(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "read_gpus", FakeGpuReader().read)
    with served_in_thread(FaultServer()) as server:
        runs = [in_process(capsys, "snapshot", server.url(), "--samples", "1", "--json", *flag)
                for flag in ((), ("--no-gpu",))]
    (code, out, err), (no_gpu_code, no_gpu_out, _) = runs
    assert (code, no_gpu_code, err) == (EXIT_OK, EXIT_OK, "")
    document, no_gpu = json.loads(out), json.loads(no_gpu_out)
    assert [gpu["name"] for gpu in document["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert document["gpu_sources"] == [{"source": "nvml", "target": None,
                                        "host": socket.gethostname(), "status": "ok",
                                        "error": None, "gpus": 2}]
    assert (no_gpu["gpus"], no_gpu["gpu_sources"]) == ([], [])


def test_a_snapshot_closes_its_connections_when_it_has_read() -> None:
    with served_in_thread(FaultServer()) as server:
        source = direct([Target.from_spec(server.url())], interval_s=0.1, timeout_s=10,
                        insecure=False)
        [state] = asyncio.run(read_states(source, samples=1))
    assert state.status == "up"
    assert source.live()._session is None  # the poller's HTTP session was closed


def test_the_two_reads_are_the_interval_given_apart(capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer()) as server:
        code, out, err = in_process(capsys, "snapshot", server.url(), "--interval", "3",
                                    "--json", "--no-gpu")
    assert (code, err, server.hits) == (EXIT_OK, "", 2)  # two reads unless --samples 1
    # 3 s less the reads' latency; the source's own default (1 s) would be far under it
    assert json.loads(out)["targets"][0]["engines"][0]["rates"]["window_s"] >= 2.0


def test_a_watch_whose_prometheus_answers_nonsense_closes_its_connection(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        prom.hostile["discover"] = answer([1, "x"])
        feed = PrometheusFeed(load_settings(prom.url), interval_s=0.2, timeout_s=10)
        code = stream(feed, every_s=0.2, with_gpus=False)
    out, err = capsys.readouterr()
    assert (code, out) == (EXIT_UNREADABLE, "")
    assert err.startswith("kvtop snapshot: ") and "not a Prometheus query answer" in err
    assert feed.source.api._session is None  # discovery's session was closed


def test_a_prometheus_that_cannot_be_read_ends_a_snapshot_or_a_watch_with_exit_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    prometheus = f"http://127.0.0.1:{closed_port()}"
    for watching in ((), ("--watch", "0.2")):
        code, out, err = in_process(capsys, "snapshot", "--prometheus", prometheus,
                                    "--no-gpu", "--timeout", "5", *watching)
        assert (code, out) == (EXIT_UNREADABLE, "")
        [line] = err.splitlines()
        assert line.startswith(f"kvtop snapshot: Prometheus {prometheus}"), line


def test_watch_is_every_interval_given_or_the_reads_interval() -> None:
    def every(*argv: str) -> float | None:
        return _watch_seconds(build_command_parser().parse_args(["snapshot", *argv]))

    assert every() is None
    assert every("--watch") == 1.0  # --interval's default
    assert every("--watch", "--interval", "0.3") == 0.3
    assert every("--watch", "2.5", "--interval", "0.3") == 2.5
    assert every("--watch", "--json") == 1.0
