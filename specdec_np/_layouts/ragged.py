"""The ragged layout of engines and its front, :func:`verify_ragged`.

:func:`verify_ragged` verifies the flat batch that vLLM v1, SGLang and the llama.cpp server
hand a verifier: request ``b`` proposes ``k_b >= 0`` drafts, the target rows of all
requests are stacked ``[T + B, V]`` (request ``b``'s ``k_b`` draft positions, then its
bonus position), and greedy (``temperature == 0``) and sampled requests share one call and
one kernel launch.  :func:`ragged_chain` checks such a batch and makes it the
:class:`~specdec_np._layouts.padded.ChainBatch` the chain drivers read; :func:`output_buffers`
makes the ``out=`` buffers of a steady-state engine.  ``docs/semantics.md`` states the
rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import _core, registry
from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import contract as _contract
from .._runtime import results as _results
from . import fast_path as _fast
from . import padded as _chains
from . import sampling as _sampling
from . import surface as _surface
from .engine_call import RowSources, UniformSource, engine_call, new_record
from .sampling import SamplingParameters

__all__ = ["RaggedCall", "output_buffers", "ragged_chain", "verify_ragged"]

_GREEDY = registry.get("greedy")
_REJECTION = registry.get("rejection")
_INT64_MAX = int(np.iinfo(np.int64).max)

#: The arguments whose arrays decide the results' array library.
DATA_ARGUMENTS = (
    "num_draft_tokens",
    "draft_token_ids",
    "target_logits",
    "target_probs",
    "draft_logits",
    "draft_probs",
    "bonus_token_ids",
)


def output_buffers(batch_size: int, max_draft_tokens: int, xp: Any = np) -> _contract.OutputBlock:
    """Buffers for ``verify_ragged(..., out=...)``, so that a steady-state engine allocates
    nothing per call.

    Parameters
    ----------
    batch_size : int
        ``B``.
    max_draft_tokens : int
        The largest ``k_b`` the buffers must hold (output width ``max_draft_tokens + 1``).
    xp : module
        ``numpy`` or ``cupy`` (on the current device).

    Returns
    -------
    OutputBlock
        ``output_token_ids`` int64 ``[B, max_draft_tokens + 1]`` and three int64 ``[B]``
        arrays (accepted lengths, acceptance counts, row status).

    Raises
    ------
    TypeError, ValueError
        For a size that is not a non-negative int (floats, even ``2.0``, included).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import output_buffers, verify_ragged
    >>> out = output_buffers(batch_size=2, max_draft_tokens=4)
    >>> logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]))
    >>> result = verify_ragged(num_draft_tokens=np.array([1, 0]), draft_token_ids=np.array([0]),
    ...                        target_logits=logits, temperature=0.0, out=out)
    >>> result.output_token_ids, np.shares_memory(result.output_token_ids, out.output_token_ids)
    (array([[ 0,  2],
           [ 2, -1]]), True)
    """
    return _contract.allocate_output_block(
        xp,
        _validate.check_integer("batch_size", batch_size),
        _validate.check_integer("max_draft_tokens", max_draft_tokens) + 1,
    )


def _check_out(
    out: Any, batch: _chains.ChainBatch, inputs: dict[str, Any]
) -> _contract.OutputBlock:
    def shapes(block: _contract.OutputBlock) -> dict[str, tuple[int, ...]]:
        found = tuple(block.output_token_ids.shape)
        if len(found) != 2 or found[0] != batch.batch_size or found[1] < batch.max_k + 1:
            raise ValueError(
                f"out must hold [B, >= max k + 1] = [{batch.batch_size}, {batch.max_k + 1}] "
                f"outputs; found {_validate.shape_text(found)}"
            )
        expected: dict[str, tuple[int, ...]] = {
            name: (batch.batch_size,) for name in block._fields
        }
        expected["output_token_ids"] = found
        return expected

    xp = batch.xp
    _validate.check_out_block(
        out,
        _contract.OutputBlock,
        "output_buffers(B, max_k)",
        shapes,
        lambda array: _backend.is_array_of(array, xp),
        _backend.device_of,
        batch.device,
        xp,
        inputs,
    )
    return out


@_backend.array_front(
    device_from=("target_probs", "target_logits"), library_from=DATA_ARGUMENTS
)
@registry.document_methods
def verify_ragged(
    *,
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_logits: Any = None,
    target_probs: Any = None,
    draft_logits: Any = None,
    draft_probs: Any = None,
    method: str = "rejection",
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    bonus_token_ids: Any = None,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    stream: str = "verify",
    strict_mode: bool = False,
    out: _contract.OutputBlock | None = None,
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
    **method_parameters: Any,
) -> _results.VerificationResult:
    """Verify a flat engine batch: ragged drafts, per-request parameters, mixed methods.

    Parameters
    ----------
    num_draft_tokens : int array [B]
        ``k_b >= 0`` drafts per request (0: the request only gets its bonus token).
    draft_token_ids : int64 or int32 [T], ``T = sum k_b``
        The drafts, request by request.
    target_logits : float32 or float64 [T + B, V], optional
        Request ``b`` owns ``k_b + 1`` consecutive rows: its draft positions, then its
        bonus position.  Each row a request reads is processed with its ``temperature``,
        ``min_p``, ``top_k`` and ``top_p`` (the law of ``docs/semantics.md``), and only the
        rows it reads are (exactly one of ``target_logits`` and ``target_probs``).
    target_probs : float32 or float64 [T + B, V], optional
        The same rows as probabilities, taken as already processed.  In either form, with
        ``bonus_token_ids`` given the bonus rows are never read, and ``[T, V]`` (the draft
        positions only, as vLLM v1 holds them) is accepted.
    draft_logits : same dtype [T, V], optional
        The draft's logits (with ``target_logits``), processed like the target's.
    draft_probs : same dtype [T, V] or None
        The distributions the drafts were drawn from; None for point-mass drafts.
    method : str
        The verifier of the requests with ``temperature != 0``:
        [[verifier names]]
        Or a relaxed (lossy) method, which raises acceptance and measures its own bias
        (``report_bias``), each with its keyword parameters:

        [[relaxed methods]]
    temperature : scalar or array [B], optional
        ``0`` makes a request greedy: verified on its raw rows (accept while the draft is
        the argmax), the others by ``method``.  With logits it also scales them; with
        probabilities it only says which requests are greedy.  None: 1, every request
        uses ``method``.
    top_k, top_p, min_p : scalar or array [B], optional
        Sampling filters of logits rows (``top_k`` 0 or >= V, ``top_p`` 1 and ``min_p``
        0 are off); a ValueError with probabilities, which are taken as processed.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters: ``"vllm"`` filters ``logits / temperature``;
        ``"llama.cpp"`` runs top-k, top-p and min-p on the logits at temperature 1 (as
        llama.cpp's sampler chain does) and applies the temperature to what they keep
        (``docs/semantics.md`` §12).
    bonus_token_ids : int [B], optional
        None: a request whose drafts are all accepted draws its bonus token from its
        processed bonus row (the argmax for a greedy request), reading that row only then.
    uniforms : float64 or float32 [B, max_k + 2], optional
        Explicit uniforms in ``[0, 1)`` (float32, JAX's default, is widened exactly):
        request ``b`` uses columns ``0 .. k_b - 1`` (acceptance), ``k_b`` (residual) and
        ``k_b + 1`` (bonus).  Every entry is checked.
    generator : numpy.random.Generator, optional
        Source of the uniforms of requests without a seed of their own; a fresh unseeded
        generator if None.
    seeded_seqs : dict[int, numpy.random.Generator], optional
        Request index -> that request's generator.
    counter_seeds : dict[int, tuple[int, int]], optional
        Request index -> ``(seed, position)``: counter-based Philox uniforms (see
        :func:`specdec_np.counter_uniforms`).  A sampled request consumes exactly
        ``k_b + 2`` draws from its source whatever the outcome, a greedy one none.
    stream : {"verify", "draft"}
        The counter domain of the ``counter_seeds`` requests (the fourth Philox counter
        word; :func:`specdec_np.counter_uniforms`): ``"verify"``, the default, for the
        acceptance tests and the tokens drawn here; ``"draft"`` only where the call draws
        a drafter's tokens.  The two domains never share a Philox block, so a drafter
        that draws from ``"draft"`` never shares noise with the verification of its
        drafts under the same ``(seed, position)``.  Rows of the other sources ignore it.
    strict_mode : bool
        Also check exact dtypes and finite, non-negative probabilities.
    out : OutputBlock, optional
        Buffers from :func:`output_buffers` to write into.
    prompt_token_ids, output_token_ids : sequence of B token sequences, optional
        What each request had before this step (None, or None for a request: empty).  The
        context of a row is the output plus the drafts before that row.
    repetition_penalty : scalar or array [B], optional
        ``> 0``, 1 off: over prompt and context, a positive logit divided, a negative one
        multiplied.
    frequency_penalty, presence_penalty : scalar or array [B], optional
        In ``[-2, 2]``, 0 off: ``logit -= frequency * count + presence * (count > 0)``
        over the context.
    logit_bias : sequence of B mappings (token -> finite bias), optional
        Added to the request's logits at every row, before the penalties.
    allowed_token_ids : sequence of B token sequences, optional
        Every other token masked.
    bad_words_token_ids : sequence of B lists of token sequences, optional
        A word's last token masked where the context (not the prompt) ends with the rest.
    min_tokens : int or int array [B], optional
        ``stop_token_ids`` masked while the context holds fewer tokens, unless nothing
        else is possible.
    stop_token_ids : sequence of B token sequences, optional
        The emitted run ends at its first stop token (kept).
    max_tokens : int or int array [B], optional
        The remaining budget (``>= 1``): the emitted run ends when it is spent.
    token_bitmask : int32 [T + B, ceil(V / 32)], optional
        One packed mask per target row (xgrammar's layout: bit ``j`` of word ``i`` allows
        token ``32 i + j``); a draft logits row takes its position's mask.
    logprobs : int, optional
        ``N >= 0``: the result gains ``logprobs``, ``raw_logprobs`` (float32 ``[B,
        max_k + 1]``, NaN padded), ``top_token_ids`` and ``top_logprobs`` (``[B, max_k +
        1, N]``).  ``docs/semantics.md`` ("The whole sampling surface") has the order:
        masks and bias, penalties, then temperature and filters.  Penalties, bias and
        masks need logits.
    report_bias : bool
        Also measure how far each emitted token's law is from the target's: the result's
        ``total_variation`` (float64 ``[B, max_k + 1]``, NaN after the emitted run), 0 for
        a lossless method and at the bonus position (``docs/semantics.md``, "Relaxed
        methods").  It reads every row of the emitted positions once more.
    **method_parameters : float or sequence
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``; a relaxed method's, listed with it above).

    Returns
    -------
    VerificationResult
        ``output_token_ids`` int64 ``[B, max_k + 1]`` (-1 padded), ``accepted_lengths``
        int64 ``[B]`` (causal), ``num_accepted`` (equal to ``accepted_lengths``: every
        request stops at its first rejection and the rows after it are never read), and
        ``num_draft_tokens`` ``T``; with a stop or budget also ``finished`` (bool
        ``[B]``), with ``logprobs`` the four logprob arrays.

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument and the request, before any uniform is drawn.

    Examples
    --------
    Request 0 has one draft (token 0), so it owns two rows (its draft position, then its
    bonus position); request 1 has none and owns one row.  Both greedy (temperature 0): the
    tokens are the rows' argmaxes.

    >>> import numpy as np
    >>> from specdec_np import verify_ragged
    >>> logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]))
    >>> result = verify_ragged(num_draft_tokens=np.array([1, 0]), draft_token_ids=np.array([0]),
    ...                        target_logits=logits, temperature=0.0)
    >>> result.output_token_ids, result.accepted_lengths
    (array([[ 0,  2],
           [ 2, -1]]), array([1, 0]))

    Sampled, with counter-based uniforms: the same seeds and positions give the same tokens.

    >>> def sampled():
    ...     return verify_ragged(num_draft_tokens=np.array([1, 0]), draft_token_ids=np.array([0]),
    ...                          target_logits=logits, counter_seeds={0: (7, 0), 1: (8, 0)})
    >>> np.array_equal(sampled().output_token_ids, sampled().output_token_ids)
    True
    """
    # The records made with every field in their order (``new_record``: a named tuple's
    # own constructor binds its arguments in Python, a cost every call pays).
    return engine_call(
        RaggedCall(method, method_parameters, num_draft_tokens, draft_token_ids, bonus_token_ids),
        new_record(RowSources, (target_logits, target_probs, draft_logits, draft_probs)),
        new_record(SamplingParameters, (
            temperature, top_k, top_p, min_p, filter_order, prompt_token_ids,
            output_token_ids, repetition_penalty, frequency_penalty, presence_penalty,
            logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids,
            max_tokens, token_bitmask, logprobs,
        )),
        new_record(
            UniformSource, (uniforms, generator, seeded_seqs, counter_seeds, None, None, stream)
        ),
        strict_mode=strict_mode,
        out=out,
        report_bias=report_bias,
    )  # fmt: skip


#: A registry verifier's entry, its default parameters and whether it is greedy, by the
#: name a call gave without parameters (the registry does not change while running).
_PLAIN_METHODS: dict[str, tuple[registry.Verifier, tuple[float, ...], bool]] = {}


class RaggedCall:
    """The ragged chain as :func:`~specdec_np._layouts.engine_call.engine_call` sees it.

    Parameters
    ----------
    method : str
        The registry name of the sampled requests' verifier.
    method_parameters : mapping of str to float
        Its parameters (checked here).
    num_draft_tokens, draft_token_ids, bonus_token_ids
        As :func:`verify_ragged` takes them.
    on_success : callable, optional
        ``on_success(num_draft_tokens, accepted_lengths, commit[, emitted])``: a sampler's
        record of a successful call (all or nothing, setting ``commit.done`` last);
        ``emitted`` (tokens per request) is passed where the sampling surface cut a run.
    """

    greedy_entry = _GREEDY
    #: A sampling step's key (:func:`specdec_np._layouts.fast_path.lane_key`), set by
    #: :func:`specdec_np.sample_tokens`: the fast path then keeps what its launch needs.
    lane_key: tuple[Any, ...] | None = None

    def __init__(
        self,
        method: str,
        method_parameters: Mapping[str, Any],
        num_draft_tokens: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        on_success: Callable[..., None] | None = None,
    ) -> None:
        #: The relaxed (lossy) method of the call, or None for a registry verifier: a
        #: relaxed call builds and checks its batch as a token-wise rejection call does
        #: and runs :func:`specdec_np._relaxed.runner.run` instead of a kernel.
        self.relaxed: registry.RelaxedMethod | None = None
        self.relaxed_parameters: dict[str, Any] = {}
        self._parameters: tuple[float, ...]
        self._num_draft_tokens = num_draft_tokens
        self._draft_token_ids = draft_token_ids
        self._bonus_token_ids = bonus_token_ids
        self._on_success = on_success
        plain = None
        if type(method) is str and not method_parameters:
            plain = _PLAIN_METHODS.get(method)
        if plain is not None:
            # A registry verifier named without parameters: what the lines below found
            # for it the first time.
            self._given = {}
            self.entry, self._parameters, self.every_request_greedy = plain
            return
        found = registry.chain_method(method)
        self._given = dict(method_parameters)
        if isinstance(found, registry.RelaxedMethod):
            self.relaxed = found
            self.entry = _REJECTION
            unknown = set(method_parameters).difference(found.parameter_names)
            if unknown:
                _validate.check_relaxed_parameters(found, method_parameters, 0, 0, 1)
            self._parameters = ()
        else:
            self.entry = found
            self._parameters = _validate.check_method_parameters(found, method_parameters)
        self.every_request_greedy = self.entry.greedy
        if self.relaxed is None and not method_parameters and type(method) is str:
            _PLAIN_METHODS[method] = (self.entry, self._parameters, self.every_request_greedy)

    def build(self, form: _sampling.RowForm, strict: bool) -> _chains.ChainBatch:
        """The checked batch (:func:`ragged_chain`), and a relaxed method's parameters
        checked against it."""
        batch = ragged_chain(
            self._num_draft_tokens,
            self._draft_token_ids,
            form.target,
            form.draft,
            self._bonus_token_ids,
            strict=strict,
            # A relaxed call keeps the draft rows its rule ignores: its bias reads them.
            reads_draft_probs=self.relaxed is not None or self.entry.reads_draft_probs,
            target_name=form.target_name,
            draft_name=form.draft_name,
        )
        if self.relaxed is not None:
            self.relaxed_parameters = _validate.check_relaxed_parameters(
                self.relaxed, self._given, batch.batch_size, batch.max_k, batch.vocab_size
            )
        return batch

    def fast_call(
        self, rows: RowSources, sampling: SamplingParameters, uniform_source: UniformSource
    ) -> _results.VerificationResult | None:
        """The common call without the generic steps
        (:func:`specdec_np._layouts.fast_path.ragged_call`), or None (a relaxed method
        always takes the general steps)."""
        if self.relaxed is not None:
            return None
        return _fast.ragged_call(
            self, self._parameters, self._num_draft_tokens, self._draft_token_ids,
            self._bonus_token_ids, self._on_success, rows, sampling, uniform_source,
            self.lane_key,
        )  # fmt: skip

    def check_rows(
        self, batch: _chains.ChainBatch, form: _sampling.RowForm, greedy: Any, strict: bool
    ) -> None:
        """In strict mode, the greedy requests' probability rows must be distributions."""
        if not strict or form.from_logits or not greedy.any():
            return
        # Greedy verification of probabilities accepts p(x) > 1/2 unread: its rows must
        # be distributions, as for the padded greedy verifier.
        counts = batch.draft_counts
        if batch.bonus_rows:
            rows = np.repeat(greedy, counts + 1)
            rows[np.cumsum(counts + 1) - 1] = False  # bonus rows are not tested
        else:
            rows = np.repeat(greedy, counts)  # [T, V]: the draft positions only
        _validate.check_row_sums(
            form.target_name, batch.target_rows[batch.xp.asarray(rows)], batch.xp
        )

    @property
    def draws_bonus(self) -> bool:
        """Whether a request that accepts every draft draws its bonus token (no
        ``bonus_token_ids`` given)."""
        return self._bonus_token_ids is None

    @property
    def method_parameters(self) -> tuple[float, ...]:
        """The registry verifier's checked parameters, in registry order."""
        return self._parameters

    def rows_per_request(self, batch: _chains.ChainBatch) -> tuple[np.ndarray, np.ndarray]:
        """A request's ``k_b + 1`` target rows (``k_b`` without bonus rows) and ``k_b``
        draft rows."""
        return batch.draft_counts + batch.bonus_rows, batch.draft_counts

    def uniform_rows(self, batch: _chains.ChainBatch, greedy: Any) -> dict[str, Any]:
        """A sampled request's ``k_b + 2`` draws, a greedy one's none (``k_b + 2`` too
        under a relaxed method whose greedy requests draw)."""
        none = greedy & (self.relaxed is None or not self.relaxed.greedy_draws)
        return {"k": batch.max_k + 1, "row_widths": np.where(none, 0, batch.draft_counts + 2)}

    def output_block(
        self, batch: _chains.ChainBatch, out: Any, inputs: dict[str, Any]
    ) -> _contract.OutputBlock:
        """``out`` checked (:func:`output_buffers`), or a new block."""
        if out is None:
            return _contract.allocate_output_block(batch.xp, batch.batch_size, batch.max_k + 1)
        return _check_out(out, batch, inputs)

    def threads(self, batch: _chains.ChainBatch, chosen: Any) -> int:
        """The batch's thread count for the chosen verifier."""
        return batch.threads(chosen)

    def layout_options(
        self,
        batch: _chains.ChainBatch,
        block: Any,
        threads: int,
        chosen: Any,
        options: dict[str, Any],
    ) -> None:
        """Causal counting, the lazy bonus draw, and target rows without bonus rows."""
        options["causal"] = True
        if self._bonus_token_ids is None:
            options["draw_bonus"] = True
        if not batch.bonus_rows:
            options["bonus_rows"] = False

    def after_uniforms(self, batch: _chains.ChainBatch, chosen: Any) -> tuple[Any, ...]:
        """The method's parameters (none when every request is greedy)."""
        return (batch.parameters(self._parameters if chosen is self.entry else ()),)

    def recorder(self, batch: _chains.ChainBatch) -> Callable[[Any, Any], None] | None:
        """``on_success`` as :func:`specdec_np._kernels.dispatch.run` calls it."""
        record = self._on_success
        if record is None:
            return None
        counts = batch.draft_counts

        def record_result(result: Any, commit: Any) -> None:
            # A run the sampling surface cut: count what it emitted.
            emitted = None if result.finished is None else (
                (result.output_token_ids >= 0).sum(axis=1)
            )
            variation = getattr(result, "total_variation", None)
            if variation is None:
                record(counts, result.accepted_lengths, commit, emitted)
            else:
                record(counts, result.accepted_lengths, commit, emitted, variation)

        return record_result

    def finish(self, batch: _chains.ChainBatch, result: Any) -> Any:
        """The kernel's result as it is."""
        return result

    def surface_contexts(self, batch: _chains.ChainBatch) -> _surface.RowContexts:
        """Chain position ``i`` follows drafts ``0 .. i - 1`` of its request (the bonus row
        all of them); draft row ``i`` shares target row ``i``'s context."""
        return chain_contexts(batch)

    def emitted_rows(self, batch: _chains.ChainBatch, result: Any) -> np.ndarray:
        """Position ``i`` of request ``b`` was drawn from its target row ``i``."""
        counts = batch.draft_counts
        starts = np.cumsum(counts) - counts + (np.arange(counts.size) if batch.bonus_rows else 0)
        positions = np.arange(batch.max_k + 1)
        rows = starts[:, None] + positions[None, :]
        width = counts + 1 if batch.bonus_rows else counts
        return np.where(positions[None, :] < width[:, None], rows, -1)


