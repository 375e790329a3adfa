"""The command line's shared options as a user writes them: durations with their units,
numbers within their rule (quoted with it when not), and which targets, tokens, KV event
endpoints and Prometheus a command ends up reading from its options and the config."""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import certifi
import pytest

from kvtop.cli_args import (
    add_kv_events_argument,
    add_output_arguments,
    add_prometheus_arguments,
    add_target_arguments,
    add_time_range_arguments,
    fraction,
    kv_events_endpoint,
    no_terminal,
    non_negative_number,
    open_source,
    parse_duration,
    positive_number,
    resolve_kv_events,
    resolve_prometheus,
    resolve_targets,
    size,
    time_range,
)
from kvtop.collect.kv_endpoint import KvEventsEndpoint
from kvtop.collect.target import Scrape, Secret, Target
from kvtop.config import ConfigError, load_config
from kvtop.store.recording import RecordingWriter
from kvtop.store.replay import RecordingSource
from kvtop.store.time_range import Bound, TimeRange
from tests.support.paths import fixture_text


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


NO_TARGET_FOR_KV_EVENTS = (
    "--kv-events names the KV events of the command-line targets, one each in their order "
    '(a config\'s target takes kv_events = "tcp://host:port")')


@pytest.mark.parametrize(("argv", "says"), [
    (("a:1", "--kv-events", "tcp://a:1", "--kv-events", "tcp://a:2"),
     "2 --kv-events for 1 target(s): one each, in the targets' order"),
    (("--kv-events", "tcp://a:1"), NO_TARGET_FOR_KV_EVENTS),
])
def test_kv_events_without_a_command_line_target_each_are_a_usage_error(
        tmp_path: Path, argv: tuple[str, ...], says: str) -> None:
    args, loaded = parsed(*argv), load_config(config(tmp_path, ""))
    with pytest.raises(ConfigError, match=f"^{re.escape(says)}$"):
        resolve_kv_events(args, loaded, resolve_targets(args, loaded))


def test_kv_events_from_a_command_without_target_options(tmp_path: Path) -> None:
    """A command whose parser has no TARGET (nor --kv-events) reads the config's; given
    --kv-events but no targets option it is the same usage error."""
    loaded = load_config(config(tmp_path, '[[targets]]\nurl = "gpu-1:8000"\n'
                                          'kv_events = "tcp://gpu-1:5557"\n'))
    targets = resolve_targets(parsed(), loaded)
    assert resolve_kv_events(argparse.Namespace(), loaded, targets) == {
        "http://gpu-1:8000/metrics": KvEventsEndpoint("tcp://gpu-1:5557")}
    with pytest.raises(ConfigError, match=f"^{re.escape(NO_TARGET_FOR_KV_EVENTS)}$"):
        resolve_kv_events(argparse.Namespace(kv_events=[KvEventsEndpoint("tcp://a:1")]),
                          loaded, targets)


def test_the_source_opened_carries_the_kv_events_and_prometheus_refuses_them(
        tmp_path: Path) -> None:
    loaded = load_config(config(tmp_path, ""))
    with open_source(parsed("a:1", "--kv-events", "tcp://a:5557"), loaded) as source:
        assert source.kv_events == {"http://a:1/metrics": KvEventsEndpoint("tcp://a:5557")}
    with pytest.raises(ConfigError, match="Prometheus does not carry KV events"), \
            open_source(parsed("--prometheus", "http://p:9090", "--kv-events", "tcp://a:1"),
                        loaded):
        pass


# -- headers and CA bundle for the command-line targets --------------------------------------


def ca_bundle(tmp_path: Path) -> Path:
    """A real PEM CA bundle (certifi's)."""
    path = tmp_path / "ca.pem"
    path.write_text(Path(certifi.where()).read_text())
    return path


def test_command_line_headers_and_ca_bundle_go_with_each_command_line_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_KEY", "key-from-env")
    ca = ca_bundle(tmp_path)
    targets = resolve_targets(parsed("a:1", "b:1", "--header", "Accept: text/plain",
                                     "--header", "X-Api-Key:$API_KEY", "--cacert", str(ca)),
                              load_config(config(tmp_path, "")))
    headers = (("Accept", "text/plain"), ("X-Api-Key", Secret("key-from-env")))
    assert targets == [Target.from_spec("a:1", headers=headers, cacert=str(ca)),
                       Target.from_spec("b:1", headers=headers, cacert=str(ca))]
    assert [(t.headers, t.cacert) for t in targets] == [(headers, str(ca))] * 2


