"""Unit tests of the Prometheus / OpenMetrics text parser (kvtop.collect.exposition).

Property tests of the exposition parser: it never raises, and valid text round-trips.

The parser as its readers rely on it: samples written back as text (a recording of a
Prometheus answer) read again as the same samples, in the spellings Prometheus uses; a
narrowed read keeps the HELP and TYPE of the families it keeps; HELP lines of any length."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvtop.collect import exposition
from kvtop.collect.exposition import (
    MAX_ERRORS,
    MAX_LINE_CHARS,
    MAX_LINES,
    MAX_WANTED_LINES,
    Exposition,
    Sample,
    parse,
    to_text,
)
from tests.support.mutation_run import examples
from tests.support.paths import FIXTURES, REPO

FIXTURE_FILES = sorted(FIXTURES.glob("*.txt"))


AIBRIX = "vllm-0.7.x-v0-aibrix-runtime-doc.txt"


def triples(expo: Exposition) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for s in expo.samples]


def one(text: str, keep: list[str] | None = None) -> exposition.Sample:
    """The single sample of a one-sample text, asserting no errors."""
    expo = parse(text, keep)
    assert expo.errors == []
    assert len(expo.samples) == 1, expo.samples
    return expo.samples[0]


def same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_plain_sample_with_and_without_labels() -> None:
    expo = parse('a 1\nb{x="y",z="w"} 2.5\n')
    assert triples(expo) == [("a", {}, 1.0), ("b", {"x": "y", "z": "w"}, 2.5)]
    assert expo.errors == []
    assert [s.timestamp for s in expo.samples] == [None, None]


def test_escaped_label_values() -> None:
    sample = one(r'm{a="back\\slash",b="say \"hi\"",c="two\nlines",d="\\n"} 1')
    assert sample.labels == {
        "a": "back\\slash",
        "b": 'say "hi"',
        "c": "two\nlines",
        "d": "\\n",  # an escaped backslash followed by a plain n
    }


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("NaN", math.isnan),
        ("+Inf", lambda v: v == math.inf),
        ("-Inf", lambda v: v == -math.inf),
        ("Inf", lambda v: v == math.inf),
        ("1e-300", lambda v: v == 1e-300),
        ("-0.5", lambda v: v == -0.5),
        ("12345678901234567890", lambda v: v == 12345678901234567890.0),
    ],
)
def test_special_and_float_values(text: str, check) -> None:
    assert check(one(f"m {text}").value)


@pytest.mark.parametrize(
    ("line", "timestamp"),
    [
        ("m 1 1712345678901", 1712345678901.0),  # 0.0.4: integer milliseconds
        ("m{a=\"b\"} 1 1712345678.901", 1712345678.901),  # OpenMetrics: float seconds
        ("m 1 -5", -5.0),
    ],
)
def test_optional_timestamps(line: str, timestamp: float) -> None:
    sample = one(line)
    assert sample.value == 1.0
    assert sample.timestamp == timestamp


def test_non_finite_timestamp_is_an_error() -> None:
    expo = parse("m 1 NaN\nok 2\n")
    assert triples(expo) == [("ok", {}, 2.0)]
    assert [e.line_no for e in expo.errors] == [1]


def test_eof_stops_parsing_and_later_content_is_ignored() -> None:
    text = "# TYPE a gauge\na 1\n# EOF\nb 2\nthis is garbage {{{\n"
    expo = parse(text)
    assert triples(expo) == [("a", {}, 1.0)]
    assert expo.errors == []


def test_created_series_are_kept_as_samples() -> None:
    text = (
        "# TYPE req counter\n"
        'req_total{m="x"} 7\n'
        'req_created{m="x"} 1.7e9\n'
    )
    assert triples(parse(text)) == [
        ("req_total", {"m": "x"}, 7.0),
        ("req_created", {"m": "x"}, 1.7e9),
    ]
    # _created of a kept counter is only kept when asked for by name
    assert triples(parse(text, keep=["req_total"])) == [("req_total", {"m": "x"}, 7.0)]


def test_openmetrics_exemplar_is_dropped_and_value_kept() -> None:
    expo = parse(
        'foo_bucket{le="1"} 3 # {trace_id="abc"} 0.5 1.6e9\n'
        'foo_bucket{le="+Inf"} 4 123 # {trace_id="a b # c"} 0.7\n'
    )
    assert expo.errors == []
    assert triples(expo) == [("foo_bucket", {"le": "1"}, 3.0), ("foo_bucket", {"le": "+Inf"}, 4.0)]
    assert [s.timestamp for s in expo.samples] == [None, 123.0]


def test_blank_and_comment_lines() -> None:
    text = "\n\n# just a comment\n#\n   \n\t\na 1\n# HELP\n# TYPE\n#HELPless words\n\n"
    expo = parse(text)
    assert triples(expo) == [("a", {}, 1.0)]
    assert expo.errors == []


def test_crlf_line_endings() -> None:
    text = '# HELP a The a.\r\n# TYPE a gauge\r\na{x="y"} 1\r\n\r\nb 2 1000\r\n'
    expo = parse(text)
    assert expo.errors == []
    assert triples(expo) == [("a", {"x": "y"}, 1.0), ("b", {}, 2.0)]
    assert expo.samples[1].timestamp == 1000.0
    assert expo.helps == {"a": "The a."}
    assert expo.types == {"a": "gauge"}


def test_help_and_type_recorded_with_help_escapes() -> None:
    expo = parse("# HELP a Line one\\nline two \\\\ done\n# TYPE a counter\na_total 1\n")
    assert expo.helps == {"a": "Line one\nline two \\ done"}
    assert expo.types == {"a": "counter"}


def test_duplicate_help_and_type_are_reported_first_wins_samples_kept() -> None:
    text = (
        "# HELP a first\n# TYPE a gauge\na{n=\"1\"} 1\n"
        "# HELP a second\n# TYPE a counter\na{n=\"2\"} 2\n"
    )
    expo = parse(text)
    assert triples(expo) == [("a", {"n": "1"}, 1.0), ("a", {"n": "2"}, 2.0)]
    assert expo.helps == {"a": "first"}
    assert expo.types == {"a": "gauge"}
    assert sorted(e.line_no for e in expo.errors) == [4, 5]


def test_missing_help_and_type() -> None:
    expo = parse('untyped_thing{a="b"} 3\n# TYPE only_type gauge\nonly_type 1\n')
    assert expo.errors == []
    assert triples(expo) == [("untyped_thing", {"a": "b"}, 3.0), ("only_type", {}, 1.0)]
    assert expo.types == {"only_type": "gauge"}
    assert expo.helps == {}


def test_unknown_type_is_reported() -> None:
    expo = parse("# TYPE a bogus\na 1\n")
    assert triples(expo) == [("a", {}, 1.0)]
    assert [e.line_no for e in expo.errors] == [1]
    assert "a" not in expo.types


def test_histogram_with_sum_before_buckets() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_sum{m="x"} 12.5\n'
        'h_bucket{m="x",le="0.1"} 1\n'
        'h_bucket{m="x",le="1.0"} 3\n'
        'h_bucket{m="x",le="+Inf"} 4\n'
        'h_count{m="x"} 4\n'
    )
    expo = parse(text)
    assert expo.errors == []
    assert [s.value for s in expo.series("h_bucket")] == [1.0, 3.0, 4.0]
    assert [s.labels["le"] for s in expo.series("h_bucket")] == ["0.1", "1.0", "+Inf"]
    assert expo.series("h_sum")[0].value == 12.5
    assert expo.series("h_count")[0].value == 4.0
    keep = ["h_bucket", "h_sum", "h_count"]
    assert triples(parse(text, keep=keep)) == triples(expo)


def test_label_values_with_special_characters() -> None:
    value = 'a}b,c#d=e f\tg ü 東京 🚀 {"x"}'
    escaped = value.replace('"', '\\"')
    sample = one(f'm{{v="{escaped}",w="2"}} 5')
    assert sample.labels == {"v": value, "w": "2"}
    assert sample.value == 5.0


def test_trailing_comma_in_label_set() -> None:
    assert one('m{a="1",b="2",} 3').labels == {"a": "1", "b": "2"}


def test_spaces_around_labels() -> None:
    assert one('m{ a = "1" , b="2" } 3').labels == {"a": "1", "b": "2"}


def test_whitespace_between_name_and_brace() -> None:
    sample = one('m {a="1"} 3')
    assert (sample.name, sample.labels, sample.value) == ("m", {"a": "1"}, 3.0)
    sample = one('m\t{a="1"}\t3')
    assert (sample.name, sample.labels, sample.value) == ("m", {"a": "1"}, 3.0)


def test_empty_label_set() -> None:
    sample = one("m{} 3")
    assert (sample.name, sample.labels) == ("m", {})


def test_quoted_utf8_metric_names() -> None:
    sample = one('{"my.metric", a="b"} 1')
    assert (sample.name, sample.labels, sample.value) == ("my.metric", {"a": "b"}, 1.0)
    sample = one('{"only.name"} 2')
    assert (sample.name, sample.labels) == ("only.name", {})
    sample = one('{"dotted.name", "label.with.dots"="v"} 3')
    assert sample.labels == {"label.with.dots": "v"}
    # keep= applies to quoted names too
    assert triples(parse('{"my.metric"} 1\n{"other"} 2\n', keep=["my.metric"])) == [
        ("my.metric", {}, 1.0)
    ]


def test_colons_in_names() -> None:
    sample = one('vllm:num_requests_running{engine="0"} 3')
    assert sample.name == "vllm:num_requests_running"


@pytest.mark.parametrize(
    "bad",
    [
        "missing_value",
        'missing_value_labels{a="b"}',
        "bad_value abc",
        "bad_value 1_000",
        "bad_value 0x10",
        "bad_value \u0661",  # ARABIC-INDIC DIGIT ONE: float() takes it, the format does not
        "bad_ts 1 \uff11\uff12",  # FULLWIDTH digits
        'unterminated{a="b} 1',
        'unterminated{a="b\\"} 1',
        'unclosed{a="b" 1',
        'dup{a="1",a="2"} 1',
        "9bad_name 1",
        "bad-name 1",
        'three_tokens{a="b"} 1 2 3',
        "three_tokens 1 2 3",
        'no_value_for_label{a} 1',
        'not_quoted{a=b} 1',
        '{a="b"} 1',
        'two_names{"other"} 1',
        "bad_ts 1 abc",
        'two_commas{a="1",,b="2"} 1',
    ],
)
def test_malformed_line_is_reported_with_line_number_and_rest_kept(bad: str) -> None:
    text = f"# TYPE good gauge\ngood 1\n{bad}\ngood_too 2\n"
    expo = parse(text)
    assert triples(expo) == [("good", {}, 1.0), ("good_too", {}, 2.0)]
    assert len(expo.errors) == 1
    error = expo.errors[0]
    assert error.line_no == 3
    assert error.text == bad[:120]
    assert error.reason


def test_error_line_numbers_count_blank_and_comment_lines() -> None:
    text = "\n# c\n\nok 1\r\nbroken\r\n\r\nalso broken 1 2 3\n"
    expo = parse(text)
    assert [e.line_no for e in expo.errors] == [5, 7]
    assert triples(expo) == [("ok", {}, 1.0)]


def test_long_bad_line_text_is_cut() -> None:
    expo = parse("x" * 500 + "{\n")
    assert len(expo.errors) == 1
    assert len(expo.errors[0].text) == 120


KEEP_TEXT = """\
# HELP a_total The a.
# TYPE a_total counter
a_total{x="1"} 1
a_total_extra 2
a_created{x="1"} 3
# HELP b_seconds The b.
# TYPE b_seconds histogram
b_seconds_bucket{le="1"} 4
b_seconds_sum 5
b_seconds_count 4
# HELP c The c.
# TYPE c gauge
c 6
ca 7
{"c",i="8"} 8
  c{i="9"} 9
