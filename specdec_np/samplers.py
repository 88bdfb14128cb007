"""The sampler classes: vLLM's names and semantics, counters and derived metrics.

One class per verifier of :mod:`specdec_np.registry` that has a padded front
(``RejectionSampler``, ``BlockVerificationSampler``, ``TypicalAcceptanceSampler``,
``GreedySampler``), each a ``class`` statement over one ``forward`` template of its kind
(stochastic or deterministic) that names its registry entry.  The work is done by the verifiers of
:mod:`specdec_np.verify`; a sampler adds
vLLM's counters (``num_accepted_tokens``, ``num_emitted_tokens`` as 0-d int64 arrays on the
sampler's device, ``num_draft_tokens`` as an int), its own random generator, and the
``_raise_if_*`` checks and ``_create_output`` that vLLM's tests call.

Thread safety: a sampler instance is not meant to be shared between threads that call it
at the same time (its counters and generator are plain state); give each thread its own.
Separate instances run concurrently and release the GIL inside the kernels.
"""

from __future__ import annotations

import abc
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import registry, verify
from ._layouts.padded import without_sampling_settings
from ._runtime import arrays as _backend
from ._runtime import checks as _validate
from ._runtime import uniforms as _random
from ._runtime.results import VerificationResult

__all__ = [
    "BlockVerificationSampler",
    "GreedySampler",
    "RejectionSampler",
    "SpecDecodeBaseSampler",
    "SpecDecodeDeterministicBaseSampler",
    "SpecDecodeStochasticBaseSampler",
    "TypicalAcceptanceSampler",
]


def _parse_device(device: Any, device_type: Any = "cuda") -> int | None:
    """``"cpu"`` → None (NumPy); an int or ``"cuda:N"`` → CUDA device N (CuPy)."""
    device_type = getattr(device_type, "type", device_type)
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise TypeError(f"device must be an int or a str; found {type(device).__name__}")
    if isinstance(device, int):
        if device_type == "cpu":
            return None
        if device_type != "cuda":
            raise ValueError(f"device_type must be 'cuda' or 'cpu'; found {device_type!r}")
        if device < 0:
            raise ValueError(f"device must be a non-negative CUDA device index; found {device}")
        return device
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    prefix, _, index = device.partition(":")
    if prefix == "cuda" and index.isdigit():
        return int(index)
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N'; found {device!r}")


