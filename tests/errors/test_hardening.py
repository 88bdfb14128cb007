"""Hardening, second round: the defects an outside attack found, one class each.

Each test below failed on the implementation the attack was run against.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import _core, cli, registry
from specdec_np._runtime import arrays as _backend
from specdec_np._runtime import checks as _validate

try:
    import array_api_strict
except ImportError:  # pragma: no cover - depends on the installation
    array_api_strict = None

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = str(Path(specdec_np.__file__).resolve().parent)
needs_array_api_strict = pytest.mark.skipif(
    array_api_strict is None, reason="needs array_api_strict"
)


def inputs(seed: int = 0, batch: int = 3, k: int = 2, vocab: int = 5, dtype: Any = np.float32):
    """Valid inputs (target, bonus, draft_probs, draft_ids) with every probability > 0."""
    rng = np.random.default_rng(seed)
    target = rng.random((batch, k + 1, vocab)) + 0.05
    target /= target.sum(axis=-1, keepdims=True)
    draft = rng.random((batch, k, vocab)) + 0.05
    draft /= draft.sum(axis=-1, keepdims=True)
    return (
        target.astype(dtype),
        rng.integers(0, vocab, (batch, 1)),
        draft.astype(dtype),
        rng.integers(0, vocab, (batch, k)),
    )


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``code`` in a fresh interpreter (a crash is then a return code, not our death)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------------------
# Item 1: token ids are read once (a writer thread racing the kernels)
# --------------------------------------------------------------------------------------


def test_ids_written_during_calls_never_crash() -> None:
    result = run_python(
        """
        import threading, time
        import numpy as np
        import specdec_np

        B, k, V = 256, 4, 64
        rng = np.random.default_rng(0)
        target = rng.random((B, k + 1, V)).astype(np.float32) + 0.01
        target /= target.sum(axis=-1, keepdims=True)
        draft = rng.random((B, k, V)).astype(np.float32) + 0.01
        draft /= draft.sum(axis=-1, keepdims=True)
        ids = np.zeros((B, k), dtype=np.int64)
        bonus = np.zeros((B, 1), dtype=np.int64)
        stop = threading.Event()

        def writer():
            huge = np.int64(2**40)
            while not stop.is_set():
                ids[...] = huge
                ids[...] = 1
                bonus[...] = -(2**40)
                bonus[...] = 2

        thread = threading.Thread(target=writer)
        thread.start()
        calls = [
            lambda: specdec_np.greedy_sample(target, bonus, ids).output_token_ids,
            lambda: specdec_np.typical_acceptance_sample(target, bonus, ids).output_token_ids,
            lambda: specdec_np.rejection_sample(target, bonus, draft, ids).output_token_ids,
        ]
        bad = 0
        deadline = time.monotonic() + 20
        try:
            for i in range(6000):
                if time.monotonic() > deadline:
                    break
                try:
                    out = calls[i % 3]()
                except ValueError:
                    continue
                if out.min() < -1 or out.max() >= V:
                    bad += 1
        finally:
            stop.set()
            thread.join()
        print("bad", bad)
        raise SystemExit(1 if bad else 0)
        """,
        timeout=180,
    )
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])


# --------------------------------------------------------------------------------------
# Item 2: thread count bounded by the cores and the batch
# --------------------------------------------------------------------------------------


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def test_thread_count_is_bounded_by_cores_and_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 100_000)
    cores = available_cores()
    assert 1 <= _backend.thread_count(100_000, 1 << 20) <= cores
    assert _backend.thread_count(2, 1 << 20) <= 2
    assert _backend.thread_count(1, 1 << 30) == 1


def test_thread_count_honours_a_smaller_openmp_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 1)
    assert _backend.thread_count(100_000, 1 << 20) == 1


@pytest.mark.parametrize("small_stack", [False, True])
def test_huge_omp_num_threads_does_not_crash(small_stack: bool) -> None:
    result = run_python(
        f"""
        import threading
        import numpy as np
        import specdec_np
        from specdec_np._runtime import arrays as _backend

        B, k, V = 100_000, 1, 16
        target = np.full((B, k + 1, V), 1.0 / V, dtype=np.float32)
        ids = np.zeros((B, k), dtype=np.int64)
        bonus = np.zeros((B, 1), dtype=np.int64)
        assert _backend.thread_count(B, k * V) > 1 or _backend._core.SPECDEC_OPENMP == 0
        errors = []

        def work():
            try:
                out = specdec_np.greedy_sample(target, bonus, ids).output_token_ids
                if out.shape != (B, k + 1):
                    errors.append(out.shape)
            except BaseException as error:
                errors.append(error)

        if {small_stack!r}:
            threading.stack_size(256 * 1024)
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
        else:
            work()
        raise SystemExit(1 if errors else 0)
        """,
        env={"OMP_NUM_THREADS": "2000" if small_stack else "100000"},
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])


# --------------------------------------------------------------------------------------
# Item 3: no silent narrowing (byte order, longdouble)
# --------------------------------------------------------------------------------------


def test_big_endian_float64_stays_float64_for_greedy() -> None:
    # In float32 both entries round to 0.5 and the first index wins; float64 tells them apart.
    target = np.array([[[0.5 - 1e-12, 0.5 + 1e-12], [0.5, 0.5]]], dtype=np.float64)
    ids = np.array([[0]])
    bonus = np.array([[0]])
    native = specdec_np.greedy_sample(target, bonus, ids).output_token_ids
    swapped = specdec_np.greedy_sample(target.astype(">f8"), bonus, ids).output_token_ids
    assert native.tolist() == [[1, -1]]
    np.testing.assert_array_equal(swapped, native)


def test_big_endian_tiny_float64_rows_are_valid() -> None:
    target = np.full((2, 2, 3), 1e-60, dtype=">f8")
    draft = np.full((2, 1, 3), 1e-60, dtype=">f8")
    ids = np.array([[0], [1]])
    bonus = np.array([[2], [2]])
    out = specdec_np.rejection_sample(
        target, bonus, draft, ids, uniforms=np.full((2, 2), 0.5)
    ).output_token_ids
    assert out.tolist() == [[0, 2], [1, 2]]


def test_big_endian_float64_draft_matches_native_target() -> None:
    target, bonus, draft, ids = inputs(dtype=np.float64)
    uniforms = np.random.default_rng(1).random((3, 3))
    native = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms)
    swapped = specdec_np.rejection_sample(
        target, bonus, draft.astype(">f8"), ids, uniforms=uniforms.astype(">f8")
    )
    np.testing.assert_array_equal(swapped.output_token_ids, native.output_token_ids)


def test_big_endian_float32_and_int64_are_taken_as_native() -> None:
    target, bonus, draft, ids = inputs()
    uniforms = np.random.default_rng(2).random((3, 3))
    native = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms)
    swapped = specdec_np.rejection_sample(
        target.astype(">f4"),
        bonus.astype(">i8"),
        draft.astype(">f4"),
        ids.astype(">i8"),
        uniforms=uniforms,
    )
    np.testing.assert_array_equal(swapped.output_token_ids, native.output_token_ids)
    greedy = specdec_np.greedy_sample(target, bonus.astype(">i4"), ids.astype(">i4"))
    np.testing.assert_array_equal(
        greedy.output_token_ids, specdec_np.greedy_sample(target, bonus, ids).output_token_ids
    )


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="longdouble is float64 on this platform"
)
@pytest.mark.parametrize("name", ["target_with_bonus_probs", "draft_probs"])
def test_longdouble_is_refused_with_a_clear_message(name: str) -> None:
    target, bonus, draft, ids = inputs()
    arguments = {"target_with_bonus_probs": target, "draft_probs": draft}
    arguments[name] = arguments[name].astype(np.longdouble)
    with pytest.raises(TypeError, match=f"^{name} .*float64 or float32.*found float128"):
        specdec_np.rejection_sample(
            arguments["target_with_bonus_probs"], bonus, arguments["draft_probs"], ids
        )


# --------------------------------------------------------------------------------------
# Item 4: a token of target probability <= 0 is never emitted (negative or NaN q)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_q",
    [
        -1e-9,
        -1.0,
        np.nan,
    ],
)
def test_negative_or_nan_draft_entries_never_emit_a_zero_probability_token(
    bad_q: float,
) -> None:
    n = 400
    uniforms = np.random.default_rng(3).random((n, 2))
    # Row kind 1: the draft token 0 has p = 0 and q < 0 (or NaN): never accept it.
    target = np.zeros((n, 2, 3))
    target[:, :, 1:] = 0.5
    draft = np.zeros((n, 1, 3))
    draft[:, 0, 0] = bad_q
    draft[:, 0, 1] = 1.0
    ids = np.zeros((n, 1), dtype=np.int64)
    out = specdec_np.rejection_sample(
        target, np.ones((n, 1), dtype=np.int64), draft, ids, uniforms=uniforms
    ).output_token_ids
    assert not (out[:, 0] == 0).any()
    # Row kind 2: the draft is rejected; the residual max(p - q, 0) must not reach token 0.
    draft2 = np.zeros((n, 1, 3))
    draft2[:, 0, 0] = bad_q
    draft2[:, 0, 1] = 1.0
    ids2 = np.ones((n, 1), dtype=np.int64)
    out2 = specdec_np.rejection_sample(
        target, np.ones((n, 1), dtype=np.int64), draft2, ids2, uniforms=uniforms
    ).output_token_ids
    assert not (out2[:, 0] == 0).any()


# --------------------------------------------------------------------------------------
# Item 5: generators accepted by exact type only
# --------------------------------------------------------------------------------------


class GeneratorSubclass(np.random.Generator):
    """A subclass that lies: its uniforms are negative."""

    def random(self, *args: Any, **kwargs: Any) -> Any:
        return -0.5 * np.ones(args[0] if args else kwargs["size"])


def look_alike(module: str) -> Any:
    """An object whose class is called ``Generator`` and claims to live in ``module``."""
    cls = type("Generator", (), {"random": lambda self, size: -0.5 * np.ones(size)})
    cls.__module__ = module
    return cls()


@pytest.mark.parametrize(
    "generator",
    [GeneratorSubclass(np.random.PCG64(0)), look_alike("cupy.random"), look_alike("cupy")],
    ids=["subclass", "cupy.random look-alike", "cupy look-alike"],
)
@pytest.mark.parametrize("where", ["generator", "seeded_seqs"])
def test_generators_are_accepted_by_exact_type_only(generator: Any, where: str) -> None:
    target, bonus, draft, ids = inputs()
    if where == "generator":
        call = lambda: specdec_np.rejection_sample(  # noqa: E731
            target, bonus, draft, ids, generator=generator
        )
        name = "generator"
    else:
        call = lambda: specdec_np.RejectionSampler(seed=0)(  # noqa: E731
            target, bonus, draft, ids, {1: generator}
        )
        name = r"seeded_seqs\[1\]"
    with pytest.raises(TypeError, match=f"^{name} must be a numpy.random.Generator"):
        call()


def test_exact_generators_are_still_accepted() -> None:
    target, bonus, draft, ids = inputs()
    specdec_np.rejection_sample(
        target, bonus, draft, ids, generator=np.random.Generator(np.random.Philox(1))
    )
    specdec_np.RejectionSampler(seed=0)(target, bonus, draft, ids, {0: np.random.default_rng(1)})


# --------------------------------------------------------------------------------------
# Item 6: an overflowing residual is scaled, not biased
# --------------------------------------------------------------------------------------


def test_residual_whose_sum_overflows_is_drawn_without_bias() -> None:
    n = 3000
    target = np.zeros((n, 2, 4))
    target[:, :, 1:] = 1e308  # the row sums overflow float64
    draft = np.zeros((n, 1, 4))
    draft[:, 0, 0] = 1.0  # token 0 has p = 0: always rejected
    uniforms = np.column_stack([np.full(n, 0.5), (np.arange(n) + 0.5) / n])
    out = specdec_np.rejection_sample(
        target,
        np.ones((n, 1), dtype=np.int64),
        draft,
        np.zeros((n, 1), dtype=np.int64),
        uniforms=uniforms,
    ).output_token_ids
    counts = np.bincount(out[:, 0], minlength=4)
    assert counts[0] == 0
    # Inverse CDF over three equal masses with evenly spaced uniforms: a third each.
    assert np.all(np.abs(counts[1:] - n / 3) <= 2), counts


# --------------------------------------------------------------------------------------
# Item 7 and 13: masked arrays and numpy.matrix refused
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["masked", "matrix"])
@pytest.mark.parametrize(
    "name", ["target_with_bonus_probs", "draft_probs", "draft_token_ids", "bonus_token_ids"]
)
def test_masked_arrays_and_matrices_are_refused(kind: str, name: str) -> None:
    target, bonus, draft, ids = inputs(batch=1, k=1)
    arguments = {
        "target_with_bonus_probs": target,
        "bonus_token_ids": bonus,
        "draft_probs": draft,
        "draft_token_ids": ids,
    }
    value = arguments[name]
    if kind == "masked":
        arguments[name] = np.ma.masked_array(value, mask=np.zeros(value.shape, dtype=bool))
    else:
        arguments[name] = np.asmatrix(value.reshape(value.shape[0], -1))
    expected = "masked array" if kind == "masked" else "numpy.matrix"
    with pytest.raises(TypeError, match=f"^{name} .*{expected}"):
        specdec_np.rejection_sample(
            arguments["target_with_bonus_probs"],
            arguments["bonus_token_ids"],
            arguments["draft_probs"],
            arguments["draft_token_ids"],
        )
    if name != "draft_probs":
        with pytest.raises(TypeError, match=f"^{name} .*{expected}"):
            specdec_np.GreedySampler()(
                arguments["target_with_bonus_probs"],
                arguments["bonus_token_ids"],
                None,
                arguments["draft_token_ids"],
            )


def test_masked_greedy_target_is_not_silently_used() -> None:
    target = np.ma.masked_array([[[0.9, 0.1], [0.5, 0.5]]], mask=[[[True, False], [False] * 2]])
    with pytest.raises(TypeError, match="^target_with_bonus_probs .*masked array"):
        specdec_np.greedy_sample(target, np.array([[0]]), np.array([[0]]))


@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_masked_uniforms_and_create_output_arguments_are_refused(kind: str) -> None:
    def wrap(x: np.ndarray) -> Any:
        return np.ma.masked_array(x) if kind == "masked" else np.asmatrix(x)

    target, bonus, draft, ids = inputs()
    with pytest.raises(TypeError, match="^uniforms "):
        specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=wrap(np.full((3, 3), 0.5)))
    accepted = np.ones((3, 2), dtype=bool)
    for name in ("accepted", "substitute_token_ids", "draft_token_ids"):
        arguments = {"accepted": accepted, "substitute_token_ids": ids, "draft_token_ids": ids}
        arguments[name] = wrap(arguments[name])
        with pytest.raises(TypeError, match=f"^{name} "):
            specdec_np.GreedySampler()._create_output(
                arguments["accepted"],
                arguments["substitute_token_ids"],
                arguments["draft_token_ids"],
                bonus,
            )


# --------------------------------------------------------------------------------------
# Item 8: a failed call never rewinds a generator over another thread's draws
# --------------------------------------------------------------------------------------


def test_failed_calls_do_not_rewind_a_shared_generator() -> None:
    shared = np.random.default_rng(5)
    batch, vocab = 4000, 64
    target, bonus, draft, ids = inputs(batch=batch, k=1, vocab=vocab)
    ids[-1, 0] = vocab  # out of range, in the last row: found late by the kernel
    stop = threading.Event()

    def failing_calls() -> None:
        while not stop.is_set():
            try:
                specdec_np.rejection_sample(target, bonus, draft, ids, generator=shared)
            except ValueError:
                pass

    thread = threading.Thread(target=failing_calls)
    thread.start()
    seen: list[float] = []
    try:
        for _ in range(20_000):
            seen.extend(shared.random(2).tolist())
    finally:
        stop.set()
        thread.join()
    assert len(set(seen)) == len(seen), f"{len(seen) - len(set(seen))} repeated draws"


# --------------------------------------------------------------------------------------
# Item 10: KeyboardInterrupt leaves counters (and generators) all or nothing
# --------------------------------------------------------------------------------------


class InterruptAt:
    """A ``sys.settrace`` hook that raises KeyboardInterrupt at the ``at``-th bytecode
    executed in the package (optionally only in functions called ``only``), the points
    where CPython delivers a real SIGINT."""

    def __init__(self, at: int, only: str | None = None) -> None:
        self.at = at
        self.only = only
        self.count = 0
        self.fired = False

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            code = frame.f_code
            if not code.co_filename.startswith(PACKAGE_DIR):
                return None
            if self.only is not None and code.co_name != self.only:
                return None
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return self
        if event == "opcode" and not self.fired:
            self.count += 1
            if self.count >= self.at:
                self.fired = True
                raise KeyboardInterrupt
        return self


def interrupted(call: Any, at: int, only: str | None = None) -> tuple[bool, int]:
    """Run ``call`` under :class:`InterruptAt`; (whether it was interrupted, opcodes seen)."""
    hook = InterruptAt(at, only)
    sys.settrace(hook)
    try:
        call()
    except KeyboardInterrupt:
        return True, hook.count
    finally:
        sys.settrace(None)
    return False, hook.count


def totals(sampler: Any) -> tuple[Any, ...]:
    accepted, emitted = sampler.num_accepted_tokens, sampler.num_emitted_tokens
    return (
        None if accepted is None else int(accepted),
        None if emitted is None else int(emitted),
        sampler.num_draft_tokens,
        sampler._num_verified_rows,
        sampler._num_possible_tokens,
    )


def after_one_call(before: tuple[Any, ...], output: np.ndarray, accepted: int) -> tuple:
    batch, width = output.shape
    return (
        (before[0] or 0) + accepted,
        (before[1] or 0) + int((output != -1).sum()),
        before[2] + batch * (width - 1),
        before[3] + batch,
        before[4] + batch * width,
    )


@pytest.mark.parametrize("verifier", registry.VERIFIERS, ids=lambda v: v.name)
def test_keyboard_interrupt_leaves_counters_all_or_nothing(verifier: registry.Verifier) -> None:
    target, bonus, draft, ids = inputs(seed=4, batch=3, k=3, vocab=6)
    uniforms = np.random.default_rng(6).random((3, 4))
    function = getattr(specdec_np, verifier.function_name)
    if verifier.stochastic:
        make = functools.partial(getattr(specdec_np, verifier.sampler_name), seed=0)
        args: tuple = (target, bonus, draft, ids)
        kwargs: dict = {"uniforms": uniforms}
        reference = function(target, bonus, draft, ids, uniforms=uniforms)
    else:
        make = getattr(specdec_np, verifier.sampler_name)
        args, kwargs = (target, bonus, None, ids), {}
        reference = function(target, bonus, ids)
    output, accepted = reference.output_token_ids, int(reference.num_accepted.sum())
    _, total = interrupted(lambda: make()(*args, **kwargs), at=10**9)
    _, in_record = interrupted(lambda: make()(*args, **kwargs), at=10**9, only="_record")
    assert in_record > 0
    rng = np.random.default_rng(7)
    sampler = make()
    half_done = []
    for trial in range(3000):
        if trial % 200 == 0:
            sampler = make()  # the first call also creates the counters
        before = totals(sampler)
        only = "_record" if trial % 2 else None
        at = int(rng.integers(1, (in_record if only else total) + 2))
        was_interrupted, _ = interrupted(functools.partial(sampler, *args, **kwargs), at, only)
        after = totals(sampler)
        if after == before:
            continue
        if after != after_one_call(before, output, accepted):
            half_done.append((trial, at, only, was_interrupted, before, after))
    assert not half_done, f"{len(half_done)} calls left the counters half updated: {half_done[:3]}"


def test_keyboard_interrupt_moves_generator_and_counters_together() -> None:
    target, bonus, draft, ids = inputs(seed=8, batch=3, k=2, vocab=5)
    _, total = interrupted(
        lambda: specdec_np.RejectionSampler(seed=0)(target, bonus, draft, ids), at=10**9
    )
    rng = np.random.default_rng(9)
    sampler = specdec_np.RejectionSampler(seed=1)
    seeded = np.random.default_rng(10)
    inconsistent = []
    for trial in range(2000):
        before = totals(sampler)
        own_state = sampler._generator.bit_generator.state
        seeded_state = seeded.bit_generator.state
        at = int(rng.integers(1, total + 2))
        interrupted(lambda: sampler(target, bonus, draft, ids, {2: seeded}), at)
        moved_counters = totals(sampler) != before
        own_clone = np.random.default_rng()
        own_clone.bit_generator.state = own_state
        own_clone.random((2, 3))
        seeded_clone = np.random.default_rng()
        seeded_clone.bit_generator.state = seeded_state
        seeded_clone.random(3)
        now_own, now_seeded = sampler._generator.bit_generator.state, seeded.bit_generator.state
        if moved_counters:
            ok = now_own == own_clone.bit_generator.state
            ok = ok and now_seeded == seeded_clone.bit_generator.state
        else:
            ok = now_own == own_state and now_seeded == seeded_state
        if not ok:
            inconsistent.append((trial, at, moved_counters))
    assert not inconsistent, f"{len(inconsistent)} inconsistent calls: {inconsistent[:5]}"


def test_keyboard_interrupt_on_the_engine_fast_path_moves_metrics_and_generator_together(
    monkeypatch: Any,
) -> None:
    """EngineVerifier's common call (the ragged fast path, which records its PCG64 draw by
    the draw itself and sets the metrics in one step), interrupted at every opcode: the
    metrics and the generator are both as before or both as after one call, and the draw
    was put back where the call failed after it."""
    from specdec_np._runtime import uniforms as _random

    undone = []
    undo = _random.undo_pcg64_draw
    monkeypatch.setattr(_random, "undo_pcg64_draw", lambda *a: undone.append(1) or undo(*a))
    keywords = {
        "num_draft_tokens": np.array([2, 1]), "draft_token_ids": np.array([1, 2, 0]),
        "target_logits": np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32),
        "temperature": 0.8,
    }  # fmt: skip

    def state(verifier: Any) -> tuple[str, str]:
        return repr(verifier.metrics), repr(verifier._own_generator.numpy.bit_generator.state)

    start = state(specdec_np.EngineVerifier(seed=1))
    done_verifier = specdec_np.EngineVerifier(seed=1)
    done_verifier(**keywords)
    done = state(done_verifier)
    _, total = interrupted(lambda: specdec_np.EngineVerifier(seed=1)(**keywords), at=10**9)
    outcomes = set()
    for at in range(1, total + 2):
        verifier = specdec_np.EngineVerifier(seed=1)
        interrupted(functools.partial(verifier, **keywords), at)
        found = state(verifier)
        assert found in (start, done), at
        outcomes.add(found == done)
    assert outcomes == {True, False} and undone


# --------------------------------------------------------------------------------------
# Item 11: an empty batch creates no counters
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [specdec_np.RejectionSampler, specdec_np.GreedySampler])
def test_empty_batch_creates_no_counters(make: Any) -> None:
    target, bonus, draft, ids = inputs(batch=0)
    sampler = make()
    out = sampler(target, bonus, draft, ids)
    assert out.shape == (0, 3)
    assert sampler.num_accepted_tokens is None and sampler.num_emitted_tokens is None
    sampler.init_tensors("cpu")
    assert int(sampler.num_accepted_tokens) == 0
    sampler._create_output(np.ones((0, 2), dtype=bool), ids, ids, bonus)
    assert int(sampler.num_emitted_tokens) == 0


def test_empty_batch_still_checks_the_counters_device() -> None:
    sampler = specdec_np.GreedySampler()
    sampler.init_tensors("cpu")
    target, bonus, _, ids = inputs(batch=0)
    sampler(target, bonus, None, ids)  # same device: fine
    assert sampler.num_draft_tokens == 0


# --------------------------------------------------------------------------------------
# Item 12: the vLLM check helpers take what forward takes
# --------------------------------------------------------------------------------------


def test_check_helpers_refuse_non_arrays_like_forward() -> None:
    target, bonus, draft, ids = inputs()
    sampler = specdec_np.RejectionSampler(strict_mode=True, seed=0)
    with pytest.raises(TypeError) as from_forward:
        sampler("target", bonus, draft, ids)
    helpers = [
        lambda t: sampler._raise_if_incorrect_input(t, ids, bonus, draft),
        lambda t: sampler._raise_if_incorrect_shape(t, ids, bonus, draft),
        lambda t: sampler._raise_if_incorrect_dtype(t, ids, bonus, draft),
        lambda t: sampler._raise_if_inconsistent_device(t, ids, bonus, draft),
    ]
    for helper in helpers:
        with pytest.raises(TypeError) as from_helper:
            helper("target")
        assert str(from_helper.value) == str(from_forward.value)
    with pytest.raises(TypeError, match="^draft_token_ids must be an array"):
        sampler._raise_if_out_of_bounds_vocab(5, "ids", bonus)
    # array_like values are taken by the helpers as by forward.
    sampler._raise_if_out_of_bounds_vocab(5, ids.tolist(), bonus)


@needs_array_api_strict
def test_check_helpers_take_foreign_arrays() -> None:
    xp = array_api_strict
    target, bonus, draft, ids = inputs()
    sampler = specdec_np.RejectionSampler(strict_mode=True, seed=0)
    foreign = [xp.asarray(a) for a in (target, ids, bonus, draft)]
    sampler._raise_if_incorrect_input(*foreign)
    sampler._raise_if_out_of_bounds_vocab(5, foreign[1], foreign[2])
    with pytest.raises(ValueError, match="^draft_token_ids must lie in"):
        sampler._raise_if_out_of_bounds_vocab(2, foreign[1] + 3, foreign[2])
    with pytest.raises(TypeError, match="^target_with_bonus_probs .*found float64$"):
        sampler._raise_if_incorrect_dtype(xp.asarray(target.astype(np.float64)), *foreign[1:])
    with pytest.raises(TypeError, match="^bonus_token_ids .*found int32$"):
        sampler._raise_if_incorrect_dtype(
            foreign[0], foreign[1], xp.asarray(bonus.astype(np.int32)), foreign[3]
        )


# --------------------------------------------------------------------------------------
# Item 13: clear errors
# --------------------------------------------------------------------------------------


class BrokenDLPack:
    """Claims DLPack; ``capsule`` is what ``__dlpack__`` returns, ``device`` what
    ``__dlpack_device__`` returns."""

    def __init__(self, capsule: Any, device: Any) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> Any:
        return self.device


def test_numpy_matrix_ids_get_a_clear_message() -> None:
    target, bonus, _, ids = inputs()
    with pytest.raises(TypeError, match="^draft_token_ids .*numpy.matrix.*found matrix"):
        specdec_np.greedy_sample(target, bonus, np.asmatrix(ids))


def test_dlpack_returning_a_non_capsule_is_a_clear_type_error() -> None:
    target, bonus, _, ids = inputs()
    with pytest.raises(TypeError, match=r"^target_with_bonus_probs.__dlpack__\(\) .*found int"):
        specdec_np.greedy_sample(BrokenDLPack(5, (1, 0)), bonus, ids)


@pytest.mark.parametrize("device", [None, "cpu", (1,), ("a", 0), 3.5, (1, 0, 0)])
def test_dlpack_device_returning_junk_is_a_clear_type_error(device: Any) -> None:
    target, bonus, _, ids = inputs()
    with pytest.raises(TypeError, match=r"^draft_token_ids.__dlpack_device__\(\) must return"):
        specdec_np.greedy_sample(target, bonus, BrokenDLPack(None, device))


@needs_array_api_strict
def test_foreign_float64_uniforms_are_accepted() -> None:
    target, bonus, draft, ids = inputs()
    uniforms = np.random.default_rng(3).random((3, 3))
    native = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms)
    foreign = specdec_np.rejection_sample(
        target, bonus, draft, ids, uniforms=array_api_strict.asarray(uniforms)
    )
    np.testing.assert_array_equal(foreign.output_token_ids, native.output_token_ids)
    # float32 (JAX's default) is widened exactly; integers are refused.
    single = uniforms.astype(np.float32)
    widened = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=single.astype(float))
    foreign_single = specdec_np.rejection_sample(
        target, bonus, draft, ids, uniforms=array_api_strict.asarray(single)
    )
    np.testing.assert_array_equal(foreign_single.output_token_ids, widened.output_token_ids)
    with pytest.raises(TypeError, match="^uniforms must be a float64 or float32 array .*int64"):
        specdec_np.rejection_sample(
            target,
            bonus,
            draft,
            ids,
            uniforms=array_api_strict.asarray(np.zeros((3, 3), dtype=np.int64)),
        )
    listed = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms.tolist())
    np.testing.assert_array_equal(listed.output_token_ids, native.output_token_ids)


def test_zero_d_uniforms_report_their_real_shape() -> None:
    target, bonus, draft, ids = inputs()
    with pytest.raises(ValueError, match=r"^uniforms must have shape .*found shape \[\]$"):
        specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=np.array(0.5))


@pytest.mark.parametrize(
    "make",
    [
        functools.partial(
            lambda name, s: getattr(specdec_np, name)(strict_mode=s), verifier.sampler_name
        )
        for verifier in registry.VERIFIERS
    ],
    ids=registry.names(),
)
@pytest.mark.parametrize("value", [np.array([True, False]), np.array(True), "yes", None, 1])
def test_strict_mode_must_be_a_bool_in_constructors(make: Any, value: Any) -> None:
    with pytest.raises(TypeError, match="^strict_mode must be a bool; found "):
        make(value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_check_strict_mode_accepts_bools(value: Any) -> None:
    assert _validate.check_strict_mode(value) is bool(value)


@pytest.mark.parametrize("verifier", registry.VERIFIERS, ids=lambda v: v.name)
def test_strict_mode_must_be_a_bool_in_stateless_functions(verifier: registry.Verifier) -> None:
    target, bonus, draft, ids = inputs()
    function = getattr(specdec_np, verifier.function_name)
    args = (target, bonus, draft, ids) if verifier.stochastic else (target, bonus, ids)
    with pytest.raises(TypeError, match="^strict_mode must be a bool; found ndarray$"):
        function(*args, strict_mode=np.array([True, False]))


# --------------------------------------------------------------------------------------
# Item 14: CLI sizes have upper bounds
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--k", "65"],
        ["demo", "--k", str(10**12)],
        ["demo", "--batch", "4097"],
        ["demo", "--tokens", "100001"],
        ["demo", "--vocab-size", str(10**9)],
        ["demo", "--samples", str(10**9)],
        ["demo", "--batch", "4096", "--k", "64", "--vocab-size", "50000"],
        ["demo", "--batch", "4096", "--tokens", "100000"],
    ],
)
def test_cli_sizes_have_upper_bounds(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and ("at most" in err or "too large" in err), err
