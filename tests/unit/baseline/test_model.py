"""The baseline file: it reads back what was written, and anything else (cut off, another
format or version, wrong types, hostile values) is refused with a message, never a crash."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.baseline_eval.scenarios import HEALTHY, baseline
from kvtop.baseline import store
from kvtop.baseline.model import VERSION, Baseline, BaselineError, baseline_from_json, loads
from kvtop.baseline.stats import mann_whitney


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


def test_store_save_list_show_remove(sample: Baseline, data_home: Path) -> None:
    path = store.save(sample, "healthy-1")
    assert path == data_home / "healthy-1.json"
    with pytest.raises(FileExistsError, match="--force"):
        store.save(sample, "healthy-1")
    store.save(sample, "healthy-1", overwrite=True)
    (data_home / "broken.json").write_text('{"format": "kvtop-baseline", "vers')
    listed = {entry.name: entry for entry in store.list_saved()}
    assert listed["healthy-1"].baseline is not None
    assert listed["broken"].baseline is None and "cut off" in (listed["broken"].error or "")
    assert [p.name for p in data_home.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert store.load("healthy-1").to_json() == sample.to_json()
    store.remove("healthy-1")
    with pytest.raises(BaselineError, match="kvtop baseline list"):
        store.load("healthy-1")


@pytest.mark.parametrize("name", ["../etc/passwd", "a b", "", "-x", "x" * 101, "a:b"])
def test_names_that_are_not_names(name: str, data_home: Path) -> None:
    if store.is_path(name):
        assert store.baseline_path(name) == Path(name)
        return
    with pytest.raises(BaselineError, match="not a baseline name"):
        store.baseline_path(name)


def test_a_path_instead_of_a_name(sample: Baseline, tmp_path: Path) -> None:
    path = store.save(sample, str(tmp_path / "here.json"))
    assert path == tmp_path / "here.json" and store.load(str(path)).name == "sample"


def test_mann_whitney_exact_and_approximate() -> None:
    # complete separation of 5 and 5: exact two-sided p = 2 / C(10, 5)
    u, p = mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 25 and p == pytest.approx(2 / 252)
    assert mann_whitney([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == (0, pytest.approx(2 / 252))
    assert mann_whitney([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.1)
    assert mann_whitney([1, 1, 1], [1, 1, 1]) == (4.5, 1.0)  # nothing to rank
    assert mann_whitney([], [1.0])[1] == 1.0
    # interleaved: no evidence either way
    assert mann_whitney([1, 3, 5, 7], [2, 4, 6, 8])[1] > 0.5
    # the normal approximation (ties) agrees with the exact count where both apply
    a, b = [float(i) for i in range(0, 40, 2)], [float(i) + 5 for i in range(0, 40, 2)]
    exact = mann_whitney(a, b)[1]
    tied = mann_whitney([*a, 100.0], [*b, 100.0])[1]
    assert 0.01 < exact < 0.5 and tied == pytest.approx(exact, rel=0.35)
