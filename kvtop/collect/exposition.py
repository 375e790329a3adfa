"""A Prometheus text-format parser (exposition 0.0.4 and OpenMetrics 1.0).

Built for a monitor that reads a 50 KB scrape every second from many servers:

* ``keep`` names the samples wanted; one regex (the names as a trie) finds their lines and
  those of their HELP/TYPE, so the other lines are never visited in Python (a monitor needs
  ~100 of ~550 lines). Rare forms (quoted names, ``# EOF``) take the line-by-line path.
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
from typing import NamedTuple

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
_HELP_ESCAPE_RE = re.compile(r"\\[\\n]")
_MAX_CACHED_LABEL_BLOCKS = 50_000
_label_cache: dict[str, tuple[str | None, dict[str, str]]] = {}
_sample_heads: dict[str, tuple[str, dict[str, str]]] = {}  # "name{labels}" -> parsed
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount")
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown",
                    "info", "stateset", "gaugehistogram"})


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
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def unescape_help(text: str) -> str:
    """HELP text escapes only backslash and newline."""
    if "\\" not in text:
        return text
    return _HELP_ESCAPE_RE.sub(lambda m: "\n" if m.group(0) == "\\n" else "\\", text)


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
        return new_sample((known[0], known[1], _parse_value(value), None))
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


@functools.lru_cache(maxsize=8192)
def _comment(line: str) -> tuple[str, str, str, str] | None:
    """(HELP or TYPE, family name, text as written, its value: the lower-cased type or the
    unescaped help) of a HELP/TYPE line, or None for any other comment. Cached: servers
    send the same HELP/TYPE lines every scrape."""
    match = _COMMENT_RE.match(line)
    if match is None:
        return None
    kind, quoted, name, text = match.groups()
    if quoted is not None:
        name = _unescape(quoted)
    text = text.rstrip(" \t") if text else ""  # blanks and tabs only: U+00A0 is text
    return kind, name, text, text.lower() if kind == "TYPE" else unescape_help(text)


def _read_comment(line: str, out: Exposition, families: frozenset[str] | None) -> str | None:
    """Record a HELP/TYPE line in ``out``; what is wrong with it, if anything."""
    comment = _comment(line)
    if comment is None:
        return None
    kind, name, text, value = comment
    if families is not None and name not in families:
        return None
    if kind == "TYPE":
        if value not in _TYPES:
            return f"unknown type {text!r}"
        if name in out.types:
            return f"duplicate TYPE for {name}"
        out.types[name] = value
    elif name in out.helps:
        return f"duplicate HELP for {name}"
    else:
        out.helps[name] = value
    return None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to find the wanted lines of a scrape for one ``keep`` set."""

    families: frozenset[str]  # families whose HELP/TYPE lines matter
    # A line that starts (after blanks) with a wanted sample name or a HELP/TYPE of a wanted
    # family; group 1 is the line from that name (or '#') on.
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
    # Forms this path does not read, sending the scrape down the line-by-line one: a label
    # block first (a quoted name), a quoted HELP/TYPE name, '# EOF'.
    careful = r'\{|#[ \t]*(?:HELP|TYPE)[ \t]+"|# EOF'
    pattern = re.compile(rf"\n[ \t]*(?:((?:{sample}|{comment})[^\n]*)|{careful})")
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


def _parse_wanted(text: str, keep: frozenset[str], plan: _Plan) -> Exposition | None:
    """The fast path for ``keep``: only the wanted lines are visited, in order; None when
    the scrape needs the careful path. A known head (nearly every line of every scrape
    after the first) costs a split, a lookup and a float()."""
    lines: list[str] = plan.wanted_line.findall("\n" + text)
    if "" in lines:  # a form only the careful path reads
        return None
    out = Exposition()
    samples, families = out.samples, plan.families
    for index, line in enumerate(lines):
        if line[-1] == "\r":
            line = line.rstrip("\r")
        if line[0] == "#":
            reason = _read_comment(line, out, families)
        elif (known := _known_sample(line)) is not None:
            samples.append(known)
            continue
        else:
            reason = _read_sample(line, keep, samples)
        if reason is not None:
            line_no = _line_no(text, plan, index)
            out.errors.append(ParseError(line_no, reason, line[:120]))
    return out


def _read_sample(line: str, keep: frozenset[str] | None, samples: list[Sample]) -> str | None:
    """Append the sample on ``line`` when wanted; what is wrong with it, if anything."""
    try:
        sample = _parse_sample(line, _name_end(line))
    except ValueError as exc:
        return str(exc)
    if keep is None or sample.name in keep:
        samples.append(sample)
    return None


def _line_no(text: str, plan: _Plan, index: int) -> int:
    """The 1-based line number of the index-th wanted line (only malformed lines need it)."""
    for seen, match in enumerate(plan.wanted_line.finditer("\n" + text)):
        if seen == index:
            return text.count("\n", 0, match.start(1) - 1) + 1
    raise IndexError(index)


def parse(text: str, keep: Iterable[str] | None = None) -> Exposition:
    """Parse an exposition. With ``keep``, only samples with those exact names are kept
    (and the HELP/TYPE lines of their families)."""
    keep_set = frozenset(keep) if keep is not None else None
    if keep_set is not None:
        fast = _parse_wanted(text, keep_set, _plan(keep_set))
        if fast is not None:
            return fast
    families = _families_of(keep_set) if keep_set is not None else None
    out = Exposition()
    for line_no, line in enumerate(text.split("\n"), 1):
        if line[:1] != "#" and (known := _known_sample(line)) is not None:
            if keep_set is None or known.name in keep_set:
                out.samples.append(known)
            continue
        line = line.rstrip("\r").lstrip(" \t")  # an indented comment is still a comment
        if not line or line.isspace():
            continue
        if line[0] == "#":
            if line.rstrip() == "# EOF":  # exactly: '# EOFX' is an ordinary comment
                break
            reason = _read_comment(line, out, families)
        else:
            name_end = _name_end(line)
            if keep_set is not None and name_end and line[:name_end] not in keep_set:
                continue
            reason = _read_sample(line, keep_set, out.samples)
        if reason is not None:
            out.errors.append(ParseError(line_no, reason, line[:120]))
    return out
