"""The command line's shared options: targets and their tokens, Prometheus, output, and the
argparse types for durations, numbers and sizes; and the source of scrapes they name
(:func:`open_source`).

Tokens come only from environment variables or files, never from argv, and are never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtop.collect.kv_endpoint import KvEventsEndpoint, parse_endpoint_argument
from kvtop.collect.target import (
    DEFAULT_TARGET,
    HEADER_FORMS,
    Header,
    HeaderError,
    Target,
    TokenError,
    check_cacert,
    parse_header,
    read_token,
)
from kvtop.config import Config, ConfigError, quoted
from kvtop.safe_text import display_text, warn
from kvtop.store.time_range import BadBound, Bound, TimeRange, parse_bound
from kvtop.store.writer import DEFAULT_MAX_BYTES, parse_size, size_text

if TYPE_CHECKING:
    from kvtop.collect.prometheus import PrometheusSettings
    from kvtop.collect.source import Source

DEFAULT_TOKEN_ENV = "KVTOP_TOKEN"
MAX_SIZE_HELP = (f"stop recording when the file would pass SIZE (500M, 2G; 0 for no limit; "
                 f"default {size_text(DEFAULT_MAX_BYTES)})")

# -- argparse types -------------------------------------------------------------------------


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


def size(text: str) -> int:
    """A size in bytes: 500M, 2G, 0 (for argparse ``type=``)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- the terminal --------------------------------------------------------------------------


def no_terminal(who: str, instead: str) -> bool:
    """True, after saying so on stderr, when stdout is not a terminal: the app would write
    its escape codes into a pipe or a file (``kvtop … | cat``, cron). ``instead`` names the
    headless command that does the job there."""
    if sys.stdout.isatty():
        return False
    warn(f"{who}: the app draws on a terminal, and stdout is not one; for a pipe or a file "
         f"use {instead}")
    return True


# -- options --------------------------------------------------------------------------------


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
    parser.add_argument("--header", action="append", metavar="NAME:VALUE",
                        help=f"send this header with every request to the command-line "
                             f"targets (repeatable): {HEADER_FORMS}; a value is a secret, "
                             f"masked everywhere, unless the header is Accept, User-Agent or "
                             f"the like, and a secret is never taken from argv")
    parser.add_argument("--cacert", type=Path, metavar="FILE",
                        help="verify the command-line targets' TLS with this CA bundle (PEM) "
                             "instead of the system's")
    parser.add_argument("--insecure", action="store_true",
                        help="do not verify TLS certificates")
    parser.add_argument("--timeout", type=positive_seconds, metavar="S",
                        help="per-target request deadline (default: 2x interval, 2-5 s)")
    parser.add_argument("--full-metrics", action="store_true",
                        help="read every metric family; by default kvtop asks servers that "
                             "can filter (vLLM) for only the ~20 it reads")


def kv_events_endpoint(text: str) -> KvEventsEndpoint:
    """``tcp://host:port[,tcp://host:replay_port]`` (for argparse ``type=``)."""
    try:
        return parse_endpoint_argument(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (got {quoted(text)})") from None


def add_kv_events_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-events", type=kv_events_endpoint, action="append", default=[],
                        metavar="tcp://HOST:PORT[,REPLAY]",
                        help="subscribe to vLLM's KV events (--kv-events-config) of the "
                             "command-line targets, one each in their order; after a comma "
                             "the replay socket (docs/kv-anatomy.md; in the config: "
                             "kv_events per target)")


def add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", metavar="URL",
                        help="read every vLLM/SGLang server a Prometheus scrapes, through its "
                             "HTTP API (or [prometheus] url in the config)")
    parser.add_argument("--selector", metavar="'{LABEL=\"VALUE\",...}'",
                        help="with --prometheus: only instances whose series match, "
                             "e.g. '{namespace=\"prod\"}'")


def add_output_arguments(parser: argparse.ArgumentParser, text_flags: tuple[str, ...],
                         text_help: str) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="as_json", action="store_true", default=None,
                        help="JSON (the default when stdout is not a terminal)")
    output.add_argument(*text_flags, dest="as_json", action="store_false", help=text_help)


def resolve_targets(args: argparse.Namespace, config: Config) -> list[Target]:
    """Command-line targets (with the command-line token, headers and CA bundle), else the
    config's, else the default one (with the headers and CA bundle)."""
    if not args.targets and config.targets:
        if _request_options(args):
            raise ConfigError("--header and --cacert go with targets on the command line; "
                              "for the config's, give each [[targets]] headers / cacert")
        return config.targets
    try:  # the default target has never been sent a token: it is whatever listens there
        token = read_token(args.token_env, args.token_file,
                           default_env=DEFAULT_TOKEN_ENV) if args.targets else None
    except TokenError as exc:
        raise ConfigError(f"--{exc.field.replace('_', '-')}: {exc}") from None
    request = _command_line_request(args)
    targets = []
    for spec in args.targets or [DEFAULT_TARGET]:
        try:
            targets.append(Target.from_spec(spec, token=token, **request))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return list(dict.fromkeys(targets))  # the same server twice is read once


def _request_options(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "header", None) or getattr(args, "cacert", None))


