"""The tree layout: validation and builders from the forms engines hold.

A batch of draft trees is described by three flat arrays (docs/semantics.md, trees):

* ``num_nodes`` int ``[B]``: the nodes of request ``b`` (``N_b >= 0``, ``N = sum N_b``);
* ``tree_parents`` int ``[N]``: request by request, the parent of each node as an index
  *within its request*, ``-1`` for a child of the root; parents come before children;
* ``draft_token_ids`` int ``[N]``: the token each node proposes.

Target rows are ``[N + B, V]``: request ``b`` owns ``N_b + 1`` consecutive rows, its root
row (the law of the first new token) and then one row per node (the law of the token after
that node).  Draft rows, when given, are ``[N, V]``: the distribution node ``j`` was drawn
from.  The children of a node are tried in node order, so node order is sibling order.

:func:`validate_tree` checks a layout and returns a :class:`TreeLayout`; :func:`chain_tree`,
:func:`multi_draft_tree` and :func:`from_next_arrays` build one from a chain per request,
from several independent chains per request, and from SGLang's ``retrieve_next_token`` /
``retrieve_next_sibling`` arrays.  :func:`leaf_paths` and :func:`to_next_arrays` go back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _core, registry
from .._kernels import dispatch as _dispatch
from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import contract as _contract
from .._runtime import results as _results
from . import sampling as _sampling
from . import tree_links as _tree_links
from .engine_call import RowSources, UniformSource, engine_call
from .sampling import SamplingParameters

__all__ = [
    "MAX_TREE_DEPTH",
    "TreeBatch",
    "TreeLayout",
    "chain_tree",
    "from_next_arrays",
    "leaf_paths",
    "multi_draft_tree",
    "to_next_arrays",
    "tree_batch",
    "tree_output_buffers",
    "validate_tree",
    "verify_tree",
]

_GREEDY = registry.get_tree_method("greedy")

#: The arguments whose arrays decide the results' array library.
_DATA_ARGUMENTS = (
    "num_nodes",
    "tree_parents",
    "draft_token_ids",
    "target_logits",
    "target_probs",
    "draft_logits",
    "draft_probs",
)

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


def _checked_layout(
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


class TreeBatch(NamedTuple):
    """Validated, kernel-ready inputs of one tree-verification call.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    device : int or None
    target_rows : float32 or float64 [N + B, V], C-contiguous
    draft_rows : same dtype [N, V] or None
    draft_token_ids : int32 or int64 [N]
        A private copy: the kernel reads it while the caller may write its own.
    tree_parents : int64 [N]
    layout : TreeLayout
        The checked layout (host arrays), with offsets and depths.
    links : TreeLinks
        The child lists the kernel walks (of the private ids), on the rows' device.
    vocab_size : int
    target_name : str
        The target argument's name, for messages.
    """

    xp: Any
    device: Any
    target_rows: Any
    draft_rows: Any
    draft_token_ids: Any
    tree_parents: Any
    layout: TreeLayout
    links: _tree_links.TreeLinks
    vocab_size: int
    target_name: str

    @property
    def kernel_name(self) -> str:
        """The kernel family of tree batches."""
        return "verify_trees"

    @property
    def batch_size(self) -> int:
        """``B``."""
        return self.layout.batch_size

    def kernel_inputs(self) -> tuple[Any, ...]:
        """``_core.verify_trees``'s arguments between the code and the uniforms."""
        point_mass = self.draft_rows is None
        return (
            self.target_rows,
            self.target_rows if point_mass else self.draft_rows,
            point_mass,
            self.draft_token_ids,
            self.tree_parents,
            self.xp.asarray(self.layout.node_offsets),
            *self.links,
        )

    def check_ids(self) -> None:
        """Nothing to do: the layout check read every id before anything is drawn."""

    def result(self, block: _contract.TreeOutputBlock) -> _results.TreeVerificationResult:
        """The result of a call whose kernel wrote ``block``."""
        layout = self.layout
        nodes, output = block.accepted_nodes, block.output_token_ids
        if nodes.shape[1] != layout.max_depth:
            # Caller's buffers deeper than this batch: the kernel padded them with -1.
            nodes = nodes[:, : layout.max_depth]
            output = output[:, : layout.max_depth + 1]
        return _results.TreeVerificationResult(
            nodes, output, block.accepted_lengths, int(layout.node_offsets[-1])
        )

    def raise_for_row_status(self, first_bad_row: int, row_status: Any) -> None:
        """The kernel's status of request ``first_bad_row`` as a ``ValueError``."""
        request, status = first_bad_row, int(row_status[first_bad_row])
        _contract.raise_for_kernel_status(status, request)
        if status > 0:
            node = status - 1
            start = int(self.layout.node_offsets[request])
            raise ValueError(
                f"draft_token_ids[{start + node}] (request {request}, node {node}) is "
                f"{int(self.draft_token_ids[start + node])}: outside the vocabulary "
                f"0 .. {self.vocab_size - 1}"
            )
        node = -status - 2
        raise ValueError(
            f"{self.target_name} row {self.layout.target_row(request, node)} (request "
            f"{request}, {'the root' if node < 0 else f'node {node}'}) has no positive "
            "probability to draw the final token from"
        )


