"""A Prometheus text-format parser (exposition 0.0.4 and OpenMetrics 1.0).

Built for a monitor that reads a 50 KB scrape every second from many servers:

* ``keep`` names the samples wanted; every other line is dropped with one ``startswith``
  test, before any label parsing (a monitor needs ~20 of ~500 lines).
* Label blocks repeat verbatim between scrapes, so parsed label dicts are cached by their
  raw text. The dicts are shared: treat ``Sample.labels`` as read-only.
* A malformed line is reported in ``Exposition.errors`` and skipped; the rest is kept.
  No input raises.

Handled: escaped label values, ``NaN``/``+Inf``/``-Inf``, optional timestamps, ``# EOF``,
``_created`` series (kept like any sample), exemplars (dropped), blank and comment lines,
CRLF, duplicate or missing HELP/TYPE, samples in any order, quoted (UTF-8) metric names.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_NAME_TOKEN_RE = re.compile(r"[^{ \t]*")  # a sample line's name: up to '{' or a blank
_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_RE = re.compile(
    r'\s*(?:([a-zA-Z_][a-zA-Z0-9_]*)|"((?:[^"\\\n]|\\.)*)")\s*(?:=\s*"((?:[^"\\\n]|\\.)*)")?\s*'
)
# '# HELP name text' or '# TYPE name type'; the name may be quoted like a UTF-8 sample name
_COMMENT_RE = re.compile(
    r'#[ \t]*(HELP|TYPE)[ \t]+(?:"((?:[^"\\]|\\.)*)"|([^ \t]+))(?:[ \t]+(.*))?\Z'
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\[\\\"n]")
_MAX_CACHED_LABEL_BLOCKS = 50_000
_label_cache: dict[str, tuple[str | None, dict[str, str]]] = {}
_sample_heads: dict[str, tuple[str, dict[str, str]]] = {}  # "name{labels}" -> parsed
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount")
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown",
                    "info", "stateset", "gaugehistogram"})


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None  # as written: ms in 0.0.4, seconds in OpenMetrics


@dataclass(frozen=True, slots=True)
class ParseError:
    line_no: int  # 1-based
    reason: str
    text: str  # the offending line, cut to 120 characters


@dataclass(slots=True)
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # family name -> type
    helps: dict[str, str] = field(default_factory=dict)
    errors: list[ParseError] = field(default_factory=list)
    _index: dict[str, list[Sample]] | None = None

    def series(self, name: str) -> list[Sample]:
        """All samples with exactly this name (e.g. ``vllm:e2e_request_latency_seconds_bucket``)."""
        if self._index is None:
            self._index = {}
            for sample in self.samples:
                self._index.setdefault(sample.name, []).append(sample)
        return self._index.get(name, [])

    def names(self) -> set[str]:
        self.series("")
        assert self._index is not None
        return set(self._index)


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def unescape_help(text: str) -> str:
    """HELP text escapes only backslash and newline."""
    if "\\" not in text:
        return text
    return text.replace("\\\\", "\x00").replace("\\n", "\n").replace("\x00", "\\")


def _parse_label_block(line: str, start: int) -> tuple[int, str | None, dict[str, str]]:
    """Parse ``{...}`` starting at ``line[start] == "{"``.

    Returns (index after ``}``, quoted metric name or None, labels). Raises ValueError.
    """
    pos = start + 1
    labels: dict[str, str] = {}
    quoted_name: str | None = None
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return pos + 1, quoted_name, labels
        match = _LABEL_RE.match(line, pos)
        if not match or match.end() == pos:
            raise ValueError("malformed label set")
        key = match.group(1) if match.group(1) is not None else _unescape(match.group(2))
        if match.group(3) is None:
            if match.group(2) is None or quoted_name is not None or labels:
                raise ValueError(f"label {key!r} has no value")
            quoted_name = key
        elif key in labels:
            raise ValueError(f"duplicate label {key!r}")
        else:
            labels[key] = _unescape(match.group(3))
        pos = match.end()
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ValueError("expected ',' or '}' in label set")


def _labels_at(line: str, brace: int) -> tuple[int, str | None, dict[str, str]]:
    """Labels starting at ``brace``, cached by the raw block text.

    The guess ``line[brace:first '}'+1]`` is a sound cache key: a block stored under it was
    parsed whole and ended exactly there, so any line starting with it ends there too.
    """
    close = line.find("}", brace)
    if close != -1:
        hit = _label_cache.get(line[brace : close + 1])
        if hit is not None:
            return close + 1, hit[0], hit[1]
    end, quoted_name, labels = _parse_label_block(line, brace)
    if len(_label_cache) >= _MAX_CACHED_LABEL_BLOCKS:
        _label_cache.clear()
    _label_cache[line[brace:end]] = (quoted_name, labels)
    return end, quoted_name, labels


def _parse_value(text: str) -> float:
    # float() also takes '1_000' and non-ASCII digits ('١'); the format allows neither
    if "_" in text or not text.isascii():
        raise ValueError(f"bad value {text!r}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text!r}") from None


def _parse_head(line: str, name_end: int) -> tuple[int, str, dict[str, str]]:
    """(index after the name and labels, name, labels) of a sample line."""
    name = line[:name_end]
    pos = name_end
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos, quoted_name, labels = _labels_at(line, pos)
        if quoted_name is not None:
            if name:
                raise ValueError("metric name given twice")
            return pos, quoted_name, labels
    if not _NAME_RE.match(name):
        raise ValueError(f"bad metric name {name!r}")
    return (pos if labels or line[pos - 1 : pos] == "}" else name_end), name, labels


def _parse_sample(line: str, name_end: int) -> Sample:
    pos, name, labels = _parse_head(line, name_end)
    rest = line[pos:]
    if rest[:1] == " " and rest.count(" ", 1) == 0 and "\t" not in rest:
        # "head value": remember the head, so the next scrape parses it with one lookup
        sample = Sample(name, labels, _parse_value(rest[1:]))
        if len(_sample_heads) >= _MAX_CACHED_LABEL_BLOCKS:
            _sample_heads.clear()
        _sample_heads[line[:pos]] = (name, labels)
        return sample
    parts = rest.split()
    if "#" in parts:  # OpenMetrics exemplar: dropped
        parts = parts[: parts.index("#")]
    if not parts or len(parts) > 2:
        raise ValueError("expected a value and an optional timestamp")
    value = _parse_value(parts[0])
    timestamp = _parse_value(parts[1]) if len(parts) == 2 else None
    if timestamp is not None and not math.isfinite(timestamp):
        raise ValueError("timestamp is not finite")
    return Sample(name, labels, value, timestamp)


def _known_sample(line: str) -> Sample | None:
    """The fast path: a line "head value" whose head was parsed before (see _parse_sample).
    A stored head is exactly a name and label set, so a line with a timestamp or an
    exemplar never matches one."""
    head, _, value = line.rpartition(" ")
    known = _sample_heads.get(head)
    if known is None:
        return None
    try:
        return Sample(known[0], known[1], _parse_value(value))
    except ValueError:
        return None


def _name_end(line: str) -> int:
    """Index where the metric name at the start of a sample line ends."""
    return _NAME_TOKEN_RE.match(line).end()  # type: ignore[union-attr]  # always matches


def _families_of(names: frozenset[str]) -> frozenset[str]:
    """Family names whose HELP/TYPE lines matter for these sample names."""
    families = set(names)
    for name in names:
        for suffix in _SAMPLE_SUFFIXES:
            if name.endswith(suffix):
                families.add(name[: -len(suffix)])
    return frozenset(families)


def _parse_comment(
    line: str, line_no: int, out: Exposition, families: frozenset[str] | None
) -> None:
    match = _COMMENT_RE.match(line)
    if match is None:
        return
    kind, quoted, name, text = match.groups()
    if quoted is not None:
        name = _unescape(quoted)
    if families is not None and name not in families:
        return
    text = text.rstrip(" \t") if text else ""  # blanks and tabs only: U+00A0 is text
    if kind == "TYPE":
        if text.lower() not in _TYPES:
            out.errors.append(ParseError(line_no, f"unknown type {text!r}", line[:120]))
        elif name in out.types:
            out.errors.append(ParseError(line_no, f"duplicate TYPE for {name}", line[:120]))
        else:
            out.types[name] = text.lower()
    elif name in out.helps:
        out.errors.append(ParseError(line_no, f"duplicate HELP for {name}", line[:120]))
    else:
        out.helps[name] = unescape_help(text)


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to drop unwanted lines of a scrape cheaply for one ``keep`` set."""

    head_len: int  # the first head_len characters of a wanted line ...
    heads: frozenset[str]  # ... are one of these (or the line starts with SPECIAL_STARTS)
    families: frozenset[str]  # families whose HELP/TYPE lines matter
    comment_len: int  # the same test for "# HELP name" / "# TYPE name" lines
    comment_heads: frozenset[str]


