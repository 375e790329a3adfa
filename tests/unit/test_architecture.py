"""The house rules of docs/architecture.md, read from the code: every import points down the
layers, no two modules import each other (TYPE_CHECKING imports count: a type two modules
need lives below both), every module sits in a layer, and only ui/ imports Textual."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "kvtop"
# Lowest first. A module may import from its own unit and from the units of lower layers;
# units of one layer never import each other. A new folder or top-level module must be
# placed here (test_every_module_has_a_layer), which is where its room is decided.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvtop",),  # the package itself: its version
    ("kvtop.safe_text", "kvtop.exits", "kvtop.runtime", "kvtop.contract", "kvtop.files"),
    ("kvtop.crash",),
    ("kvtop.collect",),
    ("kvtop.derive",),
    ("kvtop.store", "kvtop.report", "kvtop.sim"),
    ("kvtop.config",),
    ("kvtop.cli_args",),
    ("kvtop.load",),
    ("kvtop.baseline",),
    ("kvtop.rehearse",),
    ("kvtop.view", "kvtop.alerts"),
    ("kvtop.ui",),
    ("kvtop.commands",),
    ("kvtop.cli",),
    ("kvtop.manpage", "kvtop.__main__"),
)
TEXTUAL_ONLY_IN = "kvtop.ui"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every kvtop module ``path`` imports, at any depth (inside functions, TYPE_CHECKING)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("kvtop"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("kvtop"):
                continue
            for alias in node.names:  # `from kvtop.view import format` imports a module
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in known else node.module


def unit_of(module: str) -> tuple[int, str] | None:
    """(layer, unit): the longest unit name the module is or sits under."""
    found = [(len(unit), layer, unit) for layer, units in enumerate(LAYERS) for unit in units
             if module == unit or module.startswith(unit + ".")]
    if not found:
        return None
    _, layer, unit = max(found)
    return layer, unit


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(path, known)) for name, path in known.items()}


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if unit_of(name) is None] == []


def test_every_import_points_down() -> None:
    wrong = []
    for module, imported in graph().items():
        here = unit_of(module)
        for target in imported:
            there = unit_of(target)
            assert here is not None and there is not None, (module, target)
            if there[1] != here[1] and there[0] >= here[0]:
                wrong.append(f"{module} (layer {here[0]}) imports {target} (layer {there[0]})")
    assert wrong == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in edges), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_even_for_types() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]],
                                       expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_only_the_ui_imports_textual() -> None:
    outside = []
    for name, path in modules().items():
        if name == TEXTUAL_ONLY_IN or name.startswith(TEXTUAL_ONLY_IN + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "textual":
                outside.append(name)
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "textual"
                                                    for a in node.names):
                outside.append(name)
    assert outside == []


LONG_MODULE_LINES = 500
LONG_REASON = "Over 500 lines:"  # how a long module's docstring starts saying why


def test_a_module_over_500_lines_says_why_in_its_docstring() -> None:
    long = {}
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LONG_MODULE_LINES:
            long[name] = LONG_REASON in (ast.get_docstring(ast.parse(text)) or "")
    assert sorted(name for name, said in long.items() if not said) == []


LARGEST_UI_CLASS = 300  # lines: the app is composed of parts, not one class holding them all
UI_PACKAGE = PACKAGE / "ui"


def class_lengths(source: str) -> dict[str, int]:
    """Every class of ``source`` (nested ones too) -> its lines, decorators and docstring
    included."""
    lengths = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            lengths[node.name] = node.end_lineno - first + 1
    return lengths


def test_every_class_in_the_ui_is_under_300_lines() -> None:
    long = {f"{module_name(path)}.{name}": lines
            for path in sorted(UI_PACKAGE.rglob("*.py"))
            for name, lines in class_lengths(path.read_text(encoding="utf-8")).items()
            if lines >= LARGEST_UI_CLASS}
    assert long == {}


def test_class_lengths_count_decorators_and_nested_classes() -> None:
    source = "@dataclass\nclass Outer:\n    class Inner:\n        x = 1\n\n    y = 2\n"
    assert class_lengths(source) == {"Outer": 6, "Inner": 2}
