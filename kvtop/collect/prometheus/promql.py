"""PromQL built by one set of functions: every label value kvtop puts in a query is written
as a PromQL string (:func:`string`), and every value matched by a regex is escaped as a
literal first (:func:`literal_regex`). A value is never spliced into a query as it is: one
``job`` label holding a quote (``honor_labels`` lets a target set it) made every refresh a
parse error, and all the healthy instances were lost with it.
"""

from __future__ import annotations

from collections.abc import Iterable

# Go's escapes, which PromQL's double-quoted strings read.
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}
_REGEX_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")


def string(value: str) -> str:
    """``value`` as a PromQL string literal: double-quoted, with quotes, backslashes and
    control characters escaped (every other character as it is, sent as UTF-8)."""
    out = []
    for char in value:
        escaped = _ESCAPES.get(char)
        if escaped is None and (char < " " or char == "\x7f"):
            escaped = f"\\x{ord(char):02x}"
        out.append(escaped or char)
    return '"' + "".join(out) + '"'


def literal_regex(value: str) -> str:
    """A RE2 regex matching exactly ``value``: every ASCII character but letters, digits,
    ``_`` and ``:`` (a metric name's) escaped with a backslash (RE2 reads an escaped
    punctuation or control character as itself)."""
    return "".join(c if c in _REGEX_PLAIN or not c.isascii() else "\\" + c for c in value)


def matcher(name: str, op: str, value: str) -> str:
    """One label matcher, ``name op "value"``; for ``=~`` and ``!~`` the value is a regex
    and is written as given (a literal one comes from :func:`literal_regex`)."""
    if op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"not a PromQL label matcher operator: {op!r}")
    return f"{name}{op}{string(value)}"


def one_of(name: str, values: Iterable[str]) -> str:
    """``name`` matching any of ``values`` exactly (``name=~"a|b\\"c"``)."""
    return matcher(name, "=~", "|".join(literal_regex(v) for v in sorted(set(values))))


def selector_matchers(selector: str) -> str:
    """``{a="b", c=~"d"}`` -> ``a="b", c=~"d"`` (checked loosely; Prometheus checks the rest)."""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"a label selector looks like {{namespace=\"prod\"}}, not {selector!r}")
    inner = text[1:-1].strip().rstrip(",")
    if "__name__" in inner:
        raise ValueError("the selector picks instances by their labels; leave out __name__")
    return inner


def vector_selector(names: Iterable[str], selector: str, extra: str = "") -> str:
    """``{__name__=~"<names>", <the operator's selector>, <extra>}``."""
    matchers = [one_of("__name__", names), selector_matchers(selector), extra]
    return "{" + ", ".join(m for m in matchers if m) + "}"


def duration(seconds: float) -> str:
    """A PromQL range: whole milliseconds (2.x rejects fractional durations)."""
    return f"{max(1, round(seconds * 1000))}ms"


