"""Sources of uniforms (docs/semantics.md §5): sampler generator, seeded_seqs, counter
seeds, explicit.

The inputs are flat targets with unrelated drafts over a vocabulary of 50, so that the
output of a row changes with almost any change of its uniforms: equal outputs across
calls mean equal uniforms, and different uniforms show up as different outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np

K = 4
V = 50


def make_inputs(batch_size, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.ones(V), size=(batch_size, K + 1)).astype(dtype)
    draft = rng.dirichlet(np.ones(V), size=(batch_size, K)).astype(dtype)
    draft_ids = rng.integers(0, V, (batch_size, K))
    bonus = rng.integers(0, V, (batch_size, 1))
    return target, bonus, draft, draft_ids


def row_inputs(inputs, row):
    """Row ``row`` of a batch as a batch of one."""
    return tuple(a[row : row + 1] for a in inputs)


def place_row(row_inputs_, batch_size, row, seed):
    """A batch of other rows with ``row_inputs_`` at index ``row``."""
    batch = [a.copy() for a in make_inputs(batch_size, seed)]
    for a, r in zip(batch, row_inputs_):
        a[row] = r[0]
    return tuple(batch)


def assert_same_result(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------------------
# seeded_seqs
# --------------------------------------------------------------------------------------


def test_seeded_rows_repeat_with_fresh_generators():
    inputs = make_inputs(6)
    seeds = {1: 11, 4: 44}
    results = [
        specdec_np.rejection_sample(
            *inputs, seeded_seqs={b: np.random.default_rng(s) for b, s in seeds.items()}
        )
        for _ in range(3)
    ]
    for result in results[1:]:
        for b in seeds:
            np.testing.assert_array_equal(
                result.output_token_ids[b], results[0].output_token_ids[b]
            )
            assert result.num_accepted[b] == results[0].num_accepted[b]


def test_seeded_row_consumes_k_plus_1_uniforms_in_documented_order():
    inputs = make_inputs(3)
    generator = np.random.default_rng(5)
    seeded = specdec_np.rejection_sample(*inputs, seeded_seqs={2: generator})
    expected_uniforms = np.random.default_rng(5).random(K + 1)
    explicit = specdec_np.rejection_sample(
        *row_inputs(inputs, 2), uniforms=expected_uniforms[None, :]
    )
    np.testing.assert_array_equal(seeded.output_token_ids[2], explicit.output_token_ids[0])
    # Exactly k + 1 draws were taken: the next draw is the (k + 2)-th of a fresh copy.
    fresh = np.random.default_rng(5)
    fresh.random(K + 1)
    assert generator.random() == fresh.random()


@settings(max_examples=40, deadline=None)
@given(
    batch_size=st.integers(2, 8),
    data=st.data(),
    seed=st.integers(0, 2**63 - 1),
)
def test_seeded_row_alone_equals_seeded_row_in_batch(batch_size, data, seed):
    row = data.draw(st.integers(0, batch_size - 1))
    inputs = make_inputs(1, seed=seed % 1000)
    alone = specdec_np.rejection_sample(*inputs, seeded_seqs={0: np.random.default_rng(seed)})
    batch = place_row(inputs, batch_size, row, seed=seed % 997 + 1)
    inside = specdec_np.rejection_sample(
        *batch,
        seeded_seqs={row: np.random.default_rng(seed)},
        generator=np.random.default_rng(seed + 1),
    )
    np.testing.assert_array_equal(inside.output_token_ids[row], alone.output_token_ids[0])
    assert inside.accepted_lengths[row] == alone.accepted_lengths[0]
    assert inside.num_accepted[row] == alone.num_accepted[0]


def test_unseeded_rows_vary_between_calls():
    inputs = make_inputs(16)
    first = specdec_np.rejection_sample(*inputs, seeded_seqs={0: np.random.default_rng(1)})
    second = specdec_np.rejection_sample(*inputs, seeded_seqs={0: np.random.default_rng(1)})
    np.testing.assert_array_equal(first.output_token_ids[0], second.output_token_ids[0])
    assert not np.array_equal(first.output_token_ids[1:], second.output_token_ids[1:])
    sampler = specdec_np.RejectionSampler()
    assert not np.array_equal(sampler(*inputs), sampler(*inputs))


def test_sampler_seed_is_reproducible():
    inputs = make_inputs(8)
    a = specdec_np.RejectionSampler(seed=123)
    b = specdec_np.RejectionSampler(seed=123)
    outputs_a = [a(*inputs) for _ in range(3)]
    outputs_b = [b(*inputs) for _ in range(3)]
    for x, y in zip(outputs_a, outputs_b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(outputs_a[0], outputs_a[1])  # the generator moves on
    assert not np.array_equal(outputs_a[0], specdec_np.RejectionSampler(seed=124)(*inputs))
    assert int(a.num_emitted_tokens) == int(b.num_emitted_tokens)


# --------------------------------------------------------------------------------------
# Counter-based seeds
# --------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    batch_size=st.integers(1, 8),
    data=st.data(),
    seed=st.integers(0, 2**64 - 1),
    position=st.integers(0, 2**64 - 1),
)
def test_counter_seeds_independent_of_batch_layout(batch_size, data, seed, position):
    row = data.draw(st.integers(0, batch_size - 1))
    other = data.draw(st.sets(st.integers(0, batch_size - 1)))
    inputs = make_inputs(1, seed=seed % 1000)
    expected_uniforms = specdec_np.counter_uniforms([seed], [position], K + 1)
    assert expected_uniforms.shape == (1, K + 1) and expected_uniforms.dtype == np.float64
    explicit = specdec_np.rejection_sample(*inputs, uniforms=expected_uniforms)
    alone = specdec_np.rejection_sample(*inputs, counter_seeds={0: (seed, position)})
    assert_same_result(alone, explicit)
    batch = place_row(inputs, batch_size, row, seed=position % 997 + 1)
    counter_seeds = {b: (b + 7, b) for b in other - {row}}
    counter_seeds[row] = (seed, position)
    inside = specdec_np.rejection_sample(*batch, counter_seeds=counter_seeds)
    np.testing.assert_array_equal(inside.output_token_ids[row], explicit.output_token_ids[0])
    assert inside.num_accepted[row] == explicit.num_accepted[0]


def test_counter_seeds_rows_are_pure_functions_of_seed_and_position():
    inputs = make_inputs(4)
    layout = {0: (5, 100), 2: (5, 101), 3: (6, 100)}
    first = specdec_np.rejection_sample(*inputs, counter_seeds=layout)
    second = specdec_np.rejection_sample(
        *inputs, counter_seeds=layout, generator=np.random.default_rng(0)
    )
    for b in layout:
        np.testing.assert_array_equal(first.output_token_ids[b], second.output_token_ids[b])
    uniforms = specdec_np.counter_uniforms([5, 5, 6], [100, 101, 100], K + 1)
    assert not np.array_equal(uniforms[0], uniforms[1])  # another position
    assert not np.array_equal(uniforms[0], uniforms[2])  # another seed
    assert np.all((uniforms >= 0) & (uniforms < 1))
    # A longer request extends the row without changing its first draws.
    np.testing.assert_array_equal(
        specdec_np.counter_uniforms([5], [100], 2 * K + 3)[:, : K + 1], uniforms[:1]
    )


# --------------------------------------------------------------------------------------
# Global state and failures
# --------------------------------------------------------------------------------------


def _global_state():
    return np.random.get_state()  # noqa: NPY002 - the state that must stay untouched


def _assert_global_state_equal(before, after):
    assert before[0] == after[0]
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2:] == after[2:]


def test_no_global_random_state_is_touched():
    np.random.seed(1234)  # noqa: NPY002 - a known global state to compare against
    before = _global_state()
    inputs = make_inputs(5)
    specdec_np.rejection_sample(*inputs)
    specdec_np.rejection_sample(*inputs, generator=np.random.default_rng(1))
    specdec_np.rejection_sample(*inputs, seeded_seqs={1: np.random.default_rng(2)})
    specdec_np.rejection_sample(*inputs, counter_seeds={0: (3, 4)})
    specdec_np.rejection_sample(inputs[0], inputs[1], None, inputs[3])
    sampler = specdec_np.RejectionSampler()
    sampler(*inputs)
    sampler(*inputs, {2: np.random.default_rng(3)}, counter_seeds={4: (1, 1)})
    specdec_np.RejectionSampler(seed=9)(*inputs)
    specdec_np.counter_uniforms([1, 2], [3, 4], 7)
    _assert_global_state_equal(before, _global_state())


def _bad_inputs(batch_size=3):
    target, bonus, draft, draft_ids = make_inputs(batch_size)
    draft_ids = draft_ids.copy()
    draft_ids[batch_size - 1, K - 1] = V  # one past the vocabulary
    return target, bonus, draft, draft_ids


def _generator_state(generator):
    return generator.bit_generator.state


def test_failing_call_leaves_generators_and_counters_alone():
    good = make_inputs(3)
    sampler = specdec_np.RejectionSampler(seed=77)
    twin = specdec_np.RejectionSampler(seed=77)
    sampler(*good)
    twin(*good)
    counters = (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )
    seeded = np.random.default_rng(8)
    with pytest.raises(ValueError, match=r"draft_token_ids.*\(2, 3\)"):
        sampler(*_bad_inputs(), {0: seeded})
    assert (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    ) == counters
    # The next draws equal those of fresh copies that never saw the failing call.
    assert seeded.random() == np.random.default_rng(8).random()
    np.testing.assert_array_equal(sampler(*good), twin(*good))


def test_failing_stateless_call_restores_generators():
    generator = np.random.default_rng(21)
    seeded = np.random.default_rng(22)
    before = (_generator_state(generator), _generator_state(seeded))
    with pytest.raises(ValueError, match="draft_token_ids"):
        specdec_np.rejection_sample(*_bad_inputs(), generator=generator, seeded_seqs={1: seeded})
    assert (_generator_state(generator), _generator_state(seeded)) == before


BAD_SOURCES = {
    "negative counter seed": ({2: (-1, 0)}, None, ValueError, "counter_seeds"),
    "counter seed 2**64": ({2: (2**64, 0)}, None, ValueError, "counter_seeds"),
    "counter position 2**64": ({2: (1, 2**64)}, None, ValueError, "counter_seeds"),
    "counter seed not a pair": ({2: 5}, None, TypeError, None),
    "seeded_seqs value not a generator": (None, "not a generator", TypeError, None),
}


@pytest.mark.parametrize("name", BAD_SOURCES)
def test_bad_seed_source_restores_generators(name):
    """A bad counter seed or seeded_seqs entry is found after other rows' uniforms may
    have been drawn; the failed call must still leave every generator as it was and raise
    TypeError/ValueError (docs/semantics.md §5.3 and §8)."""
    counter_seeds, bad_generator, error, match = BAD_SOURCES[name]
    generator = np.random.default_rng(31)
    seeded = np.random.default_rng(32)
    seeded_seqs = {1: seeded}
    if bad_generator is not None:
        seeded_seqs[2] = bad_generator
    before = (_generator_state(generator), _generator_state(seeded))
    with pytest.raises(error, match=match):
        specdec_np.rejection_sample(
            *make_inputs(3),
            generator=generator,
            seeded_seqs=seeded_seqs,
            counter_seeds=counter_seeds,
        )
    after = (_generator_state(generator), _generator_state(seeded))
    assert after == before, "a failed call advanced the generator or a seeded_seqs generator"


def test_bad_counter_seed_leaves_sampler_generator_alone():
    good = make_inputs(3)
    sampler = specdec_np.RejectionSampler(seed=41)
    twin = specdec_np.RejectionSampler(seed=41)
    with pytest.raises(ValueError, match="counter_seeds"):
        sampler(*good, counter_seeds={0: (-5, 0)})
    assert sampler.num_accepted_tokens is None or int(sampler.num_accepted_tokens) == 0
    assert sampler.num_draft_tokens == 0
    np.testing.assert_array_equal(sampler(*good), twin(*good))


def test_conflicting_sources_raise():
    inputs = make_inputs(3)
    uniforms = np.full((3, K + 1), 0.5)
    with pytest.raises(ValueError, match="uniforms"):
        specdec_np.rejection_sample(
            *inputs, uniforms=uniforms, seeded_seqs={0: np.random.default_rng(0)}
        )
    with pytest.raises(ValueError, match="uniforms"):
        specdec_np.RejectionSampler()(*inputs, {0: np.random.default_rng(0)}, uniforms=uniforms)
    with pytest.raises(ValueError, match="uniforms"):
        specdec_np.rejection_sample(*inputs, uniforms=uniforms, counter_seeds={0: (1, 2)})
    with pytest.raises(ValueError, match="both"):
        specdec_np.rejection_sample(
            *inputs, seeded_seqs={1: np.random.default_rng(0)}, counter_seeds={1: (1, 2)}
        )
    for key in (3, -1, 100):
        with pytest.raises(ValueError, match="seeded_seqs"):
            specdec_np.rejection_sample(*inputs, seeded_seqs={key: np.random.default_rng(0)})
        with pytest.raises(ValueError, match="counter_seeds"):
            specdec_np.rejection_sample(*inputs, counter_seeds={key: (1, 2)})


def test_counter_stream_rows_are_counter_uniforms_and_rewind():
    """The sampler's GPU source: row n of the stream is counter_uniforms(key, n), and a
    snapshot rewinds it (checked here on NumPy; the GPU tests run it on CuPy)."""
    from specdec_np._runtime import uniforms as _random

    stream = _random.CounterStream(12345, np)
    first = stream.random((3, 5))
    expected = specdec_np.counter_uniforms(
        np.full(3, 12345, np.uint64), np.arange(3, dtype=np.uint64), 5
    )
    np.testing.assert_array_equal(first, expected)
    log = _random.DrawLog()
    second = log.random(stream, (2, 5))
    log.undo()
    np.testing.assert_array_equal(stream.random((2, 5)), second)
    assert stream.state == 5


def test_a_failed_call_puts_back_only_its_own_draws():
    """A logged draw is undone when nothing drew since; after another draw of the same
    generator (another thread's) it is left alone, so no uniform is handed out twice."""
    from specdec_np._runtime import uniforms as _random

    for make in (lambda: np.random.default_rng(3), lambda: _random.CounterStream(7, np)):
        generator = make()
        log = _random.DrawLog()
        mine = log.random(generator, (2, 3))
        log.undo()
        np.testing.assert_array_equal(generator.random((2, 3)), mine)

        generator = make()
        log = _random.DrawLog()
        mine = log.random(generator, (2, 3))
        theirs = generator.random((1, 3))  # another thread, after the call drew
        log.undo()
        following = generator.random((4, 3))
        seen = np.concatenate([mine.ravel(), theirs.ravel()])
        assert not np.isin(following.ravel(), seen).any(), "a uniform was handed out twice"


def test_no_rewind_over_a_draw_made_between_the_saved_state_and_the_call():
    """Another thread draws between the state a call saves and its own draw: the replay
    from the saved state does not reach the generator's state, so nothing is rewound."""
    from specdec_np._runtime import uniforms as _random

    generator = np.random.default_rng(11)
    log = _random.DrawLog()
    log._draws.append(_random._Draw(generator, (2,), generator.bit_generator.state))
    theirs = generator.random(1)  # drawn after the state was saved, before the call's draw
    mine = generator.random(2)
    log.undo()
    following = generator.random(8)
    assert not np.isin(following, np.concatenate([theirs, mine])).any()


@pytest.mark.parametrize("size", [1, 5, (2, 3)])
@pytest.mark.parametrize("halves", [0, 1, 2], ids=["none", "one buffered", "two"])
def test_a_pcg64_draw_is_put_back_from_the_draw_itself(size, halves):
    """undo_pcg64_draw: the state before the draw comes back (a buffered 32-bit half
    included); after another draw (another thread's) nothing is rewound; a draw made by
    another thread before this one stays made."""
    from specdec_np._runtime import uniforms as _random

    generator = np.random.default_rng(3)
    generator.integers(0, 2**32, halves, dtype=np.uint32)  # an odd count buffers a half
    before = generator.bit_generator.state
    mine = generator.random(size)
    _random.undo_pcg64_draw(generator, mine)
    assert generator.bit_generator.state == before
    np.testing.assert_array_equal(generator.random(size), mine)

    mine = generator.random(size)
    theirs = generator.random(1)  # after the call drew: left alone
    after = generator.bit_generator.state
    _random.undo_pcg64_draw(generator, mine)
    assert generator.bit_generator.state == after
    assert not np.isin(generator.random(8), np.append(mine, theirs)).any()

    generator.random(2)  # before the call's draw: stays drawn
    between = generator.bit_generator.state
    _random.undo_pcg64_draw(generator, generator.random(size))
    assert generator.bit_generator.state == between
    # A negative control: values that are not the draw's rewind nothing.
    generator.random(size)
    moved = generator.bit_generator.state
    _random.undo_pcg64_draw(generator, np.zeros(size))
    assert generator.bit_generator.state == moved


def test_a_failed_call_does_not_repeat_other_threads_uniforms():
    """End to end: calls that fail late (the kernel finds a target row
    without mass after the draws) share a generator with a thread that draws from it
    directly; none of that thread's uniforms may come out twice."""
    import threading
    import time

    rng = np.random.default_rng(0)
    shared = np.random.default_rng(1)
    # Rows long enough that the kernel (which releases the GIL) gives the drawing thread
    # time to draw between a failing call's draws and its undo.
    batch, k, vocab = 16, 1, 100_000
    target = rng.random((batch, k + 1, vocab))
    target[:, 0] = 0.0  # position 0 rejected on a row without mass: a late ValueError
    draft = rng.random((batch, k, vocab))
    ids = rng.integers(0, vocab, (batch, k))
    bonus = np.zeros((batch, 1), dtype=np.int64)
    direct: list[np.ndarray] = []
    stop = threading.Event()

    def failing() -> None:
        while not stop.is_set():
            with pytest.raises(ValueError, match="no positive probability"):
                specdec_np.rejection_sample(target, bonus, draft, ids, generator=shared)

    def drawing() -> None:
        for _ in range(3000):
            direct.append(shared.random(4))
            time.sleep(0)
        stop.set()

    threads = [threading.Thread(target=failing) for _ in range(2)]
    threads.append(threading.Thread(target=drawing))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    values = np.concatenate(direct)
    assert np.unique(values).size == values.size, "uniforms were handed out twice"


def test_counter_stream_uniforms_reach_the_kernel_contiguous():
    """An odd k + 1 makes the counter stream return a column slice; the verifier must hand
    the kernel a row-major array all the same (the GPU launchers insist on it)."""
    from specdec_np._runtime import uniforms as _random

    sources = _random.RejectionUniforms(3, 4, np, generator=_random.CounterStream(7, np))
    draws = sources.draw()
    assert draws.shape == (3, 5) and draws.flags["C_CONTIGUOUS"]
