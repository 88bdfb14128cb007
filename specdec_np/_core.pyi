"""Type stub of the compiled CPU kernels (``specdec_np/_core.pyx``).

Probability arrays are float32 or float64 and C-contiguous; token ids are int32 or int64
(one dtype per call); every output buffer is int64 and written by the kernel.  The
``row_status`` codes are those of ``specdec_np._contract``.  ``specdec_np._cuda.core_like``
has the same signatures on CuPy arrays (its kernels return None).
"""

import numpy as np
import numpy.typing as npt

GREEDY_MARGIN: float
#: Row functions by index, the ``method`` of :func:`verify_chains` (registry ``row_function``).
ROW_FUNCTIONS: tuple[str, ...]
TREE_WALKS: tuple[str, ...]

FloatArray = npt.NDArray[np.float32] | npt.NDArray[np.float64]
IdArray = npt.NDArray[np.int32] | npt.NDArray[np.int64]
Int64Array = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]

def openmp_enabled() -> bool: ...
def debug_build() -> bool: ...
def openmp_max_threads() -> int: ...
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
) -> int: ...
def verify_trees(
    method: int,
    target_rows: FloatArray,
    draft_rows: FloatArray,
    point_mass_drafts: bool,
    draft_token_ids: IdArray,
    tree_parents: Int64Array,
    node_offsets: Int64Array,
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
) -> int: ...
def first_invalid_id(
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    draft_offsets: Int64Array,
    vocab_size: int,
) -> tuple[int, int] | None: ...
def ragged_offsets(counts: Int64Array, offsets: Int64Array) -> tuple[int, int]: ...
def tree_layout_is_valid(
    num_nodes: Int64Array,
    tree_parents: Int64Array,
    draft_token_ids: Int64Array,
    vocab_size: int,
    max_depth: int,
    node_offsets: Int64Array,
    depths: Int64Array,
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
