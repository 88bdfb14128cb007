"""Typical acceptance (docs/semantics.md §2.4): the Cython kernel against the array-API
reference, the behaviours users rely on, the counters and the constructor checks.

How kernel and reference may differ, and why only there
-------------------------------------------------------
Both accept position ``i`` iff ``p(x) > min(posterior_threshold, posterior_alpha *
exp(-H))`` with ``H = -sum_y p(y) ln(p(y) + 1e-5)``.  The reference computes every step in
float64.  For float32 inputs the kernel rounds ``p + 1e-5`` to float32, takes a float32
polynomial logarithm (error about one float32 ulp), rounds the product ``p * ln(...)`` to
float32 and only then accumulates in float64.  Per element that is at most four float32
roundings, each ``<= 2**-24 ~ 6e-8`` relative, of either ``p`` (the argument rounding moves
``ln`` by ``~6e-8`` absolute) or ``|p ln(p + 1e-5)|`` (result and product roundings), so

    |H_kernel - H_reference| <= 2.4e-7 * (sum_y p(y) + sum_y |p(y) ln(p(y) + 1e-5)|).

We use ``1e-6 * mass`` (a safety factor of four), ``mass`` being the bracket.  For float64
the kernel uses libm's ``log`` and sums in another order than NumPy, which costs at most a
few ulp per element plus ``V`` ulp of the sum: ``(V + 8) * 2.3e-16 * mass``.

An entropy error ``delta`` moves ``e = alpha * exp(-H)`` by the factor ``exp(+-delta)``;
``posterior_threshold`` itself is exact.  So the kernel's threshold lies in ``[lo, hi]`` with
``lo = min(posterior_threshold, e * exp(-2 delta))`` and ``hi = min(posterior_threshold,
e * exp(2 delta))`` (the 2 is one more safety factor), and a decision may differ from the
reference's only where ``lo < p(x) <= hi``.  Where ``posterior_threshold`` is the minimum
with room to spare, or the threshold is 0, that interval is empty: exact.  For a normalised
row of 5000 tokens, ``mass <= 1 + ln 5000``, so the band is about ``2e-5`` relative:
:func:`test_tolerance_band_is_narrow` pins that, and
:func:`test_decisions_exact_just_outside_the_band` shows that the kernel is exact at
``1e-4`` relative from the threshold.  (Measured while writing these tests: float32 flips
happened up to 4e-8 relative from the threshold, about 1% of the band.)  Everywhere else
kernel and reference must agree exactly, and the recovered token (an argmax, first index on
ties) must be identical.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np._reference import chains as _reference

# --------------------------------------------------------------------------------------
# Oracle with explicit tolerance bookkeeping
# --------------------------------------------------------------------------------------


@dataclass
class Expectation:
    """Reference decisions per position, and which of them the kernel may flip."""

    accepted: np.ndarray  # bool [B, k]
    ambiguous: np.ndarray  # bool [B, k]
    threshold: np.ndarray  # float64 [B, k]
    low: np.ndarray  # float64 [B, k]: the kernel's threshold is in [low, high]
    high: np.ndarray  # float64 [B, k]
    p_x: np.ndarray  # float64 [B, k]
    argmax: np.ndarray  # int64 [B, k]
    draft: np.ndarray  # int64 [B, k]
    bonus: np.ndarray  # int64 [B]


def entropy_error_bound(target: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(terms, delta)``: the float64 entropy terms ``p ln(p + 1e-5)`` ``[B, k, V]`` and the
    bound ``delta`` ``[B, k]`` on the kernel's entropy error (module docstring)."""
    p = target[:, :k, :].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        terms = p * np.log(p + 1e-5)
        mass = p.sum(axis=-1) + np.abs(terms).sum(axis=-1)
    vocab_size = target.shape[2]
    per_unit = 1e-6 if target.dtype == np.float32 else (vocab_size + 8) * 2.3e-16
    return terms, per_unit * mass


def typical_expectation(target, bonus, draft, threshold_arg, alpha) -> Expectation:
    """The reference decisions computed the way docs/semantics.md §2.4 states them,
    per position."""
    k = draft.shape[1]
    terms, delta = entropy_error_bound(target, k)
    entropy = -terms.sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = alpha * np.exp(-entropy)
        threshold = np.minimum(threshold_arg, scaled)
        low = np.minimum(threshold_arg, scaled * np.exp(-2.0 * delta))
        high = np.minimum(threshold_arg, scaled * np.exp(2.0 * delta))
    p = target[:, :k, :].astype(np.float64)
    ids = draft.astype(np.int64)
    p_x = np.take_along_axis(p, ids[:, :, None], axis=2)[:, :, 0]
    accepted = p_x > threshold
    ambiguous = (low < p_x) & (p_x <= high)
    argmax = p.argmax(axis=-1)
    return Expectation(
        accepted,
        ambiguous,
        threshold,
        low,
        high,
        p_x,
        argmax,
        ids,
        bonus.reshape(-1).astype(np.int64),
    )


