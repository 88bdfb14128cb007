"""Top-k's survivors (specdec_np/_kernels/src/cpu/survivors.h and logits_law.h): with top-k
on, a long row's law, its processed row and its draw come from the survivors alone, and
must give the bits of the law that scans the whole row.

The headers are compiled here twice: as the extension builds them (the survivors' path on),
and with room for 3 gathered entries (SPECDEC_TOP_P_CANDIDATES=3), where every filter scans
the row (the path without survivors).  The two must give the same law, bit for bit, and the
survivors' draw must give the token of the inverse-CDF draw over the whole processed row
(draw_by_blocks' block sums, emulated here), at uniforms on every CDF boundary.  Wrong
variants (a draw that adds survivors to the wrong lanes; survivors that drop the tie group
at top-k's key) must be caught.  The extension's ``processed_probs`` and ``sample_tokens``
are checked against the reference and the draw from probabilities.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_headers import build_library

import specdec_np
from specdec_np._reference.chains import process_logits
from specdec_np._runtime.contract import FILTER_ORDER_CODES

_WRAPPER = r"""
#include <stdlib.h>
#include "logits_law.h"

/* The law of a row, its processed row in out (from the survivors where the law has them)
 * and the survivors' count (-1: none). */
#define T_SURVIVORS(SUFFIX, T)                                                              \
    ptrdiff_t t_law_##SUFFIX(const T *l, ptrdiff_t V, T t, int64_t k, double p, double m,   \
                             int order, specdec_row_law *law, T *out)                      \
    {                                                                                      \
        specdec_law_scratch *scratch = specdec_law_scratch_new();                          \
        specdec_row_law_##SUFFIX(l, V, t, k, p, m, order, scratch, NULL, law);              \
        ptrdiff_t survivors = scratch->survivors;                                          \
        if (survivors >= 0)                                                                \
            specdec_survivors_row_##SUFFIX(scratch, law, V, out);                          \
        else                                                                               \
            specdec_law_materialise_##SUFFIX(l, V, t, law, out);                           \
        free(scratch);                                                                     \
        return survivors;                                                                  \
    }                                                                                      \
    /* The survivors' draw at each of the n uniforms v (-2 where the law has none). */     \
    void t_draws_##SUFFIX(const T *l, ptrdiff_t V, T t, int64_t k, double p, double m,      \
                          int order, ptrdiff_t block, const double *v, ptrdiff_t n,        \
                          int64_t *tokens)                                                 \
    {                                                                                      \
        specdec_law_scratch *scratch = specdec_law_scratch_new();                          \
        specdec_row_law law;                                                               \
        for (ptrdiff_t i = 0; i < n; ++i) {                                                \
            specdec_row_law_##SUFFIX(l, V, t, k, p, m, order, scratch, NULL, &law);         \
            tokens[i] = scratch->survivors >= 0                                            \
                            ? specdec_survivors_draw_##SUFFIX(scratch, &law, block, v[i])  \
                            : -2;                                                          \
        }                                                                                  \
        free(scratch);                                                                     \
    }                                                                                      \
    /* The block pass and the gathering alone. */                                          \
    void t_maxima_##SUFFIX(const T *l, ptrdiff_t V, ptrdiff_t block, T *maxima)            \
    {                                                                                      \
        specdec_block_maxima_##SUFFIX(l, V, block, maxima);                                \
    }                                                                                      \
    ptrdiff_t t_gather_##SUFFIX(const T *l, ptrdiff_t V, ptrdiff_t block, const T *maxima, \
                                ptrdiff_t blocks, T floor, T *z, ptrdiff_t *y)             \
    {                                                                                      \
        return specdec_gather_blocks_##SUFFIX(l, V, block, maxima, blocks, floor, z, y);   \
    }

