"""specdec_np: speculative-decoding verifiers for NumPy and CuPy, without torch.

The samplers keep vLLM's names and semantics (``RejectionSampler``,
``TypicalAcceptanceSampler``, ``GreedySampler`` and their base classes) and add
``BlockVerificationSampler``; the stateless functions of :mod:`specdec_np.verify` do the
work and can be used on their own.  :mod:`specdec_np.registry` lists every verifier.
"""

from . import registry, samplers, verify
from ._philox import counter_uniforms
from .samplers import (
    SpecDecodeBaseSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
)
from .verify import VerificationResult, create_output

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
    "VerificationResult",
    "__version__",
    "counter_uniforms",
    "create_output",
    "registry",
    *(verifier.function_name for verifier in registry.VERIFIERS),
    *(verifier.sampler_name for verifier in registry.VERIFIERS),
]
