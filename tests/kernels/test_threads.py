"""Threads: separate sampler instances called concurrently give the sequential results.

The kernels release the GIL (and may run their row loop with OpenMP), so several Python
threads can verify batches at the same time.  The contract, stated in the module
docstring of ``specdec_np.samplers``: a sampler instance is *not* meant to be shared
between threads that call it at the same time (its counters and generator are plain
state); each thread gets its own instance, and the stateless functions of
``specdec_np.verify`` may be called from any number of threads.  These tests check that
contract: every concurrent task must produce exactly the outputs and counters of the same
task run alone.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import _core, registry, samplers
from specdec_np._kernels import dispatch as _dispatch
from specdec_np._runtime import arrays as _backend
from specdec_np.registry import Verifier

THREADS = 4

# (B, k, V): "big" is over the size at which the kernels use OpenMP by themselves
# (B * 2V and B * k * V >= PARALLEL_MIN_ELEMENTS); "small" runs serially unless forced.
SIZES = {"big": (64, 2, 8192), "small": (3, 2, 16)}
# Calls per task: the big batches are few, to keep the file fast on two loaded cores
# (OpenMP teams of several Python threads oversubscribe them).
CALLS = {"big": 8, "small": 50}


def make_batches(size: str, count: int = 3, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """A few different valid batches (float32 probabilities, int64 ids)."""
    batch_size, k, vocab = SIZES[size]
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        target = rng.random((batch_size, k + 1, vocab), dtype=np.float32) ** 8
        target /= target.sum(axis=-1, keepdims=True)
        draft = rng.random((batch_size, k, vocab), dtype=np.float32) ** 8
        draft /= draft.sum(axis=-1, keepdims=True)
        draft_ids = rng.integers(0, vocab, (batch_size, k))
        # Some rows draft the target's argmax, so that prefixes of every length occur.
        agree = rng.random((batch_size, k)) < 0.7
        draft_ids = np.where(agree, target[:, :k].argmax(axis=-1), draft_ids)
        batches.append(
            {
                "target": target,
                "draft_probs": draft,
                "draft_ids": draft_ids.astype(np.int64),
                "bonus": rng.integers(0, vocab, (batch_size, 1)),
                "accepted": rng.random((batch_size, k)) < 0.8,
                "substitute": rng.integers(0, vocab, (batch_size, k)),
            }
        )
    return batches


def counters(sampler: Any) -> tuple[int, int, int]:
    return (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )


# Each task builds its own sampler and makes `calls` calls; it returns the outputs
# and the sampler's final counters.  The result depends only on the task's arguments.
Task = Callable[[], tuple[list[np.ndarray], tuple[int, int, int] | None]]


def stochastic_with_uniforms(entry: Verifier, batches: list[dict], seed: int, calls: int) -> Task:
    def task() -> tuple[list[np.ndarray], tuple[int, int, int]]:
        sampler = getattr(specdec_np, entry.sampler_name)()
        rng = np.random.default_rng(seed)
        outputs = []
        for call in range(calls):
            batch = batches[call % len(batches)]
            uniforms = rng.random((batch["draft_ids"].shape[0], batch["draft_ids"].shape[1] + 1))
            draft_probs = batch["draft_probs"] if call % 2 else None
            outputs.append(
                sampler(
                    batch["target"],
                    batch["bonus"],
                    draft_probs,
                    batch["draft_ids"],
                    uniforms=uniforms,
                )
            )
        return outputs, counters(sampler)

    return task


def stochastic_with_generators(
    entry: Verifier, batches: list[dict], seed: int, calls: int
) -> Task:
    """The sampler's own seeded generator, plus seeded_seqs and counter_seeds rows."""

    def task() -> tuple[list[np.ndarray], tuple[int, int, int]]:
        sampler = getattr(specdec_np, entry.sampler_name)(seed=seed)
        row_generator = np.random.default_rng(seed + 1000)
        outputs = []
        for call in range(calls):
            batch = batches[call % len(batches)]
            seeded = {0: row_generator} if call % 3 == 0 else None
            counter_seeds = {1: (seed, call)} if call % 4 == 1 else None
            outputs.append(
                sampler(
                    batch["target"],
                    batch["bonus"],
                    batch["draft_probs"],
                    batch["draft_ids"],
                    seeded,
                    counter_seeds=counter_seeds,
                )
            )
        return outputs, counters(sampler)

    return task


def parameters_for(entry: Verifier, seed: int) -> dict[str, float]:
    """The registry defaults for odd seeds, three times them for even ones, so that tasks
    with different parameters overlap."""
    scale = 1.0 if seed % 2 else 3.0
    return {p.name: scale * p.default for p in entry.parameters}