T_SURVIVORS(f, float)
T_SURVIVORS(d, double)
"""


class RowLaw(ctypes.Structure):
    _fields_ = [
        ("z_max", ctypes.c_double),
        ("cutoff", ctypes.c_double),
        ("normaliser", ctypes.c_double),
        ("num_infinite", ctypes.c_int64),
        ("status", ctypes.c_int64),
    ]


class Survivors:
    def __init__(self, lib: Any) -> None:
        self.lib = lib
        p = ctypes.c_void_p
        for kind, scalar in (("f", ctypes.c_float), ("d", ctypes.c_double)):
            law = getattr(lib, f"t_law_{kind}")
            law.argtypes = [
                p, ctypes.c_ssize_t, scalar, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                ctypes.c_int, p, p,
            ]  # fmt: skip
            law.restype = ctypes.c_ssize_t
            getattr(lib, f"t_draws_{kind}").argtypes = [
                p, ctypes.c_ssize_t, scalar, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                ctypes.c_int, ctypes.c_ssize_t, p, ctypes.c_ssize_t, p,
            ]  # fmt: skip

    @staticmethod
    def _kind(row: np.ndarray) -> str:
        return "f" if row.dtype == np.float32 else "d"

    def law(self, row: np.ndarray, case: dict) -> tuple[tuple, int, np.ndarray]:
        law, out = RowLaw(), np.empty_like(row)
        survivors = getattr(self.lib, f"t_law_{self._kind(row)}")(
            row.ctypes.data, row.size, case["temperature"], case["top_k"], case["top_p"],
            case["min_p"], FILTER_ORDER_CODES[case["order"]], ctypes.byref(law),
            out.ctypes.data,
        )  # fmt: skip
        fields = tuple(getattr(law, name) for name, _ in RowLaw._fields_)
        return fields, survivors, out

    def draws(self, row: np.ndarray, case: dict, block: int, uniforms: np.ndarray) -> np.ndarray:
        uniforms = np.ascontiguousarray(uniforms, dtype=np.float64)
        tokens = np.empty(uniforms.size, dtype=np.int64)
        getattr(self.lib, f"t_draws_{self._kind(row)}")(
            row.ctypes.data, row.size, case["temperature"], case["top_k"], case["top_p"],
            case["min_p"], FILTER_ORDER_CODES[case["order"]], block, uniforms.ctypes.data,
            uniforms.size, tokens.ctypes.data,
        )  # fmt: skip
        return tokens


def _build(tmp: Path, stem: str, *defines: str) -> Survivors:
    return Survivors(build_library(tmp, stem, _WRAPPER, *defines))


@pytest.fixture(scope="module")
def survivors(tmp_path_factory: pytest.TempPathFactory) -> Survivors:
    return _build(tmp_path_factory.mktemp("survivors"), "survivors")


@pytest.fixture(scope="module")
def generic_survivors(tmp_path_factory: pytest.TempPathFactory) -> Survivors:
    """The block pass and the gathering in the generic code, not in AVX2 instructions."""
    return _build(tmp_path_factory.mktemp("generic"), "generic",
                  "-DSPECDEC_NO_X86_AVX2")  # fmt: skip


@pytest.fixture(scope="module")
def eight_lane_survivors(tmp_path_factory: pytest.TempPathFactory) -> Survivors:
    """Without the AVX-512 code: top-k's partitions on eight lanes where the CPU has AVX2."""
    return _build(tmp_path_factory.mktemp("eight"), "eight", "-DSPECDEC_AVX512_PATH=0")


@pytest.fixture(scope="module")
def one_lane_survivors(tmp_path_factory: pytest.TempPathFactory) -> Survivors:
    """Without the AVX-512 and the AVX2 code: top-k's partitions one entry at a time."""
    return _build(tmp_path_factory.mktemp("one"), "one", "-DSPECDEC_AVX512_PATH=0",
                  "-DSPECDEC_NO_X86_AVX2")  # fmt: skip


@pytest.fixture(scope="module")
def row_scans(tmp_path_factory: pytest.TempPathFactory) -> Survivors:
    """Room for 3 gathered entries: top-k's filters scan the row."""
    return _build(tmp_path_factory.mktemp("row_scans"), "row_scans",
                  "-DSPECDEC_TOP_P_CANDIDATES=3")  # fmt: skip


