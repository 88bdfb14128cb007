"""specdec_np/_kernels/src/cpu/treescan.h (the tree walk's row passes): the vector build equals
the scalar
fallback bit for bit, and both equal the formula of the reference element by element.

The header is compiled here (``c_headers``) and called through ctypes, so these tests need a
C compiler but not the built extension.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_headers import build_library
from hypothesis import given, settings
from hypothesis import strategies as st

_WRAPPER = r"""
#include "treescan.h"

double t_update_ff(const float *s, double sm, const float *q, double qm, ptrdiff_t V,
                   double *d) { return specdec_residual_update_ff(s, sm, q, qm, V, d); }
double t_update_df(const double *s, double sm, const float *q, double qm, ptrdiff_t V,
                   double *d) { return specdec_residual_update_df(s, sm, q, qm, V, d); }
double t_update_dd(const double *s, double sm, const double *q, double qm, ptrdiff_t V,
                   double *d) { return specdec_residual_update_dd(s, sm, q, qm, V, d); }
double t_clean_sum_f(const float *q, ptrdiff_t V) { return specdec_clean_sum_f(q, V); }
double t_clean_sum_d(const double *q, ptrdiff_t V) { return specdec_clean_sum_d(q, V); }
void t_clean_copy_f(const float *s, ptrdiff_t V, double *d) { specdec_clean_copy_f(s, V, d); }
void t_clean_copy_d(const double *s, ptrdiff_t V, double *d) { specdec_clean_copy_d(s, V, d); }
"""

_CODE = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


class TreeScan:
    """ctypes calls of one build of the header, on NumPy arrays."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        p, n, m = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_double
        for name in ("t_update_ff", "t_update_df", "t_update_dd"):
            getattr(lib, name).argtypes = [p, m, p, m, n, p]
            getattr(lib, name).restype = ctypes.c_double
        for kind in "fd":
            getattr(lib, f"t_clean_sum_{kind}").argtypes = [p, n]
            getattr(lib, f"t_clean_sum_{kind}").restype = ctypes.c_double
            getattr(lib, f"t_clean_copy_{kind}").argtypes = [p, n, p]

    def update(self, src: np.ndarray, src_mass: float, q: np.ndarray, q_mass: float):
        # The trailing guard entry must stay untouched: the last partial group is padded.
        out = np.full(src.size + 1, -7.0)
        name = f"t_update_{_CODE[src.dtype]}{_CODE[q.dtype]}"
        total = getattr(self.lib, name)(
            src.ctypes.data, src_mass, q.ctypes.data, q_mass, src.size, out.ctypes.data
        )
        assert out[-1] == -7.0
        return float(total), out[:-1]

    def clean_sum(self, q: np.ndarray) -> float:
        return float(getattr(self.lib, f"t_clean_sum_{_CODE[q.dtype]}")(q.ctypes.data, q.size))

    def clean_copy(self, src: np.ndarray) -> np.ndarray:
        out = np.full(src.size + 1, -7.0)
        getattr(self.lib, f"t_clean_copy_{_CODE[src.dtype]}")(src.ctypes.data, src.size,
                                                              out.ctypes.data)  # fmt: skip
        assert out[-1] == -7.0
        return out[:-1]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TreeScan]:
    tmp: Path = tmp_path_factory.mktemp("treescan")
    return {
        "vector": TreeScan(build_library(tmp, "vector", _WRAPPER)),
        "scalar": TreeScan(
            build_library(tmp, "scalar", _WRAPPER, "-DSPECDEC_NO_VECTOR_EXTENSIONS")
        ),
    }


def _row(rng: np.random.Generator, size: int, dtype: Any) -> np.ndarray:
    """Probabilities with zeros, negative entries, -0.0, NaN and now and then +inf."""
    row = rng.random(size) / max(size, 1)
    row[rng.random(size) < 0.2] = 0.0
    spoilt = rng.random(size) < 0.1
    row[spoilt] = rng.choice(np.array([-0.5, -0.0, np.nan, -1e-300]), int(spoilt.sum()))
    return row.astype(dtype)


def _clean(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return np.where(x > 0.0, x, 0.0)


def _expected_update(src, src_mass, q, q_mass) -> np.ndarray:
    """The reference's formula: (src / src_mass - max(q, 0) / q_mass)+, NaN weighing 0, with
    no division by a mass of 1."""
    a = src.astype(np.float64)
    a = a / src_mass if src_mass != 1.0 else a
    b = _clean(q)
    b = b / q_mass if q_mass != 1.0 else b
    with np.errstate(invalid="ignore"):
        return _clean(a - b)


@settings(max_examples=120, deadline=None)
@given(
    size=st.integers(0, 70),
    seed=st.integers(0, 2**32 - 1),
    pair=st.sampled_from([(np.float32, np.float32), (np.float64, np.float32),
                          (np.float64, np.float64)]),
    src_mass=st.sampled_from([1.0, 0.7, 3.0, 1e-300]),
    q_mass=st.sampled_from([1.0, 0.37, 2.5]),
)  # fmt: skip
def test_residual_update_vector_equals_scalar_and_formula(
    builds, size, seed, pair, src_mass, q_mass
) -> None:
    rng = np.random.default_rng(seed)
    src, q = _row(rng, size, pair[0]), _row(rng, size, pair[1])
    with np.errstate(all="ignore"):
        total, out = builds["vector"].update(src, src_mass, q, q_mass)
        scalar_total, scalar_out = builds["scalar"].update(src, src_mass, q, q_mass)
        expected = _expected_update(src, src_mass, q, q_mass)
    assert out.view(np.uint64).tolist() == scalar_out.view(np.uint64).tolist()
    assert np.float64(total).view(np.uint64) == np.float64(scalar_total).view(np.uint64)
    assert out.view(np.uint64).tolist() == expected.view(np.uint64).tolist()
    assert total == pytest.approx(float(expected.sum()), rel=1e-12, abs=1e-300)


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(0, 70),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_clean_sum_and_copy_vector_equal_scalar_and_formula(builds, size, seed, dtype) -> None:
    rng = np.random.default_rng(seed)
    q = _row(rng, size, dtype)
    sums = [builds[name].clean_sum(q) for name in ("vector", "scalar")]
    copies = [builds[name].clean_copy(q) for name in ("vector", "scalar")]
    assert np.float64(sums[0]).view(np.uint64) == np.float64(sums[1]).view(np.uint64)
    assert sums[0] == pytest.approx(float(_clean(q).sum()), rel=1e-12, abs=1e-300)
    for copy in copies:
        assert copy.view(np.uint64).tolist() == _clean(q).view(np.uint64).tolist()


def test_the_lane_order_is_the_documented_one(builds) -> None:
    """Lane l sums the elements 8 i + l, combined as ((L0 + L4) + (L1 + L5)) + ((L2 + L6) +
    (L3 + L7)): a row whose sum depends on the order gives that order's bits."""
    rng = np.random.default_rng(0)
    q = (rng.random(53) * 10.0 ** rng.integers(-12, 3, 53)).astype(np.float64)
    lanes = [0.0] * 8
    for y, value in enumerate(q):
        lanes[y % 8] += float(value)
    expected = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + (
        (lanes[2] + lanes[6]) + (lanes[3] + lanes[7])
    )
    in_order = 0.0
    for value in q:
        in_order += float(value)
    assert in_order != expected  # the row tells the orders apart
    for build in builds.values():
        assert build.clean_sum(q) == expected
