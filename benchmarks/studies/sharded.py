"""Verification across vocabulary shards: bytes exchanged per step against the all-gather,
and wall time on 2 MPI ranks against the unsharded call on one process.

Rows: ``V`` in {32000, 128256}, ``B`` in {1, 8, 64} (``k = 4`` drafts per request, float32
target and draft logits, ``S = 2`` ranks with even shards) and two sampling settings
(``plain``: temperature only; ``filtered``: top-k 50, top-p 0.9 and min-p 0.05 on every
request).  Each step's drafts are the draft's argmaxes, so some are rejected and some
requests reach the bonus draw, as in a real step: the draft rows are the first ``T``
target rows plus 0.5 times standard normals, which for every request but the first are
another position's rows, so most of their first drafts are rejected (the unsharded kernel
then stops at a request's first rejection and reads about two of its rows, where every rank
weighs all of them).  ``--draft-noise E`` instead makes each draft row its own position's
target row plus ``E`` times standard normals (at 0.01 nearly every draft is accepted).

Bytes: the sharded call runs on simulated ranks (``run_local``) at each ``V`` and reports
its ``exchanged_bytes`` (what one rank hands ``allgather``); the all-gather's are ``rows x
V x 4``, what ``gather_bytes`` reports.

Wall time (``--time``): per row, the median of a few steps of

* ``unsharded_s``: :func:`specdec_np.verify_ragged` on the whole rows, one process (its
  compiled kernel, with the threads it takes by default);
* ``mpi_s``: :func:`specdec_np.sharded.verify_ragged` on 2 MPI processes (``mpiexec -n 2``
  from beside the interpreter; each step's time is the slower rank's, with a barrier before
  each step); Open MPI's waits yield the core (``mpi_yield_when_idle``), since a busy-wait
  steals it from the other rank on a machine with fewer free cores than ranks;
* ``rank_s``: one rank's own work, without waiting: the ranks run once as threads, and
  rank 0 then runs again with a communicator that hands back what the ranks gathered;
* ``local_s``: the step on 2 ranks as threads of this process (:func:`sharded.run_local`),
  the rounds through its in-memory communicator.

Usage: ``python benchmarks/studies/sharded.py [--time] [--repeats N] [--batches 1,8,64]
[--vocabularies 32000,128256] [--out FILE.jsonl]`` (``--small-vocabulary V`` measures the
bytes at one ``V`` only, which do not depend on it for these settings).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
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
MPIEXEC = Path(sys.executable).parent / "mpiexec"
DRAFT_NOISE: float | None = None


def make_step(rng: np.random.Generator, batch: int, vocab_size: int) -> dict[str, Any]:
    """One engine step's arguments on the whole rows (float32 logits)."""
    counts = np.full(batch, K, dtype=np.int64)
    total = int(counts.sum())
    target = (rng.standard_normal((total + batch, vocab_size), dtype=np.float32) * 3)
    noise = rng.standard_normal((total, vocab_size), dtype=np.float32)
    if DRAFT_NOISE is None:
        draft = target[:total] + np.float32(0.5) * noise
    else:
        # Request b's position j is target row b (K + 1) + j.
        own = (np.arange(batch)[:, None] * (K + 1) + np.arange(K)).reshape(-1)
        draft = target[own] + np.float32(DRAFT_NOISE) * noise
    return {
        "num_draft_tokens": counts,
        "draft_token_ids": np.argmax(draft, axis=1),
        "target_logits": target,
        "draft_logits": draft,
        "uniforms": rng.random((batch, K + 2)),
    }


def shard_of(step: dict[str, Any], ranks: int, rank: int) -> tuple[int, dict[str, Any]]:
    """Rank ``rank``'s first column and arguments (even shards, contiguous copies)."""
    vocab_size = step["target_logits"].shape[1]
    bounds = np.linspace(0, vocab_size, ranks + 1).astype(int)
    start, end = int(bounds[rank]), int(bounds[rank + 1])
    local = dict(step)
    for name in ("target_logits", "draft_logits"):
        local[name] = np.ascontiguousarray(step[name][:, start:end])
    return start, local


def run_sharded(step: dict[str, Any], ranks: int, **setting: Any) -> Any:
    """The sharded call on ``ranks`` threads (even shards); rank 0's result."""
    vocab_size = step["target_logits"].shape[1]
    shards = [shard_of(step, ranks, rank) for rank in range(ranks)]

    def rank_call(communicator: Any) -> Any:
        start, local = shards[communicator.rank]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size,
            **local, **setting,
        )

    return sharded.run_local(ranks, rank_call)[0]