"""


def test_keep_keeps_exactly_the_named_samples_and_their_families() -> None:
    keep = ["a_total", "b_seconds_bucket", "c"]
    expo = parse(KEEP_TEXT, keep=keep)
    assert expo.errors == []
    assert triples(expo) == [
        ("a_total", {"x": "1"}, 1.0),
        ("b_seconds_bucket", {"le": "1"}, 4.0),
        ("c", {}, 6.0),
        ("c", {"i": "8"}, 8.0),
        ("c", {"i": "9"}, 9.0),
    ]
    assert expo.types == {"a_total": "counter", "b_seconds": "histogram", "c": "gauge"}
    assert expo.helps == {"a_total": "The a.", "b_seconds": "The b.", "c": "The c."}


def test_keep_equals_filtered_full_parse() -> None:
    full = parse(KEEP_TEXT)
    for keep in (["a_total"], ["b_seconds_sum", "b_seconds_count"], ["ca", "a_created"], []):
        kept = parse(KEEP_TEXT, keep=keep)
        assert triples(kept) == [t for t in triples(full) if t[0] in keep]


def test_keep_does_not_report_errors_on_lines_it_skips() -> None:
    expo = parse("junk here now 1 2\nwanted 1\nwanted{ 2\n", keep=["wanted"])
    assert triples(expo) == [("wanted", {}, 1.0)]
    assert [e.line_no for e in expo.errors] == [3]


@pytest.fixture
def empty_cache():
    exposition._label_cache.clear()
    yield
    exposition._label_cache.clear()


@pytest.mark.usefixtures("empty_cache")
def test_cache_with_brace_inside_quoted_value_both_orders() -> None:
    long_line = 'm{a="x}",b="y"} 1'
    short_line = 'm{a="x"} 2'
    for order in ((long_line, short_line), (short_line, long_line)):
        exposition._label_cache.clear()
        first = parse(order[0])
        second = parse(order[1])
        both = parse("\n".join(order))
        for expo in (first, second, both):
            assert expo.errors == []
        got = {t[2]: t[1] for t in triples(first) + triples(second) + triples(both)}
        assert got == {1.0: {"a": "x}", "b": "y"}, 2.0: {"a": "x"}}


@pytest.mark.usefixtures("empty_cache")
def test_cache_never_turns_an_error_into_a_sample() -> None:
    # The valid line caches '{a="x"}'; the broken line starts with '{a="x' then differs.
    text = 'm{a="x"} 1\nm{a="x}"} 2\nm{a="x} 3\nm{a="x"}} 4\nn{a="x"} 5\n'
    expo = parse(text)
    assert triples(expo) == [
        ("m", {"a": "x"}, 1.0),
        ("m", {"a": "x}"}, 2.0),
        ("n", {"a": "x"}, 5.0),
    ]
    assert [e.line_no for e in expo.errors] == [3, 4]
    again = parse(text)  # now everything is cached
    assert triples(again) == triples(expo)
    assert [e.line_no for e in again.errors] == [3, 4]


@pytest.mark.usefixtures("empty_cache")
def test_cache_prefix_of_escaped_quote() -> None:
    lines = ['m{a="p\\"}"} 1', 'm{a="p\\\\"} 2', 'm{a="p\\\\"}"} 3']
    expected = {1: ("m", {"a": 'p"}'}, 1.0), 2: ("m", {"a": "p\\"}, 2.0)}
    for order in (lines, lines[::-1]):
        exposition._label_cache.clear()
        for _ in range(2):
            results = [parse(line) for line in order]
            for line, expo in zip(order, results, strict=True):
                key = int(line[-1])
                if key in expected:
                    assert triples(expo) == [expected[key]] and expo.errors == []
                else:
                    assert expo.samples == [] and len(expo.errors) == 1


@pytest.mark.usefixtures("empty_cache")
def test_cache_is_bounded() -> None:
    limit = exposition._MAX_CACHED_LABEL_BLOCKS
    text = "\n".join(f'm{{i="{i}"}} {i}' for i in range(limit + 10))
    expo = parse(text)
    assert len(expo.samples) == limit + 10
    assert expo.samples[-1].labels == {"i": str(limit + 9)}
    assert len(exposition._label_cache) <= limit


def reference_triples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def normalised_for_prometheus_client(expo: Exposition) -> list[tuple[str, dict[str, str], float]]:
    # prometheus_client renames a counter's sample "x" to "x_total"; kvtop keeps names as written.
    out = []
    for name, labels, value in triples(expo):
        if expo.types.get(name) == "counter" and not name.endswith("_total"):
            name += "_total"
        out.append((name, labels, value))
    return out


def assert_same_samples(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine[:2] == ref[:2]
        assert same_value(mine[2], ref[2]), (mine, ref)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_fixture_parses_like_prometheus_client(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    expo = parse(text)
    assert expo.errors == []
    if path.name == AIBRIX:  # truncated in its source: compare its complete lines only
        text = text[: text.rstrip("\n").rfind("\n") + 1]
        expo = parse(text)
    theirs = reference_triples(text)
    assert len(theirs) > 5
    assert_same_samples(normalised_for_prometheus_client(expo), theirs)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_fixture_crlf_and_keep_agree_with_full_parse(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    full = parse(text)
    assert triples(parse(text.replace("\n", "\r\n"))) == triples(full)
    names = sorted(full.names())
    keep = names[::3]
    kept = parse(text, keep=keep)
    assert kept.errors == []
    assert triples(kept) == [t for t in triples(full) if t[0] in keep]
    assert set(kept.types) <= set(full.types)
    assert all(full.types[k] == v for k, v in kept.types.items())


def test_fixture_values_read_by_hand() -> None:
    expo = parse((FIXTURES / "vllm-0.33.0-v1-twin-under-load.txt").read_text(encoding="utf-8"))
    running = expo.series("vllm:num_requests_running")
    assert [(s.labels["engine"], s.labels["model_name"], s.value) for s in running] == [
        ("0", "twin-llama", 30.0)
    ]
    assert expo.series("vllm:num_requests_waiting")[0].value == 149.0
    assert expo.series("vllm:num_preemptions_total")[0].value == 6.0
    assert expo.series("vllm:prefix_cache_hits_total")[0].value == 6400.0
    assert expo.series("vllm:prefix_cache_queries_total")[0].value == 17016.0
    info = expo.series("vllm:cache_config_info")[0].labels
    assert info["num_gpu_blocks"] == "600" and info["block_size"] == "16"
    assert expo.types["vllm:kv_cache_usage_perc"] == "gauge"


def test_indented_comments_are_comments() -> None:
    expo = parse("  # HELP a The a.\n\t# TYPE a gauge\n \t# free text\n  a 1\n")
    assert expo.errors == []
    assert triples(expo) == [("a", {}, 1.0)]
    assert expo.helps == {"a": "The a."}
    assert expo.types == {"a": "gauge"}


def test_only_an_exact_eof_line_ends_the_exposition() -> None:
    expo = parse("a 1\n# EOFX is just a comment\n# EOF of nothing\nb 2\n# EOF \nc 3\n")
    assert triples(expo) == [("a", {}, 1.0), ("b", {}, 2.0)]
    assert expo.errors == []


def test_help_and_type_of_quoted_utf8_names() -> None:
    text = (
        '# HELP "my.metric" Dotted \\\\ name\n'
        '# TYPE "my.metric" gauge\n'
        '# TYPE "with space\\"quote" counter\n'
        '{"my.metric", a="b"} 1\n'
    )
    expo = parse(text)
    assert expo.errors == []
    assert expo.helps == {"my.metric": "Dotted \\ name"}
    assert expo.types == {"my.metric": "gauge", 'with space"quote': "counter"}
    kept = parse(text, keep=["my.metric"])
    assert (kept.helps, kept.types) == ({"my.metric": "Dotted \\ name"}, {"my.metric": "gauge"})


def test_help_text_keeps_inner_whitespace_and_may_be_empty() -> None:
    expo = parse("# HELP a  two  spaces\there \n# HELP b\n#HELP c tight\n")
    assert expo.helps == {"a": "two  spaces\there", "b": "", "c": "tight"}


def test_keep_reads_help_type_written_unusually() -> None:
    # the keep fast path skips '# HELP other ...' unread; these forms must still be read
    text = (
        "# HELP w\tTab separated.\n"
        "# TYPE w\tgauge\n"
        "# HELP v_total\n"
        '# TYPE "v" counter\n'
        "#  HELP  u  Spaced.\n"
        "# HELP other Not wanted.\n"
        "w 1\nv_total 2\nu 3\nother 4\n"
    )
    for keep in (["w", "v_total", "u"], {"w", "v_total", "u"}, frozenset(["w", "v_total", "u"])):
        expo = parse(text, keep=keep)
        assert expo.errors == []
        assert triples(expo) == [("w", {}, 1.0), ("v_total", {}, 2.0), ("u", {}, 3.0)]
        assert expo.helps == {"w": "Tab separated.", "v_total": "", "u": "Spaced."}
        assert expo.types == {"w": "gauge", "v": "counter"}


def test_sample_head_cache_never_misreads_timestamps_or_exemplars() -> None:
    # the first line teaches the cache the head 'cache_probe{a="1"}'; later lines share it
    text = "\n".join([
        'cache_probe{a="1"} 1',
        'cache_probe{a="1"} 2 1700000000000',
        'cache_probe{a="1"} 3 # {trace_id="x"} 9',
        'cache_probe{a="1"} 4',
        'cache_probe{a="1"}  5',
        'cache_probe{a="1"} bad',
    ])
    for _ in range(2):  # cold and warm cache give the same answer
        # one series per parse: written twice in one body, a series is left out
        parsed = [parse(line) for line in text.split("\n")]
        assert [(s.value, s.timestamp) for expo in parsed for s in expo.samples] == [
            (1.0, None), (2.0, 1700000000000.0), (3.0, None), (4.0, None), (5.0, None)]
        assert [len(expo.errors) for expo in parsed] == [0, 0, 0, 0, 0, 1]


def test_help_unescaping_survives_any_character() -> None:
    # found by the round-trip property: a NUL in HELP text once stood in for a backslash
    expo = parse('# HELP a \x00\\\\ and \\n and \\x\na 1\n')
    assert expo.helps["a"] == "\x00\\ and \n and \\x"


SETTINGS = settings(max_examples=examples(250), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


FRAGMENTS = st.sampled_from([
    "m", "vllm:kv_cache_usage_perc", "_total", "_bucket", "a", "le", "9x", "é", "东",
    "{", "}", "{}", '"', "\\", '\\"', "\\n", "\\\\", "=", ",", " ", "\t", "#", "# ", "# HELP ",
    "# TYPE ", " counter", " gauge", " histogram", "# EOF", "\n", "\r", "\r\n", "1", "-2.5",
    "1e9", "NaN", "+Inf", "-Inf", "1_0", "0x1", ".", "+", "-", "1712345678901",
])


SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount")


EXPOSITION_LIKE = st.lists(FRAGMENTS, max_size=60).map("".join)


def sample_lines(text: str) -> set[int]:
    """1-based numbers of the lines that may hold a sample: not blank, not a comment."""
    numbers = set()
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r").strip()
        if line and not line.startswith("#"):
            numbers.add(number)
    return numbers


def check_never_raises(text: str) -> None:
    expo = parse(text)
    candidates = sample_lines(text)
    sample_errors = [e for e in expo.errors if e.line_no in candidates]
    assert len(expo.samples) + len(sample_errors) <= len(candidates)
    lines = text.split("\n")
    for error in expo.errors:  # comment errors (bad TYPE, duplicates) point at real lines too
        assert 1 <= error.line_no <= len(lines)
        assert lines[error.line_no - 1].strip()
        assert isinstance(error.reason, str) and error.reason
    assert len({e.line_no for e in expo.errors}) == len(expo.errors)  # one report per line
    for sample in expo.samples:
        assert isinstance(sample.value, float)
        assert sample.timestamp is None or math.isfinite(sample.timestamp)
    kept = parse(text, keep=["m", "m_total", "a"])
    assert [(s.name, s.labels) for s in kept.samples] == [
        (s.name, s.labels) for s in expo.samples if s.name in ("m", "m_total", "a")
    ]
    # the keep path (a regex over wanted lines, or line by line for rare forms) reads the
    # same lines the same way: its reports are some of the full parse's, at the same lines
    reports = {(e.line_no, e.reason) for e in expo.errors}
    assert {(e.line_no, e.reason) for e in kept.errors} <= reports
    assert kept.types == {n: t for n, t in expo.types.items() if n in ("m", "m_total", "a")}
    assert kept.helps == {n: h for n, h in expo.helps.items() if n in ("m", "m_total", "a")}


@SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_unicode_never_raises(text: str) -> None:
    check_never_raises(text)


@SETTINGS
@given(EXPOSITION_LIKE)
def test_exposition_like_fragments_never_raise(text: str) -> None:
    check_never_raises(text)


@SETTINGS
@given(st.lists(st.sampled_from([EXPOSITION_LIKE, st.text(max_size=20)]).flatmap(lambda s: s),
                max_size=10).map("\n".join))
def test_mixed_lines_never_raise(text: str) -> None:
    check_never_raises(text)


NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:"


NAME_REST = NAME_START + "0123456789"


LABEL_START = NAME_START.replace(":", "")


LABEL_REST = LABEL_START + "0123456789"


metric_names = st.builds(lambda a, b: a + b, st.sampled_from(NAME_START),
                         st.text(NAME_REST, max_size=12))


label_names = st.builds(lambda a, b: a + b, st.sampled_from(LABEL_START),
                        st.text(LABEL_REST, max_size=8))


# any character at all, with the ones that need escaping made likely
label_values = st.text(st.one_of(st.characters(), st.sampled_from('"\\\n}{,#= \t\r')),
                       max_size=15)


help_texts = st.text(st.one_of(st.characters(exclude_characters="\n\r"),
                               st.sampled_from('\\\n"#')), max_size=30)


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 2.2250738585072014e-308, 1e-300]),
    st.integers(-(2**53), 2**53).map(float),
)


timestamps = st.one_of(st.none(), st.integers(0, 2**45).map(float),
                       st.floats(0, 2e9, allow_nan=False))


label_sets = st.dictionaries(label_names, label_values, max_size=4)


TYPES = ["counter", "gauge", "histogram", "summary", "untyped"]


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def render_sample(name, labels, value, timestamp, style) -> str:
    sep, space_before_brace, trailing_comma = style
    body = sep.join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
    if labels and trailing_comma:
        body += ","
    label_block = f"{' ' if space_before_brace else ''}{{{body}}}" if labels else ""
    line = f"{name}{label_block} {render_value(value)}"
    if timestamp is not None:
        line += f" {render_value(timestamp)}"
    return line


families = st.lists(
    st.tuples(
        metric_names,
        st.sampled_from(TYPES),
        st.one_of(st.none(), help_texts),
        # one sample per series: a series written twice is an error (left out)
        st.lists(st.tuples(label_sets, values, timestamps), max_size=4,
                 unique_by=lambda s: frozenset(s[0].items())),
    ),
    max_size=5,
    unique_by=lambda f: f[0],
)


styles = st.tuples(st.sampled_from([",", ", "]), st.booleans(), st.booleans())


@SETTINGS
@given(families, styles, st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_valid_expositions_round_trip(fams, style, newline, eof) -> None:
    lines: list[str] = []
    expected: list[tuple[str, dict[str, str], float, float | None]] = []
    for name, typ, help_text, samples in fams:
        if help_text is not None:
            lines.append(f"# HELP {name} {escape_help(help_text)}")
        lines.append(f"# TYPE {name} {typ}")
        for labels, value, timestamp in samples:
            lines.append(render_sample(name, labels, value, timestamp, style))
            expected.append((name, labels, value, timestamp))
        lines.append("")
    if eof:
        lines.append("# EOF")
    text = newline.join(lines) + newline

    expo = parse(text)

    assert expo.errors == []
    got = [(s.name, s.labels, s.value, s.timestamp) for s in expo.samples]
    assert len(got) == len(expected)
    for (name, labels, value, ts), (ename, elabels, evalue, ets) in zip(got, expected,
                                                                        strict=True):
        assert (name, labels, ts) == (ename, elabels, ets)
        assert (math.isnan(value) and math.isnan(evalue)) or value == evalue
    assert expo.types == {name: typ for name, typ, _, _ in fams}
    assert expo.helps == {name: h.strip(" \t") for name, _, h, _ in fams if h is not None}

    wanted = [name for name, *_ in fams][::2]
    kept = parse(text, keep=wanted)
    assert kept.errors == []
    assert [(s.name, s.labels) for s in kept.samples] == [
        (n, labels) for n, labels, _, _ in expected if n in wanted
    ]
    # a wanted "x_total" also reads the TYPE of family "x" (how counters are declared)
    families = set(wanted) | {n[: -len(sfx)] for n in wanted for sfx in SUFFIXES
                              if n.endswith(sfx)}
    assert kept.types == {n: t for n, t in expo.types.items() if n in families}


utf8_names = st.one_of(metric_names, st.text(st.one_of(st.characters(exclude_categories=["Cs"]),
                                                       st.sampled_from('"\\{} .')),
                                             min_size=1, max_size=10))


@SETTINGS
@given(st.lists(st.tuples(utf8_names, label_sets, values), max_size=6,
                unique_by=lambda r: (r[0], frozenset(r[1].items()))))
def test_samples_written_as_text_parse_back(rows) -> None:
    """What a reader hands on as samples (Prometheus's API) is written to snapshot files and
    recordings with to_text; kvtop must read those files back to the same samples."""
    samples = [Sample(name, labels, value) for name, labels, value in rows]
    back = parse(to_text(Exposition(samples)))
    assert back.errors == []
    assert [(s.name, s.labels) for s in back.samples] == [(s.name, s.labels) for s in samples]
    for got, want in zip(back.samples, samples, strict=True):
        assert (math.isnan(got.value) and math.isnan(want.value)) or got.value == want.value


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


def test_a_narrowed_read_keeps_only_the_families_of_the_names_it_keeps() -> None:
    # "re", "requ" are "requests" cut by a suffix's length, but "requests" has no suffix:
    # their HELP/TYPE belong to other families, not to the one kept
    body = ("# TYPE re gauge\nre 1\n# TYPE requ gauge\n# HELP requ Other.\nrequ 2\n"
            "# TYPE requests gauge\nrequests 3\n# TYPE tokens counter\ntokens_total 4\n")
    expo = parse(body, keep={"requests", "tokens_total"})
    assert expo.types == {"requests": "gauge", "tokens": "counter"}
    assert expo.helps == {}


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_a_help_or_type_line_over_the_line_limit_is_reported_and_skipped(keep) -> None:
    at_limit = "# HELP g " + "x" * (MAX_LINE_CHARS - len("# HELP g "))
    expo = parse(f"{at_limit}\ng 1\n", keep=keep)
    assert expo.errors == [] and expo.helps["g"] == "x" * (MAX_LINE_CHARS - 9)
    over = "# TYPE g gauge" + " " * (MAX_LINE_CHARS - 13)
    expo = parse(f"{over}\ng 1\n", keep=keep)
    assert [(e.line_no, e.reason) for e in expo.errors] == [
        (1, f"line of {MAX_LINE_CHARS + 1:,} characters (the limit is {MAX_LINE_CHARS:,})")]
    assert expo.types == {} and [s.value for s in expo.samples] == [1.0]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_bad_help_and_type_lines_are_named_with_the_servers_text_cut_short(keep) -> None:
    # the reason quotes at most 40 characters of a type and 60 of a name: a hostile server
    # cannot flood the error list through them
    kind = "k" * 100
    body = (f"# TYPE g {kind}\n# TYPE g gauge\n# TYPE g counter\n"
            f"# HELP g One.\n# HELP g Two.\ng 1\n")
    expo = parse(body, keep=keep)
    assert [e.reason for e in expo.errors] == [
        f"unknown type {kind[:40]!r}", "duplicate TYPE for g", "duplicate HELP for g"]
    long = "n" * 100
    body = f"# TYPE {long} gauge\n# TYPE {long} gauge\n# HELP {long} a\n# HELP {long} b\n"
    expo = parse(body + f"{long} 1\n", keep=None if keep is None else {long})
    assert [e.reason for e in expo.errors] == [f"duplicate TYPE for {long[:60]}",
                                               f"duplicate HELP for {long[:60]}"]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("ending", ["X", "XX", "\u00a0", "\u2003", "\\\\"])
def test_help_text_keeps_its_last_characters_but_blanks_and_tabs(ending: str,
                                                                 newline: str) -> None:
    for keep in (None, {"g"}):
        for blanks in ("", " \t"):
            expo = parse(f"# HELP g Queue{ending}{blanks}{newline}g 1{newline}", keep=keep)
            assert expo.helps["g"] == "Queue" + ending.replace("\\\\", "\\")


@pytest.mark.parametrize("keep", [None, {"a", "b", "c"}])
def test_a_narrowed_read_ends_at_the_exact_eof_line_like_a_full_read(keep) -> None:
    body = "a 1\n# EOFX is a comment\n# EOF of nothing\nb 2\n# EOF \r\nc 3\n"
    expo = parse(body, keep=keep)
    assert [(s.name, s.value) for s in expo.samples] == [("a", 1.0), ("b", 2.0)]
    assert expo.errors == []


def test_a_type_is_read_whatever_its_case() -> None:
    for keep in (None, {"g", "c_total"}):
        expo = parse("# TYPE g GAUGE\ng 1\n# TYPE c Counter\nc_total 2\n", keep=keep)
        assert expo.errors == [] and expo.types == {"g": "gauge", "c": "counter"}


def test_a_narrowed_read_of_more_lines_than_one_server_sends_is_refused() -> None:
    def body(count: int) -> str:
        return "".join(f'g{{i="{i}"}} 1\n' for i in range(count)) + "other 2\n"

    expo = parse(body(MAX_WANTED_LINES), keep={"g"})
    assert expo.refused is None and len(expo.samples) == MAX_WANTED_LINES
    expo = parse(body(MAX_WANTED_LINES + 1), keep={"g"})
    assert expo.refused == (f"{MAX_WANTED_LINES + 1:,} lines of metrics kvtop reads; more "
                            f"than {MAX_WANTED_LINES:,} is not one server's")
    assert expo.samples == []


@pytest.mark.parametrize("keep", [None, {"g", "h"}])
def test_every_scrape_of_a_server_reads_the_same_as_its_first(keep) -> None:
    # a monitor parses the same lines every scrape (the second time through what it learnt
    # from the first): a series written twice is left out and named each time, a bad value
    # on a known series is named too, and the rest is read as written
    body = 'g{x="1"} 1\ng{x="2"} 2\ng{x="1"} 3\nh 4\nh five\ng{x="3"} 6\n'
    reads = [parse(body, keep=keep) for _ in range(3)]
    for expo in reads:
        assert [(s.labels, s.value) for s in expo.samples] == [({"x": "2"}, 2.0), ({}, 4.0),
                                                               ({"x": "3"}, 6.0)]
        assert [(e.line_no, e.reason) for e in expo.errors] == [
            (3, "series written twice: every copy left out"), (5, "bad value 'five'")]


def test_label_values_holding_a_nul_read_back_as_written() -> None:
    samples = [Sample("g", {"v": 'a\0"b\\c\nd'}, 1.0), Sample("g", {"v": "\0\\n"}, 2.0)]
    for keep in (None, {"g"}):
        again = parse(to_text(Exposition(samples=samples)), keep=keep)
        assert again.errors == [] and [s.labels for s in again.samples] == [
            s.labels for s in samples]


def test_past_the_error_limit_a_narrowed_read_is_refused_too() -> None:
    # "first bad line" is not a line it reads: the first of the malformed g lines is
    body = "g 1\nfirst bad line\n" + "g{ 1\n" * (MAX_ERRORS + 1)
    expo = parse(body, keep={"g"})
    assert expo.samples == [] and expo.refused is not None
    assert expo.refused.startswith(f"more than {MAX_ERRORS:,} malformed lines (the first, "
                                   "line 3: ")


def test_a_quoted_name_is_read_with_labels_of_any_name() -> None:
    for keep in (None, {"my.metric"}):
        expo = parse('{"my.metric", Xfer="1",X="2", \tx="3"} 1\n', keep=keep)
        assert expo.errors == []
        assert [(s.name, s.labels) for s in expo.samples] == [
            ("my.metric", {"Xfer": "1", "X": "2", "x": "3"})]


@pytest.mark.parametrize(("line", "reason"), [
    ('g{a="1" b="2"} 1', "expected ',' or '}' in label set"),
    ('g{a="1"', "expected ',' or '}' in label set"),
    ('g{a="1",,} 1', "malformed label set"),
    ("g{=} 1", "malformed label set"),
    ("g{a} 1", "label 'a' has no value"),
    ('{"a.b", "c.d"} 1', "label 'c.d' has no value"),
    ('{a="1", "b.c"} 1', "label 'b.c' has no value"),
    ('g{a="1",a="2"} 1', "duplicate label 'a'"),
])
def test_a_malformed_label_set_is_named_by_what_is_wrong_with_it(line: str, reason: str) -> None:
    for keep in (None, {"g", "a.b"}):
        expo = parse(f"{line}\ng 5\n", keep=keep)
        assert [(e.line_no, e.reason) for e in expo.errors] == [(1, reason)]
        assert [(s.name, s.value) for s in expo.samples] == [("g", 5.0)]


def test_a_quoted_name_alone_in_its_braces_is_read_with_its_value() -> None:
    for keep in (None, {"a.b"}):
        expo = parse('{"a.b"} 12\n{"a.b", x="y"} 34\n{"a.b", x="z"}56\n', keep=keep)
        assert [(s.name, s.labels, s.value) for s in expo.samples] == [
            ("a.b", {}, 12.0), ("a.b", {"x": "y"}, 34.0), ("a.b", {"x": "z"}, 56.0)]


@pytest.mark.parametrize("keep", [None, {"g", "h"}])
def test_a_series_written_twice_is_found_whatever_the_order_of_its_labels(keep) -> None:
    body = 'g{a="1",b="2"} 1\nh 2\ng{a="2",b="2"} 3\ng{b="2",a="1"} 4\n'
    expo = parse(body, keep=keep)
    assert [(s.name, s.value) for s in expo.samples] == [("h", 2.0), ("g", 3.0)]
    assert [(e.line_no, e.reason) for e in expo.errors] == [
        (4, "series written twice: every copy left out")]


@pytest.mark.parametrize(("value", "quoted"), [
    ("1_000", "'1_000'"), ("\u0661", "'\u0661'"), ("x" * 50, repr("x" * 40)),
    ("1_" + "0" * 50, repr("1_" + "0" * 38)),
])
def test_a_bad_value_is_quoted_in_the_reason_cut_to_forty_characters(value: str,
                                                                      quoted: str) -> None:
    for keep in (None, {"g"}):
        expo = parse(f"g {value}\n", keep=keep)
        assert [e.reason for e in expo.errors] == [f"bad value {quoted}"]


@pytest.mark.parametrize("space", ["\u00a0", "\x0b", "\x0c", "\u2003"])
def test_only_blanks_and_tabs_indent_a_line(space: str) -> None:
    # any other space character is part of what follows: a name no server can mean
    expo = parse(f" \tg 1\n{space}g 2\n")
    assert [(s.name, s.value) for s in expo.samples] == [("g", 1.0)]
    assert [(e.line_no, e.reason) for e in expo.errors] == [(2, f"bad metric name {space + 'g'!r}")]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_text_between_a_name_and_its_labels_is_malformed(keep) -> None:
    expo = parse('g X{a="1"} 1\ng \t{a="2"} 2\n', keep=keep)
    assert [(s.labels, s.value) for s in expo.samples] == [({"a": "2"}, 2.0)]
    assert [e.line_no for e in expo.errors] == [1]


def test_the_first_scrapes_of_a_fresh_process_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # series numbers start at 0 in a new process, like the positions of the samples read:
    # the second read (through the heads learnt from the first) must not mix them up
    monkeypatch.setattr(exposition, "_next_series_id", itertools.count())
    monkeypatch.setattr(exposition, "_series_ids", {})
    monkeypatch.setattr(exposition, "_sample_heads", exposition.BoundedCache(100, 10_000))
    body = 'a 1\nb{x="1"} 2\nc 3\n'
    for _ in range(2):
        expo = parse(body, keep={"a", "b", "c"})
        assert expo.errors == [] and [s.value for s in expo.samples] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_a_sample_line_over_the_line_limit_is_reported_and_skipped(keep) -> None:
    def line(length: int, value: int) -> str:
        head = 'g{v="'
        return head + "x" * (length - len(head) - len(f'"}} {value}')) + f'"}} {value}'

    expo = parse(f"{line(MAX_LINE_CHARS, 1)}\n{line(MAX_LINE_CHARS + 1, 2)}\ng 3\n", keep=keep)
    assert [s.value for s in expo.samples] == [1.0, 3.0]
    assert [(e.line_no, e.reason) for e in expo.errors] == [
        (2, f"line of {MAX_LINE_CHARS + 1:,} characters (the limit is {MAX_LINE_CHARS:,})")]


@pytest.mark.parametrize(("line", "reason"), [
    ('g{"h"} 1', "metric name given twice"),
    ("9g 1", "bad metric name '9g'"),
    ("9" + "x" * 100 + " 1", f"bad metric name {'9' + 'x' * 59!r}"),
])
def test_a_bad_metric_name_is_named_in_the_reason(line: str, reason: str) -> None:
    expo = parse(f"{line}\ng 5\n")
    assert [(e.line_no, e.reason) for e in expo.errors] == [(1, reason)]
    assert [s.value for s in expo.samples] == [5.0]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_values_and_timestamps_are_read_between_any_blanks(keep) -> None:
    body = 'g{a="1"} 1\t1700000000\ng{a="2"}\t2\ng{a="3"}3\ng{a="4"}  4  \n'
    expo = parse(body, keep=keep)
    assert expo.errors == []
    assert [(s.labels["a"], s.value, s.timestamp) for s in expo.samples] == [
        ("1", 1.0, 1700000000.0), ("2", 2.0, None), ("3", 3.0, None), ("4", 4.0, None)]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_a_line_without_a_value_or_with_too_many_is_named_so(keep) -> None:
    expo = parse('g\ng{a="1"}\ng 1 2 3\ng 4\n', keep=keep)
    assert [(e.line_no, e.reason) for e in expo.errors] == [
        (n, "expected a value and an optional timestamp") for n in (1, 2, 3)]
    assert [s.value for s in expo.samples] == [4.0]


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_a_body_of_more_lines_than_a_server_can_send_is_refused_unread(keep) -> None:
    expo = parse("\n" * (MAX_LINES - 1) + "g 1", keep=keep)
    assert expo.refused is None and [s.value for s in expo.samples] == [1.0]
    expo = parse("\n" * MAX_LINES, keep=keep)
    assert expo.refused == (f"{MAX_LINES + 1:,} lines: more than the {MAX_LINES:,} of a "
                            "server with kvtop's limit of engines")
    assert expo.samples == [] and expo.errors == []


@pytest.mark.parametrize("keep", [None, {"g"}])
def test_a_timestamp_that_is_not_a_finite_number_is_named_so(keep) -> None:
    expo = parse("g 1 NaN\ng 2 +Inf\ng 3 1700000000\n", keep=keep)
    assert [(e.line_no, e.reason) for e in expo.errors] == [
        (1, "timestamp is not finite"), (2, "timestamp is not finite")]
    assert [s.value for s in expo.samples] == [3.0]


def documented_body_limits() -> dict[str, int]:
    """docs/security.md, "Limits on one body": `| limit | value | past it |`."""
    text = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    table = text[text.index("**Limits on one body**"):]
    limits = {}
    for row in table.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        value = cells[1].split()[0].replace(",", "") if len(cells) == 3 else ""
        if row.startswith("| ") and value.isdigit():
            limits[cells[0]] = int(value)
        elif limits and not row.startswith("|"):
            break
    return limits


def test_the_body_limits_are_the_ones_the_security_notes_give() -> None:
    # the tests above check the parser at each limit; this pins each limit to what
    # docs/security.md promises an operator
    limits = documented_body_limits()
    assert (limits["lines in a body"], limits["lines kvtop reads"], limits["malformed lines"],
            limits["characters in a line kvtop reads"]) == (
        MAX_LINES, MAX_WANTED_LINES, MAX_ERRORS, MAX_LINE_CHARS)


def test_the_parser_caches_are_the_size_the_security_notes_give() -> None:
    # docs/security.md, "Memory": what a hostile server can pin in the parser's caches
    text = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if line.startswith("| parser caches")]
    assert f"{exposition._MAX_CACHED_LABEL_BLOCKS:,} entries" in row
    assert f"{exposition._MAX_CACHED_KEY_CHARS / 2**20:g} MiB of key text" in row
    assert f"at most {exposition._MAX_CACHED_COMMENT_CHARS / 2**10:g} KiB" in row
    assert f"heads over {exposition._MAX_CACHED_HEAD_CHARS / 2**10:g} KiB are never cached" in row


@pytest.mark.parametrize("keep", [None, frozenset({"a"})])
def test_openmetrics_points_of_one_series_at_several_times_are_read_the_newest(
        keep: frozenset[str] | None) -> None:
    """Valid OpenMetrics (its duplicate_timestamps cases): read as the series written twice
    and, past the error cap, the whole body was refused."""
    text = ("# TYPE a gauge\na{x=\"1\"} 1 10\na{x=\"1\"} 3 30\na{x=\"1\"} 2 20\n"
            "a{x=\"2\"} 5 1\na{x=\"2\"} 6 1\n# EOF\n")
    expo = parse(text, keep=keep)
    assert [(s.labels["x"], s.value, s.timestamp) for s in expo.samples] == [
        ("1", 3.0, 30.0), ("2", 6.0, 1.0)]  # the same time twice: the later line
    assert expo.errors == [] and expo.refused is None
    mixed = parse("a 1 10\na 2\n", keep=keep)  # one copy without a time: which is true?
    assert mixed.samples == [] and [e.reason for e in mixed.errors] == [
        "series written twice: every copy left out"]
    many = "".join(f"a{{x=\"{i % 2}\"}} {i} {i}\n" for i in range(3000))
    assert parse(many, keep=keep).refused is None


def test_a_series_written_twice_is_seen_after_the_series_ids_were_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The map of series ids is emptied when full; a head stored before then named its
    series by an old id, and a timestamped copy (read in full) by a new one: both kept."""
    monkeypatch.setattr(exposition, "_MAX_CACHED_LABEL_BLOCKS", 4)
    exposition._series_ids.clear()
    exposition._sample_heads.clear()
    parse("a 1\n")  # the head "a" is stored with its id
    parse("b 1\nc 1\nd 1\ne 1\n")  # the ids are forgotten past 4 series
    mixed = parse("a 1 10\na 2\n")
    assert mixed.samples == [] and [e.reason for e in mixed.errors] == [
        "series written twice: every copy left out"]
