"""``adapt``: one answer in, one ServerReading out, never an exception. A body over the
parser's limits, too many series handed over by Prometheus, a value no pool has, or an
adapter bug each refuse that target's answer with a message that says why, keeping the
server version; skipped lines and impossible values are said in the notes."""

from __future__ import annotations

import logging

import pytest

from kvtop.collect.adapters import NOTED_VALUES, adapt, read_exposition, sglang
from kvtop.collect.exposition import MAX_ERRORS, MAX_WANTED_LINES, Exposition, Sample


def test_a_body_the_parser_refused_is_refused_with_its_reason() -> None:
    body = "".join(f"vllm:num_requests_running{{engine=\"0\" {i}\n" for i in range(MAX_ERRORS + 1))
    reading = read_exposition(body, version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("unknown", [], "0.9.1")
    assert reading.refused is not None and "malformed lines" in reading.refused


def test_more_series_than_one_server_has_are_refused() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": str(i), "model_name": "m"}, 1.0)
               for i in range(MAX_WANTED_LINES + 1)]
    reading = adapt(Exposition(samples=samples), version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("unknown", [], "0.9.1")
    assert reading.refused == (f"{MAX_WANTED_LINES + 1:,} series; more than "
                               f"{MAX_WANTED_LINES:,} is not one server's")


def test_exactly_the_most_series_one_server_has_are_read() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": "0", "model_name": "m",
                                                     "n": str(i)}, 1.0)
               for i in range(MAX_WANTED_LINES)]
    reading = adapt(Exposition(samples=samples))
    assert reading.refused is None and reading.engines[0].running == MAX_WANTED_LINES


def test_a_value_no_pool_has_refuses_the_answer_and_keeps_the_version() -> None:
    body = ('vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="inf"} 1\n')
    reading = read_exposition(body, version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("vllm", [], "0.9.1")
    assert reading.refused is not None and "num_gpu_blocks" in reading.refused


def test_an_adapter_bug_fails_that_answer_not_kvtop(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def broken(expo: Exposition, version: str | None = None) -> None:
        raise KeyError("x" * 500)

    monkeypatch.setattr(sglang, "adapt", broken)
    with caplog.at_level(logging.ERROR, logger="kvtop.collect.adapters"):
        reading = read_exposition('sglang:num_running_reqs{model_name="q"} 1\n', version="0.5")
    assert (reading.kind, reading.engines, reading.version) == ("sglang", [], "0.5")
    assert reading.refused is not None
    cut = "'" + "x" * 119  # the exception's text, cut to 120 characters
    assert reading.refused == (f"kvtop could not read this answer (KeyError: {cut}); a bug in "
                               "kvtop, please report it")
    assert [r.getMessage() for r in caplog.records] == ["the sglang adapter failed"]


def test_an_unknown_server_says_what_kvtop_reads() -> None:
    reading = read_exposition("process_cpu_seconds_total 5\n", version="1.0")
    assert (reading.kind, reading.engines, reading.version, reading.refused) == (
        "unknown", [], "1.0", None)
    assert reading.notes == ["no inference-server metrics found: not vLLM, SGLang, llama.cpp or "
                             "TRT-LLM (or vLLM started with --disable-log-stats)"]


def test_skipped_lines_are_counted_and_the_first_one_named() -> None:
    body = ('vllm:num_requests_running{model_name="m"} 1\n'
            "vllm:num_requests_waiting{model_name=\"m\"} one\n"
            "vllm:num_requests_swapped{\n")
    reading = read_exposition(body)
    assert reading.parse_errors == 2
    assert reading.notes[-1].startswith("2 malformed line(s) skipped; first at line 2: ")


def usage_of(model: str, value: float) -> str:
    return f'vllm:kv_cache_usage_perc{{model_name="{model}",engine="0"}} {value}\n'


def test_exactly_three_impossible_values_are_all_named_and_none_more() -> None:
    body = "".join(usage_of(f"m{i}", 2.0) for i in range(NOTED_VALUES))
    reading = read_exposition(body)
    assert reading.impossible_values == NOTED_VALUES
    [note] = reading.notes
    assert note.count("kv_usage 2") == NOTED_VALUES and "more" not in note


def test_a_long_model_name_is_cut_to_60_characters_in_the_note() -> None:
    model = "a" * 70
    [note] = read_exposition(usage_of(model, 2.0)).notes
    assert note == f"impossible values left out: {'a' * 60}/0: kv_usage 2 (not within 0..1)"


def test_each_impossible_value_is_named_with_its_engine_unless_it_has_no_name() -> None:
    body = usage_of("m", 2.0) + 'vllm:num_requests_waiting{model_name="m",engine="0"} -1\n'
    [note] = read_exposition(body).notes
    assert note == ("impossible values left out: m/0: kv_usage 2 (not within 0..1); "
                    "m/0: waiting -1 (not a count)")
    # llama.cpp serves one model and names no engine
    [note] = read_exposition("llamacpp:requests_processing 1\n"
                             "llamacpp:kv_cache_usage_ratio 2\n").notes
    assert note == "impossible values left out: kv_usage 2 (not within 0..1)"
