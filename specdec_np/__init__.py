"""specdec_np: speculative-decoding verifiers for NumPy and CuPy, without torch.

The samplers keep vLLM's names and semantics (``RejectionSampler``,
``TypicalAcceptanceSampler``, ``GreedySampler`` and their base classes) and add
``BlockVerificationSampler``; the stateless functions of :mod:`specdec_np.verify` do the
work and can be used on their own.  :mod:`specdec_np.registry` lists every verifier.
:func:`verify_ragged` verifies the flat batches engines hold (ragged drafts, logits,
per-request sampling parameters) and :func:`verify_tree` draft trees, with the builders
:func:`chain_tree`, :func:`multi_draft_tree`, :func:`from_next_arrays` and
:func:`best_first_tree`.
"""

from . import registry
from ._layouts.processed import processed_probs, sample_tokens
from ._layouts.ragged import output_buffers, verify_ragged
from ._layouts.tree import (
    MAX_TREE_DEPTH,
    TreeLayout,
    chain_tree,
    from_next_arrays,
    multi_draft_tree,
    to_next_arrays,
    tree_output_buffers,
    validate_tree,
    verify_tree,
)
from ._layouts.tree_builders import best_first_tree
from ._runtime.philox import counter_uniforms
from ._runtime.results import TreeVerificationResult, VerificationResult
from ._version import __version__
from .engine import EngineVerifier
from .metrics import VerificationMetrics
from .samplers import (
    BlockVerificationSampler,
    GreedySampler,
    RejectionSampler,
    SpecDecodeBaseSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
    TypicalAcceptanceSampler,
)
from .verify import (
    block_verification_sample,
    create_output,
    greedy_sample,
    rejection_sample,
    typical_acceptance_sample,
)

__all__ = [
    "MAX_TREE_DEPTH",
    "BlockVerificationSampler",
    "EngineVerifier",
    "GreedySampler",
    "RejectionSampler",
    "SpecDecodeBaseSampler",
    "SpecDecodeDeterministicBaseSampler",
    "SpecDecodeStochasticBaseSampler",
    "TreeLayout",
    "TreeVerificationResult",
    "TypicalAcceptanceSampler",
    "VerificationMetrics",
    "VerificationResult",
    "__version__",
    "best_first_tree",
    "block_verification_sample",
    "chain_tree",
    "counter_uniforms",
    "create_output",
    "from_next_arrays",
    "greedy_sample",
    "multi_draft_tree",
    "output_buffers",
    "processed_probs",
    "registry",
    "rejection_sample",
    "sample_tokens",
    "to_next_arrays",
    "tree_output_buffers",
    "typical_acceptance_sample",
    "validate_tree",
    "verify_ragged",
    "verify_tree",
]
