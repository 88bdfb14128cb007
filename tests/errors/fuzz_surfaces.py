"""Fuzz worker for the engine and tree surfaces under the conditions of an outside attack:
writer threads, interrupts, small stacks, masked and foreign arrays (docs/semantics.md §6
and §8).

Run as a script in a subprocess by ``tests/errors/test_fuzz_surfaces.py``, so that a crash is seen
as a crash::

    python tests/errors/fuzz_surfaces.py MODE --seed S --calls N

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
* ``adapter``: instead, a random vLLM v1 batch through ``specdec_np.adapters.vllm`` (NumPy
  or torch inputs, bfloat16 rows now and then, greedy and sampled requests, some seeded
  with their own generator).  The valid call must give vLLM's output, and move each
  seeded generator by exactly its request's draws (``k_b + 2`` sampled, none greedy); a
  seeded request verified alone must give the same tokens and the same generator state.
  The same batch with one corruption must raise a TypeError or ValueError that names
  the argument, and move no generator, torch's global one included.
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
    # the call's checks and copies: log-uniform from 1 to about 300,000 loop steps, which
    # spans a call of the release build and of the debug build (several times slower, so
    # that delays up to 3,000 steps landed before its copy in 98 % of calls).
    delay = int(10 ** rng.uniform(0.0, 5.5))

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


#: Adapter corruptions: label -> the argument the refusal must name.
ADAPTER_CORRUPTIONS = {
    "draft id V": "draft_token_ids",
    "bonus id -1": "bonus_token_ids",
    "float counts": "num_draft_tokens",
    "running sums": "cu_num_draft_tokens",
    "float max_spec_len": "max_spec_len",
    "short logits": "target_logits",
    "generator key": "generators",
    "no temperature": "temperature",
    "no metadata": "sampling_metadata",
    "top_p": "top_p",
}


class SamplingMetadata:
    """The attributes of vLLM's ``SamplingMetadata`` that the adapter reads."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


def adapter_case(rng: np.random.Generator, torch: Any) -> dict[str, Any]:
    """A valid vLLM v1 batch: the adapter's arguments, its library, and each seeded
    request's seed (its generator is made afresh for every call)."""
    library = "torch" if torch is not None and rng.random() < 0.6 else "numpy"
    vocab = int(rng.choice(VOCAB_SIZES))
    batch = int(rng.integers(0, 5))
    counts = [int(count) for count in rng.integers(0, 4, batch)]
    total = sum(counts)
    temperature = np.where(rng.random(batch) < 0.3, rng.choice([0.0, -1.0], batch),
                           rng.uniform(0.3, 2, batch))  # fmt: skip
    arrays = {
        "draft_token_ids": rng.integers(0, vocab, total),
        "cu_num_draft_tokens": np.cumsum(counts, dtype=np.int64),
        "target_logits": (rng.normal(size=(total, vocab)) * 2).astype(np.float32),
        "bonus_token_ids": rng.integers(0, vocab, (batch, 1)),
        "draft_probs": softmax(rng.normal(size=(total, vocab))).astype(np.float32)
        if rng.random() < 0.7 else None,
        "temperature": temperature,
        "top_k": rng.integers(0, vocab + 1, batch) if rng.random() < 0.5 else None,
        "top_p": rng.uniform(0.2, 1.0, batch) if rng.random() < 0.5 else None,
    }
    if library == "torch":
        arrays = {name: None if value is None else torch.from_numpy(value)
                  for name, value in arrays.items()}  # fmt: skip
        if rng.random() < 0.3:
            for name in ("target_logits", "draft_probs"):
                if arrays[name] is not None:
                    arrays[name] = arrays[name].to(torch.bfloat16)
    seeds = {b: int(rng.integers(2**31)) for b in range(batch) if rng.random() < 0.6}
    return {
        "library": library, "torch": torch, "counts": counts, "vocab": vocab,
        "max_spec_len": max(counts, default=0) + int(rng.integers(0, 2)),
        "arrays": arrays, "seeds": seeds,
        "all_greedy": bool(batch) and bool((temperature <= 1e-5).all()) and rng.random() < 0.5,
    }


def adapter_generator(case: dict[str, Any], seed: int) -> Any:
    if case["library"] == "torch":
        return case["torch"].Generator().manual_seed(seed)
    return np.random.default_rng(seed)


def adapter_state(case: dict[str, Any], generator: Any) -> Any:
    if case["library"] == "torch":
        return generator.get_state().tolist()
    return repr(generator.bit_generator.state)


