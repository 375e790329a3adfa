"""The mutation script's map: every module of kvtop/ has tests to score it by (issue 28)."""

from __future__ import annotations

import importlib.util
import sys

from tests.support.paths import REPO

spec = importlib.util.spec_from_file_location("mutation", REPO / "scripts" / "mutation.py")
assert spec is not None and spec.loader is not None
mutation = importlib.util.module_from_spec(spec)
sys.modules["mutation"] = mutation
spec.loader.exec_module(mutation)


def test_every_module_of_kvtop_is_mapped_to_its_tests() -> None:
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "kvtop").rglob("*.py")}
    assert sorted(modules - set(mutation.MODULES)) == []
    assert sorted(set(mutation.MODULES) - modules) == []


def test_every_test_a_module_names_exists() -> None:
    named = {test.split("::")[0] for tests in mutation.MODULES.values() for test in tests
             if not test.startswith("--deselect")}
    deselected = {tests[i + 1].split("::")[0] for tests in mutation.MODULES.values()
                  for i, test in enumerate(tests) if test == "--deselect"}
    assert sorted(path for path in named - {"--deselect"} | deselected
                  if not (REPO / path).exists()) == []
