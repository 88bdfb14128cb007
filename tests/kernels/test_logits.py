"""specdec_np/_kernels/src/cpu/logits_law.h (the processed law of logits rows) against the
reference.

The header is compiled here into small shared libraries (the vector build, the scalar
fallback, and deliberately wrong variants) and called through ctypes, so these tests need a
C compiler but not the built extension.

What may differ between the kernel and the reference, and by how much:

* float32 rows: ``w`` is bit-identical (the reference computes the kernel's exponential
  operation for operation), so min-p and top-k keep identical sets; top-p may differ only
  where a cumulative sum is within the float64 rounding of two summation orders of
  ``top_p * S`` (the knife-edge, ``_acceptable_cutoffs``).
* float64 rows: the kernel uses libm's ``exp`` and the reference NumPy's, which may differ
  in the last bit, so min-p may also differ for a token whose ``w`` is within a few float64
  ulp of ``min_p``.
* probabilities: ``_relative_bound``.
"""

from __future__ import annotations

import ctypes
import math
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_headers import build_library
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import _core
from specdec_np._reference.chains import _processed_law, fast_expf, fmaf, process_logits
from specdec_np._runtime.contract import FILTER_ORDER_CODES

_WRAPPER = r"""
#include <stdlib.h>
#include "logits_law.h"

void t_exp_scalar(const float *x, float *out, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; ++i)
        out[i] = specdec_fast_expf(x[i]);
}

void t_exp_vector(const float *x, float *out, ptrdiff_t n)
{
    ptrdiff_t i = 0;
#if SPECDEC_HAVE_VECTORS
    for (; i + 8 <= n; i += 8) {
        specdec_v8f v;
        memcpy(&v, x + i, sizeof v);
        v = specdec_fast_expf8(v);
        memcpy(out + i, &v, sizeof v);
    }
#endif
    for (; i < n; ++i)
        out[i] = specdec_fast_expf(x[i]);
}

/* Steps where exp decreases as x grows, over every float in [-104, -0]: the floats
 * -0 .. -104 have the bit patterns 0x80000000 .. 0xC2D00000, in decreasing order. */
int64_t t_exp_monotone_violations(void)
{
    int64_t violations = 0;
    float previous = 0.0f;
    const uint32_t first = 0x80000000u, last = 0xC2D00000u;
    float x[1024], e[1024];
    for (uint32_t start = first; start <= last; start += 1024) {
        uint32_t count = last - start + 1 < 1024 ? last - start + 1 : 1024;
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t bits = start + i;
            memcpy(&x[i], &bits, sizeof bits);
        }
        t_exp_vector(x, e, count);
        /* x decreases with i, so exp must not increase. */
        for (uint32_t i = 0; i < count; ++i) {
            violations += (i == 0 ? start != first && e[0] > previous : e[i] > e[i - 1]);
        }
        previous = e[count - 1];
    }
    return violations;
}

/* Inputs where min-p's floor (which starts next to z_max + log(min_p)) is not the plain
 * bisection over every key from -inf to z_max: the floor needs w monotone in z. */
#define T_MIN_P_BISECTION(SUFFIX, T, KEY_T)                                                 \
    int64_t t_min_p_differences_##SUFFIX(const T *z_max, const double *min_p, ptrdiff_t n)  \
    {                                                                                      \
        int64_t differences = 0;                                                           \
        for (ptrdiff_t i = 0; i < n; ++i) {                                                \
            T top = z_max[i];                                                              \
            KEY_T low = specdec_key_##SUFFIX(-(T)INFINITY), high = specdec_key_##SUFFIX(top); \
            while (high - low > 1) {                                                       \
                KEY_T middle = low + (high - low) / 2;                                     \
                if (specdec_weight_##SUFFIX(specdec_value_##SUFFIX(middle), top) >= min_p[i]) \
                    high = middle;                                                         \
                else                                                                       \
                    low = middle;                                                          \
            }                                                                              \
            differences += specdec_min_p_floor_##SUFFIX(z_max[i], min_p[i]) != high;       \
        }                                                                                  \
        return differences;                                                                \
    }
T_MIN_P_BISECTION(f, float, uint32_t)
T_MIN_P_BISECTION(d, double, uint64_t)

/* The law's scratch from the heap, as the kernels take it. */
void t_row_law_f(const float *l, ptrdiff_t V, float t, int64_t k, double p, double m,
                 int order, specdec_row_law *law)
{
    specdec_law_scratch *scratch = specdec_law_scratch_new();
    specdec_row_law_f(l, V, t, k, p, m, order, scratch, NULL, law);
    free(scratch);
}
void t_row_law_d(const double *l, ptrdiff_t V, double t, int64_t k, double p, double m,
                 int order, specdec_row_law *law)
{
    specdec_law_scratch *scratch = specdec_law_scratch_new();
    specdec_row_law_d(l, V, t, k, p, m, order, scratch, NULL, law);
    free(scratch);
}
/* The law that keeps its weights in out and divides them there (the kernels' one
 * exponential pass); returns whether it could, out then holding the processed row. */
int t_law_weights_f(const float *l, ptrdiff_t V, float t, int64_t k, double p, double m,
                    specdec_row_law *law, float *out)
{
    specdec_law_scratch *scratch = specdec_law_scratch_new();
    int stored = specdec_row_law_f(l, V, t, k, p, m, 0, scratch, out, law);
    free(scratch);
    if (stored)
        specdec_law_from_weights_f(out, V, law->normaliser);
    return stored;
}
int t_law_weights_d(const double *l, ptrdiff_t V, double t, int64_t k, double p, double m,
                    specdec_row_law *law, double *out)
{
    specdec_law_scratch *scratch = specdec_law_scratch_new();
    int stored = specdec_row_law_d(l, V, t, k, p, m, 0, scratch, out, law);
    free(scratch);
    if (stored)
        specdec_law_from_weights_d(out, V, law->normaliser);
    return stored;
}
void t_materialise_f(const float *l, ptrdiff_t V, float t, const specdec_row_law *law,
                     float *out) { specdec_law_materialise_f(l, V, t, law, out); }
void t_materialise_d(const double *l, ptrdiff_t V, double t, const specdec_row_law *law,
                     double *out) { specdec_law_materialise_d(l, V, t, law, out); }
double t_probability_f(const float *l, ptrdiff_t y, float t, const specdec_row_law *law)
{ return specdec_law_probability_f(l, y, t, law); }
double t_probability_d(const double *l, ptrdiff_t y, double t, const specdec_row_law *law)
{ return specdec_law_probability_d(l, y, t, law); }
ptrdiff_t t_argmax_f(const float *row, ptrdiff_t V) { return specdec_row_argmax_f(row, V); }

/* The law with its scratch's row_threads set to `threads`: its weights kept in out and
 * divided there when out is not NULL (returns whether they were), else no weights. */
#define T_LAW_THREADS(SUFFIX, T)                                                            \
    int t_law_threads_##SUFFIX(const T *l, ptrdiff_t V, T t, int64_t k, double p, double m, \
                               int order, int threads, specdec_row_law *law, T *out)       \
    {                                                                                      \
        specdec_law_scratch *scratch = specdec_law_scratch_new();                          \
        scratch->row_threads = threads;                                                    \
        int stored = specdec_row_law_##SUFFIX(l, V, t, k, p, m, order, scratch, out, law);  \
        free(scratch);                                                                     \
        if (stored)                                                                        \
            specdec_law_from_weights_##SUFFIX(out, V, law->normaliser);                    \
        return stored;                                                                     \
    }                                                                                      \
    /* The one-thread exponential pass (its sum, its weights in w), and the residual sum   \
     * of weights w (q = 0, rho = 1, scale = 1), which the threaded pass returns. */       \
    double t_kept_sum_##SUFFIX(const T *l, ptrdiff_t V, T t, T z_max, T cutoff, T *w)       \
    { return specdec_kept_sum_##SUFFIX(l, V, t, z_max, cutoff, w); }                       \
    double t_weights_sum_##SUFFIX(const T *w, ptrdiff_t V)                                  \
    { return specdec_residual_sum_##SUFFIX(w, NULL, -1, 1.0, 1.0, 0, V); }                  \
    /* The one-thread maximum scan. */                                                     \
    T t_row_max_##SUFFIX(const T *l, ptrdiff_t V, T t)                                     \
    {                                                                                      \
        T z_max;                                                                           \
        int64_t infinite;                                                                  \
        specdec_row_max_##SUFFIX(l, V, t, &z_max, &infinite);                              \
        return z_max;                                                                      \
    }
T_LAW_THREADS(f, float)
T_LAW_THREADS(d, double)

/* A draw's block sums of a float row, dividing its weights by `normaliser` in place. */
void t_block_sums_f(float *p, ptrdiff_t V, double normaliser, ptrdiff_t block, double *sums)
{ specdec_block_sums_f(p, V, normaliser, block, sums); }

/* The residual sum of a row in one call, and in pieces of `piece` entries added to one set
 * of lanes (what the kernels do when they process a logits row block by block). */
double t_residual_sum_f(const float *p, const float *q, ptrdiff_t m, double rho, ptrdiff_t V)
{ return specdec_residual_sum_f(p, q, m, rho, 1.0, 0, V); }
double t_residual_pieces_f(const float *p, const float *q, ptrdiff_t m, double rho, ptrdiff_t V,
                           ptrdiff_t piece)
{
    double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (ptrdiff_t start = 0; start < V; start += piece) {
        ptrdiff_t stop = start + piece < V ? start + piece : V;
        ptrdiff_t mass = m >= start && m < stop ? m - start : -1;
        specdec_residual_sum_f_accumulate(p + start, q ? q + start : q, mass, rho, 1.0, 0,
                                          stop - start, lanes);
    }
    return specdec_combine_lanes(lanes);
}
"""


