"""GPU backend (CuPy): the CUDA kernel skeleton and its row functors against the CPU kernels,
for every verifier of the registry; counters, errors, randomness, DLPack and the import rule.

Every test is marked ``gpu``: ``tests/conftest.py`` skips them unless ``cupy.is_available()``
(``SPECDEC_REQUIRE_GPU=1`` turns the skip into a failure), and cupy is imported lazily by the
``cp`` fixture, so collecting this file never needs CuPy.

How the GPU may differ from the CPU, and why only there
--------------------------------------------------------
* Rejection sampling, same explicit uniforms: the acceptance test ``u * q(x) < p(x)`` is a
  float64 comparison of stored values, so ``accepted_lengths``, ``num_accepted`` and every
  accepted prefix must be identical.  The recovered token is an inverse-CDF draw whose float64
  sums are taken in another order on the GPU (segments, chunks, scan) than on the CPU; the two
  tokens may differ only where ``v * Z`` lies within float rounding of the CDF boundary between
  them (:func:`assert_draw_consistent`, the check of ``tests/verifiers/test_rejection.py``).
* Block verification, same explicit uniforms: ``rho`` is the same float64 recurrence on both
  backends; ``h_i`` divides residual masses summed in another order, so a decision could flip
  only where ``eta_i`` lies within rounding of ``h_i`` (never on these inputs): accepted
  lengths are compared exactly, and the draw from the weighted residual as above.
* Greedy: comparisons of stored values only, identical on both backends.
* Typical acceptance: both backends use the same float32 entropy term ``p * ln(p + 1e-5)``
  accumulated in float64, but another log implementation (CUDA ``logf``/``log``, both within
  one ulp) and another summation order.  The error bound of
  ``tests/verifiers/test_typical_acceptance.py`` holds for both, so a decision may differ
  only where ``p(x)`` lies inside that rounding band around the float64 threshold
  (``typical_expectation``); everywhere else GPU, CPU and the
  float64 formula agree exactly, and the recovered argmax is identical.
* Trees (``verify_tree``): every element of a residual update is the CPU's double (the same
  operations in the same order); the masses and the final inverse-CDF totals are float64 sums
  in another order.  A request's result must equal the CPU's, or equal the CPU's once one of
  its uniforms is nudged by ``TREE_NUDGE`` (the uniform lay within rounding of a boundary).
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from draw_checks import (
    LARGEST_BELOW_ONE,
    MC_P,
    MC_Q,
    assert_draw_consistent,
    block_rho,
    random_rows,
    residual_weights,
    weighted_residual,
)

import specdec_np
from specdec_np import _core, registry
from specdec_np._kernels import cuda as _cuda
from specdec_np._reference import chains as _reference
from specdec_np._runtime import arrays as _backend
from specdec_np._runtime import philox as _philox
from specdec_np.testing import _monte_carlo, _oracles, _self_check, _statistics

pytestmark = pytest.mark.gpu

FLOAT_DTYPES = (np.float32, np.float64)
ID_DTYPES = (np.int32, np.int64)
VERIFIERS = {verifier.name: verifier for verifier in registry.VERIFIERS}
STOCHASTIC = tuple(v for v in registry.VERIFIERS if v.stochastic)
# The verifiers with padded fronts (a sampler class and a stateless function); one reached
# through method= only is tested on the device through verify_ragged.
PADDED = tuple(v for v in registry.VERIFIERS if v.sampler_name is not None)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cp():
    """The cupy module (imported lazily: collecting this file never needs CuPy)."""
    return pytest.importorskip("cupy")


def dtype_id(value):
    return np.dtype(value).name


def stable_seed(*parts):
    """A seed fixed by the test parameters (``hash`` of a str changes between runs)."""
    return zlib.crc32(repr(parts).encode())


# --------------------------------------------------------------------------------------
# Moving arrays and checking where results live
# --------------------------------------------------------------------------------------


def on_device(cp, device, *arrays):
    """Copies of NumPy arrays on CUDA device ``device`` (``None`` stays ``None``)."""
    with cp.cuda.Device(device):
        return tuple(None if a is None else cp.asarray(a) for a in arrays)


def to_host(cp, result):
    """A verifier result (or any tuple of CuPy arrays) as NumPy arrays."""
    return tuple(cp.asnumpy(a) for a in result)


def assert_on_device(cp, array, device, shape=None, dtype=np.int64):
    assert isinstance(array, cp.ndarray), f"expected a cupy.ndarray, found {type(array)}"
    assert array.device.id == device, f"array on device {array.device.id}, expected {device}"
    assert array.dtype == dtype
    if shape is not None:
        assert tuple(array.shape) == tuple(shape)


def assert_gpu_result(cp, result, device, batch_size, k):
    """A :class:`VerificationResult` of CuPy int64 arrays on ``device`` with the output shapes
    of docs/semantics.md §1."""
    output, lengths, passes = result
    assert_on_device(cp, output, device, (batch_size, k + 1))
    assert_on_device(cp, lengths, device, (batch_size,))
    assert_on_device(cp, passes, device, (batch_size,))


def synchronize(cp, device=0):
    """Wait for the device: a sticky CUDA error (an out-of-bounds access) surfaces here."""
    cp.cuda.Device(device).synchronize()


# --------------------------------------------------------------------------------------
# Rejection sampling: inputs and the GPU-versus-CPU comparison
# --------------------------------------------------------------------------------------


def make_rejection_case(seed, batch_size, k, vocab_size, dtype, id_dtype, with_draft_probs):
    """A batch mixing the edge cases of rejection sampling (docs/semantics.md §2.2)
    position by position: ``p(x) = 0``,
    ``q(x) = 0``, ``p == q``, an empty residual (``q = 2p``), one-hot targets, uniforms 0 and
    the largest double below 1, drafts drawn from ``q`` and rows that accept often.  Every
    target row keeps positive mass, so no call fails."""
    rng = np.random.default_rng(seed)
    target = random_rows(rng, (batch_size, k + 1, vocab_size))
    draft = random_rows(rng, (batch_size, k, vocab_size))
    draft_ids = rng.integers(0, vocab_size, (batch_size, k))
    for b, i in zip(*np.nonzero(rng.random((batch_size, k)) < 0.5)):
        draft_ids[b, i] = _monte_carlo.draw_from(draft[b, i], 1, rng)[0]
    uniforms = rng.random((batch_size, k + 1))
    uniforms[:, :k] *= rng.choice([0.05, 0.3, 1.0], size=(batch_size, 1))
    edge = rng.integers(0 if vocab_size > 1 else 1, 9, (batch_size, k))
    rows, cols = np.nonzero(edge == 0)  # p(x) = 0 (never accepted)
    target[rows, cols, draft_ids[rows, cols]] = 0.0
    for b, i in zip(rows, cols):
        if target[b, i].sum() == 0:
            target[b, i, (draft_ids[b, i] + 1) % vocab_size] = 1.0
        target[b, i] /= target[b, i].sum()
    rows, cols = np.nonzero(edge == 1)  # q(x) = 0 < p(x) (always accepted)
    draft[rows, cols, draft_ids[rows, cols]] = 0.0
    rows, cols = np.nonzero(edge == 3)  # q = 2p >= p: empty residual, draw from p
    draft[rows, cols] = 2.0 * target[rows, cols]
    rows, cols = np.nonzero(edge == 4)  # one-hot target at the draft token
    target[rows, cols] = 0.0
    target[rows, cols, draft_ids[rows, cols]] = 1.0
    rows, cols = np.nonzero(edge == 5)  # extreme acceptance uniforms
    uniforms[rows, cols] = rng.choice([0.0, LARGEST_BELOW_ONE], size=rows.size)
    extreme = rng.random(batch_size) < 0.2  # extreme residual uniforms
    uniforms[extreme, k] = rng.choice([0.0, LARGEST_BELOW_ONE], size=int(extreme.sum()))
    target = target.astype(dtype)
    draft = draft.astype(dtype)
    rows, cols = np.nonzero(edge == 2)  # p == q exactly, after rounding to dtype
    draft[rows, cols] = target[rows, cols]
    bonus = rng.integers(0, vocab_size, (batch_size, 1)).astype(id_dtype)
    return (
        target,
        bonus,
        draft if with_draft_probs else None,
        draft_ids.astype(id_dtype),
        uniforms,
    )


def acceptance_passes(target, draft_probs, draft_ids, uniforms):
    """Rejection's acceptance test (docs/semantics.md §2.2) restated: ``u * q(x) < p(x)`` in
    float64, ``[B, k]``."""
    k = draft_ids.shape[1]
    ids = draft_ids.astype(np.int64)[:, :, None]
    p_x = np.take_along_axis(target[:, :k], ids, 2)[..., 0].astype(np.float64)
    if draft_probs is None:
        q_x = np.ones_like(p_x)
    else:
        q_x = np.take_along_axis(draft_probs, ids, 2)[..., 0].astype(np.float64)
    return uniforms[:, :k] * q_x < p_x


def compare_rejection(case, cpu, gpu):
    """GPU and CPU results (NumPy) of the same inputs and uniforms: decisions, counters and
    prefixes identical; the recovered token equal except at a CDF boundary."""
    target, bonus, draft_probs, draft_ids, uniforms = case
    k = draft_ids.shape[1]
    cpu_output, cpu_lengths, cpu_passes = cpu
    output, lengths, passes = gpu
    np.testing.assert_array_equal(lengths, cpu_lengths)
    np.testing.assert_array_equal(passes, cpu_passes)
    accepted = acceptance_passes(target, draft_probs, draft_ids, uniforms)
    np.testing.assert_array_equal(passes, accepted.sum(axis=1))
    first_fail = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1))
    np.testing.assert_array_equal(lengths, first_fail)
    assert_prefixes_and_draws(case, cpu_output, output, lengths, lambda b, r: 1.0)


def assert_prefixes_and_draws(case, cpu_output, output, lengths, rho_of=None):
    """Rows of equal accepted lengths on both backends: the draft prefix, then the bonus
    token (all accepted) or the token after the prefix, then -1.  That token is a draw from
    ``max(rho p - q, 0)`` (``rho = rho_of(b, r)``) equal to the CPU's except at a CDF
    boundary, or, for a deterministic verifier (``rho_of`` None), the CPU's token."""
    target, bonus, draft_probs, draft_ids, uniforms = case
    batch_size, k = draft_ids.shape
    for b in range(batch_size):
        r = int(lengths[b])
        np.testing.assert_array_equal(output[b, :r], draft_ids[b, :r])
        np.testing.assert_array_equal(output[b, r + 1 :], -1)
        if r == k:
            assert output[b, k] == bonus[b, 0] == cpu_output[b, k]
            continue
        if rho_of is None:
            assert output[b, r] == cpu_output[b, r]
            continue
        if draft_probs is None:
            q_row = np.eye(1, target.shape[2], int(draft_ids[b, r]))[0]
        else:
            q_row = draft_probs[b, r]
        weights = weighted_residual(target[b, r], q_row, rho_of(b, r))
        assert_draw_consistent(
            output[b, r], cpu_output[b, r], weights, uniforms[b, k], names=("GPU", "CPU")
        )


def case_block_rho(case, b, i):
    """rho_i of block verification for row b of a case."""
    target, _, draft_probs, draft_ids, _ = case
    ids = draft_ids[b, :i].astype(np.int64)
    p_x = target[b, np.arange(i), ids]
    return block_rho(p_x, None if draft_probs is None else draft_probs[b, np.arange(i), ids])


def compare_block(case, cpu, gpu):
    """Block verification on both backends with the same uniforms: accepted lengths (tau),
    counts and prefixes identical; the token after the prefix is the bonus token, or a draw
    from max(rho_tau p - q, 0) equal except at a CDF boundary."""
    cpu_output, cpu_lengths, cpu_passes = cpu
    output, lengths, passes = gpu
    np.testing.assert_array_equal(lengths, cpu_lengths)
    np.testing.assert_array_equal(passes, lengths)  # causal counts
    np.testing.assert_array_equal(cpu_passes, cpu_lengths)
    assert_prefixes_and_draws(
        case, cpu_output, output, lengths, lambda b, i: case_block_rho(case, b, i)
    )


def check_block(cp, case, device=0):
    """Block verification of the case on the CPU and on ``device``, same uniforms; compare."""
    target, bonus, draft_probs, draft_ids, uniforms = case
    cpu = specdec_np.block_verification_sample(
        target, bonus, draft_probs, draft_ids, uniforms=uniforms
    )
    g_target, g_bonus, g_draft, g_ids, g_uniforms = on_device(cp, device, *case)
    gpu = specdec_np.block_verification_sample(
        g_target, g_bonus, g_draft, g_ids, uniforms=g_uniforms
    )
    assert_gpu_result(cp, gpu, device, *draft_ids.shape)
    compare_block(case, cpu, to_host(cp, gpu))
    return cpu, gpu


def check_rejection(cp, case, device=0):
    """Run the case on the CPU and on ``device`` with the same explicit uniforms; compare."""
    target, bonus, draft_probs, draft_ids, uniforms = case
    cpu = specdec_np.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
    g_target, g_bonus, g_draft, g_ids, g_uniforms = on_device(cp, device, *case)
    gpu = specdec_np.rejection_sample(g_target, g_bonus, g_draft, g_ids, uniforms=g_uniforms)
    assert_gpu_result(cp, gpu, device, *draft_ids.shape)
    compare_rejection(case, cpu, to_host(cp, gpu))
    return cpu, gpu


