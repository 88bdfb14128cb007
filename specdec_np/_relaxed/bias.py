"""The exact bias of a rule: the total-variation distance per emitted position.

At draft position ``i`` of a request, with everything but that position's draft and
uniform as in this call, a method emits token ``y`` with probability

    E(y) = sum_x Q(x) [a(x) [y = x] + (1 - a(x)) R_x(y)]

where ``Q`` is the draft's law there (a point mass at the drafted token for point-mass
drafts), ``a(x)`` the probability that ``x`` passes (:class:`specdec_np._relaxed.rules.Decisions`'s
``acceptance``) and ``R_x`` what a failure emits (the argmax for a greedy request; for a
sampled one ``max(p - Q, 0)`` normalised, or ``p`` with ``x`` removed).  The target's law
there is ``p`` (a point mass at the argmax for a greedy request), and the bias is
``TV = sum_y |E(y) - p(y)| / 2``.  ``docs/semantics.md`` ("Relaxed methods") states it.
"""

from __future__ import annotations

from typing import Any

from .laws import ChunkLaws
from .rules import Decisions, _namespace

__all__ = ["total_variation"]


def _one_hot(xp: Any, tokens: Any, vocab_size: int) -> Any:
    return (xp.arange(vocab_size)[None, None, :] == tokens[:, :, None]).astype(xp.float64)


def total_variation(laws: ChunkLaws, decisions: Decisions) -> Any:
    """float64 ``[n, K]``: the bias at each draft position (0 where not valid).

    Parameters
    ----------
    laws : ChunkLaws
    decisions : Decisions
        With ``acceptance``.

    Returns
    -------
    float64 array [n, K]
    """
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    target = laws.target[:, :width, :]
    vocab_size = target.shape[2]
    draft = laws.draft if laws.draft is not None else _one_hot(xp, laws.draft_ids, vocab_size)
    acceptance = decisions.acceptance
    argmax = _one_hot(xp, laws.top[:, :width], vocab_size)
    greedy = laws.greedy[:, None, None]
    kept = draft * acceptance
    failing = draft * (1.0 - acceptance)
    failed = failing.sum(axis=2, keepdims=True)
    total = target.sum(axis=2, keepdims=True)
    # Probability rows may be given unnormalised; the draws normalise them.
    normal = xp.where(total > 0, target / xp.where(total > 0, total, 1.0), 0.0)
    if decisions.rejection == "removed":
        remaining = 1.0 - normal
        removable = remaining > 0
        share = xp.where(removable, failing / xp.where(removable, remaining, 1.0), 0.0)
        sampled_rejected = normal * (
            share.sum(axis=2, keepdims=True) + xp.where(removable, 0.0, failing).sum(
                axis=2, keepdims=True)
        ) - xp.where(removable, share * normal, 0.0)
    elif decisions.rejection == "residual":
        residual = xp.maximum(target - draft, 0.0)
        mass = residual.sum(axis=2, keepdims=True)
        law = xp.where(mass > 0, residual / xp.where(mass > 0, mass, 1.0), normal)
        sampled_rejected = failed * law
    else:
        sampled_rejected = failed * argmax
    emitted = kept + xp.where(greedy, failed * argmax, sampled_rejected)
    wanted = xp.where(greedy, argmax, normal)
    distance = 0.5 * xp.abs(emitted - wanted).sum(axis=2)
    return xp.where(laws.valid, distance, 0.0)


