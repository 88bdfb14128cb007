#!/usr/bin/env python
"""Accepted-length gain of a tree over a chain of the same node budget (no timing).

Two measurements, for every sampled method of ``specdec_np.registry.TREE_METHODS``, each
method's drafts drawn as its ``drafting`` says:

* ``exact``: a synthetic target/draft pair on a small vocabulary, the expected accepted
  length computed by exact enumeration (``_tree_reference.tree_emission_law`` and
  ``expected_accepted_length``): the target's row after a path is the softmax of
  ``target_scale`` x normals seeded by the path, the draft's the softmax of the same logits
  plus ``noise`` x normals seeded by the path, for each of ``--draft-noises`` (small: a
  draft close to the target, long chains accepted; large: a weak draft);
  fixed candidates are the top-ranked tokens of the draft row;
* ``monte_carlo``: ``benchmarks/studies/tree.py``'s realistic inputs at a large vocabulary (peaked
  targets; the draft row is the testing target row plus ``noise`` x normals, for each of
  ``--mc-draft-noises``; 0.3 is the benchmark's realistic regime), ``--rounds`` rounds of
  fresh inputs and drafts at batch ``--batch``, verified from logits with
  ``specdec_np.verify_tree`` on fresh uniforms: mean accepted length and standard error;
* ``versus`` (on the tree): each sequence-level method (traversal) against each
  token-level method with draft rows (SpecInfer, RRS): accepted length and tokens per
  request-step, their difference and the relative gain, with standard errors (paired
  where both methods see the same drafts and uniforms).

Chain: ``[-1, 0, 1, ...]``; tree: ``specdec_np.best_first_tree`` (the shape of
``specdec-np demo --tree`` and of the benchmark)::

    python benchmarks/studies/tree_gain.py --markdown
    python benchmarks/studies/tree_gain.py --quick       # tiny (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (JSON lines and tables)
import tree as bench  # noqa: E402  (the inputs of benchmarks/studies/tree.py)

import specdec_np  # noqa: E402
from specdec_np import best_first_tree, registry  # noqa: E402
from specdec_np._demo.trees import chain_parents  # noqa: E402
from specdec_np._reference import trees as _tree_reference  # noqa: E402

METHODS = [method for method in registry.TREE_METHODS if method.stochastic]
COLUMNS = (
    "kind", "method", "regime", "V", "nodes", "chain", "tree", "gain", "chain_se", "tree_se",
)  # fmt: skip


class SyntheticPair:
    """Target and draft rows after a token path, from normals seeded by the path."""

    def __init__(self, vocab: int, seed: int, target_scale: float, draft_noise: float):
        self.vocab, self.seed = vocab, seed
        self.target_scale, self.draft_noise = target_scale, draft_noise

    def _normals(self, path: tuple[int, ...], stream: int) -> np.ndarray:
        return np.random.default_rng([self.seed, stream, len(path), *path]).standard_normal(
            self.vocab
        )

    def _logits(self, path: tuple[int, ...]) -> np.ndarray:
        return self.target_scale * self._normals(path, 0)

    def target(self, path: tuple[int, ...]) -> np.ndarray:
        return _softmax(self._logits(path))

    def draft(self, path: tuple[int, ...], _position: int = 0) -> np.ndarray:
        return _softmax(self._logits(path) + self.draft_noise * self._normals(path, 1))

    def fixed_tokens(self, parents: Sequence[int]) -> list[int]:
        """Top-ranked draft tokens: the ``r``-th child of a node proposes the rank-``r``
        token of the draft row after the node's path."""
        tokens: list[int] = []
        paths: list[tuple[int, ...]] = []
        rank: dict[int, int] = {}
        for parent in parents:
            prefix = () if parent < 0 else paths[parent]
            order = np.argsort(-self.draft(prefix), kind="stable")
            r = rank.get(parent, 0)
            rank[parent] = r + 1
            tokens.append(int(order[r]))
            paths.append(prefix + (tokens[-1],))
        return tokens


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def exact_length(pair: SyntheticPair, method: registry.TreeMethod, parents: list[int]) -> float:
    options: dict[str, Any] = {}
    if method.drafting == "fixed":
        options["draft_token_ids"] = pair.fixed_tokens(parents)
    else:
        options["draft"] = pair.draft
    law = _tree_reference.tree_emission_law(
        method.name, pair.target, parents, pair.vocab, **options
    )
    return _tree_reference.expected_accepted_length(law)