def adapter_call(case: dict[str, Any], **change: Any) -> tuple[Any, dict[int, Any]]:
    """Call the adapter on ``case`` (with ``change`` applied); the result and the fresh
    generators it was given."""
    from specdec_np.adapters import vllm

    arrays = {**case["arrays"], **{name: value for name, value in change.items()
                                   if name in case["arrays"]}}  # fmt: skip
    generators = {b: adapter_generator(case, seed) for b, seed in case["seeds"].items()}
    all_greedy = case["all_greedy"]
    metadata = SamplingMetadata(
        all_greedy=all_greedy, all_random=False,
        temperature=None if all_greedy else arrays["temperature"],
        top_k=arrays["top_k"], top_p=arrays["top_p"], generators=generators,
    )
    for name in ("temperature", "generators", "all_random"):
        if name in change:
            setattr(metadata, name, change[name](generators) if name == "generators"
                    else change[name])  # fmt: skip
    result = vllm.rejection_sample(
        draft_token_ids=arrays["draft_token_ids"],
        num_draft_tokens=change.get("num_draft_tokens", case["counts"]),
        max_spec_len=change.get("max_spec_len", case["max_spec_len"]),
        cu_num_draft_tokens=arrays["cu_num_draft_tokens"],
        draft_probs=arrays["draft_probs"],
        target_logits=arrays["target_logits"],
        bonus_token_ids=arrays["bonus_token_ids"],
        sampling_metadata=change.get("sampling_metadata", metadata),
    )
    return result, generators


def adapter_draws(case: dict[str, Any], row: int) -> int:
    """The uniforms request ``row`` takes from its generator: ``k_b + 2``, none greedy."""
    greedy = case["all_greedy"] or float(case["arrays"]["temperature"][row]) <= 1e-5
    return 0 if greedy else case["counts"][row] + 2


def adapter_expected_state(case: dict[str, Any], row: int) -> Any:
    generator = adapter_generator(case, case["seeds"][row])
    draws = adapter_draws(case, row)
    if case["library"] == "torch":
        torch = case["torch"]
        torch.rand(draws, dtype=torch.float64, generator=generator)
    else:
        generator.random(draws)
    return adapter_state(case, generator)


def adapter_output_problems(case: dict[str, Any], output: Any) -> list[str]:
    """vLLM's output: int32 ``[B, max_spec_len + 1]``, each row the accepted drafts, one
    more token in ``[0, V)``, then -1."""
    torch, counts = case["torch"], case["counts"]
    expected_type = torch.Tensor if case["library"] == "torch" else np.ndarray
    if not isinstance(output, expected_type) or str(output.dtype).split(".")[-1] != "int32":
        return [f"output {type(output).__name__} {output.dtype}, not int32 {case['library']}"]
    if tuple(output.shape) != (len(counts), case["max_spec_len"] + 1):
        return [f"output shape {tuple(output.shape)}"]
    rows = np.asarray(output).tolist()
    drafts = np.asarray(case["arrays"]["draft_token_ids"]).tolist()
    bonus = np.asarray(case["arrays"]["bonus_token_ids"]).reshape(-1).tolist()
    start = 0
    for b, (row, count) in enumerate(zip(rows, counts)):
        emitted = [token for token in row if token != -1]
        own = drafts[start : start + count]
        start += count
        if (row[: len(emitted)] != emitted or not 1 <= len(emitted) <= count + 1
                or emitted[:-1] != own[: len(emitted) - 1]
                or not 0 <= emitted[-1] < case["vocab"]
                or (len(emitted) == count + 1 and emitted[-1] != bonus[b])):  # fmt: skip
            return [f"request {b}: {row} for drafts {own}, bonus {bonus[b]}"]
    return []


def adapter_alone(case: dict[str, Any], row: int) -> dict[str, Any]:
    """Request ``row`` of ``case`` as a batch of its own."""
    counts = case["counts"]
    start = sum(counts[:row])
    rows = slice(start, start + counts[row])
    arrays = dict(case["arrays"])
    for name in ("draft_token_ids", "target_logits", "draft_probs"):
        if arrays[name] is not None:
            arrays[name] = arrays[name][rows]
    for name in ("bonus_token_ids", "temperature", "top_k", "top_p"):
        if arrays[name] is not None:
            arrays[name] = arrays[name][row : row + 1]
    arrays["cu_num_draft_tokens"] = arrays["cu_num_draft_tokens"][:1] * 0 + counts[row]
    return {**case, "counts": [counts[row]], "arrays": arrays,
            "seeds": {0: case["seeds"][row]}}  # fmt: skip


