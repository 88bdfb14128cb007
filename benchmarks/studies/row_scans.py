#!/usr/bin/env python
"""Microbenchmark of the kernels' row passes (``rowscan.h``, ``treescan.h``, ``logits_law.h``
of ``specdec_np/_kernels/src/cpu/``), one vocabulary row at a time, on one core.

Every verifier's cost is a few passes over rows of ``V`` entries: the block sums of an
inverse-CDF draw, a residual sum, the tree walk's residual update, the online pass and the
materialisation of a logits row's law.  This script compiles the headers with the
extension's flags and macros into a small library, calls each pass through ctypes over
``--rows`` distinct rows (so that they come from memory, not cache), and prints the time per
row, per element, and the bytes the pass reads and writes per second.  It says which passes
are bound by compute (far below the streaming bandwidth of the harness's probe) rather
than by memory.

``--include DIR`` compiles another copy of the headers (for instance those of an earlier
commit: ``git show REV:specdec_np/_kernels/src/cpu/rowscan.h > DIR/rowscan.h``, and the
same for the other
two), to measure a change before and after::

    OMP_NUM_THREADS=1 python benchmarks/studies/row_scans.py
    python benchmarks/studies/row_scans.py --quick        # tiny rows (the smoke test)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (the C build, best-of timing, JSON lines and tables)

HEADERS = harness.HEADERS

_SOURCE = r"""
#include "treescan.h"
#include "logits_law.h"

/* Each function runs one pass over each of `rows` rows of V entries and returns a value
 * that depends on every pass (so that none is optimised away). */
#define SPECDEC_EACH_ROW(CALL)                                                             \
    double s = 0;                                                                          \
    for (ptrdiff_t r = 0; r < rows; ++r)                                                   \
        s += CALL;                                                                         \
    return s;

double residual_sum_plain_f(const float *p, ptrdiff_t rows, ptrdiff_t V)
{ SPECDEC_EACH_ROW(specdec_residual_sum_f(p + r * V, NULL, -1, 1.0, 1.0, 0, V)) }
double residual_sum_plain_d(const double *p, ptrdiff_t rows, ptrdiff_t V)
{ SPECDEC_EACH_ROW(specdec_residual_sum_d(p + r * V, NULL, -1, 1.0, 1.0, 0, V)) }
double residual_sum_draft_f(const float *p, const float *q, ptrdiff_t rows, ptrdiff_t V)
{ SPECDEC_EACH_ROW(specdec_residual_sum_f(p + r * V, q + r * V, -1, 1.0, 1.0, 0, V)) }
double residual_update_ff(const float *p, const float *q, ptrdiff_t rows, ptrdiff_t V,
                          double *out)
{ SPECDEC_EACH_ROW(specdec_residual_update_ff(p + r * V, 1.0, q + r * V, 1.0, V, out)) }
double residual_update_df(const double *p, const float *q, ptrdiff_t rows, ptrdiff_t V,
                          double *out)
{ SPECDEC_EACH_ROW(specdec_residual_update_df(p + r * V, 0.7, q + r * V, 1.0, V, out)) }
double clean_sum_f(const float *q, ptrdiff_t rows, ptrdiff_t V)
{ SPECDEC_EACH_ROW(specdec_clean_sum_f(q + r * V, V)) }
double materialise_f(const float *z, ptrdiff_t rows, ptrdiff_t V, float *out)
{
    double s = 0;
    for (ptrdiff_t r = 0; r < rows; ++r) {
        specdec_row_law law;
        specdec_law_scratch *scratch = specdec_law_scratch_new();
        specdec_row_law_f(z + r * V, V, 1.0f, 0, 1.0, 0.0, 0, scratch, NULL, &law);
        free(scratch);
        specdec_law_materialise_f(z + r * V, V, 1.0f, &law, out);
        s += out[r % V];
    }
    return s;
}
double row_law_f(const float *z, ptrdiff_t rows, ptrdiff_t V)
{
    double s = 0;
    for (ptrdiff_t r = 0; r < rows; ++r) {
        specdec_row_law law;
        specdec_law_scratch *scratch = specdec_law_scratch_new();
        specdec_row_law_f(z + r * V, V, 1.0f, 0, 1.0, 0.0, 0, scratch, NULL, &law);
        free(scratch);
        s += law.normaliser;
    }
    return s;
}
"""

#: name: (argument kinds, bytes read and written per element, what the pass is)
PASSES: dict[str, tuple[str, int, str]] = {
    "residual_sum_plain_f": ("p", 4, "block sums of a draw from a float32 probability row"),
    "residual_sum_plain_d": ("P", 8, "the same over a float64 row"),
    "residual_sum_draft_f": ("pq", 8, "sum of (p - q)+ over float32 rows (a residual draw)"),
    "residual_update_ff": ("pqo", 16, "tree residual update from the target row"),
    "residual_update_df": ("Pqo", 20, "tree residual update from a float64 residual"),
    "clean_sum_f": ("q", 4, "an RRS draft row's mass"),
    "row_law_f": ("z", 4, "a logits row's law (online pass: one exp per element)"),
    "materialise_f": ("zm", 8, "law and materialisation (two exp per element)"),
}


def build(include: Path, directory: Path) -> ctypes.CDLL:
    """The passes compiled against the headers in ``include`` with the extension's
    optimisation level and the contract's macros."""
    return harness.compile_library(_SOURCE, directory, include=include, flags=["-w"])


