"""What a scrape says before any adapter fills it in (kvtop/collect/reading.py's defaults): a
refused answer counts no malformed line, and a server whose pool needs no version-dependent
idle floor (TensorRT-LLM) has its leak told without an assumed one."""

from __future__ import annotations

from kvtop.collect.adapters import adapt
from kvtop.collect.exposition import MAX_WANTED_LINES, Exposition, Sample
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker

TARGET = Target.from_spec("127.0.0.1:8000")
TRT_IDLE_HOLDING = (
    'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="t",version="1"} 1000\n'
    'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="t",version="1"} 300\n'
    'nv_trt_llm_request_metrics{model="t",request_type="active",version="1"} 0\n'
    'nv_trt_llm_request_metrics{model="t",request_type="waiting",version="1"} 0\n')


def test_a_refused_answer_counts_no_malformed_lines_and_nothing_else() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": str(i)}, 1.0)
               for i in range(MAX_WANTED_LINES + 1)]  # more than one server has
    reading = adapt(Exposition(samples=samples))
    assert reading.refused and reading.engines == [] and reading.gpus == []
    assert (reading.parse_errors, reading.engines_over_cap, reading.impossible_values) == (
        0, 0, 0)


def test_a_trtllm_pool_held_at_idle_is_a_leak_with_no_assumed_idle_floor() -> None:
    tracker = TargetTracker(TARGET)
    states = [tracker.update(read_scrape(Scrape(TARGET, float(t), body=TRT_IDLE_HOLDING)))
              .engines[0].leak for t in range(0, 70, 10)]
    assert states[-1].state == "leak" and states[-1].leaked_blocks == 300.0
    assert all("assumed" not in verdict.reason for verdict in states)
