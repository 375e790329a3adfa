"""The rehearsal's text report: what a GO rests on, the stall in its verdict's words, a run
stopped early and why, a version guessed from the metric names said to be so, every request
that went out counted as sent (the cut among them), and lines wrapped to a terminal under
their own text."""

from __future__ import annotations

from typing import Any

from kvtop.rehearse.report import render_text, wrapped

REQUESTS = {"sent": 11, "ok": 11, "failed": 0, "error_rate": 0.0, "dropped": 2, "cut": 8,
            "retries": {"sent": 0, "ok": 0}, "errors": {}}


def document(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "verdict": "go", "reasons": ["free KV and latency judged, no criterion failed"],
        "evidence": ["free KV not falling: OK (holding: m 0)"], "rule": "r",
        "target": {"api": "http://h/v1", "metrics": "http://h/metrics", "model": "m",
                   "server": {"kind": "vllm", "version": "0.33.0", "version_inferred": False}},
        "settings": {"watch_only": False, "rate": 1.0, "concurrency": 8,
                     "workload": "mixed", "duration_s": 600.0, "time_scale": 1.0},
        "run": {"load_s": 600.0, "stopped": "duration", "stopped_reason": None,
                "restarts_s": []},
        "stall": {"state": "ok", "reason": "making progress", "engine": "m 0",
                  "first_s": None},
        "criteria": {name: {"state": "ok", "reason": "fine", "figures": {}}
                     for name in ("gpu_memory", "kv_free", "latency")},
        "requests": None, "server": {}, "kv": {"engines": []}, "advice": [], "files": {}}
    doc.update(changes)
    return doc


def test_a_go_says_what_it_rests_on() -> None:
    lines = render_text(document()).splitlines()
    assert lines[:3] == ["kvtop rehearse: GO",
                         "  because free KV and latency judged, no criterion failed",
                         "  rests on free KV not falling: OK (holding: m 0)"]
    assert "  target    http://h/v1 (vllm 0.33.0), model m" in lines
    assert not any("stall verdict" in line for line in lines)


def test_a_stall_stopped_early_is_named_with_its_words() -> None:
    doc = document(verdict="no-go", reasons=["stalled: m 0: no token generated for 12 s"],
                   evidence=[],
                   run={"load_s": 95.0, "stopped": "stalled", "restarts_s": [],
                        "stopped_reason": "m 0: STALLED (no token generated for 12 s)"},
                   stall={"state": "stalled", "reason": "no token generated for 12 s",
                          "engine": "m 0", "first_s": 80.0})
    lines = render_text(doc).splitlines()
    assert "  load      workload mixed, 1 req/s, at most 8 in flight; 0:01:35 of 0:10:00 " \
        "(stopped early: stalled)" in lines
    assert "  stopped   early, the verdict could no longer change: m 0: STALLED (no token " \
        "generated for 12 s) (--full-duration runs on)" in lines
    assert "  STALLED stall verdict: m 0: no token generated for 12 s" in lines


def test_an_inferred_version_says_so() -> None:
    doc = document(target={"api": None, "metrics": "http://h/metrics", "model": None,
                           "server": {"kind": "vllm", "version": "0.10.2+",
                                      "version_inferred": True}})
    assert "  target    http://h/metrics (vllm 0.10.2+ (inferred from the metric names))" in \
        render_text(doc).splitlines()


def _long(requests: dict[str, Any]) -> dict[str, Any]:
    """A report whose criteria's reasons run past any terminal's width."""
    return document(requests=requests,
                    criteria={name: {"state": "ok", "reason": "fine " * 30, "figures": {}}
                              for name in ("gpu_memory", "kv_free", "latency")})


def test_every_request_that_went_out_is_counted_as_sent() -> None:
    text = render_text(_long(REQUESTS))
    assert ("  requests  19 sent: 11 answered, 0 failed, 8 cut by the end of the run; "
            "2 dropped before sending; retries 0 (0 answered)") in text  # not "11 sent … 8 cut"


def test_at_80_columns_each_line_wraps_under_its_own_text() -> None:
    lines = render_text(_long(REQUESTS), width=80).splitlines()
    assert max(len(line) for line in lines) <= 80
    requests = next(i for i, line in enumerate(lines) if line.startswith("  requests  "))
    assert lines[requests + 1].startswith(" " * 12) and lines[requests + 1][12] != " "
    ok = next(i for i, line in enumerate(lines) if line.startswith("  OK     "))
    assert lines[ok + 1].startswith(" " * 9) and lines[ok + 1][9] != " "
    assert render_text(_long(REQUESTS)).count("\n") < len(lines)  # a pipe gets long lines
    assert wrapped("short", 80) == ["short"]
