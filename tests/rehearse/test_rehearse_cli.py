"""`kvtop rehearse` on the command line: usage errors, targets it refuses, watch-only, the
text report and progress, and no secret anywhere."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvtop.cli import main
from kvtop.collect.target import Target
from kvtop.commands import rehearse as rehearse_command
from kvtop.load.driver import RequestRecord, RunClock
from kvtop.load.workloads import NAMED
from kvtop.rehearse.judge import DEFAULT_MAX_ERROR_RATE
from kvtop.rehearse.progress import Progress
from kvtop.rehearse.report import render_text
from kvtop.rehearse.requests import RequestTable
from tests.faultserver import FaultServer, closed_port
from tests.load.fake_openai import FakeOpenAI
from tests.rehearse.test_rehearse_sim import kvtop_command, kvtop_sim


@pytest.mark.parametrize("argv", [
    ["rehearse"],
    ["rehearse", "a:1", "b:2"],
    ["rehearse", "a:1", "--watch-only", "--rate", "3"],
    ["rehearse", "a:1", "--watch-only", "--workload", "shared-prefix"],
    ["rehearse", "a:1", "--token-ids", "--chat"],
    ["rehearse", "a:1", "--workload", "everything"],
    ["rehearse", "a:1", "--workload", "trace:/no/such/file.csv"],
    ["rehearse", "a:1", "--retries", "-1"],
    ["rehearse", "http://user:pw@a:1"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "kvtop: " in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["rehearse", "a:1", "--rate", "0"],
    ["rehearse", "a:1", "--concurrency", "many"],
    ["rehearse", "a:1", "--duration", "soon"],
])
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2  # argparse's usage error, returned like every other exit code
    assert "error: argument" in capsys.readouterr().err


def test_the_target_gives_both_the_api_and_metrics() -> None:
    base = rehearse_command._server_base
    assert base("http://h:8000/metrics") == "http://h:8000"
    assert base("http://h:8000/v1") == "http://h:8000"
    assert base("https://proxy/llm/v1/") == "https://proxy/llm"
    assert base(Target.from_spec("h:8000").url) == "http://h:8000"


def test_the_parsers_copies_of_names_agree_with_the_modules() -> None:
    assert ", ".join(NAMED) == rehearse_command.WORKLOAD_NAMES
    assert rehearse_command.DEFAULT_MAX_ERRORS_PCT / 100 == DEFAULT_MAX_ERROR_RATE


@contextmanager
def served(server: FaultServer | FakeOpenAI) -> Iterator[str]:
    """Serve from a thread's event loop while the test runs `kvtop`; yields the URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(20)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)


def run_cli(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvtop_command(), "rehearse", url, "--duration", "5s", "--out",
                           str(tmp_path / "out"), "--no-gpu", "--quiet", *extra],
                          capture_output=True, text=True, timeout=120)


def test_refuses_what_is_not_an_openai_server(tmp_path: Path) -> None:
    with served(FaultServer()) as url:
        done = run_cli(url, tmp_path)
    assert done.returncode == 3
    assert "not an OpenAI-compatible server" in done.stderr
    assert not (tmp_path / "out/requests.jsonl").exists()  # nothing was sent
    refused = run_cli(f"127.0.0.1:{closed_port()}", tmp_path)
    assert refused.returncode == 3 and "connection refused" in refused.stderr


def test_refuses_a_server_whose_metrics_cannot_be_read(tmp_path: Path) -> None:
    with served(FakeOpenAI()) as url:
        done = run_cli(url, tmp_path, "--time-scale", "10")
    assert done.returncode == 3
    assert "cannot read" in done.stderr and "/metrics" in done.stderr


def test_a_model_it_does_not_serve_is_a_usage_error(tmp_path: Path) -> None:
    with kvtop_sim() as url:
        done = run_cli(url, tmp_path, "--model", "gpt-5")
    assert done.returncode == 2
    assert "--model 'gpt-5' is not served there; it serves 'sim-llama-3-8b'" in done.stderr


