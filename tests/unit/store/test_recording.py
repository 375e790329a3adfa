"""The recording format round-trips scrapes losslessly, never holds a token, and reads back
what it can from a damaged file.

What a recording promises (docs/recording-format.md). A reader: only a ``kvtop-recording``
of a version this kvtop knows is read; anything else is a clear RecordingError, never a
misread file. A writer: the header and lines the format names, never over an existing file
or through a link, lines on disk at each flush, a size limit met before it is crossed, and a
full disk that loses a batch (counted and said) but never the file."""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import random
import stat
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kvtop.collect.kv_events import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch
from kvtop.collect.target import Scrape, Secret, Target
from kvtop.safe_text import display_text
from kvtop.store.format import MAX_LINE_BYTES, MAX_RECORDED_HASHES, MAX_T, MiB
from kvtop.store.reader import (
    BIG_LINE_BYTES,
    MAX_TARGETS,
    MAX_VALUES,
    REORDER_BYTES,
    open_recording,
    time_ordered,
)
from kvtop.store.recording import (
    VERSION,
    RecordingError,
    RecordingExists,
    RecordingWriter,
    TargetKvEvents,
    parse_size,
    read_recording,
    size_text,
)
from kvtop.store.writer import FLUSH_BYTES, MIN_MAX_BYTES
from tests.support.full_disk import refused_writes_past
from tests.support.paths import fixture_text

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


URL = "http://127.0.0.1:8000/metrics"


OTHER = "https://10.0.0.2/custom/metrics"


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


def lines_of(path: Path) -> list[dict[str, object]]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return [json.loads(line) for line in raw.decode().splitlines()]


def test_the_header_says_when_and_what_was_recorded(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    before = datetime.now(timezone.utc).replace(microsecond=0)
    with RecordingWriter(path, interval_s=0.5, targets=[Target(URL), Target(OTHER)]):
        pass
    [header] = lines_of(path)
    created = datetime.fromisoformat(str(header["created"]))
    assert created.tzinfo is not None and before <= created <= datetime.now(timezone.utc)
    assert (header["interval_s"], header["targets"]) == (0.5, [URL, OTHER])


def test_a_failed_scrape_is_an_error_line_with_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, failure="timeout", error="no answer in 2 s"))
        writer.write(Scrape(Target(URL), T0 + 1))  # no body and no reason given
        writer.write(Scrape(Target(URL), T0 + 2, body=BODY, version="0.33.0"))
        writer.write(Scrape(Target(URL), T0 + 3, body=BODY))
    assert lines_of(path)[1:] == [
        {"t": T0, "target": URL, "error": "no answer in 2 s", "failure": "timeout"},
        {"t": T0 + 1, "target": URL, "error": "failed", "failure": "down"},
        {"t": T0 + 2, "target": URL, "body": BODY, "version": "0.33.0"},
        {"t": T0 + 3, "target": URL, "body": BODY},  # "version" only when it was read
    ]


def test_lines_reach_the_disk_at_flush_or_once_a_mebibyte_waits(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, body=BODY))
        assert len(lines_of(path)) == 1 and writer.written == 0  # the header alone
        writer.flush()
        assert len(lines_of(path)) == 2 and writer.written == 1
        big = "#" + "x" * (FLUSH_BYTES // 4) + "\n"
        for n in range(3):
            writer.write(Scrape(Target(URL), T0 + 1 + n, body=big))
        assert writer.written == 1  # 3/4 MiB waits
        writer.write(Scrape(Target(URL), T0 + 4, body=big))
        assert writer.written == 5 and len(lines_of(path)) == 6
        writer.write(Scrape(Target(URL), T0 + 5, body=BODY))
    assert writer.written == 6 and len(lines_of(path)) == 7  # closing flushes the rest
    assert writer.status() is None


@pytest.mark.parametrize("name", ["e.jsonl", "e.jsonl.gz"])
def test_an_existing_file_or_link_is_never_overwritten(tmp_path: Path, name: str) -> None:
    taken = tmp_path / name
    taken.write_text("precious\n")
    with pytest.raises(RecordingExists, match="it is an existing file, and kvtop does not "
                                              "overwrite or follow one"):
        RecordingWriter(taken, interval_s=1.0, targets=[])
    link = tmp_path / ("link-" + name)
    link.symlink_to(tmp_path / "elsewhere")  # dangling: following it would create a file
    with pytest.raises(RecordingExists, match="it is a symbolic link"):
        RecordingWriter(link, interval_s=1.0, targets=[])
    assert taken.read_text() == "precious\n" and not (tmp_path / "elsewhere").exists()


def test_replace_writes_a_new_file_over_the_name_and_leaves_a_links_target(
        tmp_path: Path) -> None:
    kept = tmp_path / "kept.jsonl"
    kept.write_text("precious\n")
    link = tmp_path / "r.jsonl.gz"
    link.symlink_to(kept)
    with RecordingWriter(link, interval_s=1.0, targets=[], replace=True) as writer:
        writer.write(Scrape(Target(URL), T0, body=BODY))
    assert not link.is_symlink() and kept.read_text() == "precious\n"
    assert [s.text() for s in read_recording(link).scrapes] == [BODY]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "r.jsonl.gz"]