def chain_contexts(batch: _chains.ChainBatch) -> _surface.RowContexts:
    """The :class:`~specdec_np._layouts.surface.RowContexts` of a ragged chain batch."""
    ids = batch.draft_token_ids
    ids = np.asarray(ids.get() if hasattr(ids, "get") else ids, dtype=np.int64)
    requests: list[int] = []
    prefixes: list[np.ndarray] = []
    draft_targets: list[int] = []
    offset = 0
    for b, count in enumerate(batch.draft_counts.tolist()):
        for position in range(count + (1 if batch.bonus_rows else 0)):
            if position < count:
                draft_targets.append(len(requests))
            requests.append(b)
            prefixes.append(ids[offset : offset + position])
        offset += count
    return _surface.RowContexts(
        np.asarray(requests, dtype=np.int64), prefixes, np.asarray(draft_targets, np.int64)
    )


def _draft_counts(num_draft_tokens: Any, xp: Any) -> tuple[np.ndarray, Any, int, int]:
    """``num_draft_tokens`` checked: host int64 counts, the offsets on the device, the
    largest count and ``T``."""
    counts = _backend.intake(
        _validate.empty_sequence_as_integers(num_draft_tokens), "num_draft_tokens"
    )
    if counts.ndim != 1:
        raise ValueError(
            "num_draft_tokens must have shape [B] (1 dimension); found shape "
            f"{_validate.shape_text(counts.shape)}"
        )
    if type(counts) is not np.ndarray:
        counts = np.asarray(counts.get() if hasattr(counts, "get") else counts)
    host = _validate.int64_values(counts, "num_draft_tokens")
    offsets = np.empty(host.shape[0] + 1, dtype=np.int64)
    max_k, negative = _core.ragged_offsets(host, offsets)
    if negative >= 0:
        raise ValueError(
            f"num_draft_tokens must be >= 0 for every request; found {int(host[negative])} "
            f"for request {negative}"
        )
    if max_k > _INT64_MAX // max(host.shape[0], 1):
        # The offsets may have wrapped around int64: no array is that long anyway.
        raise ValueError(
            "num_draft_tokens must sum to T, the length of draft_token_ids; found sum "
            f"{sum(int(count) for count in host)}"
        )
    return host, offsets if xp is np else xp.asarray(offsets), max_k, int(offsets[-1])


