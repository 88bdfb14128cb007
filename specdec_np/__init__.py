"""specdec_np: speculative-decoding verifiers for NumPy and CuPy, without torch.

The samplers keep vLLM's names and semantics (``RejectionSampler``,
``TypicalAcceptanceSampler``, ``GreedySampler`` and their base classes); the stateless
functions of :mod:`specdec_np.verify` do the work and can be used on their own.
"""

from ._philox import counter_uniforms
from .samplers import (
    GreedySampler,
    RejectionSampler,
    SpecDecodeBaseSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
    TypicalAcceptanceSampler,
)
from .verify import (
    VerificationResult,
    create_output,
    greedy_sample,
    rejection_sample,
    typical_acceptance_sample,
)

__version__ = "0.1.0"

__all__ = [
    "GreedySampler",
    "RejectionSampler",
    "SpecDecodeBaseSampler",
    "SpecDecodeDeterministicBaseSampler",
    "SpecDecodeStochasticBaseSampler",
    "TypicalAcceptanceSampler",
    "VerificationResult",
    "__version__",
    "counter_uniforms",
    "create_output",
    "greedy_sample",
    "rejection_sample",
    "typical_acceptance_sample",
]
