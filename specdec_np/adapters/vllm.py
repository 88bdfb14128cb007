"""vLLM v1's ``rejection_sample``, on :func:`specdec_np.verify_ragged`.

vLLM v1 hands its rejection sampler the target's logits at the draft positions
(``[num_tokens, V]``), the drafter's probabilities as they are (or None for n-gram
drafts), the bonus tokens its own sampler drew, and a ``SamplingMetadata``.  This module
takes exactly that and returns what vLLM returns: int32 ``[B, max_spec_len + 1]``, with
``PLACEHOLDER_TOKEN_ID`` (-1) after each request's tokens.  ``sampling_metadata`` is read by
vLLM's attribute names only, and must have all of them:

* ``all_greedy``, ``all_random`` (bools);
* ``temperature`` (``[B]``, None exactly when ``all_greedy`` is set; a request whose
  temperature is at most ``GREEDY_EPSILON`` (vLLM's greedy marker, 0 or -1) is greedy);
* ``top_k``, ``top_p`` (``[B]`` or None; top-k 0 or ``>= V`` and top-p 1 are off);
* ``generators``: request index in ``0 .. B-1`` -> generator of a seeded request
  (``torch.Generator`` for torch inputs, ``numpy.random.Generator`` for NumPy ones).

Randomness follows vLLM's contract: a seeded request draws its uniforms from its own
generator, ``k_b + 2`` of them when it is sampled and none when it is greedy, so that its
generator moves by an amount that depends on that request alone, never on the rest of the
batch.  The other sampled requests draw from torch's default generator of the inputs'
device (torch inputs) or from a fresh NumPy generator (NumPy inputs).  Nothing is drawn
before every argument is checked, so a refused call moves no generator; a call that fails
later (a row the kernel refuses) puts each generator back where nothing else drew from it
in between.  vLLM's own streams (``k_b`` acceptance uniforms, then ``V`` exponentials for
the recovered token) are not reproduced bit for bit: the tokens have vLLM's law, not its
exact draws.

The sampling surface (docs/semantics.md, "The whole sampling surface") is read from the
optional attributes of ``SamplingMetadata``, each where present (:data:`SURFACE_ATTRIBUTES`),
and applied at every draft position with the drafts before it in the context:

* ``frequency_penalties``, ``presence_penalties``, ``repetition_penalties`` (``[B]``) and
  ``prompt_token_ids`` (``[B, max prompt length]``, padded with ids ``>= V``, which are
  dropped), unless ``no_penalties`` is set;
* ``output_token_ids`` (a list of B lists): the output before this step;
* ``allowed_token_ids_mask`` (bool ``[B, V]``, True where a token is *not* allowed, as vLLM
  fills it): a request with a True entry gets ``allowed_token_ids`` = its False entries;
* ``bad_words_token_ids`` (request index -> list of token sequences);
* ``logitsprocs``: the processors in its ``all`` (or ``non_argmax_invariant``) collection,
  by attribute: ``min_toks`` (request index -> ``(min_tokens, output ids, stop ids)``, vLLM's
  min-tokens processor) gives ``min_tokens`` and ``stop_token_ids`` (and the output ids
  where ``output_token_ids`` is absent), ``biases`` (request index -> token -> bias, vLLM's
  logit-bias processor) gives ``logit_bias``.

Stops are not cut here (vLLM's engine does that), and the bonus token is vLLM's own.

torch is imported only when the inputs are torch tensors; NumPy inputs give NumPy outputs.
bfloat16 and float16 logits and probabilities are read as float32.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._layouts import ragged as _ragged
from .._layouts.engine_call import RowSources, UniformSource, engine_call
from .._layouts.sampling import SamplingParameters
from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import uniforms as _random

__all__ = ["GREEDY_EPSILON", "PLACEHOLDER_TOKEN_ID", "rejection_sample"]

#: vLLM's placeholder after a request's tokens.
PLACEHOLDER_TOKEN_ID = -1
#: Temperatures at or below this are greedy (vLLM marks greedy requests with 0 or -1).
GREEDY_EPSILON = 1e-5
#: The attributes of vLLM's ``SamplingMetadata`` that the adapter reads.
METADATA_ATTRIBUTES = ("all_greedy", "all_random", "temperature", "top_k", "top_p", "generators")
#: The optional attributes read where present: the sampling surface.
SURFACE_ATTRIBUTES = (
    "no_penalties",
    "prompt_token_ids",
    "output_token_ids",
    "frequency_penalties",
    "presence_penalties",
    "repetition_penalties",
    "allowed_token_ids_mask",
    "bad_words_token_ids",
    "logitsprocs",
)


def rejection_sample(
    draft_token_ids: Any,
    num_draft_tokens: Sequence[int],
    max_spec_len: int,
    cu_num_draft_tokens: Any,
    draft_probs: Any,
    target_logits: Any,
    bonus_token_ids: Any,
    sampling_metadata: Any,
) -> Any:
    """Rejection-sample a vLLM v1 batch (vLLM v1's signature and output) on specdec_np.

    Parameters
    ----------
    draft_token_ids : int [num_tokens]
        The drafts, request by request (``num_tokens = sum(num_draft_tokens)``).
    num_draft_tokens : list of int [B]
        Drafts per request (0 for a request that only gets its bonus token); ``[]`` is an
        empty batch.
    max_spec_len : int
        The output's width is ``max_spec_len + 1``.
    cu_num_draft_tokens : int [B]
        Running sums of ``num_draft_tokens`` (checked against them).
    draft_probs : float [num_tokens, V] or None
        The drafter's probabilities, used as given; None for n-gram (point-mass) drafts.
    target_logits : float [num_tokens, V]
        The target's logits at the draft positions, processed with each request's
        temperature, top-k and top-p.
    bonus_token_ids : int [B, 1]
        The token each request emits after all its drafts are accepted (vLLM samples it
        beforehand from the bonus position).
    sampling_metadata : object
        vLLM's ``SamplingMetadata`` (the attributes the module docstring lists).

    Returns
    -------
    int32 [B, max_spec_len + 1]
        In the inputs' library and on their device (``[0, max_spec_len + 1]`` for an
        empty batch).

    Raises
    ------
    TypeError
        For counts that are not integers (``2.0`` included), a ``sampling_metadata`` that
        is None or lacks one of vLLM's attributes, and generators of the wrong kind,
        naming the argument.
    ValueError
        On inputs vLLM's own sampler would refuse (inconsistent counts, generator keys
        outside ``0 .. B-1``, temperatures that contradict ``all_greedy`` or
        ``all_random``, ids outside ``[0, V)``, shapes), naming the argument.  No
        generator has moved when either is raised.

    Examples
    --------
    NumPy inputs, and a stand-in for vLLM's ``SamplingMetadata`` with every request greedy:
    request 0's second draft (3) is not its row's argmax (2), request 1's draft is accepted
    and its bonus token follows:

    >>> from types import SimpleNamespace
    >>> import numpy as np
    >>> from specdec_np.adapters import vllm
    >>> metadata = SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
    ...                            top_k=None, top_p=None, generators={})
    >>> logits = np.log(np.array([[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.6, 0.1],
    ...                           [0.6, 0.2, 0.1, 0.1]]))
    >>> vllm.rejection_sample(np.array([1, 3, 0]), [2, 1], 2, np.array([2, 3]), None, logits,
    ...                       np.array([[3], [3]]), metadata)
    array([[ 1,  2, -1],
           [ 0,  3, -1]], dtype=int32)
    """
    counts = _counts(num_draft_tokens, "num_draft_tokens")
    batch_size = int(counts.shape[0])
    _check_max_spec_len(max_spec_len, counts)
    ends = _counts(cu_num_draft_tokens, "cu_num_draft_tokens")
    if ends.tolist() != np.cumsum(counts).tolist():
        raise ValueError(
            "cu_num_draft_tokens must be the running sums of num_draft_tokens; found "
            f"{ends.tolist()} for {counts.tolist()}"
        )
    inputs = (target_logits, draft_token_ids, bonus_token_ids, draft_probs)
    torch = _torch_of(*inputs)
    metadata = _read_metadata(sampling_metadata, batch_size, torch)
    sources_for = None
    if torch is not None:
        device = next(value.device for value in inputs if _is_torch(value))

        def sources_for(row_widths: np.ndarray, shape: tuple[int, int]) -> _TorchUniforms:
            return _TorchUniforms(torch, metadata.generators, device, row_widths, shape)

    result = _verify(
        num_draft_tokens=counts,
        draft_token_ids=draft_token_ids,
        target_logits=target_logits,
        draft_probs=draft_probs,
        bonus_token_ids=bonus_token_ids,
        sampling=SamplingParameters(
            metadata.temperature, metadata.top_k, metadata.top_p,
            **_surface_settings(sampling_metadata, batch_size, int(target_logits.shape[-1])),
        ),
        uniform_source=UniformSource(
            seeded_seqs=None if torch is not None else metadata.generators,
            sources_for=sources_for,
        ),
    )
    return _placeholder_padded(result.output_token_ids, batch_size, max_spec_len, torch)


@_backend.array_front(device_from=("target_logits",), library_from=_ragged.DATA_ARGUMENTS)
def _verify(
    *,
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_logits: Any,
    draft_probs: Any,
    bonus_token_ids: Any,
    sampling: SamplingParameters,
    uniform_source: UniformSource,
) -> Any:
    """The engine call of a rejection-sampled ragged batch, on the inputs' device and
    answering in their library (as :func:`specdec_np.verify_ragged` does)."""
    return engine_call(
        _ragged.RaggedCall("rejection", {}, num_draft_tokens, draft_token_ids, bonus_token_ids),
        RowSources(target_logits=target_logits, draft_probs=draft_probs),
        sampling,
        uniform_source,
        strict_mode=False,
        out=None,
    )


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "torch"


def _torch_of(*inputs: Any) -> Any:
    """The torch module when an input is a torch tensor (it is imported then), else None."""
    return sys.modules["torch"] if any(_is_torch(value) for value in inputs) else None


def _host(value: Any, name: str) -> np.ndarray:
    """A small tensor or array (the O(B) metadata) as a host NumPy array, taken in as the
    library takes any array (foreign arrays and bfloat16 included)."""
    if _is_torch(value):
        value = value.detach().cpu()
    array = _backend.intake(value, name)
    return np.asarray(array.get() if _backend.is_cupy_array(array) else array)


def _counts(value: Any, name: str) -> np.ndarray:
    """int64 ``[B]`` counts, refusing floats (``2.0`` included) rather than truncating."""
    array = _host(value, name)
    if array.ndim != 1:
        raise ValueError(
            f"{name} must have shape [B] (1 dimension); found shape "
            f"{_validate.shape_text(array.shape)}"
        )
    if not array.size:
        # NumPy makes [] float64: an empty batch has no count to misread.
        return np.zeros(0, dtype=np.int64)
    return _validate.int64_values(array, name)


def _check_max_spec_len(max_spec_len: Any, counts: np.ndarray) -> None:
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, (int, np.integer)):
        raise TypeError(f"max_spec_len must be an int; found {type(max_spec_len).__name__}")
    if max_spec_len < max(int(counts.max(initial=0)), 0):
        raise ValueError(
            "max_spec_len must be an int >= 0 and >= the largest of num_draft_tokens; "
            f"found {int(max_spec_len)} for {counts.tolist()}"
        )


class _Metadata(NamedTuple):
    """``sampling_metadata`` checked, in the library's terms."""

    temperature: np.ndarray  # float64 [B], 0 for a greedy request
    top_k: np.ndarray | None
    top_p: np.ndarray | None
    generators: dict[int, Any]