# ---- rows and cases -------------------------------------------------------------------


def _row(kind: str, vocab: int, dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row = 3.0 * rng.standard_normal(vocab)
    if kind == "ties":
        # Few distinct values: top-k's K-th value is shared by many entries.
        row = np.round(row * 2.0) / 2.0
    elif kind == "specials":
        row[rng.choice(vocab, 50, replace=False)] = np.nan
        row[rng.choice(vocab, 50, replace=False)] = -np.inf
        row[rng.choice(vocab, 3, replace=False)] = row.max() + 1.0  # a tie at the top
    elif kind == "plus_infinity":
        row[rng.choice(vocab, 3, replace=False)] = np.inf
    elif kind == "ascending":
        row = np.sort(row)
    elif kind == "nan_blocks":
        # Whole blocks of NaN (the first ones, one inside, the partial last one): a block's
        # maximum must skip them, and a block of NaN alone must never be gathered.
        row[:640] = np.nan
        row[1024:1088] = np.nan
        row[-10:] = np.nan
    elif kind == "zeros":
        # The maximum is a zero of either sign (the law's z_max keeps the first one's).
        row = -np.abs(row)
        row[rng.choice(vocab, 20, replace=False)] = -0.0
        row[rng.choice(vocab, 20, replace=False)] = 0.0
    return np.ascontiguousarray(row.astype(dtype))


ROWS = ["normal", "ties", "specials", "plus_infinity", "ascending", "zeros", "nan_blocks"]
# (temperature, top_k, top_p, min_p): llama.cpp's chain, top-k alone, k = 1, large k.
FILTERS = [
    (0.8, 40, 0.95, 0.05),
    (1.0, 40, 1.0, 0.0),
    (2.0, 1, 1.0, 0.0),
    (0.3, 500, 0.9, 0.0),
    (1.0, 50, 0.5, 0.1),
]


def _cases() -> list[tuple]:
    cases = []
    for vocab in (5000, 20000):
        for kind in ROWS:
            for filters in FILTERS:
                for order in ("vllm", "llama.cpp"):
                    cases.append((vocab, kind, filters, order))
    # k = V - 1: the survivors would be most of the row, which is scanned.
    cases.append((5000, "ties", (0.8, 4999, 0.95, 0.05), "vllm"))
    cases.append((5000, "normal", (1.0, 4999, 1.0, 0.0), "llama.cpp"))
    return cases


def _case(filters: tuple, order: str) -> dict:
    temperature, top_k, top_p, min_p = filters
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, order=order)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


# ---- the law and its processed row ------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_survivors_give_the_bits_of_the_row_scans(
    survivors: Survivors, row_scans: Survivors, dtype: type
) -> None:
    used = 0
    for seed, (vocab, kind, filters, order) in enumerate(_cases()):
        row = _row(kind, vocab, dtype, seed)
        case = _case(filters, order)
        law, count, out = survivors.law(row, case)
        scanned_law, _, scanned = row_scans.law(row, case)
        used += count >= 0
        context = f"{kind} V={vocab} {case}"
        assert np.array_equal(np.array(law).view(np.uint64),
                              np.array(scanned_law).view(np.uint64)), context  # fmt: skip
        np.testing.assert_array_equal(_bits(out), _bits(scanned), err_msg=context)
    # Most cases go through the survivors (not the +inf rows, nor k = V - 1).
    assert used >= len(_cases()) // 2


def test_every_width_of_the_partitions_gives_the_same_law(
    survivors: Survivors, eight_lane_survivors: Survivors, one_lane_survivors: Survivors
) -> None:
    """Top-k's key over the block maxima and over the survivors, by partitions of sixteen
    lanes (AVX-512), eight (AVX2) or one: the same law and processed row, bit for bit."""
    for seed, (vocab, kind, filters, order) in enumerate(_cases()):
        row = _row(kind, vocab, np.float32, seed)
        case = _case(filters, order)
        law, count, out = one_lane_survivors.law(row, case)
        for build in (survivors, eight_lane_survivors):
            wide_law, wide_count, wide_out = build.law(row, case)
            context = f"{kind} V={vocab} {case}"
            assert np.array_equal(np.array(wide_law).view(np.uint64),
                                  np.array(law).view(np.uint64)), context  # fmt: skip
            assert wide_count == count, context
            np.testing.assert_array_equal(_bits(wide_out), _bits(out), err_msg=context)


