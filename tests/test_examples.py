"""The runnable integrations of ``examples/`` (docs/semantics.md, engines): each runs here.

* ``numpy_engine_loop.py``: greedy requests, alone or in a mixed ragged batch, emit what
  plain greedy decoding emits; the caches hold exactly the states of a prefix of the text;
  every registry verifier drives the loop.
* ``vllm_v1_batch.py`` (skipped without torch): vLLM's output form, the greedy rule, the
  seeded request reproducible.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from specdec_np import registry

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the folder is not a package)."""
    module_name = f"specdec_np_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# -- the NumPy engine loop -------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> ModuleType:
    return load_example("numpy_engine_loop")


@pytest.mark.parametrize("max_drafts", [[4, 1, 0, 6], [2, 2, 2, 2]])
def test_greedy_loop_equals_plain_greedy_decoding(loop: ModuleType, max_drafts) -> None:
    requests, stats, _ = loop.run([0.0] * len(max_drafts), max_drafts, max_new_tokens=30)
    for request in requests:
        prompt = request.tokens[: request.num_prompt_tokens]
        assert request.tokens == loop.greedy_reference(prompt, 30)
    assert stats.accepted_tokens > 0, "the draft never agreed: the loop tested no rollback"


def test_greedy_requests_in_a_mixed_batch_equal_plain_greedy_decoding(loop) -> None:
    temperatures = [0.0, 1.0, 0.7, 0.0, 1.3]
    requests, stats, _ = loop.run(temperatures, [4, 3, 0, 2, 5], max_new_tokens=25)
    for request in requests:
        assert len(request.tokens) == request.num_prompt_tokens + 25
        assert all(0 <= token < loop.VOCAB_SIZE for token in request.tokens)
        if request.temperature == 0:
            prompt = request.tokens[: request.num_prompt_tokens]
            assert request.tokens == loop.greedy_reference(prompt, 25)
    assert stats.emitted_tokens == 5 * 25


@pytest.mark.parametrize("method", registry.names())
def test_caches_hold_exactly_a_prefix_of_the_text(loop: ModuleType, method: str) -> None:
    requests, stats, verifier = loop.run([0.0, 1.0, 0.8], [3, 5, 2], 20, method=method)
    target, draft = loop.make_models(0)
    for request in requests:
        for model, cache in ((target, request.target_cache), (draft, request.draft_cache)):
            assert cache.length <= len(request.tokens)
            fresh = loop.StateCache()
            model.forward(fresh, request.tokens[: cache.length])
            # Same operations in the same order: the same bits, or a stale state survived.
            np.testing.assert_array_equal(np.array(cache.states), np.array(fresh.states))
    assert verifier.metrics.drafted == stats.draft_tokens
    assert verifier.metrics.accepted == stats.accepted_tokens
    assert verifier.metrics.emitted == stats.emitted_tokens


def test_the_loop_script_runs(loop: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    loop.main(["--tokens", "12"])
    assert "verifier calls" in capsys.readouterr().out


# -- the vLLM v1 batch -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_example() -> ModuleType:
    pytest.importorskip("torch")
    return load_example("vllm_v1_batch")


def _greedy_tokens(batch: dict, request: int) -> list[int]:
    """vLLM's greedy rule for one request: drafts while they are the argmax, then the
    argmax at the first mismatch, or the bonus token when every draft matched."""
    start = sum(batch["num_draft_tokens"][:request])
    count = batch["num_draft_tokens"][request]
    rows = batch["target_logits"][start : start + count]
    drafts = batch["draft_token_ids"][start : start + count].tolist()
    tokens = []
    for row, draft in zip(rows, drafts):
        best = int(row.argmax())
        tokens.append(best)
        if best != draft:
            return tokens
    return tokens + [int(batch["bonus_token_ids"][request, 0])]


def test_the_vllm_batches_give_vllms_output(vllm_example: ModuleType) -> None:
    import torch

    for name, (batch, output) in vllm_example.run().items():
        assert output.dtype == torch.int32, name
        assert tuple(output.shape) == (len(batch["num_draft_tokens"]), batch["max_spec_len"] + 1)
        for request, tokens in enumerate(vllm_example.parse_output(output)):
            count = batch["num_draft_tokens"][request]
            assert 1 <= len(tokens) <= count + 1
            assert all(0 <= token < vllm_example.VOCAB_SIZE for token in tokens)
            # The accepted drafts are the request's own drafts.
            start = sum(batch["num_draft_tokens"][:request])
            accepted = batch["draft_token_ids"][start : start + len(tokens) - 1].tolist()
            assert tokens[:-1] == accepted
    mixed, mixed_output = vllm_example.run()["mixed"]
    assert vllm_example.parse_output(mixed_output)[0] == _greedy_tokens(mixed, 0)
    greedy, greedy_output = vllm_example.run()["greedy"]
    for request in range(2):
        assert vllm_example.parse_output(greedy_output)[request] == _greedy_tokens(greedy, request)


def test_the_seeded_vllm_request_is_reproducible(vllm_example: ModuleType) -> None:
    first = vllm_example.run(seed=3)["mixed"][1]
    second = vllm_example.run(seed=3)["mixed"][1]
    assert first[3].tolist() == second[3].tolist()  # request 3 draws from its generator


def test_the_vllm_script_runs(vllm_example, capsys: pytest.CaptureFixture[str]) -> None:
    vllm_example.main()
    assert "new tokens per request" in capsys.readouterr().out
