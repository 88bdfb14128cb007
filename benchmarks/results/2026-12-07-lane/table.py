"""The NOTE's tables from the runs beside it, as Markdown.

Each study ran five times per side, before and after alternating; a cell is the fastest
round of all five runs of a side (each run's own record is the fastest of its 20 rounds),
and its ratio that figure over the fastest of the other side's; in brackets, the median
of the five runs' own ratios.  llama.cpp's times do not depend on our side, so its
fastest is taken over all ten runs.

Usage: ``python table.py`` from this folder (or with the folder as its argument); a
folder with one of the two studies gets its table alone.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def llama_cpp_table(records: list[dict]) -> None:
    ours: dict[tuple, list[float]] = defaultdict(list)
    theirs: dict[tuple, list[float]] = defaultdict(list)
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        cell = (r.get("rows", "synthetic"), r["chain"], r["B"], r["V"])
        call = r.get("llama_cpp_call", "apply")
        ours[(r["label"], *cell)].append(r["ours_us_per_row"])
        theirs[(call, *cell)].append(r["llama_cpp_us_per_row"])
        ratios[(r["label"], call, *cell)].append(r["ratio"])
    cells = sorted(
        {key[1:] for key in ours}, key=lambda c: (c[0] != "SmolLM2-135M", c[3], c[2], c[1])
    )
    print(
        "| rows | chain | B | V | llama.cpp sample | llama.cpp apply | ours before "
        "| ours after | after / sample | after / apply |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        before, after = min(ours[("before", *cell)]), min(ours[("after", *cell)])
        apply = min(theirs[("apply", *cell)])
        sample = theirs.get(("sample", *cell))
        by_sample = f"{after / min(sample):.2f}" if sample else "-"
        median = statistics.median(ratios[("after", "apply", *cell)])
        print(
            f"| {cell[0]} | {cell[1]} | {cell[2]} | {cell[3]} "
            f"| {f'{min(sample):.1f}' if sample else '-'} | {apply:.1f} | {before:.1f} "
            f"| {after:.1f} | {by_sample} | {after / apply:.2f} ({median:.2f}) |"
        )


def top_k_table(records: list[dict]) -> None:
    ours: dict[tuple, list[float]] = defaultdict(list)
    row_max: dict[tuple, list[float]] = defaultdict(list)
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        cell = (r["B"], r["V"], r["filter_order"])
        ours[(r["label"], *cell)].append(r["draw_us_per_row"])
        row_max[cell].append(r["max_us_per_row"])
        ratios[(r["label"], *cell)].append(r["ratio"])
    print("| B | V | filter order | np.max | before | x | after | x |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for cell in sorted(row_max, key=lambda c: (c[1], c[0])):
        fastest = min(row_max[cell])
        before, after = min(ours[("before", *cell)]), min(ours[("after", *cell)])
        median = statistics.median(ratios[("after", *cell)])
        print(
            f"| {cell[0]} | {cell[1]} | {cell[2]} | {fastest:.1f} | {before:.1f} "
            f"| {before / fastest:.2f} | {after:.1f} | {after / fastest:.2f} ({median:.2f}) |"
        )


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
    # A run may hold either study alone: the tables of the files it has.
    tables = [(name, table) for name, table in
              (("llama-cpp-chain.jsonl", llama_cpp_table), ("top-k-draw.jsonl", top_k_table))
              if (folder / name).exists()]  # fmt: skip
    for index, (name, table) in enumerate(tables):
        if index:
            print()
        table(read(folder / name))


if __name__ == "__main__":
    main()
