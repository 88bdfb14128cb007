"""Bad input on the engine, tree and layout surfaces (docs/semantics.md §8).

Each test is a regression test of one class of defect an outside attack found; each failed
before its fix.
"""

from __future__ import annotations

import copy
import functools
import threading

import numpy as np
import pytest
from test_hardening import interrupted

import specdec_np
from specdec_np import _core, registry
from specdec_np._layouts import tree_links as _tree_links

VOCAB = 12


def _ragged(seed: int = 0, counts=(2, 0, 3), logits: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    rows = rng.dirichlet(np.ones(VOCAB), size=total + counts.size)
    batch = {
        "num_draft_tokens": counts,
        "draft_token_ids": rng.integers(0, VOCAB, total),
    }
    if logits:
        batch["target_logits"] = np.log(rows)
    else:
        batch["target_probs"] = rows
        batch["draft_probs"] = rng.dirichlet(np.ones(VOCAB), size=total)
    return batch


def _tree() -> dict:
    rng = np.random.default_rng(1)
    parents = np.array([-1, 0, 0, -1, -1])
    return {
        "num_nodes": np.array([3, 2]),
        "tree_parents": parents,
        "draft_token_ids": rng.integers(0, VOCAB, 5),
        "target_probs": rng.dirichlet(np.ones(VOCAB), size=7),
    }


# -- 3. arrays read after they were checked are private copies ---------------------------


def test_explicit_uniforms_written_during_the_call_never_accept_a_zero_probability_draft():
    """A writer thread flips the caller's uniforms between valid values and -1 (which would
    make u * q < p hold for p = 0): the kernel reads the checked copy, so a draft the
    target gives probability zero is never accepted."""
    rng = np.random.default_rng(2)
    batch, k, vocab = 32, 4, 50_000
    target = rng.random((batch, k + 1, vocab))
    ids = rng.integers(0, vocab, (batch, k))
    target[np.arange(batch)[:, None], np.arange(k)[None, :], ids] = 0.0  # p(x) = 0
    draft = rng.random((batch, k, vocab))
    bonus = np.zeros((batch, 1), dtype=np.int64)
    uniforms = np.full((batch, k + 1), 0.5)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            uniforms[:, :k] = -1.0
            uniforms[:, :k] = 0.5

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        accepted = 0
        for _ in range(100):
            try:
                result = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms)
            except ValueError as error:
                assert "uniforms" in str(error)
                continue
            accepted += int(result.num_accepted.sum())
    finally:
        stop.set()
        thread.join()
    assert accepted == 0, "a draft with target probability zero was accepted"


# -- 5. temperatures are checked in the dtype they are used in ----------------------------


@pytest.mark.parametrize("value", [1e-50, 1e300])
def test_a_temperature_that_float32_cannot_hold_is_refused(value: float):
    batch = _ragged(logits=True)
    batch["target_logits"] = batch["target_logits"].astype(np.float32)
    with pytest.raises(ValueError, match="temperature"):
        specdec_np.verify_ragged(**batch, temperature=value)
    # The same value is a normal float64: float64 logits take it.
    batch["target_logits"] = batch["target_logits"].astype(np.float64)
    specdec_np.verify_ragged(**batch, temperature=value, generator=np.random.default_rng(0))


def test_a_subnormal_float64_temperature_is_refused():
    batch = _ragged(logits=True)
    with pytest.raises(ValueError, match="temperature"):
        specdec_np.verify_ragged(**batch, temperature=5e-324)


OVERFLOWING = np.float32([10.0, 9.0, -5.0, -6.0])  # at t = 1.5e-38: [inf, inf, -inf, -inf]


