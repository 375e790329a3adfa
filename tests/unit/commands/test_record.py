"""`kvtop record` run through kvtop's own command line in this process (so the mutation runs
see it), against real HTTP servers on 127.0.0.1 serving a real scrape; the recording is read
back with kvtop's reader. What a user relies on: the header and every scrape, what stderr
says (the start, a write failing and working again, the size limit, the summary), the exit
codes, a path that is taken, a symlink or read-only never written through, the token never
written.

Ctrl-C is SIGTERM sent to this process while the recording runs (the command's own handler
takes it); the disk that fills is a real 512 KiB tmpfs, which only root may mount."""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import signal
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtop.cli import main
from kvtop.store.recording import RecordingError, read_recording
from tests.fakes.faultserver import FaultServer, fixture, served_in_thread
from tests.support.cli import run_kvtop
from tests.support.full_disk import fill, tmpfs
from tests.support.paths import LOAD
from tests.support.waiting import wait_until

TOKEN = "s3cret-token-never-written"


def scrapes_in(path: Path) -> int:
    """Scrapes readable in a recording still being written."""
    try:
        return len(read_recording(path).scrapes)
    except (RecordingError, OSError):
        return 0


def numbered_bodies(count: int = 500) -> list[bytes]:
    """Real bodies that differ, so a scrape lost or written twice can't pass for another."""
    body = fixture().decode()
    return [f"{body}# scrape {n}\n".encode() for n in range(count)]


def numbers(path: Path) -> list[int]:
    return [int(s.body.rsplit("# scrape ", 1)[1]) for s in read_recording(path).scrapes
            if s.body]


@pytest.fixture
def stderr() -> io.StringIO:
    """What kvtop says on stderr, readable from another thread while it runs."""
    return io.StringIO()


@pytest.fixture
def interrupt() -> Iterator[Callable[[], None]]:
    """Ctrl-C for a recording running in this thread: SIGTERM to this process. Outside the
    run (whose own handler takes it) a SIGTERM does nothing here."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield lambda: os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, previous)


def record(stderr: io.StringIO, *args: str) -> int:
    with contextlib.redirect_stderr(stderr):
        code = main(["record", *args])
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a late Ctrl-C: harmless
    return code


@contextlib.contextmanager
def meanwhile(action: Callable[[], None]) -> Iterator[None]:
    """``action`` in a thread while the block runs `kvtop record` in this one; an assertion
    that fails there fails the test."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    thread.join(60)
    if errors:
        raise errors[0]