def test_survivors_law_is_the_reference_law(survivors: Survivors) -> None:
    for seed, (vocab, kind, filters, order) in enumerate(_cases()):
        row = _row(kind, vocab, np.float32, seed)
        case = _case(filters, order)
        _, _, out = survivors.law(row, case)
        reference = process_logits(
            row[None], np.array([case["temperature"]]), np.array([case["top_k"]]),
            np.array([case["top_p"]]), np.array([case["min_p"]]), order,
        )[0]  # fmt: skip
        context = f"{kind} V={vocab} {case}"
        # The kept sets agree except where top-p's boundary lies within rounding.
        if ((out > 0) == (reference > 0)).all():
            np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-30, err_msg=context)
        else:
            assert case["top_p"] < 1.0, context


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_pass_and_gathering_have_the_generic_bits(
    survivors: Survivors, generic_survivors: Survivors, dtype: type
) -> None:
    """The AVX2 block maxima and gathering (where the CPU has AVX2) against the generic
    code: the same maxima bit for bit (a zero's sign included) and the same entries."""
    kind = "f" if dtype == np.float32 else "d"
    p = ctypes.c_void_p
    for library in (survivors.lib, generic_survivors.lib):
        getattr(library, f"t_maxima_{kind}").argtypes = [p, ctypes.c_ssize_t, ctypes.c_ssize_t, p]
        gather = getattr(library, f"t_gather_{kind}")
        gather.argtypes = [p, ctypes.c_ssize_t, ctypes.c_ssize_t, p, ctypes.c_ssize_t,
                           ctypes.c_float if kind == "f" else ctypes.c_double, p, p]
        gather.restype = ctypes.c_ssize_t
    gathered = 0
    for seed, kind_of_row in enumerate(ROWS):
        for vocab, block in ((5000, 64), (20000, 128), (20037, 256)):
            row = _row(kind_of_row, vocab, dtype, seed)
            blocks = -(-vocab // block)
            found = []
            for library in (survivors.lib, generic_survivors.lib):
                maxima = np.empty(blocks, dtype=dtype)
                getattr(library, f"t_maxima_{kind}")(row.ctypes.data, vocab, block,
                                                     maxima.ctypes.data)
                floor = np.sort(maxima[~np.isnan(maxima)])[-min(40, blocks)]
                z, y = np.empty(2048, dtype=dtype), np.empty(2048, dtype=np.intp)
                count = getattr(library, f"t_gather_{kind}")(
                    row.ctypes.data, vocab, block, maxima.ctypes.data, blocks, floor,
                    z.ctypes.data, y.ctypes.data,
                )
                found.append((_bits(maxima), count, _bits(z[:max(count, 0)]),
                              y[:max(count, 0)]))
            context = f"{kind_of_row} V={vocab} block={block}"
            for fast, generic in zip(*found):
                np.testing.assert_array_equal(fast, generic, err_msg=context)
            gathered += found[0][1] >= 40
    # Most cases gather (not a sorted row's last blocks: more entries than the room).
    assert gathered >= len(ROWS) * 3 // 2


def _tied_in_z(dtype: type, temperature: float) -> tuple[Any, Any]:
    """Two adjacent logits whose z at the temperature is one value."""
    a = np.array(1.9, dtype=dtype)
    t = dtype(temperature)
    while True:
        below = np.nextafter(a, dtype(-np.inf))
        if below / t == a / t:
            return a, below
        a = below


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_that_tie_in_z_stay_among_the_survivors(
    survivors: Survivors, row_scans: Survivors, dtype: type
) -> None:
    """llama.cpp's order selects on logits: a logit just below top-k's lowest can share its
    z at the temperature, and is then kept.  It is gathered with the survivors (the law's
    bits are the row scan's) instead of sending the row to a scan of its own."""
    a, below = _tied_in_z(dtype, 0.8)
    for seed, top_k in enumerate((1, 2, 3, 40)):
        row = _row("normal", 20000, dtype, seed) - dtype(20.0)
        # The top_k largest logits at a, the next one adjacent below it, in other blocks.
        row[np.arange(top_k) * 300 + 7] = a
        row[top_k * 300 + 11] = below
        case = _case((0.8, top_k, 1.0, 0.0), "llama.cpp")
        law, count, out = survivors.law(row, case)
        scanned_law, _, scanned = row_scans.law(row, case)
        assert count >= 0, top_k
        assert np.array_equal(np.array(law).view(np.uint64),
                              np.array(scanned_law).view(np.uint64)), top_k  # fmt: skip
        np.testing.assert_array_equal(_bits(out), _bits(scanned))
        # The tied logit is kept, with the mass of the others.
        assert out[top_k * 300 + 11] == out[7] > 0


def test_survivors_that_drop_the_ties_at_top_k_are_caught(
    row_scans: Survivors, tmp_path: Path
) -> None:
    wrong = _build(tmp_path, "mutation9", "-DSPECDEC_LOGITS_MUTATION=9")
    row = _row("ties", 20000, np.float32, 0)
    case = _case((1.0, 40, 1.0, 0.0), "vllm")
    _, _, out = wrong.law(row, case)
    _, _, scanned = row_scans.law(row, case)
    assert not np.array_equal(out, scanned)


# ---- the draw ---------------------------------------------------------------------------


def _combine(lanes: np.ndarray) -> float:
    return float(((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                 + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7])))  # fmt: skip


