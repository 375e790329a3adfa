"""PromQL built by one set of functions: values written as PromQL strings, regexes of
literal values escaped (the real Prometheus reads them back in tests/prometheus)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtop.collect.prometheus.promql import (
    duration,
    literal_regex,
    matcher,
    one_of,
    string,
    vector_selector,
)


@pytest.mark.parametrize(("value", "written"), [
    ("prod", '"prod"'),
    ('bad"job', '"bad\\"job"'),
    ("back\\slash", '"back\\\\slash"'),
    ("new\nline\r\t", '"new\\nline\\r\\t"'),
    ("bell\x07\x1b\x7f", '"bell\\a\\x1b\\x7f"'),
    ("模型 ²", '"模型 ²"'),  # sent as UTF-8, as Prometheus reads it
])
def test_a_value_is_a_promql_string(value: str, written: str) -> None:
    assert string(value) == written


@given(st.text())
def test_a_written_string_never_ends_early_or_spans_lines(value: str) -> None:
    inner = string(value)[1:-1]
    assert "\n" not in inner and "\r" not in inner
    assert re.fullmatch(r'(?:[^"\\]|\\.)*', inner, re.DOTALL)  # every quote escaped


@given(st.text().filter(lambda v: "\x00" not in v))
def test_a_literal_regex_matches_exactly_its_value(value: str) -> None:
    """Python's re reads RE2's escapes of punctuation the same way."""
    assert re.fullmatch(literal_regex(value), value, re.DOTALL)
    assert not re.fullmatch(literal_regex(value), value + "x", re.DOTALL)


def test_matchers_and_alternatives() -> None:
    assert matcher("namespace", "=", 'a"b') == 'namespace="a\\"b"'
    assert one_of("job", ["b.c", "a", "a"]) == 'job=~"a|b\\\\.c"'
    assert vector_selector(["vllm:x", "up"], '{namespace="p"}') == (
        '{__name__=~"up|vllm:x", namespace="p"}')
    assert duration(1.2345) == "1234ms" and duration(0) == "1ms"
    with pytest.raises(ValueError, match="operator"):
        matcher("job", "==", "x")


@pytest.mark.parametrize("op", ["=", "!=", "=~", "!~"])
def test_every_promql_matcher_operator_is_written(op: str) -> None:
    assert matcher("job", op, "x") == f'job{op}"x"'
