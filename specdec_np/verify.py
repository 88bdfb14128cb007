"""Stateless verifiers: the functions the sampler classes wrap.

One function per verifier of :mod:`specdec_np.registry` (``rejection_sample``,
``block_verification_sample``, ``typical_acceptance_sample``, ``greedy_sample``), made here
from its registry entry.  Each takes the vLLM arguments, validates them, runs the chain
driver of the inputs' backend and returns a :class:`VerificationResult`.  They keep no
counters, so an engine with its own metrics can call them directly.  ``docs/semantics.md``
states the rules they implement.

Order of work in every call: every argument is checked (shapes, dtypes, the token-id
range, the uniform sources) before any uniform is drawn, so a bad call moves no
generator.  Only two failures come later: a target row without mass at a position where a
token must be drawn (only the kernel sees it) and an interrupt; then the generators the
call consumed are put back.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from . import (
    _backend,
    _contract,
    _core,
    _dispatch,  # noqa: F401  (importing it binds the kernels' tables from the registry)
    _layout,
    _random,
    _validate,
    registry,
)

__all__ = [
    "TreeVerificationResult",
    "VerificationResult",
    "create_output",
    *(verifier.function_name for verifier in registry.VERIFIERS),
]


class _Outputs(NamedTuple):
    output_token_ids: Any
    accepted_lengths: Any
    num_accepted: Any


class VerificationResult(_Outputs):
    """What a verifier returns: a named triple, plus the number of drafts it verified.

    Attributes
    ----------
    output_token_ids : int64 [B, k+1]
        Accepted draft prefix, then the recovered or bonus token, then -1.
    accepted_lengths : int64 [B]
        Length ``r_b`` of the accepted prefix; row ``b`` emits ``r_b + 1`` tokens.
    num_accepted : int64 [B]
        Acceptance count per row: positions whose test passed, after the first rejection
        too (vLLM's semantics), or the accepted prefix for causal verifiers (block).
    num_draft_tokens : int
        Draft tokens verified by the call (``B * k`` for a padded batch; the default when
        it is not given).  Not part of the triple, so ``output, lengths, accepted =
        result`` keeps working.
    """

    def __new__(
        cls,
        output_token_ids: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        num_draft_tokens: int | None = None,
    ) -> VerificationResult:
        result = super().__new__(cls, output_token_ids, accepted_lengths, num_accepted)
        if num_draft_tokens is None:
            rows, width = output_token_ids.shape
            num_draft_tokens = rows * (width - 1)
        result.num_draft_tokens = int(num_draft_tokens)
        return result

    @classmethod
    def _make(cls, iterable: Any) -> VerificationResult:
        # _replace goes through _make; keep the draft count of a padded batch.
        return cls(*iterable)


_EMPTY_UNIFORMS = np.empty((0, 0), dtype=np.float64)


def verify_chain_batch(
    verifier: registry.Verifier,
    batch: _layout.ChainBatch,
    parameters: tuple[float, ...] = (),
    sources: _random.RejectionUniforms | None = None,
    on_success: Callable[[VerificationResult], None] | None = None,
    *,
    request_methods: Any = None,
    causal: bool = False,
    draw_bonus: bool = False,
    sampling: Any = None,
    block: _contract.OutputBlock | None = None,
) -> VerificationResult:
    """Run a verifier's row function over a validated chain batch.

    Parameters
    ----------
    verifier : registry.Verifier
    batch : ChainBatch
        From a layout of :mod:`specdec_np._layout`.
    parameters : tuple of float
        The verifier's parameters, checked, in registry order.
    sources : RejectionUniforms, optional
        The checked uniform sources (stochastic verifiers).
    on_success : callable, optional
        Called with the result before the call counts as done (a sampler's counters), so
        that an interrupt leaves the generators and the counters both updated or both not.
    request_methods : int8 array [B], optional
        Per-request row functions (registry codes).
    causal, draw_bonus : bool
        As the chain driver takes them (the engine layout sets both).
    sampling : float64 array [B, 4], optional
        The rows are logits, processed with these per-request parameters.
    block : OutputBlock, optional
        Output buffers to fill (``[B, max_k + 1]`` and ``[B]``); allocated when None.

    Returns
    -------
    VerificationResult
    """
    xp = batch.xp
    if batch.device is None:
        # Ids are checked before any draw: a bad id must not move a generator.
        bad = _core.first_invalid_id(
            batch.draft_token_ids, batch.bonus_token_ids, batch.draft_offsets, batch.vocab_size
        )
        if bad is not None:
            batch.raise_for_invalid_id(*bad)
    if block is None:
        block = _contract.allocate_output_block(xp, batch.batch_size, batch.max_k + 1)
    threads = _backend.thread_count(
        batch.batch_size, (2 if verifier.stochastic else max(batch.max_k, 1)) * batch.vocab_size
    )
    options = _driver_options(request_methods, causal, draw_bonus)
    if sampling is not None:
        options["sampling"] = sampling
        # The processed target and draft row of a request: per CPU thread, or per request
        # on the GPU (one thread block each).
        rows = threads if batch.device is None else batch.batch_size
        options["scratch"] = _scratch_rows(xp, rows, batch.vocab_size, batch.target_rows.dtype)
    snapshot = sources.snapshot() if sources is not None else None
    point_mass = batch.draft_rows is None
    try:
        if sources is not None:
            uniforms = sources.draw()
        else:
            uniforms = _EMPTY_UNIFORMS if xp is np else xp.empty((0, 0), dtype=xp.float64)
        first_bad_row = _chain_kernel(batch)(
            verifier.code,
            batch.target_rows,
            batch.target_rows if point_mass else batch.draft_rows,
            point_mass,
            batch.draft_token_ids,
            batch.bonus_token_ids,
            batch.draft_offsets,
            uniforms,
            xp.asarray(parameters, dtype=xp.float64),
            *block,
            threads,
            # The engine layout's options, passed only when used.
            **options,
        )
        first = _backend.first_failed_row(first_bad_row, block.row_status)
        if first >= 0:
            batch.raise_for_row_status(first, block.row_status)
        output = block.output_token_ids
        if output.shape[1] != batch.max_k + 1:
            # Caller's buffers wider than this batch: the kernel padded them with -1.
            output = output[:, : batch.max_k + 1]
        result = VerificationResult(
            output,
            block.accepted_lengths,
            block.num_accepted,
            batch.num_draft_tokens,
        )
        if on_success is not None:
            on_success(result)
        return result
    except BaseException:
        if snapshot is not None:
            snapshot.restore()
        raise


# The CPU driver's specialisations by (row dtype, id dtype): calling one directly skips
# the fused-type dispatch, microseconds that a small batch notices.
_CPU_CHAIN_KERNELS = {
    (np.dtype(row_dtype), np.dtype(id_dtype)): _core.verify_chains[row_type, id_type]
    for row_dtype, row_type in ((np.float32, "float"), (np.float64, "double"))
    for id_dtype, id_type in ((np.int32, "int32_t"), (np.int64, "int64_t"))
}


def _chain_kernel(batch: _layout.ChainBatch) -> Callable[..., Any]:
    if batch.device is None:
        kernel = _CPU_CHAIN_KERNELS.get((batch.target_rows.dtype, batch.draft_token_ids.dtype))
        if kernel is not None:
            return kernel
    return _backend.kernels_for(batch.device).verify_chains


_SCRATCH = threading.local()


def _scratch_rows(xp: Any, threads: int, vocab_size: int, dtype: Any) -> Any:
    """The kernels' working rows ``[threads, 2 V]``, kept per Python thread.

    A fresh ``[threads, 2 V]`` allocation is large enough to be mapped anew by the
    allocator, and its pages faulted in, on every call; the driver overwrites what it
    reads, so one buffer per Python thread (never shared by two concurrent calls) serves
    every call of that thread.
    """
    if xp is not np:
        return xp.empty((threads, 2 * vocab_size), dtype=dtype)
    key = (threads, vocab_size, np.dtype(dtype))
    cached = getattr(_SCRATCH, "rows", None)
    if cached is None or cached[0] != key:
        cached = (key, np.empty((threads, 2 * vocab_size), dtype=dtype))
        _SCRATCH.rows = cached
    return cached[1]


class TreeVerificationResult(NamedTuple):
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
    """

    accepted_nodes: Any
    output_token_ids: Any
    accepted_lengths: Any


def verify_tree_batch(
    method: registry.TreeMethod,
    batch: Any,
    sources: _random.RejectionUniforms,
    *,
    request_methods: Any = None,
    sampling: Any = None,
    block: _contract.TreeOutputBlock | None = None,
) -> TreeVerificationResult:
    """Run a tree method's walk over a validated tree batch.

    Parameters
    ----------
    method : registry.TreeMethod
    batch : specdec_np._trees.TreeBatch
    sources : RejectionUniforms
        The checked uniform sources (``[B, max_nodes + 1]``).
    request_methods : int8 array [B], optional
        Per-request walks (registry codes).
    sampling : float64 array [B, 4], optional
        The rows are logits, processed with these per-request parameters.
    block : TreeOutputBlock, optional
        Output buffers (``[B, max_depth]``, ``[B, max_depth + 1]``, ``[B]``).

    Returns
    -------
    TreeVerificationResult
    """
    xp = batch.xp
    layout = batch.layout
    vocab_size = batch.vocab_size
    if block is None:
        block = _contract.allocate_tree_output_block(xp, layout.batch_size, layout.max_depth)
    threads = _backend.thread_count(layout.batch_size, 2 * vocab_size)
    # Working rows are per CPU thread, or per request on the GPU (one thread block each).
    rows = threads if batch.device is None else layout.batch_size
    options: dict[str, Any] = {}
    if request_methods is not None:
        options["request_methods"] = request_methods
    if sampling is not None:
        options["sampling"] = sampling
        # The processed target and draft row of the node being walked.
        options["scratch"] = _scratch_rows(xp, rows, vocab_size, batch.target_rows.dtype)
    stochastic = method.stochastic or request_methods is not None
    if stochastic:
        # The residual and its update: allocated once per call, not per node.
        options["working"] = xp.empty((rows, 2 * vocab_size), dtype=xp.float64)
    snapshot = sources.snapshot()
    point_mass = batch.draft_rows is None
    try:
        uniforms = sources.draw()
        reported = _backend.kernels_for(batch.device).verify_trees(
            method.code,
            batch.target_rows,
            batch.target_rows if point_mass else batch.draft_rows,
            point_mass,
            batch.draft_token_ids,
            batch.tree_parents,
            xp.asarray(layout.node_offsets),
            uniforms,
            *block,
            threads,
            **options,
        )
        first_bad_row = _backend.first_failed_row(reported, block.row_status)
        if first_bad_row >= 0:
            batch.raise_for_row_status(first_bad_row, int(block.row_status[first_bad_row]))
        nodes, output = block.accepted_nodes, block.output_token_ids
        if nodes.shape[1] != layout.max_depth:
            # Caller's buffers deeper than this batch: the kernel padded them with -1.
            nodes = nodes[:, : layout.max_depth]
            output = output[:, : layout.max_depth + 1]
        return TreeVerificationResult(nodes, output, block.accepted_lengths)
    except BaseException:
        snapshot.restore()
        raise


def _driver_options(request_methods: Any, causal: bool, draw_bonus: bool) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if request_methods is not None:
        options["request_methods"] = request_methods
    if causal:
        options["causal"] = True
    if draw_bonus:
        options["draw_bonus"] = True
    return options


def check_parameters(verifier: registry.Verifier, given: Mapping[str, Any]) -> tuple[float, ...]:
    """A verifier's parameters from keyword arguments, checked, in registry order.

    Raises
    ------
    TypeError
        For an unknown keyword or a parameter that is not a real number.
    ValueError
        For a parameter that is negative or not finite.
    """
    if not given and not verifier.parameters:
        return ()
    unknown = set(given).difference(verifier.parameter_names)
    if unknown:
        expected = ", ".join(verifier.parameter_names) or "none"
        raise TypeError(
            f"{verifier.function_name}() got unexpected keyword argument(s) "
            f"{', '.join(sorted(unknown))}; its parameters are: {expected}"
        )
    return tuple(
        _validate.check_posterior(p.name, given.get(p.name, p.default))
        for p in verifier.parameters
    )


def _chain_batch(
    verifier: registry.Verifier,
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    strict_mode: bool,
) -> _layout.ChainBatch:
    batch = _layout.padded_chain(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs,
        draft_token_ids,
        strict=strict_mode,
        reads_draft_probs=verifier.reads_draft_probs,
    )
    if strict_mode and verifier.requires_normalised_rows:
        _validate.check_row_sums("target_with_bonus_probs", batch.draft_position_rows(), batch.xp)
    return batch


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
    on_success: Callable[[VerificationResult], None] | None = None,
) -> VerificationResult:
    """Verify a padded ``[B, k+1, V]`` batch with any registered verifier.

    The stateless functions and the samplers are thin fronts of this.  ``generator_for``
    (a sampler's) is asked for the generator only after every argument has been checked,
    with the inputs' device; ``generator`` is the stateless functions' argument.
    """
    strict = _validate.check_strict_mode(strict_mode)
    values = check_parameters(verifier, parameters or {})
    batch = _chain_batch(
        verifier, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, strict
    )
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
    return verify_chain_batch(verifier, batch, values, sources, on_success)


_STOCHASTIC_DOC = """{summary}

Parameters
----------
target_with_bonus_probs : float32 or float64 [B, k+1, V]
    Target probabilities; position ``k`` (the bonus position) is only shape-checked.
bonus_token_ids : int64 or int32 [B, 1]
draft_probs : same float dtype [B, k, V] or None
    None means point-mass drafts (n-gram, prompt lookup, argmax drafters).
draft_token_ids : int64 or int32 [B, k]
uniforms : float64 [B, k+1], optional
    Explicit uniforms in ``[0, 1)``: columns ``0 .. k-1`` for the acceptance tests,
    column ``k`` for the residual draw.  Excludes the three options below.
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

Raises
------
TypeError, ValueError
    On bad input, before any uniform is drawn (see ``docs/semantics.md``).
"""

_DETERMINISTIC_DOC = """{summary}

Parameters
----------
target_with_bonus_probs : float32 or float64 [B, k+1, V]
bonus_token_ids : int64 or int32 [B, 1]
draft_token_ids : int64 or int32 [B, k]
{parameters}strict_mode : bool
    Also check exact dtypes and finite, non-negative probabilities{rows}.

Returns
-------
VerificationResult
"""


def _parameter_doc(verifier: registry.Verifier) -> str:
    return "".join(
        f"{p.name} : float, default {p.default}\n    {p.description.capitalize()}; finite, "
        "non-negative.\n"
        for p in verifier.parameters
    )


def _make_stochastic(verifier: registry.Verifier) -> Callable[..., VerificationResult]:
    def function(
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
        return run_padded(
            verifier,
            target_with_bonus_probs,
            bonus_token_ids,
            draft_probs,
            draft_token_ids,
            uniforms=uniforms,
            generator=generator,
            seeded_seqs=seeded_seqs,
            counter_seeds=counter_seeds,
            strict_mode=strict_mode,
        )

    function.__doc__ = _STOCHASTIC_DOC.format(summary=verifier.summary)
    return function


def _make_deterministic(verifier: registry.Verifier) -> Callable[..., VerificationResult]:
    def function(
        target_with_bonus_probs: Any,
        bonus_token_ids: Any,
        draft_token_ids: Any,
        *,
        strict_mode: bool = False,
        **parameters: float,
    ) -> VerificationResult:
        return run_padded(
            verifier,
            target_with_bonus_probs,
            bonus_token_ids,
            None,
            draft_token_ids,
            parameters=parameters,
            strict_mode=strict_mode,
        )

    keyword = inspect.Parameter.KEYWORD_ONLY
    signature = inspect.signature(function)
    listed = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    listed[3:3] = [
        inspect.Parameter(p.name, keyword, default=p.default, annotation=float)
        for p in verifier.parameters
    ]
    function.__signature__ = signature.replace(parameters=listed)  # type: ignore[attr-defined]
    function.__doc__ = _DETERMINISTIC_DOC.format(
        summary=verifier.summary,
        parameters=_parameter_doc(verifier),
        rows=", and that each row sums to one" if verifier.requires_normalised_rows else "",
    )
    return function


def _publish(verifier: registry.Verifier) -> Callable[..., VerificationResult]:
    make = _make_stochastic if verifier.stochastic else _make_deterministic
    function = make(verifier)
    function.__name__ = function.__qualname__ = verifier.function_name
    function.__module__ = __name__
    wrapped = _backend.on_inputs_device(function)
    globals()[verifier.function_name] = wrapped
    return wrapped


for _verifier in registry.VERIFIERS:
    _publish(_verifier)
del _verifier


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
    substitute_token_ids, draft_token_ids : int64 or int32 [B, k]
    bonus_token_ids : int64 or int32 [B, 1] or [B]
    vocab_size : int, optional
        Ids must lie in ``[0, vocab_size)``; without it they must be non-negative.

    Returns
    -------
    VerificationResult
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
    first_bad_row = _backend.kernels_for(device).create_output(
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
