"""Verification across vocabulary shards (specdec_np.sharded) on simulated ranks.

Each test runs the ranks as threads (``run_local``) and checks every rank's result against
``specdec_np.verify_ragged`` on the whole rows with the same uniforms: token for token,
which fixes the law as a function of the uniforms (the unsharded law is proven exact
elsewhere).  A stratified-uniform law check ties the emitted law to ``processed_probs``
directly, and negative controls (a shard that normalises locally, a draw that picks its
shard by width) must fail both checks.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types

import numpy as np
import pytest

import specdec_np
from specdec_np import sharded
from specdec_np._runtime import arrays as runtime_arrays
from specdec_np._sharded import rows as shard_rows

TIMEOUT = 60


def _cuts(widths: list[int]) -> list[int]:
    return [0, *np.cumsum(widths).tolist()]


def _columns(value, start, end):
    return None if value is None else value[:, start:end]


def run_sharded(widths, **arguments):
    """Every rank's result for shards of ``widths`` (rank r holds the r-th slice); all
    ranks must agree."""
    cuts = _cuts(widths)
    vocab_size = cuts[-1]
    row_names = ("target_logits", "target_probs", "draft_logits", "draft_probs")

    def rank_call(communicator):
        r = communicator.rank
        start, end = cuts[r], cuts[r + 1]
        local = {
            name: (_columns(value, start, end) if name in row_names else value)
            for name, value in arguments.items()
        }
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size, **local
        )

    results = sharded.run_local(len(widths), rank_call, timeout=TIMEOUT)
    for other in results[1:]:
        np.testing.assert_array_equal(other.output_token_ids, results[0].output_token_ids)
        np.testing.assert_array_equal(other.accepted_lengths, results[0].accepted_lengths)
    return results[0]


def _batch(rng, vocab_size, counts, dtype, draft_form):
    """A ragged batch whose drafts are often accepted: the draft's logits are the target's
    plus noise, and most drafts are the draft's argmax."""
    counts = np.asarray(counts)
    total = int(counts.sum())
    batch_size = counts.size
    target = (rng.normal(size=(total + batch_size, vocab_size)) * 2).astype(dtype)
    # Target row of each draft position: request b's rows start at offset_b + b.
    request = np.repeat(np.arange(batch_size), counts)
    rows = np.arange(total) + request
    draft = (target[rows] + 0.7 * rng.normal(size=(total, vocab_size))).astype(dtype)
    drafted = np.where(
        rng.random(total) < 0.7, np.argmax(draft, axis=1), rng.integers(0, vocab_size, total)
    )
    arguments = {
        "num_draft_tokens": counts,
        "draft_token_ids": drafted,
        "target_logits": target,
    }
    if draft_form == "logits":
        arguments["draft_logits"] = draft
    elif draft_form == "probs":
        probs = np.exp(draft - draft.max(axis=1, keepdims=True))
        arguments["draft_probs"] = (probs / probs.sum(axis=1, keepdims=True)).astype(dtype)
    return arguments


SETTINGS = {
    "plain": {},
    "temperature": {"temperature": [0.7, 1.3, 0.9, 1.0]},
    "top_k": {"temperature": 0.8, "top_k": [3, 0, 17, 40]},
    "top_p": {"temperature": 1.1, "top_p": [0.8, 0.5, 1.0, 0.95]},
    "min_p": {"min_p": [0.1, 0.0, 0.3, 0.05]},
    "all": {"temperature": [0.6, 1.0, 1.5, 0.9], "top_k": [5, 12, 0, 2],
            "top_p": [0.9, 0.6, 0.7, 1.0], "min_p": [0.02, 0.1, 0.0, 0.2]},
    "greedy_mixed": {"temperature": [0.0, 0.8, 0.0, 1.2], "top_k": [0, 6, 0, 0],
                     "top_p": [1.0, 1.0, 1.0, 0.7]},
}


def _settings(name):
    return {key: np.asarray(value) for key, value in SETTINGS[name].items()}


def _compare(widths, arguments, rng, trials):
    """Tokens of the sharded and the unsharded call for ``trials`` uniform draws."""
    counts = arguments["num_draft_tokens"]
    mismatches = 0
    for _ in range(trials):
        uniforms = rng.random((counts.size, int(counts.max()) + 2))
        expected = specdec_np.verify_ragged(uniforms=uniforms, **arguments)
        found = run_sharded(widths, uniforms=uniforms, **arguments)
        same = np.array_equal(found.output_token_ids, expected.output_token_ids) and (
            np.array_equal(found.accepted_lengths, expected.accepted_lengths)
        )
        mismatches += not same
    return mismatches


