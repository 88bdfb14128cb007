"""The NOTE's wall-time table from the runs beside it: per row the median over the three
``before-*.jsonl`` and the three ``after-*.jsonl`` runs of each run's median (the
unsharded call: over all six), as Markdown.

Usage: ``python table.py`` from this folder (or with the folder as its argument).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

NAMES = {"plain": "temperature only", "filtered": "top-k, top-p, min-p"}


def load(path: Path) -> dict[tuple[str, int, int], dict]:
    """The timed rows of one run, by (setting, B, V)."""
    rows = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "mpi_s" in row:
            rows[(row["setting"], row["B"], row["V"])] = row
    return rows


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    before = [load(path) for path in sorted(folder.glob("before-*.jsonl"))]
    after = [load(path) for path in sorted(folder.glob("after-*.jsonl"))]
    print("| setting | B | V | unsharded | 2 MPI ranks, before | after | after / unsharded "
          "| one rank's work, before | after | after / unsharded |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in before[0]:
        def median(runs: list[dict], column: str, key: tuple = key) -> float:
            return statistics.median(run[key][column] for run in runs)

        unsharded = median(before + after, "unsharded_s")
        mpi_after, rank_after = median(after, "mpi_s"), median(after, "rank_s")
        print(f"| {NAMES[key[0]]} | {key[1]} | {key[2]} | {unsharded:.3g} "
              f"| {median(before, 'mpi_s'):.3g} | {mpi_after:.3g} "
              f"| {mpi_after / unsharded:.1f} | {median(before, 'rank_s'):.3g} "
              f"| {rank_after:.3g} | {rank_after / unsharded:.2f} |")


if __name__ == "__main__":
    main()
