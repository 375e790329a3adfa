"""What the command line and the config file accept, as a user writes them: durations with
their units, numbers within their rule, and ``[thresholds]`` that the leak detector can use
(whole numbers where it counts, fractions at most 1, sizes above 0)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvtop.config import (
    ConfigError,
    fraction,
    leak_params,
    load_config,
    non_negative_number,
    parse_duration,
    positive_number,
)
from kvtop.derive.leak import LeakParams


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("1.5m", 90.0), ("2h", 7200.0), ("1d", 86400.0),
    (" 30M ", 1800.0), ("0.5", 0.5),
])
def test_a_duration_is_read_with_its_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "0s", "-1m", "nan", "inf", "1e400h", "abc", "h", ""])
def test_a_duration_that_is_not_a_time_span_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


@pytest.mark.parametrize(("parse", "good", "bad"), [
    (positive_number, ["0.001", "5", "1e6"], ["0", "-1", "nan", "inf", "x"]),
    (non_negative_number, ["0", "0.0", "7"], ["-0.001", "-1", "nan", "-inf"]),
    (fraction, ["0", "0.5", "1"], ["1.0001", "2", "-0.1", "nan"]),
])
def test_a_number_option_keeps_to_its_rule(parse, good: list[str],  # type: ignore[no-untyped-def]
                                           bad: list[str]) -> None:
    assert [parse(text) for text in good] == [float(text) for text in good]
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def thresholds(tmp_path: Path, line: str) -> LeakParams:
    return leak_params(load_config(config(tmp_path, f"[thresholds]\n{line}\n")))


def test_thresholds_reach_the_detector(tmp_path: Path) -> None:
    params = thresholds(tmp_path, "idle_leak_s = 90\nresidual_min_frac = 1\ntrend_min_buckets = 4")
    assert (params.idle_leak_s, params.residual_min_frac, params.trend_min_buckets) == (90, 1, 4)
    assert isinstance(params.trend_min_buckets, int)


@pytest.mark.parametrize(("line", "words"), [
    ("trend_min_buckets = 4.5", "whole number"),  # a count of buckets
    ("idle_min_scrapes = 3.0", "whole number"),
    ("watch_rise_frac = 1.5", "at most 1"),  # a fraction of the pool
    ("pinned_frac = 1.01", "at most 1"),
    ("bucket_s = 0", "> 0"),  # a size the detector divides by
    ("history_s = 0", "> 0"),
    ("idle_leak_s = -1", ">= 0"),
    ("z = nan", "finite"),
])
def test_a_threshold_the_detector_cannot_use_is_refused(tmp_path: Path, line: str,
                                                        words: str) -> None:
    with pytest.raises(ConfigError, match=line.split(" =")[0]) as raised:
        thresholds(tmp_path, line)
    assert words in str(raised.value)


def test_a_threshold_of_zero_is_allowed_where_zero_means_off(tmp_path: Path) -> None:
    params = thresholds(tmp_path, "idle_leak_s = 0\nresidual_min_blocks = 0")
    assert (params.idle_leak_s, params.residual_min_blocks) == (0, 0)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_the_interval_must_be_a_positive_number_of_seconds(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="interval"):
        load_config(config(tmp_path, f"interval = {value}\n"))


def test_a_fractional_interval_is_kept(tmp_path: Path) -> None:
    assert load_config(config(tmp_path, "interval = 0.5\n")).interval_s == 0.5
