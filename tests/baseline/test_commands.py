"""`kvtop baseline` and `kvtop compare` as a user meets them: usage errors and refusals
(exit 2, a message that says what to do), no data (exit 3), list/show/rm, and text output
that shows outside strings (model names, config values) written out, never acted on."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.baseline_eval.scenarios import HEALTHY, RunSpec, write_recording
from kvtop.cli import main
from tests.faultserver import closed_port

HOSTILE_MODEL = "evil\x1b]52;c;aGk=\x07\x1b[2J[link=http://x]m[/link]\u202e"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short healthy recording (5 minutes)."""
    return write_recording(HEALTHY.but(minutes=5),
                           tmp_path_factory.mktemp("rec") / "small.jsonl.gz")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_errors_exit_2_with_a_reason(small: Path, data_home: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "baseline", "save", "x", "gpu-1:8000", "--from", str(small))
    assert code == 2 and "--from reads a recording" in err
    code, _, err = run(capsys, "baseline", "save", "no good", "--from", str(small))
    assert code == 2 and "not a baseline name" in err
    code, _, err = run(capsys, "compare", "nothing-saved", "--replay", str(small))
    assert code == 2 and "no baseline 'nothing-saved'" in err and "kvtop baseline list" in err
    assert run(capsys, "baseline", "save", "ok", "--from", str(small))[0] == 0
    code, _, err = run(capsys, "baseline", "save", "ok", "--from", str(small))
    assert code == 2 and "--force" in err
    code, _, err = run(capsys, "compare", "ok", "gpu-1:8000", "--replay", str(small))
    assert code == 2 and "--replay reads a recording" in err
    code, _, err = run(capsys, "compare", "--replay", str(small))
    assert code == 2 and "give the BASELINE" in err
    not_recording = data_home.parent / "x.jsonl"
    not_recording.write_text("hello\n")
    code, _, err = run(capsys, "compare", "ok", "--replay", str(not_recording))
    assert code == 2 and "not a kvtop recording" in err
    code, _, err = run(capsys, "baseline", "rm", "ghost")
    assert code == 2 and "no baseline 'ghost'" in err
    code, _, err = run(capsys, "baseline", "save", "p", "--probes", "0")
    assert code == 2 and "--probes: from 1 to 100" in err
    code, _, err = run(capsys, "compare", "ok", "--interval", "inf")
    assert code == 2 and "--interval: must be a finite number > 0" in err


def test_truncated_or_newer_baseline_is_refused(small: Path, data_home: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "baseline", "save", "full", "--from", str(small))[0] == 0
    text = (data_home / "full.json").read_text()
    (data_home / "cut.json").write_text(text[: len(text) // 2])
    code, _, err = run(capsys, "compare", "cut", "--replay", str(small))
    assert code == 2 and "cut.json" in err and "cut off" in err
    doc = json.loads(text)
    doc["version"] = 99
    (data_home / "future.json").write_text(json.dumps(doc))
    code, _, err = run(capsys, "compare", "future", "--replay", str(small))
    assert code == 2 and "version 99 is newer than this kvtop reads (1)" in err
    code, _, err = run(capsys, "baseline", "show", "future")
    assert code == 2 and "upgrade kvtop" in err
    code, out, _ = run(capsys, "baseline", "list", "--json")
    listed = {entry["name"]: entry for entry in json.loads(out)["baselines"]}
    assert listed["full"]["error"] is None and listed["full"]["models"] == ["sim-llama-3-8b"]
    assert "cut off" in listed["cut"]["error"] and "newer" in listed["future"]["error"]


def test_another_model_is_refused(small: Path, tmp_path: Path, data_home: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "baseline", "save", "llama", "--from", str(small))[0] == 0
    other = write_recording(HEALTHY.but(minutes=3, url="sim://other"),
                            tmp_path / "other.jsonl.gz")
    text = other.read_bytes()
    import gzip

    renamed = gzip.decompress(text).replace(b"sim-llama-3-8b", b"sim-qwen-7b")
    (tmp_path / "qwen.jsonl").write_bytes(renamed)
    code, out, err = run(capsys, "compare", "llama", "--replay", str(tmp_path / "qwen.jsonl"))
    assert code == 2 and out == ""
    assert "'sim-llama-3-8b'" in err and "'sim-qwen-7b'" in err and "across models" in err


def test_no_data_exits_3_and_saves_nothing(data_home: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "baseline", "save", "dead", f"127.0.0.1:{closed_port()}",
                       "--duration", "2s", "--interval", "0.5", "--no-gpu")
    assert code == 3 and "nothing saved" in err
    assert not (data_home / "dead.json").exists()


def test_list_show_rm(small: Path, data_home: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(capsys, "baseline", "list", "--json")
    assert code == 0 and json.loads(out) == {"baselines": []}
    run(capsys, "baseline", "save", "one", "--from", str(small))
    code, out, _ = run(capsys, "baseline", "show", "one", "--json")
    doc = json.loads(out)
    assert doc["format"] == "kvtop-baseline" and doc["name"] == "one"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, _ = run(capsys, "baseline", "show", "one")
    assert "KV usage p50" in out and "num_gpu_blocks 600" in out
    code, out, _ = run(capsys, "baseline", "list")
    assert out.splitlines()[1].startswith("one ")
    assert run(capsys, "baseline", "rm", "one")[0] == 0
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
    run(capsys, "baseline", "save", "hostile", "--from", str(base))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    outputs: list[Any] = [run(capsys, "baseline", "show", "hostile")[1],
                          run(capsys, "compare", "hostile", "--replay", str(fewer))[1],
                          run(capsys, "baseline", "list")[1]]
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]52" in outputs[0] and "\\u202e" in outputs[1]
    assert "[link=http://x]" in outputs[1]  # literal, never markup
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    doc = json.loads(run(capsys, "compare", "hostile", "--replay", str(fewer))[1])
    assert doc["engines"][0]["model"] == HOSTILE_MODEL  # JSON keeps the exact value


def test_an_upgrade_is_listed_as_a_config_change(small: Path, tmp_path: Path,
                                                 data_home: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Another baseline as the run: the same server after a vLLM upgrade and a dtype change
    lists both first; nothing else moved, so nothing is worse."""
    assert run(capsys, "baseline", "save", "before", "--from", str(small))[0] == 0
    doc = json.loads((data_home / "before.json").read_text())
    doc["name"] = "after"
    doc["targets"][0]["server"]["version"] = "0.34.0"
    doc["targets"][0]["engines"][0]["config"]["cache_dtype"] = "fp8"
    after = tmp_path / "after.json"
    after.write_text(json.dumps(doc))
    code, out, err = run(capsys, "compare", "before", str(after), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [(c["key"], c["now"]) for c in result["config_changes"]] == [
        ("version", "0.34.0"), ("cache_dtype", "fp8")]
    assert result["verdict"] == "same"
