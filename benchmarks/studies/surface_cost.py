#!/usr/bin/env python
"""What the sampling surface costs: ``verify_ragged`` from logits with penalties and a
logit bias, or a grammar bitmask, against the same call without them.

At ``(B, k, V) = (64, 4, 128256)`` (``--quick``: ``(4, 2, 4096)``), float32 logits (normals
times 2), draft logits near the target's, temperature 0.8 and top-p 0.95, a NumPy
generator: the plain call; penalties (repetition 1.1, frequency 0.5, presence 0.3) over a
1,000-token output context per request plus a logit bias of 100 entries; a bitmask
forbidding one word in seven.  The three are interleaved round by round so that a load
spike hits all; the fastest round of each and its ratio to the plain call::

    OMP_NUM_THREADS=1 python benchmarks/studies/surface_cost.py --json F
    python benchmarks/studies/surface_cost.py --render F
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import harness
import numpy as np


def cases(batch: int, k: int, vocab: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The plain call's keywords and each setting's extra keywords (seed 0)."""
    rng = np.random.default_rng(0)
    rows = batch * (k + 1)
    logits = (2.0 * rng.standard_normal((rows, vocab))).astype(np.float32)
    draft_rows = np.concatenate([np.arange(b * (k + 1), b * (k + 1) + k) for b in range(batch)])
    draft = logits[draft_rows] + (0.5 * rng.standard_normal((batch * k, vocab))).astype(
        np.float32
    )
    base = dict(num_draft_tokens=np.full(batch, k), draft_token_ids=rng.integers(
        0, vocab, batch * k), target_logits=logits, draft_logits=draft, temperature=0.8,
        top_p=0.95)
    bias = [{int(t): float(v) for t, v in zip(rng.integers(0, vocab, 100),
                                               rng.standard_normal(100))}
            for _ in range(batch)]
    mask = np.full((rows, (vocab + 31) // 32), -1, dtype=np.int32)
    mask[:, ::7] = 0x7FFFFFFF
    settings = {
        "plain": {},
        "penalties and bias": dict(
            output_token_ids=[rng.integers(0, vocab, 1000) for _ in range(batch)],
            repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.3,
            logit_bias=bias),
        "bitmask": dict(token_bitmask=mask),
    }
    return base, settings


def measure(label: str, shape: tuple[int, int, int], rounds: int) -> list[dict]:
    import specdec_np

    base, settings = cases(*shape)
    best = {name: float("inf") for name in settings}
    for _ in range(rounds):
        for name, extra in settings.items():
            generator = np.random.default_rng(1)

            def call(extra: dict = extra, generator: Any = generator) -> Any:
                return specdec_np.verify_ragged(generator=generator, **base, **extra)

            best[name] = min(best[name], harness.best_seconds(call, 1))
    batch, k, vocab = shape
    return [
        {"label": label, "B": batch, "k": k, "V": vocab, "setting": name,
         "ms": seconds * 1e3, "ratio": seconds / best["plain"], "loadavg": harness.loadavg()}
        for name, seconds in best.items()
    ]


def render(records: list[dict]) -> None:
    print("| label | B, k, V | setting | ms | x plain |")
    print("|---|---|---|---:|---:|")
    for r in records:
        print(f"| {r['label']} | {r['B']}, {r['k']}, {r['V']} | {r['setting']} | "
              f"{r['ms']:.1f} | {r['ratio']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", help="append one JSON line per setting to this file")
    parser.add_argument("--render", help="print the table of a saved run and exit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="(4, 2, 4096), 1 round")
    args = parser.parse_args(argv)
    if args.render:
        render(harness.read_jsonl(args.render))
        return 0
    shape, rounds = ((4, 2, 4096), 1) if args.quick else ((64, 4, 128256), args.rounds)
    records = measure(args.label, shape, rounds)
    if args.json:
        harness.write_jsonl(args.json, records, append=True)
    render(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
