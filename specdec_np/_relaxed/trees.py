"""A relaxed method on draft trees: SGLang's thresholds, walked request by request.

At a node whose children are tried (the root first), one uniform decides: that of its
first child (column ``kids[0]`` of the request's ``N_b + 1`` uniforms, so that each
column serves one test).  The children are tried in sibling order with a running sum
``acc`` of their target probabilities; child ``x`` is accepted when ``u <= acc /
threshold_acc`` or ``p(x) >= threshold_single``, and the walk goes on from it.  When
every child fails, or at a leaf, the final token is drawn from the node's row (without
the failed children's tokens) with column ``N_b``.  A greedy request walks greedily.
``docs/semantics.md`` (section 14a) states it; the candidates are taken as given (SGLang's
are deterministic), so its bias per depth is computed for those candidates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._kernels.dispatch import Commit
from .._layouts import surface as _surface
from .rules import THRESHOLD_ACC_FLOOR, inverse_cdf

__all__ = ["run_tree"]


def _request_laws(batch: Any, request: Any, form: Any, b: int) -> tuple[np.ndarray, bool]:
    """Host float64 laws of request ``b``'s ``N_b + 1`` target rows (its raw rows for a
    greedy request), and whether it is greedy."""
    xp = batch.xp
    layout = batch.layout
    start, stop = int(layout.node_offsets[b]), int(layout.node_offsets[b + 1])
    rows = batch.target_rows[start + b : stop + b + 1]
    greedy = bool(np.asarray(request.greedy)[b])
    if greedy:
        laws = xp.where(xp.isnan(rows), xp.asarray(-np.inf, dtype=rows.dtype), rows)
    elif form.from_logits:
        table = request.table[b : b + 1]
        laws = _surface.law_rows(
            xp.ascontiguousarray(rows), xp.repeat(table, rows.shape[0], axis=0)
        )
    else:
        laws = rows
    laws = laws.get() if hasattr(laws, "get") else laws
    return np.asarray(laws, dtype=np.float64), greedy


def _depth_bias(row: np.ndarray, tokens: list[int], single: float, acc: float) -> float:
    """The bias at one depth: the law of the emitted token over the depth's uniform (and
    the final draw) against the row's normalised law."""
    total = row.sum()
    law = row / total if total > 0 else row
    emitted = np.zeros_like(law)
    before = 0.0
    running = 0.0
    for x in tokens:
        running += row[x]
        if row[x] >= single:
            emitted[x] += 1.0 - before
            before = 1.0
            break
        reach = min(1.0, running / acc)
        emitted[x] += max(reach - before, 0.0)
        before = max(before, reach)
    failing = 1.0 - before
    if failing > 0:
        rest = law.copy()
        rest[tokens] = 0.0
        mass = rest.sum()
        emitted += failing * (rest / mass if mass > 0 else law)
    return 0.5 * float(np.abs(emitted - law).sum())


def run_tree(
    parameters: dict[str, Any],
    batch: Any,
    form: Any,
    request: Any,
    sources: Any,
    block: Any,
    *,
    report_bias: bool,
    on_success: Any = None,
) -> Any:
    """Verify a checked tree batch by SGLang's thresholds (the module docstring).

    Parameters
    ----------
    parameters : dict
        ``threshold_single`` and ``threshold_acc``, checked.
    batch : specdec_np._layouts.tree.TreeBatch
    form, request, sources, block, report_bias, on_success
        As :func:`specdec_np._relaxed.runner.run` takes them.

    Returns
    -------
    TreeVerificationResult
    """
    xp = batch.xp
    layout = batch.layout
    single = float(parameters["threshold_single"])
    acc = max(float(parameters["threshold_acc"]), THRESHOLD_ACC_FLOOR)
    width = layout.max_depth
    commit = Commit()
    try:
        uniforms = sources.draw()
        uniforms = np.asarray(uniforms.get() if hasattr(uniforms, "get") else uniforms)
        nodes_out = np.full((layout.batch_size, width), -1, dtype=np.int64)
        tokens_out = np.full((layout.batch_size, width + 1), -1, dtype=np.int64)
        lengths = np.zeros(layout.batch_size, dtype=np.int64)
        variation = np.full((layout.batch_size, width + 1), np.nan)
        for b in range(layout.batch_size):
            # The uniforms are flat (request b's N_b + 1 from node_offsets[b] + b on) or
            # [B, >= max_nodes + 1].
            mine = (
                uniforms[int(layout.node_offsets[b]) + b :] if uniforms.ndim == 1
                else uniforms[b]
            )
            laws, greedy = _request_laws(batch, request, form, b)
            children = layout.children(b)
            tokens = layout.tokens_of(b)
            node, depth = -1, 0
            while True:
                row = laws[node + 1]
                kids = children[node + 1]
                chosen = None
                if greedy:
                    best = int(np.argmax(row))
                    chosen = next((c for c in kids if tokens[c] == best), None)
                    final = best
                else:
                    u = float(mine[kids[0]]) if kids else 0.0
                    running = 0.0
                    for child in kids:
                        p_x = float(row[tokens[child]])
                        running += p_x
                        if u <= running / acc or p_x >= single:
                            chosen = child
                            break
                variation[b, depth] = 0.0 if greedy or not (report_bias and kids) else (
                    _depth_bias(row, [tokens[c] for c in kids], single, acc)
                )
                if chosen is not None:
                    nodes_out[b, depth] = chosen
                    tokens_out[b, depth] = tokens[chosen]
                    node, depth = chosen, depth + 1
                    continue
                if not greedy:
                    weights = np.where(row > 0, row, 0.0)
                    weights[[tokens[c] for c in kids]] = 0.0
                    if not (weights > 0).any():
                        weights = np.where(row > 0, row, 0.0)
                    final = int(inverse_cdf(weights[None, :], mine[len(tokens)][None])[0])
                    if final < 0:
                        block.row_status[...] = 0
                        block.row_status[b] = -(node + 2)
                        batch.raise_for_row_status(b, np.asarray(block.row_status))
                tokens_out[b, depth] = final
                lengths[b] = depth
                break
        block.accepted_nodes[...] = -1
        block.accepted_nodes[:, :width] = xp.asarray(nodes_out)
        block.output_token_ids[...] = -1
        block.output_token_ids[:, : width + 1] = xp.asarray(tokens_out)
        block.accepted_lengths[...] = xp.asarray(lengths)
        block.row_status[...] = 0
        result = batch.result(block)
        if report_bias:
            result.total_variation = xp.asarray(variation)
        if on_success is not None:
            on_success(result, commit)
        return result
    except BaseException:
        if sources is not None and not commit.done:
            sources.undo()
        raise
