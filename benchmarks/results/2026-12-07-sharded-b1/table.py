"""The NOTE's wall-time table from the runs beside it: per row and column the median over
the ``before-*.jsonl`` and over the ``after-*.jsonl`` runs of each run's median (the
unsharded call: over all of them, which share its kernel), as Markdown.

Usage: ``python table.py`` from this folder (or with the folder as its argument).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

NAMES = {"plain": "temperature only", "filtered": "top-k, top-p, min-p"}
COLUMNS = (("rank_s", "one rank's work"), ("local_s", "2 ranks, threads"),
           ("mpi_s", "2 MPI ranks"))


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
    header = ["setting", "B", "V", "unsharded"]
    for _, name in COLUMNS:
        header += [f"{name}, before", "after", "after / before", "after / unsharded"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for key in before[0]:
        def median(runs: list[dict], column: str, key: tuple = key) -> float:
            return statistics.median(run[key][column] for run in runs)

        unsharded = median(before + after, "unsharded_s")
        cells = [NAMES[key[0]], str(key[1]), str(key[2]), f"{unsharded * 1e3:.3f}"]
        for column, _ in COLUMNS:
            old, new = median(before, column), median(after, column)
            cells += [f"{old * 1e3:.3f}", f"{new * 1e3:.3f}", f"{new / old:.2f}",
                      f"{new / unsharded:.2f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
