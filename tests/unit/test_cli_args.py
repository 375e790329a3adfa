"""The command line's shared options as a user writes them: durations with their units,
numbers within their rule (quoted with it when not), and which targets, tokens, KV event
endpoints and Prometheus a command ends up reading from its options and the config."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from kvtop.cli_args import (
    add_kv_events_argument,
    add_prometheus_arguments,
    add_target_arguments,
    fraction,
    kv_events_endpoint,
    non_negative_number,
    open_source,
    parse_duration,
    positive_number,
    resolve_kv_events,
    resolve_prometheus,
    resolve_targets,
)
from kvtop.collect.kv_endpoint import KvEventsEndpoint
from kvtop.collect.target import Secret
from kvtop.config import ConfigError, load_config


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


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


def parsed(*argv: str) -> argparse.Namespace:
    """The command line as kvtop's commands parse it."""
    parser = argparse.ArgumentParser()
    add_target_arguments(parser)
    add_kv_events_argument(parser)
    add_prometheus_arguments(parser)
    return parser.parse_args(list(argv))


def test_targets_on_the_command_line_win_over_the_configs_then_the_default(
        tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, '[[targets]]\nurl = "gpu-1:8000"\n'))
    assert [t.url for t in resolve_targets(parsed(), loaded)] == ["http://gpu-1:8000/metrics"]
    assert [t.url for t in resolve_targets(parsed("gpu-2:9000"), loaded)] == [
        "http://gpu-2:9000/metrics"]
    assert [t.url for t in resolve_targets(parsed(), load_config(config(tmp_path, "")))] == [
        "http://127.0.0.1:8000/metrics"]


def test_the_same_server_twice_on_the_command_line_is_read_once(tmp_path: Path) -> None:
    targets = resolve_targets(parsed("b:1", "a:1", "http://b:1/metrics"),
                              load_config(config(tmp_path, "")))
    assert [t.url for t in targets] == ["http://b:1/metrics", "http://a:1/metrics"]


def test_command_line_targets_take_their_token_from_the_environment_or_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = load_config(config(tmp_path, ""))
    monkeypatch.delenv("KVTOP_TOKEN", raising=False)
    assert resolve_targets(parsed("a:1"), empty)[0].token is None
    monkeypatch.setenv("KVTOP_TOKEN", "default-variable")
    assert resolve_targets(parsed("a:1"), empty)[0].token == Secret("default-variable")
    monkeypatch.setenv("MY_TOKEN", "named-variable")
    [target] = resolve_targets(parsed("a:1", "--token-env", "MY_TOKEN"), empty)
    assert target.token == Secret("named-variable")
    token_file = tmp_path / "token"
    token_file.write_text("in-a-file\n")
    [target] = resolve_targets(parsed("a:1", "--token-env", "UNSET_TOKEN",
                                      "--token-file", str(token_file)), empty)
    assert target.token == Secret("in-a-file")


def test_a_bad_token_file_or_target_on_the_command_line_is_a_usage_error(
        tmp_path: Path) -> None:
    empty = load_config(config(tmp_path, ""))
    with pytest.raises(ConfigError, match=r"^--token-file: not a regular file"):
        resolve_targets(parsed("a:1", "--token-file", str(tmp_path)), empty)
    with pytest.raises(ConfigError, match=r"^not an http:// or https:// URL: 'ftp://a:1'"):
        resolve_targets(parsed("ftp://a:1"), empty)


def test_a_token_variable_named_but_unset_is_a_usage_error_everywhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to send no token, silently: the server's 401 then blamed the token."""
    monkeypatch.delenv("UNSET_TOKEN", raising=False)
    empty = load_config(config(tmp_path, ""))
    with pytest.raises(ConfigError, match=r"^--token-env: the environment variable "
                                          r"'UNSET_TOKEN' is not set"):
        resolve_targets(parsed("a:1", "--token-env", "UNSET_TOKEN"), empty)
    with pytest.raises(ConfigError, match=r"targets\[0\]: token_env: the environment variable"):
        load_config(config(tmp_path, '[[targets]]\nurl = "a:1"\ntoken_env = "UNSET_TOKEN"\n'))
    loaded = load_config(config(tmp_path, '[prometheus]\nurl = "p:9090"\n'
                                          'token_env = "UNSET_TOKEN"\n'))
    with pytest.raises(ConfigError, match=r"^\[prometheus\] token_env: the environment"):
        resolve_prometheus(parsed(), loaded)


def test_no_prometheus_unless_asked(tmp_path: Path) -> None:
    assert resolve_prometheus(parsed("a:1"), load_config(config(tmp_path, ""))) is None
    assert resolve_prometheus(argparse.Namespace(), load_config(config(tmp_path, ""))) is None


