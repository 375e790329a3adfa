"""The rehearsal's text report: what a GO rests on, the stall in its verdict's words, a run
stopped early and why, a version guessed from the metric names said to be so, every request
that went out counted as sent (the cut among them), and lines wrapped to a terminal under
their own text."""

from __future__ import annotations

import math
import re
from typing import Any

from kvtop.rehearse.report import FORMAT_VERSION, clock, render_text, wrapped
from tests.support.paths import REPO

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
    assert lines[3:] == [  # no stall, restarts, requests, server figures, advice nor files
        "  rule: r",
        "",
        "  target    http://h/v1 (vllm 0.33.0), model m",
        "  load      workload mixed, 1 req/s, at most 8 in flight; 0:10:00 of 0:10:00"
        " (full length)",
        "",
        "  OK     GPU memory stable: fine",
        "  OK     free KV not falling: fine",
        "  OK     slow-request share not rising: fine",
        ""]


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


# A run stopped by Ctrl-C with every part of the report filled in: a leak, a latency WATCH,
# a saturated server on no named engine, restarts, errors beyond the three shown, timings
# either side of a second, two engines (one never read before), advice and files.
LEAK = document(
    verdict="no-go", reasons=["a leak: free KV not falling: failed (falling: m 0)"], evidence=[],
    rule="NO-GO on a confirmed leak",
    settings={"watch_only": False, "rate": 0.0, "concurrency": 256, "workload": "mixed",
              "duration_s": 10800.0, "time_scale": 60.0},
    run={"load_s": 2712.4, "stopped": "interrupted", "stopped_reason": None,
         "restarts_s": [30.0, 3725.0], "failed_across_restarts": 3},
    stall={"state": "saturated", "reason": "the queue grows with nothing running",
           "engine": None, "first_s": 300.0},
    criteria={"gpu_memory": {"state": "not_judged", "reason": "no GPU readings", "figures": {}},
              "kv_free": {"state": "fail", "reason": "falling: m 0", "figures": {}},
              "latency": {"state": "watch", "reason": "creeping", "figures": {
                  "ttft_s": {"first": {"p50": 0.1234, "p99": 0.95},
                             "last": {"p50": 1.0, "p99": 12.345}},
                  "tpot_s": {"first": {"p50": 0.0081, "p99": 0.02},
                             "last": {"p50": 0.0095, "p99": 1.5}}}}},
    requests={"sent": 43150, "ok": 43000, "failed": 150, "error_rate": 150 / 43150,
              "dropped": 50, "cut": 7, "retries": {"sent": 60, "ok": 58},
              "errors": {"HTTP 500: boom": 100, "timeout": 40, "HTTP 503: busy": 9,
                         "connection reset": 1}},
    server={"pinned_share": 0.02, "usage_max": 0.974, "preemptions": 12.0,
            "preemptions_per_min": 0.066, "waiting_p90": 3.4, "hit_rate": 0.045},
    kv={"engines": [{"model": "m", "engine": "0",
                     "before": {"used_blocks": 0.0, "blocks_total": 599, "usage": 0.0,
                                "idle": True},
                     "after": {"used_blocks": 187.4, "blocks_total": 599, "usage": 0.3129,
                               "idle": False}},
                    {"model": "m", "engine": None, "before": None,
                     "after": {"used_blocks": 3.0, "blocks_total": 0, "usage": 0.5,
                               "idle": True}},
                    {"model": None, "engine": "1",
                     "before": {"used_blocks": 2.0, "blocks_total": 10, "usage": None,
                                "idle": False},
                     "after": {"used_blocks": None, "blocks_total": 10, "usage": 0.25}}]},
    advice=[{"lever": "leak", "action": "Restart the server nightly",
             "figures": {"leaked_blocks": 187.0, "leaked_tokens": 29920, "leaked_gib": None,
                         "rate": 0.123456}},
            {"lever": "stall", "action": "Look at the engine", "figures": {}}],
    files={"recording": "run.kvtop", "requests": "requests.jsonl", "gpus": None,
           "report_json": "report.json"})


def test_every_part_of_a_full_report_in_its_words_and_figures() -> None:
    assert render_text(LEAK) == "\n".join([
        "kvtop rehearse: NO-GO",
        "  because a leak: free KV not falling: failed (falling: m 0)",
        "  rule: NO-GO on a confirmed leak",
        "",
        "  target    http://h/v1 (vllm 0.33.0), model m",
        "  load      workload mixed, 256 in flight; 0:45:12 of 3:00:00 (stopped by Ctrl-C)",
        "  time      the target's clock, 60x wall time",
        "  restarts  the server restarted at 0:00:30, 1:02:05 (3 requests failed across it)",
        "",
        "  -      GPU memory stable: no GPU readings",
        "  FAIL   free KV not falling: falling: m 0",
        "  WATCH  slow-request share not rising: creeping",
        "  SATURATED stall verdict: the queue grows with nothing running",
        "",
        "  requests  43157 sent: 43000 answered, 150 failed (0.3%), 7 cut by the end of the"
        " run; 50 dropped before sending; retries 60 (58 answered)",
        "            100 x HTTP 500: boom",
        "            40 x timeout",
        "            9 x HTTP 503: busy",
        "  TTFT      p50 123 ms -> 1.00 s, p99 950 ms -> 12.35 s (first -> last third)",
        "  per token p50 8 ms -> 10 ms, p99 20 ms -> 1.50 s",
        "  server    12 preemptions (0.1/min), waiting p90 3, KV usage max 97% (>= 95 % in 2%"
        " of scrapes), prefix hits 4%",
        "  KV        m 0: before 0/599 blocks used (0.0%, idle); after 187/599 blocks used"
        " (31.3%, busy)",
        "  KV        m: before not read; after usage (50.0%, idle)",
        "  KV        1: before 2/10 blocks used (busy); after usage (25.0%, busy)",
        "",
        "Advice:",
        "  [leak] Restart the server nightly (leaked_blocks 187, leaked_tokens 29920,"
        " rate 0.1235)",
        "  [stall] Look at the engine ()",
        "",
        "Files: run.kvtop, requests.jsonl, report.json",
        ""])