def ragged_chain(
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_rows: Any,
    draft_rows: Any,
    bonus_token_ids: Any,
    *,
    strict: bool,
    reads_draft_probs: bool,
    target_name: str = "target_probs",
    draft_name: str = "draft_probs",
) -> _chains.ChainBatch:
    """Take a flat engine batch in, check it and make it kernel-ready.

    Parameters
    ----------
    num_draft_tokens : int array [B]
        ``k_b >= 0`` drafts per request.
    draft_token_ids : int64 or int32 [T], ``T = sum k_b``
        Request by request.
    target_rows : float32 or float64 [T + B, V]
        Request ``b`` owns ``k_b + 1`` consecutive rows: its draft positions, then its
        bonus position.
    draft_rows : same dtype [T, V] or None
        None for point-mass drafts.
    bonus_token_ids : int [B] or None
        None: each fully accepted request draws its bonus from its bonus row.
    strict : bool
        Also exact dtypes (float32 rows, int64 ids) and finite, non-negative values.
    reads_draft_probs : bool
    target_name, draft_name : str
        The arguments' names in messages (``target_probs`` or ``target_logits``).

    Returns
    -------
    ChainBatch
        With ``padded_k`` None and, when ``bonus_token_ids`` is None, zeros as bonus ids.
    """
    target = _backend.intake(target_rows, target_name)
    draft_ids = _backend.intake(draft_token_ids, "draft_token_ids", like=target)
    drafts = _backend.intake_if_read(draft_rows, draft_name, reads_draft_probs, like=target)
    bonus = None
    if bonus_token_ids is not None:
        bonus = _backend.intake(bonus_token_ids, "bonus_token_ids", like=target)
    device = _backend.check_one_device(
        {target_name: target, "draft_token_ids": draft_ids, draft_name: drafts,
         "bonus_token_ids": bonus}
    )
    xp = _backend.array_namespace(target)
    counts, offsets, max_k, total = _draft_counts(num_draft_tokens, xp)
    batch_size = int(counts.shape[0])
    if tuple(draft_ids.shape) != (total,):
        raise ValueError(
            f"draft_token_ids must have shape [T] = [{total}] (T = sum of num_draft_tokens); "
            f"found shape {_validate.shape_text(draft_ids.shape)}"
        )
    # With the bonus ids given, the bonus rows are never read: the target may leave them
    # out ([T, V], as vLLM v1 holds its target logits).
    bonus_rows = not (bonus is not None and target.ndim == 2 and target.shape[0] == total)
    if target.ndim != 2 or target.shape[1] < 1 or (
        bonus_rows and target.shape[0] != total + batch_size
    ):
        also = f" (or [T, V] = [{total}, V] with bonus_token_ids)" if bonus is not None else ""
        raise ValueError(
            f"{target_name} must have shape [T + B, V] = [{total + batch_size}, V] with "
            f"V >= 1{also}; found shape {_validate.shape_text(target.shape)}"
        )
    vocab_size = int(target.shape[1])
    if drafts is not None and tuple(drafts.shape) != (total, vocab_size):
        raise ValueError(
            f"{draft_name} must have shape [T, V] = [{total}, {vocab_size}]; found shape "
            f"{_validate.shape_text(drafts.shape)}"
        )
    if bonus is not None and tuple(bonus.shape) not in ((batch_size,), (batch_size, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape [B] = [{batch_size}]; found shape "
            f"{_validate.shape_text(bonus.shape)}"
        )
    named = {"draft_token_ids": draft_ids}
    if bonus is not None:
        named["bonus_token_ids"] = bonus
    ids = _backend.token_ids(named, xp, strict)
    draft_ids = ids[0]
    if bonus is not None:
        bonus = ids[1].reshape(batch_size)
    elif xp is np:
        bonus = _chains.zero_ids(batch_size, draft_ids.dtype)
    else:
        bonus = xp.zeros(batch_size, dtype=draft_ids.dtype)
    target, drafts = _backend.kernel_rows(target, drafts, target_name, draft_name, xp, strict)
    return _chains.ChainBatch(
        xp=xp,
        device=device,
        target_rows=target,
        draft_rows=drafts,
        draft_token_ids=draft_ids,
        bonus_token_ids=bonus,
        draft_offsets=offsets,
        batch_size=batch_size,
        max_k=max_k,
        vocab_size=vocab_size,
        num_draft_tokens=total,
        padded_k=None,
        target_name=target_name,
        index_label="(request, position)",
        draft_counts=counts,
        bonus_rows=bonus_rows,
    )