# (B, k, V): V = 1, k = 1, more rows than one block handles at once, vocabularies around the
# 16-byte pack and segment sizes, and Llama 3's 128256 for a few rows.  B = 0 has its own test.
REJECTION_SHAPES = [
    (1, 1, 1),
    (6, 4, 1),
    (9, 1, 13),
    (16, 4, 40),
    (300, 2, 64),
    (8, 5, 515),
    (24, 3, 2049),
    (3, 2, 128256),
]


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", REJECTION_SHAPES, ids=lambda s: "B{}-k{}-V{}".format(*s))
def test_rejection_gpu_matches_cpu(cp, shape, dtype, id_dtype, with_draft_probs):
    batch_size, k, vocab_size = shape
    seed = stable_seed(shape, dtype_id(dtype), dtype_id(id_dtype), with_draft_probs)
    case = make_rejection_case(seed, *shape, dtype, id_dtype, with_draft_probs)
    check_rejection(cp, case)


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", REJECTION_SHAPES, ids=lambda s: "B{}-k{}-V{}".format(*s))
def test_block_gpu_matches_cpu(cp, shape, dtype, id_dtype, with_draft_probs):
    seed = stable_seed("block", shape, dtype_id(dtype), dtype_id(id_dtype), with_draft_probs)
    case = make_rejection_case(seed, *shape, dtype, id_dtype, with_draft_probs)
    check_block(cp, case)


def test_block_with_one_draft_decides_as_rejection_on_gpu(cp):
    """For k = 1 block verification makes token-wise rejection's decisions on the same
    uniforms (and draws from the same residual)."""
    case = make_rejection_case(17, 200, 1, 300, np.float32, np.int64, True)
    g = on_device(cp, 0, *case)
    block = specdec_np.block_verification_sample(*g[:4], uniforms=g[4])
    rejection = specdec_np.rejection_sample(*g[:4], uniforms=g[4])
    np.testing.assert_array_equal(
        cp.asnumpy(block.accepted_lengths), cp.asnumpy(rejection.accepted_lengths)
    )
    np.testing.assert_array_equal(
        cp.asnumpy(block.output_token_ids), cp.asnumpy(rejection.output_token_ids)
    )


def test_point_mass_equals_one_hot_on_gpu(cp):
    """``draft_probs=None`` and one-hot ``draft_probs`` give identical GPU outputs, for every
    stochastic verifier."""
    target, bonus, _, draft_ids, uniforms = make_rejection_case(
        5, 40, 3, 300, np.float32, np.int64, True
    )
    one_hot = np.zeros((40, 3, 300), dtype=np.float32)
    np.put_along_axis(one_hot, draft_ids[:, :, None], 1.0, axis=2)
    g_target, g_bonus, g_one_hot, g_ids, g_uniforms = on_device(
        cp, 0, target, bonus, one_hot, draft_ids, uniforms
    )
    for verifier in STOCHASTIC:
        verify = getattr(specdec_np, verifier.function_name)
        point = verify(g_target, g_bonus, None, g_ids, uniforms=g_uniforms)
        dense = verify(g_target, g_bonus, g_one_hot, g_ids, uniforms=g_uniforms)
        for got, expected in zip(to_host(cp, point), to_host(cp, dense)):
            np.testing.assert_array_equal(got, expected)


def cdf_boundary_values(weights, picks):
    """Uniforms exactly on, and one ulp either side of, the CDF boundaries after ``picks``."""
    cdf = np.cumsum(weights) / weights.sum()
    values = [0.0, LARGEST_BELOW_ONE]
    for y in picks:
        values += [cdf[y], np.nextafter(cdf[y], 0.0), np.nextafter(cdf[y], 1.0)]
    return np.clip(np.array(values, dtype=np.float64), 0.0, LARGEST_BELOW_ONE)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab_size", [37, 2049, 128256])
def test_rejection_gpu_at_cdf_boundaries(cp, vocab_size, dtype):
    """Both stochastic verifiers (k = 1: the same residual), the residual uniform placed on
    and next to CDF boundaries, where the GPU's blocked sums and the CPU's may legitimately
    pick neighbouring tokens: every difference must be explained by rounding at that
    boundary.  The picks include the ends of the GPU's first-level segments (16 per row) and
    random tokens; every boundary for small V."""
    rng = np.random.default_rng(vocab_size)
    target = random_rows(rng, (1, 2, vocab_size), sparsity=0.5)
    draft = random_rows(rng, (1, 1, vocab_size), sparsity=0.5)
    # p(x) = 0 at the draft token: position 0 is always rejected and the residual drawn.
    draft_id = int(rng.integers(vocab_size))
    target[0, 0, draft_id] = 0.0
    target[0, 0] /= target[0, 0].sum()
    target, draft = target.astype(dtype), draft.astype(dtype)
    weights = residual_weights(target[0, 0].astype(np.float64), draft[0, 0].astype(np.float64))
    if vocab_size <= 64:
        picks = np.arange(vocab_size)
    else:
        kvec = 16 // np.dtype(dtype).itemsize
        segment = ((vocab_size + 15) // 16 + kvec - 1) // kvec * kvec
        ends = np.arange(segment, vocab_size, segment) - 1
        picks = np.r_[ends, ends + 1, rng.integers(0, vocab_size, 8)]
        picks = picks[picks < vocab_size]
    values = cdf_boundary_values(weights, picks)
    batch_size = values.size
    case = (
        np.repeat(target, batch_size, 0),
        np.zeros((batch_size, 1), np.int64),
        np.repeat(draft, batch_size, 0),
        np.full((batch_size, 1), draft_id, np.int64),
        np.column_stack([np.full(batch_size, 0.5), values]),
    )
    check_rejection(cp, case)
    check_block(cp, case)


# --------------------------------------------------------------------------------------
# Typical acceptance and greedy: inputs and comparisons
# --------------------------------------------------------------------------------------

TYPICAL_KINDS = ("dirichlet", "noise", "counts", "tied_max", "onehot", "floored_onehot", "zeros")
GREEDY_KINDS = ("dirichlet", "counts", "tied_max", "peaked", "halves", "onehot", "small_noise")


def make_row(rng, vocab_size, kind):
    """One target row of a named kind (the kinds of the CPU tests of both verifiers)."""
    if kind == "dirichlet":
        row = rng.dirichlet(np.full(vocab_size, rng.choice([0.05, 0.5, 5.0])))
        if np.isfinite(row).all() and row.sum() > 0:
            return row
        kind = "onehot"
    if kind == "noise":  # unnormalised (as vLLM's tests feed); entries > 1 only for small V
        scale = rng.choice([0.1, 1.0, 3.0]) if vocab_size <= 64 else rng.choice([0.1, 1.0])
        return rng.random(vocab_size) * scale
    if kind == "small_noise":  # unnormalised, every entry <= 1/2 (valid greedy input)
        return rng.random(vocab_size) * 0.5
    if kind == "counts":  # small integers, normalised: many exact ties
        row = rng.integers(0, 4, vocab_size).astype(np.float64)
        row[rng.integers(vocab_size)] += 1
        return row / row.sum()
    if kind == "tied_max":  # the maximum copied to 1-3 places
        row = rng.dirichlet(np.full(vocab_size, 0.5))
        if not np.isfinite(row).all():
            row = np.ones(vocab_size)
        row[rng.integers(0, vocab_size, size=rng.integers(1, 4))] = row.max()
        return row / row.sum()
    if kind == "peaked":  # one token above 1/2 (the greedy shortcut)
        top = rng.choice([0.5006, 0.51, 0.6, 0.9, 0.999])
        row = rng.dirichlet(np.ones(vocab_size)) * (1 - top)
        row[rng.integers(vocab_size)] = top
        return row / row.sum()
    if kind == "halves":  # two tokens at exactly 1/2: a tie the shortcut must not take
        row = np.zeros(vocab_size)
        row[rng.integers(0, vocab_size, size=2)] = 0.5
        return row if row.sum() == 1.0 else np.ones(vocab_size) / vocab_size
    row = np.zeros(vocab_size)
    if kind == "floored_onehot":
        row[:] = 1e-5
    if kind != "zeros":
        row[rng.integers(vocab_size)] = 1.0
    return row


def make_deterministic_case(seed, batch_size, k, vocab_size, dtype, id_dtype, kinds):
    """Target rows of mixed kinds and drafts that hit the argmax, a tied maximum, the
    runner-up, the minimum or a random token."""
    rng = np.random.default_rng(seed)
    target = np.empty((batch_size, k + 1, vocab_size))
    for b, i in itertools.product(range(batch_size), range(k + 1)):
        target[b, i] = make_row(rng, vocab_size, kinds[rng.integers(len(kinds))])
    target = target.astype(dtype)
    draft = np.empty((batch_size, k), dtype=np.int64)
    for b, i in itertools.product(range(batch_size), range(k)):
        row = target[b, i]
        maxima = np.flatnonzero(row == row.max())
        choice = rng.integers(5)
        if choice <= 1:
            draft[b, i] = maxima[0]
        elif choice == 2:
            draft[b, i] = maxima[-1]
        elif choice == 3:
            draft[b, i] = np.argsort(row, kind="stable")[-2] if vocab_size > 1 else 0
        else:
            draft[b, i] = rng.integers(vocab_size)
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    return target, bonus.astype(id_dtype), draft.astype(id_dtype)


def expected_row(accepted, recovered, draft, bonus):
    """The output row ``(tokens, accepted_length, num_accepted)`` from per-position decisions."""
    k = accepted.shape[0]
    r = k if accepted.all() else int(np.argmin(accepted))
    row = np.full(k + 1, -1, dtype=np.int64)
    row[:r] = draft[:r]
    row[r] = bonus if r == k else recovered[r]
    return tuple(int(v) for v in row), r, int(accepted.sum())


def result_row(result, b):
    output, lengths, passes = result
    return tuple(int(v) for v in output[b]), int(lengths[b]), int(passes[b])


def typical_expectation(target, draft, threshold_arg, alpha):
    """The float64 decisions of typical acceptance (docs/semantics.md §2.4) and the band
    where a kernel may flip them.

    The entropy error of either kernel is at most ``delta = c * (sum p + sum |p ln(p+1e-5)|)``
    with ``c = 1e-6`` for float32 rows (four float32 roundings per element, times a safety
    factor of four) and ``c = (V + 8) * 2.3e-16`` for float64 rows (the bound derived in
    ``tests/verifiers/test_typical_acceptance.py``).  A decision may then differ from the
    float64 one only where ``p(x)`` lies in ``(min(t, e exp(-2 delta)), min(t, e exp(2 delta))]``,
    ``e = alpha exp(-H)``: about 1e-5 relative for large normalised rows, empty where the
    posterior threshold is the minimum with room to spare.
    """
    k = draft.shape[1]
    vocab_size = target.shape[2]
    p = target[:, :k].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        terms = p * np.log(p + 1e-5)
        mass = p.sum(axis=-1) + np.abs(terms).sum(axis=-1)
        per_unit = 1e-6 if target.dtype == np.float32 else (vocab_size + 8) * 2.3e-16
        delta = per_unit * mass
        entropy_factor = np.exp(terms.sum(axis=-1))  # exp(-H)
        # alpha = 0 gives a zero threshold even where exp(-H) overflows (as both kernels do).
        scaled = alpha * entropy_factor if alpha > 0 else np.zeros_like(entropy_factor)
        threshold = np.minimum(threshold_arg, scaled)
        low = np.minimum(threshold_arg, scaled * np.exp(-2.0 * delta))
        high = np.minimum(threshold_arg, scaled * np.exp(2.0 * delta))
    p_x = np.take_along_axis(p, draft.astype(np.int64)[:, :, None], axis=2)[..., 0]
    return p_x > threshold, (low < p_x) & (p_x <= high), p.argmax(axis=-1)


def request_decisions(verifier, target, draft, ids, uniforms=None):
    """The reference's decisions of one request under ``verifier`` at its parameters'
    defaults (:class:`specdec_np._reference.chains.Decisions`: how close each decision is to
    its boundary, and the residual's scale ``rho``)."""
    parameters = dict(zip(verifier.parameter_names, verifier.parameter_defaults))
    with np.errstate(all="ignore"):
        return _reference.decisions_for(verifier)(target, draft, ids, uniforms, **parameters)


def any_knife_edge(verifier, args):
    """Whether a decision of a padded call ``(target, bonus, draft_probs, draft_ids)`` of a
    verifier without randomness lies within its own arithmetic's rounding of its boundary
    (typical acceptance's entropy), where two backends may decide differently."""
    target, _, draft, ids = args
    return any(
        request_decisions(verifier, target[b], None if draft is None else draft[b], ids[b])
        .knife_edge(0.0)
        for b in range(ids.shape[0])
    )


def compare_typical(case, threshold_arg, alpha, cpu, gpu):
    """Rows without an ambiguous position: GPU == CPU == the float64 formula.  Rows with one:
    both equal the formula's row with some of the ambiguous decisions flipped."""
    target, bonus, draft = case
    accepted, ambiguous, argmax = typical_expectation(target, draft, threshold_arg, alpha)
    for b in range(draft.shape[0]):
        got, cpu_row = result_row(gpu, b), result_row(cpu, b)
        exact = expected_row(accepted[b], argmax[b], draft[b], int(bonus[b, 0]))
        if not ambiguous[b].any():
            assert got == exact == cpu_row, f"row {b}: GPU {got}, CPU {cpu_row}, exact {exact}"
            continue
        flexible = np.flatnonzero(ambiguous[b])
        allowed = []
        for flips in itertools.product((False, True), repeat=flexible.size):
            decisions = accepted[b].copy()
            decisions[flexible] = flips
            allowed.append(expected_row(decisions, argmax[b], draft[b], int(bonus[b, 0])))
        assert got in allowed, f"row {b}: GPU {got} not in {allowed}"
        assert cpu_row in allowed, f"row {b}: CPU {cpu_row} not in {allowed}"


DETERMINISTIC_SHAPES = [
    (1, 1, 1),
    (5, 3, 1),
    (12, 1, 7),
    (40, 4, 50),
    (200, 2, 33),
    (6, 3, 2051),
    (3, 2, 128256),
]
POSTERIORS = [(0.09, 0.3), (0.3, 0.9), (0.0, 0.0), (1.0, 5.0)]


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", DETERMINISTIC_SHAPES, ids=lambda s: "B{}-k{}-V{}".format(*s))
def test_typical_gpu_matches_cpu(cp, shape, dtype, id_dtype):
    seed = stable_seed("typical", shape, dtype_id(dtype), dtype_id(id_dtype))
    case = make_deterministic_case(seed, *shape, dtype, id_dtype, TYPICAL_KINDS)
    g_target, g_bonus, g_draft = on_device(cp, 0, *case)
    for threshold_arg, alpha in POSTERIORS:
        options = {"posterior_threshold": threshold_arg, "posterior_alpha": alpha}
        cpu = specdec_np.typical_acceptance_sample(*case, **options)
        gpu = specdec_np.typical_acceptance_sample(g_target, g_bonus, g_draft, **options)
        assert_gpu_result(cp, gpu, 0, *case[2].shape)
        compare_typical(case, threshold_arg, alpha, cpu, to_host(cp, gpu))


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", DETERMINISTIC_SHAPES, ids=lambda s: "B{}-k{}-V{}".format(*s))
def test_greedy_gpu_matches_cpu(cp, shape, dtype, id_dtype):
    seed = stable_seed("greedy", shape, dtype_id(dtype), dtype_id(id_dtype))
    case = make_deterministic_case(seed, *shape, dtype, id_dtype, GREEDY_KINDS)
    target, bonus, draft = case
    cpu = specdec_np.greedy_sample(*case)
    gpu = specdec_np.greedy_sample(*on_device(cp, 0, *case))
    assert_gpu_result(cp, gpu, 0, *draft.shape)
    # The rows are probability rows (or every entry <= 1/2): plain argmax decisions.
    argmax = target[:, : draft.shape[1]].argmax(axis=-1)
    accepted = draft.astype(np.int64) == argmax
    for got, want in zip(to_host(cp, gpu), cpu):
        np.testing.assert_array_equal(got, want)
    for b in range(draft.shape[0]):
        exact = expected_row(accepted[b], argmax[b], draft[b], int(bonus[b, 0]))
        assert result_row(cpu, b) == exact


def test_create_output_gpu_matches_cpu(cp):
    rng = np.random.default_rng(12)
    batch_size, k, vocab_size = 600, 5, 1000
    accepted = rng.random((batch_size, k)) < 0.7
    substitute = rng.integers(0, vocab_size, (batch_size, k))
    draft = rng.integers(0, vocab_size, (batch_size, k)).astype(np.int32)
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    args = (accepted, substitute, draft, bonus)
    cpu = specdec_np.create_output(*args, vocab_size=vocab_size)
    gpu = specdec_np.create_output(*on_device(cp, 0, *args), vocab_size=vocab_size)
    assert_gpu_result(cp, gpu, 0, batch_size, k)
    for got, want in zip(to_host(cp, gpu), cpu):
        np.testing.assert_array_equal(got, want)
    cpu_sampler, gpu_sampler = specdec_np.GreedySampler(), specdec_np.GreedySampler()
    cpu_out = cpu_sampler._create_output(*args)
    gpu_out = gpu_sampler._create_output(*on_device(cp, 0, *args))
    assert_on_device(cp, gpu_out, 0, (batch_size, k + 1))
    np.testing.assert_array_equal(cp.asnumpy(gpu_out), cpu_out)
    assert_on_device(cp, gpu_sampler.num_accepted_tokens, 0, ())
    assert int(gpu_sampler.num_accepted_tokens) == int(cpu_sampler.num_accepted_tokens)
    assert int(gpu_sampler.num_emitted_tokens) == int(cpu_sampler.num_emitted_tokens)
    bad = substitute.copy()
    row = int(np.flatnonzero(~accepted.all(axis=1))[0])
    bad[row, int(np.argmin(accepted[row]))] = vocab_size
    with pytest.raises(ValueError, match=rf"substitute_token_ids.*\({row}, "):
        specdec_np.create_output(*on_device(cp, 0, accepted, bad, draft, bonus), vocab_size=1000)


def test_empty_batch_on_gpu(cp):
    """B = 0: empty CuPy results on the device, counters untouched, for every verifier."""
    k, vocab_size = 3, 11
    target, draft = on_device(
        cp,
        0,
        np.zeros((0, k + 1, vocab_size), np.float32),
        np.zeros((0, k, vocab_size), np.float32),
    )
    bonus, ids, uniforms = on_device(
        cp, 0, np.zeros((0, 1), np.int64), np.zeros((0, k), np.int64), np.zeros((0, k + 1))
    )
    for verifier in PADDED:
        assert_gpu_result(cp, stateless(verifier.name, target, bonus, draft, ids), 0, 0, k)
        if verifier.stochastic:
            result = stateless(verifier.name, target, bonus, None, ids, uniforms=uniforms)
            assert_gpu_result(cp, result, 0, 0, k)
    accepted = cp.zeros((0, k), dtype=cp.bool_)
    assert_gpu_result(cp, specdec_np.create_output(accepted, ids, ids, bonus), 0, 0, k)
    for kind in SAMPLER_KINDS:
        sampler = make_sampler(kind)
        sampler.init_tensors(0)
        output = sampler(target, bonus, draft, ids)
        assert_on_device(cp, output, 0, (0, k + 1))
        assert int(sampler.num_accepted_tokens) == int(sampler.num_emitted_tokens) == 0
        assert sampler.num_draft_tokens == 0


def test_strict_mode_checks_gpu_arrays(cp):
    target, bonus, draft, ids, uniforms = make_rejection_case(
        3, 4, 2, 20, np.float32, np.int64, True
    )
    bad_target = target.copy()
    bad_target[1, 0, 3] = np.nan
    g = on_device(cp, 0, bad_target, bonus, draft, ids, uniforms)
    with pytest.raises(ValueError, match="finite"):
        specdec_np.RejectionSampler(strict_mode=True)(g[0], g[1], g[2], g[3], uniforms=g[4])
    g64 = on_device(cp, 0, target.astype(np.float64), bonus, ids)
    with pytest.raises(TypeError):
        specdec_np.GreedySampler(strict_mode=True)(g64[0], g64[1], None, g64[2])


# --------------------------------------------------------------------------------------
# Chi-square on the GPU rejection kernel (fixed seeds)
# --------------------------------------------------------------------------------------


def _wide_case():
    rng = np.random.default_rng(1027)
    p = random_rows(rng, (2, 1027), sparsity=0.25)
    q = random_rows(rng, (1, 1027), sparsity=0.25)
    return p, q


CHI_SQUARE_CASES = {
    "dense-float64-V8-k2": (MC_P, MC_Q, np.float64, 200_000),
    "dense-float32-V1027-k1": (*_wide_case(), np.float32, 100_000),
    "point-mass-float32-V8-k2": (MC_P, [4, 0], np.float32, 200_000),
}


def gpu_first_tokens(
    cp, p, q, num_rows, rng, dtype, *, reuse_uniform=False, verify=specdec_np.rejection_sample
):
    """Run the GPU kernel of ``verify`` on ``num_rows`` copies of ``p`` with drafts drawn
    from ``q`` (or the point-mass tokens ``q``); return the NumPy output and the draft ids.
    ``reuse_uniform`` feeds the acceptance uniform of position 0 as the residual uniform
    too: a broken sampler for the negative control."""
    p = np.asarray(p, dtype=dtype)
    k = p.shape[0] - 1
    vocab_size = p.shape[1]
    point_mass = isinstance(q, list)
    if point_mass:
        draft_ids = np.tile(np.asarray(q, dtype=np.int64), (num_rows, 1))
        draft_probs = None
    else:
        draft_probs = np.asarray(q, dtype=dtype)
        q64 = draft_probs.astype(np.float64)
        draft_ids = np.stack(
            [_monte_carlo.draw_from(q64[i], num_rows, rng) for i in range(k)], axis=1
        )
    uniforms = rng.random((num_rows, k + 1))
    if reuse_uniform:
        uniforms[:, k] = uniforms[:, 0]
    with cp.cuda.Device(0):
        target = cp.ascontiguousarray(
            cp.broadcast_to(cp.asarray(p), (num_rows, k + 1, vocab_size))
        )
        probs = None
        if draft_probs is not None:
            shape = (num_rows, k, vocab_size)
            probs = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(draft_probs), shape))
        bonus = cp.full((num_rows, 1), vocab_size - 1, dtype=cp.int64)
        result = verify(target, bonus, probs, cp.asarray(draft_ids), uniforms=cp.asarray(uniforms))
    assert_gpu_result(cp, result, 0, num_rows, k)
    return cp.asnumpy(result.output_token_ids), draft_ids


