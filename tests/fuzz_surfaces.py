"""Fuzz worker for the engine and tree surfaces under the conditions of an outside attack:
writer threads, interrupts, small stacks, masked and foreign arrays (docs/semantics.md §6
and §8).

Run as a script in a subprocess by ``tests/test_fuzz_surfaces.py``, so that a crash is seen
as a crash::

    python tests/fuzz_surfaces.py MODE --seed S --calls N

Every case is a random valid call of ``verify_ragged`` or ``verify_tree`` (a method of the
registry, probability or logits rows with sampling parameters, greedy requests mixed in,
explicit uniforms so that the call is deterministic), first made once to get its
*pristine* result.  Then, by mode:

* ``writers``: threads write invalid values (out-of-range ids and uniforms, bad sampling
  parameters and parents) into one of the caller's arrays while the call runs.  The call
  must return the pristine result (it read a private copy) or raise a ValueError or
  TypeError (it saw the write before its copy); never another result.
* ``interrupts``: a ``KeyboardInterrupt`` is raised at a random point of an
  ``EngineVerifier`` call or a ``verify_tree`` call drawing from a generator.  Afterwards
  the metrics and the generator are both updated or both untouched.
* ``small_stack``: the call runs in a thread with a 32 KiB stack (Python's minimum) and must
  give the pristine result; run the worker under ``OMP_STACKSIZE=16K`` for OpenMP threads.
* ``masked``: one array argument becomes a masked array or a ``numpy.matrix``: a TypeError
  that names it.  With torch installed, all arrays become torch tensors: the same tokens,
  as torch tensors.
* ``sampling``: ``processed_probs``, ``sample_tokens``, ``verify_ragged`` and
  ``verify_tree`` on logits rows with temperatures near and past the overflow of the
  rows' largest finite logits (huge logits, ``-inf`` masks, NaN and ``+inf`` entries,
  greedy requests), and on empty batches.  A call is refused with a ValueError naming
  ``temperature`` exactly when some row a temperature divides has ``m / t`` infinite for
  its largest finite logit ``m`` (computed here in the rows' dtype); otherwise its laws
  are distributions and an empty batch gives empty results of the right shapes.  (The
  random case of the other modes is not used.)

The last line printed is a JSON summary (calls per outcome).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from typing import Any

import numpy as np

import specdec_np
from specdec_np import registry

VOCAB_SIZES = (1, 2, 5, 17)


def random_case(rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
    """A valid call: ``("ragged" | "tree", keyword arguments)``."""
    layout = "ragged" if rng.random() < 0.5 else "tree"
    vocab = int(rng.choice(VOCAB_SIZES))
    batch = int(rng.integers(1, 5))
    logits = bool(rng.random() < 0.5)
    dtype = np.float32 if rng.random() < 0.7 else np.float64
    if layout == "ragged":
        counts = rng.integers(0, 4, batch)
        total = int(counts.sum())
        method = str(rng.choice(registry.names()))
        arguments: dict[str, Any] = {
            "num_draft_tokens": counts,
            "draft_token_ids": rng.integers(0, vocab, total),
            "method": method,
            "uniforms": rng.random((batch, int(counts.max(initial=0)) + 2)),
        }
        draft_rows = total
    else:
        counts = rng.integers(0, 5, batch)
        parents = np.concatenate(
            [[-1 if j == 0 else int(rng.integers(-1, j)) for j in range(n)] for n in counts]
            or [[]]
        ).astype(np.int64)
        total = int(counts.sum())
        arguments = {
            "num_nodes": counts,
            "tree_parents": parents,
            "draft_token_ids": rng.integers(0, vocab, total),
            "method": str(rng.choice(registry.tree_method_names())),
            "uniforms": rng.random((batch, int(counts.max(initial=0)) + 1)),
        }
        draft_rows = total
    rows = rng.normal(size=(total + batch, vocab)) * 2
    drafts = rng.normal(size=(draft_rows, vocab)) * 2
    if logits:
        arguments["target_logits"] = rows.astype(dtype)
        arguments["draft_logits"] = drafts.astype(dtype)
        greedy = rng.random(batch) < 0.3
        arguments["temperature"] = np.where(greedy, 0.0, rng.uniform(0.3, 2, batch))
        arguments["top_k"] = rng.integers(0, vocab + 1, batch)
        arguments["top_p"] = rng.uniform(0.2, 1.0, batch)
        arguments["min_p"] = np.where(rng.random(batch) < 0.5, 0.0, rng.uniform(0, 0.5, batch))
    else:
        arguments["target_probs"] = softmax(rows).astype(dtype)
        arguments["draft_probs"] = softmax(drafts).astype(dtype)
    return layout, arguments


def softmax(rows: np.ndarray) -> np.ndarray:
    weights = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def call(layout: str, arguments: dict[str, Any]) -> Any:
    function = specdec_np.verify_ragged if layout == "ragged" else specdec_np.verify_tree
    return function(**arguments)


def tokens(result: Any) -> list:
    return np.asarray(result.output_token_ids).tolist()


def copied(arguments: dict[str, Any]) -> dict[str, Any]:
    return {name: value.copy() if isinstance(value, np.ndarray) else value
            for name, value in arguments.items()}  # fmt: skip


#: The invalid value a writer thread puts into each array argument.
INVALID = {
    "uniforms": 1.5,
    "draft_token_ids": 10**6,
    "temperature": -1.0,
    "top_k": -5,
    "top_p": 2.0,
    "min_p": 1.5,
    "tree_parents": 10**6,
    "num_draft_tokens": 10**6,
    "num_nodes": 10**6,
}


def writers(
    rng: np.random.Generator, layout: str, arguments: dict[str, Any], pristine: list
) -> str:
    targets = [name for name in INVALID if isinstance(arguments.get(name), np.ndarray)
               and arguments[name].size]  # fmt: skip
    name = str(rng.choice(targets))
    victim = copied(arguments)
    stop = threading.Event()
    flat = victim[name].reshape(-1)
    invalid = np.asarray(INVALID[name]).astype(flat.dtype)
    # The writes start after a random delay, so that they land before, during and after
    # the call's checks and copies.
    delay = int(rng.integers(0, 3000))

    def write() -> None:
        for _ in range(delay):
            if stop.is_set():
                return
        index = 0
        while not stop.is_set():
            flat[index % flat.size] = invalid
            index += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        result = call(layout, victim)
    except (ValueError, TypeError):
        return "refused"
    finally:
        stop.set()
        thread.join()
    if tokens(result) != pristine:
        raise AssertionError(f"{layout}: a writer on {name} changed the tokens: "
                             f"{tokens(result)} != {pristine}")  # fmt: skip
    return "pristine"


class InterruptAt:
    """A trace function raising KeyboardInterrupt at the ``at``-th line event."""

    def __init__(self, at: int) -> None:
        self.at, self.count = at, 0

    def __call__(self, frame: Any, event: str, argument: Any) -> Any:
        if event == "line":
            self.count += 1
            if self.count == self.at:
                raise KeyboardInterrupt
        return self


def interrupts(rng: np.random.Generator, layout: str, arguments: dict[str, Any]) -> str:
    seed = int(rng.integers(2**32))
    # A dry run counts the call's line events, so that the interrupt lands anywhere in it
    # (or nowhere: some calls complete), and says what a completed call changes.
    counter = InterruptAt(0)
    run, state = interruptible_call(layout, arguments, seed)
    start = state()
    sys.settrace(counter)
    try:
        run()
    finally:
        sys.settrace(None)
    done = state()
    run, state = interruptible_call(layout, arguments, seed)
    hook = InterruptAt(int(rng.integers(1, counter.count + 10)))
    sys.settrace(hook)
    try:
        run()
        outcome = "completed"
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        sys.settrace(None)
    after = state()
    if after != done and (outcome == "completed" or after != start):
        raise AssertionError(
            f"{outcome}: metrics and generator must be both updated or both untouched; "
            f"found {after}, untouched {start}, updated {done}"
        )
    return outcome if after == start or outcome == "completed" else "interrupted after"


def interruptible_call(layout: str, arguments: dict[str, Any], seed: int) -> tuple[Any, Any]:
    """A call drawing from a fresh source seeded with ``seed``, and the function giving the
    ``(metrics, generator state)`` it changes."""
    keywords = copied(arguments)
    keywords.pop("uniforms")
    generator = np.random.default_rng(seed)
    if layout == "ragged":
        verifier = specdec_np.EngineVerifier(keywords.pop("method"), seed=seed)

        def run() -> Any:
            return verifier(**keywords)

        def state() -> tuple[str, str]:
            return repr(verifier.metrics), repr(verifier._own_generator.numpy.bit_generator.state)
    else:
        keywords["generator"] = generator

        def run() -> Any:
            return specdec_np.verify_tree(**keywords)

        def state() -> tuple[str, str]:
            return "", repr(generator.bit_generator.state)

    return run, state


def small_stack(layout: str, arguments: dict[str, Any], pristine: list) -> str:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["tokens"] = tokens(call(layout, arguments))
        except BaseException as error:  # reported below, in the main thread
            box["error"] = error

    previous = threading.stack_size(32768)
    try:
        thread = threading.Thread(target=run)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    if "error" in box:
        raise box["error"]
    if box["tokens"] != pristine:
        raise AssertionError(f"a 32 KiB stack changed the tokens: {box['tokens']} != {pristine}")
    return "pristine"


def masked(
    rng: np.random.Generator, layout: str, arguments: dict[str, Any], pristine: list
) -> str:
    names = [name for name, value in arguments.items() if isinstance(value, np.ndarray)]
    if rng.random() < 0.2:
        try:
            import torch
        except ImportError:
            return "no torch"
        foreign = {name: torch.from_numpy(np.ascontiguousarray(value)) if name in names else value
                   for name, value in arguments.items()}  # fmt: skip
        result = call(layout, foreign)
        if not isinstance(result.output_token_ids, torch.Tensor) or tokens(result) != pristine:
            raise AssertionError("torch inputs must give the same tokens as torch tensors")
        return "torch"
    name = str(rng.choice(names))
    value = arguments[name]
    bad = np.ma.masked_array(value, mask=np.zeros(value.shape, bool))
    if rng.random() < 0.5:
        bad = np.asmatrix(value.reshape(1, -1) if value.ndim == 1 else value)
    broken = {**arguments, name: bad}
    try:
        call(layout, broken)
    except TypeError as error:
        if name not in str(error):
            raise AssertionError(f"the TypeError for {type(bad).__name__} {name} does not "
                                 f"name it: {error}") from None  # fmt: skip
        return "refused"
    raise AssertionError(f"{type(bad).__name__} {name} was accepted")


def overflowing_rows(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """Logits rows of one random dtype and a temperature per row near the overflow of
    their largest finite logits, and whether some divided row overflows (the oracle:
    ``m / t`` in the rows' dtype, ``m`` the largest finite logit, for ``0 < t``)."""
    dtype = np.float32 if rng.random() < 0.6 else np.float64
    info = np.finfo(dtype)
    batch, vocab = int(rng.integers(1, 5)), int(rng.choice(VOCAB_SIZES))
    scale = float(info.max) * 10.0 ** -rng.uniform(0, 6, (batch, 1))
    rows = (rng.uniform(-1, 1, (batch, vocab)) * scale).astype(dtype)
    special = rng.random((batch, vocab))
    rows[special < 0.15] = -np.inf
    rows[(special >= 0.15) & (special < 0.2)] = np.nan
    rows[(special >= 0.2) & (special < 0.23)] = np.inf
    finite = np.where(np.isfinite(rows), rows, -np.inf)
    largest = finite.max(axis=1)
    # Temperatures around |m| / max: just past, at and just below the overflow.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        edge = np.abs(largest.astype(np.float64)) / float(info.max)
    factor = rng.choice([0.5, 1.0 - 1e-7, 1.0, 1.0 + 1e-7, 2.0, 1e3], batch)
    temperature = np.clip(np.nan_to_num(edge * factor, nan=1.0), float(info.tiny), 4.0)
    temperature = np.where(rng.random(batch) < 0.15, 0.0, temperature)
    divisor = temperature.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quotient = largest / np.where(divisor > 0, divisor, dtype(1))
    overflows = (divisor > 0) & np.isfinite(largest) & np.isinf(quotient)
    return rows, temperature, bool(overflows.any())


def sampling(rng: np.random.Generator) -> str:
    if rng.random() < 0.2:
        return empty_batches(rng)
    rows, temperature, overflows = overflowing_rows(rng)
    batch = rows.shape[0]
    surface = str(rng.choice(["processed_probs", "sample_tokens", "verify_ragged",
                              "verify_tree"]))  # fmt: skip
    uniforms = rng.random(batch)
    try:
        if surface == "processed_probs":
            law = specdec_np.processed_probs(rows, temperature=temperature)
            sums = law.astype(np.float64).sum(axis=1)
            if not (np.isfinite(law).all() and (law >= 0).all()
                    and np.all((np.abs(sums - 1) < 1e-3) | (sums == 0))):  # fmt: skip
                raise AssertionError(f"processed_probs gave rows that are not laws: {law}")
        elif surface == "sample_tokens":
            specdec_np.sample_tokens(logits=rows, temperature=temperature, uniforms=uniforms)
        elif surface == "verify_ragged":
            specdec_np.verify_ragged(
                num_draft_tokens=np.zeros(batch, np.int64), draft_token_ids=[],
                target_logits=rows, temperature=temperature,
                uniforms=np.stack([uniforms, uniforms], axis=1),
            )  # fmt: skip
        else:
            specdec_np.verify_tree(
                num_nodes=np.zeros(batch, np.int64), tree_parents=[], draft_token_ids=[],
                target_logits=rows, temperature=temperature, method="traversal",
                uniforms=uniforms[:, None],
            )  # fmt: skip
    except ValueError as error:
        if "temperature" in str(error) and "overflow" in str(error):
            if not overflows:
                raise AssertionError(f"{surface} refused a temperature that overflows no "
                                     f"finite logit: {error}") from None  # fmt: skip
            return "refused"
        if "no positive probability" in str(error) and not overflows:
            return "no mass"  # a row of -inf and NaN only, drawn from
        raise
    if overflows:
        raise AssertionError(f"{surface} accepted temperatures {temperature.tolist()} that "
                             f"overflow finite logits of rows {rows.tolist()}")  # fmt: skip
    return "accepted"


def empty_batches(rng: np.random.Generator) -> str:
    dtype = np.float32 if rng.random() < 0.5 else np.float64
    vocab = int(rng.choice(VOCAB_SIZES))
    rows = np.zeros((0, vocab), dtype)
    empty = [[], (), np.zeros(0, np.int64)][int(rng.integers(3))]
    temperature = [None, [], 0.5][int(rng.integers(3))]
    law = specdec_np.processed_probs(rows, temperature=temperature)
    drawn = specdec_np.sample_tokens(logits=rows, temperature=temperature)
    ragged = specdec_np.verify_ragged(
        num_draft_tokens=empty, draft_token_ids=[], target_logits=rows, temperature=temperature
    )
    engine = specdec_np.EngineVerifier(seed=0)
    engine_result = engine(
        num_draft_tokens=empty, draft_token_ids=[], target_logits=rows, temperature=temperature
    )
    tree = specdec_np.verify_tree(
        num_nodes=empty, tree_parents=[], draft_token_ids=[], target_logits=rows,
        temperature=temperature,
    )  # fmt: skip
    shapes = (law.shape, drawn.shape, ragged.output_token_ids.shape,
              engine_result.output_token_ids.shape, tree.output_token_ids.shape)  # fmt: skip
    if shapes != ((0, vocab), (0,), (0, 1), (0, 1), (0, 1)) or engine.metrics.requests:
        raise AssertionError(f"an empty batch gave shapes {shapes}, {engine.metrics}")
    return "empty"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "mode", choices=("writers", "interrupts", "small_stack", "masked", "sampling")
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=200)
    arguments = parser.parse_args(argv)
    rng = np.random.default_rng(arguments.seed)
    # Threads switch every microsecond instead of every 5 ms: the writers' races happen.
    sys.setswitchinterval(1e-6)
    outcomes: Counter[str] = Counter()
    for index in range(arguments.calls):
        if arguments.mode == "sampling":
            print(f"call {index}: sampling", file=sys.stderr, flush=True)
            outcomes[sampling(rng)] += 1
            continue
        layout, case = random_case(rng)
        form = "logits" if "target_logits" in case else "probs"
        shape = np.shape(case.get("target_logits", case.get("target_probs")))
        message = f"call {index}: {layout} {case.get('method')} {form} {shape}"
        print(message, file=sys.stderr, flush=True)
        pristine = tokens(call(layout, copied(case)))
        if arguments.mode == "writers":
            outcome = writers(rng, layout, case, pristine)
        elif arguments.mode == "interrupts":
            outcome = interrupts(rng, layout, case)
        elif arguments.mode == "small_stack":
            outcome = small_stack(layout, case, pristine)
        else:
            outcome = masked(rng, layout, case, pristine)
        outcomes[outcome] += 1
    print(json.dumps({"mode": arguments.mode, "calls": arguments.calls, **outcomes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
