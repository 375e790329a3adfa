"""Settings from the command line and the TOML config file.

Default file: ``$XDG_CONFIG_HOME/kvtop/config.toml`` (``~/.config/kvtop/config.toml``)::

    interval = 1.0
    [[targets]]
    url = "http://gpu-1:8000"      # or "gpu-1:8000"; /metrics is added when no path is given
    name = "gpu-1"
    group = "prod"
    token_env = "VLLM_METRICS_TOKEN"   # or token_file = "~/.config/kvtop/token"
    kv_events = "tcp://gpu-1:5557"     # vLLM's --kv-events-config endpoint (docs/kv-anatomy.md);
                                       # or {url, replay, ranks, listen}
    [prometheus]                       # read the fleet from Prometheus instead
    url = "http://prometheus:9090"
    selector = '{namespace="prod"}'
    token_env = "PROM_TOKEN"           # or token_file
    [alerts]                           # when an engine enters LEAK or STALLED (docs/alerts.md)
    bell = true
    command = ["notify-send", "kvtop"] # run without a shell, the event as JSON on stdin
    min_interval_s = 300               # per engine and verdict

Tokens come only from environment variables or files, never from argv, and are never printed.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtop.collect.kv_subscriber import KvEventsEndpoint, parse_endpoint
from kvtop.collect.target import DEFAULT_TARGET, Target, TokenError, read_token
from kvtop.derive.leak import LeakParams
from kvtop.safe_text import display_text

if TYPE_CHECKING:
    from kvtop.collect.prometheus import PrometheusSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_TOKEN_ENV = "KVTOP_TOKEN"
TOP_KEYS = ("interval", "targets", "thresholds", "prometheus", "alerts")
TARGET_KEYS = ("url", "name", "group", "token_env", "token_file", "baseline", "kv_events")
KV_EVENTS_KEYS = ("url", "replay", "ranks", "listen")
PROMETHEUS_KEYS = ("url", "selector", "token_env", "token_file", "backfill_step")
ALERT_KEYS = ("bell", "command", "min_interval_s", "max_per_minute", "timeout_s")
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; a huge one is a mistake

# [thresholds] beyond "a finite number >= 0": what each must also be for the detector to work
THRESHOLD_INTS = frozenset(f.name for f in fields(LeakParams) if f.type in ("int", int))
THRESHOLD_POSITIVE = frozenset({"bucket_s", "window_s", "max_gap_s", "history_s",
                                "max_hours_to_full", "pinned_frac", *THRESHOLD_INTS})
THRESHOLD_FRACTIONS = frozenset({"residual_min_frac", "watch_rise_frac", "leak_rise_frac",
                                 "max_load_share", "pinned_frac"})


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """The ``[alerts]`` table (kvtop/alerts.py runs them)."""

    bell: bool = True
    command: tuple[str, ...] = ()  # argv; empty: no command
    min_interval_s: float = 300.0  # one run per engine and verdict in this long
    max_per_minute: int = 6  # runs in all
    timeout_s: float = 10.0  # then the command is killed and reported


class ConfigError(ValueError):
    """A config file, option or target that can't be used; the message says why."""


def quoted(value: object) -> str:
    """A value from the config or the command line, safe to put in a message."""
    return f"'{display_text(value, 80)}'"


