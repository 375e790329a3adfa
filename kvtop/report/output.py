"""How headless commands print a document: JSON for scripts, text for people, both through
the output boundary (``kvtop/safe_text.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from kvtop.safe_text import json_text, out


def emit(document: dict[str, Any], as_json: bool | None,
         render_text: Callable[[dict[str, Any]], str]) -> None:
    """JSON when asked, or by default when stdout is not a terminal; else the text
    ``render_text`` makes of it. JSON keeps the exact values (known tokens masked); the
    text is made safe for a terminal line by line."""
    if as_json is None:
        as_json = not sys.stdout.isatty()
    if as_json:  # escaped by JSON itself (ASCII, no controls): the exact values
        sys.stdout.write(json_text(document, indent=2) + "\n")
    else:
        out(render_text(document))
