"""The recording format's names and limits, shared by the writer and the reader
(docs/recording-format.md says what each means to someone writing or reading a file)."""

from __future__ import annotations

from typing import Any, Literal

from kvtop.collect.kv_events import (
    MAX_EVENTS,
    MAX_HASHES,
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
)
from kvtop.collect.target import Scrape

FORMAT, VERSION = "kvtop-recording", 1
FAILURES: frozenset[str] = frozenset({"down", "timeout", "auth", "bad_payload"})

MiB = 1024 * 1024
# What a reader accepts. Anything beyond is a skipped line (or, in the header, an error):
# a recording may come from anywhere, and replaying it must not take the machine down.
MAX_LINE_BYTES = 24 * MiB  # a 16 MiB body (the poller's cap) JSON-escaped fits
MAX_TARGETS = 10_000
MAX_URL_CHARS = 4096
MAX_T = 1e10  # unix seconds, before the year 2286: a clock can show it
MAX_INTERVAL_S = 86_400.0
MAX_LATE_S = 600.0  # how far a line's t may lag behind an earlier line's (a slow scrape)
MAX_ERROR_CHARS = 2000
MAX_VERSION_CHARS = 200


KV_EVENTS = "kv_events"  # the line kind of a KV event batch
# Hashes written in one batch line: a JSON line of more than 10,000 values and 1 MiB is one
# readers skip (reader.py), so a bigger batch is written as a malformed one instead.
MAX_RECORDED_HASHES = 8_000
MAX_PROBLEM_CHARS = 200
MAX_MEDIUM_CHARS = 64
MAX_SEQ = 2**63  # vLLM's sequence numbers are 8 bytes


class RecordingError(ValueError):
    """A file that is not a readable kvtop recording; the message says why."""


def header_line(interval_s: float, targets: list[str], created: str) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "created": created,
            "interval_s": interval_s, "targets": targets}


def scrape_line(scrape: Scrape) -> dict[str, Any]:
    """A scrape as a recording line. Only the URL is written: never a token."""
    line: dict[str, Any] = {"t": scrape.t, "target": scrape.target.url}
    if scrape.ok:
        line["body"] = scrape.text()
    else:
        line["error"] = scrape.error or "failed"
        line["failure"] = scrape.failure or "down"
    if scrape.version:
        line["version"] = scrape.version
    return line


def _event_json(event: KvEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return ["S", list(event.hashes), event.parent, event.tokens, event.block_size,
                event.medium]
    if isinstance(event, BlockRemoved):
        return ["R", list(event.hashes), event.medium]
    return ["C"]


def kv_events_line(batch: KvEventBatch, target: str) -> dict[str, Any]:
    """A KV event batch as a recording line: hashes, counts and names, never token ids (the
    batch holds none) or LoRA names. One too big to read back is written malformed."""
    line: dict[str, Any] = {"kind": KV_EVENTS, "t": batch.t, "target": target,
                            "rank": batch.rank, "seq": batch.seq, "ts": batch.ts}
    hashes = sum(len(e.hashes) for e in batch.events if not isinstance(e, AllCleared))
    problem = batch.problem
    if hashes > MAX_RECORDED_HASHES:
        problem = f"a batch of {hashes:,} block hashes is too large to record"
    events = [] if problem else [_event_json(e) for e in batch.events]
    line |= {"events": events, "unknown": batch.unknown, "malformed": problem is not None,
             "lost": batch.lost, "restart": batch.restart}
    if problem:
        line["problem"] = problem
    return line


def _count(value: object, most: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        return None
    return value


def _key(value: object) -> int | None:
    return _count(value, (1 << 64) - 1)


def _text(value: object) -> str | Literal[False] | None:
    """A name as written (None for null); False when it is neither."""
    if value is None:
        return None
    return value[:MAX_MEDIUM_CHARS] if isinstance(value, str) else False


def _keys(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or len(value) > MAX_HASHES:
        return None
    keys = tuple(_key(v) for v in value)
    return None if None in keys else keys  # type: ignore[return-value]


def _event_from_json(value: object) -> KvEvent | None:
    """An event of a batch line; None when it is not one."""
    if not isinstance(value, list) or not value:
        return None
    kind, rest = value[0], value[1:]
    if kind == "C" and not rest:
        return AllCleared()
    if kind == "R" and len(rest) == 2:
        keys, medium = _keys(rest[0]), _text(rest[1])
        return None if keys is None or medium is False else BlockRemoved(keys, medium or None)
    if kind == "S" and len(rest) == 5:
        keys, medium = _keys(rest[0]), _text(rest[4])
        parent = None if rest[1] is None else _key(rest[1])
        tokens, size = _count(rest[2], 1 << 40), _count(rest[3], 1 << 40)
        if keys is None or medium is False or tokens is None or size is None or (
                rest[1] is not None and parent is None):
            return None
        return BlockStored(keys, parent, tokens, size, medium or None)
    return None


def kv_events_from_line(line: dict[str, Any], t: float) -> KvEventBatch | str:
    """The batch of a ``kv_events`` line (its time already checked), or why it is not one."""
    rank, seq = _count(line.get("rank"), 1 << 16), _count(line.get("seq"), MAX_SEQ)
    if rank is None or seq is None:
        return '"rank" or "seq" is not a whole number in range'
    ts = line.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
        return '"ts" is not a number'
    raw = line.get("events")
    if not isinstance(raw, list) or len(raw) > MAX_EVENTS:
        return f'"events" is not a list of at most {MAX_EVENTS:,} events'
    events = [_event_from_json(value) for value in raw]
    if None in events:
        return f"event {events.index(None) + 1} is not a KV event"
    unknown, lost = _count(line.get("unknown", 0), MAX_EVENTS), _count(line.get("lost", 0),
                                                                        MAX_SEQ)
    malformed, restart = line.get("malformed", False), line.get("restart", False)
    if unknown is None or lost is None or not isinstance(malformed, bool) or not isinstance(
            restart, bool):
        return '"unknown", "lost", "malformed" or "restart" is not of its kind'
    problem = line.get("problem")
    problem = problem[:MAX_PROBLEM_CHARS] if isinstance(problem, str) else None
    return KvEventBatch(t=t, rank=rank, seq=seq, ts=None if ts is None else float(ts),
                        events=tuple(events), unknown=unknown,  # type: ignore[arg-type]
                        malformed=malformed, lost=lost, restart=restart, problem=problem)