class RowLaw(ctypes.Structure):
    _fields_ = [
        ("z_max", ctypes.c_double),
        ("cutoff", ctypes.c_double),
        ("normaliser", ctypes.c_double),
        ("num_infinite", ctypes.c_int64),
        ("status", ctypes.c_int64),
    ]

    def fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name, _ in self._fields_)


class Logits:
    """ctypes calls of one build of the header, on NumPy arrays."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        p = ctypes.c_void_p
        for kind, scalar in (("f", ctypes.c_float), ("d", ctypes.c_double)):
            getattr(lib, f"t_row_law_{kind}").argtypes = [
                p,
                ctypes.c_ssize_t,
                scalar,
                ctypes.c_int64,
                ctypes.c_double,
                ctypes.c_double,
                ctypes.c_int,
                p,
            ]
            getattr(lib, f"t_materialise_{kind}").argtypes = [p, ctypes.c_ssize_t, scalar, p, p]
            getattr(lib, f"t_law_weights_{kind}").argtypes = [
                p, ctypes.c_ssize_t, scalar, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                p, p,
            ]  # fmt: skip
            getattr(lib, f"t_probability_{kind}").argtypes = [p, ctypes.c_ssize_t, scalar, p]
            getattr(lib, f"t_probability_{kind}").restype = ctypes.c_double
            getattr(lib, f"t_law_threads_{kind}").argtypes = [
                p, ctypes.c_ssize_t, scalar, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                ctypes.c_int, ctypes.c_int, p, p,
            ]  # fmt: skip
            getattr(lib, f"t_kept_sum_{kind}").argtypes = [
                p, ctypes.c_ssize_t, scalar, scalar, scalar, p
            ]
            getattr(lib, f"t_kept_sum_{kind}").restype = ctypes.c_double
            getattr(lib, f"t_weights_sum_{kind}").argtypes = [p, ctypes.c_ssize_t]
            getattr(lib, f"t_weights_sum_{kind}").restype = ctypes.c_double
            getattr(lib, f"t_row_max_{kind}").argtypes = [p, ctypes.c_ssize_t, scalar]
            getattr(lib, f"t_row_max_{kind}").restype = scalar
        for name in ("t_exp_scalar", "t_exp_vector"):
            getattr(lib, name).argtypes = [p, p, ctypes.c_ssize_t]
        lib.t_exp_monotone_violations.restype = ctypes.c_int64
        lib.t_argmax_f.argtypes = [p, ctypes.c_ssize_t]
        lib.t_argmax_f.restype = ctypes.c_ssize_t
        lib.t_block_sums_f.argtypes = [p, ctypes.c_ssize_t, ctypes.c_double, ctypes.c_ssize_t, p]
        lib.t_residual_sum_f.argtypes = [p, p, ctypes.c_ssize_t, ctypes.c_double, ctypes.c_ssize_t]
        lib.t_residual_sum_f.restype = ctypes.c_double
        lib.t_residual_pieces_f.argtypes = [*lib.t_residual_sum_f.argtypes, ctypes.c_ssize_t]
        lib.t_residual_pieces_f.restype = ctypes.c_double

    @staticmethod
    def _kind(row: np.ndarray) -> str:
        return "f" if row.dtype == np.float32 else "d"

    def exp(self, x: np.ndarray, vector: bool = True) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        function = self.lib.t_exp_vector if vector else self.lib.t_exp_scalar
        function(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def row_law(
        self,
        row: np.ndarray,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        filter_order: str = "vllm",
    ) -> RowLaw:
        law = RowLaw()
        getattr(self.lib, f"t_row_law_{self._kind(row)}")(
            row.ctypes.data, row.size, temperature, top_k, top_p, min_p,
            FILTER_ORDER_CODES[filter_order], ctypes.byref(law),
        )  # fmt: skip
        return law

    def block_sums(
        self, weights: np.ndarray, normaliser: float, block: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """A draw's block sums of a float row of weights, and the row divided by
        ``normaliser`` in place (on a copy)."""
        row = np.array(weights, dtype=np.float32)
        sums = np.zeros(-(-row.size // block))
        self.lib.t_block_sums_f(row.ctypes.data, row.size, normaliser, block, sums.ctypes.data)
        return row, sums

    def law_from_weights(
        self, row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
    ) -> tuple[RowLaw, np.ndarray | None]:
        """The law computed with its weights kept, and the row divided from them (None
        when the law kept none)."""
        law = RowLaw()
        out = np.full_like(row, -7.0)
        stored = getattr(self.lib, f"t_law_weights_{self._kind(row)}")(
            row.ctypes.data, row.size, temperature, top_k, top_p, min_p, ctypes.byref(law),
            out.ctypes.data,
        )
        return law, (out if stored else None)

    def law_on_threads(
        self,
        row: np.ndarray,
        temperature: float,
        filters: tuple[int, float, float],
        filter_order: str,
        threads: int,
        keep_weights: bool,
    ) -> tuple[RowLaw, np.ndarray | None]:
        """The law with ``threads`` row threads, and the row divided from its weights when
        ``keep_weights`` and the law kept them (else None)."""
        law = RowLaw()
        out = np.full_like(row, -7.0)
        stored = getattr(self.lib, f"t_law_threads_{self._kind(row)}")(
            row.ctypes.data, row.size, temperature, *filters, FILTER_ORDER_CODES[filter_order],
            threads, ctypes.byref(law), out.ctypes.data if keep_weights else None,
        )  # fmt: skip
        return law, (out if stored else None)

    def kept_sum(
        self, row: np.ndarray, temperature: float, z_max: float, cutoff: float
    ) -> tuple[float, float]:
        """The one-thread exponential pass's sum, and the residual sum of the weights it
        stored."""
        kind = self._kind(row)
        weights = np.full_like(row, -7.0)
        kept = getattr(self.lib, f"t_kept_sum_{kind}")(
            row.ctypes.data, row.size, temperature, z_max, cutoff, weights.ctypes.data
        )
        stored = getattr(self.lib, f"t_weights_sum_{kind}")(weights.ctypes.data, row.size)
        return float(kept), float(stored)

    def row_max(self, row: np.ndarray, temperature: float) -> float:
        """The one-thread maximum scan's z_max."""
        return float(getattr(self.lib, f"t_row_max_{self._kind(row)}")(
            row.ctypes.data, row.size, temperature
        ))  # fmt: skip

    def materialise(self, row: np.ndarray, temperature: float, law: RowLaw) -> np.ndarray:
        out = np.full_like(row, -7.0)
        getattr(self.lib, f"t_materialise_{self._kind(row)}")(
            row.ctypes.data, row.size, temperature, ctypes.byref(law), out.ctypes.data
        )
        return out

    def residual_sum(
        self, p: np.ndarray, q: np.ndarray | None, point_mass: int, rho: float, piece: int = 0
    ) -> float:
        """sum max(rho p - q, 0) of float32 rows in one call, or in pieces of ``piece``."""
        q_address = None if q is None else q.ctypes.data
        if piece:
            return float(
                self.lib.t_residual_pieces_f(
                    p.ctypes.data, q_address, point_mass, rho, p.size, piece
                )
            )
        return float(self.lib.t_residual_sum_f(p.ctypes.data, q_address, point_mass, rho, p.size))

    def probability(self, row: np.ndarray, y: int, temperature: float, law: RowLaw) -> float:
        function = getattr(self.lib, f"t_probability_{self._kind(row)}")
        return float(function(row.ctypes.data, y, temperature, ctypes.byref(law)))


def _build(tmp: Path, stem: str, *defines: str) -> Logits:
    return Logits(build_library(tmp, stem, _WRAPPER, *defines))


def _vector_and_scalar(
    build: Callable[..., Logits], tmp: Path, stem: str
) -> dict[str, Logits]:
    """The vector build of ``build`` and its scalar fallback, by name."""
    return {
        "vector": build(tmp, stem),
        "scalar": build(tmp, f"{stem}_scalar", "-DSPECDEC_NO_VECTOR_EXTENSIONS"),
    }


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Logits]:
    return _vector_and_scalar(_build, tmp_path_factory.mktemp("logits"), "vector")


@pytest.fixture(scope="module")
def vector(builds: dict[str, Logits]) -> Logits:
    return builds["vector"]