def deterministic(entry: Verifier, batches: list[dict], seed: int, calls: int) -> Task:
    def task() -> tuple[list[np.ndarray], tuple[int, int, int]]:
        sampler_class = getattr(specdec_np, entry.sampler_name)
        sampler = sampler_class(**parameters_for(entry, seed), strict_mode=bool(seed % 2))
        outputs = [
            sampler(batch["target"], batch["bonus"], None, batch["draft_ids"])
            for batch in (batches[(call + seed) % len(batches)] for call in range(calls))
        ]
        return outputs, counters(sampler)

    return task


def create_output(batches: list[dict], seed: int, calls: int) -> Task:
    def task() -> tuple[list[np.ndarray], tuple[int, int, int]]:
        sampler = specdec_np.SpecDecodeBaseSampler()
        outputs = []
        for call in range(calls):
            batch = batches[(call + seed) % len(batches)]
            outputs.append(
                sampler._create_output(
                    batch["accepted"], batch["substitute"], batch["draft_ids"], batch["bonus"]
                )
            )
        return outputs, counters(sampler)

    return task


def stateless(batches: list[dict], seed: int, calls: int) -> Task:
    """The stateless functions of every registered verifier (stochastic ones with explicit
    uniforms and with a generator) and ``create_output``, each result flattened into one
    output array."""

    def task() -> tuple[list[np.ndarray], None]:
        rng = np.random.default_rng(seed)
        outputs = []
        for call in range(calls):
            batch = batches[call % len(batches)]
            shape = (batch["draft_ids"].shape[0], batch["draft_ids"].shape[1] + 1)
            results = []
            for entry in registry.VERIFIERS:
                function = getattr(specdec_np, entry.function_name)
                if entry.stochastic:
                    results.append(
                        function(
                            batch["target"],
                            batch["bonus"],
                            batch["draft_probs"],
                            batch["draft_ids"],
                            uniforms=rng.random(shape),
                        )
                    )
                    results.append(
                        function(
                            batch["target"],
                            batch["bonus"],
                            None,
                            batch["draft_ids"],
                            generator=np.random.default_rng([seed, call]),
                        )
                    )
                else:
                    results.append(
                        function(
                            batch["target"],
                            batch["bonus"],
                            batch["draft_ids"],
                            **parameters_for(entry, seed),
                        )
                    )
            results.append(
                specdec_np.create_output(
                    batch["accepted"], batch["substitute"], batch["draft_ids"], batch["bonus"]
                )
            )
            outputs.append(
                np.concatenate(
                    [
                        np.column_stack([r.output_token_ids, r.accepted_lengths, r.num_accepted])
                        for r in results
                    ],
                    axis=1,
                )
            )
        return outputs, None

    return task


def tasks_for(size: str, seeds: tuple[int, ...]) -> list[tuple[str, Task]]:
    """Per registered verifier: its sampler with explicit uniforms and with generators
    (stochastic) or with parameters (deterministic); then ``_create_output`` and the
    stateless functions."""
    batches = make_batches(size)
    tasks = []
    for entry in registry.VERIFIERS:
        factories = (
            (stochastic_with_uniforms, stochastic_with_generators)
            if entry.stochastic
            else (deterministic,)
        )
        tasks += [
            (
                f"{factory.__name__}[{entry.name}][{seed}]",
                factory(entry, batches, seed, CALLS[size]),
            )
            for factory in factories
            for seed in seeds
        ]
    tasks += [
        (f"{factory.__name__}[{seed}]", factory(batches, seed, CALLS[size]))
        for factory in (create_output, stateless)
        for seed in seeds
    ]
    return tasks