@pytest.mark.parametrize("name", ["big.jsonl", "big.jsonl.gz"])
def test_a_size_limit_stops_before_the_batch_that_would_cross_it(tmp_path: Path,
                                                                 name: str) -> None:
    path = tmp_path / name
    limit = MIN_MAX_BYTES
    bodies = [f"# {n} {random.Random(n).randbytes(150_000).hex()}\n" for n in range(8)]
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)],
                         max_bytes=limit) as writer:
        for n, body in enumerate(bodies):
            writer.write(Scrape(Target(URL), T0 + n, body=body))
            writer.flush()
        fit = {"big.jsonl": 3, "big.jsonl.gz": 6}[name]  # 300 KB each, gzip halves hex
        assert writer.full and writer.written == fit and writer.unrecorded == 8 - fit
        writer.write(Scrape(Target(URL), T0 + 9, body=BODY))
        assert writer.unrecorded == 9 - fit  # nothing more once full
    assert path.stat().st_size <= limit
    assert writer.status() == "stopped at 1 MiB"
    recording = read_recording(path)  # a whole file, gzip ended
    assert recording.warnings == [] and [s.text() for s in recording.scrapes] == bodies[:fit]


def test_no_size_limit_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    body = "#" + "x" * MIN_MAX_BYTES + "\n"
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=0) as writer:
        writer.write(Scrape(Target(URL), T0, body=body))
        writer.write(Scrape(Target(URL), T0 + 1, body=body))
    assert not writer.full and writer.written == 2 and writer.max_bytes is None


def test_a_body_too_large_to_read_back_is_recorded_as_an_error_line(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    body = "#" + "x" * MAX_LINE_BYTES + "\n"
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=0) as writer:
        writer.write(Scrape(Target(URL), T0, body=body))
    [scrape] = read_recording(path).scrapes
    assert (scrape.failure, scrape.t) == ("bad_payload", T0)
    size = len(json.dumps({"t": T0, "target": URL, "body": body}, separators=(",", ":"))) + 1
    assert scrape.error == f"a body of {size} bytes is too large to record"


def padded(n: int) -> str:
    return f"{BODY}# scrape {n} {'x' * 5000}\n"


@pytest.mark.parametrize("name", ["full.jsonl", "full.jsonl.gz"])
def test_a_refused_write_loses_the_batch_says_so_and_the_next_flush_goes_on(
        tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, body=padded(0)))
        writer.flush()
        with refused_writes_past(path.stat().st_size):
            for n in (1, 2):
                writer.write(Scrape(Target(URL), T0 + n, body=padded(n)))
                writer.flush()
        assert (writer.written, writer.lost, writer.failing) == (1, 2, True)
        assert writer.status() == "2 lost (File too large)"
        writer.write(Scrape(Target(URL), T0 + 3, body=padded(3)))
        writer.flush()
        assert (writer.written, writer.lost, writer.failing) == (2, 2, False)
    assert writer.status() == "2 lost (File too large)"  # the count stays: it is the report
    recording = read_recording(path)
    assert recording.warnings == []
    assert [s.text() for s in recording.scrapes] == [padded(0), padded(3)]


def test_a_gzip_end_that_cannot_be_written_still_reads_to_the_last_line(
        tmp_path: Path) -> None:
    path = tmp_path / "end.jsonl.gz"
    writer = RecordingWriter(path, interval_s=1.0, targets=[Target(URL)])
    writer.write(Scrape(Target(URL), T0, body=padded(0)))
    writer.flush()
    with refused_writes_past(path.stat().st_size):
        writer.close()
    assert writer.end_lost and writer.status() == "end not written (File too large)"
    recording = read_recording(path)
    assert [s.text() for s in recording.scrapes] == [padded(0)]
    assert any("ends early" in warning for warning in recording.warnings)


