"""What kvtop says after a bug: one line for the terminal, the traceback in a file.

The traceback is written without the frames' locals: a local may hold a bearer token (the
HTTP client builds its header from one), and a crash report is something users paste into
issues. Textual's own report shows every frame's locals, so the app uses this one too.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback

from kvtop import __version__
from kvtop.safe_text import display_text, file_text


def write_crash_report(error: BaseException) -> str:
    """Write ``error``'s traceback (no locals) to a fresh file; return a one-line summary
    naming the error and where its traceback went."""
    summary = display_text(f"{type(error).__name__}: {error}", 200)
    try:
        fd, path = tempfile.mkstemp(prefix="kvtop-crash-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as report:
            report.write(f"kvtop {__version__}, Python {sys.version.split()[0]}\n")
            # an exception's message may quote a server: a file a person reads, as safe
            report.write(file_text("".join(traceback.format_exception(error))))
        where = f"traceback in {path}"
    except OSError as exc:
        where = f"the traceback could not be written: {exc.strerror or exc}"
    return f"{summary} ({where})"
