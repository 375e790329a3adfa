"""A Prometheus text-format parser (exposition 0.0.4 and OpenMetrics 1.0).

Built for a monitor that reads a 50 KB scrape every second from many servers:

* ``keep`` names the samples wanted; one regex (the names as a trie) finds their lines and
  those of their HELP/TYPE, so the other lines are never visited in Python (a monitor needs
  ~100 of ~550 lines). Rare forms (quoted names, ``# EOF``) take the line-by-line path.
* Label blocks repeat verbatim between scrapes, so parsed label dicts are cached by their
  raw text. The dicts are shared: treat ``Sample.labels`` as read-only.
* A malformed line is reported in ``Exposition.errors`` and skipped; the rest is kept.
  So is a series written twice (both copies are left out: which one is true is unknown),
  unless every copy has a timestamp (OpenMetrics: points of one series at several times;
  the newest is read).
  No input raises.
* Time and memory are linear in the body and bounded: a body of more than ``MAX_LINES``
  lines, with more than ``MAX_WANTED_LINES`` lines to read or more than ``MAX_ERRORS``
  malformed ones is refused whole (``Exposition.refused`` says why; nothing in it is
  kept); a line longer than ``MAX_LINE_CHARS`` is reported and skipped; the caches hold
  at most a few MB.

Handled: escaped label values, ``NaN``/``+Inf``/``-Inf``, optional timestamps, ``# EOF``,
``_created`` series (kept like any sample), exemplars (dropped), blank and comment lines,
CRLF, duplicate or missing HELP/TYPE, samples in any order, quoted (UTF-8) metric names.

Over 500 lines: one parser, its fast path and its bounded caches; split, the hot loop would
call across modules for every line.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from kvtop.collect.bounded import BoundedCache

_NAME_TOKEN_RE = re.compile(r"[^{ \t]*")  # a sample line's name: up to '{' or a blank
_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# Quoted text, written unrolled: an alternation per character costs ~1 µs/char in re.
_QUOTED = r'"([^"\\\n]*(?:\\.[^"\\\n]*)*)"'
_LABEL_RE = re.compile(
    r'\s*(?:([a-zA-Z_][a-zA-Z0-9_]*)|' + _QUOTED + r')\s*(?:=\s*' + _QUOTED + r')?\s*'
)
# A label block of plain names only, matched whole in one call (what servers write); the
# loop in _parse_label_block reads the rest and says what is wrong.
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*' + _QUOTED)
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
# Each pair ends at its comma or before the '}', so a match never backtracks into a value
# (which cost ~0.2 us a character of it).
_PLAIN_BLOCK_RE = re.compile(r'\{(?:\s*' + _PAIR + r'\s*(?:,|(?=\})))*[ \t]*\}')
# '# HELP name text' or '# TYPE name type'; the name may be quoted like a UTF-8 sample name
_COMMENT_RE = re.compile(
    r'#[ \t]*(HELP|TYPE)[ \t]+(?:"([^"\\]*(?:\\.[^"\\]*)*)"|([^ \t]+))(?:[ \t]+(.*))?\Z'
)
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount")
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown",
                    "info", "stateset", "gaugehistogram"})

# Limits on one body (module notes). A vLLM server writes ~550 lines (~90 that kvtop reads)
# per engine and its longest line is ~1.1 KB; 256 engines (the adapters' cap) write
# ~140,000 lines of which ~23,000 are read.
MAX_LINES = 250_000
MAX_WANTED_LINES = 40_000
MAX_LINE_CHARS = 16_384
MAX_ERRORS = 1_000  # malformed lines: past this, the body is not Prometheus text
ERROR_TEXT_CHARS = 120
# The caches: entries, and characters of their keys. A fleet of 500 servers with their own
# label values fills ~45,000 entries of ~100 characters; a hostile server making every
# label block new pins at most ~50 MB here, and pays a re-parse.
_MAX_CACHED_LABEL_BLOCKS = 50_000
_MAX_CACHED_KEY_CHARS = 16 << 20
_MAX_CACHED_HEAD_CHARS = 4096  # longer heads are parsed every time, never cached
_MAX_CACHED_COMMENT_CHARS = 1024
# '{labels}' -> (quoted name or None, labels); 'name{labels}' -> (name, labels, series id)
_label_cache = BoundedCache(_MAX_CACHED_LABEL_BLOCKS, _MAX_CACHED_KEY_CHARS)
_sample_heads = BoundedCache(_MAX_CACHED_LABEL_BLOCKS, _MAX_CACHED_KEY_CHARS)
# A number per series (name and label pairs, in any order), to find one written twice;
# never reused, so a number from before the map was emptied never names another series.
_series_ids: dict[tuple[str, frozenset[tuple[str, str]]], int] = {}
_next_series_id = itertools.count()


class Sample(NamedTuple):
    """One sample line (a tuple: building one is cheap, and a scrape makes a hundred)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None  # as written: ms in 0.0.4, seconds in OpenMetrics


