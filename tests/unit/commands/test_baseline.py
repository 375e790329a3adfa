"""`kvtop baseline` and `kvtop compare` as a user meets them: usage errors and refusals
(exit 2, a message that says what to do), no data (exit 3), list/show/rm, and text output
that shows outside strings (model names, config values) written out, never acted on.

`kvtop baseline` and `kvtop compare` in this process (so the mutation runs see them), on
what the tests above leave to a word or two: live runs against a real server
on 127.0.0.1 (what is saved, what stderr and stdout say), --probe refused by a server that is
not OpenAI-compatible, the probe count's limits, a baseline saved at a path, the list's JSON,
rm's and show's words, a recording's warnings passed on."""

from __future__ import annotations

import contextlib
import io
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from benchmarks.baseline_eval.scenarios import HEALTHY, RunSpec, write_recording
from kvtop.cli import build_command_parser, main
from kvtop.store.recording import read_recording
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_openai import MODEL, FakeOpenAI
from tests.fakes.faultserver import FaultServer, closed_port, fixture, served_in_thread

HOSTILE_MODEL = "evil\x1b]52;c;aGk=\x07\x1b[2J[link=http://x]m[/link]\u202e"


@pytest.fixture(scope="module")
def five_minutes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short healthy recording (5 minutes)."""
    return write_recording(HEALTHY.but(minutes=5),
                           tmp_path_factory.mktemp("rec") / "small.jsonl.gz")


def run_captured(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_errors_exit_2_with_a_reason(five_minutes: Path, data_home: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_captured(capsys, "baseline", "save", "x", "gpu-1:8000",
                                "--from", str(five_minutes))
    assert code == 2 and "--from reads a recording" in err
    code, _, err = run_captured(capsys, "baseline", "save", "no good", "--from", str(five_minutes))
    assert code == 2 and "not a baseline name" in err
    code, _, err = run_captured(capsys, "compare", "nothing-saved", "--replay", str(five_minutes))
    assert code == 2 and "no baseline 'nothing-saved'" in err and "kvtop baseline list" in err
    assert run_captured(capsys, "baseline", "save", "ok", "--from", str(five_minutes))[0] == 0
    code, _, err = run_captured(capsys, "baseline", "save", "ok", "--from", str(five_minutes))
    assert code == 2 and "--force" in err
    code, _, err = run_captured(capsys, "compare", "ok", "gpu-1:8000",
                                "--replay", str(five_minutes))
    assert code == 2 and "--replay reads a recording" in err
    code, _, err = run_captured(capsys, "compare", "--replay", str(five_minutes))
    assert code == 2 and "give the BASELINE" in err
    not_recording = data_home.parent / "x.jsonl"
    not_recording.write_text("hello\n")
    code, _, err = run_captured(capsys, "compare", "ok", "--replay", str(not_recording))
    assert code == 2 and "not a kvtop recording" in err
    code, _, err = run_captured(capsys, "baseline", "rm", "ghost")
    assert code == 2 and "no baseline 'ghost'" in err
    code, _, err = run_captured(capsys, "baseline", "save", "p", "--probes", "0")
    assert code == 2 and "--probes: from 1 to 100" in err
    code, _, err = run_captured(capsys, "compare", "ok", "--interval", "inf")
    assert code == 2 and "--interval: must be a finite number > 0" in err


def test_truncated_or_newer_baseline_is_refused(five_minutes: Path, data_home: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_captured(capsys, "baseline", "save", "full", "--from", str(five_minutes))[0] == 0
    text = (data_home / "full.json").read_text()
    (data_home / "cut.json").write_text(text[: len(text) // 2])
    code, _, err = run_captured(capsys, "compare", "cut", "--replay", str(five_minutes))
    assert code == 2 and "cut.json" in err and "cut off" in err
    doc = json.loads(text)
    doc["version"] = 99
    (data_home / "future.json").write_text(json.dumps(doc))
    code, _, err = run_captured(capsys, "compare", "future", "--replay", str(five_minutes))
    assert code == 2 and "version 99 is newer than this kvtop reads (1)" in err
    code, _, err = run_captured(capsys, "baseline", "show", "future")
    assert code == 2 and "upgrade kvtop" in err
    code, out, _ = run_captured(capsys, "baseline", "list", "--json")
    listed = {entry["name"]: entry for entry in json.loads(out)["baselines"]}
    assert listed["full"]["error"] is None and listed["full"]["models"] == ["sim-llama-3-8b"]
    assert "cut off" in listed["cut"]["error"] and "newer" in listed["future"]["error"]


def test_another_model_is_refused(five_minutes: Path, tmp_path: Path, data_home: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_captured(capsys, "baseline", "save", "llama", "--from", str(five_minutes))[0] == 0
    other = write_recording(HEALTHY.but(minutes=3, url="sim://other"),
                            tmp_path / "other.jsonl.gz")
    text = other.read_bytes()
    import gzip

    renamed = gzip.decompress(text).replace(b"sim-llama-3-8b", b"sim-qwen-7b")
    (tmp_path / "qwen.jsonl").write_bytes(renamed)
    code, out, err = run_captured(capsys, "compare", "llama",
                                  "--replay", str(tmp_path / "qwen.jsonl"))
    assert code == 2 and out == ""
    assert "'sim-llama-3-8b'" in err and "'sim-qwen-7b'" in err and "across models" in err


def test_no_data_exits_3_and_saves_nothing(data_home: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_captured(capsys, "baseline", "save", "dead", f"127.0.0.1:{closed_port()}",
                       "--duration", "2s", "--interval", "0.5", "--no-gpu")
    assert code == 3 and "nothing saved" in err
    assert not (data_home / "dead.json").exists()


def test_list_show_rm(five_minutes: Path, data_home: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_captured(capsys, "baseline", "list", "--json")
    assert code == 0 and json.loads(out) == {"baselines": []}
    run_captured(capsys, "baseline", "save", "one", "--from", str(five_minutes))
    code, out, _ = run_captured(capsys, "baseline", "show", "one", "--json")
    doc = json.loads(out)
    assert doc["format"] == "kvtop-baseline" and doc["name"] == "one"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, _ = run_captured(capsys, "baseline", "show", "one")
    assert "KV usage p50" in out and "num_gpu_blocks 600" in out
    code, out, _ = run_captured(capsys, "baseline", "list")
    assert out.splitlines()[1].startswith("one ")
    assert run_captured(capsys, "baseline", "rm", "one")[0] == 0
    assert not (data_home / "one.json").exists()


def hostile_recording(path: Path, spec: RunSpec) -> Path:
    """A recording whose model name and cache dtype carry escapes and markup."""
    import gzip

    raw = gzip.decompress(write_recording(spec, path.with_suffix(".gz")).read_bytes())
    label = json.dumps(HOSTILE_MODEL)[1:-1].encode()  # as the JSON line holds it
    raw = raw.replace(b"sim-llama-3-8b", label).replace(b'cache_dtype=\\"auto\\"',
                                                        b'cache_dtype=\\"' + label + b'\\"')
    path.write_bytes(raw)
    return path


def test_outside_strings_are_written_out_in_text(tmp_path: Path, data_home: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec = HEALTHY.but(minutes=4)
    base = hostile_recording(tmp_path / "a.jsonl", spec)
    fewer = hostile_recording(tmp_path / "b.jsonl", spec.but(blocks=420))
    run_captured(capsys, "baseline", "save", "hostile", "--from", str(base))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    outputs: list[Any] = [run_captured(capsys, "baseline", "show", "hostile")[1],
                          run_captured(capsys, "compare", "hostile", "--replay", str(fewer))[1],
                          run_captured(capsys, "baseline", "list")[1]]
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]52" in outputs[0] and "\\u202e" in outputs[1]
    assert "[link=http://x]" in outputs[1]  # literal, never markup
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    doc = json.loads(run_captured(capsys, "compare", "hostile", "--replay", str(fewer))[1])
    assert doc["engines"][0]["model"] == HOSTILE_MODEL  # JSON keeps the exact value


def test_an_upgrade_is_listed_as_a_config_change(five_minutes: Path, tmp_path: Path,
                                                 data_home: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Another baseline as the run: the same server after a vLLM upgrade and a dtype change
    lists both first; nothing else moved, so nothing is worse."""
    assert run_captured(capsys, "baseline", "save", "before", "--from", str(five_minutes))[0] == 0
    doc = json.loads((data_home / "before.json").read_text())
    doc["name"] = "after"
    doc["targets"][0]["server"]["version"] = "0.34.0"
    doc["targets"][0]["engines"][0]["config"]["cache_dtype"] = "fp8"
    after = tmp_path / "after.json"
    after.write_text(json.dumps(doc))
    code, out, err = run_captured(capsys, "compare", "before", str(after), "--json")
    assert code == 0, err
    result = json.loads(out)
    # the simulator serves no /version: both versions are guessed from the metric names,
    # and said to be
    assert [(c["key"], c["now"]) for c in result["config_changes"]] == [
        ("version", "0.34.0 (inferred)"), ("cache_dtype", "fp8")]
    assert result["verdict"] == "same"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short healthy recording of the simulated server (3 minutes)."""
    return write_recording(HEALTHY.but(minutes=3),
                           tmp_path_factory.mktemp("rec") / "small.jsonl.gz")


@pytest.fixture
def server() -> Iterator[str]:
    """A vLLM server's /metrics (a real scrape) on 127.0.0.1; no OpenAI API."""
    with served_in_thread(FaultServer()) as served:
        yield served.url()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*argv: str, tty: bool = False) -> tuple[int, str, str]:
    out, err = Terminal() if tty else io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


