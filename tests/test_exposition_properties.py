"""Property tests of the exposition parser: it never raises, and valid text round-trips."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.collect.exposition import Exposition, Sample, parse, to_text
from tests.mutation_run import examples

SETTINGS = settings(max_examples=examples(250), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# --- (a) any text: parses or reports, never raises ------------------------------------------

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


# --- (b) round trip -------------------------------------------------------------------------

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


# --- (c) samples written out read back -------------------------------------------------------

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
