"""The tree layout: a batch of draft trees, checked and verified (:func:`verify_tree`).

A batch of draft trees is described by three flat arrays (docs/semantics.md, trees):

* ``num_nodes`` int ``[B]``: the nodes of request ``b`` (``N_b >= 0``, ``N = sum N_b``);
* ``tree_parents`` int ``[N]``: request by request, the parent of each node as an index
  *within its request*, ``-1`` for a child of the root; parents come before children;
* ``draft_token_ids`` int ``[N]``: the token each node proposes.

Target rows are ``[N + B, V]``: request ``b`` owns ``N_b + 1`` consecutive rows, its root
row (the law of the first new token) and then one row per node (the law of the token after
that node).  Draft rows, when given, are ``[N, V]``: the distribution node ``j`` was drawn
from.  The children of a node are tried in node order, so node order is sibling order.

The trees themselves (:class:`TreeLayout`, :func:`validate_tree` and the builders) live in
:mod:`specdec_np._layouts.tree_builders`; this module makes a batch of them kernel-ready
(:func:`tree_batch`) and verifies it through the engine call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import registry
from .._kernels import dispatch as _dispatch
from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import contract as _contract
from .._runtime import results as _results
from . import sampling as _sampling
from . import surface as _surface
from . import tree_links as _tree_links
from .engine_call import RowSources, UniformSource, engine_call
from .sampling import SamplingParameters
from .tree_builders import (
    MAX_TREE_DEPTH,
    TreeLayout,
    chain_tree,
    checked_layout,
    from_next_arrays,
    leaf_paths,
    multi_draft_tree,
    to_next_arrays,
    validate_tree,
)

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
_POINT_MASS = registry.get_tree_method("point_mass")

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
    layout = checked_layout(
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

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import tree_output_buffers, verify_tree
    >>> out = tree_output_buffers(batch_size=1, max_depth=4)
    >>> result = verify_tree(num_nodes=[1], tree_parents=[-1], draft_token_ids=[1],
    ...                      target_probs=np.array([[0.2, 0.8], [0.6, 0.4]]), method="greedy",
    ...                      out=out)
    >>> result.output_token_ids, np.shares_memory(result.output_token_ids, out.output_token_ids)
    (array([[1, 0]]), True)
    """
    return _contract.allocate_tree_output_block(
        xp,
        _validate.check_integer("batch_size", batch_size),
        _validate.check_integer("max_depth", max_depth),
    )


@_backend.array_front(
    device_from=("target_probs", "target_logits"), library_from=_DATA_ARGUMENTS
)
@registry.document_methods
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
    stream: str = "verify",
    strict_mode: bool = False,
    out: _contract.TreeOutputBlock | None = None,
    prompt_token_ids: Any = None,
    output_token_ids: Any = None,
    repetition_penalty: Any = None,
    frequency_penalty: Any = None,
    presence_penalty: Any = None,
    logit_bias: Any = None,
    allowed_token_ids: Any = None,
    bad_words_token_ids: Any = None,
    min_tokens: Any = None,
    stop_token_ids: Any = None,
    max_tokens: Any = None,
    token_bitmask: Any = None,
    logprobs: int | None = None,
    report_bias: bool = False,
    **method_parameters: Any,
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
        The distribution each node was drawn from, as logits or probabilities.
        [[tree methods reading draft rows]]
    method : str, default "point_mass"
        A tree method of ``specdec_np.registry.TREE_METHODS`` (the walks are in
        ``docs/semantics.md``; ``"traversal"`` is the recommended lossless one):

        [[tree methods]]

        Or a relaxed (lossy) method that runs on trees, with its keyword parameters
        (``docs/semantics.md`` section 14a):

        [[relaxed tree methods]]
    temperature : scalar or array [B], optional
        ``0`` walks a request greedily on its raw rows, the others by ``method``.  With
        logits it also scales them.
    top_k, top_p, min_p : scalar or array [B], optional
        Sampling filters of logits rows; a ValueError with probabilities.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters, as in :func:`specdec_np.verify_ragged`.
    uniforms : float64 or float32 [B, max_nodes + 1], optional
        Explicit uniforms in ``[0, 1)`` (float32 is widened exactly): request ``b`` uses
        column ``j`` for node ``j``'s test and column ``N_b`` for the final token.
    generator : numpy.random.Generator, optional
        Source of the uniforms of requests without a seed of their own; a fresh unseeded
        generator if None.
    seeded_seqs : dict[int, numpy.random.Generator], optional
        Request index -> that request's generator.
    counter_seeds : dict[int, tuple[int, int]], optional
        Request index -> ``(seed, position)``: counter-based Philox uniforms (see
        :func:`specdec_np.counter_uniforms`).  A sampled request consumes exactly
        ``N_b + 1`` draws from its source whatever the walk, a greedy one none.
    stream : {"verify", "draft"}
        The counter domain of the ``counter_seeds`` requests (the fourth Philox counter
        word; :func:`specdec_np.counter_uniforms`): ``"verify"``, the default, for the
        acceptance tests and the tokens drawn here; ``"draft"`` only where the call draws
        a drafter's tokens.  The two domains never share a Philox block, so a drafter
        that draws from ``"draft"`` never shares noise with the verification of its
        drafts under the same ``(seed, position)``.  Rows of the other sources ignore it.
    strict_mode : bool
        Also check exact dtypes and finite (non-negative) row values.
    out : TreeOutputBlock, optional
        Buffers from :func:`tree_output_buffers` to write into.
    prompt_token_ids, output_token_ids, repetition_penalty, frequency_penalty, \
