"""The chain benchmark's cells: inputs, read models, and the calls it times.

The grid of ``benchmarks/studies/run.py`` is B x k x V in two input regimes: ``flat`` (a
confident drafter unrelated to the target: almost every draft rejected) and
``realistic`` (a peaked target and a close drafter: most drafts accepted).  For one cell
this module makes the inputs (:func:`make_cell`), says how many bytes each verifier must
read for the outcome it had (:data:`BYTES_MODELS`, the roofline's numerator), and builds
the calls that are timed: the public entry point, the array-API reference, the torch
baseline, the sampler class, the entry point's stages one by one (the B = 1 profile), and
the paired accepted-length comparison of the stochastic verifiers.  Timing itself is the
harness's (:mod:`harness`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import specdec_np
from specdec_np import _core, registry, verify
from specdec_np._layouts import padded as _chains
from specdec_np._reference import chains as _reference
from specdec_np._runtime import arrays as _backend
from specdec_np._runtime import checks as _validate
from specdec_np._runtime import contract as _contract
from specdec_np._runtime import uniforms as _random

VERIFIERS = registry.VERIFIERS
VERIFIER_NAMES = tuple(verifier.name for verifier in VERIFIERS)
REGIMES = ("flat", "realistic")

# A draft with p(x) > 1/2 + margin is the argmax without reading its row.
GREEDY_SHORTCUT = 0.5 + _contract.GREEDY_MARGIN
ID_BYTES = 8
UNIFORM_BYTES = 8
#: The token-wise verifier that the paired accepted-length comparison divides by.
TOKENWISE = "rejection"


# --------------------------------------------------------------------------------------
# Inputs (the flat and the realistic regime)
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

    * intake: parameter check and ``_chains.padded_chain`` (shapes, dtypes, devices,
      kernel-ready views);
    * id_check: ``_core.first_invalid_id`` (ids are checked before any draw);
    * uniforms: ``_random.RejectionUniforms`` from a generator made before the clock
      starts, and its logged ``draw()``;
    * output_block: ``_contract.allocate_output_block``;
    * kernel: ``_core.verify_chains`` alone;
    * finish: the row-status check and the ``VerificationResult``.

    They use private names of ``specdec_np``: a name that moved raises here, and the run
    fails.  Before returning, the stages are run in order once and their result must equal
    the entry point's on the same uniforms, so the profile times the real pipeline.
    """
    parameters = parameters_of(verifier)
    generators = iter([np.random.default_rng(seed) for _ in range(calls + 2)])

    def intake() -> tuple[np.ndarray, _chains.ChainBatch]:
        values = _validate.check_method_parameters(verifier, parameters)
        batch = _chains.padded_chain(
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


def rows_equal(ours: np.ndarray, theirs: Any) -> float:
    """The share of rows on which two outputs are equal."""
    theirs = np.asarray(theirs)
    return float(np.mean(np.all(np.asarray(ours) == theirs, axis=1)))
