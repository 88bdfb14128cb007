"""Draft trees: every tree method of the registry through ``verify_tree``.

Each request has two draft chains of depth k under its root (``multi_draft_tree``): the
first takes the top-ranked token of each draft row, the second starts at the root's
second-ranked token, so that the siblings are distinct as every method requires.  Siblings
share their parent's draft row, as when they are drawn from one distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import specdec_np
from specdec_np import registry

from . import common


def two_chain_parents(depth: int) -> np.ndarray:
    """The parents of one request's two chains of ``depth`` nodes, in node order.

    Parameters
    ----------
    depth : int

    Returns
    -------
    int64 [2 depth]
        ``-1`` for a child of the root.
    """
    chain = np.arange(-1, depth - 1)
    return np.concatenate([chain, np.where(chain < 0, -1, chain + depth)])


class TimeTree:
    """The tree layout: ``B`` requests of ``2 k`` nodes each."""

    params = (common.LAYOUTS["tree"], common.TREE_METHOD_NAMES, common.BATCHES, common.VOCABS)
    param_names = ("form", "method", "B", "V")
    timeout = 300

    def setup(self, form: str, method_name: str, batch: int, vocab: int) -> None:
        """Make the trees, their rows and the keywords of one method.

        Parameters
        ----------
        form : str
            ``"logits"`` or ``"probs"``: the rows given.
        method_name : str
        batch, vocab : int
        """
        method = registry.get_tree_method(method_name)
        generator = common.rng()
        nodes = 2 * common.K
        parents = two_chain_parents(common.K)
        # Per request its root row, then a row per node: node j's row is 1 + j.
        target_logits = common.peaked_logits(generator, batch * (nodes + 1), vocab)
        first_row = np.arange(batch) * (nodes + 1)
        parent_rows = (first_row[:, None] + 1 + parents[None, :]).ravel()
        # Siblings share the draft row made from their parent's target row.
        noisy = common.near(generator, target_logits)
        draft_logits = noisy[parent_rows]
        ranked = np.argsort(-draft_logits, axis=1)[:, :2]
        tokens = ranked[:, 0].reshape(batch, nodes)
        tokens[:, common.K] = ranked.reshape(batch, nodes, 2)[:, common.K, 1]
        layout = specdec_np.multi_draft_tree(
            [[row[: common.K], row[common.K :]] for row in tokens.tolist()], vocab_size=vocab
        )
        if not np.array_equal(layout.tree_parents, np.tile(parents, batch)):
            raise AssertionError("multi_draft_tree ordered the nodes unlike the rows")
        self.keywords: dict[str, Any] = {
            "num_nodes": layout.num_nodes,
            "tree_parents": layout.tree_parents,
            "draft_token_ids": layout.draft_token_ids,
        }
        if form == "logits":
            self.keywords.update(target_logits=target_logits, temperature=1.0)
            if method.reads_draft_probs:
                self.keywords["draft_logits"] = draft_logits
        else:
            self.keywords["target_probs"] = common.softmax(target_logits)
            if method.reads_draft_probs:
                self.keywords["draft_probs"] = common.softmax(draft_logits)
        if method.stochastic:
            self.keywords["uniforms"] = generator.random((batch, layout.max_nodes + 1))
        self.method_name = method_name
        common.warm_up(self, form, method_name, batch, vocab)

    def time_verify_tree(self, form: str, method_name: str, batch: int, vocab: int) -> None:
        """``verify_tree(..., method=name)``."""
        specdec_np.verify_tree(method=self.method_name, **self.keywords)
