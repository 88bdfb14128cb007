"""A NumPy-only speculative-decoding engine loop around :class:`specdec_np.EngineVerifier`.

What an engine does around the verifier, in one file and nothing but NumPy:

* two toy models, a target and a cheaper draft (recurrent networks with random weights; the
  draft's are the target's plus noise, so that it agrees with the target most of the time),
  each with a per-sequence cache of its states, the stand-in for a KV cache;
* a **ragged batch**: every request drafts its own number of tokens ``k_b`` (one request
  never drafts, the others draft fewer near the end of their budget), greedy and sampled
  requests in the same call;
* the flat layout of :func:`specdec_np.verify_ragged`: ``num_draft_tokens [B]``,
  ``draft_token_ids [T]``, ``target_logits [T + B, V]`` (request ``b`` owns ``k_b + 1``
  consecutive rows: its draft positions, then its bonus position), ``draft_logits [T, V]``;
* the **cache rollback** after verification: each cache keeps the states of the tokens that
  were accepted, and the states computed for rejected drafts are dropped.

Cache bookkeeping, the invariant every step relies on: a cache holds the states of a
prefix of its sequence, ``cache.length <= len(sequence)``.  Before a model runs on a request
it is fed ``sequence[cache.length:]`` (the tokens it has not seen, at least the last
emitted one) and then the drafts.  After verification the sequence grows by the accepted
drafts and one new token, and each cache is truncated to at most ``len(old sequence) +
accepted`` states: the states of the accepted drafts are kept (they were computed from the
right prefix), the rest are thrown away.  The new token is fed at the next step.

Run it: ``python examples/numpy_engine_loop.py`` (``--help`` for the options).  With every
request greedy the output equals plain greedy decoding token for token; that and the caches'
consistency are what ``tests/project/test_examples.py`` checks.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import numpy as np

import specdec_np

VOCAB_SIZE = 64
HIDDEN_SIZE = 24


class ToyModel:
    """A recurrent language model: ``h_t = tanh(A h_{t-1} + E[x_t])``, ``logits_t = W h_t``.

    Parameters
    ----------
    weights : tuple of float64 arrays
        ``A [H, H]``, ``E [V, H]`` and ``W [H, V]``.
    """

    def __init__(self, weights: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.recurrence, self.embedding, self.output = weights

    def forward(self, cache: StateCache, tokens: list[int]) -> np.ndarray:
        """Feed ``tokens`` after the cached states, appending a state per token.

        Parameters
        ----------
        cache : StateCache
            The sequence's cache; it grows by ``len(tokens)`` states.
        tokens : list of int
            The tokens to feed, in order.

        Returns
        -------
        float32 [len(tokens), V]
            Row ``i``: the logits of the token after ``tokens[i]``.
        """
        rows = np.empty((len(tokens), VOCAB_SIZE), dtype=np.float32)
        state = cache.last()
        for i, token in enumerate(tokens):
            state = np.tanh(self.recurrence @ state + self.embedding[token])
            cache.append(state)
            rows[i] = state @ self.output
        return rows


@dataclass
class StateCache:
    """One sequence's cached states (the stand-in for its KV cache), one per fed token."""

    states: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        """The number of tokens whose state is cached (a prefix of the sequence)."""
        return len(self.states)

    def last(self) -> np.ndarray:
        """The state after the cached prefix (zeros for an empty cache)."""
        return self.states[-1] if self.states else np.zeros(HIDDEN_SIZE)

    def append(self, state: np.ndarray) -> None:
        """Cache the state of the next token."""
        self.states.append(state)

    def truncate(self, length: int) -> None:
        """Keep the states of the first ``length`` tokens at most (the rollback)."""
        del self.states[length:]


