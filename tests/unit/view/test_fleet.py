"""The fleet view's rows without a terminal: names, order, filter, the row cache."""

from __future__ import annotations

import dataclasses

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.ui.widgets.fleet_table import fit
from kvtop.view import format as fmt
from kvtop.view.cells import NO_DELTA, NO_GPU, Cell
from kvtop.view.fleet import FleetRow, RowCache, build_rows, filter_rows, order_rows, row_key

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




def _named(name: str, *engines: EngineStats) -> TargetState:
    """An up target shown under ``name`` (its URL is the name's host, so keys stay apart)."""
    return TargetState(Target.from_spec(f"{name.replace('_', '-')}:1", name=name), "up",
                       kind="vllm", engines=list(engines), last_good_t=NOW)


def _identity(row: FleetRow) -> tuple[object, ...]:
    return row.key, row.url, row.engine, row.name, row.name_keep


def test_each_row_says_which_target_and_engine_it_stands_for() -> None:
    down = TargetState(Target.from_spec("down:1"), "down", error="connection refused",
                       failure="down", last_good_t=NOW - 10)
    one = _up("one:1", EngineStats("m", "0", NOW))
    ranks = _up("dp:1", EngineStats("m", "0", NOW), EngineStats("m", None, NOW),
                EngineStats("m", "1234", NOW), EngineStats("m", "12345", NOW),
                EngineStats("m", "rank-abcdefgh", NOW))
    models = _up("mix:1", EngineStats("llama", "0", NOW), EngineStats("qwen", None, NOW),
                 EngineStats(None, "7", NOW))
    assert [_identity(r) for r in build_rows([down, one, ranks, models], NOW)] == [
        ("http://down:1/metrics", "http://down:1/metrics", None, "down:1", 0),
        # one engine needs no suffix, whatever its rank
        ("http://one:1/metrics|m|0", "http://one:1/metrics", ("m", "0"), "one:1", 0),
        # ranks of one model: " e<rank>", none for the rank-less, the rank cut to 12 cells;
        # a suffix of up to 6 characters survives a cut name, a longer one does not
        ("http://dp:1/metrics|m|0", "http://dp:1/metrics", ("m", "0"), "dp:1 e0", 3),
        ("http://dp:1/metrics|m|", "http://dp:1/metrics", ("m", None), "dp:1", 0),
        ("http://dp:1/metrics|m|1234", "http://dp:1/metrics", ("m", "1234"), "dp:1 e1234", 6),
        ("http://dp:1/metrics|m|12345", "http://dp:1/metrics", ("m", "12345"),
         "dp:1 e12345", 0),
        ("http://dp:1/metrics|m|rank-abcdefgh", "http://dp:1/metrics", ("m", "rank-abcdefgh"),
         "dp:1 erank-abcdef…", 0),
        # engines of different models: model/rank, either left out when unknown
        ("http://mix:1/metrics|llama|0", "http://mix:1/metrics", ("llama", "0"),
         "mix:1 llama/0", 0),
        ("http://mix:1/metrics|qwen|", "http://mix:1/metrics", ("qwen", None), "mix:1 qwen", 5),
        ("http://mix:1/metrics||7", "http://mix:1/metrics", (None, "7"), "mix:1 7", 2),
    ]


def test_a_row_without_engines_keeps_its_whole_name_and_says_why() -> None:
    state = TargetState(Target.from_spec("h:1"), "down", error="connection refused",
                        failure="down", last_good_t=NOW - 10)
    row = build_rows([state], NOW)[0]
    assert (row.cells["name"], row.cells["model"], row.cells["status"]) == (
        Cell("h:1"), Cell("connection refused", "dim"), Cell("down 10s", "bad"))


def test_row_key_is_the_url_and_both_parts_of_the_engine() -> None:
    assert row_key("u", None) == "u"
    assert row_key("u", ("m", "0")) == "u|m|0"
    assert row_key("u", (None, None)) == "u||"
    assert row_key("u", ("", "")) == "u||"


def test_search_text_is_what_a_person_reads_in_the_row() -> None:
    state = TargetState(Target.from_spec("h:1", group="Rack-A"), "down",
                        error="Connection Refused", failure="down", last_good_t=NOW - 10)
    up = _up("u:1", EngineStats("Org/Llama", "0", NOW))
    nameless = _up("n:1", EngineStats(None, "0", NOW))
    assert [r.search for r in build_rows([state, up, nameless], NOW)] == [
        "h:1 http://h:1/metrics rack-a down 10s h:1 connection refused",
        "u:1 http://u:1/metrics vllm up u:1 org/llama",
        "n:1 http://n:1/metrics vllm up n:1",  # no model: nothing, not the cell's dash
    ]


