"""Fleet structure: rows grouped by config group, model or a Prometheus label, under an
aggregate row per group (summed blocks, running and waiting; the worst state), collapsible
like htop's tree. Pure functions of the rows, so the table only draws what it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtop.collect.exposition import Exposition, Sample
from kvtop.derive.verdicts import LEAK_RANK
from kvtop.safe_text import display_text
from kvtop.view import format as fmt
from kvtop.view.cells import NARROW_BAR, Cell, Level
from kvtop.view.fleet import FleetRow, order_rows
from kvtop.view.fleet_summary import summarise
from kvtop.view.sort_keys import TEXT_SORTS

NONE = "none"
BASE_MODES = (NONE, "group", "model")
LABEL_PREFIX = "label:"
NO_VALUE = "(none)"
# Labels of single series, not of the server: never offered for grouping.
SERIES_LABELS = frozenset({"__name__", "model_name", "engine", "le", "quantile",
                           "finished_reason", "reason", "position", "source", "stage",
                           "max_lora", "running_lora_adapters", "waiting_lora_adapters"})
MAX_LABEL_MODES = 8
MAX_LABEL_CHARS = 80  # a label's name or value as a group's title
# The labels an instance's series all share, per scrape read (computed when grouping needs
# them, not per scrape); emptied past this many scrapes.
MAX_CACHED_LABELS = 2048
_common_labels: dict[int, tuple[Exposition, dict[str, str]]] = {}
STATUS_RANK: dict[str | None, int] = {"ok": 0, None: 0, "dim": 1, "warn": 2, "bad": 3,
                                      "alarm": 4}
OPEN, SHUT = "▾", "▸"


def target_labels(row: FleetRow) -> dict[str, str]:
    """The labels a Prometheus puts on every series of an instance (namespace, cluster,
    pod…): those all its series share, less the labels that tell series apart. (Not its
    first series': on vLLM that is ``cache_config_info``, whose ~37 labels hid
    ``namespace``.) A server read directly carries none."""
    scrape = row.state.last_good
    expo = scrape.samples if scrape is not None else None
    if expo is None or not expo.samples:
        return {}
    cached = _common_labels.get(id(expo))
    if cached is not None and cached[0] is expo:
        return cached[1]
    if len(_common_labels) >= MAX_CACHED_LABELS:
        _common_labels.clear()
    labels = _shared(expo.samples)
    _common_labels[id(expo)] = (expo, labels)
    return labels


def _shared(samples: list[Sample]) -> dict[str, str]:
    first = samples[0].labels
    common = {k: v for k, v in first.items() if k not in SERIES_LABELS}
    for sample in samples:
        labels = sample.labels
        if labels is not first and common:
            common = {k: v for k, v in common.items() if labels.get(k) == v}
    return common


def group_modes(rows: Iterable[FleetRow]) -> list[str]:
    """What F5 cycles through: no groups, config group, model, then each label seen."""
    names: set[str] = set()
    for row in rows:
        names.update(target_labels(row))
        if len(names) > MAX_LABEL_MODES:
            break
    return [*BASE_MODES, *(LABEL_PREFIX + n for n in sorted(names)[:MAX_LABEL_MODES])]


def mode_label(mode: str) -> str:
    """A mode as the app names it ("model", or a label's name): a Prometheus label name is
    outside text (``a\\x1b[2J`` or ``a[/]``), shown only through the boundary."""
    return display_text(mode.removeprefix(LABEL_PREFIX), MAX_LABEL_CHARS)


def group_value(row: FleetRow, mode: str) -> str:
    if mode == "group":
        value = row.state.target.group
    elif mode == "model":
        value = row.stats.model if row.stats is not None else None
    else:
        value = target_labels(row).get(mode.removeprefix(LABEL_PREFIX))
    return display_text(value, MAX_LABEL_CHARS) if value else NO_VALUE


@dataclass(slots=True, eq=False)
class GroupRow(FleetRow):
    """A group's aggregate row; its cells are made from its members'."""

    members: list[FleetRow] = field(default_factory=list)
    collapsed: bool = False

    @property
    def search(self) -> str:
        """A filter finds a group by any of its members."""
        if self._search is None:
            self._search = " ".join(m.search for m in self.members)
        return self._search

    @property
    def is_group(self) -> bool:
        return True


def _worst_leak(members: list[FleetRow]) -> Cell:
    def rank(row: FleetRow) -> tuple[int, int]:
        cell = row.cells["leak"]
        verdict = row.stats.leak if row.stats is not None else None
        return STATUS_RANK[cell.level], LEAK_RANK[verdict.state] if verdict else -1

    return max(members, key=rank).cells["leak"] if members else Cell(fmt.DASH, "dim")


def _status(members: list[FleetRow]) -> Cell:
    up = sum(1 for m in members if m.state.status == "up")
    worst: Level | None = max((m.status.level for m in members),
                              key=STATUS_RANK.__getitem__, default="dim")
    return Cell(f"{up}/{len(members)} up", worst)


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _limit(limits: tuple[tuple[str, int], ...], engines: list[FleetRow]) -> Cell:
    """The limit holding the most members back, with how many ("KV 3"); else the members'
    own word when they agree (none), else a dash."""
    if limits:
        word, count = max(limits, key=lambda item: item[1])
        return Cell(f"{word} {count}", "warn")
    words = {m.cells["limit"].text for m in engines}
    return Cell(words.pop(), "dim") if len(words) == 1 else Cell(fmt.DASH, "dim")


def group_cells(name: str, members: list[FleetRow]) -> dict[str, Cell]:
    """Sums over the members' engines; dashes where no member has a number."""
    engines = [m for m in members if m.stats is not None]
    summary = summarise(members)
    models = sorted({m.cells["model"].text for m in engines})
    model = models[0] + (f" +{len(models) - 1}" if len(models) > 1 else "") if models else "–"
    preempt = _sum(m.stats.preemptions_per_s for m in engines if m.stats is not None)
    cells = {
        "name": Cell(name, keep=len(name) - name.rfind(" (")),
        "status": _status(members),
        "model": Cell(model),
        "kv": Cell(fmt.kv_cell(summary.kv_usage, summary.blocks_used, summary.blocks_total),
                   short=fmt.kv_cell(summary.kv_usage, summary.blocks_used,
                                     summary.blocks_total, NARROW_BAR)),
        "leak": _worst_leak(members),
        "running": Cell(fmt.count(summary.running)),
        "waiting": Cell(fmt.count(summary.waiting), "warn" if summary.waiting else None),
        "limit": _limit(summary.limits, engines),
        "preempt": Cell(fmt.rate(preempt), "bad" if preempt else None),
        "hit": Cell(fmt.percent(summary.hit_rate)),
        "prompt": Cell(fmt.rate(summary.prompt_tps)),
        "gen": Cell(fmt.rate(summary.generation_tps)),
        "ttft": Cell(fmt.DASH, "dim"),  # percentiles of several servers can't be added
        "gpu": Cell(fmt.DASH, "dim"),
    }
    if not engines:
        for key in ("running", "waiting", "preempt", "hit", "prompt", "gen"):
            cells[key] = Cell(fmt.DASH, "dim")
    return cells


def _group_sort_values(members: list[FleetRow]) -> dict[str, float | None]:
    summary = summarise(members)
    values: dict[str, float | None] = {
        key: max((v for m in members if (v := m.sort_value(key)) is not None),
                 default=None)
        for key in ("worst", "leak", "ttft", "hit")
    }
    values |= {"kv": summary.kv_usage, "running": summary.running, "waiting": summary.waiting,
               "prompt": summary.prompt_tps, "gen": summary.generation_tps,
               "preempt": _sum(m.sort_value("preempt") for m in members)}
    return values


def make_group(mode: str, value: str, members: list[FleetRow], collapsed: bool) -> GroupRow:
    name = f"{SHUT if collapsed else OPEN} {value} ({len(members)})"
    cells = group_cells(name, members)
    return GroupRow(key=f"group:{mode}:{value}", url="", engine=None, name=name,
                    state=members[0].state, stats=None, status=cells["status"],
                    sort_values=_group_sort_values(members), members=members,
                    collapsed=collapsed, _cells=cells)


def group_rows(rows: list[FleetRow], mode: str, collapsed: set[str], sort_key: str,
               reverse: bool = False) -> list[FleetRow]:
    """``rows`` (already filtered and ordered) under one aggregate row per group, the groups
    in the same order; a collapsed group's members are left out."""
    if mode == NONE:
        return rows
    groups: dict[str, list[FleetRow]] = {}
    for row in rows:
        groups.setdefault(group_value(row, mode), []).append(row)
    heads = [make_group(mode, value, members, f"group:{mode}:{value}" in collapsed)
             for value, members in groups.items()]
    if sort_key in TEXT_SORTS:  # a group's name is its value, not its first row's
        heads.sort(key=lambda h: h.name[2:].lower(), reverse=reverse)
    else:
        heads = order_rows(heads, sort_key, reverse)
    shown: list[FleetRow] = []
    for head in heads:
        shown.append(head)
        if not head.collapsed:
            shown += head.members
    return shown