@pytest.mark.parametrize(("text", "size"), [
    ("500M", 500 * MiB), ("1G", 1024 * MiB), ("2GiB", 2048 * MiB), ("1.5g", 1536 * MiB),
    ("1024k", MiB), ("3 MB", 3 * MiB), ("1t", 1024 * 1024 * MiB), (str(MiB), MiB),
    ("0", 0), ("none", 0), (" NONE ", 0),
])
def test_a_size_as_people_write_it(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "says"), [
    ("12 parsecs", "'12 parsecs' is not a size (500M, 1G, 0 for no limit)"),
    ("-1G", "is not a size"),
    ("64k", "'64k' is under the least a recording may be (1 MiB; 0 for no limit)"),
    (str(MiB - 1), "is under the least"),
])
def test_a_size_that_is_none_or_too_small_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_size(text)
    assert says in str(raised.value)


@pytest.mark.parametrize(("size", "text"), [
    (512, "512 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536 * 1024, "1.5 MiB"),
    (MiB, "1 MiB"), (1024 * MiB, "1 GiB"), (5 * 1024 * 1024 * MiB, "5 TiB"),
])
def test_a_size_reads_in_the_largest_unit_it_fills(size: int, text: str) -> None:
    assert size_text(size) == text


def lines_file(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "r.jsonl"
    first = {"format": "kvtop-recording", "version": VERSION, "interval_s": 1.0,
             "targets": [URL]}
    with path.open("wb") as file:
        for line in (first, *lines):
            file.write(line if isinstance(line, bytes) else json.dumps(line).encode())
            file.write(b"\n")
    return path


def test_times_from_0_up_to_the_clocks_limit_are_read(tmp_path: Path) -> None:
    times = [0, 0.5, MAX_T - 1, MAX_T, -1.0, 1e300]
    path = lines_file(tmp_path, *({"t": t, "target": URL, "body": BODY} for t in times))
    recording = open_recording(path)
    assert [s.t for s in recording.in_file_order()] == [0.0, 0.5, MAX_T - 1]
    assert recording.skipped == 3
    assert recording.warnings == [f'line {n}: "t" is not a time (unix seconds, 0 to 1e+10); '
                                  "skipped" for n in (5, 6, 7)]


def test_a_version_is_kept_up_to_200_characters(tmp_path: Path) -> None:
    versions = ["v" * 200, "v" * 201, 5]
    path = lines_file(tmp_path, *({"t": T0 + n, "target": URL, "body": BODY, "version": v}
                                  for n, v in enumerate(versions)))
    assert [s.version for s in read_recording(path).scrapes] == ["v" * 200, None, None]


def test_a_long_error_is_cut_to_2000_characters_and_an_unknown_kind_is_down(
        tmp_path: Path) -> None:
    errors = [("e" * 2000, "auth"), ("e" * 2001, "timeout"), ("short", "exploded"),
              ("short", 5), ("no kind", None)]
    path = lines_file(tmp_path, *({"t": T0 + n, "target": URL, "error": error,
                                   "failure": failure}
                                  for n, (error, failure) in enumerate(errors)))
    scrapes = read_recording(path).scrapes
    assert [(s.error, s.failure) for s in scrapes] == [
        ("e" * 2000, "auth"), ("e" * 1999 + "…", "timeout"), ("short", "down"),
        ("short", "down"), ("no kind", "down")]


def test_line_kinds_a_reader_does_not_know_are_passed_over_quietly(tmp_path: Path) -> None:
    path = lines_file(tmp_path, {"kind": "gpus", "gpus": []},
                      {"t": T0, "target": URL, "body": BODY})
    recording = open_recording(path)
    assert (recording.count, recording.skipped, recording.warnings) == (1, 0, [])


def test_each_skipped_line_is_counted(tmp_path: Path) -> None:
    path = lines_file(tmp_path, b"not json", {"t": T0, "target": URL}, [1, 2],
                      {"t": T0, "target": URL, "body": BODY})
    recording = open_recording(path)
    assert (recording.count, recording.skipped) == (1, 3)


def test_a_header_value_is_quoted_short_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"format": "kvtop-recording", "version": "9" * 100}) + "\n")
    with pytest.raises(RecordingError) as raised:
        read_recording(path)
    assert f"version '{'9' * 38}… is not a format version" in str(raised.value)


