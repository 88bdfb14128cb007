"""ns per element of the row law of specdec_np/_kernels/src/cpu/logits_law.h, and its fraction of
streaming.

Builds the header into a small shared library (``cc -O3``, with the AVX-512 and AVX2 + FMA3
clones the extension gets), then times one row of ``V`` float32 logits on one thread: the
law with no filter (the online pass), with top-k 50, with top-p 0.95, and the materialised
row; and a NumPy streaming read of the same row (``row.sum()``) as the bandwidth reference.

    python benchmarks/studies/logits_bench.py [--vocab 128256] [--repeats 200]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (the C build and the best-of timing)

_SOURCE = r"""
#include <stdlib.h>
#include "logits_law.h"
void b_row_law(const float *l, ptrdiff_t V, float t, int64_t k, double p, double m,
               specdec_row_law *law, int repeats)
{
    /* The law's scratch is the caller's, once per thread and call, as in the kernels. */
    specdec_law_scratch *scratch = specdec_law_scratch_new();
    for (int r = 0; r < repeats; ++r)
        specdec_row_law_f(l, V, t, k, p, m, 0, scratch, NULL, law);
    free(scratch);
}
void b_materialise(const float *l, ptrdiff_t V, float t, const specdec_row_law *law,
                   float *out, int repeats)
{ for (int r = 0; r < repeats; ++r) specdec_law_materialise_f(l, V, t, law, out); }
"""


class _Law(ctypes.Structure):
    _fields_ = [
        ("z_max", ctypes.c_double),
        ("cutoff", ctypes.c_double),
        ("normaliser", ctypes.c_double),
        ("num_infinite", ctypes.c_int64),
        ("status", ctypes.c_int64),
    ]


def _build(directory: Path) -> ctypes.CDLL:
    return harness.compile_library(_SOURCE, directory, flags=["-fno-math-errno"])


def _seconds_per_call(call, repeats: int) -> float:
    """Best of 5 rounds of ``call(repeats)``, per call."""
    return harness.best_seconds(lambda: call(repeats), 5) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    vocab, repeats = args.vocab, args.repeats
    row = np.random.default_rng(0).standard_normal(vocab).astype(np.float32) * 3
    out = np.empty_like(row)
    with tempfile.TemporaryDirectory() as directory:
        lib = _build(Path(directory))
        p = ctypes.c_void_p
        lib.b_row_law.argtypes = [p, ctypes.c_ssize_t, ctypes.c_float, ctypes.c_int64,
                                  ctypes.c_double, ctypes.c_double, p, ctypes.c_int]  # fmt: skip
        lib.b_materialise.argtypes = [p, ctypes.c_ssize_t, ctypes.c_float, p, p, ctypes.c_int]
        law = _Law()

        def streaming(n: int) -> None:
            for _ in range(n):
                row.sum()

        def row_law(top_k: int, top_p: float, temperature: float = 1.0):
            return lambda n: lib.b_row_law(
                row.ctypes.data, vocab, temperature, top_k, top_p, 0.0, ctypes.byref(law), n
            )

        stream = _seconds_per_call(streaming, repeats)
        print(f"V = {vocab} float32, one thread, best of 5 x {repeats} calls")
        print(f"{'case':<28} {'ns/element':>10} {'fraction of streaming':>22}")
        print(f"{'numpy row.sum() (streaming)':<28} {stream / vocab * 1e9:>10.3f} {1.0:>22.2f}")
        cases = [
            ("no filter, t = 1", row_law(0, 1.0)),
            ("no filter, t = 0.7", row_law(0, 1.0, 0.7)),
            ("top-k 50", row_law(50, 1.0)),
            ("top-p 0.95", row_law(0, 0.95)),
        ]
        for name, call in cases:
            seconds = _seconds_per_call(call, repeats)
            print(f"{name:<28} {seconds / vocab * 1e9:>10.3f} {stream / seconds:>22.2f}")
        lib.b_row_law(row.ctypes.data, vocab, 1.0, 0, 0.95, 0.0, ctypes.byref(law), 1)
        seconds = _seconds_per_call(
            lambda n: lib.b_materialise(row.ctypes.data, vocab, 1.0, ctypes.byref(law),
                                        out.ctypes.data, n),  # fmt: skip
            repeats,
        )
        print(f"{'materialise (top-p 0.95)':<28} {seconds / vocab * 1e9:>10.3f} "
              f"{stream / seconds:>22.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
