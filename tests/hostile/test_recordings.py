"""Recordings under attack and accident, through the real commands: a disk that fills (and
frees), a server that makes the file huge, a path that is taken or a symlink, crafted files
given to `kvtop check --replay` and `kvtop replay`, and a long recording that must not be
held in memory.

The full-disk tests use a real 512 KiB tmpfs, which only root can mount (CI runs as root;
for other users they skip and say why); the file-size limit (RLIMIT_FSIZE, set on the
running `kvtop record` with prlimit) makes the kernel refuse writes for any user.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from kvtop.cli import build_app_parser, build_command_parser, main
from kvtop.collect.target import Scrape
from kvtop.store.recording import (
    DEFAULT_MAX_BYTES,
    RecordingError,
    RecordingWriter,
    open_recording,
    read_recording,
)
from kvtop.ui.app import AppConfig, KvtopApp, run_app
from kvtop.ui.replay import ReplayApp, replay_app, run_replay
from tests.fakes.faultserver import FaultServer
from tests.scenarios.app import (
    HOST_A,
    HOST_B,
    T0,
    UNDER_LOAD,
    live_app,
    live_data_shown,
    table_rows,
    until,
)
from tests.support.full_disk import fill
from tests.support.paths import fixture_text

SIZE = (120, 30)
URL = "http://10.0.0.5:8000/metrics"


# -- helpers ------------------------------------------------------------------------------


class KvtopProcess:
    """``python -m kvtop ARGS`` with its stderr read as it comes."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.stderr = ""
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KvtopProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvtop", *self.args, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr += line.decode()

    async def shows(self, text: str, timeout_s: float = 30.0) -> None:
        assert await until_true(lambda: text in self.stderr, timeout_s), (text, self.stderr)

    async def wait(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None and self._reader is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        await self._reader
        return code

    async def interrupt(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return await self.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def until_true(check: Callable[[], object], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def scrapes_in(path: Path) -> int:
    """Scrapes readable in a recording still being written (its gzip not yet ended)."""
    try:
        return len(read_recording(path).scrapes)
    except RecordingError:
        return 0


def numbered_bodies(count: int = 2000) -> list[bytes]:
    """Bodies that differ, so a scrape lost or written twice can't pass for another."""
    body = fixture_text(UNDER_LOAD)
    return [f"{body}# scrape {n}\n".encode() for n in range(count)]


def assert_in_order(recording_scrapes: list[Scrape]) -> None:
    numbers = [int(s.body.rsplit("# scrape ", 1)[1]) for s in recording_scrapes if s.body]
    assert numbers == sorted(set(numbers)) and len(numbers) == len(recording_scrapes)
    assert [s.t for s in recording_scrapes] == sorted(s.t for s in recording_scrapes)


def header(**changes: object) -> dict[str, object]:
    return {"format": "kvtop-recording", "version": 1, "created": "2026-01-01T00:00:00+00:00",
            "interval_s": 1.0, "targets": [URL]} | changes


def good(seconds: float, url: str = URL) -> dict[str, object]:
    return {"t": T0 + seconds, "target": url, "body": fixture_text(UNDER_LOAD)}


def write_lines(path: Path, *lines: object) -> Path:
    """Each line a JSON value (NaN and infinities allowed, as a hostile writer would) or
    raw bytes."""
    with path.open("wb") as file:
        for line in lines:
            file.write(line if isinstance(line, bytes) else json.dumps(line).encode())
            file.write(b"\n")
    return path


# -- item 7: a full disk while recording --------------------------------------------------


async def test_record_goes_on_through_a_full_disk_and_keeps_the_file_whole(
        small_disk: Path) -> None:
    output = small_disk / "rec.jsonl.gz"
    async with FaultServer(bodies=numbered_bodies()) as server, KvtopProcess(
            "record", server.url(), "-o", str(output), "--interval", "0.2") as kvtop:
        assert await until_true(lambda: scrapes_in(output) >= 3)
        filler = fill(small_disk)
        await kvtop.shows("cannot write")
        hits = server.hits
        assert await until_true(lambda: server.hits >= hits + 3)  # polling goes on
        filler.unlink()
        await kvtop.shows("again")
        hits = server.hits
        assert await until_true(lambda: server.hits >= hits + 3)
        code = await kvtop.interrupt()
    err = kvtop.stderr
    assert code == 4, err
    assert "Traceback" not in err
    assert "No space left on device" in err
    written = int(re.findall(r"(\d+) scrapes written", err)[-1])
    lost = int(re.findall(r"(\d+) scrapes were not written", err)[-1])
    assert lost >= 1
    gzip.decompress(output.read_bytes())  # one valid gzip stream: CRC and length agree
    recording = read_recording(output)
    assert recording.warnings == []
    assert len(recording.scrapes) == written >= 6
    assert_in_order(recording.scrapes)


UNLIMITED = resource.RLIM_INFINITY


def limit_file_size(pid: int, size: int = UNLIMITED) -> None:
    """RLIMIT_FSIZE on a running process: past it the kernel refuses writes (EFBIG)."""
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, UNLIMITED))


async def test_record_through_refused_writes_keeps_one_valid_gzip(tmp_path: Path) -> None:
    """The same as a full disk, for any user: the file-size limit refuses the writes."""
    output = tmp_path / "rec.jsonl.gz"
    async with FaultServer(bodies=numbered_bodies()) as server, KvtopProcess(
            "record", server.url(), "-o", str(output), "--interval", "0.2") as kvtop:
        assert kvtop.proc is not None
        assert await until_true(lambda: scrapes_in(output) >= 2)
        limit_file_size(kvtop.proc.pid, output.stat().st_size)
        await kvtop.shows("cannot write")
        hits = server.hits
        assert await until_true(lambda: server.hits >= hits + 2)
        limit_file_size(kvtop.proc.pid)
        await kvtop.shows("again")
        written_before = scrapes_in(output)
        assert await until_true(lambda: scrapes_in(output) >= written_before + 2)
        code = await kvtop.interrupt()
    err = kvtop.stderr
    assert code == 4, err
    assert "Traceback" not in err and "File too large" in err
    written = int(re.findall(r"(\d+) scrapes written", err)[-1])
    gzip.decompress(output.read_bytes())  # one valid gzip stream: CRC and length agree
    recording = read_recording(output)
    assert recording.warnings == [] and len(recording.scrapes) == written
    assert_in_order(recording.scrapes)


async def test_record_whose_end_cannot_be_written_still_reads_back(tmp_path: Path) -> None:
    output = tmp_path / "rec.jsonl.gz"
    async with FaultServer(bodies=numbered_bodies()) as server, KvtopProcess(
            "record", server.url(), "-o", str(output), "--interval", "0.2") as kvtop:
        assert kvtop.proc is not None
        assert await until_true(lambda: scrapes_in(output) >= 2)
        limit_file_size(kvtop.proc.pid, output.stat().st_size)
        await kvtop.shows("cannot write")
        code = await kvtop.interrupt()  # closing must write the gzip end: refused too
    err = kvtop.stderr
    assert code == 4, err
    assert "Traceback" not in err and "could not be written" in err
    written = int(re.findall(r"(\d+) scrapes written", err)[-1])
    with pytest.raises(EOFError):
        gzip.decompress(output.read_bytes())  # no end ...
    recording = read_recording(output)  # ... yet every scrape written reads back
    assert len(recording.scrapes) == written >= 2
    assert_in_order(recording.scrapes)
    assert any("ends early" in w for w in recording.warnings)


async def test_the_app_records_onto_a_full_disk_and_keeps_monitoring(
        small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvtop.ui.recording_tap.RECORD_FLUSH_S", 0.1)
    path = small_disk / "live.jsonl.gz"
    app, source = live_app(tmp_path, record=path)
    body = fixture_text(UNDER_LOAD)
    pushed = [T0]

    async def push_until(pilot: Pilot, ready: Callable[[], bool]) -> bool:
        for _ in range(100):
            pushed.append(pushed[-1] + 1)
            source.push(Scrape(HOST_A, pushed[-1], body))
            if await until(pilot, ready, timeout_s=0.5):
                return True
        return False

    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot)
        assert await until(pilot, lambda: "REC" in summary(app))
        recorder = app.recording.writer
        assert recorder is not None
        filler = fill(small_disk)
        assert await push_until(pilot, lambda: "lost (No space left on device)" in summary(app))
        # the trackers never waited for the disk: the newest scrape is folded and shown
        assert await until(pilot, lambda: app.trackers[HOST_A.url].state.last_good_t
                           == pushed[-1])
        assert any(n.title == "Recording" and "No space left" in n.message
                   for n in app._notifications)
        assert "…" not in {row["kv"] for row in table_rows(app) if row["name"] == "10.0.0.5:8000"}
        filler.unlink()
        assert await push_until(pilot, lambda: not recorder.failing)
        await pilot.press("q")
    recording = read_recording(path)
    assert recording.warnings == []
    assert len(recording.scrapes) == recorder.written
    assert recorder.lost >= 1
    assert len(source.delivered) == recorder.written + recorder.lost


def summary(app: KvtopApp) -> str:
    return str(app.query_one("#summary").render())


# -- item 9: recordings that fill the disk; taken paths and symlinks -----------------------


async def test_record_stops_at_max_size_with_a_whole_file(tmp_path: Path) -> None:
    output = tmp_path / "big.jsonl"
    # ~3 MB that is one real server plus families kvtop does not read (--full-metrics keeps
    # them): a body of that many lines kvtop *reads* is refused as no single server's.
    line = "exporter_padding_total{series=\"%s\"} 1\n"
    big = (fixture_text(UNDER_LOAD)
           + "".join(line % f"s{i:07d}" for i in range(60_000))).encode()
    async with FaultServer(bodies=[big]) as server, KvtopProcess(
            "record", server.url(), "-o", str(output), "--interval", "0.1",
            "--full-metrics", "--max-size", "8M", "--duration", "120") as kvtop:
        code = await kvtop.wait(timeout_s=100)
    assert code == 4, kvtop.stderr
    assert "reached --max-size (8 MiB); recording stopped" in kvtop.stderr
    assert output.stat().st_size <= 8 * 1024 * 1024
    recording = read_recording(output)
    assert recording.warnings == [] and len(recording.scrapes) == 2
    assert recording.scrapes[0].body == big.decode()


def test_the_size_limit_is_on_by_default() -> None:
    record = build_command_parser().parse_args(["record", "-o", "x.jsonl"])
    app = build_app_parser().parse_args(["--record", "x.jsonl"])
    check = build_command_parser().parse_args(["check", "--record", "x.jsonl"])
    assert record.max_size == app.record_max_size == check.record_max_size
    assert record.max_size == DEFAULT_MAX_BYTES == 1024**3
    assert build_command_parser().parse_args(["record", "-o", "x", "--max-size", "0"]
                                             ).max_size == 0  # no limit, when asked


async def test_the_app_stops_recording_at_its_limit_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    app, source = live_app(tmp_path, record=path, record_max_bytes=300_000)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot)
        for second in range(1, 10):  # 9 x 48 KB: past the limit
            source.push(Scrape(HOST_A, T0 + second, fixture_text(UNDER_LOAD)))
            assert await until(pilot, lambda s=second: app.trackers[HOST_A.url].state
                               .last_good_t == T0 + s)
            app.recording.flush()  # what the flush timer does
        assert await until(pilot, lambda: "REC stopped at 293 KiB" in summary(app))
        source.push(Scrape(HOST_B, T0 + 20, failure="down", error="refused"))
        assert await until(pilot, lambda: app.trackers[HOST_B.url].state.last_attempt_t
                           == T0 + 20)  # monitoring goes on
    assert path.stat().st_size <= 300_000
    recording = read_recording(path)
    assert recording.warnings == [] and len(recording.scrapes) >= 4