def first_token_p_value(output, p, q):
    """Chi-square p-value of the first emitted tokens against the exact oracle, which must
    equal the target (to 1e-9; to float32 rounding for float32 rows, which do not sum to 1
    exactly and make the oracle differ from ``p / sum(p)`` by about 1e-8)."""
    p64 = np.asarray(p, dtype=np.float64)
    q0 = q[0] if isinstance(q, list) else np.asarray(q, dtype=np.float64)[0]
    oracle = _oracles.exact_first_token_distribution(p64[0], q0)
    atol = 1e-9 if np.asarray(p).dtype == np.float64 else 1e-6
    np.testing.assert_allclose(oracle, p64[0] / p64[0].sum(), rtol=0, atol=atol)
    first = output[:, 0]
    assert np.all((first >= 0) & (first < p64.shape[1]))
    counts = np.bincount(first, minlength=p64.shape[1])
    statistic, dof = _statistics.chi_square_statistic(counts, oracle)
    return _statistics.chi_square_p_value(statistic, dof)


def prefix_lengths(output, draft_ids):
    """The accepted lengths of outputs that must be a draft prefix, one token, then -1."""
    emitted = output >= 0
    lengths = emitted.sum(axis=1) - 1
    k = draft_ids.shape[1]
    np.testing.assert_array_equal(emitted, np.arange(k + 1)[None, :] <= lengths[:, None])
    prefix = np.arange(k)[None, :] < lengths[:, None]
    assert np.all(np.where(prefix, output[:, :k] == draft_ids, True))
    return lengths


@pytest.mark.parametrize("name", CHI_SQUARE_CASES)
def test_gpu_rejection_chi_square(cp, name):
    p, q, dtype, num_rows = CHI_SQUARE_CASES[name]
    p = np.asarray(p, dtype=dtype)  # the oracle uses the rounded values the kernel sees
    rng = np.random.default_rng(20240611)
    output, draft_ids = gpu_first_tokens(cp, p, q, num_rows, rng, dtype)
    p_value = first_token_p_value(output, p, q)
    assert p_value > 1e-4, f"{name}: chi-square p-value {p_value:.3g}"
    prefix_lengths(output, draft_ids)
    # The acceptance rate is sum(min(p, q)).
    p64 = p.astype(np.float64)
    q0 = np.eye(p.shape[1])[q[0]] if isinstance(q, list) else np.asarray(q, np.float64)[0]
    expected = math.fsum((q0 * _oracles.acceptance_probabilities(p64[0], q0)).tolist())
    rate = float((output[:, 1] >= 0).mean())
    sigma = math.sqrt(expected * (1 - expected) / num_rows)
    assert abs(rate - expected) <= 5 * sigma + 1e-12, (rate, expected)


@pytest.mark.parametrize("name", CHI_SQUARE_CASES)
def test_gpu_block_verification_chi_square(cp, name):
    """Block verification on the GPU: the first emitted token follows the target (lossless),
    the output is a draft prefix then one token, and on the same uniforms it accepts no
    fewer tokens on average than token-wise rejection (5 sigma)."""
    p, q, dtype, num_rows = CHI_SQUARE_CASES[name]
    p = np.asarray(p, dtype=dtype)
    block = specdec_np.block_verification_sample
    output, draft_ids = gpu_first_tokens(
        cp, p, q, num_rows, np.random.default_rng(20240612), dtype, verify=block
    )
    target = p[0].astype(np.float64) / p[0].astype(np.float64).sum()
    first = output[:, 0]
    assert np.all((first >= 0) & (first < p.shape[1]))
    statistic, dof = _statistics.chi_square_statistic(
        np.bincount(first, minlength=p.shape[1]), target
    )
    p_value = _statistics.chi_square_p_value(statistic, dof)
    assert p_value > 1e-4, f"{name}: chi-square p-value {p_value:.3g}"
    lengths = prefix_lengths(output, draft_ids)
    token_wise, _ = gpu_first_tokens(cp, p, q, num_rows, np.random.default_rng(20240612), dtype)
    token_wise_lengths = (token_wise >= 0).sum(axis=1) - 1
    spread = math.sqrt((lengths.var() + token_wise_lengths.var()) / num_rows)
    assert lengths.mean() >= token_wise_lengths.mean() - 5 * spread


def test_gpu_chi_square_rejects_a_reused_uniform(cp):
    """Negative control: the same check fails when the GPU kernel is fed the acceptance
    uniform again as the residual uniform (the residual draw is then biased)."""
    rng = np.random.default_rng(20240611)
    output, _ = gpu_first_tokens(cp, MC_P, MC_Q, 200_000, rng, np.float64, reuse_uniform=True)
    p_value = first_token_p_value(output, MC_P, MC_Q)
    assert p_value < 1e-12, p_value


def test_conformance_checks_pass_on_cupy(cp):
    results = _self_check.run_checks(backend="cupy")
    assert results
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# --------------------------------------------------------------------------------------
# Counters on the device
# --------------------------------------------------------------------------------------

SAMPLER_KINDS = tuple(v.name for v in PADDED)


def make_sampler(kind, **options):
    """The sampler class of the registry verifier ``kind``."""
    return getattr(specdec_np, VERIFIERS[kind].sampler_name)(**options)


def sampler_inputs(kind, seed, batch_size=32, k=4, vocab_size=50, id_dtype=np.int64):
    """``(args, kwargs)`` of one sampler call (``target, bonus, draft_probs, draft_ids``),
    NumPy; explicit uniforms for the stochastic verifiers."""
    if VERIFIERS[kind].stochastic:
        target, bonus, draft, ids, uniforms = make_rejection_case(
            seed, batch_size, k, vocab_size, np.float32, id_dtype, True
        )
        return (target, bonus, draft, ids), {"uniforms": uniforms}
    kinds = GREEDY_KINDS if VERIFIERS[kind].requires_normalised_rows else TYPICAL_KINDS
    target, bonus, ids = make_deterministic_case(
        seed, batch_size, k, vocab_size, np.float32, id_dtype, kinds
    )
    # draft_probs is ignored by the deterministic verifiers; give one anyway.
    draft = random_rows(np.random.default_rng(seed), (batch_size, k, vocab_size))
    return (target, bonus, draft.astype(np.float32), ids), {}


