"""The rehearsal report: a versioned JSON document (docs/rehearse.md) and its text form."""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any

from kvtop.rehearse.criteria import TITLES
from kvtop.safe_text import display_text

FORMAT_VERSION = 1
STATE_WORDS = {"ok": "OK", "watch": "WATCH", "fail": "FAIL", "not_judged": "-"}
CRITERIA_ORDER = ("gpu_memory", "kv_free", "latency")
STOPPED = {"interrupted": "stopped by Ctrl-C", "leak": "stopped early: a confirmed leak",
           "stalled": "stopped early: stalled", "duration": "full length"}


def render_text(doc: dict[str, Any], width: int | None = None) -> str:
    """The report for people; every string from outside goes through display_text. With
    ``width`` (a terminal's), each line is wrapped to it under its own text."""
    lines = [f"kvtop rehearse: {doc['verdict'].upper()}"]
    lines += [f"  because {display_text(r)}" for r in doc["reasons"]]
    lines += [f"  rests on {display_text(e)}" for e in doc.get("evidence", [])]
    lines.append(f"  rule: {doc['rule']}")
    lines += ["", *_setting_lines(doc), ""]
    for name in CRITERIA_ORDER:
        criterion = doc["criteria"][name]
        lines.append(f"  {STATE_WORDS[criterion['state']]:<6} {TITLES[name]}: "
                     f"{display_text(criterion['reason'])}")
    stall = doc.get("stall") or {}
    if stall.get("state") in ("stalled", "saturated"):
        where = f"{stall['engine']}: " if stall.get("engine") else ""
        lines.append(f"  {stall['state'].upper():<6} stall verdict: "
                     f"{display_text(where + stall['reason'])}")
    lines.append("")
    lines += _request_lines(doc.get("requests"), doc["criteria"]["latency"]["figures"])
    lines += _server_lines(doc)
    if doc["advice"]:
        lines += ["", "Advice:"]
        for advice in doc["advice"]:
            figures = ", ".join(f"{k} {_figure(v)}" for k, v in advice["figures"].items()
                                if v is not None)
            lines.append(f"  [{advice['lever']}] {advice['action']} ({display_text(figures)})")
    files = [display_text(path) for path in doc["files"].values() if path]
    if files:
        lines += ["", "Files: " + ", ".join(files)]
    if width is not None:
        lines = [part for line in lines for part in wrapped(line, width)]
    return "\n".join(lines) + "\n"


LABEL = re.compile(r" *(?:[A-Za-z]+ +|\[[^]]*\] |[A-Z]+ +)?")  # "  requests  ", "  [lever] "


