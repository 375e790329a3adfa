"""Property-based fuzzing of what reads outside data: the exposition parser, the adapters
(and the tracker after them), and the Prometheus-answer reader. Whatever they are given,
no exception escapes; the results are the documented ones."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.collect import exposition
from kvtop.collect.adapters import WANTED, adapt
from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.adapters.plausible import COUNTERS, COUNTS, FRACTIONS, MAX_VALUE
from kvtop.collect.exposition import Exposition, Sample, parse
from kvtop.collect.prometheus import (
    PrometheusAPI,
    PrometheusError,
    group_scrapes,
    load_settings,
    series_points,
)
from kvtop.collect.prometheus.answers import last_errors
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = sorted(WANTED)

# --- the parser ---------------------------------------------------------------------------------

WEIRD = ["", "inf", "+Inf", "-Inf", "NaN", "nan", "1e308", "-1e308", "1e999", "-1", "0", "²",
         "١", "9" * 5000, "True", "None", "0x10", "1_000", "\\", '\\"', "\\n", "é", "\u202e",
         "\x1b[2J", "}", "{", ",", "="]
label_names = st.sampled_from(["model_name", "engine", "le", "finished_reason", "model",
                               "kv_cache_block_type", "request_type", "dp_rank", "num_gpu_blocks",
                               "block_size", "kv_cache_size_tokens", "enable_prefix_caching",
                               "9bad", "__name__", ""])
label_values = st.one_of(st.sampled_from(WEIRD), st.text(max_size=8))
values = st.one_of(st.sampled_from(["1", "0.5", "-3", "NaN", "+Inf", "-Inf", "1e308", "1e999",
                                    "x", "1_0", "", "1 2", "1 2 3", "1 # {a=\"b\"} 2"]),
                   st.floats().map(repr))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def lines(draw: st.DrawFn) -> str:
    name = draw(st.one_of(st.sampled_from(NAMES), st.sampled_from(["m", "{", '"q"', "# EOF"])))
    pairs = draw(st.lists(st.tuples(label_names, label_values), max_size=4))
    escape = draw(st.booleans())
    block = ",".join(f'{k}="{_escape(v) if escape else v}"' for k, v in pairs)
    head = f"{name}{{{block}}}" if pairs or draw(st.booleans()) else name
    kind = draw(st.sampled_from(["sample", "sample", "sample", "help", "type", "junk"]))
    if kind == "help":
        return f"# HELP {name} {draw(st.sampled_from(WEIRD))}"
    if kind == "type":
        return f"# TYPE {name} {draw(st.sampled_from(['gauge', 'counter', 'histogram', 'x']))}"
    if kind == "junk":
        return draw(st.text(max_size=30))
    return f"{head}{draw(st.sampled_from([' ', '  ', chr(9)]))}{draw(values)}"


bodies = st.lists(lines(), max_size=40).map("\n".join)


def check_parse(expo: Exposition, text: str) -> None:
    assert expo.refused is None  # small bodies are never over a limit
    number_of_lines = text.count("\n") + 1
    assert len({e.line_no for e in expo.errors}) == len(expo.errors)
    for error in expo.errors:
        assert 1 <= error.line_no <= number_of_lines and error.reason
        assert len(error.text) <= exposition.ERROR_TEXT_CHARS
    keys = [(s.name, frozenset(s.labels.items())) for s in expo.samples]
    assert len(set(keys)) == len(keys)  # a series written twice is left out
    assert all(isinstance(s.value, float) for s in expo.samples)


@SETTINGS
@given(bodies)
def test_the_parser_reads_any_body_without_raising(text: str) -> None:
    check_parse(parse(text), text)
    kept = parse(text, keep=WANTED)
    check_parse(kept, text)
    assert all(s.name in WANTED for s in kept.samples)


@contextmanager
def without_the_plain_block_regex():
    saved = exposition._PLAIN_BLOCK_RE
    exposition._PLAIN_BLOCK_RE = exposition.re.compile(r"(?!)")
    try:
        yield
    finally:
        exposition._PLAIN_BLOCK_RE = saved


@SETTINGS
@given(st.lists(st.one_of(st.sampled_from(['a="1"', "b = \"x\\\"y\"", ",", " ", "\t", "\x0b",
                                           '"q"', "a", "=", '"', "\\", "}", 'a="1",a="2"']),
                          st.text(max_size=4)), max_size=8).map("".join))
def test_the_whole_block_regex_reads_a_label_block_as_the_loop_does(inner: str) -> None:
    line = "{" + inner + "} 1"

    def read() -> Any:
        try:
            return exposition._parse_label_block(line, 0)
        except ValueError:
            return "error"

    fast = read()
    with without_the_plain_block_regex():
        assert read() == fast


ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@SETTINGS
@given(st.text(st.sampled_from('\\"n\x00ax'), max_size=30))
def test_escapes_are_read_as_a_left_to_right_scan_reads_them(value: str) -> None:
    """The reference: one regex scan, each escape replaced where it is found."""
    scanned = exposition.re.sub(r'\\[\\"n]', lambda m: ESCAPES[m.group(0)], value)
    assert exposition._unescape(value) == scanned
    help_scanned = exposition.re.sub(r"\\[\\n]", lambda m: ESCAPES[m.group(0)], value)
    assert exposition.unescape_help(value) == help_scanned


# --- the adapters, and a tracker after them ----------------------------------------------------

sample_values = st.one_of(
    st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1.0, 0.0, 1.7, 2.0**60]))


@st.composite
def expositions(draw: st.DrawFn) -> Exposition:
    """Samples of the names the adapters read, most of them for a few engines (so the
    adapters get past "no engines"), with odd labels and values mixed in."""
    engine_labels = st.fixed_dictionaries({
        "model_name": st.sampled_from(["m", "²", "", "9" * 5000]),
        "engine": st.sampled_from(["0", "1", "²", "9" * 5000]),
        "model": st.sampled_from(["m", "t"])})
    samples = draw(st.lists(st.builds(
        lambda name, engine, extra, value: Sample(name, {**engine, **extra}, value),
        st.sampled_from(NAMES), engine_labels,
        st.dictionaries(label_names, label_values, max_size=3), sample_values), max_size=30))
    return Exposition(samples)


def check_reading(expo: Exposition) -> None:
    reading = adapt(expo, version=None)
    if reading.refused is not None:
        assert isinstance(reading.refused, str) and reading.engines == []
        return
    assert len(reading.engines) <= MAX_ENGINES
    for engine in reading.engines:
        for name in FRACTIONS:
            value = getattr(engine, name)
            assert value is None or -1e-6 <= value <= 1 + 1e-6
        for name in COUNTS + COUNTERS:
            value = getattr(engine, name)
            assert value is None or 0 <= value <= MAX_VALUE
        for histogram in (engine.ttft, engine.itl, engine.e2e):
            counts = [count for _, count in histogram.buckets] if histogram else []
            assert counts == sorted(counts)


@SETTINGS
@given(expositions(), st.sampled_from([None, "0.33.0", "0.7.3", "garbage", "9" * 400]))
def test_the_adapters_read_any_samples_without_raising(expo: Exposition, version: Any) -> None:
    check_reading(expo)
    adapt(expo, version=version)


@settings(SETTINGS, max_examples=100)  # each example builds trackers and detectors
@given(st.lists(expositions(), min_size=1, max_size=4))
def test_a_tracker_folds_any_sequence_of_readings(expos: list[Exposition]) -> None:
    target = Target("http://127.0.0.1:9/metrics")
    tracker = TargetTracker(target)
    for n, expo in enumerate(expos):
        state = tracker.update(read_scrape(Scrape(target, 1000.0 + n, samples=expo)))
        assert state.status in ("up", "bad_payload", "stale")
        assert len(state.engines) <= MAX_ENGINES


@SETTINGS
@given(bodies)
def test_a_body_goes_through_parser_adapters_and_tracker(text: str) -> None:
    target = Target("http://127.0.0.1:9/metrics")
    tracker = TargetTracker(target)
    for t in (1000.0, 1001.0):
        state = tracker.update(read_scrape(Scrape(target, t, body=text)))
        assert state.status in ("up", "bad_payload", "stale")


# --- the Prometheus-answer reader ---------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=20)
labels = st.dictionaries(st.sampled_from(["__name__", "job", "instance", "model_name", "engine"]),
                         st.one_of(st.sampled_from(NAMES), st.text(max_size=4), json_values),
                         max_size=5)
good_points = st.lists(st.tuples(st.floats(0, 2e9), st.sampled_from(["1", "0.5", "NaN", "x"]))
                       .map(list), min_size=1, max_size=3)
good_labels = st.fixed_dictionaries({"__name__": st.sampled_from(NAMES),
                                     "job": st.sampled_from(["j", ""]),
                                     "instance": st.sampled_from(["a:1", "b:1"]),
                                     "model_name": st.just("m"), "engine": st.just("0")})
points = st.one_of(good_points, st.lists(st.one_of(
    st.tuples(st.one_of(st.floats(), st.integers(), json_values), json_values).map(list),
    json_values), max_size=4))
almost_series = st.one_of(
    st.fixed_dictionaries({"metric": good_labels, "values": good_points}),  # as Prometheus
    json_values,
    st.fixed_dictionaries({}, optional={
        "metric": st.one_of(good_labels, labels, json_values),
        "values": st.one_of(points, json_values),
        "value": st.one_of(points.map(lambda p: p[0] if p else p), json_values)}))
results = st.one_of(json_values, st.lists(almost_series, max_size=6))


@SETTINGS
@given(results)
def test_the_prometheus_reader_reads_any_answer_or_says_why_not(result: Any) -> None:
    try:
        grouped = group_scrapes(result)
    except PrometheusError as exc:
        assert exc.kind == "bad_payload" and str(exc).startswith("not a Prometheus query answer")
        return
    for (job, instance), per_t in grouped.items():
        assert isinstance(job, str) and isinstance(instance, str)
        for t, samples in per_t.items():
            assert math.isfinite(t)
            assert all(isinstance(s.name, str) and isinstance(s.value, float) for s in samples)


@SETTINGS
@given(almost_series, st.sampled_from(["values", "value"]))
def test_a_series_is_read_or_refused(series: Any, key: str) -> None:
    try:
        metric, found = series_points(series, key)
    except PrometheusError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
    assert all(math.isfinite(t) for t, _ in found)


@SETTINGS
@given(json_values, st.integers(100, 599))
def test_any_api_payload_is_data_or_an_error(payload: Any, status: int) -> None:
    api = PrometheusAPI(load_settings("prom:9090"), timeout_s=1.0, insecure=False)
    try:
        api._data(status, payload)
    except PrometheusError as exc:
        assert exc.kind in ("auth", "bad_payload", "down")
    last_errors(payload, None)
    last_errors({"activeTargets": payload}, None)
