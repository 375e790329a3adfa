"""The fleet view's rows without a terminal: names, order, filter, the row cache."""

from __future__ import annotations

import dataclasses

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.ui.widgets.fleet_table import fit
from kvtop.view import format as fmt
from kvtop.view.fleet import RowCache, build_rows, filter_rows, order_rows

NOW = 1000.0


def _up(spec: str, *engines: EngineStats) -> TargetState:
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=list(engines),
                       last_good_t=NOW)


def test_several_engines_are_named_apart() -> None:
    state = _up("h:1", EngineStats("m", "0", NOW), EngineStats("m", "1", NOW))
    assert [r.name for r in build_rows([state], NOW)] == ["h:1 e0", "h:1 e1"]


def test_sort_and_filter() -> None:
    rows = build_rows([
        _up("a:1", EngineStats("llama", None, NOW, kv_usage=0.2)),
        _up("b:1", EngineStats("qwen", None, NOW, kv_usage=0.9)),
        _up("c:1", EngineStats("qwen", None, NOW)),
    ], NOW)
    assert [r.name for r in order_rows(rows, "kv")] == ["b:1", "a:1", "c:1"]
    assert [r.name for r in filter_rows(rows, "QWEN c:1")] == ["c:1"]


def test_worst_first_leaks_then_trouble_then_fullest() -> None:
    def judged(state: str, usage: float) -> EngineStats:
        verdict = LeakVerdict(state, "why", None, None, None)
        return EngineStats("m", None, NOW, kv_usage=usage, leak=verdict)

    rows = build_rows([
        _up("full:1", EngineStats("m", None, NOW, kv_usage=0.9)),
        _up("low:1", EngineStats("m", None, NOW, kv_usage=0.2)),
        TargetState(Target.from_spec("down:1"), "down", last_good_t=NOW - 60),
        TargetState(Target.from_spec("stale:1"), "stale", last_good_t=NOW - 20,
                    engines=[EngineStats("m", None, NOW - 20, kv_usage=0.5)]),
        _up("watch:1", judged("watch", 0.1)),
        _up("leak:1", judged("leak", 0.05)),
        _up("fuller-leak:1", judged("leak", 0.6)),
        TargetState(Target.from_spec("new:1")),
    ], NOW)
    assert [r.name for r in order_rows(rows, "worst")] == [
        "fuller-leak:1", "leak:1", "watch:1", "stale:1", "down:1", "full:1", "low:1", "new:1",
    ]


def test_row_cache_rebuilds_only_what_changed() -> None:
    quiet = _up("a:1", EngineStats("m", None, NOW, kv_usage=0.2))
    busy = _up("b:1", EngineStats("m", None, NOW, kv_usage=0.4))
    stale = TargetState(Target.from_spec("c:1"), "stale", last_good_t=NOW - 5,
                        engines=[EngineStats("m", None, NOW - 5, kv_usage=0.3)])
    cache = RowCache()
    first = cache.rows([quiet, busy, stale], NOW)
    busy.engines = [dataclasses.replace(busy.engines[0], kv_usage=0.7)]  # a new scrape
    busy.last_good_t = NOW + 1
    second = cache.rows([quiet, busy, stale], NOW + 1)
    assert second[0] is first[0]  # nothing new: the same row, not even re-formatted
    assert second[1] is not first[1] and second[1].cells["kv"].text.endswith(" 70%")
    assert second[2].cells["status"].text == "down 6s"  # its age keeps counting
    assert [r.cells for r in second] == [r.cells for r in build_rows([quiet, busy, stale],
                                                                     NOW + 1)]


def test_bar_has_eighth_cell_resolution_never_hides_use_or_claims_full() -> None:
    assert fmt.bar(0.01) == "▏░░░░"
    assert fmt.bar(0.98) == "████▉" != fmt.bar(0.75) == "███▊░"  # 98 % never looks like 75 %
    assert fmt.bar(0.999) == "████▉"  # only a full pool fills every cell
    assert fmt.bar(1.0) == "█████"
    assert fmt.bar(0.5, 20) == "█" * 10 + "░" * 10
    assert fmt.kv_cell(None, None, None) == fmt.DASH


def test_data_parallel_suffix_survives_a_cut_name() -> None:
    state = _up("a-very-long-host-name.example:8000", EngineStats("m", "0", NOW),
                EngineStats("m", "1", NOW))
    names = [r.cells["name"] for r in build_rows([state], NOW)]
    assert [fit(c.text, 16, c.keep) for c in names] == ["a-very-long-… e0", "a-very-long-… e1"]


def test_sort_either_way_keeps_unknowns_last() -> None:
    rows = build_rows([
        _up("a:1", EngineStats("m", None, NOW, running=3)),
        _up("b:1", EngineStats("m", None, NOW, running=9)),
        _up("c:1", EngineStats("m", None, NOW)),
    ], NOW)
    assert [r.name for r in order_rows(rows, "running")] == ["b:1", "a:1", "c:1"]
    assert [r.name for r in order_rows(rows, "running", reverse=True)] == ["a:1", "b:1", "c:1"]
    assert [r.name for r in order_rows(rows, "name", reverse=True)] == ["c:1", "b:1", "a:1"]


