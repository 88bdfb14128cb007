"""The tree comparison behind ``specdec-np demo --tree``: a tree drafter against a chain of
the same node budget, on the demo's n-gram models and the same contexts.

The models, corpus, prompts and sampling cycle are those of :mod:`specdec_np._demo.chains`.  At
every decoding step each request gets, for every sampled tree method of
:data:`specdec_np.registry.TREE_METHODS`, two drafts of ``nodes`` nodes from the bigram
draft model:

* a **chain**: ``nodes`` tokens, each below the previous one;
* a **tree** of the shape :func:`specdec_np.best_first_tree` (EAGLE-2-like: the top-ranked
  continuations at each of the first levels, the top-ranked branch deepest).

Children are drafted as the method assumes (``registry.TreeMethod.drafting``): ``fixed``
takes the top-ranked tokens of the draft row, ``independent`` draws each child from the
request's processed draft law, ``without_replacement`` draws the siblings from it without
replacement (a sibling that the law cannot supply is dropped, with its subtree).  Greedy
requests draft the top-ranked tokens and are walked greedily.  The target scores the root
and every node in one call, and :func:`specdec_np.verify_tree` verifies each draft from the
target's logits with the request's temperature, top-k and top-p.

Every draft is verified on the **same context**; the sequences advance by the tree of the
first method.  Each method is lossless, so the context's law is the target's whichever
output advances it, and the chain and tree lengths are a paired comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import registry
from .._layouts.tree import verify_tree
from .._layouts.tree_builders import best_first_tree
from .._reference.chains import process_logits
from .chains import (
    DemoConfig,
    InterpolatedNGram,
    Sampling,
    _choose_prompts,
    build_corpus,
    build_models,
)

__all__ = ["SHAPES", "TreeDemoResult", "chain_parents", "run_tree_demo"]

#: The two drafts compared, same node budget.
SHAPES = ("chain", "tree")

# Per request: parents, tokens, each node's token path, draft rows [n, V].
_Drafted = tuple[list[list[int]], list[list[int]], list[list[tuple[int, ...]]], list[np.ndarray]]

def chain_parents(nodes: int) -> list[int]:
    """Parents of a chain of ``nodes`` nodes: ``[-1, 0, 1, ...]``."""
    return list(range(-1, nodes - 1))


@dataclass
class TreeDemoResult:
    """What a tree comparison measured.

    Attributes
    ----------
    config : DemoConfig
        ``k`` is the node budget of both drafts.
    methods : list of str
        The sampled tree methods compared, in registry order.
    shapes : dict
        Shape name -> parents of the template.
    accepted : dict
        ``(method, shape)`` -> accepted nodes of every verified request-step.
    drafted : dict
        ``(method, shape)`` -> drafted nodes of every verified request-step.
    target_calls : int
        Batched target calls: one per decoding step, each verifying every draft of every
        unfinished request.
    decode_seconds : float
    """

    config: DemoConfig
    methods: list[str]
    shapes: dict[str, list[int]]
    accepted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    drafted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    target_calls: int = 0
    decode_seconds: float = 0.0

    def tokens_per_request_step(self, method: str, shape: str) -> float:
        """Mean tokens emitted per request-step (one request in one batched target call):
        accepted nodes plus the final token."""
        return 1.0 + float(np.mean(self.accepted[method, shape]))

    def summary(self) -> dict[str, Any]:
        """The measurements as a JSON-ready dict."""
        rows = []
        for method in self.methods:
            chain = self.tokens_per_request_step(method, "chain")
            tree = self.tokens_per_request_step(method, "tree")
            accepted = {shape: self.accepted[method, shape] for shape in SHAPES}
            difference = np.subtract(accepted["tree"], accepted["chain"])
            rows.append(
                {
                    "method": method,
                    "chain_tokens_per_request_step": chain,
                    "tree_tokens_per_request_step": tree,
                    "gain": tree / chain,
                    "paired_difference": float(difference.mean()),
                    "paired_standard_error": float(
                        difference.std(ddof=1) / np.sqrt(difference.size)
                    )
                    if difference.size > 1
                    else float("nan"),
                    "chain_nodes_per_request_step": float(
                        np.mean(self.drafted[method, "chain"])
                    ),
                    "tree_nodes_per_request_step": float(np.mean(self.drafted[method, "tree"])),
                }
            )
        return {
            "versus": self.versus(),
            "node_budget": self.config.k,
            "batch": self.config.batch,
            "tokens_per_sequence": self.config.tokens,
            "seed": self.config.seed,
            "shapes": self.shapes,
            "target_calls": self.target_calls,
            "request_steps": len(next(iter(self.accepted.values()), [])),
            "decode_seconds": self.decode_seconds,
            "methods": rows,
        }


    def versus(self) -> list[dict[str, Any]]:
        """On the tree, each sequence-level method (traversal) against each token-level
        method that reads draft rows (SpecInfer, RRS): tokens per request-step, their
        paired difference per request-step (same contexts; the same drafts for the same
        drafting) with its standard error, and the relative gain with its standard error.

        Returns
        -------
        list of dict
            One per pair, in registry order.
        """
        entries = {method.name: method for method in registry.TREE_METHODS}
        rows = []
        for name in (m for m in self.methods if entries[m].sequence_level):
            for other in self.methods:
                baseline = entries[other]
                if baseline.sequence_level or not baseline.reads_draft_probs:
                    continue
                ours = np.asarray(self.accepted[name, "tree"], dtype=np.float64)
                theirs = np.asarray(self.accepted[other, "tree"], dtype=np.float64)
                difference = ours - theirs
                base = 1.0 + float(theirs.mean())
                error = (
                    float(difference.std(ddof=1) / np.sqrt(difference.size))
                    if difference.size > 1
                    else float("nan")
                )
                rows.append({
                    "method": name, "baseline": other,
                    "tokens_per_request_step": 1.0 + float(ours.mean()),
                    "baseline_tokens_per_request_step": base,
                    "paired_difference": float(difference.mean()),
                    "paired_standard_error": error,
                    "gain": float(difference.mean()) / base,
                    "gain_standard_error": error / base,
                })  # fmt: skip
        return rows


def _processed(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The request's law of a draft row (float64 [V])."""
    law = process_logits(
        logits[None, :].astype(np.float64),
        np.array([sampling.temperature]),
        np.array([sampling.top_k]),
        np.array([sampling.top_p]),
        np.zeros(1),
    )[0]
    return np.asarray(law, dtype=np.float64)


