#!/usr/bin/env python
"""The targets for logits rows, through the public API, with their bars in the same run.

Each cell alternates calls of ``specdec_np`` and of its bar (interleaved, so that a load
spike hits both), and reports the medians and their ratio:

* ``bonus draw``: a bonus-only draw (``k_b = 0``) from 64 rows at V = 128256 (temperature
  1, no filters; then top-k 50 and top-p 0.95) against ``np.exp`` of the same rows (into a
  preallocated array): targets 1.5x and 2.5x;
* ``filtered row``: the cost per row of a bonus-only draw from B = 64 filtered rows (top-k
  50, top-p 0.95) at V in {111, 1024}, minus the same call's unfiltered cost: the fixed
  cost of a filtered row (target 3 us);
* ``greedy``: ``verify_ragged(method="greedy")`` from logits at (B, 4, 128256) with every
  draft the target's argmax (every row read) against ``np.argmax`` of those rows (target 1x);
* ``roofline``: the bytes a bonus-only unfiltered draw must read (B rows of V float32) over
  its time, divided by the streaming bandwidth of one thread (``np.maximum.reduce``),
  at B in {1, 8, 64}; run the script with OMP_NUM_THREADS=1 and =2 for the two columns.
  Beside it, the physical floor: the bytes at that bandwidth and the B V exponentials at
  the machine's vector width (``np.exp`` per element on an L1-resident row), and the
  fraction of the time that the larger of the two is.

Sampled ``verify_ragged`` against vLLM v1's CPU path is ``benchmarks/studies/engine.py``'s cell.
The script uses only the public API, so a checkout's build is measured by pointing
PYTHONPATH at it::

    OMP_NUM_THREADS=1 python benchmarks/studies/logits_targets.py --label after --json FILE.jsonl
    python benchmarks/studies/logits_targets.py --render BEFORE.jsonl AFTER.jsonl [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (bandwidth, metadata, JSON lines, tables)

import specdec_np  # noqa: E402

VOCAB = 128256
FILTERED = {"top_k": 50, "top_p": 0.95}


def interleaved_medians(
    first: Callable[[], Any], second: Callable[[], Any], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``first`` and of ``second``, called alternately ``repeats`` times
    each after one warm-up call of each."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for index, call in enumerate((first, second)):
            start = time.perf_counter()
            call()
            times[index].append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1]))


def bonus_draw(rows: np.ndarray, filters: dict[str, Any], seed: int = 0) -> Callable[[], Any]:
    """A bonus-only ``verify_ragged`` over ``rows`` (one request a row), one generator."""
    batch = rows.shape[0]
    generator = np.random.default_rng(seed)
    options = {name: np.full(batch, value) for name, value in filters.items()}
    counts = np.zeros(batch, dtype=np.int64)
    ids = np.zeros(0, dtype=np.int64)
    return lambda: specdec_np.verify_ragged(
        num_draft_tokens=counts, draft_token_ids=ids, target_logits=rows,
        temperature=np.ones(batch), generator=generator, **options,
    )  # fmt: skip


def measure(repeats: int, label: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    cells: list[dict[str, Any]] = []
    threads = os.environ.get("OMP_NUM_THREADS")
    rows = (rng.standard_normal((64, VOCAB)) * 3).astype(np.float32)
    exp_out = np.empty_like(rows)
    for name, filters in (("off", {}), ("k50_p0.95", FILTERED)):
        ours, bar = interleaved_medians(
            bonus_draw(rows, filters), lambda: np.exp(rows, out=exp_out), repeats
        )
        cells.append({"kind": "cell", "target": "bonus draw", "case": f"B=64 V={VOCAB} {name}",
                      "ours_s": ours, "bar_s": bar, "ratio": ours / bar,
                      "goal": 1.5 if name == "off" else 2.5, "threads": threads,
                      "label": label})  # fmt: skip
    for vocab in (111, 1024):
        small = (rng.standard_normal((64, vocab)) * 3).astype(np.float32)
        filtered, plain = interleaved_medians(
            bonus_draw(small, FILTERED), bonus_draw(small, {}), repeats * 4
        )
        cells.append({"kind": "cell", "target": "filtered row", "case": f"B=64 V={vocab}",
                      "ours_s": filtered, "bar_s": plain,
                      "fixed_us": (filtered - plain) / 64 * 1e6, "goal_us": 3.0,
                      "threads": threads, "label": label})  # fmt: skip
    for batch in (8, 64):
        k = 4
        logits = (rng.standard_normal((batch * (k + 1), VOCAB)) * 3).astype(np.float32)
        argmax = logits.argmax(axis=1).reshape(batch, k + 1)
        counts = np.full(batch, k, dtype=np.int64)
        ids = np.ascontiguousarray(argmax[:, :k]).reshape(-1)

        def greedy(logits: np.ndarray = logits, counts: np.ndarray = counts,
                   ids: np.ndarray = ids) -> Any:  # fmt: skip
            return specdec_np.verify_ragged(
                num_draft_tokens=counts, draft_token_ids=ids, target_logits=logits,
                method="greedy",
            )

        ours, bar = interleaved_medians(
            greedy, lambda logits=logits: np.argmax(logits, axis=1), repeats
        )
        cells.append({"kind": "cell", "target": "greedy", "case": f"({batch}, {k}, {VOCAB})",
                      "ours_s": ours, "bar_s": bar, "ratio": ours / bar, "goal": 1.0,
                      "threads": threads, "label": label})  # fmt: skip
    bandwidth = harness.measure_bandwidth(256 << 20, threads=1)["gb_per_s"]["max_1t"]
    exp_seconds = exp_seconds_per_element()
    for batch in (1, 8, 64):
        subset = np.ascontiguousarray(rows[:batch])
        draw = bonus_draw(subset, {})
        seconds, _ = interleaved_medians(draw, lambda: None, repeats * (8 if batch < 64 else 1))
        gb_per_s = subset.nbytes / seconds / 1e9
        # The physical floor: the bytes at one thread's streaming bandwidth, and the
        # exponentials at the vector width (np.exp's AVX-512 code on an L1-resident row).
        floor_bytes_s = subset.nbytes / (bandwidth * 1e9)
        floor_exp_s = subset.size * exp_seconds
        cells.append({"kind": "cell", "target": "roofline", "case": f"B={batch} V={VOCAB}",
                      "ours_s": seconds, "gb_per_s": gb_per_s, "bandwidth_gb_per_s": bandwidth,
                      "roofline": gb_per_s / bandwidth, "floor_bytes_s": floor_bytes_s,
                      "floor_exp_s": floor_exp_s,
                      "floor_fraction": max(floor_bytes_s, floor_exp_s) / seconds,
                      "threads": threads, "label": label})  # fmt: skip
    return cells


def exp_seconds_per_element(repeats: int = 2000) -> float:
    """Seconds per float32 exponential of ``np.exp`` on rows that stay in L1 (the machine's
    vector width, no memory traffic): the difference of the median times of 8192 and 2048
    entries over the 6144 more, which leaves out the cost of a call."""
    medians = []
    for size in (2048, 8192):
        row = np.linspace(-20.0, 0.0, size, dtype=np.float32)
        out = np.empty_like(row)
        times = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            np.exp(row, out=out)
            times.append(time.perf_counter_ns() - start)
        medians.append(float(np.median(times)))
    return (medians[1] - medians[0]) * 1e-9 / (8192 - 2048)


def _median_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell from several runs of it: the median of each measured number."""
    merged = dict(cells[0])
    for key in ("ours_s", "bar_s", "ratio", "fixed_us", "roofline", "gb_per_s", "floor_bytes_s",
                "floor_exp_s", "floor_fraction"):
        if key in merged:
            merged[key] = float(np.median([cell[key] for cell in cells]))
    merged["runs"] = len(cells)
    return merged