def gpu_call(cp, sampler, args, kwargs, device=0):
    g_args = on_device(cp, device, *args)
    g_kwargs = {name: on_device(cp, device, value)[0] for name, value in kwargs.items()}
    return sampler(*g_args, **g_kwargs)


def stateless_gpu_call(cp, kind, args, kwargs, device=0):
    """The stateless verifier of ``kind`` on copies of ``args`` on ``device``."""
    target, bonus, draft, ids = on_device(cp, device, *args)
    g_kwargs = {name: on_device(cp, device, value)[0] for name, value in kwargs.items()}
    return stateless(kind, target, bonus, draft, ids, **g_kwargs)


def stateless(kind, target, bonus, draft, ids, **kwargs):
    """The stateless function of the registry verifier ``kind`` (the deterministic ones take
    no ``draft_probs``)."""
    verifier = VERIFIERS[kind]
    verify = getattr(specdec_np, verifier.function_name)
    if verifier.reads_draft_probs:
        return verify(target, bonus, draft, ids, **kwargs)
    return verify(target, bonus, ids, **kwargs)


def counter_values(sampler):
    return (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )


@pytest.mark.parametrize(
    "init",
    [
        lambda s: s.init_tensors(0),
        lambda s: s.init_gpu_tensors(0),
        lambda s: s.init_tensors("cuda:0"),
        lambda s: s.init_gpu_tensors("cuda:0"),
    ],
    ids=["init_tensors(0)", "init_gpu_tensors(0)", "init_tensors(cuda:0)", "init_gpu(cuda:0)"],
)
@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_init_tensors_put_counters_on_the_device(cp, kind, init):
    sampler = make_sampler(kind)
    init(sampler)
    for counter in (sampler.num_accepted_tokens, sampler.num_emitted_tokens):
        assert_on_device(cp, counter, 0, ())
        assert int(counter) == 0
    assert sampler.num_draft_tokens == 0
    with pytest.raises(RuntimeError):
        sampler.init_tensors(0)


@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_gpu_counters_equal_cpu_counters(cp, kind):
    gpu_sampler, cpu_sampler = make_sampler(kind), make_sampler(kind)
    gpu_sampler.init_tensors(0)
    cpu_sampler.init_tensors("cpu")
    for seed in range(4):
        args, kwargs = sampler_inputs(kind, seed, batch_size=8 + 7 * seed)
        if not VERIFIERS[kind].stochastic:  # precondition: no decision on a knife edge
            assert not any_knife_edge(VERIFIERS[kind], args)
        cpu_out = cpu_sampler(*args, **kwargs)
        gpu_out = gpu_call(cp, gpu_sampler, args, kwargs)
        assert_on_device(cp, gpu_out, 0, cpu_out.shape)
        if VERIFIERS[kind].stochastic:  # recovered tokens may differ at a CDF boundary
            lengths = (cpu_out >= 0).sum(axis=1)
            np.testing.assert_array_equal((cp.asnumpy(gpu_out) >= 0).sum(axis=1), lengths)
        else:
            np.testing.assert_array_equal(cp.asnumpy(gpu_out), cpu_out)
        for counter in (gpu_sampler.num_accepted_tokens, gpu_sampler.num_emitted_tokens):
            assert_on_device(cp, counter, 0, ())
        assert counter_values(gpu_sampler) == counter_values(cpu_sampler)
    assert gpu_sampler.draft_acceptance_rate == cpu_sampler.draft_acceptance_rate
    assert gpu_sampler.system_efficiency == cpu_sampler.system_efficiency
    assert gpu_sampler.mean_accepted_length == cpu_sampler.mean_accepted_length


@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_lazy_counters_land_on_the_inputs_device(cp, kind):
    sampler = make_sampler(kind)
    assert sampler.num_accepted_tokens is None
    args, kwargs = sampler_inputs(kind, 1)
    gpu_call(cp, sampler, args, kwargs)
    assert_on_device(cp, sampler.num_accepted_tokens, 0, ())
    assert_on_device(cp, sampler.num_emitted_tokens, 0, ())
    assert sampler.num_draft_tokens == args[3].size


@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_counters_and_inputs_on_different_devices_raise(cp, kind):
    args, kwargs = sampler_inputs(kind, 2)
    cpu_counters = make_sampler(kind)
    cpu_counters.init_tensors("cpu")
    with pytest.raises(ValueError, match="cuda:0.*cpu"):
        gpu_call(cp, cpu_counters, args, kwargs)
    assert counter_values(cpu_counters) == (0, 0, 0)
    assert isinstance(cpu_counters.num_accepted_tokens, np.ndarray)
    gpu_counters = make_sampler(kind)
    gpu_counters.init_tensors(0)
    with pytest.raises(ValueError, match="cpu.*cuda:0"):
        gpu_counters(*args, **kwargs)
    assert counter_values(gpu_counters) == (0, 0, 0)


# --------------------------------------------------------------------------------------
# Errors: out-of-range ids, zero-mass rows, mixed devices
# --------------------------------------------------------------------------------------


def bad_id_values(id_dtype, vocab_size):
    return [vocab_size, -1, int(np.iinfo(id_dtype).max), int(np.iinfo(id_dtype).min)]


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_out_of_range_ids_raise_on_gpu(cp, kind, id_dtype):
    """Every bad id raises ValueError naming the argument and the first offending (row,
    position) in row-major order; counters stay as they were; the device stays healthy."""
    batch_size, k, vocab_size = 6, 4, 50
    args, kwargs = sampler_inputs(kind, 3, batch_size, k, vocab_size, id_dtype)
    target, bonus, draft, ids = args
    sampler = make_sampler(kind)
    sampler.init_tensors(0)
    gpu_call(cp, sampler, args, kwargs)
    before = counter_values(sampler)
    for value in bad_id_values(id_dtype, vocab_size):
        bad_ids = ids.copy()
        bad_ids[2, 3] = value
        bad_ids[4, 0] = value  # a later row: not the one reported
        bad_bonus = bonus.copy()
        bad_bonus[2, 0] = value  # same row, later column: not the one reported
        with pytest.raises(ValueError, match=rf"draft_token_ids.*{value}.*\(2, 3\)"):
            gpu_call(cp, sampler, (target, bad_bonus, draft, bad_ids), kwargs)
        assert counter_values(sampler) == before
        only_bonus = bonus.copy()
        only_bonus[5, 0] = value
        only_bonus[1, 0] = value
        with pytest.raises(ValueError, match=rf"bonus_token_ids.*{value}.*\(1, 0\)"):
            gpu_call(cp, sampler, (target, only_bonus, draft, ids), kwargs)
        assert counter_values(sampler) == before
    synchronize(cp)
    # The device is still usable and the next call counts exactly what it verified.
    output = gpu_call(cp, sampler, args, kwargs)
    emitted = int((cp.asnumpy(output) >= 0).sum())
    passes = stateless_gpu_call(cp, kind, args, kwargs).num_accepted
    after = (before[0] + int(cp.asnumpy(passes).sum()), before[1] + emitted, before[2] + ids.size)
    assert counter_values(sampler) == after


@pytest.mark.parametrize("kind", [v.name for v in STOCHASTIC])
def test_zero_mass_row_raises_on_gpu(cp, kind):
    """A position where a token must be drawn and neither the residual nor the target has
    mass: ValueError naming the target row; counters untouched."""
    target, bonus, draft, ids, uniforms = make_rejection_case(
        4, 5, 3, 30, np.float32, np.int64, True
    )
    target[3, 1] = 0.0  # p(x) = 0: position 1 of row 3 is rejected whatever u is
    uniforms[3, 0] = 0.0  # position 0 of row 3 is accepted: p(x_0) > 0 = q(x_0)
    target[3, 0, ids[3, 0]] = max(target[3, 0, ids[3, 0]], np.float32(0.5))
    draft[3, 0, ids[3, 0]] = 0.0
    sampler = make_sampler(kind)
    sampler.init_tensors(0)
    g = on_device(cp, 0, target, bonus, draft, ids, uniforms)
    with pytest.raises(ValueError, match=r"target_with_bonus_probs\[3, 1\].*no positive"):
        sampler(g[0], g[1], g[2], g[3], uniforms=g[4])
    assert counter_values(sampler) == (0, 0, 0)
    synchronize(cp)


def ragged_case(seed, id_dtype, with_draft_probs):
    """A ragged chain batch in the flat layout of ``_chains`` (requests with k_b = 0 among
    them), float64 rows (so that typical acceptance has no decision within rounding of its
    threshold), a bad draft id in one request and a bonus id outside V in another."""
    rng = np.random.default_rng(seed)
    lengths = np.array([3, 0, 5, 1, 0, 2, 4, 4, 0, 1])
    batch_size, vocab_size = lengths.size, 70
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    num_drafts = int(offsets[-1])
    target = random_rows(rng, (num_drafts + batch_size, vocab_size))
    draft = random_rows(rng, (num_drafts, vocab_size)) if with_draft_probs else None
    ids = rng.integers(0, vocab_size, num_drafts).astype(id_dtype)
    for i in range(0, num_drafts, 2):  # likely accepted drafts
        ids[i] = target[i + int(np.searchsorted(offsets, i, side="right")) - 1].argmax()
    bonus = rng.integers(0, vocab_size, batch_size).astype(id_dtype)
    ids[offsets[6] + 2] = vocab_size  # request 6, column 2
    bonus[8] = -1  # request 8 (k_b = 0), column 0
    uniforms = rng.random((batch_size, int(lengths.max()) + 1))
    return target, draft, ids, bonus, offsets, uniforms


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_ragged_chains_on_the_launch_surface_match_cpu(cp, kind, id_dtype, with_draft_probs):
    """``_cuda.core_like.verify_chains`` (the one launch surface) on a ragged batch against
    ``_core.verify_chains``: the same row status, and for verified requests the same
    lengths, counts and prefixes; the token after a stochastic prefix at a CDF boundary at
    most.  A bad id leaves the request's other cells unwritten on both."""
    verifier = VERIFIERS[kind]
    target, draft, ids, bonus, offsets, uniforms = ragged_case(
        stable_seed(kind, dtype_id(id_dtype), with_draft_probs), id_dtype, with_draft_probs
    )
    if not verifier.stochastic:
        uniforms = np.empty((0, 0))
    parameters = np.array([p.default for p in verifier.parameters], dtype=np.float64)
    method = verifier.code
    batch_size, width = bonus.size, int(np.diff(offsets).max()) + 1
    inputs = (target, target if draft is None else draft, draft is None, ids, bonus, offsets)
    host = [np.full((batch_size, width), -7, np.int64)]
    host += [np.full(batch_size, -7, np.int64) for _ in range(3)]
    first = _core.verify_chains(method, *inputs, uniforms, parameters, *host, 1)
    assert first == 6
    g_inputs = on_device(cp, 0, target, inputs[1], ids, bonus, offsets, uniforms, parameters)
    g_out = on_device(cp, 0, *(np.full_like(a, -7) for a in host))
    g_target, g_draft, g_ids, g_bonus, g_offsets, g_uniforms, g_parameters = g_inputs
    returned = _cuda.core_like.verify_chains(
        method, g_target, g_draft, draft is None, g_ids, g_bonus, g_offsets, g_uniforms,
        g_parameters, *g_out, 1,
    )  # fmt: skip
    assert returned is None
    assert _backend.first_failed_row(None, g_out[3]) == 6
    output, lengths, passes, status = (cp.asnumpy(a) for a in g_out)
    np.testing.assert_array_equal(status, host[3])
    assert status[6] == 1 + 2 and status[8] == 1 + 0
    good = status == 0
    np.testing.assert_array_equal(lengths, host[1])  # untouched (-7) where the status is not 0
    np.testing.assert_array_equal(passes, host[2])
    np.testing.assert_array_equal(output[~good], host[0][~good])
    for b in np.flatnonzero(good):  # each verified request as a batch of one
        start, k_b = int(offsets[b]), int(offsets[b + 1] - offsets[b])
        rows = slice(start + b, start + b + k_b + 1)
        request = (
            target[None, rows],
            bonus[b : b + 1, None],
            None if draft is None else draft[None, start : start + k_b],
            ids[None, start : start + k_b],
            uniforms[b : b + 1, : k_b + 1] if verifier.stochastic else None,
        )
        rho_of = None  # deterministic: the CPU's token exactly
        if verifier.stochastic:  # the residual's scale of the verifier's own rule
            rho = request_decisions(
                verifier, request[0][0], None if draft is None else request[2][0],
                request[3][0], request[4][0],
            ).rho  # fmt: skip
            rho_of = lambda _, i, rho=rho: float(rho[i])  # noqa: E731
        assert_prefixes_and_draws(
            request, host[0][b : b + 1], output[b : b + 1, : k_b + 1], lengths[b : b + 1], rho_of
        )
        np.testing.assert_array_equal(output[b, k_b + 1 :], -1)
    synchronize(cp)


MIXED_ARGUMENTS = ("target_with_bonus_probs", "bonus_token_ids", "draft_probs", "draft_token_ids")


@pytest.mark.parametrize("host_argument", range(4), ids=MIXED_ARGUMENTS)
@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_mixed_numpy_and_cupy_inputs_raise(cp, kind, host_argument):
    args, _ = sampler_inputs(STOCHASTIC[0].name, 4)
    mixed = list(on_device(cp, 0, *args))
    mixed[host_argument] = args[host_argument]  # this one stays a NumPy array
    if host_argument == 2 and not VERIFIERS[kind].reads_draft_probs:
        pytest.skip(f"{kind} ignores draft_probs")
    with pytest.raises(ValueError, match="one device"):
        stateless(kind, *mixed)