def _overflowing_calls(rows: np.ndarray, temperature) -> dict:
    """Every surface that divides logits by a temperature, on rows of two requests with
    one draft each (request 1's rows are ``rows`` too)."""
    ragged = {
        "num_draft_tokens": [1, 1],
        "draft_token_ids": [0, 1],
        "temperature": temperature,
        "generator": np.random.default_rng(0),
    }
    tree = {"num_nodes": [1, 1], "tree_parents": [-1, -1], "draft_token_ids": [0, 1]}
    target = np.tile(rows, (4, 1))
    probs = np.full((4, rows.shape[0]), 1.0 / rows.shape[0], rows.dtype)
    return {
        "processed_probs": lambda: specdec_np.processed_probs(
            target[:2], temperature=temperature
        ),
        "sample_tokens": lambda: specdec_np.sample_tokens(
            logits=target[:2], temperature=temperature
        ),
        "verify_ragged": lambda: specdec_np.verify_ragged(**ragged, target_logits=target),
        "verify_ragged draft_logits": lambda: specdec_np.verify_ragged(
            **ragged, target_probs=probs, draft_logits=target[:2]
        ),
        "EngineVerifier": lambda: specdec_np.EngineVerifier(seed=0)(
            **{k: v for k, v in ragged.items() if k != "generator"}, target_logits=target
        ),
        "verify_tree": lambda: specdec_np.verify_tree(
            **tree, target_logits=target, temperature=temperature,
            generator=np.random.default_rng(0), method="specinfer",
            draft_logits=target[:2],
        ),
    }


