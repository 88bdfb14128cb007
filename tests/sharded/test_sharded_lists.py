"""The sharded call's fast paths: the vectorised float32 exponential, min-p's floor from the
maximum, thresholds on ``z`` read as thresholds on the logits, and the candidate lists of
top-k and top-p on shards wide enough for the lists to be pruned (ties at a list's last
key, top-k beyond the lists, top-p settled by the lists or left to the radix select),
each checked against the reference or the unsharded call token for token."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import specdec_np
from specdec_np import sharded
from specdec_np._sharded import filters, laws
from specdec_np._sharded import rows as shard_rows

TIMEOUT = 60


def _bits(array):
    return array.view(np.uint32 if array.dtype == np.float32 else np.uint64)


def test_min_p_floors_are_the_kernels_bisection():
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        top = (rng.standard_normal(40) * 30).astype(dtype)
        top[:3] = [0.0, -1e30, 3e3]
        min_p = np.concatenate([rng.random(30), [1.0, 1e-40, 1e-300, 0.5, 1e-9] * 2])
        low = shard_rows.ordered_keys(np.full(top.shape, -np.inf, dtype=dtype))
        high = shard_rows.ordered_keys(top)
        expected = filters._bisect(top, min_p, low, high)
        np.testing.assert_array_equal(filters.min_p_floors(top, min_p), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_floor_on_z_is_a_floor_on_the_logits(dtype):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((6, 500)) * 4).astype(dtype)
    logits[0, :5] = [np.nan, -np.inf, np.inf, 0.0, -0.0]
    temperature = np.array([0.7, 1.0, 1.3, 0.1, 3.0, 0.9], dtype=dtype)
    rows = laws.LogitRows([logits], temperature)
    z = logits / temperature[:, None]
    every = np.arange(6)
    for floors in (z[every, rng.integers(0, 500, 6)], (rng.standard_normal(6) * 4).astype(dtype),
                   np.full(6, -np.inf, dtype=dtype)):
        found = rows.at_least(every, floors)
        expected = np.nonzero(z >= floors[:, None])
        np.testing.assert_array_equal(found.rows, expected[0])
        np.testing.assert_array_equal(found.columns, expected[1])
        np.testing.assert_array_equal(found.values, z[expected])


def _run(widths, **arguments):
    cuts = [0, *np.cumsum(widths).tolist()]
    vocab_size = cuts[-1]

    def rank_call(communicator):
        start, end = cuts[communicator.rank], cuts[communicator.rank + 1]
        local = dict(arguments)
        for name in ("target_logits", "draft_logits"):
            local[name] = arguments[name][:, start:end]
        return sharded.verify_ragged(
            communicator=communicator, vocab_start=start, vocab_size=vocab_size, **local
        )

    results = sharded.run_local(len(widths), rank_call, timeout=TIMEOUT)
    for other in results[1:]:
        np.testing.assert_array_equal(other.output_token_ids, results[0].output_token_ids)
    return results[0]


def _step(rng, vocab_size, counts, scale, ties=False):
    counts = np.asarray(counts)
    total = int(counts.sum())
    target = rng.standard_normal((total + counts.size, vocab_size)) * scale
    if ties:
        target = np.round(target * 2) / 2  # whole runs of equal logits
    request = np.repeat(np.arange(counts.size), counts)
    draft = target[np.arange(total) + request] + 0.5 * rng.standard_normal((total, vocab_size))
    return {
        "num_draft_tokens": counts,
        "draft_token_ids": np.argmax(draft, axis=1),
        "target_logits": target.astype(np.float32),
        "draft_logits": draft.astype(np.float32),
    }


def _same_tokens(widths, arguments, rng, trials):
    counts = arguments["num_draft_tokens"]
    for _ in range(trials):
        uniforms = rng.random((counts.size, int(counts.max()) + 2))
        expected = specdec_np.verify_ragged(uniforms=uniforms, **arguments)
        found = _run(widths, uniforms=uniforms, **arguments)
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)
    return found


class _Spy:
    def __init__(self, monkeypatch):
        self.calls = 0
        original = shard_rows.radix_select

        def counted(*arguments, **keywords):
            self.calls += 1
            return original(*arguments, **keywords)

        monkeypatch.setattr(shard_rows, "radix_select", counted)


CASES = {
    # Lists pruned by the maxima of sets of columns; ties across the shards at the lists'
    # last keys; top-k beyond the lists (radix select); min-p, top-p and both orders.
    "top_k": ({"temperature": 0.8, "top_k": np.array([3, 40, 1, 17])}, 3.0, False, 0),
    "ties": ({"temperature": 1.0, "top_k": np.array([5, 12, 30, 2]),
              "top_p": np.array([0.9, 1.0, 0.7, 0.8])}, 1.0, True, 0),
    "beyond": ({"top_k": np.array([300, 7, 0, 200]), "top_p": 0.8,
                "min_p": np.array([0.0, 0.1, 0.0, 0.02])}, 2.0, False, 8),
    "llama": ({"temperature": np.array([0.6, 1.4, 1.0, 0.9]), "top_k": 25, "top_p": 0.85,
               "min_p": 0.05, "filter_order": "llama.cpp"}, 3.0, False, 0),
    # Top-p alone: settled by the lists on peaked rows, by the radix select on flat ones.
    "peaked": ({"temperature": 0.7, "top_p": np.array([0.9, 0.6, 0.99, 0.8])}, 6.0, False, 0),
    "flat": ({"top_p": np.array([0.9, 0.5, 0.3, 0.95]), "min_p": 0.01}, 0.5, False, 8),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_candidate_lists_give_the_unsharded_tokens(case, monkeypatch):
    setting, scale, ties, radix_rounds = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    arguments = _step(rng, 3000, [2, 3, 0, 1], scale, ties)
    arguments.update(setting)
    spy = _Spy(monkeypatch)
    _same_tokens([1100, 1900], arguments, rng, trials=4)
    found = _same_tokens([700, 1000, 1300], arguments, rng, trials=2)
    # The radix select runs only where the lists leave a cutoff open (4 rounds each).
    assert (spy.calls > 0) == (radix_rounds > 0)
    assert found.rounds >= 5


def test_the_study_rows_are_under_a_percent_of_the_all_gather():
    """benchmarks/studies/sharded.py's filtered rows follow docs/semantics.md's count:
    ``288 + (24 + 4 (C + 1)) R + 16 R + 24 D`` bytes with top-k's lists of ``C = 50``
    keys, under 1 % of all-gathering the rows at ``V = 32000``."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "sharded.py"
    spec = importlib.util.spec_from_file_location("specdec_np_sharded_study_lists", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkey_batches = module.BATCHES
    module.BATCHES = (1, 8)
    try:
        rows = module.bytes_table(small_vocabulary=2048)
    finally:
        module.BATCHES = monkey_batches
    for row in rows:
        read = row["B"] * (2 * row["k"] + 1)
        if row["setting"] == "filtered":
            assert row["exchanged_bytes"] == 288 + (24 + 4 * 51) * read + 16 * read + 24 * row["B"]
        assert row["exchanged_bytes"] < 0.01 * row["gather_bytes"]
