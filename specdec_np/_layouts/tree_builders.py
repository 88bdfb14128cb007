"""Draft trees as flat arrays: their record, their validation and their builders.

A batch of draft trees is described by three flat arrays (docs/semantics.md, trees):

* ``num_nodes`` int ``[B]``: the nodes of request ``b`` (``N_b >= 0``, ``N = sum N_b``);
* ``tree_parents`` int ``[N]``: request by request, the parent of each node as an index
  *within its request*, ``-1`` for a child of the root; parents come before children;
* ``draft_token_ids`` int ``[N]``: the token each node proposes.

:func:`validate_tree` checks a layout and returns a :class:`TreeLayout`; :func:`chain_tree`,
:func:`multi_draft_tree` and :func:`from_next_arrays` build one from a chain per request,
from several independent chains per request, and from SGLang's ``retrieve_next_token`` /
``retrieve_next_sibling`` arrays; :func:`best_first_tree` gives the parents of an
EAGLE-2-like shape.  :func:`leaf_paths` and :func:`to_next_arrays` go back.
:mod:`specdec_np._layouts.tree` verifies a batch of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._runtime import arrays as _backend
from .._runtime import checks as _validate

__all__ = [
    "MAX_TREE_DEPTH",
    "RANK_WEIGHTS",
    "TreeLayout",
    "best_first_tree",
    "chain_tree",
    "checked_layout",
    "from_next_arrays",
    "leaf_paths",
    "multi_draft_tree",
    "to_next_arrays",
    "validate_tree",
]

#: The deepest node a tree may hold (a child of the root has depth 1).  The output rows
#: are ``[B, max_depth + 1]`` and the kernels keep the walked path in a fixed buffer, so
#: the depth is bounded; 64 is far above what tree drafters use (EAGLE-2 uses 6 to 10).
MAX_TREE_DEPTH = 64


class TreeLayout(NamedTuple):  # numpydoc ignore=PR01
    """A validated batch of draft trees.

    Attributes
    ----------
    num_nodes : int64 [B]
        Nodes per request, ``N_b >= 0``.
    tree_parents : int64 [N]
        Parent of each node within its request, ``-1`` for a child of the root.
    draft_token_ids : int64 [N]
        The token of each node.
    node_offsets : int64 [B + 1]
        Request ``b`` owns nodes ``node_offsets[b] .. node_offsets[b + 1] - 1``.
    depths : int64 [N]
        Depth of each node, 1 for a child of the root.
    max_nodes : int
        ``max(N_b)``, 0 for an empty batch.
    max_depth : int
        The deepest node of the batch, 0 when there is no node.

    Examples
    --------
    >>> from specdec_np import chain_tree
    >>> layout = chain_tree([[5, 6], [7]])
    >>> layout.batch_size, layout.num_nodes, layout.depths
    (2, array([2, 1]), array([1, 2, 1]))
    >>> layout.children(0), layout.tokens_of(1), layout.target_row(1, -1)
    ([[0], [1], []], [7], 3)
    """

    num_nodes: np.ndarray
    tree_parents: np.ndarray
    draft_token_ids: np.ndarray
    node_offsets: np.ndarray
    depths: np.ndarray
    max_nodes: int
    max_depth: int

    @property
    def batch_size(self) -> int:
        """``B``."""
        return int(self.num_nodes.shape[0])

    def parents_of(self, request: int) -> list[int]:
        """The parents of one request's nodes.

        Parameters
        ----------
        request : int
            A request index in ``[0, B)``.

        Returns
        -------
        list of int
            ``N_b`` parents within the request, ``-1`` for a child of the root.
        """
        start, stop = int(self.node_offsets[request]), int(self.node_offsets[request + 1])
        return [int(parent) for parent in self.tree_parents[start:stop]]

    def tokens_of(self, request: int) -> list[int]:
        """The draft tokens of one request's nodes.

        Parameters
        ----------
        request : int
            A request index in ``[0, B)``.

        Returns
        -------
        list of int
            ``N_b`` token ids, in node order.
        """
        start, stop = int(self.node_offsets[request]), int(self.node_offsets[request + 1])
        return [int(token) for token in self.draft_token_ids[start:stop]]

    def children(self, request: int) -> list[list[int]]:
        """The children lists of one request's tree.

        Parameters
        ----------
        request : int
            A request index in ``[0, B)``.

        Returns
        -------
        list of list of int
            ``N_b + 1`` lists: entry 0 is the root's children, entry ``j + 1`` node ``j``'s;
            each list in node (that is, sibling) order.
        """
        parents = self.parents_of(request)
        children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
        for node, parent in enumerate(parents):
            children[parent + 1].append(node)
        return children

    def target_row(self, request: int, node: int) -> int:
        """The index of a node's row in the ``[N + B, V]`` target rows.

        Parameters
        ----------
        request : int
            A request index in ``[0, B)``.
        node : int
            A node index within the request, or ``-1`` for the root.

        Returns
        -------
        int
            The row: request ``b``'s root row, then one row per node.
        """
        return int(self.node_offsets[request]) + request + 1 + node


def validate_tree(
    num_nodes: Any,
    tree_parents: Any,
    draft_token_ids: Any,
    vocab_size: int | None = None,
    *,
    max_depth: int = MAX_TREE_DEPTH,
) -> TreeLayout:
    """Check a tree layout and describe it.

    Parameters
    ----------
    num_nodes : int [B]
        Nodes per request, each ``>= 0``.
    tree_parents : int [N]
        Parent of each node within its request (``-1``: child of the root); every parent
        must come before its child, which also makes cycles impossible.
    draft_token_ids : int [N]
        The token of each node.
    vocab_size : int, optional
        When given, every token must lie in ``0 .. vocab_size - 1``.
    max_depth : int
        The deepest node allowed (default :data:`MAX_TREE_DEPTH`).

    Returns
    -------
    TreeLayout
        The arrays as private int64 copies, with each request's node offsets and each
        node's depth.

    Raises
    ------
    TypeError
        If an argument has a non-integer type or dtype (masked arrays, matrices included).
    ValueError
        On a negative count, counts that do not sum to ``N``, a parent outside its request
        or not before its node, a token outside the vocabulary, or a node deeper than
        ``max_depth``; node errors name ``(request, node)``.

    Examples
    --------
    >>> from specdec_np import validate_tree
    >>> layout = validate_tree([3], [-1, 0, 0], [4, 5, 6], vocab_size=8)
    >>> layout.depths, layout.max_depth
    (array([1, 2, 2]), 2)
    """
    counts = _validate.host_integers(num_nodes, "num_nodes")
    parents = _validate.host_integers(tree_parents, "tree_parents")
    tokens = _validate.host_integers(draft_token_ids, "draft_token_ids")
    if vocab_size is not None:
        vocab_size = _validate.check_integer("vocab_size", vocab_size, minimum=1)
    max_depth = _validate.check_integer("max_depth", max_depth)
    negative = np.flatnonzero(counts < 0)
    if negative.size:
        b = int(negative[0])
        raise ValueError(f"num_nodes[{b}] must be >= 0; found {int(counts[b])}")
    if counts.size and int(counts.max()) > np.iinfo(np.int64).max // counts.size:
        # Counts this large cannot describe these arrays; summing them could wrap int64.
        raise ValueError(
            f"num_nodes must sum to N = {parents.shape[0]}, the length of tree_parents; "
            f"found sum {sum(int(count) for count in counts)}"
        )
    total = int(counts.sum())
    if parents.shape[0] != total:
        raise ValueError(
            f"tree_parents must have sum(num_nodes) = {total} entries; found {parents.shape[0]}"
        )
    if tokens.shape[0] != total:
        raise ValueError(
            f"draft_token_ids must have sum(num_nodes) = {total} entries; found {tokens.shape[0]}"
        )
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    request = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    local = np.arange(total, dtype=np.int64) - offsets[request]
    outside = (parents < -1) | (parents >= counts[request])
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise ValueError(
            f"tree_parents[{i}] (request {int(request[i])}, node {int(local[i])}) is "
            f"{int(parents[i])}: outside its request, whose nodes are "
            f"0 .. {int(counts[request[i]]) - 1} (-1 for a child of the root)"
        )
    forward = parents >= local
    if forward.any():
        i = int(np.flatnonzero(forward)[0])
        raise ValueError(
            f"tree_parents[{i}] (request {int(request[i])}, node {int(local[i])}) is "
            f"{int(parents[i])}: a parent must come before its node (parents < node index); "
            "this is also what rules out cycles, which can only form through such a pointer"
        )
    if vocab_size is not None:
        bad = (tokens < 0) | (tokens >= vocab_size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"draft_token_ids[{i}] (request {int(request[i])}, node {int(local[i])}) is "
                f"{int(tokens[i])}: outside the vocabulary 0 .. {vocab_size - 1}"
            )
    depths = _depths(np.where(parents >= 0, parents + offsets[request], -1))
    too_deep = depths > max_depth
    if too_deep.any():
        i = int(np.flatnonzero(too_deep)[0])
        raise ValueError(
            f"node {int(local[i])} of request {int(request[i])} (tree_parents[{i}]) has depth "
            f"{int(depths[i])}; the deepest allowed is {max_depth} (MAX_TREE_DEPTH)"
        )
    return TreeLayout(
        num_nodes=counts,
        tree_parents=parents,
        draft_token_ids=tokens,
        node_offsets=offsets,
        depths=depths,
        max_nodes=int(counts.max()) if counts.size else 0,
        max_depth=int(depths.max()) if total else 0,
    )


def checked_layout(
    num_nodes: Any, tree_parents: Any, draft_token_ids: Any, vocab_size: int
) -> TreeLayout:
    """:func:`validate_tree`'s layout from one compiled pass (``_core.tree_layout_is_valid``);
    :func:`validate_tree` itself, whose NumPy passes cost more than a small batch's walk,
    runs only when that pass finds a fault, to say what it is."""
    counts = _validate.host_integers(num_nodes, "num_nodes")
    parents = _validate.host_integers(tree_parents, "tree_parents")
    tokens = _validate.host_integers(draft_token_ids, "draft_token_ids")
    offsets = np.empty(counts.shape[0] + 1, dtype=np.int64)
    depths = np.empty(parents.shape[0], dtype=np.int64)
    if not _core.tree_layout_is_valid(
        counts, parents, tokens, vocab_size, MAX_TREE_DEPTH, offsets, depths
    ):
        return validate_tree(counts, parents, tokens, vocab_size)
    return TreeLayout(
        num_nodes=counts,
        tree_parents=parents,
        draft_token_ids=tokens,
        node_offsets=offsets,
        depths=depths,
        max_nodes=int(counts.max()) if counts.size else 0,
        max_depth=int(depths.max()) if depths.size else 0,
    )


def _depths(global_parents: np.ndarray) -> np.ndarray:
    """Depth of every node (1 for a child of the root) by pointer jumping: each round adds
    the distance to the current ancestor and jumps to that ancestor's, so a chain of depth
    ``D`` takes about ``log2 D`` vectorised rounds instead of a Python loop over nodes."""
    ancestor = global_parents.copy()
    distance = np.ones(global_parents.shape[0], dtype=np.int64)
    while True:
        pending = np.flatnonzero(ancestor >= 0)
        if pending.size == 0:
            return distance
        above = ancestor[pending]
        distance[pending] += distance[above]
        ancestor[pending] = ancestor[above]


def _check_layout_type(layout: Any) -> None:
    if not isinstance(layout, TreeLayout):
        found = type(layout).__name__
        raise TypeError(f"layout must be a TreeLayout (from a tree builder); found {found}")


def _concatenate(per_request: list[tuple[list[int], list[int]]], vocab_size: int | None):
    counts = [len(parents) for parents, _ in per_request]
    parents = [parent for request_parents, _ in per_request for parent in request_parents]
    tokens = [token for _, request_tokens in per_request for token in request_tokens]
    return validate_tree(
        np.asarray(counts, dtype=np.int64),
        np.asarray(parents, dtype=np.int64),
        np.asarray(tokens, dtype=np.int64),
        vocab_size,
    )


def chain_tree(chains: Any, vocab_size: int | None = None) -> TreeLayout:
    """The tree of one draft chain per request: node ``i``'s parent is node ``i - 1``.

    Parameters
    ----------
    chains : int [B, k], or a sequence of ``B`` int sequences (chains may differ in length)
        Request ``b``'s draft tokens in order.
    vocab_size : int, optional
        Checked as in :func:`validate_tree`.

    Returns
    -------
    TreeLayout
        ``num_nodes[b] = len(chains[b])``; its root row and node rows are the chain's target
        rows ``[k_b + 1, V]`` in order, the last one the bonus position.

    Raises
    ------
    TypeError, ValueError
        As :func:`validate_tree`, and for ``chains`` or a chain that is not a sequence (a
        list, a tuple or a plain array) or a token that is not an int, naming it.

    Examples
    --------
    >>> from specdec_np import chain_tree
    >>> chain_tree([[5, 6], [7]]).tree_parents
    array([-1,  0, -1])
    """
    per_request = []
    for b, chain in enumerate(_validate.sequence(chains, "chains", "token-id sequences")):
        chain = _validate.sequence(chain, f"chains[{b}]", "int token ids")
        tokens = [_validate.token_id(token, f"chains[{b}][{i}]") for i, token in enumerate(chain)]
        per_request.append((list(range(-1, len(tokens) - 1)), tokens))
    return _concatenate(per_request, vocab_size)


def multi_draft_tree(drafts: Sequence[Sequence[Any]], vocab_size: int | None = None) -> TreeLayout:
    """The tree of several independent draft chains per request (multi-draft speculation).

    Each chain becomes its own branch: its first token is a child of the root (siblings in
    chain order) and each later token the only child of the one before.  Chains that share a
    prefix are *not* merged: independently drafted children are tested one by one, and
    merging them would change the law they were drawn from.

    Parameters
    ----------
    drafts : sequence of ``B`` sequences of int sequences
        ``drafts[b][c]`` is chain ``c`` of request ``b``; an empty chain adds no node.
    vocab_size : int, optional
        Checked as in :func:`validate_tree`.

    Returns
    -------
    TreeLayout
        The nodes of chain 0, then those of chain 1, and so on, each chain in order.

    Raises
    ------
    TypeError, ValueError
        As :func:`chain_tree`, for ``drafts``, a request's chains, a chain or a token.

    Examples
    --------
    Two chains of one request that share their first token stay two branches:

    >>> from specdec_np import multi_draft_tree
    >>> multi_draft_tree([[[5, 6], [5, 7]]]).tree_parents
    array([-1,  0, -1,  2])
    """
    per_request = []
    for b, request_chains in enumerate(_validate.sequence(drafts, "drafts", "per-request chains")):
        parents: list[int] = []
        tokens: list[int] = []
        request_chains = _validate.sequence(request_chains, f"drafts[{b}]", "token-id sequences")
        for c, chain in enumerate(request_chains):
            previous = -1
            chain = _validate.sequence(chain, f"drafts[{b}][{c}]", "int token ids")
            for i, token in enumerate(chain):
                parents.append(previous)
                tokens.append(_validate.token_id(token, f"drafts[{b}][{c}][{i}]"))
                previous = len(parents) - 1
        per_request.append((parents, tokens))
    return _concatenate(per_request, vocab_size)


#: Sibling-rank weights of :func:`best_first_tree`.
RANK_WEIGHTS = (0.6, 0.25, 0.1)


def best_first_tree(nodes: int, weights: Sequence[float] = RANK_WEIGHTS) -> list[int]:
    """Parents of an EAGLE-2-like tree of ``nodes`` nodes (``-1``: a child of the root).

    Best-first growth: the candidate at sibling rank ``r`` scores its parent's score times
    ``weights[r]`` (the root scores 1), and the ``nodes`` best candidates are kept (ties to
    the earlier candidate), as EAGLE-2 keeps the drafts of highest path probability.  Nodes
    are numbered in the order they are kept, so parents come before their children and
    siblings are in rank order.  A drafter fills the shape with its top-ranked tokens
    (node ``j`` with its parent's rank-``r`` continuation when it is the ``r``-th child).

    Parameters
    ----------
    nodes : int
        ``>= 0``.
    weights : sequence of float
        Non-increasing, in ``(0, 1)``; its length (at least one) is the most children of
        a node.

    Returns
    -------
    list of int, length ``nodes``
        The parents of one request, as :func:`verify_tree`'s ``tree_parents`` takes them
        (``numpy.tile`` them for ``B`` requests of the same shape).

    Raises
    ------
    TypeError, ValueError
        For a ``nodes`` that is not a non-negative int, or ``weights`` that are not a
        non-empty, non-increasing sequence of numbers in ``(0, 1)``, naming the argument.

    Examples
    --------
    >>> from specdec_np import best_first_tree
    >>> best_first_tree(8)
    [-1, 0, -1, 1, 0, 2, 3, -1]
    """
    nodes = _validate.check_integer("nodes", nodes)
    weights = _validate.sequence(weights, "weights", "numbers in (0, 1)")
    for rank, weight in enumerate(weights):
        if isinstance(weight, (bool, np.bool_)) or not isinstance(
            weight, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"weights[{rank}] must be a number; found {type(weight).__name__}")
        if not 0.0 < float(weight) < 1.0 or (rank and float(weight) > float(weights[rank - 1])):
            raise ValueError(
                f"weights must be non-increasing numbers in (0, 1); found {weights!r}"
            )
    if len(weights) == 0:
        raise ValueError("weights must hold at least one number (the most children of a node)")
    parents: list[int] = []
    heap: list[tuple[float, int, int]] = []  # (-score, serial, parent)
    serial = 0
    for weight in weights:
        heapq.heappush(heap, (-float(weight), serial, -1))
        serial += 1
    while len(parents) < nodes:
        negative, _, parent = heapq.heappop(heap)
        parents.append(parent)
        node = len(parents) - 1
        for weight in weights:
            heapq.heappush(heap, (negative * float(weight), serial, node))
            serial += 1
    return parents


def leaf_paths(layout: TreeLayout) -> list[list[list[int]]]:
    """The token paths from the root to every leaf, leaves in node order, per request.

    Parameters
    ----------
    layout : TreeLayout

    Returns
    -------
    list of ``B`` lists of int lists
        The inverse of :func:`chain_tree` (one path, none for an empty chain) and of
        :func:`multi_draft_tree` (the non-empty chains).

    Raises
    ------
    TypeError
        For a ``layout`` that is not a :class:`TreeLayout`.
    """
    _check_layout_type(layout)
    result = []
    for b in range(layout.batch_size):
        parents = layout.parents_of(b)
        tokens = layout.tokens_of(b)
        has_child = [False] * len(parents)
        for parent in parents:
            if parent >= 0:
                has_child[parent] = True
        paths = []
        for node in range(len(parents)):
            if has_child[node]:
                continue
            path = []
            walker = node
            while walker >= 0:
                path.append(tokens[walker])
                walker = parents[walker]
            paths.append(path[::-1])
        result.append(paths)
    return result


def from_next_arrays(
    retrieve_next_token: Any,
    retrieve_next_sibling: Any,
    candidates: Any,
    vocab_size: int | None = None,
) -> tuple[TreeLayout, np.ndarray]:
    """The tree of SGLang's linked-list form (``retrieve_next_token`` / ``retrieve_next_sibling``).

    In that form column 0 of each request is the root (the last verified token) and every
    other column a draft; ``retrieve_next_token[b, i]`` is the first child of column ``i``
    and ``retrieve_next_sibling[b, i]`` the next sibling, ``-1`` for none.  Columns not
    reached from the root are padding and are left out.

    Parameters
    ----------
    retrieve_next_token, retrieve_next_sibling, candidates : int [B, n]
        ``candidates[b, i]`` is column ``i``'s token (column 0 is not read).
    vocab_size : int, optional
        Checked as in :func:`validate_tree`.

    Returns
    -------
    layout : TreeLayout
        Nodes in depth-first order (a node, then its first child's subtree, then its next
        sibling's), which keeps each sibling list in linked order.
    source_columns : int64 [N]
        The SGLang column of every node, to map accepted nodes back.

    Raises
    ------
    TypeError
        For an argument that is not an integer array (masked arrays and ``numpy.matrix``
        included: their mask and 2-d semantics would be ignored) or int.
    ValueError
        If the arrays differ in shape, a link leaves ``1 .. n - 1``, or a column is reached
        twice (a cycle or a shared child).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import from_next_arrays
    >>> layout, columns = from_next_arrays(np.array([[1, 2, -1, -1]]),
    ...                                    np.array([[-1, 3, -1, -1]]),
    ...                                    np.array([[9, 5, 6, 7]]))
    >>> layout.tree_parents, layout.draft_token_ids, columns
    (array([-1,  0, -1]), array([5, 6, 7]), array([1, 2, 3]))
    """
    arrays = {
        "retrieve_next_token": retrieve_next_token,
        "retrieve_next_sibling": retrieve_next_sibling,
        "candidates": candidates,
    }
    for name, value in arrays.items():
        # As the array fronts take arrays in: masked arrays, matrices and non-arrays refused.
        array = arrays[name] = _backend.intake(value, name)
        array = arrays[name] = array.get() if _backend.is_cupy_array(array) else array
        if array.dtype.kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype; found {array.dtype}")
    next_token, next_sibling, tokens = arrays.values()
    for name, array in arrays.items():
        if array.ndim != 2 or array.shape != next_token.shape:
            raise ValueError(
                f"{name} must have the shape [B, n] of retrieve_next_token "
                f"{list(next_token.shape)}; found {list(array.shape)}"
            )
    width = next_token.shape[1]
    per_request = []
    sources: list[int] = []
    for b in range(next_token.shape[0]):
        parents: list[int] = []
        node_tokens: list[int] = []
        seen = [False] * width
        # Explicit stack of (column, parent node): recursion would be as deep as the tree.
        stack: list[tuple[int, int, str]] = []
        first = int(next_token[b, 0]) if width else -1
        if first != -1:
            stack.append((first, -1, f"retrieve_next_token[{b}, 0]"))
        while stack:
            column, parent, link = stack.pop()
            if not 1 <= column < width:
                raise ValueError(
                    f"{link} is {column}: links must point at columns 1 .. {width - 1} or be -1"
                )
            if seen[column]:
                raise ValueError(
                    f"{link} is {column}, a column already in the tree of request {b}: "
                    "the links form a cycle or share a child"
                )
            seen[column] = True
            node = len(parents)
            parents.append(parent)
            node_tokens.append(_validate.token_id(tokens[b, column], f"candidates[{b}, {column}]"))
            sources.append(column)
            sibling = int(next_sibling[b, column])
            if sibling != -1:
                stack.append((sibling, parent, f"retrieve_next_sibling[{b}, {column}]"))
            child = int(next_token[b, column])
            if child != -1:
                stack.append((child, node, f"retrieve_next_token[{b}, {column}]"))
        per_request.append((parents, node_tokens))
    return _concatenate(per_request, vocab_size), np.asarray(sources, dtype=np.int64)


def to_next_arrays(
    layout: TreeLayout, root_token_ids: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGLang's linked-list form of a tree: column 0 the root, node ``j`` in column ``j + 1``.

    Parameters
    ----------
    layout : TreeLayout
        The trees, as the builders or :func:`validate_tree` return them.
    root_token_ids : int [B], optional
        Written into column 0 of ``candidates`` (0 when not given).

    Returns
    -------
    retrieve_next_token, retrieve_next_sibling, candidates : int64 [B, max_nodes + 1]
        ``-1`` for no link and in the padding columns of smaller trees.

    Raises
    ------
    TypeError, ValueError
        For a ``layout`` that is not a :class:`TreeLayout`, or ``root_token_ids`` that are
        not integers (masked arrays and matrices included) of shape ``[B]``.

    Examples
    --------
    >>> from specdec_np import multi_draft_tree, to_next_arrays
    >>> next_token, next_sibling, candidates = to_next_arrays(
    ...     multi_draft_tree([[[5, 6], [7]]]), root_token_ids=[9])
    >>> next_token, next_sibling, candidates
    (array([[ 1,  2, -1, -1]]), array([[-1,  3, -1, -1]]), array([[9, 5, 6, 7]]))
    """
    _check_layout_type(layout)
    batch_size = layout.batch_size
    roots = np.zeros(batch_size, dtype=np.int64)
    if root_token_ids is not None:
        roots = _validate.host_integers(root_token_ids, "root_token_ids")
        if roots.shape != (batch_size,):
            raise ValueError(
                f"root_token_ids must have shape [B] = [{batch_size}]; found shape "
                f"{_validate.shape_text(roots.shape)}"
            )
    width = layout.max_nodes + 1
    next_token = np.full((batch_size, width), -1, dtype=np.int64)
    next_sibling = np.full((batch_size, width), -1, dtype=np.int64)
    candidates = np.full((batch_size, width), -1, dtype=np.int64)
    candidates[:, 0] = roots
    for b in range(batch_size):
        tokens = layout.tokens_of(b)
        candidates[b, 1 : len(tokens) + 1] = tokens
        for column, children in enumerate(layout.children(b)):
            if children:
                next_token[b, column] = children[0] + 1
            for earlier, later in zip(children[:-1], children[1:]):
                next_sibling[b, earlier + 1] = later + 1
    return next_token, next_sibling, candidates
