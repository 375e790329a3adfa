"""What ``kvtop check`` promises a script or a person (docs/check-json.md), in this process so
the mutation runs see it: each engine's worst verdict and when WATCH, LEAK, STALLED and
SATURATED were first reached, the exit code (a leak over a stall over no data), the span
judged, the text a person reads, the progress line on a terminal only, and a recording
judged as it was recorded.

`kvtop check` as users run it: live against simulated vLLM servers (one leaking, one
healthy), then on the recordings it wrote, which must give the same verdicts.

`kvtop check` (the real command) on a simulated server that wedges: the pool fills, the
queue grows and no token comes out. STALLED within 10 s of the wedge, exit code 4, and the
recording it wrote gives the same document."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtop.cli import main
from kvtop.collect.live import DirectSource
from kvtop.collect.target import Scrape, Target
from kvtop.commands.check import Progress, check, print_result
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.verdicts import StallVerdict
from kvtop.derive.worst import CheckRun, EngineVerdict
from kvtop.exits import EXIT_INTERRUPTED, EXIT_LEAK, EXIT_NO_DATA, EXIT_OK, EXIT_USAGE
from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from kvtop.store.recording import RecordingWriter, open_recording, read_recording
from kvtop.store.replay import RecordingSource
from kvtop.store.writer import MIN_MAX_BYTES
from tests.fakes.faultserver import FaultServer, closed_port, served_in_thread
from tests.scenarios.check_runs import (
    STEP,
    T0,
    TARGET,
    body,
    idle_holding,
    judged,
    quiet,
    stalling,
)


def text_of(run: CheckRun, capsys: pytest.CaptureFixture[str]) -> list[str]:
    code = print_result(run, as_json=False)
    assert code == run.exit_code()
    return capsys.readouterr().out.splitlines()


def test_the_text_names_the_verdict_the_span_and_each_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = text_of(judged(idle_holding(12)), capsys)
    assert lines[0] == ("kvtop check: LEAK (1m50s judged, 2026-01-01T00:00:00.000+00:00 to "
                        "2026-01-01T00:01:50.000+00:00)")
    assert lines[1].startswith(f"  LEAK    {TARGET.url} m 0: 39 blocks held")
    assert lines[2] == ("          leaked 39 blocks (624 tokens); next: record it (kvtop "
                        "record), report it upstream with the recording, and restart the "
                        "server to get the blocks back")
    assert len(lines) == 3


def test_the_text_says_stalled_in_the_headline_and_under_the_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = text_of(judged(stalling(9)), capsys)
    assert lines[0].startswith("kvtop check: UNKNOWN, STALLED (1m20s judged")
    assert lines[1] == (f"  UNKNOWN {TARGET.url} m 0: not enough data for a verdict; needs 9 "
                        "more minutes of scrapes under load, or one idle period (nothing "
                        "running or waiting for 20 s, 3 scrapes)")
    assert lines[2].startswith(f"  STALLED {TARGET.url} m 0: ")
    assert len(lines) == 3


def test_the_text_of_a_run_with_nothing_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert text_of(CheckRun(), capsys) == [
        "kvtop check: UNKNOWN",
        "  no verdict: needs a target that answers with an inference server's metrics"]


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (12.4, "12s"), (59, "59s"), (60, "1m00s"), (245, "4m05s"), (3599, "59m59s"),
    (3600, "1h00m"), (3720, "1h02m"), (90000, "25h00m"),
])
def test_the_span_reads_as_a_person_says_it(seconds: float, shown: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = judged([Scrape(TARGET, T0, failure="down", error="x"),
                  Scrape(TARGET, T0 + seconds, failure="down", error="x")])
    assert text_of(run, capsys)[0].startswith(f"kvtop check: UNKNOWN ({shown} judged, ")


def test_json_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    run = judged(idle_holding(12))
    assert print_result(run, as_json=True) == EXIT_LEAK
    assert json.loads(capsys.readouterr().out) == run.to_json()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_shows_on_a_terminal_at_most_once_a_second_and_is_cleared() -> None:
    stream, clock = Terminal(), Clock()
    progress = Progress(600.0, stream=stream, clock=clock)
    run = judged(idle_holding(3))
    progress.update(run)
    assert stream.getvalue() == ("\rkvtop check: 0s of 10m00s (10m00s left) · 1 engine(s) seen "
                                 "· worst so far: WATCH\x1b[K")
    clock.now += 0.9
    progress.update(run)
    assert stream.getvalue().count("\r") == 1  # not yet a second
    clock.now += 0.1
    progress.update(run)
    assert stream.getvalue().count("\r") == 2
    clock.now += 700
    progress.update(run)
    assert stream.getvalue().endswith(
        "\rkvtop check: 11m41s of 10m00s (0s left) · 1 engine(s) seen · worst so far: "
        "WATCH\x1b[K")
    progress.close()
    assert stream.getvalue().endswith("\x1b[K\r\x1b[K")


def test_progress_writes_nothing_into_a_file_or_pipe() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(60.0, stream=stream, clock=clock)
    progress.update(judged(idle_holding(3)))
    progress.close()
    assert stream.getvalue() == ""


def test_progress_never_shown_is_not_cleared() -> None:
    stream = Terminal()
    Progress(60.0, stream=stream, clock=Clock()).close()
    assert stream.getvalue() == ""


def run_check_replay(path: Path, *, params: LeakParams | None, as_json: bool | None) -> int:
    """`kvtop check --replay` on ``path``: what it prints, its exit code."""
    return check(RecordingSource(open_recording(path)), params=params, duration_s=None,
                 as_json=as_json)


def run_check_live(targets: list[Target], *, params: LeakParams | None, duration_s: float,
                   interval_s: float, timeout_s: float | None, insecure: bool,
                   full_metrics: bool = False, **checking: Any) -> int:
    """`kvtop check` watching ``targets`` directly."""
    source = DirectSource(targets, interval_s=interval_s, timeout_s=timeout_s,
                          insecure=insecure, narrow=not full_metrics)
    return check(source, params=params, duration_s=duration_s, **checking)


def recorded(path: Path, scrapes: list[Scrape]) -> Path:
    with RecordingWriter(path, interval_s=STEP, targets=[TARGET]) as writer:
        for scrape in scrapes:
            writer.write(scrape)
    return path


def test_a_recording_is_judged_as_it_was_recorded(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path / "r.jsonl", idle_holding(12))
    assert run_check_replay(path, params=None, as_json=True) == EXIT_LEAK
    document = json.loads(capsys.readouterr().out)
    assert document == judged(idle_holding(12)).to_json()
    patient = LeakParams(idle_leak_s=1000.0)
    assert run_check_replay(path, params=patient, as_json=True) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["verdict"] == "watch"


def test_a_recording_with_no_scrape_lists_its_targets(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path / "r.jsonl", [])
    assert run_check_replay(path, params=None, as_json=True) == EXIT_NO_DATA
    assert json.loads(capsys.readouterr().out)["targets"] == [
        {"target": TARGET.url, "engines": []}]


def test_a_recording_in_file_order_is_judged_in_time_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scrapes = idle_holding(12)
    scrapes[3], scrapes[4] = scrapes[4], scrapes[3]  # a slow scrape written after the next
    path = recorded(tmp_path / "r.jsonl", scrapes)
    assert run_check_replay(path, params=None, as_json=True) == EXIT_LEAK
    assert json.loads(capsys.readouterr().out)["targets"][0]["engines"][0][
        "watch_first_t"] == T0 + 20


def test_a_bad_recording_is_a_usage_error_and_skipped_lines_are_told(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something else"}\n')
    assert main(["check", "--replay", str(bad), "--json"]) == EXIT_USAGE == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"kvtop check: {bad}: not a kvtop recording")
    path = recorded(tmp_path / "r.jsonl", idle_holding(12))
    with path.open("a") as file:
        file.write("not json\n")
    assert run_check_replay(path, params=None, as_json=True) == EXIT_LEAK
    assert f"kvtop check: {path}: line 14: not JSON; skipped" in capsys.readouterr().err


QUICK = LeakParams(idle_min_s=0.2, idle_min_scrapes=3, idle_leak_s=0.5)  # seconds, not minutes


def test_a_live_check_until_leak_stops_at_the_leak_and_records_what_it_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "live.jsonl"
    with served_in_thread(FaultServer(bodies=[body(0.04).encode()])) as server:
        target = Target.from_spec(server.url())
        code = run_check_live([target], params=QUICK, duration_s=30.0, interval_s=0.05,
                              timeout_s=10.0, insecure=False, until_leak=True, record=record,
                              as_json=True)
    assert code == EXIT_LEAK
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["verdict"] == "leak" and document["duration_s"] < 20  # not the 30 s
    assert captured.err == ""  # no progress line off a terminal, no recording trouble
    assert run_check_replay(record, params=QUICK, as_json=True) == EXIT_LEAK
    again = json.loads(capsys.readouterr().out)
    assert again["targets"] == document["targets"]


def test_a_live_check_runs_its_duration_without_until_leak(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(bodies=[body(0.0).encode()])) as server:
        target = Target.from_spec(server.url())
        code = run_check_live([target], params=None, duration_s=0.6, interval_s=0.05,
                              timeout_s=10.0, insecure=False, until_leak=False, record=None,
                              as_json=True)
        hits = server.hits
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK and document["verdict"] == "ok" and hits >= 3
    assert [t["target"] for t in document["targets"]] == [target.url]


def test_a_live_check_of_a_server_that_never_answers_is_no_data(
        capsys: pytest.CaptureFixture[str]) -> None:
    target = Target.from_spec(f"127.0.0.1:{closed_port()}")
    code = run_check_live([target], params=None, duration_s=0.3, interval_s=0.05,
                          timeout_s=5.0, insecure=False, until_leak=True, record=None,
                          as_json=True)
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_NO_DATA and document["targets"] == [{"target": target.url,
                                                             "engines": []}]


def test_a_recording_that_cannot_be_written_stops_the_check_before_it_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken.jsonl"
    taken.write_text("precious\n")
    code = run_check_live([TARGET], params=None, duration_s=60.0, interval_s=0.05,
                          timeout_s=5.0, insecure=False, until_leak=False, record=taken,
                          as_json=True)
    captured = capsys.readouterr()
    assert code == EXIT_USAGE and captured.out == ""
    assert captured.err.startswith(f"kvtop check: cannot write {taken}: it is an existing file")
    assert taken.read_text() == "precious\n"


def test_a_recording_that_fills_up_is_told_and_the_verdict_stands(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "small.jsonl"
    big = body(0.04) + "# " + "x" * (600 * 1024) + "\n"
    with served_in_thread(FaultServer(bodies=[big.encode()])) as server:
        code = run_check_live([Target.from_spec(server.url())], params=QUICK,
                              duration_s=30.0, interval_s=0.05, timeout_s=10.0,
                              insecure=False, until_leak=True, record=record, as_json=True,
                              record_max_bytes=MIN_MAX_BYTES)
    captured = capsys.readouterr()
    assert code == EXIT_LEAK and json.loads(captured.out)["verdict"] == "leak"
    assert captured.err == f"kvtop check: recording {record}: stopped at 1 MiB\n"


def test_the_text_of_a_saturated_engine_and_one_without_model_or_engine_names(
        capsys: pytest.CaptureFixture[str]) -> None:
    run = CheckRun()
    run.add_target(TARGET)
    saturated = EngineVerdict(None, None)
    saturated.observe_stall(T0, StallVerdict("saturated", "the pool is full", T0))
    run.engines[TARGET.url][(None, None)] = saturated
    assert text_of(run, capsys) == [
        "kvtop check: UNKNOWN, SATURATED",
        f"  UNKNOWN {TARGET.url}: not enough data for a verdict; needs 10 more minutes of "
        "scrapes under load, or one idle period (nothing running or waiting for 20 s, 3 "
        "scrapes)",
        f"  SATURATED {TARGET.url}: the pool is full"]


def test_the_verdict_is_text_when_asked(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path / "r.jsonl", idle_holding(12))
    assert run_check_replay(path, params=None, as_json=False) == EXIT_LEAK
    assert capsys.readouterr().out.startswith("kvtop check: LEAK (1m50s judged, ")
    with served_in_thread(FaultServer(bodies=[body(0.0).encode()])) as server:
        run_check_live([Target.from_spec(server.url())], params=None, duration_s=0.3,
                       interval_s=0.05, timeout_s=10.0, insecure=False, until_leak=False,
                       record=None, as_json=False)
    assert capsys.readouterr().out.startswith("kvtop check: OK (")


def test_a_live_check_asks_for_its_series_only_unless_told_and_records_its_interval(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    for full in (False, True):
        record = tmp_path / f"full-{full}.jsonl"
        with served_in_thread(FaultServer(bodies=[body(0.0).encode()])) as server:
            kwargs = {"full_metrics": True} if full else {}
            run_check_live([Target.from_spec(server.url())], params=None, duration_s=0.3,
                           interval_s=0.05, timeout_s=10.0, insecure=False, until_leak=False,
                           record=record, as_json=True, **kwargs)
            reads = [r for r in server.requests if r.path.startswith("/metrics")]
        assert reads and all(("name[]" in r.query) != full for r in reads)
        assert read_recording(record).interval_s == 0.05
    assert "failed" not in caplog.text  # nothing went wrong on the way (a scrape's consumer)
    capsys.readouterr()


def test_a_live_check_keeps_to_the_timeout_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(mode="slow", delay_s=0.5,
                                      bodies=[body(0.0).encode()])) as server:
        target = Target.from_spec(server.url())
        read = []
        for timeout in (0.1, 5.0):
            run_check_live([target], params=None, duration_s=2.0, interval_s=0.05,
                           timeout_s=timeout, insecure=False, until_leak=False, record=None,
                           as_json=True)
            read.append(json.loads(capsys.readouterr().out)["targets"][0]["engines"] != [])
    assert read == [False, True]  # answers after 0.5 s: too late, then in time


def test_a_live_check_shows_its_progress_on_a_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with served_in_thread(FaultServer(bodies=[body(0.0).encode()])) as server:
        run_check_live([Target.from_spec(server.url())], params=None, duration_s=2.0,
                       interval_s=0.05, timeout_s=10.0, insecure=False, until_leak=False,
                       record=None, as_json=True)
    shown = terminal.getvalue()
    assert shown.startswith("\rkvtop check: 0s of 2s (2s left) · 1 engine(s) seen · worst so "
                            "far: ") and shown.endswith("\r\x1b[K")
    capsys.readouterr()


def test_a_live_check_reads_a_self_signed_server_only_when_insecure(
        self_signed: ssl.SSLContext, capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(bodies=[body(0.0).encode()],
                                      ssl_context=self_signed)) as server:
        target = Target.from_spec(server.url().replace("http://", "https://"))
        codes = [run_check_live([target], params=None, duration_s=0.3, interval_s=0.05,
                                timeout_s=10.0, insecure=insecure, until_leak=False,
                                record=None, as_json=True) for insecure in (False, True)]
    assert codes == [EXIT_NO_DATA, EXIT_OK]
    capsys.readouterr()


# Shorter idle confirmation than the defaults, so the test runs in well under a minute; the
# defaults are exercised by tests/unit/derive/test_leak.py on constructed series.
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


def test_a_recordings_kv_events_give_the_exact_evidence_apart_from_the_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Quiet scrapes of a pool of 1000 blocks (usage 0: the verdict is OK), with KV events in
    which block 7 is never used again while 3000 others come and go: exact evidence, told
    beside an OK verdict and exit code 0."""
    from kvtop.collect.kv_events import BlockRemoved, BlockStored, KvEventBatch

    scrapes = [Scrape(TARGET, T0 + STEP * i, body=body(0.0)) for i in range(12)]
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path, interval_s=STEP, targets=[TARGET]) as writer:
        for i, scrape in enumerate(scrapes):
            writer.write(scrape)
            churn = tuple(range(10_000 + 300 * i, 10_000 + 300 * (i + 1)))
            events = (BlockStored(churn, None, 16 * 300, 16, "GPU"), BlockRemoved(churn, "GPU"))
            if i == 0:
                events = (BlockStored((7,), None, 16, 16, "GPU"), *events)
            writer.write_kv_events(KvEventBatch(t=scrape.t + 1, rank=0, seq=i, ts=scrape.t,
                                                events=events), TARGET)
    assert run_check_replay(path, params=None, as_json=True) == EXIT_OK
    engine = json.loads(capsys.readouterr().out)["targets"][0]["engines"][0]
    assert engine["verdict"] == "ok"
    events = engine["kv_events"]
    assert events["leak"] == "evidence" and events["leaked_blocks"] == 1
    assert events["leaked_sample"] == ["0000000000000007"]
    # 3 turnovers of 999 blocks: 2997 removals after block 7, reached in the 10th batch,
    # folded with the scrape after it
    assert events["evidence_first_t"] == T0 + STEP * 10
    # the last batch came after the last scrape: no stats of the engine carry it
    assert (events["stored_total"], events["removed_total"]) == (3301, 3300)
    assert engine["limits"] == {"none": 12}


