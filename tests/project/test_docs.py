"""``docs/semantics.md`` keeps up with the registry and the kernel contract; the API
reference (``docs/api/``, a page per area) lists every public name on exactly one page;
every docstring that lists methods lists the registry's; nothing shipped or run cites the
contract's numbering."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import re
from types import ModuleType
from typing import Any

import pytest

import specdec_np
import specdec_np.testing
from specdec_np import registry
from specdec_np._runtime import contract as _contract

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEMANTICS = ROOT / "docs" / "semantics.md"


def text() -> str:
    return SEMANTICS.read_text()


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_verifier_is_described(name: str) -> None:
    entry = registry.get(name)
    page = text()
    assert f"`{entry.name}`" in page
    assert f"`{entry.function_name}`" in page
    assert f"`{entry.sampler_name}`" in page
    for parameter in entry.parameters:
        assert f"`{parameter.name} = {parameter.default}`" in page, parameter.name


def test_flag_table_matches_the_registry() -> None:
    rows = {
        match[0]: [cell.strip() for cell in match[1].split("|")]
        for match in re.findall(r"^\| `(\w+)` \|(.*)\|$", text(), re.M)
    }
    for entry in registry.VERIFIERS:
        stochastic, lossless, reads, counts = rows[entry.name][:4]
        assert stochastic == ("yes" if entry.stochastic else "no"), entry.name
        assert lossless == ("yes" if entry.lossless else "no"), entry.name
        assert reads == ("yes" if entry.reads_draft_probs else "no"), entry.name
        assert counts == ("causal" if entry.causal_counts else "independent"), entry.name


def stated(pattern: str) -> list[float]:
    return [float(value) for value in re.findall(pattern, text())]


def test_contract_constants_are_stated_with_their_values() -> None:
    number = r"([0-9][0-9.e+-]*)"
    assert stated(rf"`GREEDY_MARGIN = {number}`") == [_contract.GREEDY_MARGIN]
    assert stated(rf"`ROW_SUM_TOLERANCE = {number}`") == [_contract.ROW_SUM_TOLERANCE]
    entropy = stated(rf"ln\(p_i\(y\) \+ {number}\)")
    assert entropy == [_contract.ENTROPY_EPSILON]


def test_readme_links_the_page() -> None:
    assert "(docs/semantics.md)" in (ROOT / "README.md").read_text()


# -- the API reference and the method lists ------------------------------------------------

API = ROOT / "docs" / "api"


def public_modules() -> list[ModuleType]:
    """Every public module of the package that declares ``__all__`` (no part of its name
    starts with an underscore), the package first."""
    found = [specdec_np]
    for info in pkgutil.walk_packages(specdec_np.__path__, "specdec_np."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__"):
            found.append(module)
    return found


PUBLIC_MODULES = public_modules()


def test_the_public_modules_are_found() -> None:
    names = {module.__name__ for module in PUBLIC_MODULES}
    expected = {"specdec_np", "specdec_np.registry", "specdec_np.metrics", "specdec_np.samplers",
                "specdec_np.verify", "specdec_np.engine", "specdec_np.sharded",
                "specdec_np.adapters.vllm", "specdec_np.adapters.jax", "specdec_np.testing",
                "specdec_np.cli"}  # fmt: skip
    assert expected <= names, sorted(expected - names)


def resolve(qualified: str) -> Any:
    """The object a dotted name names: its longest importable prefix, then attributes."""
    parts = qualified.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise ImportError(qualified)


def identity(qualified: str, value: Any) -> object:
    """What makes two names the same public name: the object itself for a module, a class
    or a function (so that a re-export is the same name), the qualified name for data."""
    if isinstance(value, ModuleType) or callable(value):
        return id(value)
    return qualified


DIRECTIVE = re.compile(r"^\.\. (auto\w+|currentmodule|module):: *(\S+)", re.M)


def page_entries(text: str) -> list[str]:
    """The qualified names one page documents: its ``.. auto*::`` directives, a dotted
    name as it is, a bare one in the module of the last ``currentmodule`` or ``automodule``
    above it (as autodoc resolves them)."""
    module = None
    entries = []
    for directive, target in DIRECTIVE.findall(text):
        if directive in ("currentmodule", "module", "automodule"):
            module = target
            if directive == "automodule":
                entries.append(target)
        elif "." in target:
            entries.append(target)
        else:
            assert module, f"{directive}:: {target} comes before any currentmodule"
            entries.append(f"{module}.{target}")
    return entries


def placement_errors(
    pages: dict[str, list[str]], modules: list[ModuleType]
) -> list[str]:
    """What is wrong with the pages of the API reference: a name of a public module's
    ``__all__`` on no page or on two, and an entry that names nothing."""
    errors = []
    on_pages: dict[object, list[str]] = {}
    for page, entries in pages.items():
        for entry in entries:
            try:
                value = resolve(entry)
            except (ImportError, AttributeError):
                errors.append(f"{page}: {entry} names nothing")
                continue
            on_pages.setdefault(identity(entry, value), []).append(page)
    for module in modules:
        for name in module.__all__:
            qualified = f"{module.__name__}.{name}"
            found = on_pages.get(identity(qualified, getattr(module, name)), [])
            if len(found) != 1:
                errors.append(f"{qualified} is on {len(found)} pages {sorted(found)}, not one")
    return errors


def api_pages() -> dict[str, list[str]]:
    return {path.name: page_entries(path.read_text()) for path in sorted(API.glob("*.rst"))}


def test_every_public_name_is_on_exactly_one_page() -> None:
    pages = api_pages()
    assert len(pages) >= 10 and "index.rst" in pages
    errors = placement_errors(pages, PUBLIC_MODULES)
    assert not errors, "docs/api/:\n" + "\n".join(errors)


def test_every_page_is_in_the_index() -> None:
    index = (API / "index.rst").read_text()
    listed = set(re.findall(r"^   (\w+)$", index, re.M))
    assert listed == {path.stem for path in API.glob("*.rst")} - {"index"}


def test_the_placement_check_fails_its_controls() -> None:
    """Negative controls: a public name on no page, one on two pages (a re-export counts
    as the same name), and an entry that names nothing are each found."""
    pages = api_pages()
    chains = pages["chains.rst"]
    left_out = {**pages, "chains.rst": [e for e in chains if e != "specdec_np.create_output"]}
    assert placement_errors(left_out, PUBLIC_MODULES) == [
        "specdec_np.create_output is on 0 pages [], not one",
        "specdec_np.verify.create_output is on 0 pages [], not one",
    ]
    twice = {**pages, "extra.rst": ["specdec_np.verify.create_output"]}
    assert len(placement_errors(twice, PUBLIC_MODULES)) == 2
    stale = {**pages, "extra.rst": ["specdec_np.no_such_function"]}
    assert placement_errors(stale, PUBLIC_MODULES) == [
        "extra.rst: specdec_np.no_such_function names nothing"
    ]
    assert page_entries(
        ".. currentmodule:: a.b\n\n.. autofunction:: f\n\n.. autoclass:: c.D\n"
        ".. automodule:: e\n   :no-members:\n.. autodata:: G\n"
    ) == ["a.b.f", "c.D", "e", "e.G"]


def listing_errors(name: str, docstring: str) -> list[str]:
    """What is wrong with the method lists of one docstring: a list of two or more
    methods of one registry table that is not the whole table, or a placeholder left."""
    errors = []
    if re.search(r"^\s*\[\[[\w ]+\]\]\s*$", docstring, re.M):
        errors.append(f"{name}: a method-list placeholder was not filled")
    quoted = set(re.findall(r'"(\w+)"', docstring))
    tables = {
        "tree methods": set(registry.tree_method_names()),
        "verifiers": set(registry.names()),
    }
    for table, names in tables.items():
        # "greedy" is in both tables; the others say which table a list is of.
        own = names - set.intersection(*tables.values())
        if len(quoted & own) >= 2 and not names <= quoted:
            errors.append(f"{name} lists {table} {sorted(quoted & names)}, not {sorted(names)}")
    return errors


def public_docstrings() -> dict[str, str]:
    """Every public module's, function's, class's and method's docstring, by qualified
    name."""
    found: dict[str, str] = {}
    for module in PUBLIC_MODULES:
        found[module.__name__] = module.__doc__ or ""
        for name in module.__all__:
            value: Any = getattr(module, name)
            if isinstance(value, ModuleType) or not callable(value):
                continue
            found[f"{module.__name__}.{name}"] = inspect.getdoc(value) or ""
            if inspect.isclass(value):
                for member, attribute in vars(value).items():
                    if callable(attribute) and getattr(attribute, "__doc__", None):
                        found[f"{module.__name__}.{name}.{member}"] = attribute.__doc__
    return found


def test_every_docstring_that_lists_methods_lists_the_registry() -> None:
    docstrings = public_docstrings()
    assert "specdec_np.verify_tree" in docstrings and "specdec_np.EngineVerifier" in docstrings
    errors = [error for name, text in docstrings.items() for error in listing_errors(name, text)]
    assert not errors, "\n".join(errors)
    for method in registry.tree_method_names():
        assert f'``"{method}"``' in docstrings["specdec_np.verify_tree"], method
    for method in registry.names():
        assert f'``"{method}"``' in docstrings["specdec_np.verify_ragged"], method
        assert f'``"{method}"``' in docstrings["specdec_np.EngineVerifier"], method


def test_the_listing_check_finds_a_stale_list() -> None:
    """The check fails a docstring that lists some methods of a table, not all."""
    stale = 'method : str\n    ``"greedy"``, ``"point_mass"``, ``"specinfer"`` or ``"rrs"``.'
    assert listing_errors("stale", stale)
    # Two of the verifier table's names, not all of them.
    assert listing_errors("chains", " or ".join(f'``"{name}"``' for name in registry.names()[:2]))
    assert listing_errors("left", "Parameters\n    [[tree methods]]\n")
    whole = " ".join(f'"{name}"' for name in registry.tree_method_names())
    assert not listing_errors("whole", whole)
    assert not listing_errors("one", 'method="specinfer" reads draft rows')


# The contract's own numbering (its sections and the issues it was written from) means
# nothing to a reader of the shipped files: each reference says what the rule is instead.
# docs/semantics.md's sections ("docs/semantics.md §N") are the project's own and fine.
CONTRACT_REFERENCE = re.compile(
    "|".join([r"\bSPEC[ ](?:[0-9]|§)", r"\bissue[ ][0-9]", r"[(]issue\b",
              r"\bsection[ ][0-9]+ of the spec"])  # fmt: skip
)
SHIPPED_AND_RUN = [
    "tests", "specdec_np", "examples", "docs", ".ci/run", "pyproject.toml", "setup.py",
    "MANIFEST.in", "README.md", "specdec_np_pytest_plugin.py",
]  # fmt: skip
TEXT_SUFFIXES = {".py", ".pyx", ".pxi", ".pyi", ".h", ".cu", ".cuh", ".md", ".rst", ".toml",
                 ".in", ""}  # fmt: skip


def _contract_references(paths: list[pathlib.Path], root: pathlib.Path = ROOT) -> list[str]:
    found = []
    for top in paths:
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in files:
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES or "_build" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if CONTRACT_REFERENCE.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_nothing_shipped_or_run_cites_the_contracts_numbering() -> None:
    paths = [ROOT / name for name in SHIPPED_AND_RUN if (ROOT / name).exists()]
    assert _contract_references(paths) == []


def test_the_citation_check_fails_its_control(tmp_path: pathlib.Path) -> None:
    """Negative control: each form of citation is found; the project's own docs are not."""
    sample = tmp_path / "sample.md"
    forms = ["SPEC" + " 6", "SPEC" + " §4", "issue" + " 11", "(" + "issue twenty)",
             "section" + " 9 of the spec"]  # fmt: skip
    sample.write_text("\n".join([*forms, "docs/semantics.md §8", "the issues of a tree"]))
    assert len(_contract_references([sample], tmp_path)) == len(forms)


