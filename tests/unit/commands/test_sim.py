"""`kvtop sim` on the command line, in this process: each option, its default and what it
becomes in the simulated servers' configs; its usage errors and exit codes (kvtop/exits.py);
and servers that print their URLs, answer, and stop on Ctrl-C."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kvtop.cli import build_command_parser, main
from kvtop.commands import sim as sim_command
from kvtop.commands.sim import CPU_SHARE, configs_from_args
from kvtop.config import ConfigError
from kvtop.exits import EXIT_CANNOT_LISTEN, EXIT_OK, EXIT_USAGE
from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import Fault
from kvtop.sim.server import SimConfig
from tests.support.waiting import wait_until


def args(*argv: str) -> dict[str, object]:
    parsed = vars(build_command_parser().parse_args(["sim", *argv]))
    assert parsed.pop("command") is sim_command.run
    parsed.pop("reference")
    return parsed


def configs(*argv: str) -> list[SimConfig]:
    return configs_from_args(build_command_parser().parse_args(["sim", *argv]))


def test_the_defaults_are_the_documented_ones() -> None:
    assert args() == {
        "port": 8001, "count": 1, "workload": "synthetic", "rate": None, "blocks": 2000,
        "block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
        "max_model_len": None, "no_prefix_caching": False, "kv_cache_metrics": False,
        "kv_events_port": None, "kv_events_replay_port": 0, "leak_frac": 0.0, "leak_at": 0.0,
        "restart_at": [], "stall_at": None, "stall_for": None, "wedge_at": None,
        "slow_metrics": 0.0, "hang_at": None, "malformed_at": None, "require_token_env": None,
        "names": "v1", "model_name": "sim-llama-3-8b", "speed": 1.0, "seed": 0}
    assert configs() == [SimConfig(port=8001, engine=EngineConfig(), workload="synthetic",
                                   workload_params={}, faults=[], names="v1", speed=1.0,
                                   seed=0, cpu_share=CPU_SHARE, kv_events_port=None,
                                   kv_events_replay_port=0)]
    assert CPU_SHARE == 0.75


def test_every_option_reaches_the_servers() -> None:
    (config,) = configs(
        "--port", "9000", "--workload", "none", "--blocks", "500", "--block-size", "32",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "1024", "--max-model-len", "4096",
        "--no-prefix-caching", "--kv-cache-metrics", "--names", "sglang", "--model-name",
        "tiny", "--speed", "20", "--seed", "7", "--kv-events-port", "7000",
        "--kv-events-replay-port", "7100")
    assert config == SimConfig(
        model_name="tiny", port=9000,
        engine=EngineConfig(num_gpu_blocks=500, block_size=32, max_num_seqs=8,
                            max_num_batched_tokens=1024, max_model_len=4096,
                            enable_prefix_caching=False, kv_cache_metrics=True),
        workload="none", workload_params={}, faults=[], names="sglang", speed=20.0, seed=7,
        cpu_share=CPU_SHARE, kv_events_port=7000, kv_events_replay_port=7100)


def test_each_fault_flag_plans_its_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_TOKEN", "t0k")
    (config,) = configs("--leak-frac", "0.25", "--leak-at", "30", "--restart-at", "10",
                        "--restart-at", "20", "--stall-at", "40", "--stall-for", "5",
                        "--wedge-at", "50", "--slow-metrics", "0.5", "--hang-at", "60",
                        "--malformed-at", "70", "--require-token-env", "SIM_TOKEN")
    assert list(config.faults) == [
        Fault(10.0, "restart"), Fault(20.0, "restart"), Fault(30.0, "leak", 0.25),
        Fault(40.0, "stall", 5.0), Fault(50.0, "wedge"), Fault(0.0, "slow", 0.5),
        Fault(60.0, "hang"), Fault(70.0, "malformed"), Fault(0.0, "auth", "t0k")]


def test_the_rate_is_the_synthetic_rate_or_the_traces_scale_and_none_makes_up_nothing(
        ) -> None:
    assert configs("--rate", "3")[0].workload_params == {"rate": 3.0}
    assert configs("--workload", "azure", "--rate", "0.5")[0].workload_params == {
        "rate_scale": 0.5}
    assert configs("--workload", "mooncake", "--rate", "2")[0].workload_params == {
        "rate_scale": 2.0}
    assert configs("--workload", "none", "--rate", "3")[0].workload_params == {}
    assert configs("--workload", "mooncake")[0].workload_params == {}


def test_servers_take_consecutive_ports_and_seeds_and_share_the_cpu() -> None:
    fleet = configs("--count", "3", "--port", "9000", "--seed", "5", "--kv-events-port",
                    "7000", "--kv-events-replay-port", "7100")
    assert [(c.port, c.seed, c.kv_events_port, c.kv_events_replay_port) for c in fleet] == [
        (9000, 5, 7000, 7100), (9001, 6, 7001, 7101), (9002, 7, 7002, 7102)]
    assert {c.cpu_share for c in fleet} == {CPU_SHARE / 3}
    ephemeral = configs("--count", "2", "--port", "0", "--kv-events-port", "0")
    assert [(c.port, c.kv_events_port, c.kv_events_replay_port) for c in ephemeral] == [
        (0, 0, 0), (0, 0, 0)]  # 0: an ephemeral port for each
    assert [c.kv_events_port for c in configs("--count", "2")] == [None, None]  # off


@pytest.mark.parametrize("value", [None, ""])
def test_a_token_variable_that_is_unset_or_empty_is_a_usage_error(
        value: str | None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SIM_TOKEN", raising=False)
    if value is not None:
        monkeypatch.setenv("SIM_TOKEN", value)
    with pytest.raises(ConfigError) as error:
        configs("--require-token-env", "SIM_TOKEN")
    assert str(error.value) == "--require-token-env: $SIM_TOKEN is empty or unset"
    assert main(["sim", "--require-token-env", "SIM_TOKEN"]) == EXIT_USAGE
    assert capsys.readouterr().err == "kvtop: --require-token-env: $SIM_TOKEN is empty or unset\n"


@pytest.mark.parametrize(("argv", "error"), [
    (["--rate", "0"], "argument --rate: must be a finite number > 0 (got '0')"),
    (["--speed", "-1"], "argument --speed: must be a finite number > 0 (got '-1')"),
    (["--leak-frac", "1.5"],
     "argument --leak-frac: must be a finite number from 0 to 1 (got '1.5')"),
    (["--leak-at", "-1"], "argument --leak-at: must be a finite number >= 0 (got '-1')"),
    (["--stall-for", "0"], "argument --stall-for: must be a finite number > 0 (got '0')"),
    (["--port", "x"], "argument --port: invalid int value: 'x'"),
    # the choices, quoted since Python 3.12
    (["--workload", "all"], "argument --workload: invalid choice: 'all' (choose from "
                            "synthetic, mooncake, azure, none)"),
    (["--names", "v2"], "argument --names: invalid choice: 'v2' (choose from v1, v0, sglang)"),
])
def test_bad_values_are_usage_errors(argv: list[str], error: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *argv]) == EXIT_USAGE
    said = capsys.readouterr().err.splitlines()[-1]
    head, _, choices = said.partition("(choose from ")
    assert head + _ + choices.replace("'", "") == f"kvtop sim: error: {error}"


@contextmanager
def frozen_gc_undone() -> Iterator[None]:
    """`kvtop sim` freezes the collector as it ends (a fast exit); this process goes on."""
    try:
        yield
    finally:
        gc.unfreeze()


def test_a_missing_trace_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVTOP_TRACES_DIR", str(tmp_path))
    with frozen_gc_undone():
        assert main(["sim", "--workload", "mooncake", "--port", "0"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"kvtop sim: trace {tmp_path}/mooncake_conversation_trace.jsonl.gz not found "
        "(from $KVTOP_TRACES_DIR)\n")


def test_a_port_in_use_cannot_be_listened_on(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken, frozen_gc_undone():
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["sim", "--port", str(port), "--workload", "none"]) == EXIT_CANNOT_LISTEN
    err = capsys.readouterr().err
    assert err.startswith("kvtop sim: cannot listen: [Errno 98] ") and str(port) in err


class Lines(io.StringIO):
    """stdout that another thread may read while `kvtop sim` writes it: what was flushed, as
    a pipe to another process would show it."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed = ""

    def flush(self) -> None:
        self.flushed = self.getvalue()

    def lines(self) -> list[str]:
        return self.flushed.splitlines()


