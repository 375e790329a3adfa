"""How headless commands print a document: JSON for scripts, text for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def emit(document: dict[str, Any], as_json: bool | None,
         render_text: Callable[[dict[str, Any]], None]) -> None:
    """JSON when asked, or by default when stdout is not a terminal; else ``render_text``."""
    if as_json is None:
        as_json = not sys.stdout.isatty()
    if as_json:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_text(document)
