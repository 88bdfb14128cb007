"""A jitted JAX speculative-decoding loop around :mod:`specdec_np.adapters.jax`.

The whole loop is one ``jax.jit`` computation (a ``lax.fori_loop`` over steps):

* two toy recurrent models in ``jax.numpy``, a target and a cheaper draft (the target's
  weights plus noise, so that they agree most of the time): ``h_t = tanh(A h_{t-1} +
  E[x_t])``, ``logits_t = W h_t``; each sequence's state is the stand-in for a KV cache;
* every step, each request drafts ``k`` tokens from the draft model (sampled at its
  temperature, or the argmax when the temperature is 0), the target scores ``[last token,
  d_0 .. d_{k-1}]`` in one pass (``k + 1`` rows: the ``k`` draft positions and the bonus
  position), and :func:`specdec_np.adapters.jax.verify_ragged` verifies the flat batch
  inside the jitted step, with uniforms from the step's key (float32, JAX's default);
* the **cache rollback**: request ``b`` keeps ``accepted_lengths[b] + 1`` of the ``k + 1``
  states the pass made (the last token's and the accepted drafts'); the new token is fed
  at the next step.

Run it: ``python examples/jax_decode_loop.py`` (``--help`` for the options).  With every
request greedy the text equals plain greedy decoding with the target, token for token; that
is what ``tests/project/test_examples.py`` checks.
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specdec_np.adapters import jax as specdec_jax

VOCAB_SIZE = 32
HIDDEN_SIZE = 16


class Model(NamedTuple):
    """A recurrent language model's weights: ``A [H, H]``, ``E [V, H]`` and ``W [H, V]``."""

    recurrence: Any
    embedding: Any
    output: Any


def make_models(seed: int, draft_noise: float = 0.3) -> tuple[Model, Model]:
    """The target and the draft model (the target's weights plus noise)."""
    keys = jax.random.split(jax.random.key(seed), 6)
    target = Model(
        0.9 * jax.random.normal(keys[0], (HIDDEN_SIZE, HIDDEN_SIZE)) / HIDDEN_SIZE**0.5,
        jax.random.normal(keys[1], (VOCAB_SIZE, HIDDEN_SIZE)),
        3.0 * jax.random.normal(keys[2], (HIDDEN_SIZE, VOCAB_SIZE)) / HIDDEN_SIZE**0.5,
    )
    draft = Model(
        *(
            weights + draft_noise * weights.std() * jax.random.normal(key, weights.shape)
            for weights, key in zip(target, keys[3:])
        )
    )
    return target, draft


def feed(model: Model, state: Any, tokens: Any) -> tuple[Any, Any]:
    """Feed ``tokens [B, n]`` after ``state [B, H]``: the states after each token
    ``[B, n, H]`` and the logits of the token after each ``[B, n, V]``."""

    def one(carry: Any, token: Any) -> tuple[Any, Any]:
        carry = jnp.tanh(carry @ model.recurrence + model.embedding[token])
        return carry, carry

    _, states = jax.lax.scan(one, state, tokens.T)
    states = jnp.swapaxes(states, 0, 1)
    return states, states @ model.output


def choose(key: Any, logits: Any, temperature: Any) -> Any:
    """A token per row: drawn from ``softmax(logits / temperature)``, the argmax at 0."""
    safe = jnp.where(temperature > 0, temperature, 1.0)[:, None]
    drawn = jax.random.categorical(key, logits / safe)
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1))


class Decoding(NamedTuple):
    """The loop's carry: each request's text, its length, the last token and the two
    models' states after the text before it (the caches)."""

    tokens: Any  # [B, capacity]
    lengths: Any  # [B]
    target_state: Any  # [B, H]
    draft_state: Any  # [B, H]
    accepted: Any  # [B]: drafts accepted so far


