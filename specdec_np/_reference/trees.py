"""The oracle of tree verification: a readable walk, and the exact law it must have.

:func:`verify_tree` walks each request's tree with explicit uniforms, on any namespace of
the Python array API (NumPy, CuPy, ``array_api_strict``), one request at a time and with
none of the shortcuts of the fast kernels; the kernels are tested against it.

:func:`tree_emission_law` and :func:`tree_output_law` compute, by exact enumeration, the
law of what a method emits on small trees whose draft tokens are themselves random (drawn
as a drafter would draw them), with the uniforms integrated out: each node's test enters
through its acceptance probability and the final token through its residual law.  A
lossless method's output, continued by the target past its end, has the target's law over
every prefix length; the tests check exactly that.

The walk, shared by every method (docs/semantics.md, trees): start at the root with the
residual ``r`` equal to the root's target row (taken as normalised, as the chain verifiers
take their rows).  Try the current node's children in node order:

* ``"greedy"``: descend into the first child whose token is ``argmax p`` (first index on
  ties); if none is, emit ``argmax p``.  No uniform is read.
* ``"point_mass"``: accept child ``j`` iff ``u_j < r(x_j)``; on rejection ``x_j`` is removed
  from ``r`` and ``r`` renormalised.  Draft rows are not read.
* ``"specinfer"``: accept iff ``u_j * q_j(x_j) < r(x_j)`` (that is ``u_j < min(1, r/q_j)``,
  with the chain verifier's edge cases); on rejection ``r <- (r - q_j)+`` renormalised.
* ``"rrs"``: the same with ``q_j`` = node ``j``'s draft row with the tokens of the siblings
  tried before it removed and renormalised (the siblings were drawn without replacement
  from that one row, which every sibling carries).

Without draft rows, ``"specinfer"`` and ``"rrs"`` take point-mass drafts and walk exactly as
``"point_mass"``.  An accepted child becomes the current node with its own target row and a
fresh residual; at a node whose children all fail, or at a leaf, one token is drawn from
``r`` by inverse CDF with the request's last uniform (as the chain verifiers draw their
residual) and the walk ends.  A rejection that leaves ``(r - q_j)+`` without positive mass
(possible only through rounding) leaves ``r`` as it was, which on a chain is the chain
verifier's draw from the target row.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import registry
from .._layouts.tree import validate_tree
from . import traversal as _traversal_reference
from .chains import _per_request, _process_request_rows, residual_draw
from .surface import adjust_logits, cut_run, reference_logprobs, request_setting

__all__ = [
    "continued_law",
    "expected_accepted_length",
    "greedy_tree_walk",
    "point_mass_tree_law",
    "point_mass_tree_walk",
    "rrs_tree_law",
    "rrs_tree_walk",
    "sibling_walk",
    "specinfer_tree_law",
    "specinfer_tree_walk",
    "traversal_tree_law",
    "traversal_tree_walk",
    "tree_emission_law",
    "tree_output_law",
    "verify_tree",
    "verify_tree_requests",
]

#: Deliberately broken walks the tests must catch (the oracle only).
VARIANTS = (None, "no_renormalise", "final_keeps_rejected")


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in x.shape)


def verify_tree(
    num_nodes: Any,
    tree_parents: Any,
    draft_token_ids: Any,
    target_probs: Any,
    draft_probs: Any = None,
    uniforms: Any = None,
    method: str = "point_mass",
) -> tuple[Any, Any, Any]:
    """Tree verification with explicit uniforms (the module docstring gives the walk).

    Parameters
    ----------
    num_nodes : int [B]
    tree_parents : int [N]
        Parent within the request, ``-1`` for a child of the root, parents first.
    draft_token_ids : int [N]
    target_probs : float [N + B, V]
        Per request its root row, then one row per node.
    draft_probs : float [N, V] or None
        The row each node was drawn from; None for point-mass drafts.
    uniforms : float64 [B, >= max_nodes + 1], or None for ``"greedy"``
        Request ``b`` reads column ``j`` for node ``j``'s test and column ``N_b`` for the
        final token.
    method : {"greedy", "point_mass", "specinfer", "rrs", "traversal"}

    Returns
    -------
    accepted_nodes : int64 [B, max_depth]
        Accepted node indices within the request, root to leaf, ``-1`` padded.
    output_token_ids : int64 [B, max_depth + 1]
        The accepted nodes' tokens, then the final token, ``-1`` padded.
    accepted_lengths : int64 [B]
        Accepted nodes per request.

    Raises
    ------
    ValueError
        On a bad layout (see :func:`specdec_np._layouts.tree.validate_tree`), mismatched shapes, an
        unknown method, or a final draw from a row without positive probability.
    """
    tree_method = registry.get_tree_method(method)
    walk = getattr(sys.modules[__name__], tree_method.reference_name)
    xp = target_probs.__array_namespace__()
    target_shape = _shape(target_probs)
    if len(target_shape) != 2:
        raise ValueError(f"target_probs must be [N + B, V]; found shape {list(target_shape)}")
    vocab_size = target_shape[1]
    layout = validate_tree(num_nodes, tree_parents, draft_token_ids, vocab_size)
    batch_size = layout.batch_size
    total = int(layout.node_offsets[-1])
    if target_shape[0] != total + batch_size:
        raise ValueError(
            f"target_probs must have N + B = {total + batch_size} rows; found {target_shape[0]}"
        )
    if draft_probs is not None and _shape(draft_probs) != (total, vocab_size):
        raise ValueError(
            f"draft_probs must have shape [N, V] = {[total, vocab_size]}; "
            f"found {list(_shape(draft_probs))}"
        )
    if registry.get_tree_method(method).stochastic:
        if uniforms is None:
            raise ValueError(f"uniforms are required for method {method!r}")
        if (
            len(_shape(uniforms)) != 2
            or uniforms.shape[0] != batch_size
            or uniforms.shape[1] < layout.max_nodes + 1
        ):
            raise ValueError(
                f"uniforms must have shape [B, max_nodes + 1] = "
                f"{[batch_size, layout.max_nodes + 1]}; found {list(_shape(uniforms))}"
            )
        uniforms = xp.astype(uniforms, xp.float64)
    vocabulary = xp.arange(vocab_size, dtype=xp.int64)
    accepted_rows = []
    output_rows = []
    lengths = []
    for b in range(batch_size):
        if tree_method.sequence_level:
            nodes, final = walk(xp, layout, b, target_probs, draft_probs, uniforms, vocabulary)
        else:
            nodes, final = _walk(
                xp, layout, b, target_probs, draft_probs, uniforms, vocabulary, walk
            )
        tokens = layout.tokens_of(b)
        padding = layout.max_depth - len(nodes)
        accepted_rows.append(nodes + [-1] * padding)
        output_rows.append([tokens[node] for node in nodes] + [final] + [-1] * padding)
        lengths.append(len(nodes))
    accepted_nodes = xp.reshape(
        xp.asarray(accepted_rows, dtype=xp.int64), (batch_size, layout.max_depth)
    )
    output = xp.reshape(
        xp.asarray(output_rows, dtype=xp.int64), (batch_size, layout.max_depth + 1)
    )
    return accepted_nodes, output, xp.asarray(lengths, dtype=xp.int64)


def verify_tree_requests(
    num_nodes: Any,
    tree_parents: Any,
    draft_token_ids: Any,
    target_rows: Any,
    draft_rows: Any = None,
    uniforms: Any = None,
    *,
    method: str,
    from_logits: bool,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    draft_from_logits: bool | None = None,
    filter_order: str = "vllm",
    settings: Any = None,
) -> Any:
    """The engine form of :func:`verify_tree`: logits or probabilities, per-request
    sampling parameters, greedy requests mixed with sampled ones, one request at a time.

    A request with ``temperature == 0`` (every request for ``method="greedy"``) walks
    greedily on its raw rows; any other has its rows processed by
    :func:`specdec_np._reference.chains.process_logits` with its own parameters when
    ``from_logits`` (target and draft rows alike) and walks by ``method``.

    Parameters
    ----------
    num_nodes, tree_parents, draft_token_ids
        As :func:`verify_tree`.
    target_rows : float [N + B, V]
        Logits (``from_logits``) or probabilities taken as processed.
    draft_rows : float [N, V] or None
        In the target's form.
    uniforms : float64 [B, >= max_nodes + 1] or None
    method : str
    from_logits : bool
        The target rows are logits.
    temperature, top_k, top_p, min_p : scalar, [B] or None
        None is off.
    draft_from_logits : bool, optional
        The draft rows are logits rather than probabilities used as given;
        ``from_logits`` by default.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters.
    settings : mapping, optional
        The sampling surface by its public keywords, as in
        :func:`specdec_np._reference.ragged.verify_ragged`: a node's row has the output,
        the node's ancestors and the node as its context, the root row the output; a
        node's draft row takes its parent's row's context and mask.  With ``logprobs``,
        the emitted position ``i`` reports the law of the row it was drawn from (the root
        row, then the ``i``-th accepted node's row) through
        :func:`specdec_np._reference.surface.reference_logprobs`.

    Returns
    -------
    accepted_nodes, output_token_ids, accepted_lengths
        As :func:`verify_tree`, over the whole batch.
    finished : bool [B], only with ``settings``
    extras : dict, only with ``settings["logprobs"]``
        The float64 ``logprobs`` and ``raw_logprobs`` [B, max_depth + 1] and
        ``top_token_ids`` and ``top_logprobs`` [B, max_depth + 1, N] (NaN and -1 padded).
    """
    xp = target_rows.__array_namespace__()
    layout = validate_tree(num_nodes, tree_parents, draft_token_ids, int(target_rows.shape[1]))
    batch_size = layout.batch_size
    surface = dict(settings or {})
    bitmask = surface.get("token_bitmask")
    top_count = surface.get("logprobs")
    extras: dict[str, list[Any]] = {"logprobs": [], "raw_logprobs": [], "top_token_ids": [],
                                    "top_logprobs": []}
    settings = [
        _per_request(xp, value, batch_size, off)
        for value, off in ((temperature, 1.0), (top_k, 0.0), (top_p, 1.0), (min_p, 0.0))
    ]
    nodes_out, tokens_out, lengths, finished = [], [], [], []
    for b in range(batch_size):
        start, stop = int(layout.node_offsets[b]), int(layout.node_offsets[b + 1])
        target = target_rows[start + b : stop + b + 1, :]
        raw_target = target
        draft = None if draft_rows is None else draft_rows[start:stop, :]
        greedy = not registry.get_tree_method(method).stochastic or settings[0][b] == 0.0
        draft_logits = from_logits if draft_from_logits is None else draft_from_logits
        if surface and from_logits:
            target, adjusted_draft = _adjusted_tree_rows(
                xp, surface, b, target, draft if draft_logits else None,
                layout.tree_parents[start:stop], layout.draft_token_ids[start:stop],
                None if bitmask is None else bitmask[start + b : stop + b + 1, :],
            )
            if draft_logits:
                draft = adjusted_draft
        adjusted_target = target
        if not greedy:
            request_settings = tuple(column[b] for column in settings)
            if from_logits:
                target = _process_request_rows(xp, target, request_settings, filter_order)
            if draft is not None and draft_logits:
                draft = _process_request_rows(xp, draft, request_settings, filter_order)
        nodes, tokens, length = verify_tree(
            xp.asarray([stop - start], dtype=xp.int64),
            xp.asarray(layout.tree_parents[start:stop], dtype=xp.int64),
            xp.asarray(layout.draft_token_ids[start:stop], dtype=xp.int64),
            target,
            draft,
            None if greedy else uniforms[b : b + 1, :],
            "greedy" if greedy else method,
        )
        depth = int(length[0])
        run = [int(tokens[0, i]) for i in range(depth + 1)]
        if surface:
            run, depth, done = cut_run(
                run, depth, request_setting(surface, "stop_token_ids", b),
                request_setting(surface, "max_tokens", b),
            )
            finished.append(done)
            if top_count is not None:
                # Position i was drawn from the root row, then the i-th accepted node's.
                emitted = [0] + [int(nodes[0, i]) + 1 for i in range(len(run) - 1)]
                where = xp.asarray(emitted, dtype=xp.int64)
                reference_logprobs(
                    xp, extras, xp.take(adjusted_target, where, axis=0),
                    xp.take(raw_target, where, axis=0), run, layout.max_depth,
                    int(top_count), from_logits,
                    (1.0, 0.0, 1.0, 0.0) if greedy else tuple(column[b] for column in settings),
                    filter_order, _process_request_rows,
                )
        nodes_out.append([int(nodes[0, i]) for i in range(min(depth, len(run)))])
        tokens_out.append(run)
        lengths.append(depth)
    width = layout.max_depth
    accepted_nodes = [row + [-1] * (width - len(row)) for row in nodes_out]
    output = [row + [-1] * (width + 1 - len(row)) for row in tokens_out]
    found = (
        xp.reshape(xp.asarray(accepted_nodes, dtype=xp.int64), (batch_size, width)),
        xp.reshape(xp.asarray(output, dtype=xp.int64), (batch_size, width + 1)),
        xp.asarray(lengths, dtype=xp.int64),
    )
    if not surface:
        return found
    found += (np.asarray(finished, dtype=bool),)
    if top_count is None:
        return found
    return found + ({name: np.asarray(values) for name, values in extras.items()},)


def _adjusted_tree_rows(
    xp: Any, surface: Any, b: int, target: Any, draft: Any, parents: Any, tokens: Any,
    masks: Any,
) -> tuple[Any, Any]:
    """One request's tree rows with the surface's row settings: the root row after the
    output, node ``j``'s row after its ancestors and itself; node ``j``'s draft row with
    its parent's row's context and mask."""
    before = [int(t) for t in request_setting(surface, "output_token_ids", b, [])]
    paths: list[list[int]] = [before]
    for j in range(len(parents)):
        parent = int(parents[j])
        paths.append(paths[0 if parent < 0 else parent + 1] + [int(tokens[j])])
    adjusted = adjust_logits(xp, target, paths, surface, b, masks)
    if draft is None:
        return adjusted, None
    rows = [0 if int(parent) < 0 else int(parent) + 1 for parent in parents]
    draft_masks = None
    if masks is not None:
        draft_masks = xp.take(masks, xp.asarray(rows, dtype=xp.int64), axis=0)
    return adjusted, adjust_logits(xp, draft, [paths[r] for r in rows], surface, b, draft_masks)


def _draft_row(xp: Any, draft_probs: Any, global_node: int, token: int, vocabulary: Any) -> Any:
    """A node's draft row as float64 with negative and NaN entries zeroed (one-hot without
    draft rows)."""
    if draft_probs is None:
        return xp.astype(vocabulary == token, xp.float64)
    row = xp.astype(draft_probs[global_node, :], xp.float64)
    return xp.where(row > 0, row, 0.0)


def _walk(
    xp: Any,
    layout: Any,
    b: int,
    target_probs: Any,
    draft_probs: Any,
    uniforms: Any,
    vocabulary: Any,
    step: Callable[..., tuple[int | None, Any]],
) -> tuple[list[int], int]:
    """One request's walk with a method's sibling step: its accepted nodes and its final
    token.  ``step(xp, p, kids, tokens, uniforms, q_rows, vocabulary)`` returns the
    accepted child, or None and the final token (an int) or the final draw's inputs."""
    children = layout.children(b)
    tokens = layout.tokens_of(b)
    start = int(layout.node_offsets[b])
    accepted: list[int] = []
    node = -1
    while True:
        p = xp.astype(target_probs[layout.target_row(b, node), :], xp.float64)
        kids = children[node + 1]
        q_rows = None
        if draft_probs is not None:
            q_rows = [
                _draft_row(xp, draft_probs, start + child, None, vocabulary) for child in kids
            ]
        chosen, final = step(
            xp, p, kids, tokens, None if uniforms is None else uniforms[b, :], q_rows, vocabulary
        )
        if chosen is not None:
            node = chosen
            accepted.append(node)
            continue
        if isinstance(final, int):
            return accepted, final
        token = _final_draw(xp, final, uniforms[b, len(tokens)])
        if token < 0:
            row = layout.target_row(b, node)
            raise ValueError(
                f"target_probs row {row} (request {b}, node {node}) has no positive "
                "probability to draw the final token from"
            )
        return accepted, token


