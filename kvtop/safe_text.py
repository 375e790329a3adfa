"""The one boundary between text from outside and a terminal.

Model names, ``engine`` labels, ``cache_config_info`` values, server and Prometheus error
messages, instance labels, recording headers and config names all come from places kvtop
does not control. Before any of them is drawn in the app or printed as text, it goes
through :func:`display_text`: control characters (escape sequences start with one),
newlines, bidi overrides and invisible format characters are written out as visible
``\\xNN`` / ``\\uNNNN`` escapes, so a terminal never interprets them and a crafted name can't
wipe the screen, write the clipboard (OSC 52) or spoof a row. The result is plain text: the
app draws it as a Rich ``Text`` (never as markup), so ``[link=…]`` stays literal.

JSON output does not go through here: ``json.dumps`` escapes control characters itself, so
scripts see the exact value.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (ESC, CSI, OSC, BEL, newlines...), bidi embeddings, overrides
# and isolates, zero-width and other invisible format characters, line/paragraph separators,
# interlinear annotation marks, and lone surrogates (which can't even be encoded).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
ELLIPSIS = "…"


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def display_text(value: object, max_len: int | None = None) -> str:
    """``value`` as text that is safe to put on a terminal, cut to ``max_len`` characters
    (with an ellipsis) when given. Safe text passes through unchanged."""
    text = value if isinstance(value, str) else str(value)
    if _UNSAFE.search(text):
        text = _UNSAFE.sub(_visible, text)
    if max_len is not None and len(text) > max_len:
        text = text[: max_len - 1] + ELLIPSIS if max_len > 0 else ""
    return text
