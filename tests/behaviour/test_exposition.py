"""The parser as its readers rely on it: samples written back as text (a recording of a
Prometheus answer) read again as the same samples, in the spellings Prometheus uses; a
narrowed read keeps the HELP and TYPE of the families it keeps; HELP lines of any length."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.exposition import MAX_ERRORS, Exposition, Sample, parse, to_text


def test_odd_values_are_written_as_prometheus_spells_them() -> None:
    expo = Exposition(samples=[Sample("a", {}, math.nan), Sample("b", {}, math.inf),
                               Sample("c", {}, -math.inf), Sample("d", {}, 0.1),
                               Sample("e", {}, -0.0), Sample("f", {}, 1e300)])
    assert to_text(expo) == "a NaN\nb +Inf\nc -Inf\nd 0.1\ne -0.0\nf 1e+300\n"


def test_samples_written_as_text_read_back_the_same() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": "0", "model_name": 'm "q"\\n'}, 2.0),
               Sample("vllm:kv_cache_usage_perc", {"model_name": "line\nbreak"}, math.nan),
               Sample("le_bucket", {"le": "+Inf"}, math.inf),
               Sample("dotted.name.total", {"x": "ü"}, -math.inf),
               Sample("plain", {}, 123456789.125)]
    again = parse(to_text(Exposition(samples=samples)))
    assert again.errors == [] and len(again.samples) == len(samples)
    for read, written in zip(again.samples, samples, strict=True):
        assert (read.name, read.labels) == (written.name, written.labels)
        assert read.value == written.value or (math.isnan(read.value) and math.isnan(written.value))


HISTOGRAM = """# HELP ttft Time to first token.
# TYPE ttft histogram
ttft_bucket{le="1"} 1
ttft_bucket{le="+Inf"} 2
ttft_count 2
ttft_sum 0.5
# HELP other Not asked for.
# TYPE other gauge
other 1
"""


@pytest.mark.parametrize("keep", [{"ttft_bucket"}, {"ttft_count"}, {"ttft_sum"},
                                  {"ttft_bucket", "ttft_sum"}])
def test_a_narrowed_read_keeps_the_help_and_type_of_the_family_it_keeps(keep: set[str]) -> None:
    expo = parse(HISTOGRAM, keep=keep)
    assert {s.name for s in expo.samples} == keep
    assert expo.types.get("ttft") == "histogram"
    assert expo.helps.get("ttft") == "Time to first token."
    assert "other" not in expo.types and "other" not in expo.helps


@pytest.mark.parametrize("length", [10, 1023, 1024, 1025, 5000])
def test_help_text_of_any_length_is_read(length: int) -> None:
    text = "x" * length
    for keep in (None, {"g"}):
        expo = parse(f"# HELP g {text}\n# TYPE g gauge\ng 1\n", keep=keep)
        assert (expo.helps.get("g"), expo.types.get("g")) == (text, "gauge")


def test_a_malformed_line_is_named_by_its_line_number_in_a_full_and_a_narrowed_read() -> None:
    body = "# HELP g A gauge.\ng 1\n\nh 2\ng{x=\"1\" 3\ng{x=\"2\"} four\n"
    for keep in (None, {"g"}):
        expo = parse(body, keep=keep)
        assert [(e.line_no, e.text) for e in expo.errors] == [(5, 'g{x="1" 3'),
                                                               (6, 'g{x="2"} four')]


def test_up_to_the_error_limit_the_good_lines_are_read() -> None:
    body = "g 1\n" + "g{ 1\n" * MAX_ERRORS
    expo = parse(body)
    assert expo.refused is None and len(expo.errors) == MAX_ERRORS
    assert [s.value for s in expo.samples] == [1.0]


def test_past_the_error_limit_the_body_is_not_prometheus_text() -> None:
    body = "g 1\nfirst bad line\n" + "g{ 1\n" * MAX_ERRORS
    expo = parse(body)
    assert expo.samples == []
    assert expo.refused is not None
    assert expo.refused.startswith(f"more than {MAX_ERRORS:,} malformed lines (the first, line 2: ")
    assert expo.refused.endswith("): not Prometheus text")


def test_series_of_a_name_not_sent_is_empty_and_names_lists_what_was() -> None:
    expo = parse('a 1\nb{x="1"} 2\nb{x="2"} 3\n')
    assert expo.series("c") == [] and [s.value for s in expo.series("b")] == [2.0, 3.0]
    assert expo.names() == {"a", "b"}