def greedy_tree_walk(
    xp: Any, p: Any, kids: list[int], tokens: list[int], uniforms: Any, q_rows: Any,
    vocabulary: Any,
) -> tuple[int | None, Any]:
    """Greedy: the first child whose token is the argmax of the row (NaN never wins, as in
    the chain layout), else that argmax as the final token."""
    best = int(xp.argmax(xp.where(xp.isnan(p), -xp.inf, p)))
    matching = [child for child in kids if tokens[child] == best]
    return (matching[0], None) if matching else (None, best)


def point_mass_tree_walk(
    xp: Any, p: Any, kids: list[int], tokens: list[int], uniforms: Any, q_rows: Any,
    vocabulary: Any,
) -> tuple[int | None, Any]:
    """Deterministic candidates (:func:`_point_mass_siblings`); draft rows are not read."""
    return _point_mass_siblings(xp, p, kids, tokens, uniforms, vocabulary)


def specinfer_tree_walk(
    xp: Any, p: Any, kids: list[int], tokens: list[int], uniforms: Any, q_rows: Any,
    vocabulary: Any,
) -> tuple[int | None, Any]:
    """Independently drafted children (:func:`_residual_siblings`); without draft rows the
    children are point-mass candidates."""
    if q_rows is None:
        return _point_mass_siblings(xp, p, kids, tokens, uniforms, vocabulary)
    return _residual_siblings(xp, p, kids, tokens, uniforms, False, q_rows, vocabulary)


