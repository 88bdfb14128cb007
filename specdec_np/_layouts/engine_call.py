"""The one engine call under every engine-layout front.

:func:`specdec_np.verify_ragged`, :class:`specdec_np.EngineVerifier`,
:func:`specdec_np.verify_tree` and :func:`specdec_np.sample_tokens` each read "check, build
the batch, engine call": they put their flat keywords into three small records
(:class:`RowSources`, :class:`~specdec_np._layouts.sampling.SamplingParameters`,
:class:`UniformSource`), name their layout (a :class:`LayoutCall`: the ragged chain or the
tree) and hand them to :func:`engine_call`, which runs the same steps for both layouts:

1. the strict mode, the rows' form and the layout's batch; with a setting of the whole
   sampling surface (:mod:`specdec_np._layouts.surface`), its plan and the batch's rows
   adjusted (the layout says each row's context: :meth:`LayoutCall.surface_contexts`);
2. the per-request sampling (which requests are greedy, the kernel's table);
3. the method every request of the batch runs (greedy when every request is);
4. the uniform source, sized by the layout;
5. the output block, the thread count and the kernel options (:func:`kernel_options`,
   the one place they are assembled);
6. the draws, the kernel and the result (:func:`specdec_np._kernels.dispatch.run`), in
   the caller's output block; with the surface, the runs cut at their stops and budgets
   (before the counters record them) and the logprobs added
   (:meth:`LayoutCall.emitted_rows`).

A layout may also answer the common call itself, faster (``fast_call(rows, sampling,
uniform_source)``, :mod:`specdec_np._layouts.fast_path`): with the same results and errors,
or None to go through the steps above.

A new sampling setting goes into :class:`~specdec_np._layouts.sampling.SamplingParameters`
and the law (or the surface); nothing here changes.  A new layout writes its own
:class:`LayoutCall`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from .._kernels import dispatch as _dispatch
from .._relaxed import runner as _relaxed_runner
from .._runtime import checks as _validate
from .._runtime import philox as _philox
from .._runtime import uniforms as _random
from . import sampling as _sampling
from . import surface as _surface

__all__ = [
    "LayoutCall", "RowSources", "UniformSource", "engine_call", "kernel_options", "new_record",
]

#: ``new_record(Record, values)``: a named tuple (:class:`RowSources`, :class:`UniformSource`,
#: :class:`~specdec_np._layouts.sampling.SamplingParameters`) from every one of its fields,
#: in their order, without the Python argument binding of its constructor (a cost the
#: fronts would pay on every call).
new_record = tuple.__new__


class RowSources(NamedTuple):
    """The rows of a call, as given: exactly one target form, at most one draft form.

    Attributes
    ----------
    target_logits, target_probs : array or None
        The target's rows (``[T + B, V]`` for a chain, ``[N + B, V]`` for trees).
    draft_logits, draft_probs : array or None
        The draft's rows; both None for point-mass drafts.
    """

    target_logits: Any = None
    target_probs: Any = None
    draft_logits: Any = None
    draft_probs: Any = None


class UniformSource(NamedTuple):
    """Where a call's uniforms come from (``docs/semantics.md`` §5).

    Attributes
    ----------
    uniforms : float64 or float32 array, or None
        Explicit uniforms (float32 widened exactly).
    generator : Generator or None
        The source of requests without a seed of their own.
    seeded_seqs : mapping of int to Generator, or None
        Request index -> its own generator.
    counter_seeds : mapping of int to (int, int), or None
        Request index -> counter-based Philox ``(seed, position)``.
    generator_for : callable or None
        ``generator_for(device)``: the generator of requests without a seed of their own,
        asked for once every argument is checked (a sampler's own generator), instead of
        ``generator``.
    sources_for : callable or None
        For a caller that draws from generators the library cannot hold (torch's), instead
        of the fields above: ``sources_for(row_widths, shape)``, from each request's number
        of draws (0 for a greedy one) and the uniforms' shape, gives an object with the
        ``draw()`` and ``undo()`` of :class:`specdec_np._runtime.uniforms.RejectionUniforms`
        whose ``draw()`` returns the uniforms on the inputs' device.  ``draw()`` runs only
        once every argument, ids included, is checked.
    stream : {"verify", "draft"}
        The counter domain of the ``counter_seeds`` requests
        (:func:`specdec_np.counter_uniforms`): ``"verify"`` by default, ``"draft"`` for a
        drafter's own draws.
    """

    uniforms: Any = None
    generator: Any = None
    seeded_seqs: Any = None
    counter_seeds: Any = None
    generator_for: Callable[[Any], Any] | None = None
    sources_for: Callable[[Any, tuple[int, int]], Any] | None = None
    stream: str = "verify"


class LayoutCall(Protocol):
    """What :func:`engine_call` asks of a layout (the ragged chain, the tree).

    Attributes
    ----------
    entry : registry.Verifier or registry.TreeMethod
        The method of the call's sampled requests.
    greedy_entry : registry.Verifier or registry.TreeMethod
        The layout's greedy method (every request of an all-greedy batch runs it).
    every_request_greedy : bool
        The call's method is greedy, so every request is.
    """

    entry: Any
    greedy_entry: Any
    every_request_greedy: bool

    def build(self, form: _sampling.RowForm, strict: bool) -> Any:
        """The checked, kernel-ready batch."""

    def check_rows(self, batch: Any, form: _sampling.RowForm, greedy: Any, strict: bool) -> None:
        """Checks that need the requests' sampling (after :meth:`build`)."""

    def rows_per_request(self, batch: Any) -> tuple[Any, Any]:
        """How many consecutive target and draft rows each request owns (int64 ``[B]``
        each)."""

    def uniform_rows(self, batch: Any, greedy: Any) -> dict[str, Any]:
        """The uniform source's shape: ``k``, ``row_widths`` and ``row_offsets``."""

    def output_block(self, batch: Any, out: Any, inputs: dict[str, Any]) -> Any:
        """The caller's ``out=`` block checked, or a new one."""

    def threads(self, batch: Any, chosen: Any) -> int:
        """The OpenMP thread count of the call."""

    def layout_options(
        self, batch: Any, block: Any, threads: int, chosen: Any, options: dict[str, Any]
    ) -> None:
        """Adds the layout's own kernel options to ``options``."""

    def after_uniforms(self, batch: Any, chosen: Any) -> tuple[Any, ...]:
        """The kernel's arguments after the uniforms (the method's parameters)."""

    def recorder(self, batch: Any) -> Callable[[Any, Any], None] | None:
        """``on_success(result, commit)``: records a successful call before it counts as
        done (:class:`specdec_np._kernels.dispatch.Commit`), or None."""

    def finish(self, batch: Any, result: Any) -> Any:
        """The caller's result from the kernel's."""

    def surface_contexts(self, batch: Any) -> Any:
        """The :class:`~specdec_np._layouts.surface.RowContexts` of the batch's rows."""

    def emitted_rows(self, batch: Any, result: Any) -> Any:
        """int64 ``[B, W]``: the target row each emitted token was drawn from, -1 where
        none."""


def kernel_options(
    layout: LayoutCall,
    batch: Any,
    form: _sampling.RowForm,
    request: _sampling.RequestSampling,
    block: Any,
    threads: int,
    chosen: Any,
) -> dict[str, Any]:
    """The keyword options of the kernel call, assembled in this one place: the sampling
    table and which rows it processes, the per-request method codes of a mixed batch, then
    the layout's own options."""
    options = _dispatch.sampling_options(batch, threads, request.table)
    if request.table is not None:
        options.update(form.kernel_options())
    codes = request.request_codes(layout.greedy_entry.code, layout.entry.code, batch.xp)
    if codes is not None:
        options["request_methods"] = codes
    layout.layout_options(batch, block, threads, chosen, options)
    return options


def engine_call(
    layout: LayoutCall,
    rows: RowSources,
    sampling: _sampling.SamplingParameters,
    uniform_source: UniformSource,
    *,
    strict_mode: bool,
    out: Any,
    report_bias: bool = False,
) -> Any:
    """Verify one engine-layout call (the module docstring's steps).

    Parameters
    ----------
    layout : LayoutCall
    rows : RowSources
    sampling : SamplingParameters
    uniform_source : UniformSource
    strict_mode : bool
    out : output block or None
    report_bias : bool
        Also measure the bias per emitted position (the result's ``total_variation``,
        :mod:`specdec_np._relaxed.bias`).

    Returns
    -------
    VerificationResult or TreeVerificationResult
    """
    if out is None and strict_mode is False and report_bias is False:
        # The common call of a layout that has a fast path for it (the ragged chain): the
        # same steps, results and errors, without the generic machinery; None sends the
        # call on through the steps below.
        fast_call = getattr(layout, "fast_call", None)
        if fast_call is not None:
            result = fast_call(rows, sampling, uniform_source)
            if result is not None:
                return result
    strict = _validate.check_strict_mode(strict_mode)
    report_bias = _validate.check_flag("report_bias", report_bias)
    _philox.check_stream(uniform_source.stream)
    form = _sampling.row_form(*rows)
    batch = layout.build(form, strict)
    plan = None
    if sampling.surface_on():
        # The whole sampling surface: the rows adjusted before the law, the runs cut and
        # the logprobs added after the kernel (nothing of this runs when no setting is on).
        plan = _surface.plan_for(sampling, batch, form, layout.surface_contexts(batch))
        batch = plan.adjusted_batch(batch, in_kernel=_adjusts_in_kernel(
            layout, batch, strict, report_bias
        ))
    request = _sampling.request_sampling(
        batch.xp, batch.batch_size, batch.vocab_size, strict, form,
        (batch.target_rows, batch.draft_rows),
        every_request_greedy=layout.every_request_greedy,
        rows_per_request=layout.rows_per_request(batch), parameters=sampling,
        adjustments=None if plan is None else plan.adjustments,
    )  # fmt: skip
    layout.check_rows(batch, form, request.greedy, strict)
    chosen = layout.greedy_entry if request.all_greedy else layout.entry
    uniform_rows = layout.uniform_rows(batch, request.greedy)
    if uniform_source.sources_for is not None:
        sources = uniform_source.sources_for(
            uniform_rows["row_widths"], (batch.batch_size, uniform_rows["k"] + 1)
        )
    else:
        # Built even when every request is greedy, so that a bad source is refused
        # whatever the batch holds; greedy requests draw nothing from it.
        sources = _random.RejectionUniforms(
            batch.batch_size,
            xp=batch.xp,
            uniforms=uniform_source.uniforms,
            generator=uniform_source.generator,
            seeded_seqs=uniform_source.seeded_seqs,
            counter_seeds=uniform_source.counter_seeds,
            stream=uniform_source.stream,
            generator_for=uniform_source.generator_for,
            device=batch.device,
            **uniform_rows,
        )
    block = layout.output_block(
        batch, out, {form.target_name: batch.target_rows, form.draft_name: batch.draft_rows}
    )
    record = layout.recorder(batch)
    if report_bias:
        record = _measured(record, layout, batch, form, request)
    on_success = record if plan is None else plan.recorder(record, batch.xp)
    relaxed = getattr(layout, "relaxed", None)
    if relaxed is not None:
        result = _relaxed_runner.run(
            relaxed, getattr(layout, "relaxed_parameters", {}), batch, form, request, sources,
            block,
            contexts=None if plan is None else plan.request_contexts(),
            draws_bonus=getattr(layout, "draws_bonus", True), report_bias=report_bias,
            on_success=on_success,
        )  # fmt: skip
    else:
        threads = layout.threads(batch, chosen)
        options = kernel_options(layout, batch, form, request, block, threads, chosen)
        if plan is not None:
            options.update(plan.kernel_options(batch, threads))
        result = _dispatch.run(
            batch,
            chosen.code,
            sources,
            block,
            threads,
            after_uniforms=layout.after_uniforms(batch, chosen),
            options=options,
            on_success=on_success,
        )
    result = layout.finish(batch, result)
    if plan is not None:
        result = plan.finish(
            result, batch.xp, request.greedy, request.table,
            lambda emitted: layout.emitted_rows(batch, emitted),
        )
    return result


def _adjusts_in_kernel(layout: LayoutCall, batch: Any, strict: bool, report_bias: bool) -> bool:
    """Whether the kernel applies the sampling surface's row settings where it reads a
    row (the chain and tree kernels of both backends), rather than the rows being adjusted
    on copies first.

    The copies remain where something reads the adjusted rows outside those kernels:
    relaxed methods (their rules and laws run in Python), strict mode (its checks read the
    rows) and ``report_bias`` (it reads the laws)."""
    return (
        batch.kernel_name in ("verify_chains", "verify_trees")
        and getattr(layout, "relaxed", None) is None
        and not strict
        and not report_bias
        and np.dtype(batch.target_rows.dtype) in (np.dtype(np.float32), np.dtype(np.float64))
    )


def _measured(
    record: Callable[[Any, Any], None] | None,
    layout: LayoutCall,
    batch: Any,
    form: _sampling.RowForm,
    request: _sampling.RequestSampling,
) -> Callable[[Any, Any], None]:
    """``record`` after the result's ``total_variation`` is set (a relaxed method's own,
    or a registry verifier's from :func:`specdec_np._relaxed.runner.bias_of_result`), NaN
    where the run, cut at its stops, emitted nothing."""

    def measure_then_record(result: Any, commit: Any) -> None:
        xp = batch.xp
        variation = getattr(result, "total_variation", None)
        if variation is None:
            variation = _relaxed_runner.bias_of_result(
                layout.entry, getattr(layout, "method_parameters", ()), batch, form,
                request, result,
            )
        result.total_variation = xp.where(
            result.output_token_ids[:, : variation.shape[1]] >= 0, variation, xp.nan
        )
        if record is not None:
            record(result, commit)

    return measure_then_record
