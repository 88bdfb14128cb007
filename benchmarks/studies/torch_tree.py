"""Torch baseline of tree verification: SGLang's target-only verification (benchmark only).

Written for this benchmark from the published behaviour of SGLang's target-only tree
verification (deterministic candidates, no draft probabilities), not from its code.  Its
cost structure is what the benchmark compares against: **every** row of the tree is
processed before the walk starts:

* from logits, the softmax of all ``N + B`` target rows ``[N + B, V]`` (greedy requests: the
  argmax of every row);
* from probabilities, the rows as given (greedy: the argmax of every row);

then the walk, vectorised over the batch, one depth level and one sibling position at a
time: child ``j`` is accepted when ``u_j < p(x_j) / (1 - m)``, ``m`` the mass of the
siblings already rejected at that node (point-mass candidates removed from the target row
and renormalised); at a node whose children all fail, or at a leaf, the final token is
drawn by inverse CDF from the row with the rejected children's tokens removed.  These are
the semantics of ``specdec_np.verify_tree(method="point_mass")`` (and ``"greedy"``), on the
same uniforms.

torch is never imported by ``specdec_np``; only ``benchmarks/studies/tree.py`` uses this module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["TreeTables", "target_only_tree_verify", "tree_tables"]


class TreeTables(NamedTuple):
    """The tree of a batch in the padded form the walk indexes (built before timing).

    Attributes
    ----------
    children : int64 [B, max_nodes + 1, max_children]
        Children of the root (entry 0) and of node ``j`` (entry ``j + 1``) within the
        request, in sibling order, ``-1`` padded.
    tokens : int64 [B, max_nodes]
        Each node's draft token, ``0`` padded.
    row_base : int64 [B]
        The target row of request ``b``'s root; node ``j``'s row is ``row_base[b] + 1 + j``.
    max_depth : int
    """

    children: torch.Tensor
    tokens: torch.Tensor
    row_base: torch.Tensor
    max_depth: int


def tree_tables(layout: Any) -> TreeTables:
    """:class:`TreeTables` of a ``specdec_np._layouts.tree.TreeLayout``."""
    batch = layout.batch_size
    max_nodes = max(layout.max_nodes, 1)
    lists = [layout.children(b) for b in range(batch)]
    width = max([len(kids) for request in lists for kids in request] + [1])
    children = np.full((batch, max_nodes + 1, width), -1, dtype=np.int64)
    tokens = np.zeros((batch, max_nodes), dtype=np.int64)
    for b, request in enumerate(lists):
        for entry, kids in enumerate(request):
            children[b, entry, : len(kids)] = kids
        own = layout.tokens_of(b)
        tokens[b, : len(own)] = own
    row_base = layout.node_offsets[:-1] + np.arange(batch)
    return TreeTables(
        torch.from_numpy(children),
        torch.from_numpy(tokens),
        torch.from_numpy(np.ascontiguousarray(row_base, dtype=np.int64)),
        int(layout.max_depth),
    )


def target_only_tree_verify(
    tables: TreeTables,
    target_rows: torch.Tensor,
    uniforms: torch.Tensor,
    num_nodes: torch.Tensor,
    *,
    from_logits: bool,
    greedy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a batch of trees the target-only way.

    Parameters
    ----------
    tables : TreeTables
    target_rows : float32 [N + B, V]
        Logits (``from_logits``) or probabilities.
    uniforms : float64 [B, max_nodes + 1]
        Column ``j`` for node ``j``'s test, column ``num_nodes[b]`` for the final token.
    num_nodes : int64 [B]
    from_logits, greedy : bool

    Returns
    -------
    accepted_lengths : int64 [B]
    output_token_ids : int64 [B, max_depth + 1]
        The accepted nodes' tokens, then the final token, ``-1`` padded.
    """
    if greedy:
        scores = target_rows.argmax(dim=-1)
        probs = None
    else:
        probs = torch.softmax(target_rows, dim=-1) if from_logits else target_rows
    children, tokens, row_base = tables.children, tables.tokens, tables.row_base
    batch = row_base.shape[0]
    arange = torch.arange(batch)
    current = torch.zeros(batch, dtype=torch.int64)  # entry in `children`: 0 is the root
    alive = torch.ones(batch, dtype=torch.bool)
    output = torch.full((batch, tables.max_depth + 1), -1, dtype=torch.int64)
    lengths = torch.zeros(batch, dtype=torch.int64)
    final_rows = row_base.clone()
    rejected = torch.full((batch, children.shape[2]), -1, dtype=torch.int64)
    final_rejected = rejected.clone()
    for _depth in range(tables.max_depth + 1):
        if not bool(alive.any()):
            break
        rows = row_base + current
        moved = torch.zeros(batch, dtype=torch.bool)
        next_entry = current.clone()
        removed = torch.zeros(batch, dtype=torch.float64)
        rejected.fill_(-1)
        best = scores[rows] if greedy else None
        for sibling in range(children.shape[2]):
            child = children[arange, current, sibling]
            testing = alive & ~moved & (child >= 0)
            if not bool(testing.any()):
                break
            safe = child.clamp(min=0)
            token = tokens[arange, safe]
            if greedy:
                accept = testing & (token == best)
            else:
                p = probs[rows, token].double()
                u = uniforms[arange, safe]
                accept = testing & (u * (1.0 - removed) < p)
                rejected_now = testing & ~accept
                removed = removed + torch.where(rejected_now, p, 0.0)
                rejected[:, sibling] = torch.where(rejected_now, token, -1)
            output[arange, lengths] = torch.where(accept, token, output[arange, lengths])
            lengths = lengths + accept.long()
            next_entry = torch.where(accept, safe + 1, next_entry)
            moved = moved | accept
        ended = alive & ~moved
        final_rows = torch.where(ended, rows, final_rows)
        if not greedy:
            # The final draw at a node whose children all failed excludes their tokens.
            final_rejected = torch.where(ended.unsqueeze(1), rejected, final_rejected)
        alive = alive & moved
        current = next_entry
    if greedy:
        final = scores[final_rows]
    else:
        residual = probs[final_rows].double()
        for column in range(final_rejected.shape[1]):
            token = final_rejected[:, column]
            has = token >= 0
            residual[arange[has], token[has]] = 0.0
        cumulative = residual.cumsum(dim=-1)
        u_final = uniforms[arange, num_nodes]
        threshold = (u_final * cumulative[:, -1]).unsqueeze(1)
        final = torch.searchsorted(cumulative, threshold, right=True).squeeze(1)
        final = final.clamp(max=residual.shape[1] - 1)
    output[arange, lengths] = final
    return lengths, output
