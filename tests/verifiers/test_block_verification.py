"""Block verification: exact laws, stratified grids, the gain over token-wise rejection,
kernel versus reference, chi-square, and the array-API reference on ``array_api_strict``.

The law tests prove the algorithm lossless by enumeration (no sampling); the grid tests
prove the reference's decisions implement that algorithm; the kernel tests compare any
implementation with the reference on explicit uniforms.  Every check is run on a broken
verifier too (the first-failure stop, always-accept) and must reject it.

Accepted-length gain of block over token-wise verification, measured by
:func:`test_block_accepts_at_least_as_many_as_token_wise` (printed with ``-s``): never
negative (to 1e-12), at most 0.199 drafts per step on 442 random cases (k <= 3, V <= 5,
dense, close and point-mass drafts), and 0.5 (1.5 against 1.0 accepted drafts, k = 3,
V = 2) on the hand-made case "large gain, k = 3", the largest found; k = 1 gives 0.
"""

from __future__ import annotations

import itertools
import math

import array_api_strict as xps
import numpy as np
import pytest
from draw_checks import (
    LARGEST_BELOW_ONE,
    apply_row_edges,
    assert_draw_consistent,
    boundary_tolerance,
    random_rows,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np._reference import chains as _reference
from specdec_np._reference import ragged as ragged_reference
from specdec_np.testing import _monte_carlo, _oracles
from specdec_np.verify import VerificationResult

# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@st.composite
def chain_cases(draw, max_k=3, max_vocab=5):
    """``(p [k+1, V], q [k, V] or int [k])`` with exact zeros and point masses."""
    k = draw(st.integers(1, max_k))
    vocab_size = draw(st.integers(2, max_vocab))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = random_rows(rng, (k + 1, vocab_size), draw(st.sampled_from([0.0, 0.3, 0.6])))
    if draw(st.booleans()):
        return p, rng.integers(0, vocab_size, k)
    q = random_rows(rng, (k, vocab_size), draw(st.sampled_from([0.0, 0.3, 0.6])))
    if draw(st.booleans()):
        # Close drafts: most checks pass, so deep accepted lengths carry the mass.
        q = 0.8 * p[:k] + 0.2 * q
    return p, q


ADVERSARIAL = {
    "q = 0 < p": (
        [[0.25, 0.25, 0.5], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]],
        [[0.0, 0.5, 0.5], [0.6, 0.0, 0.4]],
    ),
    "p = 0 < q": (
        [[0.0, 0.6, 0.4], [0.5, 0.5, 0.0], [1 / 3] * 3],
        [[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]],
    ),
    "point mass on p = 0": ([[0.0, 0.5, 0.5], [0.3, 0.0, 0.7], [0.5, 0.5, 0.0]], np.array([0, 1])),
    "point mass on p = 1": ([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]], np.array([1, 0])),
    "p == q": (
        [[0.2, 0.3, 0.5], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]],
        [[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]],
    ),
    "disjoint supports": (
        [[0.0, 0.0, 0.7, 0.3], [0.5, 0.5, 0.0, 0.0], [0.25] * 4],
        [[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]],
    ),
    "one-hot target": ([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [[0.3, 0.4, 0.3]] * 2),
    "k = 1": ([[0.1, 0.2, 0.3, 0.4], [0.25] * 4], [[0.4, 0.3, 0.2, 0.1]]),
    "k = 3, V = 5": (
        [
            [0.1, 0.2, 0.3, 0.4, 0.0],
            [0.0, 0.1, 0.1, 0.4, 0.4],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.5, 0.0, 0.0, 0.0, 0.5],
        ],
        [[0.3, 0.3, 0.2, 0.0, 0.2], [0.1, 0.0, 0.6, 0.2, 0.1], [0.0, 0.5, 0.0, 0.25, 0.25]],
    ),
    "k = 3, point mass": (
        [[0.0, 0.1, 0.9], [0.3, 0.7, 0.0], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5]],
        np.array([2, 1, 1]),
    ),
    # An over-confident first draft: block verification accepts 1.5 drafts, token-wise 1.0.
    "large gain, k = 3": (
        [[0.5, 0.5], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]],
        [[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]],
    ),
}


def assert_lossless(law, p, atol=1e-9):
    """The chain law equals the product of the target rows on every prefix length."""
    expected = _oracles.prefix_laws(_oracles.target_chain_law(p))
    for length, (got, want) in enumerate(zip(_oracles.prefix_laws(law), expected), start=1):
        error = float(np.max(np.abs(got - want)))
        assert error <= atol, f"prefix of length {length}: max |law - prod p| = {error:.3g}"