def _command_line_request(args: argparse.Namespace) -> dict[str, Any]:
    """--header and --cacert, checked: a header as a (name, value) pair, a Secret unless
    harmless and never a secret written in argv; the CA bundle read once."""
    headers: list[Header] = []
    try:
        for spec in getattr(args, "header", None) or ():
            headers.append(parse_header(spec, literal_secrets=False))
    except HeaderError as exc:
        raise ConfigError(f"--header: {exc}") from None
    cacert = getattr(args, "cacert", None)
    if cacert is not None:
        if getattr(args, "insecure", False):
            raise ConfigError("--cacert verifies TLS and --insecure does not: give one")
        try:
            cacert = check_cacert(cacert)
        except ValueError as exc:
            raise ConfigError(f"--cacert: {display_text(exc)}") from None
    return {"headers": tuple(headers), "cacert": cacert}


def resolve_kv_events(args: argparse.Namespace, config: Config,
                      targets: list[Target]) -> dict[str, KvEventsEndpoint]:
    """Where each target's KV events come from, by URL: --kv-events (one per command-line
    target, in their order), else the config's ``kv_events`` of the targets read."""
    given: list[KvEventsEndpoint] = getattr(args, "kv_events", None) or []
    if not given:
        return {t.url: config.kv_events[t.url] for t in targets if t.url in config.kv_events}
    if not getattr(args, "targets", None):
        raise ConfigError("--kv-events names the KV events of the command-line targets, one "
                          "each in their order (a config's target takes kv_events = "
                          "\"tcp://host:port\")")
    if len(given) > len(targets):
        raise ConfigError(f"{len(given)} --kv-events for {len(targets)} target(s): one each, "
                          "in the targets' order")
    return {target.url: endpoint for target, endpoint in zip(targets, given, strict=False)}


def resolve_prometheus(args: argparse.Namespace, config: Config) -> PrometheusSettings | None:
    """--prometheus (with --selector), else the config's [prometheus] url, else None.
    Its token comes from the [prometheus] token_env / token_file only."""
    table = config.prometheus
    url = getattr(args, "prometheus", None) or table.url
    if not url:
        if getattr(args, "selector", None):
            raise ConfigError("--selector needs --prometheus URL (or [prometheus] url)")
        return None
    if getattr(args, "targets", None):
        raise ConfigError("give either targets or --prometheus, not both")
    if _request_options(args):
        raise ConfigError("--header and --cacert are for targets read directly, not "
                          "--prometheus")
    from kvtop.collect.prometheus import load_settings

    selector = getattr(args, "selector", None) or table.selector
    try:
        token = read_token(table.token_env, table.token_file)
        return load_settings(str(url), selector=str(selector), token=token,
                             backfill_step_s=table.backfill_step)
    except TokenError as exc:
        raise ConfigError(f"[prometheus] {exc.field}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"prometheus: {display_text(exc)}") from None


# -- the source the options name ------------------------------------------------------------


@contextlib.contextmanager
def open_source(args: argparse.Namespace, config: Config, *, interval_s: float | None = None,
                replay: Path | None = None, demo: bool = False) -> Iterator[Source]:
    """The source of scrapes a command or the app was given: a recording (``replay``), the
    built-in demo fleet (``demo``, served while the block runs), the instances a Prometheus
    scrapes (--prometheus or the config's [prometheus]), or the targets read directly.
    ``interval_s`` None takes the kind's default."""
    from kvtop.collect.live import DirectSource, PrometheusFeed

    if replay is not None:
        yield _recording(replay)
        return
    settings: dict[str, Any] = {"interval_s": interval_s,
                                "timeout_s": getattr(args, "timeout", None),
                                "insecure": getattr(args, "insecure", False),
                                "narrow": not getattr(args, "full_metrics", False)}
    if demo:
        from kvtop.sim.demo import demo_fleet

        with demo_fleet() as fleet:
            yield DirectSource(fleet.targets, kv_events=fleet.kv_events, **settings)
        return
    if (prometheus := resolve_prometheus(args, config)) is not None:
        if getattr(args, "kv_events", None):
            raise ConfigError("--kv-events names the endpoints of direct targets; Prometheus "
                              "does not carry KV events")
        yield PrometheusFeed(prometheus, **settings)
        return
    targets = resolve_targets(args, config)
    yield DirectSource(targets, kv_events=resolve_kv_events(args, config, targets), **settings)


def _recording(path: Path) -> Source:
    """RecordingError when the file is not a recording (each command says it its way)."""
    from kvtop.store.recording import open_recording
    from kvtop.store.replay import RecordingSource

    return RecordingSource(open_recording(path))


# -- a part of a recording ------------------------------------------------------------------


def _bound(text: str) -> Bound:
    try:
        return parse_bound(text)
    except BadBound as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_time_range_arguments(parser: argparse.ArgumentParser, option: str) -> None:
    """``--since`` / ``--until``: the part of the recording ``option`` reads."""
    what = ("a moment (2026-07-01T12:00:00Z) or an offset from the recording's first "
            "scrape (30m)")
    parser.add_argument("--since", type=_bound, metavar="T",
                        help=f"with {option}: from T, {what}")
    parser.add_argument("--until", type=_bound, metavar="T",
                        help=f"with {option}: up to T, {what}")


def time_range(args: argparse.Namespace, recording: Path | None, option: str) -> TimeRange:
    """The range asked for; ConfigError when given without a recording to cut."""
    found = TimeRange(args.since, args.until)
    if found and recording is None:
        raise ConfigError(f"--since and --until cut a recording: give them with {option}")
    return found
