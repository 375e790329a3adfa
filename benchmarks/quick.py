"""`--quick`: every benchmark's run with small numbers, seconds instead of minutes. Its
numbers mean nothing; tests/unit/test_benchmarks.py runs each benchmark so, so that none of
them rots unseen between the runs whose numbers the docs quote."""

from __future__ import annotations

import argparse
from typing import Any


def quick_option(parser: argparse.ArgumentParser, **small: Any) -> None:
    """Add --quick, which sets each option named in ``small`` to its value."""
    values = ", ".join(f"{name} {value}" for name, value in small.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"the smoke test's run, small numbers ({values or 'none needed'}); "
                             "its numbers mean nothing")
    parser.set_defaults(quick_values=small)


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed options, with --quick's small numbers in place."""
    args = parser.parse_args()
    if args.quick:
        for name, value in args.quick_values.items():
            setattr(args, name, value)
    return args
