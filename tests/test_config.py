"""The config loader against anything a config file can hold: Hypothesis writes TOML documents
from kvtop's own keys, near-misses and junk, with values of every TOML type (NaN, infinities,
dates, nested tables), and the loader must either accept them or raise ConfigError."""

from __future__ import annotations

import contextlib
import json
import math
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.config import (
    PROMETHEUS_KEYS,
    TARGET_KEYS,
    THRESHOLD_DEFAULTS,
    TOP_KEYS,
    ConfigError,
    leak_params,
    load_config,
)
from kvtop.derive.leak import LeakParams


class _Raw(str):
    """A TOML literal written as is (dates and times)."""


KNOWN = [*TOP_KEYS, *TARGET_KEYS, *PROMETHEUS_KEYS, *THRESHOLD_DEFAULTS]


def toml_key(key: str) -> str:
    return json.dumps(key)  # a TOML basic string is a quoted key; JSON escapes fit it


def toml_value(value: Any) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


keys = st.one_of(st.sampled_from(KNOWN), st.sampled_from(["target", "intervall", "nmae", "urll"]),
                 st.text(string.ascii_letters + "_-", min_size=1, max_size=12),
                 st.text(min_size=1, max_size=8))
scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["gpu-1:8000", "http://127.0.0.1:1/metrics", "ftp://x", "", "KVTOP_TOKEN",
                     "/dev/zero", "{namespace=\"prod\"}", "http://[::1", "https://u:p@h/"]),
    st.text(max_size=20),
    st.sampled_from(["1979-05-27", "07:32:00", "1979-05-27T07:32:00Z"]).map(lambda s: _Raw(s)),
)


values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)
documents = st.dictionaries(keys, values, max_size=5)


def write(tmp: Path, document: dict[str, Any]) -> Path:
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in document.items()]
    path = tmp / "kvtop.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=documents)
def test_the_loader_accepts_or_raises_config_error_only(
        tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any]) -> None:
    path = write(tmp_path_factory.mktemp("fuzz"), document)
    try:
        config = load_config(path)
    except ConfigError:
        return
    # Whatever got through is usable as it stands.
    assert isinstance(leak_params(config), LeakParams)
    assert config.interval_s is None or (math.isfinite(config.interval_s)
                                         and config.interval_s > 0)
    for target in config.targets:
        assert target.url.startswith(("http://", "https://"))
        assert target.name is None or isinstance(target.name, str)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_is_a_config_error_or_a_config(
        tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("text") / "kvtop.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(ConfigError):
        load_config(path)


@pytest.mark.parametrize(("name", "value"), sorted(THRESHOLD_DEFAULTS.items()))
def test_every_default_threshold_passes_its_own_check(tmp_path: Path, name: str,
                                                      value: float) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text(f"[thresholds]\n{name} = {value!r}\n")
    assert getattr(leak_params(load_config(path)), name) == value


def test_a_valid_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text('interval = 2\n[[targets]]\nurl = "gpu-1:8000"\nname = "gpu-1"\n'
                    'group = "prod"\n[thresholds]\nidle_leak_s = 90\nidle_min_scrapes = 4\n'
                    '[prometheus]\nselector = \'{namespace="prod"}\'\nbackfill_step = 30\n')
    config = load_config(path)
    assert config.interval_s == 2.0
    (target,) = config.targets
    assert (target.url, target.name, target.group) == ("http://gpu-1:8000/metrics", "gpu-1",
                                                       "prod")
    params = leak_params(config)
    assert params.idle_leak_s == 90.0 and params.idle_min_scrapes == 4
    assert config.prometheus["backfill_step"] == 30


def test_a_huge_config_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_config(path)
