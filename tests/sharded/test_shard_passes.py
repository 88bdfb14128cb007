"""The compiled passes of a rank over its slice of columns (``shardscan.h`` through
``specdec_np._core``): the statistics of the maxima round, the weights' pass given the
row's maximum, the entries at a threshold, the law's elementwise weight and the stored
probabilities of the draws' rows, a draw's masses and its scan, and the greedy argmax;
and the host side of the filters' rounds (the keys of float values and back, a rank's
lists, the merge of the ranks' lists, top-k's, min-p's and top-p's keys); each against an
exact NumPy oracle or the reference exponential, with negative controls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_np import _core
from specdec_np._reference.chains import fast_expf

DTYPES = [np.float32, np.float64]


def _bits(array):
    return array.view(np.uint32 if array.dtype == np.float32 else np.uint64)


def _libm_exp(x):
    """float64 ``exp`` by libm (``math.exp``), the law's for float64 rows: NumPy's own
    loop may differ by an ulp (its AVX-512 loop does on some inputs)."""
    values = np.asarray(x, dtype=np.float64)
    return np.array([_libm_exp_one(v) for v in values.ravel().tolist()],
                    dtype=np.float64).reshape(values.shape)  # fmt: skip


def _libm_exp_one(value):
    try:
        return math.exp(value)  # NaN stays NaN
    except OverflowError:
        return math.inf


def _rows(dtype, num_rows, width, seed):
    """Random rows with NaN, +inf, -inf, signed zeros and a row of -inf alone."""
    rng = np.random.default_rng(seed)
    rows = (rng.standard_normal((num_rows, width)) * 4).astype(dtype)
    if width >= 12:
        rows[1, [3, 7]] = np.nan
        rows[2, [5, 9]] = np.inf
        rows[3, :] = -np.inf
        rows[4, [0, 2]] = -np.inf
        rows[5, [1, 4]] = [-0.0, 0.0]
        rows[6, :] = np.nan
        rows[7, [2, 11]] = rows[7, [2, 11]].max() + 1  # a tie at the maximum
    return rows


def _weights_oracle(z, z_max, cutoff):
    """``w = exp(z - z_max)`` by the law's rule where ``z >= cutoff``, else 0."""
    shifted = z - z_max[:, None]
    if z.dtype == np.float32:
        w = fast_expf(shifted)
    else:
        with np.errstate(invalid="ignore"):
            w = np.where(np.isnan(shifted), 0.0, _libm_exp(shifted))
    return np.where(z >= cutoff[:, None], w, 0).astype(z.dtype)