# Sample((name, labels, value, None)) without the Python-level __new__ of a NamedTuple:
# a third of the cost of a known sample line.
new_sample = functools.partial(tuple.__new__, Sample)


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
    refused: str | None = None  # why the whole body was refused (over a limit): it is empty
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


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_sample(sample: Sample) -> str:
    """One sample as an exposition line (no timestamp); a name outside the classic
    charset is quoted inside the braces, as UTF-8 names are written."""
    pairs = [f'{k}="{escape_label_value(v)}"' for k, v in sample.labels.items()]
    name = sample.name
    if not _NAME_RE.match(name):
        pairs.insert(0, f'"{escape_label_value(name)}"')
        name = ""
    head = f"{name}{{{','.join(pairs)}}}" if pairs else name
    return f"{head} {_format_value(sample.value)}"


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def to_text(expo: Exposition) -> str:
    """The samples as exposition text (HELP/TYPE left out): what a reader made of them."""
    return "".join(format_sample(sample) + "\n" for sample in expo.samples)


def _unescape(value: str) -> str:
    """A label value's escapes (backslash, quote, newline) read; any other stays as is.
    Escapes pair from the left, so the escaped backslashes are set aside first; then no
    backslash left can pair across one. In C, a few passes whatever the escapes: a value
    made of them costs no Python call per escape."""
    if "\\" not in value:
        return value
    if "\0" in value:  # the stand-in is taken: the same, part by part
        return "\\".join(part.replace('\\"', '"').replace("\\n", "\n")
                         for part in value.split("\\\\"))
    return (value.replace("\\\\", "\0").replace('\\"', '"').replace("\\n", "\n")
            .replace("\0", "\\"))


def unescape_help(text: str) -> str:
    """HELP text escapes only backslash and newline."""
    if "\\" not in text:
        return text
    return "\\".join(part.replace("\\n", "\n") for part in text.split("\\\\"))


def _parse_label_block(line: str, start: int) -> tuple[int, str | None, dict[str, str]]:
    """Parse ``{...}`` starting at ``line[start] == "{"``.

    Returns (index after ``}``, quoted metric name or None, labels). Raises ValueError.
    """
    plain = _PLAIN_BLOCK_RE.match(line, start)
    if plain is not None:
        pairs = _PAIR_RE.findall(line, start, plain.end())
        labels = {key: _unescape(value) for key, value in pairs}
        if len(labels) == len(pairs):  # else a label given twice: the loop says which
            return plain.end(), None, labels
    pos = start + 1
    labels = {}
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
    if end - brace <= _MAX_CACHED_HEAD_CHARS:
        _label_cache.put(line[brace:end], (quoted_name, labels), end - brace)
    return end, quoted_name, labels


def _parse_value(text: str) -> float:
    # float() also takes '1_000' and non-ASCII digits ('١'); the format allows neither
    if "_" in text or not text.isascii():
        raise ValueError(f"bad value {text[:40]!r}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text[:40]!r}") from None


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
        raise ValueError(f"bad metric name {name[:60]!r}")
    return (pos if labels or line[pos - 1 : pos] == "}" else name_end), name, labels