def output_row(accepted: np.ndarray, recovered: np.ndarray, draft: np.ndarray, bonus: int):
    """The output row for one sequence: ``(row, accepted_length, num_accepted)``."""
    k = accepted.shape[0]
    r = k if accepted.all() else int(np.argmin(accepted))
    row = np.full(k + 1, -1, dtype=np.int64)
    row[:r] = draft[:r]
    row[r] = bonus if r == k else recovered[r]
    return tuple(int(v) for v in row), r, int(accepted.sum())


def allowed_rows(exp: Expectation, b: int) -> list[tuple]:
    """Every result row b may have: the reference's, with any subset of its ambiguous
    decisions flipped."""
    flexible = np.flatnonzero(exp.ambiguous[b])
    options = []
    for flips in itertools.product((False, True), repeat=len(flexible)):
        accepted = exp.accepted[b].copy()
        accepted[flexible] = np.asarray(flips, dtype=bool)
        options.append(output_row(accepted, exp.argmax[b], exp.draft[b], int(exp.bonus[b])))
    return options


def assert_matches_expectation(result, exp: Expectation, *, exact: bool = False) -> None:
    """The kernel's result equals the reference decisions, except for flips of ambiguous
    positions (none if ``exact``)."""
    output, lengths, num_accepted = (np.asarray(a) for a in result)
    batch_size, k = exp.accepted.shape
    assert output.shape == (batch_size, k + 1)
    assert output.dtype == np.int64
    assert lengths.shape == num_accepted.shape == (batch_size,)
    for b in range(batch_size):
        got = (tuple(int(v) for v in output[b]), int(lengths[b]), int(num_accepted[b]))
        if exact:
            options = [output_row(exp.accepted[b], exp.argmax[b], exp.draft[b], int(exp.bonus[b]))]
        else:
            options = allowed_rows(exp, b)
        assert got in options, (
            f"row {b}: got {got}, allowed {options}; p_x={exp.p_x[b]}, "
            f"threshold={exp.threshold[b]}, kernel threshold in [{exp.low[b]}, {exp.high[b]}]"
        )


def check_kernel_and_reference(target, bonus, draft, threshold_arg, alpha) -> Expectation:
    exp = typical_expectation(target, bonus, draft, threshold_arg, alpha)
    ref = _reference.typical_acceptance_sample(target, bonus, draft, threshold_arg, alpha)
    # The reference is float64 throughout: exactly the decisions of the formula.
    assert_matches_expectation(ref, exp, exact=True)
    result = specdec_np.typical_acceptance_sample(
        target, bonus, draft, posterior_threshold=threshold_arg, posterior_alpha=alpha
    )
    assert_matches_expectation(result, exp)
    return exp


# --------------------------------------------------------------------------------------
# Input generation (numpy from a hypothesis-drawn seed: large vocabularies stay fast)
# --------------------------------------------------------------------------------------

ROW_KINDS = ("dirichlet", "noise", "counts", "tied_max", "onehot", "floored_onehot", "zeros")


def make_row(rng: np.random.Generator, vocab_size: int, kind: str) -> np.ndarray:
    if kind == "dirichlet":
        row = rng.dirichlet(np.full(vocab_size, rng.choice([0.05, 0.5, 5.0])))
        if np.isfinite(row).all() and row.sum() > 0:
            return row
        kind = "onehot"
    if kind == "noise":
        # Unnormalised, as vLLM's tests feed.  Entries above 1 make p ln p positive; they
        # stay in small vocabularies so that the entropy cannot fall below -709, where
        # exp(-H) overflows (see test_alpha_zero_with_overflowing_exp for that case).
        scale = rng.choice([0.1, 1.0, 3.0]) if vocab_size <= 64 else rng.choice([0.1, 1.0])
        return rng.random(vocab_size) * scale
    if kind == "counts":
        # Small integers: many exact ties.  Unnormalised only in small vocabularies, for
        # the reason given under "noise".
        row = rng.integers(0, 4, vocab_size).astype(np.float64)
        if (vocab_size > 64 or rng.random() < 0.5) and row.sum() > 0:
            row /= row.sum()
        return row
    if kind == "tied_max":
        row = rng.dirichlet(np.full(vocab_size, 0.5))
        if not np.isfinite(row).all():
            row = np.full(vocab_size, 1.0 / vocab_size)
        copies = rng.integers(0, vocab_size, size=rng.integers(1, 4))
        row[copies] = row.max()
        return row
    row = np.zeros(vocab_size)
    if kind == "floored_onehot":
        row[:] = 1e-5
    if kind != "zeros":
        row[rng.integers(vocab_size)] = 1.0
    return row