def _record(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "kvtop", "record", "127.0.0.1:1",
                           "--duration", "0.3", *args], capture_output=True, text=True,
                          timeout=60, check=False)
    return done.returncode, done.stderr


def test_record_never_overwrites_a_file_or_follows_a_symlink(
        tmp_path: Path, precious_paths: tuple[Path, Path, Path]) -> None:
    existing, link, victim = precious_paths
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "would-be-created")

    code, err = _record("-o", str(existing))
    assert code == 2 and "existing file" in err and "--force" in err
    code, err = _record("-o", str(link))
    assert code == 2 and "symbolic link" in err
    code, err = _record("-o", str(dangling))
    assert code == 2 and not (tmp_path / "would-be-created").exists()
    assert existing.read_text() == victim.read_text() == "precious\n"

    code, err = _record("-o", str(existing), "--force")
    assert code == 0, err
    assert read_recording(existing).header["format"] == "kvtop-recording"
    code, err = _record("-o", str(link), "--force")  # the link is replaced, not followed
    assert code == 0, err
    assert not link.is_symlink() and read_recording(link).scrapes
    assert victim.read_text() == "precious\n"
    folder = tmp_path / "folder"
    folder.mkdir()
    code, err = _record("-o", str(folder), "--force")
    assert code == 2 and "cannot write" in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp


