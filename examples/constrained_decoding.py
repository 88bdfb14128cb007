"""Speculative decoding under a penalty, a grammar bitmask and a stop token, in NumPy.

The settings an engine's requests carry depend on the text before each row, and inside a
draft chain that text includes the drafts before the row.  This loop hands
:func:`specdec_np.verify_ragged` the rows and the settings and lets the verifier apply them
per draft position:

* a **repetition penalty** over the prompt and the output so far (the drafts before each
  row included, which the verifier adds itself from ``output_token_ids`` and the drafts);
* a **grammar** in xgrammar's packed bitmask form (``int32 [rows, ceil(V / 32)]``), here
  "a token's parity differs from the previous token's", computed by the engine along the
  draft path, one mask per target row (the bonus row included);
* a **stop token** that ends the run (kept), with a minimum length before which it is
  masked, and the remaining budget as ``max_tokens``.

With every request greedy, the output equals plain greedy decoding under the same settings
token for token (:func:`greedy_reference`, one :func:`specdec_np.processed_probs` row per
token); ``tests/project/test_examples.py`` checks that.  Run it: ``python
examples/constrained_decoding.py``.
"""

from __future__ import annotations

import argparse

import numpy as np

import specdec_np

VOCAB_SIZE = 32
STOP_TOKEN = 0
MIN_TOKENS = 4
REPETITION_PENALTY = 1.4
WORDS = (VOCAB_SIZE + 31) // 32


class ToyModel:
    """Logits of the next token from the last token and the position: a stand-in for a
    language model (the draft's weights are the target's plus noise)."""

    def __init__(self, seed: int, noise: float = 0.0) -> None:
        rng = np.random.default_rng(seed)
        self.by_token = rng.normal(0, 2, (VOCAB_SIZE, VOCAB_SIZE))
        self.by_position = rng.normal(0, 1, (8, VOCAB_SIZE))
        if noise:
            self.by_token = self.by_token + np.random.default_rng(seed + 1).normal(
                0, noise, self.by_token.shape
            )

    def logits(self, context: list[int]) -> np.ndarray:
        row = self.by_token[context[-1]] + self.by_position[len(context) % 8]
        row[STOP_TOKEN] += 0.25 * len(context)  # the longer the text, the likelier the end
        return row.astype(np.float32)


def grammar_mask(previous_token: int) -> np.ndarray:
    """int32 [ceil(V / 32)]: the tokens whose parity differs from ``previous_token``'s."""
    mask = np.zeros(WORDS, dtype=np.int64)
    for token in range(VOCAB_SIZE):
        if token % 2 != previous_token % 2:
            mask[token // 32] |= 1 << (token % 32)
    return mask.astype(np.uint32).view(np.int32)


def _settings(prompt: list[int], output: list[int], budget: int) -> dict:
    return dict(
        prompt_token_ids=[prompt], output_token_ids=[output],
        repetition_penalty=REPETITION_PENALTY, stop_token_ids=[[STOP_TOKEN]],
        min_tokens=MIN_TOKENS, max_tokens=budget,
    )


def greedy_reference(target: ToyModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding under the same settings, one token at a time."""
    output: list[int] = []
    while len(output) < max_new_tokens:
        context = prompt + output
        settings = _settings(prompt, output, 1)
        settings.pop("max_tokens")
        law = specdec_np.processed_probs(
            target.logits(context)[None, :], temperature=0.0,
            token_bitmask=grammar_mask(context[-1])[None, :], **settings,
        )
        output.append(int(np.argmax(law[0])))
        if output[-1] == STOP_TOKEN:
            break
    return output


def speculative(
    target: ToyModel, draft: ToyModel, prompt: list[int], max_new_tokens: int, k: int
) -> tuple[list[int], int]:
    """Greedy speculative decoding: the draft proposes ``k`` tokens (its own greedy choice
    under the grammar), the target's rows along the draft path and their masks go to the
    verifier with the settings; returns the output and the drafts accepted."""
    output: list[int] = []
    accepted = 0
    while len(output) < max_new_tokens:
        context = prompt + output
        drafts: list[int] = []
        for _ in range(k):
            row = draft.logits(context + drafts)
            allowed = [t for t in range(VOCAB_SIZE) if t % 2 != (context + drafts)[-1] % 2]
            drafts.append(max(allowed, key=lambda t: row[t]))
        paths = [context + drafts[:i] for i in range(k + 1)]
        result = specdec_np.verify_ragged(
            num_draft_tokens=[k], draft_token_ids=drafts,
            target_logits=np.stack([target.logits(path) for path in paths]),
            token_bitmask=np.stack([grammar_mask(path[-1]) for path in paths]),
            temperature=0.0, **_settings(prompt, output, max_new_tokens - len(output)),
        )
        emitted = [int(t) for t in result.output_token_ids[0] if t >= 0]
        output += emitted
        accepted += int(result.accepted_lengths[0])
        if bool(result.finished[0]):
            break
    return output, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--k", type=int, default=4)
    arguments = parser.parse_args()
    target, draft = ToyModel(0), ToyModel(0, noise=0.5)
    for prompt in ([5, 8, 3], [12, 1], [7]):
        output, accepted = speculative(target, draft, prompt, arguments.tokens, arguments.k)
        plain = greedy_reference(target, prompt, arguments.tokens)
        print(f"prompt {prompt}: {len(output)} tokens (stopped: "
              f"{output[-1:] == [STOP_TOKEN]}), {accepted} drafts accepted, equal to plain "
              f"greedy decoding: {output == plain}")


if __name__ == "__main__":
    main()
