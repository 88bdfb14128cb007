"""``specdec_np.adapters.jax``: the library's keywords inside ``jax.jit``, the same tokens
as the NumPy call on the same values, static output shapes, JAX's integer dtypes, explicit
uniforms, and a module that imports without JAX."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import registry

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from specdec_np.adapters import jax as specdec_jax  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
V = 10
COUNTS = [3, 0, 2, 1]
MAX_SPEC_LEN = 5


def batch(seed: int) -> dict[str, Any]:
    """A ragged batch in float32 NumPy, with float32 uniforms of the static width."""
    rng = np.random.default_rng(seed)
    total, size = sum(COUNTS), len(COUNTS)
    return {
        "draft_token_ids": rng.integers(0, V, total).astype(np.int32),
        "target_logits": (2 * rng.normal(size=(total + size, V))).astype(np.float32),
        "draft_logits": (2 * rng.normal(size=(total, V))).astype(np.float32),
        "temperature": np.array([0.9, 1.0, 0.0, 1.4], dtype=np.float32),
        "uniforms": rng.random((size, MAX_SPEC_LEN + 2)).astype(np.float32),
    }


def library_call(arrays: dict[str, Any], method: str) -> specdec_np.VerificationResult:
    """The NumPy call on the same values (uniforms cut to the library's width)."""
    width = max(COUNTS) + 2
    return specdec_np.verify_ragged(
        num_draft_tokens=COUNTS, method=method,
        **{**arrays, "uniforms": arrays["uniforms"][:, :width].astype(np.float64)},
    )


@pytest.mark.parametrize("method", registry.names())
def test_jitted_verify_ragged_equals_the_numpy_call(method: str) -> None:
    arrays = batch(0)

    @jax.jit
    def step(arrays: dict[str, Any]) -> Any:
        return specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, method=method, **arrays
        )

    result = step({name: jnp.asarray(value) for name, value in arrays.items()})
    expected = library_call(arrays, method)
    width = expected.output_token_ids.shape[1]
    tokens = np.asarray(result.output_token_ids)
    assert tokens.shape == (len(COUNTS), MAX_SPEC_LEN + 1)
    np.testing.assert_array_equal(tokens[:, :width], expected.output_token_ids)
    assert (tokens[:, width:] == -1).all()
    np.testing.assert_array_equal(result.accepted_lengths, expected.accepted_lengths)
    np.testing.assert_array_equal(result.num_accepted, expected.num_accepted)
    assert int(result.num_draft_tokens) == sum(COUNTS)
    assert isinstance(result.output_token_ids, jax.Array)


def test_counts_may_be_traced_and_the_same_key_gives_the_same_tokens() -> None:
    arrays = {name: jnp.asarray(value) for name, value in batch(1).items()}
    del arrays["uniforms"]

    @jax.jit
    def step(counts: Any, key: Any, arrays: dict[str, Any]) -> Any:
        uniforms = jax.random.uniform(key, (len(COUNTS), MAX_SPEC_LEN + 2))
        return specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=counts, uniforms=uniforms, **arrays
        ).output_token_ids

    counts = jnp.asarray(COUNTS)
    first = step(counts, jax.random.key(3), arrays)
    np.testing.assert_array_equal(first, step(counts, jax.random.key(3), arrays))
    draws = {tuple(np.asarray(step(counts, jax.random.key(seed), arrays))[0]) for seed in range(8)}
    assert len(draws) > 1, "the key changed nothing: the uniforms are not used"


def test_integer_dtypes_follow_jax() -> None:
    arrays = {name: jnp.asarray(value) for name, value in batch(2).items()}
    result = specdec_jax.verify_ragged(
        max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **arrays
    )
    assert result.output_token_ids.dtype == jnp.int32  # without 64-bit mode
    tokens = specdec_jax.sample_tokens(logits=arrays["target_logits"], temperature=0.0)
    assert tokens.dtype == jnp.int32
    with jax.enable_x64(True):
        wide = specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **arrays
        )
        assert wide.output_token_ids.dtype == jnp.int64
    np.testing.assert_array_equal(wide.output_token_ids, result.output_token_ids)


def test_jitted_sample_tokens_equals_the_numpy_call() -> None:
    arrays = batch(4)
    logits = arrays["target_logits"]
    uniforms = np.random.default_rng(5).random(len(logits)).astype(np.float32)
    temperature = np.linspace(0.0, 1.5, len(logits)).astype(np.float32)

    @jax.jit
    def draw(logits: Any, temperature: Any, uniforms: Any) -> Any:
        return specdec_jax.sample_tokens(
            logits=logits, temperature=temperature, top_p=0.9, uniforms=uniforms
        )

    found = draw(jnp.asarray(logits), jnp.asarray(temperature), jnp.asarray(uniforms))
    expected = specdec_np.sample_tokens(
        logits=logits, temperature=temperature, top_p=0.9, uniforms=uniforms
    )
    np.testing.assert_array_equal(found, expected)
    assert found.shape == (len(logits),)


