"""Array intake: layouts, dtypes, DLPack producers, and what ``import specdec_np`` loads."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import specdec_np
from specdec_np import registry

B, K, V = 4, 3, 11


def inputs(dtype=np.float32):
    rng = np.random.default_rng(7)
    return (
        rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(dtype),
        rng.integers(0, V, (B, 1)),
        rng.dirichlet(np.ones(V), size=(B, K)).astype(dtype),
        rng.integers(0, V, (B, K)),
    )


UNIFORMS = np.random.default_rng(8).random((B, K + 1))


def verify_one(entry, target, bonus, draft_probs, draft_ids):
    """One registered verifier's stateless function: stochastic ones with UNIFORMS and the
    draft rows, deterministic ones with their registry parameters."""
    function = getattr(specdec_np, entry.function_name)
    if entry.stochastic:
        return function(target, bonus, draft_probs, draft_ids, uniforms=UNIFORMS)
    parameters = {p.name: p.default for p in entry.parameters}
    return function(target, bonus, draft_ids, **parameters)


def verify_all(target, bonus, draft_probs, draft_ids):
    return [
        verify_one(entry, target, bonus, draft_probs, draft_ids) for entry in registry.VERIFIERS
    ]


def assert_same(results, expected, kind=np.ndarray):
    """Equal results, each array of ``kind`` (the inputs' array library)."""
    assert len(results) == len(expected) == len(registry.VERIFIERS)
    for got, want in zip(results, expected):
        for got_array, want_array in zip(got, want):
            assert isinstance(got_array, kind), type(got_array)
            np.testing.assert_array_equal(np.asarray(got_array), want_array)


def test_layouts_give_identical_results():
    target, bonus, draft_probs, draft_ids = inputs()
    expected = verify_all(target, bonus, draft_probs, draft_ids)
    # Non-contiguous views over larger buffers.
    wide = np.zeros((B, K + 1, 2 * V), np.float32)
    wide[:, :, ::2] = target
    assert_same(verify_all(wide[:, :, ::2], bonus, draft_probs, draft_ids), expected)
    # Fortran order and read-only arrays.
    fortran = [np.asfortranarray(a) for a in (target, bonus, draft_probs, draft_ids)]
    assert_same(verify_all(*fortran), expected)
    frozen = [a.copy() for a in (target, bonus, draft_probs, draft_ids)]
    for array in frozen:
        array.flags.writeable = False
    assert_same(verify_all(*frozen), expected)
    # int32 ids, and ids of mixed widths.
    assert_same(
        verify_all(target, bonus.astype(np.int32), draft_probs, draft_ids.astype(np.int32)),
        expected,
    )
    assert_same(verify_all(target, bonus.astype(np.int32), draft_probs, draft_ids), expected)


def test_broadcast_inputs():
    target, bonus, draft_probs, draft_ids = inputs()
    row = np.broadcast_to(target[:1], target.shape)
    probs = np.broadcast_to(draft_probs[:1], draft_probs.shape)
    ids = np.broadcast_to(draft_ids[:1], draft_ids.shape)
    expected = verify_all(
        np.ascontiguousarray(row), bonus, np.ascontiguousarray(probs), np.ascontiguousarray(ids)
    )
    assert_same(verify_all(row, bonus, probs, ids), expected)


def test_float16_is_upcast_to_float32():
    target, bonus, draft_probs, draft_ids = inputs(np.float16)
    expected = verify_all(
        target.astype(np.float32), bonus, draft_probs.astype(np.float32), draft_ids
    )
    assert_same(verify_all(target, bonus, draft_probs, draft_ids), expected)


def test_bfloat16_is_upcast_to_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    target, bonus, draft_probs, draft_ids = inputs()
    half = [a.astype(ml_dtypes.bfloat16) for a in (target, draft_probs)]
    expected = verify_all(half[0].astype(np.float32), bonus, half[1].astype(np.float32), draft_ids)
    assert_same(verify_all(half[0], bonus, half[1], draft_ids), expected)


def test_torch_bfloat16_and_float16_are_read_as_float32():
    """NumPy cannot take bfloat16 through DLPack: intake converts it on the tensor's side."""
    torch = pytest.importorskip("torch")
    target, bonus, draft_probs, draft_ids = inputs()
    for dtype in (torch.bfloat16, torch.float16):
        half = [torch.from_numpy(a).to(dtype) for a in (target, draft_probs)]
        expected = verify_all(half[0].float().numpy(), bonus, half[1].float().numpy(), draft_ids)
        result = verify_all(half[0], torch.from_numpy(bonus), half[1], torch.from_numpy(draft_ids))
        assert_same(result, expected, kind=torch.Tensor)


def test_dlpack_torch_cpu_tensors_match_numpy():
    torch = pytest.importorskip("torch")
    arrays = inputs()
    expected = verify_all(*arrays)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    # torch in, torch out (docs/semantics.md §1).
    assert_same(verify_all(*tensors), expected, kind=torch.Tensor)


def test_array_like_inputs_match_arrays():
    arrays = inputs()
    expected = verify_all(*arrays)
    assert_same(verify_all(*[a.tolist() for a in arrays]), expected)
    target, bonus, draft_probs, draft_ids = arrays
    assert_same(verify_all(target, bonus.tolist(), draft_probs, tuple(map(tuple, draft_ids))),
                expected)


def test_outputs_follow_the_first_foreign_input_library():
    torch = pytest.importorskip("torch")
    target, bonus, draft_probs, draft_ids = inputs()
    mixed = verify_all(target, torch.from_numpy(bonus), draft_probs, draft_ids)
    assert_same(mixed, verify_all(target, bonus, draft_probs, draft_ids), kind=torch.Tensor)
    result = specdec_np.verify_ragged(
        num_draft_tokens=[K] * B, draft_token_ids=torch.from_numpy(draft_ids.reshape(-1)),
        target_probs=target.reshape(-1, V), uniforms=np.zeros((B, K + 2)),
    )
    assert isinstance(result.output_token_ids, torch.Tensor)
    assert isinstance(result.num_draft_tokens, int)


@pytest.mark.parametrize("name", registry.names())
def test_dlpack_requires_grad_asks_for_detach(name):
    torch = pytest.importorskip("torch")
    target, bonus, draft_probs, draft_ids = inputs()
    grad = torch.from_numpy(target).requires_grad_(True)
    with pytest.raises(TypeError, match=r"target_with_bonus_probs requires grad.*detach"):
        verify_one(registry.get(name), grad, bonus, draft_probs, draft_ids)


class _DLPackOnly:
    """A minimal DLPack producer that is not a NumPy array."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class _OtherDevice(_DLPackOnly):
    def __dlpack_device__(self):
        return (4, 0)


def test_generic_dlpack_producer():
    arrays = inputs()
    expected = verify_all(*arrays)
    assert_same(verify_all(*[_DLPackOnly(a) for a in arrays]), expected)


@pytest.mark.parametrize("name", registry.names())
def test_unsupported_dlpack_device(name):
    target, bonus, draft_probs, draft_ids = inputs()
    with pytest.raises(TypeError, match="target_with_bonus_probs is on DLPack device type 4"):
        verify_one(registry.get(name), _OtherDevice(target), bonus, draft_probs, draft_ids)


def test_import_loads_neither_torch_nor_cupy():
    code = (
        "import sys, specdec_np\n"
        "for v in specdec_np.registry.VERIFIERS:\n"
        "    getattr(specdec_np, v.function_name), getattr(specdec_np, v.sampler_name)\n"
        "bad = [m for m in ('torch', 'cupy', 'jax') if m in sys.modules]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_public_names():
    for name in specdec_np.__all__:
        assert getattr(specdec_np, name).__doc__, name
    for entry in registry.VERIFIERS:
        assert {entry.function_name, entry.sampler_name} <= set(specdec_np.__all__), entry.name