def rrs_tree_walk(
    xp: Any, p: Any, kids: list[int], tokens: list[int], uniforms: Any, q_rows: Any,
    vocabulary: Any,
) -> tuple[int | None, Any]:
    """Siblings drawn without replacement from one row (:func:`_residual_siblings`);
    without draft rows the children are point-mass candidates."""
    if q_rows is None:
        return _point_mass_siblings(xp, p, kids, tokens, uniforms, vocabulary)
    return _residual_siblings(xp, p, kids, tokens, uniforms, True, q_rows, vocabulary)


def traversal_tree_walk(
    xp: Any,
    layout: Any,
    b: int,
    target_probs: Any,
    draft_probs: Any,
    uniforms: Any,
    vocabulary: Any,
) -> tuple[list[int], int]:
    """Traversal verification, a request walk (:mod:`specdec_np._reference.traversal`);
    without draft rows the children are point-mass candidates, walked as ``point_mass``."""
    if draft_probs is None:
        return _walk(
            xp, layout, b, target_probs, None, uniforms, vocabulary, point_mass_tree_walk
        )
    return _traversal_reference.traversal_walk(
        xp, layout, b, target_probs, draft_probs, uniforms, vocabulary
    )


def _final_draw(xp: Any, final: tuple[Any, int | None], v: Any) -> int:
    """The final token: an inverse-CDF draw from the residual weights, or the fallback
    token when rounding left them without mass (-1 when there is none)."""
    weights, fallback = final
    token = int(residual_draw(weights[None, :], xp.reshape(v, (1,)))[0])
    return fallback if token < 0 and fallback is not None else token


