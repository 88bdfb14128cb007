"""vLLM v1's ``rejection_sample``, on :func:`specdec_np.verify_ragged`.

vLLM v1 hands its rejection sampler the target's logits at the draft positions
(``[num_tokens, V]``), the drafter's probabilities as they are (or None for n-gram
drafts), the bonus tokens its own sampler drew, and a ``SamplingMetadata``.  This module
takes exactly that and returns what vLLM returns: int32 ``[B, max_spec_len + 1]``, with
``PLACEHOLDER_TOKEN_ID`` (-1) after each request's tokens.  ``sampling_metadata`` is read by
vLLM's attribute names only:

* ``all_greedy``, ``all_random``;
* ``temperature`` (``[B]``, None when every request is greedy; a request whose temperature
  is at most ``GREEDY_EPSILON`` (vLLM's greedy marker, 0 or -1) is greedy);
* ``top_k``, ``top_p`` (``[B]`` or None; top-k ``>= V`` and top-p 1 are off);
* ``generators``: request index -> ``torch.Generator``, whose requests draw their uniforms
  from it, the others from torch's global generator, as vLLM draws them.

torch is imported only when the inputs are torch tensors; NumPy inputs give NumPy outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._layouts.ragged import verify_ragged

__all__ = ["GREEDY_EPSILON", "PLACEHOLDER_TOKEN_ID", "rejection_sample"]

#: vLLM's placeholder after a request's tokens.
PLACEHOLDER_TOKEN_ID = -1
#: Temperatures at or below this are greedy (vLLM marks greedy requests with 0 or -1).
GREEDY_EPSILON = 1e-5


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
        Drafts per request (0 for a request that only gets its bonus token).
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
        In the inputs' library and on their device.

    Raises
    ------
    ValueError, TypeError
        On inputs vLLM's own sampler would refuse, naming the argument.
    """
    counts = [int(count) for count in num_draft_tokens]
    batch_size = len(counts)
    if not isinstance(max_spec_len, (int, np.integer)) or max_spec_len < max(counts, default=0):
        raise ValueError(
            f"max_spec_len must be an int >= the largest of num_draft_tokens; found "
            f"{max_spec_len!r}"
        )
    ends = np.asarray(_host(cu_num_draft_tokens), dtype=np.int64).reshape(-1)
    if ends.tolist() != np.cumsum(counts, dtype=np.int64).tolist():
        raise ValueError(
            "cu_num_draft_tokens must be the running sums of num_draft_tokens; found "
            f"{ends.tolist()} for {counts}"
        )
    torch = _torch_of(target_logits, draft_token_ids, bonus_token_ids, draft_probs)
    temperature, greedy = _temperatures(sampling_metadata, batch_size, torch)
    sampled = [b for b in range(batch_size) if not greedy[b]]
    uniforms = None
    if sampled:
        device = getattr(target_logits, "device", None)
        uniforms = _uniforms(sampling_metadata, counts, torch, device)
    result = verify_ragged(
        num_draft_tokens=counts,
        draft_token_ids=draft_token_ids,
        target_logits=target_logits,
        draft_probs=draft_probs,
        bonus_token_ids=bonus_token_ids,
        temperature=temperature,
        top_k=_parameter(sampling_metadata, "top_k", torch),
        top_p=_parameter(sampling_metadata, "top_p", torch),
        uniforms=uniforms,
    )
    return _placeholder_padded(result.output_token_ids, batch_size, max_spec_len, torch)


def _torch_of(*inputs: Any) -> Any:
    """The torch module when an input is a torch tensor (it is imported then), else None."""
    for value in inputs:
        if type(value).__module__.split(".", 1)[0] == "torch":
            return sys.modules["torch"]
    return None


def _host(value: Any) -> Any:
    """A small tensor or array as host numbers (for the O(B) metadata)."""
    if type(value).__module__.split(".", 1)[0] == "torch":
        return value.detach().cpu().numpy()
    if hasattr(value, "get"):
        return value.get()
    return value


def _temperatures(metadata: Any, batch_size: int, torch: Any) -> tuple[Any, list[bool]]:
    """specdec_np's temperatures (0 for a greedy request) and which requests are greedy."""
    if getattr(metadata, "all_greedy", False) or metadata.temperature is None:
        return np.zeros(batch_size), [True] * batch_size
    values = np.asarray(_host(metadata.temperature), dtype=np.float64).reshape(-1)
    if values.shape != (batch_size,):
        raise ValueError(
            f"sampling_metadata.temperature must have [B] = [{batch_size}] entries; found "
            f"{values.shape[0]}"
        )
    greedy = (values <= GREEDY_EPSILON).tolist()
    if getattr(metadata, "all_random", False) and any(greedy):
        raise ValueError("sampling_metadata.all_random is set but a temperature is greedy")
    return np.where(values <= GREEDY_EPSILON, 0.0, values), greedy


def _parameter(metadata: Any, name: str, torch: Any) -> Any:
    value = getattr(metadata, name, None)
    return None if value is None else np.asarray(_host(value), dtype=np.float64).reshape(-1)


def _uniforms(metadata: Any, counts: list[int], torch: Any, device: Any) -> Any:
    """float64 ``[B, max_k + 2]`` uniforms: a request with a generator draws its row from
    it, the others from the global generator of their library, as vLLM draws them."""
    width = max(counts, default=0) + 2
    generators = getattr(metadata, "generators", None) or {}
    if torch is None:
        uniforms = np.random.default_rng().random((len(counts), width))
        for b, generator in generators.items():
            uniforms[b] = generator.random(width)
        return uniforms
    uniforms = torch.rand(len(counts), width, dtype=torch.float64, device=device)
    for b, generator in generators.items():
        row = torch.rand(width, dtype=torch.float64, generator=generator, device=generator.device)
        uniforms[b] = row.to(device)
    return uniforms


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
    padded = np.full((batch_size, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
    padded[:, :width] = output
    return padded
