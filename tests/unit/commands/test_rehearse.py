"""`kvtop rehearse` on the command line: usage errors, targets it refuses, watch-only, the
text report and progress, and no secret anywhere.

`kvtop rehearse`'s command line in this process (so the mutation runs see it): what each
option becomes in the rehearsal, the defaults docs/rehearse.md gives, the usage errors and
their words, and a run against a real server on 127.0.0.1 that is refused or judged (the
exit code, the progress line, the report on stdout)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvtop.cli import build_command_parser, main
from kvtop.collect.target import Target
from kvtop.commands import rehearse as rehearse_command
from kvtop.commands.rehearse import settings_from_args
from kvtop.config import ConfigError
from kvtop.derive.leak_params import LeakParams
from kvtop.load.driver import RequestRecord, RunClock
from kvtop.load.workloads import NAMED
from kvtop.rehearse.progress import Progress
from kvtop.rehearse.report import render_text
from kvtop.rehearse.requests import RequestTable
from kvtop.rehearse.run import RehearsalSettings
from kvtop.rehearse.verdict import DEFAULT_MAX_ERROR_RATE
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.faultserver import FaultServer, closed_port, served_in_thread
from tests.scenarios.check_runs import body as idle_body
from tests.support.cli import kvtop_command, kvtop_sim


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
    assert done.returncode in (0, 1, 3), done.stderr
    doc = json.loads(done.stdout)
    if doc["criteria"]["kv_free"]["state"] == "not_judged":  # never idle, detector warming up
        assert done.returncode == 3 and doc["verdict"] == "no-verdict"
        assert doc["missing"][0].startswith("needs an idle floor before and after the load")
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
    assert line.startswith("0:00:00 / 1:00:00 | 5 done, 1 failed, 0 dropped, ")
    assert "TTFT p50 250ms p99 250ms" in line and "KV 42%" in line
    assert not progress.tty and Progress(terminal, RunClock(), 1.0, None, lambda: None,
                                         dict).tty


SERVER = "http://gpu-1:8000"


def settings(*argv: str) -> RehearsalSettings:
    return settings_from_args(build_command_parser().parse_args(["rehearse", *argv]))


def refused(*argv: str) -> str:
    with pytest.raises(ConfigError) as error:
        settings(*argv)
    return str(error.value)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*argv: str, tty: bool = False) -> tuple[int, str, str]:
    out, err = (Terminal(), Terminal()) if tty else (io.StringIO(), io.StringIO())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["rehearse", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    done = settings("gpu-1:8000")
    assert done.metrics == Target.from_spec(SERVER + "/metrics")
    assert done.api_base == SERVER + "/v1"
    assert done.duration_s == 3 * 3600
    assert re.fullmatch(r"rehearsal-\d{8}-\d{6}", done.out_dir.name)
    assert done.out_dir.parent == tmp_path  # ./rehearsal-DATE-TIME
    assert (done.workload, done.rate, done.concurrency, done.model) == ("mixed", None, None, None)
    assert (done.strict, done.watch_only, done.chat, done.token_ids) == (False,) * 4
    assert (done.interval_s, done.request_timeout_s, done.retries) == (1.0, 300.0, 1)
    assert (done.time_scale, done.max_error_rate) == (1.0, 0.01)
    assert (done.scrape_timeout_s, done.insecure, done.full_metrics) == (None, False, False)
    assert done.leak_params == LeakParams()


def test_every_option_reaches_the_rehearsal(tmp_path: Path) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text("[thresholds]\nleak_persist_s = 1234\n")
    done = settings("https://gpu-1:8000/v1/", "--duration", "90m", "--workload", "azure",
                    "--rate", "2.5", "--concurrency", "16", "--model", "llama",
                    "--out", str(tmp_path / "out"), "--strict", "--token-ids",
                    "--interval", "2", "--request-timeout", "30", "--retries", "0",
                    "--max-errors", "5", "--time-scale", "10", "--timeout", "3",
                    "--insecure", "--full-metrics", "--config", str(config))
    assert done.metrics.url == "https://gpu-1:8000/metrics"
    assert done.api_base == "https://gpu-1:8000/v1"
    assert (done.duration_s, done.workload, done.rate, done.concurrency, done.model) == (
        5400, "azure", 2.5, 16, "llama")
    assert done.out_dir == tmp_path / "out"
    assert (done.strict, done.watch_only, done.chat, done.token_ids) == (True, False, False, True)
    assert (done.interval_s, done.request_timeout_s, done.retries) == (2.0, 30.0, 0)
    assert (done.time_scale, done.max_error_rate, done.scrape_timeout_s) == (10.0, 0.05, 3.0)
    assert done.insecure and done.full_metrics
    assert done.leak_params == LeakParams(leak_persist_s=1234)
    assert settings("gpu-1:8000", "--chat").chat
    assert settings("gpu-1:8000", "--max-errors", "0").max_error_rate == 0


def test_watch_only_sends_nothing_and_refuses_load_options_by_name() -> None:
    done = settings("gpu-1:8000/metrics", "--watch-only", "--workload", "mixed")
    assert done.watch_only and done.api_base is None
    assert done.metrics.url == SERVER + "/metrics"
    assert refused("gpu-1:8000", "--watch-only", "--rate", "3", "--workload", "azure",
                   "--chat") == "--watch-only drives no load: drop --workload, --rate, --chat"
    assert refused("gpu-1:8000", "--watch-only", "--concurrency", "2", "--model", "m",
                   "--token-ids") == ("--watch-only drives no load: drop --concurrency, "
                                      "--model, --token-ids")


def test_usage_errors_say_what_is_wrong(tmp_path: Path) -> None:
    assert refused() == refused("a:1", "b:2") == (
        "kvtop rehearse takes one TARGET: host:port or the server's URL")
    assert refused("a:1", "--retries", "-1") == "--retries and --max-errors must be >= 0"
    assert refused("a:1", "--token-ids", "--chat") == (
        "--token-ids sends completions; a chat takes text")
    assert refused("a:1", "--workload", "everything") == (
        "--workload 'everything': choose mixed, shared-prefix, mooncake, azure or trace:FILE")
    missing = tmp_path / "none.csv"
    assert refused("a:1", "--workload", f"trace:{missing}") == (
        f"--workload trace:{missing}: no such file")
    assert refused("a:1", "--workload", f"trace:{tmp_path}") == (  # a folder is no trace
        f"--workload trace:{tmp_path}: no such file")
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_length,output_length\n0,10,10\n")
    assert settings("a:1", "--workload", f"trace:{trace}").workload == f"trace:{trace}"
    for name in ("mixed", "shared-prefix", "mooncake", "azure"):
        assert settings("a:1", "--workload", name).workload == name


def test_a_trace_in_the_home_folder_may_be_named_with_a_tilde(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "trace.csv").write_text("timestamp,input_length,output_length\n0,10,10\n")
    assert settings("a:1", "--workload", "trace:~/trace.csv").workload == "trace:~/trace.csv"


@pytest.mark.parametrize(("option", "value", "error"), [
    ("--rate", "0", "must be a finite number > 0"),
    ("--rate", "-1", "must be a finite number > 0"),
    ("--rate", "inf", "must be a finite number > 0"),
    ("--rate", "nan", "must be a finite number > 0"),
    ("--rate", "fast", "not a number: 'fast'"),
    ("--concurrency", "2.5", "not a number: '2.5'"),
    ("--interval", "0", "must be a finite number > 0"),
    ("--request-timeout", "-5", "must be a finite number > 0"),
    ("--time-scale", "0", "must be a finite number > 0"),
])
def test_numbers_that_must_be_positive(option: str, value: str, error: str) -> None:
    code, out, err = run("a:1", option, value)
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == f"kvtop rehearse: error: argument {option}: {error}"


def test_positive_numbers_are_taken_as_given() -> None:
    done = settings("a:1", "--rate", "0.25", "--concurrency", "1", "--interval", "1e-3")
    assert (done.rate, done.concurrency, done.interval_s) == (0.25, 1, 0.001)
    assert isinstance(done.concurrency, int)


def test_the_server_is_found_from_any_of_its_urls() -> None:
    for given in ("gpu-1:8000", "http://gpu-1:8000/", "http://gpu-1:8000/v1",
                  "http://gpu-1:8000/metrics/", "http://gpu-1:8000/metrics?x=1"):
        done = settings(given)
        assert (done.metrics.url, done.api_base) == (SERVER + "/metrics", SERVER + "/v1"), given
    odd = settings("https://proxy/route-X")  # only slashes are trimmed from the end
    assert odd.api_base == "https://proxy/route-X/v1"
    behind = settings("https://proxy/llm/v1")
    assert (behind.metrics.url, behind.api_base) == ("https://proxy/llm/metrics",
                                                     "https://proxy/llm/v1")


def test_a_server_that_is_not_openai_compatible_cannot_be_rehearsed(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    with served_in_thread(FaultServer()) as server:
        base = server.base_url
        code, out, err = run(server.url(), "--duration", "5s", "--no-gpu", "--out", str(out_dir))
        quiet = run(server.url(), "--duration", "5s", "--no-gpu", "--quiet", "--out",
                    str(out_dir))
    refusal = (f"kvtop rehearse: {base}/v1/models did not answer with an OpenAI model list "
               '({"data": [{"id": ...}]}): not an OpenAI-compatible server')
    assert code == 3 and out == ""
    assert err.splitlines() == [f"kvtop rehearse: {base}/v1 for 5 s -> {out_dir}", refusal]
    assert quiet == (3, "", refusal + "\n")


def test_an_out_folder_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    taken = tmp_path / "file"
    taken.write_text("")
    with served_in_thread(FaultServer()) as server:
        code, out, err = run(server.url(), "--no-gpu", "--quiet", "--out", str(taken))
    assert (code, out) == (2, "")
    assert err == f"kvtop rehearse: cannot write to {taken}: File exists\n"


def test_watch_only_watches_the_metrics_and_reports_as_json(tmp_path: Path) -> None:
    """An idle server: its floor is read, but no latency is seen, so no verdict (exit 3)
    that says what is missing."""
    out_dir = tmp_path / "out"
    with served_in_thread(FaultServer(bodies=[idle_body(0.0).encode()])) as server:
        url = server.url()
        code, out, err = run(url, "--watch-only", "--duration", "60s", "--time-scale", "20",
                             "--interval", "0.2", "--no-gpu", "--out", str(out_dir))
    doc = json.loads(out)  # JSON: stdout is not a terminal
    assert code == 3 and doc["verdict"] == "no-verdict"
    assert doc["criteria"]["kv_free"]["state"] == "ok"
    assert doc["missing"] == ["the server exported no TTFT observations in the first third"]
    assert doc["settings"]["watch_only"] and doc["target"]["api"] is None
    assert err.splitlines()[0] == f"kvtop rehearse: {url} for 60 s -> {out_dir}"
    assert (out_dir / "recording.jsonl.gz").exists()


def test_a_server_holding_requests_without_progress_is_no_go_and_stops_early(
        tmp_path: Path) -> None:
    """The fixture's counters never move while 30 requests run and 149 wait: STALLED, a
    NO-GO by itself, so the watching ends long before its 60 s."""
    with served_in_thread(FaultServer()) as server:
        code, out, _ = run(server.url(), "--watch-only", "--duration", "60s", "--time-scale",
                           "20", "--interval", "0.2", "--no-gpu", "--out", str(tmp_path / "o"))
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "no-go"
    assert doc["reasons"] == ["stalled: twin-llama 0: KV pool 98% full with 149 requests "
                              "waiting: no token generated for 5 s (30 running)"]
    assert doc["run"]["stopped"] == "stalled" and doc["run"]["load_s"] < 30
    assert doc["run"]["stopped_reason"].startswith("twin-llama 0: STALLED (KV pool 98% full")
    assert doc["stall"]["state"] == "stalled" and doc["stall"]["engine"] == "twin-llama 0"
    with served_in_thread(FaultServer()) as server:
        code, out, _ = run(server.url(), "--watch-only", "--duration", "30s", "--time-scale",
                           "20", "--interval", "0.2", "--no-gpu", "--full-duration", "--out",
                           str(tmp_path / "full"))
    full = json.loads(out)
    assert code == 1 and full["run"]["stopped"] == "duration" and full["run"]["load_s"] >= 30
    assert full["settings"]["full_duration"] is True


WATCH = ("--watch-only", "--duration", "20s", "--time-scale", "20", "--interval", "0.2")


def test_a_person_at_a_terminal_gets_the_text_report_and_progress(tmp_path: Path) -> None:
    with served_in_thread(FaultServer(bodies=[idle_body(0.0).encode()])) as server:
        code, out, err = run(server.url(), *WATCH, "--duration", "60s", "--no-gpu", "--out",
                             str(tmp_path / "a"), tty=True)  # 3 s: a redraw a second
        as_json = run(server.url(), *WATCH, "--no-gpu", "--json", "--quiet", "--out",
                      str(tmp_path / "b"), tty=True)
        quiet = run(server.url(), *WATCH, "--no-gpu", "--quiet", "--out", str(tmp_path / "c"),
                    tty=True)
    assert code == 3 and out.startswith("kvtop rehearse: NO-VERDICT\n")
    assert re.search(r"\r\S+ / \S+ \| KV .*\x1b\[K", err)  # the progress line, redrawn
    assert as_json[0] == 3 and json.loads(as_json[1])["verdict"] == "no-verdict"
    assert quiet[0] == 3 and quiet[2] == ""


def test_local_gpus_are_read_unless_told_not_to(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeGpuReader()
    monkeypatch.setattr("kvtop.collect.nvml.NvmlReader", lambda: nvml)
    with served_in_thread(FaultServer(bodies=[idle_body(0.0).encode()])) as server:
        assert run(server.url(), *WATCH, "--quiet", "--out", str(tmp_path / "a"))[0] == 3
        reads = nvml.reads
        assert run(server.url(), *WATCH, "--quiet", "--no-gpu", "--out",
                   str(tmp_path / "b"))[0] == 3
    assert reads > 0 and nvml.reads == reads
    assert (tmp_path / "a" / "gpus.jsonl").exists() and not (tmp_path / "b" / "gpus.jsonl").exists()
