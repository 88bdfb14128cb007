"""A relaxed method's run over a checked chain batch: draws, rule, emission, bias.

:func:`run` is what :func:`specdec_np._kernels.dispatch.run` is for the registry's
verifiers, for the lossy methods of :data:`specdec_np.registry.RELAXED_METHODS`: the
same checks before any draw, the same uniform columns (request ``b`` reads ``0 .. k_b - 1``
to accept, ``k_b`` for the rejection's draw and ``k_b + 1`` for the bonus), the same
output block and the same all-or-nothing record.  It walks the batch in chunks of
requests (:func:`specdec_np._relaxed.laws.chunks`) on the rows' array library.
:func:`bias_of_result` gives the bias of a registry verifier's result (0 for a lossless
one, its rule's for typical acceptance).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import registry
from .._kernels.dispatch import Commit
from . import bias as _bias
from . import laws as _laws
from . import rules as _rules
from . import trees as _trees

__all__ = ["bias_of_result", "run"]


def _rejection_weights(laws: _laws.ChunkLaws, rows: Any, positions: Any, kind: str) -> Any:
    """float64 ``[m, V]``: the law a sampled request's failure at ``positions`` draws from
    (the row itself where that has no mass)."""
    xp = _rules._namespace(laws.target)
    target = laws.target[rows, positions, :]
    if kind == "removed":
        removed = target.copy()
        removed[xp.arange(rows.size), laws.draft_ids[rows, positions]] = 0.0
        weights = removed
    elif laws.draft is None:
        weights = target.copy()
        weights[xp.arange(rows.size), laws.draft_ids[rows, positions]] = 0.0
    else:
        weights = xp.maximum(target - laws.draft[rows, positions, :], 0.0)
    has_mass = (weights > 0).any(axis=1)
    return xp.where(has_mass[:, None], weights, target)


def _emit_chunk(
    laws: _laws.ChunkLaws,
    decisions: _rules.Decisions,
    uniforms: Any,
    bonus_token_ids: Any,
) -> tuple[Any, Any, Any]:
    """The chunk's output rows ``[n, K + 1]``, accepted lengths and statuses."""
    xp = _rules._namespace(laws.target)
    n, width = laws.valid.shape
    counts = laws.counts
    passed = decisions.accepted & laws.valid
    failed = ~passed & laws.valid
    if width:
        first_failure = xp.where(failed.any(axis=1), xp.argmax(failed, axis=1), counts)
    else:
        first_failure = counts  # bonus tokens only
    lengths = first_failure.astype(xp.int64)
    rows = xp.arange(n)
    status = xp.zeros(n, dtype=xp.int64)
    last = xp.zeros(n, dtype=xp.int64)

    rejected = lengths < counts
    greedy_last = laws.top[rows, xp.minimum(lengths, laws.top.shape[1] - 1)]
    chosen = xp.flatnonzero(rejected & ~laws.greedy)
    if chosen.size:
        positions = lengths[chosen]
        weights = _rejection_weights(laws, chosen, positions, decisions.rejection)
        v = uniforms[chosen, counts[chosen]]
        drawn = _rules.inverse_cdf(weights, v)
        last[chosen] = drawn
        status[chosen] = xp.where(drawn < 0, -(1 + positions), 0)
    greedy_rejected = rejected & laws.greedy
    last = xp.where(greedy_rejected, greedy_last, last)

    finished = ~rejected
    if bonus_token_ids is not None:
        bonus = bonus_token_ids[xp.asarray(laws.requests)].astype(xp.int64)
        last = xp.where(finished, bonus, last)
    else:
        last = xp.where(finished & laws.greedy, greedy_last, last)
        chosen = xp.flatnonzero(finished & ~laws.greedy)
        if chosen.size:
            positions = counts[chosen]
            weights = laws.target[chosen, positions, :]
            drawn = _rules.inverse_cdf(weights, uniforms[chosen, positions + 1])
            last[chosen] = drawn
            status[chosen] = xp.where(drawn < 0, -(1 + positions), status[chosen])

    columns = xp.arange(width + 1)[None, :]
    padded_ids = xp.concatenate([laws.draft_ids, xp.zeros((n, 1), dtype=xp.int64)], axis=1)
    output = xp.where(
        columns < lengths[:, None],
        padded_ids,
        xp.where(columns == lengths[:, None], last[:, None], -1),
    )
    return output, lengths, status