def _row_draws(p: np.ndarray, block: int, uniforms: np.ndarray) -> np.ndarray:
    """draw_by_blocks over a processed row (q = 0, rho = 1): block sums on the eight lanes
    y mod 8 in element order, their running sum, then the scan from the chosen block."""
    w = np.where(p > 0, p.astype(np.float64), 0.0)
    sums = []
    for start in range(0, w.size, block):
        segment = w[start : start + block]
        segment = np.concatenate([segment, np.zeros(-segment.size % 8)])
        sums.append(_combine(np.cumsum(segment.reshape(-1, 8), axis=0)[-1]))
    total = 0.0
    for value in sums:
        total += value
    tokens = []
    for v in uniforms:
        threshold = v * total
        running, j = 0.0, 0
        while j < len(sums) and not running + sums[j] > threshold:
            running += sums[j]
            j += 1
        scan = np.cumsum(np.concatenate([[running], w[j * block :]]))[1:]
        hits = np.flatnonzero((w[j * block :] > 0) & (scan > threshold))
        tokens.append(j * block + hits[0] if hits.size else np.flatnonzero(w)[-1])
    return np.array(tokens)


def _boundary_uniforms(p: np.ndarray, seed: int, block: int = 2048) -> np.ndarray:
    """Random uniforms, the ones on each side of every CDF boundary of the row, and the ones
    whose threshold v * total is exactly a running sum of the draw's scan (where a total
    one rounding off moves the token)."""
    w = np.where(p > 0, p.astype(np.float64), 0.0)
    cumulative = np.cumsum(w[w > 0])
    edges = cumulative / cumulative[-1]
    running, total = [], 0.0
    for start in range(0, w.size, block):
        segment = w[start : start + block]
        running.append(np.cumsum(np.concatenate([[total], segment[segment > 0]]))[1:])
        padded = np.concatenate([segment, np.zeros(-segment.size % 8)])
        total += _combine(np.cumsum(padded.reshape(-1, 8), axis=0)[-1])
    exact = []
    for target in np.concatenate(running):
        v = target / total
        for candidate in (v, np.nextafter(v, 0.0), np.nextafter(v, 1.0)):
            if candidate * total == target:
                exact.append(candidate)
    uniforms = np.concatenate([
        np.random.default_rng(seed).random(20), edges, np.nextafter(edges, 0.0),
        np.nextafter(edges, 1.0), np.array(exact),
    ])  # fmt: skip
    return uniforms[(uniforms >= 0.0) & (uniforms < 1.0)]