def _read_metadata(metadata: Any, batch_size: int, torch: Any) -> _Metadata:
    """Check every attribute the adapter reads, before anything is drawn."""
    if metadata is None:
        raise TypeError(
            "sampling_metadata must be vLLM's SamplingMetadata (an object with "
            f"{', '.join(METADATA_ATTRIBUTES)}); found None"
        )
    missing = [name for name in METADATA_ATTRIBUTES if not hasattr(metadata, name)]
    if missing:
        raise TypeError(
            f"sampling_metadata must have vLLM's attributes {', '.join(METADATA_ATTRIBUTES)}; "
            f"found a {type(metadata).__name__} without {', '.join(missing)}"
        )
    all_greedy = _flag(metadata.all_greedy, "all_greedy")
    all_random = _flag(metadata.all_random, "all_random")
    if all_greedy and all_random:
        raise ValueError("sampling_metadata.all_greedy and all_random are both set")
    if metadata.temperature is None:
        if not all_greedy:
            # vLLM leaves the temperatures out only for an all-greedy batch: reading None
            # as greedy would verify sampled requests as greedy ones.
            raise ValueError(
                "sampling_metadata.temperature is None, which vLLM sets only for an "
                f"all-greedy batch; found all_greedy={all_greedy}, all_random={all_random}"
            )
        temperature = np.zeros(batch_size)
    else:
        values = _host(metadata.temperature, "sampling_metadata.temperature")
        values = values.astype(np.float64).reshape(-1)
        if values.shape != (batch_size,):
            raise ValueError(
                f"sampling_metadata.temperature must have [B] = [{batch_size}] entries; "
                f"found {values.shape[0]}"
            )
        greedy = values <= GREEDY_EPSILON
        if all_random and greedy.any():
            raise ValueError(
                "sampling_metadata.all_random is set but the temperature of request "
                f"{int(np.argmax(greedy))} is greedy ({values[np.argmax(greedy)]})"
            )
        # vLLM's all_greedy short-cuts every request to greedy, whatever the temperatures.
        temperature = np.zeros(batch_size) if all_greedy else np.where(greedy, 0.0, values)
    return _Metadata(
        temperature=temperature,
        top_k=_parameter(metadata.top_k, "top_k"),
        top_p=_parameter(metadata.top_p, "top_p"),
        generators=_generators(metadata.generators, batch_size, torch),
    )