@pytest.mark.parametrize(
    "widths", [[40], [13, 27], [1, 20, 19], [7, 0, 30, 3]], ids=lambda w: "-".join(map(str, w))
)
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_tokens_equal_the_unsharded_call(widths, setting):
    rng = np.random.default_rng(len(widths) * 100 + sorted(SETTINGS).index(setting))
    arguments = _batch(rng, sum(widths), [2, 0, 3, 1], np.float32, "logits")
    arguments.update(_settings(setting))
    assert _compare(widths, arguments, rng, trials=12) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("draft_form", ["logits", "probs", None])
@pytest.mark.parametrize("bonus", [False, True])
def test_forms_dtypes_and_bonus(dtype, draft_form, bonus):
    rng = np.random.default_rng(7)
    arguments = _batch(rng, 33, [3, 1, 0, 2], dtype, draft_form)
    arguments.update(_settings("all"))
    if bonus:
        arguments["bonus_token_ids"] = np.array([1, 2, 3, 4])
    assert _compare([5, 11, 17], arguments, rng, trials=10) == 0


@pytest.mark.parametrize("draft_form", ["logits", "probs", None])
@pytest.mark.parametrize("setting", ["plain", "all", "greedy_mixed"])
def test_block_verification(draft_form, setting):
    rng = np.random.default_rng(17)
    arguments = _batch(rng, 31, [3, 0, 4, 1], np.float32, draft_form)
    arguments.update(_settings(setting))
    arguments["method"] = "block"
    assert _compare([9, 0, 22], arguments, rng, trials=10) == 0
    assert _compare([31], arguments, rng, trials=4) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("setting", ["top_k", "top_p", "min_p", "all", "greedy_mixed"])
def test_llama_cpp_order(dtype, setting):
    rng = np.random.default_rng(23)
    arguments = _batch(rng, 37, [2, 3, 0, 1], dtype, "logits")
    arguments.update(_settings(setting))
    arguments["filter_order"] = "llama.cpp"
    # Adjacent logits tie at the temperature only in llama.cpp's order's threshold.
    arguments["temperature"] = np.array([0.6, 1.7, 1.0, 0.9])
    if setting == "greedy_mixed":
        arguments["temperature"] = np.array([0.0, 1.7, 0.0, 0.9])
    assert _compare([12, 0, 25], arguments, rng, trials=10) == 0
    assert _compare([5, 9, 10, 13], arguments, rng, trials=5) == 0


@pytest.mark.parametrize("setting", ["plain", "all", "greedy_mixed"])
@pytest.mark.parametrize("parameters", [(0.09, 0.3), (0.3, 0.0), (0.9, 1.0), (0.9, 2.5)])
def test_typical_acceptance(setting, parameters):
    rng = np.random.default_rng(29)
    arguments = _batch(rng, 26, [3, 0, 2, 4], np.float64, "logits")
    arguments.update(_settings(setting))
    arguments.update(method="typical", posterior_threshold=parameters[0],
                     posterior_alpha=parameters[1])
    assert _compare([8, 18], arguments, rng, trials=6) == 0
    assert _compare([3, 0, 10, 13], arguments, rng, trials=3) == 0


def test_target_probabilities():
    rng = np.random.default_rng(3)
    arguments = _batch(rng, 24, [2, 2, 1], np.float64, "probs")
    logits = arguments.pop("target_logits")
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    arguments["target_probs"] = probs / probs.sum(axis=1, keepdims=True)
    arguments["temperature"] = np.array([1.0, 0.0, 1.0])
    assert _compare([10, 14], arguments, rng, trials=15) == 0


class _Alone:
    """The one rank, in the calling thread: the rank's reused memory stays from call to
    call."""

    rank, size = 0, 1

    def allgather(self, array):
        return np.asarray(array)[np.newaxis]