class SpecDecodeBaseSampler:
    """Base class of the speculative-decoding verifiers (vLLM-compatible).

    Parameters
    ----------
    strict_mode : bool, default False
        Also run the full-array checks (exact dtypes, one device, finite and non-negative
        probabilities).  Shapes and token-id ranges are always checked.

    Attributes
    ----------
    num_accepted_tokens : 0-d int64 array or None
        Positions whose acceptance test passed, over all calls (after a first rejection
        too, as in vLLM).  None until ``init_tensors`` or the first call.
    num_emitted_tokens : 0-d int64 array or None
        Tokens emitted (non ``-1`` outputs).
    num_draft_tokens : int
        ``B * k`` summed over the calls.

    Examples
    --------
    >>> from specdec_np import GreedySampler, SpecDecodeBaseSampler
    >>> sampler = GreedySampler()
    >>> isinstance(sampler, SpecDecodeBaseSampler), sampler.num_draft_tokens
    (True, 0)
    >>> sampler.init_tensors(0, device_type="cpu")
    >>> int(sampler.num_accepted_tokens), int(sampler.num_emitted_tokens)
    (0, 0)
    """

    # Every concrete sampler defines it (vLLM's signature, and seeded_seqs when stochastic).
    forward: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call :meth:`forward`, as a torch module would.

        Parameters
        ----------
        *args, **kwargs
            The arguments of :meth:`forward`.

        Returns
        -------
        int64 [B, k+1]
            What :meth:`forward` returns.
        """
        return self.forward(*args, **kwargs)

    def __init__(self, strict_mode: bool = False) -> None:
        self._strict_mode = _validate.check_strict_mode(strict_mode)
        self._num_bonus_tokens = 1
        self.num_accepted_tokens: Any = None
        self.num_emitted_tokens: Any = None
        self.num_draft_tokens: int = 0
        self._num_verified_rows = 0
        self._num_possible_tokens = 0
        self._device: int | None = None

    # -- counters ------------------------------------------------------------------------

    def init_gpu_tensors(self, device: int | str) -> None:
        """Create the counters on CUDA device ``device`` (an int or ``"cuda:N"``).

        Parameters
        ----------
        device : int or str
            A CUDA device index, ``"cuda"`` (device 0) or ``"cuda:N"``.

        Raises
        ------
        RuntimeError
            If the counters already exist.
        """
        self.init_tensors(device, device_type="cuda")

    def init_tensors(self, device: int | str, device_type: Any = "cuda") -> None:
        """Create the counters: ``"cpu"`` (or ``device_type="cpu"``) selects NumPy; an int
        or ``"cuda:N"`` selects CuPy device N.

        Parameters
        ----------
        device : int or str
            ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a device index.
        device_type : str or object with a ``type`` attribute, default "cuda"
            ``"cuda"`` or ``"cpu"`` (a ``torch.device`` is read through its ``type``); it
            decides what an integer ``device`` means.

        Raises
        ------
        RuntimeError
            If the counters already exist (a second call is an error, as in vLLM).
        """
        if self.num_accepted_tokens is not None:
            raise RuntimeError("the counters already exist: init_tensors was called before")
        self._create_counters(_parse_device(device, device_type))

    def _create_counters(self, device: int | None) -> None:
        self.num_accepted_tokens, self.num_emitted_tokens = _zero_counters(device)
        self._device = device

    def _check_device(self, device: int | None) -> None:
        """``ValueError`` if the counters exist on another device than the inputs'."""
        if self.num_accepted_tokens is not None and device != self._device:
            raise ValueError(
                f"the inputs are on {_device_name(device)} but this sampler's counters are on "
                f"{_device_name(self._device)}"
            )

    def _record(self, result: VerificationResult, device: int | None, commit: Any = None) -> None:
        """Add one call's statistics to the counters (created on ``device`` if needed).

        All or nothing, a ``KeyboardInterrupt`` included: the new totals are computed
        first, then stored by a few assignments that are undone if anything interrupts
        them; ``commit.done`` (:class:`specdec_np._kernels.dispatch.Commit`) is set last.  An empty
        batch changes nothing and creates no counters (``init_tensors`` still works after
        it).
        """
        self._check_device(device)
        existing = self.num_accepted_tokens is not None
        batch_size = result.output_token_ids.shape[0]
        if batch_size == 0:
            if commit is not None:
                commit.done = True
            return
        if existing:
            accepted_counter, emitted_counter = self.num_accepted_tokens, self.num_emitted_tokens
        else:
            accepted_counter, emitted_counter = _zero_counters(device)
        if isinstance(result.num_accepted, np.ndarray):
            # Python ints and item updates: a tenth of the cost of 0-d array arithmetic,
            # which dominates this method at B = 1.  The counters stay the same arrays.
            old_accepted, old_emitted = int(accepted_counter), int(emitted_counter)
            new_accepted = old_accepted + sum(result.num_accepted.tolist())
            new_emitted = old_emitted + sum(result.accepted_lengths.tolist()) + batch_size
        else:
            # CuPy: sums and updates stay on the device (no synchronisation).
            old_accepted, old_emitted = accepted_counter.copy(), emitted_counter.copy()
            new_accepted = old_accepted + result.num_accepted.sum()
            new_emitted = old_emitted + result.accepted_lengths.sum() + batch_size
        old_totals = (self.num_draft_tokens, self._num_verified_rows, self._num_possible_tokens)
        old_device = self._device
        try:
            accepted_counter[...] = new_accepted
            emitted_counter[...] = new_emitted
            self.num_draft_tokens = old_totals[0] + result.num_draft_tokens
            self._num_verified_rows = old_totals[1] + batch_size
            self._num_possible_tokens = old_totals[2] + result.num_draft_tokens + batch_size
            if not existing:
                self.num_accepted_tokens = accepted_counter
                self.num_emitted_tokens = emitted_counter
                self._device = device
            if commit is not None:
                commit.done = True
        except BaseException:
            accepted_counter[...] = old_accepted
            emitted_counter[...] = old_emitted
            self.num_draft_tokens, self._num_verified_rows, self._num_possible_tokens = old_totals
            if not existing:
                self.num_accepted_tokens = self.num_emitted_tokens = None
                self._device = old_device
            raise

    @property
    def probs_dtype(self) -> np.dtype:
        """The probability dtype of strict mode: float32."""
        return np.dtype(np.float32)

    @property
    def token_id_dtype(self) -> np.dtype:
        """The token-id dtype of strict mode and of the output: int64."""
        return np.dtype(np.int64)

    # -- derived metrics ------------------------------------------------------------------

    @property
    def draft_acceptance_rate(self) -> float:
        """``num_accepted_tokens / num_draft_tokens``; NaN before any draft."""
        if not self.num_draft_tokens:
            return math.nan
        return int(self.num_accepted_tokens) / self.num_draft_tokens

    @property
    def system_efficiency(self) -> float:
        """Emitted tokens over the most that could have been emitted (``k + 1`` per row)."""
        if not self.num_draft_tokens:
            return math.nan
        return int(self.num_emitted_tokens) / self._num_possible_tokens

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens emitted per verified row (per target call of a sequence)."""
        if not self.num_draft_tokens:
            return math.nan
        return int(self.num_emitted_tokens) / self._num_verified_rows

    # -- vLLM's helpers --------------------------------------------------------------------

    @_backend.array_front(method=True)
    def _create_output(
        self,
        accepted: Any,
        substitute_token_ids: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        *,
        vocab_size: int | None = None,
    ) -> Any:
        """Format output rows and update the counters, exactly as vLLM's method.

        Parameters
        ----------
        accepted : bool [B, k]
            Acceptance test results (need not be causal).
        substitute_token_ids : int [B, k]
            Token emitted at the first rejected position.
        draft_token_ids : int [B, k]
        bonus_token_ids : int [B, 1] or [B]
        vocab_size : int, optional
            If given, ids must lie in ``[0, vocab_size)``; otherwise they must be >= 0.

        Returns
        -------
        int64 [B, k+1]
        """
        result = verify.format_output(
            accepted,
            substitute_token_ids,
            draft_token_ids,
            bonus_token_ids,
            vocab_size=vocab_size,
        )
        self._record(result, _backend.device_of(result.output_token_ids))
        return result.output_token_ids

    def _raise_if_incorrect_input(
        self,
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_probs: Any = None,
    ) -> None:
        """Run the four checks below (vLLM's order and arguments); raise on the first."""
        target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs = _taken_in(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        self._raise_if_incorrect_shape(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        self._raise_if_incorrect_dtype(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        self._raise_if_inconsistent_device(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        self._raise_if_out_of_bounds_vocab(
            target_with_bonus_probs.shape[-1], draft_token_ids, bonus_token_ids
        )

    def _raise_if_incorrect_shape(
        self,
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_probs: Any = None,
    ) -> None:
        """``ValueError`` unless the shapes are ``[B, k+1, V]``, ``[B, k]``, ``[B, 1]`` and
        ``[B, k, V]``."""
        target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs = _taken_in(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        _validate.check_shapes(
            target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids
        )

    def _raise_if_incorrect_dtype(
        self,
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_probs: Any = None,
    ) -> None:
        """``TypeError`` unless the dtypes are exactly ``probs_dtype`` and ``token_id_dtype``."""
        target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs = _taken_in(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        _validate.check_probability_dtype(
            "target_with_bonus_probs", target_with_bonus_probs.dtype, strict=True
        )
        _validate.check_token_id_dtype("draft_token_ids", draft_token_ids.dtype, strict=True)
        _validate.check_token_id_dtype("bonus_token_ids", bonus_token_ids.dtype, strict=True)
        if draft_probs is not None:
            _validate.check_probability_dtype("draft_probs", draft_probs.dtype, strict=True)

    def _raise_if_inconsistent_device(
        self,
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_probs: Any = None,
    ) -> None:
        """``ValueError`` unless every array lives on one device."""
        target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs = _taken_in(
            target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs
        )
        _backend.check_one_device(
            {
                "target_with_bonus_probs": target_with_bonus_probs,
                "bonus_token_ids": bonus_token_ids,
                "draft_probs": draft_probs,
                "draft_token_ids": draft_token_ids,
            }
        )

    def _raise_if_out_of_bounds_vocab(
        self, vocab_size: int, draft_token_ids: Any, bonus_token_ids: Any
    ) -> None:
        """``ValueError`` naming the first (row, position) whose id is outside ``[0, V)``."""
        draft_token_ids = _backend.intake(draft_token_ids, "draft_token_ids")
        bonus_token_ids = _backend.intake(bonus_token_ids, "bonus_token_ids")
        _validate.check_token_id_range(vocab_size, draft_token_ids, bonus_token_ids)


def _taken_in(
    target_with_bonus_probs: Any, draft_token_ids: Any, bonus_token_ids: Any, draft_probs: Any
) -> tuple[Any, Any, Any, Any]:
    """The check helpers' arguments as ``forward`` takes them in (NumPy, CuPy or DLPack;
    anything else is the TypeError ``forward`` raises)."""
    return (
        _backend.intake(target_with_bonus_probs, "target_with_bonus_probs"),
        _backend.intake(draft_token_ids, "draft_token_ids"),
        _backend.intake(bonus_token_ids, "bonus_token_ids"),
        None if draft_probs is None else _backend.intake(draft_probs, "draft_probs"),
    )


def _zero_counters(device: int | None) -> tuple[Any, Any]:
    """Fresh ``(num_accepted_tokens, num_emitted_tokens)``: 0-d int64 zeros on ``device``."""
    if device is None:
        return np.zeros((), dtype=np.int64), np.zeros((), dtype=np.int64)
    xp = _backend.cuda_module()
    if not _backend.cuda_available():
        raise ValueError(f"device cuda:{device} was requested but CuPy has no usable CUDA device")
    with xp.cuda.Device(device):
        return xp.zeros((), dtype=xp.int64), xp.zeros((), dtype=xp.int64)


def _device_name(device: int | None) -> str:
    return "cpu" if device is None else f"cuda:{device}"


class SpecDecodeDeterministicBaseSampler(SpecDecodeBaseSampler, abc.ABC):
    """Base class of the deterministic verifiers (no randomness).

    Parameters
    ----------
    strict_mode : bool, default False
        Also run the full-array checks (see :class:`SpecDecodeBaseSampler`).

    Examples
    --------
    >>> from specdec_np import GreedySampler, SpecDecodeDeterministicBaseSampler
    >>> isinstance(GreedySampler(), SpecDecodeDeterministicBaseSampler)
    True
    """

    @abc.abstractmethod
    def forward(
        self,
        target_with_bonus_probs: Any,
        bonus_token_ids: Any,
        draft_probs: Any,
        draft_token_ids: Any,
    ) -> Any:
        """Verify a batch (docs/semantics.md §1).

        Parameters
        ----------
        target_with_bonus_probs : float32 or float64 [B, k+1, V]
            Target probabilities; position ``k`` (the bonus position) is only shape-checked.
        bonus_token_ids : int64 or int32 [B, 1]
            The token emitted after ``k`` accepted drafts.
        draft_probs : same float dtype [B, k, V] or None
            The draft distributions; None means point-mass drafts.
        draft_token_ids : int64 or int32 [B, k]
            The draft tokens.

        Returns
        -------
        int64 [B, k+1]
            Accepted drafts, then one new token, then -1.
        """


class SpecDecodeStochasticBaseSampler(SpecDecodeBaseSampler, abc.ABC):
    """Base class of the stochastic verifiers (the uniform sources of docs/semantics.md §5).

    Parameters
    ----------
    strict_mode : bool, default False
        Also run the full-array checks (see :class:`SpecDecodeBaseSampler`).

    Examples
    --------
    >>> from specdec_np import RejectionSampler, SpecDecodeStochasticBaseSampler
    >>> isinstance(RejectionSampler(), SpecDecodeStochasticBaseSampler)
    True
    """

    @abc.abstractmethod
    def forward(
        self,
        target_with_bonus_probs: Any,
        bonus_token_ids: Any,
        draft_probs: Any,
        draft_token_ids: Any,
        seeded_seqs: Mapping[int, Any] | None = None,
    ) -> Any:
        """Verify a batch (docs/semantics.md §1).

        Parameters
        ----------
        target_with_bonus_probs : float32 or float64 [B, k+1, V]
            Target probabilities; position ``k`` (the bonus position) is only shape-checked.
        bonus_token_ids : int64 or int32 [B, 1]
            The token emitted after ``k`` accepted drafts.
        draft_probs : same float dtype [B, k, V] or None
            The draft distributions; None means point-mass drafts.
        draft_token_ids : int64 or int32 [B, k]
            The draft tokens.
        seeded_seqs : dict[int, numpy.random.Generator], optional
            Row index -> that row's generator.

        Returns
        -------
        int64 [B, k+1]
            Accepted drafts, then one new token, then -1.
        """


class _RegisteredSampler(SpecDecodeBaseSampler):
    """The ``forward`` template shared by every registered verifier's sampler class."""

    _verifier: registry.Verifier
    _parameters: dict[str, float]

    def _verify(self, *arrays: Any, **sources: Any) -> Any:
        result = verify.run_padded(
            self._verifier,
            *arrays,
            parameters=self._parameters,
            strict_mode=self._strict_mode,
            generator_for=self._generator_for,
            on_success=self._record_result,
            **sources,
        )
        return result.output_token_ids

    def _generator_for(self, device: int | None) -> Any:
        """Check the inputs' device against the counters' before anything is drawn."""
        self._check_device(device)
        return None

    def _record_result(self, result: VerificationResult, commit: Any) -> None:
        self._record(result, _backend.device_of(result.output_token_ids), commit)


class _StochasticSampler(_RegisteredSampler):
    """Constructor and ``forward`` of a stochastic verifier's sampler."""

    def __init__(self, strict_mode: bool = False, *, seed: int | None = None) -> None:
        super().__init__(strict_mode)
        self._parameters = {}
        self._own_generator = _random.OwnGenerator(_validate.check_seed(seed))
        self._generator = self._own_generator.numpy

    @without_sampling_settings
    @_backend.array_front(method=True)
    def forward(
        self,
        target_with_bonus_probs: Any,
        bonus_token_ids: Any,
        draft_probs: Any,
        draft_token_ids: Any,
        seeded_seqs: Mapping[int, Any] | None = None,
        *,
        counter_seeds: Mapping[int, tuple[int, int]] | None = None,
        uniforms: Any = None,
    ) -> Any:
        """Verify a batch of drafts.

        Parameters
        ----------
        target_with_bonus_probs : float32 or float64 [B, k+1, V]
            Target probabilities; position ``k`` (the bonus position) is only shape-checked.
        bonus_token_ids : int64 or int32 [B, 1]
            The token emitted after ``k`` accepted drafts.
        draft_probs : same float dtype [B, k, V] or None
            The draft distributions; None means point-mass drafts.
        draft_token_ids : int64 or int32 [B, k]
            The draft tokens.
        seeded_seqs : dict[int, numpy.random.Generator], optional
            Row index -> that row's generator (consumed by one ``random(k + 1)`` per call).
        counter_seeds : dict[int, tuple[int, int]], optional
            Row index -> ``(seed, position)`` for counter-based uniforms.
        uniforms : float64 or float32 [B, k+1], optional
            Explicit uniforms (acceptance columns, then the residual column; float32 is
            widened exactly).

        Returns
        -------
        int64 [B, k+1]
            Accepted drafts, then one new token, then -1.
        """
        return self._verify(
            target_with_bonus_probs,
            bonus_token_ids,
            draft_probs,
            draft_token_ids,
            uniforms=uniforms,
            seeded_seqs=seeded_seqs,
            counter_seeds=counter_seeds,
        )

    def _generator_for(self, device: int | None) -> Any:
        """The sampler's own source of uniforms for the inputs' device (see
        :class:`specdec_np._runtime.uniforms.OwnGenerator`), once the device matches the
        counters'."""
        self._check_device(device)
        return self._own_generator.for_device(device)


class _DeterministicSampler(_RegisteredSampler):
    """``forward`` of a deterministic verifier's sampler (``draft_probs`` is ignored)."""

    def __init__(self, strict_mode: bool = False, **parameters: float) -> None:
        super().__init__(strict_mode)
        values = _validate.check_method_parameters(self._verifier, parameters)
        self._parameters = dict(zip(self._verifier.parameter_names, values))

    @without_sampling_settings
    @_backend.array_front(method=True)
    def forward(
        self,
        target_with_bonus_probs: Any,
        bonus_token_ids: Any,
        draft_probs: Any,
        draft_token_ids: Any,
    ) -> Any:
        """Verify a batch; ``draft_probs`` is ignored (may be None).

        Parameters
        ----------
        target_with_bonus_probs : float32 or float64 [B, k+1, V]
            Target probabilities; position ``k`` (the bonus position) is only shape-checked.
        bonus_token_ids : int64 or int32 [B, 1]
            The token emitted after ``k`` accepted drafts.
        draft_probs : object
            Ignored (None is usual); kept for vLLM's argument order.
        draft_token_ids : int64 or int32 [B, k]
            The draft tokens.

        Returns
        -------
        int64 [B, k+1]
            Accepted drafts, then one new token, then -1.
        """
        return self._verify(target_with_bonus_probs, bonus_token_ids, None, draft_token_ids)


_SEED_DOC = """seed : int, optional
    Seed of the sampler's own ``numpy.random.Generator`` (PCG64), the source of the
    uniforms of unseeded rows (on a GPU: of the key of a counter-based Philox stream made
    on the device).  None seeds it from the OS.
"""


def _sampler_doc(cls: type) -> type:
    """Complete a sampler's docstring with its verifier's rule and parameters."""
    verifier = cls._verifier  # type: ignore[attr-defined]
    # The class's own docstring is its summary and its Examples; the rule and the
    # parameters go between them (numpydoc wants Examples last).
    summary, marker, examples = inspect.cleandoc(cls.__doc__ or "").partition("\nExamples\n")
    lines = [
        summary.strip(),
        "",
        verifier.summary,
        "",
        f"The sampler form of :func:`specdec_np.{verifier.function_name}`, with vLLM's "
        "counters.",
        "",
        "Parameters",
        "----------",
    ]
    for parameter in verifier.parameters:
        lines += [
            f"{parameter.name} : float, default {parameter.default}",
            f"    {parameter.description.capitalize()}; finite, non-negative.",
        ]
    lines += [
        "strict_mode : bool, default False",
        "    Also check exact dtypes, one device, and finite, non-negative probabilities.",
    ]
    cls.__doc__ = "\n".join(lines) + "\n" + (_SEED_DOC if verifier.stochastic else "") + (
        f"\nExamples\n{examples}" if marker else ""
    )
    return cls


@_sampler_doc
class RejectionSampler(_StochasticSampler, SpecDecodeStochasticBaseSampler):
    """Token-wise rejection sampling (lossless), vLLM's ``RejectionSampler``.

    Examples
    --------
    Drafts drawn from the target's own law are always accepted:

    >>> import numpy as np
    >>> from specdec_np import RejectionSampler
    >>> sampler = RejectionSampler(seed=0)
    >>> target = np.full((2, 3, 4), 0.25)  # B = 2 requests, k = 2 drafts, V = 4
    >>> sampler(target, np.array([[3], [3]]), target[:, :2], np.array([[0, 1], [2, 3]]))
    array([[0, 1, 3],
           [2, 3, 3]])
    >>> sampler.num_draft_tokens, int(sampler.num_accepted_tokens), sampler.draft_acceptance_rate
    (4, 4, 1.0)
    """

    _verifier = registry.get("rejection")


@_sampler_doc
class BlockVerificationSampler(_StochasticSampler, SpecDecodeStochasticBaseSampler):
    """Block verification (lossless, Sun et al., ICLR 2025).

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import BlockVerificationSampler
    >>> sampler = BlockVerificationSampler(seed=0)
    >>> target = np.full((2, 3, 4), 0.25)  # B = 2 requests, k = 2 drafts, V = 4
    >>> sampler(target, np.array([[3], [3]]), target[:, :2], np.array([[0, 1], [2, 3]]))
    array([[0, 1, 3],
           [2, 3, 3]])
    """

    _verifier = registry.get("block")


_TYPICAL = registry.get("typical")


@_sampler_doc
class TypicalAcceptanceSampler(_DeterministicSampler, SpecDecodeDeterministicBaseSampler):
    """Typical acceptance (Medusa; lossy by design), vLLM's ``TypicalAcceptanceSampler``.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import TypicalAcceptanceSampler
    >>> sampler = TypicalAcceptanceSampler(posterior_threshold=0.09, posterior_alpha=0.3)
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.9, 0.05, 0.05], [0.2, 0.2, 0.6]]])
    >>> sampler(target, np.array([[2]]), None, np.array([[1, 2]]))
    array([[ 1,  0, -1]])
    >>> sampler.num_draft_tokens, int(sampler.num_accepted_tokens)
    (2, 1)
    """

    _verifier = _TYPICAL

    def __init__(
        self,
        posterior_threshold: float = _TYPICAL.parameter_defaults[0],
        posterior_alpha: float = _TYPICAL.parameter_defaults[1],
        strict_mode: bool = False,
    ) -> None:
        super().__init__(
            strict_mode, posterior_threshold=posterior_threshold, posterior_alpha=posterior_alpha
        )


@_sampler_doc
class GreedySampler(_DeterministicSampler, SpecDecodeDeterministicBaseSampler):
    """Greedy verification (temperature 0), vLLM v1's greedy path.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import GreedySampler
    >>> sampler = GreedySampler()
    >>> target = np.array([[[0.1, 0.6, 0.3], [0.9, 0.05, 0.05], [0.2, 0.2, 0.6]]])
    >>> sampler(target, np.array([[2]]), None, np.array([[1, 0]]))
    array([[1, 0, 2]])
    >>> int(sampler.num_emitted_tokens)
    3
    """

    _verifier = registry.get("greedy")

    def __init__(self, strict_mode: bool = False) -> None:
        super().__init__(strict_mode)