async def test_a_live_check_folds_and_records_the_kv_events_and_its_replay_sees_them(
        tmp_path: Path) -> None:
    """`kvtop check --kv-events` on a simulated vLLM publishing its pool's events: the JSON
    carries what they say (blocks stored and removed, the exact evidence's state) apart from
    the verdict, the recording holds them, and check --replay of it tells the same."""
    engine = EngineConfig(num_gpu_blocks=300, max_num_seqs=16, kv_cache_metrics=True)
    config = SimConfig(engine=engine, workload_params={"rate": 4.0}, speed=5.0, seed=8,
                       kv_events_port=0)
    recording = tmp_path / "kv.jsonl"
    async with SimFleet([config]) as fleet:
        events = fleet.servers[0].kv_events
        assert events is not None
        code, document, err = await kvtop(
            "check", fleet.urls[0] + "/metrics", "--kv-events",
            f"{events.url},{events.replay_url}", "--interval", "0.5", "--duration", "4s",
            "--json", "--record", str(recording))
    assert code == EXIT_NO_DATA, err  # 4 s: the leak detector is still warming up
    assert document is not None and engine_verdict(document)["verdict"] == "unknown"
    live = engine_verdict(document)["kv_events"]
    assert live is not None and live["stored_total"] > 0 and live["lost_batches"] == 0
    assert live["leak"] in ("too_early", "none")  # a healthy pool: never evidence
    assert read_recording(recording).kv_events  # the batches are in the file
    code, replayed, err = await kvtop("check", "--replay", str(recording), "--json")
    assert code == EXIT_NO_DATA, err
    assert replayed is not None
    again = engine_verdict(replayed)["kv_events"]
    assert again is not None and again["stored_total"] > 0 and again["leak"] == live["leak"]