def make_target(rng, batch_size, k, vocab_size, kinds=ROW_KINDS) -> np.ndarray:
    target = np.empty((batch_size, k + 1, vocab_size))
    for b in range(batch_size):
        for i in range(k + 1):
            target[b, i] = make_row(rng, vocab_size, kinds[rng.integers(len(kinds))])
    return target


def make_drafts(rng, target: np.ndarray, k: int) -> np.ndarray:
    """Per position: the argmax, the last index of the maximum (a tie if there is one), the
    smallest entry, or a random token."""
    batch_size, _, vocab_size = target.shape
    draft = np.empty((batch_size, k), dtype=np.int64)
    for b in range(batch_size):
        for i in range(k):
            row = target[b, i]
            choice = rng.integers(4)
            if choice == 0:
                draft[b, i] = int(np.argmax(row))
            elif choice == 1:
                draft[b, i] = int(np.flatnonzero(row == row.max())[-1])
            elif choice == 2:
                draft[b, i] = int(np.argmin(row))
            else:
                draft[b, i] = int(rng.integers(vocab_size))
    return draft


def build_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype, kinds=ROW_KINDS):
    rng = np.random.default_rng(seed)
    target = make_target(rng, batch_size, k, vocab_size, kinds).astype(float_dtype)
    draft = make_drafts(rng, target, k).astype(id_dtype)
    bonus = rng.integers(0, vocab_size, size=(batch_size, 1)).astype(id_dtype)
    return target, bonus, draft


posteriors = st.one_of(
    st.sampled_from([0.0, 1e-3, 0.05, 0.09, 0.3, 1.0, 5.0]),
    st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
)
float_dtypes = st.sampled_from([np.float32, np.float64])
id_dtypes = st.sampled_from([np.int32, np.int64])
seeds = st.integers(0, 2**32 - 1)


# --------------------------------------------------------------------------------------
# Kernel == reference
# --------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 6),
    k=st.integers(1, 5),
    vocab_size=st.integers(1, 64),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
    threshold_arg=posteriors,
    alpha=posteriors,
)
@example(
    seed=0,
    batch_size=3,
    k=1,
    vocab_size=1,
    float_dtype=np.float32,
    id_dtype=np.int64,
    threshold_arg=0.09,
    alpha=0.3,
)
@example(
    seed=1,
    batch_size=4,
    k=1,
    vocab_size=1,
    float_dtype=np.float64,
    id_dtype=np.int32,
    threshold_arg=0.0,
    alpha=0.0,
)
@example(
    seed=2,
    batch_size=0,
    k=3,
    vocab_size=7,
    float_dtype=np.float32,
    id_dtype=np.int64,
    threshold_arg=0.09,
    alpha=0.3,
)
def test_kernel_matches_reference_small_vocab(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype, threshold_arg, alpha
):
    target, bonus, draft = build_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype)
    check_kernel_and_reference(target, bonus, draft, threshold_arg, alpha)


@settings(max_examples=150, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 6),
    k=st.integers(1, 5),
    vocab_size=st.integers(1000, 5000),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
    threshold_arg=posteriors,
    alpha=posteriors,
)
@example(
    seed=3,
    batch_size=6,
    k=5,
    vocab_size=4103,
    float_dtype=np.float32,
    id_dtype=np.int64,
    threshold_arg=1.0,
    alpha=0.3,
)
def test_kernel_matches_reference_large_vocab(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype, threshold_arg, alpha
):
    """Several 1024-entry blocks, the 8-lane tail, and (for B*(k+1)*V >= 65536) the
    OpenMP path over rows."""
    target, bonus, draft = build_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype)
    check_kernel_and_reference(target, bonus, draft, threshold_arg, alpha)


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_kernel_matches_reference_threaded_batch(float_dtype, threaded):
    """A batch big enough for the OpenMP path (B * (k+1) * V well above 65536)."""
    target, bonus, draft = build_case(11, 24, 4, 3000, float_dtype, np.int64)
    check_kernel_and_reference(target, bonus, draft, 0.09, 0.3)
    check_kernel_and_reference(target, bonus, draft, 1.0, 2.0)


