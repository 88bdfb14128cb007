"""The verifier registry: every verifier of specdec_np, declared once.

The stateless functions of :mod:`specdec_np.verify`, the sampler classes of
:mod:`specdec_np.samplers`, the command line, ``specdec-np check``, the benchmarks, the fuzz
worker and the test matrices all iterate over :data:`VERIFIERS`; nothing else lists
verifiers.  Adding a verifier means adding its entry here, its reference function, one row
kernel per backend, its oracle and its tests (see ``docs/semantics.md``).

Examples
--------
>>> from specdec_np import registry
>>> [verifier.name for verifier in registry.VERIFIERS]
['rejection', 'block', 'typical', 'greedy']
>>> registry.get("block").sampler_name
'BlockVerificationSampler'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TREE_METHODS",
    "VERIFIERS",
    "Parameter",
    "TreeMethod",
    "Verifier",
    "get",
    "get_tree_method",
    "names",
]


@dataclass(frozen=True)
class Parameter:
    """A verifier parameter (a finite, non-negative real number).

    Attributes
    ----------
    name : str
    default : float
    description : str
    """

    name: str
    default: float
    description: str


@dataclass(frozen=True)
class Verifier:
    """One verifier.

    Attributes
    ----------
    name : str
        Short name, used by the command line and ``method=`` arguments.
    function_name, sampler_name : str
        Names of the stateless function and of the sampler class made from this entry.
    summary : str
        One paragraph for the generated docstrings.
    stochastic : bool
        Reads uniforms: ``k`` acceptance uniforms and one residual uniform per row.
    lossless : bool
        The output has exactly the target's distribution.
    reads_draft_probs : bool
        Uses ``draft_probs`` (None means point-mass drafts); the others ignore them.
    causal_counts : bool
        ``num_accepted`` counts the accepted prefix only; otherwise every position is
        tested and counted independently (vLLM's counter semantics).
    requires_normalised_rows : bool
        Relies on rows summing to one (checked in strict mode).
    parameters : tuple of Parameter
    row_function : str
        The CPU row function, an entry of ``specdec_np._core.ROW_FUNCTIONS``.
    cuda_row : str
        The CUDA row functor of ``specdec_np._cuda``.
    reference_name : str
        The function of ``specdec_np._reference`` that is this verifier's oracle of record.
    oracle_name : str or None
        The exact-law function of ``specdec_np._conformance`` (lossless verifiers).
    """

    name: str
    function_name: str
    sampler_name: str
    summary: str
    stochastic: bool
    lossless: bool
    reads_draft_probs: bool
    causal_counts: bool
    requires_normalised_rows: bool
    row_function: str
    cuda_row: str
    reference_name: str
    oracle_name: str | None = None
    parameters: tuple[Parameter, ...] = field(default=())

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The names of :attr:`parameters`, in order."""
        return tuple(parameter.name for parameter in self.parameters)

    @property
    def reference(self) -> Callable[..., Any]:
        """The array-API reference, called as ``reference(target_with_bonus_probs,
        bonus_token_ids, draft_probs, draft_token_ids, uniforms, **parameters)`` and
        returning ``(output_token_ids, accepted_lengths, num_accepted)``."""
        function = getattr(importlib.import_module("specdec_np._reference"), self.reference_name)
        if self.stochastic:
            return function

        def deterministic(target, bonus, draft_probs, draft_ids, uniforms=None, **parameters):
            values = [parameters.get(p.name, p.default) for p in self.parameters]
            return function(target, bonus, draft_ids, *values)

        return deterministic

    @property
    def oracle(self) -> Callable[..., Any] | None:
        """``oracle(p, q) -> ChainLaw``: the exact law of the emitted tokens continued by
        the target, and the expected accepted length (None for lossy verifiers)."""
        if self.oracle_name is None:
            return None
        return getattr(importlib.import_module("specdec_np._conformance"), self.oracle_name)


_TYPICAL_PARAMETERS = (
    Parameter("posterior_threshold", 0.09, "upper bound of the acceptance threshold"),
    Parameter("posterior_alpha", 0.3, "scale of exp(-entropy) in the threshold"),
)

#: Every verifier, in the order the command line and the reports list them.
VERIFIERS: tuple[Verifier, ...] = (
    Verifier(
        name="rejection",
        function_name="rejection_sample",
        sampler_name="RejectionSampler",
        summary=(
            "Lossless verification by token-wise rejection sampling (Leviathan et al., Chen "
            "et al. 2023). Position i is accepted iff u_i * q_i(x_i) < p_i(x_i) (float64); at "
            "the first rejected position r a token is drawn from max(p_r - q_r, 0) by inverse "
            "CDF (from p_r if that has no mass); if none is rejected the bonus token follows."
        ),
        stochastic=True,
        lossless=True,
        reads_draft_probs=True,
        causal_counts=False,
        requires_normalised_rows=False,
        row_function="rejection_row",
        cuda_row="RejectionRow",
        reference_name="rejection_sample",
        oracle_name="rejection_law",
    ),
    Verifier(
        name="block",
        function_name="block_verification_sample",
        sampler_name="BlockVerificationSampler",
        summary=(
            "Lossless block verification (Sun et al., ICLR 2025): accepts the longest prefix "
            "tau whose weighted check eta_tau < h_tau passes, scanning from the last "
            "position down, then draws from the weighted residual max(rho_tau p - q, 0). "
            "Never accepts fewer tokens in expectation than rejection sampling. num_accepted "
            "counts the accepted prefix (causal)."
        ),
        stochastic=True,
        lossless=True,
        reads_draft_probs=True,
        causal_counts=True,
        requires_normalised_rows=False,
        row_function="block_verification_row",
        cuda_row="BlockVerificationRow",
        reference_name="block_verification_sample",
        oracle_name="block_verification_law",
    ),
    Verifier(
        name="typical",
        function_name="typical_acceptance_sample",
        sampler_name="TypicalAcceptanceSampler",
        summary=(
            "Typical acceptance (Medusa; lossy by design). Position i is accepted iff "
            "p_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)) with "
            "H_i = -sum_y p_i(y) ln(p_i(y) + 1e-5); at the first rejection the target's "
            "argmax (first index on ties) is emitted. No randomness; rows need not be "
            "normalised."
        ),
        stochastic=False,
        lossless=False,
        reads_draft_probs=False,
        causal_counts=False,
        requires_normalised_rows=False,
        row_function="typical_acceptance_row",
        cuda_row="TypicalAcceptanceRow",
        reference_name="typical_acceptance_sample",
        parameters=_TYPICAL_PARAMETERS,
    ),
    Verifier(
        name="greedy",
        function_name="greedy_sample",
        sampler_name="GreedySampler",
        summary=(
            "Greedy (temperature 0) verification: position i is accepted iff x_i is the "
            "first index of the maximum of p_i; at the first mismatch the argmax is emitted. "
            "The rows must be probability distributions (sum 1 within 1e-3, checked in "
            "strict mode): a draft with p(x) > 0.5005 is accepted without reading its row."
        ),
        stochastic=False,
        lossless=False,
        reads_draft_probs=False,
        causal_counts=False,
        requires_normalised_rows=True,
        row_function="greedy_row",
        cuda_row="GreedyRow",
        reference_name="greedy_sample",
    ),
)

_BY_NAME = {verifier.name: verifier for verifier in VERIFIERS}


def get(name: str) -> Verifier:
    """The verifier called ``name``.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.
    """
    return _lookup(_BY_NAME, name)


def _lookup(table: dict[str, Any], name: str) -> Any:
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"method must be one of {', '.join(repr(n) for n in table)}; found {name!r}"
        ) from None


