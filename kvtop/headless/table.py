"""The human-readable form of a snapshot document (``kvtop snapshot`` on a terminal)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvtop.safe_text import display_text, plain

GIB = 2**30


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _blocks(kv: dict[str, Any]) -> str:
    if kv["blocks_used"] is None or kv["blocks_total"] is None:
        return _pct(kv["usage"])
    return f"{kv['blocks_used']:.0f}/{kv['blocks_total']} ({_pct(kv['usage'])})"


def _engine_row(target: dict[str, Any], engine: dict[str, Any]) -> list[str]:
    name = target["label"]
    if engine["engine"] is not None:
        name += f" [{engine['engine']}]"
    ttft = (engine["latency_s"] or {}).get("ttft") or {}
    rates = engine["rates"]
    return [
        name, engine["model"] or "–", target["status"], _blocks(engine["kv"]),
        _num(engine["requests"]["running"]), _num(engine["requests"]["waiting"]),
        _pct(engine["prefix_cache"]["hit_rate"]),
        _num(rates["generation_tokens_per_s"], "{:.1f}"),
        _num(ttft.get("p50"), "{:.3f}s"),
    ]


def _cells(values: list[str]) -> list[Text]:
    """A row's cells made safe, as Text: a str cell would be read as markup (a model named
    "[/]oops" raised MarkupError, "[link=…]" made a hyperlink)."""
    return [plain(value) for value in values]


def render_table(document: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table("target", "model", "status", "KV blocks", "run", "wait", "hit", "gen tok/s",
                  "TTFT p50", title=f"kvtop snapshot {document['taken_at']}")
    gpus = document.get("gpus", [])
    for target in document["targets"]:
        if not target["engines"]:
            count = sum(1 for gpu in gpus if gpu.get("target") == target["target"])
            reason = (target["error"] or "; ".join(target["notes"])
                      or (f"{target['server']['kind']}: {count} GPUs" if count else "no engines"))
            table.add_row(*_cells([target["label"], "–", target["status"], reason]))
        for engine in target["engines"]:
            table.add_row(*_cells(_engine_row(target, engine)))
    console.print(table)
    _render_gpus(document, console)


def _gib(value: int | None) -> str:
    return "–" if value is None else f"{value / GIB:.1f}"


def _render_gpus(document: dict[str, Any], console: Console) -> None:
    """Every GPU with its owners, then each GPU source that could not be read."""
    gpus = document.get("gpus", [])
    if gpus:
        table = Table("host", "GPU", "memory GiB", "util", "servers", "source", title="GPUs")
        for gpu in gpus:
            name = f"{'?' if gpu['index'] is None else gpu['index']} {gpu['name']}"
            if gpu.get("mig"):
                name += f" MIG {gpu['mig']['instance']}"
            owners = ", ".join(f"{o['label']} ({o['by']})" for o in gpu.get("owners", []))
            util = gpu["utilization_percent"]
            table.add_row(plain(gpu.get("host") or "–"), plain(name),
                          f"{_gib(gpu['memory_used_bytes'])}/{_gib(gpu['memory_total_bytes'])}",
                          "–" if util is None else f"{util:.0f}%",
                          plain(owners or "–"), gpu.get("source", "nvml"))
        console.print(table)
    for source in document.get("gpu_sources", []):
        if source["status"] != "ok":
            where = source["target"] or source["host"] or ""
            console.print(f"GPUs from {source['source']} {display_text(where)}: "
                          f"{display_text(source['error'] or source['status'])}",
                          markup=False, highlight=False)
