"""Backend dispatch: one runner for a checked batch of any layout, on either backend.

A layout module (:mod:`specdec_np._layouts.padded`, :mod:`specdec_np._layouts.ragged`,
:mod:`specdec_np._layouts.tree`) turns the caller's arrays into a batch that says which kernel
family it needs (``kernel_name``), what that kernel reads (``kernel_inputs``), how a
failed request's status reads as an exception (``raise_for_row_status``) and how the
output buffers become a result (``result``).  :func:`run` does the rest, the same for
every layout and both backends:

1. the checks that need no draw (``check_ids``: a bad token id must not move a generator);
2. the draws, logged by the uniform sources;
3. the kernel call, on ``_core`` (NumPy) or the CUDA launch surface (CuPy);
4. the first failed request, as the layout's exception;
5. the caller's ``on_success`` (a sampler's counters, an engine's metrics) before the call
   counts as done, so that an interrupt leaves generators and counters both updated or
   both untouched;
6. on any exception, the draws put back where no other thread drew around them.

The kernels of both backends dispatch on registry codes (:attr:`Verifier.code`,
:attr:`TreeMethod.code`) and know no verifier by name.  On the CPU, ``_core`` calls
through tables of function pointers indexed by code; this module binds those tables from
:data:`registry.VERIFIERS` and :data:`registry.TREE_METHODS` when it is imported (before
any kernel call: every front imports it).  Each entry names its kernel (``row_function``,
``walk``) and gives the flags the drivers check arguments with.  Binding again with the
same arguments is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .. import _core, registry
from .._runtime import arrays as _backend
from . import cuda as _cuda

__all__ = [
    "CHAIN_ROW_BINDING",
    "TREE_STEP_BINDING",
    "Batch",
    "Commit",
    "kernel", "kernels_for", "run", "sampling_options", "scratch_rows"]


#: The arguments of ``_core.bind_chain_rows``: per code, the row function, whether it
#: reads uniforms, whether a drawn bonus is the raw argmax, and its parameter count.
CHAIN_ROW_BINDING: tuple[tuple[object, ...], ...] = (
    tuple(verifier.row_function for verifier in registry.VERIFIERS),
    tuple(verifier.stochastic for verifier in registry.VERIFIERS),
    tuple(verifier.bonus_by_argmax for verifier in registry.VERIFIERS),
    tuple(len(verifier.parameters) for verifier in registry.VERIFIERS),
)

#: The arguments of ``_core.bind_tree_steps``: per code, the walk step, whether the walk
#: reads uniforms, and whether its step reads draft rows when they are given.
TREE_STEP_BINDING: tuple[tuple[object, ...], ...] = (
    tuple(method.walk for method in registry.TREE_METHODS),
    tuple(method.stochastic for method in registry.TREE_METHODS),
    tuple(method.reads_draft_probs for method in registry.TREE_METHODS),
)

_core.bind_chain_rows(*CHAIN_ROW_BINDING)
_core.bind_tree_steps(*TREE_STEP_BINDING)


class Batch(Protocol):
    """What :func:`run` needs of a layout's batch."""

    @property
    def xp(self) -> Any:
        """``numpy`` or ``cupy``."""

    @property
    def device(self) -> int | None:
        """The CUDA device, None on the CPU."""

    @property
    def kernel_name(self) -> str:
        """The kernel family: ``"verify_chains"`` or ``"verify_trees"`` (a function of
        ``_core`` and of the CUDA launcher alike)."""

    @property
    def target_rows(self) -> Any:
        """The kernel-ready target rows (their dtype picks the CPU specialisation)."""

    @property
    def draft_token_ids(self) -> Any:
        """The kernel-ready ids (their dtype picks the CPU specialisation)."""

    @property
    def batch_size(self) -> int:
        """``B``."""

    @property
    def vocab_size(self) -> int:
        """``V``."""

    def kernel_inputs(self) -> tuple[Any, ...]:
        """The kernel's arguments between the code and the uniforms."""

    def check_ids(self) -> None:
        """Raise for a bad token id before anything is drawn (CPU batches)."""

    def raise_for_row_status(self, first_bad_row: int, row_status: Any) -> None:
        """The first failed request as this layout's ``ValueError``."""

    def result(self, block: Any) -> Any:
        """The result of a call whose kernel wrote ``block``."""


def kernels_for(device: int | None) -> Any:
    """The kernels for a device, with the signatures of ``_core.pyi``: ``_core`` (NumPy,
    CPU) or ``specdec_np._kernels.cuda.core_like`` (CuPy; its kernels return None and
    leave the first failed request to
    :func:`specdec_np._runtime.arrays.first_failed_row`)."""
    return _core if device is None else _cuda.core_like


_CPU_ROW_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_CPU_ID_TYPES = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}
_CPU_SPECIALISATIONS: dict[tuple[str, Any, Any], Callable[..., Any]] = {}