# --------------------------------------------------------------------------------------
# Exact laws
# --------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(chain_cases())
def test_block_law_equals_target_on_every_prefix(case):
    p, q = case
    law = _oracles.block_verification_law(p, q)
    assert law.law.shape == (p.shape[1],) * p.shape[0]
    assert math.fsum(law.law.ravel().tolist()) == pytest.approx(1.0, abs=1e-12)
    assert 0.0 <= law.expected_accepted_length <= p.shape[0] - 1 + 1e-12
    assert_lossless(law.law, p)


@settings(max_examples=60, deadline=None)
@given(chain_cases())
def test_rejection_law_equals_target_on_every_prefix(case):
    p, q = case
    assert_lossless(_oracles.rejection_law(p, q).law, p)


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_block_law_adversarial_cases(name):
    p, q = ADVERSARIAL[name]
    assert_lossless(_oracles.block_verification_law(p, q).law, np.asarray(p))


def test_laws_of_point_masses_equal_one_hot_rows():
    p, tokens = ADVERSARIAL["k = 3, point mass"]
    one_hot = np.eye(3)[tokens]
    for law in (
        _oracles.block_verification_law,
        _oracles.rejection_law,
        _oracles.block_first_failure_law,
    ):
        a, b = law(p, tokens), law(p, one_hot)
        np.testing.assert_array_equal(a.law, b.law)
        assert a.expected_accepted_length == b.expected_accepted_length


def test_law_is_computed_from_the_algorithm_not_the_target():
    """An unnormalised target is not reproduced: the law does not just return prod p."""
    p = np.array([[0.2, 0.2, 0.2], [0.3, 0.3, 0.3], [0.5, 0.25, 0.25]])
    q = np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    law = _oracles.block_verification_law(p, q).law
    assert np.max(np.abs(law - _oracles.target_chain_law(p))) > 1e-3


def test_law_inputs_are_checked():
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="q must have shape"):
        _oracles.block_verification_law(p, np.full((3, 3), 1 / 3))
    with pytest.raises(ValueError, match="point-mass q"):
        _oracles.block_verification_law(p, np.array([0, 3]))
    with pytest.raises(ValueError, match="p must"):
        _oracles.block_verification_law(p[:1], np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        _oracles.block_verification_law(-p, np.array([0, 1]))
    with pytest.raises(ValueError):
        _oracles.block_verification_law(p, np.zeros((2, 3)))


def test_first_failure_control_differs_from_the_target():
    """The negative control: stopping at the first failed check is not lossless, so the
    exact test above has teeth.  For k = 1 the two rules coincide."""
    worst = max(
        float(
            np.max(
                np.abs(_oracles.block_first_failure_law(p, q).law - _oracles.target_chain_law(p))
            )
        )
        for p, q in ADVERSARIAL.values()
    )
    assert worst > 1e-3, worst
    p, q = ADVERSARIAL["k = 1"]
    np.testing.assert_allclose(
        _oracles.block_first_failure_law(p, q).law,
        _oracles.block_verification_law(p, q).law,
        atol=0,
    )


def _gain_cases():
    """Enumerated cases: every k in 1..3 and V in 2..5, a few seeds each, plus the
    adversarial ones."""
    cases = [(np.asarray(p, dtype=np.float64), q) for p, q in ADVERSARIAL.values()]
    for k, vocab_size in itertools.product((1, 2, 3), (2, 3, 4, 5)):
        rng = np.random.default_rng(100 * k + vocab_size)
        for concentration in (0.3, 1.0, 3.0):
            for _ in range(4):
                p = rng.dirichlet(np.full(vocab_size, concentration), size=k + 1)
                q = rng.dirichlet(np.full(vocab_size, concentration), size=k)
                cases.append((p, q))
                cases.append((p, 0.7 * p[:k] + 0.3 * q))
                cases.append((p, rng.integers(0, vocab_size, k)))
    return cases


def test_block_accepts_at_least_as_many_as_token_wise():
    """E[accepted] of block verification >= token-wise rejection's on every enumerated
    case, and strictly larger on some (the largest gain is printed)."""
    gains = []
    for p, q in _gain_cases():
        block = _oracles.block_verification_law(p, q).expected_accepted_length
        token_wise = _oracles.rejection_law(p, q).expected_accepted_length
        assert block >= token_wise - 1e-12, (p, q, block, token_wise)
        gains.append((block - token_wise, p.shape[0] - 1, block, token_wise))
    largest = max(gains)
    print(
        f"\nlargest accepted-length gain of block over token-wise: {largest[0]:.4f} "
        f"(k = {largest[1]}: {largest[2]:.4f} vs {largest[3]:.4f}) over {len(gains)} cases"
    )
    assert largest[0] >= 0.5 - 1e-12
    # k = 1: block verification is token-wise rejection.
    assert all(abs(g) <= 1e-12 for g, k, _, _ in gains if k == 1)


def test_gain_check_can_fail():
    """A rule that lowers E[accepted] is caught by the comparison above: the first-failure
    stop accepts fewer drafts than token-wise rejection here."""
    p = np.array([[0.6, 0.2, 0.2], [0.5, 0.0, 0.5], [0.4, 0.3, 0.3]])
    q = np.array([[0.7, 0.3, 0.0], [0.4, 0.0, 0.6]])
    first_failure = _oracles.block_first_failure_law(p, q).expected_accepted_length
    assert first_failure < _oracles.rejection_law(p, q).expected_accepted_length - 1e-3


# --------------------------------------------------------------------------------------
# The reference on a stratified grid reproduces the law (k <= 2)
# --------------------------------------------------------------------------------------


def reference_outputs(target, bonus, draft_probs, draft_ids, uniforms):
    return np.asarray(
        _reference.block_verification_sample(target, bonus, draft_probs, draft_ids, uniforms)[0]
    )


def first_failure_outputs(target, bonus, draft_probs, draft_ids, uniforms):
    """A deliberately broken copy of the reference: same thresholds and residuals, but
    it stops at the first failed check."""
    k = draft_ids.shape[1]
    residual, h = _reference._block_thresholds(np, target, draft_probs, draft_ids)
    failed = uniforms[:, :k] >= h
    tau = np.where(failed.any(axis=1), np.argmax(failed, axis=1), k)
    return np.asarray(
        _reference._block_emit(np, target, bonus, draft_ids, residual, tau, uniforms[:, k])[0]
    )


GRID_CASES = {
    "k = 1": (ADVERSARIAL["k = 1"], 256),
    "k = 2": (
        ([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.3, 0.3, 0.4]], [[0.5, 0.2, 0.3], [0.0, 0.5, 0.5]]),
        32,
    ),
    "k = 2, zeros": (
        ([[0.6, 0.2, 0.2], [0.5, 0.0, 0.5], [0.4, 0.3, 0.3]], [[0.7, 0.3, 0.0], [0.4, 0.0, 0.6]]),
        32,
    ),
    "k = 2, point mass": (ADVERSARIAL["point mass on p = 0"], 64),
    "k = 2, V = 4, point mass": (
        ([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.1, 0.4], [0.25] * 4], np.array([3, 0])),
        64,
    ),
}


