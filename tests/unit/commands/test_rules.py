"""`kvtop rules` in this process: the rules for the config's thresholds and selector, a
selector given on the command line first, and a selector that is not one refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtop.cli import main
from kvtop.derive.leak_params import LeakParams
from kvtop.exits import EXIT_OK, EXIT_USAGE
from kvtop.report.rules import render_rules

CONFIG = """
[thresholds]
leak_rise_frac = 0.02

[prometheus]
selector = '{namespace="prod"}'
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "kvtop.toml"
    path.write_text(CONFIG)
    return path


def test_the_rules_use_the_configs_thresholds_and_selector(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--config", str(config)]) == EXIT_OK
    expected = render_rules(LeakParams(leak_rise_frac=0.02), '{namespace="prod"}')
    assert capsys.readouterr().out == expected
    assert expected != render_rules(LeakParams(), '{namespace="prod"}')


def test_a_selector_on_the_command_line_comes_first(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--config", str(config), "--selector", '{job="vllm"}']) == EXIT_OK
    assert capsys.readouterr().out == render_rules(LeakParams(leak_rise_frac=0.02),
                                                   '{job="vllm"}')


def test_a_selector_that_is_not_one_is_a_usage_error(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--config", str(config), "--selector", "job=vllm"]) == EXIT_USAGE
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith("kvtop: ") and "job=vllm" in said.err


def test_the_command_is_listed_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = [line.split(None, 1) for line in capsys.readouterr().out.splitlines()
              if line.strip().startswith("rules ")]
    assert listed == [["rules", "print Prometheus recording and alerting rules for KV-cache "
                                "leaks"]]
