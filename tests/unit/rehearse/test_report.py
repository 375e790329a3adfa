"""The rehearsal's text report: every request that went out counted as sent (the cut among
them), and lines wrapped to a terminal under their own text."""

from __future__ import annotations

from kvtop.rehearse.report import render_text, wrapped

REQUESTS = {"sent": 11, "ok": 11, "failed": 0, "error_rate": 0.0, "dropped": 2, "cut": 8,
            "retries": {"sent": 0, "ok": 0}, "errors": {}}


def _doc(requests: dict | None = None) -> dict:
    return {
        "verdict": "go", "reasons": [], "rule": "two criteria failing is NO-GO",
        "target": {"api": "http://h/v1", "metrics": "http://h/metrics", "model": "m",
                   "server": {"kind": "vllm", "version": "0.33.0"}},
        "settings": {"watch_only": False, "rate": 1.0, "concurrency": 8,
                     "workload": "mixed", "duration_s": 60.0, "time_scale": 1.0},
        "run": {"load_s": 60.0, "stopped": "duration", "restarts_s": []},
        "criteria": {name: {"state": "ok", "reason": "fine " * 30, "figures": {}}
                     for name in ("gpu_memory", "kv_free", "latency")},
        "requests": requests, "server": {}, "kv": {"engines": []}, "advice": [],
        "files": {}}


def test_every_request_that_went_out_is_counted_as_sent() -> None:
    text = render_text(_doc(REQUESTS))
    assert ("  requests  19 sent: 11 answered, 0 failed, 8 cut by the end of the run; "
            "2 dropped before sending; retries 0 (0 answered)") in text  # not "11 sent … 8 cut"


def test_at_80_columns_each_line_wraps_under_its_own_text() -> None:
    lines = render_text(_doc(REQUESTS), width=80).splitlines()
    assert max(len(line) for line in lines) <= 80
    requests = next(i for i, line in enumerate(lines) if line.startswith("  requests  "))
    assert lines[requests + 1].startswith(" " * 12) and lines[requests + 1][12] != " "
    ok = next(i for i, line in enumerate(lines) if line.startswith("  OK     "))
    assert lines[ok + 1].startswith(" " * 9) and lines[ok + 1][9] != " "
    assert render_text(_doc(REQUESTS)).count("\n") < len(lines)  # a pipe gets long lines
    assert wrapped("short", 80) == ["short"]
