"""Torch re-implementations of vLLM v0's verification algorithms (benchmark baselines only).

These are written for this benchmark from the published behaviour of vLLM v0's
``RejectionSampler`` and ``TypicalAcceptanceSampler`` (and the v1 greedy path); they keep the
cost structure of those algorithms, which is what the benchmark compares against:

* rejection sampling gathers ``p(x)`` and ``q(x)`` at every position, accepts where
  ``u < min(1, p / q)``, builds the clamped residual ``max(p - q, tiny)`` for **every**
  position ``[B, k, V]``, normalises it over the vocabulary and draws a recovered token at
  every position with the exponential race (``argmax(residual / Exponential(1))``);
* typical acceptance computes the entropy ``-sum p log(p + 1e-5)`` of every position in the
  probabilities' dtype, thresholds at ``min(posterior_threshold, alpha * exp(-H))`` and takes
  the argmax of every position as its recovered token;
* greedy takes the argmax of every position and compares it with the draft.

All three then format the output as vLLM's ``_create_output`` does: accepted prefix, the
recovered token at the first rejection (or the bonus token if every draft was accepted),
then ``-1``.  Point-mass drafts (``draft_probs=None``) do not exist in vLLM v0; pass one-hot
draft probabilities instead.

torch is never imported by ``specdec_np``; this module is only used by ``benchmarks/run.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = [
    "TorchResult",
    "configure",
    "create_output",
    "greedy_sample",
    "rejection_sample",
    "typical_acceptance_sample",
]


class TorchResult(NamedTuple):
    """Output rows plus vLLM's two counter increments for the call."""

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor


def configure(num_threads: int = 2) -> None:
    """Pin torch's intra-op thread count (the benchmark machine has 2 cores)."""
    torch.set_num_threads(num_threads)


def create_output(
    accepted: torch.Tensor,
    substitute_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> TorchResult:
    """Accepted drafts up to the first rejection, then the substitute (or bonus), then -1.

    Parameters
    ----------
    accepted : bool [B, k]
        Per-position test results (True after a False is allowed and counted).
    substitute_token_ids, draft_token_ids : int64 [B, k]
    bonus_token_ids : int64 [B, 1] or [B]
    """
    batch_size, k = substitute_token_ids.shape
    device = accepted.device
    bonus = bonus_token_ids.reshape(batch_size)
    rejected = accepted.logical_not()
    # First rejected position per row; k where every position was accepted.
    first = rejected.to(torch.int8).argmax(dim=1)
    first = torch.where(rejected.any(dim=1), first, torch.full_like(first, k))
    columns = torch.arange(k, device=device).unsqueeze(0)
    in_prefix = columns < first.unsqueeze(1)
    output = torch.full((batch_size, k + 1), -1, dtype=torch.int64, device=device)
    output[:, :k] = torch.where(in_prefix, draft_token_ids, torch.full_like(draft_token_ids, -1))
    at_rejection = substitute_token_ids.gather(1, first.clamp(max=k - 1).unsqueeze(1)).squeeze(1)
    last = torch.where(first == k, bonus, at_rejection)
    output.scatter_(1, first.unsqueeze(1), last.unsqueeze(1))
    num_accepted = accepted.sum()
    num_emitted = (output != -1).sum()
    return TorchResult(output, num_accepted, num_emitted)


def _gather_at_drafts(probs: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    return probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)


@torch.inference_mode()
def rejection_sample(
    target_with_bonus_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator | None = None,
) -> TorchResult:
    """vLLM v0 rejection sampling: full residual at every position, exponential race.

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
    bonus_token_ids : int64 [B, 1]
    draft_probs : float [B, k, V]
    draft_token_ids : int64 [B, k]
    generator : torch.Generator, optional
    """
    target = target_with_bonus_probs[:, :-1]
    p_x = _gather_at_drafts(target, draft_token_ids)
    q_x = _gather_at_drafts(draft_probs, draft_token_ids)
    uniforms = torch.rand(p_x.shape, dtype=p_x.dtype, device=p_x.device, generator=generator)
    accepted = uniforms < torch.clamp(p_x / q_x, max=1.0)
    # The residual of every position, clamped to the smallest normal float and normalised.
    tiny = torch.finfo(target.dtype).tiny
    residual = (target - draft_probs).clamp(min=tiny)
    residual = residual / residual.sum(dim=-1, keepdim=True)
    # Exponential race: argmax of w / E with E ~ Exp(1) samples index y with prob. w_y.
    race = torch.empty_like(residual).exponential_(1.0, generator=generator)
    recovered = residual.div_(race).argmax(dim=-1)
    return create_output(accepted, recovered, draft_token_ids, bonus_token_ids)


@torch.inference_mode()
def typical_acceptance_sample(
    target_with_bonus_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> TorchResult:
    """vLLM v0 typical acceptance: entropy and argmax of every position."""
    target = target_with_bonus_probs[:, :-1]
    p_x = _gather_at_drafts(target, draft_token_ids)
    entropy = -(target * torch.log(target + 1e-5)).sum(dim=-1)
    threshold = torch.minimum(
        torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy)
    )
    accepted = p_x > threshold
    recovered = target.argmax(dim=-1)
    return create_output(accepted, recovered, draft_token_ids, bonus_token_ids)


@torch.inference_mode()
def greedy_sample(
    target_with_bonus_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
) -> TorchResult:
    """Greedy verification: argmax of every position compared with the draft."""
    argmax = target_with_bonus_probs[:, :-1].argmax(dim=-1)
    accepted = argmax == draft_token_ids
    return create_output(accepted, argmax, draft_token_ids, bonus_token_ids)


def as_tensors(*arrays: Any) -> list[torch.Tensor]:
    """Zero-copy torch views of NumPy (or DLPack) arrays."""
    return [torch.from_dlpack(array) for array in arrays]
