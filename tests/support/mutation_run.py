"""What a mutation run (scripts/mutation.py sets KVTOP_MUTATION=1) changes in the suite.

The normal suite keeps Hypothesis's defaults, each property test's own `max_examples`, and
kvtop's caches warm across tests. A mutation run reruns the tests once per planted bug:

* Hypothesis's "mutation" profile keeps each property test to a few fixed examples, so the
  behaviour and unit tests do the catching and a mutant costs seconds, not tens of them;
* the tests a mutant runs go fastest first (`fastest_first`): mutmut hands them over in no
  order and stops at the first failure, so a bug the quick tests catch costs a second, not
  the slow tests' time before them;
* every test starts with kvtop's caches empty (`cold_caches`). mutmut runs a mutant only
  against the tests that reached the mutated function in a first, recorded run; with the
  caches warm, only the first test to see a comment line or label block reaches the code
  that parses it, and a bug there would be tested by that one test alone.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hypothesis import settings

from kvtop.collect.bounded import BoundedCache

MUTATION = os.environ.get("KVTOP_MUTATION") == "1"

settings.register_profile("mutation", max_examples=10, derandomize=True, database=None,
                          deadline=None)
settings.load_profile("mutation" if MUTATION else "default")


def examples(normal: int) -> int:
    """A property test's example count: `normal`, or the mutation profile's few."""
    return settings.default.max_examples if MUTATION else normal


def cold_caches() -> None:
    """Empty every functools cache and BoundedCache held by a loaded kvtop module."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "kvtop" or name.startswith("kvtop.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, BoundedCache):
                value.clear()
            elif callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def fastest_first(items: list[Any]) -> None:
    """Order a mutation run's tests by the durations mutmut recorded in its first run
    (mutmut-stats.json in its working folder); unknown ones last, in their order."""
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    durations = json.loads(stats.read_text(encoding="utf-8")).get("duration_by_test", {})
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
