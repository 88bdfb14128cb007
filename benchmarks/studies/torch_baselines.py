"""Torch baselines of the verification algorithms (benchmark only).

These are written for this benchmark from the published behaviour of vLLM v0's
``RejectionSampler`` and ``TypicalAcceptanceSampler`` (and the v1 greedy path), plus block
verification (Sun et al., ICLR 2025), which vLLM does not have: its baseline is the torch
code an engine author would write for it, vectorised over the batch and reading every
row.  They keep the cost structure of those algorithms, which is what the benchmark
compares against:

* rejection sampling gathers ``p(x)`` and ``q(x)`` at every position, accepts where
  ``u < min(1, p / q)``, builds the clamped residual ``max(p - q, tiny)`` for **every**
  position ``[B, k, V]``, normalises it over the vocabulary and draws a recovered token at
  every position with the exponential race (``argmax(residual / Exponential(1))``);
* typical acceptance computes the entropy ``-sum p log(p + 1e-5)`` of every position in the
  probabilities' dtype, thresholds at ``min(posterior_threshold, alpha * exp(-H))`` and takes
  the argmax of every position as its recovered token;
* greedy takes the argmax of every position and compares it with the draft;
* block verification computes the weights ``rho`` position by position (``k`` vector
  steps over the batch), the weighted residual ``max(rho p - q, 0)`` and its sum at
  **every** position ``[B, k, V]``, the checks ``h``, the largest passing position ``tau``
  of every row at once, and the recovered token from the residual row at ``tau`` with the
  exponential race.

All of them then format the output as vLLM's ``_create_output`` does: accepted prefix, the
recovered token at the first rejection (or the bonus token if every draft was accepted),
then ``-1``.  Point-mass drafts (``draft_probs=None``) do not exist in vLLM v0; pass one-hot
draft probabilities instead.

``v1_rejection_sample_flat`` is vLLM v1's flat-layout sampler from logits, the baseline of
``benchmarks/studies/engine.py``.

torch is never imported by ``specdec_np``; this module is only used by
``benchmarks/studies/run.py`` and ``benchmarks/studies/engine.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = [
    "BASELINES",
    "TorchResult",
    "block_verification_sample",
    "configure",
    "create_output",
    "greedy_sample",
    "rejection_sample",
    "typical_acceptance_sample",
    "v1_rejection_sample_flat",
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


@torch.inference_mode()
def block_verification_sample(
    target_with_bonus_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> TorchResult:
    """Block verification over the whole batch: every residual row is built and summed.

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
    bonus_token_ids : int64 [B, 1]
    draft_probs : float [B, k, V]
    draft_token_ids : int64 [B, k]
    generator : torch.Generator, optional
    uniforms : float64 [B, k+1], optional
        Columns ``0 .. k-1`` are the checks' uniforms ``eta_1 .. eta_k``, as in specdec_np
        (so that accepted lengths can be compared on the same uniforms); drawn from
        ``generator`` when None.  The recovered token always comes from the race.
    """
    batch_size, k = draft_token_ids.shape
    target = target_with_bonus_probs[:, :-1]
    p_x = _gather_at_drafts(target, draft_token_ids).to(torch.float64)
    q_x = _gather_at_drafts(draft_probs, draft_token_ids).to(torch.float64)
    # rho_0 = 1, rho_i = min(1, rho_{i-1} p / q); p <= 0 ends the path (rho = 0 for good).
    rho = torch.ones((batch_size, k + 1), dtype=torch.float64, device=p_x.device)
    for i in range(k):
        previous = rho[:, i]
        weighted = previous * p_x[:, i]
        ratio = torch.where(weighted >= q_x[:, i], torch.ones_like(weighted), weighted / q_x[:, i])
        alive = (p_x[:, i] > 0) & (previous > 0)
        rho[:, i + 1] = torch.where(alive, ratio, torch.zeros_like(ratio))
    residual = (rho[:, :k, None].to(target.dtype) * target - draft_probs).clamp_(min=0)
    total = residual.sum(dim=-1, dtype=torch.float64)
    denominator = total + (1.0 - rho[:, :k])
    h = torch.where(denominator > 0, total / denominator, torch.ones_like(total))
    # Column j holds h_{j+1}: h_1 .. h_{k-1} from the residuals, h_k = rho_k.
    h = torch.cat([h[:, 1:], rho[:, k:]], dim=1)
    if uniforms is None:
        eta = torch.rand(
            (batch_size, k), dtype=torch.float64, device=p_x.device, generator=generator
        )
    else:
        eta = uniforms[:, :k]
    passed = eta < h
    # tau = the largest passing position (1-based), 0 where none passes.
    last = k - 1 - passed.flip(1).to(torch.int8).argmax(dim=1)
    tau = torch.where(passed.any(dim=1), last + 1, torch.zeros_like(last))
    at = tau.clamp(max=k - 1)
    rows = residual.gather(1, at[:, None, None].expand(-1, 1, residual.shape[-1])).squeeze(1)
    empty = total.gather(1, at[:, None]).squeeze(1) <= 0
    if bool(empty.any()):
        # A residual without mass: draw from the target row itself.
        plain = target.gather(1, at[:, None, None].expand(-1, 1, target.shape[-1])).squeeze(1)
        rows = torch.where(empty[:, None], plain, rows)
    race = torch.empty_like(rows).exponential_(1.0, generator=generator)
    recovered = rows.div_(race).argmax(dim=-1)
    columns = torch.arange(k, device=tau.device)
    accepted = columns[None, :] < tau[:, None]
    substitute = recovered[:, None].expand(batch_size, k)
    return create_output(accepted, substitute, draft_token_ids, bonus_token_ids)


#: Baseline of each registry verifier that has one, by registry name.
BASELINES = {
    "rejection": rejection_sample,
    "block": block_verification_sample,
    "typical": typical_acceptance_sample,
    "greedy": greedy_sample,
}


def as_tensors(*arrays: Any) -> list[torch.Tensor]:
    """Zero-copy torch views of NumPy (or DLPack) arrays."""
    return [torch.from_dlpack(array) for array in arrays]


# --------------------------------------------------------------------------------------
# vLLM v1's flat layout, from logits (the engine entry point's baseline)
# --------------------------------------------------------------------------------------


def _process_every_row(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax of every row after temperature, with top-k/top-p by sorting every row.

    Parameters
    ----------
    logits : float32 [R, V]
    temperature : float32 [R]
        Positive (greedy rows get 1: their probabilities are unused).
    top_k : int64 [R] or None
        ``V`` keeps every token.
    top_p : float32 [R] or None
        ``1`` keeps every token.

    Returns
    -------
    float32 [R, V]
    """
    z = logits / temperature.unsqueeze(1)
    if top_k is None and top_p is None:
        return z.softmax(dim=-1)
    vocab_size = z.shape[-1]
    ascending, order = z.sort(dim=-1)
    if top_k is not None:
        # The top_k-th largest value sits at column V - top_k of the ascending sort.
        kth = ascending.gather(1, (vocab_size - top_k).clamp(min=0).unsqueeze(1))
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    if top_p is not None:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low tail whose mass is at most 1 - top_p; the largest token always stays.
        drop = cumulative <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        ascending = ascending.masked_fill(drop, float("-inf"))
    return torch.empty_like(z).scatter_(1, order, ascending).softmax(dim=-1)