def _lane_sum(w):
    """The law's sum of a row: eight float64 lanes (entries 8 i + l, each in order),
    combined as ((L0 + L4) + (L1 + L5)) + ((L2 + L6) + (L3 + L7))."""
    lanes = [float(np.cumsum(w[lane::8].astype(np.float64))[-1]) if w[lane::8].size else 0.0
             for lane in range(8)]
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + (
        (lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [0, 1, 13, 100, 1001])
def test_stats_are_the_maxima_of_the_slice(dtype, width):
    rows = _rows(dtype, 8, width, seed=width)
    temperature = np.array([0.8, 1, 1, 2, 0.5, 1.3, 1, 0.7], dtype=dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = rows / temperature[:, None]
    finite = np.where(np.isfinite(rows), rows, -np.inf)
    expected = np.stack([
        np.fmax.reduce(z, axis=1, initial=-np.inf).astype(np.float64),
        np.count_nonzero(z == np.inf, axis=1).astype(np.float64),
        finite.max(axis=1, initial=-np.inf).astype(np.float64),
    ], axis=1)
    for groups in sorted({0, 1, 5, width // 2}):
        if 2 * groups > width:
            continue
        stats = np.zeros((8, 3))
        group_max = np.zeros((8, groups), dtype=dtype)
        _core.shard_stats(rows, temperature, groups, stats, group_max)
        np.testing.assert_array_equal(stats, expected)
        run = width // groups if groups else 0
        sets = rows[:, : groups * run].reshape(8, run, groups)
        np.testing.assert_array_equal(
            group_max, np.fmax.reduce(sets, axis=1, initial=-np.inf) if groups else group_max
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_weights_pass_is_the_laws(dtype):
    rows = _rows(dtype, 8, 1003, seed=3)
    # The law weighs rows with +inf entries or without mass apart: plain rows there.
    rows[[2, 3, 6]] = np.random.default_rng(4).standard_normal((3, 1003)).astype(dtype)
    temperature = np.array([0.8, 1, 1, 2, 0.5, 1.3, 1, 0.7], dtype=dtype)
    z = rows / temperature[:, None]
    z_max = np.fmax.reduce(z, axis=1).astype(dtype)
    indices = np.array([0, 1, 2, 4, 5, 7], dtype=np.int64)
    for cutoff_value in (-np.inf, 0.5):
        cutoff = np.full(indices.size, cutoff_value, dtype=dtype)
        weights = np.empty((indices.size, rows.shape[1]), dtype=dtype)
        masses = np.zeros(indices.size)
        _core.shard_weights(rows, indices, temperature[indices], z_max[indices], cutoff,
                            weights, masses)
        expected = _weights_oracle(z[indices], z_max[indices], cutoff)
        np.testing.assert_array_equal(_bits(weights), _bits(expected))
        assert masses.tolist() == [_lane_sum(row) for row in expected]
    # Negative control: NumPy's pairwise sum of the same weights is another order, and the
    # oracle tells them apart on wide float64 rows (float32 weights of a narrow range sum
    # exactly in float64 in any order, so their sums agree).
    wide = np.random.default_rng(5).standard_normal((16, 4099))
    weights = np.empty_like(wide)
    masses = np.zeros(16)
    ones = np.ones(16)
    _core.shard_weights(wide, np.arange(16, dtype=np.int64), ones, wide.max(axis=1),
                        np.full(16, -np.inf), weights, masses)
    assert masses.tolist() == [_lane_sum(row) for row in weights]
    assert masses.tolist() != weights.sum(axis=1, dtype=np.float64).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_at_least_finds_the_entries_at_a_threshold(dtype):
    rows = _rows(dtype, 8, 517, seed=6)
    temperature = np.array([0.8, 1, 1, 2, 0.5, 1.3, 1, 0.7], dtype=dtype)
    z = rows / temperature[:, None]
    indices = np.array([7, 0, 2, 3, 4, 5, 6, 1], dtype=np.int64)  # any order
    # Thresholds at an entry's z exactly (ties kept), between entries, -inf, NaN, +inf.
    thresholds = np.array([z[7, 2], z[0, 10], np.inf, -np.inf, 1.5, 0.0, np.nan,
                           np.nextafter(z[1, 0], dtype(np.inf))], dtype=dtype)
    counts = np.zeros(indices.size, dtype=np.int64)
    width = rows.shape[1]
    # Too little room: every row is counted, and a call with the room it names writes all.
    small = np.empty(width, dtype=np.int64), np.empty(width, dtype=dtype)
    total, written = _core.shard_at_least(rows, indices, temperature[indices], thresholds,
                                          counts, *small)
    assert not written
    columns = np.empty(total + width + 1, dtype=np.int64)
    values = np.empty(total + width + 1, dtype=dtype)
    assert _core.shard_at_least(rows, indices, temperature[indices], thresholds, counts,
                                columns, values) == (total, True)
    kept = z[indices] >= thresholds[:, None]
    position, column = np.nonzero(kept)
    np.testing.assert_array_equal(counts, kept.sum(axis=1))
    np.testing.assert_array_equal(columns[:total], column)
    np.testing.assert_array_equal(_bits(values[:total]), _bits(z[indices][position, column]))
    assert counts[0] >= 2 and counts[2] == 2 and counts[6] == 0  # the ties, the +inf entries
    # Negative control: one step above a tied threshold drops the tie.
    above = thresholds.copy()
    above[0] = np.nextafter(above[0], dtype(np.inf))
    fewer = np.zeros(indices.size, dtype=np.int64)
    _core.shard_at_least(rows, indices, temperature[indices], above, fewer, *small)
    assert fewer[0] < counts[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_shard_exp_is_the_laws_weight(dtype):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(3001) * 40, [0.0, -0.0, np.nan, -np.inf, np.inf,
                                                         -104.0, -103.99, 88.0, 89.0]])
    x = x.astype(dtype)
    top = np.full(x.size, 1.5, dtype=dtype)
    out = np.empty_like(x)
    _core.shard_exp(x, top, out)
    expected = _weights_oracle(x[None, :], top[:1], np.full(1, -np.inf, dtype=dtype))[0]
    np.testing.assert_array_equal(_bits(out), _bits(expected))


@pytest.mark.parametrize("dtype", DTYPES)
def test_divided_rows_are_the_kernels_stored_probabilities(dtype):
    rng = np.random.default_rng(8)
    weights = rng.random((5, 333)).astype(dtype)
    weights[1, :5] = 0.0
    divisors = np.array([3.7, 0.3, np.inf, 123.456, 1.0])
    out = np.full((7, 333), np.nan)
    out_rows = np.array([6, 0, 2, 3, 4], dtype=np.int64)
    indices = np.array([4, 1, 0, 2, 3], dtype=np.int64)
    _core.shard_divided(weights, indices, divisors, out, out_rows)
    expected = (weights[indices].astype(np.float64) / divisors[:, None]).astype(dtype)
    np.testing.assert_array_equal(out[out_rows], expected.astype(np.float64))
    assert np.isnan(out[[1, 5]]).all()  # rows not asked for are left alone
    if dtype == np.float32:
        # Negative control: without the rounding to float32 the values differ.
        assert not np.array_equal(out[out_rows], weights[indices] / divisors[:, None])


def test_a_draws_masses_and_scan_are_numpys():
    rng = np.random.default_rng(9)
    for width in [*range(1, 140, 7), 255, 256, 257, 1000, 8193, 20011]:
        rows = rng.standard_normal((6, width)) * np.array([[1e-3], [1], [1e9], [1], [1], [1]])
        rows[3, ::3] = np.nan
        rows[4] = -1.0  # no mass
        sums = np.zeros(6)
        _core.shard_positive_sums(rows, sums)
        positive = np.where(rows > 0.0, rows, 0.0)
        assert sums.tolist() == positive.sum(axis=1).tolist(), width
        inside = rng.random(6) * sums
        inside[5] = 2 * sums[5]  # rounding runs past the row: its last positive entry
        found = np.zeros(6, dtype=np.int64)
        _core.shard_first_crossings(rows, np.arange(6, dtype=np.int64), inside, found)
        hits = (np.cumsum(positive, axis=1) > inside[:, None]) & (positive > 0.0)
        last = width - 1 - np.argmax((positive > 0.0)[:, ::-1], axis=1)
        expected = np.where(hits.any(axis=1), np.argmax(hits, axis=1), last)
        np.testing.assert_array_equal(found, expected)
    # Negative control: a sequential sum is another order, and the comparison sees it.
    wide = rng.random((8, 5000))
    sequential = np.cumsum(wide, axis=1)[:, -1]
    _core.shard_positive_sums(wide, sums := np.zeros(8))
    assert sums.tolist() != sequential.tolist()


def test_residuals_are_the_positive_part_of_rho_p_minus_q():
    rng = np.random.default_rng(10)
    p = rng.random((5, 301))
    p[0, :4] = [np.nan, 0.0, 1.0, 2.0]
    q = rng.random((3, 301))
    q[1, 7] = np.inf  # a point-mass draft's token
    rows = np.array([4, 0, 2], dtype=np.int64)
    scale = np.array([1.0, 0.7, 1.3])
    residual = p.copy()
    _core.shard_residuals(residual, rows, scale, q)
    expected = p.copy()
    expected[rows] = np.maximum(scale[:, None] * p[rows] - q, 0.0)
    # Equal but for the sign of a zero, and NaN where NumPy's maximum keeps it.
    np.testing.assert_array_equal(residual, expected)
    assert np.isnan(residual[0, 0]) and residual[0, 7] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_is_the_first_largest_entry(dtype):
    rows = _rows(dtype, 8, 4100, seed=11)
    rows[0, [5, 4000]] = rows[0].max() + 1  # a tie: the first column
    rows[5, :] = -np.inf
    rows[5, [3, 9]] = [-0.0, 0.0]  # equal zeros: the first
    table = np.zeros((8, 2))
    _core.shard_argmax(rows, 1000, table)
    clean = np.where(np.isnan(rows), -np.inf, rows)
    first = np.argmax(clean, axis=1)
    np.testing.assert_array_equal(table[:, 1], first + 1000)
    np.testing.assert_array_equal(table[:, 0], clean[np.arange(8), first])
    assert table[0, 1] == 1005 and table[5, 1] == 1003 and table[6].tolist() == [-np.inf, 1000]
    # Negative control: NumPy's own argmax lets a NaN win.
    assert np.argmax(rows[1]) != first[1]


def test_bad_rows_and_shapes_are_refused():
    rows = np.zeros((3, 16), dtype=np.float32)
    one = np.ones(1, dtype=np.float32)
    with pytest.raises(ValueError, match="outside the block"):
        _core.shard_weights(rows, np.array([3], dtype=np.int64), one, one, one,
                            np.zeros((1, 16), dtype=np.float32), np.zeros(1))
    with pytest.raises(ValueError, match="groups"):
        _core.shard_stats(rows, np.ones(3, dtype=np.float32), 9, np.zeros((3, 3)),
                          np.zeros((3, 9), dtype=np.float32))
    with pytest.raises(ValueError, match="shorter than the row indices"):
        _core.shard_at_least(rows, np.array([0, 1], dtype=np.int64), one, one,
                             np.zeros(2, dtype=np.int64), np.zeros(40, dtype=np.int64),
                             np.zeros(40, dtype=np.float32))


# The filters' host work: the NumPy expressions the compiled functions replace are the
# oracles.


def _keys_oracle(values):
    values = values + values.dtype.type(0)
    if values.dtype == np.float32:
        bits = values.view(np.uint32).astype(np.uint64)
        sign, full = np.uint64(1 << 31), np.uint64(0xFFFFFFFF)
    else:
        bits = values.view(np.uint64)
        sign, full = np.uint64(1 << 63), np.uint64(0xFFFFFFFFFFFFFFFF)
    return np.where((bits & sign) != 0, full ^ bits, bits | sign)


def _values_oracle(keys, dtype):
    if dtype == np.float32:
        sign, full = np.uint64(1 << 31), np.uint64(0xFFFFFFFF)
        bits = np.where((keys & sign) != 0, keys ^ sign, full ^ keys)
        return bits.astype(np.uint32).view(np.float32)
    sign, full = np.uint64(1 << 63), np.uint64(0xFFFFFFFFFFFFFFFF)
    return np.where((keys & sign) != 0, keys ^ sign, full ^ keys).view(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_float_keys_order_the_values_and_come_back(dtype):
    rng = np.random.default_rng(5)
    info = np.finfo(dtype)
    values = np.concatenate([
        np.array([0.0, -0.0, np.inf, -np.inf, info.max, -info.max, info.tiny / 4,
                  -info.tiny / 4, info.tiny, -info.tiny], dtype=dtype),
        (rng.standard_normal(500) * 30).astype(dtype),
    ])
    keys = np.empty(values.size, dtype=np.uint64)
    _core.float_keys(values, keys)
    np.testing.assert_array_equal(keys, _keys_oracle(values))
    order = np.argsort(values, kind="stable")
    assert (np.diff(keys[order].astype(np.float64)) >= 0).all()
    assert keys[0] == keys[1]  # -0 and +0
    # Back: every key of the values, random keys (a float32 key's low 32 bits) and key 0.
    bits = 32 if dtype == np.float32 else 63
    asked = np.concatenate([keys, rng.integers(0, 2**bits, 300, dtype=np.uint64),
                            np.zeros(1, dtype=np.uint64)])
    back = np.empty(asked.size, dtype=dtype)
    _core.key_floats(asked, back)
    np.testing.assert_array_equal(_bits(back), _bits(_values_oracle(asked, dtype)))
    np.testing.assert_array_equal(_bits(back[1:values.size]), _bits(values[1:] + dtype(0)))
    # Negative control: keys of the bits alone do not order negative values.
    assert not np.array_equal(keys, values.view(np.uint32 if bits == 32 else np.uint64))


def _merged(gathered: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_core.merge_shard_lists`` of the ranks' lists ``[ranks, rows, size + 1]``: the
    merged keys and counts ``[rows, ranks * (size + 1)]`` and each row's known count."""
    ranks, count = gathered.shape[:2]
    length = ranks * size + ranks
    keys = np.empty((count, length), dtype=np.uint64)
    counts = np.empty((count, length), dtype=np.int64)
    known = np.empty(count, dtype=np.uint64)
    _core.merge_shard_lists(gathered, size, keys, counts, known)
    return keys, counts, known


def _merge_oracle(gathered, size):
    ranks, count = gathered.shape[0], gathered.shape[1]
    keys = gathered[:, :, :size]
    sent = np.count_nonzero(keys, axis=2)
    full = sent == size
    last = np.take_along_axis(keys, np.maximum(sent - 1, 0)[:, :, None], axis=2)[:, :, 0]
    last = np.where(sent > 0, last, np.uint64(0))
    extra = np.where(full, gathered[:, :, size].astype(np.int64) - size, 0)
    known = np.where(full, last, np.uint64(0)).max(axis=0)
    all_keys = np.concatenate([keys.transpose(1, 0, 2).reshape(count, ranks * size),
                               np.where(extra > 0, last, np.uint64(0)).T], axis=1)
    all_counts = np.concatenate(
        [(keys > 0).astype(np.int64).transpose(1, 0, 2).reshape(count, ranks * size),
         np.maximum(extra, 0).T], axis=1)
    order = np.argsort(all_keys, axis=1, kind="stable")[:, ::-1]
    return (np.take_along_axis(all_keys, order, axis=1),
            np.take_along_axis(all_counts, order, axis=1), known)


def test_merged_lists_and_top_k_floors_are_the_numpy_expressions():
    rng = np.random.default_rng(6)
    for _ in range(200):
        ranks, count, size = (int(value) for value in rng.integers(1, [5, 6, 10]))
        gathered = np.zeros((ranks, count, size + 1), dtype=np.uint64)
        for rank in range(ranks):
            for row in range(count):
                sent = int(rng.integers(0, size + 1))
                # Few distinct keys: ties inside a list, across lists and with the extras;
                # now and then a list out of order (the general sort's path).
                sent_keys = np.sort(rng.integers(1, 12, sent))[::-1]
                if rng.random() < 0.1:
                    sent_keys = rng.permutation(sent_keys)
                gathered[rank, row, :sent] = sent_keys
                gathered[rank, row, size] = sent + (rng.integers(0, 3) if sent == size else 0)
        keys, counts, known = _merged(gathered, size)
        expected = _merge_oracle(gathered, size)
        for found, wanted in zip((keys, counts, known), expected, strict=True):
            np.testing.assert_array_equal(found, wanted)
        top_k = rng.integers(1, 3 * size + 3, count)
        on = rng.random(count) < 0.8
        floors = np.empty(count, dtype=np.uint64)
        _core.top_k_keys(keys, counts, top_k, on.view(np.uint8), floors)
        running = np.cumsum(counts, axis=1)
        reached = running >= top_k[:, None]
        wanted = keys[np.arange(count), np.argmax(reached, axis=1)]
        np.testing.assert_array_equal(
            floors, np.where(on & reached.any(axis=1), wanted, np.uint64(0)))
    # Equal keys come by descending place: the extra entry (a full list's ties beyond the
    # one sent, count 2) first.  Negative control: the lists' own order puts it last.
    gathered = np.array([[[5, 5, 4]], [[5, 0, 1]]], dtype=np.uint64)
    keys = np.empty((1, 6), dtype=np.uint64)
    counts = np.empty((1, 6), dtype=np.int64)
    _core.merge_shard_lists(gathered, 2, keys, counts, np.empty(1, dtype=np.uint64))
    np.testing.assert_array_equal(keys[0], [5, 5, 5, 5, 0, 0])
    np.testing.assert_array_equal(counts[0], [2, 1, 1, 1, 0, 0])
    forward = np.array([1, 1, 1, 2])  # entries of key 5 in the order they were sent
    assert not np.array_equal(forward, counts[0, :4])
    with pytest.raises(ValueError, match="merge_shard_lists"):
        _core.merge_shard_lists(gathered, 3, keys, counts, np.empty(1, dtype=np.uint64))


def _law_weights_oracle(values, top):
    """float64 ``exp(values - top)`` by the law's rule (0 for NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = values - top
        if values.dtype == np.float32:
            return fast_expf(shifted).astype(np.float64)
        return np.where(np.isnan(shifted), 0.0, _libm_exp(shifted))


def _min_p_oracle(top, min_p):
    dtype = top.dtype
    low = _keys_oracle(np.full(top.shape, -np.inf, dtype=dtype))
    high = _keys_oracle(top)
    estimate = (top.astype(np.float64) + np.log(min_p)).astype(dtype)
    centre = _keys_oracle(np.where(np.isnan(estimate), top, estimate))
    centre = np.minimum(np.maximum(centre, low + np.uint64(9)), high)
    window = np.minimum(centre[:, None] - np.uint64(8) + np.arange(17, dtype=np.uint64),
                        high[:, None])
    reached = _law_weights_oracle(_values_oracle(window, dtype), top[:, None]) >= min_p[:, None]
    first = np.argmax(reached, axis=1)
    lost = ~reached.any(axis=1) | ((first == 0) & (window[:, 0] > low + np.uint64(1)))
    return window[np.arange(top.size), first], lost


@pytest.mark.parametrize("dtype", DTYPES)
def test_min_p_keys_are_the_window_search(dtype):
    rng = np.random.default_rng(7)
    info = np.finfo(dtype)
    top = np.concatenate([np.array([0.0, -0.0, info.max, -info.max, info.tiny], dtype=dtype),
                          (rng.standard_normal(995) * 20).astype(dtype)])
    min_p = np.concatenate([[1.0, 1e-300, 1e-40, 0.5, 1e-8], rng.random(995)])
    floors = np.empty(top.size, dtype=np.uint64)
    lost = np.empty(top.size, dtype=np.uint8)
    _core.min_p_keys(top, min_p, np.log(min_p), floors, lost)
    wanted, wanted_lost = _min_p_oracle(top, min_p)
    np.testing.assert_array_equal(floors, wanted)
    np.testing.assert_array_equal(lost.view(bool), wanted_lost)
    # Where the window holds the crossing, the floor's weight reaches min_p and the key
    # below it does not (negative control: the key below is never the floor).
    held = ~wanted_lost
    weight = _law_weights_oracle(_values_oracle(floors[held], dtype), top[held])
    below = _law_weights_oracle(_values_oracle(floors[held] - np.uint64(1), dtype), top[held])
    assert (weight >= min_p[held]).all() and (below < min_p[held]).all()


def _top_p_oracle(keys, counts, known, floors, top, top_p, masses):
    entry = (keys >= floors[:, None]) & (counts > 0)
    mass = np.zeros(keys.shape)
    at = np.nonzero(entry)
    mass[at] = _law_weights_oracle(_values_oracle(keys[at], top.dtype), top[at[0]]) * counts[at]
    whole = floors >= known
    total = np.where(whole, mass.sum(axis=1), masses)
    running = np.cumsum(mass, axis=1)
    reached = (running >= (top_p * total)[:, None]) & (mass > 0.0) & (keys >= known[:, None])
    with_mass = mass > 0.0
    last = with_mass.shape[1] - 1 - np.argmax(with_mass[:, ::-1], axis=1)
    settled = reached.any(axis=1)
    cutoffs = keys[np.arange(keys.shape[0]), np.where(settled, np.argmax(reached, axis=1), last)]
    unsettled = ~settled & ~whole
    return np.where(unsettled, np.uint64(0), cutoffs), unsettled


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_p_keys_are_the_running_mass_cutoffs(dtype):
    rng = np.random.default_rng(8)
    for trial in range(60):
        ranks = int(rng.integers(1, 4))
        size = int(rng.integers(1, 12)) if trial % 3 else int(rng.integers(40, 129))
        count = int(rng.integers(1, 6))
        gathered = np.zeros((ranks, count, size + 1), dtype=np.uint64)
        for rank in range(ranks):
            for row in range(count):
                sent = int(rng.integers(0, size + 1))
                values = np.round(rng.standard_normal(sent) * 3, 1).astype(dtype)  # ties
                gathered[rank, row, :sent] = np.sort(_keys_oracle(values))[::-1]
                gathered[rank, row, size] = sent + (rng.integers(0, 3) if sent == size else 0)
        keys, counts, known = _merged(gathered, size)
        top = np.where(keys[:, 0] > 0, _values_oracle(keys[:, 0], dtype), 0).astype(dtype)
        floors = np.where(rng.random(count) < 0.5, np.uint64(0),
                          keys[np.arange(count), rng.integers(0, keys.shape[1], count)])
        top_p, masses = rng.random(count), rng.random(count) * 5
        cutoffs = np.empty(count, dtype=np.uint64)
        unsettled = np.empty(count, dtype=np.uint8)
        _core.top_p_keys(keys, counts, known, floors, top, top_p, masses, cutoffs, unsettled)
        wanted, wanted_open = _top_p_oracle(keys, counts, known, floors, top, top_p, masses)
        np.testing.assert_array_equal(cutoffs, wanted)
        np.testing.assert_array_equal(unsettled.view(bool), wanted_open)
    # Negative control: the whole summed in column order differs from NumPy's pairwise
    # sum somewhere on rows this long, so the order matters and is the pairwise one.
    rows = rng.random((200, 258)) * np.exp(rng.standard_normal((200, 258)) * 8)
    assert (np.cumsum(rows, axis=1)[:, -1] != rows.sum(axis=1)).any()


def _record_oracle(row_of, values, count, size):
    keys = _keys_oracle(values)
    if values.dtype == np.float32:
        low = np.uint64(0xFFFFFFFF)
        composite = np.sort((row_of.astype(np.uint64) << np.uint64(32)) | (low - keys))
        row_of = (composite >> np.uint64(32)).astype(np.int64)
        keys = low - (composite & low)
    else:
        order = np.lexsort((~keys, row_of))
        row_of, keys = row_of[order], keys[order]
    first = np.searchsorted(row_of, np.arange(count + 1))
    position = np.arange(row_of.size) - first[row_of]
    chosen = position < size
    record = np.zeros((count, size + 1), dtype=np.uint32 if values.dtype == np.float32
                      else np.uint64)
    record[row_of[chosen], position[chosen]] = keys[chosen]
    sent = np.minimum(np.diff(first), size)
    last = np.where(sent > 0, record[np.arange(count), np.maximum(sent - 1, 0)], 0)
    at_or_above = np.bincount(row_of[keys >= last.astype(np.uint64)[row_of]],
                              minlength=count)[:count]
    record[:, size] = np.where(sent == size, at_or_above, sent)
    return record


@pytest.mark.parametrize("dtype", DTYPES)
def test_list_records_are_the_largest_keys_with_their_ties(dtype):
    rng = np.random.default_rng(9)
    for trial in range(60):
        count, size = int(rng.integers(1, 7)), int(rng.integers(1, 20))
        # Short rows are sorted by insertion, rows of over 256 entries by the C library.
        entries = int(rng.integers(0, 80 if trial % 3 else 2000))
        row_of = rng.integers(0, count, entries)  # rows in any order
        values = np.round(rng.standard_normal(entries) * 2, 1).astype(dtype)  # ties
        values[rng.random(entries) < 0.05] = -0.0
        values[rng.random(entries) < 0.05] = -np.inf
        record = np.zeros((count, size + 1), dtype=np.uint32 if dtype == np.float32
                          else np.uint64)
        _core.list_record(row_of, values, size, record)
        np.testing.assert_array_equal(record, _record_oracle(row_of, values, count, size))
    with pytest.raises(ValueError, match="outside"):
        _core.list_record(np.array([3]), np.zeros(1, dtype=dtype), 2,
                          np.zeros((3, 3), dtype=np.uint32 if dtype == np.float32
                                   else np.uint64))


@pytest.mark.parametrize("drafts", [True, False])
def test_rejection_lengths_accept_while_u_q_is_below_p(drafts):
    rng = np.random.default_rng(10)
    for _ in range(30):
        counts = rng.integers(0, 5, int(rng.integers(1, 7)))
        batch, total, max_k = counts.size, int(counts.sum()), int(counts.max())
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        first_target = offsets[:-1] + np.arange(batch)  # a bonus row after each request
        sampled = np.flatnonzero(rng.random(batch) < 0.8)
        # The rows read in a shuffled order, their probabilities with a NaN now and then.
        target_at = rng.permutation(total + batch).astype(np.int64)
        draft_at = (total + batch + rng.permutation(total)).astype(np.int64)
        value = rng.random(2 * total + batch)
        value[rng.random(value.size) < 0.05] = np.nan
        draft_ids = rng.integers(0, 100, total)
        uniforms = rng.random((batch, max_k + 2))
        output = np.full((batch, max_k + 1), -1, dtype=np.int64)
        lengths = np.zeros(batch, dtype=np.int64)
        _core.rejection_lengths(sampled, counts, first_target, target_at, offsets,
                                draft_at if drafts else np.full(total, -1), draft_ids,
                                value, uniforms, drafts, output, lengths)
        for b in range(batch):
            expected = counts[b] if b in sampled else 0
            for i in range(counts[b] if b in sampled else 0):
                p = value[target_at[first_target[b] + i]]
                q = value[draft_at[offsets[b] + i]] if drafts else 1.0
                if not uniforms[b, i] * q < p:
                    expected = i
                    break
            assert lengths[b] == expected
            wanted = np.full(max_k + 1, -1)
            wanted[:expected] = draft_ids[offsets[b]:offsets[b] + expected]
            np.testing.assert_array_equal(output[b], wanted)
    with pytest.raises(ValueError, match="not gathered"):
        _core.rejection_lengths(np.array([0]), np.array([1]), np.array([0]), np.array([5]),
                                np.array([0, 1]), np.array([0]), np.array([7]), np.ones(2),
                                np.zeros((1, 3)), True, np.zeros((1, 2), dtype=np.int64),
                                np.zeros(1, dtype=np.int64))


def test_draw_shards_are_the_cumulative_sums_crossing():
    rng = np.random.default_rng(11)
    for _ in range(40):
        ranks, count = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        masses = rng.random((ranks, count)) * np.exp(rng.standard_normal((ranks, count)) * 6)
        masses[rng.random((ranks, count)) < 0.3] = 0.0
        masses[:, 0] = 0.0  # a draw without mass
        order = rng.permutation(ranks).astype(np.int64)
        v = rng.random(count)
        v[-1] = 1.0 - 2**-53  # rounding may leave v M past every crossing
        rank = int(rng.integers(0, ranks))
        position = np.empty(count, dtype=np.int64)
        inside = np.empty(count)
        flags = np.zeros((2, count), dtype=np.uint8)
        _core.draw_shards(masses, order, v, rank, position, inside, flags[0], flags[1])
        running = np.cumsum(masses, axis=0)
        threshold = v * running[-1]
        crossing = (running > threshold) & (masses > 0.0)
        last = ranks - 1 - np.argmax((masses > 0.0)[::-1], axis=0)
        wanted = np.where(crossing.any(axis=0), np.argmax(crossing, axis=0), last)
        before = np.concatenate([np.zeros((1, count)), running[:-1]])[wanted, np.arange(count)]
        empty = ~(running[-1] > 0.0)
        np.testing.assert_array_equal(position, wanted)
        np.testing.assert_array_equal(inside, threshold - before)
        np.testing.assert_array_equal(flags[0].view(bool), empty)
        np.testing.assert_array_equal(flags[1].view(bool), (order[wanted] == rank) & ~empty)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_draw_rows_are_the_passes_in_turn(dtype):
    rng = np.random.default_rng(12)
    weights = np.abs(rng.standard_normal((6, 45))).astype(dtype)
    weights[2] = 0  # a row without mass
    p_rows = np.array([0, 2, 5, 3], dtype=np.int64)
    q_rows = np.array([1, -1, 4, 4], dtype=np.int64)  # -1: a bonus draw, no residual
    p_masses = np.array([3.0, 0.0, 7.5, 1.25])  # 0: divided by inf
    q_masses = np.array([2.0, 1.0, 0.5, 9.0])
    scale = np.array([1.0, 1.0, 0.75, 1.0])
    p_out, residual, masses = np.empty((4, 45)), np.empty((4, 45)), np.empty((4, 2))
    _core.dense_draw_rows(weights, p_rows, p_masses, q_rows, q_masses, scale, p_out,
                          residual, masses)
    p_divisors = np.where(p_masses > 0, p_masses, np.inf)
    q_divisors = np.where(q_masses > 0, q_masses, np.inf)
    # The same passes one by one.
    p = np.empty((4, 45))
    _core.shard_divided(weights, p_rows, p_divisors, p, np.arange(4, dtype=np.int64))
    rejected = np.flatnonzero(q_rows >= 0)
    q = np.empty((rejected.size, 45))
    _core.shard_divided(weights, q_rows[rejected], q_divisors[rejected], q,
                        np.arange(rejected.size, dtype=np.int64))
    wanted = p.copy()
    _core.shard_residuals(wanted, rejected, scale[rejected], q)
    sums = np.empty((2, 4))
    _core.shard_positive_sums(wanted, sums[0])
    _core.shard_positive_sums(p, sums[1])
    np.testing.assert_array_equal(p_out, p)
    np.testing.assert_array_equal(residual, wanted)
    np.testing.assert_array_equal(masses, sums.T)
    assert (residual[1] == p[1]).all() and (residual[0] != p[0]).any()  # no residual at -1
    with pytest.raises(ValueError, match="outside the block"):
        _core.dense_draw_rows(weights, np.array([6]), p_masses, q_rows, q_masses, scale,
                              p_out, residual, masses)