def _special_row(seed: int, vocab: int, dtype: type, special: str, share: int) -> np.ndarray:
    """A random row of logits with one entry in ``share`` set to NaN or -inf (``special``
    "nan" or "minus_inf"), one +inf entry ("plus_inf"), or every entry NaN ("all_nan")."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(vocab) * 4).astype(dtype)
    if special == "nan":
        row[rng.integers(vocab, size=max(vocab // share, 1))] = np.nan
    elif special == "minus_inf":
        row[rng.integers(vocab, size=max(vocab // share, 1))] = -np.inf
    elif special == "plus_inf":
        row[rng.integers(vocab)] = np.inf
    elif special == "all_nan":
        row[:] = np.nan
    return row


# ---- the exponential ------------------------------------------------------------------


def _exp_grid() -> np.ndarray:
    dense = np.linspace(-104.0, 0.0, 1 << 21, dtype=np.float32)
    near_zero = -np.geomspace(1e-30, 1.0, 1 << 16).astype(np.float32)
    return np.concatenate([dense, near_zero, np.float32([0.0, -0.0, -103.97, -103.28])])


def _ulp_error(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    return np.abs(values.astype(np.float64) - exact) / ulp


def test_fast_exp_is_within_one_ulp(vector: Logits) -> None:
    """The accuracy of the specified exponential against float64 exp over the range the
    kernels use (x = z - max z <= 0, down to where exp rounds to 0): 0.98 ulp measured."""
    x = _exp_grid()
    error = _ulp_error(vector.exp(x), x)
    worst = float(error.max())
    print(f"fast expf: max error {worst:.3f} float32 ulp over {x.size} points in [-104, 0]")
    assert worst <= 1.0, (worst, float(x[np.argmax(error)]))


def test_fast_exp_ulp_check_catches_a_worse_exp(vector: Logits) -> None:
    # The ulp measure itself must see a one-part-in-ten-million error.
    x = _exp_grid()[::64]
    assert _ulp_error(np.float32(1.0000002) * vector.exp(x), x).max() > 1.0


_FMAF_WRAPPER = r"""
#include <math.h>
#include <stddef.h>
void t_fmaf(const float *a, const float *b, const float *c, float *out, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; ++i)
        out[i] = fmaf(a[i], b[i], c[i]);
}
"""


def test_reference_fmaf_is_cs_fmaf_even_where_a_float64_sum_rounds_twice(tmp_path: Path):
    """The reference's fmaf (float64 arithmetic) against C's correctly rounded fmaf: random
    operands, and sums that land on a float32 midpoint in float64 while the exact value
    does not (where rounding the float64 sum to float32 is wrong)."""
    lib = build_library(tmp_path, "fmaf", _FMAF_WRAPPER)
    rng = np.random.default_rng(5)
    size = 1 << 18
    # (2^-24 (1 + 2^-23)) (1 - 2^-23) is a hair (2^-70) below half an ulp of 1 + 2^-23.
    odd = np.float32(1 + 2.0**-23)
    cases = [
        tuple(rng.standard_normal((3, size)).astype(np.float32)),
        tuple((rng.standard_normal((3, size)) * [[1.0], [1.0], [1e-9]]).astype(np.float32)),
        (
            np.float32([2.0**-24 * (1 + 2.0**-23)] * 4) * np.float32([1, -1, 1, -1]),
            np.full(4, 1 - 2.0**-23, np.float32),
            np.float32([odd, odd, -odd, -odd]),
        ),
    ]
    for a, b, c in cases:
        a, b, c = (np.ascontiguousarray(v, dtype=np.float32) for v in (a, b, c))
        expected = np.empty_like(a)
        p = ctypes.c_void_p
        lib.t_fmaf.argtypes = [p, p, p, p, ctypes.c_ssize_t]
        lib.t_fmaf(a.ctypes.data, b.ctypes.data, c.ctypes.data, expected.ctypes.data, a.size)
        assert np.array_equal(fmaf(a, b, c).view(np.uint32), expected.view(np.uint32))
    # The last case is one that the plain float64 sum gets wrong.
    a, b, c = cases[2]
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert not np.array_equal(naive, fmaf(a, b, c))


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    found = re.search(r"^flags\s*:(.*)$", text, flags=re.MULTILINE)
    return set(found.group(1).split()) if found else set()


# One clone at a time, with the CPU features each needs.
_CLONES = {
    "x86-64-v4": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "fma", "avx2"},
    "x86-64-v3": {"fma", "avx2"},
}


@pytest.mark.parametrize("clone", [*_CLONES, "baseline"])
def test_every_clone_of_the_exponential_gives_the_same_bits(
    tmp_path: Path, clone: str, vector: Logits
) -> None:
    """The AVX-512 and AVX2 + FMA3 clones and the baseline (libm's fmaf) compute the same
    bits, lane by lane, as the reference, and so does the law of a row built from them."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the clones are x86-64's")
    if clone in _CLONES and not _CLONES[clone] <= _cpu_flags():
        pytest.skip(f"this CPU cannot run the {clone} clone")
    target = f"__attribute__((target(\"arch={clone}\")))" if clone in _CLONES else ""
    build = _build(tmp_path, f"clone_{clone.replace('-', '_')}", f"-DSPECDEC_CLONES={target}")
    x = np.concatenate([_exp_grid()[::7], np.float32([np.nan, -np.inf, -110.0, 50.0, 88.0])])
    bits = build.exp(x).view(np.uint32)
    assert np.array_equal(bits, fast_expf(x).view(np.uint32))
    assert np.array_equal(bits, vector.exp(x).view(np.uint32))
    row = (np.random.default_rng(3).standard_normal(5000) * 4).astype(np.float32)
    for top_k, top_p in ((0, 1.0), (50, 0.9), (0, 0.8)):
        assert build.row_law(row, 0.7, top_k, top_p, 0.0).fields() == vector.row_law(
            row, 0.7, top_k, top_p, 0.0
        ).fields()


def test_fast_exp_special_values(vector: Logits) -> None:
    x = np.float32([-np.inf, np.nan, -104.5, -200.0, 0.0, -0.0, 1.0, 88.0, 1000.0, np.inf])
    got = vector.exp(x)
    assert np.array_equal(got[:4], np.zeros(4, np.float32))
    assert got[4] == 1.0 and got[5] == 1.0
    assert np.isfinite(got).all()


def test_fast_exp_vector_scalar_and_reference_bits(builds: dict[str, Logits]) -> None:
    x = np.concatenate(
        [_exp_grid(), np.float32([np.nan, -np.inf, np.inf, -110.0, 50.0, 88.0, 89.0])]
    )
    vector_bits = builds["vector"].exp(x, vector=True).view(np.uint32)
    assert np.array_equal(vector_bits, builds["vector"].exp(x, vector=False).view(np.uint32))
    assert np.array_equal(vector_bits, builds["scalar"].exp(x).view(np.uint32))
    assert np.array_equal(vector_bits, fast_expf(x).view(np.uint32))


def test_fast_exp_reference_on_array_api_strict(vector: Logits) -> None:
    xps = pytest.importorskip("array_api_strict")
    x = _exp_grid()[::97]
    got = np.asarray(fast_expf(xps.asarray(x)))
    assert np.array_equal(got.view(np.uint32), vector.exp(x).view(np.uint32))


@pytest.mark.slow
def test_fast_exp_is_monotone(vector: Logits) -> None:
    # min-p's cutoff is found by bisection on z, which needs w monotone in z.
    assert vector.lib.t_exp_monotone_violations() == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_min_p_floor_is_the_bisection_over_every_key(builds: dict[str, Logits], dtype: type):
    """min-p's floor starts next to z_max + log(min_p) and probes outward before bisecting:
    the key of the bisection over every key from -inf to z_max, on both builds, for
    maxima and min-p values across their ranges (tiny, 1, subnormal, huge maxima)."""
    rng = np.random.default_rng(4)
    z_max = np.concatenate([
        rng.standard_normal(3000) * 10, rng.uniform(-300, 300, 1000),
        [0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38, 1.0, 80.0, -100.0, 104.0],
    ]).astype(dtype)  # fmt: skip
    min_p = np.concatenate([
        rng.random(2000), 10.0 ** -rng.uniform(0, 40, 1500), np.ones(500),
        np.full(510, 1e-300),
    ])[: z_max.size]  # fmt: skip
    min_p[min_p <= 0] = 0.5
    kind = "f" if dtype == np.float32 else "d"
    for build in builds.values():
        count = getattr(build.lib, f"t_min_p_differences_{kind}")
        count.restype = ctypes.c_int64
        count.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t]
        assert count(z_max.ctypes.data, min_p.ctypes.data, z_max.size) == 0


# ---- the law of a row -----------------------------------------------------------------


