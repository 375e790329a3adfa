"""Reading a recording: every line checked in one place, the file streamed, never held.

A recording may come from anywhere, so nothing in it is trusted. :func:`open_recording`
reads the file once through: a bad header is a :class:`RecordingError` (the commands exit
2), a bad line is skipped with a warning, and what a replay needs up front is noted (the
targets, the first and last time, how far a line lags behind an earlier one in time).
:meth:`RecordingFile.in_time_order` then streams the scrapes again, as often as a replay
rewinds, time-ordered through a small reorder buffer: memory stays at a line or so plus
the few seconds a slow scrape lags, however long the recording.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import heapq
import math
import re
import zlib
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from io import BufferedIOBase
from json.decoder import scanstring  # type: ignore[attr-defined]  # C scanner; not in typeshed
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.collect.source import ScrapeReader
from kvtop.collect.target import Scrape, Target
from kvtop.files import UnreadableFile, open_regular
from kvtop.safe_text import display_text
from kvtop.store.format import (
    FAILURES,
    FORMAT,
    KV_EVENTS,
    MAX_ERROR_CHARS,
    MAX_INTERVAL_S,
    MAX_LATE_S,
    MAX_LINE_BYTES,
    MAX_T,
    MAX_TARGETS,
    MAX_URL_CHARS,
    MAX_VERSION_CHARS,
    VERSION,
    MiB,
    RecordingError,
    kv_events_from_line,
)

Item = Scrape | TargetKvEvents  # what a pass that reads KV events yields

GZIP_MAGIC = b"\x1f\x8b"  # gzip is recognised by its first bytes, whatever the name
BIG_LINE_BYTES = MiB
MAX_VALUES = 10_000  # JSON values in a line over BIG_LINE_BYTES (a scrape line has ~6)
REORDER_BYTES = 64 * MiB  # bodies the time-ordering buffer may hold
MAX_WARNINGS = 20  # kept word for word; the rest are counted
# What a damaged file raises part-way (BadGzipFile is an OSError): read what came before.
_DAMAGED = (EOFError, OSError, zlib.error)
_VALUE_START = re.compile(r'["\[{,]')


@dataclass(slots=True)
class _Warnings:
    kept: list[str] = field(default_factory=list)
    more: int = 0

    def add(self, text: str) -> None:
        if len(self.kept) < MAX_WARNINGS:
            self.kept.append(text)
        else:
            self.more += 1

    def as_list(self) -> list[str]:
        return self.kept + ([f"… and {self.more} more lines skipped"] if self.more else [])


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BufferedIOBase]:
    """The file's bytes, unzipped when it is gzip. Only a regular file: /dev/zero would
    never end a line and a FIFO would block (O_NONBLOCK lets the check see it first)."""
    try:
        opened = open_regular(path)
    except UnreadableFile as exc:
        raise RecordingError(f"{path}: {exc}") from None
    with opened as file:  # buffered: it can peek
        if file.peek(2)[:2] != GZIP_MAGIC:
            yield file
            return
        with gzip.GzipFile(fileobj=file, mode="rb") as unzipped:
            yield unzipped


def _raw_lines(file: BufferedIOBase) -> Iterator[bytes | None]:
    """Each line's bytes, or None for a line over MAX_LINE_BYTES (read past, never held)."""
    while line := file.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := file.readline(MiB)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _json_object(raw: bytes) -> dict[str, Any] | str:
    """The line as a JSON object, or why it is not one. orjson refuses NaN, infinities,
    numbers that overflow a double, invalid UTF-8 and nesting over 1024 levels."""
    if len(raw) > BIG_LINE_BYTES and _too_many_values(raw):
        return f"more than {MAX_VALUES} JSON values"  # a few MB of [] would be GBs of lists
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "not JSON" if raw.endswith(b"\n") else "not JSON (cut off?)"
    return value if isinstance(value, dict) else "not a JSON object"


