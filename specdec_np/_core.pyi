"""Type stub of the compiled CPU kernels (``specdec_np/_core.pyx`` and the include files
of ``specdec_np/_kernels/src/``).

Probability arrays are float32 or float64 and C-contiguous; token ids are int32 or int64
(one dtype per call); every output buffer is int64 and written by the kernel.  The
``row_status`` codes are those of ``specdec_np._runtime.contract``.  The ``method`` of
:func:`verify_chains` and :func:`verify_trees` (and the entries of ``request_methods``) are
registry codes (``Verifier.code``, ``TreeMethod.code``), bound to the kernels once by
``specdec_np._kernels.dispatch`` through :func:`bind_chain_rows` and :func:`bind_tree_steps`.
``specdec_np._kernels.cuda.core_like`` has the same kernel signatures on CuPy arrays (its kernels
return None).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

GREEDY_MARGIN: float

FloatArray = npt.NDArray[np.float32] | npt.NDArray[np.float64]
IdArray = npt.NDArray[np.int32] | npt.NDArray[np.int64]
Int64Array = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]
UInt64Array = npt.NDArray[np.uint64]

def openmp_enabled() -> bool: ...
def debug_build() -> bool: ...
def openmp_max_threads() -> int: ...
def row_function_names() -> tuple[str, ...]: ...
def tree_step_names() -> tuple[str, ...]: ...
def bind_chain_rows(
    row_functions: Sequence[str],
    reads_uniforms: Sequence[bool],
    bonus_by_argmax: Sequence[bool],
    num_parameters: Sequence[int],
) -> None: ...
def bind_tree_steps(
    steps: Sequence[str],
    reads_uniforms: Sequence[bool],
    reads_draft_rows: Sequence[bool],
) -> None: ...
def verify_chains(
    method: int,
    target_rows: FloatArray,
    draft_rows: FloatArray,
    point_mass_drafts: bool,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    draft_offsets: Int64Array,
    uniforms: Float64Array,
    parameters: Float64Array,
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
    num_threads: int,
    request_methods: npt.NDArray[np.int8] | None = None,
    causal: bool = False,
    draw_bonus: bool = False,
    sampling: Float64Array | None = None,
    scratch: FloatArray | None = None,
    target_logits: bool = True,
    draft_logits: bool = True,
    bonus_rows: bool = True,
    row_threads: int = 1,
    finds_overflow: bool = False,
) -> int: ...
def verify_trees(
    method: int,
    target_rows: FloatArray,
    draft_rows: FloatArray,
    point_mass_drafts: bool,
    draft_token_ids: IdArray,
    tree_parents: Int64Array,
    node_offsets: Int64Array,
    first_child: Int64Array,
    next_sibling: Int64Array,
    next_distinct_sibling: Int64Array,
    repeated_token: npt.NDArray[np.int8],
    uniforms: Float64Array,
    accepted_nodes: Int64Array,
    output: Int64Array,
    accepted_lengths: Int64Array,
    row_status: Int64Array,
    num_threads: int,
    request_methods: npt.NDArray[np.int8] | None = None,
    sampling: Float64Array | None = None,
    scratch: FloatArray | None = None,
    working: Float64Array | None = None,
    target_logits: bool = True,
    draft_logits: bool = True,
    row_threads: int = 1,
    target_adjustments: tuple[Any, Any, Any, Any] | None = None,
    draft_adjustments: tuple[Any, Any, Any, Any] | None = None,
    adjusted_rows: FloatArray | None = None,
) -> int: ...
def verify_chains_direct(
    method: int,
    target_rows: FloatArray,
    draft_rows: FloatArray,
    point_mass_drafts: bool,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    draft_offsets: Int64Array,
    uniforms: Float64Array,
    parameters: Float64Array,
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
    num_threads: int,
    request_methods: npt.NDArray[np.int8] | None = None,
    causal: bool = False,
    draw_bonus: bool = False,
    sampling: Float64Array | None = None,
    scratch: FloatArray | None = None,
    target_logits: bool = True,
    draft_logits: bool = True,
    bonus_rows: bool = True,
    row_threads: int = 1,
    finds_overflow: bool = False,
    target_adjustments: tuple[Any, Any, Any, Any] | None = None,
    draft_adjustments: tuple[Any, Any, Any, Any] | None = None,
    adjusted_rows: FloatArray | None = None,
) -> int: ...
def check_ragged_call(
    counts: Int64Array,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    bonus_given: bool,
    target_rows: FloatArray,
    draft_rows: FloatArray | None,
    temperature: Float64Array | None,
    greedy: npt.NDArray[np.bool_] | npt.NDArray[np.uint8],
    target_logits: bool,
    draft_logits: bool,
    law_reads_lone_rows: bool = False,
) -> tuple[Int64Array, Int64Array, int, int, bool, int] | None: ...
def output_block(
    batch_size: int, width: int
) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]: ...
def explicit_uniform_block(column: object, batch_size: int) -> Float64Array | None: ...
def sampling_arrays(
    batch_size: int,
    vocab_size: int,
    temperature: npt.NDArray[np.generic] | None,
    top_k: npt.NDArray[np.generic] | None,
    top_p: npt.NDArray[np.generic] | None,
    min_p: npt.NDArray[np.generic] | None,
    filter_code: float,
    from_logits: bool,
    divides_logits: bool,
    row_itemsize: int,
    every_request_greedy: bool,
    table: bool,
) -> tuple[
    Float64Array | None,
    Int64Array | None,
    Float64Array | None,
    Float64Array | None,
    npt.NDArray[np.bool_],
    Float64Array | None,
] | None: ...
def add_position_counts(lengths: Int64Array, counts: Int64Array) -> None: ...
def record_metrics(
    fields: dict[str, object],
    num_draft_tokens: object,
    accepted_lengths: object,
    commit: object,
    lock: object = None,
) -> bool: ...
def first_invalid_id(
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    draft_offsets: Int64Array,
    vocab_size: int,
) -> tuple[int, int] | None: ...
def ragged_offsets(counts: Int64Array, offsets: Int64Array) -> tuple[int, int]: ...
def first_tempered_overflow(
    rows: FloatArray,
    temperature: Float64Array,
    greedy: npt.NDArray[np.bool_] | npt.NDArray[np.uint8],
    rows_per_request: Int64Array,
    adjustments: tuple[Any, Any, Any, Any] | None = None,
) -> int: ...
def tree_layout_is_valid(
    num_nodes: Int64Array,
    tree_parents: Int64Array,
    draft_token_ids: Int64Array,
    vocab_size: int,
    max_depth: int,
    node_offsets: Int64Array,
    depths: Int64Array,
) -> bool: ...
def small_tree_links(
    node_offsets: Int64Array,
    tree_parents: Int64Array,
    draft_token_ids: Int64Array,
    first_child: Int64Array,
    next_sibling: Int64Array,
    next_distinct_sibling: Int64Array,
    repeated_token: npt.NDArray[np.int8],
) -> bool: ...
def create_output(
    accepted: npt.NDArray[np.uint8],
    substitute_token_ids: IdArray,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    vocab_size: int,
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
) -> int: ...

def processed_rows(
    logits: np.ndarray,
    sampling: np.ndarray,
    out: np.ndarray,
    num_threads: int,
    row_threads: int = 1,
    adjustments: tuple[Any, Any, Any, Any] | None = None,
) -> None: ...

def shard_stats(
    rows: FloatArray,
    temperature: FloatArray,
    groups: int,
    stats: Float64Array,
    group_max: FloatArray,
) -> None: ...
def shard_weights(
    rows: FloatArray,
    indices: Int64Array,
    temperature: FloatArray,
    z_max: FloatArray,
    cutoff: FloatArray,
    weights: FloatArray,
    masses: Float64Array,
) -> None: ...
def shard_at_least(
    rows: FloatArray,
    indices: Int64Array,
    temperature: FloatArray,
    thresholds: FloatArray,
    counts: Int64Array,
    columns: Int64Array,
    values: FloatArray,
) -> tuple[int, bool]: ...
def shard_exp(x: FloatArray, z_max: FloatArray, out: FloatArray) -> None: ...
def shard_divided(
    weights: FloatArray,
    indices: Int64Array,
    divisors: Float64Array,
    out: Float64Array,
    out_rows: Int64Array,
) -> None: ...
def shard_positive_sums(rows: Float64Array, sums: Float64Array) -> None: ...
def shard_first_crossings(
    rows: Float64Array,
    indices: Int64Array,
    inside: Float64Array,
    found: Int64Array,
) -> None: ...
def shard_residuals(
    rows: Float64Array,
    indices: Int64Array,
    scale: Float64Array,
    q: Float64Array,
) -> None: ...
def shard_argmax(rows: FloatArray, start: int, table: Float64Array) -> None: ...
def float_keys(values: FloatArray, keys: UInt64Array) -> None: ...
def key_floats(keys: UInt64Array, values: FloatArray) -> None: ...
def merge_shard_lists(
    gathered: UInt64Array,
    size: int,
    keys: UInt64Array,
    counts: Int64Array,
    known: UInt64Array,
) -> None: ...
def top_k_keys(
    keys: UInt64Array,
    counts: Int64Array,
    top_k: Int64Array,
    on: npt.NDArray[np.uint8],
    floors: UInt64Array,
) -> None: ...
def min_p_keys(
    top: FloatArray,
    min_p: Float64Array,
    log_min_p: Float64Array,
    floors: UInt64Array,
    lost: npt.NDArray[np.uint8],
) -> None: ...
def top_p_keys(
    keys: UInt64Array,
    counts: Int64Array,
    known: UInt64Array,
    floors: UInt64Array,
    top: FloatArray,
    top_p: Float64Array,
    masses: Float64Array,
    cutoffs: UInt64Array,
    open_rows: npt.NDArray[np.uint8],
) -> None: ...
def list_record(
    row_of: Int64Array,
    values: FloatArray,
    size: int,
    record: npt.NDArray[np.uint32] | UInt64Array,
) -> None: ...
def rejection_lengths(
    sampled: Int64Array,
    counts: Int64Array,
    first_target: Int64Array,
    target_at: Int64Array,
    offsets: Int64Array,
    draft_at: Int64Array,
    draft_ids: Int64Array,
    value: Float64Array,
    uniforms: Float64Array,
    drafts: bool,
    output: Int64Array,
    lengths: Int64Array,
) -> None: ...
def draw_shards(
    masses: Float64Array,
    order: Int64Array,
    v: Float64Array,
    rank: int,
    position: Int64Array,
    inside: Float64Array,
    empty: npt.NDArray[np.uint8],
    mine: npt.NDArray[np.uint8],
) -> None: ...
def dense_draw_rows(
    weights: FloatArray,
    p_rows: Int64Array,
    p_masses: Float64Array,
    q_rows: Int64Array,
    q_masses: Float64Array,
    scale: Float64Array,
    p_out: Float64Array,
    residual_out: Float64Array,
    masses: Float64Array,
) -> None: ...
