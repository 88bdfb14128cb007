"""The stateful engine front: :class:`EngineVerifier`, :func:`verify_ragged` with a method,
its parameters, a generator and running metrics.

:func:`~specdec_np.verify_ragged` (the ragged layout, :mod:`specdec_np._layouts.ragged`) verifies
the flat batches engines hold; this class keeps what an engine would otherwise keep beside
it: the method and its parameters, a seeded generator for requests without a seed of their
own, and :class:`~specdec_np.metrics.VerificationMetrics` over every successful call.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Mapping
from typing import Any

from . import _core, registry
from ._layouts import ragged as _ragged
from ._layouts.engine_call import RowSources, UniformSource, engine_call, new_record
from ._layouts.sampling import SamplingParameters
from ._runtime import arrays as _backend
from ._runtime import checks as _validate
from ._runtime import uniforms as _random
from ._runtime.contract import OutputBlock
from ._runtime.results import VerificationResult
from .metrics import VerificationMetrics

__all__ = ["EngineVerifier"]

# verify_ragged's arguments that EngineVerifier fixes at construction.
_SET_AT_CONSTRUCTION = {"method", "strict_mode", "generator", "**method_parameters"}


def _call_sections(ragged_doc: str) -> str:
    """The Parameters, Returns and Raises sections of :meth:`EngineVerifier.__call__`,
    taken from :func:`verify_ragged`'s docstring without the arguments set at
    construction (and without its Examples)."""
    parameters = ragged_doc.split("Parameters\n----------\n", 1)[1]
    parameters, rest = parameters.split("\n\nReturns\n-------\n", 1)
    # verify_ragged's Examples call verify_ragged; the method has its class's.
    rest = rest.split("\n\nExamples\n--------\n", 1)[0]
    # An entry starts at an unindented line ("name : type"); its description is indented.
    entries = re.split(r"\n(?=\S)", parameters)
    kept = [
        entry
        for entry in entries
        if not {name.strip() for name in entry.split(" : ", 1)[0].split(",")}
        <= _SET_AT_CONSTRUCTION
    ]
    return (
        "Parameters\n----------\n" + "\n".join(kept) + "\n\nReturns\n-------\n" + rest
    )


@registry.document_methods
class EngineVerifier:
    """:func:`verify_ragged` with a method, its parameters, a generator and running metrics.

    Parameters
    ----------
    method : str, default "rejection"
        The verifier of the requests with ``temperature != 0``:
        [[verifier names]]
    seed : int, optional
        Seed of the verifier's own ``numpy.random.Generator``, the source of the uniforms
        of requests without a seed of their own.
    strict_mode : bool, default False
        Also check exact dtypes and finite, non-negative probabilities, in every call.
    **method_parameters : float
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``).

    Attributes
    ----------
    metrics : VerificationMetrics
        Sums over every successful call; merge across workers with ``+``.

    Notes
    -----
    One instance may be shared by threads: its generator is NumPy's (which draws under
    its own lock), a failed call puts back only its own draws, and the metrics are updated
    under a lock, whole or not at all, a ``KeyboardInterrupt`` included.

    Examples
    --------
    Request 0 has one draft (two rows), request 1 none (its bonus row); both are greedy
    here (temperature 0), so the tokens are the rows' argmaxes:

    >>> import numpy as np
    >>> from specdec_np import EngineVerifier
    >>> verifier = EngineVerifier("rejection", seed=0)
    >>> logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]))
    >>> result = verifier(num_draft_tokens=np.array([1, 0]), draft_token_ids=np.array([0]),
    ...                   target_logits=logits, temperature=0.0)
    >>> result.output_token_ids
    array([[ 0,  2],
           [ 2, -1]])
    >>> verifier.metrics.acceptance_rate, verifier.metrics.mean_accepted_length
    (1.0, 1.5)
    """

    def __init__(
        self,
        method: str = "rejection",
        *,
        seed: int | None = None,
        strict_mode: bool = False,
        **method_parameters: float,
    ) -> None:
        self._verifier = registry.chain_method(method)
        if isinstance(self._verifier, registry.RelaxedMethod):
            # Checked whole against each batch (rates per position, a flag per request).
            unknown = set(method_parameters).difference(self._verifier.parameter_names)
            if unknown:
                _validate.check_relaxed_parameters(self._verifier, method_parameters, 0, 0, 1)
        else:
            _validate.check_method_parameters(self._verifier, method_parameters)
        self._method_parameters = dict(method_parameters)
        self._strict_mode = _validate.check_strict_mode(strict_mode)
        self._own_generator = _random.OwnGenerator(_validate.check_seed(seed))
        # What every call passes on, looked up once.
        self._method_name = self._verifier.name
        self._generator_for = self._own_generator.for_device
        self.metrics = VerificationMetrics()
        self._metrics_lock = threading.RLock()

    @property
    def method(self) -> str:
        """The registry name of the verifier of sampled requests."""
        return self._verifier.name

    @_backend.array_front(
        device_from=("target_probs", "target_logits"),
        method=True,
        library_from=_ragged.DATA_ARGUMENTS,
    )
    def __call__(
        self,
        *,
        num_draft_tokens: Any,
        draft_token_ids: Any,
        target_logits: Any = None,
        target_probs: Any = None,
        draft_logits: Any = None,
        draft_probs: Any = None,
        temperature: Any = None,
        top_k: Any = None,
        top_p: Any = None,
        min_p: Any = None,
        filter_order: str = "vllm",
        bonus_token_ids: Any = None,
        uniforms: Any = None,
        seeded_seqs: Mapping[int, Any] | None = None,
        counter_seeds: Mapping[int, tuple[int, int]] | None = None,
        stream: str = "verify",
        out: OutputBlock | None = None,
        prompt_token_ids: Any = None,
        output_token_ids: Any = None,
        repetition_penalty: Any = None,
        frequency_penalty: Any = None,
        presence_penalty: Any = None,
        logit_bias: Any = None,
        allowed_token_ids: Any = None,
        bad_words_token_ids: Any = None,
        min_tokens: Any = None,
        stop_token_ids: Any = None,
        max_tokens: Any = None,
        token_bitmask: Any = None,
        logprobs: int | None = None,
        report_bias: bool = False,
    ) -> VerificationResult:
        """Verify a batch; the metrics are updated only by a call that succeeds.

        The keyword arguments of :func:`verify_ragged` other than ``method``,
        ``strict_mode``, ``generator`` and the method's parameters, which are set at
        construction; their entries below are :func:`verify_ragged`'s own.
        """
        # The records made with every field in their order (new_record: no argument
        # binding on every call).
        return engine_call(
            _ragged.RaggedCall(
                self._method_name, self._method_parameters, num_draft_tokens,
                draft_token_ids, bonus_token_ids, self._record,
            ),
            new_record(RowSources, (target_logits, target_probs, draft_logits, draft_probs)),
            new_record(SamplingParameters, (
                temperature, top_k, top_p, min_p, filter_order, prompt_token_ids,
                output_token_ids, repetition_penalty, frequency_penalty, presence_penalty,
                logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens,
                stop_token_ids, max_tokens, token_bitmask, logprobs,
            )),
            new_record(UniformSource, (
                uniforms, None, seeded_seqs, counter_seeds, self._generator_for,
                None, stream,
            )),
            strict_mode=self._strict_mode,
            out=out,
            report_bias=report_bias,
        )  # fmt: skip

    if __call__.__doc__ is not None and _ragged.verify_ragged.__doc__ is not None:
        # One source for the arguments' documentation: verify_ragged's own entries.
        __call__.__doc__ = inspect.cleandoc(__call__.__doc__) + "\n\n" + _call_sections(
            inspect.cleandoc(_ragged.verify_ragged.__doc__)
        )

    def _record(
        self, num_draft_tokens: Any, accepted_lengths: Any, commit: Any, emitted: Any = None,
        total_variation: Any = None,
    ) -> None:
        metrics = self.metrics
        lock = self._metrics_lock
        # The common record of VerificationMetrics itself in one compiled step that takes
        # and gives back the lock too (nothing of it is Python, so no interrupt lands
        # between them); any other record, or other metrics, through the method below.
        if (
            type(metrics) is VerificationMetrics
            and emitted is None
            and total_variation is None
            and _core.record_metrics(
                metrics.__dict__, num_draft_tokens, accepted_lengths, commit, lock
            )
        ):
            return
        # Not ``with``: an interrupt between acquiring the lock and entering the block would
        # keep it for good.  The ``finally`` releases it whenever this thread holds it.
        try:
            lock.acquire()
            self.metrics.record(
                num_draft_tokens, accepted_lengths, commit, emitted, total_variation
            )
        finally:
            if lock._is_owned():  # type: ignore[attr-defined]
                lock.release()