# --------------------------------------------------------------------------------------
# The tolerance is narrow, and the checker does fail
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [50, 5000])
def test_tolerance_band_is_narrow(vocab_size):
    """On normalised rows the band where a flip is tolerated stays below 3e-5 relative
    (float32) and 1e-10 relative (float64)."""
    rng = np.random.default_rng(5)
    rows = np.stack([rng.dirichlet(np.full(vocab_size, c)) for c in (0.05, 1.0, 50.0)])
    target = rows[None, :, :]
    for dtype, bound in ((np.float32, 3e-5), (np.float64, 1e-10)):
        _, delta = entropy_error_bound(target.astype(dtype), 3)
        assert np.all(np.expm1(2 * delta) < bound)


def test_checker_rejects_a_wrong_decision():
    """Negative control of assert_matches_expectation: a flipped decision that is not
    ambiguous, or a wrong recovered token, must be caught."""
    target = np.array([[[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]], dtype=np.float32)
    bonus = np.array([[2]])
    draft = np.array([[2]])
    exp = typical_expectation(target, bonus, draft, 0.09, 0.3)
    assert not exp.ambiguous.any()
    assert exp.accepted.tolist() == [[True]]
    good = (np.array([[2, 2]]), np.array([1]), np.array([1]))
    assert_matches_expectation(good, exp)
    flipped = (np.array([[0, -1]]), np.array([0]), np.array([0]))
    with pytest.raises(AssertionError):
        assert_matches_expectation(flipped, exp)
    wrong_count = (np.array([[2, 2]]), np.array([1]), np.array([0]))
    with pytest.raises(AssertionError):
        assert_matches_expectation(wrong_count, exp)


def test_checker_tolerates_a_flip_only_at_the_threshold():
    """A float64 row whose draft probability equals the reference threshold (to rounding)
    is ambiguous (either decision is allowed); the other position is not."""
    rng = np.random.default_rng(9)
    row = rng.dirichlet(np.full(300, 1.0))
    target = np.stack([row, row, row])[None].copy()
    draft = np.array([[7, int(np.argmax(row))]])
    p_x = solve_for_draft_probability(target[0, 0], 7, 1.0, 0.3, 0.0, np.float64)
    target[0, 0, 7] = p_x
    exp = typical_expectation(target, np.array([[0]]), draft, 1.0, 0.3)
    assert exp.ambiguous.tolist() == [[True, False]]
    assert len(allowed_rows(exp, 0)) == 2


def solve_for_draft_probability(row, x, threshold_arg, alpha, epsilon, dtype):
    """A value ``p`` for ``row[x]`` with ``p == (1 + epsilon) * threshold(row with p)``,
    rounded to ``dtype`` (a fixed point: the threshold moves slowly with ``row[x]``)."""
    row = row.astype(np.float64).copy()
    p = 0.01
    for _ in range(200):
        row[x] = p
        entropy = -np.sum(row * np.log(row + 1e-5))
        new = (1.0 + epsilon) * min(threshold_arg, alpha * math.exp(-entropy))
        if new == p:
            break
        p = new
    return dtype(p)


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("vocab_size", [37, 1031, 4099])
@pytest.mark.parametrize("epsilon", [-1e-4, 1e-4, -1e-3, 1e-3])
def test_decisions_exact_just_outside_the_band(float_dtype, vocab_size, epsilon):
    """Draft probabilities 1e-4 relative from the entropy threshold: well outside the
    tolerated band, so the kernel must decide exactly as the reference."""
    rng = np.random.default_rng(vocab_size)
    k = 4
    target = np.empty((2, k + 1, vocab_size))
    draft = np.empty((2, k), dtype=np.int64)
    for b in range(2):
        for i in range(k + 1):
            target[b, i] = rng.dirichlet(np.full(vocab_size, [0.1, 1.0, 10.0][(b + i) % 3]))
        for i in range(k):
            x = int(rng.integers(vocab_size))
            target[b, i, x] = solve_for_draft_probability(
                target[b, i], x, 1.0, 0.3, epsilon, float_dtype
            )
            draft[b, i] = x
    target = target.astype(float_dtype)
    bonus = np.array([[1], [2]])
    exp = typical_expectation(target, bonus, draft, 1.0, 0.3)
    relative = (exp.p_x - exp.threshold) / exp.threshold
    np.testing.assert_allclose(relative, epsilon, rtol=0.01)
    assert not exp.ambiguous.any()
    assert np.all(exp.accepted == (epsilon > 0))
    check_kernel_and_reference(target, bonus, draft, 1.0, 0.3)


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_disagreements_only_inside_the_band(float_dtype):
    """Draft probabilities within 1e-7 relative of the entropy threshold, where the kernel's
    float32 logarithm may legitimately decide the other way: its result must still be one
    of the allowed rows (the flips stay at the ambiguous positions)."""
    rng = np.random.default_rng(17)
    batch_size, k = 6, 5
    epsilons = [-1e-7, -1e-8, 0.0, 1e-8, 1e-7] if float_dtype == np.float32 else [0.0] * 5
    for vocab_size in (40, 2100):
        target = np.empty((batch_size, k + 1, vocab_size))
        draft = rng.integers(0, vocab_size, (batch_size, k))
        for b in range(batch_size):
            for i in range(k + 1):
                target[b, i] = rng.dirichlet(np.full(vocab_size, [0.05, 0.5, 5.0][b % 3]))
            for i in range(k):
                target[b, i, draft[b, i]] = solve_for_draft_probability(
                    target[b, i], draft[b, i], 1.0, 0.3, epsilons[i], float_dtype
                )
        target = target.astype(float_dtype)
        bonus = rng.integers(0, vocab_size, (batch_size, 1))
        exp = check_kernel_and_reference(target, bonus, draft, 1.0, 0.3)
        assert exp.ambiguous.mean() > 0.9  # the tolerance path is really exercised


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_strict_inequality_at_posterior_threshold(float_dtype):
    """When ``posterior_threshold`` is the minimum, it is exact: p(x) equal to it is
    rejected, the next representable value above it is accepted (the kernel's shortcut)."""
    t = float(float_dtype(0.09))
    above = float(np.nextafter(float_dtype(t), float_dtype(1)))
    target = np.zeros((1, 3, 4), dtype=float_dtype)
    target[0, 0] = [t, 1 - t, 0, 0]
    target[0, 1] = [above, 1 - above, 0, 0]
    draft = np.array([[0, 0]])
    bonus = np.array([[3]])
    exp = typical_expectation(target, bonus, draft, t, 0.3)
    assert np.all(exp.threshold == t)  # low entropy: alpha * exp(-H) > t
    result = specdec_np.typical_acceptance_sample(
        target, bonus, draft, posterior_threshold=t, posterior_alpha=0.3
    )
    np.testing.assert_array_equal(result.output_token_ids, [[1, -1, -1]])
    np.testing.assert_array_equal(result.num_accepted, [1])
    check_kernel_and_reference(target, bonus, draft, t, 0.3)


# --------------------------------------------------------------------------------------
# The shortcut agrees with the full pass
# --------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds,
    vocab_size=st.sampled_from([1, 5, 64, 1500]),
    float_dtype=float_dtypes,
    threshold_arg=st.sampled_from([0.0, 0.01, 0.09, 0.3, 0.7]),
    alpha=posteriors,
)
def test_shortcut_agrees_with_full_pass(seed, vocab_size, float_dtype, threshold_arg, alpha):
    """With k = 1 each row's num_accepted is its decision.  Accepting iff
    ``p > min(t, a e^-H)`` is ``p > t or p > a e^-H``; with t = 1e300 the kernel can never
    take its shortcut, so decisions(t) == (p > t) | decisions(1e300) on normal rows."""
    rng = np.random.default_rng(seed)
    batch_size = 12
    target = make_target(rng, batch_size, 1, vocab_size, ("dirichlet", "counts", "onehot"))
    target = target.astype(float_dtype)
    draft = make_drafts(rng, target, 1)
    bonus = np.zeros((batch_size, 1), dtype=np.int64)
    with_shortcut = specdec_np.typical_acceptance_sample(
        target, bonus, draft, posterior_threshold=threshold_arg, posterior_alpha=alpha
    )
    full_pass = specdec_np.typical_acceptance_sample(
        target, bonus, draft, posterior_threshold=1e300, posterior_alpha=alpha
    )
    p_x = np.take_along_axis(target[:, 0, :], draft, axis=1)[:, 0].astype(np.float64)
    expected = (p_x > threshold_arg) | (full_pass.num_accepted == 1)
    np.testing.assert_array_equal(with_shortcut.num_accepted == 1, expected)
    argmax = target[:, 0, :].argmax(axis=1)
    np.testing.assert_array_equal(
        with_shortcut.output_token_ids[:, 0], np.where(expected, draft[:, 0], argmax)
    )