def _point_mass_siblings(
    xp: Any, p: Any, kids: list[int], tokens: list[int], uniforms: Any, vocabulary: Any
) -> tuple[int | None, Any]:
    """Deterministic candidates: child ``j`` is accepted iff ``u_j (1 - m) < r(x_j)``, with
    ``r`` the row without the tokens tried before (``m`` their mass, so that
    ``r(x_j) / (1 - m)`` is the renormalised residual); if all fail, the final token is
    drawn from the row without the children's tokens.  A rejection of a token with no mass
    removes nothing.  Returns the accepted child, or None and the final draw's inputs:
    the weights, and the last removed token, which is what is left when rounding leaves
    the weights without mass (the exact walk would have accepted it)."""
    removed_mass = 0.0
    tried: list[int] = []
    last_removed = None
    for child in kids:
        x = tokens[child]
        r_x = 0.0 if x in tried else float(p[x])
        if float(uniforms[child]) * (1.0 - removed_mass) < r_x:
            return child, None
        tried.append(x)
        if r_x > 0:
            removed_mass += r_x
            last_removed = x
    weights = xp.where(p > 0, p, 0.0)
    for x in tried:
        weights = xp.where(vocabulary == x, 0.0, weights)
    return None, (weights, last_removed)


def _residual_siblings(
    xp: Any,
    p: Any,
    kids: list[int],
    tokens: list[int],
    uniforms: Any,
    without_replacement: bool,
    q_rows: list[Any],
    vocabulary: Any,
) -> tuple[int | None, Any]:
    """SpecInfer, and RRS when ``without_replacement``: child ``j`` is accepted iff
    ``u_j q_j(x_j) < r(x_j)``; on rejection ``r <- (r - q_j)+`` renormalised, kept only if
    it has mass.  RRS takes ``q_j`` as the draft row without the tokens of the siblings
    tried before, renormalised.  Returns the accepted child, or None and the weights of
    the final draw."""
    # The target row is taken as normalised; the mass is recomputed after each update.
    residual, mass = p, 1.0
    tried: list[int] = []
    for child, q in zip(kids, q_rows):
        x = tokens[child]
        if without_replacement and tried:
            earlier = xp.zeros_like(q, dtype=xp.bool)
            for token in tried:
                earlier = xp.logical_or(earlier, vocabulary == token)
            q = xp.where(earlier, 0.0, q)
            q_mass = float(xp.sum(q))
            q = q / q_mass if q_mass > 0 else q
        r = residual / mass if mass != 1.0 else residual
        if float(uniforms[child]) * float(q[x]) < float(r[x]):
            return child, None
        tried.append(x)
        updated = xp.where(r - q > 0, r - q, 0.0)
        updated_mass = float(xp.sum(updated))
        if updated_mass > 0:
            residual, mass = updated, updated_mass
    return None, (residual, None)