def said(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_record_writes_the_header_and_every_scrape_and_exits_0(
        tmp_path: Path, stderr: io.StringIO) -> None:
    output = tmp_path / "run.jsonl"
    with served_in_thread(FaultServer(bodies=numbered_bodies())) as server:
        url = server.url()
        code = record(stderr, url, "-o", str(output), "--interval", "0.2", "--duration", "1.5")
        hits, reads = server.hits, [r for r in server.requests if r.path == "/metrics"]
    recording = read_recording(output)
    assert code == 0, stderr.getvalue()
    assert recording.warnings == []
    assert recording.header["format"] == "kvtop-recording"
    assert recording.header["interval_s"] == 0.2
    assert recording.header["targets"] == [url]
    written = len(recording.scrapes)
    assert numbers(output) == list(range(written))  # every scrape, in order, once
    assert hits - 1 <= written <= hits and written >= 3  # (one may be in flight at the end)
    assert all(s.target.url == url for s in recording.scrapes)
    assert all("name[]" in r.query for r in reads)  # only the series kvtop reads
    assert said(stderr) == [
        f"kvtop record: 1 target(s) every 0.2 s -> {output}, at most 1 GiB",
        f"kvtop record: {written} scrapes written to {output}"]


def test_record_with_full_metrics_and_no_size_limit(tmp_path: Path, stderr: io.StringIO) -> None:
    output = tmp_path / "run.jsonl.gz"
    with served_in_thread(FaultServer()) as one, served_in_thread(FaultServer()) as two:
        urls = [one.url(), two.url()]
        code = record(stderr, *urls, "-o", str(output), "--interval", "0.5",
                      "--duration", "1.2", "--full-metrics", "--max-size", "0")
        reads = [r for s in (one, two) for r in s.requests if r.path == "/metrics"]
        hits = one.hits + two.hits
    recording = read_recording(output)
    assert code == 0, stderr.getvalue()
    assert recording.header["targets"] == urls
    written = len(recording.scrapes)
    assert hits - 2 <= written <= hits and written >= 4
    assert reads and not any("name[]" in r.query for r in reads)  # every series, as asked
    assert said(stderr) == [f"kvtop record: 2 target(s) every 0.5 s -> {output}",
                            f"kvtop record: {written} scrapes written to {output}"]


def test_each_scrape_is_on_disk_as_soon_as_it_is_made(
        tmp_path: Path, stderr: io.StringIO, interrupt: Callable[[], None]) -> None:
    """A crash or a kill loses at most the scrape in flight: the file is flushed per scrape."""
    output = tmp_path / "run.jsonl"
    seen: list[int] = []

    def watch() -> None:
        seen.append(wait_until(lambda: scrapes_in(output) >= 2 and scrapes_in(output),
                               "two scrapes on disk while recording", timeout_s=30))
        interrupt()

    with served_in_thread(FaultServer(bodies=numbered_bodies())) as server, meanwhile(watch):
        code = record(stderr, server.url(), "-o", str(output), "--interval", "0.2",
                      "--duration", "60")
    assert code == 0, stderr.getvalue()
    assert seen and seen[0] >= 2
    assert numbers(output) == list(range(len(numbers(output))))


def test_a_token_is_sent_and_never_written(tmp_path: Path, stderr: io.StringIO) -> None:
    output = tmp_path / "run.jsonl"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = FaultServer(mode="auth", token=TOKEN)
    with served_in_thread(server):
        code = record(stderr, server.url("auth"), "-o", str(output), "--token-file",
                      str(token_file), "--interval", "0.3", "--duration", "1")
    recording = read_recording(output)
    assert code == 0, stderr.getvalue()
    assert recording.scrapes and all(s.body == fixture().decode() for s in recording.scrapes)
    assert TOKEN not in output.read_text() and TOKEN not in stderr.getvalue()


def test_timeout_and_insecure_reach_the_scrapes(tmp_path: Path, stderr: io.StringIO,
                                                self_signed: ssl.SSLContext) -> None:
    slow = tmp_path / "slow.jsonl"
    with served_in_thread(FaultServer(mode="slow", delay_s=1.0)) as server:
        code = record(stderr, server.url(), "-o", str(slow), "--interval", "0.2",
                      "--timeout", "0.3", "--duration", "2")
    scrapes = read_recording(slow).scrapes
    assert code == 0, stderr.getvalue()
    assert len(scrapes) >= 2 and {s.failure for s in scrapes} == {"timeout"}  # not 2 s
    tls = tmp_path / "tls.jsonl"
    with served_in_thread(FaultServer(ssl_context=self_signed)) as server:
        code = record(stderr, server.url(), "-o", str(tls), "--interval", "0.2",
                      "--insecure", "--duration", "1")
    scrapes = read_recording(tls).scrapes
    assert code == 0, stderr.getvalue()
    assert scrapes and all(s.body == fixture().decode() for s in scrapes)


def test_an_existing_file_or_a_symlink_is_never_overwritten_or_followed(
        precious_paths: tuple[Path, Path, Path], stderr: io.StringIO) -> None:
    existing, link, victim = precious_paths
    with served_in_thread(FaultServer()) as server:
        for path, what in ((existing, "an existing file"), (link, "a symbolic link")):
            assert record(stderr, server.url(), "-o", str(path), "--duration", "0.5") == 2
            assert said(stderr)[-1] == (
                f"kvtop record: cannot write {path}: it is {what}, and kvtop does not "
                "overwrite or follow one (--force replaces it)")
        assert server.requests == []  # refused before a scrape
        assert existing.read_text() == victim.read_text() == "precious\n"
        assert record(stderr, server.url(), "-o", str(link), "--duration", "0.5", "--force") == 0
    assert not link.is_symlink() and read_recording(link).scrapes
    assert victim.read_text() == "precious\n"


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder no one may create a file in: a read-only tmpfs for root (whom a mode does not
    stop), a folder of mode 0o555 for anyone else."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    with tmpfs(folder, "ro,size=64k"):
        yield folder


def test_a_read_only_folder_is_named_with_the_reason_and_no_force_hint(
        read_only_folder: Path, stderr: io.StringIO) -> None:
    output = read_only_folder / "run.jsonl"
    reason = os.strerror(30 if os.geteuid() == 0 else 13)  # EROFS, EACCES
    with served_in_thread(FaultServer()) as server:
        assert record(stderr, server.url(), "-o", str(output), "--duration", "0.5") == 2
        assert server.requests == []
    assert said(stderr) == [f"kvtop record: cannot write {output}: {reason}"]
    assert not output.exists()


def test_the_size_limit_stops_the_recording_whole_and_exits_4(
        tmp_path: Path, stderr: io.StringIO) -> None:
    output = tmp_path / "run.jsonl"
    # ~420 KB a scrape: one real server plus families kvtop does not read (kept with
    # --full-metrics), so two fit in the least limit there is, 1 MiB, and a third does not
    padding = "".join(f'exporter_padding_total{{series="s{i:07d}"}} 1\n' for i in range(8000))
    bodies = [body.replace(b"# scrape", padding.encode() + b"# scrape")
              for body in numbered_bodies(50)]
    with served_in_thread(FaultServer(bodies=bodies)) as server:
        code = record(stderr, server.url(), "-o", str(output), "--interval", "0.1",
                      "--full-metrics", "--duration", "60", "--max-size", "1M")
        hits = server.hits
    assert code == 4, stderr.getvalue()
    recording = read_recording(output)
    assert recording.warnings == [] and numbers(output) == [0, 1]
    assert output.stat().st_size <= 1024 * 1024
    assert hits < 10  # it stopped at the limit, not at --duration
    assert said(stderr) == [
        f"kvtop record: 1 target(s) every 0.1 s -> {output}, at most 1 MiB",
        f"kvtop record: {output} reached --max-size (1 MiB); recording stopped",
        f"kvtop record: 2 scrapes written to {output}",
        "kvtop record: stopped early at --max-size 1 MiB"]


def test_a_first_scrape_past_the_limit_is_told_too(tmp_path: Path,
                                                   stderr: io.StringIO) -> None:
    output = tmp_path / "run.jsonl"
    padding = "".join(f'exporter_padding_total{{series="s{i:07d}"}} 1\n' for i in range(25000))
    big = fixture() + padding.encode()  # over 1 MiB: not one scrape fits
    with served_in_thread(FaultServer(bodies=[big])) as server:
        code = record(stderr, server.url(), "-o", str(output), "--full-metrics",
                      "--duration", "60", "--max-size", "1M")
    assert code == 4, stderr.getvalue()
    recording = read_recording(output)
    assert recording.warnings == [] and recording.scrapes == []
    assert said(stderr)[1:] == [
        f"kvtop record: {output} reached --max-size (1 MiB); recording stopped",
        f"kvtop record: 0 scrapes written to {output}",
        "kvtop record: stopped early at --max-size 1 MiB"]


def test_a_full_disk_is_told_once_polling_goes_on_and_the_file_stays_whole(
        small_disk: Path, stderr: io.StringIO, interrupt: Callable[[], None]) -> None:
    output = small_disk / "run.jsonl.gz"
    server = FaultServer(bodies=numbered_bodies())

    def fill_then_free() -> None:
        wait_until(lambda: scrapes_in(output) >= 2, "two scrapes written")
        filler = fill(small_disk)
        wait_until(lambda: "cannot write" in stderr.getvalue(), "the failure told")
        hits = server.hits
        wait_until(lambda: server.hits >= hits + 3, "polling going on")
        filler.unlink()
        wait_until(lambda: "again" in stderr.getvalue(), "the recovery told")
        written = scrapes_in(output)
        wait_until(lambda: scrapes_in(output) >= written + 2, "scrapes written again")
        interrupt()

    with served_in_thread(server), meanwhile(fill_then_free):
        code = record(stderr, server.url(), "-o", str(output), "--interval", "0.2",
                      "--duration", "120")
    lines = said(stderr)
    assert code == 4, stderr.getvalue()
    full = os.strerror(28)  # ENOSPC
    written = len(read_recording(output).scrapes)
    lost = int(re.findall(r"again \((\d+) scrapes lost\)", stderr.getvalue())[0])
    assert lost >= 3 and written + lost <= server.hits
    assert numbers(output) == sorted(set(numbers(output)))
    assert read_recording(output).warnings == []  # the gzip ended well once the disk freed
    assert lines[1:] == [
        f"kvtop record: cannot write {output}: {full}; scrapes are lost until it can "
        "(still polling, trying again every scrape)",
        f"kvtop record: writing {output} again ({lost} scrapes lost)",
        f"kvtop record: {written} scrapes written to {output}",
        f"kvtop record: {lost} scrapes were not written ({full}); the file holds every "
        "other one"]


def test_a_recording_whose_end_cannot_be_written_says_so_and_reads_back(
        tmp_path: Path, stderr: io.StringIO, interrupt: Callable[[], None]) -> None:
    """The file-size limit (RLIMIT_FSIZE, for any user) refuses every write past the
    recording's size, the gzip end included."""
    output = tmp_path / "run.jsonl.gz"
    server = FaultServer(bodies=numbered_bodies())
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)

    def refuse_then_stop() -> None:
        wait_until(lambda: scrapes_in(output) >= 2, "two scrapes written")
        resource.setrlimit(resource.RLIMIT_FSIZE, (output.stat().st_size, limit[1]))
        wait_until(lambda: "cannot write" in stderr.getvalue(), "the failure told")
        interrupt()  # closing must write the gzip end: refused too

    try:
        with served_in_thread(server), meanwhile(refuse_then_stop):
            code = record(stderr, server.url(), "-o", str(output), "--interval", "0.2",
                          "--duration", "120")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    too_large = os.strerror(27)  # EFBIG
    recording = read_recording(output)
    written = len(recording.scrapes)
    assert code == 4, stderr.getvalue()
    assert written >= 2 and numbers(output) == list(range(written))
    assert any("ends early" in w for w in recording.warnings)
    lines = said(stderr)
    assert lines[-3] == f"kvtop record: {written} scrapes written to {output}"
    assert re.fullmatch(rf"kvtop record: \d+ scrapes were not written \({too_large}\); "
                        "the file holds every other one", lines[-2])
    assert lines[-1] == (
        f"kvtop record: the end of {output} could not be written ({too_large}): readers "
        "warn that it ends early, and read every scrape in it")


