"""Property-based fuzzing of the recording reader: whatever a file holds, the reader raises
RecordingError (a bad header, exit 2) or reads it, and every line after the header is a
scrape, a line kind it ignores by contract, or a line skipped with a warning. What it hands
on is always a well-formed scrape, in time order."""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.cli import main
from kvtop.store.format import FAILURES, MAX_INTERVAL_S, MAX_T
from kvtop.store.recording import RecordingError, open_recording

URLS = ["http://10.0.0.5:8000/metrics", "http://[::1", "", "x" * 5000, "http://a:99999/m"]
T0 = 1_767_225_600.0

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
times = st.one_of(st.floats(T0, T0 + 3600), st.floats(allow_nan=True, allow_infinity=True),
                  st.integers(), json_values)
valid_scrape = st.fixed_dictionaries({
    "t": st.floats(T0, T0 + 3600), "target": st.just(URLS[0]),
}, optional={"version": st.text(max_size=10)}).flatmap(lambda line: st.one_of(
    st.builds(lambda body: line | {"body": body}, st.text(max_size=200)),
    st.builds(lambda error, failure: line | {"error": error, "failure": failure},
              st.text(max_size=50), st.sampled_from(sorted(FAILURES)))))
mutation = st.tuples(
    st.sampled_from(["t", "target", "body", "error", "failure", "version", "kind"]),
    st.one_of(st.just(None), times, st.sampled_from(URLS), scalars,
              st.lists(scalars, max_size=2), st.dictionaries(st.text(max_size=3), scalars,
                                                             max_size=2)),
)


def _mutated(line: dict[str, object], changes: list[tuple[str, object]]) -> dict[str, object]:
    """A valid scrape line with a few keys given hostile values (None: the key removed)."""
    line = dict(line)
    for key, value in changes:
        if value is None:
            line.pop(key, None)
        else:
            line[key] = value
    return line


scrape_like = st.builds(_mutated, valid_scrape, st.lists(mutation, max_size=2))
lines = st.one_of(
    scrape_like.map(lambda line: json.dumps(line).encode()),
    scrape_like.map(lambda line: json.dumps(line).encode()),  # near-valid lines: twice as often
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=80).map(lambda raw: raw.replace(b"\n", b" ")),
    st.integers(1, 2000).map(lambda depth: b"[" * depth + b"]" * depth),
)
valid_header = st.fixed_dictionaries({
    "format": st.just("kvtop-recording"), "version": st.just(1),
}, optional={"interval_s": st.floats(0.001, 60), "targets": st.lists(st.just(URLS[0]))})
header_mutation = st.tuples(
    st.sampled_from(["format", "version", "interval_s", "targets"]),
    st.one_of(json_values, st.lists(st.sampled_from(URLS), max_size=3), st.just(None)),
)
headers = st.one_of(
    valid_header, valid_header, valid_header,  # most files get past the header
    st.builds(_mutated, valid_header, st.lists(header_mutation, min_size=1, max_size=2)),
    json_values,
).map(lambda header: json.dumps(header).encode())


def _ignored(raw: bytes) -> bool:
    """A line the format says readers ignore: another kind (it carries a "kind" key)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and "kind" in value


def _write(folder: Path, header: bytes, body: list[bytes], zipped: bool, cut: int | None) -> Path:
    data = b"\n".join([header, *body]) + b"\n"
    if zipped:
        data = gzip.compress(data)
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    path = folder / ("rec.jsonl.gz" if zipped else "rec.jsonl")
    path.write_bytes(data)
    return path


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(header=headers, body=st.lists(lines, min_size=1, max_size=12), zipped=st.booleans(),
       cut=st.sampled_from([None, None, None, 0]).flatmap(  # one file in four cut short
           lambda none: st.none() if none is None else st.integers(0, 10_000)))
def test_every_line_is_read_ignored_or_skipped_with_a_warning(
        header: bytes, body: list[bytes], zipped: bool, cut: int | None) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), header, body, zipped, cut)
        try:
            recording = open_recording(path)
        except RecordingError:
            return
        scrapes = list(recording.in_time_order())
    assert 0 < recording.interval_s <= MAX_INTERVAL_S
    assert all(isinstance(t.url, str) for t in recording.targets())
    assert len(scrapes) == recording.count
    assert [s.t for s in scrapes] == sorted(s.t for s in scrapes)
    for scrape in scrapes:
        assert math.isfinite(scrape.t) and 0 <= scrape.t < MAX_T
        assert isinstance(scrape.target.url, str) and scrape.target.url
        if scrape.body is None:
            assert isinstance(scrape.error, str) and scrape.failure in FAILURES
        else:
            assert isinstance(scrape.body, str) and scrape.failure is None
        assert scrape.version is None or isinstance(scrape.version, str)
    if cut is None:  # an undamaged file: every line is accounted for
        ignored = sum(_ignored(raw) for raw in body)
        assert recording.count + recording.skipped + ignored == len(body)
        assert len(recording.warnings) == min(recording.skipped, 21)


@settings(max_examples=60, deadline=None,  # capsys: each example reads what it printed
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(header=headers, body=st.lists(lines, max_size=8), zipped=st.booleans())
def test_check_replay_of_anything_exits_with_a_documented_code(
        header: bytes, body: list[bytes], zipped: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), header, body, zipped, None)
        code = main(["check", "--replay", str(path), "--json"])
    captured = capsys.readouterr()
    assert code in (0, 1, 2, 3)
    if code != 2:
        json.loads(captured.out)
