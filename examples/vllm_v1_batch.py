"""A vLLM v1 speculative-decoding batch through :mod:`specdec_np.adapters.vllm`.

vLLM v1's ``RejectionSampler`` receives, for a batch of ``B`` requests:

* ``draft_token_ids`` int32 ``[num_tokens]``: every request's drafts, request by request;
* ``num_draft_tokens``: a Python list ``[B]`` (0 for a request without drafts) and
  ``cu_num_draft_tokens`` int32 ``[B]``, its running sums;
* ``draft_probs`` ``[num_tokens, V]``: the proposer's probabilities (None for n-gram
  drafts), used as given;
* ``target_logits`` float32 ``[num_tokens, V]``: the target's logits at the draft
  positions only;
* ``bonus_token_ids`` int ``[B, 1]``: the token vLLM's own sampler already drew at each
  request's bonus position;
* ``sampling_metadata``: a ``SamplingMetadata``, read by attribute name (``all_greedy``,
  ``all_random``, ``temperature`` (None when every request is greedy), ``top_k``, ``top_p``,
  ``generators``: request index -> ``torch.Generator`` for seeded requests).

:func:`specdec_np.adapters.vllm.rejection_sample` takes exactly these and returns vLLM's
int32 ``[B, max_spec_len + 1]``, ``-1`` after each request's tokens, as a torch tensor.

This script builds two such batches from a toy torch "model" (random logits), one mixed
(greedy, sampled with top-k / top-p, seeded) and one all greedy, runs them through the
adapter and parses the output as vLLM's scheduler would.  Run it:
``python examples/vllm_v1_batch.py`` (needs torch; the package itself never imports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdec_np.adapters import vllm

VOCAB_SIZE = 32


@dataclass
class SamplingMetadata:
    """The attributes of vLLM v1's ``SamplingMetadata`` that the adapter reads."""

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)


def make_batch(
    num_draft_tokens: list[int],
    temperature: list[float] | None,
    seed: int = 0,
    ngram_drafts: list[list[int]] | None = None,
) -> dict[str, Any]:
    """A vLLM v1 batch: the target's logits at the draft positions, drafts drawn from the
    proposer's probabilities (or n-gram drafts) and bonus tokens drawn from the target's
    bonus rows.

    Parameters
    ----------
    num_draft_tokens : list of int
        Drafts per request (0: none).
    temperature : list of float or None
        Per request (0: greedy); None: every request greedy (vLLM then sets
        ``SamplingMetadata.temperature`` to None).
    seed : int
        Seed of the toy logits and of the draws.
    ngram_drafts : list of list of int, optional
        Given drafts (an n-gram proposer: ``draft_probs=None``), one list per request of
        ``num_draft_tokens[b]`` tokens.

    Returns
    -------
    dict
        The adapter's keyword arguments except ``sampling_metadata``.
    """
    generator = torch.Generator().manual_seed(seed)
    batch_size, num_tokens = len(num_draft_tokens), sum(num_draft_tokens)
    # The target scored k_b + 1 positions per request; vLLM hands the rejection sampler the
    # draft positions and has drawn the bonus token from the last position itself.
    all_logits = 2.0 * torch.randn(num_tokens + batch_size, VOCAB_SIZE, generator=generator)
    bonus_rows = torch.tensor(np.cumsum(np.array(num_draft_tokens) + 1) - 1)
    is_draft_row = torch.ones(len(all_logits), dtype=torch.bool)
    is_draft_row[bonus_rows] = False
    greedy = torch.tensor([True] * batch_size if temperature is None else
                          [t == 0 for t in temperature])
    scale = torch.ones(batch_size) if temperature is None else torch.tensor(temperature)
    scale = torch.where(greedy, 1.0, scale)[:, None]
    bonus_logits = all_logits[bonus_rows]
    sampled_bonus = torch.multinomial(
        torch.softmax(bonus_logits / scale, dim=-1), 1, generator=generator
    )
    bonus = torch.where(greedy[:, None], bonus_logits.argmax(dim=-1, keepdim=True), sampled_bonus)
    if ngram_drafts is not None:
        draft_probs = None
        draft_token_ids = torch.tensor([t for d in ngram_drafts for t in d], dtype=torch.int32)
    else:
        # A proposer close to the target: its logits plus noise, at the request's
        # temperature; each draft is drawn from its row.
        request_of_row = torch.repeat_interleave(
            torch.arange(batch_size), torch.tensor(num_draft_tokens)
        )
        draft_logits = all_logits[is_draft_row] + torch.randn(
            num_tokens, VOCAB_SIZE, generator=generator
        )
        draft_probs = torch.softmax(draft_logits / scale[request_of_row], dim=-1)
        draft_token_ids = torch.multinomial(draft_probs, 1, generator=generator)
        draft_token_ids = draft_token_ids.reshape(-1).to(torch.int32)
    return {
        "draft_token_ids": draft_token_ids,
        "num_draft_tokens": list(num_draft_tokens),
        "max_spec_len": max(num_draft_tokens, default=0),
        "cu_num_draft_tokens": torch.tensor(np.cumsum(num_draft_tokens), dtype=torch.int32),
        "draft_probs": draft_probs,
        "target_logits": all_logits[is_draft_row].contiguous(),
        "bonus_token_ids": bonus.to(torch.int64),
    }


