"""``kvtop rules``: kvtop's leak evidence and stall verdict as Prometheus recording and
alerting rules.

The thresholds come from :class:`LeakParams` (and so from ``[thresholds]`` in the config).
PromQL cannot do everything the in-app detector does; docs/prometheus.md lists where the
two differ. Work is in fractions of the pool: PromQL cannot turn ``cache_config_info``'s
``num_gpu_blocks`` label into a number.
"""

from __future__ import annotations

import json

from kvtop.collect.prometheus import selector_matchers
from kvtop.derive.leak_params import LeakParams

BY = "job, instance, model_name, engine"
ON = f"on ({BY})"
STALL_WINDOW = "1m"  # a rate needs several scrapes at Prometheus' usual 15 s interval


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _vector(name: str, selector: str) -> str:
    matchers = selector_matchers(selector)
    return f"{name}{{{matchers}}}" if matchers else name


def _engine_from_dp_rank(expr: str) -> str:
    """SGLang names its engines by dp_rank; the rules key engines by ``engine``."""
    return f'label_replace({expr}, "engine", "$1", "dp_rank", "(.*)")'


def recording_rules(p: LeakParams, selector: str) -> list[tuple[str, str]]:
    bucket, window = _duration(p.bucket_s), _duration(p.window_s)
    v = lambda name: _vector(name, selector)  # noqa: E731 - a local shorthand
    sglang = lambda agg, name: _engine_from_dp_rank(  # noqa: E731
        f"{agg} by (job, instance, model_name, dp_rank) ({v(name)})")
    floor_series = f"min_over_time(kvtop:kv_usage:ratio[{bucket}])[{window}:{bucket}]"
    load_series = f"avg_over_time(kvtop:requests_running[{bucket}])[{window}:{bucket}]"
    return [
        # every rank of one engine reports the same pool: max, never a sum
        ("kvtop:kv_usage:ratio",
         f"max by ({BY}) ({v('vllm:kv_cache_usage_perc')})"
         f" or max by ({BY}) ({v('vllm:gpu_cache_usage_perc')})"
         f" or {sglang('max', 'sglang:token_usage')}"),
        ("kvtop:requests_running",
         f"sum by ({BY}) ({v('vllm:num_requests_running')})"
         f" or {sglang('max', 'sglang:num_running_reqs')}"),
        # usage while nothing runs: blocks no live request holds
        ("kvtop:kv_idle_residual:ratio",
         f"kvtop:kv_usage:ratio and {ON} (kvtop:requests_running == 0)"),
        # the lower envelope per bucket, its least-squares slope over the window, per hour
        ("kvtop:kv_floor_slope:ratio_per_hour", f"deriv({floor_series}) * 3600"),
        ("kvtop:kv_floor_buckets", f"count_over_time({floor_series})"),
        # the slope the load explains, if the floor were proportional to the load
        ("kvtop:kv_load_explained_slope:ratio_per_hour",
         f"clamp_min(deriv({load_series}), 0) * 3600"
         f" / clamp_min(avg_over_time(kvtop:requests_running[{window}]), 1)"
         f" * avg_over_time({floor_series})"),
        # finished requests in the window per most running: the batch turned over
        ("kvtop:requests_turnover",
         f"sum by ({BY}) (increase({v('vllm:request_success_total')}[{window}]))"
         f" / clamp_min(max_over_time(kvtop:requests_running[{window}]), 1)"),
        # The leak figures: present only while WATCH-level evidence holds (absent = OK), so
        # a dashboard or a `> 0` alert on them never reads a healthy pool as leaking.
        ("kvtop:kv_leak_slope:ratio_per_hour", _floor_condition(p, p.watch_rise_frac)),
        ("kvtop:kv_leaked:ratio",
         f"(kvtop:kv_idle_residual:ratio > {p.residual_min_frac:g})"
         f" or (kvtop:kv_leak_slope:ratio_per_hour * {p.window_s / 3600:g})"),
        # the stall verdict: requests held, no token out for a whole window
        ("kvtop:requests_waiting",
         f"sum by ({BY}) ({v('vllm:num_requests_waiting')})"
         f" or {sglang('max', 'sglang:num_queue_reqs')}"),
        ("kvtop:generation_tokens:rate" + STALL_WINDOW,
         f"sum by ({BY}) (rate({v('vllm:generation_tokens_total')}[{STALL_WINDOW}]))"
         f" or {_engine_from_dp_rank(_sglang_rate(v('sglang:generation_tokens_total')))}"),
        ("kvtop:stalled_kv_usage:ratio",
         f"kvtop:kv_usage:ratio and {ON} (kvtop:generation_tokens:rate{STALL_WINDOW} == 0)"
         f" and {ON} (min_over_time(kvtop:requests_running[{STALL_WINDOW}]) > 0"
         f" or min_over_time(kvtop:requests_waiting[{STALL_WINDOW}]) > 0)"),
    ]