def inputs(rows: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = (rng.random((rows, vocab), dtype=np.float32) / np.float32(vocab)).astype(np.float32)
    q = (rng.random((rows, vocab), dtype=np.float32) / np.float32(vocab)).astype(np.float32)
    z = (3.0 * rng.standard_normal((rows, vocab))).astype(np.float32)
    return {
        "p": p, "P": p.astype(np.float64), "q": q, "z": z,
        "o": np.empty(vocab, dtype=np.float64), "m": np.empty(vocab, dtype=np.float32),
    }  # fmt: skip


def _call(library: ctypes.CDLL, name: str, arrays: dict[str, np.ndarray]) -> Callable[[], float]:
    kinds = PASSES[name][0]
    function = getattr(library, name)
    rows, vocab = arrays["p"].shape
    pointers = [ctypes.c_void_p(arrays[kind].ctypes.data) for kind in kinds]
    sizes = [ctypes.c_ssize_t(rows), ctypes.c_ssize_t(vocab)]
    # Inputs first, then the row count and V, then the output row (if any).
    arguments = [p for k, p in zip(kinds, pointers) if k not in "om"]
    arguments += sizes + [p for k, p in zip(kinds, pointers) if k in "om"]
    function.restype = ctypes.c_double
    return lambda: function(*arguments)


def measure(library: ctypes.CDLL, arrays: dict[str, np.ndarray], repeats: int) -> list[dict]:
    rows, vocab = arrays["p"].shape
    results = []
    for name, (_, bytes_per_element, what) in PASSES.items():
        call = _call(library, name, arrays)
        call()  # fault the pages in
        best = harness.best_seconds(call, repeats)
        per_row = best / rows
        results.append({
            "pass": name, "us_per_row": per_row * 1e6, "ns_per_element": per_row / vocab * 1e9,
            "gb_per_s": bytes_per_element * vocab / per_row / 1e9, "what": what,
        })  # fmt: skip
    return results


def format_table(results: Sequence[dict[str, Any]]) -> str:
    cells = [
        (r["pass"], f"{r['us_per_row']:.1f}", f"{r['ns_per_element']:.3f}",
         f"{r['gb_per_s']:.1f}", r["what"])
        for r in results
    ]  # fmt: skip
    headers = ("pass", "us_per_row", "ns_per_element", "GB/s", "what")
    return harness.render_table(headers, cells, True, align=("right",) * 4 + ("left",))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rows", type=int, default=64, help="distinct rows per pass (memory)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--include", type=Path, default=HEADERS, help="directory of the headers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny rows (the smoke test)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON lines")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.rows, args.repeats = 1000, 4, 2
    if args.vocab < 8 or args.rows < 1 or args.repeats < 1:
        parser.error("--vocab must be >= 8, --rows and --repeats >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        library = build(args.include, Path(directory))
        results = measure(library, inputs(args.rows, args.vocab, args.seed), args.repeats)
    print(f"V = {args.vocab}, {args.rows} rows per pass, headers from {args.include}")
    print(format_table(results))
    if args.json:
        records = ({**row, "V": args.vocab, "rows": args.rows} for row in results)
        harness.write_jsonl(args.json, records, append=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
