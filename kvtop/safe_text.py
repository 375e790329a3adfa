"""The one boundary between text from outside and a terminal or a file.

Model names, ``engine`` labels, ``cache_config_info`` values, Prometheus label names and
values, server, Prometheus and OpenAI API error messages, recording headers, baseline files
and config names all come from places kvtop does not control. Everything kvtop writes goes
out through here:

* **Text for a terminal** (:func:`display_text`, :func:`plain`, :func:`out`, :func:`warn`,
  :func:`rewrite_line`): control characters (escape sequences start with one), newlines,
  bidi overrides and invisible format characters are written out as visible ``\\xNN`` /
  ``\\uNNNN`` escapes, so a terminal never interprets them and a crafted name can't wipe the
  screen, write the clipboard (OSC 52) or spoof a row. The result is plain text, never
  markup: the app and the table draw it as a Rich :class:`~rich.text.Text` (:func:`plain`),
  so ``[link=…]`` or ``[/]`` stays literal. Widths are terminal cells (:func:`cells`,
  :func:`pad`): a CJK name takes two per character.
* **Files** for people (:func:`file_text`: the same lines as on a terminal) **and JSON**
  (:func:`json_text`, :func:`json_bytes`): JSON keeps the exact values (it escapes control
  characters itself, so scripts see what the server sent), with every known token masked.
* **Secrets** (:class:`Secret`, :func:`mask`): a token read from the environment or a file
  is known here from the moment it is read; every client masks what it keeps from a server
  with :func:`mask` (the token, and whatever follows an echoed ``Bearer``) before it cuts
  a quote short, and everything written through this module masks every known token again.

``tests/unit/test_safe_text.py`` walks kvtop's code and fails on a write to a terminal or a
file that does not come through here.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import orjson
from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

# C0 and C1 controls and DEL (ESC, CSI, OSC, BEL, newlines...), bidi embeddings, overrides
# and isolates, zero-width and other invisible format characters, line/paragraph separators,
# interlinear annotation marks, invisible fillers, tag characters (hidden "ASCII
# smuggling") and lone surrogates (which can't even be encoded).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)
ELLIPSIS = "…"
# No label, error or config value needs more on a screen; a megabyte-long "model name"
# costs nothing past this.
DISPLAY_MAX = 1024
# A whole line of a document (a table row of every column) is cut here: no terminal is
# wider, and a line this long is a hostile one.
LINE_MAX = 16_384


# ---------------------------------------------------------------------------- secrets


MASK = "***"
# Tokens shorter than this are masked where their own client quotes its server, not in
# every output: masking "abc" in every line would garble the text it protects nothing in.
MIN_KNOWN_SECRET = 8
_known: set[str] = set()
_known_order: tuple[str, ...] = ()  # longest first: a token inside another is masked last
# A header echoed by a server or proxy ("Authorization: Bearer abc…"), even one it cut short;
# case-sensitive "Bearer" alone, so kvtop's own hints ("a bearer token") are left as they are.
_BEARER = re.compile(r"((?:(?i:authorization)[\s\"':=]{0,6}(?i:bearer)|\bBearer)\s+)"
                     r"[^\s\"',;)}\]]+")


class Secret:
    """A bearer token that never shows itself in repr, str, logs or JSON, and is masked in
    everything kvtop writes from the moment it exists."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        _remember(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _remember(value: str) -> None:
    global _known_order
    if len(value) >= MIN_KNOWN_SECRET and value not in _known:
        _known.add(value)
        _known_order = tuple(sorted(_known, key=len, reverse=True))


def _mask_known(text: str) -> str:
    for secret in _known_order:
        text = text.replace(secret, MASK)
    return text


def _given(token: Secret | Sequence[Secret] | None) -> tuple[Secret, ...]:
    if token is None:
        return ()
    return (token,) if isinstance(token, Secret) else tuple(token)


def mask(text: str, token: Secret | Sequence[Secret] | None = None) -> str:
    """``text`` (a server's, a Prometheus's or an API's words) with ``token`` (a token, or
    every secret a target sends: its token and secret header values), every known secret
    and anything quoted after ``Bearer`` masked: the one masking function every client uses
    on what it keeps. Call it before cutting a quote short: a token cut in two would no
    longer match, and its first characters would leak."""
    for secret in _given(token):
        if secret.reveal() and secret.reveal() in text:
            text = text.replace(secret.reveal(), MASK)
    text = _mask_known(text)
    if "earer" in text.lower():  # a cheap test first: most texts quote no header
        text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    return text


