"""``kvtop rehearse``: a go-live rehearsal with a GO / NO-GO verdict (docs/rehearse.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import shutil
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from kvtop.cli_args import (
    add_target_arguments,
    non_negative_number,
    parse_duration,
    resolve_targets,
)
from kvtop.config import ConfigError, leak_params, load_config
from kvtop.exits import EXIT_CANNOT_RUN, EXIT_NO_GO, EXIT_OK, EXIT_USAGE
from kvtop.report.output import emit

if TYPE_CHECKING:
    from kvtop.rehearse.run import RehearsalSettings

EXIT_FOR = {"go": EXIT_OK, "no-go": EXIT_NO_GO, "no-verdict": EXIT_CANNOT_RUN}
DEFAULT_DURATION = "3h"
LOAD_OPTIONS = ("workload", "rate", "concurrency", "model", "chat", "token_ids")
# Kept here, not imported, so building kvtop's parser loads none of the rehearsal's modules.
WORKLOAD_NAMES = "mixed, shared-prefix, mooncake, azure"
DEFAULT_MAX_ERRORS_PCT = 1.0


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: ``kind`` of the text, which must be > 0."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError("must be a finite number > 0")
        return value
    return parse


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "rehearse", help=summary,
        description="Drive load through the server's OpenAI-compatible API (or only watch, "
                    "with --watch-only), watch its /metrics and the local GPUs, and judge "
                    "three criteria: GPU memory stable, free KV not falling, slow-request "
                    "share not rising. NO-GO on a leak, a stalled engine, over --max-errors "
                    "% of requests failed, a server that answers nothing, or two soft "
                    "signals (--strict: one); GO only when free KV and latency were judged, "
                    "else no verdict (exit 3) with what is missing. Writes a recording, a "
                    "per-request log and the report to --out. docs/rehearse.md has the "
                    "rules.")
    add_target_arguments(parser)
    for action in parser._actions:  # the shared positional describes /metrics endpoints
        if action.dest == "targets":
            action.help = ("the server: host:port or its URL (its API at /v1 and its "
                           "/metrics are found from it)")
    parser.add_argument("--duration", type=parse_duration, default=parse_duration(
        DEFAULT_DURATION), metavar="D", help=f"how long to load (default {DEFAULT_DURATION})")
    parser.add_argument("--workload", default="mixed", metavar="W",
                        help=f"{WORKLOAD_NAMES} or trace:FILE (default mixed)")
    parser.add_argument("--rate", type=_positive(float), metavar="R",
                        help="requests/s, evenly spaced (a trace: its mean rate)")
    parser.add_argument("--concurrency", type=_positive(int), metavar="N",
                        help="most requests in flight (default 8; 256 with --rate or a trace)")
    parser.add_argument("--model", metavar="NAME", help="default: the one /v1/models lists")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the files go (default ./rehearsal-DATE-TIME)")
    parser.add_argument("--strict", action="store_true",
                        help="NO-GO when GPU memory or latency fails alone")
    parser.add_argument("--full-duration", action="store_true",
                        help="run the whole duration even after a confirmed leak or stall "
                             "(by default the load stops then: the verdict is NO-GO)")
    parser.add_argument("--watch-only", action="store_true",
                        help="drive no load (bring your own tool); watch and judge the same")
    parser.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    parser.add_argument("--token-ids", action="store_true",
                        help="send prompts as token ids (servers without a tokenizer)")
    parser.add_argument("--interval", type=_positive(float), default=1.0, metavar="S",
                        help="seconds between scrapes (default 1)")
    parser.add_argument("--request-timeout", type=_positive(float), default=300.0,
                        metavar="S", help="seconds a request may take (default 300)")
    parser.add_argument("--retries", type=int, default=1, metavar="N",
                        help="retries of a request refused or dropped before an answer "
                             "(default 1; counted apart)")
    parser.add_argument("--max-errors", type=non_negative_number,
                        default=DEFAULT_MAX_ERRORS_PCT,
                        metavar="PCT", help="NO-GO above this %% of failed requests (default 1)")
    parser.add_argument("--time-scale", type=_positive(float), default=1.0, metavar="S",
                        help="the target's clock runs S times wall time (kvtop sim --speed S):"
                             " durations, rates and latencies are read in its time")
    parser.add_argument("--no-gpu", action="store_true", help="do not read local GPUs")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--json", dest="as_json", action="store_true", default=None,
                        help="print the report as JSON (the default when stdout is not a "
                             "terminal)")
    return parser


def settings_from_args(args: argparse.Namespace) -> RehearsalSettings:
    """Check the options against each other and find the target's API and /metrics."""
    from kvtop.rehearse.run import RehearsalSettings

    if len(args.targets) != 1:
        raise ConfigError("kvtop rehearse takes one TARGET: host:port or the server's URL")
    if args.watch_only:
        given = [f"--{name.replace('_', '-')}" for name in LOAD_OPTIONS
                 if getattr(args, name) not in (None, False, "mixed")]
        if given:
            raise ConfigError(f"--watch-only drives no load: drop {', '.join(given)}")
    if args.retries < 0 or args.max_errors < 0:
        raise ConfigError("--retries and --max-errors must be >= 0")
    if args.token_ids and args.chat:
        raise ConfigError("--token-ids sends completions; a chat takes text")
    _check_workload(args.workload)
    config = load_config(args.config)
    (target,) = resolve_targets(args, config)
    base = _server_base(target.url)
    metrics = dataclasses.replace(target, url=base + "/metrics")
    return RehearsalSettings(
        metrics=metrics, api_base=None if args.watch_only else base + "/v1",
        duration_s=args.duration, out_dir=args.out or _default_out(),
        workload=args.workload, rate=args.rate, concurrency=args.concurrency,
        model=args.model, strict=args.strict, watch_only=args.watch_only, chat=args.chat,
        token_ids=args.token_ids, interval_s=args.interval, scrape_timeout_s=args.timeout,
        request_timeout_s=args.request_timeout, retries=args.retries,
        time_scale=args.time_scale, max_error_rate=args.max_errors / 100,
        full_duration=args.full_duration,
        insecure=args.insecure, full_metrics=args.full_metrics,
        leak_params=leak_params(config))