def wrapped(line: str, width: int) -> list[str]:
    """``line`` wrapped to ``width`` cells, its continuations under the text after its
    label ("  requests  …"), so the report's columns hold at 80 columns."""
    if len(line) <= width:
        return [line]
    # every part of LABEL is optional, so it matches every line (maybe empty): never None
    indent = " " * min(len(LABEL.match(line).group()), width // 2)  # type: ignore[union-attr]
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _setting_lines(doc: dict[str, Any]) -> list[str]:
    target, settings, run = doc["target"], doc["settings"], doc["run"]
    server = target.get("server") or {}
    version = server.get("version")
    if version and server.get("version_inferred"):
        version = f"{version} (inferred from the metric names)"
    kind = " ".join(str(v) for v in (server.get("kind"), version) if v)
    where = target.get("api") or target["metrics"]
    lines = [f"  target    {display_text(where)}" + (f" ({display_text(kind)})" if kind else "")
             + (f", model {display_text(target['model'])}" if target.get("model") else "")]
    if settings["watch_only"]:
        load = "watched only (the load came from elsewhere)"
    else:
        pace = (f"{settings['rate']:g} req/s, at most {settings['concurrency']} in flight"
                if settings["rate"] else f"{settings['concurrency']} in flight")
        load = f"workload {display_text(settings['workload'])}, {pace}"
    stopped = STOPPED.get(run["stopped"], "full length")
    lines.append(f"  load      {load}; {clock(run['load_s'])} of "
                 f"{clock(settings['duration_s'])} ({stopped})")
    if run.get("stopped_reason"):
        lines.append(f"  stopped   early, the verdict could no longer change: "
                     f"{display_text(run['stopped_reason'])} (--full-duration runs on)")
    if settings["time_scale"] != 1:
        lines.append(f"  time      the target's clock, {settings['time_scale']:g}x wall time")
    if run["restarts_s"]:
        lost = run.get("failed_across_restarts")
        lines.append("  restarts  the server restarted at "
                     + ", ".join(clock(t) for t in run["restarts_s"])
                     + (f" ({lost} requests failed across it)" if lost is not None else ""))
    return lines


def _request_lines(requests: dict[str, Any] | None, latency: dict[str, Any]) -> list[str]:
    lines = []
    if requests is not None:
        rate = requests["error_rate"]
        # "sent" in the JSON leaves out the cut (the error rate's denominator); a person
        # counts every request that went out
        lines.append(
            f"  requests  {requests['sent'] + requests['cut']} sent: {requests['ok']} "
            f"answered, {requests['failed']} failed" + (f" ({rate:.1%})" if rate else "")
            + f", {requests['cut']} cut by the end of the run; {requests['dropped']} dropped "
            f"before sending; retries {requests['retries']['sent']} "
            f"({requests['retries']['ok']} answered)")
        for error, count in list(requests["errors"].items())[:3]:
            lines.append(f"            {count} x {display_text(error, 120)}")
    ttft = latency.get("ttft_s")
    if ttft and ttft.get("first") and ttft.get("last"):
        first, last = ttft["first"], ttft["last"]
        lines.append(f"  TTFT      p50 {_s(first['p50'])} -> {_s(last['p50'])}, p99 "
                     f"{_s(first['p99'])} -> {_s(last['p99'])} (first -> last third)")
    tpot = latency.get("tpot_s")
    if tpot and tpot.get("first") and tpot.get("last"):
        lines.append(f"  per token p50 {_s(tpot['first']['p50'])} -> {_s(tpot['last']['p50'])}"
                     f", p99 {_s(tpot['first']['p99'])} -> {_s(tpot['last']['p99'])}")
    return lines


def _server_lines(doc: dict[str, Any]) -> list[str]:
    server = doc["server"]
    parts = []
    if server.get("preemptions") is not None:
        parts.append(f"{server['preemptions']:.0f} preemptions "
                     f"({server['preemptions_per_min']:.1f}/min)")
    if server.get("waiting_p90") is not None:
        parts.append(f"waiting p90 {server['waiting_p90']:.0f}")
    if server.get("usage_max") is not None:
        parts.append(f"KV usage max {server['usage_max']:.0%} (>= 95 % in "
                     f"{server['pinned_share']:.0%} of scrapes)")
    if server.get("hit_rate") is not None:
        parts.append(f"prefix hits {server['hit_rate']:.0%}")
    lines = [f"  server    {', '.join(parts)}"] if parts else []
    for engine in doc["kv"]["engines"]:
        name = display_text(" ".join(str(v) for v in (engine["model"], engine["engine"]) if v))
        lines.append(f"  KV        {name}: before {_kv_state(engine['before'])}; "
                     f"after {_kv_state(engine['after'])}")
    return lines


def _kv_state(state: dict[str, Any] | None) -> str:
    if state is None:
        return "not read"
    used, total = state.get("used_blocks"), state.get("blocks_total")
    blocks = f"{used:.0f}/{total} blocks used" if used is not None and total else "usage"
    idle = "idle" if state.get("idle") else "busy"
    usage = state.get("usage")
    return f"{blocks} ({'' if usage is None else f'{usage:.1%}, '}{idle})"


def clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    sign, seconds = ("-" if seconds < 0 else ""), round(abs(seconds))
    return f"{sign}{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