def test_jitted_sample_tokens_returns_the_drawn_probabilities() -> None:
    arrays = batch(7)
    logits = arrays["target_logits"]
    uniforms = np.random.default_rng(8).random(len(logits)).astype(np.float32)
    temperature = np.linspace(0.0, 1.5, len(logits)).astype(np.float32)

    @jax.jit
    def draw(logits: Any, temperature: Any, uniforms: Any) -> Any:
        return specdec_jax.sample_tokens(
            logits=logits, temperature=temperature, top_k=4, uniforms=uniforms,
            return_probs=True,
        )  # fmt: skip

    token_ids, probs = draw(jnp.asarray(logits), jnp.asarray(temperature), jnp.asarray(uniforms))
    expected_ids, expected = specdec_np.sample_tokens(
        logits=logits, temperature=temperature, top_k=4, uniforms=uniforms, return_probs=True
    )
    np.testing.assert_array_equal(token_ids, expected_ids)
    # JAX's default float dtype: float32 unless 64-bit mode is on.
    np.testing.assert_array_equal(probs, expected.astype(probs.dtype))
    assert probs.dtype == jax.dtypes.canonicalize_dtype(np.float64)


def test_bfloat16_rows_inside_jit_are_read_as_float32() -> None:
    arrays = {name: jnp.asarray(value) for name, value in batch(6).items()}
    half = {**arrays, "target_logits": arrays["target_logits"].astype(jnp.bfloat16),
            "draft_logits": arrays["draft_logits"].astype(jnp.bfloat16)}
    rounded = {**arrays, "target_logits": half["target_logits"].astype(jnp.float32),
               "draft_logits": half["draft_logits"].astype(jnp.float32)}

    @jax.jit
    def step(arrays: dict[str, Any]) -> Any:
        return specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **arrays
        ).output_token_ids

    np.testing.assert_array_equal(step(half), step(rounded))


def test_vmap_verifies_each_example() -> None:
    examples = [batch(seed) for seed in (7, 8)]
    stacked = {name: jnp.stack([jnp.asarray(e[name]) for e in examples]) for name in examples[0]}

    def step(arrays: dict[str, Any]) -> Any:
        return specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **arrays
        ).output_token_ids

    found = jax.jit(jax.vmap(step))(stacked)
    for index, arrays in enumerate(examples):
        expected = library_call(arrays, "rejection").output_token_ids
        np.testing.assert_array_equal(np.asarray(found[index])[:, : expected.shape[1]], expected)


def test_sampled_requests_without_uniforms_are_refused() -> None:
    arrays = {name: jnp.asarray(value) for name, value in batch(9).items()}
    del arrays["uniforms"]
    # Known while tracing: no temperature means every request is sampled.
    with pytest.raises(ValueError, match="uniforms are needed for sampled requests"):
        specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS,
            **{**arrays, "temperature": None},
        )
    # Known only when it runs: a traced temperature.
    with pytest.raises(Exception, match="uniforms are needed for sampled requests"):
        jax.jit(lambda a: specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **a))(arrays)
    # Greedy requests draw nothing: no uniforms needed.
    greedy = {**arrays, "temperature": jnp.zeros(len(COUNTS))}
    result = jax.jit(lambda a: specdec_jax.verify_ragged(
        max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, **a))(greedy)
    assert result.output_token_ids.shape == (len(COUNTS), MAX_SPEC_LEN + 1)
    with pytest.raises(ValueError, match="uniforms are needed"):
        specdec_jax.sample_tokens(logits=arrays["target_logits"])


def test_static_arguments_are_checked_while_tracing() -> None:
    arrays = {name: jnp.asarray(value) for name, value in batch(10).items()}
    with pytest.raises(TypeError, match="max_spec_len must be an int"):
        specdec_jax.verify_ragged(max_spec_len=True, num_draft_tokens=COUNTS, **arrays)
    with pytest.raises(ValueError, match="unknown|must be one of"):
        specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS, method="nope", **arrays
        )
    # Too narrow for the drafts: refused when it runs, with the library's words.
    with pytest.raises(Exception, match="max_spec_len must be at least the most drafts"):
        specdec_jax.verify_ragged(max_spec_len=2, num_draft_tokens=COUNTS, **arrays)
    # The library's own checks reach the caller.
    with pytest.raises(Exception, match="draft_token_ids must lie in"):
        specdec_jax.verify_ragged(
            max_spec_len=MAX_SPEC_LEN, num_draft_tokens=COUNTS,
            **{**arrays, "draft_token_ids": arrays["draft_token_ids"] + V},
        )


def test_an_empty_batch() -> None:
    result = specdec_jax.verify_ragged(
        max_spec_len=3, num_draft_tokens=[], draft_token_ids=jnp.zeros(0, jnp.int32),
        target_logits=jnp.zeros((0, V)), temperature=0.0,
    )
    assert result.output_token_ids.shape == (0, 4)


def test_the_module_imports_without_jax_and_says_so_when_called() -> None:
    code = (
        "import sys; sys.modules['jax'] = None\n"
        "from specdec_np.adapters import jax as adapter\n"
        "try:\n"
        "    adapter.sample_tokens(logits=[[0.0, 1.0]], temperature=0.0)\n"
        "except ImportError as error:\n"
        "    print('refused:', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "refused: specdec_np.adapters.jax needs JAX" in done.stdout
