"""Helpers shared by the CPU and GPU verifier tests (a module, not a test file).

The residual draw of two implementations may differ only where ``v * Z`` lies within
rounding of a CDF boundary; :func:`assert_draw_consistent` checks exactly that.
"""

from __future__ import annotations

import math

import numpy as np

from specdec_np.testing._monte_carlo import draw_from

LARGEST_BELOW_ONE = float(np.nextafter(1.0, 0.0))

# Fixed (p, q) cases of the first-token oracle: rows sum to one; q may be a point-mass token.
ORACLE_CASES = (
    ("overlapping", (0.1, 0.2, 0.3, 0.4), (0.4, 0.3, 0.2, 0.1)),
    ("point mass", (0.1, 0.2, 0.3, 0.4), 2),
    ("point mass on p = 0", (0.0, 0.5, 0.5), 0),
    ("point mass on p = 1", (0.0, 1.0, 0.0), 1),
    ("q = 0 < p", (0.25, 0.25, 0.5), (0.0, 0.5, 0.5)),
    ("p = 0 < q", (0.0, 0.6, 0.4), (0.5, 0.25, 0.25)),
    ("p == q", (0.2, 0.3, 0.5), (0.2, 0.3, 0.5)),
    ("disjoint supports", (0.0, 0.0, 0.7, 0.3), (0.5, 0.5, 0.0, 0.0)),
    ("V = 1", (1.0,), (1.0,)),
)

# Fixed (p, q) cases of the exact block-verification law: k in {1, 2, 3}, V in {2, 3, 4}; an
# int tuple is a point-mass draft.
BLOCK_CASES = (
    ("k = 1", ((0.1, 0.2, 0.3, 0.4), (0.25,) * 4), ((0.4, 0.3, 0.2, 0.1),)),
    (
        "k = 2, q = 0 < p and p = 0 < q",
        ((0.6, 0.2, 0.2), (0.5, 0.0, 0.5), (0.4, 0.3, 0.3)),
        ((0.7, 0.3, 0.0), (0.4, 0.0, 0.6)),
    ),
    ("k = 2, point mass", ((0.2, 0.5, 0.3), (0.6, 0.1, 0.3), (0.3, 0.3, 0.4)), (1, 0)),
    (
        "k = 3",
        ((0.1, 0.2, 0.3, 0.4), (0.4, 0.1, 0.1, 0.4), (0.0, 0.5, 0.5, 0.0), (0.25,) * 4),
        ((0.3, 0.3, 0.2, 0.2), (0.1, 0.6, 0.2, 0.1), (0.5, 0.0, 0.25, 0.25)),
    ),
    (
        "k = 3, point mass",
        ((0.0, 0.1, 0.9), (0.3, 0.7, 0.0), (0.1, 0.8, 0.1), (0.2, 0.3, 0.5)),
        (2, 1, 1),
    ),
    (
        "k = 3, V = 2, an over-confident first draft",
        ((0.5, 0.5), (0.0, 1.0), (0.5, 0.5), (0.5, 0.5)),
        ((1.0, 0.0), (0.5, 0.5), (0.5, 0.5)),
    ),
)

# Fixed Monte-Carlo case: V = 8, k = 2 (the third target row is the bonus position).
MC_P = np.array(
    [
        [0.02, 0.08, 0.30, 0.05, 0.25, 0.05, 0.15, 0.10],
        [0.30, 0.05, 0.05, 0.10, 0.10, 0.20, 0.15, 0.05],
        [0.125] * 8,
    ]
)
MC_Q = np.array(
    [
        [0.25, 0.05, 0.10, 0.15, 0.10, 0.20, 0.05, 0.10],
        [0.10, 0.20, 0.10, 0.10, 0.20, 0.10, 0.10, 0.10],
    ]
)


def boundary_tolerance(vocab_size: int) -> float:
    """Largest rounding of a CDF value or of ``v * Z``, relative to the residual mass Z.

    Any float64 summation (sequential, blocked or multi-lane) of V non-negative terms is
    within ``(V - 1) * 2**-53 * Z`` of the exact sum, and so is each partial sum; the product
    ``v * Z`` adds one more rounding.  Four times that bound, and never less than 1e-12
    (far below any probability the tests use), covers every summation order and nothing
    more: for V <= 40 it is 1e-12 * Z.
    """
    return max(1e-12, 4.0 * vocab_size * 2.0**-53)


def random_rows(rng: np.random.Generator, shape: tuple[int, ...], sparsity: float = 0.3):
    """Normalised non-negative rows with some exact zeros; every row keeps some mass."""
    rows = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])
    rows = rows * (rng.random(shape) >= sparsity)
    empty = rows.sum(axis=-1) == 0
    keep = rng.integers(0, shape[-1], size=empty.shape)
    rows[empty, keep[empty]] = 1.0
    return rows / rows.sum(axis=-1, keepdims=True)


