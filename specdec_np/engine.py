"""The engine layout: ragged batches, per-request sampling parameters, mixed methods.

:func:`verify_ragged` verifies the flat batch that vLLM v1, SGLang and the llama.cpp server
hand a verifier: request ``b`` proposes ``k_b >= 0`` drafts, the target rows of all
requests are stacked ``[T + B, V]`` (request ``b``'s ``k_b`` draft positions, then its
bonus position), and greedy (``temperature == 0``) and sampled requests share one call and
one kernel launch.  :class:`EngineVerifier` wraps it with running
:class:`~specdec_np.metrics.VerificationMetrics`.  ``docs/semantics.md`` states the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _backend, _contract, _layout, _random, _trees, _validate, registry, verify
from .metrics import VerificationMetrics

__all__ = [
    "EngineVerifier",
    "output_buffers",
    "tree_output_buffers",
    "verify_ragged",
    "verify_tree",
]

_GREEDY = registry.get("greedy")
_GREEDY_TREE = registry.get_tree_method("greedy")


def output_buffers(batch_size: int, max_draft_tokens: int, xp: Any = np) -> _contract.OutputBlock:
    """Buffers for ``verify_ragged(..., out=...)``, so that a steady-state engine allocates
    nothing per call.

    Parameters
    ----------
    batch_size : int
        ``B``.
    max_draft_tokens : int
        The largest ``k_b`` the buffers must hold (output width ``max_draft_tokens + 1``).
    xp : module
        ``numpy`` or ``cupy`` (on the current device).

    Returns
    -------
    OutputBlock
        ``output_token_ids`` int64 ``[B, max_draft_tokens + 1]`` and three int64 ``[B]``
        arrays (accepted lengths, acceptance counts, row status).
    """
    return _contract.allocate_output_block(xp, int(batch_size), int(max_draft_tokens) + 1)


def _check_out(out: Any, batch: _layout.ChainBatch) -> _contract.OutputBlock:
    if not isinstance(out, _contract.OutputBlock):
        raise TypeError(
            "out must be the OutputBlock of specdec_np.output_buffers(B, max_k); found "
            f"{type(out).__name__}"
        )
    xp = batch.xp
    rows, width = (int(n) for n in out.output_token_ids.shape)
    if rows != batch.batch_size or width < batch.max_k + 1:
        raise ValueError(
            f"out must hold [B, >= max k + 1] = [{batch.batch_size}, {batch.max_k + 1}] "
            f"outputs; found {_validate.shape_text(out.output_token_ids.shape)}"
        )
    for name, array in zip(out._fields, out):
        if _backend.array_namespace(array) is not xp or array.dtype != np.int64:
            raise TypeError(f"out.{name} must be an int64 array of the inputs' backend")
        if array.ndim == 1 and array.shape[0] != batch.batch_size:
            raise ValueError(f"out.{name} must have shape [B] = [{batch.batch_size}]")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"out.{name} must be C-contiguous and writeable")
    if _backend.device_of(out.output_token_ids) != batch.device:
        raise ValueError("out must be on the inputs' device")
    return out


def verify_ragged(
    *,
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
    bonus_token_ids: Any = None,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
    out: _contract.OutputBlock | None = None,
    **method_parameters: float,
) -> verify.VerificationResult:
    """Verify a flat engine batch: ragged drafts, per-request parameters, mixed methods.

    Parameters
    ----------
    num_draft_tokens : int array [B]
        ``k_b >= 0`` drafts per request (0: the request only gets its bonus token).
    draft_token_ids : int64 or int32 [T], ``T = sum k_b``
        The drafts, request by request.
    target_probs : float32 or float64 [T + B, V], optional
        Request ``b`` owns ``k_b + 1`` consecutive rows: its draft positions, then its
        bonus position.  Taken as already processed (exactly one of ``target_logits`` and
        ``target_probs``).
    target_logits : float32 or float64 [T + B, V], optional
        The target's logits, in the layout of ``target_probs``; each row a request reads
        is processed with its ``temperature``, ``min_p``, ``top_k`` and ``top_p`` (the law
        of ``docs/semantics.md``), and only the rows it reads are.
    draft_probs : same dtype [T, V] or None
        The distributions the drafts were drawn from; None for point-mass drafts.
    draft_logits : same dtype [T, V], optional
        The draft's logits (with ``target_logits``), processed like the target's.
    method : str
        A registry name (``specdec_np.registry.names()``): the verifier of the requests
        with ``temperature != 0``.
    temperature : scalar or array [B], optional
        ``0`` makes a request greedy: verified on its raw rows (accept while the draft is
        the argmax), the others by ``method``.  With logits it also scales them; with
        probabilities it only says which requests are greedy.  None: 1, every request
        uses ``method``.
    top_k, top_p, min_p : scalar or array [B], optional
        Sampling filters of logits rows (``top_k`` 0 or >= V, ``top_p`` 1 and ``min_p``
        0 are off); a ValueError with probabilities, which are taken as processed.
    bonus_token_ids : int [B], optional
        None: a request whose drafts are all accepted draws its bonus token from its
        processed bonus row (the argmax for a greedy request), reading that row only then.
    uniforms : float64 [B, max_k + 2], optional
        Explicit uniforms in ``[0, 1)``: request ``b`` uses columns ``0 .. k_b - 1``
        (acceptance), ``k_b`` (residual) and ``k_b + 1`` (bonus).  Every entry is checked.
    generator, seeded_seqs, counter_seeds
        The other sources of uniforms, keyed by request: a sampled request consumes
        exactly ``k_b + 2`` draws from its source whatever the outcome, a greedy one none.
    strict_mode : bool
        Also check exact dtypes and finite, non-negative probabilities.
    out : OutputBlock, optional
        Buffers from :func:`output_buffers` to write into.
    **method_parameters : float
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``).

    Returns
    -------
    VerificationResult
        ``output_token_ids`` int64 ``[B, max_k + 1]`` (-1 padded), ``accepted_lengths``
        int64 ``[B]`` (causal), ``num_accepted`` (equal to ``accepted_lengths``: every
        request stops at its first rejection and the rows after it are never read), and
        ``num_draft_tokens`` ``T``.

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument and the request, before any uniform is drawn.
    """
    with _backend.device_context(target_probs if target_probs is not None else target_logits):
        return _verify_ragged(
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
            bonus_token_ids=bonus_token_ids,
            uniforms=uniforms,
            generator=generator,
            seeded_seqs=seeded_seqs,
            counter_seeds=counter_seeds,
            strict_mode=strict_mode,
            out=out,
            method_parameters=method_parameters,
        )


def _verify_ragged(
    *,
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_logits: Any,
    target_probs: Any,
    draft_logits: Any,
    draft_probs: Any,
    method: str,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    bonus_token_ids: Any,
    uniforms: Any,
    generator: Any,
    seeded_seqs: Any,
    counter_seeds: Any,
    strict_mode: bool,
    out: Any,
    method_parameters: Mapping[str, Any],
    generator_for: Any = None,
    on_success: Any = None,
) -> verify.VerificationResult:
    strict = _validate.check_strict_mode(strict_mode)
    verifier = registry.get(method)
    parameters = verify.check_parameters(verifier, method_parameters)
    from_logits, target_name, draft_name = _row_form(
        target_logits, target_probs, draft_logits, draft_probs
    )
    batch = _layout.ragged_chain(
        num_draft_tokens,
        draft_token_ids,
        target_logits if from_logits else target_probs,
        draft_logits if from_logits else draft_probs,
        bonus_token_ids,
        strict=strict,
        reads_draft_probs=verifier.reads_draft_probs,
        target_name=target_name,
        draft_name=draft_name,
    )
    sampling = _checked_sampling(
        batch.xp, batch.batch_size, batch.vocab_size, strict, from_logits,
        (target_name, batch.target_rows), (draft_name, batch.draft_rows),
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
    )
    counts = batch.draft_counts
    batch_size = batch.batch_size
    greedy = _greedy_requests(sampling, verifier is _GREEDY, batch_size)
    num_greedy = int(np.count_nonzero(greedy))
    all_greedy = num_greedy == batch_size
    if strict and not from_logits and num_greedy:
        # Greedy verification of probabilities accepts p(x) > 1/2 unread: its rows must
        # be distributions, as for the padded greedy verifier.
        rows = np.repeat(greedy, counts + 1)
        rows[np.cumsum(counts + 1) - 1] = False  # bonus rows are not tested
        _validate.check_row_sums(target_name, batch.target_rows[batch.xp.asarray(rows)], batch.xp)
    request_methods = None
    if num_greedy and not all_greedy:
        codes = np.where(greedy, _GREEDY.code, verifier.code)
        request_methods = batch.xp.asarray(codes.astype(np.int8))
    chosen = _GREEDY if all_greedy and batch_size else verifier
    draw_bonus = bonus_token_ids is None
    # Built even when every request is greedy, so that a bad source is refused whatever
    # the batch holds; greedy requests draw nothing from it.
    sources = _random.RejectionUniforms(
        batch_size,
        batch.max_k + 1,
        batch.xp,
        uniforms=uniforms,
        generator=generator,
        generator_for=generator_for,
        device=batch.device,
        seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds,
        row_widths=np.zeros(batch_size, dtype=np.int64)
        if all_greedy
        else np.where(greedy, 0, counts + 2),
    )
    block = None if out is None else _check_out(out, batch)
    processing = None
    if from_logits:
        processing = batch.xp.asarray(_sampling_table(sampling, greedy, batch.batch_size))
    return verify.verify_chain_batch(
        chosen,
        batch,
        parameters if chosen is verifier else (),
        sources,
        None if on_success is None else lambda result: on_success(counts, result.accepted_lengths),
        request_methods=request_methods,
        causal=True,
        draw_bonus=draw_bonus,
        sampling=processing,
        block=block,
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
    """
    return _contract.allocate_tree_output_block(xp, int(batch_size), int(max_depth))


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
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
    out: _contract.TreeOutputBlock | None = None,
) -> verify.TreeVerificationResult:
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
    target_probs : float32 or float64 [N + B, V], optional
        Per request its root row (the law of the first new token), then one row per node
        (the law of the token after it).  Taken as already processed.
    target_logits : float32 or float64 [N + B, V], optional
        The same rows as logits; each row the walk reads is processed with the request's
        ``temperature``, ``min_p``, ``top_k`` and ``top_p`` (exactly one of the two).
    draft_probs, draft_logits : same dtype [N, V], optional
        The distribution each node was drawn from (``"specinfer"``, ``"rrs"``); None for
        deterministic candidates.
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
    uniforms : float64 [B, max_nodes + 1], optional
        Request ``b`` uses column ``j`` for node ``j``'s test and column ``N_b`` for the
        final token.
    generator, seeded_seqs, counter_seeds
        The other sources of uniforms, keyed by request: a sampled request consumes
        exactly ``N_b + 1`` draws from its source whatever the walk, a greedy one none.
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
    strict = _validate.check_strict_mode(strict_mode)
    tree_method = registry.get_tree_method(method)
    from_logits, target_name, draft_name = _row_form(
        target_logits, target_probs, draft_logits, draft_probs
    )
    batch = _trees.tree_batch(
        num_nodes,
        tree_parents,
        draft_token_ids,
        target_logits if from_logits else target_probs,
        draft_logits if from_logits else draft_probs,
        strict=strict,
        reads_draft_probs=tree_method.reads_draft_probs,
        target_name=target_name,
        draft_name=draft_name,
    )
    layout = batch.layout
    sampling = _checked_sampling(
        batch.xp, layout.batch_size, batch.vocab_size, strict, from_logits,
        (target_name, batch.target_rows), (draft_name, batch.draft_rows),
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
    )
    greedy = _greedy_requests(sampling, tree_method is _GREEDY_TREE, layout.batch_size)
    request_methods = None
    if greedy.any() and not greedy.all():
        codes = np.where(greedy, _GREEDY_TREE.code, tree_method.code)
        request_methods = batch.xp.asarray(codes.astype(np.int8))
    chosen = _GREEDY_TREE if greedy.all() and layout.batch_size else tree_method
    sources = _random.RejectionUniforms(
        layout.batch_size,
        layout.max_nodes,
        batch.xp,
        uniforms=uniforms,
        generator=generator,
        device=batch.device,
        seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds,
        row_widths=np.where(greedy, 0, layout.num_nodes + 1),
    )
    block = None if out is None else _check_tree_out(out, batch)
    processing = None
    if from_logits:
        processing = batch.xp.asarray(_sampling_table(sampling, greedy, layout.batch_size))
    return verify.verify_tree_batch(
        chosen, batch, sources, request_methods=request_methods, sampling=processing, block=block
    )