def test_prometheus_from_the_command_line_or_the_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROM_TOKEN", "prom-secret")
    loaded = load_config(config(tmp_path, (
        '[prometheus]\nurl = "prom:9090"\nselector = \'{namespace="prod"}\'\n'
        'token_env = "PROM_TOKEN"\nbackfill_step = 30\n')))
    settings = resolve_prometheus(parsed(), loaded)
    assert settings is not None
    assert (settings.url, settings.selector, settings.token, settings.backfill_step_s) == (
        "http://prom:9090", '{namespace="prod"}', Secret("prom-secret"), 30.0)
    settings = resolve_prometheus(parsed("--prometheus", "https://other:9090/",
                                         "--selector", '{job="vllm"}'), loaded)
    assert settings is not None
    assert (settings.url, settings.selector, settings.token, settings.backfill_step_s) == (
        "https://other:9090", '{job="vllm"}', Secret("prom-secret"), 30.0)
    settings = resolve_prometheus(parsed("--prometheus", "prom:9090"),
                                  load_config(config(tmp_path, "")))
    assert settings is not None
    assert (settings.selector, settings.token, settings.backfill_step_s) == ("", None, None)


def test_a_command_without_target_options_reads_the_configs_prometheus(
        tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, '[prometheus]\nurl = "prom:9090"\n'
                                          'selector = \'{job="vllm"}\'\n'))
    settings = resolve_prometheus(argparse.Namespace(), loaded)
    assert settings is not None and (settings.url, settings.selector) == (
        "http://prom:9090", '{job="vllm"}')


@pytest.mark.parametrize(("argv", "table", "words"), [
    (["--selector", '{a="b"}'], "", "--selector needs --prometheus URL (or [prometheus] url)"),
    (["a:1", "--prometheus", "prom:9090"], "", "give either targets or --prometheus, not both"),
    (["a:1"], '[prometheus]\nurl = "prom:9090"\n',
     "give either targets or --prometheus, not both"),
    (["--prometheus", "ftp://prom"], "", "prometheus: not a Prometheus URL: 'ftp://prom'"),
    (["--prometheus", "prom:9090", "--selector", "namespace=prod"], "",
     "prometheus: a label selector looks like"),
    ([], '[prometheus]\nurl = "prom:9090"\ntoken_file = "/nonexistent/t"\n',
     "[prometheus] token_file: No such file or directory: /nonexistent/t"),
])
def test_a_prometheus_that_cannot_be_read_is_a_usage_error(
        tmp_path: Path, argv: list[str], table: str, words: str) -> None:
    loaded = load_config(config(tmp_path, table))
    with pytest.raises(ConfigError) as raised:
        resolve_prometheus(parsed(*argv), loaded)
    assert str(raised.value).startswith(words)


@pytest.mark.parametrize(("parse", "text", "says"), [
    (parse_duration, "abc", "not a duration: 'abc' (e.g. 90s, 30m, 2h)"),
    (parse_duration, "0s", "a duration must be finite and > 0 (got '0s')"),
    (positive_number, "x", "not a number: 'x'"),
    (positive_number, "0", "must be a finite number > 0 (got '0')"),
    (non_negative_number, "-1", "must be a finite number >= 0 (got '-1')"),
    (fraction, "2", "must be a finite number from 0 to 1 (got '2')"),
    (kv_events_endpoint, "gpu-1:5557",
     "kv_events must be tcp://host:port (got 'gpu-1:5557')"),
])
def test_a_bad_option_value_is_quoted_with_the_rule_it_breaks(parse, text: str,  # type: ignore[no-untyped-def]
                                                              says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        parse(text)
    assert str(raised.value) == says


def test_kv_events_come_from_the_command_line_in_the_targets_order_else_the_config(
        tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, '[[targets]]\nurl = "gpu-1:8000"\n'
                                          'kv_events = "tcp://gpu-1:5557"\n'
                                          '[[targets]]\nurl = "gpu-2:8000"\n'))
    args = parsed()
    assert resolve_kv_events(args, loaded, resolve_targets(args, loaded)) == {
        "http://gpu-1:8000/metrics": KvEventsEndpoint("tcp://gpu-1:5557")}
    args = parsed("a:1", "b:1", "--kv-events", "tcp://a:5557,tcp://a:5558")
    assert resolve_kv_events(args, loaded, resolve_targets(args, loaded)) == {
        "http://a:1/metrics": KvEventsEndpoint("tcp://a:5557", "tcp://a:5558")}


@pytest.mark.parametrize(("argv", "says"), [
    (("a:1", "--kv-events", "tcp://a:1", "--kv-events", "tcp://a:2"),
     "2 --kv-events for 1 target(s): one each, in the targets' order"),
    (("--kv-events", "tcp://a:1"), "--kv-events names the KV events of the command-line"),
])
def test_kv_events_without_a_command_line_target_each_are_a_usage_error(
        tmp_path: Path, argv: tuple[str, ...], says: str) -> None:
    args, loaded = parsed(*argv), load_config(config(tmp_path, ""))
    with pytest.raises(ConfigError, match=re.escape(says)):
        resolve_kv_events(args, loaded, resolve_targets(args, loaded))


def test_the_source_opened_carries_the_kv_events_and_prometheus_refuses_them(
        tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, ""))
    with open_source(parsed("a:1", "--kv-events", "tcp://a:5557"), loaded) as source:
        assert source.kv_events == {"http://a:1/metrics": KvEventsEndpoint("tcp://a:5557")}
    with pytest.raises(ConfigError, match="Prometheus does not carry KV events"), \
            open_source(parsed("--prometheus", "http://p:9090", "--kv-events", "tcp://a:1"),
                        loaded):
        pass