@pytest.mark.parametrize("surface", list(_overflowing_calls(OVERFLOWING, 1.0)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_temperature_that_makes_finite_logits_overflow_is_refused(surface, dtype):
    info = np.finfo(dtype)
    temperature = 1.5e-38 if dtype == np.float32 else 1e-307
    rows = OVERFLOWING.astype(dtype) * (1.0 if dtype == np.float32 else 1e3)
    with pytest.raises(ValueError, match=rf"^temperature must not make finite logits "
                                         rf"overflow in {np.dtype(dtype)}; found .* request 1"):
        _overflowing_calls(rows, [1.0, temperature])[surface]()
    # Exact at the boundary: m / t is the largest finite number, or one step past it.
    edge = np.array([info.max / 2, 0.0, -1.0, 0.0], dtype)
    _overflowing_calls(edge, 0.5)[surface]()
    past = edge.copy()
    past[0] = np.nextafter(past[0], dtype(np.inf))
    with pytest.raises(ValueError, match="temperature must not make finite logits overflow"):
        _overflowing_calls(past, 0.5)[surface]()
    # All finite logits overflowing to -inf would leave the row without mass: refused too.
    with pytest.raises(ValueError, match=r"overflow.* to -inf"):
        _overflowing_calls(np.array([-0.75, -0.6, -np.inf, -1.0], dtype) * info.max, 0.5)[
            surface
        ]()


@pytest.mark.parametrize("surface", list(_overflowing_calls(OVERFLOWING, 1.0)))
def test_the_overflow_check_reads_only_rows_the_temperature_divides(surface):
    huge = np.float32([3e38, 1.0, -np.inf, np.nan])
    # Greedy requests read their rows raw, and t >= 1 never overflows a finite logit.
    _overflowing_calls(huge, [0.0, 1.0])[surface]()
    # +inf, -inf and NaN entries are not finite logits; the largest finite one decides.
    masked = np.float32([np.inf, 1e37, -np.inf, np.nan])
    _overflowing_calls(masked, 0.5)[surface]()
    with pytest.raises(ValueError, match="largest finite logit 9.99999993"):
        _overflowing_calls(masked, 0.01)[surface]()
    # A smaller logit overflowing to -inf below a finite maximum weighs 0 either way.
    law = specdec_np.processed_probs(np.float32([[10.0, -3e38, 9.0]]), temperature=0.5)
    np.testing.assert_allclose(law, [[1 / (1 + np.exp(-2.0)), 0.0, 1 / (1 + np.exp(2.0))]])


def test_an_overflowing_temperature_draws_nothing():
    generator = np.random.default_rng(3)
    state = generator.bit_generator.state
    with pytest.raises(ValueError, match="overflow"):
        specdec_np.verify_ragged(
            num_draft_tokens=[1], draft_token_ids=[0], target_logits=np.tile(OVERFLOWING, (2, 1)),
            temperature=1.5e-38, generator=generator,
        )
    assert generator.bit_generator.state == state


# -- 6. masked arrays and matrices are refused on every surface ----------------------------


def test_masked_sampling_parameters_are_refused():
    batch = _ragged(logits=True)
    masked = np.ma.masked_array([1.0, 0.0, 1.0], mask=[False, True, False])
    with pytest.raises(TypeError, match="temperature.*masked"):
        specdec_np.verify_ragged(**batch, temperature=masked)
    with pytest.raises(TypeError, match="top_p.*matrix"):
        specdec_np.verify_ragged(**batch, top_p=np.matrix([0.9, 0.9, 0.9]))


@pytest.mark.parametrize("name", ["num_nodes", "tree_parents", "draft_token_ids"])
def test_masked_tree_arrays_are_refused(name: str):
    arguments = _tree()
    arguments[name] = np.ma.masked_array(arguments[name], mask=False)
    with pytest.raises(TypeError, match=f"{name}.*masked"):
        specdec_np.verify_tree(**arguments)
    arguments = _tree()
    arguments[name] = np.asmatrix(arguments[name])
    with pytest.raises(TypeError, match=f"{name}.*matrix"):
        specdec_np.verify_tree(**arguments)


def test_masked_out_buffers_are_refused():
    batch = _ragged()
    good = specdec_np.output_buffers(3, 3)
    bad = good._replace(accepted_lengths=np.ma.masked_array(good.accepted_lengths))
    with pytest.raises(TypeError, match="out.accepted_lengths"):
        specdec_np.verify_ragged(**batch, out=bad)


# -- 7. out= buffers must not overlap --------------------------------------------------------


def test_overlapping_out_buffers_are_refused():
    batch = _ragged()
    good = specdec_np.output_buffers(3, 3)
    shared = good._replace(num_accepted=good.accepted_lengths)
    with pytest.raises(ValueError, match="share memory"):
        specdec_np.verify_ragged(**batch, out=shared)
    inside = good._replace(row_status=good.output_token_ids[:, 0].copy())
    specdec_np.verify_ragged(**batch, out=inside, generator=np.random.default_rng(0))
    tree = _tree()
    buffers = specdec_np.tree_output_buffers(2, 3)
    overlapping = buffers._replace(row_status=buffers.accepted_lengths)
    with pytest.raises(ValueError, match="share memory"):
        specdec_np.verify_tree(**tree, out=overlapping)


def test_out_buffers_that_alias_an_input_are_refused():
    batch = _ragged()
    rows = np.zeros((5 + 3, VOCAB), dtype=np.float64)
    rows[:] = batch["target_probs"]
    batch["target_probs"] = rows
    out = specdec_np.output_buffers(3, 3)
    alias = out._replace(accepted_lengths=rows.view(np.int64)[0, :3])
    with pytest.raises(ValueError, match="shares memory with target_probs"):
        specdec_np.verify_ragged(**batch, out=alias)


# -- 8. ids, parents and counts are integers within int64 --------------------------------------


def test_huge_uint64_parents_are_refused_not_wrapped():
    arguments = _tree()
    parents = arguments["tree_parents"].astype(np.uint64)
    parents[3] = np.uint64(2**64 - 1)  # wraps to -1: a node re-attached to the root
    arguments["tree_parents"] = parents
    with pytest.raises(ValueError, match="tree_parents must fit in int64; found 1844674"):
        specdec_np.verify_tree(**arguments)


@pytest.mark.parametrize("token", [1.0, "1", True, np.float64(2.0)])
def test_tree_builders_refuse_tokens_that_are_not_integers(token):
    with pytest.raises(TypeError, match="integer token id"):
        specdec_np.chain_tree([[1, token]])
    with pytest.raises(TypeError, match="integer token id"):
        specdec_np.multi_draft_tree([[[token]]])


def test_tree_builders_refuse_tokens_beyond_int64():
    with pytest.raises(ValueError, match="fit in int64"):
        specdec_np.chain_tree([[2**63]])


@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_every_tree_builder_refuses_masked_arrays_and_matrices(kind):
    def wrap(rows):
        rows = np.asarray(rows, dtype=np.int64)
        return np.ma.masked_array(rows, mask=True) if kind == "masked" else np.asmatrix(rows)

    found = "MaskedArray" if kind == "masked" else "matrix"
    links = {
        "retrieve_next_token": [[1, -1]],
        "retrieve_next_sibling": [[-1, -1]],
        "candidates": [[0, 4]],
    }
    for name in links:
        with pytest.raises(TypeError, match=f"{name} .*{found}"):
            specdec_np.from_next_arrays(**{**links, name: wrap(links[name])})
    with pytest.raises(TypeError, match=f"chains .*{found}"):
        specdec_np.chain_tree(wrap([[1, 2]]))
    with pytest.raises(TypeError, match=f"drafts.* .*{found}"):
        specdec_np.multi_draft_tree([[wrap([[1, 2]])[0]]] if kind == "masked" else [wrap([[1]])])
    layout = specdec_np.chain_tree([[1, 2]])
    with pytest.raises(TypeError, match=f"root_token_ids .*{found}"):
        specdec_np.to_next_arrays(layout, root_token_ids=wrap([3]))
    for name in ("num_nodes", "tree_parents", "draft_token_ids"):
        arguments = {"num_nodes": [2], "tree_parents": [-1, 0], "draft_token_ids": [1, 2]}
        arguments[name] = wrap(arguments[name])
        with pytest.raises(TypeError, match=f"{name} .*{found}"):
            specdec_np.validate_tree(**arguments)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: specdec_np.chain_tree(5), "chains"),
        (lambda: specdec_np.chain_tree("12"), "chains"),
        (lambda: specdec_np.chain_tree(np.array([1, 2])), r"chains\[0\]"),
        (lambda: specdec_np.multi_draft_tree([5]), r"drafts\[0\]"),
        (lambda: specdec_np.multi_draft_tree([[3]]), r"drafts\[0\]\[0\]"),
        (lambda: specdec_np.to_next_arrays([1, 2]), "layout"),
        (lambda: specdec_np.to_next_arrays(specdec_np.chain_tree([[1]]), [1.0]),
         "root_token_ids"),
        (lambda: specdec_np.validate_tree([1], [-1], [0], vocab_size="3"), "vocab_size"),
        (lambda: specdec_np.validate_tree([1], [-1], [0], vocab_size=3.0), "vocab_size"),
        (lambda: specdec_np.validate_tree([1], [-1], [0], max_depth=2.0), "max_depth"),
        (lambda: specdec_np.validate_tree(1, [-1], [0]), "num_nodes"),
        (lambda: specdec_np.chain_tree([[1]], vocab_size=3.0), "vocab_size"),
        (lambda: specdec_np.from_next_arrays("ab", [[-1]], [[0]]), "retrieve_next_token"),
        (lambda: specdec_np.from_next_arrays([[-1]], [[-1]], [[0]], vocab_size="2"),
         "vocab_size"),
        (lambda: specdec_np.tree_output_buffers(2.0, 3), "batch_size"),
        (lambda: specdec_np.tree_output_buffers(2, 3.0), "max_depth"),
        (lambda: specdec_np.output_buffers(2.7, 3), "batch_size"),
        (lambda: specdec_np.output_buffers(2, np.float64(1.0)), "max_draft_tokens"),
        (lambda: specdec_np.best_first_tree(4.0), "nodes"),
        (lambda: specdec_np.best_first_tree(True), "nodes"),
        (lambda: specdec_np.best_first_tree(4, 0.5), "weights"),
        (lambda: specdec_np.best_first_tree(4, np.ma.masked_array([0.5])), "weights"),
        (lambda: specdec_np.best_first_tree(4, ["0.5"]), r"weights\[0\]"),
    ],
)
def test_wrong_types_on_the_builders_are_type_errors_naming_the_argument(call, name):
    with pytest.raises(TypeError, match=f"^{name} must"):
        call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: specdec_np.best_first_tree(-1), r"nodes must lie in \[0, "),
        (lambda: specdec_np.best_first_tree(4, []), "weights must hold at least one"),
        (lambda: specdec_np.best_first_tree(4, [0.5, 1.0]), r"non-increasing numbers in \(0, 1\)"),
        (lambda: specdec_np.best_first_tree(4, [0.2, 0.5]), "non-increasing"),
        (lambda: specdec_np.best_first_tree(4, [0.0]), "non-increasing"),
    ],
)
def test_bad_best_first_tree_weights_and_sizes_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    # One child per node: a chain.
    assert specdec_np.best_first_tree(3, [0.5]) == [-1, 0, 1]