def speculative_step(
    target: Model, draft: Model, decoding: Decoding, key: Any, temperature: Any, k: int
) -> Decoding:
    """One step: draft ``k`` tokens per request, score them, verify, roll the caches back."""
    batch = decoding.tokens.shape[0]
    rows = jnp.arange(batch)
    last = decoding.tokens[rows, decoding.lengths - 1]
    draft_key, verify_key = jax.random.split(key)

    # The draft: k tokens, each from the row of the token before it.
    def draft_one(carry: Any, step_key: Any) -> tuple[Any, Any]:
        state, token = carry
        states, logits = feed(draft, state, token[:, None])
        chosen = choose(step_key, logits[:, 0], temperature)
        return (states[:, 0], chosen), (chosen, logits[:, 0], states[:, 0])

    _, (drafts, draft_logits, draft_states) = jax.lax.scan(
        draft_one, (decoding.draft_state, last), jax.random.split(draft_key, k)
    )
    drafts, draft_logits = drafts.T, jnp.swapaxes(draft_logits, 0, 1)  # [B, k], [B, k, V]
    # The draft's state after its last draft too (kept when every draft is accepted).
    after_last, _ = feed(draft, draft_states[-1], drafts[:, -1:])
    draft_states = jnp.concatenate([jnp.swapaxes(draft_states, 0, 1), after_last], axis=1)

    # The target: one pass over [last, d_0 .. d_{k-1}] gives k + 1 rows per request, the k
    # draft positions and the bonus position: verify_ragged's [T + B, V] with T = B * k.
    fed = jnp.concatenate([last[:, None], drafts], axis=1)
    target_states, target_logits = feed(target, decoding.target_state, fed)

    result = specdec_jax.verify_ragged(
        max_spec_len=k,
        num_draft_tokens=[k] * batch,
        draft_token_ids=drafts.reshape(-1),
        target_logits=target_logits.reshape(batch * (k + 1), VOCAB_SIZE),
        draft_logits=draft_logits.reshape(batch * k, VOCAB_SIZE),
        temperature=temperature,
        uniforms=jax.random.uniform(verify_key, (batch, k + 2)),
    )
    accepted = result.accepted_lengths

    # Append the accepted drafts and the new token (the -1 after them are overwritten by
    # the next step), and keep the states of the last token and the accepted drafts.
    def append(text: Any, length: Any, output: Any) -> Any:
        return jax.lax.dynamic_update_slice(text, output.astype(text.dtype), (length,))

    return Decoding(
        tokens=jax.vmap(append)(decoding.tokens, decoding.lengths, result.output_token_ids),
        lengths=decoding.lengths + accepted + 1,
        target_state=target_states[rows, accepted],
        draft_state=draft_states[rows, accepted],
        accepted=decoding.accepted + accepted,
    )


def start(target: Model, draft: Model, prompts: Any, capacity: int) -> Decoding:
    """The carry after the prompts ``[B, n]``: both caches hold all of a prompt but its
    last token."""
    batch, prompt_length = prompts.shape
    tokens = jnp.zeros((batch, capacity), dtype=prompts.dtype).at[:, :prompt_length].set(prompts)
    empty = jnp.zeros((batch, HIDDEN_SIZE))
    states = [
        feed(model, empty, prompts[:, :-1])[0][:, -1] if prompt_length > 1 else empty
        for model in (target, draft)
    ]
    lengths = jnp.full(batch, prompt_length)
    return Decoding(tokens, lengths, states[0], states[1], jnp.zeros(batch, lengths.dtype))


def decode(
    prompts: Any, temperature: Any, key: Any, *, steps: int, k: int, seed: int = 0
) -> Decoding:
    """``steps`` speculative steps of ``k`` drafts for every request (jit-compatible)."""
    target, draft = make_models(seed)
    capacity = prompts.shape[1] + steps * (k + 1)
    decoding = start(target, draft, prompts, capacity)
    keys = jax.random.split(key, steps)

    def body(step: Any, carry: Decoding) -> Decoding:
        return speculative_step(target, draft, carry, keys[step], temperature, k)

    return jax.lax.fori_loop(0, steps, body, decoding)


#: The whole loop, compiled once per (steps, k, seed).
decode_jit = jax.jit(decode, static_argnames=("steps", "k", "seed"))


def _plain_greedy(prompts: Any, *, new_tokens: int, seed: int) -> Any:
    target, _ = make_models(seed)
    batch, prompt_length = prompts.shape
    tokens = jnp.zeros((batch, prompt_length + new_tokens), prompts.dtype)
    tokens = tokens.at[:, :prompt_length].set(prompts)
    states, logits = feed(target, jnp.zeros((batch, HIDDEN_SIZE)), prompts)

    def body(step: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        tokens, state, logits = carry
        chosen = jnp.argmax(logits, axis=-1).astype(tokens.dtype)
        tokens = tokens.at[:, prompt_length + step].set(chosen)
        states, next_logits = feed(target, state, chosen[:, None])
        return tokens, states[:, 0], next_logits[:, 0]

    return jax.lax.fori_loop(0, new_tokens, body, (tokens, states[:, -1], logits[:, -1]))[0]


#: Plain greedy decoding with the target, one token per step (the reference).
plain_greedy = jax.jit(_plain_greedy, static_argnames=("new_tokens", "seed"))


def main(argv: list[str] | None = None) -> None:
    """Run the loop on three requests and print what each emitted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--k", type=int, default=4, help="drafts per request and step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = jnp.asarray([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    temperature = jnp.asarray([0.0, 0.8, 1.0])  # request 0 greedy
    decoding = decode_jit(
        prompts, temperature, jax.random.key(args.seed), steps=args.steps, k=args.k
    )
    target_calls = args.steps
    for b in range(prompts.shape[0]):
        length = int(decoding.lengths[b])
        emitted = length - prompts.shape[1]
        print(
            f"request {b} (temperature {float(temperature[b])}): {emitted} tokens in "
            f"{target_calls} target calls ({emitted / target_calls:.2f} per call), "
            f"text {decoding.tokens[b, :length].tolist()}"
        )


if __name__ == "__main__":
    main()
