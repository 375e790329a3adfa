"""`kvtop rules` as Prometheus runs them: `promtool test rules` feeds series of leaking and
healthy servers through the generated rules and checks which alerts fire, with which labels
and text, and what the recording rules compute (docs/prometheus.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvtop.derive.leak_params import LeakParams
from kvtop.report.rules import render_rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no 'promtool' on PATH (Debian's "
                                    "prometheus package has it)")

STEPS = 240  # samples 15 s apart: an hour

def vllm(instance: str, name: str, values: str, *, engine: str = "0", **labels: str) -> dict:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return {"series": f'{name}{{job="vllm",instance="{instance}",model_name="m",'
                      f'engine="{engine}"{extra}}}', "values": values}

def idle(instance: str, usage: float, name: str = "vllm:kv_cache_usage_perc") -> list[dict]:
    return [vllm(instance, name, f"{usage}x{STEPS}"),
            vllm(instance, "vllm:num_requests_running", f"0x{STEPS}")]

def labels(instance: str, state: str, evidence: str, severity: str,
           engine: str = "0") -> dict[str, str]:
    return {"job": "vllm", "instance": instance, "model_name": "m", "engine": engine,
            "severity": severity, "kvtop_state": state, "kvtop_evidence": evidence}

def promtool_test(tmp_path: Path, rules: str, tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yml").write_text(rules)
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": tests}
    (tmp_path / "test.yml").write_text(json.dumps(spec))  # JSON is YAML
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

def idle_alert(instance: str, percent: str, *, watch: bool, engine: str = "0",
               held_s: int = 60) -> dict[str, Any]:
    if watch:
        return {"exp_labels": labels(instance, "watch", "idle", "warning", engine),
                "exp_annotations": {
                    "summary": f"KV blocks held at idle on {instance}",
                    "description": f"{percent} of the KV pool held with nothing running "
                                   "(confirming)"}}
    return {"exp_labels": labels(instance, "leak", "idle", "critical", engine),
            "exp_annotations": {
                "summary": f"KV cache leak on {instance}",
                "description": f"{percent} of the KV pool held with nothing running "
                               f"for {held_s}s"}}

@needs_promtool
def test_blocks_held_at_idle_alert_after_the_watch_and_leak_durations(tmp_path: Path) -> None:
    series = [
        *idle("leaky:8000", 0.2),
        *idle("old-names:8000", 0.05, name="vllm:gpu_cache_usage_perc"),
        *idle("healthy:8000", 0.0),
        *idle("at-threshold:8000", 0.001),  # residual_min_frac is a strict bound
        vllm("busy:8000", "vllm:kv_cache_usage_perc", f"0.5x{STEPS}"),
        vllm("busy:8000", "vllm:num_requests_running", f"3x{STEPS}"),
        {"series": 'sglang:token_usage{job="sg",instance="sg:30000",model_name="m",'
                   'dp_rank="1",tp_rank="0"}', "values": f"0.3x{STEPS}"},
        {"series": 'sglang:num_running_reqs{job="sg",instance="sg:30000",model_name="m",'
                   'dp_rank="1",tp_rank="0"}', "values": f"0x{STEPS}"},
    ]
    sglang_watch = idle_alert("sg:30000", "30%", watch=True, engine="1")
    sglang_leak = idle_alert("sg:30000", "30%", watch=False, engine="1")
    for alert in (sglang_watch, sglang_leak):  # SGLang's dp_rank is copied into engine
        alert["exp_labels"].update(job="sg", dp_rank="1")
    promtool_test(tmp_path, render_rules(), [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "45s", "alertname": "KVCacheLeakIdleResidual", "exp_alerts": []},
            {"eval_time": "45s", "alertname": "KVCacheLeakIdleResidualWatch",
             "exp_alerts": [idle_alert("leaky:8000", "20%", watch=True),
                            idle_alert("old-names:8000", "5%", watch=True), sglang_watch]},
            {"eval_time": "10m", "alertname": "KVCacheLeakIdleResidual",
             "exp_alerts": [idle_alert("leaky:8000", "20%", watch=False),
                            idle_alert("old-names:8000", "5%", watch=False), sglang_leak]},
        ],
    }])

@needs_promtool
def test_the_thresholds_and_the_selector_reach_the_rules(tmp_path: Path) -> None:
    params = LeakParams(idle_leak_s=120, idle_min_s=40, residual_min_frac=0.1)
    series = [*idle("below:8000", 0.05), *idle("above:8000", 0.2),
              *[dict(s, series=s["series"].replace("}", ',namespace="prod"}'))
                for s in idle("prod:8000", 0.2)]]
    for s in series[:4]:
        s["series"] = s["series"].replace("}", ',namespace="dev"}')
    prod = idle_alert("prod:8000", "20%", watch=False, held_s=120)
    prod_watch = idle_alert("prod:8000", "20%", watch=True)  # aggregated: namespace dropped
    promtool_test(tmp_path, render_rules(params, '{namespace="prod"}'), [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "30s", "alertname": "KVCacheLeakIdleResidualWatch", "exp_alerts": []},
            {"eval_time": "100s", "alertname": "KVCacheLeakIdleResidual", "exp_alerts": []},
            {"eval_time": "100s", "alertname": "KVCacheLeakIdleResidualWatch",
             "exp_alerts": [prod_watch]},
            {"eval_time": "5m", "alertname": "KVCacheLeakIdleResidual", "exp_alerts": [prod]},
        ],
    }])

def under_load(instance: str, usage: str, running: str, finished: str) -> list[dict]:
    return [vllm(instance, "vllm:kv_cache_usage_perc", usage),
            vllm(instance, "vllm:num_requests_running", running),
            vllm(instance, "vllm:request_success_total", finished, finished_reason="stop")]

def floor_alert(instance: str, watch: bool) -> dict[str, Any]:
    rising = ("KV floor rising 12% of the pool per hour under load, not explained by load, "
              "with the batch turning over")
    if watch:
        return {"exp_labels": labels(instance, "watch", "floor", "warning"),
                "exp_annotations": {"summary": f"KV floor rising on {instance}",
                                    "description": f"{rising} (confirming)"}}
    return {"exp_labels": labels(instance, "leak", "floor", "critical"),
            "exp_annotations": {"summary": f"KV cache leak on {instance}",
                                "description": rising}}

@needs_promtool
def test_a_floor_rising_under_steady_load_alerts_and_explained_rises_do_not(
        tmp_path: Path) -> None:
    rise = f"0.1+0.0005x{STEPS}"  # 0.12 of the pool per hour
    series = [
        *under_load("leaky:8000", rise, f"5x{STEPS}", f"0+2x{STEPS}"),
        # the floor follows the load: usage = 0.05 x running
        *under_load("loaded:8000", rise, f"2+0.01x{STEPS}", f"0+2x{STEPS}"),
        # nothing finishes: a batch that never turns over is not a leak yet
        *under_load("stuck:8000", rise, f"5x{STEPS}", f"7x{STEPS}"),
        # too slow to matter: 0.035 per hour, full in more than 24 h
        *under_load("slow:8000", f"0.1+0.000145833x{STEPS}", f"5x{STEPS}", f"0+2x{STEPS}"),
        # full within 24 h, but rising 0.005 of the pool in the window: under watch_rise_frac
        *under_load("creeping:8000", f"0.9+0.0000416667x{STEPS}", f"5x{STEPS}",
                    f"0+2x{STEPS}"),
    ]
    promtool_test(tmp_path, render_rules(), [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            # fewer than trend_min_buckets (10) one-minute buckets yet
            {"eval_time": "8m", "alertname": "KVCacheLeakRisingFloorWatch", "exp_alerts": []},
            {"eval_time": "40m", "alertname": "KVCacheLeakRisingFloorWatch",
             "exp_alerts": [floor_alert("leaky:8000", watch=True)]},
            {"eval_time": "40m", "alertname": "KVCacheLeakRisingFloor",
             "exp_alerts": [floor_alert("leaky:8000", watch=False)]},
        ],
        "promql_expr_test": [
            {"expr": "round(kvtop:kv_floor_slope:ratio_per_hour{instance='leaky:8000'}, 0.001)",
             "eval_time": "40m",
             "exp_samples": [{"labels": '{job="vllm",instance="leaky:8000",model_name="m",'
                                        'engine="0"}', "value": 0.12}]},
            # a 30 min window of 1 min buckets (30 or 31 by the Prometheus release's range edge)
            {"expr": "kvtop:kv_floor_buckets{instance='leaky:8000'} >= bool 30",
             "eval_time": "40m",
             "exp_samples": [{"labels": '{job="vllm",instance="leaky:8000",model_name="m",'
                                        'engine="0"}', "value": 1}]},
            {"expr": "round(kvtop:kv_leaked:ratio{instance='leaky:8000'} * 100000)",
             "eval_time": "40m",  # the slope over the 30 min window: 0.06000
             "exp_samples": [{"labels": '{job="vllm",instance="leaky:8000",model_name="m",'
                                        'engine="0"}', "value": 6000}]},
            {"expr": "round(kvtop:requests_turnover{instance='leaky:8000'}, 0.1)",
             "eval_time": "40m",
             "exp_samples": [{"labels": '{job="vllm",instance="leaky:8000",model_name="m",'
                                        'engine="0"}', "value": 48}]},
        ],
    }])

@needs_promtool
def test_ranks_of_one_engine_are_one_pool_and_their_requests_add(tmp_path: Path) -> None:
    series = [
        vllm("tp:8000", "vllm:kv_cache_usage_perc", "0.4x10", rank="0"),
        vllm("tp:8000", "vllm:kv_cache_usage_perc", "0.6x10", rank="1"),
        vllm("tp:8000", "vllm:num_requests_running", "2x10", api="a"),
        vllm("tp:8000", "vllm:num_requests_running", "3x10", api="b"),
        {"series": 'sglang:num_running_reqs{job="sg",instance="sg:1",model_name="m",'
                   'dp_rank="0",tp_rank="0"}', "values": "4x10"},
        {"series": 'sglang:num_running_reqs{job="sg",instance="sg:1",model_name="m",'
                   'dp_rank="0",tp_rank="1"}', "values": "4x10"},
    ]
    engine = '{job="vllm",instance="tp:8000",model_name="m",engine="0"}'
    promtool_test(tmp_path, render_rules(), [{
        "interval": "15s", "input_series": series,
        "promql_expr_test": [
            {"expr": "kvtop:kv_usage:ratio", "eval_time": "1m",
             "exp_samples": [{"labels": f"kvtop:kv_usage:ratio{engine}", "value": 0.6}]},
            {"expr": "kvtop:requests_running", "eval_time": "1m",
             "exp_samples": [
                 {"labels": f"kvtop:requests_running{engine}", "value": 5},
                 {"labels": 'kvtop:requests_running{job="sg",instance="sg:1",model_name="m",'
                            'engine="0",dp_rank="0"}', "value": 4}]},
        ],
    }])

@needs_promtool
def test_an_engine_with_requests_and_no_token_out_for_a_minute_is_stalled(
        tmp_path: Path) -> None:
    flat = f"100x{STEPS}"
    series = [
        vllm("wedged:8000", "vllm:kv_cache_usage_perc", f"0.7x{STEPS}"),
        vllm("wedged:8000", "vllm:num_requests_running", f"3x{STEPS}"),
        vllm("wedged:8000", "vllm:generation_tokens_total", flat),
        vllm("queued:8000", "vllm:kv_cache_usage_perc", f"0.9x{STEPS}"),
        vllm("queued:8000", "vllm:num_requests_running", f"0x{STEPS}"),
        vllm("queued:8000", "vllm:num_requests_waiting", f"4x{STEPS}"),
        vllm("queued:8000", "vllm:generation_tokens_total", flat),
        vllm("working:8000", "vllm:kv_cache_usage_perc", f"0.5x{STEPS}"),
        vllm("working:8000", "vllm:num_requests_running", f"3x{STEPS}"),
        vllm("working:8000", "vllm:generation_tokens_total", f"0+45x{STEPS}"),
        vllm("idle:8000", "vllm:kv_cache_usage_perc", f"0x{STEPS}"),
        vllm("idle:8000", "vllm:num_requests_running", f"0x{STEPS}"),
        vllm("idle:8000", "vllm:num_requests_waiting", f"0x{STEPS}"),
        vllm("idle:8000", "vllm:generation_tokens_total", flat),
        *[{"series": f'{name}{{job="sg",instance="sg:30000",model_name="m",dp_rank="1",'
                     f'tp_rank="0"}}', "values": values}
          for name, values in (("sglang:token_usage", f"0.3x{STEPS}"),
                               ("sglang:num_running_reqs", f"0x{STEPS}"),
                               ("sglang:num_queue_reqs", f"2x{STEPS}"),
                               ("sglang:generation_tokens_total", flat))],
    ]

    def stalled(instance: str, full: str, **extra: str) -> dict[str, Any]:
        return {"exp_labels": {"job": "vllm", "instance": instance, "model_name": "m",
                               "engine": "0", "severity": "critical",
                               "kvtop_state": "stalled", **extra},
                "exp_annotations": {
                    "summary": f"Inference engine stalled on {instance}",
                    "description": "no token generated for 1m with requests running or "
                                   f"waiting; KV pool {full} full"}}

    engine = 'job="vllm",instance="{}",model_name="m",engine="0"'
    promtool_test(tmp_path, render_rules(), [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [{"eval_time": "5m", "alertname": "KVEngineStalled", "exp_alerts": [
            stalled("wedged:8000", "70%"), stalled("queued:8000", "90%"),
            stalled("sg:30000", "30%", job="sg", engine="1", dp_rank="1")]}],
        "promql_expr_test": [
            {"expr": "kvtop:requests_waiting", "eval_time": "5m", "exp_samples": [
                {"labels": "kvtop:requests_waiting{" + engine.format("queued:8000") + "}",
                 "value": 4},
                {"labels": "kvtop:requests_waiting{" + engine.format("idle:8000") + "}",
                 "value": 0},
                {"labels": 'kvtop:requests_waiting{job="sg",instance="sg:30000",'
                           'model_name="m",engine="1",dp_rank="1"}', "value": 2}]},
            {"expr": "kvtop:generation_tokens:rate1m{instance='working:8000'}",
             "eval_time": "5m", "exp_samples": [
                 {"labels": "kvtop:generation_tokens:rate1m{" + engine.format("working:8000")
                            + "}", "value": 3}]},
        ],
    }])

@needs_promtool
def test_the_file_says_what_made_it() -> None:
    assert render_rules().splitlines()[:2] == [
        "# kvtop KV-cache leak rules: generated by `kvtop rules`; see docs/prometheus.md",
        "groups:"]

@needs_promtool
def test_a_threshold_of_a_second_is_a_second_in_the_rules() -> None:
    rules = render_rules(LeakParams(idle_min_s=1.0, idle_leak_s=0.4))
    assert "        for: 1s\n" in rules  # never 0s: a rounded-down threshold is still one

def test_rules_carry_the_thresholds() -> None:
    params = LeakParams(idle_leak_s=90, idle_min_s=15, residual_min_frac=0.002, window_s=3600,
                        bucket_s=120, leak_rise_frac=0.03)
    text = render_rules(params, '{namespace="prod"}')
    assert 'kvtop:kv_idle_residual:ratio > 0.002"' in text
    assert "for: 90s" in text and "for: 15s" in text
    assert "[3600s:120s]" in text and ">= 0.03" in text
    assert 'vllm:kv_cache_usage_perc{namespace=\\"prod\\"}' in text