def test_the_targets_are_the_headers_then_those_only_scrapes_name(tmp_path: Path) -> None:
    path = lines_file(tmp_path, {"t": T0, "target": OTHER, "body": BODY},
                      {"t": T0 + 1, "target": URL, "body": BODY},
                      {"t": T0 + 2, "target": OTHER, "body": BODY})
    assert [t.url for t in read_recording(path).targets()] == [URL, OTHER]
    assert [t.url for t in open_recording(path).targets()] == [URL, OTHER]
    headless = tmp_path / "h.jsonl"
    headless.write_text(json.dumps({"format": "kvtop-recording", "version": 1}) + "\n"
                        + json.dumps({"t": T0, "target": OTHER, "body": BODY}) + "\n")
    assert [t.url for t in read_recording(headless).targets()] == [OTHER]


def test_a_recording_still_being_written_is_read_up_to_where_it_was_checked(
        tmp_path: Path) -> None:
    path = lines_file(tmp_path, {"t": T0, "target": URL, "body": BODY})
    recording = open_recording(path)
    with path.open("a") as file:
        file.write(json.dumps({"t": T0 + 1, "target": URL, "body": BODY}) + "\n")
    assert [s.t for s in recording.in_file_order()] == [T0]


def test_a_recording_replaced_after_it_was_checked_stops_quietly(tmp_path: Path) -> None:
    path = lines_file(tmp_path, {"t": T0, "target": URL, "body": BODY})
    recording = open_recording(path)
    path.write_text("no longer a recording\n")
    assert list(recording.in_file_order()) == []


def value_line(values: int) -> bytes:
    """A line over 1 MiB (a long string, skipped over) holding this many JSON value starts:
    the object, the list and each comma."""
    pad = "x" * BIG_LINE_BYTES
    return f'{{"pad":"{pad}","v":[{",".join("0" * (values - 2))}]}}'.encode()


def test_a_big_line_of_at_most_ten_thousand_values_is_parsed_and_no_more(
        tmp_path: Path) -> None:
    path = lines_file(tmp_path, value_line(MAX_VALUES), value_line(MAX_VALUES + 1),
                      {"t": T0, "target": URL, "body": BODY})
    recording = open_recording(path)
    assert recording.count == 1
    assert recording.warnings == [  # the first parsed, and refused for what it holds
        'line 2: "target" is not a URL of at most 4096 characters; skipped',
        f"line 3: more than {MAX_VALUES} JSON values; skipped"]


def test_values_inside_a_string_are_not_counted(tmp_path: Path) -> None:
    body = "[" * (MAX_VALUES + 10) + "x" * BIG_LINE_BYTES
    path = lines_file(tmp_path, {"t": T0, "target": URL, "body": body},
                      {"t": T0 + 1, "target": URL, "body": BODY})
    assert [s.body for s in read_recording(path).scrapes] == [body, BODY]


def ordered(times: list[float], late_s: float, bodies: list[str] | None = None
            ) -> list[tuple[float, int]]:
    """(t, scrapes read so far) for each scrape time_ordered gives out, in order."""
    read = [0]

    def scrapes() -> Iterator[Scrape]:
        for n, t in enumerate(times):
            read[0] += 1
            yield Scrape(Target(URL), t, body=bodies[n] if bodies else "x")

    return [(s.t, read[0]) for s in time_ordered(scrapes(), late_s)]


def test_a_scrape_goes_out_once_nothing_late_can_come_before_it() -> None:
    # a line lags an earlier one by at most late_s: t=0 is safe once t=5 was read
    assert ordered([0, 3, 5, 8, 9], 5.0) == [(0, 3), (3, 4), (5, 5), (8, 5), (9, 5)]
    assert ordered([3, 0, 5, 1, 9], 5.0) == [(0, 3), (1, 5), (3, 5), (5, 5), (9, 5)]


def test_the_reorder_buffer_holds_at_most_64_mib_of_bodies() -> None:
    # each scrape counts its body and 200 bytes: 65,536 of these fill the buffer exactly
    fill = REORDER_BYTES // 1024
    body = "x" * (1024 - 200)
    out = ordered([float(n) for n in range(fill + 3)], math.inf, [body] * (fill + 3))
    # nothing leaves while exactly 64 MiB is held; past it, the earliest, one for one
    assert out[:3] == [(0.0, fill + 1), (1.0, fill + 2), (2.0, fill + 3)]
    assert [t for t, _ in out] == [float(n) for n in range(fill + 3)]


