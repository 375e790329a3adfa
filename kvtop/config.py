"""The TOML config file, read into a :class:`Config` (the command line's options are in
kvtop/cli_args.py).

Default file: ``$XDG_CONFIG_HOME/kvtop/config.toml`` (``~/.config/kvtop/config.toml``)::

    interval = 1.0
    [[targets]]
    url = "http://gpu-1:8000"      # or "gpu-1:8000"; /metrics is added when no path is given
    name = "gpu-1"
    group = "prod"
    token_env = "VLLM_METRICS_TOKEN"   # or token_file = "~/.config/kvtop/token"
    headers = {"X-Api-Key" = "$GATEWAY_KEY"}   # or "@FILE", or the value; masked everywhere
    cacert = "~/.config/kvtop/internal-ca.pem" # verify its TLS with this CA bundle
    kv_events = "tcp://gpu-1:5557"     # vLLM's --kv-events-config endpoint (docs/kv-anatomy.md);
                                       # or {url, replay, ranks, listen}
    max_num_seqs = 256                 # vLLM's, which it does not export (what limits it)
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

import difflib
import math
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvtop.collect.kv_endpoint import KvEventsEndpoint, parse_endpoint
from kvtop.collect.target import (
    Header,
    HeaderError,
    Target,
    TokenError,
    check_cacert,
    parse_header,
    read_token,
)
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.limits import LimitParams
from kvtop.files import UnreadableFile, read_regular
from kvtop.safe_text import display_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; a huge one is a mistake
MAX_CONFIG_DEPTH = 16  # tables and arrays in each other; kvtop's own go 3 deep
MAX_SEQS = 1 << 20  # a target's max_num_seqs (vLLM's default is 256 to 1,024)

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


@dataclass(frozen=True, slots=True)
class TargetTable:
    """One ``[[targets]]`` table, as written (it becomes a :class:`Target`)."""

    url: str
    name: str | None = None
    group: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    baseline: str | None = None  # a saved baseline the app draws for this target
    headers: dict[str, str] | None = None  # sent with every request: NAME = "VALUE"
    cacert: str | None = None  # a CA bundle (PEM) that verifies its TLS instead


@dataclass(frozen=True, slots=True)
class PrometheusTable:
    """The ``[prometheus]`` table: read the fleet from a Prometheus instead."""

    url: str | None = None
    selector: str = ""
    token_env: str | None = None
    token_file: str | None = None
    backfill_step: float | None = None  # seconds between the backfill's points


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


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kvtop" / "config.toml"


@dataclass(slots=True)
class Config:
    """The whole file; ``key`` names a field's top-level key where it is not the field's
    name (None: it comes from the [[targets]] tables)."""

    targets: list[Target] = field(default_factory=list)
    interval_s: float | None = field(default=None, metadata={"key": "interval"})
    thresholds: dict[str, Any] = field(default_factory=dict)
    prometheus: PrometheusTable = field(default_factory=PrometheusTable)
    baselines: dict[str, str] = field(default_factory=dict,  # target URL -> baseline name
                                      metadata={"key": None})
    alerts: AlertSettings = field(default_factory=AlertSettings)
    kv_events: dict[str, KvEventsEndpoint] = field(default_factory=dict,  # target URL -> where
                                                   metadata={"key": None})
    limits: dict[str, LimitParams] = field(default_factory=dict,  # target URL -> max_num_seqs
                                           metadata={"key": None})


def _keys(table: type) -> tuple[str, ...]:
    """The keys a table may have: its dataclass's fields, as the file names them."""
    names = (f.metadata.get("key", f.name) for f in fields(table))
    return tuple(name for name in names if name is not None)


TOP_KEYS = _keys(Config)
# kv_events: a string or a table; max_num_seqs: a number
TARGET_KEYS = (*_keys(TargetTable), "kv_events", "max_num_seqs")
KV_EVENTS_KEYS = ("url", "replay", "ranks", "listen")
PROMETHEUS_KEYS = _keys(PrometheusTable)
ALERT_KEYS = _keys(AlertSettings)