# ---------------------------------------------------------------------------------------
# The exact oracle: plain Python floats, written apart from the walk above on purpose, so
# that agreeing with it means something.

Law = dict[tuple[int, ...], float]
PathRow = Callable[[tuple[int, ...]], Any]


def _as_list(row: Any) -> list[float]:
    return [float(value) for value in np.asarray(row, dtype=np.float64)]


def _normalised(row: list[float]) -> list[float]:
    total = sum(row)
    return [value / total for value in row] if total > 0 else list(row)


DraftRule = Callable[[int, "list[float] | None", "list[int]", int], "list[float]"]


def _point_mass_rule(x: int, row: list[float] | None, tried: list[int], vocab_size: int):
    """The law a deterministic candidate ``x`` is tested against: its point mass."""
    return [1.0 if y == x else 0.0 for y in range(vocab_size)]


def _independent_rule(x: int, row: list[float] | None, tried: list[int], vocab_size: int):
    """An independently drafted child: its own draft row (a point mass without one)."""
    if row is None:
        return _point_mass_rule(x, row, tried, vocab_size)
    return [max(value, 0.0) for value in row]


def _without_replacement_rule(
    x: int, row: list[float] | None, tried: list[int], vocab_size: int
):
    """A sibling drawn without replacement: the row without the earlier siblings' tokens,
    renormalised (a point mass without a row)."""
    q = _independent_rule(x, row, tried, vocab_size)
    if row is None:
        return q
    return _normalised([0.0 if y in tried else q[y] for y in range(vocab_size)])