def test_kv_events_are_for_live_targets_not_a_replay(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path / "r.jsonl", [Scrape(TARGET, T0, body=body(0.0))])
    assert main(["check", "--replay", str(path), "--kv-events", "tcp://h:1"]) == EXIT_USAGE
    assert "--kv-events" in capsys.readouterr().err


def test_ctrl_c_during_a_live_check_exits_130_with_the_verdict_so_far(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FaultServer(bodies=[body(0.0).encode()])) as server:
        target = Target.from_spec(server.url())

        def interrupt_soon(scrape: Scrape) -> None:
            if server.hits == 5:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C at the terminal

        source = DirectSource([target], interval_s=0.05, timeout_s=10.0, insecure=False,
                              narrow=True)
        started = time.monotonic()
        with tapped(source, interrupt_soon):
            code = check(source, params=None, duration_s=60.0, as_json=False)
    assert code == EXIT_INTERRUPTED == 130
    assert time.monotonic() - started < 30  # not the 60 s asked for
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kvtop check: OK (") and lines[0].endswith(
        " (interrupted: the verdict so far)")


@contextlib.contextmanager
def tapped(source: DirectSource, tap: Callable[[Scrape], None]) -> Iterator[None]:
    """Call ``tap`` on every scrape the source's poller delivers, before the consumer."""
    live = source.live()
    assert live is not None
    original = live.run

    async def run(on_scrape: Any, *, stop: asyncio.Event) -> None:
        def both(scrape: Scrape) -> Any:
            tap(scrape)
            return on_scrape(scrape)
        await original(both, stop=stop)

    live.run = run  # type: ignore[method-assign]
    yield