def _series_id(name: str, labels: dict[str, str]) -> int:
    key = (name, frozenset(labels.items()))
    known = _series_ids.get(key)
    if known is None:
        if len(_series_ids) >= _MAX_CACHED_LABEL_BLOCKS:
            # the stored heads carry ids from this map: forgotten with it, or a series read
            # once through a head and once in full would be two series (a copy never seen)
            _series_ids.clear()
            _sample_heads.clear()
        known = _series_ids[key] = next(_next_series_id)
    return known


def _parse_sample(line: str) -> tuple[Sample, int]:
    """The sample on a line, and its series id. Raises ValueError."""
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"line of {len(line):,} characters (the limit is {MAX_LINE_CHARS:,})")
    pos, name, labels = _parse_head(line, _NAME_TOKEN_RE.match(line).end())  # type: ignore[union-attr]
    key = _series_id(name, labels)
    rest = line[pos:]
    if rest[:1] == " " and rest.count(" ", 1) == 0 and "\t" not in rest:
        # "head value": remember the head, so the next scrape parses it with one lookup
        sample = Sample(name, labels, _parse_value(rest[1:]))
        if pos <= _MAX_CACHED_HEAD_CHARS:
            _sample_heads.put(line[:pos], (name, labels, key), pos)
        return sample, key
    parts = rest.split()
    if "#" in parts:  # OpenMetrics exemplar: dropped
        parts = parts[: parts.index("#")]
    if not parts or len(parts) > 2:
        raise ValueError("expected a value and an optional timestamp")
    value = _parse_value(parts[0])
    timestamp = _parse_value(parts[1]) if len(parts) == 2 else None
    if timestamp is not None and not math.isfinite(timestamp):
        raise ValueError("timestamp is not finite")
    return Sample(name, labels, value, timestamp), key


def _families_of(names: frozenset[str]) -> frozenset[str]:
    """Family names whose HELP/TYPE lines matter for these sample names."""
    families = set(names)
    for name in names:
        for suffix in _SAMPLE_SUFFIXES:
            if name.endswith(suffix):
                families.add(name[: -len(suffix)])
    return frozenset(families)


def _comment(line: str) -> tuple[str, str, str, str] | None:
    """(HELP or TYPE, family name, text as written, its value: the lower-cased type or the
    unescaped help) of a HELP/TYPE line, or None for any other comment."""
    if len(line) > _MAX_CACHED_COMMENT_CHARS:
        return _read_comment_line(line)
    return _cached_comment(line)


def _read_comment_line(line: str) -> tuple[str, str, str, str] | None:
    match = _COMMENT_RE.match(line)
    if match is None:
        return None
    kind, quoted, name, text = match.groups()
    if quoted is not None:
        name = _unescape(quoted)
    text = text.rstrip(" \t") if text else ""  # blanks and tabs only: U+00A0 is text
    return kind, name, text, text.lower() if kind == "TYPE" else unescape_help(text)


# Servers send the same HELP/TYPE lines every scrape.
_cached_comment = functools.lru_cache(maxsize=8192)(_read_comment_line)


def _read_comment(line: str, out: Exposition, families: frozenset[str] | None) -> str | None:
    """Record a HELP/TYPE line in ``out``; what is wrong with it, if anything."""
    comment = _comment(line)
    if comment is None:
        return None
    kind, name, text, value = comment
    if families is not None and name not in families:
        return None
    if len(line) > MAX_LINE_CHARS:
        return f"line of {len(line):,} characters (the limit is {MAX_LINE_CHARS:,})"
    if kind == "TYPE":
        if value not in _TYPES:
            return f"unknown type {text[:40]!r}"
        if name in out.types:
            return f"duplicate TYPE for {name[:60]}"
        out.types[name] = value
    elif name in out.helps:
        return f"duplicate HELP for {name[:60]}"
    else:
        out.helps[name] = value
    return None


