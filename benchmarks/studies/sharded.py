"""Verification across vocabulary shards: bytes exchanged per step against the all-gather,
and a short wall-time run.

Bytes: for each ``V`` in {32000, 128256}, ``B`` in {1, 8, 64} (``k = 4`` drafts per
request, draft logits, ``S = 2`` ranks) and two sampling settings (``plain``: temperature
only; ``filtered``: top-k, top-p and min-p on every request), the call runs on simulated
ranks (``run_local``) at a small vocabulary and reports its ``exchanged_bytes``, which do
not depend on ``V`` (``tests/sharded/test_sharded.py`` checks that); the all-gather's bytes are
``rows x V x 4`` (float32 target and draft rows), what ``gather_bytes`` reports at that
``V``.  Every draft is rejected at its first position or accepted through the bonus
depending on the uniforms, as in a real step.

Wall time (``--time``): one step at ``V = 32000``, ``B = 8`` on 2 threads of one process
against the unsharded ``specdec_np.verify_ragged`` on the whole rows, median of a few
repeats.  The sharded statistics are NumPy (no compiled kernel yet), so this measures the
protocol's overhead here, not what an engine's GPU ranks would see.

Usage: ``python benchmarks/studies/sharded.py [--time] [--out FILE.jsonl]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (tables)

import specdec_np  # noqa: E402
from specdec_np import sharded  # noqa: E402

VOCABULARIES = (32000, 128256)
BATCHES = (1, 8, 64)
K = 4
RANKS = 2
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {"temperature": 0.8},
    "filtered": {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "min_p": 0.05},
}


def make_step(rng: np.random.Generator, batch: int, vocab_size: int) -> dict[str, Any]:
    """One engine step's arguments on the whole rows (float32 logits)."""
    counts = np.full(batch, K, dtype=np.int64)
    total = int(counts.sum())
    target = (rng.normal(size=(total + batch, vocab_size)) * 3).astype(np.float32)
    draft = (target[:total] + 0.5 * rng.normal(size=(total, vocab_size))).astype(np.float32)
    return {
        "num_draft_tokens": counts,
        "draft_token_ids": np.argmax(draft, axis=1),
        "target_logits": target,
        "draft_logits": draft,
        "uniforms": rng.random((batch, K + 2)),
    }


def run_sharded(step: dict[str, Any], ranks: int, **setting: Any) -> Any:
    """The sharded call on ``ranks`` threads (even shards); rank 0's result."""
    vocab_size = step["target_logits"].shape[1]
    bounds = np.linspace(0, vocab_size, ranks + 1).astype(int)

    def rank_call(communicator: Any) -> Any:
        start, end = int(bounds[communicator.rank]), int(bounds[communicator.rank + 1])
        local = dict(step)
        for name in ("target_logits", "draft_logits"):
            local[name] = step[name][:, start:end]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size,
            **local, **setting,
        )

    return sharded.run_local(ranks, rank_call)[0]


def bytes_table(small_vocabulary: int = 2048) -> list[dict[str, Any]]:
    """Exchanged bytes (measured at ``small_vocabulary``) beside the all-gather's."""
    rows = []
    rng = np.random.default_rng(0)
    for name, setting in SETTINGS.items():
        for batch in BATCHES:
            step = make_step(rng, batch, small_vocabulary)
            result = run_sharded(step, RANKS, **setting)
            read_rows = step["target_logits"].shape[0] + step["draft_logits"].shape[0]
            for vocab_size in VOCABULARIES:
                gather = read_rows * vocab_size * 4
                rows.append({
                    "setting": name, "B": batch, "k": K, "V": vocab_size, "ranks": RANKS,
                    "exchanged_bytes": result.exchanged_bytes, "rounds": result.rounds,
                    "gather_bytes": gather,
                    "ratio": round(gather / result.exchanged_bytes, 1),
                })
    return rows


def wall_times(repeats: int = 3, batch: int = 8, vocab_size: int = 32000) -> dict[str, Any]:
    """Median seconds of one step, sharded on 2 threads and unsharded."""
    step = make_step(np.random.default_rng(1), batch, vocab_size)
    setting = SETTINGS["filtered"]
    found: dict[str, Any] = {"B": batch, "k": K, "V": vocab_size, "ranks": RANKS}
    for label, call in (
        ("unsharded_s", lambda: specdec_np.verify_ragged(**step, **setting)),
        ("sharded_s", lambda: run_sharded(step, RANKS, **setting)),
    ):
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        found[label] = statistics.median(times)
    return found


def main() -> None:
    """Print (and optionally write) the bytes table and the wall times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="also time one step")
    parser.add_argument("--out", help="write the rows as JSON lines")
    arguments = parser.parse_args()
    rows = bytes_table()
    columns = ("setting", "B", "V", "exchanged_bytes", "rounds", "gather_bytes", "ratio")
    cells = [[str(row[column]) for column in columns] for row in rows]
    print(harness.render_table(columns, cells, markdown=False))
    if arguments.time:
        timing = wall_times()
        timing["machine"] = platform.processor() or platform.machine()
        rows.append(timing)
        print(json.dumps(timing))
    if arguments.out:
        with open(arguments.out, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
