"""``docs/semantics.md`` keeps up with the registry and the kernel contract; ``docs/api.rst``
lists every public name; every docstring that lists methods lists the registry's; nothing
shipped or run cites the contract's numbering."""

from __future__ import annotations

import inspect
import pathlib
import re
from types import ModuleType
from typing import Any

import pytest

import specdec_np
import specdec_np.testing
from specdec_np import registry
from specdec_np._runtime import contract as _contract
from specdec_np.adapters import jax as jax_adapter
from specdec_np.adapters import vllm as vllm_adapter

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

PUBLIC_MODULES = [specdec_np, registry, specdec_np.testing, vllm_adapter, jax_adapter]


def documented_names() -> set[str]:
    """The names ``docs/api.rst`` documents (``.. auto*::`` directives and modules)."""
    api = (ROOT / "docs" / "api.rst").read_text()
    return set(re.findall(r"^\.\. auto\w+:: ([\w.]+)", api, re.M))


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda module: module.__name__)
def test_the_api_reference_lists_every_public_name(module: ModuleType) -> None:
    documented = documented_names()
    missing = [
        name
        for name in module.__all__
        if name not in documented
        and f"{module.__name__}.{name}" not in documented
        and not (isinstance(getattr(module, name), ModuleType)
                 and getattr(module, name).__name__ in documented)
    ]
    assert not missing, f"docs/api.rst does not list {module.__name__}: {missing}"


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