def test_a_watched_run_with_few_figures_leaves_out_what_it_lacks() -> None:
    doc = document(
        evidence=[], target={"api": None, "metrics": "http://h/metrics", "model": None,
                             "server": {"kind": "sglang", "version": None}},
        settings={"watch_only": True, "rate": 2.0, "concurrency": 8, "workload": "mixed",
                  "duration_s": 3600.0, "time_scale": 1.0},
        run={"load_s": 3599.5, "stopped": "a later reason", "stopped_reason": None,
             "restarts_s": [-5.0], "failed_across_restarts": None},
        stall={}, server={"preemptions": 0.0, "preemptions_per_min": 0.0, "hit_rate": 0.0},
        criteria={name: {"state": "ok", "reason": "fine", "figures": {
            "ttft_s": {"first": {"p50": 0.1, "p99": 0.2}, "last": None},
            "tpot_s": {"first": None, "last": {"p50": 0.1, "p99": 0.2}}}}
            for name in ("gpu_memory", "kv_free", "latency")})
    assert render_text(doc) == "\n".join([
        "kvtop rehearse: GO",
        "  because free KV and latency judged, no criterion failed",
        "  rule: r",
        "",
        "  target    http://h/metrics (sglang)",
        "  load      watched only (the load came from elsewhere); 1:00:00 of 1:00:00"
        " (full length)",
        "  restarts  the server restarted at -0:00:05",
        "",
        "  OK     GPU memory stable: fine",
        "  OK     free KV not falling: fine",
        "  OK     slow-request share not rising: fine",
        "",
        "  server    0 preemptions (0.0/min), prefix hits 0%",
        ""])


def test_a_paced_load_and_a_server_without_figures() -> None:
    doc = document(target={"api": "http://h/v1", "metrics": "http://h/metrics", "model": "m",
                           "server": None},
                   settings={"watch_only": False, "rate": 2.5, "concurrency": 64,
                             "workload": "long-prompt", "duration_s": 60.0, "time_scale": 1.0},
                   run={"load_s": 61.0, "stopped": "leak", "stopped_reason": None,
                        "restarts_s": []},
                   stall={"state": "stalled", "reason": "no token generated for 12 s",
                          "engine": "", "first_s": 5.0},
                   server={"waiting_p90": 0.0, "usage_max": 0.0, "pinned_share": 0.0},
                   criteria={name: {"state": "ok", "reason": "fine", "figures": {"ttft_s": {
                       "first": {"p50": None, "p99": 0.2}, "last": {"p50": 0.3, "p99": 2.0}}}}
                       for name in ("gpu_memory", "kv_free", "latency")},
                   requests={**REQUESTS, "cut": 0, "errors": {"HTTP 500: " + "x" * 200: 1}})
    lines = render_text(doc).splitlines()
    assert lines[5:7] == [
        "  target    http://h/v1, model m",
        "  load      workload long-prompt, 2.5 req/s, at most 64 in flight; 0:01:01 of 0:01:00"
        " (stopped early: a confirmed leak)"]
    assert "  STALLED stall verdict: no token generated for 12 s" in lines
    assert lines[-4:] == [
        "  requests  11 sent: 11 answered, 0 failed, 0 cut by the end of the run; 2 dropped"
        " before sending; retries 0 (0 answered)",
        "            1 x HTTP 500: " + "x" * 109 + "…",  # an error is cut to 120 cells
        "  TTFT      p50 - -> 300 ms, p99 200 ms -> 2.00 s (first -> last third)",
        "  server    waiting p90 0, KV usage max 0% (>= 95 % in 0% of scrapes)"]


def test_clock() -> None:
    assert [clock(s) for s in (0.0, 0.5, 59.6, 3599.4, 3600.0, 10800.0, -65.0)] == [
        "0:00:00", "0:00:00", "0:01:00", "0:59:59", "1:00:00", "3:00:00", "-0:01:05"]
    assert clock(None) == clock(math.inf) == clock(math.nan) == "-"


def test_wrapping_at_its_edges() -> None:
    line = "  requests  " + "word " * 30
    assert wrapped(line, 20)[1] == " " * 10 + "word word"  # the indent is half the width at most
    assert wrapped("  OK     " + "ab-cd " * 20, 80) == [
        "  OK     " + "ab-cd " * 11 + "ab-cd", " " * 9 + "ab-cd " * 7 + "ab-cd"]  # to 80, not 70
    assert wrapped("  OK     abcdef-ghijklmnop", 20) == [  # a word is not broken at its hyphen
        "  OK", "         abcdef-ghij", "         klmnop"]
    assert wrapped("exactly 20 cells  x ", 20) == ["exactly 20 cells  x "]  # kept as it is
    assert wrapped(" " * 30, 20) == [""]


def test_the_json_version_is_the_documented_one() -> None:
    documented = re.findall(r"^## Report JSON \(version (\d+)\)$",
                            (REPO / "docs" / "rehearse.md").read_text(), re.MULTILINE)
    assert documented == [str(FORMAT_VERSION)]