def test_watch_only_judges_the_servers_own_histograms(tmp_path: Path) -> None:
    """The simulator makes up its own load; kvtop only watches."""
    process = subprocess.Popen([*kvtop_command(), "sim", "--port", "0", "--speed", "10",
                                "--rate", "4"], stdout=subprocess.PIPE, text=True)
    try:
        url = (process.stdout.readline() if process.stdout else "").strip()
        done = run_cli(url, tmp_path, "--watch-only", "--duration", "90s", "--time-scale",
                       "10", "--interval", "2", "--json")
    finally:
        process.terminate()
        process.wait(20)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert doc["requests"] is None and doc["settings"]["watch_only"]
    assert doc["target"]["api"] is None and doc["files"]["requests"] is None
    latency = doc["criteria"]["latency"]
    assert latency["state"] != "not_judged", latency["reason"]
    assert latency["figures"]["source"] == "the server's TTFT histogram"
    assert doc["criteria"]["kv_free"]["state"] in ("ok", "watch", "not_judged")


def test_no_token_in_any_file_or_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    monkeypatch.setenv("SIM_TOKEN", "tok-Zq9-secret")
    process = subprocess.Popen([*kvtop_command(), "sim", "--port", "0", "--workload", "none",
                                "--speed", "10", "--require-token-env", "SIM_TOKEN"],
                               stdout=subprocess.PIPE, text=True)
    try:
        url = (process.stdout.readline() if process.stdout else "").strip()
        done = run_cli(url, tmp_path, "--token-env", "SIM_TOKEN", "--time-scale", "10",
                       "--duration", "20s", "--interval", "2", "--json")
    finally:
        process.terminate()
        process.wait(20)
    assert done.returncode in (0, 1, 3), done.stderr
    assert json.loads(done.stdout)["requests"]["ok"] > 0  # the token was sent, and worked
    for path in (tmp_path / "out").iterdir():
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        assert b"tok-Zq9-secret" not in data, path
    assert "tok-Zq9-secret" not in done.stdout + done.stderr


def test_outside_text_is_made_safe_in_the_text_report() -> None:
    doc = {
        "verdict": "go", "reasons": [], "rule": "r",
        "target": {"api": "http://h/v1", "metrics": "http://h/metrics",
                   "model": "evil\x1b]52;c;AAAA\x07", "server": {"kind": "vllm",
                                                                  "version": "0.33.0"}},
        "settings": {"watch_only": False, "rate": 1.0, "concurrency": 8,
                     "workload": "mixed", "duration_s": 60.0, "time_scale": 1.0},
        "run": {"load_s": 60.0, "stopped": "duration", "restarts_s": []},
        "criteria": {name: {"state": "ok", "reason": "fine\x1b[2J", "figures": {}}
                     for name in ("gpu_memory", "kv_free", "latency")},
        "requests": None, "server": {}, "kv": {"engines": []}, "advice": [], "files": {}}
    text = render_text(doc)
    assert "\x1b" not in text and "\\x1b]52" in text


def test_progress_lines() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    table = RequestTable()
    for i in range(5):
        table.add(RequestRecord(i, 1, "short", float(i), 0.0, "ok", 10, 10, ttft_s=0.25))
    table.add(RequestRecord(9, 1, "short", 9.0, 0.0, "timeout", 10, 10))
    plain, terminal = io.StringIO(), Terminal()
    progress = Progress(plain, RunClock(), 3600.0, table, lambda: 0.42,
                        lambda: {"KV": "ok", "latency": "-"})
    for i in range(5):
        progress.add(RequestRecord(i, 1, "short", float(i), 0.0, "ok", 10, 10, ttft_s=0.25))
    line = progress.line()
    assert line.startswith("0:00:00 / 1:00:00 | 5 done, 1 failed, 0 dropped")
    assert "TTFT p50 250ms p99 250ms" in line and "KV 42%" in line
    assert not progress.tty and Progress(terminal, RunClock(), 1.0, None, lambda: None,
                                         dict).tty