_SPECIAL_STARTS = frozenset("#{ \t")


@functools.lru_cache(maxsize=32)
def _plan(keep: frozenset[str]) -> _Plan:
    """Cached: a monitor passes the same set every scrape, and building it costs more than
    a scan of the scrape. One slice and one set lookup per line beats ``startswith`` over
    dozens of names."""
    head_len = min((len(name) for name in keep), default=0)
    families = _families_of(keep)
    family_len = min((len(name) for name in families), default=0)
    comment_heads = frozenset(f"# {kind} {name[:family_len]}" for kind in ("HELP", "TYPE")
                              for name in families)
    return _Plan(head_len, frozenset(name[:head_len] for name in keep), families,
                 7 + family_len, comment_heads)


def _unwanted_comment(line: str, plan: _Plan) -> bool:
    """A plain ``# HELP name`` / ``# TYPE name`` line of a family nobody asked for.
    Other comment forms (quoted names, extra blanks) take the careful path."""
    return (line[: plan.comment_len] not in plan.comment_heads
            and line.startswith(("# HELP ", "# TYPE ")) and line[7:8] not in ('"', " ", "\t"))


def parse(text: str, keep: Iterable[str] | None = None) -> Exposition:
    """Parse an exposition. With ``keep``, only samples with those exact names are kept
    (and the HELP/TYPE lines of their families)."""
    keep_set = frozenset(keep) if keep is not None else None
    plan = _plan(keep_set) if keep_set is not None else None
    families = plan.families if plan is not None else None
    out = Exposition()
    for line_no, line in enumerate(text.split("\n"), 1):
        # With keep, most lines are dropped unread: other samples, CRLF blank lines.
        if plan is not None and line[: plan.head_len] not in plan.heads:
            first = line[:1]
            if first not in _SPECIAL_STARTS:
                continue
            if first == "#" and _unwanted_comment(line, plan):
                continue
        elif line[:1] != "#" and (known := _known_sample(line)) is not None:
            if keep_set is None or known.name in keep_set:
                out.samples.append(known)
            continue
        line = line.rstrip("\r").lstrip(" \t")  # an indented comment is still a comment
        if not line or line.isspace():
            continue
        if line[0] == "#":
            if line.rstrip() == "# EOF":  # exactly: '# EOFX' is an ordinary comment
                break
            _parse_comment(line, line_no, out, families)
            continue
        name_end = _name_end(line)
        if keep_set is not None and name_end and line[:name_end] not in keep_set:
            continue
        try:
            sample = _parse_sample(line, name_end)
        except ValueError as exc:
            out.errors.append(ParseError(line_no, str(exc), line[:120]))
            continue
        if keep_set is None or sample.name in keep_set:
            out.samples.append(sample)
    return out