def _sglang_rate(series: str) -> str:
    return (f"sum by (job, instance, model_name, dp_rank) "
            f"(rate({series}[{STALL_WINDOW}]))")


def _floor_condition(p: LeakParams, rise: float) -> str:
    """Floor evidence: the value is the floor's slope (fraction of the pool per hour)."""
    slope = "kvtop:kv_floor_slope:ratio_per_hour"
    clauses = [
        f"kvtop:kv_floor_buckets >= {p.trend_min_buckets}",
        f"{slope} * {p.window_s / 3600:g} >= {rise:g}",
        f"kvtop:kv_load_explained_slope:ratio_per_hour <= {ON} {slope} * {p.max_load_share:g}",
        f"kvtop:requests_turnover >= {p.turnover_min:g}",
        f"(1 - kvtop:kv_usage:ratio) / {ON} {slope} <= {p.max_hours_to_full:g}",
    ]
    return f"{slope} > 0" + "".join(f" and {ON} ({clause})" for clause in clauses)


def alerting_rules(p: LeakParams) -> list[dict[str, object]]:
    residual = f"kvtop:kv_idle_residual:ratio > {p.residual_min_frac:g}"
    held = "{{ $value | humanizePercentage }} of the KV pool held with nothing running"
    rising = "KV floor rising {{ $value | humanizePercentage }} of the pool per hour under " \
             "load, not explained by load, with the batch turning over"
    return [
        {"alert": "KVEngineStalled", "expr": "kvtop:stalled_kv_usage:ratio >= 0", "for": "0s",
         "labels": {"severity": "critical", "kvtop_state": "stalled"},
         "annotations": {"summary": "Inference engine stalled on {{ $labels.instance }}",
                         "description": f"no token generated for {STALL_WINDOW} with requests "
                                        "running or waiting; KV pool {{ $value | "
                                        "humanizePercentage }} full"}},
        {"alert": "KVCacheLeakIdleResidual", "expr": residual, "for": _duration(p.idle_leak_s),
         "labels": {"severity": "critical", "kvtop_state": "leak", "kvtop_evidence": "idle"},
         "annotations": {"summary": "KV cache leak on {{ $labels.instance }}",
                         "description": f"{held} for {_duration(p.idle_leak_s)}"}},
        {"alert": "KVCacheLeakIdleResidualWatch", "expr": residual,
         "for": _duration(p.idle_min_s),
         "labels": {"severity": "warning", "kvtop_state": "watch", "kvtop_evidence": "idle"},
         "annotations": {"summary": "KV blocks held at idle on {{ $labels.instance }}",
                         "description": f"{held} (confirming)"}},
        {"alert": "KVCacheLeakRisingFloor",
         "expr": _floor_condition(p, p.leak_rise_frac), "for": _duration(p.leak_persist_s),
         "labels": {"severity": "critical", "kvtop_state": "leak", "kvtop_evidence": "floor"},
         "annotations": {"summary": "KV cache leak on {{ $labels.instance }}",
                         "description": rising}},
        {"alert": "KVCacheLeakRisingFloorWatch",
         "expr": _floor_condition(p, p.watch_rise_frac), "for": _duration(p.bucket_s),
         "labels": {"severity": "warning", "kvtop_state": "watch", "kvtop_evidence": "floor"},
         "annotations": {"summary": "KV floor rising on {{ $labels.instance }}",
                         "description": f"{rising} (confirming)"}},
    ]


def _q(value: object) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def _rule_lines(rule: dict[str, object]) -> list[str]:
    lines = [f"      - alert: {rule['alert']}", f"        expr: {_q(rule['expr'])}",
             f"        for: {rule['for']}"]
    for section in ("labels", "annotations"):
        lines.append(f"        {section}:")
        items = rule[section]
        assert isinstance(items, dict)
        lines += [f"          {key}: {_q(value)}" for key, value in items.items()]
    return lines


def render_rules(params: LeakParams | None = None, selector: str = "") -> str:
    """The rules file (YAML) for ``rule_files:`` in prometheus.yml."""
    p = params or LeakParams()
    lines = ["# kvtop KV-cache leak rules: generated by `kvtop rules`; see docs/prometheus.md",
             "groups:", "  - name: kvtop-leak-recording", "    rules:"]
    for record, expr in recording_rules(p, selector):
        lines += [f"      - record: {record}", f"        expr: {_q(expr)}"]
    lines += ["  - name: kvtop-leak-alerts", "    rules:"]
    for rule in alerting_rules(p):
        lines += _rule_lines(rule)
    return "\n".join(lines) + "\n"
