"""SGLang's thresholds on draft trees: SGLang's own kernel test as the outside check, the
walk's rule, and its bias against an exact enumeration."""

from __future__ import annotations

import numpy as np
import pytest

import specdec_np

# SGLang's test of tree_speculative_sampling_target_only: two requests of six columns
# (column 0 the root), its linked lists, and target logits of 1 with a 10 at the token
# each column should be followed by (18 where none is given), at temperature 0.01.
CANDIDATES = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
NEXT_TOKEN = np.array([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
NEXT_SIBLING = np.array([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])


def _sglang_batch():
    logits = np.ones((2, 6, 20), dtype=np.float32)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = 10
    logits[1, 0, 11] = logits[1, 4, 12] = 10
    peaked = logits.max(axis=2) < 10
    logits[peaked, 18] = 10
    layout, columns = specdec_np.from_next_arrays(NEXT_TOKEN, NEXT_SIBLING, CANDIDATES, 20)
    rows = []
    for b in range(2):
        start, stop = layout.node_offsets[b], layout.node_offsets[b + 1]
        rows.append(logits[b, 0])
        rows.extend(logits[b, columns[start:stop]])
    return layout, np.stack(rows)


@pytest.mark.parametrize(
    ("single", "acc", "tokens", "lengths"),
    [
        (1.0, 1.0, [[3, 4, 5, 18], [11, 12, 18, -1]], [3, 2]),
        (0.0, 0.0, [[1, 2, 18, -1], [11, 12, 18, -1]], [2, 2]),
    ],
)
def test_sglang_threshold_cases(single, acc, tokens, lengths) -> None:
    layout, rows = _sglang_batch()
    for seed in range(5):  # SGLang draws its coins at random: the outcome must not depend
        result = specdec_np.verify_tree(
            num_nodes=layout.num_nodes, tree_parents=layout.tree_parents,
            draft_token_ids=layout.draft_token_ids, target_logits=rows,
            temperature=0.01, method="threshold", threshold_single=single,
            threshold_acc=acc, generator=np.random.default_rng(seed),
        )
        width = result.output_token_ids.shape[1]
        assert result.output_token_ids.tolist() == [row[:width] for row in tokens]
        assert result.accepted_lengths.tolist() == lengths


#: A root with children 0, 1, 2 (tokens 1, 2, 0) on V = 4; node 0 has a child 3 (token 3).
PARENTS = np.array([-1, -1, -1, 0])
TOKENS = np.array([1, 2, 0, 3])
ROOT = np.array([0.4, 0.3, 0.2, 0.1])
OTHER = np.array([0.25, 0.25, 0.25, 0.25])


def _tree(uniforms, **parameters):
    rows = np.stack([ROOT, OTHER, OTHER, OTHER, OTHER])
    return specdec_np.verify_tree(
        num_nodes=np.array([4]), tree_parents=PARENTS, draft_token_ids=TOKENS,
        target_probs=rows, method="threshold", uniforms=np.atleast_2d(uniforms),
        report_bias=True, **parameters,
    )


def test_the_first_childs_uniform_decides_with_a_running_sum() -> None:
    # Children tokens 1 (0.3), 2 (0.2), 0 (0.4): running sums 0.3, 0.5, 0.9.
    for u, child in ((0.25, 0), (0.45, 1), (0.85, 2)):
        result = _tree([u, 0.0, 0.0, 0.0, 0.5])
        assert int(result.accepted_nodes[0, 0]) == child
    # 0.95 fails all three: the final token is the only one left, 3.
    assert _tree([0.95, 0, 0, 0, 0.5]).output_token_ids[0].tolist() == [3, -1, -1]
    # threshold_single 0.35 keeps the third child (0.4) whatever u.
    assert int(_tree([0.95, 0, 0, 0, 0.5], threshold_single=0.35).accepted_nodes[0, 0]) == 2
    # threshold_acc 0.5 doubles the running sums: 0.55 reaches the first child.
    assert int(_tree([0.55, 0, 0, 0, 0.5], threshold_acc=0.5).accepted_nodes[0, 0]) == 0


@pytest.mark.parametrize("parameters", [{}, dict(threshold_single=0.35),
                                        dict(threshold_acc=0.5)])
def test_the_depth_bias_is_the_enumerated_one(parameters) -> None:
    # The root's emitted token over the midpoints of a 120-point grid of its uniform, every
    # threshold a multiple of 1/120; a failure leaves only token 3 to draw.
    grid = (np.arange(120) + 0.5) / 120
    n = grid.size
    uniforms = np.zeros((n, 5))
    uniforms[:, 0] = grid
    result = specdec_np.verify_tree(
        num_nodes=np.full(n, 4), tree_parents=np.tile(PARENTS, n),
        draft_token_ids=np.tile(TOKENS, n),
        target_probs=np.tile(np.stack([ROOT, OTHER, OTHER, OTHER, OTHER]), (n, 1)),
        method="threshold", uniforms=uniforms, report_bias=True, **parameters,
    )
    law = np.bincount(result.output_token_ids[:, 0], minlength=4) / n
    exact = 0.5 * np.abs(law - ROOT).sum()
    assert (exact > 0.05) == bool(parameters)  # thresholds of 1 are exact
    assert np.allclose(result.total_variation[:, 0], exact, atol=1e-12)


def test_thresholds_of_one_are_exact_and_parameters_are_checked() -> None:
    assert float(_tree([0.5, 0, 0, 0, 0.5]).total_variation[0, 0]) < 1e-15
    with pytest.raises(ValueError, match="threshold_acc"):
        _tree([0.5, 0, 0, 0, 0.5], threshold_acc=-1.0)
    with pytest.raises(TypeError, match="window_size"):
        _tree([0.5, 0, 0, 0, 0.5], window_size=1)
    with pytest.raises(TypeError, match="takes none"):
        specdec_np.verify_tree(
            num_nodes=np.array([1]), tree_parents=np.array([-1]), draft_token_ids=TOKENS[:1],
            target_probs=np.stack([ROOT, OTHER]), method="point_mass",
            uniforms=np.zeros((1, 2)), threshold_acc=0.5,
        )
