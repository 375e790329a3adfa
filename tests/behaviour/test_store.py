"""What a recording's header promises a reader (docs/recording-format.md): only a
``kvtop-recording`` of a version this kvtop knows is read; anything else is a clear
RecordingError, never a misread file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtop.collect.target import Scrape, Target
from kvtop.store.recording import VERSION, RecordingError, RecordingWriter, read_recording

URL = "http://127.0.0.1:8000/metrics"
T0 = 1_767_225_600.0
BODY = 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'


def recording(tmp_path: Path, **header: object) -> Path:
    """A one-scrape recording whose header has ``header`` changed."""
    first = {"format": "kvtop-recording", "version": VERSION, "created": "2026-01-01T00:00:00Z",
             "interval_s": 1.0, "targets": [URL]} | header
    path = tmp_path / "r.jsonl"
    lines = [first, {"t": T0, "target": URL, "body": BODY}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_what_the_writer_writes_the_reader_reads(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with RecordingWriter(path, interval_s=2.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, body=BODY))
    header = json.loads(path.read_text().splitlines()[0])
    assert (header["format"], header["version"]) == ("kvtop-recording", VERSION)
    read = read_recording(path)
    assert read.interval_s == 2.0 and [s.text() for s in read.scrapes] == [BODY]


def test_a_current_header_is_read(tmp_path: Path) -> None:
    read = read_recording(recording(tmp_path))
    assert [(s.target.url, s.t) for s in read.scrapes] == [(URL, T0)]


@pytest.mark.parametrize("name", ["prometheus-dump", "kvtop-snapshot", None])
def test_json_lines_of_another_format_are_not_a_recording(tmp_path: Path,
                                                          name: str | None) -> None:
    with pytest.raises(RecordingError, match="not a kvtop recording"):
        read_recording(recording(tmp_path, format=name))


@pytest.mark.parametrize("version", [VERSION + 1, VERSION + 2, 99])
def test_a_newer_version_asks_for_an_upgrade(tmp_path: Path, version: int) -> None:
    # a newer format may mean something else by the same keys: never guess
    with pytest.raises(RecordingError, match=f"version {version} is newer.*upgrade kvtop"):
        read_recording(recording(tmp_path, version=version))


@pytest.mark.parametrize("version", [1.0, 1.5, 0, -1, None, "1", True, [1]])
def test_a_version_that_is_not_a_whole_number_from_1_is_refused(tmp_path: Path,
                                                               version: object) -> None:
    with pytest.raises(RecordingError, match="is not a format version"):
        read_recording(recording(tmp_path, version=version))