def test_calls_in_one_thread_reuse_the_weights_memory(monkeypatch):
    """A thread's calls weigh their rows in memory kept from its earlier calls (larger,
    smaller, of another dtype): every call still equals the unsharded one."""
    monkeypatch.setattr(runtime_arrays, "_THREAD_BLOCKS", threading.local())  # none kept
    rng = np.random.default_rng(5)
    blocks = []
    for vocab_size, counts, dtype in [(300, [3, 2, 4], np.float32), (80, [1, 0], np.float64),
                                      (300, [4, 4, 4, 1], np.float32), (57, [2], np.float32)]:
        arguments = _batch(rng, vocab_size, counts, dtype, "logits")
        uniforms = rng.random((len(counts), max(counts) + 2))
        expected = specdec_np.verify_ragged(uniforms=uniforms, **arguments)
        found = sharded.verify_ragged(communicator=_Alone(), vocab_start=0,
                                      vocab_size=vocab_size, uniforms=uniforms, **arguments)
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)
        # Held, so that no two share an id.
        blocks.append(runtime_arrays._THREAD_BLOCKS.shard_weights)
    assert len({id(block) for block in blocks}) == 2  # grown once, then reused


def test_greedy_is_bit_equal_with_ties_across_shards():
    vocab_size = 12
    target = np.zeros((4, vocab_size), dtype=np.float32)
    target[0, [3, 9]] = 5.0  # tied across the shards: the lowest id wins
    target[1, [8, 10]] = 2.0  # tied inside the second shard
    target[2, :] = np.nan
    target[2, 11] = 1.0
    target[3, [0, 6]] = -1.0
    target[3, [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]] = -2.0
    arguments = {
        "num_draft_tokens": np.array([3]),
        "draft_token_ids": np.array([3, 8, 11]),
        "target_logits": target,
        "temperature": 0.0,
    }
    expected = specdec_np.verify_ragged(**arguments)
    for widths in ([6, 6], [4, 0, 8], [3, 3, 3, 3]):
        found = run_sharded(widths, **arguments)
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)
    np.testing.assert_array_equal(expected.output_token_ids, [[3, 8, 11, 0]])


@pytest.mark.parametrize("source", ["generator", "counter_seeds", "seeded_seqs"])
def test_one_shard_matches_every_source(source):
    rng = np.random.default_rng(11)
    arguments = _batch(rng, 29, [2, 3, 0], np.float32, "logits")
    arguments.update({"temperature": np.array([0.9, 0.0, 1.2]), "top_p": 0.9})
    for seed in range(5):
        if source == "generator":
            expected = specdec_np.verify_ragged(
                generator=np.random.default_rng(seed), **arguments
            )
            found = sharded.run_local(
                1,
                lambda communicator, seed=seed: sharded.verify_ragged(
                    communicator=communicator, vocab_start=0, vocab_size=29,
                    generator=np.random.default_rng(seed), **arguments,
                ),
            )[0]
        elif source == "counter_seeds":
            seeds = {0: (seed, 4), 2: (seed + 1, 0)}
            expected = specdec_np.verify_ragged(counter_seeds=seeds, **arguments)
            found = run_sharded([13, 16], counter_seeds=seeds, **arguments)
        else:
            def sources(seed):
                return {0: np.random.default_rng(seed), 2: np.random.default_rng(seed + 7)}

            expected = specdec_np.verify_ragged(seeded_seqs=sources(seed), **arguments)

            def rank_call(communicator, seed=seed):
                start, end = [(0, 10), (10, 29)][communicator.rank]
                local = dict(arguments)
                for name in ("target_logits", "draft_logits"):
                    local[name] = arguments[name][:, start:end]
                # Each rank owns its generator, seeded as every other rank's.
                return sharded.verify_ragged(
                    communicator=communicator, vocab_start=start, vocab_size=29,
                    seeded_seqs=sources(seed), **local,
                )

            found = sharded.run_local(2, rank_call, timeout=TIMEOUT)[0]
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)


def test_seeded_generators_on_every_rank():
    rng = np.random.default_rng(5)
    arguments = _batch(rng, 20, [2, 1], np.float64, "probs")
    expected = specdec_np.verify_ragged(generator=np.random.default_rng(99), **arguments)

    def rank_call(communicator):
        start = [0, 9][communicator.rank]
        end = [9, 20][communicator.rank]
        local = dict(arguments)
        for name in ("target_logits", "draft_probs"):
            local[name] = arguments[name][:, start:end]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=20,
            generator=np.random.default_rng(99), **local,
        )

    for result in sharded.run_local(2, rank_call, timeout=TIMEOUT):
        np.testing.assert_array_equal(result.output_token_ids, expected.output_token_ids)


