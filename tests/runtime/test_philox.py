"""Tests for the array-API Philox4x32-10 generator and the counter-based uniforms."""

from __future__ import annotations

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specdec_np._runtime.philox import DOMAIN_TAG, counter_uniforms, philox4x32_10

MASK32 = 0xFFFFFFFF

# Known-answer vectors: the three "philox4x32 10" rows of Random123's tests/kat_vectors,
# as cut-and-pasted by D. E. Shaw Research into DEShawResearch/Random123-Boost
# libs/random/test/test_philox.cpp (commit 916db91ae4c6fd8324ef054a518851321ab41f91) and
# DEShawResearch/fs123 core123/ut/ut_philox.cpp (commit
# 3ea43efd78b784cef36819ce4a9a25886a49ae3e); both copies agree with the rows below.
# Format: (counter[4], key[2], expected[4]).
KAT_VECTORS = [
    (
        (0x00000000, 0x00000000, 0x00000000, 0x00000000),
        (0x00000000, 0x00000000),
        (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    ),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

EDGE_U64 = [0, 1, 2**32 - 1, 2**32, 2**64 - 1]
u64 = st.one_of(st.sampled_from(EDGE_U64), st.integers(min_value=0, max_value=2**64 - 1))
u32 = st.integers(min_value=0, max_value=MASK32)

NAMESPACES = [pytest.param(np, id="numpy"), pytest.param(xps, id="array_api_strict")]


def to_numpy(a):
    return np.asarray(a)


def py_philox(counter, key):
    """Scalar Philox4x32-10 on Python ints: an independent cross-check of the array code."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & MASK32
            k1 = (k1 + 0xBB67AE85) & MASK32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
    return c0, c1, c2, c3


def words_to_uniform(wa, wb):
    """The documented 53-bit conversion, on Python ints."""
    return ((wa << 21) | (wb >> 11)) * 2.0**-53


def reference_uniform(seed, position, d):
    """Draw d of (seed, position), going through the public philox4x32_10 on one row."""
    counter = np.asarray(
        [[position & MASK32, position >> 32, d // 2, DOMAIN_TAG]], dtype=np.uint32
    )
    key = np.asarray([[seed & MASK32, seed >> 32]], dtype=np.uint32)
    w = [int(v) for v in philox4x32_10(counter, key)[0]]
    return words_to_uniform(w[0], w[1]) if d % 2 == 0 else words_to_uniform(w[2], w[3])


# --------------------------------------------------------------------------------------
# philox4x32_10
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("xp", NAMESPACES)
@pytest.mark.parametrize("counter, key, expected", KAT_VECTORS)
def test_philox_known_answers(xp, counter, key, expected):
    out = philox4x32_10(xp.asarray([counter], dtype=xp.uint32), xp.asarray([key], dtype=xp.uint32))
    assert out.dtype == xp.uint32
    assert out.shape == (1, 4)
    assert [int(v) for v in to_numpy(out)[0]] == list(expected)


@pytest.mark.parametrize("xp", NAMESPACES)
def test_philox_known_answers_batched(xp):
    # All vectors in one call, in both orders: a row must not see its neighbours.
    counters = [v[0] for v in KAT_VECTORS]
    keys = [v[1] for v in KAT_VECTORS]
    expected = np.asarray([v[2] for v in KAT_VECTORS], dtype=np.uint32)
    out = philox4x32_10(xp.asarray(counters, dtype=xp.uint32), xp.asarray(keys, dtype=xp.uint32))
    np.testing.assert_array_equal(to_numpy(out), expected)
    out_rev = philox4x32_10(
        xp.asarray(counters[::-1], dtype=xp.uint32), xp.asarray(keys[::-1], dtype=xp.uint32)
    )
    np.testing.assert_array_equal(to_numpy(out_rev), expected[::-1])


def test_py_reference_matches_known_answers():
    for counter, key, expected in KAT_VECTORS:
        assert py_philox(counter, key) == expected


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.tuples(u32, u32, u32, u32), st.tuples(u32, u32)), max_size=6))
def test_philox_matches_scalar_reference_on_both_namespaces(rows):
    counters = [r[0] for r in rows]
    keys = [r[1] for r in rows]
    expected = np.asarray([py_philox(c, k) for c, k in rows], dtype=np.uint32).reshape(-1, 4)
    c_np = np.asarray(counters, dtype=np.uint32).reshape(-1, 4)
    k_np = np.asarray(keys, dtype=np.uint32).reshape(-1, 2)
    out_np = philox4x32_10(c_np, k_np)
    out_xs = philox4x32_10(xps.asarray(c_np), xps.asarray(k_np))
    np.testing.assert_array_equal(out_np, expected)
    np.testing.assert_array_equal(to_numpy(out_xs), expected)


def test_philox_empty_batch():
    out = philox4x32_10(np.zeros((0, 4), dtype=np.uint32), np.zeros((0, 2), dtype=np.uint32))
    assert out.shape == (0, 4)
    assert out.dtype == np.uint32


def test_philox_rejects_bad_inputs():
    c = np.zeros((2, 4), dtype=np.uint32)
    k = np.zeros((2, 2), dtype=np.uint32)
    with pytest.raises(TypeError, match="counter"):
        philox4x32_10(c.astype(np.int64), k)
    with pytest.raises(TypeError, match="key"):
        philox4x32_10(c, k.astype(np.uint64))
    with pytest.raises(ValueError, match="counter"):
        philox4x32_10(np.zeros((2, 3), dtype=np.uint32), k)
    with pytest.raises(ValueError, match="key"):
        philox4x32_10(c, np.zeros((2, 3), dtype=np.uint32))
    with pytest.raises(ValueError, match="leading shape"):
        philox4x32_10(c, np.zeros((3, 2), dtype=np.uint32))
    with pytest.raises(TypeError, match="key"):
        philox4x32_10(c, xps.asarray(k))


# --------------------------------------------------------------------------------------
# counter_uniforms
# --------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(u64, u64), max_size=8),
    num_draws=st.integers(min_value=0, max_value=7),
)
@example(rows=[(s, p) for s in EDGE_U64 for p in EDGE_U64], num_draws=5)
def test_numpy_and_strict_bit_identical(rows, num_draws):
    seeds = [r[0] for r in rows]
    positions = [r[1] for r in rows]
    out_np = counter_uniforms(
        np.asarray(seeds, dtype=np.uint64), np.asarray(positions, dtype=np.uint64), num_draws
    )
    out_xs = counter_uniforms(
        xps.asarray(seeds, dtype=xps.uint64), xps.asarray(positions, dtype=xps.uint64), num_draws
    )
    assert out_xs.__array_namespace__() is xps
    assert out_xs.dtype == xps.float64
    assert out_np.dtype == np.float64
    assert out_np.shape == out_xs.shape == (len(rows), num_draws)
    # Compare the bit patterns, not just the values.
    np.testing.assert_array_equal(
        out_np.view(np.uint64), np.ascontiguousarray(to_numpy(out_xs)).view(np.uint64)
    )
    # The Python-sequence path gives the same bits as the array path.
    np.testing.assert_array_equal(counter_uniforms(seeds, positions, num_draws), out_np)


@settings(max_examples=60, deadline=None)
@given(seed=u64, position=u64, num_draws=st.integers(min_value=1, max_value=6))
def test_matches_documented_definition(seed, position, num_draws):
    out = counter_uniforms([seed], [position], num_draws)
    expected = [reference_uniform(seed, position, d) for d in range(num_draws)]
    assert out[0].tolist() == expected


@pytest.mark.parametrize("xp", NAMESPACES)
def test_first_two_draws_from_philox_output(xp):
    seed, position = 0x0123456789ABCDEF, 2**40 + 17
    counter = xp.asarray([[position & MASK32, position >> 32, 0, DOMAIN_TAG]], dtype=xp.uint32)
    key = xp.asarray([[seed & MASK32, seed >> 32]], dtype=xp.uint32)
    w = [int(v) for v in to_numpy(philox4x32_10(counter, key))[0]]
    out = counter_uniforms(
        xp.asarray([seed], dtype=xp.uint64), xp.asarray([position], dtype=xp.uint64), 2
    )
    assert to_numpy(out)[0].tolist() == [
        words_to_uniform(w[0], w[1]),
        words_to_uniform(w[2], w[3]),
    ]


def test_all_zero_seed_position_uses_domain_tag():
    # Seed 0 / position 0 must NOT be the all-zero KAT block: the tag is in counter word 3.
    out = counter_uniforms([0], [0], 2)
    kat0 = KAT_VECTORS[0][2]
    assert out[0, 0] != words_to_uniform(kat0[0], kat0[1])
    tagged = py_philox((0, 0, 0, DOMAIN_TAG), (0, 0))
    assert out[0].tolist() == [
        words_to_uniform(tagged[0], tagged[1]),
        words_to_uniform(tagged[2], tagged[3]),
    ]


def test_uniform_conversion_never_reaches_one():
    top = words_to_uniform(MASK32, MASK32)
    assert top < 1.0
    assert top == 1.0 - 2.0**-53
    assert words_to_uniform(0, 0) == 0.0


@pytest.mark.parametrize("xp", NAMESPACES)
def test_range_dtype_shape(xp):
    seeds = xp.asarray(list(range(50)), dtype=xp.uint64)
    positions = xp.asarray([3 * i + 2**33 for i in range(50)], dtype=xp.uint64)
    out = counter_uniforms(seeds, positions, 9)
    assert out.shape == (50, 9)
    assert out.dtype == xp.float64
    arr = to_numpy(out)
    assert np.all(arr >= 0.0)
    assert np.all(arr < 1.0)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(u64, u64), min_size=1, max_size=8),
    num_draws=st.integers(min_value=0, max_value=5),
    data=st.data(),
)
def test_rows_independent_of_batch(rows, num_draws, data):
    seeds = np.asarray([r[0] for r in rows], dtype=np.uint64)
    positions = np.asarray([r[1] for r in rows], dtype=np.uint64)
    batch = counter_uniforms(seeds, positions, num_draws)
    for i in range(len(rows)):
        alone = counter_uniforms(seeds[i : i + 1], positions[i : i + 1], num_draws)
        np.testing.assert_array_equal(alone[0], batch[i])
    perm = np.asarray(data.draw(st.permutations(list(range(len(rows))))), dtype=np.intp)
    permuted = counter_uniforms(seeds[perm], positions[perm], num_draws)
    np.testing.assert_array_equal(permuted, batch[perm])


@settings(max_examples=40, deadline=None)
@given(seed=u64, position=u64, n=st.integers(min_value=0, max_value=9), extra=st.integers(1, 4))
def test_prefix_independent_of_num_draws(seed, position, n, extra):
    short = counter_uniforms([seed], [position], n)
    long = counter_uniforms([seed], [position], n + extra)
    np.testing.assert_array_equal(short, long[:, :n])


def test_different_positions_and_seeds_give_different_values():
    positions = np.arange(1000, dtype=np.uint64) + np.uint64(2**32 - 500)
    out = counter_uniforms(np.full(1000, 7, dtype=np.uint64), positions, 4)
    assert len(np.unique(out)) == out.size
    by_seed = counter_uniforms(np.arange(1000, dtype=np.uint64), np.zeros(1000, np.uint64), 4)
    assert len(np.unique(by_seed)) == by_seed.size
    # Seeds that differ only in the high word must differ too.
    hi = counter_uniforms([1, 1 + 2**32], [5, 5], 2)
    assert not np.any(hi[0] == hi[1])


def test_crude_uniformity():
    # 1000 rows x 100 draws = 10**5 values; fixed inputs, so the test is deterministic.
    seeds = np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    positions = np.arange(1000, dtype=np.uint64) % np.uint64(37)
    u = counter_uniforms(seeds, positions, 100).ravel()
    assert u.size == 10**5
    assert abs(u.mean() - 0.5) < 0.01
    counts = np.bincount(np.floor(u * 10).astype(np.int64), minlength=10)
    assert counts.size == 10
    expected = u.size / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 99.9th percentile of chi-square with 9 degrees of freedom.
    assert chi2 < 27.88, (chi2, counts)


@pytest.mark.parametrize("xp", NAMESPACES)
@pytest.mark.parametrize("num_draws", [0, 1, 4])
def test_empty_batch_and_zero_draws(xp, num_draws):
    empty = counter_uniforms(
        xp.asarray([], dtype=xp.uint64), xp.asarray([], dtype=xp.uint64), num_draws
    )
    assert empty.shape == (0, num_draws)
    assert empty.dtype == xp.float64
    some = counter_uniforms(xp.asarray([1, 2, 3]), xp.asarray([4, 5, 6]), 0)
    assert some.shape == (3, 0)


@pytest.mark.parametrize("xp", NAMESPACES)
@pytest.mark.parametrize("dtype_name", ["int8", "int16", "int32", "int64", "uint8", "uint32"])
def test_any_integer_dtype_same_values(xp, dtype_name):
    dtype = getattr(xp, dtype_name)
    ref = counter_uniforms([0, 5, 100], [1, 2, 127], 3)
    out = counter_uniforms(
        xp.asarray([0, 5, 100], dtype=dtype), xp.asarray([1, 2, 127], dtype=dtype), 3
    )
    np.testing.assert_array_equal(to_numpy(out), ref)


def test_int64_large_nonnegative_values():
    big = 2**63 - 1
    out = counter_uniforms(np.asarray([big], np.int64), np.asarray([big], np.int64), 3)
    np.testing.assert_array_equal(out, counter_uniforms([big], [big], 3))


def test_explicit_namespace():
    out = counter_uniforms([1, 2], [3, 4], 3, xp=xps)
    assert out.__array_namespace__() is xps
    np.testing.assert_array_equal(to_numpy(out), counter_uniforms([1, 2], [3, 4], 3))
    mixed = counter_uniforms(xps.asarray([1, 2]), [3, 4], 3)
    assert mixed.__array_namespace__() is xps


def test_python_lists_give_numpy():
    out = counter_uniforms([1, 2**64 - 1], [0, 2**64 - 1], 2)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float64


def test_does_not_touch_global_random_state():
    before = np.random.get_state()  # noqa: NPY002 - the global state is what we guard
    counter_uniforms(np.arange(10, dtype=np.uint64), np.arange(10, dtype=np.uint64), 10)
    after = np.random.get_state()  # noqa: NPY002
    assert before[0] == after[0]
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]


@pytest.mark.parametrize("xp", NAMESPACES)
def test_validation_errors(xp):
    ok = xp.asarray([1, 2], dtype=xp.int64)
    with pytest.raises(ValueError, match="seeds"):
        counter_uniforms(xp.asarray([1, -1], dtype=xp.int64), ok, 2)
    with pytest.raises(ValueError, match="positions"):
        counter_uniforms(ok, xp.asarray([-5, 0], dtype=xp.int32), 2)
    with pytest.raises(TypeError, match="positions"):
        counter_uniforms(ok, xp.asarray([1.0, 2.0], dtype=xp.float64), 2)
    with pytest.raises(TypeError, match="seeds"):
        counter_uniforms(xp.asarray([1.0, 2.0], dtype=xp.float32), ok, 2)
    with pytest.raises(TypeError, match="seeds"):
        counter_uniforms(xp.asarray([True, False]), ok, 2)
    with pytest.raises(ValueError, match="same length"):
        counter_uniforms(ok, xp.asarray([1, 2, 3]), 2)
    with pytest.raises(ValueError, match="seeds"):
        counter_uniforms(xp.reshape(ok, (1, 2)), xp.reshape(ok, (1, 2)), 2)


def test_validation_errors_python_sequences():
    with pytest.raises(ValueError, match="seeds"):
        counter_uniforms([-1], [0], 1)
    with pytest.raises(ValueError, match="seeds"):
        counter_uniforms([2**64], [0], 1)
    with pytest.raises(ValueError, match="positions"):
        counter_uniforms([0], [2**64], 1)
    with pytest.raises(TypeError, match="positions"):
        counter_uniforms([0], [1.5], 1)
    with pytest.raises(TypeError, match="seeds"):
        counter_uniforms([True], [1], 1)
    with pytest.raises(TypeError, match="seeds"):
        counter_uniforms(3, [1], 1)
    with pytest.raises(ValueError, match="num_draws"):
        counter_uniforms([0], [0], -1)
    with pytest.raises(TypeError, match="num_draws"):
        counter_uniforms([0], [0], 2.0)


@pytest.mark.gpu
def test_cupy_bit_identical_to_numpy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # no driver / runtime
        pytest.skip(f"CuPy unusable: {exc}")
    seeds = np.asarray(EDGE_U64 + [12345, 2**63], dtype=np.uint64)
    positions = np.asarray(EDGE_U64[::-1] + [0, 2**40], dtype=np.uint64)
    ref = counter_uniforms(seeds, positions, 11)
    out = counter_uniforms(cp.asarray(seeds), cp.asarray(positions), 11)
    assert isinstance(out, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint64), ref.view(np.uint64))
    counters = np.asarray([v[0] for v in KAT_VECTORS], dtype=np.uint32)
    keys = np.asarray([v[1] for v in KAT_VECTORS], dtype=np.uint32)
    kat = philox4x32_10(cp.asarray(counters), cp.asarray(keys))
    np.testing.assert_array_equal(
        cp.asnumpy(kat), np.asarray([v[2] for v in KAT_VECTORS], dtype=np.uint32)
    )