# -- the Examples sections ------------------------------------------------------------------


def public_objects() -> dict[str, Any]:
    """Every public module, class and function of the package, once (under the first name
    it has in :data:`PUBLIC_MODULES`)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for module in PUBLIC_MODULES:
        named = [(module.__name__, module)]
        named += [(f"{module.__name__}.{name}", getattr(module, name)) for name in module.__all__]
        for qualified, value in named:
            if id(value) not in seen and (isinstance(value, ModuleType) or callable(value)):
                seen.add(id(value))
                found[qualified] = value
    return found


PUBLIC_OBJECTS = public_objects()
EXAMPLE_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_every_public_function_and_class_has_examples() -> None:
    missing = [
        name
        for name, value in PUBLIC_OBJECTS.items()
        if not isinstance(value, ModuleType)
        and "\nExamples\n--------\n" not in (inspect.getdoc(value) or "")
    ]
    assert not missing, f"no Examples section: {missing}"


def examples_of(name: str, value: Any) -> list[doctest.DocTest]:
    """The doctests of one object's own docstring (not its members')."""
    finder = doctest.DocTestFinder(recurse=False)
    return [test for test in finder.find(value, name, globs={}) if test.examples]


def missing_imports(tests: list[doctest.DocTest]) -> list[str]:
    """The top-level modules the examples import (those that are not skipped) that are not
    installed here: torch, JAX."""
    imported = {
        match
        for test in tests
        for example in test.examples
        if not example.options.get(doctest.SKIP)
        for match in re.findall(r"^\s*(?:from|import)\s+(\w+)", example.source, re.M)
    }
    return sorted(name for name in imported if importlib.util.find_spec(name) is None)


def run_examples(tests: list[doctest.DocTest]) -> tuple[int, int, str]:
    """Run doctests with the flags the docstrings are written for: (tried, failed, report)."""
    runner = doctest.DocTestRunner(optionflags=EXAMPLE_FLAGS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    return results.attempted, results.failed, "".join(report)


@pytest.mark.parametrize(
    "name", [name for name, value in PUBLIC_OBJECTS.items() if examples_of(name, value)]
)
def test_the_examples_run(name: str) -> None:
    tests = examples_of(name, PUBLIC_OBJECTS[name])
    if missing := missing_imports(tests):
        pytest.skip(f"the examples import {missing}, not installed")
    tried, failed, report = run_examples(tests)
    assert tried and not failed, report


def test_the_example_runner_fails_a_wrong_example() -> None:
    """Negative control: an example whose output is wrong fails; one that imports a module
    that is not installed is found."""

    def wrong() -> None:
        """Return nothing.

        >>> import numpy as np
        >>> np.arange(3)
        array([0, 1, 3])
        >>> import no_such_module_of_specdec  # doctest: +SKIP
        """

    tests = examples_of("wrong", wrong)
    tried, failed, report = run_examples(tests)
    assert (tried, failed) == (2, 1) and "array([0, 1, 2])" in report
    assert missing_imports(tests) == []
    wrong.__doc__ = ">>> import no_such_module_of_specdec\n"
    assert missing_imports(examples_of("wrong", wrong)) == ["no_such_module_of_specdec"]
