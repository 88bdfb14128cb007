"""Tree links: each node's children as linked lists, so that a walk finds them in O(1).

A tree step visits a node's children in node order and asks of each whether an earlier
sibling proposed the same token (docs/semantics.md, trees).  Scanning the request for them
costs O(N_b) per child; the links below are computed once per call, in O(N log N) with
NumPy, and turn both questions into one array read.  The kernels of both backends take
them next to the parents.  A batch whose sibling lists hold few distinct tokens (the common
case) gets the same links from one compiled O(N) pass, without the sorts' fixed costs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import _core


class TreeLinks(NamedTuple):  # numpydoc ignore=PR01
    """The children of every node of a tree batch, as linked lists in node order.

    Indices are node indices within the request, like ``tree_parents``; ``-1`` ends a list.

    Attributes
    ----------
    first_child : int64 [N + B]
        Request ``b``'s node ``i`` (``-1``: the root) at ``node_offsets[b] + b + i + 1``:
        its first child, or ``-1`` for a leaf (the flat layout of the tree uniforms).
    next_sibling : int64 [N]
        The next child of the node's parent, or ``-1``.
    next_distinct_sibling : int64 [N]
        For a node whose token no earlier sibling proposed: the next such sibling, or
        ``-1``.  A node's distinct children are its first child, then this list.  ``-1``
        for a repeated node (never read).
    repeated_token : int8 [N]
        1 when an earlier sibling proposed the same token, else 0.
    """

    first_child: np.ndarray
    next_sibling: np.ndarray
    next_distinct_sibling: np.ndarray
    repeated_token: np.ndarray


def _chain(order: np.ndarray, parent_slot: np.ndarray, local: np.ndarray) -> np.ndarray:
    """``next[j]``: the node after ``order``'s entry ``j`` among those of the same parent
    slot (``order`` groups the slots, in node order within each), or -1."""
    following = np.full(local.shape[0], -1, dtype=np.int64)
    slots = parent_slot[order]
    same = slots[1:] == slots[:-1]
    following[order[:-1][same]] = local[order[1:][same]]
    return following


def tree_links(node_offsets: Any, tree_parents: Any, draft_token_ids: Any) -> TreeLinks:
    """The child lists of a checked tree batch, in O(N log N) and no Python loop over nodes.

    Parameters
    ----------
    node_offsets : int [B + 1]
        Request ``b`` owns nodes ``node_offsets[b] .. node_offsets[b + 1] - 1``; a valid
        layout (:func:`specdec_np._layouts.tree.validate_tree`'s offsets).
    tree_parents : int [N]
        Each node's parent within its request (``-1``: the root), below its index.
    draft_token_ids : int [N]
        The token of each node: the private copy the kernel reads, since the repeated
        siblings are those of these values.  Tokens are only compared (any value).

    Returns
    -------
    TreeLinks
        Host arrays; the kernels check in O(N) that the lists stay inside each request and
        agree with the parents, so wrong links can never make them read out of bounds.
    """
    offsets = np.ascontiguousarray(node_offsets, dtype=np.int64)
    parents = np.ascontiguousarray(tree_parents, dtype=np.int64)
    tokens = np.ascontiguousarray(draft_token_ids, dtype=np.int64)
    batch, total = offsets.shape[0] - 1, parents.shape[0]
    links = TreeLinks(
        np.empty(total + batch, dtype=np.int64),
        np.empty(total, dtype=np.int64),
        np.empty(total, dtype=np.int64),
        np.empty(total, dtype=np.int8),
    )
    if _core.small_tree_links(offsets, parents, tokens, *links):
        return links
    return _sorted_links(offsets, parents, tokens)


def _sorted_links(offsets: np.ndarray, parents: np.ndarray, tokens: np.ndarray) -> TreeLinks:
    """:func:`tree_links` by NumPy's stable sorts: O(N log N) whatever the tokens."""
    batch, total = offsets.shape[0] - 1, parents.shape[0]
    request = np.repeat(np.arange(batch, dtype=np.int64), np.diff(offsets))
    local = np.arange(total, dtype=np.int64) - offsets[request]
    # The parent's entry in first_child; a stable sort keeps siblings in node order.
    parent_slot = offsets[request] + request + parents + 1
    order = np.argsort(parent_slot, kind="stable")
    leaders = np.ones(total, dtype=bool)
    leaders[1:] = parent_slot[order[1:]] != parent_slot[order[:-1]]
    first_child = np.full(total + batch, -1, dtype=np.int64)
    first_child[parent_slot[order[leaders]]] = local[order[leaders]]
    # Siblings grouped by token, in node order within a token (lexsort is stable): all but
    # the first of each group repeat an earlier sibling's token.
    by_token = np.lexsort((tokens, parent_slot))
    repeated = np.zeros(total, dtype=np.int8)
    same_token = (parent_slot[by_token[1:]] == parent_slot[by_token[:-1]]) & (
        tokens[by_token[1:]] == tokens[by_token[:-1]]
    )
    repeated[by_token[1:][same_token]] = 1
    distinct = order[repeated[order] == 0]
    return TreeLinks(
        first_child=first_child,
        next_sibling=_chain(order, parent_slot, local),
        next_distinct_sibling=_chain(distinct, parent_slot, local),
        repeated_token=repeated,
    )
