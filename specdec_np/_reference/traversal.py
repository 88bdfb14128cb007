"""Traversal verification (Weng et al., NeurIPS 2025): its readable walk and its exact law.

Traversal verification decides on whole root-to-node sequences, from the leaves up, in
post-order (``docs/semantics.md``, trees: the traversal walk).  Every node ``c`` below a
node ``b`` carries a weight, block verification's path weight taken from its parent's
current state::

    rho_c = min(1, rho_b * M_b(x_c) / q_c(x_c))

where ``M_b`` is ``b``'s current law of the next token (its target row, normalised, until a
child of ``b`` is rejected) and ``q_c`` the draft row ``c`` was drawn from.  The root has
weight 1.  The walk visits ``b``'s children in node order, each child's whole subtree
before the next child.  After every child of ``c`` was rejected (at once for a leaf), ``c``
is tested: it is accepted iff ``u_c < rho_c``, and the walk then emits the tokens from the
root to ``c`` followed by one token drawn from ``M_c`` with the request's last uniform.
When ``c`` is rejected, its parent ``b`` takes block verification's rejection update::

    W = max(rho_b M_b - q_c, 0),   Z = sum(W)
    M_b <- W / Z   (kept as it was when Z = 0)
    rho_b <- Z / (Z + 1 - rho_b)   (0 when that denominator is not positive; a weight of
                                   1, the root's among them, stays 1)

and the walk moves to ``b``'s next child.  When every child of the root was rejected, the
final token is drawn from the root's ``M``.  On a chain this is block verification with the
same uniforms (node ``i`` is block's check ``eta_{i+1}``), and on a tree of depth one it is
SpecInfer.  Why it is lossless: given ``x_c``, the walk below ``c`` accepts with probability
exactly ``rho_c`` and then continues with the target's law (by induction from the leaves);
so a child drawn from ``q_c`` accepts ``y`` with probability ``min(q_c(y), rho_b M_b(y))``,
which leaves exactly ``(rho_b M_b - q_c)+`` of ``b``'s budget ``rho_b M_b`` for the rest, and
the update above is that remainder renormalised by the rejection's probability
``1 - rho_b + Z``.

:func:`traversal_walk` walks one request with explicit uniforms on any namespace of the
Python array API; :func:`traversal_law` is the exact law by enumeration, written apart from
the walk in plain Python floats.  Both take real draft rows: without them the method walks
as ``point_mass`` (``specdec_np._reference.trees`` dispatches).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from .chains import residual_draw

__all__ = ["VARIANTS", "next_weight", "rejection_update", "traversal_law", "traversal_walk"]

#: Deliberately broken walks the tests must catch (the oracle only): a rejection that leaves
#: the parent's law and weight as they were, or one that updates the law but not the weight.
VARIANTS = (None, "no_residual_update", "keep_weight")


def next_weight(rho: float, r_x: float, q_x: float) -> float:
    """A child's weight ``min(1, rho r(x) / q(x))``, as block verification computes it.

    Parameters
    ----------
    rho : float
        The parent's current weight.
    r_x : float
        The parent's current law at the child's token.
    q_x : float
        The child's draft probability of its token (clean: non-negative).

    Returns
    -------
    float
        0 when ``r(x) <= 0`` (or NaN) or ``rho == 0``; 1 when ``rho r(x) >= q(x)`` (so
        ``q(x) = 0`` is safe); else the ratio.
    """
    if not r_x > 0.0 or rho == 0.0:
        return 0.0
    if rho * r_x >= q_x:
        return 1.0
    return rho * r_x / q_x


def rejection_update(rho: float, total: float, is_root: bool) -> float:
    """The parent's weight after a child's rejection: ``Z / (Z + 1 - rho)``.

    Parameters
    ----------
    rho : float
        The parent's weight before.
    total : float
        ``Z``, the mass of ``max(rho M - q, 0)``.
    is_root : bool
        The root's weight stays 1.

    Returns
    -------
    float
        1 at the root and wherever ``rho`` is 1 (block verification's check there, read
        without ``Z``); 0 where the denominator is not positive.
    """
    if is_root or rho >= 1.0:
        return 1.0
    denominator = total + (1.0 - rho)
    return total / denominator if denominator > 0.0 else 0.0


def traversal_walk(
    xp: Any,
    layout: Any,
    b: int,
    target_probs: Any,
    draft_probs: Any,
    uniforms: Any,
    vocabulary: Any,
    reads: list[tuple[str, int]] | None = None,
) -> tuple[list[int], int]:
    """One request's traversal walk (the module docstring): its accepted nodes, root to the
    deepest, and its final token.

    Parameters
    ----------
    xp : namespace
        The arrays' array-API namespace.
    layout : specdec_np._layouts.tree.TreeLayout
    b : int
        The request.
    target_probs : float [N + B, V]
    draft_probs : float [N, V]
        Real draft rows (negative and NaN entries weigh 0).
    uniforms : float64 [B, >= max_nodes + 1]
    vocabulary : int64 [V]
        ``arange(V)``, unused here but shared with the sibling walks' signature.
    reads : list, optional
        Appended ``("target", row)`` and ``("draft", row)`` for every row the walk reads
        (rows of the whole batch): the rows a kernel may read, for the cost tests.

    Returns
    -------
    nodes : list of int
    final : int

    Raises
    ------
    ValueError
        When the final token must be drawn from a row without positive probability.
    """
    children = layout.children(b)
    tokens = layout.tokens_of(b)
    start = int(layout.node_offsets[b])
    row_uniforms = uniforms[b, :]

    def target_row(node: int) -> Any:
        if reads is not None:
            reads.append(("target", layout.target_row(b, node)))
        return xp.astype(target_probs[layout.target_row(b, node), :], xp.float64)

    def draft_row(node: int) -> Any:
        if reads is not None:
            reads.append(("draft", start + node))
        row = xp.astype(draft_probs[start + node, :], xp.float64)
        return xp.where(row > 0, row, 0.0)

    def visit(node: int, rho: float) -> tuple[int, Any] | None:
        """The walk below ``node`` at weight ``rho``: the accepted node and the weights of
        its final draw, or None when ``node`` and its subtree are rejected."""
        # The node's law: its target row (taken as normalised, read when first needed),
        # then its residual.
        residual, mass = None, 1.0
        for child in children[node + 1]:
            if rho == 0.0:
                # Nothing below a weight of 0 can be accepted, nor can the node itself: the
                # rest of its subtree is rejected whatever its uniforms, and not read.
                break
            x = tokens[child]
            q = draft_row(child)
            if residual is None:
                residual = target_row(node)
            r_x = float(residual[x]) / mass if mass != 1.0 else float(residual[x])
            weight = next_weight(rho, r_x, float(q[x]))
            # A child of weight 0 is rejected with its subtree whatever their uniforms.
            found = visit(child, weight) if weight > 0.0 else None
            if found is not None:
                return found
            law = residual / mass if mass != 1.0 else residual
            weights = xp.where(rho * law - q > 0, rho * law - q, 0.0)
            total = float(xp.sum(weights))
            rho = rejection_update(rho, total, node < 0)
            if total > 0:
                residual, mass = weights, total
        if node < 0 or float(row_uniforms[node]) < rho:
            return node, target_row(node) if residual is None else residual
        return None

    found = visit(-1, 1.0)
    if found is None:
        raise RuntimeError("the traversal rejected the root, which its weight 1 forbids")
    accepted, weights = found
    token = int(residual_draw(weights[None, :], xp.reshape(row_uniforms[len(tokens)], (1,)))[0])
    if token < 0:
        raise ValueError(
            f"target_probs row {layout.target_row(b, accepted)} (request {b}, node "
            f"{accepted}) has no positive probability to draw the final token from"
        )
    path = []
    node = accepted
    parents = layout.tree_parents
    while node >= 0:
        path.append(node)
        node = int(parents[start + node])
    return path[::-1], token


# ---------------------------------------------------------------------------------------
# The exact law: plain Python floats, apart from the walk above on purpose.

Law = dict[tuple[int, ...], float]


def _as_list(row: Any) -> list[float]:
    return [float(value) for value in row]


def _normalised(row: list[float]) -> list[float]:
    total = sum(row)
    return [value / total for value in row] if total > 0 else list(row)


def _child_tokens(
    drafting: str, given: tuple[int, ...] | None, rows: list[list[float]], vocab_size: int
) -> list[tuple[tuple[int, ...], float]]:
    """Every way the children's tokens can come out, with its probability."""
    if drafting == "fixed":
        if given is None:
            raise ValueError("the fixed drafting needs the children's tokens (draft_token_ids)")
        return [(given, 1.0)]
    result = []
    for candidate in itertools.product(range(vocab_size), repeat=len(rows)):
        weight = 1.0
        if drafting == "independent":
            for row, x in zip(rows, candidate):
                weight *= row[x]
        else:  # without replacement, all from the first sibling's row
            for position, x in enumerate(candidate):
                earlier = candidate[:position]
                remaining = sum(rows[0][y] for y in range(vocab_size) if y not in earlier)
                if x in earlier or remaining <= 0:
                    weight = 0.0
                    break
                weight *= rows[0][x] / remaining
        if weight > 0:
            result.append((candidate, weight))
    return result