def test_root_token_ids_of_another_length_are_refused():
    layout = specdec_np.chain_tree([[1], [2]])
    with pytest.raises(ValueError, match=r"root_token_ids must have shape \[B\] = \[2\]"):
        specdec_np.to_next_arrays(layout, root_token_ids=[7])
    assert specdec_np.to_next_arrays(layout, root_token_ids=[7, 8])[2][:, 0].tolist() == [7, 8]


def test_float_parents_are_a_type_error():
    arguments = _tree()
    arguments["tree_parents"] = arguments["tree_parents"].astype(np.float64)
    with pytest.raises(TypeError, match="tree_parents"):
        specdec_np.verify_tree(**arguments)


@pytest.mark.parametrize("count", [1.0, np.float32(2.0)])
def test_float_counts_are_a_type_error_naming_them(count):
    batch = _ragged(logits=True)
    batch["num_draft_tokens"] = [count, 0, 3]
    with pytest.raises(TypeError, match="num_draft_tokens must have an integer dtype"):
        specdec_np.verify_ragged(**batch)
    with pytest.raises(TypeError, match="num_draft_tokens must have an integer dtype"):
        specdec_np.EngineVerifier()(**batch)
    arguments = _tree()
    arguments["num_nodes"] = [count, 2]
    with pytest.raises(TypeError, match="num_nodes must have an integer dtype"):
        specdec_np.verify_tree(**arguments)


