"""The common ragged engine call, without the generic machinery of
:func:`~specdec_np._layouts.engine_call.engine_call`.

A small batch costs what its Python steps cost: at ``B = 1`` the kernel reads its rows in
a microsecond or two, while the generic steps (per-step records and dispatch, NumPy
reductions of ``[B]`` arrays at a microsecond or more each, a memoryview per kernel
argument) cost tens.  :func:`ragged_call` serves the call an engine makes every step, on
the CPU:

* NumPy arrays (C-contiguous float32 or float64 rows, int64 ``num_draft_tokens``, int32
  or int64 ids), no ``out=``, not strict;
* uniforms from a ``numpy.random.Generator`` (the caller's, a sampler's own, or a fresh
  one), or explicit NumPy uniforms (float64, or float32 widened exactly), taken in as the
  general path takes them (:func:`_explicit_uniforms`): no ``seeded_seqs``,
  ``counter_seeds`` or other source;
* no setting of the whole sampling surface.

It runs the engine call's steps in their order, sharing its functions where they cost
little (the row form, the checked sampling parameters and their table, the kernel options,
the layout's options, the row statuses' errors), and replaces the others by one compiled
check of the batch (:func:`specdec_np._core.check_ragged_call`), the same draws from the
same generator without the generic uniform sources, and the kernel call without
:func:`specdec_np._kernels.dispatch.run`.  Its results are the general path's, bit for bit,
and so are the generators' states.  It never raises for bad input that the general path
would word otherwise: an argument outside the common call, or one that a check refuses,
makes it answer None before anything is drawn or any generator asked for, and the general
path then runs and raises its own error.  One check is left to the kernel: the temperature's
overflow of a drawn bonus row of a request without drafts, which the kernel's law reads
anyway (one pass over such rows instead of two); a row it refuses makes the call put its
draws back and answer None.  Otherwise, after the draw it behaves as the general path: a
failed request raises the layout's error, and the draws are put back.

A sampling step (:func:`specdec_np.sample_tokens` on NumPy logits, its settings Python
numbers, no row setting) goes further: a successful step keeps what its launch needs under
the key of its kind (:func:`lane_key`), and the next step of that kind is one draw, the
output block and the kernel (:func:`sample_lane`); the kernel reads what is left to check
(the rows), and a row it refuses sends the step, its draw put back, through the steps
above.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._kernels import dispatch as _dispatch
from .._runtime import arrays as _backend
from .._runtime import contract as _contract
from .._runtime import results as _results
from .._runtime import uniforms as _random
from . import padded as _chains
from . import sampling as _sampling
from .engine_call import RowSources, UniformSource, kernel_options

__all__ = ["lane_key", "ragged_call", "sample_lane"]

_ROW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ID_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)
_NDARRAY = np.ndarray
_GENERATOR = np.random.Generator
_PCG64 = np.random.PCG64
_new_tuple = tuple.__new__

#: The uniform sources this path knows: a source with another field (one added later)
#: takes the general path.
_SOURCE_FIELDS = (
    "uniforms", "generator", "seeded_seqs", "counter_seeds", "generator_for", "sources_for",
    "stream",
)
#: The counter domains (the stream only chooses among counter-based sources, which this
#: path does not serve; a bad one takes the general path, which refuses it).
_STREAMS = ("verify", "draft")
_KNOWN_SOURCES = UniformSource._fields == _SOURCE_FIELDS
#: The leading fields of the row form of target logits alone (``row_form``'s).
_LOGITS_ONLY = (True, False, "target_logits", "draft_probs")
#: The draft ids of a batch without drafts: int64, as the general path makes them (an
#: empty array holds nothing the kernel could write or a caller change).
_NO_IDS = np.empty(0, dtype=np.int64)


def ragged_call(
    layout: Any,
    method_parameters: tuple[float, ...],
    num_draft_tokens: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    on_success: Callable[..., None] | None,
    rows: RowSources,
    sampling: _sampling.SamplingParameters,
    uniform_source: UniformSource,
    lane_key: tuple[Any, ...] | None = None,
) -> _results.VerificationResult | None:
    """Verify a ragged chain batch on the common call's fast path, or answer None.

    Parameters
    ----------
    layout : RaggedCall
        The call's layout (its method and options).
    method_parameters : tuple of float
        The method's checked parameters.
    num_draft_tokens, draft_token_ids, bonus_token_ids
        As :func:`specdec_np.verify_ragged` takes them.
    on_success : callable or None
        As :class:`~specdec_np._layouts.ragged.RaggedCall` takes it.
    rows : RowSources
    sampling : SamplingParameters
    uniform_source : UniformSource
        The call's ``out`` is None and its ``strict_mode`` False (the caller checks).
    lane_key : tuple, optional
        :func:`sample_lane`'s key of a step without drafts: a successful call keeps what
        its launch needs under it.

    Returns
    -------
    VerificationResult or None
        None, before anything is drawn or any generator is asked for, when the call is
        not the common one or an argument is refused, or after the kernel with the draws
        put back, when its law refused a row's temperature (the general path then says
        why).

    Raises
    ------
    ValueError
        For rows given in no form or in two (the general path's first check, the same
        error); for a request that fails in the kernel, as the general path raises it.
    """
    explicit = uniform_source.uniforms
    if not (
        _KNOWN_SOURCES
        and (explicit is None or (type(explicit) is _NDARRAY and explicit.dtype in _ROW_DTYPES))
        and uniform_source.seeded_seqs is None
        and uniform_source.counter_seeds is None
        and uniform_source.sources_for is None
        and type(uniform_source.stream) is str
        and uniform_source.stream in _STREAMS
    ):
        return None
    if sampling.surface_on():
        return None
    target_logits, target_probs, draft_logits, draft_probs = rows
    if target_probs is None and draft_logits is None and draft_probs is None and (
        target_logits is not None
    ):
        # Target logits alone (a sampling step, point-mass drafts): row_form's record.
        form = _new_tuple(_sampling.RowForm, _LOGITS_ONLY + (target_logits, None))
    else:
        form = _sampling.row_form(target_logits, target_probs, draft_logits, draft_probs)
    target = form.target
    draft = form.draft
    counts = num_draft_tokens
    ids = draft_token_ids
    if type(target) is not _NDARRAY or type(counts) is not _NDARRAY or type(ids) is not _NDARRAY:
        return None
    dtype = target.dtype
    if dtype not in _ROW_DTYPES or target.ndim != 2 or not target.flags.c_contiguous:
        return None
    if draft is not None:
        if type(draft) is not _NDARRAY:
            return None
        if not layout.entry.reads_draft_probs:
            draft = None  # never read, as the general path ignores it
        elif draft.dtype != dtype or draft.ndim != 2 or not draft.flags.c_contiguous:
            return None
    if counts.dtype != _INT64 or counts.ndim != 1 or ids.ndim != 1 or ids.dtype not in _ID_DTYPES:
        return None
    if not counts.flags.c_contiguous:
        return None  # a strided view (reversed, say): the general path copies it
    batch_size = counts.shape[0]
    vocab_size = target.shape[1]
    if not batch_size or not vocab_size:
        return None
    # Private copies (the counts' made by the check): what is checked is what the kernel
    # and the records read.
    if bonus_token_ids is None:
        ids = ids.copy() if ids.shape[0] else _NO_IDS
        bonus = _chains.zero_ids(batch_size, ids.dtype)
    else:
        bonus = bonus_token_ids
        if type(bonus) is not _NDARRAY or bonus.dtype not in _ID_DTYPES:
            return None
        if bonus.shape != (batch_size,) and bonus.shape != (batch_size, 1):
            return None
        # One dtype for both, as the general path picks it (empty ids take the bonus ids').
        id_dtype = bonus.dtype if not ids.shape[0] or ids.dtype == bonus.dtype else _INT64
        ids = np.array(ids, dtype=id_dtype, order="C", copy=True)
        bonus = np.array(bonus, dtype=id_dtype, order="C", copy=True).reshape(batch_size)
    processed = form.from_logits or form.draft_from_logits
    # Python numbers seen before: their kept record, by key; otherwise the checks.
    key = _sampling.parameters_key(
        sampling, batch_size, vocab_size, form.from_logits, processed, dtype,
        layout.every_request_greedy, processed,
    )  # fmt: skip
    checked = _sampling.kept_parameters.get(key) if key is not None else None
    if checked is None:
        try:
            checked = _sampling.checked_parameters(
                batch_size, vocab_size, sampling, from_logits=form.from_logits,
                divides_logits=processed, row_dtype=dtype,
                every_request_greedy=layout.every_request_greedy, table=processed,
            )  # fmt: skip
        except (TypeError, ValueError):
            return None
    # The counts, the shapes, the ids and the temperatures, in one compiled pass.
    # A drawn bonus row of a request without drafts is read by the kernel's law, which
    # checks its temperature's overflow as it reads it (the launch's finds_overflow).
    found = _core.check_ragged_call(
        counts, ids, bonus, bonus_token_ids is not None, target, draft,
        checked.sampling["temperature"], checked.greedy, form.from_logits,
        form.draft_from_logits, bonus_token_ids is None,
    )  # fmt: skip
    if found is None:
        return None
    offsets, counts, max_k, total, bonus_rows, greedy_count = found
    if explicit is not None:
        # Checked after the batch, as the general path checks them (they are [B, k + 1]
        # for its k = max_k + 1: a request's k_b + 2 draws).
        explicit = _explicit_uniforms(explicit, batch_size, max_k + 2)
        if explicit is None:
            return None
    # ChainBatch(...) with every field in its order, without its constructor's binding.
    batch = _new_tuple(_chains.ChainBatch, (
        np, None, target, draft, ids, bonus, offsets, batch_size, max_k, vocab_size, total,
        None, form.target_name, "(request, position)", counts, bonus_rows,
    ))  # fmt: skip
    return _verify(
        layout, method_parameters, batch, form, checked, greedy_count,
        bonus_token_ids is None, on_success, uniform_source, explicit, lane_key,
    )  # fmt: skip


#: Explicit uniforms of at most this many entries are checked on Python floats (a NumPy
#: reduction costs more than they do).
_PYTHON_CHECK_MAX = 64


def _explicit_uniforms(uniforms: np.ndarray, batch_size: int, width: int) -> np.ndarray | None:
    """A private float64 C-contiguous copy of NumPy explicit uniforms (float64 or native
    float32, widened exactly), or None where the general path
    (:class:`~specdec_np._runtime.uniforms.RejectionUniforms`) refuses them: another shape
    than ``[B, width]``, or a value outside ``[0, 1)`` (NaN included).  The values are
    checked on the copy, which is what the kernel reads: a caller's thread writing its own
    array during the call cannot slip an unchecked value past the check."""
    if uniforms.shape != (batch_size, width):
        return None
    # A new C-contiguous float64 array either way (float32 widened exactly).
    if uniforms.dtype == _FLOAT64:
        copy = uniforms.copy(order="C")
    else:
        copy = uniforms.astype(np.float64, order="C")
    return copy if _in_unit_interval(copy.ravel()) else None


def _in_unit_interval(values: np.ndarray) -> bool:
    """Whether every entry of float64 ``values`` ``[n]`` lies in ``[0, 1)`` (NaN does not)."""
    if values.shape[0] <= _PYTHON_CHECK_MAX:
        listed = values.tolist()
        # NaN would slip through min and max (its comparisons are all false); the sum of
        # values that min and max put in [0, 1) is NaN exactly when one of them is.
        total = sum(listed)
        return bool(0.0 <= min(listed) and max(listed) < 1.0 and total == total)
    return bool(((values >= 0.0) & (values < 1.0)).all())


class _Plan(NamedTuple):
    """What a call's kernel launch needs besides its arrays, its sampling table and its
    per-request codes: the same for every call with the same method and parameters,
    shapes, row forms and bonus form, and kept per Python thread (its scratch rows are
    that thread's).  The kernel's options go by position: those before the table
    (``causal``, ``draw_bonus``) and those after it."""

    code: int
    threads: int
    before_table: tuple[Any, ...]
    after_table: tuple[Any, ...]
    parameters: np.ndarray
    launch: Callable[..., Any]


_PLANS = threading.local()
_PLANS_MAX = 32

#: The chain kernel's keyword options after ``num_threads``, in its order, with their
#: defaults (``specdec_np._core.verify_chains``).
_OPTION_DEFAULTS = {
    "request_methods": None,
    "causal": False,
    "draw_bonus": False,
    "sampling": None,
    "scratch": None,
    "target_logits": True,
    "draft_logits": True,
    "bonus_rows": True,
    "row_threads": 1,
    "finds_overflow": False,
    # The sampling surface's (never on this path).
    "target_adjustments": None,
    "draft_adjustments": None,
    "adjusted_rows": None,
}
_TABLE = list(_OPTION_DEFAULTS).index("sampling")
_ROW_STATUS = _contract.OutputBlock._fields.index("row_status")


def _launch(
    layout: Any,
    method_parameters: tuple[float, ...],
    batch: _chains.ChainBatch,
    form: _sampling.RowForm,
    checked: _sampling.CheckedParameters,
    greedy_count: int,
    draw_bonus: bool,
) -> tuple[_Plan, tuple[Any, ...], dict[str, Any]]:
    """The call's plan and its options, by position and by keyword.

    A plan is made by the general path's own functions (the thread count, the kernel
    options, the method's parameters, the kernel) and kept, keyed by what they read (the
    shapes and forms, the method, and the row threads' setting in the environment); a
    kept plan takes the call's own table and per-request codes.  Options that the kernel's order
    does not know (a new one) go by keyword, from the general path on every call."""
    batch_size = batch.batch_size
    request = None
    codes = None
    if 0 < greedy_count < batch_size:
        # A batch that mixes greedy and sampled requests: their codes, as the general path
        # makes them.
        request = _sampling.RequestSampling(checked.greedy, checked.table)
        codes = request.request_codes(layout.greedy_entry.code, layout.entry.code, np)
    # The row threads' count reads the environment on rows long enough for row threads
    # (row_thread_count): there its setting is part of the key; shorter rows never read it
    # (a lookup costs about 0.04 us even so, _backend.row_threads_setting).
    key = (
        id(layout.entry), method_parameters, batch_size, batch.vocab_size,
        batch.target_rows.dtype, batch.max_k, form.from_logits, form.draft_from_logits,
        batch.bonus_rows, draw_bonus, greedy_count == batch_size,
        _backend.row_threads_setting()
        if batch.vocab_size >= _backend.ROW_THREADS_MIN_VOCAB else None,
    )  # fmt: skip
    plans = getattr(_PLANS, "plans", None)
    if plans is None:
        plans = _PLANS.plans = {}
    plan = plans.get(key)
    if plan is not None:
        return plan, (codes, *plan.before_table, checked.table, *plan.after_table), {}
    chosen = layout.greedy_entry if greedy_count == batch_size else layout.entry
    threads = batch.threads(chosen)
    # The ragged layout's options do not read the output block.
    if request is None:
        request = _sampling.RequestSampling(checked.greedy, checked.table)
    options = kernel_options(layout, batch, form, request, None, threads, chosen)
    if draw_bonus:
        # The rows the compiled check left to the law (check_ragged_call's lone rows).
        options["finds_overflow"] = True
    (parameters,) = layout.after_uniforms(batch, chosen)
    launch = _dispatch.kernel("verify_chains", None, batch.target_rows, batch.draft_token_ids)
    if not _OPTION_DEFAULTS.keys() >= options.keys():
        return _Plan(chosen.code, threads, (), (), parameters, launch), (), options
    # The options in the kernel's order, by position (a keyword costs a search each).
    positional = tuple(options.get(name, value) for name, value in _OPTION_DEFAULTS.items())
    plan = _Plan(
        chosen.code, threads, positional[1:_TABLE], positional[_TABLE + 1 :], parameters,
        launch,
    )  # fmt: skip
    if len(plans) >= _PLANS_MAX:
        plans.clear()
    plans[key] = plan
    return plan, positional, {}


def _verify(
    layout: Any,
    method_parameters: tuple[float, ...],
    batch: _chains.ChainBatch,
    form: _sampling.RowForm,
    checked: _sampling.CheckedParameters,
    greedy_count: int,
    draw_bonus: bool,
    on_success: Callable[..., None] | None,
    uniform_source: UniformSource,
    explicit: np.ndarray | None = None,
    lane_key: tuple[Any, ...] | None = None,
) -> _results.VerificationResult | None:
    """The checked call: the uniform source (``explicit``: the checked explicit uniforms),
    the draws, the kernel and the record; with ``lane_key``, what a successful launch
    needs is kept for :func:`sample_lane`."""
    batch_size = batch.batch_size
    generator = uniform_source.generator
    sources = None
    if generator is not None:
        if type(generator) is not _GENERATOR:
            return None
    elif uniform_source.generator_for is not None:
        # A sampler's own source, asked for only now that every argument is checked.
        generator = uniform_source.generator_for(None)
        if generator is not None and type(generator) is not _GENERATOR:
            # Another kind of source: the general uniform sources check it and draw.
            sources = _random.RejectionUniforms(
                batch_size, batch.max_k + 1, np, uniforms=explicit, generator=generator,
                row_widths=layout.uniform_rows(batch, checked.greedy)["row_widths"],
            )  # fmt: skip
    plan, positional, keywords = _launch(
        layout, method_parameters, batch, form, checked, greedy_count, draw_bonus
    )
    # The output block (views of one allocation: the fields of an OutputBlock, in its
    # order), made in compiled code.
    block = _core.output_block(batch_size, batch.max_k + 1)
    commit = None if on_success is None else _dispatch.Commit()
    # The one draw's record (:func:`_draw`), so that an interrupt anywhere after it can put
    # the draw back.
    before: list[Any] = []
    size: Any = None
    try:
        if sources is not None:
            uniforms = sources.draw()
        elif explicit is not None:
            uniforms = explicit  # nothing is drawn: the generator is not asked
        elif greedy_count == batch_size:
            uniforms = np.empty((batch_size, batch.max_k + 2))  # nothing is drawn
        else:
            if generator is None:
                # Seeded from the OS, only when a request draws from it.
                generator = np.random.default_rng()
            width = batch.max_k + 2
            if not greedy_count and batch.num_draft_tokens == batch_size * batch.max_k:
                # Every request draws the whole width: the one draw is the block, row-major.
                size = (batch_size, width)
                uniforms = _draw(before, generator, size)
            else:
                # One draw of exactly the sampled requests' k_b + 2 each, laid out row by
                # row in their leading columns (as RejectionUniforms.draw lays it out).
                widths = np.where(checked.greedy, 0, batch.draft_counts + 2)
                mask = np.arange(width)[None, :] < widths[:, None]
                size = int(np.count_nonzero(mask))
                uniforms = np.empty((batch_size, width))
                uniforms[mask] = _draw(before, generator, size)
        reported = plan.launch(
            plan.code, *batch.kernel_inputs(), uniforms, plan.parameters, *block,
            plan.threads, *positional, **keywords,
        )  # fmt: skip
        if reported >= 0:
            if draw_bonus and form.from_logits and _overflows(batch, checked):
                # A row the law refused for its temperature: the draws go back and the
                # general path, whose check reads every row first, words the error.
                _put_back(sources, generator, size, before)
                return None
            batch.raise_for_row_status(reported, block[_ROW_STATUS])
        if (
            lane_key is not None and draw_bonus and not batch.max_k
            and batch.draft_rows is None and sources is None and not keywords
        ):  # fmt: skip
            _keep_lane(lane_key, plan, batch, positional, greedy_count == batch_size)
        # VerificationResult(*block[:3], T) without its constructor's Python steps.
        result = _new_tuple(_results.VerificationResult, block[:3])
        result.num_draft_tokens = batch.num_draft_tokens
        if on_success is not None:
            on_success(batch.draft_counts, result.accepted_lengths, commit)
        return result
    except BaseException:
        if commit is None or not commit.done:
            _put_back(sources, generator, size, before)
        raise


def _put_back(sources: Any, generator: Any, size: Any, before: list[Any]) -> None:
    """Undo the call's one draw (from ``sources``, or ``generator`` by its record in
    ``before``, :func:`_draw`'s), where it drew."""
    if sources is not None:
        sources.undo()
    elif before and type(before[0]) is _NDARRAY:
        _random.undo_pcg64_draw(generator, before[0])
    elif before:
        _random.undo_draw(generator, size, before[0])


def _overflows(batch: _chains.ChainBatch, checked: _sampling.CheckedParameters) -> bool:
    """Whether a target row (logits) of a sampled request overflows at its temperature (the
    general path's check, :func:`~specdec_np._layouts.sampling.check_tempered_rows`):
    asked only after a failed kernel call, which a refused row explains."""
    temperature = checked.sampling["temperature"]
    if temperature is None:
        return False
    rows_per_request = batch.draft_counts + (1 if batch.bonus_rows else 0)
    found: int = _core.first_tempered_overflow(
        batch.target_rows, temperature, checked.greedy, rows_per_request
    )
    return found >= 0


def _draw(before: list[Any], generator: np.random.Generator, size: Any) -> np.ndarray:
    """``generator.random(size)``, recorded in ``before`` so that it can be put back.

    From a PCG64 generator (``numpy.random.default_rng``'s), the drawn array itself: made
    and appended in one compiled step (``list.extend`` over ``map``), so that no interrupt
    can land between them (:func:`~specdec_np._runtime.uniforms.undo_pcg64_draw` puts it
    back).  From another bit generator, the state before it (a dict), appended first (as
    :meth:`~specdec_np._runtime.uniforms.DrawLog.random` logs a draw before making it).
    """
    if type(generator.bit_generator) is _PCG64:
        before.extend(map(generator.random, (size,)))
        drawn: np.ndarray = before[0]
        return drawn
    before.append(generator.bit_generator.state)
    uniforms: np.ndarray = generator.random(size)
    return uniforms


# ---- the sampling step's lane ------------------------------------------------------------

#: What a launch of a step without drafts needs, kept per Python thread by the key of its
#: call (:func:`sample_lane`): the plan, the options by position (the sampling table
#: among them), the kernel inputs after the rows (no draft ids, zero bonus ids and the
#: drafts' offsets, all read-only) and whether every row is greedy (then nothing is drawn).
_LANES = threading.local()
_LANES_MAX = 32
_LANE_SETTING_TYPES = frozenset({int, float, type(None)})


class _Lane(NamedTuple):
    plan: _Plan
    positional: tuple[Any, ...]
    inputs_after_rows: tuple[Any, ...]
    greedy: bool


def lane_key(rows: Any, settings: tuple[Any, ...], filter_order: Any) -> tuple[Any, ...] | None:
    """The key of a sampling step (:func:`specdec_np.sample_tokens` on NumPy logits, its
    four filters Python numbers or None), or None for any other call: the rows' dtype and
    shape, each setting with its type (so that ``40`` and ``40.0`` never share a key, nor
    ``0.0`` and ``-0.0``), the filter order, and the row threads' setting where rows are
    long enough to read it (as the kept plans' keys do)."""
    if type(rows) is not _NDARRAY or type(filter_order) is not str:
        return None
    types = tuple(map(type, settings))
    if not _LANE_SETTING_TYPES.issuperset(types):
        return None
    if 0 in settings:
        for value in settings:
            if type(value) is float and value == 0.0 and math.copysign(1.0, value) < 0:
                return None
    shape = rows.shape
    return (
        rows.dtype, shape, types, settings, filter_order,
        _backend.row_threads_setting()
        if len(shape) == 2 and shape[1] >= _backend.ROW_THREADS_MIN_VOCAB else None,
    )  # fmt: skip


def _keep_lane(
    key: tuple[Any, ...], plan: _Plan, batch: _chains.ChainBatch, positional: tuple[Any, ...],
    greedy: bool,
) -> None:
    """Keep a successful step's launch under its key (the inputs after the rows are the
    batch's read-only arrays of a step without drafts)."""
    inputs = batch.kernel_inputs()
    for array in inputs[2:]:
        if type(array) is _NDARRAY:
            array.flags.writeable = False  # read by every later step of the kind
    lanes = getattr(_LANES, "lanes", None)
    if lanes is None:
        lanes = _LANES.lanes = {}
    if len(lanes) >= _LANES_MAX:
        lanes.clear()
    lanes[key] = _Lane(plan, positional, inputs[2:], greedy)


def sample_lane(
    key: tuple[Any, ...], rows: np.ndarray, generator: Any, uniforms: Any = None
) -> np.ndarray | None:
    """The tokens of a sampling step whose key (:func:`lane_key`) a successful call of the
    same kind has kept, or None: then the caller takes the general steps.

    ``uniforms``: a row's explicit uniform (NumPy float64 or float32 ``[B]``, checked here
    as the general path checks them, the generator then not asked), or None.

    The kept call checked everything that the key fixes (the settings, the shapes, the
    dtype); what is left per call is what the rows hold, which the kernel reads: a row it
    refuses (no mass, or a temperature that overflows) makes the call put its draw back and
    answer None, and the general steps then raise their error.  The draw is the one the
    general path makes (``generator.random((B, 2))``, nothing for greedy rows), from the
    same generator, so the tokens and the generator's state are the general path's.
    """
    lanes = getattr(_LANES, "lanes", None)
    lane = lanes.get(key) if lanes is not None else None
    if lane is None or not rows.flags.c_contiguous:
        return None
    if generator is not None and type(generator) is not _GENERATOR:
        return None
    batch_size = rows.shape[0]
    explicit = uniforms is not None
    if explicit:
        # The block the general path makes: the residual draw's column unused, float32
        # widened exactly.
        uniforms = _core.explicit_uniform_block(uniforms, batch_size)
        if uniforms is None:
            return None
    plan = lane.plan
    block = _core.output_block(batch_size, 1)
    before: list[Any] = []
    if explicit:
        pass  # nothing is drawn: the generator is not asked
    elif lane.greedy:
        uniforms = np.empty((batch_size, 2))  # nothing is drawn
    else:
        if generator is None:
            generator = np.random.default_rng()
        uniforms = _draw(before, generator, (batch_size, 2))
    try:
        reported = plan.launch(
            plan.code, rows, rows, *lane.inputs_after_rows, uniforms, plan.parameters, *block,
            plan.threads, *lane.positional,
        )  # fmt: skip
    except BaseException:
        _put_back(None, generator, (batch_size, 2), before)
        raise
    if reported >= 0:
        _put_back(None, generator, (batch_size, 2), before)
        return None
    tokens: np.ndarray = block[0][:, 0]
    return tokens