@pytest.fixture
def two_devices(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    return cp


def test_inputs_on_two_devices_raise(two_devices):
    cp = two_devices
    args, kwargs = sampler_inputs(STOCHASTIC[0].name, 5)
    on0 = on_device(cp, 0, *args, kwargs["uniforms"])
    on1 = on_device(cp, 1, *args, kwargs["uniforms"])
    for moved in range(4):
        mixed = list(on0[:4])
        mixed[moved] = on1[moved]
        for verifier in PADDED:
            if moved == 2 and not verifier.reads_draft_probs:
                continue
            extra = {"uniforms": on0[4]} if verifier.stochastic else {}
            with pytest.raises(ValueError, match="one device"):
                stateless(verifier.name, *mixed, **extra)


def test_second_device_results_and_counters(two_devices):
    """Inputs on device 1 while device 0 is current: results and counters on device 1."""
    cp = two_devices
    case = make_rejection_case(6, 12, 3, 70, np.float32, np.int64, True)
    with cp.cuda.Device(0):
        cpu, gpu = check_rejection(cp, case, device=1)
        check_block(cp, case, device=1)
        g_target, g_bonus, _, g_ids = on_device(cp, 1, *case[:4])
        for verifier in PADDED:
            extra = {"counter_seeds": {0: (1, 2)}} if verifier.stochastic else {}
            result = stateless(verifier.name, g_target, g_bonus, None, g_ids, **extra)
            assert_gpu_result(cp, result, 1, 12, 3)
        for kind in SAMPLER_KINDS:
            for init in (None, "cuda:1"):
                sampler = make_sampler(kind)
                if init is not None:
                    sampler.init_tensors(init)
                args, kwargs = sampler_inputs(kind, 7)
                output = gpu_call(cp, sampler, args, kwargs, device=1)
                assert_on_device(cp, output, 1)
                assert_on_device(cp, sampler.num_accepted_tokens, 1, ())
                assert_on_device(cp, sampler.num_emitted_tokens, 1, ())
                with pytest.raises(ValueError):
                    gpu_call(cp, sampler, args, kwargs, device=0)


# --------------------------------------------------------------------------------------
# Randomness (docs/semantics.md §5)
# --------------------------------------------------------------------------------------

EDGE_SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF]


@pytest.mark.parametrize("num_draws", [0, 1, 2, 5, 8, 33])
def test_counter_uniforms_bit_identical_on_cupy(cp, num_draws):
    rng = np.random.default_rng(num_draws)
    seeds = np.array(EDGE_SEEDS + list(rng.integers(0, 2**63, 24)), dtype=np.uint64)
    positions = np.array(EDGE_SEEDS[::-1] + list(rng.integers(0, 2**40, 24)), dtype=np.uint64)
    signed_seeds = (seeds >> np.uint64(1)).astype(np.int64)  # non-negative int64
    g_seeds, g_positions, g_signed = on_device(cp, 0, seeds, positions, signed_seeds)
    variants = {
        "uint64 cupy arrays": (
            specdec_np.counter_uniforms(g_seeds, g_positions, num_draws),
            specdec_np.counter_uniforms(seeds, positions, num_draws),
        ),
        "lists, xp=cupy": (
            specdec_np.counter_uniforms(seeds.tolist(), positions.tolist(), num_draws, xp=cp),
            specdec_np.counter_uniforms(seeds.tolist(), positions.tolist(), num_draws),
        ),
        "int64 cupy arrays": (
            specdec_np.counter_uniforms(g_signed, g_positions, num_draws),
            specdec_np.counter_uniforms(signed_seeds, positions, num_draws),
        ),
    }
    for name, (got, want) in variants.items():
        assert isinstance(want, np.ndarray)
        assert want.shape == (seeds.size, num_draws) and want.dtype == np.float64
        assert_on_device(cp, got, 0, want.shape, np.float64)
        bits = cp.asnumpy(got).view(np.uint64)
        np.testing.assert_array_equal(bits, want.view(np.uint64), err_msg=name)