def test_text_sorts_go_by_lower_case_name_or_model_then_name() -> None:
    # "_" sorts before letters in lower case and after them in upper case
    rows = build_rows([
        _named("a", EngineStats("zeta", None, NOW)),
        _named("b", EngineStats("Alpha", None, NOW)),
        _named("c", EngineStats("a_x", None, NOW)),
        _named("d", EngineStats("AAX", None, NOW)),
        _named("x_y", EngineStats("same", None, NOW)),
        _named("xay", EngineStats("same", None, NOW)),
    ], NOW)
    assert [r.name for r in order_rows(rows, "model")] == ["c", "d", "b", "x_y", "xay", "a"]
    assert [r.name for r in order_rows(rows, "model", reverse=True)] == [
        "a", "xay", "x_y", "b", "d", "c"]
    assert [r.name for r in order_rows(rows, "name")] == ["a", "b", "c", "d", "x_y", "xay"]


def test_number_sorts_break_ties_by_lower_case_name_and_keep_unknowns_by_name() -> None:
    rows = build_rows([
        _named("xay", EngineStats("m", None, NOW, running=2)),
        _named("q", EngineStats("m", None, NOW)),
        _named("x_y", EngineStats("m", None, NOW, running=2)),
        _named("p_q", EngineStats("m", None, NOW)),
        _named("h2", EngineStats("m", None, NOW, running=1.5e308)),
        _named("h1", EngineStats("m", None, NOW, running=1.7e308)),
        _named("h3", EngineStats("m", None, NOW, running=1e308)),
        _named("paq", EngineStats("m", None, NOW)),
    ], NOW)
    # values near the largest float still sort by size, either way round (a key scaled up
    # would overflow to a tie and fall back on the names)
    assert [r.name for r in order_rows(rows, "running")] == [
        "h1", "h2", "h3", "x_y", "xay", "p_q", "paq", "q"]
    assert [r.name for r in order_rows(rows, "running", reverse=True)] == [
        "x_y", "xay", "h3", "h2", "h1", "p_q", "paq", "q"]


def test_row_cache_rebuilds_a_target_whose_error_changed_under_the_same_status() -> None:
    state = TargetState(Target.from_spec("h:1"), "down", error="connection refused",
                        failure="down", last_good_t=NOW - 10)
    cache = RowCache()
    assert cache.rows([state], NOW)[0].cells["model"].text == "connection refused"
    state.error = "connection reset"  # the same engines list and the same "down 10s"
    assert cache.rows([state], NOW)[0].cells["model"].text == "connection reset"
    state.kind = "sglang"
    assert cache.rows([state], NOW)[0].search.split()[2] == "sglang"


def test_a_new_gpu_or_baseline_cell_makes_new_cells_and_the_same_one_keeps_them() -> None:
    row = build_rows([_up("h:1", EngineStats("m", None, NOW))], NOW)[0]
    gpu, delta = Cell("40/80G"), Cell("+3/−2%", "warn")
    row.set_gpu(gpu)
    row.set_delta(delta)
    first = row.cells  # made after the cells were set: they are in it
    assert (first["gpu"], first["delta"], row.gpu, row.delta) == (gpu, delta, gpu, delta)
    row.set_gpu(Cell("40/80G"))
    row.set_delta(Cell("+3/−2%", "warn"))
    assert row.cells is first  # equal cells: the table sees no change
    row.set_gpu(NO_GPU)
    after_gpu = row.cells
    row.set_delta(NO_DELTA)
    assert (first["gpu"], first["delta"]) == (gpu, delta)  # the old dict is left as it was
    assert after_gpu is not first and after_gpu["gpu"] == NO_GPU and after_gpu["delta"] == delta
    assert row.cells is not after_gpu and row.cells["delta"] == NO_DELTA
    # the other cells are the ones made first: a GPU read does not re-format the row
    assert row.cells["kv"] is after_gpu["kv"] is first["kv"]
    assert (row.gpu, row.delta) == (NO_GPU, NO_DELTA)
