"""The baseline file (docs/baseline-format.md): every field written where the format says and
read back as written, the defaults of what an older or hand-made file leaves out, and
anything else (cut off, another format or version, wrong types, hostile values) refused
with a message naming the field, never a crash."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.baseline_eval.scenarios import HEALTHY, baseline
from kvtop.baseline.model import (
    MISSING,
    VERSION,
    Baseline,
    BaselineError,
    EngineSummary,
    Figure,
    GpuSummary,
    ProbeSummary,
    TargetSummary,
    baseline_from_json,
    loads,
)


@pytest.fixture(scope="module")
def sample() -> Baseline:
    return baseline(HEALTHY.but(minutes=4), "sample")


def test_a_baseline_reads_back_as_written(sample: Baseline) -> None:
    again = loads(sample.dumps())
    assert again.to_json() == sample.to_json()
    (_, engine), = again.engines()
    assert engine.figure("kv_usage").value == pytest.approx(
        sample.targets[0].engines[0].figure("kv_usage").value, abs=1e-6)
    assert len(engine.figure("kv_usage").values) == engine.minutes == 4
    assert engine.config["num_gpu_blocks"] == HEALTHY.blocks


def test_every_cut_of_the_file_is_refused_cleanly(sample: Baseline) -> None:
    text = sample.dumps()
    step = max(1, len(text) // 400)
    for cut in range(0, len(text) - 1, step):
        with pytest.raises(BaselineError):
            loads(text[:cut])


def test_another_format_or_a_newer_version_is_refused(sample: Baseline) -> None:
    doc = sample.to_json()
    with pytest.raises(BaselineError, match="newer than this kvtop reads"):
        baseline_from_json({**doc, "version": VERSION + 1})
    with pytest.raises(BaselineError, match="not a kvtop baseline"):
        baseline_from_json({**doc, "format": "kvtop-recording"})
    with pytest.raises(BaselineError, match="not a kvtop baseline"):
        baseline_from_json([doc])
    with pytest.raises(BaselineError, match="version"):
        baseline_from_json({**doc, "version": True})


@pytest.mark.parametrize(("path", "value", "message"), [
    (("targets",), "x", "targets: expected a list"),
    (("targets", 0, "engines", 0, "figures", "kv_usage", "per_minute"), ["1"],
     "per_minute: expected a list of numbers"),
    (("targets", 0, "engines", 0, "figures", "kv_usage", "value"), True, "expected a number"),
    (("targets", 0, "engines", 0, "config"), {"block_size": [16]}, "expected a plain value"),
    (("targets", 0, "engines", 0, "model"), 7, "model: expected text"),
    (("targets", 0, "engines", 0, "samples"), 1.5, "samples: expected a whole number"),
])
def test_a_wrong_type_names_the_field(sample: Baseline, path: tuple[Any, ...], value: Any,
                                      message: str) -> None:
    doc = json.loads(sample.dumps())
    holder = doc
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(BaselineError, match=message):
        baseline_from_json(doc)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=12)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_value_anywhere_is_read_or_refused(sample: Baseline, data: st.DataObject) -> None:
    """Replace one value anywhere in a real baseline by anything JSON can hold."""
    doc = json.loads(sample.dumps())
    holder: Any = doc
    while True:
        keys = list(holder) if isinstance(holder, dict) else list(range(len(holder)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if not isinstance(holder[key], (dict, list)) or data.draw(st.booleans()):
            holder[key] = data.draw(json_values)
            break
        holder = holder[key]
    try:
        read = baseline_from_json(doc)
    except BaselineError:
        return
    read.dumps()  # what was read can be written again and compared
    from kvtop.baseline.compare import ModelMismatch, compare

    with contextlib.suppress(ModelMismatch):
        compare(read, read)


# A baseline with every field set, none to its default, and the document it is written as.
FULL = Baseline(
    name="full", created="2026-12-05T06:00:00+00:00", kvtop_version="9.9",
    source={"kind": "live", "time_scale": 30.0}, interval_s=5.0, duration_s=180.12345,
    minute_s=30.0,
    targets=[TargetSummary(
        target="http://127.0.0.1:8000/metrics", kind="vllm", version="0.10.2+",
        version_inferred=True, scrapes=37, failed_scrapes=2,
        engines=[EngineSummary(
            model="m", engine="0", config={"num_gpu_blocks": 1000, "cache_dtype": "fp8",
                                           "prefix_caching": True, "utilization": 0.9},
            figures={"kv_usage": Figure(0.25, (0.2, 0.3), {"p5": 0.1, "max": None}),
                     "ttft_p99": Figure(None)},
            samples=36, minutes=2, duration_s=175.4996, leak="watch",
            leak_reason="rising", restarts=1, minute_index={"kv_usage": (0, 2)})],
        probe=ProbeSummary(model="m", prompt="token_ids", max_tokens=16, prompt_tokens=32,
                           requests=5, failed=1,
                           figures={"ttft": Figure(0.05, (0.04, 0.06), {"min": 0.04})},
                           error="HTTP 503"))],
    gpus=[GpuSummary(index=1, name="NVIDIA H100", memory_total_bytes=80 * 2**30,
                     memory_used=Figure(2.0e10, (1.9e10, 2.1e10), {"samples": 4.0}),
                     uuid="GPU-1", host="node-7", source="dcgm")])
FULL_DOC = {
    "format": "kvtop-baseline", "version": 1, "name": "full",
    "created": "2026-12-05T06:00:00+00:00", "kvtop_version": "9.9",
    "source": {"kind": "live", "time_scale": 30.0}, "interval_s": 5.0, "duration_s": 180.123,
    "minute_s": 30.0,
    "targets": [{
        "target": "http://127.0.0.1:8000/metrics",
        "server": {"kind": "vllm", "version": "0.10.2+", "version_inferred": True},
        "scrapes": 37, "failed_scrapes": 2,
        "engines": [{
            "model": "m", "engine": "0", "samples": 36, "minutes": 2, "duration_s": 175.5,
            "restarts": 1, "config": {"num_gpu_blocks": 1000, "cache_dtype": "fp8",
                                      "prefix_caching": True, "utilization": 0.9},
            "leak": {"verdict": "watch", "reason": "rising"},
            "figures": {"kv_usage": {"value": 0.25, "p5": 0.1, "max": None,
                                     "per_minute": [0.2, 0.3]},
                        "ttft_p99": {"value": None, "per_minute": []}},
            "minute_index": {"kv_usage": [0, 2]}}],
        "probe": {"model": "m", "prompt": "token_ids", "max_tokens": 16, "prompt_tokens": 32,
                  "requests": 5, "failed": 1, "error": "HTTP 503",
                  "figures": {"ttft": {"value": 0.05, "min": 0.04,
                                       "per_request": [0.04, 0.06]}}}}],
    "gpus": [{"index": 1, "name": "NVIDIA H100", "uuid": "GPU-1", "host": "node-7",
              "source": "dcgm", "memory_total_bytes": 80 * 2**30,
              "memory_used_bytes": {"value": 2.0e10, "samples": 4.0,
                                    "per_minute": [1.9e10, 2.1e10]}}],
}


def test_every_field_is_written_where_the_format_says() -> None:
    """Durations to the millisecond; a figure's summary beside its value and values."""
    assert FULL.to_json() == FULL_DOC
    text = FULL.dumps()
    assert text.endswith("}\n") and ", " not in text and ": " not in text  # compact
    assert json.loads(text) == FULL_DOC


