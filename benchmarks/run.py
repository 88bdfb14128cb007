#!/usr/bin/env python
"""Benchmark grid of specdec_np's verifiers against the reference, torch and the roofline.

Times every verifier of ``specdec_np.registry.VERIFIERS`` on NumPy (and on CuPy when
``cupy.is_available()``) over B x k x V in two input regimes (SPEC 8), against

* the array-API reference (``specdec_np._reference``) on NumPy, where it has the verifier's
  function (``--skip-reference``);
* torch baselines (``benchmarks/torch_baselines.py``: vLLM v0's algorithms, and block
  verification as an engine would write it in torch), for the verifiers that have one;
  skipped with a note if torch is missing, or with ``--skip-torch``;
* the memory roofline: the bytes each algorithm must read for the outcome it actually had,
  divided by the streaming read bandwidth measured at the start and end of the same run.

What is timed is what a user pays: the public entry point (e.g.
``specdec_np.rejection_sample`` with a ``numpy.random.Generator`` made once per call before
the clock starts, so uniform generation, validation and dispatch are included), one warm-up
call or more, then the median of N calls measured with ``time.perf_counter_ns`` (N adapts
to the call's cost, within ``--min-repeats`` and ``--repeats``).  For B = 1 the run also
splits the entry point's time into its stages (intake, id check, uniforms, output block,
kernel, finish; ``--no-profile`` skips it).  Every stochastic verifier also gets its mean
accepted length over ``--paired-draws`` rounds (fresh draft ids drawn from ``draft_probs``
and fresh explicit uniforms per round, shared by all of them), and its ratio to token-wise
rejection's on the same ids and uniforms.

Usage::

    python benchmarks/run.py                          # full grid, ~10 minutes on 2 cores
    python benchmarks/run.py --quick                  # tiny grid (smoke test)
    python benchmarks/run.py --batch 64 --k 4 --vocab 128256 --verifiers rejection block
    python benchmarks/run.py --json out.jsonl --plot out.png --markdown
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import gc
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import specdec_np
from specdec_np import _backend, _contract, _core, _layout, _random, _reference, registry, verify

VERIFIERS = registry.VERIFIERS
VERIFIER_NAMES = tuple(verifier.name for verifier in VERIFIERS)
REGIMES = ("flat", "realistic")
FULL_BATCH = (1, 8, 64)
FULL_K = (1, 4, 8)
FULL_VOCAB = (32000, 128256, 256000)
QUICK_BATCH = (1, 2)
QUICK_K = (1, 2)
QUICK_VOCAB = (1000,)

# A draft with p(x) > 1/2 + margin is the argmax without reading its row.
GREEDY_SHORTCUT = 0.5 + _contract.GREEDY_MARGIN
ID_BYTES = 8
UNIFORM_BYTES = 8
#: The token-wise verifier that the paired accepted-length comparison divides by.
TOKENWISE = "rejection"

# Targets of issues 3 and 4 (ratios against the torch baseline, 2-core machine).
REJECTION_MIN_SPEEDUP = 50.0
REJECTION_KEY_CELL = (64, 4, 128256)
REJECTION_KEY_SPEEDUP = 150.0
REJECTION_KEY_ROOFLINE = 0.5
DETERMINISTIC_MIN_SPEEDUP = {"flat": 5.0, "realistic": 20.0}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    """How many calls to time: ``budget_s / first call``, clamped to the repeat limits."""

    budget_s: float
    min_repeats: int
    max_repeats: int
    warmup_s: float = 0.05
    max_warmups: int = 20
    # A call slower than the budget is timed once: its warm-up call is the sample.
    first_call_counts: bool = False

    @property
    def max_calls(self) -> int:
        """Most calls :func:`time_calls` makes: first call, warm-ups, timed calls."""
        return 1 + self.max_warmups + self.max_repeats

    def limited(self, repeats: int | None, min_repeats: int | None = None) -> Policy:
        """At most ``repeats`` timed calls, at least ``min_repeats`` (a noisy machine)."""
        policy = self
        if repeats is not None:
            policy = dataclasses.replace(
                policy,
                min_repeats=min(policy.min_repeats, repeats),
                max_repeats=repeats,
                max_warmups=min(policy.max_warmups, repeats),
            )
        if min_repeats is not None:
            floor = min(min_repeats, policy.max_repeats) if repeats is not None else min_repeats
            policy = dataclasses.replace(
                policy,
                min_repeats=floor,
                max_repeats=max(policy.max_repeats, floor),
                first_call_counts=False,
            )
        return policy


@dataclasses.dataclass
class Timing:
    median_ns: float
    repeats: int
    results: list[Any]
    mean_ns: float | None = None
    min_ns: float | None = None


def time_calls(fn: Callable[[], Any], policy: Policy) -> Timing:
    """Warm up, then time ``fn`` with ``perf_counter_ns``; keep each call's result."""
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        result = fn()
        first_ns = max(time.perf_counter_ns() - start, 1)
        if policy.first_call_counts and first_ns >= policy.budget_s * 1e9:
            return Timing(float(first_ns), 1, [result])
        for _ in range(min(policy.max_warmups, int(policy.warmup_s * 1e9 / first_ns))):
            fn()
        repeats = int(policy.budget_s * 1e9 / first_ns)
        repeats = max(policy.min_repeats, min(policy.max_repeats, repeats))
        times = np.empty(max(repeats, 1), dtype=np.int64)
        results = []
        for j in range(len(times)):
            start = time.perf_counter_ns()
            result = fn()
            times[j] = time.perf_counter_ns() - start
            results.append(result)
        return Timing(
            float(np.median(times)), len(times), results, float(np.mean(times)), float(times.min())
        )
    finally:
        if gc_enabled:
            gc.enable()


def time_cuda_calls(cupy: Any, fn: Callable[[], Any], policy: Policy) -> Timing:
    """CuPy timing: warm-up and synchronise, then CUDA events around each call."""
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    repeats = max(policy.min_repeats, min(policy.max_repeats, 50))
    times, results = [], []
    for _ in range(repeats):
        start.record()
        result = fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e6)  # ms -> ns
        results.append(result)
    return Timing(float(np.median(times)), repeats, results)


SPECDEC_POLICY = Policy(budget_s=0.25, min_repeats=5, max_repeats=300)
TORCH_POLICY = Policy(budget_s=1.0, min_repeats=2, max_repeats=30)
REFERENCE_POLICY = Policy(budget_s=0.5, min_repeats=1, max_repeats=10, first_call_counts=True)


# --------------------------------------------------------------------------------------
# Streaming bandwidth (the roofline's denominator)
# --------------------------------------------------------------------------------------


