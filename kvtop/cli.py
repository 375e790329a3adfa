"""The ``kvtop`` command: the terminal app by default, subcommands for headless work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtop import __version__
from kvtop.config import (
    ConfigError,
    add_target_arguments,
    load_config,
    parse_duration,
    resolve_targets,
)

EXIT_USAGE = 2


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _snapshot_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "snapshot", help="read the targets once and print JSON or a table",
        description="Read every target (two scrapes --interval apart, so rates are filled "
                    "in) and print the snapshot JSON (docs/snapshot-json.md) or a table. "
                    "Exit 0 when every target was read, 3 when any could not be.")
    add_target_arguments(parser)
    parser.add_argument("--interval", type=_positive, default=1.0, metavar="S",
                        help="seconds between the samples (default 1)")
    parser.add_argument("--samples", type=int, choices=(1, 2), default=2,
                        help="1 for a single scrape (no rates), 2 (default) for rates")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="as_json", action="store_true", default=None,
                        help="JSON (the default when stdout is not a terminal)")
    output.add_argument("--table", dest="as_json", action="store_false",
                        help="a readable table")
    parser.add_argument("--no-gpu", action="store_true", help="leave local GPUs out")
    parser.set_defaults(command=_run_snapshot)


def _run_snapshot(args: argparse.Namespace) -> int:
    from kvtop.headless.snapshot_command import run_snapshot

    targets = resolve_targets(args, load_config(args.config))
    return run_snapshot(targets, samples=args.samples, interval_s=args.interval,
                        timeout_s=args.timeout, insecure=args.insecure,
                        as_json=args.as_json, with_gpus=not args.no_gpu)


def _record_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "record", help="write every scrape to a recording for replay and check",
        description="Poll the targets and write every scrape (body or error) to a recording "
                    "(docs/recording-format.md; gzip when FILE ends in .gz) until --duration "
                    "passes or Ctrl-C.")
    add_target_arguments(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE")
    parser.add_argument("--interval", type=_positive, default=1.0, metavar="S",
                        help="seconds between scrapes of a target (default 1)")
    parser.add_argument("--duration", type=parse_duration, metavar="D",
                        help="stop after D (90s, 30m, 2h); default: until Ctrl-C")
    parser.set_defaults(command=_run_record)


def _run_record(args: argparse.Namespace) -> int:
    from kvtop.headless.record_command import run_record

    targets = resolve_targets(args, load_config(args.config))
    return run_record(targets, args.output, interval_s=args.interval,
                      duration_s=args.duration, timeout_s=args.timeout, insecure=args.insecure)


def _sim_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvtop.sim.cli import add_sim_parser, run_sim

    add_sim_parser(subparsers).set_defaults(command=run_sim)


SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "snapshot": _snapshot_parser,
    "record": _record_parser,
    "sim": _sim_parser,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvtop",
        description="htop for the KV cache of vLLM, SGLang and llama.cpp servers.",
        epilog="Subcommands: " + ", ".join(SUBCOMMANDS) + " (kvtop COMMAND --help)")
    parser.add_argument("--version", action="version", version=f"kvtop {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in SUBCOMMANDS.values():
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    command = getattr(args, "command", None)
    if command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return command(args)
    except ConfigError as exc:
        print(f"kvtop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
