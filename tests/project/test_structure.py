"""The package's structure: layered imports, the house's layout, module sizes, a static
public API.

* The import graph of ``specdec_np``, every module of every folder by its dotted name
  (every ``import`` statement, at module level or inside a function, relative or absolute),
  has no cycle, and the registry imports nothing of the package.
* The package root holds the public modules and at most three private ones (``_core``, the
  compiled kernels, and ``_version`` today); no C header, Cython include file or CUDA
  source lies there: they live in ``_kernels/src``.
* Every private folder's ``__init__.py`` opens with a map of the folder: a docstring that
  names each of its modules and sub-folders.
* No source file of the package is over 1,000 lines (an alarm: a file that grows past it
  has more than one job).
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
SOURCE_SUFFIXES = {".py", ".pyx", ".pxi", ".pxd", ".pyi", ".h", ".cuh", ".cu"}
#: Kernel sources that belong in ``_kernels/src``, never at the package root.
KERNEL_SUFFIXES = {".h", ".hpp", ".c", ".cpp", ".pxi", ".pxd", ".cu", ".cuh"}
MAX_LINES = 1000
MAX_PRIVATE_ROOT_MODULES = 3
#: The compiled module, a node of the graph without a Python source to read.
COMPILED = {"_core"}


def _module_names(package: Path) -> dict[str, Path]:
    """Every Python module under ``package``, by dotted name (a package by its
    ``__init__.py``)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules that module ``name`` (at ``path``) imports, anywhere in the file,
    as dotted names of ``known``: ``from package import module`` is an import of the
    module, ``from package import attribute`` one of the package."""
    root = next(iter(known)).split(".")[0] if known else name.split(".")[0]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != root and not source.startswith(root + "."):
                continue
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in known else source)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(root + "."):
                    found.add(alias.name)
    return {module for module in found if module in known}


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """The import graph of every module of ``package``, by dotted name."""
    modules = _module_names(package)
    known = set(modules) | {f"{package.name}.{name}" for name in COMPILED}
    graph = {name: _imports(name, path, known) - {name} for name, path in modules.items()}
    graph.update({f"{package.name}.{name}": set() for name in COMPILED})
    return graph


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


def test_the_graph_reads_every_module_of_every_folder() -> None:
    graph = _graph()
    assert set(graph) >= {
        "specdec_np", "specdec_np.registry", "specdec_np._core",
        "specdec_np._runtime.arrays", "specdec_np._layouts.ragged",
        "specdec_np._kernels.dispatch", "specdec_np._reference.chains",
        "specdec_np.testing._padded",
    }  # fmt: skip
    # Relative imports of either depth and absolute ones resolve to the dotted module.
    assert "specdec_np._kernels.dispatch" in graph["specdec_np._layouts.tree"]
    assert "specdec_np._core" in graph["specdec_np._layouts.ragged"]
    assert "specdec_np.registry" in graph["specdec_np._layouts.ragged"]
    assert "specdec_np._runtime.arrays" in graph["specdec_np.verify"]


def test_a_cycle_across_folders_is_found(tmp_path: Path) -> None:
    """Negative control: a package whose sub-folder module imports back up, relatively and
    absolutely, is a cycle of the graph."""
    package = tmp_path / "pkg"
    (package / "_inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "top.py").write_text("from ._inner import low\n")
    (package / "_inner" / "__init__.py").write_text("")
    (package / "_inner" / "low.py").write_text("def f():\n    from .. import top\n")
    assert _cycle(_graph(package)) == ["pkg._inner.low", "pkg.top", "pkg._inner.low"]
    (package / "_inner" / "low.py").write_text("import pkg.top\n")
    assert _cycle(_graph(package)) == ["pkg._inner.low", "pkg.top", "pkg._inner.low"]
    (package / "_inner" / "low.py").write_text("import numpy\n")
    assert _cycle(_graph(package)) is None


def test_the_registry_imports_nothing_of_the_package() -> None:
    assert _graph()["specdec_np.registry"] == set()


# -- the house: the package root and the folders' maps ---------------------------------------


def _root_problems(package: Path) -> list[str]:
    """What breaks the rules of the package root: too many private modules, kernel sources."""
    problems = []
    private = {
        path.name.split(".")[0]
        for path in package.iterdir()
        if path.is_file() and path.name.startswith("_") and not path.name.startswith("__")
    }
    if len(private) > MAX_PRIVATE_ROOT_MODULES:
        problems.append(f"{len(private)} private modules at the root: {sorted(private)}")
    for path in sorted(package.iterdir()):
        if path.is_file() and path.suffix in KERNEL_SUFFIXES and path.name != "_core.c":
            problems.append(f"kernel source at the root: {path.name}")
    return problems


def _map_problems(folder: Path) -> list[str]:
    """What the map of ``folder`` (its ``__init__.py`` docstring) fails to name."""
    init = folder / "__init__.py"
    if not init.exists():
        return [f"{folder.name} has no __init__.py"]
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    if not docstring or "map of this" not in docstring.lower():
        return [f"{folder.name}/__init__.py does not open with a map of its folder"]
    entries = sorted(
        path.stem if path.is_file() else path.name
        for path in folder.iterdir()
        if path.name not in {"__init__.py", "__pycache__"}
        and (path.is_dir() or path.suffix in SOURCE_SUFFIXES)
    )
    return [
        f"{folder.name}/__init__.py's map does not name {entry}"
        for entry in entries
        if not re.search(rf"(?<![\w]){re.escape(entry)}(?![\w])", docstring)
    ]


def test_the_root_holds_few_private_modules_and_no_kernel_source() -> None:
    assert _root_problems(PACKAGE) == []
    assert {p.name for p in PACKAGE.iterdir() if p.suffix in {".pyx", ".pyi"}} == {
        "_core.pyx", "_core.pyi"
    }  # fmt: skip


def test_the_root_rules_fail_their_controls(tmp_path: Path) -> None:
    """Negative controls: a fourth private module and a header at the root are reported."""
    for name in ["__init__.py", "_core.pyx", "_core.pyi", "_version.py", "_a.py", "_b.py"]:
        (tmp_path / name).write_text("")
    assert _root_problems(tmp_path) == ["4 private modules at the root: "
                                        "['_a', '_b', '_core', '_version']"]  # fmt: skip
    (tmp_path / "_b.py").unlink()
    (tmp_path / "rowscan.h").write_text("")
    assert _root_problems(tmp_path) == ["kernel source at the root: rowscan.h"]


@pytest.mark.parametrize(
    "folder",
    sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name.startswith("_")
           and p.name != "__pycache__"),
    ids=lambda path: path.name,
)  # fmt: skip
def test_every_private_folder_opens_with_a_map(folder: Path) -> None:
    assert _map_problems(folder) == []


def test_the_map_rule_fails_its_controls(tmp_path: Path) -> None:
    """Negative controls: a folder without a map, and a map that misses a module."""
    folder = tmp_path / "_things"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""Things."""\n')
    (folder / "alpha.py").write_text("")
    (folder / "alphabet.py").write_text("")
    assert _map_problems(folder) == ["_things/__init__.py does not open with a map of its folder"]
    (folder / "__init__.py").write_text('"""Things.\n\nMap of this folder:\n\n* alphabet\n"""\n')
    assert _map_problems(folder) == ["_things/__init__.py's map does not name alpha"]


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
    for path in _module_names(PACKAGE).values():
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