def test_a_check_of_part_of_a_recording_judges_only_that_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path / "r.jsonl", [*quiet(6), *idle_holding(12, start=T0 + 60)])
    assert main(["check", "--replay", str(path), "--until", "50s", "--json"]) == EXIT_OK
    quiet_part = json.loads(capsys.readouterr().out)
    assert quiet_part["duration_s"] == 50.0 and quiet_part["verdict"] == "ok"
    assert main(["check", "--replay", str(path), "--since", "1m", "--json"]) == EXIT_LEAK
    leaking = json.loads(capsys.readouterr().out)
    assert leaking["started_at"] == "2026-01-01T00:01:00.000+00:00"
    moment = "2026-01-01T00:01:00Z"
    assert main(["check", "--replay", str(path), "--since", moment, "--until", "110s",
                 "--json"]) == EXIT_OK  # 50 s held: WATCH, not yet the 60 s of a LEAK
    cut = json.loads(capsys.readouterr().out)
    assert (cut["started_at"], cut["duration_s"]) == ("2026-01-01T00:01:00.000+00:00", 50.0)
    assert cut["verdict"] == "watch"


@pytest.mark.parametrize(("argv", "error"), [
    (["--since", "10m"], "--since and --until cut a recording: give them with --replay"),
    (["--replay", "r.jsonl", "--until", "yesterday"], "not a time: 'yesterday'"),
    (["--replay", "r.jsonl", "--since=-5m"], "an offset must be finite and >= 0"),
])
def test_a_time_range_needs_a_recording_and_a_time(argv: list[str], error: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.suppress(SystemExit):
        assert main(["check", *argv]) == EXIT_USAGE
    assert error in capsys.readouterr().err