def _check_tree_out(out: Any, batch: _trees.TreeBatch) -> _contract.TreeOutputBlock:
    layout = batch.layout
    if not isinstance(out, _contract.TreeOutputBlock):
        raise TypeError(
            "out must be the TreeOutputBlock of specdec_np.tree_output_buffers(B, max_depth); "
            f"found {type(out).__name__}"
        )
    rows, depth = (int(n) for n in out.accepted_nodes.shape)
    if rows != layout.batch_size or depth < layout.max_depth:
        raise ValueError(
            f"out must hold [B, >= max depth] = [{layout.batch_size}, {layout.max_depth}] "
            f"nodes; found {_validate.shape_text(out.accepted_nodes.shape)}"
        )
    expected = {
        "accepted_nodes": (rows, depth),
        "output_token_ids": (rows, depth + 1),
        "accepted_lengths": (rows,),
        "row_status": (rows,),
    }
    for name, array in zip(out._fields, out):
        ours = isinstance(array, np.ndarray) if batch.xp is np else _backend.is_cupy_array(array)
        if not ours or array.dtype != np.int64:
            raise TypeError(f"out.{name} must be an int64 array of the inputs' backend")
        if tuple(array.shape) != expected[name]:
            raise ValueError(
                f"out.{name} must have shape {list(expected[name])}; found "
                f"{_validate.shape_text(array.shape)}"
            )
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"out.{name} must be C-contiguous and writeable")
    if _backend.device_of(out.accepted_nodes) != batch.device:
        raise ValueError("out must be on the inputs' device")
    return out