def test_philox_block_bit_identical_on_cupy(cp):
    rng = np.random.default_rng(3)
    counter = rng.integers(0, 2**32, (257, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, (257, 2), dtype=np.uint64).astype(np.uint32)
    counter[0], key[0] = 0, 0
    counter[1], key[1] = 2**32 - 1, 2**32 - 1
    expected = _philox.philox4x32_10(counter, key)
    got = _philox.philox4x32_10(*on_device(cp, 0, counter, key))
    assert_on_device(cp, got, 0, expected.shape, np.uint32)
    np.testing.assert_array_equal(cp.asnumpy(got), expected)


def flat_inputs(batch_size, seed=0, k=4, vocab_size=50):
    """Flat targets and unrelated drafts: a row's output changes with almost any change of
    its uniforms (the inputs of ``tests/runtime/test_random.py``)."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.ones(vocab_size), size=(batch_size, k + 1)).astype(np.float32)
    draft = rng.dirichlet(np.ones(vocab_size), size=(batch_size, k)).astype(np.float32)
    ids = rng.integers(0, vocab_size, (batch_size, k))
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    return target, bonus, draft, ids


def test_counter_seeds_give_the_cpu_result_on_gpu(cp):
    batch_size, k = 10, 4
    inputs = flat_inputs(batch_size, seed=1, k=k)
    counter_seeds = {b: (EDGE_SEEDS[b % len(EDGE_SEEDS)], 1000 * b + 7) for b in range(0, 10, 2)}
    gpu_inputs = on_device(cp, 0, *inputs)
    cpu = specdec_np.rejection_sample(
        *inputs, counter_seeds=counter_seeds, generator=np.random.default_rng(5)
    )
    gpu = specdec_np.rejection_sample(
        *gpu_inputs, counter_seeds=counter_seeds, generator=np.random.default_rng(5)
    )
    assert_gpu_result(cp, gpu, 0, batch_size, k)
    # The uniforms both used: counter rows from Philox, the others from the NumPy generator.
    uniforms = np.empty((batch_size, k + 1))
    others = [b for b in range(batch_size) if b not in counter_seeds]
    uniforms[others] = np.random.default_rng(5).random((len(others), k + 1))
    rows = sorted(counter_seeds)
    uniforms[rows] = specdec_np.counter_uniforms(
        [counter_seeds[b][0] for b in rows], [counter_seeds[b][1] for b in rows], k + 1
    )
    compare_rejection((*inputs, uniforms), cpu, to_host(cp, gpu))
    again = specdec_np.rejection_sample(*gpu_inputs, counter_seeds=counter_seeds)
    for b in rows:
        np.testing.assert_array_equal(
            cp.asnumpy(again.output_token_ids[b]), cp.asnumpy(gpu.output_token_ids[b])
        )


def test_seeded_seqs_with_numpy_generators_on_gpu(cp):
    batch_size, k = 8, 4
    inputs = flat_inputs(batch_size, seed=2, k=k)
    gpu_inputs = on_device(cp, 0, *inputs)
    seeds = {1: 11, 4: 44, 7: 77}
    results = []
    for _ in range(3):
        generators = {b: np.random.default_rng(s) for b, s in seeds.items()}
        results.append(specdec_np.rejection_sample(*gpu_inputs, seeded_seqs=generators))
        for b, s in seeds.items():  # exactly k + 1 draws were taken from each
            fresh = np.random.default_rng(s)
            fresh.random(k + 1)
            assert generators[b].random() == fresh.random()
    for result in results:
        assert_gpu_result(cp, result, 0, batch_size, k)
    host = [to_host(cp, result) for result in results]
    for b, s in seeds.items():
        for other in host[1:]:
            for got, want in zip(other, host[0]):
                np.testing.assert_array_equal(got[b], want[b])
        # The seeded row equals the CPU verifier given that generator's k + 1 uniforms.
        row_uniforms = np.random.default_rng(s).random(k + 1)[None, :]
        row = tuple(a[b : b + 1] for a in inputs)
        cpu = specdec_np.rejection_sample(*row, uniforms=row_uniforms)
        compare_rejection((*row, row_uniforms), cpu, tuple(a[b : b + 1] for a in host[0]))


def test_seeded_seqs_with_cupy_generators_are_reproducible(cp):
    inputs = on_device(cp, 0, *flat_inputs(6, seed=3))
    outputs = []
    for _ in range(2):
        with cp.cuda.Device(0):
            generators = {0: cp.random.default_rng(123), 5: cp.random.default_rng(456)}
        result = specdec_np.rejection_sample(*inputs, seeded_seqs=generators)
        outputs.append(cp.asnumpy(result.output_token_ids))
    for b in (0, 5):
        np.testing.assert_array_equal(outputs[0][b], outputs[1][b])


def test_seeded_gpu_sampler_is_reproducible(cp):
    inputs = on_device(cp, 0, *flat_inputs(16, seed=4))
    a = specdec_np.RejectionSampler(seed=123)
    b = specdec_np.RejectionSampler(seed=123)
    outputs_a = [cp.asnumpy(a(*inputs)) for _ in range(3)]
    outputs_b = [cp.asnumpy(b(*inputs)) for _ in range(3)]
    for x, y in zip(outputs_a, outputs_b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(outputs_a[0], outputs_a[1])  # the generator moves on
    other = cp.asnumpy(specdec_np.RejectionSampler(seed=124)(*inputs))
    assert not np.array_equal(outputs_a[0], other)
    assert counter_values(a) == counter_values(b)
    assert_on_device(cp, a.num_accepted_tokens, 0, ())


def test_failed_gpu_call_leaves_generators_alone(cp):
    """A failed call changes no counter and no generator state that a later call
    depends on; on the GPU the error is found after the uniforms were drawn."""
    good = on_device(cp, 0, *flat_inputs(3, seed=5))
    target, bonus, draft, ids = flat_inputs(3, seed=5)
    bad_ids = ids.copy()
    bad_ids[2, 3] = 50
    bad = on_device(cp, 0, target, bonus, draft, bad_ids)
    sampler = specdec_np.RejectionSampler(seed=77)
    twin = specdec_np.RejectionSampler(seed=77)
    sampler(*good)
    twin(*good)
    counters = counter_values(sampler)
    seeded = np.random.default_rng(8)
    with pytest.raises(ValueError, match=r"draft_token_ids.*\(2, 3\)"):
        sampler(*bad, {0: seeded})
    assert counter_values(sampler) == counters
    assert seeded.random() == np.random.default_rng(8).random()
    np.testing.assert_array_equal(cp.asnumpy(sampler(*good)), cp.asnumpy(twin(*good)))


# --------------------------------------------------------------------------------------
# DLPack (torch CUDA tensors)
# --------------------------------------------------------------------------------------


@pytest.fixture
def torch_cuda(cp):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no usable CUDA device")
    return torch


def test_torch_cuda_tensors_are_taken_zero_copy(cp, torch_cuda):
    torch = torch_cuda
    target, bonus, draft, ids, uniforms = make_rejection_case(
        8, 16, 3, 200, np.float32, np.int64, True
    )
    tensors = [torch.from_numpy(a).to("cuda:0") for a in (target, bonus, draft, ids)]
    for tensor, name in zip(tensors, MIXED_ARGUMENTS):
        taken = _backend.intake(tensor, name)
        assert isinstance(taken, cp.ndarray)
        assert taken.data.ptr == tensor.data_ptr(), f"{name} was copied"
        assert taken.device.id == 0
    t_target, t_bonus, t_draft, t_ids = tensors
    c_target, c_bonus, c_draft, c_ids, c_uniforms = on_device(
        cp, 0, target, bonus, draft, ids, uniforms
    )
    for verifier in PADDED:
        extra = {"uniforms": c_uniforms} if verifier.stochastic else {}
        from_torch = stateless(verifier.name, t_target, t_bonus, t_draft, t_ids, **extra)
        from_cupy = stateless(verifier.name, c_target, c_bonus, c_draft, c_ids, **extra)
        assert_gpu_result(cp, from_torch, 0, 16, 3)
        for got, want in zip(to_host(cp, from_torch), to_host(cp, from_cupy)):
            np.testing.assert_array_equal(got, want)
    sampler = specdec_np.GreedySampler()
    output = sampler(t_target, t_bonus, None, t_ids)
    assert_on_device(cp, output, 0, (16, 4))
    assert_on_device(cp, sampler.num_accepted_tokens, 0, ())


def test_torch_tensor_requiring_grad_raises(cp, torch_cuda):
    torch = torch_cuda
    target = torch.rand((2, 3, 5), device="cuda:0", requires_grad=True)
    bonus = torch.zeros((2, 1), dtype=torch.int64, device="cuda:0")
    ids = torch.zeros((2, 2), dtype=torch.int64, device="cuda:0")
    with pytest.raises(TypeError, match="detach"):
        specdec_np.greedy_sample(target, bonus, ids)
    with pytest.raises(TypeError, match="detach"):
        specdec_np.RejectionSampler()(target, bonus, None, ids)
    result = specdec_np.greedy_sample(target.detach(), bonus, ids)
    assert_gpu_result(cp, result, 0, 2, 2)


# --------------------------------------------------------------------------------------
# The import rule: importing specdec_np never imports CuPy
# --------------------------------------------------------------------------------------


def test_import_does_not_import_cupy(cp):
    """``import specdec_np`` (and NumPy use of it) never imports cupy, although cupy is
    installed and importable in the same interpreter."""
    code = "\n".join(
        [
            "import sys",
            "import numpy as np",
            "import specdec_np, specdec_np._kernels.cuda, specdec_np.verify, specdec_np.samplers",
            "target = np.full((2, 3, 4), 0.25, dtype=np.float32)",
            "ids = np.zeros((2, 2), dtype=np.int64)",
            "specdec_np.RejectionSampler(seed=0)(target, ids[:, :1], None, ids)",
            "specdec_np.greedy_sample(target, ids[:, :1], ids)",
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'cupy')",
            "assert not loaded, loaded",
            "import cupy",
            "print('cupy importable, not imported by specdec_np')",
        ]
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "not imported by specdec_np" in completed.stdout


# --------------------------------------------------------------------------------------
# Trees: specdec_np.verify_tree on CuPy (verify_trees_kernel) against NumPy (_core)
# --------------------------------------------------------------------------------------

TREE_METHODS = tuple(method.name for method in registry.TREE_METHODS)
# A sum taken in another order moves a decision only where a uniform lies within rounding of
# its boundary: a request whose GPU result differs must get it on the CPU once one of its
# uniforms is nudged by this much (random results almost never do).
TREE_NUDGE = 1e-9


def tree_case(seed, dtype, id_dtype, with_draft_probs, batch_size=5, vocab_size=37):
    """Random trees (zero-node requests, a wide sibling list, repeated sibling tokens) with
    probability rows and explicit uniforms."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 7, batch_size)
    counts[0], counts[1] = 0, 12  # a request without nodes, a wide one
    parents = []
    for b, n in enumerate(counts):
        parents += [-1 if b == 1 and j < 9 else int(rng.integers(-1, j)) for j in range(int(n))]
    total = int(counts.sum())
    target = random_rows(rng, (total + batch_size, vocab_size)).astype(dtype)
    draft = random_rows(rng, (total, vocab_size)).astype(dtype)
    ids = rng.integers(0, vocab_size, total)
    ids[rng.random(total) < 0.3] = int(rng.integers(vocab_size))  # repeated sibling tokens
    return {
        "num_nodes": counts,
        "tree_parents": np.asarray(parents, np.int64),
        "draft_token_ids": ids.astype(id_dtype),
        "target_probs": target,
        "draft_probs": draft if with_draft_probs else None,
        "uniforms": rng.random((batch_size, int(counts.max()) + 1)),
    }


TREE_ROWS = ("target_probs", "draft_probs", "target_logits", "draft_logits")
TREE_SAMPLING = ("temperature", "top_k", "top_p", "min_p")


def tree_logits_case(seed, dtype, id_dtype, with_draft_logits):
    """``tree_case`` with logits rows: ties at the top-k and top-p boundaries, masked entries,
    per-request temperature, top-k, top-p and min-p, and greedy requests (temperature 0)."""
    case = tree_case(seed, dtype, id_dtype, with_draft_logits)
    rng = np.random.default_rng(seed + 1)
    for name in ("target", "draft"):
        rows = case.pop(f"{name}_probs")
        if rows is not None:
            logits = rng.choice(np.array([0.0, 1.0, 2.0, 2.5, -np.inf]), rows.shape)
            with np.errstate(divide="ignore"):  # a zero probability is a masked logit
                logits[::3] = np.log(rows[::3].astype(np.float64))
            rows = logits.astype(dtype)
        case[f"{name}_logits"] = rows
    case.update(
        temperature=np.array([0.7, 1.0, 0.0, 1.5, 1.0]),
        top_k=np.array([0, 3, 5, 0, 37]),
        top_p=np.array([0.9, 1.0, 0.5, 0.3, 0.8]),
        min_p=np.array([0.0, 0.1, 0.0, 0.0, 0.05]),
    )
    return case


def tree_on_device(cp, case):
    arrays = ("tree_parents", "draft_token_ids", "uniforms", *TREE_ROWS)
    moved = on_device(cp, 0, *(case.get(name) for name in arrays))
    return {**case, **{name: array for name, array in zip(arrays, moved) if name in case}}


def tree_request(case, b, uniforms=None):
    """Request b of a tree case as a batch of one."""
    counts = np.asarray(case["num_nodes"])
    start, n = int(counts[:b].sum()), int(counts[b])
    rows = {
        name: case[name][start + b : start + b + n + 1]
        if name.startswith("target")
        else case[name][start : start + n]
        for name in TREE_ROWS
        if case.get(name) is not None
    }
    return {
        **case,
        **rows,
        "num_nodes": counts[b : b + 1],
        "tree_parents": case["tree_parents"][start : start + n],
        "draft_token_ids": case["draft_token_ids"][start : start + n],
        "uniforms": (case["uniforms"][b] if uniforms is None else uniforms)[None, : n + 1],
        **{name: case[name][b : b + 1] for name in TREE_SAMPLING if name in case},
    }


def assert_tree_results_match(case, method, gpu, cpu):
    """Per request: the GPU's nodes, tokens and length equal the CPU's, or equal the CPU's
    on one uniform nudged by TREE_NUDGE (a boundary within rounding)."""
    gpu = [np.asarray(a) for a in gpu]
    depth = gpu[0].shape[1]
    for b in range(len(case["num_nodes"])):
        ours = tuple(a[b].tolist() for a in gpu)
        if ours == tuple(np.asarray(a)[b].tolist() for a in cpu):
            continue
        n = int(case["num_nodes"][b])
        explained = False
        for column, sign in itertools.product(range(n + 1), (1.0, -1.0)):
            nudged = case["uniforms"][b].copy()
            nudged[column] = min(
                max(nudged[column] * (1 + sign * TREE_NUDGE) + sign * TREE_NUDGE, 0.0),
                LARGEST_BELOW_ONE,
            )
            one = specdec_np.verify_tree(**tree_request(case, b, nudged), method=method)
            more = depth - one.accepted_nodes.shape[1]  # the batch of one may be shallower
            nodes, tokens = (np.pad(a[0], (0, more), constant_values=-1) for a in one[:2])
            theirs = (nodes.tolist(), tokens.tolist(), int(one.accepted_lengths[0]))
            explained = explained or theirs == ours
        assert explained, f"{method} request {b}: GPU {ours} != CPU"


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "candidates"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("method", TREE_METHODS)
def test_verify_tree_gpu_matches_cpu(cp, method, dtype, id_dtype, with_draft_probs):
    """verify_tree on CuPy probability rows: CuPy int64 results on the device, equal to
    NumPy's on the same uniforms (within rounding of a boundary at most)."""
    case = tree_case(stable_seed(method, dtype_id(dtype), dtype_id(id_dtype)), dtype, id_dtype,
                     with_draft_probs)  # fmt: skip
    cpu = specdec_np.verify_tree(**case, method=method)
    gpu = specdec_np.verify_tree(**tree_on_device(cp, case), method=method)
    for array, expected in zip(gpu, cpu):
        assert_on_device(cp, array, 0, expected.shape)
    assert_tree_results_match(case, method, to_host(cp, gpu), cpu)
    synchronize(cp)


@pytest.mark.parametrize("with_draft_logits", [True, False], ids=["draft_logits", "candidates"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("method", TREE_METHODS)
def test_verify_tree_gpu_logits_match_cpu(cp, method, dtype, with_draft_logits):
    """verify_tree on CuPy logits rows, processed on the device with per-request
    temperature, top-k, top-p and min-p (a greedy request among them): the NumPy results on
    the same uniforms (within rounding of a boundary at most)."""
    case = tree_logits_case(stable_seed("logits", method, dtype_id(dtype)), dtype, np.int64,
                            with_draft_logits)  # fmt: skip
    cpu = specdec_np.verify_tree(**case, method=method)
    gpu = specdec_np.verify_tree(**tree_on_device(cp, case), method=method)
    for array, expected in zip(gpu, cpu):
        assert_on_device(cp, array, 0, expected.shape)
    assert_tree_results_match(case, method, to_host(cp, gpu), cpu)
    synchronize(cp)


@pytest.mark.parametrize("method", registry.tree_method_names(stochastic=True))
def test_verify_tree_gpu_mixed_greedy_requests(cp, method):
    """temperature 0 walks a request greedily on CuPy as on NumPy (per-request walks)."""
    case = tree_case(stable_seed("mixed", method), np.float32, np.int64, True)
    case["temperature"] = np.array([0.0, 1.0, 0.0, 1.0, 1.0])
    cpu = specdec_np.verify_tree(**case, method=method)
    gpu = specdec_np.verify_tree(**tree_on_device(cp, case), method=method)
    assert_tree_results_match(case, method, to_host(cp, gpu), cpu)


def test_verify_tree_gpu_counter_seeds_and_out_buffers(cp):
    """Counter-based uniforms are bit-identical on both backends; CuPy out buffers are
    filled and returned, padded past the batch's depth."""
    case = tree_case(stable_seed("seeds"), np.float64, np.int64, True)
    del case["uniforms"]
    seeds = {b: (11, 100 + b) for b in range(5)}
    cpu = specdec_np.verify_tree(**case, method="rrs", counter_seeds=seeds)
    out = specdec_np.tree_output_buffers(5, cpu.accepted_nodes.shape[1] + 2, xp=cp)
    gpu = specdec_np.verify_tree(**tree_on_device(cp, case), method="rrs", counter_seeds=seeds,
                                 out=out)  # fmt: skip
    case["uniforms"] = specdec_np.counter_uniforms(
        [s[0] for s in seeds.values()], [s[1] for s in seeds.values()],
        int(case["num_nodes"].max()) + 1,
    )  # fmt: skip
    assert_tree_results_match(case, "rrs", to_host(cp, gpu), cpu)
    assert gpu.output_token_ids.data.ptr == out.output_token_ids.data.ptr
    assert (cp.asnumpy(out.accepted_nodes)[:, cpu.accepted_nodes.shape[1] :] == -1).all()
    host_out = specdec_np.tree_output_buffers(5, 9)
    with pytest.raises(TypeError, match="out.accepted_nodes must be an int64 array of the inputs"):
        specdec_np.verify_tree(**tree_on_device(cp, case), out=host_out)


def test_verify_tree_gpu_zero_nodes_empty_batch_and_errors(cp):
    """Zero-node requests draw from the root row; B = 0 launches nothing; a row without
    mass raises the CPU's ValueError, from probabilities and from logits."""
    target = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    none = np.zeros(0, np.int64)
    (g_target, g_none) = on_device(cp, 0, target, none)
    result = specdec_np.verify_tree(
        num_nodes=np.array([0, 0]), tree_parents=g_none, draft_token_ids=g_none,
        target_probs=g_target, uniforms=cp.asarray(np.array([[0.5], [0.99]])),
    )  # fmt: skip
    assert_on_device(cp, result.output_token_ids, 0, (2, 1))
    np.testing.assert_array_equal(cp.asnumpy(result.output_token_ids), [[1], [2]])
    empty = specdec_np.verify_tree(
        num_nodes=none, tree_parents=g_none, draft_token_ids=g_none,
        target_probs=cp.zeros((0, 5)),
    )  # fmt: skip
    assert_on_device(cp, empty.output_token_ids, 0, (0, 1))
    dead = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    arguments = {
        "num_nodes": np.array([1]), "tree_parents": np.array([-1]),
        "draft_token_ids": np.array([0]), "uniforms": np.array([[0.0, 0.5]]),
    }  # fmt: skip
    with pytest.raises(ValueError) as expected:
        specdec_np.verify_tree(**arguments, target_probs=dead)
    on_gpu = {**arguments, "draft_token_ids": cp.asarray(arguments["draft_token_ids"])}
    with pytest.raises(ValueError) as found:
        specdec_np.verify_tree(**on_gpu, target_probs=cp.asarray(dead))
    assert str(found.value) == str(expected.value)
    masked = np.where(dead > 0.0, 0.0, -np.inf)
    with pytest.raises(ValueError) as expected:
        specdec_np.verify_tree(**arguments, target_logits=masked, method="specinfer")
    with pytest.raises(ValueError) as found:
        specdec_np.verify_tree(**on_gpu, target_logits=cp.asarray(masked), method="specinfer")
    assert str(found.value) == str(expected.value)
    synchronize(cp)


# --------------------------------------------------------------------------------------
# The engine layout on CuPy: verify_ragged and EngineVerifier against the NumPy path
# --------------------------------------------------------------------------------------


def engine_case(seed, logits, dtype):
    """A ragged engine batch (k_b = 0 among the requests) with ties in its logits rows at
    the top-k and top-p boundaries, masked entries, per-request sampling parameters and
    greedy requests (temperature 0) among the sampled ones."""
    rng = np.random.default_rng(seed)
    lengths = np.array([3, 0, 5, 1, 0, 2, 4, 1])
    batch_size, vocab_size = lengths.size, 70
    num_drafts = int(lengths.sum())
    if logits:
        target = rng.choice(
            np.array([0.0, 1.0, 2.0, 2.5, -np.inf]), (num_drafts + batch_size, vocab_size)
        )
        target[::3] = rng.standard_normal(target[::3].shape) * 2.0
        draft = rng.choice(np.array([0.0, 1.0, 2.0, 3.0]), (num_drafts, vocab_size))
    else:
        target = random_rows(rng, (num_drafts + batch_size, vocab_size))
        draft = random_rows(rng, (num_drafts, vocab_size))
    target, draft = target.astype(dtype), draft.astype(dtype)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(0, vocab_size, num_drafts)
    for i in range(0, num_drafts, 2):  # likely accepted drafts
        ids[i] = np.argmax(target[i + int(np.searchsorted(offsets, i, side="right")) - 1])
    sampling = {
        "temperature": np.array([0.7, 0.0, 1.0, 1.5, 0.0, 1.0, 0.8, 1.0]),
        "top_k": np.array([0, 3, 5, 0, 2, 1, 70, 4]) if logits else None,
        "top_p": np.array([0.9, 1.0, 0.5, 0.3, 1.0, 1.0, 0.8, 1.0]) if logits else None,
        "min_p": np.array([0.0, 0.0, 0.1, 0.0, 0.0, 0.05, 0.0, 0.2]) if logits else None,
    }
    uniforms = rng.random((batch_size, int(lengths.max()) + 2))
    return lengths, ids, target, draft, sampling, uniforms


ENGINE_ROWS = {True: ("target_logits", "draft_logits"), False: ("target_probs", "draft_probs")}


@pytest.mark.parametrize("lazy_bonus", [True, False], ids=["lazy_bonus", "bonus_ids"])
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_rows", "point_mass"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("logits", [True, False], ids=["logits", "probabilities"])
@pytest.mark.parametrize("kind", registry.names())
def test_verify_ragged_on_cupy_matches_numpy(cp, kind, logits, dtype, point_mass, lazy_bonus):
    """``verify_ragged`` on CuPy arrays returns CuPy arrays equal to the NumPy path's on the
    same explicit uniforms: mixed greedy and sampled requests, k_b = 0, the lazy bonus,
    logits processed on the device with temperature, top-k, top-p and min-p.  On a real
    device a drawn token may differ only where v * Z lies within rounding of a CDF boundary
    (the draw sums in another order), so there only the acceptance decisions are compared
    exactly; on the stand-in CuPy (the emulated kernels) every cell must be equal."""
    _check_ragged_on_cupy(cp, kind, logits, dtype, point_mass, lazy_bonus)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", SAMPLER_KINDS)
def test_verify_ragged_on_cupy_in_llama_cpp_order(cp, kind, dtype):
    """The same comparison with the filters in llama.cpp's order (at temperature 1, then the
    temperature), from target and draft logits."""
    _check_ragged_on_cupy(cp, kind, True, dtype, False, True, "llama.cpp")


def _check_ragged_on_cupy(cp, kind, logits, dtype, point_mass, lazy_bonus, filter_order=None):
    lengths, ids, target, draft, sampling, uniforms = engine_case(
        stable_seed(kind, logits, dtype_id(dtype), point_mass, lazy_bonus), logits, dtype
    )
    if filter_order is not None:
        sampling = {**sampling, "filter_order": filter_order}
    target_name, draft_name = ENGINE_ROWS[logits]
    bonus = None if lazy_bonus else (np.arange(lengths.size) * 7) % target.shape[1]
    host = {
        "num_draft_tokens": lengths, "draft_token_ids": ids, target_name: target,
        draft_name: None if point_mass else draft, "bonus_token_ids": bonus,
        "uniforms": uniforms, **sampling,
    }  # fmt: skip
    device = dict(host)
    for name in (
        "num_draft_tokens",
        "draft_token_ids",
        target_name,
        draft_name,
        "bonus_token_ids",
        "uniforms",
    ):
        device[name] = on_device(cp, 0, host[name])[0]
    expected = specdec_np.verify_ragged(method=kind, **host)
    found = specdec_np.verify_ragged(method=kind, **device)
    assert all(isinstance(a, cp.ndarray) for a in found[:3])
    output, accepted, counts = (cp.asnumpy(a) for a in found[:3])
    np.testing.assert_array_equal(accepted, expected.accepted_lengths)
    np.testing.assert_array_equal(counts, expected.num_accepted)
    assert found.num_draft_tokens == expected.num_draft_tokens
    emulated = hasattr(cp, "_LIBRARY")
    for b in range(lengths.size):
        r = int(accepted[b])
        np.testing.assert_array_equal(output[b, :r], expected.output_token_ids[b, :r])
        np.testing.assert_array_equal(output[b, r + 1 :], expected.output_token_ids[b, r + 1 :])
        greedy = sampling["temperature"][b] == 0 or registry.get(kind).greedy
        # A verifier without randomness emits its recovered token by a rule, not a draw.
        deterministic = not registry.get(kind).stochastic and r < lengths[b]
        if emulated or greedy or deterministic:
            assert output[b, r] == expected.output_token_ids[b, r], (b, r)
    synchronize(cp)


def test_engine_verifier_on_cupy_matches_numpy(cp):
    """``EngineVerifier`` on CuPy: the same seeded_seqs generators give the NumPy path's
    tokens, and the metrics count the same acceptances."""
    lengths, ids, target, draft, sampling, _ = engine_case(11, True, np.float32)
    runs = []
    for on_gpu in (False, True):
        verifier = specdec_np.EngineVerifier("rejection")
        arrays = {"num_draft_tokens": lengths, "draft_token_ids": ids, "target_logits": target,
                  "draft_logits": draft}  # fmt: skip
        if on_gpu:
            arrays = {name: on_device(cp, 0, a)[0] for name, a in arrays.items()}
        seeds = {b: np.random.default_rng(100 + b) for b in range(lengths.size)}
        result = verifier(**arrays, **sampling, seeded_seqs=seeds)
        runs.append((tuple(np.asarray(cp.asnumpy(a) if on_gpu else a) for a in result[:2]),
                     verifier.metrics))  # fmt: skip
    (cpu, cpu_metrics), (gpu, gpu_metrics) = runs
    np.testing.assert_array_equal(gpu[1], cpu[1])
    assert gpu_metrics == cpu_metrics
    if hasattr(cp, "_LIBRARY"):
        np.testing.assert_array_equal(gpu[0], cpu[0])
    synchronize(cp)


def test_engine_verifier_own_generator_on_cupy(cp):
    """Without seeds of its own a request draws from the verifier's generator, made on the
    device: CuPy in, CuPy out, and two verifiers with one seed give the same tokens."""
    lengths, ids, target, draft, sampling, _ = engine_case(12, True, np.float64)
    arrays = {"num_draft_tokens": lengths, "draft_token_ids": ids, "target_logits": target,
              "draft_logits": draft}  # fmt: skip
    arrays = {name: on_device(cp, 0, a)[0] for name, a in arrays.items()}
    results = [specdec_np.EngineVerifier("block", seed=3)(**arrays, **sampling) for _ in "ab"]
    assert all(isinstance(a, cp.ndarray) for a in results[0][:3])
    for first, second in zip(results[0][:3], results[1][:3]):
        np.testing.assert_array_equal(cp.asnumpy(first), cp.asnumpy(second))
    synchronize(cp)


@pytest.mark.parametrize("form", ["target_logits+draft_probs", "target_probs+draft_logits"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", registry.names())
def test_verify_ragged_mixed_forms_on_cupy_match_numpy(cp, kind, dtype, form):
    """Any target form with any draft form, on the device as on the host: draft
    probabilities used as given, draft logits processed like the target's."""
    rng = np.random.default_rng(stable_seed(kind, dtype_id(dtype), form))
    lengths = np.array([2, 0, 3, 1])
    total, batch, vocab = int(lengths.sum()), lengths.size, 37
    logits_rows = lambda n: (rng.normal(size=(n, vocab)) * 2).astype(dtype)  # noqa: E731
    prob_rows = lambda n: rng.dirichlet(np.ones(vocab), size=n).astype(dtype)  # noqa: E731
    target_form, draft_form = (name.split("_")[1] for name in form.split("+"))
    target = (logits_rows if target_form == "logits" else prob_rows)(total + batch)
    draft = (logits_rows if draft_form == "logits" else prob_rows)(total)
    host = {
        "num_draft_tokens": lengths, "draft_token_ids": rng.integers(0, vocab, total),
        f"target_{target_form}": target, f"draft_{draft_form}": draft,
        "temperature": np.array([0.8, 0.0, 1.2, 1.0]),
        "uniforms": rng.random((batch, int(lengths.max()) + 2)),
    }  # fmt: skip
    if target_form == "logits":
        host["top_k"] = np.array([0, 3, 5, 0])
    device = {
        name: on_device(cp, 0, value)[0] if isinstance(value, np.ndarray) else value
        for name, value in host.items()
    }
    expected = specdec_np.verify_ragged(method=kind, **host)
    found = specdec_np.verify_ragged(method=kind, **device)
    np.testing.assert_array_equal(cp.asnumpy(found.accepted_lengths), expected.accepted_lengths)
    if hasattr(cp, "_LIBRARY") or not registry.get(kind).stochastic:
        np.testing.assert_array_equal(cp.asnumpy(found.output_token_ids),
                                      expected.output_token_ids)
    synchronize(cp)


def test_verify_ragged_without_bonus_rows_on_cupy(cp):
    """vLLM v1's [T, V] target rows, with the bonus ids given, on the device."""
    rng = np.random.default_rng(5)
    lengths = np.array([3, 0, 2])
    total, vocab = int(lengths.sum()), 29
    rows = rng.normal(size=(total, vocab)).astype(np.float32)
    host = {
        "num_draft_tokens": lengths, "draft_token_ids": rng.integers(0, vocab, total),
        "target_logits": rows, "draft_probs": rng.dirichlet(np.ones(vocab), total)
        .astype(np.float32), "bonus_token_ids": np.array([1, 2, 3]),
        "uniforms": rng.random((3, 5)), "temperature": 0.9,
    }  # fmt: skip
    device = {
        name: on_device(cp, 0, value)[0] if isinstance(value, np.ndarray) else value
        for name, value in host.items()
    }
    expected = specdec_np.verify_ragged(**host)
    found = specdec_np.verify_ragged(**device)
    np.testing.assert_array_equal(cp.asnumpy(found.accepted_lengths), expected.accepted_lengths)
    if hasattr(cp, "_LIBRARY"):
        np.testing.assert_array_equal(cp.asnumpy(found.output_token_ids),
                                      expected.output_token_ids)
    synchronize(cp)


@pytest.mark.parametrize("filter_order", ["vllm", "llama.cpp"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_processed_probs_on_cupy(cp, dtype, filter_order):
    """processed_probs on the device: CuPy in, CuPy out, the host's rows (bit for bit on the
    stand-in CuPy; on a device, within the float64 exp's last bit), in both filter orders."""
    rng = np.random.default_rng(stable_seed("processed", dtype_id(dtype)))
    logits = (rng.normal(size=(6, 300)) * 3).astype(dtype)
    settings = {"temperature": np.array([0.7, 0.0, 1.0, 2.0, 1.0, 0.5]), "top_k": 20,
                "top_p": np.array([1.0, 1.0, 0.9, 0.5, 1.0, 0.8]),
                "min_p": np.array([0.01, 0.0, 0.0, 0.2, 0.3, 0.05]),
                "filter_order": filter_order}
    expected = specdec_np.processed_probs(logits, **settings)
    found = specdec_np.processed_probs(on_device(cp, 0, logits)[0], **settings)
    assert isinstance(found, cp.ndarray) and found.dtype == expected.dtype
    if hasattr(cp, "_LIBRARY"):
        np.testing.assert_array_equal(cp.asnumpy(found), expected)
    else:
        np.testing.assert_allclose(cp.asnumpy(found), expected, rtol=1e-6, atol=0)
    synchronize(cp)


@pytest.mark.parametrize("method", registry.relaxed_names())
def test_relaxed_methods_on_cupy(cp, method):
    """A relaxed method on the device: the host's tokens and bias from the same uniforms
    (its rule is array code on the rows' library, the laws the device's own)."""
    rng = np.random.default_rng(stable_seed("relaxed", method))
    counts = np.array([3, 0, 2])
    logits = (rng.normal(size=(int(counts.sum()) + 3, 50)) * 2).astype(np.float32)
    draft = (rng.normal(size=(int(counts.sum()), 50)) * 2).astype(np.float32)
    parameters = {"fly": {"window_size": 1, "entropy_threshold": 0.5},
                  "synthetic": {"acceptance_rates": [0.9, 0.6, 0.3]},
                  "relaxed": {"relaxed_top_k": 3, "delta": 0.2}}.get(method, {})
    host = {"num_draft_tokens": counts, "draft_token_ids": rng.integers(0, 50, counts.sum()),
            "target_logits": logits, "draft_logits": draft,
            "temperature": np.array([0.8, 0.0, 1.2]), "uniforms": rng.random((3, 5))}
    device = dict(host, target_logits=on_device(cp, 0, logits)[0],
                  draft_logits=on_device(cp, 0, draft)[0],
                  draft_token_ids=on_device(cp, 0, host["draft_token_ids"])[0],
                  num_draft_tokens=on_device(cp, 0, counts)[0])
    expected = specdec_np.verify_ragged(method=method, report_bias=True, **host, **parameters)
    found = specdec_np.verify_ragged(method=method, report_bias=True, **device, **parameters)
    np.testing.assert_array_equal(cp.asnumpy(found.output_token_ids), expected.output_token_ids)
    np.testing.assert_allclose(cp.asnumpy(found.total_variation), expected.total_variation,
                               rtol=1e-9, atol=1e-12)
    synchronize(cp)


# --------------------------------------------------------------------------------------
# Verification across vocabulary shards on CuPy rows (specdec_np.sharded, shard_passes.cu)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    "method", [verifier.name for verifier in registry.VERIFIERS if verifier.reads_draft_probs]
)
def test_sharded_call_on_cupy_rows(cp, method, dtype):
    """Ranks holding CuPy rows (threads of one process): one shard gives the unsharded CuPy
    call's tokens, two and three uneven shards the CPU sharded call's, on every rank.  On a
    real device a drawn token of the one-shard call may differ from the unsharded call's
    three-level draw only where v * Z lies within rounding of a CDF boundary, and float64
    weights by an ulp of CUDA's exp from the CPU's; on the stand-in CuPy every cell is
    equal."""
    from specdec_np import sharded

    lengths, ids, target, draft, sampling, uniforms = engine_case(
        stable_seed("sharded", method, dtype_id(dtype)), True, dtype
    )
    host = {"num_draft_tokens": lengths, "draft_token_ids": ids, "target_logits": target,
            "draft_logits": draft, "uniforms": uniforms, "method": method, **sampling}
    device = dict(host, target_logits=cp.asarray(target), draft_logits=cp.asarray(draft))
    emulated = hasattr(cp, "_LIBRARY")
    vocab_size = target.shape[1]

    def run(arguments, widths):
        cuts = np.concatenate([[0], np.cumsum(widths)]).astype(int)

        def rank(communicator):
            start, end = cuts[communicator.rank], cuts[communicator.rank + 1]
            local = dict(arguments)
            for name in ("target_logits", "draft_logits"):
                local[name] = arguments[name][:, start:end]
            return sharded.verify_ragged(communicator=communicator, vocab_start=int(start),
                                         vocab_size=vocab_size, **local)

        results = sharded.run_local(len(widths), rank, timeout=120)
        for other in results[1:]:
            np.testing.assert_array_equal(other.output_token_ids, results[0].output_token_ids)
        return results[0]

    moved = ("num_draft_tokens", "draft_token_ids", "uniforms")
    unsharded = specdec_np.verify_ragged(**dict(device, **{
        name: on_device(cp, 0, host[name])[0] for name in moved}))
    expected = [cp.asnumpy(array) for array in unsharded[:2]]
    for widths, reference in (([vocab_size], expected), ([23, 47], None), ([9, 0, 61], None)):
        if reference is None:
            cpu = run(host, widths)
            reference = [cpu.output_token_ids, cpu.accepted_lengths]
        found = run(device, widths)
        np.testing.assert_array_equal(found.accepted_lengths, reference[1])
        if emulated or dtype == np.float32 and len(widths) > 1:
            np.testing.assert_array_equal(found.output_token_ids, reference[0])


# --------------------------------------------------------------------------------------
# The sampling surface's row settings inside the CUDA chain kernel
# --------------------------------------------------------------------------------------


def surface_case(seed, dtype, group):
    """A ragged batch whose drafts repeat tokens (ids 0..3), greedy and sampled requests
    mixed, with one group of the row settings: ``"masks"`` (token_bitmask, logit_bias,
    allowed_token_ids) or ``"context"`` (the three penalties, bad words whose prefix is a
    draft, a minimum length reached inside the chain)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([3, 0, 4, 2])
    batch, vocab = lengths.size, 45
    total = int(lengths.sum())
    # Tokens 0..3 likely in both models: the drafts are often accepted, deep into a chain.
    likely = np.where(np.arange(vocab) < 4, 4.0, 0.0)
    target = (rng.normal(size=(total + batch, vocab)) * 1.5 + likely).astype(dtype)
    target[rng.random(target.shape) < 0.05] = -np.inf
    ids = rng.integers(0, 4, total)
    host = {
        "num_draft_tokens": lengths, "draft_token_ids": ids, "target_logits": target,
        "draft_logits": (rng.normal(size=(total, vocab)) * 1.5 + likely).astype(dtype),
        "temperature": np.array([0.9, 0.0, 1.0, 0.0]), "top_k": np.array([0, 0, 6, 0]),
        "top_p": np.array([0.9, 1.0, 1.0, 1.0]), "min_p": np.array([0.0, 0.0, 0.05, 0.0]),
        "uniforms": rng.random((batch, int(lengths.max()) + 2)), "logprobs": 2,
    }  # fmt: skip
    if group == "masks":
        mask = rng.integers(-(2**31), 2**31 - 1, (total + batch, 2)).astype(np.int32)
        mask[:, 0] |= 0xF  # the drafts' ids stay possible
        mask[::3, 1] = 0
        host.update(
            token_bitmask=mask,
            logit_bias=[{1: 2.5, 7: -1.0}, {2: 3.0}, None, {0: -4.0, 40: 6.0}],
            allowed_token_ids=[None, list(range(0, 30)), list(range(0, 12)), None],
        )
    else:
        host.update(
            output_token_ids=[[1, 2, 2], [0], [], [3, 3]],
            prompt_token_ids=[[5, 6], None, [1, 9], [0]],
            repetition_penalty=np.array([1.3, 1.6, 0.8, 1.0]),
            frequency_penalty=np.array([0.5, 0.0, -0.3, 0.7]),
            presence_penalty=np.array([0.2, 0.4, 0.0, -0.5]),
            bad_words_token_ids=[[[int(ids[0]), int(ids[1])]], [[2]], [[int(ids[3]), 1]], None],
            min_tokens=np.array([2, 1, 3, 4]), stop_token_ids=[[1, 3], [0], [2], [3, 9]],
        )
    return host


def _surface_on_device(cp, host):
    return {
        name: on_device(cp, 0, value)[0]
        if isinstance(value, np.ndarray) and name != "num_draft_tokens" else value
        for name, value in host.items()
    }


def _surface_results(result, cp):
    names = ("output_token_ids", "accepted_lengths", "num_accepted", "finished", "logprobs",
             "raw_logprobs", "top_token_ids", "top_logprobs")
    found = {}
    for name in names:
        value = getattr(result, name)
        found[name] = cp.asnumpy(value) if isinstance(value, cp.ndarray) else np.asarray(value)
    return found


@pytest.mark.parametrize(
    ("kind", "group", "filter_order", "dtype"),
    [("rejection", "masks", "vllm", np.float32), ("rejection", "context", "llama.cpp",
     np.float64), ("block", "context", "vllm", np.float32), ("typical", "masks", "llama.cpp",
     np.float64), ("greedy", "masks", "vllm", np.float32)],
)  # fmt: skip
def test_surface_in_the_cuda_chain_kernel_matches_numpy(cp, kind, group, filter_order, dtype):
    """The row settings applied inside the CUDA chain kernel (the rows themselves on the
    device, only the touched entries computed on the host) give the NumPy call's tokens,
    lengths, stops and logprobs; the call hands the kernel its adjustments."""
    host = surface_case(stable_seed("surface", kind, group), dtype, group)
    host["filter_order"] = filter_order
    expected = specdec_np.verify_ragged(method=kind, **host)
    seen = []
    launch = _cuda.core_like.verify_chains

    def spy(*arguments, **options):
        seen.append(options)
        return launch(*arguments, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_cuda.core_like, "verify_chains", spy)
        found = specdec_np.verify_ragged(method=kind, **_surface_on_device(cp, host))
    assert seen and seen[-1].get("target_adjustments") is not None
    assert isinstance(found.output_token_ids, cp.ndarray)
    expected, found = _surface_results(expected, cp), _surface_results(found, cp)
    emulated = hasattr(cp, "_LIBRARY")
    for name, value in expected.items():
        if emulated or name in ("accepted_lengths", "num_accepted"):
            np.testing.assert_array_equal(found[name], value, err_msg=name)
    synchronize(cp)


def test_cuda_chain_kernel_without_its_adjustments_differs(cp):
    """Negative control: the same calls with the settings dropped on the kernel side (the
    launcher passes none) no longer give the NumPy results."""
    differs = []
    for group in ("masks", "context"):
        host = surface_case(stable_seed("surface", "rejection", group), np.float32, group)
        expected = _surface_results(specdec_np.verify_ragged(**host), cp)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_cuda, "_guard_adjustments", lambda *arguments: (None,) * 4)
            found = _surface_results(
                specdec_np.verify_ragged(**_surface_on_device(cp, host)), cp
            )
        differs.append(any(
            not np.array_equal(found[name], expected[name], equal_nan=True)
            for name in ("output_token_ids", "accepted_lengths", "logprobs")
        ))
    assert all(differs)
    synchronize(cp)


def test_cuda_chain_surface_refuses_the_numpy_temperatures(cp):
    """The temperatures' overflow check reads CuPy rows adjusted on the device (a bias can
    make or unmake an overflow): the same refusals, worded alike, as the NumPy call."""
    host = surface_case(stable_seed("surface", "overflow"), np.float32, "masks")
    host["logit_bias"] = [{5: 30.0}, None, {1: -10.0}, None]
    messages = []
    # Below 8.8e-38 a logit of 30 overflows float32 when divided; the rows' own largest
    # logits (about 10) only below 3e-38: at 6e-38 the bias alone makes the overflow.
    for scale in (2e-37, 6e-38):
        host["temperature"] = np.array([scale, 0.0, scale, 1.0])
        found = []
        for arguments in (host, _surface_on_device(cp, host)):
            try:
                specdec_np.verify_ragged(**arguments)
                found.append(None)
            except ValueError as error:
                found.append(str(error))
        assert found[0] == found[1]
        messages.append(found[0])
    assert messages[0] is None and messages[1] is not None
    synchronize(cp)


def surface_tree_case(seed):
    """``tree_logits_case`` (float32, draft logits) with every row setting on: a bitmask per
    target row, a bias, allowed ids, the penalties over the ancestors, bad words and a
    minimum length."""
    case = tree_logits_case(seed, np.float32, np.int64, True)
    rng = np.random.default_rng(seed + 2)
    rows = case["target_logits"].shape[0]
    mask = rng.integers(-(2**31), 2**31 - 1, (rows, 2)).astype(np.int32)
    mask[::4] = -1
    ids = case["draft_token_ids"]
    case.update(
        token_bitmask=mask,
        logit_bias=[{1: 2.0}, {int(ids[0]): 3.0, 5: -2.0}, None, {0: 1.5}, None],
        allowed_token_ids=[None, None, list(range(20)), None, list(range(5, 37))],
        output_token_ids=[[1, 1], [int(ids[0])], [], [2], None],
        repetition_penalty=np.array([1.5, 1.2, 1.0, 0.7, 1.3]),
        frequency_penalty=np.array([0.3, 0.0, 0.5, -0.4, 0.2]),
        presence_penalty=np.array([0.0, 0.6, 0.1, 0.0, -0.3]),
        bad_words_token_ids=[None, [[int(ids[0]), int(ids[1])]], [[3]], None, [[4, 4]]],
        min_tokens=np.array([0, 2, 1, 3, 2]), stop_token_ids=[None, [5], [0, 1], [2], [6]],
        logprobs=1,
    )
    return case


@pytest.mark.parametrize("method", ["greedy", "specinfer", "traversal"])
def test_surface_in_the_cuda_tree_kernel_matches_numpy(cp, method):
    """The row settings applied inside the CUDA tree kernel give the NumPy call's (copied
    rows') nodes, tokens, stops and logprobs; the launch gets the adjustments."""
    case = surface_tree_case(stable_seed("surface tree", method))
    expected = specdec_np.verify_tree(**case, method=method)
    seen = []
    launch = _cuda.core_like.verify_trees

    def spy(*arguments, **options):
        seen.append(options)
        return launch(*arguments, **options)

    device = {**tree_on_device(cp, case), "token_bitmask": cp.asarray(case["token_bitmask"])}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_cuda.core_like, "verify_trees", spy)
        found = specdec_np.verify_tree(**device, method=method)
    assert seen and seen[-1].get("target_adjustments") is not None
    for name in ("accepted_nodes", "output_token_ids", "accepted_lengths", "finished",
                 "logprobs", "raw_logprobs", "top_token_ids", "top_logprobs"):
        value = getattr(found, name)
        assert isinstance(value, cp.ndarray), name
        if hasattr(cp, "_LIBRARY") or name in ("accepted_nodes", "accepted_lengths"):
            np.testing.assert_array_equal(cp.asnumpy(value), getattr(expected, name),
                                          err_msg=name)
    # Negative control: the same call with the settings dropped on the kernel side.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_cuda, "_guard_adjustments", lambda *arguments: (None,) * 4)
        dropped = specdec_np.verify_tree(**device, method=method)
    assert not np.array_equal(cp.asnumpy(dropped.output_token_ids), expected.output_token_ids)
    synchronize(cp)


def test_engine_verifier_surface_on_cupy_matches_numpy(cp):
    """``EngineVerifier`` with row settings on CuPy rows: the NumPy call's tokens, stops
    and metrics (the settings applied inside the CUDA chain kernel)."""
    runs = []
    for on_gpu in (False, True):
        host = surface_case(stable_seed("surface", "engine"), np.float32, "context")
        host["logit_bias"] = [{2: 1.5}, None, {0: -2.0}, {3: 1.0}]
        arguments = _surface_on_device(cp, host) if on_gpu else host
        verifier = specdec_np.EngineVerifier("rejection")
        result = _surface_results(verifier(**arguments), cp)
        runs.append((result, verifier.metrics))
    (cpu, cpu_metrics), (gpu, gpu_metrics) = runs
    for name, value in cpu.items():
        if hasattr(cp, "_LIBRARY") or name in ("accepted_lengths", "num_accepted"):
            np.testing.assert_array_equal(gpu[name], value, err_msg=name)
    assert gpu_metrics == cpu_metrics
    synchronize(cp)


@pytest.mark.parametrize("with_bitmask", [False, True], ids=["no_bitmask", "bitmask"])
def test_sparse_adjustments_of_cupy_rows_equal_numpy(cp, with_bitmask):
    """The adjustments of CuPy rows (touched columns gathered on the device, the minimum
    length's whole-row test run there) are the NumPy rows' on the device, and apply to the
    copied rows' bits; rows where only a stop token is possible keep it."""
    from specdec_np._layouts import row_adjustments as _row_adjustments
    from specdec_np._layouts import sampling as _sampling
    from specdec_np._layouts import surface as _surface

    rng = np.random.default_rng(stable_seed("sparse on cupy", with_bitmask))
    rows, vocab = 6, 40
    logits = (rng.normal(size=(rows, vocab)) * 2).astype(np.float32)
    logits[0, 1:] = -np.inf  # only the stop (token 0) is possible: it stays
    logits[1, 2:] = -np.inf  # token 1 is possible besides the stop
    logits[2, :] = -np.inf
    logits[2, [0, 33]] = 1.0  # possible elsewhere (outside the gathered columns)
    fields = {name: None for name in _sampling.SamplingParameters._fields}
    fields.update(min_tokens=np.full(rows, 3), stop_token_ids=[[0]] * rows)
    if with_bitmask:
        mask = np.full((rows, 2), -1, dtype=np.int32)
        mask[2, 1] = 0  # token 33 masked: row 2 keeps its stop
        fields["token_bitmask"] = mask
    found = []
    for xp, values in ((np, logits), (cp, cp.asarray(logits))):
        parameters = _sampling.SamplingParameters(**fields)
        if xp is cp and with_bitmask:
            parameters = parameters._replace(token_bitmask=cp.asarray(mask))
        surface = _surface.checked_surface(parameters, rows, vocab, rows, xp)
        contexts = _surface.independent_contexts(rows)
        chosen = np.arange(rows, dtype=np.int64)
        found.append(_row_adjustments.sparse_adjustments(values, chosen, chosen, contexts,
                                                         surface))
    host, device = found
    for name, expected in zip(host._fields, host):
        value = getattr(device, name)
        if expected is None:
            assert value is None, name
            continue
        assert isinstance(value, cp.ndarray), name
        np.testing.assert_array_equal(cp.asnumpy(value), expected, err_msg=name)
    adjusted = host.apply(logits)
    np.testing.assert_array_equal(cp.asnumpy(device.apply(cp.asarray(logits))), adjusted)
    assert adjusted[0, 0] == logits[0, 0] and adjusted[1, 0] == -np.inf
    assert (adjusted[2, 0] == -np.inf) != with_bitmask
