"""The kernel contract: constants, row-status codes and the output block.

This module is the one owner of what the Python layer and the kernels of both backends
must agree on.  It is pure Python with no package imports, so that ``setup.py`` can load
it by path and hand the constants to the C compiler as macros, and
:mod:`specdec_np._kernels.cuda` can write
them into the CUDA sources: every backend compiles the same numbers.

Row status, written by every kernel for every request ``b``:

* ``STATUS_OK`` (0): the request was verified;
* ``1 + c``: the token id in column ``c`` of the request's virtual id row (columns
  ``0 .. k_b - 1`` are its draft ids, column ``k_b`` its bonus id) lies outside ``[0, V)``;
  nothing else of that request was read or written;
* ``-(1 + r)``: a token had to be drawn at position ``r`` from a target row without any
  positive probability (invalid input); the request's output is meaningless;
* ``STATUS_BAD_METHOD``: the request's method code names no registry entry, or its method
  needs uniforms or working rows that the call did not pass.  Only the CUDA kernels write
  it, for a direct caller's arguments (the layouts never write such a code, and the CPU
  kernels raise instead); nothing else of the request was read or written;
* ``STATUS_NO_MEMORY``: the kernel could not allocate the request's working memory (a
  ``MemoryError``).

See ``docs/semantics.md`` for the user-facing rules these implement.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "ENTROPY_EPSILON",
    "FILTER_ORDER_CODES",
    "GREEDY_MARGIN",
    "OVERFLOW_EXPONENT",
    "ROW_SUM_TOLERANCE",
    "SAMPLING_COLUMNS",
    "STATUS_BAD_METHOD",
    "STATUS_NO_MEMORY",
    "STATUS_OK",
    "OutputBlock",
    "TreeOutputBlock",
    "allocate_output_block",
    "allocate_tree_output_block",
    "fill_deeper_tree_block",
    "tree_kernel_block",
    "compile_time_macros",
    "raise_for_invalid_id",
    "raise_for_kernel_status",
    "raise_for_row_status",
]

#: A draft token with ``p(x) > 0.5 + GREEDY_MARGIN`` is the unique argmax of any row that
#: sums to one within ``ROW_SUM_TOLERANCE``, so greedy verification accepts it unread.
GREEDY_MARGIN = 5e-4
#: Row-sum tolerance that strict greedy verification checks (twice the margin).
ROW_SUM_TOLERANCE = 2 * GREEDY_MARGIN
#: The ``1e-5`` inside typical acceptance's entropy ``-sum p ln(p + 1e-5)``.
ENTROPY_EPSILON = 1e-5
#: A residual whose float64 sum overflows to inf is summed and drawn again with every weight
#: times ``2**OVERFLOW_EXPONENT``: exact for every weight that matters, and unbiased.
OVERFLOW_EXPONENT = -64
#: The orders of the sampling filters (docs/semantics.md §12) and the code the kernels
#: read for each, in the last column of the sampling table.
FILTER_ORDER_CODES = {"vllm": 0, "llama.cpp": 1}
#: Columns of the sampling table of logits rows: temperature, top-k, top-p, min-p and the
#: filter order's code.
SAMPLING_COLUMNS = 5
#: Row verified.
STATUS_OK = 0
#: The request's method code names no registry entry (CUDA kernels only): below every
#: ``-(1 + r)`` a request can report.
STATUS_BAD_METHOD = -(2**63)
#: A kernel could not allocate its working memory for the request (next to
#: ``STATUS_BAD_METHOD``, apart from every other code).
STATUS_NO_MEMORY = -(2**63) + 1


def compile_time_macros() -> list[tuple[str, str]]:
    """The constants as ``(name, value)`` C macros, for ``setup.py`` and the CUDA sources."""
    return [
        ("SPECDEC_GREEDY_MARGIN", repr(GREEDY_MARGIN)),
        ("SPECDEC_ENTROPY_EPSILON", repr(ENTROPY_EPSILON)),
        ("SPECDEC_OVERFLOW_EXPONENT", repr(OVERFLOW_EXPONENT)),
        ("SPECDEC_FILTER_ORDER_LLAMA_CPP", str(FILTER_ORDER_CODES["llama.cpp"])),
        # Written so that no C compiler sees an out-of-range literal.
        ("SPECDEC_STATUS_NO_MEMORY", f"({STATUS_NO_MEMORY}LL)"),
    ]


class OutputBlock(NamedTuple):
    """The outputs of one kernel call: views of one int64 allocation.

    Attributes
    ----------
    output_token_ids : int64 [B, width], C-contiguous
    accepted_lengths : int64 [B]
    num_accepted : int64 [B]
    row_status : int64 [B]
    """

    output_token_ids: Any
    accepted_lengths: Any
    num_accepted: Any
    row_status: Any


def allocate_output_block(xp: Any, batch_size: int, width: int) -> OutputBlock:
    """One ``empty`` allocation cut into the four output arrays of a kernel call.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    batch_size, width : int
        ``B`` and the output width (``max k_b + 1``).
    """
    cells = batch_size * width
    block = xp.empty(cells + 3 * batch_size, dtype=xp.int64)
    return OutputBlock(
        block[:cells].reshape(batch_size, width),
        block[cells : cells + batch_size],
        block[cells + batch_size : cells + 2 * batch_size],
        block[cells + 2 * batch_size :],
    )


class TreeOutputBlock(NamedTuple):
    """The outputs of one tree-kernel call: views of one int64 allocation.

    Attributes
    ----------
    accepted_nodes : int64 [B, depth], C-contiguous
    output_token_ids : int64 [B, depth + 1], C-contiguous
    accepted_lengths : int64 [B]
    row_status : int64 [B]
    """

    accepted_nodes: Any
    output_token_ids: Any
    accepted_lengths: Any
    row_status: Any


def allocate_tree_output_block(xp: Any, batch_size: int, depth: int) -> TreeOutputBlock:
    """One ``empty`` allocation cut into the four outputs of a tree-kernel call.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    batch_size, depth : int
        ``B`` and the deepest path the outputs hold.
    """
    nodes = batch_size * depth
    tokens = batch_size * (depth + 1)
    block = xp.empty(nodes + tokens + 2 * batch_size, dtype=xp.int64)
    return TreeOutputBlock(
        block[:nodes].reshape(batch_size, depth),
        block[nodes : nodes + tokens].reshape(batch_size, depth + 1),
        block[nodes + tokens : nodes + tokens + batch_size],
        block[nodes + tokens + batch_size :],
    )


def tree_kernel_block(
    block: TreeOutputBlock, layout: Any, device: Any, xp: Any
) -> TreeOutputBlock:
    """The tree buffers the kernel writes: ``block`` itself, except on the GPU when it is
    deeper than the batch (``layout.max_depth``).  The CUDA kernel strides its working rows
    by the depth of ``accepted_nodes``, so it gets buffers of the batch's depth (``O(B D)``,
    against the ``O(B D V)`` working rows the caller's depth would size), and
    :func:`fill_deeper_tree_block` copies them into ``block`` after a successful call."""
    if device is None or block.accepted_nodes.shape[1] == layout.max_depth:
        return block
    return allocate_tree_output_block(xp, layout.batch_size, layout.max_depth)


def fill_deeper_tree_block(block: TreeOutputBlock, written: Any, depth: int) -> None:
    """Copy a successful call's tree outputs ``written`` (of depth ``depth``) into the
    deeper ``block``, ``-1`` padded as the kernel pads it."""
    block.accepted_nodes[:, :depth] = written.accepted_nodes
    block.accepted_nodes[:, depth:] = -1
    block.output_token_ids[:, : depth + 1] = written.output_token_ids
    block.output_token_ids[:, depth + 1 :] = -1
    block.accepted_lengths[...] = written.accepted_lengths
    block.row_status[...] = 0  # the call succeeded: every request's status is 0


def raise_for_row_status(
    first_bad_row: int,
    row_status: Any,
    id_of: Any,
    vocab_size: int,
    *,
    target_name: str = "target_with_bonus_probs",
    index_label: str = "(row, position)",
    row_of: Any = None,
) -> None:
    """Turn the first non-zero row status into a ``ValueError`` naming request and column.

    Parameters
    ----------
    first_bad_row : int
        The first request with a non-zero status, or -1 (nothing to raise).
    row_status : int64 [B]
    id_of : callable
        ``id_of(request, column) -> (argument name, index tuple, value)`` for the id in a
        column of the request's virtual id row (the layout knows where ids live).
    vocab_size : int
    target_name : str
        The target argument's name, for a row without mass.
    index_label : str
        How the message names an id's index (``(request, position)`` in the engine layout).
    row_of : callable, optional
        ``row_of(request, position)``: the flat target row, for layouts whose target is
        not indexed ``[request, position]``.

    Raises
    ------
    ValueError
    """
    if first_bad_row < 0:
        return
    row = int(first_bad_row)
    code = int(row_status[row])
    raise_for_kernel_status(code, row)
    if code < 0:
        position = -code - 1
        where = f"[{row}, {position}]" if row_of is None else (
            f"[{row_of(row, position)}] (request {row}, position {position})"
        )
        raise ValueError(
            f"{target_name}{where} has no positive probability, so no token can be drawn "
            "there; the target rows must be probability distributions"
        )
    raise_for_invalid_id(
        id_of, row, code - 1, vocab_size, target_name=target_name, index_label=index_label
    )


def raise_for_kernel_status(code: int, request: int) -> None:
    """The statuses of every layout that are about the kernel call, not the inputs.

    Raises
    ------
    MemoryError
        For ``STATUS_NO_MEMORY``.
    ValueError
        For ``STATUS_BAD_METHOD``.
    """
    if code == STATUS_NO_MEMORY:
        raise MemoryError(f"the kernel could not allocate working memory for request {request}")
    if code == STATUS_BAD_METHOD:
        raise ValueError(
            f"request {request}: its method code names no registry entry, or its method "
            "needs uniforms or working rows that the call did not pass"
        )


def raise_for_invalid_id(
    id_of: Any,
    request: int,
    column: int,
    vocab_size: int,
    *,
    target_name: str = "target_with_bonus_probs",
    index_label: str = "(row, position)",
) -> None:
    """``ValueError`` for the out-of-vocabulary id in ``column`` of ``request``'s id row.

    Parameters as :func:`raise_for_row_status`.
    """
    name, index, value = id_of(request, column)
    raise ValueError(
        f"{name} must lie in [0, {vocab_size}) (the vocabulary of {target_name}); "
        f"found {int(value)} at {index_label} = {index}"
    )
