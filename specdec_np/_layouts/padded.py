"""Chain batches: the one description the chain drivers of both backends read, and the
padded layout.

A chain layout turns the caller's arrays into a :class:`ChainBatch`: flat target rows
``[T + B, V]``, flat draft rows ``[T, V]`` (or None for point-mass drafts), flat draft ids
``[T]``, bonus ids ``[B]`` and ``draft_offsets [B + 1]`` (request ``b`` owns drafts
``draft_offsets[b] .. draft_offsets[b + 1]`` and the ``k_b + 1`` target rows from
``draft_offsets[b] + b``).  The verifiers never see the caller's layout; the layout never
sees the verifier.

:func:`padded_chain` is the vLLM layout ``[B, k+1, V]``; the ragged layout engines use
(``num_draft_tokens [B]``, ``k_b >= 0``) is :mod:`specdec_np._layouts.ragged`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np

from .. import _core
from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import contract as _contract
from .._runtime import results as _results
from . import sampling as _sampling

__all__ = ["SAMPLING_KEYWORDS", "ChainBatch", "padded_chain", "without_sampling_settings",
           "zero_ids"]

#: The keywords of the sampling parameters and of the whole sampling surface: the padded
#: fronts take none of them (their rows are probabilities, verified as given).
SAMPLING_KEYWORDS = frozenset(_sampling.SamplingParameters._fields)

_Front = TypeVar("_Front", bound=Callable[..., Any])


class ChainBatch(NamedTuple):
    """Validated, kernel-ready inputs of one verification call over draft chains.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    device : int or None
        CUDA device id, None on the CPU.
    target_rows : float32 or float64 [T + B, V], C-contiguous
    draft_rows : same dtype [T, V] or None
        None for point-mass drafts.
    draft_token_ids : int32 or int64 [T]
        A private copy: the kernels read it while the caller may write its own.
    bonus_token_ids : same dtype [B]
    draft_offsets : int64 [B + 1]
    batch_size, max_k, vocab_size : int
    num_draft_tokens : int
        ``T``, the drafts this call verifies (the samplers' ``num_draft_tokens``).
    padded_k : int or None
        ``k`` of a padded batch, else None.
    target_name : str
        The target argument's name, for messages.
    index_label : str
        How messages name an id's index: ``(row, position)`` or ``(request, position)``.
    draft_counts : int64 numpy array [B] or None
        Host copy of ``k_b`` for a ragged batch (what ``draft_offsets`` was made from), so
        that callers need not read the offsets back; None for a padded batch.
    bonus_rows : bool
        Whether ``target_rows`` holds each request's bonus row (``[T + B, V]``), or only
        its draft positions (``[T, V]``, when the bonus ids are given).
    """

    xp: Any
    device: Any
    target_rows: Any
    draft_rows: Any
    draft_token_ids: Any
    bonus_token_ids: Any
    draft_offsets: Any
    batch_size: int
    max_k: int
    vocab_size: int
    num_draft_tokens: int
    padded_k: int | None
    target_name: str = "target_with_bonus_probs"
    index_label: str = "(row, position)"
    draft_counts: Any = None
    bonus_rows: bool = True

    @property
    def kernel_name(self) -> str:
        """The kernel family of chain batches."""
        return "verify_chains"

    def kernel_inputs(self) -> tuple[Any, ...]:
        """``_core.verify_chains``'s arguments between the code and the uniforms."""
        point_mass = self.draft_rows is None
        return (
            self.target_rows,
            self.target_rows if point_mass else self.draft_rows,
            point_mass,
            self.draft_token_ids,
            self.bonus_token_ids,
            self.draft_offsets,
        )

    def threads(self, verifier: Any) -> int:
        """CPU threads for a call of ``verifier`` (a registry entry): a stochastic request
        reads at most two rows, a deterministic one up to ``k_b``."""
        rows = 2 if verifier.stochastic else max(self.max_k, 1)
        return _backend.thread_count(self.batch_size, rows * self.vocab_size)

    def parameters(self, values: tuple[float, ...]) -> Any:
        """A verifier's checked parameters as the kernels read them (float64 ``[P]``)."""
        if not values and self.xp is np:
            return _NO_PARAMETERS
        return self.xp.asarray(values, dtype=self.xp.float64)

    def check_ids(self) -> None:
        """Raise for the first out-of-vocabulary id before anything is drawn (on the GPU
        the kernel reports it, read with the row status)."""
        if self.device is None:
            bad = _core.first_invalid_id(
                self.draft_token_ids, self.bonus_token_ids, self.draft_offsets, self.vocab_size
            )
            if bad is not None:
                self.raise_for_invalid_id(*bad)

    def result(self, block: _contract.OutputBlock) -> _results.VerificationResult:
        """The result of a call whose kernel wrote ``block``."""
        output = block.output_token_ids
        if output.shape[1] != self.max_k + 1:
            # Caller's buffers wider than this batch: the kernel padded them with -1.
            output = output[:, : self.max_k + 1]
        return _results.VerificationResult(
            output, block.accepted_lengths, block.num_accepted, self.num_draft_tokens
        )

    def raise_for_row_status(self, first_bad_row: int, row_status: Any) -> None:
        """The kernel's first failed request as a ``ValueError`` in this layout's terms."""
        _contract.raise_for_row_status(
            first_bad_row,
            row_status,
            self.id_of,
            self.vocab_size,
            target_name=self.target_name,
            index_label=self.index_label,
            row_of=None if self.padded_k is not None else self.flat_row,
        )

    def flat_row(self, request: int, position: int) -> int:
        """The index in ``target_rows`` of a request's row at a draft or bonus position."""
        return int(self.draft_offsets[request]) + (request if self.bonus_rows else 0) + position

    def raise_for_invalid_id(self, request: int, column: int) -> None:
        """``ValueError`` for the out-of-vocabulary id at ``(request, column)``."""
        _contract.raise_for_invalid_id(
            self.id_of,
            request,
            column,
            self.vocab_size,
            target_name=self.target_name,
            index_label=self.index_label,
        )

    def id_of(self, request: int, column: int) -> tuple[str, tuple[int, int], int]:
        """``(argument, index, value)`` of column ``column`` of a request's id row (its draft
        ids, then its bonus id), for error messages."""
        start = int(self.draft_offsets[request])
        k_b = int(self.draft_offsets[request + 1]) - start
        if column < k_b:
            return "draft_token_ids", (request, column), int(self.draft_token_ids[start + column])
        return "bonus_token_ids", (request, 0), int(self.bonus_token_ids[request])

    def draft_position_rows(self) -> Any:
        """The target rows of draft positions (every row but each request's bonus row)."""
        xp = self.xp
        if self.padded_k is not None:
            vocab = self.vocab_size
            rows = self.target_rows.reshape(self.batch_size, self.padded_k + 1, vocab)
            return rows[:, : self.padded_k]
        if not self.bonus_rows:
            return self.target_rows
        keep = xp.ones(self.target_rows.shape[0], dtype=bool)
        keep[self.draft_offsets[1:] + xp.arange(self.batch_size)] = False
        return self.target_rows[keep]


_NO_PARAMETERS = np.empty(0, dtype=np.float64)
_NO_PARAMETERS.flags.writeable = False


@functools.lru_cache(maxsize=64)
def zero_ids(batch_size: int, dtype: np.dtype) -> np.ndarray:
    """Read-only zeros ``[B]``: the bonus ids the kernels ignore when they draw the bonus
    (a ragged batch without ``bonus_token_ids``)."""
    zeros = np.zeros(batch_size, dtype=dtype)
    zeros.flags.writeable = False
    return zeros


@functools.lru_cache(maxsize=64)
def _padded_offsets(batch_size: int, k: int) -> np.ndarray:
    offsets = np.arange(0, (batch_size + 1) * k, k, dtype=np.int64)[: batch_size + 1]
    offsets.flags.writeable = False
    return offsets


def padded_chain(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    strict: bool,
    reads_draft_probs: bool,
) -> ChainBatch:
    """Take the four arguments of the vLLM layout in, check them, make them kernel-ready.

    Always: array types, one backend and device, shapes, dtype families.  In strict mode
    also: exact dtypes (float32, int64) and finite, non-negative probabilities.  Token ids
    are range-checked by the caller before any uniform is drawn, and by the kernels.

    Parameters
    ----------
    target_with_bonus_probs : array [B, k+1, V]
    bonus_token_ids : array [B, 1] or [B]
    draft_probs : array [B, k, V] or None
    draft_token_ids : array [B, k]
    strict : bool
    reads_draft_probs : bool
        False for the verifiers that ignore ``draft_probs`` entirely.

    Returns
    -------
    ChainBatch
    """
    target = _backend.intake(target_with_bonus_probs, "target_with_bonus_probs")
    bonus = _backend.intake(bonus_token_ids, "bonus_token_ids", like=target)
    draft_ids = _backend.intake(draft_token_ids, "draft_token_ids", like=target)
    probs = _backend.intake_if_read(draft_probs, "draft_probs", reads_draft_probs, like=target)
    device = _backend.check_one_device(
        {
            "target_with_bonus_probs": target,
            "bonus_token_ids": bonus,
            "draft_token_ids": draft_ids,
            "draft_probs": probs,
        }
    )
    batch_size, k, vocab_size = _validate.check_shapes(target, bonus, probs, draft_ids)
    xp = _backend.array_namespace(target)
    draft_ids, bonus = _backend.token_ids(
        {"draft_token_ids": draft_ids, "bonus_token_ids": bonus}, xp, strict
    )
    target = _backend.probabilities(target, "target_with_bonus_probs", xp, strict)
    if probs is not None:
        probs = _backend.probabilities(probs, "draft_probs", xp, strict)
        _validate.check_same_float_dtype(target.dtype, probs.dtype)
    if strict:
        _validate.check_probability_values("target_with_bonus_probs", target, xp)
        _validate.check_probability_values("draft_probs", probs, xp)
    if xp is np:
        offsets = _padded_offsets(batch_size, k)
    else:
        offsets = xp.arange(0, (batch_size + 1) * k, k, dtype=xp.int64)[: batch_size + 1]
    return ChainBatch(
        xp=xp,
        device=device,
        target_rows=target.reshape(batch_size * (k + 1), vocab_size),
        draft_rows=None if probs is None else probs.reshape(batch_size * k, vocab_size),
        draft_token_ids=draft_ids.reshape(batch_size * k),
        bonus_token_ids=bonus.reshape(batch_size),
        draft_offsets=offsets,
        batch_size=batch_size,
        max_k=k,
        vocab_size=vocab_size,
        num_draft_tokens=batch_size * k,
        padded_k=k,
    )


def without_sampling_settings(function: _Front) -> _Front:
    """A padded front that refuses every sampling keyword by name, pointing to the ragged
    call that takes them.

    The padded fronts keep vLLM's signature: probabilities verified as given, no sampling
    parameters, no settings, no stops, no logprobs.  A caller who passes one (say
    ``stop_token_ids``) gets a TypeError that names it and says how to run the same batch
    with it: :func:`specdec_np.verify_ragged` with ``k`` drafts per request, the padded
    rows flattened, gives the padded outputs and takes the whole sampling surface.

    Parameters
    ----------
    function : callable
        A padded front.

    Returns
    -------
    callable
        ``function``, refusing the keywords of :data:`SAMPLING_KEYWORDS`.

    Examples
    --------
    >>> from specdec_np._layouts.padded import without_sampling_settings
    >>> @without_sampling_settings
    ... def front(probs, **options):
    ...     return probs
    >>> front(1)
    1
    >>> try:
    ...     front(1, logprobs=2)
    ... except TypeError as error:
    ...     print(str(error).split(";")[0])
    front() takes no sampling settings (logprobs)
    """

    @functools.wraps(function)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not SAMPLING_KEYWORDS.isdisjoint(kwargs):
            given = ", ".join(sorted(SAMPLING_KEYWORDS.intersection(kwargs)))
            name = function.__qualname__
            if "." in name and args:
                # A sampler's method: named by the caller's class, not the private base.
                name = f"{type(args[0]).__name__}.{function.__name__}"
            raise TypeError(
                f"{name}() takes no sampling settings ({given}); "
                "a padded batch is verified on its probabilities as given: for sampling "
                "parameters, penalties, masks, stops or logprobs, pass its rows flattened "
                "to specdec_np.verify_ragged with num_draft_tokens = k for every request"
            )
        return function(*args, **kwargs)

    return refuse  # type: ignore[return-value]