def _draw_children(
    logits: np.ndarray, count: int, drafting: str, sampling: Sampling, rng: np.random.Generator
) -> list[int]:
    """Up to ``count`` sibling tokens drafted from one draft row, as ``drafting`` says."""
    if sampling.greedy or drafting == "fixed":
        return [int(t) for t in np.argsort(-logits, kind="stable")[:count]]
    law = _processed(logits, sampling)
    if drafting == "independent":
        return [int(t) for t in rng.choice(law.shape[0], size=count, p=law / law.sum())]
    support = int(np.count_nonzero(law > 0))
    count = min(count, support)
    return [int(t) for t in rng.choice(law.shape[0], size=count, p=law / law.sum(), replace=False)]


def _draft_tree(
    draft: InterpolatedNGram,
    windows: np.ndarray,
    template: list[int],
    drafting: str,
    sampling: Sequence[Sampling],
    rng: np.random.Generator,
) -> _Drafted:
    """Draft one tree per request on the template shape.

    Returns, per request, the parents and tokens of the nodes that could be drafted (in
    template order, renumbered), each node's path of tokens, and its draft row ``[n, V]``.
    """
    batch = windows.shape[0]
    children: list[list[int]] = [[] for _ in range(len(template) + 1)]
    for node, parent in enumerate(template):
        children[parent + 1].append(node)
    parents: list[list[int]] = [[] for _ in range(batch)]
    tokens: list[list[int]] = [[] for _ in range(batch)]
    paths: list[list[tuple[int, ...]]] = [[] for _ in range(batch)]
    rows: list[list[np.ndarray]] = [[] for _ in range(batch)]
    # Template node -> index of the drafted node, per request; -1 is the root.
    placed: list[dict[int, int]] = [{-1: -1} for _ in range(batch)]
    frontier = [-1]
    while frontier:
        expand = [
            (b, t) for t in frontier for b in range(batch) if t in placed[b] and children[t + 1]
        ]
        if not expand:
            break
        histories = []
        for b, t in expand:
            path = () if t < 0 else paths[b][placed[b][t]]
            history = np.concatenate([windows[b], np.asarray(path, dtype=np.int64)])
            histories.append(history[-draft.context_length :])
        laws = draft.log_probs(np.stack(histories))
        for (b, t), logits in zip(expand, laws):
            kids = children[t + 1]
            drawn = _draw_children(logits, len(kids), drafting, sampling[b], rng)
            own = placed[b][t]
            prefix = () if t < 0 else paths[b][own]
            for kid, token in zip(kids, drawn):
                placed[b][kid] = len(tokens[b])
                parents[b].append(own)
                tokens[b].append(token)
                paths[b].append(prefix + (token,))
                rows[b].append(logits)
        frontier = [kid for t in frontier for kid in children[t + 1]]
    draft_rows = [
        np.stack(r) if r else np.zeros((0, draft.vocab_size), dtype=np.float32) for r in rows
    ]
    return parents, tokens, paths, draft_rows