def _surface_settings(metadata: Any, batch_size: int, vocab_size: int) -> dict[str, Any]:
    """The sampling surface's settings from ``SamplingMetadata``'s optional attributes
    (the module docstring's mapping); checked by the verifier, which names them."""
    settings: dict[str, Any] = {}
    if not getattr(metadata, "no_penalties", True):
        for name, setting in (("frequency_penalties", "frequency_penalty"),
                              ("presence_penalties", "presence_penalty"),
                              ("repetition_penalties", "repetition_penalty")):
            value = getattr(metadata, name, None)
            if value is not None:
                settings[setting] = _host(value, f"sampling_metadata.{name}").reshape(-1)
        prompts = getattr(metadata, "prompt_token_ids", None)
        if prompts is not None:
            # vLLM pads the prompts with V (one past the vocabulary): the ids below it count.
            rows = _host(prompts, "sampling_metadata.prompt_token_ids").astype(np.int64)
            settings["prompt_token_ids"] = [
                row[(row >= 0) & (row < vocab_size)] for row in rows.reshape(batch_size, -1)
            ]
    outputs = getattr(metadata, "output_token_ids", None)
    if outputs is not None and len(outputs):
        settings["output_token_ids"] = [list(row) for row in outputs]
    mask = getattr(metadata, "allowed_token_ids_mask", None)
    if mask is not None:
        masked = _host(mask, "sampling_metadata.allowed_token_ids_mask").astype(bool)
        settings["allowed_token_ids"] = [
            np.flatnonzero(~row) if row.any() else None for row in masked
        ]
    bad_words = getattr(metadata, "bad_words_token_ids", None)
    if bad_words:
        settings["bad_words_token_ids"] = [bad_words.get(b) for b in range(batch_size)]
    for processor in _processors(getattr(metadata, "logitsprocs", None)):
        min_tokens = getattr(processor, "min_toks", None)
        if min_tokens:
            settings["min_tokens"] = [
                int(min_tokens[b][0]) if b in min_tokens else 0 for b in range(batch_size)
            ]
            settings["stop_token_ids"] = [
                sorted(min_tokens[b][2]) if b in min_tokens else None for b in range(batch_size)
            ]
            if "output_token_ids" not in settings:
                settings["output_token_ids"] = [
                    list(min_tokens[b][1]) if b in min_tokens else None
                    for b in range(batch_size)
                ]
        biases = getattr(processor, "biases", None)
        if biases:
            settings["logit_bias"] = [biases.get(b) for b in range(batch_size)]
    if set(settings) <= {"output_token_ids", "prompt_token_ids"}:
        # vLLM always hands the outputs over; alone they change nothing, and a batch
        # without a setting must not pay for reading them.
        return {}
    return settings