def traversal_law(
    target: Callable[[tuple[int, ...]], Any],
    tree_parents: Any,
    vocab_size: int,
    *,
    draft: Callable[[tuple[int, ...], int], Any],
    draft_token_ids: Any = None,
    drafting: str = "independent",
    variant: str | None = None,
) -> Law:
    """The exact law of what one request's traversal walk emits, drafts and uniforms
    integrated out (the arguments of ``specdec_np._reference.trees.tree_emission_law``).

    Parameters
    ----------
    target : callable, path -> float [V]
    tree_parents : int [n]
    vocab_size : int
    draft : callable, (path, sibling position) -> float [V]
        The draft row of each child (the first sibling's for every sibling when drawing
        without replacement); the walk is given these rows.
    draft_token_ids : int [n], optional
        The tokens, for ``drafting="fixed"``.
    drafting : {"independent", "fixed", "without_replacement"}
        How the children's tokens are drawn; the walk assumes ``"independent"`` and is
        lossless for it (and, trivially, for given tokens whose rows are point masses).
    variant : {None, "no_residual_update", "keep_weight"}
        A deliberately broken walk.

    Returns
    -------
    dict
        Emitted token tuple (accepted tokens, then the final token) -> probability.
    """
    if variant not in VARIANTS or drafting not in ("fixed", "independent", "without_replacement"):
        raise ValueError(f"unknown drafting {drafting!r} or variant {variant!r}")
    parents = [int(parent) for parent in tree_parents]
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    fixed = None if draft_token_ids is None else [int(t) for t in draft_token_ids]
    memo: dict[tuple[int, tuple[int, ...], float], tuple[Law, float]] = {}

    def run(node: int, path: tuple[int, ...], rho: float) -> tuple[Law, float]:
        """What the walk below ``node`` at weight ``rho`` emits (suffixes after ``path``,
        with their probabilities), and the probability that it rejects ``node``."""
        key = (node, path, rho)
        if key in memo:
            return memo[key]
        p = _normalised(_as_list(target(path)))
        kids = children[node + 1]
        rows = [
            [
                max(v, 0.0)
                for v in _as_list(draft(path, 0 if drafting == "without_replacement" else s))
            ]
            for s in range(len(kids))
        ]
        given = None if fixed is None else tuple(fixed[k] for k in kids)
        outcomes = _child_tokens(drafting, given, rows, vocab_size) if kids else [((), 1.0)]
        if kids and abs(sum(w for _, w in outcomes) - 1.0) > 1e-9:
            raise ValueError(f"the draft below path {path} cannot draw {len(kids)} children")
        law: Law = {}
        rejected = 0.0
        for tokens, weight in outcomes:
            weight_now, m = rho, p
            reach = weight
            for child, x, q in zip(kids, tokens, rows):
                child_weight = next_weight(weight_now, m[x], q[x])
                if reach > 0 and child_weight > 0:
                    below, child_rejected = run(child, path + (x,), child_weight)
                    for suffix, value in below.items():
                        law[(x,) + suffix] = law.get((x,) + suffix, 0.0) + reach * value
                    reach *= child_rejected
                if variant == "no_residual_update":
                    continue
                remainder = [max(weight_now * m[y] - q[y], 0.0) for y in range(vocab_size)]
                total = sum(remainder)
                if variant != "keep_weight":
                    weight_now = rejection_update(weight_now, total, node < 0)
                if total > 0:
                    m = [value / total for value in remainder]
            accept = 1.0 if node < 0 else weight_now
            for y, value in enumerate(m):
                if reach * accept * value > 0:
                    law[(y,)] = law.get((y,), 0.0) + reach * accept * value
            rejected += reach * (1.0 - accept)
        memo[key] = (law, rejected)
        return law, rejected

    return run(-1, (), 1.0)[0]
