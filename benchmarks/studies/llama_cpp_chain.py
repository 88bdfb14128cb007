#!/usr/bin/env python
"""``sample_tokens`` against llama.cpp's own sampler chain, per row, on the same rows.

llama.cpp's sampler chain (``llama_sampler_*`` through llama-cpp-python's ctypes API, in
C, one thread): its default chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8,
then ``dist``) and greedy, applied row by row to a ``llama_token_data_array`` filled from
the logits (what ``llama_sampler_sample`` does in C), only the chain's ``apply`` timed.
``specdec_np.sample_tokens`` draws the same rows in one call with the same chain
(``filter_order="llama.cpp"``, a NumPy generator: an engine's call) or greedily
(temperature 0), on one
thread (``OMP_NUM_THREADS=1``).  Float32 logits, normals times 3, at B in {1, 64} and
V in {49152, 128256} (SmolLM2's and Llama 3's vocabularies).  The two are interleaved
round by round so that a load spike hits both; the fastest round of each, per row, and
their ratio (below 1: the library is faster)::

    OMP_NUM_THREADS=1 python benchmarks/studies/llama_cpp_chain.py --json F
    python benchmarks/studies/llama_cpp_chain.py --render F
    python benchmarks/studies/llama_cpp_chain.py --quick     # skips without llama_cpp
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from typing import Any

import harness
import numpy as np

CHAIN = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
CHAINS = ("default", "greedy")


class LlamaChain:
    """One llama.cpp sampler chain and a candidate array of ``V`` entries."""

    def __init__(self, llama_cpp: Any, chain: str, vocab_size: int, seed: int = 0) -> None:
        self.api = llama_cpp
        self.sampler = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        if chain == "greedy":
            steps = [llama_cpp.llama_sampler_init_greedy()]
        else:
            steps = [
                llama_cpp.llama_sampler_init_top_k(CHAIN["top_k"]),
                llama_cpp.llama_sampler_init_top_p(CHAIN["top_p"], 1),
                llama_cpp.llama_sampler_init_min_p(CHAIN["min_p"], 1),
                llama_cpp.llama_sampler_init_temp(CHAIN["temperature"]),
                llama_cpp.llama_sampler_init_dist(seed),
            ]
        for step in steps:
            llama_cpp.llama_sampler_chain_add(self.sampler, step)
        self.candidates = np.zeros(
            vocab_size, dtype=np.dtype([("id", np.int32), ("logit", np.float32),
                                        ("p", np.float32)])
        )
        self.data = self.candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))

    def sample(self, row: np.ndarray) -> tuple[int, float]:
        """The chain's token for one row of logits, and the seconds its ``apply`` took.

        Only the chain is timed: NumPy fills the candidates' fields strided, several times
        slower than the C loop of ``llama_sampler_sample``, so leaving the fill out keeps
        the comparison on llama.cpp's side."""
        candidates = self.candidates
        candidates["id"] = np.arange(candidates.size, dtype=np.int32)
        candidates["logit"] = row
        candidates["p"] = 0.0
        array = self.api.llama_token_data_array(
            data=self.data, size=candidates.size, selected=-1, sorted=False
        )
        start = time.perf_counter()
        self.api.llama_sampler_apply(self.sampler, ctypes.byref(array))
        seconds = time.perf_counter() - start
        return int(candidates["id"][array.selected]), seconds

    def close(self) -> None:
        self.api.llama_sampler_free(self.sampler)


def measure(label: str, batches: list[int], vocabularies: list[int], rounds: int) -> list[dict]:
    import llama_cpp

    import specdec_np

    records = []
    rng = np.random.default_rng(0)
    for V in vocabularies:
        for B in batches:
            rows = (3.0 * rng.standard_normal((B, V))).astype(np.float32)
            for chain in CHAINS:
                sampler = LlamaChain(llama_cpp, chain, V)
                settings = CHAIN if chain == "default" else {"temperature": 0.0}

                generator = np.random.default_rng(1)

                def ours(rows: np.ndarray = rows, settings: dict = settings,
                         generator: np.random.Generator = generator) -> Any:
                    return specdec_np.sample_tokens(
                        logits=rows, generator=generator, filter_order="llama.cpp", **settings
                    )

                def theirs(rows: np.ndarray = rows, sampler: LlamaChain = sampler) -> Any:
                    drawn = [sampler.sample(row) for row in rows]
                    return [token for token, _ in drawn], sum(s for _, s in drawn)

                if chain == "greedy" and list(ours()) != theirs()[0]:
                    raise RuntimeError("greedy tokens differ: the rows are not the same")
                ours()
                ours_s, theirs_s = float("inf"), float("inf")
                for _ in range(rounds):
                    ours_s = min(ours_s, harness.best_seconds(ours, 1))
                    theirs_s = min(theirs_s, theirs()[1])
                sampler.close()
                records.append({
                    "label": label, "B": B, "V": V, "chain": chain,
                    "ours_us_per_row": ours_s / B * 1e6,
                    "llama_cpp_us_per_row": theirs_s / B * 1e6,
                    "ratio": ours_s / theirs_s, "loadavg": harness.loadavg(),
                })  # fmt: skip
                harness.log(f"{label} B={B} V={V} {chain}: {records[-1]['ratio']:.2f}x llama.cpp")
    return records


def render(records: list[dict]) -> None:
    print("| label | chain | B | V | specdec_np, us per row | llama.cpp, us per row | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in records:
        print(
            f"| {r['label']} | {r['chain']} | {r['B']} | {r['V']} | {r['ours_us_per_row']:.1f} "
            f"| {r['llama_cpp_us_per_row']:.1f} | {r['ratio']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", help="append one JSON line per cell to this file")
    parser.add_argument("--render", help="print the table of a saved run and exit")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="B = 1, V = 4096, 1 round")
    args = parser.parse_args(argv)
    if args.render:
        render(harness.read_jsonl(args.render))
        return 0
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama_cpp is not installed (pip install llama-cpp-python): nothing to compare")
        return 0
    if args.quick:
        records = measure(args.label, [1, 3], [4096], 1)
    else:
        records = measure(args.label, [1, 64], [49152, 128256], args.rounds)
    if args.json:
        harness.write_jsonl(args.json, records, append=True)
    render(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