# -- empty batches are valid calls ----------------------------------------------------------


@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("empty", [[], (), np.zeros(0, dtype=np.int32)])
def test_an_empty_ragged_batch_is_a_valid_call(empty, logits):
    rows = np.zeros((0, VOCAB), dtype=np.float32)
    batch = {
        "num_draft_tokens": empty,
        "draft_token_ids": [],
        ("target_logits" if logits else "target_probs"): rows,
        "temperature": [],
    }
    for verify in (specdec_np.verify_ragged, specdec_np.EngineVerifier(seed=0)):
        result = verify(**batch)
        assert result.output_token_ids.shape == (0, 1)
        assert result.accepted_lengths.shape == result.num_accepted.shape == (0,)
        assert result.output_token_ids.dtype == np.int64


def test_an_empty_call_keeps_the_engine_metrics_and_generator_consistent():
    engine = specdec_np.EngineVerifier(seed=0)
    engine(**_ragged())
    before = copy.deepcopy(engine.metrics)
    state = engine._own_generator.numpy.bit_generator.state
    engine(num_draft_tokens=[], draft_token_ids=[], target_probs=np.zeros((0, VOCAB)))
    assert engine.metrics == before
    assert engine._own_generator.numpy.bit_generator.state == state
    # A fresh engine's first call may be empty: nothing recorded, nothing drawn.
    fresh = specdec_np.EngineVerifier(seed=0)
    fresh(num_draft_tokens=[], draft_token_ids=[], target_probs=np.zeros((0, VOCAB)))
    assert fresh.metrics == specdec_np.VerificationMetrics()
    assert fresh.metrics.acceptance_by_position.shape == (0,)


# -- 9. metrics and generators move together ------------------------------------------------


def test_keyboard_interrupt_leaves_engine_metrics_and_generator_together():
    batch = _ragged(seed=3, counts=(2, 1, 3))
    make = lambda: specdec_np.EngineVerifier("rejection", seed=5)  # noqa: E731
    _, total = interrupted(lambda: make()(**batch), at=10**9)
    _, in_record = interrupted(lambda: make()(**batch), at=10**9, only="record")
    assert in_record > 0
    rng = np.random.default_rng(11)
    engine = make()
    problems = []
    for trial in range(2000):
        if trial % 200 == 0:
            engine = make()
        before = (engine.metrics.requests, engine.metrics.drafted, engine.metrics.emitted)
        state = engine._own_generator.numpy.bit_generator.state
        only = "record" if trial % 2 else None
        at = int(rng.integers(1, (in_record if only else total) + 2))
        interrupted(functools.partial(engine, **batch), at, only)
        after = (engine.metrics.requests, engine.metrics.drafted, engine.metrics.emitted)
        moved = engine._own_generator.numpy.bit_generator.state != state
        widths = engine.metrics.accepted_at.shape[0], engine.metrics.drafted_at.shape[0]
        if after == before and moved:
            problems.append((trial, at, only, "generator moved, metrics did not"))
        elif after != before and not moved:
            problems.append((trial, at, only, "metrics moved, generator did not"))
        elif after != before and after != (before[0] + 3, before[1] + 6, after[2]):
            problems.append((trial, at, only, f"metrics half updated: {before} -> {after}"))
        elif widths[0] != widths[1]:
            problems.append((trial, at, only, "per-position counts of unequal length"))
    assert not problems, problems[:5]