async def test_record_writes_every_scrape_of_every_target(tmp_path) -> None:
    from kvtop.store.recording import read_recording

    output = tmp_path / "run.jsonl.gz"
    async with FaultServer() as healthy, FaultServer(mode="error500") as broken:
        code, _, err, _ = await run_kvtop(
            "record", healthy.url(), broken.url(), "-o", str(output), "--interval", "0.3",
            "--duration", "3")
        urls = [healthy.url(), broken.url()]
    assert code == 0, err
    recording = read_recording(output)
    times = [s.t for s in recording.scrapes]
    assert max(times) - min(times) <= 3  # it stopped at its duration, on its own clock
    assert recording.header["targets"] == urls
    good = [s for s in recording.scrapes if s.target.url == urls[0]]
    bad = [s for s in recording.scrapes if s.target.url == urls[1]]
    assert len(good) >= 3 and all(s.body == fixture(LOAD).decode() for s in good)
    assert bad and all(s.failure == "down" and "500" in s.error for s in bad)


async def test_record_to_unwritable_place_is_a_clear_error(tmp_path) -> None:
    code, _, err, _ = await run_kvtop("record", "127.0.0.1:1", "-o",
                                      str(tmp_path / "missing-dir" / "r.jsonl"), "--duration", "1")
    assert code == 2 and "cannot write" in err