def _sibling_walk(
    rule: DraftRule,
    p: list[float],
    tokens: tuple[int, ...],
    q_rows: list[list[float] | None],
    variant: str | None,
) -> tuple[list[float], list[float]]:
    """Conditional acceptance probability of each child (given the ones before failed) and
    the law of the final token when all fail; ``rule`` gives the law each child is tested
    against."""
    vocab_size = len(p)
    r = _normalised(p)
    conditional = []
    tried: list[int] = []
    for x, row in zip(tokens, q_rows):
        q = rule(x, row, tried, vocab_size)
        if q[x] > 0:
            a = min(1.0, r[x] / q[x])
        else:
            a = 1.0 if r[x] > 0 else 0.0
        conditional.append(a)
        tried.append(x)
        updated = [max(r[y] - q[y], 0.0) for y in range(vocab_size)]
        if sum(updated) > 0:
            r = updated if variant == "no_renormalise" else _normalised(updated)
    final = _normalised(p) if variant == "final_keeps_rejected" and tokens else _normalised(r)
    return conditional, final


def _assignments(
    drafting: str,
    tokens: tuple[int, ...] | None,
    rows: list[list[float]],
    vocab_size: int,
) -> list[tuple[tuple[int, ...], float]]:
    """Every way the children's tokens can come out, with its probability."""
    if drafting == "fixed":
        return [(tokens, 1.0)]
    result = []
    for candidate in itertools.product(range(vocab_size), repeat=len(rows)):
        weight = 1.0
        if drafting == "independent":
            for row, x in zip(rows, candidate):
                weight *= row[x]
        else:
            one_row = rows[0]
            for position, x in enumerate(candidate):
                earlier = candidate[:position]
                remaining = sum(one_row[y] for y in range(vocab_size) if y not in earlier)
                if x in earlier or remaining <= 0:
                    weight = 0.0
                    break
                weight *= one_row[x] / remaining
        if weight > 0:
            result.append((candidate, weight))
    return result