LIVE = ("--duration", "60s", "--time-scale", "20", "--interval", "0.5", "--no-gpu")


def test_a_live_baseline_is_saved_with_its_source_and_said_so(data_home: Path,
                                                              server: str) -> None:
    code, out, err = run("baseline", "save", "live", server, *LIVE)
    assert code == 0, err
    assert err == ("kvtop: watching 1 target(s) for 60 s ...\n"
                   "kvtop baseline: 1 whole minute(s) is too short to judge against: kvtop "
                   "compare needs 5 a side before its rank test can find any change, and "
                   "says unknown until then; save one of 20m (the default)\n")
    saved = json.loads((data_home / "live.json").read_text())
    assert out == (f"saved baseline 'live' to {data_home / 'live.json'}: 1 engine(s), "
                   f"{saved['duration_s'] / 60:.1f} min\n")
    assert saved["name"] == "live" and saved["interval_s"] == 0.5
    assert saved["source"] == {"kind": "live", "time_scale": 20.0}
    assert 40 < saved["duration_s"] <= 60  # in the server's time: 60 s at 20x
    assert [t["target"] for t in saved["targets"]] == [server]


def test_save_json_prints_the_file_it_saved(data_home: Path, server: str) -> None:
    code, out, err = run("baseline", "save", "live", server, "--json", *LIVE)
    assert code == 0, err
    assert out == (data_home / "live.json").read_text()