def _processors(logitsprocs: Any) -> list[Any]:
    """The logits processors of ``SamplingMetadata.logitsprocs``, by vLLM's collections."""
    if logitsprocs is None:
        return []
    for name in ("all", "non_argmax_invariant"):
        found = getattr(logitsprocs, name, None)
        if found is not None:
            return list(found)
    return list(logitsprocs) if isinstance(logitsprocs, (list, tuple)) else []


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"sampling_metadata.{name} must be a bool; found {type(value).__name__}"
        )
    return bool(value)


def _parameter(value: Any, name: str) -> np.ndarray | None:
    """A per-request filter as host values (checked by the verifier, which names it)."""
    return None if value is None else _host(value, f"sampling_metadata.{name}").reshape(-1)


def _generators(generators: Any, batch_size: int, torch: Any) -> dict[int, Any]:
    """``sampling_metadata.generators`` checked: keys in ``0 .. B-1`` (a negative key
    would otherwise seed a request counted from the end), values of the inputs' library."""
    name = "sampling_metadata.generators"
    checked = _random._check_rows(name, {} if generators is None else generators, batch_size)
    for row, generator in checked.items():
        if torch is None:
            _random._check_generator(f"{name}[{row}]", generator)
        elif not isinstance(generator, torch.Generator):
            raise TypeError(
                f"{name}[{row}] must be a torch.Generator for torch inputs; found "
                f"{type(generator).__name__}"
            )
    return dict(checked)