def grid_law(outputs, p, q, num_strata):
    """Run ``outputs`` on a stratified batch; point-mass ``q`` is called with None."""
    p = np.asarray(p, dtype=np.float64)
    point_mass = np.asarray(q).dtype.kind in "iu"
    rows = np.eye(p.shape[1])[q] if point_mass else np.asarray(q, dtype=np.float64)
    batch = _oracles.stratified_rejection_batch(p, rows, num_strata)
    output = outputs(
        batch.target_with_bonus_probs,
        batch.bonus_token_ids,
        None if point_mass else batch.draft_probs,
        batch.draft_token_ids,
        batch.uniforms,
    )
    return _oracles.grid_chain_law(output, batch.weights, p)


@pytest.mark.parametrize("name", GRID_CASES)
def test_reference_on_grid_reproduces_the_law(name):
    (p, q), num_strata = GRID_CASES[name]
    law = _oracles.block_verification_law(p, q).law
    error = np.abs(grid_law(reference_outputs, p, q, num_strata) - law)
    bound = _oracles.chain_grid_error_bound(p, q, num_strata)
    assert np.all(error <= bound), float(np.max(error / bound))


def test_grid_check_rejects_the_first_failure_copy():
    (p, q), num_strata = GRID_CASES["k = 2, zeros"]
    law = _oracles.block_verification_law(p, q).law
    bound = _oracles.chain_grid_error_bound(p, q, num_strata)
    broken = np.abs(grid_law(first_failure_outputs, p, q, num_strata) - law)
    assert np.any(broken > bound + 1e-3), float(np.max(broken / bound))
    # The control is not broken in its shared parts: for k = 1 it passes.
    (p1, q1), strata1 = GRID_CASES["k = 1"]
    error = np.abs(
        grid_law(first_failure_outputs, p1, q1, strata1)
        - _oracles.block_verification_law(p1, q1).law
    )
    assert np.all(error <= _oracles.chain_grid_error_bound(p1, q1, strata1))