def tree_batch(
    num_nodes: Any,
    tree_parents: Any,
    draft_token_ids: Any,
    target_rows: Any,
    draft_rows: Any,
    *,
    strict: bool,
    reads_draft_probs: bool,
    target_name: str = "target_probs",
    draft_name: str = "draft_probs",
) -> TreeBatch:
    """Take a batch of trees in, check it and make it kernel-ready.

    Parameters
    ----------
    num_nodes : int [B]
    tree_parents : int [N]
    draft_token_ids : int64 or int32 [N]
    target_rows : float32 or float64 [N + B, V]
        Per request its root row, then one row per node.
    draft_rows : same dtype [N, V] or None
    strict : bool
        Also exact dtypes (float32 rows, int64 ids).
    reads_draft_probs : bool
        False: ``draft_rows`` is not read (and not checked).
    target_name, draft_name : str
        The arguments' names in messages.

    Returns
    -------
    TreeBatch

    Raises
    ------
    TypeError, ValueError
        As :func:`validate_tree` and the chain layouts do, naming the argument.
    """
    target = _backend.intake(target_rows, target_name)
    ids = _backend.intake(draft_token_ids, "draft_token_ids", like=target)
    drafts = _backend.intake_if_read(draft_rows, draft_name, reads_draft_probs, like=target)
    device = _backend.check_one_device(
        {target_name: target, "draft_token_ids": ids, draft_name: drafts}
    )
    xp = _backend.array_namespace(target)
    if target.ndim != 2 or target.shape[1] < 1:
        raise ValueError(
            f"{target_name} must have shape [N + B, V] with V >= 1; found shape "
            f"{_validate.shape_text(target.shape)}"
        )
    vocab_size = int(target.shape[1])
    # The kernel reads a private copy, checked here: a caller writing its own array during
    # the call cannot change what was checked.
    (private_ids,) = _backend.token_ids({"draft_token_ids": ids}, xp, strict)
    layout = _checked_layout(
        num_nodes, tree_parents, private_ids.get() if xp is not np else private_ids, vocab_size
    )
    total = int(layout.node_offsets[-1])
    if target.shape[0] != total + layout.batch_size:
        raise ValueError(
            f"{target_name} must have shape [N + B, V] = [{total + layout.batch_size}, V] "
            f"(N = sum of num_nodes); found shape {_validate.shape_text(target.shape)}"
        )
    if drafts is not None and tuple(drafts.shape) != (total, vocab_size):
        raise ValueError(
            f"{draft_name} must have shape [N, V] = [{total}, {vocab_size}]; found shape "
            f"{_validate.shape_text(drafts.shape)}"
        )
    target, drafts = _backend.kernel_rows(target, drafts, target_name, draft_name, xp, strict)
    # From the layout's ids, the private copy's values: the kernel compares those.
    links = _tree_links.tree_links(
        layout.node_offsets, layout.tree_parents, layout.draft_token_ids
    )
    return TreeBatch(
        xp=xp,
        device=device,
        target_rows=target,
        draft_rows=drafts,
        draft_token_ids=private_ids,
        tree_parents=xp.asarray(layout.tree_parents),
        layout=layout,
        links=_tree_links.TreeLinks(*(xp.asarray(link) for link in links)),
        vocab_size=vocab_size,
        target_name=target_name,
    )


def tree_output_buffers(
    batch_size: int, max_depth: int, xp: Any = np
) -> _contract.TreeOutputBlock:
    """Buffers for ``verify_tree(..., out=...)``, so that a steady-state engine allocates
    nothing per call.

    Parameters
    ----------
    batch_size : int
        ``B``.
    max_depth : int
        The deepest tree the buffers must hold.
    xp : module
        ``numpy`` or ``cupy`` (on the current device).

    Returns
    -------
    TreeOutputBlock
        ``accepted_nodes`` int64 ``[B, max_depth]``, ``output_token_ids`` int64
        ``[B, max_depth + 1]`` and two int64 ``[B]`` arrays (accepted lengths, row status).

    Raises
    ------
    TypeError, ValueError
        For a size that is not a non-negative int (floats, even ``2.0``, included).
    """
    return _contract.allocate_tree_output_block(
        xp,
        _validate.check_integer("batch_size", batch_size),
        _validate.check_integer("max_depth", max_depth),
    )


