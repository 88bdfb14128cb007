"""Verification across vocabulary shards: each rank of a tensor-parallel LM head holds
some columns of every row, and only small per-row statistics cross ranks.

:func:`verify_ragged` is :func:`specdec_np.verify_ragged` on one rank's columns: it
exchanges maxima, normalisers, the drafted tokens' values, the filters' short candidate
lists and residual masses through a :class:`Communicator` (never the rows), and returns the same
result on every rank, the unsharded call's law exactly.  :func:`run_local` runs ranks as
threads of one process; :class:`MPICommunicator`, :class:`NCCLCommunicator` and
:class:`TorchCommunicator` wrap existing collective libraries.  ``docs/semantics.md``
("Verification across vocabulary shards") states the protocol and why it is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import registry
from ._sharded import ragged as _ragged
from ._sharded.communicators import (
    Communicator,
    LocalCommunicator,
    MPICommunicator,
    NCCLCommunicator,
    TorchCommunicator,
    run_local,
)
from ._sharded.ragged import ShardedResult

__all__ = [
    "Communicator",
    "LocalCommunicator",
    "MPICommunicator",
    "NCCLCommunicator",
    "ShardedResult",
    "TorchCommunicator",
    "run_local",
    "verify_ragged",
]


@registry.document_methods
def verify_ragged(
    *,
    communicator: Any,
    vocab_start: int,
    vocab_size: int,
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_logits: Any = None,
    target_probs: Any = None,
    draft_logits: Any = None,
    draft_probs: Any = None,
    method: str = "rejection",
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    bonus_token_ids: Any = None,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    **method_parameters: float,
) -> ShardedResult:
    """Verify a ragged engine batch whose rows are split over ranks by vocabulary columns.

    Every rank calls this with its own columns and the same everything else; every rank
    returns the same result.  The law of the result is :func:`specdec_np.verify_ragged`'s
    on the whole rows; greedy tokens are the unsharded ones; with one rank every token is
    the unsharded call's for the same uniforms.

    Parameters
    ----------
    communicator : Communicator
        ``rank``, ``size`` and ``allgather(array) -> [size, *array.shape]``
        (:class:`MPICommunicator`, :class:`NCCLCommunicator`, :class:`TorchCommunicator`,
        or :func:`run_local`'s).
    vocab_start : int
        This rank's first column: its rows hold token ids ``vocab_start .. vocab_start +
        width - 1`` (``width`` the rows' second dimension, which may differ between ranks
        and may be 0).  The ranks' columns must tile ``0 .. vocab_size - 1``.
    vocab_size : int
        ``V``, the whole vocabulary.
    num_draft_tokens : int array [B]
        ``k_b >= 0`` drafts per request.
    draft_token_ids : int [T], ``T = sum k_b``
        Full-vocabulary ids, request by request.
    target_logits, target_probs : float32 or float64 [T + B, width]
        This rank's columns of the target rows (exactly one of the two), as
        :func:`specdec_np.verify_ragged` lays them out (``[T, width]`` with
        ``bonus_token_ids``): NumPy arrays, or CuPy arrays, whose logits rows stay on their
        device (the passes over them run there; only per-row numbers reach the host).
    draft_logits, draft_probs : same dtype [T, width], optional
        This rank's columns of the draft rows (the same kind of array as the target's);
        neither for point-mass drafts.
    method : str
        [[verifier names]]
        The sampled requests' verifier (``temperature == 0`` requests are greedy); block
        verification adds one round (the weighted residuals' masses at every position),
        typical acceptance one (every position's entropy and argmax).
    temperature, top_k, top_p, min_p : scalar or array [B], optional
        Sampling parameters, as :func:`specdec_np.verify_ragged` takes them.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters, as :func:`specdec_np.verify_ragged` takes it.
    bonus_token_ids : int [B], optional
        None: fully accepted requests draw their bonus token.
    uniforms : float64 [B, max_k + 2], optional
        Explicit uniforms, the same on every rank.
    generator : numpy.random.Generator, optional
        Seeded alike on every rank (checked: the uniforms drawn from it must agree).
    seeded_seqs, counter_seeds : mapping, optional
        Per-request sources, as :func:`specdec_np.verify_ragged` takes them, the same on
        every rank.
    **method_parameters : float
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``), the same on every rank.

    Returns
    -------
    ShardedResult
        ``output_token_ids`` int64 ``[B, max_k + 1]``, ``accepted_lengths``,
        ``num_accepted``, plus ``exchanged_bytes``, ``gather_bytes`` and ``rounds``.

    Raises
    ------
    TypeError, ValueError
        On every rank when any rank's input is refused, the ranks' settings, ids or
        randomness differ, or the shards do not tile the vocabulary (found in one
        allgather, never a hang).

    Examples
    --------
    Two ranks (threads here), each holding two of the four columns of every row; one
    request with one draft, greedy, so the tokens are the whole rows' argmaxes, the same on
    both ranks:

    >>> import numpy as np
    >>> from specdec_np import sharded
    >>> logits = np.log(np.array([[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    >>> def rank(communicator):
    ...     start = 2 * communicator.rank
    ...     return sharded.verify_ragged(
    ...         communicator=communicator, vocab_start=start, vocab_size=4,
    ...         num_draft_tokens=np.array([1]), draft_token_ids=np.array([1]),
    ...         target_logits=logits[:, start:start + 2], temperature=0.0)
    >>> [result.output_token_ids for result in sharded.run_local(2, rank)]
    [array([[1, 3]]), array([[1, 3]])]
    """
    return _ragged.verify_ragged(
        communicator=communicator,
        vocab_start=vocab_start,
        vocab_size=vocab_size,
        num_draft_tokens=num_draft_tokens,
        draft_token_ids=draft_token_ids,
        target_logits=target_logits,
        target_probs=target_probs,
        draft_logits=draft_logits,
        draft_probs=draft_probs,
        method=method,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        filter_order=filter_order,
        bonus_token_ids=bonus_token_ids,
        uniforms=uniforms,
        generator=generator,
        seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds,
        method_parameters=method_parameters,
    )