def test_a_header_over_the_line_limit_is_no_recording(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"format": "kvtop-recording", "pad": "' + b"x" * MAX_LINE_BYTES + b'"}\n')
    with pytest.raises(RecordingError) as raised:
        read_recording(path)
    assert str(raised.value) == f"{path}: not a kvtop recording (line 1 is over 24 MiB)"


def scrape_line_of(size: int, t: float = T0, newline: bool = True) -> bytes:
    """A good scrape line of exactly ``size`` bytes, its newline included."""
    head = json.dumps({"t": t, "target": URL, "body": ""}).encode()[:-2]
    pad = size - len(head) - 2 - (1 if newline else 0)
    return head + b"#" * pad + b'"}' + (b"\n" if newline else b"")


def raw_file(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "r.jsonl"
    header = {"format": "kvtop-recording", "version": VERSION, "targets": [URL]}
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"".join(lines))
    return path


def test_a_line_of_24_mib_is_read_and_one_byte_more_is_skipped_whole(tmp_path: Path) -> None:
    path = raw_file(tmp_path, scrape_line_of(MAX_LINE_BYTES + 1, T0),  # 24 MiB, and "\n"
                    scrape_line_of(MAX_LINE_BYTES + 2, T0 + 1),
                    scrape_line_of(MAX_LINE_BYTES + 3 * MiB, T0 + 2),
                    scrape_line_of(1000, T0 + 3),
                    scrape_line_of(MAX_LINE_BYTES, T0 + 4, newline=False))  # the last, cut
    recording = open_recording(path)
    assert [s.t for s in recording.in_file_order()] == [T0, T0 + 3, T0 + 4]
    assert recording.warnings == [f"line {n}: longer than 24 MiB; skipped" for n in (3, 4)]


def test_a_line_of_exactly_a_mebibyte_is_parsed_whatever_it_holds(tmp_path: Path) -> None:
    many = ",".join("0" * (MAX_VALUES + 10))
    head = f'{{"t": {T0}, "target": "{URL}", "body": "", "v": ['.encode()
    line = head + many.encode() + b"]}\n"
    pad = BIG_LINE_BYTES - len(line)
    line = head.replace(b'"body": ""', b'"body": "' + b"#" * pad + b'"') + many.encode() + b"]}\n"
    assert len(line) == BIG_LINE_BYTES
    recording = open_recording(raw_file(tmp_path, line))
    assert recording.count == 1 and recording.warnings == []


@pytest.mark.parametrize(("interval", "ok"), [(86_400, True), (86_400.5, False), (0, False)])
def test_an_interval_of_up_to_a_day_is_read(tmp_path: Path, interval: float, ok: bool) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"format": "kvtop-recording", "version": 1,
                                "interval_s": interval}) + "\n")
    if ok:
        assert read_recording(path).interval_s == interval
        return
    with pytest.raises(RecordingError) as raised:
        read_recording(path)
    assert str(raised.value) == (f"{path}: bad header: interval_s {interval!r} is not a number "
                                 "of seconds above 0 and at most 86400")


