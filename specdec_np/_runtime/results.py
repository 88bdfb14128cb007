"""What the verifiers return: one result vocabulary for the padded, ragged and tree fronts.

Every result has ``output_token_ids`` (the accepted tokens, then the emitted token, then
``-1``), ``accepted_lengths`` (accepted drafts or nodes per request), ``num_accepted``
(the acceptance count the counters add up) and ``num_draft_tokens`` (the drafts the call
verified).  A tree result adds ``accepted_nodes``, the node indices an engine keeps in its
KV cache.  Both are named tuples whose tuple part is what earlier releases returned, so
that unpacking keeps working; the other fields are attributes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TreeVerificationResult", "VerificationResult"]

# The named triple's own constructor, without the generated one's keyword handling (a
# result is made on every call).
_new_tuple = tuple.__new__


class _ChainOutputs(NamedTuple):
    output_token_ids: Any
    accepted_lengths: Any
    num_accepted: Any


class VerificationResult(_ChainOutputs):  # numpydoc ignore=PR01
    """What a chain verifier returns: a named triple, plus the number of drafts it verified.

    Attributes
    ----------
    output_token_ids : int64 [B, k+1]
        Accepted draft prefix, then the recovered or bonus token, then -1.
    accepted_lengths : int64 [B]
        Length ``r_b`` of the accepted prefix; row ``b`` emits ``r_b + 1`` tokens.
    num_accepted : int64 [B]
        Acceptance count per row: positions whose test passed, after the first rejection
        too (vLLM's semantics), or the accepted prefix for causal verifiers (block, and
        every request of the ragged layout).
    num_draft_tokens : int
        Draft tokens verified by the call (``B * k`` for a padded batch; the default when
        it is not given).  Not part of the triple, so ``output, lengths, accepted =
        result`` keeps working.
    finished : bool [B] or None
        With ``stop_token_ids`` or ``max_tokens`` (the sampling surface): a stop token was
        emitted, or exactly the budget was; None otherwise.
    logprobs, raw_logprobs : float32 [B, W] or None
        With ``logprobs=N``: each emitted token's log-probability under its row's processed
        law and under the raw softmax of the row (NaN after the emitted run).
    top_token_ids, top_logprobs : int64 and float32 [B, W, N] or None
        With ``logprobs=N``: the processed law's ``N`` most likely tokens, most likely
        first, ties to the lower id (``-1`` and NaN padded).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import greedy_sample
    >>> result = greedy_sample(np.array([[[0.2, 0.8], [0.6, 0.4]]]), np.array([[0]]),
    ...                        np.array([[1]]))
    >>> output, lengths, accepted = result
    >>> output, lengths, result.num_draft_tokens
    (array([[1, 0]]), array([1]), 1)
    """

    num_draft_tokens: int
    finished: Any = None
    logprobs: Any = None
    raw_logprobs: Any = None
    top_token_ids: Any = None
    top_logprobs: Any = None

    def __new__(
        cls,
        output_token_ids: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        num_draft_tokens: int | None = None,
    ) -> VerificationResult:
        result = _new_tuple(cls, (output_token_ids, accepted_lengths, num_accepted))
        if num_draft_tokens is None:
            rows, width = output_token_ids.shape
            num_draft_tokens = rows * (width - 1)
        result.num_draft_tokens = int(num_draft_tokens)
        return result

    @classmethod
    def _make(cls, iterable: Any) -> VerificationResult:  # type: ignore[override]
        return cls(*iterable)

    def _replace(self, **changes: Any) -> VerificationResult:
        fields = {name: changes.pop(name, value) for name, value in self._asdict().items()}
        if changes:
            raise ValueError(f"got unexpected field names: {sorted(changes)!r}")
        return type(self)(**fields, num_draft_tokens=self.num_draft_tokens)


class _TreeOutputs(NamedTuple):
    accepted_nodes: Any
    output_token_ids: Any
    accepted_lengths: Any


class TreeVerificationResult(_TreeOutputs):  # numpydoc ignore=PR01
    """What :func:`specdec_np.verify_tree` returns.

    Attributes
    ----------
    accepted_nodes : int64 [B, max_depth]
        Accepted node indices within each request, root to leaf, ``-1`` padded: the
        KV-cache entries to keep.
    output_token_ids : int64 [B, max_depth + 1]
        The accepted nodes' tokens, then the final token, ``-1`` padded.
    accepted_lengths : int64 [B]
        Accepted nodes per request.
    num_accepted : int64 [B]
        The acceptance count, as in :class:`VerificationResult`: a walk stops at the first
        node whose children all fail, so it is ``accepted_lengths``.
    num_draft_tokens : int
        Nodes verified by the call (``N``).  Neither this nor ``num_accepted`` is part of
        the triple, so ``nodes, output, lengths = result`` keeps working.
    finished : bool [B] or None
        With ``stop_token_ids`` or ``max_tokens`` (the sampling surface): a stop token was
        emitted, or exactly the budget was; None otherwise.
    logprobs, raw_logprobs : float32 [B, W] or None
        With ``logprobs=N``: each emitted token's log-probability under its row's processed
        law and under the raw softmax of the row (NaN after the emitted run).
    top_token_ids, top_logprobs : int64 and float32 [B, W, N] or None
        With ``logprobs=N``: the processed law's ``N`` most likely tokens, most likely
        first, ties to the lower id (``-1`` and NaN padded).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import verify_tree
    >>> result = verify_tree(num_nodes=[1], tree_parents=[-1], draft_token_ids=[1],
    ...                      target_probs=np.array([[0.2, 0.8], [0.6, 0.4]]), method="greedy")
    >>> nodes, output, lengths = result
    >>> nodes, output, lengths
    (array([[0]]), array([[1, 0]]), array([1]))
    """

    num_draft_tokens: int
    finished: Any = None
    logprobs: Any = None
    raw_logprobs: Any = None
    top_token_ids: Any = None
    top_logprobs: Any = None

    def __new__(
        cls,
        accepted_nodes: Any,
        output_token_ids: Any,
        accepted_lengths: Any,
        num_draft_tokens: int = 0,
    ) -> TreeVerificationResult:
        result = super().__new__(cls, accepted_nodes, output_token_ids, accepted_lengths)
        result.num_draft_tokens = int(num_draft_tokens)
        return result

    @property
    def num_accepted(self) -> Any:
        """Accepted nodes per request (``accepted_lengths``)."""
        return self.accepted_lengths

    @classmethod
    def _make(cls, iterable: Any) -> TreeVerificationResult:  # type: ignore[override]
        return cls(*iterable)

    def _replace(self, **changes: Any) -> TreeVerificationResult:
        fields = {name: changes.pop(name, value) for name, value in self._asdict().items()}
        if changes:
            raise ValueError(f"got unexpected field names: {sorted(changes)!r}")
        return type(self)(**fields, num_draft_tokens=self.num_draft_tokens)