def _target_from_table(entry: object, where: str) -> Target:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each [[targets]] must be a table with url = \"host:port\"")
    check_keys(entry, TARGET_KEYS, where)
    # every key a string but headers, a table read apart below (Any: TargetTable checks it)
    strings: dict[str, Any] = {key: _string(entry, key, where) for key in _keys(TargetTable)
                               if key != "headers"}
    url = strings.pop("url")
    if not url:
        raise ConfigError(f"{where}: each [[targets]] needs url = \"host:port\"")
    table = TargetTable(url=url, **strings)
    try:
        token = read_token(table.token_env, table.token_file)
        cacert = check_cacert(table.cacert) if table.cacert else None
        return Target.from_spec(table.url, name=table.name, group=table.group, token=token,
                                headers=_headers(entry.get("headers", {}), where),
                                cacert=cacert)
    except TokenError as exc:
        raise ConfigError(f"{where}: {exc.field}: {exc}") from None
    except HeaderError as exc:
        raise ConfigError(f"{where}: headers: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _headers(table: object, where: str) -> tuple[Header, ...]:
    """``headers = {"X-Api-Key" = "$GATEWAY_KEY", Accept = "text/plain"}``: values as on the
    command line, and also written out (a file is not argv), each a secret unless harmless."""
    table = _table(table, f"{where}: headers")
    for name, value in table.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}: headers: {quoted(name)} must be a string "
                              f"(got {quoted(value)})")
    return tuple(parse_header(f"{name}:{value}", literal_secrets=True)
                 for name, value in table.items())


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
        data = tomllib.loads(read_regular(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (UnreadableFile, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {display_text(exc)}") from None
    except RecursionError:  # the parser recurses per level: 5,000 levels was exit 70
        raise ConfigError(f"{where}: nested deeper than a config is "
                          f"(at most {MAX_CONFIG_DEPTH} levels)") from None
    if _depth(data) > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{where}: nested deeper than a config is "
                          f"(at most {MAX_CONFIG_DEPTH} levels)")
    check_keys(data, TOP_KEYS, where)
    entries = data.get("targets", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: targets must be an array of tables ([[targets]])")
    targets = [_target_from_table(entry, f"{where} targets[{i}]")
               for i, entry in enumerate(entries)]
    baselines = {target.url: name for i, (target, entry) in enumerate(zip(targets, entries,
                                                                          strict=True))
                 if (name := _string(entry, "baseline", f"{where} targets[{i}]"))}
    numbered = list(enumerate(zip(targets, entries, strict=True)))
    kv_events = {target.url: _kv_events(entry["kv_events"], f"{where} targets[{i}]")
                 for i, (target, entry) in numbered if "kv_events" in entry}
    limits = {target.url: _limit_params(entry["max_num_seqs"], f"{where} targets[{i}]")
              for i, (target, entry) in numbered if "max_num_seqs" in entry}
    interval = data.get("interval")
    if interval is not None:
        interval = finite_number(interval, f"{where}: interval (seconds)")
    thresholds = _table(data.get("thresholds", {}), f"{where}: [thresholds]")
    config = Config(targets, interval, dict(thresholds), _prometheus_table(data, where),
                    baselines, alert_settings(data.get("alerts", {}), f"{where}: [alerts]"),
                    kv_events, limits)
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


def _limit_params(value: object, where: str) -> LimitParams:
    """A target's ``max_num_seqs`` (vLLM's scheduler limit, which it does not export): what
    tells "max sequences" from "token budget" without waiting for a plateau."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEQS:
        raise ConfigError(f"{where}: max_num_seqs must be a whole number from 1 to "
                          f"{MAX_SEQS:,} (got {quoted(value)})")
    return LimitParams(max_num_seqs=value)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _prometheus_table(data: dict[str, Any], where: str) -> PrometheusTable:
    table = _table(data.get("prometheus", {}), f"{where}: [prometheus]")
    check_keys(table, PROMETHEUS_KEYS, f"{where} [prometheus]")
    strings = {key: _string(table, key, f"{where} [prometheus]")
               for key in ("url", "selector", "token_env", "token_file")}
    step = table.get("backfill_step")
    if step is not None:
        step = finite_number(step, f"{where} [prometheus] backfill_step (seconds)")
    return PrometheusTable(url=strings["url"], selector=strings["selector"] or "",
                           token_env=strings["token_env"], token_file=strings["token_file"],
                           backfill_step=step)


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
