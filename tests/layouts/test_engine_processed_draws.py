"""Draws from logits rows, processed block by block, against the same draws from the whole
processed rows.

From logits the kernels never materialise a processed row: at a rejected position (and for
a drawn bonus, and for block verification's and typical acceptance's whole-row scans) each
block of the row is processed into cache-resident scratch and used there.  That must change
nothing: given the processed rows as probabilities (made by the header's own
materialisation, compiled here as in ``test_logits.py``), the verifier draws from exactly
those bits, so the token drawn from logits must be the token drawn from the probabilities
for every uniform, knife-edge uniforms at block boundaries included.  The acceptance
decisions are made decisive (``q(x)`` near 1 against a flat target, or a target peaked at
the draft), because from logits ``p(x)`` is not rounded to the rows' dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from draw_checks import LARGEST_BELOW_ONE
from test_logits import Logits, _build

import specdec_np
from specdec_np import registry

#: Block length of the kernels' inverse CDF (``MIN_BLOCK`` in ``_core.pyx``) for V below 1M.
BLOCK = 2048
#: The verifiers whose emitted token at a rejection comes from the processed row.
PROCESSED = tuple(
    verifier.name
    for verifier in registry.VERIFIERS
    if verifier is not registry.get("greedy")  # greedy reads raw rows
)
FILTERS = {
    "off": (0, 1.0, 0.0),
    "top_k_top_p": (700, 0.9, 0.0),
    "min_p": (0, 1.0, 0.002),
}


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> Logits:
    return _build(Path(tmp_path_factory.mktemp("processed")), "vector")


def _processed(header: Logits, rows: np.ndarray, temperature: float, filters: str) -> Any:
    top_k, top_p, min_p = FILTERS[filters]
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        law = header.row_law(np.ascontiguousarray(row), temperature, top_k, top_p, min_p)
        out[r] = header.materialise(np.ascontiguousarray(row), temperature, law)
    return out


def _knife_uniforms(weights: np.ndarray) -> list[float]:
    """Uniforms whose threshold falls at block boundaries (and one ulp either side), at the
    last positive weight, and at the ends of [0, 1)."""
    cumulative = np.cumsum(weights)
    total = cumulative[-1]
    uniforms = [0.0, 0.5, LARGEST_BELOW_ONE]
    edges = [j * BLOCK - 1 for j in range(1, len(weights) // BLOCK + 1)]
    edges.append(int(np.flatnonzero(weights > 0)[-1]))
    for edge in edges:
        centre = float(cumulative[edge] / total)
        uniforms += [centre, float(np.nextafter(centre, 0.0)), float(np.nextafter(centre, 1.0))]
    return [u for u in uniforms if 0.0 <= u < 1.0]


def _case(vocab: int, dtype: Any, outcome: str, seed: int) -> dict[str, Any]:
    """One request with k = 1: its target rows [2, V] and draft row [1, V] as logits, its
    draft id, and the acceptance uniform that makes the outcome decisive."""
    rng = np.random.default_rng([seed, vocab])
    target = (rng.standard_normal((2, vocab)) * 2).astype(dtype)
    draft = (rng.standard_normal((1, vocab)) * 2).astype(dtype)
    x = int(rng.integers(vocab))
    if outcome == "reject":
        draft[0, x] += 30  # q(x) about 1 against a flat target: rejected
        acceptance = LARGEST_BELOW_ONE
    else:
        target[0, x] += 30  # p(x) about 1: accepted with u = 0, then the bonus is drawn
        acceptance = 0.0
    return {"target": target, "draft": draft, "x": x, "acceptance": acceptance}


@pytest.mark.parametrize("method", PROCESSED)
@pytest.mark.parametrize("vocab", [2048, 2049, 6150])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("filters", sorted(FILTERS))
@pytest.mark.parametrize("outcome", ["reject", "bonus"])
@pytest.mark.parametrize("point_mass", [False, True])
def test_processed_draws_equal_draws_from_materialised_rows(
    header: Logits,
    method: str,
    vocab: int,
    dtype: Any,
    filters: str,
    outcome: str,
    point_mass: bool,
) -> None:
    case = _case(vocab, dtype, outcome, seed=11)
    temperature = 0.8
    top_k, top_p, min_p = FILTERS[filters]
    target_p = _processed(header, case["target"], temperature, filters)
    draft_p = _processed(header, case["draft"], temperature, filters)
    x = case["x"]
    if outcome == "reject":
        q = np.zeros(vocab) if point_mass else draft_p[0].astype(np.float64)
        if point_mass:
            q[x] = 1.0
        weights = np.maximum(target_p[0].astype(np.float64) - q, 0.0)
    else:
        weights = target_p[1].astype(np.float64)
    common = {
        "num_draft_tokens": np.array([1]),
        "draft_token_ids": np.array([x]),
        "method": method,
        "temperature": temperature,
    }
    compared = 0
    for v in _knife_uniforms(weights):
        uniforms = np.array([[case["acceptance"], v, v]])
        from_logits = specdec_np.verify_ragged(
            target_logits=case["target"],
            draft_logits=None if point_mass else case["draft"],
            top_k=top_k or None,
            top_p=top_p if top_p < 1 else None,
            min_p=min_p or None,
            uniforms=uniforms,
            **common,
        )
        from_rows = specdec_np.verify_ragged(
            target_probs=target_p,
            draft_probs=None if point_mass else draft_p,
            uniforms=uniforms,
            **common,
        )
        expected_length = 0 if outcome == "reject" else 1
        assert int(from_rows.accepted_lengths[0]) == expected_length
        assert from_logits.output_token_ids.tolist() == from_rows.output_token_ids.tolist(), v
        compared += 1
    assert compared >= 4


def test_the_comparison_sees_a_different_draw() -> None:
    """The comparison can fail: the bonus token depends on the uniform, so a draw that read
    the wrong block or the wrong uniform would not go unnoticed."""
    case = _case(6150, np.float32, "bonus", seed=11)
    tokens = set()
    for v in (0.0, 0.5, LARGEST_BELOW_ONE):
        result = specdec_np.verify_ragged(
            num_draft_tokens=np.array([1]),
            draft_token_ids=np.array([case["x"]]),
            target_logits=case["target"],
            draft_logits=case["draft"],
            temperature=0.8,
            uniforms=np.array([[0.0, v, v]]),
        )
        tokens.add(int(result.output_token_ids[0, 1]))
    assert len(tokens) == 3