def _verify(
    target: InterpolatedNGram,
    windows: np.ndarray,
    drafted: _Drafted,
    method: registry.TreeMethod,
    sampling: Sequence[Sampling],
    rng: np.random.Generator,
) -> Any:
    parents, tokens, paths, draft_rows = drafted
    histories = []
    for b in range(windows.shape[0]):
        for path in [(), *paths[b]]:
            history = np.concatenate([windows[b], np.asarray(path, dtype=np.int64)])
            histories.append(history[-target.context_length :])
    target_logits = target.log_probs(np.stack(histories))
    draft_logits = np.concatenate(draft_rows).astype(np.float32)
    return verify_tree(
        num_nodes=np.array([len(p) for p in parents], dtype=np.int64),
        tree_parents=np.array([x for p in parents for x in p], dtype=np.int64),
        draft_token_ids=np.array([x for t in tokens for x in t], dtype=np.int64),
        target_logits=target_logits,
        draft_logits=draft_logits if method.reads_draft_probs else None,
        method=method.name,
        temperature=np.array([s.temperature for s in sampling]),
        top_k=np.array([s.top_k for s in sampling], dtype=np.int64),
        top_p=np.array([s.top_p for s in sampling]),
        generator=rng,
    )


def run_tree_demo(
    config: DemoConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TreeDemoResult:
    """Decode with the demo's models, verifying a chain and a tree of ``config.k`` nodes
    for every sampled tree method at every step (the module docstring has the details).

    Parameters
    ----------
    config : DemoConfig, optional
        ``k`` is the node budget; ``verifier`` and ``drafter`` are not used.
    progress : callable, optional
        Called as ``progress(done, total)`` after each step with the generated token count.

    Returns
    -------
    TreeDemoResult
    """
    config = config or DemoConfig()
    corpus = build_corpus(config.vocab_size)
    target, draft = build_models(corpus)
    draft_seed, verifier_seed = np.random.SeedSequence(config.seed).spawn(2)
    draft_rng = np.random.default_rng(draft_seed)
    verifier_rng = np.random.default_rng(verifier_seed)
    methods = [method for method in registry.TREE_METHODS if method.stochastic]
    sampling = [config.sampling()[b] for b in range(config.batch)]
    shapes = {"chain": chain_parents(config.k), "tree": best_first_tree(config.k)}
    result = TreeDemoResult(config, [method.name for method in methods], shapes)
    for method in methods:
        for shape in SHAPES:
            result.accepted[method.name, shape] = []
            result.drafted[method.name, shape] = []
    B, N, P = config.batch, config.tokens, config.prompt_length
    context = max(target.context_length, draft.context_length)
    sequences = np.zeros((B, P + N + config.k + 1), dtype=np.int64)
    sequences[:, :P] = np.stack(_choose_prompts(corpus, B, P))
    lengths = np.full(B, P, dtype=np.int64)
    start = time.perf_counter()
    while True:
        rows = np.flatnonzero(lengths - P < N)
        if rows.size == 0:
            break
        windows = sequences[rows[:, None], lengths[rows, None] - context + np.arange(context)]
        row_sampling = [sampling[r] for r in rows]
        advance = None
        # Methods of the same drafting verify the same drafts (a paired comparison).
        drafts: dict[tuple[str | None, str], _Drafted] = {}
        for method in methods:
            for shape in SHAPES:
                key = (method.drafting, shape)
                if key not in drafts:
                    drafts[key] = _draft_tree(
                        draft, windows, shapes[shape], method.drafting, row_sampling, draft_rng
                    )
                drafted = drafts[key]
                verified = _verify(target, windows, drafted, method, row_sampling, verifier_rng)
                result.accepted[method.name, shape].extend(verified.accepted_lengths.tolist())
                result.drafted[method.name, shape].extend(len(p) for p in drafted[0])
                if advance is None and shape == "tree":
                    advance = verified
        output = advance.output_token_ids
        keep = output >= 0
        row_index, column = np.nonzero(keep)
        sequences[rows[row_index], lengths[rows][row_index] + column] = output[keep]
        lengths[rows] += keep.sum(axis=1)
        result.target_calls += 1
        if progress is not None:
            progress(int(np.minimum(lengths - P, N).sum()), B * N)
    result.decode_seconds = time.perf_counter() - start
    return result
