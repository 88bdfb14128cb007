"""specdec_np: speculative-decoding verifiers for NumPy and CuPy, without torch.

The samplers keep vLLM's names and semantics (``RejectionSampler``,
``TypicalAcceptanceSampler``, ``GreedySampler`` and their base classes) and add
``BlockVerificationSampler``; the stateless functions of :mod:`specdec_np.verify` do the
work and can be used on their own.  :mod:`specdec_np.registry` lists every verifier.
:func:`verify_ragged` verifies the flat batches engines hold (ragged drafts, logits,
per-request sampling parameters) and :func:`verify_tree` draft trees, with the builders
:func:`chain_tree`, :func:`multi_draft_tree` and :func:`from_next_arrays`.
"""

from . import registry, samplers, verify
from ._philox import counter_uniforms
from ._trees import (
    MAX_TREE_DEPTH,
    TreeLayout,
    chain_tree,
    from_next_arrays,
    multi_draft_tree,
    to_next_arrays,
    validate_tree,
)
from .engine import (
    EngineVerifier,
    output_buffers,
    tree_output_buffers,
    verify_ragged,
    verify_tree,
)
from .metrics import VerificationMetrics
from .samplers import (
    SpecDecodeBaseSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
)
from .verify import TreeVerificationResult, VerificationResult, create_output

__version__ = "0.1.0"

# One stateless function and one sampler class per registered verifier.
for _verifier in registry.VERIFIERS:
    globals()[_verifier.function_name] = getattr(verify, _verifier.function_name)
    globals()[_verifier.sampler_name] = getattr(samplers, _verifier.sampler_name)
del _verifier

__all__ = [
    "SpecDecodeBaseSampler",
    "SpecDecodeDeterministicBaseSampler",
    "SpecDecodeStochasticBaseSampler",
    "EngineVerifier",
    "MAX_TREE_DEPTH",
    "TreeLayout",
    "TreeVerificationResult",
    "VerificationMetrics",
    "VerificationResult",
    "__version__",
    "chain_tree",
    "counter_uniforms",
    "create_output",
    "from_next_arrays",
    "multi_draft_tree",
    "output_buffers",
    "registry",
    "to_next_arrays",
    "tree_output_buffers",
    "validate_tree",
    "verify_ragged",
    "verify_tree",
    *(verifier.function_name for verifier in registry.VERIFIERS),
    *(verifier.sampler_name for verifier in registry.VERIFIERS),
]