def bytes_table(small_vocabulary: int | None = None) -> list[dict[str, Any]]:
    """Exchanged bytes beside the all-gather's, measured at each ``V`` (or once at
    ``small_vocabulary`` and reported for each ``V``)."""
    rows = []
    for name, setting in SETTINGS.items():
        for batch in BATCHES:
            measured = {}
            for vocab_size in VOCABULARIES:
                at = small_vocabulary or vocab_size
                if at not in measured:
                    step = make_step(np.random.default_rng(batch), batch, at)
                    measured[at] = run_sharded(step, RANKS, **setting)
                result = measured[at]
                read_rows = batch * (2 * K + 1)
                gather = read_rows * vocab_size * 4
                rows.append({
                    "setting": name, "B": batch, "k": K, "V": vocab_size, "ranks": RANKS,
                    "exchanged_bytes": result.exchanged_bytes, "rounds": result.rounds,
                    "gather_bytes": gather,
                    "percent": round(100 * result.exchanged_bytes / gather, 3),
                    "ratio": round(gather / result.exchanged_bytes, 1),
                })
    return rows


class _Recording:
    """A communicator that keeps what rank 0 gathered."""

    def __init__(self, inner: Any, kept: list[np.ndarray]) -> None:
        self.inner, self.kept = inner, kept
        self.rank, self.size = inner.rank, inner.size

    def allgather(self, array: np.ndarray) -> np.ndarray:
        gathered = self.inner.allgather(array)
        if self.rank == 0:
            self.kept.append(np.array(gathered))
        return gathered


class _Replay:
    """Rank 0 of ``size``, handed back what it gathered before (no waiting)."""

    rank = 0

    def __init__(self, kept: list[np.ndarray], size: int) -> None:
        self.kept, self.size, self.at = kept, size, 0

    def allgather(self, array: np.ndarray) -> np.ndarray:
        self.at += 1
        return self.kept[self.at - 1]


def rank_seconds(step: dict[str, Any], setting: dict[str, Any], repeats: int) -> float:
    """Median seconds of rank 0's own work on the step (see the module docstring)."""
    vocab_size = step["target_logits"].shape[1]
    shards = [shard_of(step, RANKS, rank) for rank in range(RANKS)]
    kept: list[np.ndarray] = []

    def rank_call(communicator: Any) -> Any:
        start, local = shards[communicator.rank]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size,
            **local, **setting,
        )

    sharded.run_local(RANKS, lambda communicator: rank_call(_Recording(communicator, kept)))
    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        rank_call(_Replay(kept, RANKS))
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])


def local_seconds(step: dict[str, Any], setting: dict[str, Any], repeats: int) -> float:
    """Median seconds of the step on ``RANKS`` threads (the shards cut once, before; after
    one warm step)."""
    vocab_size = step["target_logits"].shape[1]
    shards = [shard_of(step, RANKS, rank) for rank in range(RANKS)]

    def rank_call(communicator: Any) -> Any:
        start, local = shards[communicator.rank]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size,
            **local, **setting,
        )

    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        sharded.run_local(RANKS, rank_call)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])


def unsharded_seconds(step: dict[str, Any], setting: dict[str, Any], repeats: int) -> float:
    """Median seconds of the unsharded call on the whole rows (after one warm call)."""
    specdec_np.verify_ragged(**step, **setting)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        specdec_np.verify_ragged(**step, **setting)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def mpi_worker(repeats: int, out: str) -> None:
    """In each of the ``mpiexec`` processes: every row's steps, timed on the slower rank;
    rank 0 writes the medians to ``out``."""
    communicator = sharded.MPICommunicator()
    found = []
    for name, setting in SETTINGS.items():
        for batch in BATCHES:
            for vocab_size in VOCABULARIES:
                step = make_step(np.random.default_rng(batch), batch, vocab_size)
                start, local = shard_of(step, communicator.size, communicator.rank)
                del step
                times = []
                for _ in range(repeats + 1):
                    communicator.allgather(np.zeros(1))
                    began = time.perf_counter()
                    sharded.verify_ragged(
                        communicator=communicator, vocab_start=start, vocab_size=vocab_size,
                        **local, **setting,
                    )
                    elapsed = time.perf_counter() - began
                    times.append(float(communicator.allgather(np.array([elapsed])).max()))
                found.append({"setting": name, "B": batch, "V": vocab_size,
                              "mpi_s": statistics.median(times[1:])})
    if communicator.rank == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(found, handle)