def unknown_key(key: str, known: Collection[str], where: str) -> ConfigError:
    """An unknown key, with the closest known one as a suggestion."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known)}"
    return ConfigError(f"{where}: unknown key {quoted(key)} ({hint})")


def check_keys(table: Mapping[str, Any], known: Collection[str], where: str) -> None:
    for key in table:
        if key not in known:
            raise unknown_key(key, known, where)


def finite_number(value: object, what: str, *, positive: bool = True) -> float:
    """``value`` as a float if it is a finite number (> 0, or >= 0 unless ``positive``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and (number > 0 if positive else number >= 0):
            return number
    bound = "> 0" if positive else ">= 0"
    raise ConfigError(f"{what} must be a finite number {bound} (got {quoted(value)})")


def _string(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string (got {quoted(value)})")
    return value


def _table(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a table (got {quoted(value)})")
    return value


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` or ``1d`` -> seconds (for argparse ``type=``)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    text = text.strip().lower()
    scale = units.get(text[-1:])
    try:
        value = float(text[:-1] if scale else text) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {quoted(text)} (e.g. 90s, 30m, 2h)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"a duration must be finite and > 0 (got {quoted(text)})")
    return value


def _number_argument(text: str, ok: Callable[[float], bool], rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {quoted(text)}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"must be a finite number {rule} (got {quoted(text)})")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0 (for argparse ``type=``): nan, inf, 0 and -1 are usage errors."""
    return _number_argument(text, lambda v: v > 0, "> 0")


positive_seconds = positive_number  # intervals, timeouts, speeds


def non_negative_number(text: str) -> float:
    """A finite number >= 0 (for argparse ``type=``)."""
    return _number_argument(text, lambda v: v >= 0, ">= 0")


def fraction(text: str) -> float:
    """A finite number from 0 to 1 (for argparse ``type=``)."""
    return _number_argument(text, lambda v: 0 <= v <= 1, "from 0 to 1")


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kvtop" / "config.toml"


@dataclass(slots=True)
class Config:
    targets: list[Target] = field(default_factory=list)
    interval_s: float | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    prometheus: dict[str, Any] = field(default_factory=dict)  # the [prometheus] table
    baselines: dict[str, str] = field(default_factory=dict)  # target URL -> baseline name
    alerts: AlertSettings = field(default_factory=AlertSettings)
    kv_events: dict[str, KvEventsEndpoint] = field(default_factory=dict)  # target URL -> where


def _target_from_table(entry: object, where: str) -> Target:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each [[targets]] must be a table with url = \"host:port\"")
    check_keys(entry, TARGET_KEYS, where)
    url = _string(entry, "url", where)
    if not url:
        raise ConfigError(f"{where}: each [[targets]] needs url = \"host:port\"")
    name, group = _string(entry, "name", where), _string(entry, "group", where)
    try:
        token = read_token(_string(entry, "token_env", where), _string(entry, "token_file", where))
        return Target.from_spec(url, name=name, group=group, token=token)
    except TokenError as exc:
        raise ConfigError(f"{where}: token_file: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(path: Path | None) -> Config:
    """The config at ``path``, or the default file if it exists, or an empty config.
    Anything unknown, of the wrong type or out of range is a :class:`ConfigError`."""
    explicit = path is not None
    path = path or default_config_path()
    if not path.exists():
        if explicit:
            raise ConfigError(f"config file not found: {path}")
        return Config()
    where = display_text(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES // 1024} KiB")
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {display_text(exc)}") from None
    check_keys(data, TOP_KEYS, where)
    entries = data.get("targets", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: targets must be an array of tables ([[targets]])")
    targets = [_target_from_table(entry, f"{where} targets[{i}]")
               for i, entry in enumerate(entries)]
    baselines = {target.url: name for i, (target, entry) in enumerate(zip(targets, entries,
                                                                          strict=True))
                 if (name := _string(entry, "baseline", f"{where} targets[{i}]"))}
    kv_events = {target.url: _kv_events(entry["kv_events"], f"{where} targets[{i}]")
                 for i, (target, entry) in enumerate(zip(targets, entries, strict=True))
                 if "kv_events" in entry}
    interval = data.get("interval")
    if interval is not None:
        interval = finite_number(interval, f"{where}: interval (seconds)")
    thresholds = _table(data.get("thresholds", {}), f"{where}: [thresholds]")
    config = Config(targets, interval, dict(thresholds), _prometheus_table(data, where),
                    baselines, alert_settings(data.get("alerts", {}), f"{where}: [alerts]"),
                    kv_events)
    try:
        leak_params(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return config


def _kv_events(value: object, where: str) -> KvEventsEndpoint:
    """A target's ``kv_events``: "tcp://host:port", or a table with url, replay, ranks and
    listen (kvtop listens and vLLM connects)."""
    table = {"url": value} if isinstance(value, str) else _table(value, f"{where}: kv_events")
    check_keys(table, KV_EVENTS_KEYS, f"{where}: kv_events")
    try:
        return parse_endpoint(table.get("url"), replay=table.get("replay"),
                              ranks=table.get("ranks", 1), bind=table.get("listen", False))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _prometheus_table(data: dict[str, Any], where: str) -> dict[str, Any]:
    table = _table(data.get("prometheus", {}), f"{where}: [prometheus]")
    check_keys(table, PROMETHEUS_KEYS, f"{where} [prometheus]")
    for key in ("url", "selector", "token_env", "token_file"):
        _string(table, key, f"{where} [prometheus]")
    if table.get("backfill_step") is not None:
        finite_number(table["backfill_step"], f"{where} [prometheus] backfill_step (seconds)")
    return dict(table)


def alert_settings(table: object, where: str) -> AlertSettings:
    """The ``[alerts]`` table: a bell, and an argv list (never a shell line) to run."""
    table = _table(table, where)
    check_keys(table, ALERT_KEYS, where)
    bell = table.get("bell", True)
    if not isinstance(bell, bool):
        raise ConfigError(f"{where}: bell must be true or false (got {quoted(bell)})")
    command = table.get("command", [])
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command) or (
            command and not command[0]):
        raise ConfigError(f"{where}: command must be a list of strings, the program first "
                          "(it is run without a shell), e.g. [\"notify-send\", \"kvtop\"]")
    numbers: dict[str, Any] = {}
    for key, kind in (("min_interval_s", float), ("max_per_minute", int), ("timeout_s", float)):
        if table.get(key) is not None:
            numbers[key] = kind(finite_number(table[key], f"{where}: {key}"))
    return AlertSettings(bell=bell, command=tuple(command), **numbers)


def add_target_arguments(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    if positional:
        parser.add_argument("targets", nargs="*", metavar="TARGET",
                            help=f"host:port or http(s) URL of a /metrics endpoint "
                                 f"(default {DEFAULT_TARGET})")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="TOML config (default $XDG_CONFIG_HOME/kvtop/config.toml, "
                             "else ~/.config/kvtop/config.toml)")
    parser.add_argument("--token-env", metavar="VAR",
                        help=f"read a bearer token for the command-line targets from this "
                             f"environment variable (default {DEFAULT_TOKEN_ENV}, if set)")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help="read a bearer token for the command-line targets from this file")
    parser.add_argument("--insecure", action="store_true",
                        help="do not verify TLS certificates")
    parser.add_argument("--timeout", type=positive_seconds, metavar="S",
                        help="per-target request deadline (default: 2x interval, 2-5 s)")
    parser.add_argument("--full-metrics", action="store_true",
                        help="read every metric family; by default kvtop asks servers that "
                             "can filter (vLLM) for only the ~20 it reads")


def resolve_targets(args: argparse.Namespace, config: Config) -> list[Target]:
    """Command-line targets (with the command-line token), else the config's, else default."""
    if not args.targets:
        return config.targets or [Target.from_spec(DEFAULT_TARGET)]
    try:
        token = read_token(args.token_env or DEFAULT_TOKEN_ENV, args.token_file)
    except TokenError as exc:
        raise ConfigError(f"--token-file: {exc}") from None
    targets = []
    for spec in args.targets:
        try:
            targets.append(Target.from_spec(spec, token=token))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return list(dict.fromkeys(targets))  # the same server twice is read once


def leak_params(config: Config) -> LeakParams:
    """The leak detector's parameters, with any ``[thresholds]`` from the config file."""
    values: dict[str, Any] = {}
    for key, value in config.thresholds.items():
        if key not in THRESHOLD_DEFAULTS:
            raise unknown_key(key, list(THRESHOLD_DEFAULTS), "[thresholds]")
        values[key] = _threshold(key, value)
    return LeakParams(**values)


THRESHOLD_DEFAULTS = {f.name: f.default for f in fields(LeakParams)}


def _threshold(key: str, value: object) -> float:
    what = f"[thresholds] {key}"
    number = finite_number(value, what, positive=key in THRESHOLD_POSITIVE)
    if key in THRESHOLD_INTS:
        if not isinstance(value, int):
            raise ConfigError(f"{what} must be a whole number (got {quoted(value)})")
        return int(value)
    if key in THRESHOLD_FRACTIONS and number > 1:
        raise ConfigError(f"{what} is a fraction: at most 1 (got {quoted(value)})")
    return number


def add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", metavar="URL",
                        help="read every vLLM/SGLang server a Prometheus scrapes, through its "
                             "HTTP API (or [prometheus] url in the config)")
    parser.add_argument("--selector", metavar="'{LABEL=\"VALUE\",...}'",
                        help="with --prometheus: only instances whose series match, "
                             "e.g. '{namespace=\"prod\"}'")


def resolve_prometheus(args: argparse.Namespace, config: Config) -> PrometheusSettings | None:
    """--prometheus (with --selector), else the config's [prometheus] url, else None.
    Its token comes from the [prometheus] token_env / token_file only."""
    table = config.prometheus
    url = getattr(args, "prometheus", None) or table.get("url")
    if not url:
        if getattr(args, "selector", None):
            raise ConfigError("--selector needs --prometheus URL (or [prometheus] url)")
        return None
    if getattr(args, "targets", None):
        raise ConfigError("give either targets or --prometheus, not both")
    from kvtop.collect.prometheus import load_settings

    selector = getattr(args, "selector", None) or table.get("selector", "")
    step = table.get("backfill_step")
    try:
        token = read_token(table.get("token_env"), table.get("token_file"))
        return load_settings(str(url), selector=str(selector), token=token,
                             backfill_step_s=None if step is None else float(step))
    except TokenError as exc:
        raise ConfigError(f"[prometheus] token_file: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"prometheus: {display_text(exc)}") from None
