"""Type stub of the compiled CPU kernels (``specdec_np/_core.pyx``).

Probability arrays are float32 or float64 and C-contiguous; token ids are int32 or int64
(one dtype per call); every output buffer is int64 and written by the kernel.  The
``row_status`` protocol is described in the module docstring of ``_core.pyx``.
"""

import numpy as np
import numpy.typing as npt

GREEDY_MARGIN: float

FloatArray = npt.NDArray[np.float32] | npt.NDArray[np.float64]
IdArray = npt.NDArray[np.int32] | npt.NDArray[np.int64]
Int64Array = npt.NDArray[np.int64]

def openmp_enabled() -> bool: ...
def debug_build() -> bool: ...
def openmp_max_threads() -> int: ...
def rejection_sample(
    target_with_bonus_probs: FloatArray,
    draft_probs: FloatArray,
    point_mass_drafts: bool,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    uniforms: npt.NDArray[np.float64],
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
    num_threads: int,
) -> int: ...
def typical_acceptance_sample(
    target_with_bonus_probs: FloatArray,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    posterior_threshold: float,
    posterior_alpha: float,
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
    num_threads: int,
) -> int: ...
def greedy_sample(
    target_with_bonus_probs: FloatArray,
    draft_token_ids: IdArray,
    bonus_token_ids: IdArray,
    output: Int64Array,
    accepted_lengths: Int64Array,
    num_accepted: Int64Array,
    row_status: Int64Array,
    num_threads: int,
) -> int: ...
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