def _too_many_values(raw: bytes) -> bool:
    """Count where JSON values start, jumping over strings in C: cheap for a line that is
    mostly one long string (a body), stops early for one that is all brackets."""
    try:
        text = raw.decode("utf-8")
        count, at = 0, 0
        while match := _VALUE_START.search(text, at):
            if match.group() == '"':
                at = scanstring(text, match.end())[1]
                continue
            count += 1
            if count > MAX_VALUES:
                return True
            at = match.end()
    except ValueError:  # not UTF-8, a broken string: orjson says so next
        pass
    return False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)  # orjson gives a float for an integer beyond 64 bits
    return number if math.isfinite(number) else None


def _url(value: object) -> str | None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_URL_CHARS:
        return None
    try:
        urlsplit(value).port  # noqa: B018 - what Target.label needs must not raise later
    except ValueError:
        return None
    return value


def _show(value: object) -> str:
    return display_text(repr(value), 40)


def _header(raw: bytes | None, path: Path) -> dict[str, Any]:
    """Line 1, checked: anything wrong here is the whole file's problem (exit 2)."""
    if raw is None:
        raise RecordingError(f"{path}: not a kvtop recording (line 1 is over "
                             f"{MAX_LINE_BYTES // MiB} MiB)")
    if not raw:
        raise RecordingError(f"{path}: empty file, not a kvtop recording")
    line = _json_object(raw)
    if isinstance(line, str):
        raise RecordingError(f"{path}: not a kvtop recording (line 1 is {line})")
    if line.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a kvtop recording (no {FORMAT!r} header)")
    version = line.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordingError(f"{path}: bad header: version {_show(version)} is not a "
                             "format version")
    if version > VERSION:
        raise RecordingError(f"{path}: recording version {version} is newer than this kvtop "
                             f"reads ({VERSION}); upgrade kvtop")
    interval = line.get("interval_s")
    number = _number(interval)
    if interval is not None and (number is None or not 0 < number <= MAX_INTERVAL_S):
        raise RecordingError(f"{path}: bad header: interval_s {_show(interval)} is not a "
                             f"number of seconds above 0 and at most {MAX_INTERVAL_S:g}")
    targets = line.get("targets")
    if targets is not None and not (isinstance(targets, list) and len(targets) <= MAX_TARGETS
                                    and all(_url(url) for url in targets)):
        raise RecordingError(f"{path}: bad header: targets {_show(targets)} is not a list of "
                             f"at most {MAX_TARGETS} URLs")
    return line


def _fields(line: dict[str, Any]) -> tuple[str, float, dict[str, Any]] | str:
    """(url, t, the rest of the Scrape) of a scrape line, or why it is not one."""
    url = _url(line.get("target"))
    if url is None:
        return f'"target" is not a URL of at most {MAX_URL_CHARS} characters'
    t = _number(line.get("t"))
    if t is None or not 0 <= t < MAX_T:
        return f'"t" is not a time (unix seconds, 0 to {MAX_T:g})'
    version = line.get("version")
    rest: dict[str, Any] = {"version": version if isinstance(version, str)
                            and len(version) <= MAX_VERSION_CHARS else None}
    body, error, failure = line.get("body"), line.get("error"), line.get("failure")
    if isinstance(body, str):
        return url, t, rest | {"body": body}
    if isinstance(error, str):
        known = isinstance(failure, str) and failure in FAILURES
        if len(error) > MAX_ERROR_CHARS:
            error = error[: MAX_ERROR_CHARS - 1] + "…"
        return url, t, rest | {"error": error, "failure": failure if known else "down"}
    return '"body" or "error" is missing or not a string'