# ---- the emitted law, by stratified uniforms --------------------------------------------

GRID = 64


def _first_token_law(widths, arguments):
    """The law of request 0's first emitted token over a GRID x GRID stratified grid of
    its (acceptance, residual) uniforms (a one-draft request)."""
    centres = (np.arange(GRID) + 0.5) / GRID
    acceptance, residual = np.meshgrid(centres, centres, indexing="ij")
    uniforms = np.stack(
        [acceptance.ravel(), residual.ravel(), np.full(GRID * GRID, 0.5)], axis=1
    )
    batch = GRID * GRID
    tiled = {
        "num_draft_tokens": np.ones(batch, dtype=np.int64),
        "draft_token_ids": np.repeat(arguments["draft_token_ids"], batch),
        "target_logits": np.tile(arguments["target_logits"], (batch, 1)),
        "draft_logits": np.repeat(arguments["draft_logits"], batch, axis=0),
        "temperature": arguments["temperature"],
        "top_k": arguments["top_k"],
        "top_p": arguments["top_p"],
        "uniforms": uniforms,
    }
    result = run_sharded(widths, **tiled)
    vocab_size = sum(widths)
    return np.bincount(result.output_token_ids[:, 0], minlength=vocab_size) / batch


@pytest.fixture
def law_case():
    rng = np.random.default_rng(2)
    vocab_size = 9
    target = np.array([[1.5, 0.2, 2.0, 1.9, -1.0, 0.7, 1.8, 0.1, 1.0],
                       [0.0] * vocab_size], dtype=np.float32)
    draft = rng.normal(size=(1, vocab_size)).astype(np.float32) * 2
    case = {
        "draft_token_ids": np.array([int(np.argmax(draft[0]))]),
        "target_logits": target,
        "draft_logits": draft,
        "temperature": 0.9,
        "top_k": 6,
        "top_p": 0.85,
    }
    law = specdec_np.processed_probs(
        target[:1], temperature=0.9, top_k=6, top_p=0.85
    )[0].astype(np.float64)
    return case, law


@pytest.mark.slow
def test_emitted_law_is_the_processed_law(law_case):
    case, law = law_case
    # The kept set [0, 2, 3, 5, 6, 8] spans every shard.
    for widths in ([4, 5], [2, 3, 4]):
        found = _first_token_law(widths, case)
        # Stratified uniforms: each cell of the grid is off by at most one row of cells.
        np.testing.assert_allclose(found, law, atol=2.5 / GRID)


@pytest.mark.slow
def test_negative_control_local_normaliser(law_case, monkeypatch):
    case, law = law_case

    def local_normaliser(exchange, local):
        totals = exchange.gather(local).sum(axis=0)
        totals[:, 0] = local[:, 0]  # this shard's own mass as the row's normaliser
        return totals

    monkeypatch.setattr(shard_rows, "row_totals", local_normaliser)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(_first_token_law([4, 5], case), law, atol=2.5 / GRID)


@pytest.mark.slow
def test_negative_control_shard_by_width(law_case, monkeypatch):
    case, law = law_case

    def by_width(masses, shard):
        widths = shard.widths[shard.order()].astype(np.float64)[:, None]
        return np.where(masses > 0.0, widths, 0.0)

    monkeypatch.setattr(shard_rows, "shard_masses", by_width)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(_first_token_law([2, 3, 4], case), law, atol=2.5 / GRID)


# ---- bad shards and disagreeing ranks: a ValueError on every rank, never a hang ----------


def _errors(size, rank_call):
    def guarded(communicator):
        try:
            rank_call(communicator)
        except (TypeError, ValueError) as error:
            return error
        return None

    return sharded.run_local(size, guarded, timeout=TIMEOUT)


def _bad_case():
    rng = np.random.default_rng(0)
    return _batch(rng, 10, [2, 1], np.float32, "logits")


@pytest.mark.parametrize(
    "layout, message",
    [
        ([(0, 5), (5, 4)], "add up to 9"),
        ([(0, 5), (4, 5)], "overlaps"),
        ([(0, 4), (5, 5)], "add up to 9|gap"),
    ],
)
def test_bad_shards_fail_on_every_rank(layout, message):
    arguments = _bad_case()

    def rank_call(communicator):
        start, width = layout[communicator.rank]
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, start : start + width]
        sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=10,
            uniforms=np.full((2, 4), 0.5), **local,
        )

    errors = _errors(2, rank_call)
    assert all(isinstance(error, ValueError) for error in errors)
    assert all(__import__("re").search(message, str(error)) for error in errors)


