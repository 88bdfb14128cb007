"""The README's performance figure, drawn from a committed benchmark run.

Reads the JSON lines that ``benchmarks/studies/run.py --json`` wrote (the padded layout, the
verifiers of the registry against their torch baselines) and draws two panels for one
vocabulary size: the speed-up over the torch baseline, and the fraction of the roofline
(the time the bytes the algorithm must read take at the measured bandwidth, over the
measured time), per verifier and batch size, for both input regimes.  Nothing is measured
here: the figure is a picture of the file, so that it can be redrawn and checked.

Usage::

    python benchmarks/studies/plot_summary.py \\
        benchmarks/results/2026-12-01-padded-cpu/reduced-grid.jsonl \\
        --vocab 128256 --out benchmarks/summary.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

from specdec_np import registry  # noqa: E402


def summary_cells(records: list[dict[str, Any]], vocab_size: int) -> list[dict[str, Any]]:
    """The run's cells at ``vocab_size`` on the CPU that have a torch baseline, in
    registry order, then by regime and batch size."""
    order = {name: position for position, name in enumerate(registry.names())}
    cells = [
        record
        for record in records
        if record.get("kind") == "cell"
        and record.get("V") == vocab_size
        and record.get("backend") == "numpy"
        and record.get("x_torch") is not None
    ]
    return sorted(cells, key=lambda c: (order.get(c["verifier"], 99), c["regime"], c["B"]))


def draw(records: list[dict[str, Any]], vocab_size: int, out: Path) -> int:
    """Draw the two panels of the cells at ``vocab_size`` into ``out``; the cell count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary_cells(records, vocab_size)
    if not cells:
        raise SystemExit(f"no cell with V = {vocab_size} and a torch baseline in the file")
    meta = next((r for r in records if r.get("kind") == "meta"), {})
    labels = [f"{c['verifier']}\n{c['regime']} B={c['B']}" for c in cells]
    figure, (speed, roofline) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    colours = {"flat": "tab:blue", "realistic": "tab:orange"}
    positions = range(len(cells))
    speed.bar(positions, [c["x_torch"] for c in cells],
              color=[colours.get(c["regime"], "grey") for c in cells])  # fmt: skip
    speed.set_yscale("log")
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.set_ylabel("speed-up over torch (x)")
    roofline.bar(positions, [c["roofline"] for c in cells],
                 color=[colours.get(c["regime"], "grey") for c in cells])  # fmt: skip
    roofline.axhline(0.5, color="black", linewidth=0.8, linestyle="--")
    roofline.set_ylabel("fraction of the roofline")
    roofline.set_xticks(list(positions), labels, rotation=90, fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in colours.values()]
    speed.legend(handles, list(colours), title="regime", loc="upper right")
    bandwidth = meta.get("roofline_bandwidth_gb_per_s")
    subtitle = f"{bandwidth:.1f} GB/s measured" if bandwidth else "bandwidth not recorded"
    speed.set_title(
        f"specdec_np, padded layout from probabilities, k = {cells[0]['k']}, V = {vocab_size}, "
        f"one thread ({meta.get('date', '?')[:10]}, {meta.get('cpu_count', '?')} cores, "
        f"{subtitle})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return len(cells)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl", help="a run of benchmarks/studies/run.py --json")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--out", default=str(HERE.parent / "summary.png"))
    arguments = parser.parse_args(argv)
    count = draw(harness.read_jsonl(arguments.jsonl), arguments.vocab, Path(arguments.out))
    harness.log(f"{arguments.out}: {count} cells of {arguments.jsonl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
