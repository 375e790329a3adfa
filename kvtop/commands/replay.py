"""``kvtop replay FILE``: the terminal app on a recording (pause, step, seek, speed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtop.cli_args import no_terminal, positive_seconds
from kvtop.exits import EXIT_USAGE


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "replay", help=summary,
        description="Replay a recording in the terminal app; everything (history, rates, "
                    "the leak indicator) is computed as it was live. Keys: space pause, "
                    ". step, [ ] seek ({ } ten at a time), < > speed, ? for all.")
    parser.add_argument("recording", type=Path, metavar="FILE",
                        help="a recording written by kvtop record, kvtop check --record or "
                             "the app's --record (JSON Lines, .gz or not)")
    parser.add_argument("--speed", type=positive_seconds, default=1.0, metavar="X",
                        help="recording seconds per second (default 1)")
    parser.add_argument("--snapshot-dir", type=Path, default=Path.cwd(), metavar="DIR",
                        help="where the s key writes snapshots of the replayed moment "
                             "(default: current directory)")
    parser.add_argument("--baseline", metavar="NAME",
                        help="draw this saved baseline against the recording (as kvtop "
                             "--baseline)")
    return parser


def run(args: argparse.Namespace) -> int:
    from kvtop.baseline.overlay import baseline_overlay
    from kvtop.ui.replay import run_replay  # Textual only here: the other commands start light

    baseline = baseline_overlay(args.baseline, {}) if args.baseline else None
    if no_terminal("kvtop replay", "`kvtop check --replay FILE` (a verdict) or "
                                   "`kvtop snapshot` on a live target"):
        return EXIT_USAGE
    return run_replay(args.recording, speed=args.speed, snapshot_dir=args.snapshot_dir,
                      baseline=baseline)