def mask_bytes(data: bytearray, token: Secret | Sequence[Secret] | None = None) -> bytearray:
    """A raw answer with ``token`` (one or several) and every known secret masked, before
    anything quotes or parses it (a secret echoed in another form is masked by :func:`mask`
    where it is quoted)."""
    short = tuple(secret.reveal() for secret in _given(token)
                  if secret.reveal() and secret.reveal() not in _known)
    secrets = (*short, *_known_order)  # short ones are masked here only
    for secret in secrets:
        raw = secret.encode()
        if raw in data:  # bytearray.replace copies even when there is nothing to replace
            data = data.replace(raw, MASK.encode())
    return data


# ---------------------------------------------------------------------------- a terminal


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_text(value: object, max_len: int = DISPLAY_MAX) -> str:
    """``value`` as text that is safe to put on a terminal, known tokens masked, cut to
    ``max_len`` characters (with an ellipsis). Safe text passes through unchanged."""
    text = value if isinstance(value, str) else str(value)
    # Tokens first, in the whole value: masked ones shorten it, so a window cut before
    # masking would show the start of a token repeated along it. A substring search each.
    for secret in _known_order:  # inlined: this runs for every string shown
        if secret in text:  # faster than replace when it is not there, as it seldom is
            text = text.replace(secret, MASK)
    if len(text) > max_len:  # each character shows as one or more: the rest can't fit
        text = text[: max_len + 1]
    if not (text.isascii() and text.isprintable()):  # the fast path: nothing to write out
        text = _UNSAFE.sub(_visible, text)
    if len(text) > max_len:
        text = text[: max_len - 1] + ELLIPSIS if max_len > 0 else ""
    return text


def plain(value: object, style: str | Style = "", max_len: int = DISPLAY_MAX) -> Text:
    """``value`` made safe and wrapped as Rich text: drawn as it reads, never as markup."""
    return Text(display_text(value, max_len), style=style)


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes (a CJK character two, a combining mark none)."""
    return len(text) if text.isascii() and text.isprintable() else _cells(text)


@functools.lru_cache(maxsize=4096)  # a table's cells repeat ("–", "0/80G"): measured once
def _cells(text: str) -> int:
    return cell_len(text)


def pad(text: str, width: int, *, right: bool = False) -> str:
    """``text`` padded with spaces to ``width`` terminal cells (``right``: aligned right)."""
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill


def terminal_lines(text: str) -> str:
    """A document of lines for a terminal: each line made safe (newlines kept between them,
    every other control written out), none longer than ``LINE_MAX``."""
    return "\n".join(display_text(line, LINE_MAX) for line in text.split("\n"))


def out(text: str, file: TextIO | None = None) -> None:
    """Write a document of lines (kvtop's text with outside strings in it) to stdout."""
    (file or sys.stdout).write(terminal_lines(text))


def warn(message: str, file: TextIO | None = None) -> None:
    """Print a one-line message that may quote outside text (a server's error, a file's
    contents, a config value) on stderr, made safe."""
    print(display_text(message), file=file or sys.stderr)


def rewrite_line(stream: TextIO, line: str) -> None:
    """A progress line written over the last one on a terminal: the line made safe; the
    return to the line's start and the erase after it are kvtop's own control sequences."""
    stream.write(f"\r{display_text(line, LINE_MAX)}\x1b[K")


def erase_line(stream: TextIO) -> None:
    """Wipe the progress line (kvtop's own control sequences)."""
    stream.write("\r\x1b[K")


# ---------------------------------------------------------------------------- files, JSON


def file_text(text: str) -> str:
    """A text file for people (a report they ``cat``): the same lines as on a terminal."""
    return terminal_lines(text)


def kept_text(text: str) -> str:
    """A server's text kept exactly in a file (a snapshot's metrics files), every known
    token masked: for a person's tools, not their terminal."""
    return _mask_known(text)


def _json_forms(secret: str) -> set[str]:
    """The ways JSON may write a token: as is, or with quotes and backslashes escaped."""
    return {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}


def json_text(document: Any, **options: Any) -> str:
    """``json.dumps(document, **options)`` with every known token masked."""
    text = json.dumps(document, **options)
    for secret in _known_order:
        for form in _json_forms(secret):
            text = text.replace(form, MASK)
    return text


def json_bytes(document: Any, option: int = 0) -> bytes:
    """``orjson.dumps(document, option=option)`` (JSON lines, files written in binary) with
    every known token masked."""
    data = orjson.dumps(document, option=option)
    for secret in _known_order:
        for form in _json_forms(secret):
            data = data.replace(form.encode(), MASK.encode())
    return data