def test_every_field_reads_back_as_written() -> None:
    read = baseline_from_json(copy.deepcopy(FULL_DOC))
    assert read.to_json() == FULL_DOC
    expected = copy.deepcopy(FULL)
    expected.duration_s, expected.targets[0].engines[0].duration_s = 180.123, 175.5
    assert read == expected


def test_what_a_file_leaves_out_reads_as_its_default() -> None:
    """Zeros and empty text where the format says the field must be there; the defaults
    where it may be left out (an older kvtop's file, or one made by hand)."""
    doc = {"format": "kvtop-baseline", "version": 1, "created": "", "interval_s": 0,
           "duration_s": 0,
           "targets": [{"target": "", "engines": [{}],
                        "probe": {"model": "", "prompt": "", "max_tokens": 0,
                                  "requests": 0, "failed": 0}}],
           "gpus": [{"name": ""}]}
    assert baseline_from_json(doc) == Baseline(
        name=None, created="", kvtop_version="?", source={}, interval_s=0.0, duration_s=0.0,
        minute_s=60.0,
        targets=[TargetSummary(target="", engines=[EngineSummary(None, None)],
                               probe=ProbeSummary("", "text", 0, None, 0, 0))],
        gpus=[GpuSummary(None, "", None, MISSING)])
    bare = baseline_from_json({**doc, "targets": [{"target": "t", "server": {}, "engines": [
        {"leak": {}, "figures": {"kv_usage": {"value": 0.3}}}]}]})
    assert bare.targets == [TargetSummary("t", engines=[EngineSummary(
        None, None, figures={"kv_usage": Figure(0.3)})])]
    assert bare.gpus == [GpuSummary(None, "", None)]
    assert baseline_from_json({**doc, "gpus": None, "targets": None}).targets == []
    assert EngineSummary(None, None).figure("kv_usage") is MISSING == Figure(None)


def test_a_file_stays_strict_json() -> None:
    """NaN is not JSON: a figure's is written as unknown, a source value's refused."""
    odd = copy.deepcopy(FULL)
    odd.targets[0].engines[0].figures["kv_usage"] = Figure(float("nan"), (), {})
    assert odd.to_json()["targets"][0]["engines"][0]["figures"]["kv_usage"]["value"] is None
    odd.source["time_scale"] = float("nan")
    with pytest.raises(ValueError, match="not JSON compliant"):
        odd.dumps()


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """FULL_DOC with the value at ``path`` replaced (``...``: removed)."""
    doc = copy.deepcopy(FULL_DOC)
    holder: Any = doc
    for key in path[:-1]:
        holder = holder[key]
    if value is ...:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return doc


ENGINE = ("targets", 0, "engines", 0)
PROBE = ("targets", 0, "probe")