def test_up_to_ten_thousand_targets_are_read_and_a_line_beyond_them_skipped(
        tmp_path: Path) -> None:
    urls = [f"http://10.0.{n // 256}.{n % 256}:8000/metrics" for n in range(MAX_TARGETS)]
    path = tmp_path / "r.jsonl"
    lines = [{"format": "kvtop-recording", "version": 1, "targets": urls},
             {"t": T0, "target": urls[-1], "body": BODY},
             {"t": T0 + 1, "target": URL, "body": BODY},
             {"t": T0 + 2, "target": urls[0], "body": BODY}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    recording = open_recording(path)
    assert [(s.target.url, s.t) for s in recording.in_file_order()] == [
        (urls[-1], T0), (urls[0], T0 + 2)]
    assert recording.warnings == [f"line 3: a target beyond the first {MAX_TARGETS}; skipped"]
    assert len(recording.targets()) == MAX_TARGETS
    path.write_text(json.dumps({"format": "kvtop-recording", "version": 1,
                                "targets": [*urls, URL]}) + "\n")
    with pytest.raises(RecordingError) as raised:
        open_recording(path)
    shown = display_text(repr([*urls, URL]), 40)  # quoted short
    assert str(raised.value) == (f"{path}: bad header: targets {shown} is not a list of at "
                                 f"most {MAX_TARGETS} URLs")


@pytest.mark.parametrize(("url", "kept"), [("x", True), ("", False), ("h" * 4096, True),
                                           ("h" * 4097, False), ("http://h:port/", False)])
def test_a_target_is_any_url_of_up_to_4096_characters(tmp_path: Path, url: str,
                                                      kept: bool) -> None:
    recording = open_recording(lines_file(tmp_path, {"t": T0, "target": url, "body": BODY}))
    assert recording.count == (1 if kept else 0)


def test_a_line_up_to_ten_minutes_behind_an_earlier_one_is_kept(tmp_path: Path) -> None:
    path = lines_file(tmp_path, *({"t": t, "target": URL, "body": BODY}
                                  for t in (T0, T0 - 600, T0 - 600.5)))
    recording = open_recording(path)
    assert [s.t for s in recording.in_file_order()] == [T0, T0 - 600]
    assert recording.warnings == ["line 4: t is over 600 s before an earlier line's; skipped"]
    assert [s.t for s in recording.in_time_order()] == [T0 - 600, T0]


def test_an_empty_recording_spans_nothing(tmp_path: Path) -> None:
    recording = open_recording(lines_file(tmp_path))
    assert (recording.count, recording.start_t, recording.end_t) == (0, 0.0, 0.0)
    assert [t.url for t in recording.targets()] == [URL]


def test_a_file_that_is_gzip_only_by_its_first_bytes_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\x1f\x8b" + b"x" * 30)
    with pytest.raises(RecordingError) as raised:
        open_recording(path)
    assert str(raised.value) == f"{path}: unreadable (Unknown compression method)"


def test_a_gzip_cut_short_reads_to_where_it_ends_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.gz"
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, body=BODY))
    path.write_bytes(path.read_bytes()[:-8])  # the trailer lost
    recording = open_recording(path)
    assert [s.t for s in recording.in_file_order()] == [T0]
    assert recording.warnings == [
        "the file ends early or is damaged after line 2 (Compressed file ended before the "
        "end-of-stream marker was reached); read what came before"]


def line_bytes(t: float, body: str) -> int:
    return len(json.dumps({"t": t, "target": URL, "body": body}, separators=(",", ":"))) + 1


def body_for(size: int, t: float) -> str:
    """A body whose recording line is exactly ``size`` bytes."""
    return "#" * (size - line_bytes(t, ""))


def test_a_new_writer_is_well_and_says_what_it_writes(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[]) as writer:
        assert writer.path == path
        assert (writer.failing, writer.full, writer.end_lost, writer.error) == (
            False, False, False, None)
        assert (writer.written, writer.lost, writer.unrecorded) == (0, 0, 0)


def test_a_recording_is_created_readable_and_writable_never_executable(tmp_path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    RecordingWriter(tmp_path / "new.jsonl", interval_s=1.0, targets=[]).close()
    (tmp_path / "old.jsonl").write_text("x\n")
    RecordingWriter(tmp_path / "old.jsonl", interval_s=1.0, targets=[], replace=True).close()
    for name in ("new.jsonl", "old.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask


def test_a_taken_name_is_a_file_exists_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x\n")
    with pytest.raises(RecordingExists) as raised:
        RecordingWriter(tmp_path / "taken", interval_s=1.0, targets=[])
    assert isinstance(raised.value, FileExistsError) and raised.value.errno == errno.EEXIST


def test_a_header_that_cannot_be_written_leaves_no_file(tmp_path: Path) -> None:
    for replace in (False, True):
        with refused_writes_past(0), pytest.raises(OSError) as raised:
            RecordingWriter(tmp_path / "r.jsonl", interval_s=1.0, targets=[], replace=replace)
        assert raised.value.errno == errno.EFBIG
        assert list(tmp_path.iterdir()) == []


def test_a_directory_is_never_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "kept").write_text("x\n")
    with pytest.raises(OSError):
        RecordingWriter(folder, interval_s=1.0, targets=[], replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]  # no temporary file left
    assert (folder / "kept").read_text() == "x\n"


def test_a_header_the_reader_would_refuse_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RecordingWriter(tmp_path / "nan.jsonl", interval_s=math.nan, targets=[])
    assert list(tmp_path.iterdir()) == []


def test_a_write_cut_short_by_a_limit_is_cut_back_off_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[Target(URL)]) as writer:
        writer.write(Scrape(Target(URL), T0, body=padded(0)))
        writer.flush()
        with refused_writes_past(path.stat().st_size + 100):  # 100 bytes go, then no more
            writer.write(Scrape(Target(URL), T0 + 1, body=padded(1)))
            writer.flush()
        assert (writer.written, writer.lost) == (1, 1)
        writer.write(Scrape(Target(URL), T0 + 2, body=padded(2)))
    recording = read_recording(path)
    assert recording.warnings == []
    assert [s.text() for s in recording.scrapes] == [padded(0), padded(2)]