def tree_emission_law(
    method: str,
    target: PathRow,
    tree_parents: Any,
    vocab_size: int,
    *,
    draft: Callable[[tuple[int, ...], int], Any] | None = None,
    draft_token_ids: Any = None,
    drafting: str | None = None,
    variant: str | None = None,
) -> Law:
    """The exact law of the tokens one request's walk emits: the oracle the registry names
    for ``method`` (``oracle_name``).

    Parameters
    ----------
    method : str
        A stochastic tree method of the registry.
    target : callable, path -> float [V]
        The target's law of the next token after ``path`` (a tuple of emitted tokens); a
        node's target row is ``target`` at the path to it.
    tree_parents : int [n]
        One request's tree shape, as in the layout.
    vocab_size : int
    draft : callable, (path, sibling position) -> float [V], optional
        The draft law of the child at that sibling position below ``path``.  Drawing
        without replacement uses the row at position 0 for every sibling, and it is the row
        the verifier is given for each of them.  None: point-mass drafts.
    draft_token_ids : int [n], optional
        The tokens, for ``drafting="fixed"``.
    drafting : str, optional
        How the children were drawn (one of ``registry.DRAFTINGS``); by default the
        method's own drafting.
    variant : {None, "no_renormalise", "final_keeps_rejected"}
        A deliberately broken walk, for negative controls.

    Returns
    -------
    dict
        Emitted token tuple (accepted tokens, then the final token) -> probability.
    """
    tree_method = registry.get_tree_method(method)
    if tree_method.oracle_name is None:
        raise ValueError(f"tree method {method!r} has no law (it draws nothing)")
    oracle = getattr(sys.modules[__name__], tree_method.oracle_name)
    return oracle(
        target, tree_parents, vocab_size, draft=draft, draft_token_ids=draft_token_ids,
        drafting=drafting or tree_method.drafting, variant=variant,
    )


def point_mass_tree_law(
    target: PathRow, tree_parents: Any, vocab_size: int, **options: Any
) -> Law:
    """The law of the point-mass walk (:func:`tree_emission_law`'s arguments)."""
    return _sibling_law(_point_mass_rule, target, tree_parents, vocab_size, **options)


def specinfer_tree_law(
    target: PathRow, tree_parents: Any, vocab_size: int, **options: Any
) -> Law:
    """The law of the SpecInfer walk (:func:`tree_emission_law`'s arguments)."""
    return _sibling_law(_independent_rule, target, tree_parents, vocab_size, **options)


def rrs_tree_law(
    target: PathRow, tree_parents: Any, vocab_size: int, **options: Any
) -> Law:
    """The law of the RRS walk (:func:`tree_emission_law`'s arguments)."""
    return _sibling_law(_without_replacement_rule, target, tree_parents, vocab_size, **options)


def traversal_tree_law(
    target: PathRow, tree_parents: Any, vocab_size: int, **options: Any
) -> Law:
    """The law of the traversal walk (:func:`tree_emission_law`'s arguments): without a
    draft, the point-mass walk's, which it then walks."""
    if options.get("draft") is None:
        return point_mass_tree_law(target, tree_parents, vocab_size, **options)
    return _traversal_reference.traversal_law(target, tree_parents, vocab_size, **options)


#: The law each sibling-walk oracle tests a child against.
_SIBLING_RULES: dict[str, DraftRule] = {
    "point_mass_tree_law": _point_mass_rule,
    "specinfer_tree_law": _independent_rule,
    "rrs_tree_law": _without_replacement_rule,
}


def sibling_walk(
    method: str,
    p: list[float],
    tokens: tuple[int, ...],
    q_rows: list[list[float] | None],
    variant: str | None = None,
) -> tuple[list[float], list[float]]:
    """One node of a sibling-walk method's oracle: the conditional acceptance probability
    of each child (given the ones before failed) and the law of the final token.

    Parameters
    ----------
    method : str
        A registry tree method whose oracle walks siblings.
    p : list of float [V]
        The node's target row.
    tokens : tuple of int
        The children's tokens, in sibling order.
    q_rows : list of (list of float [V] or None)
        Their draft rows.
    variant : str, optional
        A deliberately broken walk (``VARIANTS``).
    """
    oracle_name = registry.get_tree_method(method).oracle_name
    return _sibling_walk(_SIBLING_RULES[str(oracle_name)], p, tokens, q_rows, variant)


