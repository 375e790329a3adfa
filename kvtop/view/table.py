"""The human-readable form of a snapshot (``kvtop snapshot --table``): the app's fleet rows,
then the GPUs, on stdout; what went wrong (a target's whole error, a GPU source that failed)
as notes on stderr, so a pipe gets the table alone.

Rows and cells come from the fleet view's own model (``kvtop.view.fleet`` and
``kvtop.view.cells``, which format with ``kvtop.view.format`` and import no Textual), so a
number reads the same here as in the app.
Every column is printed, each line is one row (a pipe is never squeezed to 80 columns and
nothing wraps), columns are padded by terminal cells (a wide character is two), a target
that could not be read says why in a few words in its row and whole in a note, and every
cell goes through ``display_text``: names and errors come from servers.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from kvtop.derive.tracker import TargetState
from kvtop.safe_text import cells, display_text
from kvtop.view import format as fmt
from kvtop.view.cells import COLUMNS
from kvtop.view.fleet import FleetRow, build_rows

NUMERIC = frozenset({"running", "waiting", "preempt", "hit", "prompt", "gen"})
GAP = "  "
GIB = 2**30
ERROR_CELL = 40  # characters of an error in a row: the whole of it goes to the notes


def aligned(header: list[str], rows: list[list[str]], right: Collection[int] = ()) -> list[str]:
    """Columns padded to their widest cell (``right``: right-aligned), made terminal-safe."""
    table = [[display_text(cell) for cell in row] for row in (header, *rows)]
    sizes = [[cells(cell) for cell in row] for row in table]  # measured once per cell
    widths = [max(row[i] for row in sizes) for i in range(len(header))]
    flush_right = [i in right for i in range(len(header))]

    def line(texts: list[str], used: list[int]) -> str:
        return GAP.join((" " * (width - n) + text) if at_right else (text + " " * (width - n))
                        for text, n, width, at_right in zip(texts, used, widths, flush_right,
                                                            strict=True)).rstrip()

    return [line(row, used) for row, used in zip(table, sizes, strict=True)]


def table_lines(states: list[TargetState], now: float) -> list[str]:
    """The header and one line per engine (or per target without engines: its error cut
    to a few words, so one down target does not widen every row)."""
    rows = [[_text(row, column.key) for column in COLUMNS] for row in build_rows(states, now)]
    right = {i for i, column in enumerate(COLUMNS) if column.key in NUMERIC}
    return aligned([column.label for column in COLUMNS], rows, right)


def _text(row: FleetRow, key: str) -> str:
    text = row.cells[key].text
    return display_text(text, ERROR_CELL) if key == "model" and row.stats is None else text


def gpu_lines(document: dict[str, Any]) -> list[str]:
    """Every GPU with the servers that own it."""
    lines = []
    if gpus := document.get("gpus", []):
        rows = []
        for gpu in gpus:
            name = f"{'?' if gpu['index'] is None else gpu['index']} {gpu['name']}"
            if gpu.get("mig"):
                name += f" MIG {gpu['mig']['instance']}"
            owners = ", ".join(f"{o['label']} ({o['by']})" for o in gpu.get("owners", []))
            memory = f"{_gib(gpu['memory_used_bytes'])}/{_gib(gpu['memory_total_bytes'])}"
            util = gpu["utilization_percent"]
            rows.append([gpu.get("host") or fmt.DASH, name, memory,
                         fmt.DASH if util is None else f"{util:.0f}%", owners or fmt.DASH,
                         gpu.get("source", "nvml")])
        lines += aligned(["HOST", "GPU", "MEMORY GiB", "UTIL", "SERVERS", "SOURCE"], rows,
                         right={2, 3})
    return lines


def note_lines(states: list[TargetState], document: dict[str, Any]) -> list[str]:
    """What went wrong, for stderr: each target that could not be read, with its whole
    error, then each GPU source that failed. No GPU on this machine (NVML absent) is no
    news: the JSON document says so."""
    notes = [display_text(f"{state.target.label}: {state.error}") for state in states
             if state.status != "up" and state.error]
    for source in document.get("gpu_sources", []):
        if source["status"] not in ("ok", "unavailable"):
            where = source["target"] or source["host"] or ""
            notes.append(display_text(f"GPUs from {source['source']} {where}: "
                                      f"{source['error'] or source['status']}"))
    return notes


def _gib(value: int | None) -> str:
    return fmt.DASH if value is None else f"{value / GIB:.1f}"


def table_text(states: list[TargetState], document: dict[str, Any]) -> str:
    """The snapshot ``document`` of these ``states`` as text: targets, then GPUs."""
    lines = table_lines(states, datetime.fromisoformat(document["taken_at"]).timestamp())
    if gpus := gpu_lines(document):
        lines += ["", *gpus]
    return "\n".join(lines) + "\n"