def test_a_secret_header_value_written_in_argv_is_refused(tmp_path: Path) -> None:
    """Every user of the machine can read argv: a secret comes from $VAR or @FILE."""
    with pytest.raises(ConfigError, match=(
            r"^--header: header 'X-Api-Key': its value would show in process listings; "
            r"write X-Api-Key:\$VAR or X-Api-Key:@FILE$")):
        resolve_targets(parsed("a:1", "--header", "X-Api-Key:sk-live"),
                        load_config(config(tmp_path, "")))


def test_a_ca_bundle_with_insecure_or_unreadable_is_a_usage_error(tmp_path: Path) -> None:
    empty = load_config(config(tmp_path, ""))
    with pytest.raises(ConfigError, match=(
            r"^--cacert verifies TLS and --insecure does not: give one$")):
        resolve_targets(parsed("a:1", "--cacert", str(ca_bundle(tmp_path)), "--insecure"),
                        empty)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError) as raised:
        resolve_targets(parsed("a:1", "--cacert", str(junk)), empty)
    assert str(raised.value).startswith(f"--cacert: not a PEM CA bundle: {junk} (")


def test_a_command_without_header_options_reads_its_targets_plainly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parser without --header, --cacert or --insecure: nothing is sent but the token,
    and a CA bundle alone is checked without an --insecure to ask about."""
    monkeypatch.delenv("KVTOP_TOKEN", raising=False)
    empty = load_config(config(tmp_path, ""))
    plain = argparse.Namespace(targets=["a:1"], token_env=None, token_file=None)
    assert resolve_targets(plain, empty) == [Target.from_spec("a:1")]
    ca = ca_bundle(tmp_path)
    with_ca = argparse.Namespace(targets=["a:1"], token_env=None, token_file=None, cacert=ca)
    assert resolve_targets(with_ca, empty) == [Target.from_spec("a:1", cacert=str(ca))]


def test_the_default_target_is_never_sent_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It is whatever listens on 127.0.0.1:8000; only targets the user named get a token."""
    monkeypatch.setenv("KVTOP_TOKEN", "for-named-targets")
    [target] = resolve_targets(parsed(), load_config(config(tmp_path, "")))
    assert (target.url, target.token) == ("http://127.0.0.1:8000/metrics", None)


@pytest.mark.parametrize("argv", [("--header", "Accept:text/plain"), ("--cacert", "ca.pem"),
                                  ("--header", "Accept:text/plain", "--cacert", "ca.pem")])
def test_headers_and_ca_bundle_go_only_with_command_line_targets(
        tmp_path: Path, argv: tuple[str, ...]) -> None:
    """Not the config's targets (each has its own headers / cacert), nor a Prometheus."""
    with pytest.raises(ConfigError, match=(
            r"^--header and --cacert go with targets on the command line; for the config's, "
            r"give each \[\[targets\]\] headers / cacert$")):
        resolve_targets(parsed(*argv), load_config(config(tmp_path, '[[targets]]\nurl = "a:1"\n')))
    with pytest.raises(ConfigError, match=(
            r"^--header and --cacert are for targets read directly, not --prometheus$")):
        resolve_prometheus(parsed("--prometheus", "prom:9090", *argv),
                           load_config(config(tmp_path, "")))


# -- what the parsers make of a command line --------------------------------------------------


