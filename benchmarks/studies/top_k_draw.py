#!/usr/bin/env python
"""A top-k-filtered draw (llama.cpp's default chain) against ``np.max`` over the same rows.

``sample_tokens`` with top-k 40, top-p 0.95, min-p 0.05 and temperature 0.8 (llama.cpp's
defaults) at B in {1, 64} and V in {49152, 128256}, float32 logits (normals times 3),
explicit uniforms, interleaved with ``np.max(rows, axis=1)`` so that a load spike hits
both; the fastest of the rounds of each, per row, and their ratio.  Both filter orders.
``--chains`` adds other settings: ``top_k`` (top-k 40 and temperature 0.8 alone, where
top-k's key is the law's cutoff) and ``top_k_1`` (top-k 1, temperature 0.8).

The script uses only the public API, so two checkouts' builds are compared by pointing
PYTHONPATH at each in turn (one JSON line per cell)::

    cd benchmarks/studies
    PYTHONPATH=OLD OMP_NUM_THREADS=1 python top_k_draw.py --label before --json F
    PYTHONPATH=NEW OMP_NUM_THREADS=1 python top_k_draw.py --label after --json F
    python top_k_draw.py --render F
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import harness
import numpy as np

CHAINS = {
    "default": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    "top_k": {"temperature": 0.8, "top_k": 40},
    "top_k_1": {"temperature": 0.8, "top_k": 1},
}


def measure(
    label: str, batches: list[int], vocabularies: list[int], rounds: int,
    chains: tuple[str, ...] = ("default",),
) -> list[dict]:
    import specdec_np

    records = []
    rng = np.random.default_rng(0)
    for V in vocabularies:
        for B in batches:
            rows = (3.0 * rng.standard_normal((B, V))).astype(np.float32)
            uniforms = rng.random(B)
            for chain, order in [(c, o) for c in chains for o in ("vllm", "llama.cpp")]:

                def draw(
                    rows: np.ndarray = rows, uniforms: np.ndarray = uniforms, order: str = order,
                    settings: dict = CHAINS[chain],
                ) -> Any:
                    return specdec_np.sample_tokens(
                        logits=rows, uniforms=uniforms, filter_order=order, **settings
                    )

                def row_max(rows: np.ndarray = rows) -> Any:
                    return np.max(rows, axis=1)

                draw()
                draw_s, max_s = float("inf"), float("inf")
                for _ in range(rounds):
                    draw_s = min(draw_s, harness.best_seconds(draw, 1))
                    max_s = min(max_s, harness.best_seconds(row_max, 1))
                records.append({
                    "label": label, "B": B, "V": V, "filter_order": order, "chain": chain,
                    "draw_us_per_row": draw_s / B * 1e6, "max_us_per_row": max_s / B * 1e6,
                    "ratio": draw_s / max_s, "loadavg": harness.loadavg(),
                })  # fmt: skip
                harness.log(
                    f"{label} B={B} V={V} {chain} {order}: {records[-1]['ratio']:.2f}x np.max"
                )
    return records


def render(records: list[dict]) -> None:
    print("| label | chain | B | V | filter order | draw, us per row | np.max, us per row "
          "| ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['label']} | {r.get('chain', 'default')} | {r['B']} | {r['V']} | "
            f"{r['filter_order']} | "
            f"{r['draw_us_per_row']:.1f} | {r['max_us_per_row']:.1f} | {r['ratio']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", help="append one JSON line per cell to this file")
    parser.add_argument("--render", help="print the table of a saved run and exit")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="B = 1, V = 49152, 2 rounds")
    parser.add_argument("--chains", default="default",
                        help=f"comma-separated settings among {', '.join(CHAINS)}")
    args = parser.parse_args(argv)
    chains = tuple(args.chains.split(","))
    unknown = sorted(set(chains) - set(CHAINS))
    if unknown:
        parser.error(f"unknown chains: {', '.join(unknown)}")
    if args.render:
        render(harness.read_jsonl(args.render))
        return 0
    if args.quick:
        records = measure(args.label, [1], [49152], 2, chains)
    else:
        records = measure(args.label, [1, 64], [49152, 128256], args.rounds, chains)
    if args.json:
        harness.write_jsonl(args.json, records, append=True)
    render(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
