"""The recording format round-trips scrapes losslessly, never holds a token, and reads back
what it can from a damaged file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvtop.collect.target import Scrape, Secret, Target
from kvtop.store.recording import RecordingError, RecordingWriter, read_recording
from tests.paths import fixture_text

TOKEN = "recording-secret"


def scrapes() -> list[Scrape]:
    a = Target.from_spec("127.0.0.1:8000", token=Secret(TOKEN))
    b = Target.from_spec("http://10.0.0.2:8001/custom/metrics")
    body = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    return [
        Scrape(a, 1000.25, body=body, version="0.33.0"),
        Scrape(b, 1000.5, failure="timeout", error="no complete answer within 2 s"),
        Scrape(a, 1001.25, body=body + '\n# weird \u2028 unicode \\ "quotes"\n'),
        Scrape(b, 1001.5, failure="auth", error="HTTP 401: wants a bearer token"),
    ]


def fields(scrape: Scrape) -> tuple[object, ...]:
    return (scrape.target.url, scrape.t, scrape.body, scrape.failure, scrape.error,
            scrape.version)


@pytest.mark.parametrize("name", ["run.jsonl", "run.jsonl.gz"])
def test_round_trip_is_lossless(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    original = scrapes()
    targets = list(dict.fromkeys(s.target for s in original))
    with RecordingWriter(path, interval_s=0.5, targets=targets) as writer:
        for scrape in original:
            writer.write(scrape)
    raw = path.read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    assert TOKEN.encode() not in raw
    header = json.loads(raw.split(b"\n", 1)[0])
    assert header["format"] == "kvtop-recording" and header["version"] == 1
    assert header["interval_s"] == 0.5 and header["targets"] == [t.url for t in targets]
    back = read_recording(path)
    assert back.warnings == []
    assert [fields(s) for s in back.scrapes] == [fields(s) for s in original]


def test_unknown_kinds_and_keys_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    lines = [
        {"format": "kvtop-recording", "version": 1, "created": "2026-11-30T00:00:00+00:00",
         "interval_s": 1.0, "targets": ["http://a/metrics"], "future_key": 1},
        {"kind": "gpus", "t": 1.0, "gpus": []},
        {"t": 2.0, "target": "http://a/metrics", "body": "x 1\n", "extra": True},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    back = read_recording(path)
    assert [(s.t, s.body) for s in back.scrapes] == [(2.0, "x 1\n")]


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
def test_a_crash_mid_write_keeps_every_scrape_flushed_before_it(tmp_path: Path,
                                                                  name: str) -> None:
    path = tmp_path / name
    original = scrapes()
    with RecordingWriter(path, interval_s=1.0, targets=[]) as writer:
        for scrape in original[:3]:
            writer.write(scrape)
        writer.flush()  # as the app does every few seconds
        flushed = path.stat().st_size
        writer.write(original[3])
    path.write_bytes(path.read_bytes()[: flushed + 20])  # the crash: the last one half written
    back = read_recording(path)
    assert [fields(s) for s in back.scrapes] == [fields(s) for s in original[:3]]
    (warning,) = back.warnings
    assert warning.startswith("the file ends early" if name.endswith(".gz") else
                              "line 5: not JSON (cut off?)"), warning


@pytest.mark.parametrize(("content", "says"), [
    (b"", "empty file, not a kvtop recording"),
    (b"not json\n", "not a kvtop recording (line 1 is not JSON)"),
    (b'{"format": "other", "version": 1}\n', "not a kvtop recording (no 'kvtop-recording' header)"),
    (b'{"version": 1}\n', "not a kvtop recording (no 'kvtop-recording' header)"),
    (b'{"format": "kvtop-recording", "version": 2}\n', "recording version 2 is newer"),
    (b'{"format": "kvtop-recording", "version": "1"}\n',
     "bad header: version '1' is not a format version"),
    (b'{"format": "kvtop-recording"}\n', "bad header: version None is not a format version"),
], ids=["empty", "not-json", "other-format", "no-format", "version-2", "version-text",
        "no-version"])
def test_not_a_recording_is_a_clear_error(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    with pytest.raises(RecordingError) as raised:
        read_recording(path)
    assert str(raised.value).startswith(f"{path}: {says}"), raised.value


def test_the_newest_version_read_is_this_one(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"format": "kvtop-recording", "version": 1}\n')
    assert read_recording(path).scrapes == []


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="No such file"):
        read_recording(tmp_path / "nope.jsonl")


def test_credentials_in_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="credentials"):
        Target.from_spec("http://user:pw@host:8000")