@pytest.mark.parametrize("difference", ["temperature", "uniforms", "draft_token_ids",
                                        "unseeded", "shape", "vocab_size"])
def test_disagreeing_ranks_fail_on_every_rank(difference):
    arguments = _bad_case()

    def rank_call(communicator):
        r = communicator.rank
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, 5 * r : 5 * r + 5]
        extra = {"uniforms": np.full((2, 4), 0.5), "vocab_size": 10}
        if r == 1:
            if difference == "temperature":
                local["temperature"] = 0.5
            elif difference == "uniforms":
                extra["uniforms"] = np.full((2, 4), 0.25)
            elif difference == "draft_token_ids":
                local["draft_token_ids"] = arguments["draft_token_ids"][::-1].copy()
            elif difference == "shape":
                local["draft_logits"] = local["draft_logits"][:, :3]
            elif difference == "vocab_size":
                extra["vocab_size"] = 11
        if difference == "unseeded":
            extra = {"generator": np.random.default_rng(), "vocab_size": 10}
        sharded.verify_ragged(
            communicator=communicator, vocab_start=5 * r, **extra, **local
        )

    errors = _errors(2, rank_call)
    assert all(isinstance(error, ValueError) for error in errors), errors


def test_an_overflowing_temperature_is_refused_on_every_rank():
    arguments = _bad_case()
    arguments["target_logits"][1, 7] = 3e38  # in the second rank's columns
    arguments["temperature"] = np.array([0.5, 1.0])
    with pytest.raises(ValueError, match="overflow"):
        specdec_np.verify_ragged(uniforms=np.full((2, 4), 0.5), **arguments)

    def rank_call(communicator):
        r = communicator.rank
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, 5 * r : 5 * r + 5]
        sharded.verify_ragged(communicator=communicator, vocab_start=5 * r, vocab_size=10,
                              uniforms=np.full((2, 4), 0.5), **local)

    errors = _errors(2, rank_call)
    assert all("overflow" in str(error) and "request 0" in str(error) for error in errors)


def test_no_randomness_is_refused_on_every_rank():
    arguments = _bad_case()

    def rank_call(communicator):
        r = communicator.rank
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, 5 * r : 5 * r + 5]
        sharded.verify_ragged(communicator=communicator, vocab_start=5 * r, vocab_size=10,
                              **local)

    errors = _errors(2, rank_call)
    assert all("same randomness" in str(error) for error in errors)


