"""The parser as its readers rely on it: samples written back as text (a recording of a
Prometheus answer) read again as the same samples, in the spellings Prometheus uses; a
narrowed read keeps the HELP and TYPE of the families it keeps; HELP lines of any length."""

from __future__ import annotations

import itertools
import math

import pytest

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
from tests.paths import REPO


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
