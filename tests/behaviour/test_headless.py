"""Headless commands as a script runs them, in this process (so the mutation runs see them):
JSON unless a person is at a terminal, the exit code of ``kvtop snapshot``, a long command
stopped by SIGTERM or its duration."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import ssl
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvtop.collect.clock import stop_event
from kvtop.collect.target import Target
from kvtop.commands.snapshot import (
    EXIT_OK,
    EXIT_UNREADABLE,
    collect_states,
    print_snapshot,
    run_snapshot,
    snapshot_exit_code,
)
from kvtop.contract import json_number
from kvtop.report.output import emit
from tests.faultserver import FaultServer, closed_port, fixture, served_in_thread


def test_json_for_a_script_text_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[dict[str, Any]] = []
    document = {"kvtop_snapshot": 1, "x": [1, 2]}
    emit(document, None, shown.append)  # stdout is a pipe here: JSON
    out = capsys.readouterr().out
    assert out == json.dumps(document, indent=2) + "\n"  # indented by two, one line after
    emit(document, True, shown.append)
    assert json.loads(capsys.readouterr().out) == document
    emit(document, False, shown.append)
    assert capsys.readouterr().out == "" and shown == [document]


def test_json_numbers_are_rounded_and_never_nan_or_infinite() -> None:
    assert json_number(0.123456789) == 0.123457
    assert json_number(12.3456, 1) == 12.3
    assert [json_number(v) for v in (None, math.nan, math.inf, -math.inf)] == [None] * 4
    assert json_number(0.0) == 0.0


async def test_a_long_command_stops_after_its_duration() -> None:
    stop = stop_event(0.05)
    assert not stop.is_set()
    await asyncio.wait_for(stop.wait(), timeout=30)


@pytest.fixture
async def sigterm_not_fatal() -> AsyncIterator[list[int]]:
    """SIGTERM handled by the test itself unless something installs its own handler."""
    reached: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: reached.append(signum))
    yield reached
    asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
    signal.signal(signal.SIGTERM, previous)


async def test_sigterm_stops_a_long_command(sigterm_not_fatal: list[int]) -> None:
    stop = stop_event(None)
    signal.raise_signal(signal.SIGTERM)
    await asyncio.wait_for(stop.wait(), timeout=30)
    assert sigterm_not_fatal == []  # the command's handler had it, not the default


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


def test_a_long_command_outside_the_main_thread_still_stops_after_its_duration() -> None:
    """Signal handlers can only be set in the main thread: elsewhere the duration alone."""
    stopped: list[bool] = []

    async def command() -> None:
        stop = stop_event(0.05)
        await asyncio.wait_for(stop.wait(), timeout=30)
        stopped.append(True)

    thread = threading.Thread(target=lambda: asyncio.run(command()))
    thread.start()
    thread.join(60)
    assert stopped == [True]