def measure_bandwidth(nbytes: int, threads: int = 2, repeats: int = 9) -> dict[str, Any]:
    """Streaming read bandwidth of this machine, measured with NumPy reductions.

    ``np.maximum.reduce`` (SIMD, no float rounding work, releases the GIL) and ``np.sum``
    over a float32 array of ``nbytes``, on 1 thread and on ``threads`` threads (each
    reducing one contiguous slice); the best median is the roofline bandwidth.
    """
    array = np.ones(nbytes // 4, dtype=np.float32)  # also faults every page in
    slices = np.array_split(array, threads)
    measured: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for name, reduce in (("max", np.maximum.reduce), ("sum", np.add.reduce)):
            reduce(array)
            single, multi = [], []
            for _ in range(repeats):
                start = time.perf_counter_ns()
                reduce(array)
                single.append(time.perf_counter_ns() - start)
                start = time.perf_counter_ns()
                list(pool.map(reduce, slices))
                multi.append(time.perf_counter_ns() - start)
            measured[f"{name}_1t"] = float(array.nbytes / np.median(single))  # B/ns = GB/s
            measured[f"{name}_{threads}t"] = float(array.nbytes / np.median(multi))
    best = max(measured, key=measured.get)
    del array, slices
    return {
        "bytes": nbytes,
        "gb_per_s": {name: round(value, 3) for name, value in measured.items()},
        "best": best,
        "bandwidth_gb_per_s": measured[best],
        "loadavg": _loadavg(),
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def _uptime() -> str | None:
    """What ``uptime`` prints (the machine's load, for the record); None without it."""
    try:
        completed = subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def measure_cuda_bandwidth(cupy: Any, nbytes: int) -> float:
    """Device read bandwidth (GB/s) from the median time of ``cupy.max`` over nbytes."""
    array = cupy.ones(nbytes // 4, dtype=cupy.float32)
    timing = time_cuda_calls(cupy, lambda: array.max(), Policy(0, 10, 10))
    return nbytes / timing.median_ns


# --------------------------------------------------------------------------------------
# Inputs (SPEC 8 regimes)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    regime: str
    batch: int
    k: int
    vocab: int
    target: np.ndarray  # float32 [B, k+1, V]
    draft_probs: np.ndarray  # float32 [B, k, V]
    draft_ids: np.ndarray  # int64 [B, k]
    bonus_ids: np.ndarray  # int64 [B, 1]


def _softmax_of_normals(
    rng: np.random.Generator, shape: tuple[int, ...], scale: float
) -> np.ndarray:
    logits = rng.standard_normal(shape, dtype=np.float32)
    if scale != 1.0:
        logits *= np.float32(scale)
        logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    return logits


def _peaked(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Softmax-of-normals tail with one random top token holding U(0.35, 0.65) of the mass."""
    probs = rng.standard_normal((rows, vocab), dtype=np.float32)
    np.exp(probs, out=probs)
    top = rng.integers(0, vocab, size=(rows, 1))
    top_mass = rng.uniform(0.35, 0.65, size=(rows, 1)).astype(np.float32)
    np.put_along_axis(probs, top, 0.0, axis=1)
    probs *= (1 - top_mass) / probs.sum(axis=1, keepdims=True)
    np.put_along_axis(probs, top, top_mass, axis=1)
    return probs


def _sample_rows(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One token per row of ``probs [n, V]`` by inverse CDF (float64)."""
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    draws = rng.random(len(probs)) * cdf[:, -1]
    ids = np.array([np.searchsorted(cdf[i], draws[i], side="right") for i in range(len(probs))])
    return np.minimum(ids, probs.shape[-1] - 1)


def make_cell(
    regime: str, batch: int, k: int, vocab: int, *, seed: int, flat_draft_scale: float
) -> Cell:
    """Inputs of one grid cell, generated row by row to keep temporaries small.

    * flat: target = softmax of standard-normal logits; draft_probs = softmax of
      ``flat_draft_scale`` x independent normals (a confident drafter unrelated to the
      target); draft ids sampled from draft_probs.  Almost every draft is rejected.
    * realistic: target = peaked (top token ~half the mass, softmax-of-normals tail);
      draft_probs = 0.9 target + 0.1 softmax(normals); draft ids sampled from draft_probs.
      Most drafts are accepted (sum min(p, q) >= 0.9).
    """
    rng = np.random.default_rng([seed, REGIMES.index(regime), batch, k, vocab])
    target = np.empty((batch, k + 1, vocab), dtype=np.float32)
    draft_probs = np.empty((batch, k, vocab), dtype=np.float32)
    draft_ids = np.empty((batch, k), dtype=np.int64)
    for b in range(batch):
        if regime == "flat":
            target[b] = _softmax_of_normals(rng, (k + 1, vocab), 1.0)
            draft_probs[b] = _softmax_of_normals(rng, (k, vocab), flat_draft_scale)
        else:
            target[b] = _peaked(rng, k + 1, vocab)
            noise = _softmax_of_normals(rng, (k, vocab), 1.0)
            np.multiply(target[b, :k], np.float32(0.9), out=draft_probs[b])
            draft_probs[b] += np.float32(0.1) * noise
            draft_probs[b] /= draft_probs[b].sum(axis=-1, keepdims=True)
        draft_ids[b] = _sample_rows(rng, draft_probs[b])
    bonus_ids = rng.integers(0, vocab, size=(batch, 1), dtype=np.int64)
    return Cell(regime, batch, k, vocab, target, draft_probs, draft_ids, bonus_ids)


# --------------------------------------------------------------------------------------
# Bytes each algorithm must read (for the outcome it actually had)
# --------------------------------------------------------------------------------------


def _p_at_drafts(cell: Cell) -> np.ndarray:
    return np.take_along_axis(cell.target[:, : cell.k], cell.draft_ids[:, :, None], axis=2)[
        :, :, 0
    ]


def _q_at_drafts(cell: Cell) -> np.ndarray:
    return np.take_along_axis(cell.draft_probs, cell.draft_ids[:, :, None], axis=2)[:, :, 0]


def _stochastic_scalars(cell: Cell) -> float:
    """p(x), q(x), the acceptance uniform and the draft id per position; the bonus id and
    the residual uniform per row."""
    item = cell.target.itemsize
    return cell.batch * (cell.k * (2 * item + UNIFORM_BYTES + ID_BYTES) + ID_BYTES + UNIFORM_BYTES)


def rejection_bytes(
    cell: Cell, accepted_lengths: Sequence[np.ndarray], parameters: dict[str, float]
) -> float:
    """Scalars plus one target row and one draft row of V at the first rejection of each row
    that has one, averaged over the timed calls."""
    rows = np.mean(
        [np.count_nonzero(np.asarray(lengths) < cell.k) for lengths in accepted_lengths]
    )
    return _stochastic_scalars(cell) + rows * 2 * cell.vocab * cell.target.itemsize


def block_weights(cell: Cell) -> np.ndarray:
    """``rho [B, k+1]`` of block verification (float64), as the kernels compute it."""
    p_x = _p_at_drafts(cell).astype(np.float64)
    q_x = _q_at_drafts(cell).astype(np.float64)
    rho = np.ones((cell.batch, cell.k + 1))
    for i in range(cell.k):
        weighted = rho[:, i] * p_x[:, i]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(weighted >= q_x[:, i], 1.0, weighted / q_x[:, i])
        rho[:, i + 1] = np.where((p_x[:, i] > 0) & (rho[:, i] > 0), ratio, 0.0)
    return rho


def block_bytes(
    cell: Cell, accepted_lengths: Sequence[np.ndarray], parameters: dict[str, float]
) -> float:
    """Scalars plus a target row and a draft row for every position the top-down scan has to
    sum (``i`` from ``k - 1`` down to ``max(tau, 1)`` with ``0 < rho_i < 1``; ``h_k`` and
    positions with ``rho_i`` in {0, 1} need no row) and for the draw at ``tau < k`` (counted
    once when the scan already read it), averaged over the timed calls."""
    rho = block_weights(cell)
    summed = (rho[:, : cell.k] > 0) & (rho[:, : cell.k] < 1)
    summed[:, 0] = False
    columns = np.arange(cell.k)
    counts = []
    for lengths in accepted_lengths:
        tau = np.asarray(lengths)[:, None]
        read = summed & (columns >= tau)
        read |= columns == tau  # the draw's row (tau == k matches no column)
        counts.append(np.count_nonzero(read))
    return _stochastic_scalars(cell) + np.mean(counts) * 2 * cell.vocab * cell.target.itemsize


def typical_bytes(
    cell: Cell, accepted_lengths: Sequence[np.ndarray], parameters: dict[str, float]
) -> float:
    """Scalars plus one full row for every position whose p(x) <= posterior_threshold (the
    only ones whose test needs the entropy; the argmax rides along in the same pass)."""
    item = cell.target.itemsize
    scalars = cell.batch * (cell.k * (item + ID_BYTES) + ID_BYTES)
    passes = np.count_nonzero(_p_at_drafts(cell) <= parameters["posterior_threshold"])
    return scalars + passes * cell.vocab * item


def greedy_bytes(
    cell: Cell, accepted_lengths: Sequence[np.ndarray], parameters: dict[str, float]
) -> float:
    """Scalars plus, for each position with p(x) <= 1/2 + margin: the full row up to and at
    the first rejection (the argmax must be proven or found) and for accepted positions
    after it; for rejected positions after it, the row up to the first entry that beats
    p(x) (or ties it at a lower index)."""
    item = cell.target.itemsize
    total = cell.batch * (cell.k * (item + ID_BYTES) + ID_BYTES)
    p_x = _p_at_drafts(cell)
    for b in range(cell.batch):
        rejected_before = False
        for i in range(cell.k):
            x = int(cell.draft_ids[b, i])
            if p_x[b, i] > GREEDY_SHORTCUT:
                continue
            row = cell.target[b, i]
            accepted = int(np.argmax(row)) == x
            if accepted or not rejected_before:
                total += cell.vocab * item
            else:
                beats = (row > row[x]) | ((row == row[x]) & (np.arange(cell.vocab) < x))
                total += (int(np.argmax(beats)) + 1) * item
            rejected_before = rejected_before or not accepted
    return float(total)


#: The read model of each registry verifier, by registry name (the algorithm decides what
#: must be read, so this is per verifier); a verifier without one gets no roofline.
BYTES_MODELS: dict[str, Callable[[Cell, Sequence[np.ndarray], dict[str, float]], float]] = {
    "rejection": rejection_bytes,
    "block": block_bytes,
    "typical": typical_bytes,
    "greedy": greedy_bytes,
}
_UNKNOWN = set(BYTES_MODELS).difference(VERIFIER_NAMES)
if _UNKNOWN:
    raise RuntimeError(f"BYTES_MODELS names verifiers the registry lacks: {sorted(_UNKNOWN)}")


# --------------------------------------------------------------------------------------
# The verifiers under test and their baselines (all from the registry)
# --------------------------------------------------------------------------------------


def parameters_of(verifier: registry.Verifier) -> dict[str, float]:
    """The verifier's parameters at their registry defaults."""
    return {parameter.name: parameter.default for parameter in verifier.parameters}


def specdec_call(
    verifier: registry.Verifier, arrays: dict[str, Any], generator: Callable[[], Any]
) -> Callable[[], Any]:
    """The public entry point on ``arrays``; ``generator()`` gives each call of a stochastic
    verifier its ``numpy.random.Generator`` (or CuPy's)."""
    function = getattr(specdec_np, verifier.function_name)
    target, bonus, draft, ids = arrays["target"], arrays["bonus"], arrays["draft"], arrays["ids"]
    if verifier.stochastic:
        return lambda: function(target, bonus, draft, ids, generator=generator())
    parameters = parameters_of(verifier)
    return lambda: function(target, bonus, ids, **parameters)


def reference_call(verifier: registry.Verifier, cell: Cell) -> Callable[[], Any] | None:
    """The array-API reference on NumPy; None where ``_reference`` has no function for the
    verifier (said so on stderr by the caller)."""
    if not hasattr(_reference, verifier.reference_name):
        return None
    reference = _reference.reference_for(verifier)
    target, bonus, draft, ids = cell.target, cell.bonus_ids, cell.draft_probs, cell.draft_ids
    if verifier.stochastic:
        generator = np.random.default_rng(0)
        shape = (cell.batch, cell.k + 1)
        return lambda: reference(target, bonus, draft, ids, generator.random(shape))
    parameters = parameters_of(verifier)
    return lambda: reference(target, bonus, None, ids, **parameters)


def torch_call(tb: Any, verifier: registry.Verifier, cell: Cell) -> Callable[[], Any] | None:
    """The torch baseline of ``torch_baselines.BASELINES``; None where there is none."""
    baseline = tb.BASELINES.get(verifier.name)
    if baseline is None:
        return None
    target, bonus, draft, ids = tb.as_tensors(
        cell.target, cell.bonus_ids, cell.draft_probs, cell.draft_ids
    )
    if verifier.stochastic:
        import torch

        generator = torch.Generator().manual_seed(0)
        return lambda: baseline(target, bonus, draft, ids, generator=generator)
    parameters = parameters_of(verifier)
    return lambda: baseline(target, bonus, ids, **parameters)


#: The stages of the B = 1 profile, in the order the entry point runs them (``uniforms``
#: only for stochastic verifiers).
STAGES = ("intake", "id_check", "uniforms", "output_block", "kernel", "finish")


def stage_names(verifier: registry.Verifier) -> tuple[str, ...]:
    return tuple(name for name in STAGES if verifier.stochastic or name != "uniforms")


def stage_calls(
    verifier: registry.Verifier, cell: Cell, seed: int, calls: int
) -> dict[str, Callable[[], Any]]:
    """The entry point's work split into its stages, each callable on its own.

    * intake: parameter check and ``_layout.padded_chain`` (shapes, dtypes, devices,
      kernel-ready views);
    * id_check: ``_core.first_invalid_id`` (ids are checked before any draw);
    * uniforms: ``_random.RejectionUniforms`` from a generator made before the clock
      starts, its snapshot and ``draw()``;
    * output_block: ``_contract.allocate_output_block``;
    * kernel: ``_core.verify_chains`` alone;
    * finish: the row-status check and the ``VerificationResult``.

    They use private names of ``specdec_np``: a name that moved raises here, and the run
    fails.  Before returning, the stages are run in order once and their result must equal
    the entry point's on the same uniforms, so the profile times the real pipeline.
    """
    parameters = parameters_of(verifier)
    generators = iter([np.random.default_rng(seed) for _ in range(calls + 2)])

    def intake() -> tuple[np.ndarray, _layout.ChainBatch]:
        values = verify.check_parameters(verifier, parameters)
        batch = _layout.padded_chain(
            cell.target,
            cell.bonus_ids,
            cell.draft_probs,
            cell.draft_ids,
            strict=False,
            reads_draft_probs=verifier.reads_draft_probs,
        )
        return np.asarray(values, dtype=np.float64), batch

    values, batch = intake()

    def id_check() -> None:
        bad = _core.first_invalid_id(
            batch.draft_token_ids, batch.bonus_token_ids, batch.draft_offsets, batch.vocab_size
        )
        if bad is not None:
            _contract.raise_for_invalid_id(batch.id_of, *bad, batch.vocab_size)

    def uniforms() -> np.ndarray:
        sources = _random.RejectionUniforms(
            batch.batch_size, batch.max_k, np, generator=next(generators)
        )
        sources.snapshot()
        return sources.draw()

    def output_block() -> _contract.OutputBlock:
        return _contract.allocate_output_block(np, batch.batch_size, batch.max_k + 1)

    drawn = uniforms() if verifier.stochastic else np.empty((0, 0), dtype=np.float64)
    block = output_block()
    point_mass = batch.draft_rows is None
    kernel_arguments = (
        verifier.code,
        batch.target_rows,
        batch.target_rows if point_mass else batch.draft_rows,
        point_mass,
        batch.draft_token_ids,
        batch.bonus_token_ids,
        batch.draft_offsets,
        drawn,
        values,
        *block,
        _backend.thread_count(
            batch.batch_size,
            (2 if verifier.stochastic else max(batch.max_k, 1)) * batch.vocab_size,
        ),
    )

    def kernel() -> int:
        return _core.verify_chains(*kernel_arguments)

    first_bad_row = kernel()

    def finish() -> verify.VerificationResult:
        first = _backend.first_failed_row(first_bad_row, block.row_status)
        if first >= 0:
            _contract.raise_for_row_status(first, block.row_status, batch.id_of, batch.vocab_size)
        return verify.VerificationResult(
            block.output_token_ids,
            block.accepted_lengths,
            block.num_accepted,
            batch.num_draft_tokens,
        )

    staged = finish()
    arrays = {
        "target": cell.target,
        "bonus": cell.bonus_ids,
        "draft": cell.draft_probs,
        "ids": cell.draft_ids,
    }
    entry = specdec_call(verifier, arrays, lambda: np.random.default_rng(seed))()
    for name in ("output_token_ids", "accepted_lengths", "num_accepted"):
        if not np.array_equal(getattr(staged, name), getattr(entry, name)):
            raise RuntimeError(
                f"the staged pipeline of {verifier.name} gives other {name} than "
                f"{verifier.function_name}: the stages no longer mirror the entry point"
            )
    stages = {
        "intake": intake,
        "id_check": id_check,
        "uniforms": uniforms,
        "output_block": output_block,
        "kernel": kernel,
        "finish": finish,
    }
    return {name: stages[name] for name in stage_names(verifier)}


def class_call(
    verifier: registry.Verifier, cell: Cell, seed: int, calls: int
) -> Callable[[], Any]:
    """The vLLM-style sampler call (counters included).  A stochastic verifier gets a fresh
    sampler with ``seed=seed`` per call, so it draws what the timed entry point drew."""
    sampler_class = getattr(specdec_np, verifier.sampler_name)

    def make() -> Any:
        if verifier.stochastic:
            sampler = sampler_class(seed=seed)
        else:
            sampler = sampler_class(**parameters_of(verifier))
        sampler.init_tensors("cpu")
        return sampler

    args = (cell.target, cell.bonus_ids, cell.draft_probs, cell.draft_ids)
    if verifier.stochastic:
        samplers = iter([make() for _ in range(calls)])
        return lambda: next(samplers)(*args)
    sampler = make()
    return lambda: sampler(*args)


def paired_lengths(
    cell: Cell, verifiers: Sequence[registry.Verifier], draws: int, seed: int
) -> dict[str, dict[str, float]]:
    """Mean accepted length of each stochastic verifier over ``draws`` rounds, paired.

    Each round draws fresh draft ids from ``draft_probs`` (the drafter's process: block
    verification's guarantee holds in expectation over the drafts, not for every fixed
    path) and fresh explicit uniforms; every verifier gets the same ids and uniforms.

    Returns
    -------
    dict
        ``name -> {"mean": mean accepted length per row, "gain": mean paired difference
        from TOKENWISE's, "gain_se": its standard error}``.
    """
    generator = np.random.default_rng([seed, 1, cell.batch, cell.k, cell.vocab])
    ids = np.empty((draws, cell.batch, cell.k), dtype=np.int64)
    for b in range(cell.batch):
        for i in range(cell.k):
            cdf = np.cumsum(cell.draft_probs[b, i], dtype=np.float64)
            picks = np.searchsorted(cdf, generator.random(draws) * cdf[-1], side="right")
            ids[:, b, i] = np.minimum(picks, cell.vocab - 1)
    lengths = {v.name: np.empty((draws, cell.batch), dtype=np.int64) for v in verifiers}
    for round_ in range(draws):
        uniforms = generator.random((cell.batch, cell.k + 1))
        for verifier in verifiers:
            result = getattr(specdec_np, verifier.function_name)(
                cell.target, cell.bonus_ids, cell.draft_probs, ids[round_], uniforms=uniforms
            )
            lengths[verifier.name][round_] = result.accepted_lengths
    baseline = lengths[TOKENWISE]
    summary = {}
    for name, values in lengths.items():
        difference = (values - baseline).ravel().astype(np.float64)
        summary[name] = {
            "mean": float(values.mean()),
            "gain": float(difference.mean()),
            "gain_se": float(difference.std(ddof=1) / math.sqrt(difference.size))
            if difference.size > 1
            else 0.0,
        }
    return summary


def _rows_equal(ours: np.ndarray, theirs: Any) -> float:
    theirs = np.asarray(theirs)
    return float(np.mean(np.all(np.asarray(ours) == theirs, axis=1)))


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def load_torch(args: argparse.Namespace) -> tuple[Any, str]:
    if args.skip_torch:
        return None, "torch baselines skipped (--skip-torch)"
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_baselines
    except ImportError as error:
        return None, f"torch baselines skipped: torch is not installed ({error})"
    torch_baselines.configure(args.torch_threads)
    import torch

    return torch_baselines, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def load_cupy(args: argparse.Namespace) -> Any:
    if "cupy" not in args.backends:
        return None
    try:
        import cupy
    except ImportError:
        return None
    return cupy if cupy.is_available() else None


def run_cell(
    cell: Cell, args: argparse.Namespace, tb: Any, cupy: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, profiles = [], []
    host_arrays = {
        "target": cell.target,
        "bonus": cell.bonus_ids,
        "draft": cell.draft_probs,
        "ids": cell.draft_ids,
    }
    device_arrays = None
    if cupy is not None:
        device_arrays = {name: cupy.asarray(array) for name, array in host_arrays.items()}
    selected = [registry.get(name) for name in args.verifiers]
    paired: dict[str, dict[str, float]] = {}
    stochastic = [v for v in selected if v.stochastic]
    if args.paired_draws and stochastic:
        # The token-wise baseline joins every paired comparison, selected or not.
        compared = list(stochastic)
        if TOKENWISE not in {v.name for v in compared}:
            compared.insert(0, registry.get(TOKENWISE))
        paired = paired_lengths(cell, compared, args.paired_draws, args.seed)
    for verifier in selected:
        name = verifier.name
        parameters = parameters_of(verifier)
        base = {
            "verifier": name,
            "regime": cell.regime,
            "B": cell.batch,
            "k": cell.k,
            "V": cell.vocab,
        }
        ref_ns = torch_ns = torch_min_ns = None
        if not args.skip_reference:
            call = reference_call(verifier, cell)
            if call is None:
                log(f"  no reference timing for {name}: no _reference.{verifier.reference_name}")
            else:
                ref_ns = time_calls(call, REFERENCE_POLICY.limited(args.repeats)).median_ns
        torch_output = None
        if tb is not None:
            call = torch_call(tb, verifier, cell)
            if call is None:
                log(f"  no torch baseline for {name}")
            else:
                timing = time_calls(call, TORCH_POLICY.limited(args.repeats, args.min_repeats))
                torch_ns, torch_output = timing.median_ns, timing.results[-1].output_token_ids
                torch_min_ns = timing.min_ns
        for backend in ("numpy", "cupy"):
            if backend == "numpy" and "numpy" in args.backends:
                # A fresh generator with the same seed for every call (made before timing):
                # every call draws the same uniforms, so the outcome, and with it the bytes
                # read, is the same in every timed call and the median is well defined.
                policy = SPECDEC_POLICY.limited(args.repeats, args.min_repeats)
                pool = [np.random.default_rng(args.seed) for _ in range(policy.max_calls)]
                timing = time_calls(
                    specdec_call(verifier, host_arrays, iter(pool).__next__), policy
                )
            elif backend == "cupy" and device_arrays is not None:
                shared = cupy.random.default_rng(args.seed)
                timing = time_cuda_calls(
                    cupy,
                    specdec_call(verifier, device_arrays, itertools.repeat(shared).__next__),
                    SPECDEC_POLICY.limited(args.repeats, args.min_repeats),
                )
            else:
                continue
            lengths = [
                cupy.asnumpy(r.accepted_lengths) if backend == "cupy" else r.accepted_lengths
                for r in timing.results
            ]
            last_output = timing.results[-1].output_token_ids
            if backend == "cupy":
                last_output = cupy.asnumpy(last_output)
            model = BYTES_MODELS.get(name)
            nbytes = None if model is None else float(model(cell, lengths, parameters))
            median = timing.median_ns
            row = dict(
                base,
                backend=backend,
                time_us=median / 1e3,
                mean_us=None if timing.mean_ns is None else timing.mean_ns / 1e3,
                min_us=None if timing.min_ns is None else timing.min_ns / 1e3,
                repeats=timing.repeats,
                ref_us=None if ref_ns is None or backend != "numpy" else ref_ns / 1e3,
                torch_us=None if torch_ns is None or backend != "numpy" else torch_ns / 1e3,
                accepted=float(np.mean([np.mean(x) for x in lengths]) / cell.k),
                bytes=nbytes,
            )
            if name in paired:
                mean, tokenwise = paired[name]["mean"], paired[TOKENWISE]["mean"]
                row["mean_length"] = mean
                row["tokenwise_length"] = tokenwise
                row["x_tokenwise_length"] = mean / tokenwise if tokenwise > 0 else None
                row["length_gain"] = paired[name]["gain"]
                row["length_gain_se"] = paired[name]["gain_se"]
                row["paired_draws"] = args.paired_draws
            row["x_ref"] = None if row["ref_us"] is None else row["ref_us"] / row["time_us"]
            row["x_torch"] = None if row["torch_us"] is None else row["torch_us"] / row["time_us"]
            # Fastest call against fastest call: what is left when the OS never preempted
            # either side (on a shared machine the medians of 2-thread code are not).
            if backend == "numpy" and torch_min_ns is not None and row["min_us"]:
                row["torch_min_us"] = torch_min_ns / 1e3
                row["x_torch_best"] = row["torch_min_us"] / row["min_us"]
            if torch_output is not None and not verifier.stochastic:
                # Deterministic: the same rows up to float32 rounding at a threshold.
                row["rows_equal_torch"] = _rows_equal(last_output, torch_output)
                if row["rows_equal_torch"] != 1.0:
                    log(f"  note: {name} output differs from torch's on {base}")
            rows.append(row)
            if backend == "numpy" and cell.batch == 1 and args.profile:
                profiles.append(profile_b1(verifier, cell, median, args))
    return rows, profiles


def profile_b1(
    verifier: registry.Verifier, cell: Cell, entry_ns: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Where the time of a B = 1 call goes: its stages one by one, the kernel among them,
    and the class call.  A stage that fails raises: a profile is never partial."""
    policy = SPECDEC_POLICY.limited(args.repeats, args.min_repeats)
    class_ns = time_calls(
        class_call(verifier, cell, args.seed, policy.max_calls), policy
    ).median_ns
    stages = {
        name: time_calls(fn, policy).median_ns / 1e3
        for name, fn in stage_calls(verifier, cell, args.seed, policy.max_calls).items()
    }
    profile = {
        "verifier": verifier.name,
        "regime": cell.regime,
        "B": cell.batch,
        "k": cell.k,
        "V": cell.vocab,
        "entry_us": entry_ns / 1e3,
        "class_us": class_ns / 1e3,
        "kernel_us": stages["kernel"],
        "stages_us": stages,
        "overhead_us": entry_ns / 1e3 - stages["kernel"],
        # What the stages do not account for: glue between them in the entry point.
        "unstaged_us": entry_ns / 1e3 - sum(stages.values()),
    }
    return profile


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

TABLE_COLUMNS = (
    ("verifier", "verifier"),
    ("backend", "backend"),
    ("regime", "regime"),
    ("B", "B"),
    ("k", "k"),
    ("V", "V"),
    ("time_us", "time_us"),
    ("min_us", "best_us"),
    ("ref_us", "ref_us"),
    ("torch_us", "torch_us"),
    ("x_ref", "x_ref"),
    ("x_torch", "x_torch"),
    ("x_torch_best", "x_torch_best"),
    ("accepted", "acc"),
    ("mean_length", "mean_len"),
    ("x_tokenwise_length", "x_len_rej"),
    ("bytes", "MB_read"),
    ("roofline", "roofline"),
)
GAIN_COLUMNS = (
    ("regime", "regime"),
    ("B", "B"),
    ("k", "k"),
    ("V", "V"),
    ("verifier", "verifier"),
    ("mean_length", "mean_len"),
    ("tokenwise_length", "rejection_len"),
    ("x_tokenwise_length", "ratio"),
    ("length_gain", "gain"),
    ("length_gain_se", "gain_se"),
    ("roofline", "roofline"),
    ("roofline_best", "roofline_best"),
)
PROFILE_COLUMNS = (
    ("verifier", "verifier"),
    ("regime", "regime"),
    ("k", "k"),
    ("V", "V"),
    ("entry_us", "entry_us"),
    ("class_us", "class_us"),
    ("kernel_us", "kernel_us"),
    ("overhead_us", "overhead_us"),
    ("unstaged_us", "unstaged_us"),
    ("stages", "stages (us)"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "bytes":
        return f"{value / 1e6:.3f}" if value < 1e7 else f"{value / 1e6:.1f}"
    if key in ("x_ref", "x_torch", "x_torch_best"):
        return f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    if key in ("accepted", "roofline", "roofline_best", "mean_length", "tokenwise_length"):
        return f"{value:.2f}"
    if key in ("x_tokenwise_length", "length_gain", "length_gain_se"):
        return f"{value:.3f}"
    if key == "stages":
        return " ".join(f"{name}={us:.1f}" for name, us in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.1f}" if value < 1e5 else f"{value:.0f}"
    return str(value)


def format_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], markdown: bool
) -> str:
    cells = [
        [_fmt(key, row.get(key if key != "stages" else "stages_us")) for key, _ in columns]
        for row in rows
    ]
    headers = [title for _, title in columns]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
        lines += ["| " + " | ".join(line) + " |" for line in cells]
        return "\n".join(lines)
    widths = [max(len(headers[j]), *(len(line[j]) for line in cells)) for j in range(len(headers))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)


def missed_targets(rows: Sequence[dict[str, Any]], best: bool = False) -> list[str]:
    """Cells of the numpy backend that miss the speed-up/roofline targets of issues 3 and 4
    (on medians; with ``best``, on the fastest call of each side)."""
    missed = []
    for row in rows:
        speedup = row.get("x_torch_best" if best else "x_torch")
        if row["backend"] != "numpy" or speedup is None:
            continue
        where = f"{row['verifier']} {row['regime']} B={row['B']} k={row['k']} V={row['V']}"
        if row["verifier"] == TOKENWISE:
            if speedup < REJECTION_MIN_SPEEDUP:
                missed.append(f"{where}: {speedup:.1f}x vs torch < {REJECTION_MIN_SPEEDUP:.0f}x")
            if (row["B"], row["k"], row["V"]) == REJECTION_KEY_CELL:
                if speedup < REJECTION_KEY_SPEEDUP:
                    missed.append(
                        f"{where}: {speedup:.1f}x vs torch < {REJECTION_KEY_SPEEDUP:.0f}x"
                    )
                roofline = row["roofline"] * (row["time_us"] / row["min_us"] if best else 1.0)
                if roofline < REJECTION_KEY_ROOFLINE:
                    missed.append(f"{where}: roofline {roofline:.2f} < {REJECTION_KEY_ROOFLINE}")
        elif not registry.get(row["verifier"]).stochastic:
            goal = DETERMINISTIC_MIN_SPEEDUP[row["regime"]]
            if speedup < goal:
                missed.append(f"{where}: {speedup:.1f}x vs torch < {goal:.0f}x")
    return missed


def plot(rows: Sequence[dict[str, Any]], path: str, meta: dict[str, Any]) -> None:
    """Time vs vocabulary size (log-log): rows = verifiers, columns = regimes; colour = B,
    line style = implementation, at one k (4 when measured)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plot skipped: matplotlib is not installed")
        return
    verifiers = [v for v in VERIFIER_NAMES if any(r["verifier"] == v for r in rows)]
    regimes = [g for g in REGIMES if any(r["regime"] == g for r in rows)]
    ks = sorted({r["k"] for r in rows})
    k = 4 if 4 in ks else ks[-1]
    batches = sorted({r["B"] for r in rows})
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, max(len(batches), 1)))
    styles = {
        "specdec_np numpy": ("time_us", "numpy", "-", "o"),
        "specdec_np cupy": ("time_us", "cupy", "-.", "s"),
        "torch (vLLM v0)": ("torch_us", "numpy", "--", "^"),
        "reference": ("ref_us", "numpy", ":", "x"),
    }
    figure, axes = plt.subplots(
        len(verifiers),
        len(regimes),
        figsize=(5.5 * len(regimes), 3.8 * len(verifiers)),
        squeeze=False,
    )
    for i, verifier in enumerate(verifiers):
        for j, regime in enumerate(regimes):
            ax = axes[i][j]
            for colour, batch in zip(colours, batches, strict=True):
                for label, (key, backend, style, marker) in styles.items():
                    points = sorted(
                        (r["V"], r[key])
                        for r in rows
                        if (r["verifier"], r["regime"], r["B"], r["k"], r["backend"])
                        == (verifier, regime, batch, k, backend)
                        and r.get(key) is not None
                    )
                    if points:
                        ax.plot(
                            *zip(*points, strict=True),
                            style,
                            marker=marker,
                            color=colour,
                            label=f"{label}, B={batch}",
                        )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{verifier}, {regime} regime, k={k}")
            ax.set_xlabel("vocabulary size V")
            ax.set_ylabel("median time per call (µs)")
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(
        handles, labels, loc="lower center", ncol=min(4, max(len(labels), 1)), fontsize="small"
    )
    figure.suptitle(
        f"specdec_np vs baselines ({meta['cpu_count']} CPU cores, "
        f"{meta['roofline_bandwidth_gb_per_s']:.1f} GB/s streaming read)"
    )
    figure.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(labels) / 4), 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    log(f"plot written to {path}")


def report(
    meta: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    profiles: Sequence[dict[str, Any]],
    markdown: bool,
) -> None:
    """Print the header, the cell table, the B = 1 profile and the missed targets."""
    print(f"# specdec_np benchmark, {meta['date']}")
    print(f"# command: {meta['command']}")
    print(
        f"# numpy {meta['numpy']}, python {meta['python']}, {meta['cpu_count']} CPUs; "
        f"{meta['torch']}"
    )
    if meta.get("openmp_max_threads") is not None:
        print(
            f"# specdec_np kernels: at most {meta['openmp_max_threads']} OpenMP threads "
            f"(OMP_NUM_THREADS={meta.get('omp_num_threads_env')})"
        )
    bw, end = meta["bandwidth"], meta["bandwidth_end"]
    print(
        f"# streaming read bandwidth (median of {bw['bytes'] >> 20} MiB float32 reductions, best "
        f"method): start {bw['bandwidth_gb_per_s']:.2f} GB/s ({bw['best']}), end "
        f"{end['bandwidth_gb_per_s']:.2f} GB/s ({end['best']}); roofline uses "
        f"{meta['roofline_bandwidth_gb_per_s']:.2f} GB/s"
    )
    print(f"# all probes (GB/s): start {bw['gb_per_s']}, end {end['gb_per_s']}")
    print(f"# load average at start {bw['loadavg']}, at end {end['loadavg']}")
    for when in ("start", "end"):
        if meta.get(f"uptime_{when}"):
            print(f"# uptime at {when}: {meta[f'uptime_{when}']}")
    if meta.get("cuda_bandwidth_gb_per_s"):
        print(f"# CUDA read bandwidth: {meta['cuda_bandwidth_gb_per_s']:.1f} GB/s (cupy max)")
    print(
        "# time_us: median per call of the public entry point; best_us: fastest call; x_ref, "
        "x_torch: baseline median / time_us; x_torch_best: fastest torch call / best_us; acc: "
        "accepted prefix / k of the timed outcome; mean_len: mean accepted length over the "
        "paired rounds (stochastic verifiers: fresh draft ids and uniforms per round, shared by "
        "all); x_len_rej: mean_len / rejection's on the same ids and uniforms; MB_read: bytes "
        "the algorithm must read; roofline: (MB_read / bandwidth) / time_us"
    )
    print(format_table(rows, TABLE_COLUMNS, markdown))
    if profiles:
        print()
        print(
            "# B = 1 profile: entry = public function, class = sampler call, stages = median of "
            "each stage alone (intake = padded_chain, id_check = first_invalid_id, uniforms = "
            "RejectionUniforms + snapshot + draw, output_block, kernel = verify_chains, finish = "
            "status check + result), overhead = entry - kernel, unstaged = entry - sum(stages)"
        )
        print(format_table(profiles, PROFILE_COLUMNS, markdown))
    gains = [
        row
        for row in rows
        if row["backend"] == "numpy"
        and row.get("x_tokenwise_length") is not None
        and row["verifier"] != TOKENWISE
    ]
    if gains:
        gains = sorted(
            gains,
            key=lambda r: (REGIMES.index(r["regime"]), r["verifier"], r["B"], r["k"], r["V"]),
        )
        print()
        print(
            f"# accepted-length gain over token-wise {TOKENWISE} (paired: "
            f"{gains[0]['paired_draws']} rounds per cell, each with fresh draft ids drawn from "
            "draft_probs and fresh explicit uniforms, the same for both verifiers; mean_len = "
            "mean accepted prefix per row; gain = mean paired difference, gain_se its standard "
            "error; roofline_best = roofline on the fastest call)"
        )
        print(format_table(gains, GAIN_COLUMNS, markdown))
        for regime in REGIMES:
            for name in dict.fromkeys(r["verifier"] for r in gains):
                ratios = [
                    r["x_tokenwise_length"]
                    for r in gains
                    if r["regime"] == regime and r["verifier"] == name
                ]
                if ratios:
                    print(
                        f"# {name} / {TOKENWISE}, {regime}: mean ratio {np.mean(ratios):.3f} "
                        f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} cells"
                    )
    if any(row.get("torch_us") is not None for row in rows):
        for best in (False, True):
            missed = missed_targets(rows, best=best)
            timings = "fastest call vs fastest call" if best else "medians"
            print()
            print(f"# targets missed ({timings}): {len(missed)}")
            for line in missed:
                print(f"#   {line}")
    print(f"# elapsed: {meta['elapsed_s']} s")


def render(path: str, args: argparse.Namespace) -> int:
    """Print (and plot) the results of an earlier ``--json`` file without measuring."""
    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    meta = next(r for r in records if r["kind"] == "meta")

    def selected(record: dict) -> bool:
        # The grid options select rows of the saved run (all of them when not given).
        return (
            (args.batch is None or record["B"] in args.batch)
            and (args.k is None or record["k"] in args.k)
            and (args.vocab is None or record["V"] in args.vocab)
            and record["verifier"] in args.verifiers
            and record["regime"] in args.regimes
        )

    rows = [r for r in records if r["kind"] == "cell" and selected(r)]
    profiles = [r for r in records if r["kind"] == "profile" and selected(r)]
    report(meta, rows, profiles, args.markdown)
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark specdec_np's verifiers against the array-API reference, torch "
        "implementations of vLLM v0's algorithms and the memory roofline."
    )
    parser.add_argument("--batch", type=int, nargs="+", help=f"batch sizes (default {FULL_BATCH})")
    parser.add_argument("--k", type=int, nargs="+", help=f"draft lengths (default {FULL_K})")
    parser.add_argument(
        "--vocab", type=int, nargs="+", help=f"vocabulary sizes (default {FULL_VOCAB})"
    )
    parser.add_argument(
        "--verifiers",
        nargs="+",
        choices=VERIFIER_NAMES,
        default=list(VERIFIER_NAMES),
        help="registry names (default: every verifier of specdec_np.registry)",
    )
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32",
        help="dtype of the probability rows (float64: the float32 rows widened)",
    )  # fmt: skip
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=("numpy", "cupy"),
        default=["numpy", "cupy"],
        help="cupy is used only when cupy.is_available()",
    )
    parser.add_argument(
        "--repeats", type=int, help="at most this many timed calls per measurement"
    )
    parser.add_argument(
        "--min-repeats",
        type=int,
        help="at least this many timed calls per measurement (on a noisy machine)",
    )
    parser.add_argument(
        "--paired-draws",
        type=int,
        help="rounds of shared explicit uniforms for the accepted-length comparison of the "
        "stochastic verifiers (default 200, quick 5; 0 skips it)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny grid for smoke tests: B {QUICK_BATCH}, k {QUICK_K}, V {QUICK_VOCAB}, 1 repeat",
    )
    parser.add_argument(
        "--skip-reference", action="store_true", help="do not time the array-API reference"
    )
    parser.add_argument(
        "--skip-torch", action="store_true", help="do not time the torch baselines"
    )
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the B = 1 kernel-vs-overhead profile",
    )
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument(
        "--flat-draft-scale",
        type=float,
        default=4.0,
        help="scale of the flat regime's draft logits (default 4: a confident, unrelated "
        "drafter, so nearly every draft is rejected; 1 accepts ~48%%)",
    )
    parser.add_argument(
        "--bandwidth-mib", type=int, help="size of the bandwidth probe (default 1024, quick 64)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write JSON lines (meta, cells, profiles)")
    parser.add_argument("--plot", metavar="FILE.png", help="plot time vs V (needs matplotlib)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument(
        "--render",
        metavar="FILE",
        help="print (and --plot) an earlier --json file, restricted by the grid options; "
        "measure nothing",
    )
    args = parser.parse_args(argv)
    if args.render:
        return args  # the grid options only select rows of the saved run
    if args.quick:
        args.batch = args.batch or list(QUICK_BATCH)
        args.k = args.k or list(QUICK_K)
        args.vocab = args.vocab or list(QUICK_VOCAB)
        args.repeats = args.repeats or 1
        args.bandwidth_mib = args.bandwidth_mib or 64
        args.paired_draws = 5 if args.paired_draws is None else args.paired_draws
    args.batch = args.batch or list(FULL_BATCH)
    args.k = args.k or list(FULL_K)
    args.vocab = args.vocab or list(FULL_VOCAB)
    args.bandwidth_mib = args.bandwidth_mib or 1024
    args.paired_draws = 200 if args.paired_draws is None else args.paired_draws
    for name in ("batch", "k", "vocab"):
        if any(value < 1 for value in getattr(args, name)):
            parser.error(f"--{name} values must be positive")
    for name in ("repeats", "min_repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.paired_draws < 0:
        parser.error("--paired-draws must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args)
    started = time.perf_counter()
    tb, torch_note = load_torch(args)
    cupy = load_cupy(args)
    log(f"measuring streaming read bandwidth over {args.bandwidth_mib} MiB ...")
    meta: dict[str, Any] = {
        "kind": "meta",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "specdec_np": specdec_np.__version__,
        "cpu_count": os.cpu_count(),
        # The kernels' thread count follows OpenMP's (OMP_NUM_THREADS), capped at B.
        "openmp_max_threads": _core.openmp_max_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch_note,
        "cupy": None if cupy is None else cupy.__version__,
        "uptime_start": _uptime(),
        "bandwidth": measure_bandwidth(args.bandwidth_mib << 20),
    }
    if cupy is not None:
        meta["cuda_bandwidth_gb_per_s"] = measure_cuda_bandwidth(cupy, args.bandwidth_mib << 20)
    bw = meta["bandwidth"]
    log(f"bandwidth: {bw['bandwidth_gb_per_s']:.2f} GB/s ({bw['best']}); all: {bw['gb_per_s']}")
    if bw["loadavg"] and bw["loadavg"][0] > 1.5 * (os.cpu_count() or 1):
        log(
            f"WARNING: load average {bw['loadavg']} on {os.cpu_count()} CPUs: "
            "timings will be noisy"
        )
    rows: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    cells = [
        (g, v, b, k) for g in args.regimes for v in args.vocab for b in args.batch for k in args.k
    ]
    for index, (regime, vocab, batch, k) in enumerate(cells, 1):
        cell_start = time.perf_counter()
        cell = make_cell(
            regime, batch, k, vocab, seed=args.seed, flat_draft_scale=args.flat_draft_scale
        )
        if args.dtype != "float32":
            # The same float32 rows widened: both dtypes verify the same draws.
            cell.target = cell.target.astype(args.dtype)
            cell.draft_probs = cell.draft_probs.astype(args.dtype)
        cell_rows, cell_profiles = run_cell(cell, args, tb, cupy)
        rows += cell_rows
        profiles += cell_profiles
        del cell
        gc.collect()
        summary = ", ".join(
            f"{r['verifier']}/{r['backend']} {r['time_us']:.1f}us" for r in cell_rows
        )
        log(
            f"[{index}/{len(cells)}] {regime} B={batch} k={k} V={vocab}: {summary} "
            f"({time.perf_counter() - cell_start:.1f}s)"
        )
    log("measuring streaming read bandwidth again ...")
    meta["bandwidth_end"] = measure_bandwidth(args.bandwidth_mib << 20)
    meta["uptime_end"] = _uptime()
    # The larger of the two medians: never flatters the roofline fraction.
    bandwidth = max(
        meta["bandwidth"]["bandwidth_gb_per_s"], meta["bandwidth_end"]["bandwidth_gb_per_s"]
    )
    meta["roofline_bandwidth_gb_per_s"] = bandwidth
    for row in rows:
        row_bandwidth = bandwidth if row["backend"] == "numpy" else meta["cuda_bandwidth_gb_per_s"]
        row["roofline"] = (
            None
            if row["bytes"] is None
            else (row["bytes"] / row_bandwidth) / (row["time_us"] * 1e3)
        )
        # On the fastest call: what the code reaches when the OS does not preempt it.
        row["roofline_best"] = (
            None
            if row["bytes"] is None or not row.get("min_us")
            else (row["bytes"] / row_bandwidth) / (row["min_us"] * 1e3)
        )
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)

    report(meta, rows, profiles, args.markdown)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            for record in [
                meta,
                *({"kind": "cell", **r} for r in rows),
                *({"kind": "profile", **p} for p in profiles),
            ]:
                handle.write(json.dumps(record, default=float) + "\n")
        log(f"JSON lines written to {args.json}")
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