# --------------------------------------------------------------------------------------
# Behaviours from vLLM's test suite, restated
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch_size,k", [(1, 1), (8, 3), (32, 5)])
def test_uniform_noise_accepts_everything(float_dtype, batch_size, k):
    """Raw uniform [0, 1) noise over 1000 tokens: H = -sum p ln(p + 1e-5) is about
    1000 * E[-p ln p] = 250, so alpha * exp(-H) ~ 1e-109 and any draft with p > 0 passes."""
    rng = np.random.default_rng(batch_size)
    vocab_size = 1000
    target = rng.random((batch_size, k + 1, vocab_size)).astype(float_dtype)
    draft = rng.integers(0, vocab_size, (batch_size, k))
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    exp = typical_expectation(target, bonus, draft, 0.09, 0.3)
    assert np.all(exp.threshold < 1e-90)
    assert np.all(exp.p_x > 0)
    sampler = specdec_np.TypicalAcceptanceSampler(0.09, 0.3)
    output = sampler(target, bonus, None, draft)
    np.testing.assert_array_equal(output, np.concatenate([draft, bonus], axis=1))
    assert int(sampler.num_accepted_tokens) == batch_size * k
    assert int(sampler.num_emitted_tokens) == batch_size * (k + 1)
    assert sampler.num_draft_tokens == batch_size * k