def test_one_engine_verifier_shared_by_threads_counts_every_call():
    batch = _ragged(seed=4)
    engine = specdec_np.EngineVerifier("block", seed=1)
    calls = 200

    def worker() -> None:
        for _ in range(calls):
            engine(**batch)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert engine.metrics.requests == 4 * calls * 3
    assert engine.metrics.drafted == 4 * calls * 5


# -- 13. clear errors ---------------------------------------------------------------------


def test_uint64_counts_are_printed_as_they_are():
    batch = _ragged()
    batch["num_draft_tokens"] = np.array([2**64 - 1, 0, 3], dtype=np.uint64)
    with pytest.raises(ValueError, match="18446744073709551615"):
        specdec_np.verify_ragged(**batch)


@pytest.mark.parametrize("field", ["output_token_ids", "accepted_lengths"])
def test_wrong_rank_or_list_out_fields_name_the_field(field: str):
    batch = _ragged()
    good = specdec_np.output_buffers(3, 3)
    with pytest.raises(TypeError, match=f"out.{field}"):
        specdec_np.verify_ragged(**batch, out=good._replace(**{field: [0, 0, 0]}))
    flat = np.zeros(good._asdict()[field].size + 1, dtype=np.int64)[1:]
    with pytest.raises(ValueError, match="out"):
        specdec_np.verify_ragged(**batch, out=good._replace(**{field: flat.reshape(-1, 1)}))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_greedy_rows_without_a_finite_logit_emit_token_0_and_sampled_ones_are_refused(dtype):
    """The documented decision (docs/semantics.md §2.5): a greedy request on a row masked
    to -inf emits token 0 on every surface (numpy.argmax's and vLLM's answer); a sampled
    request on it has no law and is a ValueError."""
    masked = np.full((3, VOCAB), -np.inf, dtype=dtype)
    ragged = {"num_draft_tokens": [2], "draft_token_ids": [3, 4], "target_logits": masked}
    greedy = specdec_np.verify_ragged(**ragged, temperature=0.0)
    assert greedy.output_token_ids.tolist() == [[0, -1, -1]]
    tree = specdec_np.verify_tree(
        num_nodes=[2], tree_parents=[-1, 0], draft_token_ids=[3, 4], target_logits=masked,
        method="greedy",
    )  # fmt: skip
    assert tree.output_token_ids.tolist() == [[0, -1, -1]]
    assert specdec_np.sample_tokens(logits=masked[:1], temperature=0.0).tolist() == [0]
    with pytest.raises(ValueError, match="target_logits"):
        specdec_np.verify_ragged(**ragged, temperature=1.0, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="logits"):
        specdec_np.sample_tokens(logits=masked[:1], temperature=1.0)


@pytest.mark.parametrize("source", ["generator", "counter_seeds", "uniforms"])
def test_tree_uniforms_cost_the_batch_not_batch_times_the_biggest_tree(source):
    """One tree of 3000 nodes among 3000 empty requests: the uniforms are laid out flat
    (N + B entries), not [B, max_nodes + 1] (72 MB here). Explicit uniforms keep their
    [B, max_nodes + 1] form (the caller made them) and are compacted."""
    import tracemalloc

    big, empty = 3000, 3000
    counts = np.array([big] + [0] * empty)
    parents = np.full(big, -1)  # one root with `big` children
    rows = np.full((big + counts.size, 2), 0.5)
    keywords = {
        "num_nodes": counts, "tree_parents": parents, "draft_token_ids": np.zeros(big, int),
        "target_probs": rows, "method": "point_mass",
    }  # fmt: skip
    if source == "generator":
        keywords["generator"] = np.random.default_rng(0)
    elif source == "counter_seeds":
        keywords["counter_seeds"] = {b: (b, 7) for b in range(counts.size)}
    expected = specdec_np.verify_tree(**keywords)
    if source == "uniforms":
        keywords["uniforms"] = np.full((counts.size, big + 1), 0.25)
    tracemalloc.start()
    try:
        result = specdec_np.verify_tree(**keywords)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    explicit = keywords["uniforms"].nbytes if source == "uniforms" else 0
    # The explicit array is copied once (the private copy the kernel reads).
    assert peak < 2 * explicit + 16 * 2**20, peak
    assert result.output_token_ids.shape == expected.output_token_ids.shape