def test_a_mebibyte_waiting_goes_to_disk_and_less_waits(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=0) as writer:
        writer.write(Scrape(Target(URL), T0, body=body_for(FLUSH_BYTES - 1, T0)))
        assert writer.written == 0  # a byte short
        writer.flush()
        writer.write(Scrape(Target(URL), T0 + 1, body=body_for(FLUSH_BYTES - 1, T0 + 1)))
        assert writer.written == 1  # nothing left over from the last flush
        writer.flush()
        writer.write(Scrape(Target(URL), T0 + 2, body=body_for(FLUSH_BYTES, T0 + 2)))
        assert writer.written == 3


def test_a_flush_with_nothing_waiting_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.gz"
    with RecordingWriter(path, interval_s=1.0, targets=[]) as writer:
        size = path.stat().st_size
        writer.flush()
        writer.flush()
        assert path.stat().st_size == size


@pytest.mark.parametrize("spare", [0, 1])
def test_the_size_limit_keeps_room_for_the_gzip_end_to_the_byte(tmp_path: Path,
                                                                 spare: int) -> None:
    path = tmp_path / "r.jsonl"
    limit = MIN_MAX_BYTES
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=limit) as writer:
        room = limit - path.stat().st_size - 16 + spare  # 16: the gzip end, kept free
        writer.write(Scrape(Target(URL), T0, body=body_for(room, T0)))
        writer.flush()
        assert writer.full == (spare > 0)


def test_a_line_of_the_reading_limit_is_recorded_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    body = body_for(MAX_LINE_BYTES, T0)
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=0) as writer:
        writer.write(Scrape(Target(URL), T0, body=body))
    assert [s.body for s in read_recording(path).scrapes] == [body]


def test_a_limit_and_lost_scrapes_are_both_told(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[], max_bytes=MIN_MAX_BYTES) as writer:
        with refused_writes_past(path.stat().st_size):
            writer.write(Scrape(Target(URL), T0, body=padded(0)))
            writer.flush()
        writer.write(Scrape(Target(URL), T0 + 1, body=body_for(MIN_MAX_BYTES, T0 + 1)))
        writer.flush()
    assert writer.status() == "1 lost (File too large), stopped at 1 MiB"