def check_concurrent_equals_sequential(size: str, seeds: tuple[int, ...], repeats: int) -> None:
    """Run every task alone, then all of them ``repeats`` times over on THREADS threads
    (each run of a task builds its own sampler); compare outputs and counters."""
    tasks = tasks_for(size, seeds)
    sequential = [task() for _, task in tasks]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(task) for _ in range(repeats) for _, task in tasks]
        concurrent = [future.result() for future in futures]
    for repeat in range(repeats):
        for (name, _), expected, found in zip(
            tasks, sequential, concurrent[repeat * len(tasks) :]
        ):
            expected_outputs, expected_counters = expected
            found_outputs, found_counters = found
            assert len(found_outputs) == len(expected_outputs) == CALLS[size]
            for call, (want, got) in enumerate(zip(expected_outputs, found_outputs)):
                np.testing.assert_array_equal(got, want, err_msg=f"{name}, call {call}")
            assert found_counters == expected_counters, name


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "big"])
def test_separate_instances_concurrently_match_sequential_calls(size: str) -> None:
    """Default thread policy: the big batches use OpenMP inside each call as well."""
    batch_size, k, vocab = SIZES[size]
    # The sizes cover both kernel paths (the stochastic verifiers read at most 2V per row,
    # the deterministic ones kV).
    for per_row in {2 * vocab if entry.stochastic else k * vocab for entry in registry.VERIFIERS}:
        big_enough = batch_size * per_row >= _backend.PARALLEL_MIN_ELEMENTS
        assert big_enough == (size == "big")
    # Twice over, so that every kind of task overlaps with every other.
    check_concurrent_equals_sequential(size, (1, 2) if size == "small" else (1,), repeats=2)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "big"])
def test_separate_instances_concurrently_with_openmp_forced(size: str, threaded: int) -> None:
    """The ``threaded`` fixture forces the OpenMP row loop for every batch of two or more
    rows, so OpenMP teams of several Python threads run at once."""
    assert _backend.thread_count(SIZES[size][0], 1) == min(SIZES[size][0], threaded)
    # Fewer runs: waking OpenMP teams for tiny batches is slow on a loaded machine.
    check_concurrent_equals_sequential(size, (1,), repeats=1)


def test_the_contract_is_documented() -> None:
    """One instance is not to be shared between concurrently calling threads; separate
    instances (and the stateless functions) are what the tests above check."""
    text = " ".join((samplers.__doc__ or "").split())
    assert "not meant to be shared between threads" in text
    assert "give each thread its own" in text
    assert "release the GIL" in text


# ---- threads inside a row ---------------------------------------------------------------

# Several of the kernels' chunks of 4096 entries, and not a whole number of them.
ROW_VOCAB = 65536 + 123


def _record_options(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The kernel options of every logits call made through ``_dispatch.sampling_options``
    and of every ``_core.processed_rows`` call, as they are passed on."""
    seen: list[dict[str, Any]] = []
    sampling_options = _dispatch.sampling_options
    processed_rows = _core.processed_rows

    def recorded_options(batch: Any, threads: int, table: Any) -> dict[str, Any]:
        options = sampling_options(batch, threads, table)
        seen.append(dict(options, threads=threads))
        return options

    def recorded_rows(rows: Any, table: Any, out: Any, threads: int, **options: Any) -> None:
        seen.append(dict(options, threads=threads))
        processed_rows(rows, table, out, threads, **options)

    monkeypatch.setattr(_dispatch, "sampling_options", recorded_options)
    monkeypatch.setattr(_core, "processed_rows", recorded_rows)
    return seen


def _logits_calls(dtype: type, filters: dict[str, float], seed: int) -> list[np.ndarray]:
    """Every output of a few calls from logits at B = 1 through the public API: the
    processed row, bonus-only draws (sample_tokens), a ragged chain with drafts drawn from
    their logits, a tree walked on its target's logits."""
    rng = np.random.default_rng(seed)
    rows = (rng.standard_normal((4, ROW_VOCAB)) * 3).astype(dtype)
    draft = (rows[:3] + rng.standard_normal((3, ROW_VOCAB)).astype(dtype)).astype(dtype)
    # Drafts of the targets' argmax, so that some are accepted and later rows are read.
    ids = rows[:3].argmax(axis=1).astype(np.int64)
    ids[2] = rng.integers(ROW_VOCAB)
    generator = np.random.default_rng(seed + 1)
    outputs = [specdec_np.processed_probs(rows[:1], **filters)]
    outputs += [
        specdec_np.sample_tokens(logits=rows[:1], generator=generator, **filters)
        for _ in range(8)
    ]
    for _ in range(4):
        result = specdec_np.verify_ragged(
            num_draft_tokens=[3], draft_token_ids=ids, target_logits=rows, draft_logits=draft,
            generator=generator, **filters,
        )  # fmt: skip
        outputs += [result.output_token_ids, result.accepted_lengths]
        tree = specdec_np.verify_tree(
            num_nodes=[3], tree_parents=[-1, 0, 0], draft_token_ids=ids, target_logits=rows,
            generator=generator, **filters,
        )  # fmt: skip
        outputs += [tree.output_token_ids, tree.accepted_nodes]
    return outputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "filters",
    [{}, {"temperature": 0.8}, {"top_k": 50, "top_p": 0.95}, {"min_p": 0.05}],
    ids=["plain", "temperature", "top_k_top_p", "min_p"],
)
def test_threads_inside_a_row_give_the_bits_of_one(
    monkeypatch: pytest.MonkeyPatch, dtype: type, filters: dict[str, float]
) -> None:
    """A single request from logits (B = 1, V > 65536) whose rows are split between two
    threads gives, from the same seed, the processed row bit for bit and the same tokens
    as on one thread, through processed_probs, sample_tokens, verify_ragged and
    verify_tree.  Two threads are forced (OpenMP and the cores say two), so the comparison
    runs on a machine of one core too."""
    seen = _record_options(monkeypatch)
    monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, "auto")
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 2)
    monkeypatch.setattr(_backend, "available_cores", lambda: 2)
    split = _logits_calls(dtype, filters, seed=7)
    assert seen and all(options["row_threads"] == 2 for options in seen), seen
    seen.clear()
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 1)
    one = _logits_calls(dtype, filters, seed=7)
    assert seen and all(options["row_threads"] == 1 for options in seen), seen
    assert len(split) == len(one)
    for found, expected in zip(split, one):
        assert found.dtype == expected.dtype
        assert found.tobytes() == expected.tobytes()