def names(*, stochastic: bool | None = None, lossless: bool | None = None) -> tuple[str, ...]:
    """Names of the verifiers, optionally only the (non-)stochastic or (non-)lossless ones."""
    return tuple(
        verifier.name
        for verifier in VERIFIERS
        if (stochastic is None or verifier.stochastic == stochastic)
        and (lossless is None or verifier.lossless == lossless)
    )


@dataclass(frozen=True)
class TreeMethod:
    """One verification method of the tree layout (``docs/semantics.md``, trees).

    Attributes
    ----------
    name : str
    summary : str
    drafting : str or None
        How the method assumes siblings were drafted: ``"fixed"`` (deterministic
        candidates), ``"independent"`` (each child from its own ``q_j``),
        ``"without_replacement"`` (siblings from one ``q``), or None (greedy: no law).
    walk : str
        The CPU walk, a name in ``specdec_np._core.TREE_WALKS``.
    reads_draft_probs : bool
        Whether the walk reads draft rows (without them it walks as ``point_mass``).
    """

    name: str
    summary: str
    drafting: str | None
    walk: str
    reads_draft_probs: bool

    @property
    def stochastic(self) -> bool:
        """Whether the walk reads uniforms (every method but greedy)."""
        return self.drafting is not None


#: The tree methods of ``specdec_np.verify_tree``.
TREE_METHODS: tuple[TreeMethod, ...] = (
    TreeMethod(
        "greedy",
        "follow the child equal to the argmax of the node's row",
        None,
        walk="greedy_tree_walk",
        reads_draft_probs=False,
    ),
    TreeMethod(
        "point_mass",
        "deterministic candidates (EAGLE-2, SGLang): accept child j with probability r(x_j) "
        "under r with earlier siblings removed and renormalised",
        "fixed",
        walk="point_mass_tree_walk",
        reads_draft_probs=False,
    ),
    TreeMethod(
        "specinfer",
        "independently drafted children: accept x_j with probability min(1, r(x_j)/q_j(x_j)); "
        "on rejection r <- (r - q_j)+ renormalised",
        "independent",
        walk="specinfer_tree_walk",
        reads_draft_probs=True,
    ),
    TreeMethod(
        "rrs",
        "recursive rejection sampling: siblings drawn without replacement from one q",
        "without_replacement",
        walk="rrs_tree_walk",
        reads_draft_probs=True,
    ),
)

_TREE_BY_NAME = {method.name: method for method in TREE_METHODS}


def get_tree_method(name: str) -> TreeMethod:
    """The tree method called ``name``.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.
    """
    return _lookup(_TREE_BY_NAME, name)