def one_hot_target(rng, batch_size, k, vocab_size, floor=0.0, dtype=np.float32):
    hot = rng.integers(0, vocab_size, (batch_size, k + 1))
    target = np.full((batch_size, k + 1, vocab_size), floor, dtype=dtype)
    np.put_along_axis(target, hot[:, :, None], 1.0, axis=2)
    return target, hot


def wrong_drafts(rng, hot, k, vocab_size):
    return (hot[:, :k] + rng.integers(1, vocab_size, hot[:, :k].shape)) % vocab_size


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_one_hot_target_wrong_drafts(float_dtype):
    rng = np.random.default_rng(1)
    batch_size, k, vocab_size = 10, 4, 50
    target, hot = one_hot_target(rng, batch_size, k, vocab_size, dtype=float_dtype)
    draft = wrong_drafts(rng, hot, k, vocab_size)
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    output = specdec_np.TypicalAcceptanceSampler()(target, bonus, None, draft)
    expected = np.full((batch_size, k + 1), -1)
    expected[:, 0] = hot[:, 0]
    np.testing.assert_array_equal(output, expected)


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_partial_acceptance(float_dtype):
    """First two drafts equal the one-hot token, the rest are wrong."""
    rng = np.random.default_rng(2)
    batch_size, k, vocab_size = 7, 5, 30
    target, hot = one_hot_target(rng, batch_size, k, vocab_size, dtype=float_dtype)
    draft = wrong_drafts(rng, hot, k, vocab_size)
    draft[:, :2] = hot[:, :2]
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    sampler = specdec_np.TypicalAcceptanceSampler()
    output = sampler(target, bonus, None, draft)
    expected = np.full((batch_size, k + 1), -1)
    expected[:, :2] = hot[:, :2]
    expected[:, 2] = hot[:, 2]
    np.testing.assert_array_equal(output, expected)
    assert int(sampler.num_accepted_tokens) == 2 * batch_size
    assert int(sampler.num_emitted_tokens) == 3 * batch_size


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_floored_one_hot_depends_on_posteriors(float_dtype):
    """One-hot with a 1e-5 floor: H ~ 0.11, so the threshold is min(0.09, 0.3 * 0.9) = 0.09
    and p = 1e-5 fails; with posterior_threshold = posterior_alpha = 0 the threshold is 0
    and every draft passes."""
    rng = np.random.default_rng(3)
    batch_size, k, vocab_size = 6, 3, 1000
    target, hot = one_hot_target(rng, batch_size, k, vocab_size, floor=1e-5, dtype=float_dtype)
    draft = wrong_drafts(rng, hot, k, vocab_size)
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    exp = typical_expectation(target, bonus, draft, 0.09, 0.3)
    np.testing.assert_allclose(exp.threshold, 0.09)
    rejected = specdec_np.TypicalAcceptanceSampler(0.09, 0.3)(target, bonus, None, draft)
    expected = np.full((batch_size, k + 1), -1)
    expected[:, 0] = hot[:, 0]
    np.testing.assert_array_equal(rejected, expected)
    sampler = specdec_np.TypicalAcceptanceSampler(posterior_threshold=0.0, posterior_alpha=0.0)
    accepted = sampler(target, bonus, None, draft)
    np.testing.assert_array_equal(accepted, np.concatenate([draft, bonus], axis=1))


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threshold_arg", [0.09, 1.0])
def test_entropy_decides(float_dtype, threshold_arg):
    """The same p(x) = 0.05 fails in a low-entropy row (threshold min(t, 0.3 e^-0.2) >=
    0.09) and passes in a high-entropy one (0.3 e^-6.7 ~ 4e-4)."""
    vocab_size = 1000
    low = np.zeros(vocab_size)
    low[:2] = [0.95, 0.05]
    high = np.full(vocab_size, 0.95 / (vocab_size - 1))
    high[1] = 0.05
    target = np.stack([np.stack([low, low]), np.stack([high, high])]).astype(float_dtype)
    draft = np.array([[1], [1]])
    bonus = np.array([[5], [6]])
    exp = typical_expectation(target, bonus, draft, threshold_arg, 0.3)
    assert exp.threshold[0, 0] > 0.05 > 10 * exp.threshold[1, 0]
    output = specdec_np.TypicalAcceptanceSampler(threshold_arg, 0.3)(target, bonus, None, draft)
    np.testing.assert_array_equal(output, [[0, -1], [1, 6]])