DRAW_CASES = [
    ("normal", (0.8, 40, 0.95, 0.05), "vllm"),
    ("ties", (1.0, 40, 1.0, 0.0), "llama.cpp"),
    ("specials", (0.3, 500, 0.9, 0.0), "vllm"),
    ("normal", (2.0, 1, 1.0, 0.0), "llama.cpp"),
    ("zeros", (1.0, 200, 1.0, 0.0), "vllm"),
]


@pytest.mark.parametrize("block", [64, 2048])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_survivors_draw_is_the_draw_over_the_row(
    survivors: Survivors, block: int, dtype: type
) -> None:
    for seed, (kind, filters, order) in enumerate(DRAW_CASES):
        row = _row(kind, 20000, dtype, seed)
        case = _case(filters, order)
        _, count, p = survivors.law(row, case)
        assert count >= 0, kind
        uniforms = _boundary_uniforms(p, seed, block)
        tokens = survivors.draws(row, case, block, uniforms)
        np.testing.assert_array_equal(tokens, _row_draws(p, block, uniforms),
                                      err_msg=f"{kind} {case}")  # fmt: skip


def test_a_draw_that_sums_survivors_in_other_lanes_is_caught(
    survivors: Survivors, tmp_path: Path
) -> None:
    # float64 rows: float32 survivors sum exactly in float64 whatever their lanes.
    wrong = _build(tmp_path, "mutation8", "-DSPECDEC_LOGITS_MUTATION=8")
    differs = False
    for seed in range(6):
        row = _row("normal", 20000, np.float64, seed)
        case = _case((1.0, 200, 1.0, 0.0), "vllm")
        _, _, p = survivors.law(row, case)
        uniforms = _boundary_uniforms(p, seed)
        expected = _row_draws(p, 2048, uniforms)
        np.testing.assert_array_equal(survivors.draws(row, case, 2048, uniforms), expected)
        differs |= not np.array_equal(wrong.draws(row, case, 2048, uniforms), expected)
    assert differs


# ---- through the extension ---------------------------------------------------------------


@pytest.mark.parametrize("order", ["vllm", "llama.cpp"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sample_tokens_from_survivors_is_the_draw_from_processed_probs(
    order: str, dtype: type
) -> None:
    """A bonus draw with top-k on (from the survivors) gives the token of the same draw from
    the processed rows given as probabilities (which scans them whole), at the uniforms on
    the CDF boundaries of each row."""
    rng = np.random.default_rng(7)
    kinds = ["normal", "ties", "specials", "zeros"]
    logits = np.stack([_row(kind, 20000, dtype, seed) for seed, kind in enumerate(kinds)])
    parameters = dict(temperature=0.8, top_k=np.array([40, 300, 1, 500]), top_p=0.95,
                      min_p=0.05, filter_order=order)  # fmt: skip
    rows = specdec_np.processed_probs(logits, **parameters)
    for _ in range(3):
        uniforms = np.array([rng.choice(_boundary_uniforms(row, 0)) for row in rows])
        from_logits = specdec_np.sample_tokens(logits=logits, uniforms=uniforms, **parameters)
        from_probs = specdec_np.sample_tokens(probs=rows, uniforms=uniforms)
        np.testing.assert_array_equal(from_logits, from_probs)


def test_greedy_rows_with_filters_stay_the_argmax() -> None:
    logits = np.stack([_row("ties", 20000, np.float32, 1), _row("normal", 20000, np.float32, 2)])
    tokens = specdec_np.sample_tokens(
        logits=logits, temperature=np.array([0.0, 0.0]), top_k=40, top_p=0.95, min_p=0.05,
        uniforms=np.array([0.3, 0.7]),
    )  # fmt: skip
    np.testing.assert_array_equal(tokens, logits.argmax(axis=1))