def test_the_default_duration_is_twenty_minutes(data_home: Path) -> None:
    """Read from the line that starts a live run (a target that refuses: nothing saved)."""
    code, _, err = run("baseline", "save", "dead", f"127.0.0.1:{closed_port()}",
                       "--time-scale", "1200", "--interval", "0.2", "--no-gpu")
    assert code == 3
    assert err.splitlines() == ["kvtop: watching 1 target(s) for 1200 s ...",
                                "kvtop baseline: no engine was read; nothing saved"]
    assert not data_home.exists() or list(data_home.iterdir()) == []


def test_a_probe_of_a_server_without_an_openai_api_is_no_data(data_home: Path,
                                                              server: str) -> None:
    refusal = (f"--probe: {server.removesuffix('/metrics')}/v1/models did not answer with an "
               'OpenAI model list ({"data": [{"id": ...}]}): not an OpenAI-compatible server')
    code, out, err = run("baseline", "save", "probed", server, "--probe", *LIVE)
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == f"kvtop baseline: {refusal}"
    assert not (data_home / "probed.json").exists()
    assert run("baseline", "save", "live", server, *LIVE)[0] == 0
    code, out, err = run("compare", "live", server, "--probe", *LIVE)
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == f"kvtop compare: {refusal}"


def test_probes_need_probe_and_count_from_1_to_100(data_home: Path, server: str) -> None:
    code, _, err = run("baseline", "save", "x", server, "--probes", "3", *LIVE)
    assert code == 2 and err.splitlines()[-1] == "kvtop: --probes N needs --probe"
    parse = build_command_parser().parse_args
    assert parse(["baseline", "save", "x", "--probe", "--probes", "1"]).probes == 1
    assert parse(["compare", "x", "--probe", "--probes", "100"]).probes == 100
    assert parse(["compare", "x"]).probes is None
    for value, error in (("0", "from 1 to 100"), ("101", "from 1 to 100"),
                         ("2.5", "not a whole number: '2.5'"),
                         ("five", "not a whole number: 'five'")):
        code, _, err = run("compare", "x", "--probe", "--probes", value)
        assert code == 2
        assert err.splitlines()[-1] == f"kvtop compare: error: argument --probes: {error}"


def test_live_options_default_as_documented() -> None:
    args = build_command_parser().parse_args(["baseline", "save", "x"])
    assert (args.duration, args.interval, args.time_scale, args.probe, args.no_gpu) == (
        None, 1.0, 1.0, False, False)


