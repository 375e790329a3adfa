"""Settings from the command line and the TOML config file.

Default file: ``$XDG_CONFIG_HOME/kvtop/config.toml`` (``~/.config/kvtop/config.toml``)::

    interval = 1.0
    [[targets]]
    url = "http://gpu-1:8000"      # or "gpu-1:8000"; /metrics is added when no path is given
    name = "gpu-1"
    group = "prod"
    token_env = "VLLM_METRICS_TOKEN"   # or token_file = "~/.config/kvtop/token"
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
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtop.collect.target import DEFAULT_TARGET, Target, read_token
from kvtop.derive.leak import LeakParams

if TYPE_CHECKING:
    from kvtop.collect.prometheus import PrometheusSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_TOKEN_ENV = "KVTOP_TOKEN"
PROMETHEUS_KEYS = frozenset({"url", "selector", "token_env", "token_file", "backfill_step"})
ALERT_KEYS = frozenset({"bell", "command", "min_interval_s", "max_per_minute", "timeout_s"})


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """The ``[alerts]`` table (kvtop/ui/alerts.py runs them)."""

    bell: bool = True
    command: tuple[str, ...] = ()  # argv; empty: no command
    min_interval_s: float = 300.0  # one run per engine and verdict in this long
    max_per_minute: int = 6  # runs in all
    timeout_s: float = 10.0  # then the command is killed and reported


class ConfigError(ValueError):
    """A config file or target that can't be used; the message says why."""


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` or ``1d`` -> seconds (for argparse ``type=``)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    text = text.strip().lower()
    scale = units.get(text[-1:])
    try:
        value = float(text[:-1] if scale else text) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be > 0")
    return value


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kvtop" / "config.toml"


@dataclass(slots=True)
class Config:
    targets: list[Target] = field(default_factory=list)
    interval_s: float | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    prometheus: dict[str, Any] = field(default_factory=dict)  # the [prometheus] table
    alerts: AlertSettings = field(default_factory=AlertSettings)


def _target_from_table(entry: dict[str, Any], where: str) -> Target:
    if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
        raise ConfigError(f"{where}: each [[targets]] needs url = \"host:port\"")
    try:
        token = read_token(entry.get("token_env"), entry.get("token_file"))
    except OSError as exc:
        raise ConfigError(f"{where}: token_file: {exc.strerror}: {exc.filename}") from None
    try:
        return Target.from_spec(entry["url"], name=entry.get("name"), group=entry.get("group"),
                                token=token)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(path: Path | None) -> Config:
    """The config at ``path``, or the default file if it exists, or an empty config."""
    explicit = path is not None
    path = path or default_config_path()
    if not path.exists():
        if explicit:
            raise ConfigError(f"config file not found: {path}")
        return Config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    targets = [_target_from_table(entry, f"{path} targets[{i}]")
               for i, entry in enumerate(data.get("targets", []))]
    interval = data.get("interval")
    if interval is not None and (not isinstance(interval, (int, float)) or interval <= 0):
        raise ConfigError(f"{path}: interval must be a positive number of seconds")
    return Config(targets, None if interval is None else float(interval),
                  dict(data.get("thresholds", {})), _prometheus_table(data, path),
                  alert_settings(data.get("alerts", {}), f"{path}: [alerts]"))


def _prometheus_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    table = data.get("prometheus", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [prometheus] must be a table")
    unknown = set(table) - PROMETHEUS_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [prometheus] key(s): {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(PROMETHEUS_KEYS))})")
    return dict(table)


def alert_settings(table: object, where: str) -> AlertSettings:
    """The ``[alerts]`` table: a bell, and an argv list (never a shell line) to run."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(table) - ALERT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s): {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(ALERT_KEYS))})")
    bell = table.get("bell", True)
    if not isinstance(bell, bool):
        raise ConfigError(f"{where}: bell must be true or false")
    command = table.get("command", [])
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command) or (
            command and not command[0]):
        raise ConfigError(f"{where}: command must be a list of strings, the program first "
                          "(it is run without a shell), e.g. [\"notify-send\", \"kvtop\"]")
    numbers = {}
    for key, kind in (("min_interval_s", float), ("max_per_minute", int), ("timeout_s", float)):
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or value == float("inf"):
            raise ConfigError(f"{where}: {key} must be a positive number")
        numbers[key] = kind(value)
    return AlertSettings(bell=bell, command=tuple(command), **numbers)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"host:port or URL of a /metrics endpoint (default {DEFAULT_TARGET})")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help=f"TOML config (default {default_config_path()})")
    parser.add_argument("--token-env", metavar="VAR",
                        help=f"read a bearer token for the command-line targets from this "
                             f"environment variable (default {DEFAULT_TOKEN_ENV}, if set)")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help="read a bearer token for the command-line targets from this file")
    parser.add_argument("--insecure", action="store_true",
                        help="do not verify TLS certificates")
    parser.add_argument("--timeout", type=float, metavar="S",
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
    except OSError as exc:
        raise ConfigError(f"--token-file: {exc.strerror}: {exc.filename}") from None
    targets = []
    for spec in args.targets:
        try:
            targets.append(Target.from_spec(spec, token=token))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return list(dict.fromkeys(targets))  # the same server twice is read once


def leak_params(config: Config) -> LeakParams:
    """The leak detector's parameters, with any ``[thresholds]`` from the config file."""
    kinds = {f.name: int if f.type in ("int", int) else float for f in fields(LeakParams)}
    unknown = set(config.thresholds) - set(kinds)
    if unknown:
        raise ConfigError(f"unknown [thresholds] key(s): {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(kinds))})")
    try:
        return LeakParams(**{k: kinds[k](v) for k, v in config.thresholds.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[thresholds]: {exc}") from None


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
    except OSError as exc:
        raise ConfigError(f"[prometheus] token_file: {exc.strerror}: {exc.filename}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"prometheus: {exc}") from None