def make_models(seed: int = 0, draft_noise: float = 0.15) -> tuple[ToyModel, ToyModel]:
    """A target and a draft whose weights are the target's plus ``draft_noise`` x normals.

    Parameters
    ----------
    seed : int
        Seed of the weights.
    draft_noise : float
        How far the draft is from the target (0: the same model).

    Returns
    -------
    tuple of ToyModel
        ``(target, draft)``.
    """
    rng = np.random.default_rng(seed)
    target = (
        rng.normal(size=(HIDDEN_SIZE, HIDDEN_SIZE)) / np.sqrt(HIDDEN_SIZE),
        rng.normal(size=(VOCAB_SIZE, HIDDEN_SIZE)),
        2.5 * rng.normal(size=(HIDDEN_SIZE, VOCAB_SIZE)),
    )
    draft = tuple(w + draft_noise * rng.normal(size=w.shape) * w.std() for w in target)
    return ToyModel(target), ToyModel(draft)  # type: ignore[arg-type]


@dataclass
class Request:
    """One request of the batch: its sequence, sampling and speculation settings, caches."""

    tokens: list[int]
    max_new_tokens: int
    temperature: float
    max_drafts: int
    num_prompt_tokens: int = 0
    target_cache: StateCache = field(default_factory=StateCache)
    draft_cache: StateCache = field(default_factory=StateCache)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.tokens)

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.num_prompt_tokens + self.max_new_tokens - len(self.tokens)


@dataclass
class LoopStats:
    """What the loop counts: verifier calls (one target pass each), the requests in them,
    and the tokens emitted, drafted and accepted."""

    steps: int = 0
    request_steps: int = 0
    emitted_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


def engine_step(
    requests: list[Request],
    target: ToyModel,
    draft: ToyModel,
    verifier: specdec_np.EngineVerifier,
    rng: np.random.Generator,
    stats: LoopStats,
) -> None:
    """Draft, score, verify and roll the caches back, for every unfinished request.

    Parameters
    ----------
    requests : list of Request
        The batch; finished requests are skipped.
    target, draft : ToyModel
        The models.
    verifier : EngineVerifier
        Verifies the flat batch.
    rng : numpy.random.Generator
        Source of the draft model's draws.
    stats : LoopStats
        Updated in place.
    """
    active = [request for request in requests if request.remaining > 0]
    if not active:
        return
    # 1. Ragged drafting: a request drafts at most max_drafts tokens, and never more than it
    #    may still emit minus the one token every step emits anyway.
    counts = [min(request.max_drafts, request.remaining - 1) for request in active]
    draft_ids: list[int] = []
    draft_rows: list[np.ndarray] = []
    for request, count in zip(active, counts):
        if count == 0:
            continue  # the draft catches up on the tokens it missed when it next drafts
        unseen = request.tokens[request.draft_cache.length :]
        rows = draft.forward(request.draft_cache, unseen)[-1:]
        for position in range(count):
            # Drawn from the processed draft law (the verifier processes draft_logits with
            # the same temperature); temperature 0 is the argmax.
            token = int(
                specdec_np.sample_tokens(
                    logits=rows, temperature=request.temperature, generator=rng
                )[0]
            )
            draft_ids.append(token)
            draft_rows.append(rows[0])
            if position + 1 < count:
                rows = draft.forward(request.draft_cache, [token])
    # 2. One target pass per request over its unseen tokens and its drafts: the last
    #    k_b + 1 rows are its draft positions and its bonus position.
    target_rows = []
    start = 0
    for request, count in zip(active, counts):
        unseen = request.tokens[request.target_cache.length :]
        drafts = draft_ids[start : start + count]
        start += count
        target_rows.append(target.forward(request.target_cache, unseen + drafts)[-count - 1 :])
    # 3. The flat batch, verified in one call (greedy and sampled requests mixed).
    result = verifier(
        num_draft_tokens=counts,
        draft_token_ids=np.array(draft_ids, dtype=np.int64),
        target_logits=np.concatenate(target_rows),
        draft_logits=(
            np.stack(draft_rows) if draft_rows else np.empty((0, VOCAB_SIZE), np.float32)
        ),
        temperature=[request.temperature for request in active],
    )
    # 4. Emit, and roll both caches back to the accepted prefix.
    for b, request in enumerate(active):
        accepted = int(result.accepted_lengths[b])
        kept = len(request.tokens) + accepted
        request.tokens.extend(int(t) for t in result.output_token_ids[b, : accepted + 1])
        request.target_cache.truncate(kept)
        request.draft_cache.truncate(kept)
        stats.emitted_tokens += accepted + 1
        stats.accepted_tokens += accepted
    stats.draft_tokens += sum(counts)
    stats.steps += 1
    stats.request_steps += len(active)