def render(records: list[dict[str, Any]], markdown: bool) -> str:
    """One row per (target, case, threads), one column per label: the median over the runs
    of each label (alternate the labels' runs, so that a load spike hits both)."""
    labels = list(dict.fromkeys(r["label"] for r in records if r.get("kind") == "cell"))
    keys = list(dict.fromkeys(
        (r["target"], r["case"], r["threads"]) for r in records if r.get("kind") == "cell"
    ))  # fmt: skip

    def value(cell: dict[str, Any]) -> str:
        if cell["target"] == "filtered row":
            return f"{cell['fixed_us']:.2f} us"
        if cell["target"] == "roofline" and "floor_bytes_s" in cell:
            return (f"{cell['roofline']:.2f} ({cell['ours_s'] * 1e3:.2f} ms; floor: bytes "
                    f"{cell['floor_bytes_s'] * 1e3:.2f} ms, exp {cell['floor_exp_s'] * 1e3:.2f}"
                    f" ms; {cell['floor_fraction']:.2f} of it)")  # fmt: skip
        if cell["target"] == "roofline":
            return f"{cell['roofline']:.2f} ({cell['ours_s'] * 1e3:.2f} ms)"
        return f"{cell['ratio']:.2f}x ({cell['ours_s'] * 1e3:.2f} ms)"

    def goal(cell: dict[str, Any]) -> str:
        if cell["target"] == "filtered row":
            return f"<= {cell['goal_us']:g} us"
        if cell["target"] == "roofline":
            return "-"
        return f"<= {cell['goal']:g}x" if cell["target"] != "greedy" else "<= 1x"

    table = []
    for target, case, threads in keys:
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            if r.get("kind") == "cell" and (r["target"], r["case"], r["threads"]) == (
                target, case, threads
            ):  # fmt: skip
                runs.setdefault(r["label"], []).append(r)
        found = {label: _median_cell(cells) for label, cells in runs.items()}
        first = next(iter(found.values()))
        table.append([target, case, str(threads), goal(first)]
                     + [value(found[label]) if label in found else "-" for label in labels])
    return harness.render_table(["target", "case", "threads", "goal", *labels], table,
                                markdown, align="left")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", metavar="FILE", help="append JSON lines (meta, cells)")
    parser.add_argument("--render", metavar="FILE", nargs="+", help="reprint saved runs")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.render:
        records = [record for path in args.render for record in harness.read_jsonl(path)]
        print(render(records, args.markdown))
        return
    meta = {**harness.run_metadata(), "label": args.label, "loadavg": harness.loadavg(),
            "specdec_np_file": specdec_np.__file__,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
    cells = measure(args.repeats, args.label)
    if args.json:
        harness.write_jsonl(args.json, [meta, *cells], append=True)
    print(render(cells, args.markdown))


if __name__ == "__main__":
    main()
