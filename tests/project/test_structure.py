"""The package's structure (issue 19): layered imports, module sizes, a static public API.

* The import graph of ``specdec_np`` (every ``import`` statement, at module level or inside
  a function) has no cycle, and the registry imports nothing of the package.
* No source file of the package is over 1,000 lines.
* Every public name is defined by a ``def`` or ``class`` statement that static tools can
  see: nothing is injected through ``globals()``.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import specdec_np

PACKAGE = Path(specdec_np.__file__).resolve().parent
MODULES = sorted(PACKAGE.glob("*.py"))
SOURCE_SUFFIXES = {".py", ".pyx", ".pxi", ".pxd", ".pyi", ".h", ".cuh", ".cu"}
MAX_LINES = 1000


def _imports(path: Path) -> set[str]:
    """The package modules that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_np."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("specdec_np."):
                    found.add(alias.name.split(".")[1])
    return {name for name in found if (PACKAGE / f"{name}.py").exists() or name == "_core"}


def _graph() -> dict[str, set[str]]:
    return {path.stem: _imports(path) - {path.stem} for path in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for following in sorted(graph.get(node, ())):
            if state.get(following) == 1:
                return stack[stack.index(following) :] + [following]
            if following not in state:
                found = visit(following)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    """Negative control: a graph with a cycle is reported."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_registry_imports_nothing_of_the_package() -> None:
    assert _graph()["registry"] == set()


@pytest.mark.parametrize(
    "path",
    [path for path in sorted(PACKAGE.rglob("*")) if path.suffix in SOURCE_SUFFIXES],
    ids=lambda path: str(path.relative_to(PACKAGE)),
)
def test_no_source_file_is_over_1000_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines"


def test_nothing_is_injected_through_globals() -> None:
    injection = re.compile(r"globals\(\)\[[^\]]*\]\s*=")
    for path in MODULES:
        assert not injection.search(path.read_text()), path.name


def _top_level_definitions(module: object) -> set[str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
    }


@pytest.mark.parametrize("name", [n for n in specdec_np.__all__ if n != "__version__"])
def test_every_public_name_is_a_static_definition(name: str) -> None:
    obj = getattr(specdec_np, name)
    if inspect.ismodule(obj) or not callable(obj):
        return
    module = inspect.getmodule(obj)
    assert module is not None and module.__name__.startswith("specdec_np")
    assert obj.__name__ == name
    assert name in _top_level_definitions(module), (
        f"{name} is not defined by a def or class statement in {module.__name__}"
    )


def test_every_named_front_of_the_registry_is_public_and_names_its_entry() -> None:
    for verifier in specdec_np.registry.VERIFIERS:
        if verifier.function_name is not None:
            assert verifier.function_name in specdec_np.__all__
        if verifier.sampler_name is not None:
            assert verifier.sampler_name in specdec_np.__all__
            assert getattr(specdec_np, verifier.sampler_name)._verifier is verifier