@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_draft_rows_a_method_ignores_are_still_refused_when_masked(kind):
    """What a call accepts does not depend on the method: the draft rows of a method that
    does not read them (registry ``reads_draft_probs`` False) are refused as masked arrays or
    matrices too, on every layout."""
    rows = np.full((3, VOCAB), 1.0 / VOCAB)
    drafts = rows[:2]
    bad = np.ma.masked_array(drafts) if kind == "masked" else np.asmatrix(drafts)
    for verifier in specdec_np.registry.VERIFIERS:
        if verifier.reads_draft_probs:
            continue
        with pytest.raises(TypeError, match="draft_probs"):
            specdec_np.verify_ragged(
                num_draft_tokens=[2], draft_token_ids=[1, 2], target_probs=rows,
                draft_probs=bad, method=verifier.name,
            )  # fmt: skip
    for method in specdec_np.registry.TREE_METHODS:
        if method.reads_draft_probs:
            continue
        with pytest.raises(TypeError, match="draft_probs"):
            specdec_np.verify_tree(
                num_nodes=[2], tree_parents=[-1, 0], draft_token_ids=[1, 2], target_probs=rows,
                draft_probs=bad, method=method.name,
            )  # fmt: skip


# -- 1. no kernel keeps large buffers on the stack ----------------------------------------

# Every logits path that takes the law's scratch: the gathered top-k and top-p survivors
# (32 KiB for float64 rows), the radix select's histogram and the draw's block sums.  A
# child interpreter runs them, so that a stack overflow is a return code.
_SMALL_STACK_CALLS = """
import numpy as np
import specdec_np
from specdec_np import registry

def run_all():
    rng = np.random.default_rng(0)
    vocab = 40_000
    for dtype in (np.float32, np.float64):
        counts = np.array([2, 0, 3, 1], dtype=np.int64)
        rows = int(counts.sum()) + counts.size
        logits = rng.standard_normal((rows, vocab)).astype(dtype)
        ids = rng.integers(0, vocab, int(counts.sum()))
        for top_k, top_p, min_p in ((50, 0.95, 0.0), (0, 0.9, 0.0), (0, 0.9, 0.01),
                                    (3000, 0.5, 0.0), (0, 1.0, 0.0)):
            params = dict(temperature=np.full(4, 0.7), top_k=np.full(4, top_k),
                          top_p=np.full(4, top_p), min_p=np.full(4, min_p))
            for method in registry.names():
                specdec_np.verify_ragged(
                    num_draft_tokens=counts, draft_token_ids=ids, target_logits=logits,
                    method=method, generator=np.random.default_rng(1), **params)
            for tree_method in registry.tree_method_names():
                specdec_np.verify_tree(
                    num_nodes=np.array([3, 1]), tree_parents=np.array([-1, 0, 0, -1]),
                    draft_token_ids=ids[:4], target_logits=logits[:6], method=tree_method,
                    generator=np.random.default_rng(1), temperature=np.full(2, 0.7),
                    top_k=np.full(2, top_k), top_p=np.full(2, top_p), min_p=np.full(2, min_p))
            specdec_np.processed_probs(logits[:3], temperature=0.7, top_k=top_k,
                                       top_p=top_p, min_p=min_p)
"""


