"""The engine panel at 80x24 without a terminal: a row per sparkline with its number and
unit, then as many figures as the rows left hold."""

from __future__ import annotations

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.ui.widgets.engine_panel import panel_lines, sparks
from kvtop.view.engine import engine_view
from kvtop.view.fleet import build_rows

NOW = 10_000.0


def _view():
    history = [EngineStats("m", "0", NOW - 5 * i, blocks_total=1999, blocks_used=100.0 + i,
                           kv_usage=(100 + i) / 1999, running=3, waiting=0,
                           prompt_tps=398.0, generation_tps=138.0) for i in range(12)][::-1]
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[history[-1]],
                        last_good_t=NOW)
    [row] = build_rows([state], NOW)
    return engine_view(row, state, history, NOW, 300.0)


def test_every_sparkline_says_its_number_with_its_unit() -> None:
    items = sparks(_view(), (), None)
    assert [s.label for s in items] == ["KV", "run", "wait", "hit", "tok/s", "TTFT"]
    tails = {s.label: "".join(piece for piece, _ in s.tail) for s in items}
    assert tails["tok/s"] == "138 out  398 in"  # not "398 in 138 out" beside a "gen" line
    assert tails["run"] == "3" and tails["KV"].endswith("100/1999 5%")


def test_the_rows_under_the_verdicts_go_to_sparklines_then_figures() -> None:
    view = _view()
    items = sparks(view, (), None)
    verdicts, figures = len(view.lines), len(view.facts)
    # 80x24 with four hosts: 14 rows under the panel's border
    assert panel_lines(view, items, 14) == (6, min(figures, 14 - verdicts - 6))
    assert panel_lines(view, items, verdicts + 3) == (3, 0)  # a crowded fleet: sparklines first
    assert panel_lines(view, items, 40) == (6, figures)
    assert panel_lines(view, items, 0) == (0, 0)