@torch.inference_mode()
def v1_rejection_sample_flat(
    num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """vLLM v1's rejection sampler on the flat layout, from logits (its cost structure).

    * greedy requests (``temperature == 0``): argmax of the raw target logits of every row;
      a batch of only greedy requests stops there (no softmax);
    * otherwise every target row ``[T + B, V]`` and every draft row ``[T, V]`` is scaled by
      its request's temperature, filtered by top-k/top-p through a full sort of the row,
      and turned into probabilities with a softmax;
    * a draft is accepted where ``q(x) > 0`` and ``p(x) / q(x) >= u``;
    * the recovered token of **every** draft position is ``argmax(max(p - q, 0) / E)`` with
      ``E`` one ``[B, V]`` draw of Exponential(1) per request, made on every call;
    * the bonus token of every request is the same race over its processed bonus row.

    Parameters
    ----------
    num_draft_tokens : int64 [B]
    draft_token_ids : int64 [T]
    target_logits : float32 [T + B, V]
        Request ``b``'s ``k_b`` draft rows, then its bonus row, request by request.
    draft_logits : float32 [T, V]
    temperature : float32 [B]
        ``0`` is greedy.
    top_k : int64 [B] or None
    top_p : float32 [B] or None
    generator : torch.Generator, optional

    Returns
    -------
    int64 [B, max_k + 1]
        Accepted drafts, then the recovered (or bonus) token, then -1.
    """
    batch_size = num_draft_tokens.shape[0]
    num_drafts = draft_token_ids.shape[0]
    vocab_size = target_logits.shape[1]
    counts = num_draft_tokens
    max_k = int(counts.max()) if batch_size else 0
    requests = torch.arange(batch_size)
    request_of_row = torch.repeat_interleave(requests, counts + 1)
    request_of_draft = torch.repeat_interleave(requests, counts)
    starts = torch.cumsum(counts + 1, 0) - (counts + 1)
    draft_starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(num_drafts) - draft_starts[request_of_draft]
    draft_rows = starts[request_of_draft] + position
    bonus_rows = starts + counts
    greedy = temperature == 0
    target_argmax = target_logits.argmax(dim=-1)
    greedy_accept = target_argmax[draft_rows] == draft_token_ids
    if bool(greedy.all()):
        accepted, recovered, bonus = (
            greedy_accept,
            target_argmax[draft_rows],
            target_argmax[bonus_rows],
        )
    else:
        scale = torch.where(greedy, torch.ones_like(temperature), temperature)
        row_k = None if top_k is None else top_k[request_of_row]
        row_p = None if top_p is None else top_p[request_of_row]
        target = _process_every_row(target_logits, scale[request_of_row], row_k, row_p)
        draft_k = None if top_k is None else top_k[request_of_draft]
        draft_p = None if top_p is None else top_p[request_of_draft]
        draft = _process_every_row(draft_logits, scale[request_of_draft], draft_k, draft_p)
        p_x = target.reshape(-1)[draft_rows * vocab_size + draft_token_ids]
        q_x = draft.reshape(-1)[torch.arange(num_drafts) * vocab_size + draft_token_ids]
        uniforms = torch.rand(num_drafts, generator=generator)
        sampled_accept = (q_x > 0) & (p_x / q_x >= uniforms)
        accepted = torch.where(greedy[request_of_draft], greedy_accept, sampled_accept)
        race = torch.empty((batch_size, vocab_size)).exponential_(1.0, generator=generator)
        residual = (target[draft_rows] - draft).clamp_(min=0)
        sampled_recovered = residual.div_(race[request_of_draft]).argmax(dim=-1)
        recovered = torch.where(
            greedy[request_of_draft], target_argmax[draft_rows], sampled_recovered
        )
        bonus_race = torch.empty((batch_size, vocab_size)).exponential_(1.0, generator=generator)
        sampled_bonus = (target[bonus_rows] / bonus_race).argmax(dim=-1)
        bonus = torch.where(greedy, target_argmax[bonus_rows], sampled_bonus)
    # Ragged to padded: position j of request b is real for j < k_b.
    padded_accept = torch.zeros((batch_size, max_k), dtype=torch.bool)
    padded_ids = torch.full((batch_size, max_k), -1, dtype=torch.int64)
    padded_recovered = torch.full((batch_size, max_k + 1), -1, dtype=torch.int64)
    padded_accept[request_of_draft, position] = accepted
    padded_ids[request_of_draft, position] = draft_token_ids
    padded_recovered[request_of_draft, position] = recovered
    padded_recovered[requests, counts] = bonus
    accepted_lengths = padded_accept.to(torch.int64).cumprod(dim=1).sum(dim=1)
    output = torch.full((batch_size, max_k + 1), -1, dtype=torch.int64)
    columns = torch.arange(max_k).unsqueeze(0)
    output[:, :max_k] = torch.where(columns < accepted_lengths.unsqueeze(1), padded_ids, -1)
    output[requests, accepted_lengths] = padded_recovered[requests, accepted_lengths]
    return output