def test_nothing_is_written_or_counted_after_close(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    writer = RecordingWriter(path, interval_s=1.0, targets=[])
    writer.close()
    size = path.stat().st_size
    writer.write(Scrape(Target(URL), T0, body=BODY))
    writer.flush()
    assert (writer.written, writer.unrecorded, path.stat().st_size) == (0, 0, size)


# -- KV event lines (docs/recording-format.md, "KV events") --------------------------------

def kv_batch(t: float, seq: int, *events: KvEvent, **marks: object) -> KvEventBatch:
    return KvEventBatch(t=t, rank=0, seq=seq, ts=t - 0.01, events=events,
                        **marks)  # type: ignore[arg-type]


def test_kv_event_batches_round_trip_in_their_place_among_scrapes(tmp_path: Path) -> None:
    target = Target.from_spec("127.0.0.1:8000")
    path = tmp_path / "r.jsonl.gz"
    batches = [kv_batch(T0 + 0.5, 3, BlockStored((1, (1 << 64) - 1), None, 32, 16, "GPU"),
                        BlockStored((2,), 1, 16, 16, None), BlockRemoved((1,), "CPU"),
                        AllCleared()),
               kv_batch(T0 + 1.5, 9, lost=5, restart=True, unknown=2),
               kv_batch(T0 + 2.5, 10, malformed=True, problem="not a KV event batch (x)")]
    with RecordingWriter(path, interval_s=1.0, targets=[target]) as writer:
        writer.write(Scrape(target, T0, body=BODY))
        for batch in batches:
            writer.write_kv_events(batch, target)
        writer.write(Scrape(target, T0 + 2.0, body=BODY))
    file = open_recording(path)
    assert (file.count, file.kv_event_batches, file.warnings) == (2, 3, [])
    items = list(file.items_in_time_order())
    assert [type(i).__name__ for i in items] == ["Scrape", "TargetKvEvents", "TargetKvEvents",
                                                 "Scrape", "TargetKvEvents"]
    assert [i.batch for i in items if isinstance(i, TargetKvEvents)] == batches
    assert all(i.target.url == target.url for i in items)
    assert list(file.in_time_order()) == [i for i in items if isinstance(i, Scrape)]
    assert read_recording(path).kv_events == [i for i in items
                                              if isinstance(i, TargetKvEvents)]


def test_a_batch_too_large_to_read_back_is_written_malformed(tmp_path: Path) -> None:
    target = Target.from_spec("127.0.0.1:8000")
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[target]) as writer:
        big = BlockStored(tuple(range(MAX_RECORDED_HASHES + 1)), None, 16, 16, "GPU")
        writer.write_kv_events(kv_batch(T0, 0, big), target)
        most = BlockStored(tuple(range(MAX_RECORDED_HASHES)), None, 16, 16, "GPU")
        writer.write_kv_events(kv_batch(T0, 1, most), target)
    first, second = read_recording(path).kv_events
    assert first.batch.malformed and first.batch.events == ()
    assert first.batch.problem == (f"a batch of {MAX_RECORDED_HASHES + 1:,} block hashes is "
                                   "too large to record")
    assert not second.batch.malformed and second.batch.events == (most,)


def kv_line(**changes: object) -> dict[str, object]:
    line: dict[str, object] = {"kind": "kv_events", "t": T0, "target": URL, "rank": 0,
                               "seq": 1, "ts": T0, "events": [["S", [1], None, 16, 16, "GPU"]],
                               "unknown": 0, "malformed": False, "lost": 0, "restart": False}
    return line | changes


@pytest.mark.parametrize("changes, why", [
    ({"target": 5}, '"target" is not a URL of at most 4096 characters'),
    ({"t": "now"}, '"t" is not a time (unix seconds, 0 to 1e+10)'),
    ({"rank": -1}, 'KV events: "rank" or "seq" is not a whole number in range'),
    ({"seq": 2**63 + 1}, 'KV events: "rank" or "seq" is not a whole number in range'),
    ({"ts": "x"}, 'KV events: "ts" is not a number'),
    ({"events": {}}, 'KV events: "events" is not a list of at most 65,536 events'),
    ({"events": [["S", [2**64], None, 16, 16, "GPU"]]}, "KV events: event 1 is not a KV event"),
    ({"events": [["C"], ["R", [1, "2"], None]]}, "KV events: event 2 is not a KV event"),
    ({"events": [["S", [1], -1, 16, 16, None]]}, "KV events: event 1 is not a KV event"),
    ({"events": [["S", [1], None, 16, 16, 7]]}, "KV events: event 1 is not a KV event"),
    ({"events": [["X"]]}, "KV events: event 1 is not a KV event"),
    ({"lost": -3}, 'KV events: "unknown", "lost", "malformed" or "restart" is not of its kind'),
    ({"restart": 1}, 'KV events: "unknown", "lost", "malformed" or "restart" is not of its kind'),
])
def test_a_kv_events_line_that_is_not_one_is_skipped_with_why(
        tmp_path: Path, changes: dict, why: str) -> None:
    path = lines_file(tmp_path, kv_line(**changes), {"t": T0, "target": URL, "body": BODY})
    file = open_recording(path)
    assert (file.count, file.kv_event_batches, file.skipped) == (1, 0, 1)
    assert file.warnings == [f"line 2: {why}; skipped"]


def test_kv_event_lines_count_in_the_time_checks_of_every_pass(tmp_path: Path) -> None:
    """A batch stamped far ahead makes a later scrape 'late' whether or not events are read,
    so the checking pass and every streaming pass agree line for line."""
    path = lines_file(tmp_path, kv_line(t=T0 + 10_000), {"t": T0, "target": URL, "body": BODY})
    file = open_recording(path)
    assert (file.count, file.kv_event_batches, file.skipped) == (0, 1, 1)
    assert list(file.in_time_order()) == [] and len(list(file.items_in_time_order())) == 1
