"""Verify a ragged batch on vocabulary shards held by MPI processes.

Run it with ``mpiexec -n 2 python examples/sharded_mpi.py`` (``pip install
"specdec_np[mpi]"`` brings mpi4py and an MPI).  Every process holds an uneven slice of the
columns of the same target and draft logits, as the ranks of a tensor-parallel LM head do,
and calls :func:`specdec_np.sharded.verify_ragged` with the same settings and uniforms.
Rank 0 then checks the result against the unsharded :func:`specdec_np.verify_ragged` on the
whole rows, step after step, and prints what each step exchanged beside what
all-gathering the rows would have cost.  The exit status is 0 only if every step matched
on every rank.
"""

from __future__ import annotations

import sys

import numpy as np

import specdec_np
from specdec_np import sharded


def shard_bounds(vocab_size: int, size: int, rank: int) -> tuple[int, int]:
    """Uneven columns: rank ``r`` holds a slice about ``(r + 1)`` parts wide."""
    parts = np.arange(1, size + 1)
    ends = np.round(np.cumsum(parts) / parts.sum() * vocab_size).astype(int)
    starts = np.concatenate([[0], ends[:-1]])
    return int(starts[rank]), int(ends[rank])


def step_batch(rng: np.random.Generator, vocab_size: int) -> dict:
    """One engine step: four requests, one greedy, filters on, drafts near the top."""
    counts = np.array([3, 0, 4, 2])
    total = int(counts.sum())
    target = (rng.normal(size=(total + counts.size, vocab_size)) * 3).astype(np.float32)
    draft = (target[: total] + 0.3 * rng.normal(size=(total, vocab_size))).astype(np.float32)
    drafted = np.argmax(draft, axis=1)
    return {
        "num_draft_tokens": counts,
        "draft_token_ids": drafted,
        "target_logits": target,
        "draft_logits": draft,
        "temperature": np.array([0.8, 1.0, 0.0, 1.2]),
        "top_k": np.array([50, 0, 0, 20]),
        "top_p": np.array([0.9, 0.95, 1.0, 1.0]),
        "min_p": np.array([0.0, 0.05, 0.0, 0.02]),
        "uniforms": rng.random((counts.size, int(counts.max()) + 2)),
    }


def main(steps: int = 5, vocab_size: int = 32000) -> int:
    """Run ``steps`` sharded steps; 0 if each matched the unsharded call on every rank."""
    communicator = sharded.MPICommunicator()
    rank, size = communicator.rank, communicator.size
    start, end = shard_bounds(vocab_size, size, rank)
    rng = np.random.default_rng(2026)  # the same seed on every rank: the same batches
    matched = True
    for step in range(steps):
        batch = step_batch(rng, vocab_size)
        local = dict(batch)
        for name in ("target_logits", "draft_logits"):
            local[name] = batch[name][:, start:end]
        result = sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size, **local
        )
        expected = specdec_np.verify_ragged(**batch)
        same = np.array_equal(result.output_token_ids, expected.output_token_ids) and (
            np.array_equal(result.accepted_lengths, expected.accepted_lengths)
        )
        everyone = communicator.allgather(np.array([same], dtype=np.int8))
        matched = matched and bool(everyone.all())
        if rank == 0:
            print(
                f"step {step}: {size} ranks, accepted {result.accepted_lengths.tolist()}, "
                f"{'matches' if everyone.all() else 'DIFFERS FROM'} the unsharded call; "
                f"exchanged {result.exchanged_bytes} bytes in {result.rounds} rounds "
                f"(all-gathering the rows: {result.gather_bytes} bytes)"
            )
    if rank == 0:
        print("all steps matched" if matched else "a step differed")
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
