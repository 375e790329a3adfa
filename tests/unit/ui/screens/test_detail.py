"""The detail view's text and charts without a terminal: no internal keys, numbers in plain
digits, a leak's growth said before the detector has a slope of its own, and the main
screen's charts (the KV axis to the pool) with every baseline level."""

from __future__ import annotations

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.ui.screens.detail import config_lines, describe, detail_panes, leak_lines

NOW = 10_000.0


def _leaking(leaked: float, t: float) -> EngineStats:
    verdict = LeakVerdict("leak", "blocks held with nothing running", leaked, None, None,
                          {"used": 1061.0, "pool": 1999.0, "floor_slope_per_h": 12345.678,
                           "turnover": 0.00001234})
    return EngineStats("m", "0", t, blocks_total=1999, blocks_used=leaked, leak=verdict,
                       cache_config={"block_size": "16", "_block_size_resolved": "16",
                                     "cache_dtype": "auto"})


def test_the_config_line_has_no_internal_key() -> None:
    lines = config_lines(_leaking(514.0, NOW))
    assert "_block_size_resolved" not in "".join(lines) and "cache_dtype auto" in lines[1]


def test_a_leak_s_growth_is_said_when_the_detector_has_no_slope_yet() -> None:
    history = [_leaking(514.0 + 547.0 * i / 4, NOW - 240 + 60 * i) for i in range(5)]
    lines = leak_lines(history[-1].leak, history)
    assert lines[1] == ("        leaked 514 → 1061 blocks in 4m: +8.2k/h here, full in 7m "
                        "at that pace")  # not "slope –, full in –"
    assert leak_lines(history[-1].leak, history[-1:])[1] == (
        "        leaked 1061 blocks  slope –  full in –")  # one point: nothing to say
    evidence = " ".join(lines[2:])
    assert "floor_slope_per_h=12346" in evidence and "turnover=0" in evidence
    assert "e+" not in evidence and "e-" not in evidence  # never 1.235e+04


def test_the_detail_draws_the_main_screen_s_charts_with_every_baseline_level() -> None:
    from kvtop.baseline.overlay import Band

    history = [_leaking(514.0 + i, NOW - 60 + 5 * i) for i in range(13)]
    band = Band("healthy", 0.2, 0.5, 0.7, 1000, 4.0, 0.0, 0.4, 100.0, 50.0, 0.1, 0.3, 0.02)
    panes = {p.key: p for p in detail_panes(history[-1], history, NOW, 300.0, band)}
    kv = panes["kv"]
    assert kv.chart is not None and kv.chart.top == 1999  # the axis runs to the pool
    legend = "".join(piece for piece, _ in kv.legend)
    assert "base p50 (healthy)" in legend and "base p5-95" in legend
    assert sorted(r.value for r in kv.chart.rules if r.role == "base") == [
        0.2 * 1999, 0.5 * 1999, 0.7 * 1999]
    assert detail_panes(None, [], NOW, 300.0, band) == []


def test_describe_takes_the_history_for_the_growth() -> None:
    history = [_leaking(514.0 + 547.0 * i / 4, NOW - 240 + 60 * i) for i in range(5)]
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[history[-1]],
                        last_good_t=NOW)
    assert "514 → 1061 blocks" in describe(state, history[-1], NOW, None, history).plain
