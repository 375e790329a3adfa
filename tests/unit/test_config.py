"""The config loader against anything a config file can hold: Hypothesis writes TOML documents
from kvtop's own keys, near-misses and junk, with values of every TOML type (NaN, infinities,
dates, nested tables), and the loader must either accept them or raise ConfigError.

What the config file accepts, as a user writes it: ``[thresholds]`` that the leak detector
can use (whole numbers where it counts, fractions at most 1, sizes above 0), ``[alerts]``
that can be run, targets and a ``[prometheus]`` table of the right shape (the command line's
options: test_cli_args.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import string
import subprocess
from pathlib import Path
from typing import Any

import certifi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.cli import main
from kvtop.collect.kv_endpoint import KvEventsEndpoint
from kvtop.collect.target import Secret
from kvtop.config import (
    MAX_CONFIG_BYTES,
    PROMETHEUS_KEYS,
    TARGET_KEYS,
    THRESHOLD_DEFAULTS,
    TOP_KEYS,
    AlertSettings,
    ConfigError,
    leak_params,
    load_config,
)
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitParams


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
    assert config.prometheus.backfill_step == 30


def test_a_targets_headers_and_ca_bundle_load_and_their_secrets_are_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_KEY", "gw-key-from-env")
    ca = tmp_path / "ca.pem"
    ca.write_text(Path(certifi.where()).read_text())
    path = tmp_path / "kvtop.toml"
    path.write_text(f'[[targets]]\nurl = "gpu-1:8000"\ncacert = "{ca}"\n'
                    '[targets.headers]\n"X-Api-Key" = "$GW_KEY"\n"X-Tenant" = "prod"\n'
                    'Accept = "text/plain"\n')
    (target,) = load_config(path).targets
    assert target.cacert == str(ca)
    names = [name for name, _ in target.headers]
    assert names == ["X-Api-Key", "X-Tenant", "Accept"]
    assert [secret.reveal() for secret in target.secrets] == ["gw-key-from-env", "prod"]
    assert target.headers[2] == ("Accept", "text/plain")


@pytest.mark.parametrize(("table", "says"), [
    ('headers = "X-Api-Key: x"', "headers must be a table"),
    ("headers = {X-Api-Key = 3}", "headers: 'X-Api-Key' must be a string (got '3')"),
    ('headers = {"Bad Name" = "x"}', "headers: not a header: 'Bad Name'"),
    ('headers = {Host = "x"}', "headers: header 'Host' is set by kvtop itself"),
    ('headers = {X-Key = "$KVTOP_TEST_UNSET"}', "the environment variable 'KVTOP_TEST_UNSET'"),
    ('cacert = "/nonexistent/ca.pem"', "no such file: /nonexistent/ca.pem"),
    ("cacert = 1", "cacert must be a string"),
])
def test_a_targets_bad_headers_or_ca_bundle_are_config_errors(
        tmp_path: Path, table: str, says: str) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text(f'[[targets]]\nurl = "gpu-1:8000"\n{table}\n')
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(path)


def test_a_huge_config_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(path)


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


def test_alerts_ring_the_bell_and_run_nothing_unless_told(tmp_path: Path) -> None:
    alerts = load_config(config(tmp_path, "")).alerts
    assert alerts == AlertSettings()  # docs/alerts.md: bell on, no command, 300 s, 6/min, 10 s
    assert (alerts.bell, alerts.command, alerts.min_interval_s, alerts.max_per_minute,
            alerts.timeout_s) == (True, (), 300.0, 6, 10.0)


def test_the_alerts_table_reaches_the_alerts(tmp_path: Path) -> None:
    alerts = load_config(config(tmp_path, (
        '[alerts]\nbell = false\ncommand = ["notify-send", "kvtop"]\nmin_interval_s = 60\n'
        "max_per_minute = 2\ntimeout_s = 2.5\n"))).alerts
    assert alerts == AlertSettings(bell=False, command=("notify-send", "kvtop"),
                                   min_interval_s=60.0, max_per_minute=2, timeout_s=2.5)
    assert isinstance(alerts.max_per_minute, int) and isinstance(alerts.min_interval_s, float)


@pytest.mark.parametrize(("table", "words"), [
    ('bell = "yes"', "bell must be true or false (got 'yes')"),
    ('command = "notify-send kvtop"', "command must be a list of strings, the program first "
                                      '(it is run without a shell), e.g. ["notify-send", "kvtop"]'),
    ('command = ["", "kvtop"]', "command must be a list of strings"),
    ('command = ["notify-send", 5]', "command must be a list of strings"),
    ("min_interval_s = 0", "min_interval_s must be a finite number > 0"),
    ("max_per_minute = -1", "max_per_minute must be a finite number > 0"),
    ("timeout_s = nan", "timeout_s must be a finite number > 0"),
    ("bel = true", "unknown key 'bel' (did you mean 'bell'?)"),
])
def test_alerts_that_cannot_be_run_are_refused_with_the_reason(tmp_path: Path, table: str,
                                                               words: str) -> None:
    path = config(tmp_path, f"[alerts]\n{table}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: [alerts]: ") and words in str(raised.value)


def test_alerts_that_are_not_a_table_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[alerts\] must be a table \(got '3'\)"):
        load_config(config(tmp_path, "alerts = 3\n"))


def test_the_default_config_is_under_xdg_config_home_else_dot_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".config" / "kvtop").mkdir(parents=True)
    (home / ".config" / "kvtop" / "config.toml").write_text("interval = 3\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert load_config(None).interval_s == 3.0
    xdg = tmp_path / "xdg"
    (xdg / "kvtop").mkdir(parents=True)
    (xdg / "kvtop" / "config.toml").write_text("interval = 7\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert load_config(None).interval_s == 7.0
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    assert load_config(None).interval_s is None  # no file: no config, and no error


def test_a_config_named_on_the_command_line_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found: .*absent\.toml"):
        load_config(tmp_path / "absent.toml")


def test_config_targets_keep_their_name_group_token_and_baseline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\nsecond line\n")
    monkeypatch.setenv("GPU1_TOKEN", "from-env")
    loaded = load_config(config(tmp_path, (
        '[[targets]]\nurl = "gpu-1:8000"\nname = "one"\ngroup = "prod"\n'
        'token_env = "GPU1_TOKEN"\nbaseline = "steady"\n'
        f'[[targets]]\nurl = "https://gpu-2/m"\ntoken_file = "{token_file}"\n')))
    one, two = loaded.targets
    assert (one.url, one.name, one.group, one.token) == (
        "http://gpu-1:8000/metrics", "one", "prod", Secret("from-env"))
    assert (two.url, two.name, two.group, two.token) == ("https://gpu-2/m", None, None,
                                                          Secret("from-file"))
    assert loaded.baselines == {"http://gpu-1:8000/metrics": "steady"}


@pytest.mark.parametrize(("entry", "words"), [
    ('url = "gpu-1:8000"\ntoken_file = "/nonexistent/token"',
     "targets[0]: token_file: No such file or directory: /nonexistent/token"),
    ('url = "gpu-1:8000"\nbaseline = 5', "targets[0]: baseline must be a string (got '5')"),
    ("url = 8000", "targets[0]: url must be a string (got '8000')"),
    ('name = "no url"', "targets[0]: each [[targets]] needs url"),
    ('url = "gpu-1:8000"\ntoken_env = 5', "targets[0]: token_env must be a string"),
    ('url = "gpu-1:8000"\ntoken_file = 5', "targets[0]: token_file must be a string"),
])
def test_a_config_target_that_cannot_be_read_is_refused(tmp_path: Path, entry: str,
                                                        words: str) -> None:
    path = config(tmp_path, f"[[targets]]\n{entry}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(str(path)) and words in str(raised.value)


@pytest.mark.parametrize(("table", "words"), [
    ('url = "prom:9090"\nselectr = "{}"', "unknown key 'selectr' (did you mean 'selector'?)"),
    ("selector = 5", "selector must be a string"),
    ('token_env = ["A"]', "token_env must be a string"),
    ("token_file = 1", "token_file must be a string"),
    ("backfill_step = 0", "backfill_step (seconds) must be a finite number > 0"),
])
def test_a_prometheus_table_of_the_wrong_shape_is_refused(tmp_path: Path, table: str,
                                                          words: str) -> None:
    path = config(tmp_path, f"[prometheus]\n{table}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path} [prometheus]") and words in str(raised.value)


@pytest.mark.parametrize(("text", "says"), [
    ("interval = -5", "interval (seconds) must be a finite number > 0 (got '-5')"),
    ("[thresholds]\ntrend_min_buckets = 4.5",
     "[thresholds] trend_min_buckets must be a whole number (got '4.5')"),
    ("[thresholds]\nwatch_rise_frac = 1.5",
     "[thresholds] watch_rise_frac is a fraction: at most 1 (got '1.5')"),
    ("[thresholds]\nidle_leek_s = 1",
     "[thresholds]: unknown key 'idle_leek_s' (did you mean 'idle_leak_s'?)"),
    ('[[targets]]\nurl = "gpu-1:8000"\nname = 5', "targets[0]: name must be a string (got '5')"),
    ('[[targets]]\nurl = "gpu-1:8000"\ngroup = 5', "targets[0]: group must be a string (got '5')"),
])
def test_a_bad_config_value_is_quoted_with_where_it_is(tmp_path: Path, text: str,
                                                       says: str) -> None:
    path = config(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(str(path)) and str(raised.value).endswith(says)


def test_an_unknown_key_like_no_known_one_lists_the_known_ones(tmp_path: Path) -> None:
    path = config(tmp_path, "[thresholds]\nzzzz = 1\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (f"{path}: [thresholds]: unknown key 'zzzz' "
                                 f"(known: {', '.join(LeakParams.__dataclass_fields__)})")


def test_a_long_bad_value_is_cut_short_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(config(tmp_path, f'interval = "{"x" * 200}"\n'))
    assert str(raised.value).endswith(f"(got '{'x' * 79}…')")


def test_a_config_of_exactly_the_size_limit_is_read(tmp_path: Path) -> None:
    head = b"interval = 4\n# "
    path = tmp_path / "config.toml"
    path.write_bytes(head + b"x" * (MAX_CONFIG_BYTES - len(head) - 1) + b"\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(path).interval_s == 4.0


def test_bash_completion_offers_the_commands_first(capsys: pytest.CaptureFixture[str]) -> None:
    """The completion script is generated from the parsers: the command is the first word
    (a TARGET positional in front of it would shift every command to the second)."""
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    shell = ("source /dev/stdin; COMP_WORDS=(kvtop sn); COMP_CWORD=1; _shtab_kvtop; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", shell], input=script, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.split() == ["snapshot"], done.stderr


def test_a_target_names_where_its_kv_events_are(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[targets]]\nurl = "gpu-1:8000"\nkv_events = "tcp://gpu-1:5557"\n'
                    '[[targets]]\nurl = "gpu-2:8000"\n'
                    'kv_events = {url = "tcp://10.0.0.9:6000", replay = "tcp://gpu-2:5558", '
                    'ranks = 4, listen = true}\n[[targets]]\nurl = "gpu-3:8000"\n')
    config = load_config(path)
    assert config.kv_events == {
        "http://gpu-1:8000/metrics": KvEventsEndpoint("tcp://gpu-1:5557"),
        "http://gpu-2:8000/metrics": KvEventsEndpoint("tcp://10.0.0.9:6000",
                                                      "tcp://gpu-2:5558", 4, True)}


@pytest.mark.parametrize("value, says", [
    ('"http://gpu-1:5557"', "targets[0]: kv_events must be tcp://host:port"),
    ('{url = "tcp://h:1", ranks = 0}',
     "targets[0]: kv_events ranks must be a whole number from 1 to 64"),
    ('{url = "tcp://h:1", topic = "x"}', "topic"),
    ("5", "targets[0]: kv_events"),
])
def test_a_kv_events_endpoint_that_cannot_be_used_is_a_config_error(
        tmp_path: Path, value: str, says: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[[targets]]\nurl = "gpu-1:8000"\nkv_events = {value}\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert says in str(raised.value)


@pytest.mark.parametrize("nested", ["a = " + "[" * 5000 + "]" * 5000,
                                    "a = " + "[" * 17 + "]" * 17,
                                    "a = " + "{b = " * 17 + "1" + "}" * 17])
def test_a_config_nested_too_deep_is_a_usage_error_not_a_crash(tmp_path: Path,
                                                                nested: str) -> None:
    """5,000 levels was a RecursionError: exit 70."""
    with pytest.raises(ConfigError, match="nested deeper than a config is"):
        load_config(config(tmp_path, nested + "\n"))


def test_a_config_that_is_not_a_regular_file_is_refused_without_waiting(
        tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)


def test_a_target_may_say_its_max_num_seqs(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[targets]]\nurl = "gpu-1:8000"\nmax_num_seqs = 1\n'
                    '[[targets]]\nurl = "gpu-2:8000"\nmax_num_seqs = 1048576\n'
                    '[[targets]]\nurl = "gpu-3:8000"\n')
    assert load_config(path).limits == {
        "http://gpu-1:8000/metrics": LimitParams(max_num_seqs=1),
        "http://gpu-2:8000/metrics": LimitParams(max_num_seqs=1 << 20)}


@pytest.mark.parametrize("value", ["0", "-1", "true", '"256"', "2.5", str((1 << 20) + 1)])
def test_a_max_num_seqs_that_is_not_a_count_is_a_config_error(tmp_path: Path,
                                                               value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[[targets]]\nurl = "gpu-1:8000"\nmax_num_seqs = {value}\n')
    with pytest.raises(ConfigError, match=r"targets\[0\]: max_num_seqs must be a whole number "
                                          r"from 1 to 1,048,576"):
        load_config(path)