class _Draw(NamedTuple):
    """One ``torch.rand(size)`` from ``generator``, and its state before."""

    generator: Any
    before: Any
    size: int


class _TorchUniforms:
    """The uniforms of a torch call, drawn once the call is checked (the sources hook of
    :class:`specdec_np._layouts.engine_call.UniformSource`'s ``sources_for``).

    A seeded request takes its ``row_widths[b]`` uniforms from its own generator; the other
    requests that draw take theirs from torch's default generator of ``device``, in one
    draw.  :meth:`undo` puts a generator back only when nothing drew from it since (its
    state is the one the logged draw leads to); torch offers no lock to make that check
    and the rewind one step, so a thread drawing from the same generator at that very
    moment may see its draws handed out again.
    """

    def __init__(
        self,
        torch: Any,
        generators: Mapping[int, Any],
        device: Any,
        row_widths: np.ndarray,
        shape: tuple[int, int],
    ) -> None:
        self._torch = torch
        self._generators = generators
        self._device = torch.device(device)
        self._row_widths = row_widths
        self._shape = shape
        self._draws: list[_Draw] = []

    def _default_generator(self) -> Any:
        torch, device = self._torch, self._device
        if device.type == "cpu":
            return torch.default_generator
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]

    def _random(self, generator: Any, count: int) -> Any:
        # Logged before the draw: an interrupt right after it still finds it to undo.
        self._draws.append(_Draw(generator, generator.get_state(), count))
        values = self._torch.rand(
            count, dtype=self._torch.float64, generator=generator, device=generator.device
        )
        return values.to(self._device)

    def draw(self) -> Any:
        """float64 ``[B, max_k + 2]`` uniforms as a NumPy or CuPy array, each row's first
        ``row_widths[b]`` entries drawn (the rest are zeros)."""
        torch, widths = self._torch, self._row_widths
        uniforms = torch.zeros(self._shape, dtype=torch.float64, device=self._device)
        own = widths > 0
        own[list(self._generators)] = False
        if own.any():
            mask = own[:, None] & (np.arange(self._shape[1])[None, :] < widths[:, None])
            # A boolean mask assigns in row-major order: row by row, as the draw is laid out.
            values = self._random(self._default_generator(), int(mask.sum()))
            uniforms[torch.from_numpy(mask).to(self._device)] = values
        for row, generator in self._generators.items():
            width = int(widths[row])
            if width:
                uniforms[row, :width] = self._random(generator, width)
        return _backend.intake(uniforms, "uniforms")

    def undo(self) -> None:
        """Put back each logged draw whose generator nothing drew from since, newest
        first; the others keep their state (their next uniforms are fresh either way)."""
        torch = self._torch
        while self._draws:
            draw = self._draws.pop()
            replica = torch.Generator(device=draw.generator.device)
            replica.set_state(draw.before)
            torch.rand(
                draw.size, dtype=torch.float64, generator=replica, device=replica.device
            )
            if torch.equal(draw.generator.get_state(), replica.get_state()):
                draw.generator.set_state(draw.before)


def _placeholder_padded(output: Any, batch_size: int, max_spec_len: int, torch: Any) -> Any:
    """vLLM's int32 ``[B, max_spec_len + 1]`` output, -1 after each request's tokens."""
    width = output.shape[1]
    if torch is not None:
        padded = torch.full(
            (batch_size, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
            device=output.device,
        )
        padded[:, :width] = output.to(torch.int32)
        return padded
    xp = _backend.array_namespace(output)
    padded = xp.full((batch_size, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=xp.int32)
    padded[:, :width] = output
    return padded