def serve_until_ctrl_c(*argv: str, check: int) -> tuple[int, list[str], list[int]]:
    """`kvtop sim ARGV` in this thread until a helper thread has read each server's
    /metrics and pressed Ctrl-C; its exit code, its stdout and the status codes read."""
    out, statuses = Lines(), []

    def press_ctrl_c() -> None:
        try:
            wait_until(lambda: len(out.lines()) == check, "the servers' URLs", timeout_s=15)
            for line in out.lines():
                statuses.append(httpx.get(line.split()[0], timeout=10).status_code)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=press_ctrl_c)
    with contextlib.redirect_stdout(out), frozen_gc_undone():
        gc.freeze()
        frozen_at_start = gc.get_freeze_count()  # what main() freezes as it starts
        gc.unfreeze()
        helper.start()
        code = main(["sim", *argv])
        # and what serving made is frozen as it ends: the interpreter's exit skips it
        assert gc.get_freeze_count() > frozen_at_start + 1000
    helper.join(30)
    return code, out.lines(), statuses


def test_ctrl_c_where_no_signal_handler_can_be_set_ends_it_quietly_with_0() -> None:
    """In a thread no signal handler can be set: Ctrl-C comes as a KeyboardInterrupt in the
    middle of serving (planted here as that thread's asynchronous exception)."""
    args = build_command_parser().parse_args(["sim", "--port", "0", "--workload", "none"])
    ended: list[object] = []

    def serve() -> None:
        try:
            ended.append(sim_command.run(args))
        except BaseException as exc:  # the test reports what escaped
            ended.append(exc)

    out = Lines()
    with contextlib.redirect_stdout(out), frozen_gc_undone():
        thread = threading.Thread(target=serve)
        thread.start()
        wait_until(lambda: len(out.lines()) == 1, "the server's URL")
        assert ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident or 0), ctypes.py_object(KeyboardInterrupt)) == 1
        thread.join(30)
    assert ended == [EXIT_OK]


def test_each_server_prints_its_url_and_answers_until_ctrl_c() -> None:
    code, lines, statuses = serve_until_ctrl_c("--port", "0", "--count", "2", "--workload",
                                               "none", check=2)
    assert code == EXIT_OK and statuses == [200, 200]
    assert [line.split(":")[0:2] for line in lines] == [["http", "//127.0.0.1"]] * 2
    assert all(line.endswith("/metrics") for line in lines) and lines[0] != lines[1]


def test_a_server_publishing_kv_events_names_both_sockets() -> None:
    code, (line,), statuses = serve_until_ctrl_c("--port", "0", "--workload", "none",
                                                 "--kv-events-port", "0", check=1)
    assert code == EXIT_OK and statuses == [200]
    url, kv_word, events, replay_word, replay = line.split(" ")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert (kv_word, replay_word) == ("kv-events", "replay")
    assert events.startswith("tcp://127.0.0.1:") and replay.startswith("tcp://127.0.0.1:")
    assert events != replay