def _check_workload(spec: str) -> None:
    """Refuse an unknown workload or a missing trace before anything is sent."""
    if spec.startswith("trace:"):
        path = Path(spec[len("trace:"):]).expanduser()
        if not path.is_file():
            raise ConfigError(f"--workload {spec}: no such file")
    elif spec not in WORKLOAD_NAMES.split(", "):
        raise ConfigError(f"--workload {spec!r}: choose {WORKLOAD_NAMES} or trace:FILE")


def _server_base(url: str) -> str:
    """The server's root from what was given: host:port, its URL, .../v1 or .../metrics."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in ("/metrics", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _default_out() -> Path:
    return Path.cwd() / f"rehearsal-{datetime.now():%Y%m%d-%H%M%S}"


def run(args: argparse.Namespace) -> int:
    from kvtop.collect.nvml import NvmlReader
    from kvtop.rehearse.report import render_text
    from kvtop.rehearse.run import BadUsage, CannotRun, rehearse
    from kvtop.safe_text import display_text

    settings = settings_from_args(args)
    reader = None if args.no_gpu else NvmlReader()
    progress = None if args.quiet else sys.stderr
    if progress is not None:
        where = settings.metrics.url if settings.watch_only else settings.api_base
        print(display_text(f"kvtop rehearse: {where} for {settings.duration_s:g} s -> "
                           f"{settings.out_dir}"), file=progress)
    try:
        doc = asyncio.run(rehearse(settings, gpu_reader=reader, progress=progress))
    except BadUsage as exc:
        print(f"kvtop rehearse: {display_text(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except CannotRun as exc:  # may quote the server: made safe for the terminal
        print(f"kvtop rehearse: {display_text(exc)}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    emit(doc, args.as_json, lambda d: render_text(d, width))
    return EXIT_FOR[doc["verdict"]]