def full_parser(*, positional: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvtop-test")
    add_target_arguments(parser, positional=positional)
    add_kv_events_argument(parser)
    add_output_arguments(parser, ("--text",), "text")
    add_time_range_arguments(parser, "--replay")
    return parser


NOTHING_GIVEN: dict[str, object] = {
    "config": None, "token_env": None, "token_file": None, "header": None, "cacert": None,
    "insecure": False, "timeout": None, "full_metrics": False, "kv_events": [],
    "as_json": None, "since": None, "until": None}


def test_options_left_out_parse_to_their_defaults() -> None:
    assert vars(full_parser().parse_args([])) == {"targets": [], **NOTHING_GIVEN}
    assert vars(full_parser(positional=False).parse_args([])) == NOTHING_GIVEN


def test_options_parse_to_their_types() -> None:
    args = full_parser().parse_args([
        "a:1", "--config", "k.toml", "--token-env", "T", "--token-file", "t",
        "--header", "Accept:x", "--header", "X-Id:$ID", "--cacert", "ca.pem", "--insecure",
        "--timeout", "3", "--full-metrics", "--kv-events", "tcp://a:5557", "--json",
        "--since", "30m", "--until", "2026-07-01T12:00:00Z"])
    moment = datetime(2026, 7, 1, 12, tzinfo=timezone.utc).timestamp()
    assert vars(args) == {
        "targets": ["a:1"], "config": Path("k.toml"), "token_env": "T", "token_file": Path("t"),
        "header": ["Accept:x", "X-Id:$ID"], "cacert": Path("ca.pem"), "insecure": True,
        "timeout": 3.0, "full_metrics": True, "kv_events": [KvEventsEndpoint("tcp://a:5557")],
        "as_json": True, "since": Bound(1800.0, offset=True),
        "until": Bound(moment, offset=False)}
    assert full_parser().parse_args(["--text"]).as_json is False


@pytest.mark.parametrize(("argv", "says"), [
    (["--since", "yesterday"], "argument --since: not a time: 'yesterday' (an offset such as "
                               "30m, or a moment such as 2026-07-01T12:00:00Z)"),
    (["--until=-5m"], "argument --until: an offset must be finite and >= 0 (got '-5m')"),
])
def test_a_bad_time_bound_is_a_usage_error_that_says_why(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as raised:
        full_parser().parse_args(argv)
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"kvtop-test: error: {says}"


def test_since_and_until_cut_a_recording_only(tmp_path: Path) -> None:
    since, until = Bound(60.0, offset=True), Bound(600.0, offset=True)
    both = argparse.Namespace(since=since, until=until)
    assert time_range(both, tmp_path / "r.jsonl", "--replay") == TimeRange(since, until)
    assert time_range(argparse.Namespace(since=None, until=None), None, "--replay") == TimeRange()
    for args in (both, argparse.Namespace(since=None, until=until)):
        with pytest.raises(ConfigError, match=(
                r"^--since and --until cut a recording: give them with --from$")):
            time_range(args, None, "--from")


@pytest.mark.parametrize(("text", "size_bytes"), [
    ("500M", 500 * 1024**2), ("2G", 2 * 1024**3), ("1M", 1024**2), ("0", 0), ("none", 0)])
def test_a_size_is_read_in_powers_of_1024(text: str, size_bytes: int) -> None:
    assert size(text) == size_bytes


@pytest.mark.parametrize(("text", "says"), [
    ("abc", "'abc' is not a size (500M, 1G, 0 for no limit)"),
    ("1023k", "'1023k' is under the least a recording may be (1 MiB; 0 for no limit)"),
])
def test_a_bad_size_is_a_usage_error_that_says_why(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        size(text)
    assert str(raised.value) == says


# -- the terminal and the recording -------------------------------------------------------


def test_the_app_refuses_a_stdout_that_is_not_a_terminal(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert no_terminal("kvtop replay", "kvtop snapshot --replay") is True  # captured: a pipe
    assert capsys.readouterr().err == (
        "kvtop replay: the app draws on a terminal, and stdout is not one; for a pipe or a "
        "file use kvtop snapshot --replay\n")
    main, side = os.openpty()
    with open(side, "w") as terminal:  # a real pseudo-terminal
        monkeypatch.setattr(sys, "stdout", terminal)
        assert no_terminal("kvtop replay", "kvtop snapshot --replay") is False
    os.close(main)
    assert capsys.readouterr().err == ""


def test_the_source_of_a_replay_is_the_recording(tmp_path: Path) -> None:
    hosts = [Target.from_spec("10.0.0.5:8000"), Target.from_spec("10.0.0.5:8001")]
    path = tmp_path / "run.jsonl"
    with RecordingWriter(path, interval_s=5.0, targets=hosts) as writer:
        for host in hosts:
            writer.write(Scrape(host, 1_767_225_600.0, fixture_text(
                "vllm-0.33.0-v1-twin-idle.txt")))
    with open_source(parsed("a:1"), load_config(config(tmp_path, "")), replay=path) as source:
        assert isinstance(source, RecordingSource)
        assert (source.targets, source.interval_s, source.recording.path) == (hosts, 5.0, path)