def test_grid_chain_law_and_bound_helpers():
    p = np.array([[0.5, 0.5], [0.25, 0.75]])
    output = np.array([[0, 1], [1, -1], [1, 0]])
    law = _oracles.grid_chain_law(output, np.array([0.5, 0.25, 0.25]), p)
    # Rows 0 and 2 accepted their draft (the bonus ids are replaced by p_1); row 1 emitted
    # one recovered token and is continued by p_1.
    expected = 0.5 * np.outer([1, 0], p[1]) + 0.5 * np.outer([0, 1], p[1])
    np.testing.assert_allclose(law, expected, atol=1e-15)
    with pytest.raises(ValueError, match="emitted tokens"):
        _oracles.grid_chain_law(np.array([[-1, 0]]), np.ones(1), p)
    bound = _oracles.chain_grid_error_bound(p, np.array([0]), 8)
    # t = 0: (1/16 + 1/8) * p_1(a_1); t = 1: 1/16 * [a_0 == 0] * p_1(a_1).
    np.testing.assert_allclose(
        bound, 3 / 16 * p[1][None, :] + 1 / 16 * np.outer([1, 0], p[1]) + 1e-12, rtol=1e-12
    )


# --------------------------------------------------------------------------------------
# Kernel versus reference on explicit uniforms
# --------------------------------------------------------------------------------------


def reference_block_verification_sample(
    target_with_bonus_probs,
    bonus_token_ids,
    draft_probs,
    draft_token_ids,
    *,
    uniforms=None,
    generator=None,
    seeded_seqs=None,
    counter_seeds=None,
    strict_mode=False,
):
    """The reference behind the kernel's signature (NumPy inputs; uniforms or a generator)."""
    if uniforms is None:
        rng = generator if generator is not None else np.random.default_rng()
        uniforms = rng.random((draft_token_ids.shape[0], draft_token_ids.shape[1] + 1))
    outputs = _reference.block_verification_sample(
        target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, uniforms
    )
    return VerificationResult(*(np.asarray(a) for a in outputs))


@pytest.fixture(scope="module", params=["reference", "kernel"])
def block_sample(request):
    """The implementation under test: the reference (as a wrapper) and the kernel."""
    if request.param == "reference":
        return reference_block_verification_sample
    return specdec_np.block_verification_sample


def restated_thresholds(p_rows, q_rows, draft_ids):
    """Independent restatement in plain Python: ``h_1 .. h_k``, a rounding allowance for
    each, and the weighted residuals ``R_0 .. R_{k-1}``.

    Summation order and operation order (``Z + 1 - rho`` grouped either way) may move
    ``h_i`` by a few ulps of the terms: ``|dZ| <= boundary_tolerance(V) * (sum rho p +
    sum q)`` and ``|dh| <= |dZ| / (Z + 1 - rho)``, plus a few ulps for ``rho``."""
    k, vocab_size = q_rows.shape
    rho = [1.0]
    for i, x in enumerate(draft_ids):
        weighted = rho[i] * float(p_rows[i, x])
        q_x = float(q_rows[i, x])
        rho.append(0.0 if weighted == 0 else 1.0 if weighted >= q_x else weighted / q_x)
    residuals = [np.maximum(rho[i] * p_rows[i] - q_rows[i], 0.0) for i in range(k)]
    h, slack = [], []
    ulps = 16 * (k + 1) * 2.0**-53
    for i in range(1, k):
        total = math.fsum(residuals[i].tolist())
        denominator = total + (1.0 - rho[i])
        if denominator > 0:
            scale = math.fsum((rho[i] * p_rows[i]).tolist()) + math.fsum(q_rows[i].tolist())
            h.append(total / denominator)
            slack.append(boundary_tolerance(vocab_size) * scale / denominator + ulps)
        else:
            h.append(1.0)  # Z == 0 exactly (non-negative terms) and rho == 1: no rounding
            slack.append(0.0)
    h.append(rho[k])
    slack.append(ulps)
    return h, slack, residuals


