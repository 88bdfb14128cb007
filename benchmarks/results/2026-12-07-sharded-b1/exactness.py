"""The exactness check of this note: one rank's result (tokens, accepted lengths,
``exchanged_bytes``, ``rounds``) and the dtype, shape and SHA-1 of every array it handed
``allgather``, over 936 sharded calls on ``run_local`` ranks (float32 and float64; logits,
target logits alone and probabilities; B = 1, 2, 8 and a request without drafts; no
filter, top-k 50 with top-p 0.9 and min-p 0.05, top-p alone, top-k 300 (the radix
select), top-k 300 with top-p, min-p alone, top-k 5, llama.cpp's order; sampled and mixed
greedy requests; rejection, block, typical and greedy; 1, 2 and 3 ranks, one of width 0;
bonus ids with and without bonus rows).  A call that raises records its exception.

Usage: ``PYTHONPATH=<package before> python exactness.py record FILE`` then
``PYTHONPATH=<package after> python exactness.py compare FILE`` (exit status 1 and the
calls that differ where any does).
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from typing import Any

import numpy as np

from specdec_np import registry, sharded

ROW_NAMES = ("target_logits", "target_probs", "draft_logits", "draft_probs")


def batch(seed: int, vocab_size: int, counts: list[int], dtype: Any, form: str,
          greedy_mix: bool) -> dict[str, Any]:
    """One call's arguments on the whole rows."""
    rng = np.random.default_rng(seed)
    counts_array = np.asarray(counts)
    total, batch_size = int(counts_array.sum()), counts_array.size
    target = (rng.normal(size=(total + batch_size, vocab_size)) * 2.5).astype(dtype)
    request = np.repeat(np.arange(batch_size), counts_array)
    rows = np.arange(total) + request
    draft = (target[rows] + 0.7 * rng.normal(size=(total, vocab_size))).astype(dtype)
    drafted = np.where(rng.random(total) < 0.7, np.argmax(draft, axis=1),
                       rng.integers(0, vocab_size, total))
    arguments: dict[str, Any] = {"num_draft_tokens": counts_array,
                                 "draft_token_ids": drafted}
    if form == "probs":
        for name, logits in (("target_probs", target), ("draft_probs", draft)):
            weights = np.exp(logits - logits.max(axis=1, keepdims=True))
            arguments[name] = (weights / weights.sum(axis=1, keepdims=True)).astype(dtype)
    else:
        arguments["target_logits"] = target
        if form == "logits":
            arguments["draft_logits"] = draft
    arguments["uniforms"] = rng.random((batch_size, int(counts_array.max(initial=0)) + 2))
    temperature = np.full(batch_size, 0.8)
    if greedy_mix:
        temperature[::2] = 0.0
    arguments["temperature"] = temperature if greedy_mix else 0.8
    return arguments


class Recording:
    """Rank 0's digest of every array it hands ``allgather``."""

    def __init__(self, inner: Any, log: list) -> None:
        self.inner, self.log = inner, log
        self.rank, self.size = inner.rank, inner.size

    def allgather(self, array: np.ndarray) -> np.ndarray:
        if self.rank == 0:
            data = np.ascontiguousarray(array).tobytes()
            self.log.append((array.dtype.str, array.shape, hashlib.sha1(data).hexdigest()))
        return self.inner.allgather(array)


def run(widths: list[int], arguments: dict[str, Any]) -> tuple:
    """Rank 0's result and rounds on ranks of ``widths`` columns."""
    cuts = [0, *np.cumsum(widths).tolist()]
    log: list = []

    def rank_call(communicator: Any) -> Any:
        start, end = cuts[communicator.rank], cuts[communicator.rank + 1]
        local = {name: value[:, start:end] if name in ROW_NAMES else value
                 for name, value in arguments.items()}
        return sharded.verify_ragged(communicator=Recording(communicator, log),
                                     vocab_start=start, vocab_size=cuts[-1], **local)

    try:
        result = sharded.run_local(len(widths), rank_call, timeout=60)[0]
    except Exception as error:  # noqa: BLE001 - recorded, compared like a result
        return ("error", type(error).__name__ + str(error), log)
    return (result.output_token_ids.tolist(), result.accepted_lengths.tolist(),
            result.exchanged_bytes, result.rounds, log)


FILTERS: list[dict[str, Any]] = [
    {}, {"top_k": 50, "top_p": 0.9, "min_p": 0.05}, {"top_p": 0.9}, {"top_k": 300},
    {"top_k": 300, "top_p": 0.8}, {"min_p": 0.1}, {"top_k": 5},
    {"top_k": 50, "top_p": 0.9, "min_p": 0.05, "filter_order": "llama.cpp"},
]


def calls() -> list[tuple]:
    """Every call's rank 0 record."""
    found = []
    seed = 0
    for dtype in (np.float32, np.float64):
        for form in ("logits", "target_only", "probs"):
            for counts in ([4], [4, 0, 2, 3, 1, 4, 4, 2], [0], [3, 3]):
                for setting in FILTERS:
                    if form == "probs" and setting:
                        continue
                    for mix in (False, True):
                        for method in registry.names():
                            if method != "rejection" and (len(setting) not in (0, 3) or mix):
                                continue
                            for widths in ([2000, 2000], [1500, 0, 2500], [4000]):
                                if method != "rejection" and len(widths) != 2:
                                    continue
                                seed += 1
                                arguments = batch(seed, sum(widths), counts, dtype, form, mix)
                                arguments.update(setting, method=method)
                                if seed % 7 == 0:
                                    arguments["bonus_token_ids"] = np.arange(len(counts)) + 3
                                if seed % 5 == 0 and "target_logits" in arguments:
                                    # Bonus ids with the drafts' target rows alone.
                                    request = np.repeat(np.arange(len(counts)), counts)
                                    rows = np.arange(int(np.sum(counts))) + request
                                    arguments["target_logits"] = np.ascontiguousarray(
                                        arguments["target_logits"][rows])
                                    arguments["bonus_token_ids"] = np.arange(len(counts)) + 5
                                found.append(run(widths, arguments))
    return found


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    found = calls()
    if mode == "record":
        with open(path, "wb") as handle:
            pickle.dump(found, handle)
        print(f"{len(found)} calls recorded")
        return
    with open(path, "rb") as handle:
        recorded = pickle.load(handle)
    differ = [index for index, (old, new) in enumerate(zip(recorded, found, strict=True))
              if old != new]
    raised = [index for index in differ if recorded[index][0] == "error"]
    print(f"{len(found)} calls; {len(differ)} differ ({len(raised)} of them raised before)")
    for index in differ:
        print(index, recorded[index][:2], "->", found[index][:2])
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