@_backend.array_front(
    device_from=("target_probs", "target_logits"), library_from=_DATA_ARGUMENTS
)
def verify_tree(
    *,
    num_nodes: Any,
    tree_parents: Any,
    draft_token_ids: Any,
    target_logits: Any = None,
    target_probs: Any = None,
    draft_logits: Any = None,
    draft_probs: Any = None,
    method: str = "point_mass",
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
    out: _contract.TreeOutputBlock | None = None,
) -> _results.TreeVerificationResult:
    """Verify a batch of draft trees (EAGLE, Medusa, SpecInfer, multi-draft).

    Parameters
    ----------
    num_nodes : int array [B]
        ``N_b >= 0`` nodes per request.
    tree_parents : int array [N], ``N = sum N_b``
        Each node's parent as an index within its request, ``-1`` for a child of the root;
        a parent comes before its children.  Siblings are tried in node order.
    draft_token_ids : int64 or int32 [N]
        The token each node proposes.
    target_logits : float32 or float64 [N + B, V], optional
        Per request its root row (the law of the first new token), then one row per node
        (the law of the token after it), as logits; each row the walk reads is processed
        with the request's ``temperature``, ``min_p``, ``top_k`` and ``top_p`` (exactly one
        of ``target_logits`` and ``target_probs``).
    target_probs : float32 or float64 [N + B, V], optional
        The same rows as probabilities, taken as already processed.
    draft_logits, draft_probs : same dtype [N, V], optional
        The distribution each node was drawn from (``"specinfer"``, ``"rrs"``), as logits
        or probabilities; None for deterministic candidates.
    method : str, default "point_mass"
        A tree method (``specdec_np.registry.TREE_METHODS``): ``"greedy"``,
        ``"point_mass"`` (lossless whatever drew the children), ``"specinfer"``
        (children drawn independently from their rows) or ``"rrs"`` (siblings drawn
        without replacement from one row).  The walks are in ``docs/semantics.md``.
    temperature : scalar or array [B], optional
        ``0`` walks a request greedily on its raw rows, the others by ``method``.  With
        logits it also scales them.
    top_k, top_p, min_p : scalar or array [B], optional
        Sampling filters of logits rows; a ValueError with probabilities.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters, as in :func:`specdec_np.verify_ragged`.
    uniforms : float64 [B, max_nodes + 1], optional
        Request ``b`` uses column ``j`` for node ``j``'s test and column ``N_b`` for the
        final token.
    generator : numpy.random.Generator, optional
        Source of the uniforms of requests without a seed of their own; a fresh unseeded
        generator if None.
    seeded_seqs : dict[int, numpy.random.Generator], optional
        Request index -> that request's generator.
    counter_seeds : dict[int, tuple[int, int]], optional
        Request index -> ``(seed, position)``: counter-based Philox uniforms (see
        :func:`specdec_np.counter_uniforms`).  A sampled request consumes exactly
        ``N_b + 1`` draws from its source whatever the walk, a greedy one none.
    strict_mode : bool
        Also check exact dtypes and finite (non-negative) row values.
    out : TreeOutputBlock, optional
        Buffers from :func:`tree_output_buffers` to write into.

    Returns
    -------
    TreeVerificationResult
        ``accepted_nodes`` int64 ``[B, max_depth]``, ``output_token_ids`` int64
        ``[B, max_depth + 1]`` (both ``-1`` padded; ``max_depth`` the deepest node of the
        batch) and ``accepted_lengths`` int64 ``[B]``.

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument and ``(request, node)``, before any uniform is
        drawn.
    """
    return engine_call(
        TreeCall(method, num_nodes, tree_parents, draft_token_ids),
        RowSources(target_logits, target_probs, draft_logits, draft_probs),
        SamplingParameters(temperature, top_k, top_p, min_p, filter_order),
        UniformSource(uniforms, generator, seeded_seqs, counter_seeds),
        strict_mode=strict_mode,
        out=out,
    )