def make_requests(
    temperatures: list[float], max_new_tokens: int, max_drafts: list[int], seed: int = 1
) -> list[Request]:
    """Requests with random prompts of 3 to 8 tokens.

    Parameters
    ----------
    temperatures : list of float
        One per request (0: greedy).
    max_new_tokens : int
        Tokens each request generates.
    max_drafts : list of int
        The most drafts each request proposes per step (0: no speculation).
    seed : int
        Seed of the prompts.

    Returns
    -------
    list of Request
    """
    rng = np.random.default_rng(seed)
    return [
        Request(
            tokens=rng.integers(0, VOCAB_SIZE, size=int(rng.integers(3, 9))).tolist(),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            max_drafts=drafts,
        )
        for temperature, drafts in zip(temperatures, max_drafts)
    ]


def run(
    temperatures: list[float],
    max_drafts: list[int],
    max_new_tokens: int = 40,
    method: str = "rejection",
    seed: int = 0,
) -> tuple[list[Request], LoopStats, specdec_np.EngineVerifier]:
    """Generate for a batch of requests with speculative decoding.

    Parameters
    ----------
    temperatures : list of float
        One per request (0: greedy).
    max_drafts : list of int
        The most drafts per step of each request.
    max_new_tokens : int
        Tokens each request generates.
    method : str
        The verifier of sampled requests (a ``specdec_np.registry`` name).
    seed : int
        Seed of the models, the prompts, the draft draws and the verifier.

    Returns
    -------
    tuple
        ``(requests, stats, verifier)``: the finished requests, the loop's counts and the
        verifier (its ``metrics``).
    """
    target, draft = make_models(seed)
    requests = make_requests(temperatures, max_new_tokens, max_drafts, seed + 1)
    verifier = specdec_np.EngineVerifier(method, seed=seed)
    rng = np.random.default_rng(seed + 2)
    stats = LoopStats()
    while any(request.remaining > 0 for request in requests):
        engine_step(requests, target, draft, verifier, rng, stats)
    return requests, stats, verifier


def greedy_reference(prompt: list[int], max_new_tokens: int, seed: int = 0) -> list[int]:
    """Plain greedy decoding with the target alone, one token per step.

    Parameters
    ----------
    prompt : list of int
        The prompt.
    max_new_tokens : int
        Tokens to generate.
    seed : int
        Seed of the models (as in :func:`run`).

    Returns
    -------
    list of int
        The prompt and the generated tokens.
    """
    target, _ = make_models(seed)
    tokens = list(prompt)
    cache = StateCache()
    logits = target.forward(cache, tokens)[-1]
    for _ in range(max_new_tokens):
        tokens.append(int(np.argmax(logits)))
        logits = target.forward(cache, tokens[-1:])[-1]
    return tokens


def main(argv: list[str] | None = None) -> None:
    """Run the loop and print each request's tokens and the acceptance figures.

    Parameters
    ----------
    argv : list of str, optional
        The command line (``sys.argv[1:]`` when None).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--method", default="rejection", choices=specdec_np.registry.names())
    parser.add_argument("--tokens", type=int, default=40, help="new tokens per request")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    temperatures = [0.0, 1.0, 0.7, 0.0, 1.0]
    max_drafts = [4, 3, 0, 2, 5]
    requests, stats, verifier = run(
        temperatures, max_drafts, arguments.tokens, arguments.method, arguments.seed
    )
    for request in requests:
        print(
            f"T={request.temperature:.1f} k<={request.max_drafts}: "
            f"{request.tokens[request.num_prompt_tokens:]}"
        )
    print(
        f"{stats.steps} verifier calls, {stats.emitted_tokens} tokens emitted "
        f"({stats.emitted_tokens / stats.request_steps:.2f} per request per call), "
        f"{stats.accepted_tokens} of {stats.draft_tokens} drafts accepted "
        f"(metrics.acceptance_rate {verifier.metrics.acceptance_rate:.3f})"
    )


if __name__ == "__main__":
    main()
