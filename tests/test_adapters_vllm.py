"""vLLM v1's ``rejection_sample`` through ``specdec_np.adapters.vllm``: vLLM's calling
convention and output, the scenarios its own v1 tests cover (written here), and the law."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from specdec_np.adapters import vllm
from specdec_np.testing import _statistics

torch = pytest.importorskip("torch")


@dataclass
class SamplingMetadata:
    """The attributes of vLLM's ``SamplingMetadata`` the adapter reads."""

    temperature: Any
    all_greedy: bool
    all_random: bool
    top_k: Any = None
    top_p: Any = None
    generators: dict = field(default_factory=dict)


def greedy_metadata() -> SamplingMetadata:
    return SamplingMetadata(temperature=None, all_greedy=True, all_random=False)


def batch(drafts: list[list[int]], vocab: int = 8, favourite: list[list[int]] | None = None,
          bonus: list[int] | None = None) -> dict:
    """A vLLM batch whose target logits peak at ``favourite`` (the drafts by default)."""
    favourite = favourite or drafts
    counts = [len(d) for d in drafts]
    logits = torch.full((sum(counts), vocab), -100.0)
    row = 0
    for tokens in favourite:
        for token in tokens:
            logits[row, token] = 100.0
            row += 1
    return {
        "draft_token_ids": torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        "num_draft_tokens": counts,
        "max_spec_len": max(counts),
        "cu_num_draft_tokens": torch.tensor(np.cumsum(counts), dtype=torch.int32),
        "draft_probs": None,
        "target_logits": logits,
        "bonus_token_ids": torch.tensor(bonus or [[7]] * len(drafts), dtype=torch.int64)
        .reshape(-1, 1),
    }


def test_perfect_match_emits_the_drafts_and_the_bonus() -> None:
    output = vllm.rejection_sample(**batch([[1, 2, 3]], bonus=[[4]]),
                                   sampling_metadata=greedy_metadata())
    assert output.dtype == torch.int32
    assert output.tolist() == [[1, 2, 3, 4]]


def test_early_mismatch_emits_the_target_token_then_placeholders() -> None:
    output = vllm.rejection_sample(
        **batch([[1, 2, 3]], favourite=[[1, 5, 3]]), sampling_metadata=greedy_metadata()
    )
    assert output.tolist() == [[1, 5, -1, -1]]


def test_ragged_batch_and_a_wider_max_spec_len() -> None:
    arguments = batch([[1, 2], [3], [4, 5, 6]], favourite=[[1, 2], [0], [4, 5, 6]],
                      bonus=[[7], [7], [1]])
    arguments["max_spec_len"] = 4
    output = vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
    assert output.tolist() == [[1, 2, 7, -1, -1], [0, -1, -1, -1, -1], [4, 5, 6, 1, -1]]


def test_empty_drafts_in_a_batch() -> None:
    arguments = batch([[1], [2]], bonus=[[3], [4]])
    arguments.update(num_draft_tokens=[1, 0, 1],
                     cu_num_draft_tokens=torch.tensor([1, 1, 2], dtype=torch.int32),
                     bonus_token_ids=torch.tensor([[3], [5], [4]]))
    output = vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
    assert output.tolist() == [[1, 3], [5, -1], [2, 4]]


def test_mixed_greedy_and_sampled_requests() -> None:
    """vLLM marks greedy requests with a temperature of 0 (or -1) in a mixed batch; a peaked
    target accepts its drafts under sampling too."""
    arguments = batch([[1, 2], [3, 4]])
    for greedy_mark in (0.0, -1.0):
        metadata = SamplingMetadata(temperature=torch.tensor([greedy_mark, 1.0]),
                                    all_greedy=False, all_random=False)
        output = vllm.rejection_sample(**arguments, sampling_metadata=metadata)
        assert output.tolist() == [[1, 2, 7], [3, 4, 7]]