def kernel(name: str, device: int | None, rows: Any, ids: Any) -> Callable[..., Any]:
    """Kernel family ``name`` for rows and ids of these dtypes on ``device``.

    On the CPU the chain driver is ``_core.verify_chains_direct`` (the arrays read without
    typed memoryviews), and the tree driver's fused-type specialisation is looked up once
    and called directly: the fused dispatch and each memoryview cost microseconds that a
    small batch notices.
    """
    if device is not None:
        return getattr(_cuda.core_like, name)
    if name == "verify_chains":
        # The chain driver on NumPy arrays taken directly: the same checks and results as
        # the fused memoryview entry, without a memoryview per argument.
        return _core.verify_chains_direct
    key = (name, rows.dtype, ids.dtype)
    found = _CPU_SPECIALISATIONS.get(key)
    if found is None:
        fused = getattr(_core, name)
        row_type = _CPU_ROW_TYPES.get(rows.dtype)
        id_type = _CPU_ID_TYPES.get(ids.dtype)
        found = fused if row_type is None or id_type is None else fused[row_type, id_type]
        _CPU_SPECIALISATIONS[key] = found
    return found


_EMPTY_UNIFORMS = np.empty((0, 0), dtype=np.float64)


class Commit:
    """Whether a call's ``on_success`` recorded it: set as the last operation of the
    recording's own all-or-nothing block, so that an interrupt anywhere leaves the record
    and the draws both done (``done``) or both undone."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


def run(
    batch: Batch,
    code: int,
    sources: Any,
    block: Any,
    threads: int,
    *,
    after_uniforms: tuple[Any, ...] = (),
    options: dict[str, Any] | None = None,
    on_success: Callable[[Any, Commit], None] | None = None,
) -> Any:
    """Verify a checked batch: draws, kernel, row status, result (the module docstring).

    Parameters
    ----------
    batch : Batch
    code : int
        The registry code of the method every request uses (unless ``options`` holds
        per-request codes).
    sources : specdec_np._runtime.uniforms.RejectionUniforms or None
        The checked uniform sources; None when nothing is drawn.
    block : OutputBlock or TreeOutputBlock
        The output buffers the kernel writes.
    threads : int
        CPU threads for the loop over requests (ignored on the GPU).
    after_uniforms : tuple
        Kernel arguments between the uniforms and the outputs (a chain's parameters).
    options : dict, optional
        The kernel's keyword options (per-request codes, sampling table, scratch rows).
    on_success : callable, optional
        ``on_success(result, commit)`` records the result before the call counts as done,
        all or nothing, and sets ``commit.done`` as the last step of its record.

    Returns
    -------
    The layout's result.
    """
    xp = batch.xp
    batch.check_ids()
    inputs = batch.kernel_inputs()
    launch = kernel(batch.kernel_name, batch.device, batch.target_rows, batch.draft_token_ids)
    commit = Commit()
    try:
        if sources is not None:
            uniforms = sources.draw()
        else:
            uniforms = _EMPTY_UNIFORMS if xp is np else xp.empty((0, 0), dtype=xp.float64)
        reported = launch(
            code, *inputs, uniforms, *after_uniforms, *block, threads, **(options or {})
        )
        first_bad_row = _backend.first_failed_row(reported, block.row_status)
        if first_bad_row >= 0:
            batch.raise_for_row_status(first_bad_row, block.row_status)
        result = batch.result(block)
        if on_success is not None:
            on_success(result, commit)
        return result
    except BaseException:
        if sources is not None and not commit.done:
            sources.undo()
        raise


def scratch_rows(xp: Any, rows: int, vocab_size: int, dtype: Any, slot: str = "rows") -> Any:
    """The kernels' working rows for logits ``[rows, 2 V]``, kept per Python thread
    (:func:`specdec_np._runtime.arrays.thread_block`; the drivers overwrite what they read).
    ``slot`` names the buffer: one call uses the scratch rows (``"rows"``) and the sampling
    surface's adjusted rows (``"adjusted"``) together.
    """
    if xp is not np:
        return xp.empty((rows, 2 * vocab_size), dtype=dtype)
    return _backend.thread_block(slot, rows, 2 * vocab_size, dtype)


def working_rows(device: int | None, threads: int, batch_size: int) -> int:
    """How many sets of working rows a call needs: one per CPU thread, or one per request
    on the GPU (a thread block each)."""
    return threads if device is None else batch_size


def sampling_options(batch: Any, threads: int, table: Any) -> dict[str, Any]:
    """The kernel options of logits rows: the ``[B, 5]`` sampling table, the scratch rows
    of the processed target and draft row and, on the CPU, the threads for the passes over
    one row (:func:`specdec_np._runtime.arrays.row_thread_count`; the CUDA kernels split a
    row between the threads of a block already, and take no such option); empty for
    probability rows."""
    if table is None:
        return {}
    rows = working_rows(batch.device, threads, batch.batch_size)
    options = {
        "sampling": table,
        "scratch": scratch_rows(batch.xp, rows, batch.vocab_size, batch.target_rows.dtype),
    }
    if batch.device is None:
        options["row_threads"] = _backend.row_thread_count(threads, batch.vocab_size)
    return options
