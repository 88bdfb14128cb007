"""``docs/semantics.md`` keeps up with the registry and the kernel contract; nothing shipped
or run cites the contract's numbering."""

from __future__ import annotations

import pathlib
import re

import pytest

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
