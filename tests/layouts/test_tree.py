"""specdec_np.verify_tree and the CPU tree driver (``_core.verify_trees``).

The array-API reference (``specdec_np._reference.trees``) is the oracle: the kernel must
give its outputs on the same uniforms, for every method, dtype and row form.  The reference
itself is proven against the exact enumeration oracle in ``test_tree_reference.py``; here
the real kernel is also tested by chi-square against that oracle's emission law, with a
negative control that must fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import _core, registry
from specdec_np._layouts import tree as _trees
from specdec_np._layouts import tree_links as _tree_links
from specdec_np._reference import trees as tree_reference
from specdec_np.testing import _statistics

METHODS = tuple(method.name for method in registry.TREE_METHODS)
STOCHASTIC = tuple(method.name for method in registry.TREE_METHODS if method.stochastic)


@st.composite
def tree_batches(draw, max_batch: int = 4, max_nodes: int = 8):
    """A random batch: shapes, tokens, rows as probabilities or logits, and parameters."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batch_size = draw(st.integers(0, max_batch))
    vocab_size = draw(st.integers(1, 12))
    counts = rng.integers(0, max_nodes + 1, batch_size)
    parents = [int(rng.integers(-1, j)) for n in counts for j in range(int(n))]
    total = int(counts.sum())
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    from_logits = draw(st.booleans())
    with_drafts = draw(st.booleans())
    ties = draw(st.booleans())
    if from_logits:
        target = (rng.normal(size=(total + batch_size, vocab_size)) * 2).astype(dtype)
        draft = (rng.normal(size=(total, vocab_size)) * 2).astype(dtype)
        if ties:
            # Whole-number logits put ties at the top-k and top-p boundaries.
            target, draft = np.round(target), np.round(draft)
    else:
        target = rng.dirichlet(np.full(vocab_size, 0.5), total + batch_size).astype(dtype)
        draft = rng.dirichlet(np.full(vocab_size, 0.5), total).astype(dtype)
        if ties:
            target[:, : vocab_size // 2] = 0.0
    parameters = {}
    if draw(st.booleans()):
        parameters["temperature"] = rng.choice([0.0, 0.6, 1.0, 1.5], batch_size)
        if not from_logits:
            parameters["temperature"] = np.where(parameters["temperature"] == 0, 0.0, 1.0)
    if from_logits and draw(st.booleans()):
        parameters["top_k"] = rng.integers(0, vocab_size + 1, batch_size)
    if from_logits and draw(st.booleans()):
        parameters["top_p"] = rng.choice([1.0, 0.9, 0.6, 0.3], batch_size)
    if from_logits and draw(st.booleans()):
        parameters["min_p"] = rng.choice([0.0, 0.05, 0.3], batch_size)
    return {
        "num_nodes": counts,
        "tree_parents": np.asarray(parents, dtype=np.int64),
        "draft_token_ids": rng.integers(0, vocab_size, total),
        "target": target,
        "draft": draft if with_drafts else None,
        "from_logits": from_logits,
        "parameters": parameters,
        "uniforms": rng.random((batch_size, int(counts.max(initial=0)) + 1)),
    }


def rows(case):
    if case["from_logits"]:
        return {"target_logits": case["target"], "draft_logits": case["draft"]}
    return {"target_probs": case["target"], "draft_probs": case["draft"]}


def run_kernel(case, method, **extra):
    return specdec_np.verify_tree(
        num_nodes=case["num_nodes"],
        tree_parents=case["tree_parents"],
        draft_token_ids=case["draft_token_ids"],
        method=method,
        uniforms=case["uniforms"],
        **rows(case),
        **case["parameters"],
        **extra,
    )


def run_reference(case, method):
    return tree_reference.verify_tree_requests(
        case["num_nodes"],
        case["tree_parents"],
        case["draft_token_ids"],
        case["target"],
        case["draft"],
        case["uniforms"],
        method=method,
        from_logits=case["from_logits"],
        **case["parameters"],
    )


def assert_same(result, expected):
    nodes, tokens, lengths = expected
    np.testing.assert_array_equal(result.accepted_nodes, nodes)
    np.testing.assert_array_equal(result.output_token_ids, tokens)
    np.testing.assert_array_equal(result.accepted_lengths, lengths)


# --- the kernel against the reference --------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(case=tree_batches(), method=st.sampled_from(METHODS))
def test_kernel_equals_reference_on_the_same_uniforms(case, method):
    assert_same(run_kernel(case, method), run_reference(case, method))


@pytest.mark.parametrize("method", STOCHASTIC)
def test_kernel_equals_reference_on_wide_trees_and_a_large_vocabulary(method):
    # Many siblings per node (repeated tokens among them), several rejections per node,
    # and a vocabulary wide enough for the blocked inverse CDF and the lane sums.
    rng = np.random.default_rng(5)
    vocab_size, batch_size = 5000, 6
    counts = np.array([12, 0, 30, 7, 20, 1])
    parents = np.concatenate(
        [np.where(np.arange(n) < n // 2, -1, rng.integers(-1, 1 + n // 4, n)) for n in counts]
    ).astype(np.int64)
    total = int(counts.sum())
    # Most of the mass on the 40 tokens the nodes propose, the rest spread thin.
    concentration = np.where(np.arange(vocab_size) < 40, 1.0, 0.01)
    target = rng.dirichlet(concentration, total + batch_size)
    draft = rng.dirichlet(concentration, total)
    tokens = rng.integers(0, 40, total)
    case = {
        "num_nodes": counts,
        "tree_parents": parents,
        "draft_token_ids": tokens,
        "target": target,
        "draft": draft,
        "from_logits": False,
        "parameters": {},
        "uniforms": rng.random((batch_size, 31)),
    }
    result = run_kernel(case, method)
    assert_same(result, run_reference(case, method))
    # The case is not trivial: some siblings fail and some walk descends.
    assert 0 < int(result.accepted_lengths.sum())


@pytest.mark.parametrize("method", STOCHASTIC)
def test_kernel_equals_reference_with_hundreds_of_siblings(method):
    # More distinct rejected tokens at one node than the point-mass draw keeps on its stack.
    rng = np.random.default_rng(8)
    vocab_size, siblings = 700, 300
    tokens = rng.permutation(vocab_size)[:siblings]
    target = np.full((siblings + 1, vocab_size), 1e-4)
    target[0, tokens] = rng.random(siblings)
    target /= target.sum(axis=1, keepdims=True)
    case = {
        "num_nodes": np.array([siblings]),
        "tree_parents": np.full(siblings, -1),
        "draft_token_ids": tokens,
        "target": target,
        "draft": rng.dirichlet(np.ones(vocab_size), siblings),
        "from_logits": False,
        "parameters": {},
        "uniforms": np.concatenate([np.full((1, siblings), 0.999), [[0.3]]], axis=1),
    }
    result = run_kernel(case, method)
    assert_same(result, run_reference(case, method))
    if registry.get_tree_method(method).drafting == "fixed":  # every sibling rejected
        assert int(result.accepted_lengths[0]) == 0


@pytest.mark.parametrize("method", STOCHASTIC)
@pytest.mark.parametrize("edge", [0.0, float(np.nextafter(1.0, 0.0))])
def test_boundary_uniforms(method, edge):
    rng = np.random.default_rng(1)
    counts = np.array([3, 4])
    case = {
        "num_nodes": counts,
        "tree_parents": np.array([-1, -1, 0, -1, 0, 0, 1]),
        "draft_token_ids": rng.integers(0, 6, 7),
        "target": rng.dirichlet(np.ones(6), 9),
        "draft": rng.dirichlet(np.ones(6), 7),
        "from_logits": False,
        "parameters": {},
        "uniforms": np.full((2, 5), edge),
    }
    result = run_kernel(case, method)
    assert_same(result, run_reference(case, method))
    if edge == 0.0:
        # u = 0 accepts every child whose token has target mass: the walk goes deep.
        assert int(result.accepted_lengths.min()) >= 1


# --- a chain given as a tree ------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    counts=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    with_drafts=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_a_chain_as_a_tree_equals_the_chain_verifiers(seed, counts, with_drafts, dtype):
    rng = np.random.default_rng(seed)
    vocab_size = 9
    counts = np.asarray(counts)
    layout = _trees.chain_tree([rng.integers(0, vocab_size, n) for n in counts])
    total = int(counts.sum())
    target = rng.dirichlet(np.full(vocab_size, 0.4), total + len(counts)).astype(dtype)
    draft = rng.dirichlet(np.full(vocab_size, 0.4), total).astype(dtype) if with_drafts else None
    uniforms = rng.random((len(counts), int(counts.max()) + 2))
    # The tree's last column serves the residual and the bonus alike (only one is drawn).
    chain_uniforms = uniforms.copy()
    chain_uniforms[np.arange(len(counts)), counts + 1] = uniforms[np.arange(len(counts)), counts]
    # On a chain each walk is its registry chain verifier (token-wise rejection for the
    # sibling walks, block verification for traversal), and without draft rows every
    # stochastic walk is point-mass rejection.
    for method in registry.TREE_METHODS:
        tree_method = method.name
        with_rows = draft is not None and method.reads_draft_probs
        chain_method = (
            method.chain_verifier if with_rows or not method.stochastic else "rejection"
        )
        tree = specdec_np.verify_tree(
            num_nodes=layout.num_nodes,
            tree_parents=layout.tree_parents,
            draft_token_ids=layout.draft_token_ids,
            target_probs=target,
            draft_probs=draft if method.reads_draft_probs else None,
            method=tree_method,
            uniforms=uniforms[:, :-1],
        )
        chain = specdec_np.verify_ragged(
            num_draft_tokens=counts,
            draft_token_ids=layout.draft_token_ids,
            target_probs=target,
            draft_probs=draft if method.reads_draft_probs else None,
            method=chain_method,
            uniforms=chain_uniforms,
        )
        np.testing.assert_array_equal(tree.accepted_lengths, chain.accepted_lengths)
        width = tree.output_token_ids.shape[1]
        np.testing.assert_array_equal(tree.output_token_ids, chain.output_token_ids[:, :width])
        for b, length in enumerate(tree.accepted_lengths):
            np.testing.assert_array_equal(tree.accepted_nodes[b, :length], np.arange(length))


# --- the law of the real kernel -----------------------------------------------------------

VOCAB = 4
SHAPE = [-1, -1, 0, 1]  # two branches of depth 2


def path_law(seed):
    def law(path):
        rng = np.random.default_rng([seed, len(path), *path])
        row = rng.dirichlet(np.full(VOCAB, 0.8))
        return row / row.sum()

    return law


TARGET = path_law(41)
DRAFTS = [path_law(42 + position) for position in range(2)]


def sibling_draft(path, position):
    return DRAFTS[position](path)


def path_rows(law, codes):
    """``law(path)`` for every path code (``code = parent * (V + 1) + token + 1``, root 0),
    one call per distinct path."""
    unique, inverse = np.unique(codes, return_inverse=True)
    table = np.empty((unique.shape[0], VOCAB))
    for i, code in enumerate(unique):
        path, code = [], int(code)
        while code:
            code, digit = divmod(code, VOCAB + 1)
            path.append(digit - 1)
        table[i] = law(tuple(reversed(path)))
    return table[inverse.reshape(-1)]


def drafted_batch(drafting, samples, rng, shape=SHAPE, target=None, draft=None):
    """``samples`` requests of ``shape``, each with its children drawn as ``drafting``
    says (independently from their own rows, or without replacement from one row)."""
    target = TARGET if target is None else target
    draft = sibling_draft if draft is None else draft
    codes = np.zeros((samples, len(shape) + 1), dtype=np.int64)  # column 0: the root
    tokens = np.empty((samples, len(shape)), dtype=np.int64)
    draft_rows = np.empty((samples, len(shape), VOCAB))
    earlier: dict[int, list[int]] = {}
    for node, parent in enumerate(shape):
        siblings = earlier.setdefault(parent, [])
        parent_codes = codes[:, parent + 1]
        position = 0 if drafting == "without_replacement" else len(siblings)
        row = path_rows(lambda path, position=position: draft(path, position), parent_codes)
        weights = row.copy()
        if drafting == "without_replacement":
            for sibling in siblings:
                weights[np.arange(samples), tokens[:, sibling]] = 0.0
        cumulative = np.cumsum(weights, axis=1)
        u = rng.random(samples) * cumulative[:, -1]
        tokens[:, node] = np.minimum((cumulative <= u[:, None]).sum(axis=1), VOCAB - 1)
        draft_rows[:, node] = row
        codes[:, node + 1] = parent_codes * (VOCAB + 1) + tokens[:, node] + 1
        siblings.append(node)
    target_rows = path_rows(target, codes.reshape(-1)).reshape(samples, len(shape) + 1, VOCAB)
    return tokens, target_rows, draft_rows


def emission_counts(method, drafting, samples, seed, **batch_options):
    rng = np.random.default_rng(seed)
    shape = batch_options.get("shape", SHAPE)
    tokens, target_rows, draft_rows = drafted_batch(drafting, samples, rng, **batch_options)
    result = specdec_np.verify_tree(
        num_nodes=np.full(samples, len(shape)),
        tree_parents=np.tile(shape, samples),
        draft_token_ids=tokens.reshape(-1),
        target_probs=target_rows.reshape(-1, VOCAB),
        draft_probs=draft_rows.reshape(-1, VOCAB),
        method=method,
        generator=np.random.default_rng(seed + 1),
    )
    counts: dict[tuple[int, ...], int] = {}
    for row, length in zip(result.output_token_ids.tolist(), result.accepted_lengths.tolist()):
        emitted = tuple(row[: length + 1])
        counts[emitted] = counts.get(emitted, 0) + 1
    return counts


def p_value(counts, law):
    keys = sorted(set(law) | set(counts))
    observed = [counts.get(key, 0) for key in keys]
    expected = [law.get(key, 0.0) for key in keys]
    statistic, dof = _statistics.chi_square_statistic(observed, expected)
    return _statistics.chi_square_p_value(statistic, dof)


@pytest.mark.parametrize(
    ("method", "drafting"),
    [
        ("specinfer", "independent"),
        ("rrs", "without_replacement"),
        ("point_mass", "independent"),
        ("point_mass", "without_replacement"),
    ],
)
def test_kernel_emissions_follow_the_exact_law(method, drafting):
    law = tree_reference.tree_emission_law(
        method, TARGET, SHAPE, VOCAB, draft=sibling_draft, drafting=drafting
    )
    # The law itself is the target's, continued (the lossless property)...
    continued = tree_reference.continued_law(law, TARGET, 3, VOCAB)
    target = tree_reference.continued_law({(): 1.0}, TARGET, 3, VOCAB)
    assert np.abs(continued - target).max() < 1e-9
    # ...and the kernel draws from it.
    assert p_value(emission_counts(method, drafting, 20_000, seed=3), law) > 1e-4


# Three siblings drawn without replacement from a peaked row: SpecInfer's rule, which
# assumes independent children, is far off here (the exact first-token law puts about 0.7
# on token 0 instead of 0.2), while RRS is exact.
PEAKED_TARGET = np.array([0.2, 0.3, 0.35, 0.15])
PEAKED_DRAFT = np.array([0.08, 0.01, 0.01, 0.90])


def peaked_counts(method, seed):
    first = np.zeros(VOCAB, dtype=np.int64)
    counts = emission_counts(
        method,
        "without_replacement",
        20_000,
        seed,
        shape=[-1, -1, -1],
        target=lambda path: PEAKED_TARGET,
        draft=lambda path, position: PEAKED_DRAFT,
    )
    for emitted, count in counts.items():
        first[emitted[0]] += count
    return first


def test_specinfer_on_siblings_drawn_without_replacement_fails():
    # The negative control: the same kernel with the rule of the wrong drafting.
    statistic, dof = _statistics.chi_square_statistic(peaked_counts("specinfer", 4), PEAKED_TARGET)
    assert _statistics.chi_square_p_value(statistic, dof) < 1e-9
    statistic, dof = _statistics.chi_square_statistic(peaked_counts("rrs", 4), PEAKED_TARGET)
    assert _statistics.chi_square_p_value(statistic, dof) > 1e-4


def test_specinfer_accepts_more_than_point_mass_on_sampled_children():
    lengths = {}
    for method in ("specinfer", "point_mass"):
        counts = emission_counts(method, "independent", 20_000, seed=6)
        lengths[method] = sum((len(key) - 1) * n for key, n in counts.items()) / 20_000
    assert lengths["specinfer"] > lengths["point_mass"] + 0.05


# --- randomness and batch invariance --------------------------------------------------------


def small_case(seed=0, batch_size=5, vocab_size=11):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, batch_size)
    parents = np.asarray(
        [int(rng.integers(-1, j)) for n in counts for j in range(int(n))], dtype=np.int64
    )
    total = int(counts.sum())
    return {
        "num_nodes": counts,
        "tree_parents": parents,
        "draft_token_ids": rng.integers(0, vocab_size, total),
        "target_logits": rng.normal(size=(total + batch_size, vocab_size)).astype(np.float32),
        "draft_logits": rng.normal(size=(total, vocab_size)).astype(np.float32),
        "temperature": rng.choice([0.0, 0.8], batch_size),
        "top_p": 0.9,
    }


def request_slice(case, b):
    counts = case["num_nodes"]
    start = int(counts[:b].sum())
    stop = start + int(counts[b])
    return {
        "num_nodes": counts[b : b + 1],
        "tree_parents": case["tree_parents"][start:stop],
        "draft_token_ids": case["draft_token_ids"][start:stop],
        "target_logits": case["target_logits"][start + b : stop + b + 1],
        "draft_logits": case["draft_logits"][start:stop],
        "temperature": case["temperature"][b : b + 1],
        "top_p": case["top_p"],
    }


@pytest.mark.parametrize("method", STOCHASTIC)
def test_seeded_requests_are_batch_invariant(method):
    case = small_case()
    batch_size = len(case["num_nodes"])
    whole = specdec_np.verify_tree(
        **case,
        method=method,
        seeded_seqs={b: np.random.default_rng(100 + b) for b in range(batch_size)},
    )
    countered = specdec_np.verify_tree(
        **case, method=method, counter_seeds={b: (7, 100 + b) for b in range(batch_size)}
    )
    for b in range(batch_size):
        alone = specdec_np.verify_tree(
            **request_slice(case, b),
            method=method,
            seeded_seqs={0: np.random.default_rng(100 + b)},
        )
        length = int(alone.accepted_lengths[0])
        assert int(whole.accepted_lengths[b]) == length
        np.testing.assert_array_equal(
            whole.output_token_ids[b, : length + 1], alone.output_token_ids[0, : length + 1]
        )
        alone = specdec_np.verify_tree(
            **request_slice(case, b), method=method, counter_seeds={0: (7, 100 + b)}
        )
        np.testing.assert_array_equal(
            countered.output_token_ids[b, : int(alone.accepted_lengths[0]) + 1],
            alone.output_token_ids[0, : int(alone.accepted_lengths[0]) + 1],
        )


@pytest.mark.parametrize("method", STOCHASTIC)
def test_a_sampled_request_consumes_exactly_its_nodes_plus_one_draws(method):
    case = small_case(seed=3)
    counts = case["num_nodes"]
    generators = {b: np.random.default_rng(b) for b in range(len(counts))}
    specdec_np.verify_tree(**case, method=method, seeded_seqs=generators)
    for b, generator in generators.items():
        fresh = np.random.default_rng(b)
        if case["temperature"][b] != 0:
            fresh.random(int(counts[b]) + 1)
        assert generator.random() == fresh.random()


def test_explicit_uniforms_of_greedy_requests_are_unused_and_seeds_reproduce():
    case = small_case(seed=4)
    first = specdec_np.verify_tree(**case, method="rrs", generator=np.random.default_rng(9))
    again = specdec_np.verify_tree(**case, method="rrs", generator=np.random.default_rng(9))
    assert_same(first, tuple(again))
    greedy = case["temperature"] == 0
    uniforms = np.random.default_rng(1).random((len(greedy), 6))
    base = specdec_np.verify_tree(**case, method="rrs", uniforms=uniforms)
    uniforms[greedy] = 0.0
    changed = specdec_np.verify_tree(**case, method="rrs", uniforms=uniforms)
    assert_same(base, tuple(changed))


def test_zero_node_requests_draw_from_the_root_row():
    target = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    result = specdec_np.verify_tree(
        num_nodes=np.array([0, 0]),
        tree_parents=np.zeros(0, dtype=np.int64),
        draft_token_ids=np.zeros(0, dtype=np.int64),
        target_probs=target,
        uniforms=np.array([[0.5], [0.99]]),
    )
    assert result.accepted_nodes.shape == (2, 0)
    np.testing.assert_array_equal(result.output_token_ids, [[1], [2]])
    np.testing.assert_array_equal(result.accepted_lengths, [0, 0])


def test_empty_batch():
    result = specdec_np.verify_tree(
        num_nodes=np.zeros(0, dtype=np.int64),
        tree_parents=np.zeros(0, dtype=np.int64),
        draft_token_ids=np.zeros(0, dtype=np.int64),
        target_probs=np.zeros((0, 5)),
    )
    assert result.output_token_ids.shape == (0, 1)


def test_out_buffers_are_filled_and_returned():
    case = small_case(seed=5)
    out = specdec_np.tree_output_buffers(len(case["num_nodes"]), 10)
    expected = specdec_np.verify_tree(
        **case, method="specinfer", counter_seeds={0: (1, 2)}, generator=np.random.default_rng(3)
    )
    result = specdec_np.verify_tree(
        **case,
        method="specinfer",
        counter_seeds={0: (1, 2)},
        generator=np.random.default_rng(3),
        out=out,
    )
    assert_same(result, tuple(expected))
    assert np.shares_memory(result.output_token_ids, out.output_token_ids)
    assert (out.accepted_nodes[:, expected.accepted_nodes.shape[1] :] == -1).all()


# --- bad input --------------------------------------------------------------------------------


def base_arguments():
    return {
        "num_nodes": np.array([2, 1]),
        "tree_parents": np.array([-1, 0, -1]),
        "draft_token_ids": np.array([1, 2, 3]),
        "target_probs": np.full((5, 4), 0.25),
        "uniforms": np.full((2, 3), 0.5),
    }


@pytest.mark.parametrize(
    ("change", "error", "pattern"),
    [
        (
            {"tree_parents": np.array([-1, 1, -1])},
            ValueError,
            r"tree_parents\[1\] \(request 0, node 1\)",
        ),
        ({"tree_parents": np.array([-1, 2, -1])}, ValueError, r"request 0, node 1.*outside"),
        ({"tree_parents": np.array([-1, 0, 0])}, ValueError, r"request 1, node 0"),
        ({"num_nodes": np.array([2, 2])}, ValueError, "sum"),
        ({"num_nodes": np.array([3, -1])}, ValueError, r"num_nodes\[1\]"),
        ({"draft_token_ids": np.array([1, 2, 4])}, ValueError, r"request 1, node 0.*vocabulary"),
        ({"draft_token_ids": np.array([1.0, 2.0, 3.0])}, TypeError, "draft_token_ids"),
        ({"target_probs": np.full((4, 4), 0.25)}, ValueError, r"target_probs.*\[5, V\]"),
        ({"target_probs": np.full((5, 4), 1, dtype=np.int64)}, TypeError, "target_probs"),
        ({"draft_probs": np.full((2, 4), 0.25), "method": "specinfer"}, ValueError, "draft_probs"),
        ({"uniforms": np.full((2, 2), 0.5)}, ValueError, "uniforms"),
        ({"uniforms": np.full((2, 3), 1.0)}, ValueError, "uniforms"),
        ({"method": "rejection"}, ValueError, "'greedy'"),
        ({"top_k": 2}, ValueError, "top_k"),
        ({"temperature": np.array([1.0, -1.0])}, ValueError, "temperature"),
        ({"target_logits": np.zeros((5, 4))}, ValueError, "exactly one"),
        (
            {"draft_logits": np.zeros((3, 4)), "draft_probs": np.full((3, 4), 0.25)},
            ValueError,
            "at most one of draft_logits and draft_probs",
        ),
        ({"out": object()}, TypeError, "TreeOutputBlock"),
        ({"out": specdec_np.tree_output_buffers(2, 1)}, ValueError, "max depth"),
        ({"strict_mode": 1}, TypeError, "strict_mode"),
        # Found by the fuzz: counts whose int64 sum wraps, non-arrays, dict parameters.
        ({"num_nodes": np.array([3] + [2**62] * 4)}, ValueError, "num_nodes must sum"),
        ({"tree_parents": None}, TypeError, "tree_parents must be a 1-D integer array"),
        ({"num_nodes": "abc"}, TypeError, "num_nodes must be a 1-D integer array"),
        ({"temperature": {"a": 1.0}}, TypeError, "temperature"),
    ],
)
def test_bad_input_names_the_argument(change, error, pattern):
    arguments = base_arguments()
    arguments.update(change)
    with pytest.raises(error, match=pattern):
        specdec_np.verify_tree(**arguments)


def test_depth_over_the_limit():
    depth = _trees.MAX_TREE_DEPTH + 1
    with pytest.raises(ValueError, match="MAX_TREE_DEPTH"):
        specdec_np.verify_tree(
            num_nodes=np.array([depth]),
            tree_parents=np.arange(-1, depth - 1),
            draft_token_ids=np.zeros(depth, dtype=np.int64),
            target_probs=np.full((depth + 1, 2), 0.5),
            method="greedy",
        )


@st.composite
def raw_layouts(draw):
    """Layouts as a caller may pass them, valid or not: counts (some negative or not summing
    to N), parents (some forward, below -1 or beyond the request), tokens (some outside the
    vocabulary) and now and then a chain deeper than MAX_TREE_DEPTH."""
    vocab = draw(st.integers(1, 6))
    if draw(st.integers(0, 9)) == 0:
        depth = _trees.MAX_TREE_DEPTH + draw(st.integers(-1, 1))
        counts = [depth]
        parents = list(range(-1, depth - 1))
    else:
        counts = draw(st.lists(st.integers(0, 6), max_size=4))
        parents = [draw(st.integers(-1, j - 1)) for n in counts for j in range(n)]
    tokens = [draw(st.integers(0, vocab - 1)) for _ in parents]
    fault = draw(st.sampled_from(["none", "count", "parent", "token", "length"]))
    if fault == "count" and counts:
        counts[draw(st.integers(0, len(counts) - 1))] += draw(st.sampled_from([-7, -1, 1, 2**62]))
    elif fault == "parent" and parents:
        parents[draw(st.integers(0, len(parents) - 1))] += draw(st.sampled_from([-9, 1, 5]))
    elif fault == "token" and tokens:
        tokens[draw(st.integers(0, len(tokens) - 1))] = draw(st.sampled_from([-1, vocab, 99]))
    elif fault == "length":
        tokens.append(0)
    as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return as_array(counts), as_array(parents), as_array(tokens), vocab


@settings(max_examples=300, deadline=None)
@given(case=raw_layouts())
def test_the_compiled_layout_check_agrees_with_validate_tree(case):
    """``tree_batch``'s one-pass check accepts exactly the layouts ``validate_tree`` accepts,
    builds the same layout, and leaves the messages to ``validate_tree``."""
    counts, parents, tokens, vocab = case
    try:
        expected = _trees.validate_tree(counts, parents, tokens, vocab)
    except ValueError as error:
        with pytest.raises(ValueError) as found:
            _trees.checked_layout(counts, parents, tokens, vocab)
        assert str(found.value) == str(error)
        offsets = np.empty(counts.shape[0] + 1, np.int64)
        depths = np.empty(parents.shape[0], np.int64)
        args = (counts, parents, tokens, vocab, _trees.MAX_TREE_DEPTH, offsets, depths)
        assert not _core.tree_layout_is_valid(*args)
        return
    found = _trees.checked_layout(counts, parents, tokens, vocab)
    for name, value in expected._asdict().items():
        np.testing.assert_array_equal(getattr(found, name), value, err_msg=name)


def test_a_row_without_mass_names_the_row_and_moves_no_generator():
    arguments = base_arguments()
    del arguments["uniforms"]
    arguments["target_probs"] = np.full((5, 4), 0.25)
    arguments["target_probs"][3] = 0.0  # request 1's root row
    generator = np.random.default_rng(0)
    state = generator.bit_generator.state
    with pytest.raises(ValueError, match=r"target_probs row 3 \(request 1, the root\)"):
        specdec_np.verify_tree(**arguments, generator=generator)
    assert generator.bit_generator.state == state


def test_strict_mode_refuses_non_finite_logits():
    arguments = base_arguments()
    del arguments["target_probs"]
    logits = np.zeros((5, 4), dtype=np.float32)
    logits[2, 1] = np.nan
    with pytest.raises(ValueError, match="target_logits"):
        specdec_np.verify_tree(**arguments, target_logits=logits, strict_mode=True)
    # Outside strict mode a NaN logit is never kept, so its token is never emitted.
    result = specdec_np.verify_tree(**arguments, target_logits=logits)
    assert int(result.output_token_ids[0, 1]) != 1 or int(result.accepted_lengths[0]) != 1


def test_the_driver_refuses_inconsistent_arguments():
    # A direct caller of the kernel module cannot make it read out of bounds.
    target = np.full((3, 4), 0.25)
    ids = np.array([1, 2], dtype=np.int64)
    outputs = [
        np.empty((1, 2), np.int64),
        np.empty((1, 3), np.int64),
        np.empty(1, np.int64),
        np.empty(1, np.int64),
    ]
    working = np.empty((1, 8))
    common = (target, target, True, ids)

    def links(parents: np.ndarray) -> _tree_links.TreeLinks:
        return _tree_links.tree_links(np.array([0, 2]), parents, ids)
    with pytest.raises(ValueError, match="tree_parents"):
        _core.verify_trees(
            1,
            *common,
            np.array([-1, 1]),
            np.array([0, 2]),
            *links(np.array([-1, 1])),
            np.full(3, 0.5),
            *outputs,
            1,
            working=working,
        )
    with pytest.raises(ValueError, match="deepest"):
        _core.verify_trees(
            1,
            *common,
            np.array([-1, 0]),
            np.array([0, 2]),
            *links(np.array([-1, 0])),
            np.full(3, 0.5),
            np.empty((1, 1), np.int64),
            np.empty((1, 2), np.int64),
            *outputs[2:],
            1,
            working=working,
        )
    with pytest.raises(ValueError, match="working"):
        _core.verify_trees(
            1,
            *common,
            np.array([-1, 0]),
            np.array([0, 2]),
            *links(np.array([-1, 0])),
            np.full(3, 0.5),
            *outputs,
            1,
        )
    with pytest.raises(ValueError, match="uniforms"):
        _core.verify_trees(
            1,
            *common,
            np.array([-1, 0]),
            np.array([0, 2]),
            *links(np.array([-1, 0])),
            np.full(2, 0.5),
            *outputs,
            1,
            working=working,
        )
    bad_ids = np.array([1, 9], dtype=np.int64)
    status = _core.verify_trees(
        1,
        target,
        target,
        True,
        bad_ids,
        np.array([-1, 0]),
        np.array([0, 2]),
        *links(np.array([-1, 0])),
        np.full(3, 0.5),
        *outputs,
        1,
        working=working,
    )
    assert status == 0 and outputs[3][0] == 2


# --- cost: only the walked path is read ---------------------------------------------------------


# The walks from the root down (a sequence-level walk reads what its post-order visits:
# tests/reference/test_traversal.py checks it against its reference's reads).
TOP_DOWN = tuple(method.name for method in registry.TREE_METHODS if not method.sequence_level)


@settings(max_examples=60, deadline=None)
@given(case=tree_batches(max_nodes=10), method=st.sampled_from(TOP_DOWN))
def test_rows_off_the_walked_path_are_never_read(case, method):
    """Poisoning every row the walk must not read (target rows off the accepted path, draft
    rows of children never tested) changes nothing; a kernel that read one would see NaN
    and fail or emit something else."""
    result = run_kernel(case, method)
    layout = _trees.validate_tree(case["num_nodes"], case["tree_parents"], case["draft_token_ids"])
    target_read = np.zeros(case["target"].shape[0], dtype=bool)
    draft_read = np.zeros(int(layout.node_offsets[-1]), dtype=bool)
    for b in range(layout.batch_size):
        start = int(layout.node_offsets[b])
        children = layout.children(b)
        path = [-1] + [
            int(node) for node in result.accepted_nodes[b, : result.accepted_lengths[b]]
        ]
        for depth, node in enumerate(path):
            target_read[layout.target_row(b, node)] = True
            chosen = path[depth + 1] if depth + 1 < len(path) else None
            for child in children[node + 1]:
                draft_read[start + child] = True
                if child == chosen:
                    break
    poisoned = dict(case)
    poisoned["target"] = np.where(target_read[:, None], case["target"], np.nan).astype(
        case["target"].dtype
    )
    if case["draft"] is not None:
        poisoned["draft"] = np.where(draft_read[:, None], case["draft"], np.nan).astype(
            case["draft"].dtype
        )
    assert_same(run_kernel(poisoned, method), tuple(result))


def test_request_keys_of_mixed_integer_types():
    # Found by the fuzz: a numpy.uint64 key next to an int one indexed as floats.
    arguments = base_arguments()
    del arguments["uniforms"]
    mixed = specdec_np.verify_tree(
        **arguments,
        counter_seeds={np.uint64(0): (1, 2)},
        seeded_seqs={1: np.random.default_rng(3)},
    )
    plain = specdec_np.verify_tree(
        **arguments, counter_seeds={0: (1, 2)}, seeded_seqs={1: np.random.default_rng(3)}
    )
    assert_same(mixed, tuple(plain))
