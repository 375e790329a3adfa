"""What ``kvtop check`` promises a script or a person (docs/check-json.md), in this process so
the mutation runs see it: each engine's worst verdict and when WATCH, LEAK, STALLED and
SATURATED were first reached, the exit code (a leak over a stall over no data), the span
judged, the text a person reads, the progress line on a terminal only, and a recording
judged as it was recorded."""

from __future__ import annotations

import io
import json
import ssl
from pathlib import Path

import pytest

from kvtop.collect.target import Scrape, Target
from kvtop.commands.check import Progress, print_result, run_check_live, run_check_replay
from kvtop.derive.leak import LeakParams
from kvtop.derive.tracker import MAX_TRACKED_ENGINES
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.derive.worst import CheckRun, EngineVerdict
from kvtop.exits import EXIT_LEAK, EXIT_NO_DATA, EXIT_OK, EXIT_STALLED, EXIT_USAGE
from kvtop.store.recording import RecordingWriter, read_recording
from kvtop.store.writer import MIN_MAX_BYTES
from tests.faultserver import FaultServer, closed_port, served_in_thread

TARGET = Target.from_spec("127.0.0.1:8000")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 10.0


def body(usage: float, *, running: float = 0.0, tokens: float = 0.0, model: str = "m",
         engine: str = "0") -> str:
    """A vLLM engine of 1000 blocks: ``usage`` of them in use, ``running`` requests,
    ``tokens`` generated so far."""
    labels = f'engine="{engine}",model_name="{model}"'
    return "\n".join([
        f'vllm:cache_config_info{{{labels},num_gpu_blocks="1000",block_size="16"}} 1.0',
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        f"vllm:num_requests_running{{{labels}}} {running}",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        f"vllm:generation_tokens_total{{{labels}}} {tokens}",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0']) + "\n"


def idle_holding(count: int, start: float = T0) -> list[Scrape]:
    """40 blocks held with nothing running: WATCH after 20 s, LEAK after 60 s."""
    return [Scrape(TARGET, start + STEP * i, body=body(0.04)) for i in range(count)]


def quiet(count: int) -> list[Scrape]:
    """Nothing running and nothing held: a healthy idle engine."""
    return [Scrape(TARGET, T0 + STEP * i, body=body(0.0)) for i in range(count)]


def stalling(count: int, *, progress: int = 3, target: Target = TARGET) -> list[Scrape]:
    """Requests running; tokens come out for the first ``progress`` scrapes, then none."""
    return [Scrape(target, T0 + STEP * i,
                   body=body(0.5, running=3, tokens=100 + 50 * min(i, progress - 1)))
            for i in range(count)]


def judged(scrapes: list[Scrape], params: LeakParams | None = None) -> CheckRun:
    run = CheckRun(params)
    for scrape in scrapes:
        run.feed(scrape)
    return run


def engine(run: CheckRun) -> dict[str, object]:
    [target] = run.to_json()["targets"]
    [only] = target["engines"]
    return only


def test_blocks_held_at_idle_are_a_leak_with_when_watch_and_leak_began() -> None:
    run = judged(idle_holding(12))
    assert run.verdict() == "leak" and run.leak_found and run.exit_code() == EXIT_LEAK == 1
    document = run.to_json()
    assert (document["verdict"], document["stall"]) == ("leak", "ok")
    assert document["started_at"] == "2026-01-01T00:00:00.000+00:00"
    assert document["ended_at"] == "2026-01-01T00:01:50.000+00:00"
    assert document["duration_s"] == 110.0
    entry = engine(run)
    assert (entry["model"], entry["engine"], entry["verdict"]) == ("m", "0", "leak")
    assert (entry["watch_first_t"], entry["leak_first_t"]) == (T0 + 20, T0 + 60)
    assert entry["leaked_blocks"] == 39.0 and entry["slope_blocks_per_hour"] is None
    assert "39 blocks held" in entry["reason"]
    assert entry["stall"] == {"verdict": "ok", "stalled_first_t": None,
                              "saturated_first_t": None, "reason": "no requests"}


def test_the_detectors_thresholds_are_the_ones_asked_for() -> None:
    patient = LeakParams(idle_leak_s=1000.0)
    run = judged(idle_holding(12), patient)
    assert run.verdict() == "watch" and not run.leak_found
    assert run.exit_code() == EXIT_OK
    assert engine(run)["leak_first_t"] is None and engine(run)["watch_first_t"] == T0 + 20


def test_a_healthy_engine_is_ok_and_exits_0() -> None:
    run = judged(quiet(12))
    assert (run.verdict(), run.stall_verdict(), run.exit_code()) == ("ok", "ok", EXIT_OK)
    entry = engine(run)
    assert entry["verdict"] == "ok" and entry["watch_first_t"] is None
    assert entry["leaked_blocks"] is None


def test_a_stalled_engine_exits_4_with_when_it_stalled() -> None:
    run = judged(stalling(9))
    assert run.stall_verdict() == "stalled" and run.exit_code() == EXIT_STALLED == 4
    stall = engine(run)["stall"]
    assert stall["verdict"] == "stalled" and stall["saturated_first_t"] is None
    assert stall["stalled_first_t"] == T0 + 8 * STEP
    assert stall["reason"] != "not enough data for a verdict"


def test_a_leak_outranks_a_stall_in_the_exit_code() -> None:
    run = judged(idle_holding(12))
    other = Target.from_spec("127.0.0.1:8001")
    for scrape in stalling(9, target=other):
        run.feed(scrape)
    assert (run.verdict(), run.stall_verdict()) == ("leak", "stalled")
    assert run.exit_code() == EXIT_LEAK
    assert [t["target"] for t in run.to_json()["targets"]] == [TARGET.url, other.url]


def test_no_engine_read_is_no_data_exit_3() -> None:
    run = CheckRun()
    run.add_target(TARGET)
    document = run.to_json()
    assert (run.verdict(), run.stall_verdict(), run.exit_code()) == (
        "unknown", "unknown", EXIT_NO_DATA)
    assert document == {"verdict": "unknown", "stall": "unknown", "started_at": None,
                        "ended_at": None, "duration_s": None,
                        "targets": [{"target": TARGET.url, "engines": []}]}


def test_failed_reads_count_in_the_span_but_judge_no_engine() -> None:
    run = judged([Scrape(TARGET, T0 + 5, failure="down", error="refused"),
                  Scrape(TARGET, T0 + 65, failure="timeout", error="slow")])
    assert run.engines_seen() == 0 and run.exit_code() == EXIT_NO_DATA
    assert run.to_json()["duration_s"] == 60.0
    assert run.to_json()["started_at"] == "2026-01-01T00:00:05.000+00:00"


def test_the_span_is_first_to_last_scrape_whatever_order_they_come_in() -> None:
    scrapes = idle_holding(4)
    run = judged([scrapes[2], scrapes[0], scrapes[3], scrapes[1]])
    document = run.to_json()
    assert (document["started_at"], document["duration_s"]) == (
        "2026-01-01T00:00:00.000+00:00", 30.0)


def test_a_scrape_older_than_the_last_read_is_not_judged_again() -> None:
    run = judged(idle_holding(3))
    late = Scrape(TARGET, T0 + 5, body=body(0.04, model="late"))
    run.feed(late)
    assert [e["model"] for t in run.to_json()["targets"] for e in t["engines"]] == ["m"]


def warmup(reason: str = "warming up") -> LeakVerdict:
    return LeakVerdict("warmup", reason, None, None, None)


def leak(state: str, blocks: float | None = None, reason: str = "") -> LeakVerdict:
    return LeakVerdict(state, reason or state, blocks, None, None)  # type: ignore[arg-type]


def test_an_engines_verdict_is_the_worst_it_reached_with_the_latest_figures_at_it() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe(1.0, warmup())
    assert verdict.verdict == "unknown" and verdict.to_json()["reason"] == (
        "not enough data for a verdict")
    verdict.observe(2.0, leak("ok"))
    verdict.observe(3.0, leak("leak", 10.0, "first"))
    verdict.observe(4.0, leak("leak", 12.0, "second"))
    verdict.observe(5.0, leak("watch", 1.0))
    verdict.observe(6.0, leak("ok"))
    verdict.observe(7.0, warmup())
    assert (verdict.verdict, verdict.watch_first_t, verdict.leak_first_t) == ("leak", 3.0, 3.0)
    document = verdict.to_json()
    assert (document["leaked_blocks"], document["reason"]) == (12.0, "second")


def test_watch_is_first_reached_before_a_later_leak() -> None:
    verdict = EngineVerdict("m", "0")
    for t, state in ((1.0, "ok"), (2.0, "watch"), (3.0, "watch"), (4.0, "leak")):
        verdict.observe(t, leak(state))
    assert (verdict.watch_first_t, verdict.leak_first_t) == (2.0, 4.0)


def test_stall_states_are_kept_at_their_worst_with_when_each_began() -> None:
    verdict = EngineVerdict("m", "0")
    for t, state in ((1.0, "unknown"), (2.0, "ok"), (3.0, "saturated"), (4.0, "saturated"),
                     (5.0, "stalled"), (6.0, "stalled"), (7.0, "ok"), (8.0, "unknown")):
        verdict.observe_stall(t, StallVerdict(state, f"{state} at {t:g}", t))  # type: ignore[arg-type]
    document = verdict.to_json()["stall"]
    assert document == {"verdict": "stalled", "stalled_first_t": 5.0, "saturated_first_t": 3.0,
                        "reason": "stalled at 6"}


def test_unknown_stall_is_no_verdict() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe_stall(1.0, StallVerdict("unknown", "no scrape yet", None))
    assert verdict.to_json()["stall"] == {
        "verdict": "unknown", "stalled_first_t": None, "saturated_first_t": None,
        "reason": "not enough data for a verdict"}


def test_engines_a_server_invents_are_forgotten_unless_judged() -> None:
    run = judged(idle_holding(12))  # ("m", "0"): a leak, which stays in the report
    for i in range(MAX_TRACKED_ENGINES + 20):
        run.feed(Scrape(TARGET, T0 + 200 + i, body=body(0.04, model=f"invented-{i}")))
    models = [e["model"] for e in run.to_json()["targets"][0]["engines"]]
    assert "m" in models and len(models) <= MAX_TRACKED_ENGINES + 1
    assert f"invented-{MAX_TRACKED_ENGINES + 19}" in models  # the one read now stays


# -- what a person reads ---------------------------------------------------------------------


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
    assert len(lines) == 2


def test_the_text_says_stalled_in_the_headline_and_under_the_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = text_of(judged(stalling(9)), capsys)
    assert lines[0].startswith("kvtop check: UNKNOWN, STALLED (1m20s judged")
    assert lines[1].startswith(f"  UNKNOWN {TARGET.url} m 0: not enough data for a verdict")
    assert lines[2].startswith(f"  STALLED {TARGET.url} m 0: ")
    assert len(lines) == 3


def test_the_text_of_a_run_with_nothing_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert text_of(CheckRun(), capsys) == ["kvtop check: UNKNOWN"]


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


# -- the progress line -----------------------------------------------------------------------


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


# -- a recording -----------------------------------------------------------------------------


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
    assert run_check_replay(bad, params=None, as_json=True) == EXIT_USAGE == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"kvtop check: {bad}: not a kvtop recording")
    path = recorded(tmp_path / "r.jsonl", idle_holding(12))
    with path.open("a") as file:
        file.write("not json\n")
    assert run_check_replay(path, params=None, as_json=True) == EXIT_LEAK
    assert f"kvtop check: {path}: line 14: not JSON; skipped" in capsys.readouterr().err


# -- live ------------------------------------------------------------------------------------


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


def test_an_engine_with_a_stall_verdict_stays_in_the_report_when_names_are_invented() -> None:
    run = judged(stalling(2))  # ("m", "0"): stall OK, no leak verdict yet
    for i in range(MAX_TRACKED_ENGINES + 20):
        run.feed(Scrape(TARGET, T0 + 200 + i, body=body(0.04, model=f"invented-{i}")))
    kept = {(e["model"], e["stall"]["verdict"]) for e in run.to_json()["targets"][0]["engines"]}
    assert ("m", "ok") in kept


def test_the_text_of_a_saturated_engine_and_one_without_model_or_engine_names(
        capsys: pytest.CaptureFixture[str]) -> None:
    run = CheckRun()
    run.add_target(TARGET)
    saturated = EngineVerdict(None, None)
    saturated.observe_stall(T0, StallVerdict("saturated", "the pool is full", T0))
    run.engines[TARGET.url][(None, None)] = saturated
    assert text_of(run, capsys) == [
        "kvtop check: UNKNOWN, SATURATED",
        f"  UNKNOWN {TARGET.url}: not enough data for a verdict",
        f"  SATURATED {TARGET.url}: the pool is full"]


def test_leak_figures_are_rounded_to_a_tenth_of_a_block() -> None:
    verdict = EngineVerdict("m", "0")
    verdict.observe(T0, LeakVerdict("leak", "held", 12.3456, 3.14159, 2.0))
    document = verdict.to_json()
    assert (document["leaked_blocks"], document["slope_blocks_per_hour"]) == (12.3, 3.1)


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


def test_an_engine_gone_without_a_verdict_stays_listed_while_under_the_cap() -> None:
    run = CheckRun()
    for i in range(MAX_TRACKED_ENGINES):  # each scrape names another engine, judged by none
        run.feed(Scrape(TARGET, T0 + i, body=body(0.04, model=f"m{i}")))
    models = [e["model"] for e in run.to_json()["targets"][0]["engines"]]
    assert models == [f"m{i}" for i in range(MAX_TRACKED_ENGINES)]


def test_the_worst_stall_over_engines_is_the_runs() -> None:
    run = judged(stalling(9))
    never = EngineVerdict("never", "0")
    never.observe_stall(T0, StallVerdict("unknown", "no scrape yet", None))
    run.engines[TARGET.url][("never", "0")] = never
    assert run.stall_verdict() == "stalled" and run.exit_code() == EXIT_STALLED


def test_the_span_judged_is_rounded_to_the_millisecond() -> None:
    run = judged([Scrape(TARGET, T0, failure="down", error="x"),
                  Scrape(TARGET, T0 + 1.2345678, failure="down", error="x")])
    assert run.to_json()["duration_s"] == 1.235