presence_penalty, logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, \
stop_token_ids, max_tokens, token_bitmask, logprobs : optional
        The whole sampling surface of :func:`specdec_np.verify_ragged`; a node's row has
        the node's ancestors and the node itself as the drafts before it, the root row
        none; ``token_bitmask`` is ``[N + B, ceil(V / 32)]`` and a node's draft row takes
        its parent's row's mask.
    report_bias : bool
        Also give the result's ``total_variation`` (float64 ``[B, max_depth + 1]``): the
        bias per emitted position, as :func:`specdec_np.verify_ragged` measures it; every
        tree method is lossless or greedy, so it is 0 along the emitted path and NaN
        after it; a relaxed method's is measured at each depth for the candidates as
        given.
    **method_parameters : float
        A relaxed method's parameters (``threshold_single``, ``threshold_acc``).

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

    Examples
    --------
    One request whose root has two candidate children, tokens 1 and 2; rows are the root's,
    then one per node.  Point-mass candidates with explicit uniforms: token 1 fails (``0.5 >=
    0.2``), token 2 passes against the root row without token 1, and node 1's row gives the
    final token:

    >>> import numpy as np
    >>> from specdec_np import verify_tree
    >>> probs = np.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4], [0.6, 0.3, 0.1]])
    >>> result = verify_tree(num_nodes=np.array([2]), tree_parents=np.array([-1, -1]),
    ...                      draft_token_ids=np.array([1, 2]), target_probs=probs,
    ...                      uniforms=np.array([[0.5, 0.5, 0.5]]))
    >>> result.accepted_nodes, result.output_token_ids
    (array([[1]]), array([[2, 0]]))
    """
    return engine_call(
        TreeCall(method, num_nodes, tree_parents, draft_token_ids, method_parameters),
        RowSources(target_logits, target_probs, draft_logits, draft_probs),
        SamplingParameters(
            temperature, top_k, top_p, min_p, filter_order, prompt_token_ids,
            output_token_ids, repetition_penalty, frequency_penalty, presence_penalty,
            logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids,
            max_tokens, token_bitmask, logprobs,
        ),
        UniformSource(uniforms, generator, seeded_seqs, counter_seeds, stream=stream),
        strict_mode=strict_mode,
        out=out,
        report_bias=report_bias,
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
        self, method: str, num_nodes: Any, tree_parents: Any, draft_token_ids: Any,
        method_parameters: Mapping[str, Any] | None = None,
    ) -> None:
        given = dict(method_parameters or {})
        #: The relaxed (lossy) tree method of the call, or None: a relaxed call builds its
        #: batch as a point-mass call does and runs
        #: :func:`specdec_np._relaxed.runner.run` instead of a kernel.
        self.relaxed: registry.RelaxedMethod | None = None
        self.relaxed_parameters: dict[str, Any] = {}
        self._given = given
        found = registry.chain_method(method) if method in registry.relaxed_names(
            tree=True) else None
        if isinstance(found, registry.RelaxedMethod):
            self.relaxed = found
            self.entry = _POINT_MASS
            unknown = set(given).difference(self.relaxed.parameter_names)
            if unknown:
                _validate.check_relaxed_parameters(self.relaxed, given, 0, 0, 1)
        else:
            self.entry = registry.get_tree_method(method)
            if given:
                raise TypeError(
                    f"verify_tree() got unexpected keyword argument(s) "
                    f"{', '.join(sorted(given))}; tree method {method!r} takes none"
                )
        self.every_request_greedy = not self.entry.stochastic
        self._num_nodes = num_nodes
        self._tree_parents = tree_parents
        self._draft_token_ids = draft_token_ids

    def build(self, form: _sampling.RowForm, strict: bool) -> TreeBatch:
        """The checked batch (:func:`tree_batch`), and a relaxed method's parameters."""
        batch = tree_batch(
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
        if self.relaxed is not None:
            self.relaxed_parameters = _validate.check_relaxed_parameters(
                self.relaxed, self._given, batch.batch_size, batch.layout.max_depth,
                batch.vocab_size,
            )
        return batch

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

    def surface_contexts(self, batch: TreeBatch) -> _surface.RowContexts:
        """A node's row follows its ancestors and itself, the root row nothing; a node's
        draft row shares its parent's row (the root row for a child of the root)."""
        layout = batch.layout
        requests: list[int] = []
        prefixes: list[np.ndarray] = []
        draft_targets: list[int] = []
        for b in range(layout.batch_size):
            start = int(layout.node_offsets[b])
            root = len(requests)
            requests.append(b)
            prefixes.append(np.zeros(0, dtype=np.int64))
            for j in range(int(layout.num_nodes[b])):
                parent = int(layout.tree_parents[start + j])
                parent_row = root if parent < 0 else root + 1 + parent
                draft_targets.append(parent_row)
                requests.append(b)
                prefixes.append(np.append(prefixes[parent_row], layout.draft_token_ids[start + j]))
        return _surface.RowContexts(
            np.asarray(requests, dtype=np.int64), prefixes, np.asarray(draft_targets, np.int64)
        )

    def emitted_rows(self, batch: TreeBatch, result: Any) -> np.ndarray:
        """Position 0 was drawn from the root row, position ``i`` from the row of the
        ``i``-th accepted node."""
        layout = batch.layout
        nodes = result.accepted_nodes
        nodes = np.asarray(nodes.get() if hasattr(nodes, "get") else nodes)
        width = int(result.output_token_ids.shape[1])
        roots = layout.node_offsets[:-1] + np.arange(layout.batch_size)
        rows = np.full((layout.batch_size, width), -1, dtype=np.int64)
        rows[:, 0] = roots
        depth = min(width - 1, nodes.shape[1])
        rows[:, 1 : depth + 1] = np.where(
            nodes[:, :depth] >= 0, roots[:, None] + 1 + nodes[:, :depth], -1
        )
        return rows


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