class _Pass:
    """One pass through the file, in file order. Every pass applies the same checks in the
    same order, so the checking pass and the streaming passes after it agree on each line."""

    def __init__(self, path: Path, targets: dict[str, Target], warnings: _Warnings | None,
                 line_limit: int | None) -> None:
        self.path = path
        self.targets = targets  # url -> Target, header's first; grows up to MAX_TARGETS
        self.warnings = warnings
        self.line_limit = line_limit  # a recording still being written: stop where checked
        self.header: dict[str, Any] | None = None
        self.lines = 0
        self.skipped = 0
        self.newest = -math.inf
        self.late_s = 0.0  # the most a kept line's t lags behind an earlier line's

    def scrapes(self) -> Iterator[Item]:
        with _opened(self.path) as file:
            lines = _raw_lines(file)
            try:
                self.header = _header(next(lines, b""), self.path)
                self.lines = 1
                for url in self.header.get("targets") or ():
                    self.targets.setdefault(url, Target(url=url))
                for raw in lines:
                    if self.line_limit is not None and self.lines >= self.line_limit:
                        return
                    self.lines += 1
                    if (scrape := self._scrape(raw)) is not None:
                        yield scrape
            except _DAMAGED as exc:
                if self.header is None:
                    raise RecordingError(f"{self.path}: unreadable ({exc})") from None
                self._warn(f"the file ends early or is damaged after line {self.lines} "
                           f"({display_text(exc, 80)}); read what came before")

    def _warn(self, text: str) -> None:
        if self.warnings is not None:
            self.warnings.add(text)

    def _skip(self, why: str) -> None:
        self.skipped += 1
        self._warn(f"line {self.lines}: {why}; skipped")

    def _scrape(self, raw: bytes | None) -> Item | None:
        if raw is None:
            self._skip(f"longer than {MAX_LINE_BYTES // MiB} MiB")
            return None
        line = _json_object(raw)
        if isinstance(line, str):
            self._skip(line)
            return None
        if "kind" in line:  # KV events are checked like scrapes; other kinds are ignored (docs)
            return self._kv_events(line) if line["kind"] == KV_EVENTS else None
        fields = _fields(line)
        if isinstance(fields, str):
            self._skip(fields)
            return None
        url, t, rest = fields
        target = self._placed(url, t)
        return None if target is None else Scrape(target, t, **rest)

    def _placed(self, url: str, t: float) -> Target | None:
        """The line's target, its time checked against the lines before (None: skipped)."""
        if t < self.newest - MAX_LATE_S:
            self._skip(f"t is over {MAX_LATE_S:g} s before an earlier line's")
            return None
        target = self.targets.get(url)
        if target is None:
            if len(self.targets) >= MAX_TARGETS:
                self._skip(f"a target beyond the first {MAX_TARGETS}")
                return None
            target = self.targets[url] = Target(url=url)
        self.late_s = max(self.late_s, self.newest - t)
        self.newest = max(self.newest, t)
        return target

    def _kv_events(self, line: dict[str, Any]) -> TargetKvEvents | None:
        url, t = _url(line.get("target")), _number(line.get("t"))
        if url is None:
            self._skip(f'"target" is not a URL of at most {MAX_URL_CHARS} characters')
            return None
        if t is None or not 0 <= t < MAX_T:
            self._skip(f'"t" is not a time (unix seconds, 0 to {MAX_T:g})')
            return None
        batch = kv_events_from_line(line, t)
        if isinstance(batch, str):
            self._skip(f"KV events: {batch}")
            return None
        target = self._placed(url, t)
        return None if target is None else TargetKvEvents(target, batch)


def _size(item: Item) -> int:
    if isinstance(item, TargetKvEvents):
        return 64 * len(item.batch.events) + 200
    return len(item.body or item.error or "") + 200


def time_ordered(scrapes: Iterable[Item], late_s: float) -> Generator[Item, None, None]:
    """Scrapes by time (then file order). A line lags an earlier one by at most ``late_s``
    (a scrape is written when it ends, stamped when it began), so each waits that long in
    a heap. Beyond REORDER_BYTES held the earliest goes anyway; the consumer drops a scrape
    older than one it has folded, as it does live."""
    heap: list[tuple[float, int, Item]] = []
    held, newest = 0, -math.inf
    for order, scrape in enumerate(scrapes):
        newest = max(newest, scrape.t)
        heapq.heappush(heap, (scrape.t, order, scrape))
        held += _size(scrape)
        while heap and (heap[0][0] <= newest - late_s or held > REORDER_BYTES):
            ready = heapq.heappop(heap)[2]
            held -= _size(ready)
            yield ready
    while heap:
        yield heapq.heappop(heap)[2]