def monte_carlo(
    noise: float, parents: list[int], vocab: int, batch: int, rounds: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Per method, the mean accepted length per request and its standard error over
    ``rounds`` batches (every method on the same inputs, each with its own drafts)."""
    out = {}
    for name, array in accepted_lengths(noise, parents, vocab, batch, rounds, seed).items():
        out[name] = (float(array.mean()), float(array.std(ddof=1) / np.sqrt(array.size)))
    return out


def versus_rows(
    lengths: dict[str, np.ndarray], regime: str, vocab: int, nodes: int
) -> list[dict[str, Any]]:
    """Each sequence-level method against each token-level method that reads draft rows
    (``registry.TREE_METHODS``), on the same trees: the mean accepted length and tokens per
    request-step (accepted + the final token: one target call each), their difference and
    the relative gain in tokens per step, with standard errors.  Methods of the same drafting
    see the same drafts and uniforms, so their difference is paired (per request); the
    others' are independent samples."""
    rows = []
    for method in (m for m in METHODS if m.sequence_level):
        for baseline in (m for m in METHODS if m.reads_draft_probs and not m.sequence_level):
            ours, theirs = lengths[method.name], lengths[baseline.name]
            paired = method.drafting == baseline.drafting
            if paired:
                difference_se = float((ours - theirs).std(ddof=1) / np.sqrt(ours.size))
            else:
                difference_se = float(
                    np.sqrt(ours.var(ddof=1) / ours.size + theirs.var(ddof=1) / theirs.size)
                )
            mean, base = float(ours.mean()), float(theirs.mean())
            # Tokens per step are accepted + 1: the ratio's standard error by the delta method.
            tokens, base_tokens = mean + 1.0, base + 1.0
            ratio = tokens / base_tokens
            mean_se = float(ours.std(ddof=1) / np.sqrt(ours.size))
            base_se = float(theirs.std(ddof=1) / np.sqrt(theirs.size))
            if paired:
                ratio_se = difference_se / base_tokens  # to first order, the paired gap
            else:
                ratio_se = ratio * float(np.hypot(mean_se / tokens, base_se / base_tokens))
            rows.append({
                "kind": "versus", "method": method.name, "baseline": baseline.name,
                "regime": regime, "V": vocab, "nodes": nodes, "accepted": mean,
                "accepted_se": mean_se, "baseline_accepted": base, "baseline_se": base_se,
                "difference": mean - base, "difference_se": difference_se,
                "tokens_per_step": tokens, "baseline_tokens_per_step": base_tokens,
                "tokens_gain": ratio - 1.0, "tokens_gain_se": ratio_se, "paired": paired,
            })  # fmt: skip
    return rows


VERSUS_COLUMNS = (
    "method", "baseline", "regime", "V", "nodes", "accepted", "baseline_accepted",
    "difference", "difference_se", "tokens_gain", "tokens_gain_se",
)  # fmt: skip


def accepted_lengths(
    noise: float, parents: list[int], vocab: int, batch: int, rounds: int, seed: int
) -> dict[str, np.ndarray]:
    """Per method, the accepted length of every request of ``rounds`` batches of fresh
    inputs (every method on the same inputs and uniforms, each with its drafting's drafts)."""
    lengths: dict[str, list[int]] = {method.name: [] for method in METHODS}
    for round_ in range(rounds):
        inputs = bench.TreeInputs(
            "realistic", batch, len(parents), vocab, seed=seed + round_, flat_draft_scale=3.0,
            shape=parents, realistic_draft_noise=noise,
        )  # fmt: skip
        for method in METHODS:
            result = specdec_np.verify_tree(
                num_nodes=inputs.num_nodes, tree_parents=inputs.tree_parents,
                draft_token_ids=inputs.tokens_for(method), method=method.name,
                uniforms=inputs.uniforms, temperature=1.0, target_logits=inputs.target,
                draft_logits=inputs.draft if method.reads_draft_probs else None,
            )  # fmt: skip
            lengths[method.name].extend(np.asarray(result.accepted_lengths).tolist())
    return {name: np.asarray(values, dtype=np.float64) for name, values in lengths.items()}


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], markdown: bool) -> str:
    cells = [[_fmt(key, row.get(key)) for key in COLUMNS] for row in rows]
    return harness.render_table(COLUMNS, cells, markdown)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exact-vocab", type=int, default=4)
    parser.add_argument("--exact-nodes", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--target-scale", type=float, default=1.5)
    parser.add_argument("--draft-noises", type=float, nargs="+", default=[0.5, 1.5, 3.0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--mc-draft-noises", type=float, nargs="+", default=[0.3, 1.0, 2.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="FILE", help="append the rows as JSON lines")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.exact_vocab, args.exact_nodes, args.draft_noises = 3, [3], [0.5]
        args.vocab, args.nodes, args.batch, args.rounds = 200, [4], 4, 2
        args.mc_draft_noises = [1.0]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for noise, nodes, method in (
        (noise, nodes, method)
        for noise in args.draft_noises
        for nodes in args.exact_nodes
        for method in METHODS
    ):
        pair = SyntheticPair(args.exact_vocab, args.seed, args.target_scale, noise)
        chain = exact_length(pair, method, chain_parents(nodes))
        tree = exact_length(pair, method, best_first_tree(nodes))
        rows.append({
            "kind": "exact", "method": method.name, "regime": f"noise {noise:g}",
            "V": args.exact_vocab, "nodes": nodes, "chain": chain, "tree": tree,
            "gain": tree / chain if chain else None, "chain_se": None, "tree_se": None,
        })  # fmt: skip
    versus = []
    for noise in args.mc_draft_noises:
        for nodes in args.nodes:
            common = (args.vocab, args.batch, args.rounds, args.seed)
            chains = monte_carlo(noise, chain_parents(nodes), *common)
            tree_lengths = accepted_lengths(noise, best_first_tree(nodes), *common)
            trees = {
                name: (float(a.mean()), float(a.std(ddof=1) / np.sqrt(a.size)))
                for name, a in tree_lengths.items()
            }
            versus += versus_rows(tree_lengths, f"noise {noise:g}", args.vocab, nodes)
            for method in METHODS:
                (chain, chain_se), (tree, tree_se) = chains[method.name], trees[method.name]
                rows.append({
                    "kind": "monte_carlo", "method": method.name, "regime": f"noise {noise:g}",
                    "V": args.vocab, "nodes": nodes, "chain": chain, "tree": tree,
                    "gain": tree / chain if chain else None, "chain_se": chain_se,
                    "tree_se": tree_se,
                })  # fmt: skip
                harness.log(json.dumps(rows[-1]))
    print(format_table(rows, args.markdown))
    print()
    cells = [[_fmt(key, row.get(key)) for key in VERSUS_COLUMNS] for row in versus]
    print(harness.render_table(VERSUS_COLUMNS, cells, args.markdown))
    if args.json:
        harness.write_jsonl(args.json, rows + versus, append=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
