"""The kit's control for the coded rule of hierarchical speculative decoding.

arXiv 2601.05724's public code weights a chain's paths by the prefix ratio
``min(1, prod_{j <= i} p_j(x_j) / q_j(x_j))`` where block verification caps the weight at
every step (``docs/semantics.md``; ``specdec_np/_reference/chains.py``, ``_path_weights``).
An exact enumeration proves that rule is not lossless on a small example (its two-token law
is 3/16 away from the target's in total variation), that the control
``broken_verifiers.hierarchical_prefix_ratio`` implements it exactly, and then that the kit
reports it as failing, whatever the seed.
"""

from __future__ import annotations

import itertools
from typing import Any

import broken_verifiers as bv
import numpy as np
import pytest

from specdec_np import registry, testing

# Position 0 has a surplus (p / q = 7/4), position 1 a deficit (p / q = 4/7).
P = np.array([[0.875, 0.125], [0.5, 0.5], [0.5, 0.5]])
Q = np.array([[0.5, 0.5], [0.125, 0.875]])


def _rule(p: np.ndarray, q: np.ndarray, drafts: tuple[int, int],
          prefix_ratio: bool) -> tuple[list[float], list[np.ndarray]]:
    """Block verification's ``h_1, h_2`` and recovery laws ``R_0, R_1`` for drafts
    ``(x_0, x_1)``, with its capped path weights or with the prefix ratio."""
    ratio = [p[i, x] / q[i, x] for i, x in enumerate(drafts)]
    rho_1 = min(1.0, ratio[0])
    rho_2 = min(1.0, ratio[0] * ratio[1]) if prefix_ratio else min(1.0, rho_1 * ratio[1])
    residuals = [np.maximum(p[0] - q[0], 0.0), np.maximum(rho_1 * p[1] - q[1], 0.0)]
    total = residuals[1].sum()
    h_1 = total / (total + 1.0 - rho_1) if total + 1.0 - rho_1 > 0 else 1.0
    recovery = [r / r.sum() if r.sum() > 0 else p[i] for i, r in enumerate(residuals)]
    return [h_1, rho_2], recovery


def two_token_law(p: np.ndarray, q: np.ndarray, prefix_ratio: bool) -> np.ndarray:
    """The exact law ``[V, V]`` of the first two tokens (continued by ``p_1`` after a
    rejection at position 0), every draft tuple enumerated, the uniforms integrated:
    ``tau = 2`` with ``h_2``, 1 with ``h_1 (1 - h_2)``, 0 with ``(1 - h_1)(1 - h_2)``."""
    vocab_size = p.shape[1]
    law = np.zeros((vocab_size, vocab_size))
    for drafts in itertools.product(range(vocab_size), repeat=2):
        weight = q[0, drafts[0]] * q[1, drafts[1]]
        (h_1, h_2), recovery = _rule(p, q, drafts, prefix_ratio)
        law[drafts] += weight * h_2
        law[drafts[0]] += weight * h_1 * (1.0 - h_2) * recovery[1]
        law += weight * (1.0 - h_1) * (1.0 - h_2) * np.outer(recovery[0], p[1])
    return law


def _cells(points: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Midpoints and widths of ``[0, 1)`` cut at ``points``."""
    edges = np.unique(np.clip([0.0, 1.0, *points], 0.0, 1.0))
    return (edges[:-1] + edges[1:]) / 2, np.diff(edges)


def verifier_two_token_law(verifier: Any, prefix_ratio: bool) -> np.ndarray:
    """The law of the verifier's first two tokens, exactly, if it follows the rule: for
    each draft tuple the three uniform axes are cut at the thresholds the rule compares
    them with (``h_1``, ``h_2``, the residual CDF points), so the verifier is constant on
    each cell."""
    vocab_size = P.shape[1]
    law = np.zeros((vocab_size, vocab_size))
    for drafts in itertools.product(range(vocab_size), repeat=2):
        (h_1, h_2), recovery = _rule(P, Q, drafts, prefix_ratio)
        axes = [_cells([h_1]), _cells([h_2]),
                _cells([float(c) for r in recovery for c in np.cumsum(r)])]
        mids = np.stack(np.meshgrid(*(a[0] for a in axes), indexing="ij"), -1).reshape(-1, 3)
        widths = np.prod(np.stack(np.meshgrid(*(a[1] for a in axes), indexing="ij"), -1)
                         .reshape(-1, 3), axis=1)
        n = mids.shape[0]
        output = verifier(np.broadcast_to(P, (n, 3, vocab_size)),
                          np.zeros((n, 1), dtype=np.int64),
                          np.broadcast_to(Q, (n, 2, vocab_size)),
                          np.tile(np.array(drafts, dtype=np.int64), (n, 1)), uniforms=mids)
        weight = Q[0, drafts[0]] * Q[1, drafts[1]]
        for row, width in zip(output, widths):
            if row[1] == -1:  # rejected at position 0: the second token comes from p_1
                law[row[0]] += weight * width * P[1]
            else:
                law[row[0], row[1]] += weight * width
    return law


def test_the_prefix_ratio_rule_is_not_lossless() -> None:
    target = np.outer(P[0], P[1])
    # The enumeration is right: with block verification's capped weights it gives the target.
    assert np.abs(two_token_law(P, Q, prefix_ratio=False) - target).max() < 1e-15
    wrong = two_token_law(P, Q, prefix_ratio=True)
    assert wrong.sum() == pytest.approx(1.0, abs=1e-15)
    assert 0.5 * np.abs(wrong - target).sum() == pytest.approx(3 / 16, abs=1e-15)


def test_the_control_implements_the_prefix_ratio_rule() -> None:
    law = verifier_two_token_law(bv.hierarchical_prefix_ratio, prefix_ratio=True)
    assert np.abs(law - two_token_law(P, Q, prefix_ratio=True)).max() < 1e-14
    # The same integration of correct block verification gives the target.
    block = verifier_two_token_law(bv.block, prefix_ratio=False)
    assert np.abs(block - np.outer(P[0], P[1])).max() < 1e-14


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("kind", registry.names(lossless=True))
def test_the_kit_fails_the_prefix_ratio_rule(kind: str, seed: int) -> None:
    # Seed 7's random rows hide the rule; the kit's fixed surplus-then-deficit case does not.
    report = testing.check_verifier(bv.hierarchical_prefix_ratio, kind, num_rows=5000,
                                    seed=seed)
    assert not report.passed
    assert {"exact law equals the target", "exact law equals the oracle"} <= set(
        report.failed()), str(report)
    exact = next(row for row in report.rows if row.name == "exact law equals the target")
    assert "surplus then deficit" in exact.detail
    assert testing.check_verifier(bv.block, kind="block", num_rows=5000, seed=seed).passed
