"""The one boundary between text from outside and a terminal.

Model names, ``engine`` labels, ``cache_config_info`` values, server and Prometheus error
messages, instance labels, recording headers and config names all come from places kvtop
does not control. Before any of them is drawn in the app or printed as text, it goes
through :func:`display_text`: control characters (escape sequences start with one),
newlines, bidi overrides and invisible format characters are written out as visible
``\\xNN`` / ``\\uNNNN`` escapes, so a terminal never interprets them and a crafted name can't
wipe the screen, write the clipboard (OSC 52) or spoof a row. The result is plain text,
never markup: the app and the table draw it as a Rich :class:`~rich.text.Text`
(:func:`plain`), so ``[link=…]`` or ``[/]`` stays literal instead of becoming a hyperlink or
a MarkupError. Messages on stderr go through :func:`warn`.

JSON output does not go through here: ``json.dumps`` escapes control characters itself, so
scripts see the exact value.
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

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


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_text(value: object, max_len: int = DISPLAY_MAX) -> str:
    """``value`` as text that is safe to put on a terminal, cut to ``max_len`` characters
    (with an ellipsis). Safe text passes through unchanged."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > max_len:  # each character shows as one or more: the rest can't fit
        text = text[: max_len + 1]
    if not (text.isascii() and text.isprintable()) and _UNSAFE.search(text):  # fast path first
        text = _UNSAFE.sub(_visible, text)
    if len(text) > max_len:
        text = text[: max_len - 1] + ELLIPSIS if max_len > 0 else ""
    return text


def plain(value: object, style: str | Style = "", max_len: int = DISPLAY_MAX) -> Text:
    """``value`` made safe and wrapped as Rich text: drawn as it reads, never as markup."""
    return Text(display_text(value, max_len), style=style)


def warn(message: str, file: TextIO | None = None) -> None:
    """Print a one-line message that may quote outside text (a server's error, a file's
    contents, a config value) on stderr, made safe."""
    print(display_text(message), file=file or sys.stderr)
