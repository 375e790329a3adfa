"""Grouping the fleet (F5): the modes offered, each row's group, and a Prometheus label's
name and value as outside text."""

from __future__ import annotations

from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import Exposition, parse
from kvtop.collect.prometheus import group_scrapes
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.view.fleet import FleetRow, build_rows
from kvtop.view.groups import (
    LABEL_PREFIX,
    MAX_LABEL_MODES,
    group_modes,
    group_value,
    mode_label,
    target_labels,
)
from tests.support.paths import fixture_text

UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
T0 = 1_767_225_600.0


def prometheus_rows(instance_labels: dict[str, str]) -> list[FleetRow]:
    """The real vLLM 0.33 scrape as Prometheus answers it, with ``instance_labels`` on every
    series (``cache_config_info``, with its ~37 labels, first: as Prometheus sorts them)."""
    samples = sorted(parse(fixture_text(UNDER_LOAD), keep=WANTED).samples,
                     key=lambda s: s.name != "vllm:cache_config_info")
    result = [{"metric": {"__name__": s.name, **s.labels, "job": "vllm",
                          "instance": "10.0.0.1:8000", **instance_labels},
               "values": [[T0, repr(s.value)]]} for s in samples]
    [(_, per_t)] = group_scrapes(result).items()
    target = Target(url="http://prom:9090#vllm/10.0.0.1:8000", name="10.0.0.1:8000",
                    group="vllm")
    tracker = TargetTracker(target)
    tracker.update(read_scrape(Scrape(target, T0, samples=Exposition(per_t[T0]))))
    return build_rows([tracker.state], T0)


def test_the_labels_of_an_instance_are_those_all_its_series_share() -> None:
    """They were taken from its first series, cache_config_info: F5 offered its block_size,
    cache_dtype... (8 at most) and never namespace."""
    [row] = prometheus_rows({"namespace": "prod", "pod": "vllm-7f9c"})
    assert target_labels(row) == {"namespace": "prod", "pod": "vllm-7f9c"}
    modes = group_modes([row])
    assert f"{LABEL_PREFIX}namespace" in modes and f"{LABEL_PREFIX}pod" in modes
    assert f"{LABEL_PREFIX}block_size" not in modes
    assert group_value(row, f"{LABEL_PREFIX}namespace") == "prod"


def test_label_modes_are_bounded() -> None:
    [row] = prometheus_rows({f"l{i:02d}": "v" for i in range(3 * MAX_LABEL_MODES)})
    labels = [m for m in group_modes([row]) if m.startswith(LABEL_PREFIX)]
    assert len(labels) == MAX_LABEL_MODES


def test_a_label_name_and_value_are_shown_through_the_boundary() -> None:
    """A label *named* a\\x1b[2J or a[/] reached the toast and the header raw (and a[/]
    stopped the app with a MarkupError)."""
    for name in ("a\x1b[2J", "a\x9b2J", "a\x1b]52;c;ZXZpbA==\x07", "a[/]"):
        [row] = prometheus_rows({name: "v\x1b[2J"})
        [mode] = [m for m in group_modes([row]) if m.startswith(LABEL_PREFIX)]
        assert "\x1b" not in mode_label(mode) and "\x9b" not in mode_label(mode)
        assert mode_label(mode).startswith("a") and "[/]" in mode_label("label:a[/]")
        assert group_value(row, mode) == "v\\x1b[2J"


def test_a_groups_limit_is_the_one_holding_most_members_back() -> None:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState
    from kvtop.derive.verdicts import LimitVerdict
    from kvtop.view import format as fmt
    from kvtop.view.cells import Cell
    from kvtop.view.fleet import build_rows
    from kvtop.view.groups import group_cells

    def state(port: int, *limits: str) -> TargetState:
        engines = [EngineStats("m", str(i), T0, limit=LimitVerdict(limit, "why"))  # type: ignore[arg-type]
                   for i, limit in enumerate(limits)]
        return TargetState(Target.from_spec(f"h:{port}"), "up", kind="vllm", engines=engines,
                           last_good_t=T0)

    held = build_rows([state(1, "kv_capacity", "none"), state(2, "kv_capacity",
                                                             "max_sequences")], T0)
    assert group_cells("g", held)["limit"] == Cell("KV 2", "warn")
    calm = build_rows([state(1, "none"), state(2, "none")], T0)
    assert group_cells("g", calm)["limit"] == Cell("none", "dim")
    mixed = build_rows([state(1, "none"), state(2, "unknown")], T0)
    assert group_cells("g", mixed)["limit"] == Cell(fmt.DASH, "dim")