def residual_weights(p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
    """float64 residual weights of rejection sampling (the fallback to p when they have no
    mass)."""
    weights = np.maximum(p_row - q_row, 0.0)
    if not np.any(weights > 0):  # non-negative terms: the sum is zero iff all are
        weights = np.maximum(p_row, 0.0)
    return weights


def assert_draw_consistent(
    token: int,
    expected: int,
    weights: np.ndarray,
    v: float,
    names=("kernel", "reference"),
    mass: float | None = None,
) -> None:
    """Two inverse-CDF draws at v from ``weights`` may differ only at a CDF boundary.

    Both tokens must have positive weight.  If they differ (lo < hi), the exact CDF
    ``C_y = fsum(weights[:y + 1])`` must satisfy ``C_{hi-1} - tol <= v * Z <= C_lo + tol``:
    v * Z sits within rounding of the boundary between them and every token in between
    carries no more than rounding-level mass.  ``tol`` is ``boundary_tolerance(V)`` times
    ``Z``, or times ``mass`` where the weights are themselves rounded differences (block
    verification's ``rho * p - q``) whose rounding scales with the terms, not with ``Z``.
    """
    token, expected = int(token), int(expected)
    first, second = names
    assert 0 <= token < weights.size, f"{first} emitted token {token} outside the vocabulary"
    assert weights[token] > 0, f"{first} emitted token {token} of weight 0"
    assert weights[expected] > 0, f"{second} emitted token {expected} of weight 0"
    if token == expected:
        return
    total = math.fsum(weights.tolist())
    lo, hi = sorted((token, expected))
    cdf_lo = math.fsum(weights[: lo + 1].tolist())
    cdf_before_hi = math.fsum(weights[:hi].tolist())
    tol = boundary_tolerance(weights.size) * (total if mass is None else mass)
    threshold = v * total
    assert cdf_before_hi - tol <= threshold <= cdf_lo + tol, (
        f"tokens {token} ({first}) and {expected} ({second}) differ but v * Z = "
        f"{threshold!r} is not within {tol:.3g} of the CDF boundary "
        f"[{cdf_lo!r}, {cdf_before_hi!r}]"
    )


def block_rho(p_at_drafts, q_at_drafts=None) -> float:
    """rho_i of block verification from ``p_j(x_j)`` and ``q_j(x_j)``, ``j < i`` (``q`` None:
    point-mass drafts, q = 1), by the kernels' float64 rules: negative and NaN q count as 0,
    ``rho * p >= q`` gives 1, and p <= 0 (or NaN) sets rho to 0 for good."""
    rho = 1.0
    for j, p in enumerate(p_at_drafts):
        p = float(p)
        q = 1.0 if q_at_drafts is None else float(q_at_drafts[j])
        q = q if q > 0.0 else 0.0
        if not p > 0.0 or rho == 0.0:
            rho = 0.0
        elif rho * p >= q:
            rho = 1.0
        else:
            rho = rho * p / q
    return rho


def weighted_residual(p_row, q_row, rho: float = 1.0, *, fallback: bool = True) -> np.ndarray:
    """float64 weights ``max(rho p - q, 0)`` (negative and NaN q count as 0, NaN weighs 0);
    with ``fallback``, ``max(p, 0)`` where they have no mass, as the kernels draw."""
    p = np.asarray(p_row, dtype=np.float64)
    q = np.asarray(q_row, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.nan_to_num(np.maximum(rho * p - np.where(q > 0, q, 0.0), 0.0), nan=0.0)
        if fallback and not np.any(weights > 0):
            weights = np.nan_to_num(np.maximum(p, 0.0), nan=0.0)
    return weights


def apply_row_edges(
    rng: np.random.Generator,
    target: np.ndarray,
    draft: np.ndarray,
    draft_ids: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    edges: set,
) -> None:
    """The edge cases of the chain verifiers' hypothesis strategies, in place, at the
    positions ``(rows, cols)``: drafts drawn from ``q`` (everywhere), one-hot targets,
    ``p(x) = 0``, ``q(x) = 0``, ``p == q`` and an empty residual (``q = 2 p``)."""
    batch_size, k = draft_ids.shape
    if "drafts_from_q" in edges:
        for b in range(batch_size):
            for i in range(k):
                draft_ids[b, i] = draw_from(draft[b, i], 1, rng)[0]
    if "one_hot_target" in edges:
        target[rows, cols] = 0.0
        target[rows, cols, draft_ids[rows, cols]] = 1.0
    if "p_zero" in edges:
        target[rows, cols, draft_ids[rows, cols]] = 0.0
        sums = target[rows, cols].sum(axis=-1, keepdims=True)
        target[rows, cols] /= np.where(sums > 0, sums, 1.0)
    if "q_zero" in edges:
        draft[rows, cols, draft_ids[rows, cols]] = 0.0
    if "p_equals_q" in edges:
        draft[rows, cols] = target[rows, cols]
    if "residual_zero" in edges:
        # q >= p everywhere: any rejection there has an empty residual and falls back to p.
        draft[rows, cols] = 2.0 * target[rows, cols]
