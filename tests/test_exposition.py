"""Unit tests of the Prometheus / OpenMetrics text parser (kvtop.collect.exposition)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.collect import exposition
from kvtop.collect.exposition import Exposition, parse
from tests.paths import FIXTURES

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


# --- basic lines -----------------------------------------------------------------------


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


# --- malformed lines -------------------------------------------------------------------


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


# --- keep= -----------------------------------------------------------------------------

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


# --- label-block cache ----------------------------------------------------------------


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


# --- real scrapes ----------------------------------------------------------------------


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