@pytest.mark.parametrize(("path", "value", "message"), [
    (("created",), ..., "created: expected text"),
    (("interval_s",), ..., "interval_s: expected a number"),
    (("interval_s",), float("inf"), "interval_s: expected a finite number"),
    (("duration_s",), "1", "duration_s: expected a number"),
    (("minute_s",), float("nan"), "minute_s: expected a finite number"),
    (("source",), [], "source: expected an object"),
    (("source", "kind"), {"x": 1}, "source.kind: expected a plain value"),
    (("source", "time_scale"), float("inf"), "source.time_scale: expected a plain value"),
    (("targets",), {}, "targets: expected a list"),
    (("targets", 0), "x", "targets[0]: expected an object"),
    (("targets", 0, "target"), ..., "targets[0].target: expected text"),
    (("targets", 0, "server"), "vllm", "targets[0].server: expected an object"),
    (("targets", 0, "server", "kind"), 1, "targets[0].server.kind: expected text"),
    (("targets", 0, "scrapes"), True, "targets[0].scrapes: expected a whole number"),
    ((*ENGINE, "figures"), [], "targets[0].engines[0].figures: expected an object"),
    ((*ENGINE, "figures", "ttft_p99"), None,
     "targets[0].engines[0].figures.ttft_p99: expected an object"),
    ((*ENGINE, "figures", "kv_usage", "per_minute"), "0.2",
     "targets[0].engines[0].figures.kv_usage.per_minute: expected a list of numbers"),
    ((*ENGINE, "figures", "kv_usage", "per_minute"), [0.2, False],
     "targets[0].engines[0].figures.kv_usage.per_minute: expected a list of numbers"),
    ((*ENGINE, "figures", "kv_usage", "p5"), "low",
     "targets[0].engines[0].figures.kv_usage.p5: expected a number"),
    ((*ENGINE, "leak"), "watch", "targets[0].engines[0].leak: expected an object"),
    ((*ENGINE, "leak", "reason"), 3, "targets[0].engines[0].leak.reason: expected text"),
    ((*ENGINE, "config", "cache_dtype"), float("nan"),
     "targets[0].engines[0].config.cache_dtype: expected a plain value"),
    ((*ENGINE, "minute_index"), [0, 2],
     "targets[0].engines[0].minute_index: expected an object"),
    ((*PROBE, "model"), ..., "targets[0].probe.model: expected text"),
    ((*PROBE, "max_tokens"), ..., "targets[0].probe.max_tokens: expected a whole number"),
    ((*PROBE, "figures", "ttft", "per_request"), {},
     "targets[0].probe.figures.ttft.per_request: expected a list of numbers"),
    (("gpus", 0, "index"), 1.0, "gpus[0].index: expected a whole number"),
    (("gpus", 0, "memory_used_bytes"), 5, "gpus[0].memory_used_bytes: expected an object"),
    (("gpus", 0, "name"), ..., "gpus[0].name: expected text"),
])
def test_a_wrong_value_names_its_field(path: tuple[Any, ...], value: Any,
                                       message: str) -> None:
    with pytest.raises(BaselineError, match=f"^{re.escape(message)}$"):
        baseline_from_json(with_value(path, value))


@pytest.mark.parametrize("minutes", [[0, 1.5], [-1, 2], [0], [0, 1, 2]])
def test_each_per_minute_value_needs_one_whole_minute(minutes: list[float]) -> None:
    """Fractional, negative, one short, one over: refused (a comparison at matched load
    would pair the wrong minutes)."""
    doc = with_value((*ENGINE, "minute_index", "kv_usage"), minutes)
    with pytest.raises(BaselineError, match=re.escape(
            "targets[0].engines[0].minute_index.kv_usage: expected a minute (a whole number "
            ">= 0) for each per-minute value")):
        baseline_from_json(doc)


@pytest.mark.parametrize(("version", "message"), [
    (0, "baseline format version 0 is not one kvtop writes"),
    ("1", "baseline format version '1' is not one kvtop writes"),
    (..., "baseline format version None is not one kvtop writes"),
    (2, "baseline format version 2 is newer than this kvtop reads (1); upgrade kvtop, or "
        "save the baseline again"),
])
def test_a_version_this_kvtop_does_not_read_is_refused(version: Any, message: str) -> None:
    with pytest.raises(BaselineError, match=f"^{re.escape(message)}$"):
        baseline_from_json(with_value(("version",), version))
    assert VERSION == 1


def test_not_a_baseline_says_what_it_is_not() -> None:
    message = 'not a kvtop baseline (no "format": "kvtop-baseline")'
    for doc in ([FULL_DOC], with_value(("format",), "kvtop-recording"), with_value(
            ("format",), ...)):
        with pytest.raises(BaselineError, match=f"^{re.escape(message)}$"):
            baseline_from_json(doc)
    with pytest.raises(BaselineError, match=r"^not a complete JSON document \(cut off\?\): "):
        loads('{"format": ')
    with pytest.raises(BaselineError, match="not a complete JSON document"):
        loads("[" * 100_000)  # nested past the parser's recursion