def test_recovered_token_is_first_argmax_across_blocks():
    """Recovered token on ties: the first index, across 1024-blocks, at a block boundary,
    in the 8-lane tail and inside one lane group."""
    cases = [  # (vocab size, indices holding the maximum)
        (4000, [3000, 1500]),
        (2048, [2047, 1024]),
        (1029, [1028, 1025]),
        (1029, [1028]),
        (16, [13, 5, 3]),
        (5, [4, 2]),
    ]
    for vocab_size, maxima in cases:
        for dtype in (np.float32, np.float64):
            row = np.full(vocab_size, 0.2 / vocab_size)
            row[maxima] = 0.3
            row[1023 % vocab_size] = 0.29
            target = np.stack([row, row])[None].astype(dtype)
            draft = np.array([[0]])  # p = 0.2 / V, far below any threshold here
            result = specdec_np.typical_acceptance_sample(target, np.array([[1]]), draft)
            np.testing.assert_array_equal(result.output_token_ids, [[min(maxima), -1]])
            check_kernel_and_reference(target, np.array([[1]]), draft, 0.09, 0.3)


# --------------------------------------------------------------------------------------
# Counters, empty batches, draft_probs, constructor
# --------------------------------------------------------------------------------------


def test_counters_count_passes_after_the_first_rejection():
    """vLLM semantics: each position is tested on its own; passes after the first rejection
    count in num_accepted_tokens but are not emitted."""
    vocab_size = 6
    target = np.zeros((2, 5, vocab_size), dtype=np.float32)
    target[:, :, 2] = 1.0
    draft = np.array([[4, 2, 5, 2], [2, 2, 2, 2]])
    bonus = np.array([[0], [1]])
    sampler = specdec_np.TypicalAcceptanceSampler()
    sampler.init_tensors("cpu")
    output = sampler(target, bonus, None, draft)
    np.testing.assert_array_equal(output, [[2, -1, -1, -1, -1], [2, 2, 2, 2, 1]])
    for counter in (sampler.num_accepted_tokens, sampler.num_emitted_tokens):
        assert (
            isinstance(counter, np.ndarray) and counter.shape == () and counter.dtype == np.int64
        )
    assert int(sampler.num_accepted_tokens) == 2 + 4
    assert int(sampler.num_emitted_tokens) == 1 + 5
    assert sampler.num_draft_tokens == 8
    assert isinstance(sampler.num_draft_tokens, int)
    result = specdec_np.typical_acceptance_sample(target, bonus, draft)
    np.testing.assert_array_equal(result.accepted_lengths, [0, 4])
    np.testing.assert_array_equal(result.num_accepted, [2, 4])
    # A second call adds to the counters.
    sampler(target[:1], bonus[:1], None, draft[:1])
    assert int(sampler.num_accepted_tokens) == 8
    assert int(sampler.num_emitted_tokens) == 7
    assert sampler.num_draft_tokens == 12