def test_the_logits_paths_run_in_a_thread_with_a_32_kib_stack():
    """Python's smallest thread stack (32 KiB) holds every logits path."""
    from test_hardening import run_python

    result = run_python(
        _SMALL_STACK_CALLS
        + """
import threading
threading.stack_size(32768)
failures = []
def guarded():
    try:
        run_all()
    except BaseException as error:  # reported to the parent through stdout
        failures.append(repr(error))
thread = threading.Thread(target=guarded)
thread.start()
thread.join()
print("failures:", failures)
""",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "failures: []" in result.stdout, result.stdout


def test_the_logits_paths_run_under_omp_stacksize_16k():
    """OpenMP worker threads with 16 KiB stacks hold every logits path: the batch is large
    enough for the kernels to use two threads."""
    from test_hardening import run_python

    result = run_python(
        _SMALL_STACK_CALLS.replace("vocab = 40_000", "vocab = 300_000")
        + "\nrun_all()\nprint('done')\n",
        env={"OMP_STACKSIZE": "16K", "OMP_NUM_THREADS": "2"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done" in result.stdout


# --- no walk quadratic in siblings: the cost of a 4x bigger tree, by CPU time ----------------

TREE_VOCAB = 8


def _least_cpu_seconds(calls, repeats: int = 5) -> list[float]:
    """The least CPU time (``time.process_time``) of each call over ``repeats`` rounds,
    the calls interleaved: CPU time, not wall time, so that other processes on the machine
    hardly count; the least, so that a stall of one call does not; interleaved, so that a
    slow spell of the machine weighs on every call alike."""
    import time

    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.process_time()
            call()
            best[i] = min(best[i], time.process_time() - start)
    return best


def _rejected_siblings(method: registry.TreeMethod, chain: int, siblings: int):
    """The CPU tree driver's call on one tree: a chain of ``chain`` nodes (each accepted)
    whose deepest node has ``siblings`` children at the end of the request, all rejected;
    with ``chain = 0`` a star of the root's children.  The walk tests every sibling.  Their
    tokens have no target mass: the first half share token 1, the rest cycle through
    2 .. V - 1, so that each of those repeats a token first proposed half the list away (a
    scan of the earlier siblings for it is long) while the distinct tokens stay few (V
    small).  The inputs and outputs are made once: only the walk is timed, not the
    allocator's page faults.  The public call on the same tree is checked to agree."""
    total = chain + siblings
    parents = np.concatenate([np.arange(-1, chain - 1), np.full(siblings, chain - 1)])
    half = siblings // 2
    tokens = np.concatenate(
        [
            np.zeros(chain, np.int64),
            np.ones(half, np.int64),
            2 + np.arange(siblings - half, dtype=np.int64) % (TREE_VOCAB - 2),
        ]
    )
    target = np.zeros((total + 1, TREE_VOCAB))
    target[:, 0] = 1.0  # the chain's token 0 is accepted, every sibling rejected
    draft = np.full((total, TREE_VOCAB), 1.0 / TREE_VOCAB)
    uniforms = np.full(total + 1, 0.5)
    keywords = {
        "num_nodes": np.array([total]), "tree_parents": parents, "draft_token_ids": tokens,
        "target_probs": target, "method": method.name, "uniforms": uniforms[None, :],
    }  # fmt: skip
    if method.reads_draft_probs:
        keywords["draft_probs"] = draft
    result = specdec_np.verify_tree(**keywords)
    assert int(result.accepted_lengths[0]) == chain  # every sibling was tested, in vain
    assert int(result.output_token_ids[0, chain]) == 0
    offsets = np.array([0, total], np.int64)
    arguments = (
        method.code, target, draft, not method.reads_draft_probs, tokens,
        parents, offsets, *_tree_links.tree_links(offsets, parents, tokens), uniforms,
        np.empty((1, chain + 1), np.int64), np.empty((1, chain + 2), np.int64),
        lengths := np.empty(1, np.int64), np.empty(1, np.int64), 1,
    )  # fmt: skip

    working = np.empty((1, method.working_rows(chain + 1) * TREE_VOCAB))

    def call() -> None:
        assert _core.verify_trees(*arguments, working=working) == -1
        assert int(lengths[0]) == chain

    return call


@pytest.mark.parametrize("method", registry.TREE_METHODS, ids=lambda method: method.name)
@pytest.mark.parametrize("chain", [0, 60], ids=["star", "deep-chain"])
def test_no_tree_walk_is_quadratic_in_siblings(method: registry.TreeMethod, chain: int):
    """20000 siblings (a star, or a far away list under a chain of depth 60) with few
    distinct tokens, for every tree method: 4x the siblings cost far less than 16x
    (quadratic) the CPU time.
    Before the child links, point-mass candidates scanned the earlier siblings for each
    sibling's token, and RRS did so for every earlier sibling inside its loop over them
    (cubic): a tree of 10^4 siblings hung."""
    small = _rejected_siblings(method, chain, 20000)
    large = _rejected_siblings(method, chain, 80000)
    small_seconds, large_seconds = _least_cpu_seconds([small, large], repeats=7)
    ratio = large_seconds / max(small_seconds, 1e-6)
    assert ratio < 10, (ratio, small_seconds, large_seconds)