@dataclass(slots=True)
class RecordingFile:
    """A recording on disk, checked once through (:func:`open_recording`), then streamed."""

    path: Path
    header: dict[str, Any]
    warnings: list[str]
    count: int  # scrapes kept
    skipped: int  # lines skipped with a warning
    start_t: float
    end_t: float
    _targets: dict[str, Target]
    _lines: int
    _late_s: float
    kv_event_batches: int = 0  # KV event lines kept

    @property
    def interval_s(self) -> float:
        return float(self.header.get("interval_s") or 1.0)

    def targets(self) -> list[Target]:
        return list(self._targets.values())

    def items_in_file_order(self) -> Iterator[Item]:
        """The scrapes and KV event batches in file order."""
        read = _Pass(self.path, dict(self._targets), None, self._lines)
        with contextlib.suppress(RecordingError):  # replaced since it was checked: stop
            yield from read.scrapes()

    def in_file_order(self) -> Iterator[Scrape]:
        return (item for item in self.items_in_file_order() if isinstance(item, Scrape))

    def in_time_order(self) -> Iterator[Scrape]:
        """The scrapes in time order, each with its reading made."""
        with contextlib.closing(self.items_in_time_order()) as items:
            yield from (item for item in items if isinstance(item, Scrape))

    def items_in_time_order(self) -> Generator[Item, None, None]:
        """Scrapes (each with its reading made) and KV event batches, in time order (what a
        replay with events reads)."""
        read = ScrapeReader()
        with contextlib.closing(time_ordered(self.items_in_file_order(), self._late_s)) as items:
            for item in items:
                yield read(item) if isinstance(item, Scrape) else item


def open_recording(path: Path) -> RecordingFile:
    """Check the recording at ``path`` through; RecordingError when it isn't one."""
    warnings = _Warnings()
    read = _Pass(path, {}, warnings, None)
    count, batches, start, end = 0, 0, math.inf, -math.inf
    for item in read.scrapes():
        if isinstance(item, Scrape):
            count += 1
        else:
            batches += 1
        start, end = min(start, item.t), max(end, item.t)
    assert read.header is not None
    if not count + batches:
        start = end = 0.0
    return RecordingFile(path, read.header, warnings.as_list(), count, read.skipped, start,
                         end, read.targets, read.lines, read.late_s, batches)


@dataclass(slots=True)
class Recording:
    """A recording held in memory: its header and scrapes in file order. For tests and
    small files; the commands stream (:class:`RecordingFile`)."""

    header: dict[str, Any]
    scrapes: list[Scrape] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kv_events: list[TargetKvEvents] = field(default_factory=list)

    @property
    def interval_s(self) -> float:
        return float(self.header.get("interval_s") or 1.0)

    @property
    def start_t(self) -> float:
        return min((s.t for s in self.scrapes), default=0.0)

    @property
    def end_t(self) -> float:
        return max((s.t for s in self.scrapes), default=0.0)

    def targets(self) -> list[Target]:
        urls = dict.fromkeys(self.header.get("targets") or [])
        urls.update(dict.fromkeys(s.target.url for s in self.scrapes))
        return [Target(url=url) for url in urls]

    def in_time_order(self) -> Iterator[Scrape]:
        """The scrapes in time order, each with its reading made (on a copy: the recording
        held stays as read)."""
        read = ScrapeReader()
        return (read(dataclasses.replace(s)) for s in sorted(self.scrapes, key=lambda s: s.t))

    def items_in_time_order(self) -> Iterator[Item]:
        items: list[Item] = [*self.scrapes, *self.kv_events]
        return iter(sorted(items, key=lambda item: item.t))


def read_recording(path: Path) -> Recording:
    """Read a whole recording into memory, with the same checks as :func:`open_recording`."""
    file = open_recording(path)
    items = list(file.items_in_file_order())
    return Recording(file.header, [i for i in items if isinstance(i, Scrape)], file.warnings,
                     [i for i in items if isinstance(i, TargetKvEvents)])