def test_seeded_requests_are_reproducible_and_independent() -> None:
    rng = np.random.default_rng(0)
    vocab, counts = 50, [3, 3]
    logits = torch.tensor(rng.normal(size=(6, vocab)), dtype=torch.float32)
    probs = torch.softmax(torch.tensor(rng.normal(size=(6, vocab)), dtype=torch.float32), -1)
    arguments = {
        "draft_token_ids": torch.tensor(rng.integers(0, vocab, 6)),
        "num_draft_tokens": counts, "max_spec_len": 3,
        "cu_num_draft_tokens": torch.tensor([3, 6]), "draft_probs": probs,
        "target_logits": logits, "bonus_token_ids": torch.tensor([[0], [1]]),
    }

    def run(seed: int) -> list:
        generator = torch.Generator().manual_seed(seed)
        metadata = SamplingMetadata(temperature=torch.tensor([1.0, 1.0]), all_greedy=False,
                                    all_random=True, generators={0: generator})
        return vllm.rejection_sample(**arguments, sampling_metadata=metadata)[0].tolist()

    first = [run(5) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    assert len({tuple(run(seed)) for seed in range(40)}) > 1


def test_top_k_is_applied_to_the_target() -> None:
    """No emitted token lies outside the request's top-k of its target logits."""
    rng = np.random.default_rng(1)
    vocab, n = 20, 400
    logits = torch.tensor(rng.normal(size=(n, vocab)), dtype=torch.float32)
    drafts = torch.tensor(rng.integers(0, vocab, n))
    metadata = SamplingMetadata(temperature=torch.ones(n), all_greedy=False, all_random=True,
                                top_k=torch.full((n,), 3))
    output = vllm.rejection_sample(
        draft_token_ids=drafts, num_draft_tokens=[1] * n, max_spec_len=1,
        cu_num_draft_tokens=torch.arange(1, n + 1), draft_probs=None, target_logits=logits,
        bonus_token_ids=torch.zeros((n, 1), dtype=torch.int64), sampling_metadata=metadata,
    )
    top3 = torch.topk(logits, 3, dim=1).indices
    first = output[:, 0:1].to(torch.int64)
    assert bool((first == top3).any(dim=1).all())


def test_the_first_token_has_the_target_law_with_draft_probabilities() -> None:
    rng = np.random.default_rng(2)
    vocab, n = 5, 40_000
    logits = torch.tensor([[0.5, 1.5, -1.0, 0.0, 0.7]]).repeat(n, 1)
    q = np.array([0.4, 0.1, 0.2, 0.2, 0.1])
    metadata = SamplingMetadata(temperature=torch.full((n,), 0.8), all_greedy=False,
                                all_random=True)
    torch.manual_seed(3)
    output = vllm.rejection_sample(
        draft_token_ids=torch.tensor(rng.choice(vocab, size=n, p=q)), num_draft_tokens=[1] * n,
        max_spec_len=1, cu_num_draft_tokens=torch.arange(1, n + 1),
        draft_probs=torch.tensor(q, dtype=torch.float32).repeat(n, 1), target_logits=logits,
        bonus_token_ids=torch.zeros((n, 1), dtype=torch.int64), sampling_metadata=metadata,
    )
    p = torch.softmax(logits[0] / 0.8, -1).numpy().astype(np.float64)
    counts = np.bincount(output[:, 0].numpy(), minlength=vocab)
    assert _statistics.chi_square_test(counts, p) > 1e-4


def test_numpy_inputs_give_numpy_outputs() -> None:
    output = vllm.rejection_sample(
        draft_token_ids=np.array([1, 2]), num_draft_tokens=[2], max_spec_len=3,
        cu_num_draft_tokens=np.array([2]), draft_probs=None,
        target_logits=np.eye(4)[[1, 2]] * 50, bonus_token_ids=np.array([[3]]),
        sampling_metadata=greedy_metadata(),
    )
    assert isinstance(output, np.ndarray) and output.dtype == np.int32
    assert output.tolist() == [[1, 2, 3, -1]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cu_num_draft_tokens": torch.tensor([2, 2])}, "cu_num_draft_tokens"),
        ({"max_spec_len": 1}, "max_spec_len"),
    ],
)
def test_inconsistent_metadata_is_refused(change: dict, message: str) -> None:
    arguments = batch([[1, 2], [3]])
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