def test_app_and_check_never_overwrite_a_recording(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "old.jsonl"
    existing.write_text("precious\n")
    assert run_app(AppConfig(targets=[HOST_A], record=existing)) == 2
    assert "existing file" in capsys.readouterr().err
    assert main(["check", "127.0.0.1:1", "--duration", "1s", "--record", str(existing)]) == 2
    assert "existing file" in capsys.readouterr().err
    assert existing.read_text() == "precious\n"


# -- item 8: crafted recordings -----------------------------------------------------------

BAD_HEADERS = {
    "targets a number": header(targets=5),
    "targets nested lists": header(targets=[["x"]]),
    "target not a URL": header(targets=["http://[::1"]),
    "interval text": header(interval_s="abc"),
    "interval a list": header(interval_s=[1]),
    "interval negative": header(interval_s=-1),
    "interval zero": header(interval_s=0),
    "interval NaN": header(interval_s=float("nan")),
    "interval infinite": header(interval_s=float("inf")),
    "interval over a day": header(interval_s=1e9),
    "version true": header(version=True),
    "version text": header(version="1"),
    "not an object": ["kvtop-recording"],
    "deeply nested": b'{"format":"kvtop-recording","x":' + b"[" * 100_000 + b"]" * 100_000
                     + b"}",
}


@pytest.mark.parametrize("bad", BAD_HEADERS.values(), ids=list(BAD_HEADERS))
def test_a_bad_header_is_a_clean_exit_2(tmp_path: Path, capsys, bad: object) -> None:
    path = write_lines(tmp_path / "bad.jsonl", bad, good(0), good(1))
    assert main(["check", "--replay", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtop check: ") and "Traceback" not in err
    assert run_replay(path, snapshot_dir=tmp_path) == 2
    assert capsys.readouterr().err.startswith("kvtop replay: ")


BAD_LINES = {
    "failure a list": ({"t": T0 + 1.5, "target": URL, "error": "x", "failure": ["x"]}, None),
    "t of 400 digits": (b'{"t": 1' + b"0" * 400 + b', "target": "%s", "body": "x 1"}'
                        % URL.encode(), "not JSON"),
    "t infinite": ({"t": float("inf"), "target": URL, "body": "x 1"}, "not JSON"),
    "t NaN": ({"t": float("nan"), "target": URL, "body": "x 1"}, "not JSON"),
    "t 1e300": ({"t": 1e300, "target": URL, "body": "x 1"}, '"t" is not a time'),
    "t negative": ({"t": -5, "target": URL, "body": "x 1"}, '"t" is not a time'),
    "t text": ({"t": "5", "target": URL, "body": "x 1"}, '"t" is not a time'),
    "t true": ({"t": True, "target": URL, "body": "x 1"}, '"t" is not a time'),
    "deeply nested": (b'{"t": 1, "target": "x", "body": ' + b"[" * 200_000 + b"]" * 200_000
                      + b"}", "not JSON"),
    "millions of values": (b"[" + b"[]," * 1_000_000 + b"[]]", "more than 10000 JSON values"),
    "a list": ([1, 2, 3], "not a JSON object"),
    "target a list": ({"t": T0 + 1.5, "target": [URL], "body": "x 1"}, '"target" is not'),
    "target not a URL": ({"t": T0 + 1.5, "target": "http://[::1", "body": "x 1"},
                         '"target" is not'),
    "body a number": ({"t": T0 + 1.5, "target": URL, "body": 5}, '"body" or "error"'),
    "error a list": ({"t": T0 + 1.5, "target": URL, "error": ["x"]}, '"body" or "error"'),
    "not UTF-8": (b'{"t": 1, "target": "x", "body": "\xff\xfe"}', "not JSON"),
    "far out of order": ({"t": T0 - 3600, "target": URL, "body": "x 1"},
                         "t is over 600 s before an earlier line's"),
    "cut off": (b'{"t": 1767225601.5, "target": "http', "not JSON"),
}


@pytest.mark.parametrize(("bad", "why"), BAD_LINES.values(), ids=list(BAD_LINES))
def test_a_bad_line_is_skipped_with_a_warning(tmp_path: Path, capsys, bad: object,
                                              why: str | None) -> None:
    clean = write_lines(tmp_path / "clean.jsonl", header(), good(0), good(1), good(2))
    assert main(["check", "--replay", str(clean), "--json"]) == 3  # not enough for a verdict
    expected = json.loads(capsys.readouterr().out)
    path = write_lines(tmp_path / "bad.jsonl", header(), good(0), good(1), bad, good(2))
    assert main(["check", "--replay", str(path), "--json"]) == 3
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if why is None:  # read: an unknown failure kind is read as "down"
        assert captured.err == ""
    else:
        assert f"bad.jsonl: line 4: {why}" in captured.err and "; skipped" in captured.err
        assert json.loads(captured.out) == expected


def test_a_line_over_the_limit_is_skipped_without_being_held(tmp_path: Path, capsys) -> None:
    huge = b'{"t": 1767225601.5, "target": "%s", "body": "' % URL.encode() + b"x" * (25 << 20)
    path = write_lines(tmp_path / "huge.jsonl", header(), good(0), huge + b'"}', good(2))
    assert main(["check", "--replay", str(path), "--json"]) == 3
    assert "line 3: longer than 24 MiB; skipped" in capsys.readouterr().err
    assert [s.t for s in read_recording(path).scrapes] == [T0, T0 + 2]


def test_warnings_are_capped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "noisy.jsonl", header(), *([b"junk"] * 5000), good(0))
    recording = open_recording(path)
    assert recording.count == 1
    assert len(recording.warnings) == 21
    assert recording.warnings[-1] == "… and 4980 more lines skipped"


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_only_regular_files_are_read(tmp_path: Path, capsys, special: str) -> None:
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    assert main(["check", "--replay", str(path)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def _crafted(tmp_path: Path, interval_s: float) -> Path:
    """Every bad line kind between good ones, and lines a few seconds out of order."""
    lines: list[object] = [header(interval_s=interval_s)]
    for second in range(0, 40, 2):
        lines += [good(second + 1), good(second)]  # written when done, stamped at start
    lines[5:5] = [bad for bad, _ in BAD_LINES.values()]
    return write_lines(tmp_path / "crafted.jsonl", *lines)


@pytest.mark.parametrize("interval_s", [1e-9, 86_400.0])
async def test_replay_of_a_crafted_file_shows_what_is_good_and_quits_on_q(
        tmp_path: Path, interval_s: float) -> None:
    path = _crafted(tmp_path, interval_s)
    warnings: list[str] = []
    app = replay_app(path, speed=1000, snapshot_dir=tmp_path, tell=warnings.append)
    assert len(warnings) == len(BAD_LINES) - 1  # all but the unknown failure kind
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.replay.finished)
        assert app.trackers[URL].state.last_good_t == T0 + 39
        await pilot.press("q")
        assert await until(pilot, lambda: app.return_code == 0, timeout_s=5)


# -- "also": streamed, never held ---------------------------------------------------------


def test_check_replay_streams_in_time_order(tmp_path: Path) -> None:
    path = _crafted(tmp_path, 1.0)
    recording = open_recording(path)
    times = [s.t for s in recording.in_time_order()]
    assert times == sorted(times) and len(times) == recording.count == 41
    assert (recording.start_t, recording.end_t) == (T0, T0 + 39)


def test_a_long_recording_is_streamed_not_held(tmp_path: Path) -> None:
    """500 scrapes of 48 KB (24 MB of bodies) pass through in far less memory."""
    path = tmp_path / "long.jsonl.gz"
    with RecordingWriter(path, interval_s=1.0, targets=[HOST_A]) as writer:
        for second in range(500):
            writer.write(Scrape(HOST_A, T0 + second, fixture_text(UNDER_LOAD)))
    # one scrape read first: what the first read builds once (imports, compiled patterns,
    # caches) is no body held, and without it the test failed when run alone
    next(iter(open_recording(path).in_time_order()))
    tracemalloc.start()
    try:
        recording = open_recording(path)
        seen = sum(1 for _ in recording.in_time_order())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == 500
    assert peak < 20 * len(fixture_text(UNDER_LOAD))  # a few bodies at a time, not 500


async def test_replay_streams_and_rebuilds_on_a_seek_back(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl.gz"
    with RecordingWriter(path, interval_s=5.0, targets=[HOST_A]) as writer:
        for second in range(0, 300, 5):
            writer.write(Scrape(HOST_A, T0 + second, fixture_text(UNDER_LOAD)))
    app = replay_app(path, snapshot_dir=tmp_path)
    assert isinstance(app, ReplayApp)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.trackers[HOST_A.url].state.last_good_t == T0)
        await pilot.press("space", "right_square_bracket")  # paused, 1 min on
        assert await until(pilot, lambda: app.trackers[HOST_A.url].state.last_good_t
                           == T0 + 60)
        first = app.trackers[HOST_A.url]
        await pilot.press("left_square_bracket")  # back to the start: read again
        assert await until(pilot, lambda: app.trackers[HOST_A.url] is not first
                           and app.trackers[HOST_A.url].state.last_good_t == T0)
        await pilot.press("right_curly_bracket")  # 10 min on: to the end
        assert await until(pilot, lambda: app.replay.finished
                           and app.trackers[HOST_A.url].state.last_good_t == T0 + 295)


async def test_a_replay_draw_landing_at_shutdown_paints_nothing(tmp_path: Path) -> None:
    """A redraw timer that fires while the app shuts down (it once raised from the bar)."""
    path = write_lines(tmp_path / "rec.jsonl", header(), good(0), good(1))
    app = replay_app(path, snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.trackers[URL].state.last_good_t == T0)
    app._draw()