def test_a_baseline_saved_at_a_path_is_named_by_its_file(tmp_path: Path, data_home: Path,
                                                         small: Path) -> None:
    path = tmp_path / "kept" / "before-upgrade.json"
    code, out, err = run("baseline", "save", str(path), "--from", str(small))
    assert code == 0, err
    assert out.startswith(f"saved baseline 'before-upgrade' to {path}: 1 engine(s), ")
    saved = json.loads(path.read_text())
    assert saved["name"] == "before-upgrade"
    assert saved["source"] == {"kind": "recording", "recording": str(small)}
    assert not data_home.exists()  # not among the saved names
    code, out, _ = run("baseline", "show", str(path))
    assert code == 0 and json.loads(out)["name"] == "before-upgrade"


def test_a_baseline_that_cannot_be_written_is_a_usage_error(tmp_path: Path, small: Path,
                                                            data_home: Path) -> None:
    taken = tmp_path / "file"
    taken.write_text("")
    path = taken / "x.json"
    code, out, err = run("baseline", "save", str(path), "--from", str(small))
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"kvtop baseline: cannot write {path}: File exists"


def test_a_recordings_warnings_are_passed_on_and_its_scrapes_used(
        tmp_path: Path, small: Path, data_home: Path) -> None:
    import gzip

    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(gzip.decompress(small.read_bytes()) + b'{"t": 1, "tar')
    code, _, err = run("baseline", "save", "cut", "--from", str(cut))
    assert code == 0, err
    warning = err.splitlines()[0]
    assert warning.startswith(f"kvtop: {cut}: ") and "line" in warning
    saved = json.loads((data_home / "cut.json").read_text())
    assert saved["interval_s"] == read_recording(small).interval_s == 10.0


def test_the_list_as_json_says_what_each_baseline_is(small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "b", "--from", str(small))[0] == 0
    assert run("baseline", "save", "a", "--from", str(small))[0] == 0
    (data_home / "broken.json").write_text("{")
    code, out, _ = run("baseline", "list", "--json")
    listed = json.loads(out)["baselines"]
    saved = json.loads((data_home / "a.json").read_text())
    assert code == 0 and [e["name"] for e in listed] == ["a", "b", "broken"]
    assert listed[0] == {"name": "a", "path": str(data_home / "a.json"), "error": None,
                         "created": saved["created"], "duration_s": saved["duration_s"],
                         "models": ["sim-llama-3-8b"]}
    broken = listed[2]
    assert broken["error"] and (broken["created"], broken["duration_s"], broken["models"]) == (
        None, None, [])


def test_rm_and_show_name_the_file(small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "one", "--from", str(small))[0] == 0
    code, out, _ = run("baseline", "show", "one", tty=True)
    assert code == 0 and str(data_home / "one.json") in out and not out.startswith("{")
    code, out, _ = run("baseline", "show", "one", "--json")
    assert json.loads(out) == json.loads((data_home / "one.json").read_text())
    assert run("baseline", "rm", "one") == (0, f"removed {data_home / 'one.json'}\n", "")


def test_compare_with_a_live_run(small: Path, data_home: Path, server: str) -> None:
    assert run("baseline", "save", "live", server, *LIVE)[0] == 0
    code, out, err = run("compare", "live", server, *LIVE, "--json")
    doc = json.loads(out)
    assert err == "kvtop: watching 1 target(s) for 60 s ...\n"
    assert doc["baseline"]["name"] == "live" and doc["now"]["source"]["kind"] == "live"
    assert code == 3 and doc["verdict"] == "unknown"  # a minute of data: too few to judge
    code, out, err = run("compare", "live", f"127.0.0.1:{closed_port()}", *LIVE)
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == ("kvtop compare: no engine was read in this run; "
                                    "nothing to compare")


def test_a_lone_target_with_a_duration_is_watched_not_read_as_a_baseline(
        small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "one", "--from", str(small))[0] == 0
    assert run("baseline", "save", "two", "--from", str(small))[0] == 0
    code, out, _ = run("compare", "one", "two", "--json")
    # 3 minutes a side can never reach the rank test's p < 0.01: no verdict, exit 3
    assert code == 3 and json.loads(out)["now"]["name"] == "two"
    for extra in (("--duration", "1s"), ("--probe",)):
        code, _, err = run("compare", "one", "two", "--no-gpu", "--interval", "0.2", *extra)
        assert code == 3 and "watching 1 target(s)" in err, extra


