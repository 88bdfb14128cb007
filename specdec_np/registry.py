"""The verifier registry: every verifier and tree method of specdec_np, declared once.

Each entry says everything the rest of the package needs to know about its verifier: its
name, its flags (reads uniforms, lossless, causal counting, reads draft rows, needs
normalised rows, how a lazily drawn bonus token is chosen), its parameters, the names of
its kernels on both backends, of its reference and of its exact oracle, and what a check
compares its uniforms with (its decisions, for the knife-edge rule of the tests).  Its
code (its position in :data:`VERIFIERS`) is the number the kernels of both backends
dispatch on.

The stateless functions, the samplers, the dispatch layer, the command line,
``specdec-np check``, the kit, the benchmarks, the fuzz worker and the test matrices all
iterate over :data:`VERIFIERS` and :data:`TREE_METHODS`; nothing else lists verifiers.
Likewise :data:`LAYOUTS` declares each batch layout once (its front, its batch, its
reference adapter and its kit module).
This module imports nothing of the package: the modules that own a kernel, a reference or
an oracle resolve the names given here (``docs/semantics.md`` §10-11 say how to add a
verifier, a tree method and a layout).

Examples
--------
>>> from specdec_np import registry
>>> [verifier.name for verifier in registry.VERIFIERS]
['rejection', 'block', 'typical', 'greedy']
>>> registry.get("block").sampler_name
'BlockVerificationSampler'
>>> registry.get("greedy").code
3
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "DRAFTINGS",
    "LAYOUTS",
    "RELAXED_METHODS",
    "TREE_METHODS",
    "VERIFIERS",
    "Layout",
    "Parameter",
    "RelaxedMethod",
    "RelaxedParameter",
    "TreeMethod",
    "Verifier",
    "chain_method",
    "document_methods",
    "get",
    "get_layout",
    "get_tree_method",
    "layout_names",
    "names",
    "relaxed_names",
    "tree_method_names",
]


@dataclass(frozen=True)
class Parameter:  # numpydoc ignore=PR01
    """A verifier parameter (a finite, non-negative real number).

    Attributes
    ----------
    name : str
    default : float
    description : str

    Examples
    --------
    >>> from specdec_np import registry
    >>> threshold = registry.get("typical").parameters[0]
    >>> threshold.name, threshold.default
    ('posterior_threshold', 0.09)
    """

    name: str
    default: float
    description: str


@dataclass(frozen=True)
class Verifier:  # numpydoc ignore=PR01
    """One chain verifier.

    Attributes
    ----------
    name : str
        Short name, used by the command line and ``method=`` arguments.
    summary : str
        One paragraph for the docstrings and the command line.
    stochastic : bool
        Reads uniforms: ``k`` acceptance uniforms and one residual uniform per request.
    lossless : bool
        The output has exactly the target's distribution.
    reads_draft_probs : bool
        Uses the draft rows (None means point-mass drafts); the others ignore them.
    causal_counts : bool
        ``num_accepted`` counts the accepted prefix only; otherwise every position is
        tested and counted independently (vLLM's counter semantics).
    requires_normalised_rows : bool
        Relies on rows summing to one (checked in strict mode).
    bonus_by_argmax : bool
        A bonus token the verifier draws itself (``bonus_token_ids=None``) is the argmax
        of the raw bonus row, not a draw from its processed law with the last uniform.
    row_function : str
        The CPU row kernel, a function of ``specdec_np/_kernels/src/cpu/chain_rows.pxi``.
    cuda_row : str
        The CUDA row functor, a struct of ``specdec_np/_kernels/src/cuda/chain_rows.cuh``.
    reference_name : str
        The function of ``specdec_np._reference.chains`` that is this verifier's oracle of record.
    decisions_name : str
        The function of ``specdec_np._reference.chains`` that gives, per position, the quantity
        the verifier compares and its threshold: where the two are within rounding of each
        other, two correct implementations may decide differently.
    oracle_name : str or None
        The exact-law function of ``specdec_np.testing._oracles`` (lossless verifiers).
    parameters : tuple of Parameter
    function_name, sampler_name : str or None
        The names of the stateless function and of the sampler class that front this
        verifier in the padded vLLM layout (:mod:`specdec_np.verify`,
        :mod:`specdec_np.samplers`); None for a verifier reached through ``method=``
        only.
    bias_rule_name : str or None
        For a lossy verifier that is not greedy, the function of
        :mod:`specdec_np._relaxed.rules` that gives its acceptance probabilities, from
        which ``report_bias=True`` measures its bias (:mod:`specdec_np._relaxed.bias`).

    Examples
    --------
    >>> from specdec_np import registry
    >>> entry = registry.get("typical")
    >>> entry.stochastic, entry.lossless, entry.function_name
    (False, False, 'typical_acceptance_sample')
    """

    name: str
    summary: str
    stochastic: bool
    lossless: bool
    reads_draft_probs: bool
    causal_counts: bool
    requires_normalised_rows: bool
    bonus_by_argmax: bool
    row_function: str
    cuda_row: str
    reference_name: str
    decisions_name: str
    oracle_name: str | None = None
    parameters: tuple[Parameter, ...] = field(default=())
    function_name: str | None = None
    sampler_name: str | None = None
    bias_rule_name: str | None = None

    @property
    def code(self) -> int:
        """The number the kernels of both backends know this verifier by: its position in
        :data:`VERIFIERS`."""
        return _CODES[self.name]

    @property
    def greedy(self) -> bool:
        """Whether the verifier decides every request on its raw rows by the argmax (the
        lazy bonus too): the engine layouts then treat each request as greedy, process no
        row and draw no uniform, whatever its temperature."""
        return not self.stochastic and self.bonus_by_argmax

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The names of :attr:`parameters`, in order."""
        return tuple(parameter.name for parameter in self.parameters)

    @property
    def parameter_defaults(self) -> tuple[float, ...]:
        """The defaults of :attr:`parameters`, in order."""
        return tuple(parameter.default for parameter in self.parameters)


_TYPICAL_PARAMETERS = (
    Parameter("posterior_threshold", 0.09, "upper bound of the acceptance threshold"),
    Parameter("posterior_alpha", 0.3, "scale of exp(-entropy) in the threshold"),
)

#: Every chain verifier, in the order the command line and the reports list them.
VERIFIERS: tuple[Verifier, ...] = (
    Verifier(
        name="rejection",
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
        bonus_by_argmax=False,
        row_function="rejection_row",
        cuda_row="RejectionRow",
        reference_name="rejection_sample",
        decisions_name="rejection_decisions",
        oracle_name="rejection_law",
        function_name="rejection_sample",
        sampler_name="RejectionSampler",
    ),
    Verifier(
        name="block",
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
        bonus_by_argmax=False,
        row_function="block_verification_row",
        cuda_row="BlockVerificationRow",
        reference_name="block_verification_sample",
        decisions_name="block_verification_decisions",
        oracle_name="block_verification_law",
        function_name="block_verification_sample",
        sampler_name="BlockVerificationSampler",
    ),
    Verifier(
        name="typical",
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
        bonus_by_argmax=False,
        row_function="typical_acceptance_row",
        cuda_row="TypicalAcceptanceRow",
        reference_name="typical_acceptance_sample",
        decisions_name="typical_acceptance_decisions",
        parameters=_TYPICAL_PARAMETERS,
        function_name="typical_acceptance_sample",
        sampler_name="TypicalAcceptanceSampler",
        bias_rule_name="typical_accepts",
    ),
    Verifier(
        name="greedy",
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
        bonus_by_argmax=True,
        row_function="greedy_row",
        cuda_row="GreedyRow",
        reference_name="greedy_sample",
        decisions_name="greedy_decisions",
        function_name="greedy_sample",
        sampler_name="GreedySampler",
    ),
)

_CODES = {verifier.name: code for code, verifier in enumerate(VERIFIERS)}
_BY_NAME = {verifier.name: verifier for verifier in VERIFIERS}


def get(name: str) -> Verifier:
    """The verifier called ``name``.

    Parameters
    ----------
    name : str
        A name of :func:`names`.

    Returns
    -------
    Verifier
        Its entry of :data:`VERIFIERS`.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.

    Examples
    --------
    >>> from specdec_np import registry
    >>> registry.get("block").lossless
    True
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
    """Names of the verifiers, optionally only the (non-)stochastic or (non-)lossless ones.

    Parameters
    ----------
    stochastic : bool, optional
        Keep only the verifiers that read uniforms (True) or those that do not (False).
    lossless : bool, optional
        Keep only the lossless verifiers (True) or the others (False).

    Returns
    -------
    tuple of str
        In code order.

    Examples
    --------
    >>> from specdec_np import registry
    >>> len(registry.names()) == len(registry.VERIFIERS)
    True
    >>> all(registry.get(name).lossless for name in registry.names(lossless=True))
    True
    """
    return tuple(
        verifier.name
        for verifier in VERIFIERS
        if (stochastic is None or verifier.stochastic == stochastic)
        and (lossless is None or verifier.lossless == lossless)
    )


@dataclass(frozen=True)
class RelaxedParameter:  # numpydoc ignore=PR01
    """A parameter of a relaxed method, checked by its kind.

    Attributes
    ----------
    name : str
    kind : str
        ``"count"`` (an int ``>= 1``), ``"real"`` (finite, ``>= 0``), ``"fraction"``
        (in ``[0, 1]``), ``"rates"`` (a non-increasing sequence in ``[0, 1]``, one per
        draft position), ``"choice"`` (one of :attr:`choices`), ``"requests"`` (bool
        ``[B]``) or ``"token"`` (a token id).
    default : object
        None: required (``"count"``, ``"real"``, ``"rates"``) or off (``"requests"``:
        every request; ``"token"``: unused).
    description : str
    choices : tuple of str

    Examples
    --------
    >>> from specdec_np import registry
    >>> [(p.name, p.kind) for p in registry.chain_method("fly").parameters]
    [('window_size', 'count'), ('entropy_threshold', 'real'), ('entropy_top_k', 'count')]
    """

    name: str
    kind: str
    default: Any
    description: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RelaxedMethod:  # numpydoc ignore=PR01
    """A lossy chain method that raises acceptance and measures what it costs
    (``docs/semantics.md``, "Relaxed methods").

    Its rule is written once, vectorised over requests, as ``rule_name`` of
    :mod:`specdec_np._relaxed.rules`; its exact total-variation distance from the target's
    law per emitted position in :mod:`specdec_np._relaxed.bias`.  Both backends run it
    through the array namespace of the rows.

    Attributes
    ----------
    name : str
        The ``method=`` name.
    summary : str
    reads_draft_probs : bool
        Its rule reads the draft rows (None: point-mass drafts).  Its bias reads them in
        any case, as the law the drafts were drawn from.
    greedy_draws : bool
        A greedy request consumes ``k_b + 2`` draws too (otherwise none).
    parameters : tuple of RelaxedParameter
    rule_name : str
        The function of :mod:`specdec_np._relaxed.rules` that decides each position.
    tree : bool
        It also runs in the tree layout.
    lossless, stochastic : bool
        False and True: it trades exactness for acceptance, and reads uniforms.
    function_name, sampler_name : None
        No padded-layout function or sampler class fronts it (``method=`` only).

    Examples
    --------
    >>> from specdec_np import registry
    >>> entry = registry.chain_method("synthetic")
    >>> entry.lossless, entry.greedy_draws, entry.parameter_names
    (False, True, ('acceptance_rates',))
    """

    name: str
    summary: str
    reads_draft_probs: bool
    greedy_draws: bool
    parameters: tuple[RelaxedParameter, ...]
    rule_name: str
    tree: bool = False
    lossless: bool = False
    stochastic: bool = True
    function_name: None = None
    sampler_name: None = None

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The names of :attr:`parameters`, in order."""
        return tuple(parameter.name for parameter in self.parameters)


_P = RelaxedParameter

#: Every relaxed (lossy) chain method, in the order the docs list them (their rules in
#: ``docs/semantics.md`` section 14a).
RELAXED_METHODS: tuple[RelaxedMethod, ...] = (
    RelaxedMethod(
        name="fly",
        summary=(
            "FLy (vLLM): a draft that fails its own test is accepted anyway when the row's "
            "top-entropy_top_k entropy is at least entropy_threshold, the draft is possible "
            "and the next window_size drafts pass their own tests."
        ),
        reads_draft_probs=True,
        greedy_draws=False,
        parameters=(
            _P("window_size", "count", None, "drafts after a deferred one that must pass"),
            _P("entropy_threshold", "real", None, "least top-k entropy (nats) to defer"),
            _P("entropy_top_k", "count", 3, "most probable tokens the entropy reads"),
        ),
        rule_name="fly_accepts",
    ),
    RelaxedMethod(
        name="synthetic",
        summary=(
            "Synthetic acceptance (vLLM's benchmarking mode): position i is kept when its "
            "uniform is below a_i / a_(i-1) of the unconditional acceptance_rates, whatever "
            "the token; every request, greedy ones too, draws k_b + 2 uniforms."
        ),
        reads_draft_probs=True,
        greedy_draws=True,
        parameters=(_P("acceptance_rates", "rates", None, "each position's unconditional rate"),),
        rule_name="synthetic_accepts",
    ),
    RelaxedMethod(
        name="relaxed",
        summary=(
            "Relaxed acceptance (TensorRT-LLM, thinking tokens): a draft that fails its own "
            "test is kept when among the relaxed_top_k most probable tokens within delta "
            "(or ratio) of the top one, per request or inside a begin/end token phase."
        ),
        reads_draft_probs=True,
        greedy_draws=False,
        parameters=(
            _P("relaxed_top_k", "count", 1, "most probable tokens that may be kept"),
            _P("delta", "real", 0.0, "the margin of the difference rule"),
            _P("ratio", "fraction", 1.0, "the factor of the ratio rule"),
            _P("relaxed_rule", "choice", "difference", "which margin applies",
               ("difference", "ratio")),
            _P("relaxed_requests", "requests", None, "bool [B]: the requests it applies to"),
            _P("begin_token_id", "token", None, "a token that opens the relaxed phase"),
            _P("end_token_id", "token", None, "a token that closes it"),
        ),
        rule_name="relaxed_accepts",
    ),
    RelaxedMethod(
        name="threshold",
        summary=(
            "SGLang's thresholds (target only): a draft is accepted when u <= p(x) / "
            "threshold_acc (a running sum over siblings on trees) or p(x) >= "
            "threshold_single; a rejection draws from p without it. Lossless at 1 and 1."
        ),
        reads_draft_probs=False,
        greedy_draws=False,
        parameters=(
            _P("threshold_single", "real", 1.0, "a draft at least this probable is kept"),
            _P("threshold_acc", "real", 1.0, "divides the acceptance (floored at 1e-9)"),
        ),
        rule_name="threshold_accepts",
        tree=True,
    ),
)
_RELAXED_BY_NAME = {method.name: method for method in RELAXED_METHODS}


def relaxed_names(*, tree: bool | None = None) -> tuple[str, ...]:
    """Names of the relaxed (lossy) methods.

    Parameters
    ----------
    tree : bool, optional
        Keep only those that also run (True) or do not run (False) in the tree layout.

    Returns
    -------
    tuple of str
        In :data:`RELAXED_METHODS` order.

    Examples
    --------
    >>> from specdec_np import registry
    >>> registry.relaxed_names()
    ('fly', 'synthetic', 'relaxed', 'threshold')
    """
    return tuple(
        method.name for method in RELAXED_METHODS if tree is None or method.tree == tree
    )


def chain_method(name: str) -> Verifier | RelaxedMethod:
    """The chain method called ``name``: a verifier, or a relaxed method.

    Parameters
    ----------
    name : str
        A name of :func:`names` or :func:`relaxed_names`.

    Returns
    -------
    Verifier or RelaxedMethod
        Its entry of :data:`VERIFIERS` or of :data:`RELAXED_METHODS`.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.

    Examples
    --------
    >>> from specdec_np import registry
    >>> type(registry.chain_method("block")).__name__, type(registry.chain_method("fly")).__name__
    ('Verifier', 'RelaxedMethod')
    >>> registry.chain_method("threshold").parameter_names
    ('threshold_single', 'threshold_acc')
    """
    return _lookup({**_BY_NAME, **_RELAXED_BY_NAME}, name)


#: How a tree method assumes the children of a node were drafted: given (deterministic
#: candidates), each independently from its own draft row, or the siblings without
#: replacement from one row.  The oracles draw trees the same ways.
DRAFTINGS: tuple[str, ...] = ("fixed", "independent", "without_replacement")


@dataclass(frozen=True)
class TreeMethod:  # numpydoc ignore=PR01
    """One verification method of the tree layout (``docs/semantics.md``, trees).

    Attributes
    ----------
    name : str
    summary : str
    drafting : str or None
        One of :data:`DRAFTINGS`, or None (greedy: no law).
    reads_draft_probs : bool
        Whether the walk reads draft rows (without them it walks as ``point_mass``).
    walk : str
        The CPU walk step, a function of ``specdec_np/_kernels/src/cpu/tree_walks.pxi``.
    cuda_walk : str
        The CUDA walk step, a struct of ``specdec_np/_kernels/src/cuda/tree_walks.cuh``.
    reference_name : str
        The request walk of ``specdec_np._reference.trees`` that is its oracle of record.
    oracle_name : str or None
        The exact emission law of ``specdec_np._reference.trees`` (stochastic methods).
    chain_verifier : str
        The chain verifier (:data:`VERIFIERS`) the walk equals on a chain given with draft
        rows; without them every stochastic walk is ``point_mass``, token-wise rejection.
    sequence_level : bool
        Decides on whole root-to-node sequences from the leaves up (post-order) rather
        than child by child from the root: its reference is a request walk, its kernel
        step decides the whole walk in one call (returning the deepest accepted node), and
        it keeps a residual row per level of the walked path (:meth:`working_rows`).

    Examples
    --------
    >>> from specdec_np import registry
    >>> method = registry.get_tree_method("specinfer")
    >>> method.reads_draft_probs, method.drafting, method.chain_verifier
    (True, 'independent', 'rejection')
    """

    name: str
    summary: str
    drafting: str | None
    reads_draft_probs: bool
    walk: str
    cuda_walk: str
    reference_name: str
    oracle_name: str | None = None
    chain_verifier: str = "rejection"
    sequence_level: bool = False

    def working_rows(self, max_depth: int) -> int:
        """How many float64 working rows of ``V`` the walk needs per CPU thread or GPU
        request: a residual and its update, or, for a sequence-level walk, one residual per
        level of the path that is not a leaf and one for the update.

        Parameters
        ----------
        max_depth : int
            The deepest node of the batch (a child of the root has depth 1).

        Returns
        -------
        int
            At least 2.
        """
        return max(2, max_depth + 1) if self.sequence_level else 2

    @property
    def stochastic(self) -> bool:
        """Whether the walk reads uniforms (every method but greedy)."""
        return self.drafting is not None

    @property
    def code(self) -> int:
        """The number the tree kernels of both backends know this method by: its position
        in :data:`TREE_METHODS`."""
        return _TREE_CODES[self.name]


#: The tree methods of ``specdec_np.verify_tree``.
TREE_METHODS: tuple[TreeMethod, ...] = (
    TreeMethod(
        name="greedy",
        summary="follow the child equal to the argmax of the node's row",
        drafting=None,
        reads_draft_probs=False,
        walk="greedy_tree_step",
        cuda_walk="GreedyTreeStep",
        reference_name="greedy_tree_walk",
        chain_verifier="greedy",
    ),
    TreeMethod(
        name="point_mass",
        summary=(
            "deterministic candidates (EAGLE-2, SGLang): accept child j with probability "
            "r(x_j) under r with earlier siblings removed and renormalised"
        ),
        drafting="fixed",
        reads_draft_probs=False,
        walk="point_mass_tree_step",
        cuda_walk="PointMassTreeStep",
        reference_name="point_mass_tree_walk",
        oracle_name="point_mass_tree_law",
    ),
    TreeMethod(
        name="specinfer",
        summary=(
            "independently drafted children: accept x_j with probability "
            "min(1, r(x_j)/q_j(x_j)); on rejection r <- (r - q_j)+ renormalised"
        ),
        drafting="independent",
        reads_draft_probs=True,
        walk="specinfer_tree_step",
        cuda_walk="SpecInferTreeStep",
        reference_name="specinfer_tree_walk",
        oracle_name="specinfer_tree_law",
    ),
    TreeMethod(
        name="rrs",
        summary="recursive rejection sampling: siblings drawn without replacement from one q",
        drafting="without_replacement",
        reads_draft_probs=True,
        walk="rrs_tree_step",
        cuda_walk="RrsTreeStep",
        reference_name="rrs_tree_walk",
        oracle_name="rrs_tree_law",
    ),
    TreeMethod(
        name="traversal",
        summary=(
            "traversal verification (Weng et al., NeurIPS 2025), independently drafted "
            "children: sequence-level, leaves up in post-order, with block verification's "
            "path weights and weighted residuals; block verification on a chain"
        ),
        drafting="independent",
        reads_draft_probs=True,
        walk="traversal_tree_step",
        cuda_walk="TraversalTreeStep",
        reference_name="traversal_tree_walk",
        oracle_name="traversal_tree_law",
        chain_verifier="block",
        sequence_level=True,
    ),
)

_TREE_CODES = {method.name: code for code, method in enumerate(TREE_METHODS)}
_TREE_BY_NAME = {method.name: method for method in TREE_METHODS}


def get_tree_method(name: str) -> TreeMethod:
    """The tree method called ``name``.

    Parameters
    ----------
    name : str
        A name of :func:`tree_method_names`.

    Returns
    -------
    TreeMethod
        Its entry of :data:`TREE_METHODS`.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.

    Examples
    --------
    >>> from specdec_np import registry
    >>> registry.get_tree_method("traversal").sequence_level
    True
    """
    return _lookup(_TREE_BY_NAME, name)


def tree_method_names(*, stochastic: bool | None = None) -> tuple[str, ...]:
    """Names of the tree methods, optionally only the (non-)stochastic ones.

    Parameters
    ----------
    stochastic : bool, optional
        Keep only the methods that read uniforms (True) or those that do not (False).

    Returns
    -------
    tuple of str
        In code order.

    Examples
    --------
    >>> from specdec_np import registry
    >>> "greedy" in registry.tree_method_names(stochastic=False)
    True
    """
    return tuple(
        method.name
        for method in TREE_METHODS
        if stochastic is None or method.stochastic == stochastic
    )


@dataclass(frozen=True)
class Layout:  # numpydoc ignore=PR01
    """One batch layout: how a caller hands a batch over, declared once.

    Attributes
    ----------
    name : str
        Short name, used by ``check_verifier(layout=...)`` and ``specdec-np check --layout``.
    summary : str
        One line for the docs and the command line.
    front : str
        The function every front of this layout calls (the samplers and the stateless
        functions for the padded chain), as ``module:attribute``.
    batch : str
        The function that checks a batch of this layout and makes it kernel-ready.
    reference : str
        The reference's adapter of this layout (the slow twin of :attr:`front`; for the
        padded chain, the function that gives a verifier's reference).
    kit : str
        The conformance kit's module for this layout (its ``check`` function).
    tree : bool
        Its methods are :data:`TREE_METHODS` (True) or :data:`VERIFIERS` (False).
    row_forms : tuple of str
        The forms its target rows may take: ``"probs"``, ``"logits"``.

    Examples
    --------
    >>> from specdec_np import registry
    >>> layout = registry.get_layout("ragged")
    >>> layout.front, layout.tree
    ('specdec_np._layouts.ragged:verify_ragged', False)
    """

    name: str
    summary: str
    front: str
    batch: str
    reference: str
    kit: str
    tree: bool = False
    row_forms: tuple[str, ...] = ("logits", "probs")

    def method_names(self, *, stochastic: bool | None = None) -> tuple[str, ...]:
        """The registry names of the methods this layout runs.

        Parameters
        ----------
        stochastic : bool, optional
            Keep only the methods that read uniforms (True) or those that do not (False).

        Returns
        -------
        tuple of str
            Tree method names for the tree layout, verifier names otherwise, in code order.
        """
        if self.tree:
            return tree_method_names(stochastic=stochastic)
        return names(stochastic=stochastic)


#: Every layout, in the order the docs and the command line list them.  The kit, the
#: command line and the shared tests iterate over this table.
LAYOUTS: tuple[Layout, ...] = (
    Layout(
        name="padded",
        summary="vLLM's padded chain [B, k+1, V]: the sampler classes and verify()",
        front="specdec_np.verify:run_padded",
        batch="specdec_np._layouts.padded:padded_chain",
        reference="specdec_np._reference.chains:reference_for",
        kit="specdec_np.testing._padded",
        row_forms=("probs",),
    ),
    Layout(
        name="ragged",
        summary="an engine's flat ragged batch from logits or probabilities: verify_ragged()",
        front="specdec_np._layouts.ragged:verify_ragged",
        batch="specdec_np._layouts.ragged:ragged_chain",
        reference="specdec_np._reference.ragged:verify_ragged",
        kit="specdec_np.testing._ragged",
    ),
    Layout(
        name="tree",
        summary="draft trees (EAGLE, Medusa, SpecInfer, multi-draft): verify_tree()",
        front="specdec_np._layouts.tree:verify_tree",
        batch="specdec_np._layouts.tree:tree_batch",
        reference="specdec_np._reference.trees:verify_tree",
        kit="specdec_np.testing._tree",
        tree=True,
    ),
)

_LAYOUTS_BY_NAME = {layout.name: layout for layout in LAYOUTS}


def get_layout(name: str) -> Layout:
    """The layout called ``name``.

    Parameters
    ----------
    name : str
        A name of :func:`layout_names`.

    Returns
    -------
    Layout
        Its entry of :data:`LAYOUTS`.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.

    Examples
    --------
    >>> from specdec_np import registry
    >>> registry.get_layout("tree").tree
    True
    """
    if name not in _LAYOUTS_BY_NAME:
        raise ValueError(
            f"layout must be one of {', '.join(repr(n) for n in _LAYOUTS_BY_NAME)}; "
            f"found {name!r}"
        )
    return _LAYOUTS_BY_NAME[name]


def layout_names() -> tuple[str, ...]:
    """Names of the layouts, in :data:`LAYOUTS` order.

    Returns
    -------
    tuple of str
        The ``name`` of each :class:`Layout`.

    Examples
    --------
    >>> from specdec_np import registry
    >>> registry.layout_names() == tuple(layout.name for layout in registry.LAYOUTS)
    True
    """
    return tuple(_LAYOUTS_BY_NAME)


# A documented object keeps its own type.
_Documented = TypeVar("_Documented", bound=Callable[..., Any])


def _quoted(names: tuple[str, ...]) -> str:
    quoted = [f'``"{name}"``' for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _method_lists() -> dict[str, list[str]]:
    """Each placeholder of :func:`document_methods` and the paragraphs it stands for."""
    reading = tuple(method.name for method in TREE_METHODS if method.reads_draft_probs)
    return {
        "[[verifier names]]": [f"{_quoted(names())} (``specdec_np.registry.VERIFIERS``)."],
        "[[tree methods]]": [
            f'* ``"{method.name}"``: {method.summary}.' for method in TREE_METHODS
        ],
        "[[tree methods reading draft rows]]": [
            f"Read by {_quoted(reading)}; None for deterministic candidates."
        ],
        "[[relaxed tree methods]]": [
            f'* ``"{method.name}"`` ({", ".join(method.parameter_names)}): {method.summary}'
            for method in RELAXED_METHODS if method.tree
        ],
        "[[relaxed methods]]": [
            f'* ``"{method.name}"`` ({", ".join(method.parameter_names)}): {method.summary}'
            for method in RELAXED_METHODS
        ],
    }


def document_methods(documented: _Documented) -> _Documented:
    """Write the method lists into a docstring from the tables, so that no docstring
    lists methods by hand.

    A line of the docstring that holds only ``[[verifier names]]``, ``[[tree methods]]``
    (one bullet per tree method with its summary), ``[[tree methods reading draft
    rows]]``, ``[[relaxed methods]]`` (one bullet per relaxed method with its
    parameters and summary) or ``[[relaxed tree methods]]`` (those that run on trees) is
    replaced by that list, wrapped at the line's indent.

    Parameters
    ----------
    documented : function or class
        The object whose docstring holds the placeholder lines.

    Returns
    -------
    function or class
        ``documented`` itself, its ``__doc__`` filled in.

    Examples
    --------
    >>> from specdec_np import registry
    >>> def pick(method):
    ...     pass
    >>> pick.__doc__ = "[[verifier names]]"
    >>> filled = registry.document_methods(pick).__doc__
    >>> all(f'``"{name}"``' in filled for name in registry.names())
    True
    """
    lines = []
    for line in (documented.__doc__ or "").split("\n"):
        paragraphs = _method_lists().get(line.strip())
        if paragraphs is None:
            lines.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        for paragraph in paragraphs:
            bullet = "  " if paragraph.startswith("* ") else ""
            lines.extend(
                textwrap.wrap(
                    paragraph, 88, initial_indent=indent,
                    subsequent_indent=indent + bullet, break_on_hyphens=False,
                )
            )
    documented.__doc__ = "\n".join(lines)
    return documented