def mpi_seconds(repeats: int) -> dict[tuple[str, int, int], float]:
    """``mpi_s`` of every row, from ``mpiexec -n 2`` of this script."""
    environment = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [
        environment.get("PYTHONPATH")])])
    environment.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_mpi_yield_when_idle="1")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "mpi.json")
        subprocess.run(
            [str(MPIEXEC), "-n", str(RANKS), sys.executable, os.path.abspath(__file__),
             "--mpi-worker", "--repeats", str(repeats), "--out", out,
             "--batches", ",".join(map(str, BATCHES)),
             "--vocabularies", ",".join(map(str, VOCABULARIES)),
             *([] if DRAFT_NOISE is None else ["--draft-noise", str(DRAFT_NOISE)])],
            check=True, env=environment, timeout=3600,
        )
        with open(out, encoding="utf-8") as handle:
            found = json.load(handle)
    return {(row["setting"], row["B"], row["V"]): row["mpi_s"] for row in found}


def time_table(repeats: int) -> list[dict[str, Any]]:
    """Every row's ``unsharded_s``, ``mpi_s``, ``rank_s`` and ``local_s``."""
    rows = []
    for name, setting in SETTINGS.items():
        for batch in BATCHES:
            for vocab_size in VOCABULARIES:
                step = make_step(np.random.default_rng(batch), batch, vocab_size)
                rows.append({
                    "setting": name, "B": batch, "V": vocab_size,
                    "unsharded_s": unsharded_seconds(step, setting, repeats),
                    "rank_s": rank_seconds(step, setting, repeats),
                    "local_s": local_seconds(step, setting, repeats),
                })
                harness.log(f"timed {name} B={batch} V={vocab_size}")
    mpi = mpi_seconds(repeats)
    for row in rows:
        row["mpi_s"] = mpi[(row["setting"], row["B"], row["V"])]
        row["mpi_over_unsharded"] = round(row["mpi_s"] / row["unsharded_s"], 2)
    return rows


def main() -> None:
    """Print (and optionally write) the bytes table and the wall times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="also time every row")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per row")
    parser.add_argument("--small-vocabulary", type=int, help="measure the bytes at one V")
    parser.add_argument("--batches", help="comma-separated B values (default 1,8,64)")
    parser.add_argument("--vocabularies", help="comma-separated V values (default 32000,128256)")
    parser.add_argument("--out", help="write the rows as JSON lines")
    parser.add_argument("--draft-noise", type=float,
                        help="draft rows: their own position's target row plus this noise")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    global BATCHES, VOCABULARIES, DRAFT_NOISE
    DRAFT_NOISE = arguments.draft_noise
    if arguments.batches:
        BATCHES = tuple(int(value) for value in arguments.batches.split(","))
    if arguments.vocabularies:
        VOCABULARIES = tuple(int(value) for value in arguments.vocabularies.split(","))
    if arguments.mpi_worker:
        mpi_worker(arguments.repeats, arguments.out)
        return
    rows: list[dict[str, Any]] = [dict(harness.run_metadata(), kind="meta",
                                       machine=platform.processor() or platform.machine())]
    byte_rows = bytes_table(arguments.small_vocabulary)
    columns = ("setting", "B", "V", "exchanged_bytes", "rounds", "gather_bytes", "percent")
    cells = [[str(row[column]) for column in columns] for row in byte_rows]
    print(harness.render_table(columns, cells, markdown=False))
    rows += [dict(row, kind="bytes") for row in byte_rows]
    if arguments.time:
        time_rows = time_table(arguments.repeats)
        columns = ("setting", "B", "V", "unsharded_s", "mpi_s", "rank_s", "local_s",
                   "mpi_over_unsharded")
        cells = [[f"{row[column]:.4g}" if isinstance(row[column], float) else str(row[column])
                  for column in columns] for row in time_rows]
        print(harness.render_table(columns, cells, markdown=False))
        rows += [dict(row, kind="time") for row in time_rows]
    if arguments.out:
        with open(arguments.out, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