def test_json_when_asked_even_at_a_terminal(small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "one", "--from", str(small))[0] == 0
    code, out, _ = run("baseline", "list", "--json", tty=True)
    assert code == 0 and json.loads(out)["baselines"][0]["name"] == "one"
    assert not run("baseline", "list", tty=True)[1].startswith("{")
    code, out, _ = run("baseline", "show", "one", "--json", tty=True)
    assert code == 0 and json.loads(out)["name"] == "one"
    code, out, _ = run("compare", "one", "--replay", str(small), "--json", tty=True)
    assert code == 3 and json.loads(out)["verdict"] == "unknown"  # 3 minutes a side


def test_json_by_default_into_a_pipe_text_at_a_terminal(small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "one", "--from", str(small))[0] == 0
    for command in (("baseline", "list"), ("baseline", "show", "one"),
                    ("compare", "one", "--replay", str(small))):
        json.loads(run(*command)[1])
        assert not run(*command, tty=True)[1].startswith("{"), command


def test_a_compare_probes_as_the_baseline_did(small: Path, data_home: Path) -> None:
    """The baseline's probe model is asked for again: a server that no longer lists it
    cannot be compared (exit 3), rather than being probed with another model."""
    assert run("baseline", "save", "probed", "--from", str(small))[0] == 0
    doc = json.loads((data_home / "probed.json").read_text())
    doc["targets"][0]["probe"] = {"model": "llama-probed", "prompt": "text", "max_tokens": 8,
                                  "requests": 3, "failed": 0, "figures": {}}
    (data_home / "probed.json").write_text(json.dumps(doc))
    with served_in_thread(FakeOpenAI()) as api:
        code, out, err = run("compare", "probed", f"{api.url}/metrics", "--probe", *LIVE)
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == (
        f"kvtop compare: --probe: {api.url}/v1/models does not list the baseline's probe "
        f"model 'llama-probed' (it lists {MODEL})")


def test_a_recording_is_summarised_with_the_configs_thresholds(
        small: Path, tmp_path: Path, data_home: Path) -> None:
    """The config's [thresholds] are read for a recording too: a misspelt one is refused."""
    config = tmp_path / "kvtop.toml"
    config.write_text("[thresholds]\nleak_persist = 600\n")
    code, out, err = run("baseline", "save", "x", "--from", str(small), "--config", str(config))
    assert (code, out) == (2, "") and "leak_persist_s" in err
    assert not (data_home / "x.json").exists()


def test_usage_errors_word_for_word(small: Path, data_home: Path) -> None:
    rec = str(small)
    from_error = ("kvtop: --from reads a recording: give no targets, --duration or --probe "
                  "with it (a probe needs a live server)")
    replay_error = ("kvtop: --replay reads a recording: give no targets, --duration or "
                    "--probe with it")
    assert run("baseline", "save", "x", "gpu-1:8000", "--from", rec) == (
        2, "", from_error + "\n")
    for extra in (("--duration", "1s"), ("--probe",)):
        assert run("baseline", "save", "x", "--from", rec, *extra) == (2, "", from_error + "\n")
    assert run("baseline", "save") == (2, "", "kvtop: give the baseline's NAME first\n")
    assert run("baseline", "save", "ok", "--from", rec)[0] == 0
    path = data_home / "ok.json"
    assert run("baseline", "save", "ok", "--from", rec) == (
        2, "", f"kvtop: baseline 'ok' exists ({path}); --force replaces it\n")
    code, out, _ = run("baseline", "save", "ok", "--from", rec, "--force")
    assert code == 0 and out.startswith(f"saved baseline 'ok' to {path}")
    assert run("compare", "ok", "gpu-1:8000", "--replay", rec) == (2, "", replay_error + "\n")
    for extra in (("--duration", "1s"), ("--probe",)):
        assert run("compare", "ok", "--replay", rec, *extra) == (2, "", replay_error + "\n")
    assert run("compare") == (
        2, "", "kvtop: give the BASELINE (a saved name or a path) first\n")


OTHER_MODEL = "another-model"


@dataclass
class ProbedOpenAI(FakeOpenAI):
    """The fake API listing two models (another first), keeping what each request asked."""

    asked: list[dict[str, Any]] = field(default_factory=list)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "max_model_len": 2048}
            for name in (OTHER_MODEL, MODEL)]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(orjson.loads(await request.read()))
        return await super()._completions(request)