class _Reader:
    """What one parse collects besides the fast path's own loop: new sample lines, series
    written twice (both copies are left out), errors with their line numbers."""

    __slots__ = ("keep", "out", "seen", "twice")

    def __init__(self, out: Exposition, keep: frozenset[str] | None) -> None:
        self.out = out
        self.keep = keep
        self.seen: dict[int, int] = {}  # series id -> index of its sample in out.samples
        self.twice: set[int] = set()

    def add(self, sample: Sample, key: int) -> str | None:
        """Keep a sample (when wanted); what is wrong with it, if anything."""
        samples = self.out.samples
        first = self.seen.setdefault(key, len(samples))
        if first != len(samples):
            kept = samples[first]
            if (sample.timestamp is not None and kept.timestamp is not None
                    and first not in self.twice):
                # OpenMetrics: one series, points at several times; the newest is now
                if sample.timestamp >= kept.timestamp:
                    samples[first] = sample
                return None
            self.twice.add(first)
            return "series written twice: every copy left out"
        samples.append(sample)
        return None

    def read_sample(self, line: str) -> str | None:
        try:
            sample, key = _parse_sample(line)
        except ValueError as exc:
            return str(exc)
        if self.keep is not None and sample.name not in self.keep:
            return None
        return self.add(sample, key)

    def error(self, line_no: int, reason: str, line: str) -> bool:
        """Report a malformed line; True when there are too many to go on."""
        errors = self.out.errors
        if len(errors) < MAX_ERRORS:
            errors.append(ParseError(line_no, reason, line[:ERROR_TEXT_CHARS]))
            return False
        first = errors[0]
        self.out.refused = (f"more than {MAX_ERRORS:,} malformed lines (the first, line "
                            f"{first.line_no}: {first.reason}): not Prometheus text")
        return True

    def finish(self) -> Exposition:
        out = self.out
        if out.refused is not None:
            out.samples, out.errors = [], []
        elif self.twice:
            out.samples = [s for i, s in enumerate(out.samples) if i not in self.twice]
        return out


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to find the wanted lines of a scrape for one ``keep`` set."""

    families: frozenset[str]  # families whose HELP/TYPE lines matter
    # A line that starts (after blanks) with a wanted sample name, a HELP/TYPE of a wanted
    # family, or a form that may be either (a quoted name, '# EOF'); group 1 is the line
    # from there on.
    wanted_line: re.Pattern[str]


@functools.lru_cache(maxsize=32)
def _plan(keep: frozenset[str]) -> _Plan:
    """Cached: a monitor passes the same set every scrape, and compiling costs far more than
    a scan. The names go in as a trie, so the regex engine rejects an unwanted line after
    a character or two, and the leading newline lets it jump between lines in C."""
    families = _families_of(keep)
    name_end = r"(?=[{ \t]|\r*(?:\n|\Z))"  # where _NAME_TOKEN_RE's token ends
    comment_end = r"(?=[ \t]|\r*(?:\n|\Z))"
    sample = _trie_regex(keep) + name_end if keep else "(?!)"
    comment = r"#[ \t]*(?:HELP|TYPE)[ \t]+" + _trie_regex(families) + comment_end
    # Rare forms, read and filtered like the careful path does: a label block first (a
    # quoted name), a quoted HELP/TYPE name, '# EOF'.
    rare = r'\{|#[ \t]*(?:HELP|TYPE)[ \t]+"|# EOF'
    pattern = re.compile(rf"\n[ \t]*((?:{sample}|{comment}|{rare})[^\n]*)")
    return _Plan(families, pattern)


def _trie_regex(words: Iterable[str]) -> str:
    """A regex matching exactly these words, shared prefixes written once."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return _trie_node(trie)