def adapter_corruption(rng: np.random.Generator, case: dict[str, Any]) -> tuple[str, dict]:
    """One corruption that the batch allows, as a change for :func:`adapter_call`."""
    counts, arrays, vocab = case["counts"], case["arrays"], case["vocab"]
    batch = len(counts)
    options: dict[str, dict[str, Any]] = {
        "float counts": {"num_draft_tokens": [float(count) for count in counts] or [1.0]},
        "running sums": {"cu_num_draft_tokens": np.asarray(arrays["cu_num_draft_tokens"])[:-1]
                         if batch else np.ones(1, dtype=np.int64)},
        "float max_spec_len": {"max_spec_len": float(case["max_spec_len"])},
        "generator key": {"generators": lambda generators: {
            **generators, int(rng.choice([-1, batch, batch + 3])): adapter_generator(case, 1)}},
        "no metadata": {"sampling_metadata": None},
    }
    if batch:
        options["bonus id -1"] = {"bonus_token_ids": arrays["bonus_token_ids"] * 0 - 1}
        options["top_p"] = {"top_p": arrays["temperature"] * 0 + 2.0}
        if not case["all_greedy"]:
            options["no temperature"] = {"temperature": None, "all_random": True}
    if sum(counts):
        ids = arrays["draft_token_ids"].clone() if case["library"] == "torch" else (
            arrays["draft_token_ids"].copy())  # fmt: skip
        ids[int(rng.integers(ids.shape[0]))] = vocab
        options["draft id V"] = {"draft_token_ids": ids}
        options["short logits"] = {"target_logits": arrays["target_logits"][1:]}
    label = str(rng.choice(sorted(options)))
    return label, options[label]


def adapter(rng: np.random.Generator) -> str:
    """One random adapter batch: valid, alone, and corrupted (the module docstring)."""
    try:
        import torch
    except ImportError:
        torch = None
    case = adapter_case(rng, torch)
    print(f"adapter {case['library']} counts {case['counts']} V {case['vocab']} seeds "
          f"{sorted(case['seeds'])}", file=sys.stderr, flush=True)  # fmt: skip
    output, generators = adapter_call(case)
    problems = adapter_output_problems(case, output)
    for row, generator in generators.items():
        if adapter_state(case, generator) != adapter_expected_state(case, row):
            problems.append(f"seeded request {row} drew other than {adapter_draws(case, row)}")
    if generators:
        row = int(rng.choice(sorted(generators)))
        alone, alone_generators = adapter_call(adapter_alone(case, row))
        width = case["counts"][row] + 1
        if np.asarray(alone)[0, :width].tolist() != np.asarray(output)[row, :width].tolist():
            problems.append(f"seeded request {row} emits other tokens alone")
        if adapter_state(case, alone_generators[0]) != adapter_state(case, generators[row]):
            problems.append(f"seeded request {row} moves its generator otherwise alone")
    label, change = adapter_corruption(rng, case)
    global_state = torch.get_rng_state() if torch is not None else None
    box: dict[int, Any] = {}

    def keep(generators: dict[int, Any]) -> dict[int, Any]:
        box.update(generators)
        return change["generators"](generators) if "generators" in change else generators

    try:
        adapter_call(case, **{**change, "generators": keep})
        problems.append(f"{label} was accepted")
    except (TypeError, ValueError) as error:
        if ADAPTER_CORRUPTIONS[label] not in str(error):
            problems.append(f"{label}: the error does not name "
                            f"{ADAPTER_CORRUPTIONS[label]}: {error}")  # fmt: skip
    for row, generator in box.items():
        if row in case["seeds"] and adapter_state(case, generator) != adapter_state(
            case, adapter_generator(case, case["seeds"][row])
        ):
            problems.append(f"{label}: the refused call moved generator {row}")
    if torch is not None and not torch.equal(torch.get_rng_state(), global_state):
        problems.append(f"{label}: the refused call moved torch's generator")
    if problems:
        raise AssertionError(f"adapter, {case['library']} {case['counts']}: {problems}")
    return f"refused {case['library']}"
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
        "mode",
        choices=("writers", "interrupts", "small_stack", "masked", "adapter", "sampling"),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=200)
    arguments = parser.parse_args(argv)
    rng = np.random.default_rng(arguments.seed)
    # Threads switch every microsecond instead of every 5 ms: the writers' races happen.
    sys.setswitchinterval(1e-6)
    outcomes: Counter[str] = Counter()
    for index in range(arguments.calls):
        if arguments.mode == "adapter":
            print(f"call {index}:", file=sys.stderr, end=" ", flush=True)
            outcomes[adapter(rng)] += 1
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