def with_probe(data_home: Path, small: Path, name: str, prompt: str) -> None:
    """A baseline whose probe asked MODEL ``prompt``-style three times."""
    assert run("baseline", "save", name, "--from", str(small))[0] == 0
    doc = json.loads((data_home / f"{name}.json").read_text())
    doc["targets"][0]["probe"] = {"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                  "requests": 3, "failed": 0, "figures": {}}
    (data_home / f"{name}.json").write_text(json.dumps(doc))


def probes_sent(*command: str, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The requests a run of kvtop sent to the fake API (which has no /metrics: exit 3)."""
    api = ProbedOpenAI()
    with served_in_thread(api):
        code, _, err = run(*command, f"{api.url}/metrics", *extra, "--probe", *LIVE)
    assert code == 3 and "no engine was read" in err, err
    return api.asked


def test_a_compare_probes_as_the_baseline_did_model_form_and_count(
        small: Path, data_home: Path) -> None:
    with_probe(data_home, small, "ids", "token_ids")
    with_probe(data_home, small, "text", "text")
    sent = probes_sent("compare", "ids")
    assert len(sent) == 3 and {r["model"] for r in sent} == {MODEL}
    assert all(isinstance(r["prompt"], list) for r in sent)  # token ids, as the baseline
    sent = probes_sent("compare", "text", extra=("--probes", "2"))
    assert len(sent) == 2 and {r["model"] for r in sent} == {MODEL}
    assert all(isinstance(r["prompt"], str) for r in sent)


def test_a_new_baseline_probes_the_first_model_five_times_with_text(data_home: Path) -> None:
    sent = probes_sent("baseline", "save", "new")
    assert len(sent) == 5 and {r["model"] for r in sent} == {OTHER_MODEL}
    assert all(isinstance(r["prompt"], str) for r in sent)
    assert len(probes_sent("baseline", "save", "new", extra=("--probes", "2"))) == 2


def test_a_lone_target_that_is_no_baseline_is_watched(small: Path, data_home: Path) -> None:
    assert run("baseline", "save", "one", "--from", str(small))[0] == 0
    code, _, err = run("compare", "one", f"127.0.0.1:{closed_port()}", "--time-scale", "1200",
                       "--interval", "0.2", "--no-gpu")
    assert code == 3
    assert err.splitlines() == ["kvtop: watching 1 target(s) for 1200 s ...",
                                "kvtop compare: no engine was read in this run; "
                                "nothing to compare"]


def test_a_live_run_reads_the_local_gpus_unless_told_not_to(
        data_home: Path, server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    live = tuple(a for a in LIVE if a != "--no-gpu")
    nvml = FakeGpuReader()
    monkeypatch.setattr("kvtop.collect.nvml.NvmlReader", lambda: nvml)
    assert run("baseline", "save", "gpus", server, *live)[0] == 0
    assert run("baseline", "save", "none", server, *LIVE)[0] == 0
    gpus, none = (json.loads((data_home / f"{n}.json").read_text())["gpus"]
                  for n in ("gpus", "none"))
    assert len(gpus) == len(nvml.gpus) > 0 and none == []
    monkeypatch.setattr("kvtop.collect.nvml.NvmlReader",
                        lambda: FakeGpuReader(unavailable="no NVIDIA driver"))
    code, _, err = run("baseline", "save", "nodriver", server, *live)
    assert code == 0 and "kvtop: GPUs not read: no NVIDIA driver" in err.splitlines()


def test_a_live_run_takes_the_configs_targets(tmp_path: Path, data_home: Path,
                                              server: str) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text(f'[[targets]]\nurl = "{server}"\n')
    code, _, err = run("baseline", "save", "cfg", "--config", str(config), *LIVE)
    assert code == 0, err
    saved = json.loads((data_home / "cfg.json").read_text())
    assert [t["target"] for t in saved["targets"]] == [server]
    config.write_text("[thresholds]\nleak_persist = 600\n")  # its thresholds are read too
    code, out, err = run("baseline", "save", "typo", server, "--config", str(config), *LIVE)
    assert (code, out) == (2, "") and "leak_persist_s" in err


def test_a_live_run_passes_timeout_insecure_and_full_metrics_on(
        data_home: Path, self_signed: ssl.SSLContext) -> None:
    with served_in_thread(FaultServer(mode="slow", delay_s=1.0)) as slow:
        code, _, err = run("baseline", "save", "slow", slow.url(), "--timeout", "0.3", *LIVE)
    assert code == 3 and "nothing saved" in err  # every read timed out at 0.3 s, not 2 s
    with served_in_thread(FaultServer(ssl_context=self_signed)) as tls:
        assert run("baseline", "save", "tls", tls.url(), "--insecure", *LIVE)[0] == 0
    with served_in_thread(FaultServer()) as full:
        assert run("baseline", "save", "full", full.url(), "--full-metrics", *LIVE)[0] == 0
        reads = [r for r in full.requests if r.path == "/metrics"]
    assert reads and not any("name[]" in r.query for r in reads)


def test_a_live_run_judges_leaks_with_the_configs_thresholds(tmp_path: Path,
                                                             data_home: Path) -> None:
    """Blocks held at an idle server: WATCH within a minute by default, LEAK when the
    config says ten seconds held at idle is enough."""
    config = tmp_path / "kvtop.toml"
    config.write_text("[thresholds]\nidle_leak_s = 10\nidle_min_s = 5\n")
    leaking = FaultServer(bodies=[fixture("vllm-0.33.0-v1-twin-leaking-idle.txt")])
    with served_in_thread(leaking) as server:
        assert run("baseline", "save", "usual", server.url(), *LIVE)[0] == 0
        assert run("baseline", "save", "told", server.url(), "--config", str(config),
                   *LIVE)[0] == 0
    usual, told = (json.loads((data_home / f"{n}.json").read_text())["targets"][0]
                   ["engines"][0]["leak"]["verdict"] for n in ("usual", "told"))
    assert (usual, told) == ("watch", "leak")


def test_a_live_run_scrapes_at_the_interval_asked(data_home: Path) -> None:
    with served_in_thread(FaultServer()) as server:
        code, _, err = run("baseline", "save", "often", server.url(), "--duration", "3s",
                           "--interval", "0.2", "--no-gpu")
        hits = server.hits
    assert code == 0, err
    assert hits >= 8  # 3 s at 0.2 s: about 15 (the default, 1 s, would be 3 or 4)
    assert json.loads((data_home / "often.json").read_text())["interval_s"] == 0.2


def test_the_saved_line_gives_the_minutes_the_run_covers(tmp_path: Path,
                                                        data_home: Path) -> None:
    """A recording of ten minutes (a live run's minutes depend on the machine's load)."""
    ten = write_recording(HEALTHY.but(minutes=10), tmp_path / "ten.jsonl.gz")
    code, out, err = run("baseline", "save", "ten", "--from", str(ten))
    assert code == 0, err
    minutes = json.loads((data_home / "ten.json").read_text())["duration_s"] / 60
    assert 9 < minutes <= 10
    assert out.endswith(f": 1 engine(s), {minutes:.1f} min\n")


def test_baseline_needs_an_action_and_its_help_lists_them() -> None:
    code, out, err = run("baseline")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == ("kvtop baseline: error: the following arguments are "
                                    "required: ACTION")
    code, out, _ = run("baseline", "--help")
    assert code == 0
    assert "usage: kvtop baseline [-h] ACTION ..." in out and "\nactions:\n  ACTION\n" in out
    # each action with what it does, as `kvtop baseline -h` is where a user looks them up
    actions = out.split("  ACTION\n", 1)[1].split("\n\n", 1)[0]
    listed = [" ".join(line.split()) for line in actions.splitlines()]
    assert listed == [
        "save watch the targets (or read a recording) and save a baseline",
        "list the saved baselines",
        "show what a baseline holds",
        "rm remove a saved baseline",
    ]


def help_of(*command: str) -> tuple[str, str, dict[str, str]]:
    """`kvtop ... -h` as a user reads it: the usage line, the description and each option's
    help (wrapped lines joined), by how the option is written (`--from RECORDING`); the exit
    codes after them are the test_cli's."""
    code, out, err = run(*command, "-h")
    assert (code, err) == (0, "")
    usage, description, rest = out.split("\n\n", 2)
    rest = rest.split("\nexit status:\n", 1)[0]
    options: dict[str, str] = {}
    current = ""
    for line in rest.splitlines():
        if line.startswith("   ") and current:  # the help wrapped onto another line
            options[current] += " " + line.strip()
        elif line.startswith("  "):
            current, _, words = line.strip().partition("  ")
            options[current] = words
        else:
            current = ""  # a heading
    return (usage, " ".join(description.split()),
            {option: " ".join(words.split()) for option, words in options.items()})


LIVE_HELP = {
    "--duration D": "how long to watch live targets (default 20m)",
    "--interval S": "seconds between scrapes (default 1)",
    "--probes N": "how many probe requests (default 5)",
    "--time-scale S": "the target's clock runs S times wall time (kvtop sim --speed S): the "
                      "duration and timings are in its time",
    "--no-gpu": "do not read local GPUs",
}


PROBE_HELP = ("send a fixed short completion to each server's OpenAI API --probes times and "
              "time it (it sends traffic)")


TARGETS_HELP = ("then host:port or URL of each /metrics endpoint (default: the config's "
                "targets, else http://127.0.0.1:8000)")


def test_baseline_save_help_says_what_each_option_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    usage, description, options = help_of("baseline", "save")
    assert usage == ("usage: kvtop baseline save NAME [TARGET ...] [--duration D | --from "
                     "RECORDING] [--probe] [options]")
    assert description == (
        "Watch the targets for --duration (or read a recording with --from) and save what the "
        "run looked like as NAME: a name (letters, digits, . _ -) or a path ending in .json.")
    assert options["NAME TARGET"] == f"NAME, {TARGETS_HELP}"
    assert {option: options[option] for option in LIVE_HELP} == LIVE_HELP
    assert options["--probe"] == f"also {PROBE_HELP}"
    assert options["--from RECORDING"] == "summarise a recording instead of watching live targets"
    assert options["--force"] == "replace a baseline of that name"
    assert options["--json"] == "print the saved baseline"


def test_baseline_list_show_and_rm_help_say_what_each_option_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert help_of("baseline", "list") == (
        "usage: kvtop baseline list [-h] [--json]", "List the baselines saved by name.",
        {"-h, --help": "show this help message and exit",
         "--json": "JSON (the default when stdout is not a terminal)"})
    assert help_of("baseline", "show") == (
        "usage: kvtop baseline show [-h] [--json] NAME", "Print a baseline (its file with --json).",
        {"NAME": "", "-h, --help": "show this help message and exit",
         "--json": "the file's JSON (the default when stdout is not a terminal)"})
    assert help_of("baseline", "rm") == (
        "usage: kvtop baseline rm [-h] NAME", "Remove a baseline.",
        {"NAME": "", "-h, --help": "show this help message and exit"})


def test_compare_help_says_what_each_option_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    usage, description, options = help_of("compare")
    assert usage == ("usage: kvtop compare BASELINE [TARGET ... --duration D | --replay "
                     "RECORDING | OTHER_BASELINE] [--json] [options]")
    assert description == (
        "Compare a run with a saved baseline: config changes first, then each figure better, "
        "same or worse beyond run-to-run noise (a rank test on per-minute values; "
        "docs/baseline-format.md). The run is live targets watched for --duration, a "
        "recording (--replay), or another baseline (give its name or path as the only "
        "TARGET). JSON: docs/compare-json.md.")
    assert options["BASELINE TARGET"] == f"BASELINE, {TARGETS_HELP}"
    assert {option: options[option] for option in LIVE_HELP} == LIVE_HELP
    assert options["--probe"] == PROBE_HELP
    assert options["--replay RECORDING"] == "compare a recording instead of live targets"
    assert options["--json"] == "JSON (the default when stdout is not a terminal)"


def test_recording_options_complete_file_names(tmp_path: Path) -> None:
    """`kvtop baseline save x --from <Tab>` and `kvtop compare x --replay <Tab>` offer files,
    as `kvtop check --replay <Tab>` does."""
    recording = tmp_path / "run.jsonl.gz"
    recording.write_bytes(b"")
    code, script, _ = run("completion", "bash")
    assert code == 0

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in (*words, str(tmp_path / "ru")))
        shell = (f"source /dev/stdin; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
                 "_shtab_kvtop; printf '%s\\n' \"${COMPREPLY[@]}\"")
        done = subprocess.run(["bash", "-c", shell], input=script, capture_output=True,
                              text=True, timeout=60, check=False)
        return done.stdout.split()

    assert complete("kvtop", "check", "--replay") == [str(recording)]  # what the others match
    assert complete("kvtop", "baseline", "save", "x", "--from") == [str(recording)]
    assert complete("kvtop", "compare", "x", "--replay") == [str(recording)]


def test_a_recording_is_named_by_its_tidied_path(small: Path, data_home: Path) -> None:
    """However the path was typed (`dir/./run.jsonl.gz`, `dir//run.jsonl.gz`), the baseline
    and the comparison name the recording the same way."""
    untidy = f"{small.parent}/.//{small.name}"
    assert run("baseline", "save", "one", "--from", untidy)[0] == 0
    source = json.loads((data_home / "one.json").read_text())["source"]
    assert source == {"kind": "recording", "recording": str(small)}
    code, out, _ = run("compare", "one", "--replay", untidy, "--json")
    assert code == 3  # 3 minutes a side: too short to judge
    assert json.loads(out)["now"]["source"] == source