def test_the_kv_events_of_a_target_are_recorded_beside_its_scrapes(
        tmp_path: Path, stderr: io.StringIO) -> None:
    """--kv-events (publisher, replay): every batch published while recording is a
    kv_events line, read back with its target; the summary counts them apart."""
    from tests.fakes.kv_publisher import KvPublisher, removed, stored

    output = tmp_path / "run.jsonl"
    publisher = KvPublisher()
    published: list[int] = []

    def publish() -> None:
        wait_until(lambda: scrapes_in(output) >= 1, "a first scrape on disk", timeout_s=20)
        for i in range(20):
            published.append(publisher.publish([stored([100 + i], 99 + i if i else None),
                                                removed([100 + i - 5])] if i >= 5 else
                                               [stored([100 + i], 99 + i if i else None)]))
            threading.Event().wait(0.05)

    try:
        with served_in_thread(FaultServer(bodies=numbered_bodies())) as server, \
                meanwhile(publish):
            url = server.url()
            code = record(stderr, url, "-o", str(output), "--interval", "0.2",
                          "--duration", "3", "--kv-events",
                          f"{publisher.url},{publisher.replay_url}")
    finally:
        publisher.close()
    assert code == 0, stderr.getvalue()
    recording = read_recording(output)
    assert [item.batch.seq for item in recording.kv_events] == published
    assert {item.target.url for item in recording.kv_events} == {url}
    assert recording.kv_events[-1].batch.events[0].hashes == (119,)
    assert said(stderr)[-1] == (f"kvtop record: {len(recording.scrapes)} scrapes and 20 KV "
                                f"event batches written to {output}")


def test_kv_events_need_a_command_line_target_each(tmp_path: Path,
                                                   stderr: io.StringIO) -> None:
    code = record(stderr, "127.0.0.1:1", "-o", str(tmp_path / "r.jsonl"), "--duration", "1",
                  "--kv-events", "tcp://127.0.0.1:5557", "--kv-events", "tcp://127.0.0.1:5567")
    assert code == 2
    assert said(stderr) == ["kvtop: 2 --kv-events for 1 target(s): one each, in the targets' "
                            "order"]
    assert not (tmp_path / "r.jsonl").exists()