def assert_matches_reference(sample, target, bonus, draft_probs, draft_ids, uniforms):
    """Decisions equal the reference's except where an ``eta_i`` lies within rounding of
    ``h_i`` (either side is then allowed); residual draws equal up to CDF boundaries."""
    try:
        expected = _reference.block_verification_sample(
            target, bonus, draft_probs, draft_ids, uniforms
        )
    except ValueError:
        with pytest.raises(ValueError, match="no positive probability"):
            sample(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
        return
    result = sample(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
    ref_output, ref_lengths, ref_accepted = (np.asarray(a) for a in expected)
    batch_size, k = draft_ids.shape
    vocab_size = target.shape[2]
    output = np.asarray(result.output_token_ids)
    lengths = np.asarray(result.accepted_lengths)
    assert output.dtype == np.int64 and output.shape == (batch_size, k + 1)
    np.testing.assert_array_equal(result.num_accepted, lengths)
    np.testing.assert_array_equal(ref_accepted, ref_lengths)
    for b in range(batch_size):
        p_rows = target[b].astype(np.float64)
        if draft_probs is None:
            q_rows = np.eye(vocab_size)[draft_ids[b].astype(np.int64)]
        else:
            q_rows = draft_probs[b].astype(np.float64)
            q_rows = np.where(q_rows > 0, q_rows, 0.0)
        ids = [int(x) for x in draft_ids[b]]
        h, slack, residuals = restated_thresholds(p_rows, q_rows, ids)
        eta = uniforms[b, :k]
        sure = [i + 1 for i in range(k) if eta[i] < h[i] - slack[i]]
        unsure = [i + 1 for i in range(k) if abs(eta[i] - h[i]) <= slack[i]]
        base = max(sure, default=0)
        allowed = {base} | {i for i in unsure if i > base}
        tau = int(lengths[b])
        assert tau in allowed, f"row {b}: tau = {tau}, allowed {sorted(allowed)}, h = {h}"
        assert int(ref_lengths[b]) in allowed, f"row {b}: reference tau outside {allowed}"
        np.testing.assert_array_equal(output[b, :tau], draft_ids[b, :tau])
        np.testing.assert_array_equal(output[b, tau + 1 :], -1)
        if tau == k:
            assert output[b, k] == int(np.reshape(bonus, (batch_size,))[b])
            continue
        weights = residuals[tau]
        if not np.any(weights > 0):
            weights = np.maximum(p_rows[tau], 0.0)
        v = uniforms[b, k]
        if int(ref_lengths[b]) == tau:
            reference_token = int(ref_output[b, tau])
        else:
            reference_token = int(
                np.asarray(_reference.residual_draw(weights[None], np.array([v])))[0]
            )
        # Elementwise rounding of rho * p - q moves the CDF by at most the row's scale.
        scale = math.fsum(weights.tolist()) + math.fsum(np.abs(p_rows[tau]).tolist())
        assert_draw_consistent(output[b, tau], reference_token, weights, v, mass=scale)


EDGE_CASES = (
    "p_zero",
    "q_zero",
    "p_equals_q",
    "close_draft",
    "residual_zero",
    "one_hot_target",
    "dirty_draft",
    "extreme_uniforms",
    "uniforms_at_thresholds",
    "drafts_from_q",
)


@st.composite
def block_cases(draw, max_k=5, edge_cases=EDGE_CASES):
    batch_size = draw(st.integers(0, 6))
    k = draw(st.integers(1, max_k))
    vocab_size = draw(st.one_of(st.just(1), st.integers(1, 40)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    with_draft_probs = draw(st.booleans())
    edges = draw(st.sets(st.sampled_from(edge_cases)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    target = random_rows(rng, (batch_size, k + 1, vocab_size))
    draft = random_rows(rng, (batch_size, k, vocab_size))
    draft_ids = rng.integers(0, vocab_size, (batch_size, k))
    uniforms = rng.random((batch_size, k + 1))
    rows, cols = np.nonzero(rng.random((batch_size, k)) < 0.5)
    if "close_draft" in edges:
        draft = 0.9 * target[:, :k] + 0.1 * draft
    apply_row_edges(rng, target, draft, draft_ids, rows, cols, edges)
    target = target.astype(dtype)
    draft = draft.astype(dtype)
    if "p_equals_q" in edges:
        draft[rows, cols] = target[rows, cols]
    if "dirty_draft" in edges and vocab_size > 1:
        # Negative and NaN draft entries count as zero.
        dirty = rng.random(draft.shape) < 0.2
        draft[dirty] = np.where(rng.random(int(dirty.sum())) < 0.5, np.nan, -0.25)
    if "extreme_uniforms" in edges:
        choice = rng.integers(0, 3, uniforms.shape)
        uniforms = np.where(choice == 0, 0.0, np.where(choice == 1, LARGEST_BELOW_ONE, uniforms))
    if "uniforms_at_thresholds" in edges and batch_size:
        # eta_i on (or one ulp around) the reference's own h_i: the rounding allowance.
        _, h = _reference._block_thresholds(
            np, target, draft if with_draft_probs else None, draft_ids
        )
        shift = rng.integers(-1, 2, h.shape)
        at = np.where(
            shift < 0, np.nextafter(h, 0.0), np.where(shift > 0, np.nextafter(h, 1.0), h)
        )
        pick = rng.random(h.shape) < 0.5
        uniforms[:, :k] = np.where(pick, np.clip(at, 0.0, LARGEST_BELOW_ONE), uniforms[:, :k])
    return (
        target,
        rng.integers(0, vocab_size, (batch_size, 1)).astype(id_dtype),
        draft if with_draft_probs else None,
        draft_ids.astype(id_dtype),
        uniforms,
    )


@settings(max_examples=300, deadline=None)
@given(case=block_cases())
def test_kernel_matches_reference(block_sample, case):
    assert_matches_reference(block_sample, *case)


@settings(max_examples=150, deadline=None)
@given(case=block_cases(max_k=1, edge_cases=tuple(e for e in EDGE_CASES if e != "dirty_draft")))
def test_k1_decisions_equal_token_wise_rejection(case):
    """For k = 1, ``eta < h_1 = min(1, p / q)`` is token-wise ``u * q < p``: the same
    decisions and the same residual on the same uniforms.  The two roundings (``p / q``
    against ``u * q``) may disagree only where ``u * q`` is within a few ulps of ``p``.
    Negative and NaN draft entries are left out: the token-wise reference does not
    promise to read them as zero."""
    target, bonus, draft, draft_ids, uniforms = case
    try:
        block = _reference.block_verification_sample(target, bonus, draft, draft_ids, uniforms)
    except ValueError:
        with pytest.raises(ValueError):
            _reference.rejection_sample(target, bonus, draft, draft_ids, uniforms)
        return
    token_wise = _reference.rejection_sample(target, bonus, draft, draft_ids, uniforms)
    ids = draft_ids.astype(np.int64)
    p_x = np.take_along_axis(target[:, 0], ids, axis=1)[:, 0].astype(np.float64)
    if draft is None:
        q_x = np.ones_like(p_x)
    else:
        q_x = np.take_along_axis(draft[:, 0], ids, axis=1)[:, 0].astype(np.float64)
        q_x = np.where(q_x > 0, q_x, 0.0)
    u = uniforms[:, 0]
    boundary = np.abs(u * q_x - p_x) <= 4 * 2.0**-53 * np.maximum(p_x, q_x)
    for got, want in zip(block, token_wise):
        np.testing.assert_array_equal(np.asarray(got)[~boundary], np.asarray(want)[~boundary])


@settings(max_examples=80, deadline=None)
@given(case=block_cases())
def test_kernel_point_mass_equals_one_hot(block_sample, case):
    target, bonus, _, draft_ids, uniforms = case
    batch_size, k = draft_ids.shape
    one_hot = np.zeros((batch_size, k, target.shape[2]), dtype=target.dtype)
    np.put_along_axis(one_hot, draft_ids[:, :, None].astype(np.int64), 1.0, axis=2)
    try:
        point = block_sample(target, bonus, None, draft_ids, uniforms=uniforms)
    except ValueError:
        with pytest.raises(ValueError):
            block_sample(target, bonus, one_hot, draft_ids, uniforms=uniforms)
        return
    dense = block_sample(target, bonus, one_hot, draft_ids, uniforms=uniforms)
    for got, expected in zip(point, dense):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.parametrize("point_mass", [False, True])
def test_kernel_matches_reference_on_the_threaded_path(block_sample, point_mass, threaded):
    rng = np.random.default_rng(23)
    batch_size, k, vocab_size = 400, 4, 64
    target = random_rows(rng, (batch_size, k + 1, vocab_size)).astype(np.float32)
    draft = (0.8 * target[:, :k] + 0.2 * random_rows(rng, (batch_size, k, vocab_size))).astype(
        np.float32
    )
    draft_ids = np.stack(
        [
            [_monte_carlo.draw_from(draft[b, i], 1, rng)[0] for i in range(k)]
            for b in range(batch_size)
        ]
    )
    assert_matches_reference(
        block_sample,
        target,
        rng.integers(0, vocab_size, (batch_size, 1)),
        None if point_mass else draft,
        draft_ids,
        rng.random((batch_size, k + 1)),
    )


def test_matcher_can_fail():
    """The comparison rejects a first-failure kernel and a kernel that miscounts."""
    rng = np.random.default_rng(4)
    p = np.array([[0.6, 0.2, 0.2], [0.5, 0.0, 0.5], [0.4, 0.3, 0.3]])
    q = np.array([[0.7, 0.3, 0.0], [0.4, 0.0, 0.6]])
    batch = 256
    target = np.ascontiguousarray(np.broadcast_to(p, (batch, 3, 3)))
    draft = np.ascontiguousarray(np.broadcast_to(q, (batch, 2, 3)))
    ids = np.stack([_monte_carlo.draw_from(q[i], batch, rng) for i in range(2)], axis=1)
    uniforms = rng.random((batch, 3))
    bonus = np.zeros((batch, 1), np.int64)

    def first_failure(target, bonus, draft_probs, draft_ids, *, uniforms, **_):
        output = first_failure_outputs(target, bonus, draft_probs, draft_ids, uniforms)
        lengths = (output >= 0).sum(axis=1) - 1
        return VerificationResult(output, lengths, lengths)

    def miscounted(*args, **kwargs):
        result = reference_block_verification_sample(*args, **kwargs)
        return result._replace(num_accepted=result.num_accepted + 1)

    for broken in (first_failure, miscounted):
        with pytest.raises(AssertionError):
            assert_matches_reference(broken, target, bonus, draft, ids, uniforms)
    assert_matches_reference(
        reference_block_verification_sample, target, bonus, draft, ids, uniforms
    )


def test_a_later_check_rescues_an_earlier_failure(block_sample):
    """rho_1 = 0.5, h_1 = 1/6 and h_2 = rho_2 = 0.4 with point masses: eta = (0.9, 0.3)
    fails the first check and passes the second, so both drafts are accepted (a
    first-failure stop would accept none)."""
    target = np.array([[[0.5, 0.5, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]]])
    draft_ids = np.array([[1, 0]])
    result = block_sample(
        target, np.array([[2]]), None, draft_ids, uniforms=np.array([[0.9, 0.3, 0.5]])
    )
    np.testing.assert_array_equal(result.output_token_ids, [[1, 0, 2]])
    assert int(result.accepted_lengths[0]) == int(result.num_accepted[0]) == 2
    # eta_2 = 0.45 >= 0.4 and eta_1 = 0.9 >= 1/6: nothing accepted, residual of position 0
    # is p_0 - q_0 = [0.5, 0, 0] (token 0).
    result = block_sample(
        target, np.array([[2]]), None, draft_ids, uniforms=np.array([[0.9, 0.45, 0.7]])
    )
    np.testing.assert_array_equal(result.output_token_ids, [[0, -1, -1]])
    # eta_1 = 0.1 < 1/6 and eta_2 fails: tau = 1, residual max(0.5 p_1 - q_1, 0) = [0, .05, .05].
    result = block_sample(
        target, np.array([[2]]), None, draft_ids, uniforms=np.array([[0.1, 0.45, 0.7]])
    )
    np.testing.assert_array_equal(result.output_token_ids, [[1, 2, -1]])


def test_zero_probability_drafts_are_never_emitted(block_sample):
    """p(x) = 0 kills the path, also where q(x) = 0 too (no later check revives it)."""
    target = np.array([[[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4]]])
    for q0 in (0.0, 0.5):
        draft = np.array([[[q0, 0.5, 0.5 - q0], [0.0, 1.0, 0.0]]])
        for u in itertools.product((0.0, 0.5, LARGEST_BELOW_ONE), repeat=2):
            result = block_sample(
                target,
                np.array([[2]]),
                draft,
                np.array([[0, 2]]),
                uniforms=np.array([[u[0], u[1], 0.3]]),
            )
            assert int(result.accepted_lengths[0]) == 0
            assert target[0, 0, result.output_token_ids[0, 0]] > 0


def test_empty_batch(block_sample):
    k, vocab_size = 3, 5
    result = block_sample(
        np.zeros((0, k + 1, vocab_size)),
        np.zeros((0, 1), np.int64),
        None,
        np.zeros((0, k), np.int64),
        uniforms=np.zeros((0, k + 1)),
    )
    assert np.asarray(result.output_token_ids).shape == (0, k + 1)
    assert np.asarray(result.accepted_lengths).shape == (0,)


def test_a_row_without_mass_raises(block_sample):
    target = np.array([[[0.0, 0.0], [0.5, 0.5]]])
    with pytest.raises(ValueError, match="no positive probability"):
        block_sample(
            target, np.array([[0]]), None, np.array([[0]]), uniforms=np.array([[0.5, 0.5]])
        )


# --------------------------------------------------------------------------------------
# Monte-Carlo chi-square (fixed seeds)
# --------------------------------------------------------------------------------------

MC_P = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.1, 0.4], [0.05, 0.3, 0.25, 0.4]])
MC_Q = np.array([[0.3, 0.3, 0.2, 0.2], [0.1, 0.6, 0.2, 0.1]])
MC_ROWS = 200_000


def _as_sampler(function, point_mass=False):
    def sampler(target, bonus, draft_probs, draft_ids, uniforms):
        probs = None if point_mass else draft_probs
        return function(target, bonus, probs, draft_ids, uniforms=uniforms).output_token_ids

    return sampler


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chi_square_of_the_chain(block_sample, dtype):
    p, q = MC_P.astype(dtype), MC_Q.astype(dtype)
    expected = _oracles.block_verification_law(p, q).expected_accepted_length
    report = _monte_carlo.monte_carlo_chain(
        _as_sampler(block_sample),
        p,
        q,
        MC_ROWS,
        np.random.default_rng(2025),
        expected_accepted_length=expected,
        dtype=dtype,
    )
    assert report.passed(), report


def test_chi_square_of_the_chain_point_mass_and_generator(block_sample):
    tokens = [3, 0]
    expected = _oracles.block_verification_law(MC_P, np.array(tokens)).expected_accepted_length

    def generator_sampler(target, bonus, draft_probs, draft_ids, uniforms):
        return block_sample(
            target, bonus, None, draft_ids, generator=np.random.default_rng(99)
        ).output_token_ids

    report = _monte_carlo.monte_carlo_chain(
        generator_sampler,
        MC_P,
        tokens,
        MC_ROWS,
        np.random.default_rng(6),
        expected_accepted_length=expected,
    )
    assert report.passed(), report


@pytest.mark.parametrize("name", ["first_failure", "always_accept", "token_wise_length"])
def test_chi_square_of_the_chain_rejects_broken_verifiers(name):
    expected = _oracles.block_verification_law(MC_P, MC_Q).expected_accepted_length

    def always_accept(target, bonus, draft_probs, draft_ids, uniforms):
        return np.hstack([draft_ids.astype(np.int64), bonus.astype(np.int64)])

    def token_wise(target, bonus, draft_probs, draft_ids, uniforms):
        # Lossless, but with token-wise rejection's (smaller) accepted length.
        return np.asarray(
            _reference.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms)[0]
        )

    broken = {
        "first_failure": first_failure_outputs,
        "always_accept": always_accept,
        "token_wise_length": token_wise,
    }[name]
    report = _monte_carlo.monte_carlo_chain(
        broken, MC_P, MC_Q, MC_ROWS, np.random.default_rng(2025), expected_accepted_length=expected
    )
    assert not report.passed(), report
    if name == "token_wise_length":
        assert report.p_value > 1e-4 and report.accepted_length_z < -5, report
    else:
        assert report.p_value < 1e-12, report


# --------------------------------------------------------------------------------------
# The reference on array_api_strict
# --------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(block_cases())
def test_reference_on_array_api_strict_equals_numpy(case):
    target, bonus, draft, draft_ids, uniforms = case
    strict_inputs = (
        xps.asarray(target),
        xps.asarray(bonus),
        None if draft is None else xps.asarray(draft),
        xps.asarray(draft_ids),
        xps.asarray(uniforms),
    )
    try:
        expected = _reference.block_verification_sample(target, bonus, draft, draft_ids, uniforms)
    except ValueError:
        with pytest.raises(ValueError):
            _reference.block_verification_sample(*strict_inputs)
        return
    strict = _reference.block_verification_sample(*strict_inputs)
    for got, want in zip(strict, expected):
        assert isinstance(got, type(xps.asarray(0)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("from_logits", [False, True])
def test_long_chains_keep_their_path_weights_beyond_the_stack(from_logits) -> None:
    """k > 64: the path's weights move to the heap (one read of each p(x_j), no k^2 V
    term); the result is the reference's on every uniform scan position."""
    rng = np.random.default_rng(12)
    k, vocab = 90, 40
    rows = rng.normal(size=(k + 1, vocab)) * 3
    probs = np.exp(rows) / np.exp(rows).sum(axis=1, keepdims=True)
    draft = rng.dirichlet(np.ones(vocab), size=k)
    ids = probs[:k].argmax(axis=1)
    for trial in range(20):
        uniforms = rng.random((1, k + 2)) ** (0.05 if trial % 2 else 1.0)
        given = {"target_logits": rows} if from_logits else {"target_probs": probs}
        result = specdec_np.verify_ragged(
            num_draft_tokens=[k], draft_token_ids=ids, draft_probs=None if from_logits
            else draft, method="block", uniforms=uniforms, bonus_token_ids=[0], **given,
        )
        reference, length = ragged_reference.verify_ragged(
            np.array([k]), ids, rows if from_logits else probs, None if from_logits else draft,
            method="block", from_logits=from_logits, uniforms=uniforms,
            bonus_token_ids=np.array([0]),
        )
        assert int(result.accepted_lengths[0]) == int(length[0])
        np.testing.assert_array_equal(result.output_token_ids, reference)