def _z(row: np.ndarray, temperature: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        return row / row.dtype.type(temperature)


def _kernel_kept(row: np.ndarray, temperature: float, law: RowLaw) -> np.ndarray:
    z = _z(row, temperature)
    if law.status != 0:
        return np.zeros(row.shape, bool)
    if law.num_infinite > 0:
        return z == np.inf
    with np.errstate(invalid="ignore"):
        return z >= law.cutoff


def _reference(
    row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
    filter_order: str = "vllm",
):  # fmt: skip
    probabilities, kept, no_mass = _processed_law(
        row[None, :], np.array([temperature]), np.array([top_k]), np.array([top_p]),
        np.array([min_p]), filter_order,
    )  # fmt: skip
    return probabilities[0], kept[0], bool(no_mass[0])


def _weights(row: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(z with NaN as -inf, w in float64) as the law defines them, for a row with mass."""
    z = _z(row, temperature)
    z = np.where(np.isnan(z), -np.inf, z)
    with np.errstate(invalid="ignore"):
        x = z - z.max()
    w = fast_expf(x).astype(np.float64) if row.dtype == np.float32 else np.exp(x)
    return z, w


def _acceptable_cutoffs(
    row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
    filter_order: str = "vllm",
) -> list[np.ndarray]:  # fmt: skip
    """Every kept set the law allows once float64 rounding of the top-p sums is allowed for.

    The kernel sums top-p's masses in another order than the reference: it may pick another
    tie group only where the reference's cumulative mass above that group is within the
    rounding of ``top_p * S``.  That rounding is at most ``(V - 1) 2^-53 S`` per order;
    float64 rows add two ulp of ``exp`` per weight.  In llama.cpp's order top-p runs at
    temperature 1 over top-k's set, and each of its sets is then cut by min-p and taken
    at the temperature.
    """
    _, kept, no_mass = _reference(row, temperature, top_k, top_p, min_p, filter_order)
    if no_mass or top_p >= 1.0:
        return [kept]
    z, w = _weights(row, temperature)
    if np.isinf(z.max()):
        return [kept]
    if filter_order == "llama.cpp":
        logits, w1 = _weights(row, 1.0)
        min_p_kept = (w1 >= min_p) | (min_p <= 0.0)
        _, before_top_p, _ = _reference(row, 1.0, top_k, 1.0, 0.0)
        options = _top_p_options(logits, w1, before_top_p, top_p)
        # Each temperature-1 set, cut by min-p, is taken at the temperature from the z of
        # its lowest logit.
        lowest = [row.dtype.type(np.min(logits[o & min_p_kept])) for o in options]
        return [~np.isnan(row) & (z >= _z(np.array([v]), temperature)[0]) for v in lowest] or [
            kept
        ]
    _, before_top_p, _ = _reference(row, temperature, top_k, 1.0, min_p)
    return _top_p_options(z, w, before_top_p, top_p) or [kept]


def _top_p_options(
    z: np.ndarray, w: np.ndarray, before_top_p: np.ndarray, top_p: float
) -> list[np.ndarray]:
    """The kept sets top-p may choose over ``before_top_p`` (see _acceptable_cutoffs)."""
    total = float(np.sum(np.where(before_top_p, w, 0.0)))
    target = top_p * total
    delta = (4 * z.size + 8) * 2.0**-53 * total
    values = np.unique(z[before_top_p & (w > 0)])[::-1]
    masses = [float(np.sum(w[before_top_p & (z >= v)])) for v in values]
    options = []
    for i, v in enumerate(values):
        may_reach = masses[i] >= target - delta
        higher_may_fall_short = all(m < target + delta for m in masses[:i])
        if may_reach and higher_may_fall_short:
            options.append(before_top_p & (z >= v))
    return options


def _min_p_knife_edge(
    row: np.ndarray, temperature: float, min_p: float, filter_order: str = "vllm"
) -> bool:
    """float64 rows: a token whose w is within 4 ulp of min_p (libm and NumPy exp may
    round it differently); w at temperature 1 in llama.cpp's order."""
    if row.dtype != np.float64 or min_p <= 0.0:
        return False
    z, w = _weights(row, 1.0 if filter_order == "llama.cpp" else temperature)
    if not np.isfinite(z.max()):
        return False
    return bool(np.any(np.abs(w - min_p) <= 4 * np.spacing(min_p)))


def _relative_bound(row: np.ndarray, filtered: bool) -> float:
    """How far the kernel's p may be from the reference's, relative to p.

    ``w`` agrees (float32: bit for bit; float64: to 2 ulp); the normaliser differs by:
    with a filter on, the float64 sum in two orders, at most ``2 (V - 1) 2^-53``; with none,
    the online pass, whose weights ``exp(fl(z - m_lane)) exp(m_lane - m)`` differ from
    ``exp(fl(z - m))`` by the argument rounding, ``2 u |z - m|`` (u the unit roundoff of
    the dtype; under p its mean is at most the entropy, ``ln V``), plus twice the error of
    ``exp`` (2 ulp, ``2 * 2 * 2u``).  The materialised row rounds once more, to the dtype.
    """
    vocab = row.size
    u = 2.0**-24 if row.dtype == np.float32 else 2.0**-53
    sums = 4 * vocab * 2.0**-53
    online = 0.0 if filtered else 2 * u * math.log(max(vocab, 2)) + 8 * u
    return sums + online + u


def _check_row(
    build: Logits, row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
    filter_order: str = "vllm",
) -> None:  # fmt: skip
    law = build.row_law(row, temperature, top_k, top_p, min_p, filter_order)
    probabilities, kept, no_mass = _reference(row, temperature, top_k, top_p, min_p, filter_order)
    assert law.status == int(no_mass), law.fields()
    kernel_kept = _kernel_kept(row, temperature, law)
    # The kept set's -inf entries carry no mass; compare where the law puts mass.
    _, w = _weights(row, temperature) if not no_mass else (None, np.zeros(row.size))
    if not (no_mass or law.num_infinite > 0):
        mass = w > 0
        options = _acceptable_cutoffs(row, temperature, top_k, top_p, min_p, filter_order)
        matches = [np.array_equal(kernel_kept & mass, option & mass) for option in options]
        if not any(matches):
            assert _min_p_knife_edge(row, temperature, min_p, filter_order), (
                law.fields(),
                np.flatnonzero(kernel_kept & mass),
                np.flatnonzero(kept & mass),
            )
            return
        if not np.array_equal(kernel_kept & mass, kept & mass):
            return  # an allowed knife-edge choice: the probabilities differ by design
    else:
        assert np.array_equal(kernel_kept, kept)
    out = build.materialise(row, temperature, law)
    assert out.dtype == row.dtype
    filtered = bool(law.cutoff > -np.inf) if law.num_infinite == 0 else True
    bound = _relative_bound(row, filtered)
    error = np.abs(out.astype(np.float64) - probabilities)
    # A probability stored as a subnormal of the row's dtype keeps only its absolute
    # resolution (found by hypothesis: float32 rows whose smallest entries fall below 1e-38).
    resolution = float(np.finfo(row.dtype).smallest_subnormal)
    assert np.all(error <= bound * probabilities + resolution), (float(np.max(error)), bound)
    for y in np.unique(np.linspace(0, row.size - 1, 7).astype(np.int64)):
        p = build.probability(row, int(y), temperature, law)
        assert abs(p - probabilities[y]) <= bound * probabilities[y] + 1e-300


_SPECIAL = [np.nan, -np.inf, np.inf]
_TEMPERATURES = [1.0, 0.7, 2.5, 1e-3, 1e-30, 1e30, 1e-45]


@st.composite
def _cases(draw: Any) -> tuple[np.ndarray, float, int, float, float]:
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    vocab = draw(st.integers(1, 300))
    # A few distinct levels, so that ties at every boundary are common.
    levels = draw(
        st.lists(st.floats(-30.0, 30.0, allow_nan=False), min_size=1, max_size=12, unique=True)
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    row = rng.choice(np.asarray(levels), size=vocab)
    if draw(st.booleans()):
        row = row + rng.standard_normal(vocab) * draw(st.sampled_from([1e-3, 1.0, 5.0]))
    if draw(st.integers(0, 4)) == 0:
        where = rng.random(vocab) < 0.1
        row[where] = rng.choice(np.asarray(_SPECIAL), size=int(where.sum()))
    temperature = draw(st.sampled_from(_TEMPERATURES))
    top_k = draw(st.sampled_from([0, 1, 2, 5, vocab - 1, vocab, vocab + 3]))
    top_p = draw(st.sampled_from([1.0, 0.95, 0.5, 0.1, 1e-9]))
    min_p = draw(st.sampled_from([0.0, 1e-3, 0.1, 0.5, 1.0]))
    return row.astype(dtype), temperature, max(top_k, 0), top_p, min_p


@settings(max_examples=400)
@given(_cases())
def test_row_law_matches_reference(
    builds: dict[str, Logits], case: tuple[np.ndarray, float, int, float, float]
) -> None:
    row, temperature, top_k, top_p, min_p = case
    _check_row(builds["vector"], row, temperature, top_k, top_p, min_p)


@settings(max_examples=300)
@given(_cases())
def test_llama_cpp_row_law_matches_reference(
    builds: dict[str, Logits], case: tuple[np.ndarray, float, int, float, float]
) -> None:
    row, temperature, top_k, top_p, min_p = case
    _check_row(builds["vector"], row, temperature, top_k, top_p, min_p, "llama.cpp")


@settings(max_examples=200)
@given(_cases(), st.sampled_from(sorted(FILTER_ORDER_CODES)))
def test_vector_and_scalar_builds_agree_bit_for_bit(
    builds: dict[str, Logits], case: tuple[np.ndarray, float, int, float, float], order: str
) -> None:
    row, temperature, top_k, top_p, min_p = case
    laws = [builds[b].row_law(row, temperature, top_k, top_p, min_p, order) for b in builds]
    first, second = (np.array(law.fields()[:3]).view(np.uint64) for law in laws)
    assert np.array_equal(first, second) and laws[0].fields()[3:] == laws[1].fields()[3:]
    outs = [builds[b].materialise(row, temperature, laws[0]) for b in builds]
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("vocab", [1, 7, 64, 65, 1000, 4099])
def test_large_random_rows(vector: Logits, dtype: type, vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    row = (rng.standard_normal(vocab) * 3).astype(dtype)
    for top_k, top_p, min_p in [(0, 1.0, 0.0), (50, 1.0, 0.0), (0, 0.95, 0.0),
                                (0, 1.0, 0.05), (40, 0.9, 0.01), (1, 1.0, 0.0)]:  # fmt: skip
        for temperature in (1.0, 0.6):
            for order in FILTER_ORDER_CODES:
                _check_row(vector, row, temperature, top_k, top_p, min_p, order)


def test_ascending_row_keeps_its_normaliser(vector: Logits) -> None:
    # Every block raises the running maximum: the rescaling must not compound its rounding.
    row = np.linspace(-5.0, 5.0, 128256, dtype=np.float32)
    _check_row(vector, row, 1.0, 0, 1.0, 0.0)


def test_ties_at_the_boundaries_are_kept(vector: Logits) -> None:
    row = np.float32([2.0, 1.0, 1.0, 0.0, 1.0, -1.0])
    # top-k 2 lands inside the tie group of 1.0: all three are kept.
    law = vector.row_law(row, 1.0, 2, 1.0, 0.0)
    assert _kernel_kept(row, 1.0, law).tolist() == [True, True, True, False, True, False]
    # top-p crosses inside the tie group of 1.0 (mass of 2.0 alone is 1/2.32 of the total).
    law = vector.row_law(row, 1.0, 0, 0.6, 0.0)
    assert _kernel_kept(row, 1.0, law).tolist() == [True, True, True, False, True, False]
    # min-p at exactly w of 1.0 keeps the group.
    w_tie = float(fast_expf(np.float32([-1.0]))[0])
    law = vector.row_law(row, 1.0, 0, 1.0, w_tie)
    assert _kernel_kept(row, 1.0, law).tolist() == [True, True, True, False, True, False]
    law = vector.row_law(row, 1.0, 0, 1.0, np.nextafter(w_tie, 1.0))
    assert _kernel_kept(row, 1.0, law).tolist() == [True, False, False, False, False, False]
    for args in [(2, 1.0, 0.0), (0, 0.6, 0.0), (0, 1.0, w_tie), (3, 0.7, 0.1)]:
        _check_row(vector, row, 1.0, *args)


def test_top_p_knife_edge(vector: Logits) -> None:
    """top_p * S set to a cumulative sum: either neighbouring group is allowed, no other."""
    rng = np.random.default_rng(7)
    row = rng.standard_normal(3000).astype(np.float32)
    z, w = _weights(row, 1.0)
    order = np.argsort(-z, kind="stable")
    cumulative = np.cumsum(w[order])
    seen_options = 0
    for j in (5, 50, 500, 2000):
        top_p = float(cumulative[j] / cumulative[-1])
        options = _acceptable_cutoffs(row, 1.0, 0, top_p, 0.0)
        assert 1 <= len(options) <= 2
        seen_options = max(seen_options, len(options))
        law = vector.row_law(row, 1.0, 0, top_p, 0.0)
        kept = _kernel_kept(row, 1.0, law)
        assert any(np.array_equal(kept, option) for option in options)
        # Sets two groups off the knife-edge are never acceptable.
        assert not any(np.array_equal(z >= z[order[j + 2]], option) for option in options)
    assert seen_options == 2  # the knife-edge really is exercised


def test_infinite_entries_make_the_row_uniform(vector: Logits) -> None:
    row = np.float32([1.0, np.inf, 3.0, np.inf, np.nan, -np.inf])
    for args in [(0, 1.0, 0.0), (1, 0.1, 0.5)]:
        law = vector.row_law(row, 1.0, *args)
        assert law.status == 0 and law.num_infinite == 2
        assert vector.materialise(row, 1.0, law).tolist() == [0, 0.5, 0, 0.5, 0, 0]
        _check_row(vector, row, 1.0, *args)
    # A tiny temperature turns finite logits into +inf.
    law = vector.row_law(np.float32([1.0, 2.0, 2.0, -1.0]), 1e-40, 0, 1.0, 0.0)
    assert law.num_infinite == 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_without_mass(vector: Logits, dtype: type) -> None:
    row = np.array([np.nan, -np.inf, np.nan], dtype=dtype)
    law = vector.row_law(row, 1.0, 0, 0.9, 0.1)
    assert law.status == 1
    assert not vector.materialise(row, 1.0, law).any()
    assert not process_logits(row[None], np.ones(1), np.zeros(1), np.ones(1), np.zeros(1)).any()


def test_process_logits_on_array_api_strict() -> None:
    xps = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(3)
    logits = np.round(rng.standard_normal((4, 50)), 1).astype(np.float32)
    args = (
        np.array([1.0, 0.5, 2.0, 1.0]),
        np.array([0, 5, 0, 60]),
        np.array([1.0, 0.9, 0.5, 1.0]),
        np.array([0.0, 0.0, 0.1, 0.0]),
    )
    expected = process_logits(logits, *args)
    got = process_logits(xps.asarray(logits), *(xps.asarray(a) for a in args))
    assert np.array_equal(np.asarray(got), expected)
    assert np.allclose(expected.sum(axis=1), 1.0)


@settings(max_examples=60, deadline=None)
@given(
    # Across the 2048-entry blocks and the 64-lane groups, with the maximum anywhere.
    vocab=st.integers(1, 7000),
    seed=st.integers(0, 2**32 - 1),
    ties=st.booleans(),
    special=st.sampled_from(["none", "nan", "minus_inf", "all_nan"]),
)
def test_row_argmax_is_numpys_first_maximum(
    builds: dict[str, Logits], vocab: int, seed: int, ties: bool, special: str
) -> None:
    """The whole-row argmax is the first index of the largest non-NaN entry (0 when there
    is none), as np.argmax finds it on the row with NaN taken as -inf, in both builds."""
    row = _special_row(seed, vocab, np.float32, special, share=7)
    if ties:
        row = np.round(row / 4).astype(np.float32)
    expected = int(np.argmax(np.where(np.isnan(row), -np.inf, row)))
    for build in builds.values():
        assert build.lib.t_argmax_f(row.ctypes.data, row.size) == expected


def test_argmax(vector: Logits) -> None:
    row = np.float32([np.nan, 1.0, 3.0, 3.0, np.nan])
    assert vector.lib.t_argmax_f(row.ctypes.data, row.size) == 2
    row = np.float32([np.nan, -np.inf])
    assert vector.lib.t_argmax_f(row.ctypes.data, row.size) == 0


# ---- negative controls ----------------------------------------------------------------


@pytest.mark.slow  # a negative control that compiles a broken copy of the header
def test_top_p_without_the_tie_rule_is_caught(tmp_path: Path) -> None:
    wrong = _build(tmp_path, "mutation1", "-DSPECDEC_LOGITS_MUTATION=1")
    row = np.float32([2.0, 1.0, 1.0, 0.0, 1.0, -1.0])
    with pytest.raises(AssertionError):
        _check_row(wrong, row, 1.0, 0, 0.6, 0.0)


# ---- llama.cpp's order ------------------------------------------------------------------


def test_llama_cpp_order_filters_at_temperature_one(vector: Logits) -> None:
    """The orders differ where they must: at temperature 2 vLLM's top-p 0.7 needs the
    three largest logits, llama.cpp's (at temperature 1) the first two; min-p 0.3 keeps
    ``w >= 0.3`` of ``z`` in vLLM's order and of the logits in llama.cpp's."""
    row = np.float32([3.0, 2.0, 1.0, 0.0, -1.0])
    w1 = fast_expf(row - row.max()).astype(np.float64)
    w2 = fast_expf(row / 2 - 1.5).astype(np.float64)
    assert np.cumsum(w1)[1] >= 0.7 * w1.sum() > np.cumsum(w1)[0]
    assert np.cumsum(w2)[2] >= 0.7 * w2.sum() > np.cumsum(w2)[1]
    expected = {
        ("vllm", 0.7, 0.0): [True, True, True, False, False],
        ("llama.cpp", 0.7, 0.0): [True, True, False, False, False],
        ("vllm", 1.0, 0.3): [True, True, True, False, False],
        ("llama.cpp", 1.0, 0.3): [True, True, False, False, False],
    }
    for (order, top_p, min_p), kept in expected.items():
        law = vector.row_law(row, 2.0, 0, top_p, min_p, order)
        assert _kernel_kept(row, 2.0, law).tolist() == kept, (order, top_p, min_p)
        _check_row(vector, row, 2.0, 0, top_p, min_p, order)
        # The kept tokens get their weights at the temperature.
        p = vector.materialise(row, 2.0, law).astype(np.float64)
        assert np.allclose(p, np.where(kept, w2, 0.0) / w2[kept].sum(), rtol=1e-6)
    # With top-k alone at any temperature, or one filter at temperature 1, they agree.
    for args in [(1.0, 0, 0.7, 0.0), (1.0, 2, 1.0, 0.3), (2.0, 2, 1.0, 0.0), (0.5, 3, 1.0, 0.0)]:
        laws = [vector.row_law(row, *args, order) for order in FILTER_ORDER_CODES]
        assert laws[0].fields() == laws[1].fields()
    # At temperature 1 top-p and min-p together still differ: vLLM's top-p weighs only
    # what min-p kept (3 and 2, so 3 alone reaches 0.7 of it), llama.cpp's the whole row.
    for order, kept in [("vllm", [True] + [False] * 4), ("llama.cpp", [True] * 2 + [False] * 3)]:
        law = vector.row_law(row, 1.0, 0, 0.7, 0.3, order)
        assert _kernel_kept(row, 1.0, law).tolist() == kept


@pytest.mark.slow  # a negative control that compiles a broken copy of the header
def test_llama_cpp_top_p_over_min_p_is_caught(tmp_path: Path) -> None:
    """llama.cpp's top-p runs before min-p, over top-k's set: top-p 0.5 of the whole row
    keeps every token (the tie group of -2 crosses it) and min-p 0.5 then the first two;
    top-p over min-p's two tokens (vLLM's order of the two) would keep only the first."""
    wrong = _build(tmp_path, "mutation2", "-DSPECDEC_LOGITS_MUTATION=2")
    right = _build(tmp_path, "right")
    row = np.float32([0.0, -0.1] + [-2.0] * 20)
    for build, kept in [(right, 2), (wrong, 1)]:
        law = build.row_law(row, 1.5, 0, 0.5, 0.5, "llama.cpp")
        assert _kernel_kept(row, 1.5, law).sum() == kept
    _check_row(right, row, 1.5, 0, 0.5, 0.5, "llama.cpp")
    with pytest.raises(AssertionError):
        _check_row(wrong, row, 1.5, 0, 0.5, 0.5, "llama.cpp")


def _colliding_logits(dtype: type, temperature: float) -> np.ndarray:
    """Two adjacent logits whose z round to one value at ``temperature`` (3: logits in
    [1.5, 2) are 2/3 of an ulp of their z apart)."""
    start = dtype(1.6)
    for _ in range(10000):
        above = np.nextafter(start, dtype(2))
        if _z(np.array([above], dtype), temperature)[0] == _z(np.array([start], dtype),
                                                               temperature)[0]:
            return np.array([above, start], dtype)
        start = above
    raise AssertionError("no collision found")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_llama_cpp_ties_at_the_temperature_are_kept(vector: Logits, dtype: type) -> None:
    """Top-k 1 at temperature 1 keeps the larger of two adjacent logits; at a temperature
    where their z are one value the law keeps both (a tie at the temperature), as vLLM's
    order does."""
    temperature = 3.0
    pair = _colliding_logits(dtype, temperature)
    row = np.concatenate([pair, np.array([-1.0, 0.0], dtype)])
    for args in [(1, 1.0, 0.0), (0, 1e-9, 0.0), (0, 1.0, 1.0)]:
        for order in FILTER_ORDER_CODES:
            law = vector.row_law(row, temperature, *args, order)
            assert _kernel_kept(row, temperature, law).tolist() == [True, True, False, False]
            _check_row(vector, row, temperature, *args, order)
        # At temperature 1 only the larger logit is kept.
        law = vector.row_law(row, 1.0, *args, "llama.cpp")
        assert _kernel_kept(row, 1.0, law).tolist() == [True, False, False, False]


# ---- processing a row in pieces -----------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    vocab=st.integers(2, 9000),
    seed=st.integers(0, 2**32 - 1),
    piece_groups=st.sampled_from([1, 3, 128, 256]),
    point_mass=st.booleans(),
    rho=st.sampled_from([1.0, 0.37, 0.02]),
)
def test_pieces_give_the_bits_of_whole_rows(
    builds: dict[str, Logits],
    vocab: int,
    seed: int,
    piece_groups: int,
    point_mass: bool,
    rho: float,
) -> None:
    """Processed entries and residual sums of a row taken in pieces of 8 j entries (how the
    kernels process a logits row block by block) are those of the whole row, bit for bit,
    in the vector and the scalar build."""
    rng = np.random.default_rng(seed)
    piece = 8 * piece_groups
    target = (rng.standard_normal(vocab) * 3).astype(np.float32)
    draft = (rng.standard_normal(vocab) * 3).astype(np.float32)
    x = int(rng.integers(vocab))
    for build in builds.values():
        p = build.materialise(target, 0.7, build.row_law(target, 0.7, 50, 0.9, 0.0))
        draft_law = build.row_law(draft, 0.7, 0, 1.0, 0.0)
        q = build.materialise(draft, 0.7, draft_law)
        # Entries processed in pieces, each piece on its own (a start that is not a
        # multiple of 8 included, which the kernels never use but the law allows).
        for start in sorted({0, min(piece, vocab - 1), max(vocab - piece - 3, 0)}):
            stop = min(start + piece, vocab)
            part = np.full(stop - start, -7.0, dtype=np.float32)
            build.lib.t_materialise_f(
                draft[start:].ctypes.data,
                stop - start,
                0.7,
                ctypes.byref(draft_law),
                part.ctypes.data,
            )
            assert part.tobytes() == q[start:stop].tobytes()
        other = None if point_mass else q
        mass = x if point_mass else -1
        whole = build.residual_sum(p, other, mass, rho)
        assert whole == build.residual_sum(p, other, mass, rho, piece=piece)


def test_pieces_check_catches_a_lane_shift(vector: Logits) -> None:
    """The piece test can fail: pieces that are not multiples of 8 move entries to other
    lanes, and the sum changes in its last bits for such a row."""
    rng = np.random.default_rng(3)
    # Entries over many binades, so that float64 sums round and the grouping shows.
    p = np.exp(rng.standard_normal(4099) * 8).astype(np.float32)
    sums = {vector.residual_sum(p, None, -1, 1.0, piece=piece) for piece in (5, 8, 13, 4099)}
    assert len(sums) > 1


@pytest.fixture(scope="module")
def few_candidates(tmp_path_factory: pytest.TempPathFactory) -> Logits:
    """The vector build with room for 3 gathered survivors: top-k, top-p and the kept sum
    then scan the row instead of the survivors in almost every case."""
    tmp = tmp_path_factory.mktemp("few_candidates")
    return _build(tmp, "few_candidates", "-DSPECDEC_TOP_P_CANDIDATES=3")


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(1, 5000),
    seed=st.integers(0, 2**32 - 1),
    top_k=st.sampled_from([0, 1, 50]),
    top_p=st.sampled_from([1.0, 0.9]),
    min_p=st.sampled_from([0.0, 1e-3]),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from(["none", "nan", "minus_inf", "plus_inf", "all_nan"]),
)
def test_the_weights_of_the_law_give_the_materialised_row(
    builds: dict[str, Logits],
    vocab: int,
    seed: int,
    top_k: int,
    top_p: float,
    min_p: float,
    dtype: type,
    special: str,
) -> None:
    """The law that keeps its weights (the kernels' one exponential pass) gives the law's
    fields and, divided in place, the materialised row, bit for bit, in both builds; it
    keeps them for every row with mass and without +inf entries (those rows then need no
    second exponential pass), and says when it did not."""
    row = _special_row(seed, vocab, dtype, special, share=7)
    for build in builds.values():
        law = build.row_law(row, 0.8, top_k, top_p, min_p)
        kept_law, divided = build.law_from_weights(row, 0.8, top_k, top_p, min_p)
        assert kept_law.fields() == law.fields()
        if law.status == 0 and law.num_infinite == 0:
            assert divided is not None
        if divided is not None:
            expected = build.materialise(row, 0.8, law)
            assert np.array_equal(divided.view(np.uint8), expected.view(np.uint8))


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Logits:
    """The vector build without the sixteen-lane (AVX-512) exponential pass and partitions:
    eight-lane (AVX2) partitions and exponential pass in groups where the CPU has them."""
    return _build(tmp_path_factory.mktemp("narrow"), "narrow", "-DSPECDEC_AVX512_PATH=0")


@pytest.fixture(scope="module")
def one_lane(tmp_path_factory: pytest.TempPathFactory) -> Logits:
    """The vector build without its AVX-512 and AVX2 code: one-lane selections, and the
    eight-lane exponential pass one group at a time."""
    return _build(tmp_path_factory.mktemp("one_lane"), "one_lane", "-DSPECDEC_AVX512_PATH=0",
                  "-DSPECDEC_NO_X86_AVX2")  # fmt: skip


def _vector_selections() -> set[str]:
    """The x86 clones whose vector selections this CPU runs (none elsewhere)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return set()
    return {clone for clone, flags in _CLONES.items() if flags <= _cpu_flags()}


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([1.0, 0.7]),
    filters=st.sampled_from([(0, 1.0, 0.0), (50, 0.9, 0.0), (0, 1.0, 0.01), (0, 0.8, 0.0)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from(["none", "nan", "minus_inf"]),
)
def test_every_width_of_the_exponential_pass_gives_the_same_bits(
    vector: Logits,
    narrow: Logits,
    one_lane: Logits,
    vocab: int,
    seed: int,
    temperature: float,
    filters: tuple[int, float, float],
    dtype: type,
    special: str,
) -> None:
    """The sixteen-lane pass (AVX-512 CPUs), the eight-lane one in groups side by side (AVX2
    CPUs) and the eight-lane one a group at a time give the law's fields and its kept
    weights bit for bit, whatever the row's length modulo 16 and 32."""
    if platform.machine() not in ("x86_64", "AMD64") or not _CLONES["x86-64-v3"] <= _cpu_flags():
        pytest.skip("this CPU has no AVX2: every build runs the eight-lane pass a group at a time")
    row = _special_row(seed, vocab, dtype, special, share=5)
    (law, weights), *others = [
        build.law_from_weights(row, temperature, *filters) for build in (vector, narrow, one_lane)
    ]
    for other_law, other_weights in others:
        assert np.array(law.fields()[:3]).tobytes() == np.array(other_law.fields()[:3]).tobytes()
        assert law.fields()[3:] == other_law.fields()[3:]
        assert (weights is None) == (other_weights is None)
        if weights is not None:
            assert weights.tobytes() == other_weights.tobytes()


@pytest.mark.slow  # a negative control that compiles broken copies of the header
@pytest.mark.parametrize(
    ("mutation", "clone", "defines"),
    [(3, "x86-64-v4", ()),
     (12, "x86-64-v4", ()),
     (12, "x86-64-v3", ("-DSPECDEC_AVX512_PATH=0",))],
)  # fmt: skip
def test_the_width_comparison_sees_a_different_sum(
    one_lane: Logits, tmp_path: Path, mutation: int, clone: str, defines: tuple[str, ...]
) -> None:
    """Negative controls: a sixteen-lane pass that adds its halves in the wrong order (lane l
    takes w[8 + l] before w[l], mutation 3), and a pass in groups that adds its groups last
    first (mutation 12, on sixteen and on eight lanes), change the normaliser's bits on some
    row."""
    if platform.machine() not in ("x86_64", "AMD64") or not _CLONES[clone] <= _cpu_flags():
        pytest.skip(f"this CPU does not run {clone} code")
    swapped = _build(tmp_path, "swapped", f"-DSPECDEC_LOGITS_MUTATION={mutation}", *defines)
    rows = (np.random.default_rng(5).standard_normal((20, 1000)) * 4).astype(np.float32)
    assert any(
        swapped.row_law(row, 1.0, 0, 1.0, 0.0).normaliser
        != one_lane.row_law(row, 1.0, 0, 1.0, 0.0).normaliser
        for row in rows
    )


@settings(max_examples=150, deadline=None)
@given(
    # Rows up to SPECDEC_TOP_P_CANDIDATES are keyed and gathered whole, in full groups of
    # sixteen (AVX-512) and a tail.
    vocab=st.integers(1, 2048),
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([1.0, 0.7]),
    top_k=st.sampled_from([1, 3, 50, 400]),
    top_p=st.sampled_from([1.0, 0.9]),
    min_p=st.sampled_from([0.0, 0.01]),
    ties=st.booleans(),
    order=st.sampled_from(["random", "ascending", "descending"]),
    masked=st.booleans(),
)
def test_both_widths_of_the_short_row_selections_give_the_same_law(
    vector: Logits,
    narrow: Logits,
    one_lane: Logits,
    vocab: int,
    seed: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    ties: bool,
    order: str,
    masked: bool,
) -> None:
    """The sixteen-lane partitions of top-k's quickselect and gathering of its survivors
    (AVX-512 CPUs) and the eight-lane partitions (AVX2 CPUs) give the law's fields and kept
    weights of the one-lane ones, bit for bit: with tie groups at the boundary, signed
    zeros, NaN and -inf entries, sorted prefixes."""
    if not _vector_selections():
        pytest.skip("this CPU has neither AVX-512 nor AVX2: every build runs one lane")
    row = _survivor_row(seed, vocab, np.float32, ties, order, masked)
    if ties:
        row[np.random.default_rng(seed).integers(vocab, size=max(vocab // 9, 1))] = -0.0
    filters = (top_k, top_p, min_p)
    law, weights = one_lane.law_from_weights(row, temperature, *filters)
    for build in (vector, narrow):
        wide_law, wide_weights = build.law_from_weights(row, temperature, *filters)
        assert wide_law.fields() == law.fields()
        assert (wide_weights is None) == (weights is None)
        if wide_weights is not None:
            assert wide_weights.tobytes() == weights.tobytes()


@pytest.mark.parametrize(
    ("mutation", "clone", "defines", "what"),
    [(6, "x86-64-v4", (), "a sixteen-lane gathering that drops the entries at the floor key"),
     (7, "x86-64-v4", (), "a sixteen-lane first partition that compares keys as signed"),
     (7, "x86-64-v3", ("-DSPECDEC_AVX512_PATH=0",),
      "an eight-lane first partition that compares keys as signed")],
)  # fmt: skip
def test_the_short_row_width_comparison_sees_a_wrong_selection(
    one_lane: Logits, tmp_path: Path, mutation: int, clone: str, defines: tuple[str, ...],
    what: str,
) -> None:  # fmt: skip
    """Negative controls: each broken vector selection gives another law than the one-lane
    selections on some short row with ties."""
    if clone not in _vector_selections():
        pytest.skip(f"this CPU does not run {clone} code")
    wrong = _build(tmp_path, f"mutation{mutation}",
                   f"-DSPECDEC_LOGITS_MUTATION={mutation}", *defines)  # fmt: skip
    rows = [_survivor_row(seed, 1000, np.float32, True, "random", False) for seed in range(20)]
    assert any(
        wrong.row_law(row, 1.0, 50, 1.0, 0.0).fields()
        != one_lane.row_law(row, 1.0, 50, 1.0, 0.0).fields()
        for row in rows
    ), what


def _weights_near_midpoints(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Float weights w and normalisers n >= 1 whose w / n lies within a few float64 ulps of
    a float32 midpoint: n = w / m rounded, for a midpoint m <= w, so that a product by the
    rounded 1 / n may round to the other float32 than the division."""
    rng = np.random.default_rng(seed)
    low = rng.uniform(1e-6, 0.5, count).astype(np.float32)
    midpoints = low.astype(np.float64) + np.spacing(low).astype(np.float64) / 2
    weights = (midpoints * rng.uniform(1.0, 2.0, count)).astype(np.float32)
    weights = np.maximum(weights, np.nextafter(midpoints.astype(np.float32), np.float32(1)))
    return weights, weights.astype(np.float64) / midpoints


def test_block_sums_by_products_give_the_divisions_bits(vector: Logits, narrow: Logits) -> None:
    """The AVX-512 block sums (a product by the rounded reciprocal, each result checked for
    a nearby float32 midpoint) give the division's processed row and block sums, bit for
    bit: on random rows and on weights whose w / n lies on a float32 midpoint to within a
    few float64 ulps, where the unchecked product rounds the other way (shown below)."""
    rng = np.random.default_rng(11)
    for block in (8, 16, 1008):
        row = np.exp(rng.standard_normal(4 * block + 13) * 4 - 8).astype(np.float32)
        row[rng.integers(row.size, size=5)] = 0.0
        row[:3] = [1e-40, 1e-45, 0.0]  # float32 subnormal quotients take the division
        for normaliser in (1.0, 1.0 + 2.0**-40, float(row.astype(np.float64).sum()), 3e5):
            wide, wide_sums = vector.block_sums(row, normaliser, block)
            exact = (row.astype(np.float64) / normaliser).astype(np.float32)
            assert wide.tobytes() == exact.tobytes()
            assert wide_sums.tobytes() == narrow.block_sums(row, normaliser, block)[1].tobytes()
    weights, normalisers = _weights_near_midpoints(2000, 3)
    product_differs = 0
    for w, n in zip(weights, normalisers):
        row = np.full(32, w, dtype=np.float32)
        exact = np.float32(np.float64(w) / n)
        product_differs += np.float32(np.float64(w) * (1.0 / n)) != exact
        divided, sums = vector.block_sums(row, float(n), 8)
        assert (divided == exact).all(), (w, n)
        assert sums.tobytes() == narrow.block_sums(row, float(n), 8)[1].tobytes()
    assert product_differs > 0  # the cases are the hard ones


@pytest.mark.slow  # a negative control that compiles a broken copy of the header
def test_the_product_check_sees_a_midpoint(tmp_path: Path) -> None:
    """Negative control: AVX-512 block sums that round every product without the midpoint
    check (mutation 5) give another float32 for some weight near a midpoint."""
    if platform.machine() not in ("x86_64", "AMD64") or not _CLONES["x86-64-v4"] <= _cpu_flags():
        pytest.skip("this CPU has no AVX-512")
    unchecked = _build(tmp_path, "unchecked", "-DSPECDEC_LOGITS_MUTATION=5")
    weights, normalisers = _weights_near_midpoints(2000, 3)
    assert any(
        unchecked.block_sums(np.full(32, w, np.float32), float(n), 8)[0][0]
        != np.float32(np.float64(w) / n)
        for w, n in zip(weights, normalisers)
    )


@pytest.fixture(scope="module")
def radix_only(tmp_path_factory: pytest.TempPathFactory) -> Logits:
    """The vector build whose top-k key over gathered survivors is the radix select's from
    the start, never the quickselect's."""
    tmp = tmp_path_factory.mktemp("radix_only")
    return _build(tmp, "radix_only", "-DSPECDEC_QUICKSELECT_PARTITIONS=0")


def _survivor_row(
    seed: int, vocab: int, dtype: type, ties: bool, order: str, masked: bool
) -> np.ndarray:
    """A row for the gathered-survivor comparisons: random, rounded into large tie groups
    (at the boundaries too), sorted either way (a prefix of the smallest or the largest
    values), and with NaN and -inf entries."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(vocab) * 3).astype(dtype)
    if ties:
        row = np.round(row).astype(dtype)
    if order != "random":
        row = np.sort(row) if order == "ascending" else -np.sort(-row)
    if masked:
        row[rng.integers(vocab, size=max(vocab // 10, 1))] = rng.choice([np.nan, -np.inf])
    return row


@pytest.mark.slow  # two more builds; the law of the survivors is checked against the reference
@settings(max_examples=80, deadline=None)
@given(
    # Long rows: top-k's prefix sample is longer than the key buffers and is cut down.
    vocab=st.one_of(st.integers(1, 6000), st.sampled_from([40_000, 128_256])),
    seed=st.integers(0, 2**32 - 1),
    top_k=st.sampled_from([1, 2, 5, 50, 256, 700]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 1e-6]),
    min_p=st.sampled_from([0.0, 1e-3]),
    dtype=st.sampled_from([np.float32, np.float64]),
    ties=st.booleans(),
    order=st.sampled_from(["random", "ascending", "descending"]),
    masked=st.booleans(),
    filter_order=st.sampled_from(sorted(FILTER_ORDER_CODES)),
    temperature=st.sampled_from([0.9, 1.0]),
)
def test_gathered_survivors_give_the_law_of_the_row_scans(
    vector: Logits,
    few_candidates: Logits,
    radix_only: Logits,
    vocab: int,
    seed: int,
    top_k: int,
    top_p: float,
    min_p: float,
    dtype: type,
    ties: bool,
    order: str,
    masked: bool,
    filter_order: str,
    temperature: float,
) -> None:
    """Top-k's survivors gathered above the K-th largest of a prefix sample (then top-p and
    the kept sum over them alone) give the cutoff and normaliser, bit for bit, of the full
    row scans: for rows whose prefix holds the smallest values (too many survivors: the row
    scans), the largest, ties, NaN and -inf entries; and the quickselect of top-k's key
    finds the radix select's (rows up to 2048 entries are gathered whole; on long rows a
    sample longer than the key buffers is keyed from the survivors of its first entries)."""
    row = _survivor_row(seed, vocab, dtype, ties, order, masked)
    gathered = vector.row_law(row, temperature, top_k, top_p, min_p, filter_order)
    scanned = few_candidates.row_law(row, temperature, top_k, top_p, min_p, filter_order)
    assert gathered.fields() == scanned.fields()
    radix = radix_only.row_law(row, temperature, top_k, top_p, min_p, filter_order)
    assert radix.fields() == gathered.fields()


def test_survivor_comparison_sees_a_different_law(vector: Logits, few_candidates: Logits) -> None:
    """The law comparison can fail: a kept set one token smaller gives other fields."""
    row = (np.random.default_rng(1).standard_normal(3000) * 3).astype(np.float32)
    assert vector.row_law(row, 0.9, 50, 1.0, 0.0).fields() != (
        few_candidates.row_law(row, 0.9, 49, 1.0, 0.0).fields()
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_llama_cpp_gathered_survivors_see_ties_at_the_temperature(
    vector: Logits, few_candidates: Logits, dtype: type
) -> None:
    """Top-k's gathered survivors miss a token below them whose z ties with the lowest kept
    one at the temperature: the kept sum then runs over the row, and gives the bits of the
    row scans."""
    temperature = 3.0
    rng = np.random.default_rng(3)
    row = (rng.standard_normal(4000) - 6.0).astype(dtype)
    row[[100, 2000]] = _colliding_logits(dtype, temperature)
    law = vector.row_law(row, temperature, 1, 1.0, 0.0, "llama.cpp")
    assert np.flatnonzero(_kernel_kept(row, temperature, law)).tolist() == [100, 2000]
    scanned = few_candidates.row_law(row, temperature, 1, 1.0, 0.0, "llama.cpp")
    assert law.fields() == scanned.fields()
    _check_row(vector, row, temperature, 1, 1.0, 0.0, "llama.cpp")


# ---- threads inside a row -------------------------------------------------------------

# The chunk of the builds below: small rows then span many chunks (the extension's is 4096).
_TEST_CHUNK = 64


def _threaded_build(tmp: Path, stem: str, *defines: str) -> Logits:
    """A build whose row threads are OpenMP threads, where the compiler has OpenMP (else the
    chunked passes run one chunk after the other: the same code, the same bits)."""
    chunk = f"-DSPECDEC_ROW_CHUNK={_TEST_CHUNK}"
    try:
        return _build(tmp, f"{stem}_openmp", chunk, "-fopenmp", *defines)
    except AssertionError:  # no OpenMP in this compiler: build_library asserts
        return _build(tmp, stem, chunk, *defines)


@pytest.fixture(scope="module")
def threaded_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Logits]:
    return _vector_and_scalar(_threaded_build, tmp_path_factory.mktemp("row_threads"), "threads")


def _law_bits(law: RowLaw) -> tuple[bytes, tuple[Any, ...]]:
    """A law's float fields as their bits (so that -0 and +0 differ), and its counts."""
    return np.array(law.fields()[:3]).tobytes(), law.fields()[3:]


def _thread_differences(
    build: Logits,
    row: np.ndarray,
    temperature: float,
    filters: tuple[int, float, float],
    filter_order: str,
    threads: int,
) -> list[str]:
    """What differs, bit for bit, between the law (its fields, and the processed row of its
    kept weights) on ``threads`` row threads and on one."""
    differences = []
    for keep_weights in (True, False):
        one_law, one_row = build.law_on_threads(row, temperature, filters, filter_order, 1,
                                                keep_weights)  # fmt: skip
        law, processed = build.law_on_threads(
            row, temperature, filters, filter_order, threads, keep_weights
        )
        if _law_bits(law) != _law_bits(one_law):
            differences.append(f"law fields {law.fields()} != {one_law.fields()}")
        if (processed is None) != (one_row is None) or (
            processed is not None and processed.tobytes() != one_row.tobytes()
        ):
            differences.append("the processed row")
    return differences


def _core_processed_rows(rows: np.ndarray, table: np.ndarray, row_threads: int) -> np.ndarray:
    out = np.full_like(rows, -7.0)
    _core.processed_rows(rows, table, out, 1, row_threads=row_threads)
    return out


@settings(max_examples=120, deadline=None)
@given(
    vocab=st.integers(1, 40 * _TEST_CHUNK + 5),
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([1.0, 0.7, 2.5, 1e-30]),
    filters=st.sampled_from(
        [(0, 1.0, 0.0), (50, 1.0, 0.0), (0, 0.95, 0.0), (0, 1.0, 0.05), (50, 0.95, 0.0),
         (40, 0.9, 0.01), (1, 1.0, 0.0)]
    ),  # fmt: skip
    filter_order=st.sampled_from(sorted(FILTER_ORDER_CODES)),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from(["none", "nan", "minus_inf", "plus_inf", "all_minus_inf",
                             "zero_maximum", "ties"]),  # fmt: skip
    threads=st.sampled_from([2, 3]),
)
def test_threads_inside_a_row_give_the_bits_of_one_thread(
    threaded_builds: dict[str, Logits],
    vocab: int,
    seed: int,
    temperature: float,
    filters: tuple[int, float, float],
    filter_order: str,
    dtype: type,
    special: str,
    threads: int,
) -> None:
    """The law of a row split into chunks between row threads (the maximum, the weights and
    their sum) gives the law's fields (z_max's sign included) and its processed row bit for
    bit as on one thread, in the vector and the scalar build, whether it keeps its weights
    or not: rows over many chunks, with NaN, +inf (uniform over them), -inf, all -inf (no
    mass), a maximum of zero of either sign, ties; and the extension's processed rows (its
    chunks of 4096) with row_threads 2 against 1."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(vocab) * 4).astype(dtype)
    where = rng.integers(vocab, size=max(vocab // 7, 1))
    if special == "nan":
        row[where] = np.nan
    elif special == "minus_inf":
        row[where] = -np.inf
    elif special == "plus_inf":
        row[rng.integers(vocab, size=3)] = np.inf
    elif special == "all_minus_inf":
        row[:] = -np.inf
    elif special == "zero_maximum":
        # Zeros of both signs, everything else below them: which zero the maximum scan
        # keeps depends on where they fall among its lanes and chunks.
        row = -np.abs(row)
        row[where] = rng.choice(np.array([0.0, -0.0], dtype=dtype), size=where.size)
    elif special == "ties":
        row = np.round(row).astype(dtype)
    for name, build in threaded_builds.items():
        differences = _thread_differences(build, row, temperature, filters, filter_order, threads)
        assert not differences, (name, differences)
    # The extension (its chunks of 4096) on rows of two chunks or more made of this one,
    # of a length that is not a multiple of the chunk.
    length = 2 * 4096 + 1 + seed % 5000
    long_rows = np.stack([np.resize(row, length), np.resize(np.roll(row, 5), length)])
    code = FILTER_ORDER_CODES[filter_order]
    table = np.tile(np.array([temperature, *filters, code], dtype=np.float64), (2, 1))
    one = _core_processed_rows(long_rows, table, 1)
    assert _core_processed_rows(long_rows, table, threads).tobytes() == one.tobytes()


def test_a_zero_maximum_keeps_the_sign_of_one_thread(threaded_builds: dict[str, Logits]) -> None:
    """A row whose maximum is zero: the one-thread scan keeps the first zero in element
    order (-0 at entry 4), while the second chunk alone has +0, so chunk maxima combined in
    the threads' order could give +0; the threaded law gives -0, the one thread's sign."""
    build = threaded_builds["vector"]
    for dtype in (np.float32, np.float64):
        row = np.full(2 * _TEST_CHUNK, -1.0, dtype=dtype)
        row[4], row[_TEST_CHUNK + 3] = -0.0, 0.0
        assert math.copysign(1.0, build.row_max(row, 1.0)) == -1.0
        assert math.copysign(1.0, build.row_max(row[_TEST_CHUNK:], 1.0)) == 1.0
        for threads in (2, 3):
            for _ in range(20):  # the threads' order varies from run to run
                law, _ = build.law_on_threads(row, 1.0, (0, 1.0, 0.0), "vllm", threads, True)
                assert math.copysign(1.0, law.z_max) == -1.0


@pytest.mark.slow  # a negative control that compiles a broken copy of the header
def test_the_thread_comparison_sees_chunk_sums(tmp_path: Path) -> None:
    """Negative control: a threaded exponential pass that returns the sum of its chunks'
    sums (a float64 order other than one thread's) changes the normaliser's bits on some
    row, and the comparison of the test above reports it."""
    chunk_sums = _threaded_build(tmp_path, "chunk_sums", "-DSPECDEC_LOGITS_MUTATION=4")
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        rows = (rng.standard_normal((20, 30 * _TEST_CHUNK)) * 4).astype(dtype)
        found = [_thread_differences(chunk_sums, row, 1.0, (0, 1.0, 0.0), "vllm", 2)
                 for row in rows]  # fmt: skip
        assert any(found), dtype
        # On one thread the mutation changes nothing: it is the chunked pass that differs.
        one_law, _ = chunk_sums.law_on_threads(rows[0], 1.0, (0, 1.0, 0.0), "vllm", 1, True)
        assert one_law.fields() == chunk_sums.row_law(rows[0], 1.0, 0, 1.0, 0.0).fields()


@settings(max_examples=80, deadline=None)
@given(
    vocab=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([1.0, 0.7]),
    cutoff=st.sampled_from([-np.inf, -2.0, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from(["none", "nan", "minus_inf"]),
)
def test_the_sum_of_the_stored_weights_is_the_kept_sum(
    builds: dict[str, Logits],
    narrow: Logits,
    vocab: int,
    seed: int,
    temperature: float,
    cutoff: float,
    dtype: type,
    special: str,
) -> None:
    """The sum the threaded pass takes over the stored weights (specdec_residual_sum with
    q = 0, rho = 1, scale = 1) has the bits of the sum the one-thread exponential pass
    returns, in every build (sixteen lanes, eight, scalar), whatever the row's length
    modulo 16 and whichever groups the cutoff skips."""
    row = _special_row(seed, vocab, dtype, special, share=5)
    z = row / dtype(temperature)
    z_max = float(np.nanmax(np.where(np.isnan(z), -np.inf, z)))
    if not math.isfinite(z_max):
        z_max = 0.0
    for build in (*builds.values(), narrow):
        kept, stored = build.kept_sum(row, temperature, z_max, cutoff)
        assert np.float64(kept).tobytes() == np.float64(stored).tobytes()
