"""``docs/semantics.md`` keeps up with the registry and the kernel contract."""

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