def _row_form(
    target_logits: Any, target_probs: Any, draft_logits: Any, draft_probs: Any
) -> tuple[bool, str, str]:
    """Whether the rows are logits, and the names of the target and draft arguments given;
    a ValueError unless exactly one target form is given and the draft is in the same."""
    if (target_logits is None) == (target_probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if draft_logits is not None and draft_probs is not None:
        raise ValueError("give at most one of draft_logits and draft_probs")
    from_logits = target_logits is not None
    if (draft_logits is not None and not from_logits) or (draft_probs is not None and from_logits):
        raise ValueError(
            "give the draft rows in the target's form: draft_logits with target_logits, "
            "draft_probs with target_probs"
        )
    if from_logits:
        return True, "target_logits", "draft_logits"
    return False, "target_probs", "draft_probs"


def _checked_sampling(
    xp: Any,
    batch_size: int,
    vocab_size: int,
    strict: bool,
    from_logits: bool,
    target: tuple[str, Any],
    draft: tuple[str, Any],
    **parameters: Any,
) -> dict[str, Any]:
    """The per-request sampling parameters, checked, and in strict mode the row values."""
    sampling = _validate.check_sampling_parameters(
        batch_size, vocab_size, from_logits=from_logits, **parameters
    )
    check_values = (
        _validate.check_logit_values if from_logits else _validate.check_probability_values
    )
    if strict:
        for name, rows in (target, draft):
            check_values(name, rows, xp)
    return sampling


def _greedy_requests(
    sampling: Mapping[str, Any], every_request: bool, batch_size: int
) -> np.ndarray:
    """bool [B]: the requests verified greedily (``temperature == 0``, or all of them)."""
    if every_request:
        return np.ones(batch_size, dtype=bool)
    if sampling["temperature"] is None:
        return np.zeros(batch_size, dtype=bool)
    return np.asarray(sampling["temperature"] == 0)


def _sampling_table(
    sampling: Mapping[str, Any], greedy: np.ndarray, batch_size: int
) -> np.ndarray:
    """float64 [B, 4]: temperature, top-k (0 = off), top-p, min-p of every request, with
    the defaults of "off" (a greedy request reads its rows raw; its entries are unused)."""
    table = np.empty((batch_size, 4), dtype=np.float64)
    for column, (name, off) in enumerate(_SAMPLING_COLUMNS):
        values = sampling[name]
        table[:, column] = off if values is None else values
    if sampling["temperature"] is not None:
        np.copyto(table[:, 0], 1.0, where=greedy)
    return table


_SAMPLING_COLUMNS = (("temperature", 1.0), ("top_k", 0.0), ("top_p", 1.0), ("min_p", 0.0))


class EngineVerifier:
    """:func:`verify_ragged` with a method, its parameters, a generator and running metrics.

    Parameters
    ----------
    method : str, default "rejection"
        A registry name.
    seed : int, optional
        Seed of the verifier's own ``numpy.random.Generator``, the source of the uniforms
        of requests without a seed of their own.
    strict_mode : bool, default False
    **method_parameters : float
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``).

    Attributes
    ----------
    metrics : VerificationMetrics
        Sums over every successful call; merge across workers with ``+``.
    """

    def __init__(
        self,
        method: str = "rejection",
        *,
        seed: int | None = None,
        strict_mode: bool = False,
        **method_parameters: float,
    ) -> None:
        self._verifier = registry.get(method)
        verify.check_parameters(self._verifier, method_parameters)
        self._method_parameters = dict(method_parameters)
        self._strict_mode = _validate.check_strict_mode(strict_mode)
        self._own_generator = _random.OwnGenerator(_validate.check_seed(seed))
        self.metrics = VerificationMetrics()

    @property
    def method(self) -> str:
        """The registry name of the verifier of sampled requests."""
        return self._verifier.name

    def __call__(self, **arrays: Any) -> verify.VerificationResult:
        """Verify a batch: the keyword arguments of :func:`verify_ragged` other than
        ``method``, ``strict_mode``, ``generator`` and the method's parameters, which are
        set at construction.  The metrics are updated only by a call that succeeds."""
        unknown = set(arrays).difference(_ARRAY_ARGUMENTS)
        if unknown:
            raise TypeError(
                "EngineVerifier() got unexpected keyword argument(s) "
                f"{', '.join(sorted(unknown))}; method, strict_mode, generator and the "
                "method's parameters are set at construction"
            )
        target = arrays.get("target_probs", arrays.get("target_logits"))
        with _backend.device_context(target):
            return _verify_ragged(
                **{name: arrays.get(name) for name in _ARRAY_ARGUMENTS},
                method=self._verifier.name,
                strict_mode=self._strict_mode,
                generator=None,
                generator_for=self._own_generator.for_device,
                method_parameters=self._method_parameters,
                on_success=self.metrics.record,
            )


_ARRAY_ARGUMENTS = (
    "num_draft_tokens",
    "draft_token_ids",
    "target_logits",
    "target_probs",
    "draft_logits",
    "draft_probs",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "bonus_token_ids",
    "uniforms",
    "seeded_seqs",
    "counter_seeds",
    "out",
)
