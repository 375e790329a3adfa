"""``kvtop compare``: a run (live, recorded, or another baseline) against a saved baseline
(docs/baseline-format.md, docs/compare-json.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kvtop.cli_args import add_time_range_arguments, time_range
from kvtop.commands.baseline import (
    NoData,
    first,
    from_recording,
    has_data,
    live,
    live_arguments,
    load,
)
from kvtop.config import ConfigError
from kvtop.exits import EXIT_NO_DATA, EXIT_USAGE
from kvtop.report.output import emit
from kvtop.safe_text import warn

if TYPE_CHECKING:
    from kvtop.baseline.model import Baseline, ProbeSummary


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare", help=summary,
        description="Compare a run with a saved baseline: config changes first, then each "
                    "figure better, same or worse beyond run-to-run noise (a rank test on "
                    "per-minute values; docs/baseline-format.md). The run is live targets "
                    "watched for --duration, a recording (--replay), or another baseline "
                    "(give its name or path as the only TARGET). JSON: docs/compare-json.md.")
    parser.usage = ("kvtop compare BASELINE [TARGET ... --duration D | --replay RECORDING | "
                    "OTHER_BASELINE] [--json] [options]")
    live_arguments(parser, "", "BASELINE")
    parser.add_argument("--replay", type=Path, metavar="RECORDING",
                        help="compare a recording instead of live targets")
    add_time_range_arguments(parser, "--replay")
    parser.add_argument("--json", dest="as_json", action="store_true", default=None,
                        help="JSON (the default when stdout is not a terminal)")
    return parser


def _other_baseline(args: argparse.Namespace) -> str | None:
    """The one TARGET when it names a saved baseline (or a baseline file) and nothing asks
    for a live run."""
    from kvtop.baseline import store

    if len(args.targets) != 1 or args.duration or args.probe or args.replay:
        return None
    spec = args.targets[0]
    return spec if store.exists(spec) else None


def run(args: argparse.Namespace) -> int:
    from kvtop.baseline.compare import ModelMismatch, compare
    from kvtop.baseline.text import render_comparison

    base = load(first(args, "BASELINE (a saved name or a path)"))
    if args.replay is not None and (args.targets or args.duration or args.probe):
        raise ConfigError("--replay reads a recording: give no targets, --duration or "
                          "--probe with it")
    time_range(args, args.replay, "--replay")
    try:
        if args.replay is not None:
            now = from_recording(args.replay, args, None)
        elif (other := _other_baseline(args)) is not None:
            now = load(other)
        else:
            now = live(args, None, _probe_of(base))
    except NoData as exc:
        warn(f"kvtop compare: {exc}")
        return EXIT_NO_DATA
    if not has_data(now):
        warn("kvtop compare: no engine was read in this run; nothing to compare")
        return EXIT_NO_DATA
    try:
        result = compare(base, now)
    except ModelMismatch as exc:
        warn(f"kvtop compare: {exc}")
        return EXIT_USAGE
    emit(result.to_json(), args.as_json, render_comparison)
    return result.exit_code()


def _probe_of(base: Baseline) -> ProbeSummary | None:
    return next((t.probe for t in base.targets if t.probe is not None), None)