def _sibling_law(
    rule: DraftRule,
    target: PathRow,
    tree_parents: Any,
    vocab_size: int,
    *,
    draft: Callable[[tuple[int, ...], int], Any] | None,
    draft_token_ids: Any,
    drafting: str,
    variant: str | None,
) -> Law:
    """The law of a walk that tests each child against ``rule``'s law, on children drawn
    as ``drafting`` says."""
    if drafting not in registry.DRAFTINGS or variant not in VARIANTS:
        raise ValueError(f"unknown drafting {drafting!r} or variant {variant!r}")
    if drafting != "fixed" and draft is None:
        raise ValueError(f"drafting {drafting!r} needs a draft")
    parents = [int(parent) for parent in tree_parents]
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    fixed_tokens = None if draft_token_ids is None else [int(t) for t in draft_token_ids]
    memo: dict[tuple[int, tuple[int, ...]], Law] = {}

    def law_at(node: int, path: tuple[int, ...]) -> Law:
        key = (node, path)
        if key in memo:
            return memo[key]
        p = _as_list(target(path))
        kids = children[node + 1]
        law: Law = {}
        if not kids:
            for y, value in enumerate(_normalised(p)):
                if value > 0:
                    law[(y,)] = value
            memo[key] = law
            return law
        drawn_rows = [
            _as_list(draft(path, 0 if drafting == "without_replacement" else s))
            if draft is not None
            else None
            for s in range(len(kids))
        ]
        given = None if fixed_tokens is None else tuple(fixed_tokens[k] for k in kids)
        assignments = _assignments(drafting, given, drawn_rows, vocab_size)
        if abs(sum(weight for _, weight in assignments) - 1.0) > 1e-9:
            raise ValueError(
                f"the draft below path {path} cannot draw {len(kids)} children "
                f"({drafting}): its rows lack the support"
            )
        for tokens, weight in assignments:
            conditional, final = _sibling_walk(rule, p, tokens, drawn_rows, variant)
            reach = weight
            for child, x, a in zip(kids, tokens, conditional):
                if reach * a > 0:
                    for suffix, value in law_at(child, path + (x,)).items():
                        emitted = (x,) + suffix
                        law[emitted] = law.get(emitted, 0.0) + reach * a * value
                reach *= 1.0 - a
            for y, value in enumerate(final):
                if reach * value > 0:
                    law[(y,)] = law.get((y,), 0.0) + reach * value
        memo[key] = law
        return law

    return law_at(-1, ())


def continued_law(law: Law, target: PathRow, length: int, vocab_size: int) -> np.ndarray:
    """The law of the first ``length`` tokens when the emitted ones are continued by the target.

    Parameters
    ----------
    law : dict
        Token tuple -> probability (``{(): 1.0}`` gives the target's own law).
    target : callable, path -> float [V]
    length : int
    vocab_size : int

    Returns
    -------
    float64 array of shape ``[V] * length``
    """
    result = np.zeros((vocab_size,) * length, dtype=np.float64)
    pending = list(law.items())
    while pending:
        tokens, weight = pending.pop()
        if len(tokens) >= length:
            result[tokens[:length]] += weight
            continue
        for y, value in enumerate(_normalised(_as_list(target(tokens)))):
            if value > 0:
                pending.append((tokens + (y,), weight * value))
    return result


def tree_output_law(
    method: str,
    target: PathRow,
    tree_parents: Any,
    vocab_size: int,
    length: int,
    **options: Any,
) -> np.ndarray:
    """:func:`tree_emission_law` continued by the target, as ``[V] * length`` probabilities.

    Parameters
    ----------
    method, target, tree_parents, vocab_size
        As in :func:`tree_emission_law`.
    length : int
        The prefix length compared.
    **options
        ``draft``, ``draft_token_ids``, ``drafting``, ``variant`` of :func:`tree_emission_law`.

    Returns
    -------
    float64 array of shape ``[V] * length``
        Equal to ``continued_law({(): 1.0}, target, length, vocab_size)`` for a lossless walk.
    """
    law = tree_emission_law(method, target, tree_parents, vocab_size, **options)
    return continued_law(law, target, length, vocab_size)


def expected_accepted_length(law: Law) -> float:
    """Expected number of accepted nodes under an emission law (its tuples' length minus one).

    Parameters
    ----------
    law : dict

    Returns
    -------
    float
    """
    return sum(weight * (len(tokens) - 1) for tokens, weight in law.items())
