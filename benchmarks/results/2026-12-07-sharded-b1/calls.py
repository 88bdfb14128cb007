"""Python-level calls a step of one rank's work (cProfile's count: Python functions and the
C functions Python calls, not the array operators), at B = 1, V = 32000, k = 4, rank 0 of
2 with the gathered arrays replayed (benchmarks/studies/sharded.py's ``rank_s``).

Usage: ``python calls.py [plain|filtered] [steps]`` from the repository root.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "studies"))

import sharded as study  # noqa: E402

from specdec_np import sharded  # noqa: E402


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "plain"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    setting, vocab_size = study.SETTINGS[name], 32000
    step = study.make_step(np.random.default_rng(1), 1, vocab_size)
    shards = [study.shard_of(step, 2, rank) for rank in range(2)]
    kept: list[np.ndarray] = []

    def rank_call(communicator: Any) -> Any:
        start, local = shards[communicator.rank]
        return sharded.verify_ragged(communicator=communicator, vocab_start=start,
                                     vocab_size=vocab_size, **local, **setting)

    sharded.run_local(2, lambda communicator: rank_call(study._Recording(communicator, kept)))
    for _ in range(10):
        rank_call(study._Replay(kept, 2))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        rank_call(study._Replay(kept, 2))
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    print(f"{name}: {calls / steps:.0f} calls a step")


if __name__ == "__main__":
    main()