def _trie_node(node: dict[str, dict]) -> str:
    branches = [re.escape(char) + _trie_node(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    if len(branches) == 1 and "" not in node:
        return branches[0]
    group = "(?:" + "|".join(branches) + ")"
    return group + "?" if "" in node else group


class _LineNumbers:
    """1-based line numbers of the wanted lines, found by one forward pass that goes only
    as far as the last one asked for (only malformed lines need a number)."""

    __slots__ = ("_body", "_index", "_line", "_matches", "_pos")

    def __init__(self, body: str, pattern: re.Pattern[str]) -> None:
        self._body = body  # the text with a newline in front, as the pattern scans it
        self._matches = pattern.finditer(body)
        self._index, self._pos, self._line = -1, 0, 0

    def of(self, index: int) -> int:
        """The number of the index-th wanted line; indices must be asked in order."""
        while self._index < index:
            start = next(self._matches).start() + 1  # just after the line's leading newline
            self._line += self._body.count("\n", self._pos, start)
            self._pos, self._index = start, self._index + 1
        return self._line


def _known_sample(line: str) -> tuple[Sample, int] | None:
    """The fast path: a line "head value" whose head was parsed before (see _parse_sample).
    A stored head is exactly a name and label set, so a line with a timestamp or an
    exemplar never matches one."""
    head, _, value = line.rpartition(" ")
    known = _sample_heads.get(head)
    if known is None:
        return None
    try:
        return new_sample((known[0], known[1], _parse_value(value), None)), known[2]
    except ValueError:
        return None


def _parse_wanted(text: str, keep: frozenset[str], plan: _Plan) -> Exposition:
    """Only the wanted lines are visited, in order. A known head (nearly every line of
    every scrape after the first) costs a split, a lookup, a float() and a dict insert."""
    body = "\n" + text
    lines: list[str] = plan.wanted_line.findall(body)
    out = Exposition()
    if len(lines) > MAX_WANTED_LINES:
        out.refused = (f"{len(lines):,} lines of metrics kvtop reads; more than "
                       f"{MAX_WANTED_LINES:,} is not one server's")
        return out
    reader = _Reader(out, keep)
    samples, seen, families, heads = out.samples, reader.seen, plan.families, _sample_heads
    numbers: _LineNumbers | None = None
    for index, line in enumerate(lines):
        if line[-1] == "\r":
            line = line.rstrip("\r")
        first = line[0]
        if first == "#":
            if line[1:5] == " EOF" and line.rstrip() == "# EOF":
                break
            reason = _read_comment(line, out, families)
        elif first == "{":  # a quoted name: wanted or not is known once it is read
            reason = reader.read_sample(line)
        else:
            # _known_sample, inlined: this is most of a scrape's lines
            head, _, text = line.rpartition(" ")
            known = heads.get(head)
            if known is not None:
                try:
                    value = _parse_value(text)
                except ValueError:
                    known = None
            if known is None:
                reason = reader.read_sample(line)
            else:
                sample = new_sample((known[0], known[1], value, None))
                n = len(samples)
                if seen.setdefault(known[2], n) == n:
                    samples.append(sample)
                    continue
                reason = reader.add(sample, known[2])
        if reason is not None:
            numbers = numbers or _LineNumbers(body, plan.wanted_line)
            if reader.error(numbers.of(index), reason, line):
                break
    return reader.finish()


def _parse_all(text: str) -> Exposition:
    """Every line, in order (no ``keep``)."""
    reader = _Reader(Exposition(), None)
    for line_no, line in enumerate(text.split("\n"), 1):
        known = _known_sample(line) if line[:1] != "#" else None
        if known is not None:
            reason = reader.add(*known)
        else:
            line = line.rstrip("\r").lstrip(" \t")  # an indented comment is still a comment
            if not line or line.isspace():
                continue
            if line[0] == "#":
                if line.rstrip() == "# EOF":  # exactly: '# EOFX' is an ordinary comment
                    break
                reason = _read_comment(line, reader.out, None)
            else:
                reason = reader.read_sample(line)
        if reason is not None and reader.error(line_no, reason, line):
            break
    return reader.finish()


def parse(text: str, keep: Iterable[str] | None = None) -> Exposition:
    """Parse an exposition. With ``keep``, only samples with those exact names are kept
    (and the HELP/TYPE lines of their families)."""
    # (counting costs ~0.5 ns a character: only a body that could be too long is counted)
    if len(text) >= MAX_LINES and (lines := text.count("\n") + 1) > MAX_LINES:
        return Exposition(refused=f"{lines:,} lines: more than the {MAX_LINES:,} of a "
                                  "server with kvtop's limit of engines")
    if keep is None:
        return _parse_all(text)
    keep_set = keep if isinstance(keep, frozenset) else frozenset(keep)
    return _parse_wanted(text, keep_set, _plan(keep_set))