def test_exchanged_bytes_do_not_grow_with_the_vocabulary():
    found = {}
    for vocab_size in (64, 512):
        rng = np.random.default_rng(1)
        arguments = _batch(rng, vocab_size, [3, 2], np.float32, "logits")
        arguments.update({"top_p": 0.9, "top_k": 20})
        result = run_sharded([vocab_size // 2, vocab_size // 2],
                             uniforms=rng.random((2, 5)), **arguments)
        found[vocab_size] = result.exchanged_bytes
        assert result.gather_bytes == (7 + 5) * vocab_size * 4
    assert found[64] == found[512]


def test_run_local_releases_the_others_when_a_rank_raises():
    def rank_call(communicator):
        if communicator.rank == 1:
            raise RuntimeError("rank 1 gives up")
        communicator.allgather(np.zeros(3))

    with pytest.raises(RuntimeError, match="rank 1 gives up"):
        sharded.run_local(3, rank_call, timeout=TIMEOUT)
    assert threading.active_count() < 50


def test_local_allgather_is_rank_ordered():
    gathered = sharded.run_local(
        3, lambda communicator: communicator.allgather(np.array([communicator.rank] * 2))
    )
    for array in gathered:
        np.testing.assert_array_equal(array, [[0, 0], [1, 1], [2, 2]])


# ---- the NCCL adapter, emulated: fake CuPy arrays on host memory, a fake NCCL group ------


class _FakeDeviceArray:
    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.size = self.array.size
        self.data = types.SimpleNamespace(ptr=self.array.ctypes.data)


class _FakeNcclGroup:
    """ncclAllGather on raw pointers, for ranks that are threads of this process."""

    def __init__(self, size):
        self.slots = [b""] * size
        self.barrier = threading.Barrier(size, timeout=TIMEOUT)


class _FakeNcclCommunicator:
    def __init__(self, group, rank):
        self._group, self._rank = group, rank

    def rank_id(self):
        return self._rank

    def size(self):
        return len(self._group.slots)

    def allGather(self, send, receive, count, datatype, stream):  # noqa: N802 - NCCL's name
        assert datatype == 7
        group = self._group
        group.slots[self._rank] = ctypes.string_at(send, count)
        group.barrier.wait()
        for rank, data in enumerate(group.slots):
            ctypes.memmove(receive + rank * count, data, count)
        group.barrier.wait()


def _fake_cupy(monkeypatch):
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.NCCL_UINT8 = 7
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cuda.get_current_stream = lambda: stream
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    cupy.uint8 = np.uint8
    cupy.asarray = lambda array: _FakeDeviceArray(np.array(array))
    cupy.empty = lambda size, dtype: _FakeDeviceArray(np.empty(size, dtype=dtype))
    cupy.asnumpy = lambda array: array.array.copy()
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", nccl)):
        monkeypatch.setitem(sys.modules, name, module)


def test_nccl_communicator_emulated(monkeypatch):
    _fake_cupy(monkeypatch)
    rng = np.random.default_rng(21)
    arguments = _batch(rng, 30, [2, 3], np.float32, "logits")
    arguments.update({"temperature": np.array([0.8, 0.0]), "top_k": 9, "top_p": 0.9})
    uniforms = rng.random((2, 5))
    expected = specdec_np.verify_ragged(uniforms=uniforms, **arguments)
    group = _FakeNcclGroup(2)

    def rank_call(communicator):
        nccl = sharded.NCCLCommunicator(_FakeNcclCommunicator(group, communicator.rank))
        start, end = [(0, 11), (11, 30)][nccl.rank]
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, start:end]
        return sharded.verify_ragged(
            communicator=nccl, vocab_start=start, vocab_size=30, uniforms=uniforms, **local
        )

    for result in sharded.run_local(2, rank_call, timeout=TIMEOUT):
        np.testing.assert_array_equal(result.output_token_ids, expected.output_token_ids)


def test_infinite_and_masked_entries_across_shards():
    rng = np.random.default_rng(8)
    arguments = _batch(rng, 24, [2, 2, 1], np.float32, "logits")
    target = arguments["target_logits"]
    target[0, [2, 20]] = np.inf  # uniform over +inf entries in two shards
    target[3, :] = -np.inf
    target[3, [5, 6, 19]] = [1.0, 1.0, 0.5]  # a mask leaving a few tokens, ties across shards
    target[4, ::3] = np.nan
    arguments["top_k"] = np.array([0, 2, 30])
    arguments["top_p"] = np.array([0.7, 1.0, 0.5])
    assert _compare([6, 0, 7, 11], arguments, rng, trials=20) == 0


def test_a_draw_without_mass_fails_on_every_rank():
    target = np.full((2, 8), -np.inf, dtype=np.float32)
    target[0, 3] = 0.0
    arguments = {
        "num_draft_tokens": np.array([1]),
        "draft_token_ids": np.array([3]),
        "target_logits": target,
        "uniforms": np.full((1, 3), 0.5),
    }
    with pytest.raises(ValueError, match="no positive probability"):
        specdec_np.verify_ragged(**arguments)

    def rank_call(communicator):
        start = 4 * communicator.rank
        local = dict(arguments, target_logits=target[:, start : start + 4])
        sharded.verify_ragged(communicator=communicator, vocab_start=start, vocab_size=8,
                              **local)

    errors = _errors(2, rank_call)
    assert all("no positive probability" in str(error) for error in errors), errors


def test_the_bytes_study_and_the_documented_formula():
    """benchmarks/studies/sharded.py runs, and its plain rows follow docs/semantics.md's
    count: 288 + 24 (R + G) + 16 R + 24 D bytes (R rows read, no greedy rows, one draw a
    request)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "sharded.py"
    spec = importlib.util.spec_from_file_location("specdec_np_sharded_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.bytes_table(small_vocabulary=64)
    for row in rows:
        assert row["gather_bytes"] == row["B"] * (2 * row["k"] + 1) * row["V"] * 4
        if row["setting"] == "plain":
            read = row["B"] * (2 * row["k"] + 1)
            assert row["exchanged_bytes"] == 288 + 24 * read + 16 * read + 24 * row["B"]