def run(
    entry: registry.RelaxedMethod,
    parameters: dict[str, Any],
    batch: Any,
    form: Any,
    request: Any,
    sources: Any,
    block: Any,
    *,
    contexts: list[Any] | None,
    report_bias: bool,
    draws_bonus: bool = True,
    on_success: Any = None,
) -> Any:
    """Verify a checked ragged chain batch by a relaxed method.

    Parameters
    ----------
    entry : registry.RelaxedMethod
    parameters : dict
        Its checked parameters, defaults filled in.
    batch : specdec_np._layouts.padded.ChainBatch or specdec_np._layouts.tree.TreeBatch
        A tree batch is walked by :func:`specdec_np._relaxed.trees.run_tree`.
    form : specdec_np._layouts.sampling.RowForm
    request : specdec_np._layouts.sampling.RequestSampling
    sources : specdec_np._runtime.uniforms.RejectionUniforms
    block : OutputBlock
    contexts : list of int sequences, optional
        Each request's prompt then output (the relaxed method's thinking phase).
    draws_bonus : bool
        A request that accepts every draft draws its bonus token (else it takes the
        batch's ``bonus_token_ids``).
    report_bias : bool
        Also give the result's ``total_variation``.
    on_success : callable, optional
        As :func:`specdec_np._kernels.dispatch.run` takes it.

    Returns
    -------
    VerificationResult
    """
    if batch.kernel_name == "verify_trees":
        return _trees.run_tree(
            parameters, batch, form, request, sources, block, report_bias=report_bias,
            on_success=on_success,
        )
    xp = batch.xp
    batch.check_ids()
    rule = _rules.rule_for(entry.rule_name)
    width = batch.max_k + 1
    commit = Commit()
    try:
        uniforms = sources.draw()
        output = block.output_token_ids
        output[...] = -1
        variation = xp.full((batch.batch_size, width), np.nan) if report_bias else None
        for requests in _laws.chunks(batch.batch_size, batch.max_k, batch.vocab_size):
            laws = _laws.chunk_laws(batch, request, form, requests)
            chunk_width = laws.valid.shape[1]
            chunk_uniforms = uniforms[xp.asarray(requests), : chunk_width + 2]
            extra = {}
            if entry.rule_name == "relaxed_accepts":
                extra["contexts"] = [contexts[b] for b in requests] if contexts else None
            decisions = rule(laws, chunk_uniforms, parameters, report_bias, **extra)
            tokens, lengths, status = _emit_chunk(
                laws, decisions, chunk_uniforms, None if draws_bonus else batch.bonus_token_ids,
            )
            bad = xp.flatnonzero(status != 0)
            if bad.size:
                block.row_status[...] = 0
                first = int(requests[int(bad[0])])
                block.row_status[first] = status[bad[0]]
                batch.raise_for_row_status(first, block.row_status)
            rows = xp.asarray(requests)
            output[rows, : chunk_width + 1] = tokens
            block.accepted_lengths[rows] = lengths
            block.num_accepted[rows] = lengths
            block.row_status[rows] = 0
            if variation is not None:
                distance = _bias.total_variation(laws, decisions)
                emitted = xp.arange(chunk_width)[None, :] <= lengths[:, None]
                chunk = xp.where(emitted & laws.valid, distance, np.nan)
                bonus = xp.zeros((requests.size, 1))
                chunk = xp.concatenate([chunk, bonus], axis=1)
                # The bonus position is exact (0) when reached; NaN after the run.
                columns = xp.arange(chunk_width + 1)[None, :]
                chunk = xp.where(columns == lengths[:, None], xp.where(
                    lengths[:, None] == laws.counts[:, None], 0.0, chunk), chunk)
                chunk = xp.where(columns <= lengths[:, None], chunk, np.nan)
                variation[rows, : chunk_width + 1] = chunk
        result = batch.result(block)
        if variation is not None:
            result.total_variation = variation
        if on_success is not None:
            on_success(result, commit)
        return result
    except BaseException:
        if sources is not None and not commit.done:
            sources.undo()
        raise


def bias_of_result(
    entry: registry.Verifier,
    parameters: tuple[float, ...],
    batch: Any,
    form: Any,
    request: Any,
    result: Any,
) -> Any:
    """float64 like ``result.output_token_ids``: the bias of a registry verifier's (or
    tree method's) result at each emitted position (0 for a lossless or greedy one and at
    the bonus position, its rule's for typical acceptance), NaN after the run."""
    xp = batch.xp
    variation = xp.where(result.output_token_ids >= 0, 0.0, np.nan)
    rule_name = getattr(entry, "bias_rule_name", None)
    if rule_name is None:
        # Lossless, greedy, or a tree method (every one lossless or greedy): exact.
        return variation
    lengths = result.accepted_lengths
    rule = _rules.rule_for(rule_name)
    named = dict(zip(entry.parameter_names, parameters))
    for requests in _laws.chunks(batch.batch_size, batch.max_k, batch.vocab_size):
        laws = _laws.chunk_laws(batch, request, form, requests)
        chunk_width = laws.valid.shape[1]
        empty = xp.zeros((requests.size, chunk_width + 2))
        decisions = rule(laws, empty, named, True)
        # A greedy request of the batch was verified greedily: exact.
        distance = xp.where(laws.greedy[:, None], 0.0, _bias.total_variation(laws, decisions))
        rows = xp.asarray(requests)
        chunk_lengths = lengths[rows]
        emitted = (xp.arange(chunk_width)[None, :] < laws.counts[:, None]) & (
            xp.arange(chunk_width)[None, :] <= chunk_lengths[:, None]
        )
        current = variation[rows, :chunk_width]
        variation[rows, :chunk_width] = xp.where(emitted, distance, current)
    return variation
