"""Stateless verifiers of the padded vLLM layout: the functions the sampler classes wrap.

One function per verifier of :mod:`specdec_np.registry` that has a padded front
(``rejection_sample``, ``block_verification_sample``, ``typical_acceptance_sample``,
``greedy_sample``).  Each is a thin front of :func:`run_padded`, the generic driver: it
builds the ``[B, k+1, V]`` batch (:mod:`specdec_np._layouts.padded`), checks the uniform
sources, and hands both to :func:`specdec_np._kernels.dispatch.run`, which runs the chain driver of
the inputs' backend.  They keep no counters, so an engine with its own metrics can call
them directly.  ``docs/semantics.md`` states the rules they implement.

Order of work in every call: every argument is checked (shapes, dtypes, the token-id
range, the uniform sources) before any uniform is drawn, so a bad call moves no
generator.  Only two failures come later: a target row without mass at a position where a
token must be drawn (only the kernel sees it) and an interrupt; then the generators the
call consumed are put back.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from . import registry
from ._kernels import dispatch as _dispatch
from ._layouts import padded as _chains
from ._layouts.ragged import verify_ragged
from ._runtime import arrays as _backend
from ._runtime import checks as _validate
from ._runtime import contract as _contract
from ._runtime import uniforms as _random
from ._runtime.results import TreeVerificationResult, VerificationResult

__all__ = [
    "TreeVerificationResult",
    "VerificationResult",
    "block_verification_sample",
    "create_output",
    "format_output",
    "greedy_sample",
    "rejection_sample",
    "run_padded",
    "typical_acceptance_sample",
]


@_chains.without_sampling_settings
def run_padded(
    verifier: registry.Verifier,
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    parameters: Mapping[str, Any] | None = None,
    uniforms: Any = None,
    generator: Any = None,
    generator_for: Callable[[Any], Any] | None = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
    on_success: Callable[[VerificationResult, Any], None] | None = None,
) -> VerificationResult:
    """Verify a padded ``[B, k+1, V]`` batch with any registered verifier.

    The stateless functions and the samplers are thin fronts of this; a verifier without
    a named front is reached through it too.

    Parameters
    ----------
    verifier : registry.Verifier or registry.RelaxedMethod
        The verifier, an entry of :data:`specdec_np.registry.VERIFIERS`, or a relaxed
        (lossy) method of :data:`specdec_np.registry.RELAXED_METHODS` (run as the ragged
        layout runs it, every row with ``k`` drafts; counted causally).
    target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids : arrays
        As the stateless functions take them (``draft_probs`` is not read by a verifier
        that does not read draft rows).
    parameters : mapping, optional
        The verifier's parameters by name (defaults for the others).
    uniforms, generator : optional
        The uniform sources of a stochastic verifier (ignored by the others), as
        :func:`~specdec_np.rejection_sample` takes them.
    generator_for : callable, optional
        A sampler's ``generator_for(device)``: asked for the generator only after every
        argument has been checked, with the inputs' device.
    seeded_seqs, counter_seeds : mapping, optional
        The per-row uniform sources, as :func:`~specdec_np.rejection_sample` takes them.
    strict_mode : bool
        Also check exact dtypes and that every probability is finite and non-negative.
    on_success : callable, optional
        ``on_success(result, commit)`` records the result before the call counts as done (a
        sampler's counters; see :class:`specdec_np._kernels.dispatch.Commit`).

    Returns
    -------
    VerificationResult
        As the stateless functions return it.

    Examples
    --------
    Any verifier of the registry, with its parameters by name:

    >>> import numpy as np
    >>> from specdec_np import registry
    >>> from specdec_np.verify import run_padded
    >>> target = np.array([[[0.2, 0.8], [0.6, 0.4]]])
    >>> run_padded(registry.get("typical"), target, np.array([[0]]), None, np.array([[1]]),
    ...            parameters={"posterior_threshold": 0.5}).output_token_ids
    array([[1, 0]])
    """
    if isinstance(verifier, registry.RelaxedMethod):
        return _relaxed_padded(
            verifier, target_with_bonus_probs, bonus_token_ids, draft_probs,
            draft_token_ids, parameters=parameters, uniforms=uniforms, generator=generator,
            seeded_seqs=seeded_seqs, counter_seeds=counter_seeds, strict_mode=strict_mode,
        )  # fmt: skip
    strict = _validate.check_strict_mode(strict_mode)
    values = _validate.check_method_parameters(verifier, parameters or {})
    batch = _chains.padded_chain(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs,
        draft_token_ids,
        strict=strict,
        reads_draft_probs=verifier.reads_draft_probs,
    )
    if strict and verifier.requires_normalised_rows:
        _validate.check_row_sums("target_with_bonus_probs", batch.draft_position_rows(), batch.xp)
    sources = None
    if verifier.stochastic:
        sources = _random.RejectionUniforms(
            batch.batch_size,
            batch.max_k,
            batch.xp,
            uniforms=uniforms,
            generator=generator,
            generator_for=generator_for,
            device=batch.device,
            seeded_seqs=seeded_seqs,
            counter_seeds=counter_seeds,
        )
    elif generator_for is not None:
        generator_for(batch.device)
    block = _contract.allocate_output_block(batch.xp, batch.batch_size, batch.max_k + 1)
    return _dispatch.run(
        batch,
        verifier.code,
        sources,
        block,
        batch.threads(verifier),
        after_uniforms=(batch.parameters(values),),
        on_success=on_success,
    )


# A front's own type, kept through its decorator so that static tools see its signature.
_Front = TypeVar("_Front", bound=Callable[..., Any])

_REJECTION = registry.get("rejection")
_BLOCK = registry.get("block")
_TYPICAL = registry.get("typical")
_GREEDY = registry.get("greedy")

_STOCHASTIC_PARAMETERS = """
Parameters
----------
target_with_bonus_probs : float32 or float64 [B, k+1, V]
    Target probabilities; position ``k`` (the bonus position) is only shape-checked.
bonus_token_ids : int64 or int32 [B, 1]
    The token emitted after ``k`` accepted drafts.
draft_probs : same float dtype [B, k, V] or None
    None means point-mass drafts (n-gram, prompt lookup, argmax drafters).
draft_token_ids : int64 or int32 [B, k]
    The draft tokens.
uniforms : float64 or float32 [B, k+1], optional
    Explicit uniforms in ``[0, 1)`` (float32 is widened exactly): columns ``0 .. k-1``
    for the acceptance tests, column ``k`` for the residual draw.  Excludes the three
    options below.
generator : numpy.random.Generator, optional
    Source of the uniforms of rows without a seed; a fresh unseeded generator if None.
seeded_seqs : dict[int, numpy.random.Generator], optional
    Per-row generators (row index -> generator), each consumed by one ``random(k + 1)``.
counter_seeds : dict[int, tuple[int, int]], optional
    Row index -> ``(seed, position)``: counter-based Philox4x32-10 uniforms, a pure
    function of seed, position and draw index (see ``specdec_np.counter_uniforms``).
strict_mode : bool
    Also check exact dtypes and that every probability is finite and non-negative.

Returns
-------
VerificationResult
    ``output_token_ids`` int64 ``[B, k+1]`` (accepted drafts, one new token, then -1),
    ``accepted_lengths`` int64 ``[B]``, ``num_accepted`` int64 ``[B]`` (vLLM's count) and
    ``num_draft_tokens`` ``B * k``.

Raises
------
TypeError, ValueError
    On bad input, before any uniform is drawn (see ``docs/semantics.md``).
"""

_DETERMINISTIC_PARAMETERS = """
Parameters
----------
target_with_bonus_probs : float32 or float64 [B, k+1, V]
    Target probabilities; position ``k`` (the bonus position) is only shape-checked.
bonus_token_ids : int64 or int32 [B, 1]
    The token emitted after ``k`` accepted drafts.
draft_token_ids : int64 or int32 [B, k]
    The draft tokens.
{parameters}strict_mode : bool
    Also check exact dtypes and finite, non-negative probabilities{rows}.

Returns
-------
VerificationResult
    ``output_token_ids`` int64 ``[B, k+1]`` (accepted drafts, one new token, then -1),
    ``accepted_lengths`` int64 ``[B]``, ``num_accepted`` int64 ``[B]`` (vLLM's count) and
    ``num_draft_tokens`` ``B * k``.
"""


def _documented(verifier: registry.Verifier) -> Callable[[_Front], _Front]:
    """Complete a front's docstring with its verifier's rule and the shared parameters,
    and run it on the CUDA device of its first argument."""

    def decorate(function: _Front) -> _Front:
        if verifier.stochastic:
            sections = _STOCHASTIC_PARAMETERS
        else:
            sections = _DETERMINISTIC_PARAMETERS.format(
                parameters="".join(
                    f"{p.name} : float, default {p.default}\n    "
                    f"{p.description.capitalize()}; finite, non-negative.\n"
                    for p in verifier.parameters
                ),
                rows=", and that each row sums to one" if verifier.requires_normalised_rows
                else "",
            )
        # The front's own docstring is its summary and its Examples; the rule and the
        # shared sections go between them (numpydoc wants Examples last).
        summary, marker, examples = inspect.cleandoc(function.__doc__ or "").partition(
            "\nExamples\n"
        )
        function.__doc__ = f"{summary.strip()}\n\n{verifier.summary}\n{sections}" + (
            f"\nExamples\n{examples}" if marker else ""
        )
        return _chains.without_sampling_settings(_backend.on_inputs_device(function))

    return decorate


@_documented(_REJECTION)
def rejection_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
) -> VerificationResult:
    """Verify a padded batch by token-wise rejection sampling (lossless).

    Examples
    --------
    One request with two drafts over three tokens, and explicit uniforms: position 0 passes
    (``0.5 * 0.8 < 0.6``), position 1 fails (``0.9 * 0.9 >= 0.5``), and the residual
    ``max(p - q, 0)`` gives token 1 at the last uniform.

    >>> import numpy as np
    >>> from specdec_np import rejection_sample
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]])
    >>> draft = np.array([[[0.1, 0.8, 0.1], [0.9, 0.05, 0.05]]])
    >>> result = rejection_sample(target, np.array([[2]]), draft, np.array([[1, 0]]),
    ...                           uniforms=np.array([[0.5, 0.9, 0.3]]))
    >>> result.output_token_ids, result.accepted_lengths
    (array([[ 1,  1, -1]]), array([1]))
    """
    return run_padded(
        _REJECTION, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids,
        uniforms=uniforms, generator=generator, seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds, strict_mode=strict_mode,
    )


@_documented(_BLOCK)
def block_verification_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
) -> VerificationResult:
    """Verify a padded batch by block verification (lossless).

    Examples
    --------
    The batch of :func:`rejection_sample`'s example, drawn from a seeded generator:

    >>> import numpy as np
    >>> from specdec_np import block_verification_sample
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]])
    >>> draft = np.array([[[0.1, 0.8, 0.1], [0.9, 0.05, 0.05]]])
    >>> result = block_verification_sample(target, np.array([[2]]), draft, np.array([[1, 0]]),
    ...                                    generator=np.random.default_rng(0))
    >>> result.output_token_ids.shape, int(result.accepted_lengths[0]) <= 2
    ((1, 3), True)
    """
    return run_padded(
        _BLOCK, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids,
        uniforms=uniforms, generator=generator, seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds, strict_mode=strict_mode,
    )


@_documented(_TYPICAL)
def typical_acceptance_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    *,
    posterior_threshold: float = _TYPICAL.parameter_defaults[0],
    posterior_alpha: float = _TYPICAL.parameter_defaults[1],
    strict_mode: bool = False,
) -> VerificationResult:
    """Verify a padded batch by typical acceptance (lossy by design, no randomness).

    Examples
    --------
    Draft 1 is likely enough at position 0; draft 2, at probability 0.05, is not at position
    1, where the target's argmax (token 0) is emitted instead:

    >>> import numpy as np
    >>> from specdec_np import typical_acceptance_sample
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.9, 0.05, 0.05], [0.2, 0.2, 0.6]]])
    >>> typical_acceptance_sample(target, np.array([[2]]), np.array([[1, 2]])).output_token_ids
    array([[ 1,  0, -1]])
    """
    return run_padded(
        _TYPICAL, target_with_bonus_probs, bonus_token_ids, None, draft_token_ids,
        parameters={"posterior_threshold": posterior_threshold,
                    "posterior_alpha": posterior_alpha},
        strict_mode=strict_mode,
    )


@_documented(_GREEDY)
def greedy_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    *,
    strict_mode: bool = False,
) -> VerificationResult:
    """Verify a padded batch greedily (temperature 0: accept while the draft is the argmax).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import greedy_sample
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.9, 0.05, 0.05], [0.2, 0.2, 0.6]]])
    >>> greedy_sample(target, np.array([[2]]), np.array([[1, 2]])).output_token_ids
    array([[ 1,  0, -1]])
    """
    return run_padded(
        _GREEDY, target_with_bonus_probs, bonus_token_ids, None, draft_token_ids,
        strict_mode=strict_mode,
    )


@_backend.on_inputs_device
def create_output(
    accepted: Any,
    substitute_token_ids: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    *,
    vocab_size: int | None = None,
) -> VerificationResult:
    """Format verified rows as vLLM's ``_create_output`` does (docs/semantics.md §1).

    Row ``b`` gets the drafts before the first False of ``accepted[b]`` (position ``r``),
    then ``substitute_token_ids[b, r]`` (or the bonus id if all are True), then -1.

    Parameters
    ----------
    accepted : bool [B, k]
        Acceptance results; True after a False is allowed and counted in ``num_accepted``.
    substitute_token_ids : int64 or int32 [B, k]
        The token emitted at the first rejected position.
    draft_token_ids : int64 or int32 [B, k]
        The draft tokens.
    bonus_token_ids : int64 or int32 [B, 1] or [B]
        The token emitted when every draft is accepted.
    vocab_size : int, optional
        Ids must lie in ``[0, vocab_size)``; without it they must be non-negative.

    Returns
    -------
    VerificationResult
        ``output_token_ids`` int64 ``[B, k+1]``, ``accepted_lengths`` int64 ``[B]`` (up
        to the first False), ``num_accepted`` int64 ``[B]`` (every True) and
        ``num_draft_tokens`` ``B * k``.

    Examples
    --------
    Row 0 accepts its first draft and takes the substitute of position 1; the True after
    the first False counts in ``num_accepted`` only:

    >>> import numpy as np
    >>> from specdec_np import create_output
    >>> result = create_output(np.array([[True, False, True]]), np.array([[5, 6, 7]]),
    ...                        np.array([[1, 2, 3]]), np.array([[9]]))
    >>> result.output_token_ids, result.accepted_lengths, result.num_accepted
    (array([[ 1,  6, -1, -1]]), array([1]), array([2]))
    """
    return format_output(
        accepted, substitute_token_ids, draft_token_ids, bonus_token_ids, vocab_size=vocab_size
    )


def format_output(
    accepted: Any,
    substitute_token_ids: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    *,
    vocab_size: int | None = None,
) -> VerificationResult:
    """:func:`create_output` on the inputs' backend (NumPy or CuPy results, whatever the
    inputs' array library): what a sampler's ``_create_output`` records from.

    Parameters
    ----------
    accepted, substitute_token_ids, draft_token_ids, bonus_token_ids : arrays
        As :func:`~specdec_np.create_output` takes them.
    vocab_size : int, optional
        As :func:`~specdec_np.create_output` takes it.

    Returns
    -------
    VerificationResult
        As :func:`~specdec_np.create_output` returns it, in NumPy or CuPy arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np.verify import format_output
    >>> format_output(np.array([[True, True]]), np.array([[5, 6]]), np.array([[1, 2]]),
    ...               np.array([9])).output_token_ids
    array([[1, 2, 9]])
    """
    accepted = _backend.intake(accepted, "accepted")
    substitute = _backend.intake(substitute_token_ids, "substitute_token_ids")
    draft = _backend.intake(draft_token_ids, "draft_token_ids")
    bonus = _backend.intake(bonus_token_ids, "bonus_token_ids")
    device = _backend.check_one_device(
        {
            "accepted": accepted,
            "substitute_token_ids": substitute,
            "draft_token_ids": draft,
            "bonus_token_ids": bonus,
        }
    )
    xp = _backend.array_namespace(draft)
    batch_size, k = _validate.check_output_shapes(accepted, substitute, draft, bonus)
    if accepted.dtype != xp.bool_:
        raise TypeError(f"accepted must have dtype bool; found {accepted.dtype}")
    for name, ids in (
        ("substitute_token_ids", substitute),
        ("draft_token_ids", draft),
        ("bonus_token_ids", bonus),
    ):
        _validate.check_token_id_dtype(name, ids.dtype, strict=False)
    if not substitute.dtype == draft.dtype == bonus.dtype:
        substitute, draft, bonus = (ids.astype(xp.int64) for ids in (substitute, draft, bonus))
    limit = _validate.check_vocab_size(vocab_size)
    draft = xp.ascontiguousarray(draft)
    bonus = xp.ascontiguousarray(bonus.reshape(batch_size))
    block = _contract.allocate_output_block(xp, batch_size, k + 1)
    first_bad_row = _dispatch.kernels_for(device).create_output(
        xp.ascontiguousarray(accepted).view(xp.uint8),
        xp.ascontiguousarray(substitute),
        draft,
        bonus,
        limit,
        *block,
    )

    def id_of(row: int, column: int) -> tuple[str, tuple[int, int], int]:
        if column < k:
            return "draft_token_ids", (row, column), int(draft[row, column])
        if column == k:
            return "bonus_token_ids", (row, 0), int(bonus[row])
        return "substitute_token_ids", (row, column - k - 1), int(substitute[row, column - k - 1])

    _contract.raise_for_row_status(
        _backend.first_failed_row(first_bad_row, block.row_status),
        block.row_status,
        id_of,
        limit,
    )
    return VerificationResult(
        block.output_token_ids, block.accepted_lengths, block.num_accepted, batch_size * k
    )


def _relaxed_padded(
    method: registry.RelaxedMethod,
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    parameters: Mapping[str, Any] | None,
    uniforms: Any,
    generator: Any,
    seeded_seqs: Mapping[int, Any] | None,
    counter_seeds: Mapping[int, tuple[int, int]] | None,
    strict_mode: bool,
) -> VerificationResult:
    """A relaxed method on a padded batch: the same rows as a ragged batch of ``k`` drafts
    a row (the bonus row in place, the bonus ids given), and the padded uniforms ``[B, k +
    1]`` with the ragged layout's unread bonus column added."""
    batch = _chains.padded_chain(
        target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids,
        strict=_validate.check_strict_mode(strict_mode), reads_draft_probs=True,
    )  # fmt: skip
    xp, rows, k = batch.xp, batch.batch_size, batch.max_k
    if uniforms is not None:
        _validate.check_uniforms(uniforms, rows, k)
        uniforms = xp.concatenate([xp.asarray(uniforms), xp.zeros((rows, 1))], axis=1)
    result = verify_ragged(
        num_draft_tokens=np.full(rows, k, dtype=np.int64),
        draft_token_ids=xp.reshape(batch.draft_token_ids, (-1,)),
        target_probs=xp.reshape(batch.target_rows, (-1, batch.vocab_size)),
        draft_probs=None if batch.draft_rows is None else xp.reshape(
            batch.draft_rows, (-1, batch.vocab_size)
        ),
        bonus_token_ids=xp.reshape(batch.bonus_token_ids, (-1,)),
        method=method.name, uniforms=uniforms, generator=generator,
        seeded_seqs=seeded_seqs, counter_seeds=counter_seeds,
        **dict(parameters or {}),
    )  # fmt: skip
    return VerificationResult(
        result.output_token_ids, result.accepted_lengths, result.num_accepted, rows * k
    )