def parse_output(output: torch.Tensor) -> list[list[int]]:
    """Each request's new tokens, as vLLM's scheduler reads them (up to the first -1).

    Parameters
    ----------
    output : int32 tensor [B, max_spec_len + 1]
        The adapter's output.

    Returns
    -------
    list of list of int
    """
    tokens = []
    for row in output.tolist():
        end = row.index(vllm.PLACEHOLDER_TOKEN_ID) if vllm.PLACEHOLDER_TOKEN_ID in row else None
        tokens.append(row[:end])
    return tokens


def run(seed: int = 0) -> dict[str, tuple[dict[str, Any], torch.Tensor]]:
    """Verify a mixed batch and an all-greedy batch.

    Parameters
    ----------
    seed : int
        Seed of the batches and of the seeded request's generator.

    Returns
    -------
    dict
        ``"mixed"`` and ``"greedy"``: ``(batch, output)`` each.
    """
    # Mixed: request 0 greedy, 1 sampled with top-k / top-p, 2 without drafts, 3 seeded.
    temperature = [0.0, 0.8, 1.0, 1.2]
    mixed = make_batch([3, 2, 0, 4], temperature, seed)
    metadata = SamplingMetadata(
        temperature=torch.tensor(temperature),
        all_greedy=False,
        all_random=False,
        top_k=torch.tensor([VOCAB_SIZE, 8, VOCAB_SIZE, VOCAB_SIZE]),  # >= V is off
        top_p=torch.tensor([1.0, 0.9, 1.0, 1.0]),  # 1 is off
        generators={3: torch.Generator().manual_seed(seed + 1)},
    )
    mixed_output = vllm.rejection_sample(**mixed, sampling_metadata=metadata)
    # All greedy, n-gram drafts: vLLM passes temperature None and draft_probs None.
    greedy = make_batch([2, 1], None, seed, ngram_drafts=[[1, 2], [4]])
    greedy_metadata = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    greedy_output = vllm.rejection_sample(**greedy, sampling_metadata=greedy_metadata)
    return {"mixed": (mixed, mixed_output), "greedy": (greedy, greedy_output)}


def main() -> None:
    """Print the two batches' outputs and the tokens each request gets."""
    for name, (batch, output) in run().items():
        print(f"{name}: num_draft_tokens={batch['num_draft_tokens']}")
        print(f"  output {output.dtype} {tuple(output.shape)}:\n{output}")
        print(f"  new tokens per request: {parse_output(output)}")


if __name__ == "__main__":
    main()