def test_threads_inside_a_row_only_when_one_runs_over_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row threads, when SPECDEC_ROW_THREADS asks for them, are the idle cores of a call
    whose loop over requests runs on one thread, for rows of at least
    ROW_THREADS_MIN_VOCAB, capped by the variable, OpenMP's count and the cores; a threaded
    loop over requests, a short row, probability rows and the GPU get none."""
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 8)
    monkeypatch.setattr(_backend, "available_cores", lambda: 3)
    minimum = _backend.ROW_THREADS_MIN_VOCAB
    # Off by default, and for 0 and 1, however many cores are idle.
    monkeypatch.delenv(_backend.ROW_THREADS_VARIABLE, raising=False)
    assert _backend.row_thread_count(1, 128256) == 1
    for setting in ("0", "1"):
        monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, setting)
        assert _backend.row_thread_count(1, 128256) == 1
    monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, "2")
    assert _backend.row_thread_count(1, 128256) == 2
    for setting in ("two", "-2", "2.0"):
        monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, setting)
        with pytest.raises(ValueError, match="SPECDEC_ROW_THREADS must be"):
            _backend.row_thread_count(1, 128256)
    monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, "auto")
    assert _backend.row_thread_count(1, 128256) == 3
    assert _backend.row_thread_count(1, minimum) == 3
    assert _backend.row_thread_count(1, minimum - 1) == 1
    assert _backend.row_thread_count(2, 128256) == 1
    assert _backend.row_thread_count(3, 128256) == 1
    monkeypatch.setattr(_backend, "available_cores", lambda: 1)
    assert _backend.row_thread_count(1, 128256) == 1
    monkeypatch.setattr(_backend, "available_cores", lambda: 3)
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 2)  # OMP_NUM_THREADS=2
    assert _backend.row_thread_count(1, 128256) == 2
    # Through the public API: one request gets them, a batch whose loop over requests is
    # threaded (B V >= PARALLEL_MIN_ELEMENTS: processed_probs reads V a row, a draw 2 V)
    # does not.
    seen = _record_options(monkeypatch)
    rng = np.random.default_rng(0)
    vocab = minimum + 7
    for batch_size, threads, row_threads in [(1, 1, 2), (32, 2, 1)]:
        assert batch_size * vocab >= _backend.PARALLEL_MIN_ELEMENTS or batch_size == 1
        logits = rng.standard_normal((batch_size, vocab)).astype(np.float32)
        specdec_np.sample_tokens(logits=logits, generator=rng)
        specdec_np.processed_probs(logits)
        assert [(o["threads"], o["row_threads"]) for o in seen] == [(threads, row_threads)] * 2
        seen.clear()
    # Probability rows compute no law: no option.
    probs = np.full((1, vocab), 1.0 / vocab, dtype=np.float32)
    specdec_np.sample_tokens(probs=probs, generator=rng)
    assert [sorted(options) for options in seen] == [["threads"]]
    # The CUDA kernels take no row_threads: a batch on a device gets no such option.
    on_device = types.SimpleNamespace(
        device=0, xp=np, batch_size=1, vocab_size=vocab,
        target_rows=np.empty((1, vocab), dtype=np.float32),
    )  # fmt: skip
    monkeypatch.undo()
    assert "row_threads" not in _dispatch.sampling_options(on_device, 1, np.zeros((1, 5)))