class TreeCall:
    """Draft trees as :func:`~specdec_np._layouts.engine_call.engine_call` sees them.

    Parameters
    ----------
    method : str
        The registry name of the sampled requests' tree method.
    num_nodes, tree_parents, draft_token_ids
        As :func:`verify_tree` takes them.
    """

    greedy_entry = _GREEDY

    def __init__(
        self, method: str, num_nodes: Any, tree_parents: Any, draft_token_ids: Any
    ) -> None:
        self.entry = registry.get_tree_method(method)
        self.every_request_greedy = not self.entry.stochastic
        self._num_nodes = num_nodes
        self._tree_parents = tree_parents
        self._draft_token_ids = draft_token_ids

    def build(self, form: _sampling.RowForm, strict: bool) -> TreeBatch:
        """The checked batch (:func:`tree_batch`)."""
        return tree_batch(
            self._num_nodes,
            self._tree_parents,
            self._draft_token_ids,
            form.target,
            form.draft,
            strict=strict,
            reads_draft_probs=self.entry.reads_draft_probs,
            target_name=form.target_name,
            draft_name=form.draft_name,
        )

    def check_rows(
        self, batch: TreeBatch, form: _sampling.RowForm, greedy: Any, strict: bool
    ) -> None:
        """Nothing beyond :func:`tree_batch`'s checks."""

    def uniform_rows(self, batch: TreeBatch, greedy: Any) -> dict[str, Any]:
        """A sampled request's ``N_b + 1`` draws, a greedy one's none, stored flat."""
        layout = batch.layout
        return {
            "k": layout.max_nodes,
            "row_widths": np.where(greedy, 0, layout.num_nodes + 1),
            # Flat: request b's N_b + 1 uniforms from node_offsets[b] + b on, so that one
            # big tree in a batch of small ones costs its own size, not B times it.
            "row_offsets": layout.node_offsets + np.arange(layout.batch_size + 1),
        }

    def rows_per_request(self, batch: TreeBatch) -> tuple[np.ndarray, np.ndarray]:
        """A request's ``N_b + 1`` target rows and ``N_b`` draft rows."""
        return batch.layout.num_nodes + 1, batch.layout.num_nodes

    def output_block(
        self, batch: TreeBatch, out: Any, inputs: dict[str, Any]
    ) -> _contract.TreeOutputBlock:
        """``out`` checked (:func:`tree_output_buffers`), or a new block; the block the
        kernel writes has the trees' own depth (:meth:`finish` copies it into a deeper
        ``out``)."""
        if out is None:
            self._block = _contract.allocate_tree_output_block(
                batch.xp, batch.layout.batch_size, batch.layout.max_depth
            )
        else:
            self._block = _check_tree_out(out, batch, inputs)
        return _contract.tree_kernel_block(self._block, batch.layout, batch.device, batch.xp)

    def threads(self, batch: TreeBatch, chosen: Any) -> int:
        """Threads by the rows a walk reads (a target and a draft row per node)."""
        return _backend.thread_count(batch.layout.batch_size, 2 * batch.vocab_size)

    def layout_options(
        self, batch: TreeBatch, block: Any, threads: int, chosen: Any, options: dict[str, Any]
    ) -> None:
        """The working rows of stochastic walks."""
        if chosen.stochastic or "request_methods" in options:
            # The residual and its update (traversal: a residual per level of the path
            # too): allocated once per call, not per node.
            # By the trees' depth, never by out's.
            rows = _dispatch.working_rows(batch.device, threads, batch.layout.batch_size)
            width = self.entry.working_rows(batch.layout.max_depth) * batch.vocab_size
            options["working"] = batch.xp.empty((rows, width), dtype=batch.xp.float64)

    def after_uniforms(self, batch: TreeBatch, chosen: Any) -> tuple[Any, ...]:
        """Tree methods take no parameters."""
        return ()

    def recorder(self, batch: TreeBatch) -> None:
        """The tree front records nothing."""
        return None

    def finish(self, batch: TreeBatch, result: Any) -> Any:
        """The result in the caller's block (a deeper ``out`` is filled and padded)."""
        if result.accepted_nodes is self._block.accepted_nodes:
            return result
        _contract.fill_deeper_tree_block(self._block, result, batch.layout.max_depth)
        return batch.result(self._block)


def _check_tree_out(
    out: Any, batch: TreeBatch, inputs: dict[str, Any]
) -> _contract.TreeOutputBlock:
    layout = batch.layout

    def shapes(block: _contract.TreeOutputBlock) -> dict[str, tuple[int, ...]]:
        found = tuple(block.accepted_nodes.shape)
        if len(found) != 2 or found[0] != layout.batch_size or found[1] < layout.max_depth:
            raise ValueError(
                f"out must hold [B, >= max depth] = [{layout.batch_size}, {layout.max_depth}] "
                f"nodes; found {_validate.shape_text(found)}"
            )
        rows, depth = found
        return {
            "accepted_nodes": (rows, depth),
            "output_token_ids": (rows, depth + 1),
            "accepted_lengths": (rows,),
            "row_status": (rows,),
        }

    xp = batch.xp
    _validate.check_out_block(
        out,
        _contract.TreeOutputBlock,
        "tree_output_buffers(B, max_depth)",
        shapes,
        lambda array: _backend.is_array_of(array, xp),
        _backend.device_of,
        batch.device,
        xp,
        inputs,
    )
    return out
