"""The sampler classes: vLLM's constructor, counters, devices and derived metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

import specdec_np
from specdec_np import registry


def batch(batch_size=5, k=3, vocab_size=9, seed=0):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.ones(vocab_size), size=(batch_size, k + 1)).astype(np.float32)
    draft_ids = rng.integers(0, vocab_size, (batch_size, k))
    return target, rng.integers(0, vocab_size, (batch_size, 1)), None, draft_ids


def _maker(entry: registry.Verifier):
    cls = getattr(specdec_np, entry.sampler_name)
    return (lambda: cls(seed=1)) if entry.stochastic else cls


# One sampler maker per registered verifier.
ALL = [_maker(entry) for entry in registry.VERIFIERS]


def test_hierarchy_and_dtypes():
    for entry in registry.VERIFIERS:
        base = (
            specdec_np.SpecDecodeStochasticBaseSampler
            if entry.stochastic
            else specdec_np.SpecDecodeDeterministicBaseSampler
        )
        assert issubclass(getattr(specdec_np, entry.sampler_name), base)
    for base in (
        specdec_np.SpecDecodeStochasticBaseSampler,
        specdec_np.SpecDecodeDeterministicBaseSampler,
    ):
        assert issubclass(base, specdec_np.SpecDecodeBaseSampler)
        with pytest.raises(TypeError):
            base()
    sampler = specdec_np.SpecDecodeBaseSampler(strict_mode=True)
    assert sampler._strict_mode is True
    assert sampler.probs_dtype == np.float32 and sampler.token_id_dtype == np.int64
    assert sampler.num_accepted_tokens is None and sampler.num_emitted_tokens is None
    assert sampler.num_draft_tokens == 0


@pytest.mark.parametrize("make", ALL)
def test_counters_accumulate_over_calls(make):
    sampler = make()
    total_accepted = total_emitted = 0
    for seed in range(3):
        inputs = batch(seed=seed)
        output = sampler(*inputs)
        assert output.shape == (5, 4) and output.dtype == np.int64
        emitted = int((output != -1).sum())
        total_emitted += emitted
        # Every row has exactly r + 1 non-negative entries, as a prefix.
        for row in output:
            kept = int((row != -1).sum())
            assert (row[:kept] >= 0).all() and (row[kept:] == -1).all()
        total_accepted = int(sampler.num_accepted_tokens)
    assert int(sampler.num_emitted_tokens) == total_emitted
    assert sampler.num_draft_tokens == 3 * 5 * 3
    assert 0 <= total_accepted <= sampler.num_draft_tokens
    assert isinstance(sampler.num_accepted_tokens, np.ndarray)
    assert sampler.num_accepted_tokens.shape == ()
    assert sampler.num_accepted_tokens.dtype == np.int64


def test_counter_arrays_are_updated_in_place():
    sampler = specdec_np.GreedySampler()
    sampler.init_tensors("cpu")
    accepted = sampler.num_accepted_tokens
    sampler(*batch())
    assert sampler.num_accepted_tokens is accepted


@pytest.mark.parametrize("device", ["cpu", 0])
def test_init_tensors_twice_is_an_error(device):
    sampler = specdec_np.GreedySampler()
    sampler.init_tensors(device, device_type="cpu")
    assert int(sampler.num_accepted_tokens) == 0 and int(sampler.num_emitted_tokens) == 0
    with pytest.raises(RuntimeError, match="init_tensors"):
        sampler.init_tensors("cpu")
    with pytest.raises(RuntimeError):
        sampler.init_gpu_tensors(0)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", 1.5, None, True])
def test_bad_devices(device):
    with pytest.raises((TypeError, ValueError), match="device"):
        specdec_np.GreedySampler().init_tensors(device)


def test_counters_on_cpu_reject_gpu_parse():
    sampler = specdec_np.GreedySampler()
    sampler.init_tensors("cpu")
    assert sampler._device is None


def test_metrics():
    sampler = specdec_np.RejectionSampler(seed=2)
    assert math.isnan(sampler.draft_acceptance_rate)
    assert math.isnan(sampler.system_efficiency)
    assert math.isnan(sampler.mean_accepted_length)
    accepted = np.array([[True, True], [False, True], [True, False]])
    draft = np.array([[1, 2], [3, 4], [5, 6]])
    sampler._create_output(accepted, draft, draft, np.array([[7], [8], [9]]))
    assert sampler.draft_acceptance_rate == pytest.approx(4 / 6)
    # Emitted: 3 + 1 + 2 = 6 out of at most 3 * (2 + 1) = 9.
    assert sampler.system_efficiency == pytest.approx(6 / 9)
    assert sampler.mean_accepted_length == pytest.approx(6 / 3)


def test_empty_batch_returns_empty_output_and_keeps_counters():
    for make in ALL:
        sampler = make()
        target, bonus, _, draft_ids = batch(batch_size=0)
        output = sampler(target, bonus, None, draft_ids)
        assert output.shape == (0, 4) and output.dtype == np.int64
        assert sampler.num_accepted_tokens is None and sampler.num_draft_tokens == 0