def test_empty_batch_leaves_counters_alone():
    sampler = specdec_np.TypicalAcceptanceSampler()
    target = np.full((2, 3, 4), 0.25, dtype=np.float32)
    sampler(target, np.zeros((2, 1), np.int64), None, np.zeros((2, 2), np.int64))
    before = (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )
    output = sampler(
        np.zeros((0, 3, 4), np.float32),
        np.zeros((0, 1), np.int64),
        None,
        np.zeros((0, 2), np.int64),
    )
    assert output.shape == (0, 3) and output.dtype == np.int64
    after = (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )
    assert after == before
    result = specdec_np.typical_acceptance_sample(
        np.zeros((0, 3, 4)), np.zeros((0, 1), np.int32), np.zeros((0, 2), np.int32)
    )
    assert result.output_token_ids.shape == (0, 3)
    assert result.accepted_lengths.shape == result.num_accepted.shape == (0,)


def test_draft_probs_are_ignored():
    target, bonus, draft = build_case(21, 5, 3, 40, np.float32, np.int64)
    rng = np.random.default_rng(4)
    draft_probs = rng.dirichlet(np.ones(40), size=(5, 3)).astype(np.float32)
    without = specdec_np.TypicalAcceptanceSampler()(target, bonus, None, draft)
    with_probs = specdec_np.TypicalAcceptanceSampler()(target, bonus, draft_probs, draft)
    np.testing.assert_array_equal(without, with_probs)


@pytest.mark.parametrize("name", ["posterior_threshold", "posterior_alpha"])
@pytest.mark.parametrize(
    "value,error",
    [
        (-0.1, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (np.float32(np.nan), ValueError),
        ("0.1", TypeError),
        (None, TypeError),
        ([0.1], TypeError),
        (1 + 0j, TypeError),
    ],
)
def test_constructor_rejects_bad_posteriors(name, value, error):
    with pytest.raises(error, match=name):
        specdec_np.TypicalAcceptanceSampler(**{name: value})
    target = np.full((1, 2, 3), 1 / 3, dtype=np.float32)
    with pytest.raises(error, match=name):
        specdec_np.typical_acceptance_sample(
            target, np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64), **{name: value}
        )


@pytest.mark.parametrize("value", [0, 0.0, 1, np.float32(0.5), np.float64(2.0), np.int64(3)])
def test_constructor_accepts_non_negative_numbers(value):
    sampler = specdec_np.TypicalAcceptanceSampler(posterior_threshold=value, posterior_alpha=value)
    target = np.full((1, 2, 3), 1 / 3, dtype=np.float32)
    output = sampler(target, np.zeros((1, 1), np.int64), None, np.zeros((1, 1), np.int64))
    assert output.shape == (1, 2)


def test_alpha_zero_with_overflowing_exp():
    """posterior_alpha = 0 makes the threshold 0 for every finite entropy
    (min(t, 0 * exp(-H)) = 0), so every draft with p(x) > 0 is accepted.  Here the
    unnormalised row has H ~ -6900, where exp(-H) overflows to inf in float64 and
    0 * inf = NaN: neither implementation may let that NaN decide."""
    target = np.zeros((1, 3, 4))
    target[0, 0] = [1000.0, 0.5, 0.2, 0.1]
    target[0, 1] = [1000.0, 0.5, 0.2, 0.05]
    draft = np.array([[1, 3]])  # p(x) = 0.5 > t, then 0.05 < t
    bonus = np.array([[2]])
    expected = [[1, 3, 2]]
    ref = _reference.typical_acceptance_sample(target, bonus, draft, 0.09, 0.0)
    kernel = specdec_np.typical_acceptance_sample(
        target, bonus, draft, posterior_threshold=0.09, posterior_alpha=0.0
    )
    assert (np.asarray(kernel.output_token_ids).tolist(), np.asarray(ref[0]).tolist()) == (
        expected,
        expected,
    )


# --------------------------------------------------------------------------------------
# The reference on array_api_strict
# --------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 4),
    k=st.integers(1, 4),
    vocab_size=st.integers(1, 40),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
    threshold_arg=posteriors,
    alpha=posteriors,
)
def test_reference_on_array_api_strict_equals_numpy(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype, threshold_arg, alpha
):
    target, bonus, draft = build_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype)
    on_numpy = _reference.typical_acceptance_sample(target, bonus, draft, threshold_arg, alpha)
    on_strict = _reference.typical_acceptance_sample(
        xps.asarray(target), xps.asarray(bonus), xps.asarray(draft), threshold_arg, alpha
    )
    for a, b in zip(on_numpy, on_strict, strict=True):
        assert b.dtype == xps.int64
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
