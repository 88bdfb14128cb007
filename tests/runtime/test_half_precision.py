"""bfloat16 and float16 rows from NumPy (``ml_dtypes``), torch and JAX are read as float32
on every surface that takes logits or probabilities, and explicit uniforms in float32
(JAX's default) are widened exactly to float64 on every surface that takes uniforms.

Each check compares a call on half-precision rows with the same call on those rows'
values given in float32 (the rounding to half precision done first), under the same seeds;
a library that is not installed is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import registry
from specdec_np.adapters import vllm

ml_dtypes = pytest.importorskip("ml_dtypes")

V = 12
COUNTS = [3, 0, 2, 4]
TEMPERATURE = np.array([0.8, 1.0, 0.0, 1.3])


def _half(library: str, precision: str) -> Callable[[np.ndarray], Any]:
    """The converter of float32 NumPy rows to ``library``'s ``precision`` arrays."""
    if library == "numpy":
        dtype = ml_dtypes.bfloat16 if precision == "bfloat16" else np.float16
        return lambda rows: rows.astype(dtype)
    if library == "torch":
        torch = pytest.importorskip("torch")
        dtype = torch.bfloat16 if precision == "bfloat16" else torch.float16
        return lambda rows: torch.from_numpy(rows).to(dtype)
    jnp = pytest.importorskip("jax.numpy")
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float16
    return lambda rows: jnp.asarray(rows).astype(dtype)


def _float32_of(half: Any) -> np.ndarray:
    """The half-precision array's values, in float32 NumPy."""
    if type(half).__module__.startswith("torch"):
        return half.float().numpy()
    return np.asarray(half).astype(np.float32)


def _numpy(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_numpy(field) for field in value)
    if type(value).__module__.startswith("torch"):
        return value.numpy()
    return np.asarray(value)


LIBRARIES = [
    pytest.param(library, precision, id=f"{library}-{precision}")
    for library in ("numpy", "torch", "jax")
    for precision in ("bfloat16", "float16")
]


def _rows(seed: int, shape: tuple[int, ...], scale: float = 2.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def _probabilities(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]).astype(np.float32)


def _same(half_call: Callable[[Callable[[np.ndarray], Any]], Any], half: Any) -> None:
    """``half_call(convert)`` with half-precision rows equals it with their float32
    values."""
    expected = _numpy(half_call(lambda rows: _float32_of(half(rows))))
    found = _numpy(half_call(half))
    for got, want in zip(found if isinstance(found, tuple) else (found,),
                         expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("library", "precision"), LIBRARIES)
def test_processed_probs_and_sample_tokens(library: str, precision: str) -> None:
    half = _half(library, precision)
    logits = _rows(0, (4, V))
    _same(lambda convert: specdec_np.processed_probs(
        convert(logits), temperature=TEMPERATURE, top_p=0.9), half)
    _same(lambda convert: specdec_np.sample_tokens(
        logits=convert(logits), temperature=TEMPERATURE, top_k=5,
        generator=np.random.default_rng(1)), half)
    probs = _probabilities(2, (4, V))
    _same(lambda convert: specdec_np.sample_tokens(
        probs=convert(probs), generator=np.random.default_rng(1)), half)


@pytest.mark.parametrize(("library", "precision"), LIBRARIES)
@pytest.mark.parametrize("method", registry.names())
def test_verify_ragged_and_engine_verifier(library: str, precision: str, method: str) -> None:
    half = _half(library, precision)
    total = sum(COUNTS)
    target, draft = _rows(3, (total + len(COUNTS), V)), _rows(4, (total, V))
    ids = np.random.default_rng(5).integers(0, V, total)

    def ragged(convert: Callable[[np.ndarray], Any]) -> Any:
        return specdec_np.verify_ragged(
            num_draft_tokens=COUNTS, draft_token_ids=ids, target_logits=convert(target),
            draft_logits=convert(draft), method=method, temperature=TEMPERATURE, top_p=0.95,
            generator=np.random.default_rng(6),
        )[:2]

    def engine(convert: Callable[[np.ndarray], Any]) -> Any:
        verifier = specdec_np.EngineVerifier(method, seed=7)
        return verifier(
            num_draft_tokens=COUNTS, draft_token_ids=ids, target_probs=convert(
                _probabilities(8, (total + len(COUNTS), V))),
            temperature=TEMPERATURE,
        )[:2]

    _same(ragged, half)
    _same(engine, half)


@pytest.mark.parametrize(("library", "precision"), LIBRARIES)
@pytest.mark.parametrize("method", registry.tree_method_names())
def test_verify_tree(library: str, precision: str, method: str) -> None:
    half = _half(library, precision)
    layout = specdec_np.multi_draft_tree([[[3, 5, 1], [7, 2]], [[4, 4]]], vocab_size=V)
    nodes = len(layout.tree_parents)
    target, draft = _rows(9, (nodes + 2, V)), _rows(10, (nodes, V))
    _same(lambda convert: specdec_np.verify_tree(
        num_nodes=layout.num_nodes, tree_parents=layout.tree_parents,
        draft_token_ids=layout.draft_token_ids, target_logits=convert(target),
        draft_logits=convert(draft), method=method, temperature=[1.0, 0.7],
        generator=np.random.default_rng(11),
    )[:2], half)


@pytest.mark.parametrize(("library", "precision"), LIBRARIES)
@pytest.mark.parametrize("name", registry.names())
def test_padded_samplers(library: str, precision: str, name: str) -> None:
    half = _half(library, precision)
    entry = registry.get(name)
    batch, k = 3, 4
    target, draft = _probabilities(12, (batch, k + 1, V)), _probabilities(13, (batch, k, V))
    rng = np.random.default_rng(14)
    bonus, ids = rng.integers(0, V, (batch, 1)), rng.integers(0, V, (batch, k))

    def padded(convert: Callable[[np.ndarray], Any]) -> Any:
        sampler_class = getattr(specdec_np, entry.sampler_name)
        sampler = sampler_class(seed=15) if entry.stochastic else sampler_class()
        sampler.init_tensors("cpu")
        return sampler(convert(target), bonus, convert(draft), ids)

    _same(padded, half)


@pytest.mark.parametrize(("library", "precision"), LIBRARIES)
def test_the_vllm_adapter(library: str, precision: str) -> None:
    if library == "jax":
        pytest.skip("vLLM hands over torch tensors; NumPy stands for the host path")
    half = _half(library, precision)
    counts = [2, 0, 3]
    total = sum(counts)
    logits, probs = _rows(16, (total, V)), _probabilities(17, (total, V))
    ids = np.random.default_rng(18).integers(0, V, total)
    bonus = np.arange(len(counts)).reshape(-1, 1)

    def adapted(convert: Callable[[np.ndarray], Any]) -> Any:
        arrays = [convert(logits), convert(probs), ids, bonus, np.cumsum(counts)]
        if library == "torch":
            import torch

            arrays[2:] = [torch.from_numpy(np.asarray(a)) for a in arrays[2:]]
        generators: dict[int, Any] = {}
        if library == "torch":
            generators = {0: torch.Generator().manual_seed(0)}
        else:
            generators = {0: np.random.default_rng(0)}
        metadata = SimpleNamespace(
            all_greedy=False, all_random=True, temperature=np.ones(len(counts), np.float32),
            top_k=None, top_p=None, generators=generators,
        )
        if library == "torch":
            metadata.temperature = torch.ones(len(counts))
        return vllm.rejection_sample(
            draft_token_ids=arrays[2], num_draft_tokens=counts, max_spec_len=3,
            cu_num_draft_tokens=arrays[4], draft_probs=arrays[1], target_logits=arrays[0],
            bonus_token_ids=arrays[3], sampling_metadata=metadata,
        )

    # Only request 0 is seeded: compare it (the others draw from fresh generators).
    expected = _numpy(adapted(lambda rows: _float32_of(half(rows))))[0]
    np.testing.assert_array_equal(_numpy(adapted(half))[0], expected)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_strict_mode_takes_float32_only(precision: str) -> None:
    """Strict mode checks exact dtypes, vLLM's rule: the rows must be float32, so half
    precision is refused there and read as float32 everywhere else."""
    half = _half("numpy", precision)
    target = half(_probabilities(19, (2, 3, V)))
    bonus, ids = np.zeros((2, 1), np.int64), np.zeros((2, 2), np.int64)
    refused = f"must have dtype float32 in strict mode; found {precision}"
    with pytest.raises(TypeError, match=refused):
        specdec_np.greedy_sample(target, bonus, ids, strict_mode=True)
    with pytest.raises(TypeError, match="float32 in strict mode"):
        specdec_np.verify_ragged(
            num_draft_tokens=[2, 0], draft_token_ids=[1, 2],
            target_probs=half(_probabilities(20, (4, V))), strict_mode=True,
        )
    specdec_np.greedy_sample(target, bonus, ids)  # outside strict mode


# -- float32 uniforms ------------------------------------------------------------------------


def _uniform_surfaces() -> dict[str, Callable[[Any], Any]]:
    """Every surface that takes explicit uniforms, as ``call(uniforms)`` on one batch; the
    uniforms' shape is the surface's."""
    rng = np.random.default_rng(21)
    total = sum(COUNTS)
    target_logits, draft_logits = _rows(22, (total + len(COUNTS), V)), _rows(23, (total, V))
    ids = rng.integers(0, V, total)
    batch, k = 3, 4
    target, draft = _probabilities(24, (batch, k + 1, V)), _probabilities(25, (batch, k, V))
    bonus, padded_ids = rng.integers(0, V, (batch, 1)), rng.integers(0, V, (batch, k))
    layout = specdec_np.chain_tree([[1, 2, 3], [4]], vocab_size=V)
    tree_target = _rows(26, (len(layout.tree_parents) + 2, V))
    ragged = {"num_draft_tokens": COUNTS, "draft_token_ids": ids,
              "target_logits": target_logits, "draft_logits": draft_logits}
    surfaces: dict[str, Callable[[Any], Any]] = {
        "sample_tokens": lambda u: specdec_np.sample_tokens(
            logits=target_logits, temperature=0.9, uniforms=u[:, 0]),
        "verify_ragged": lambda u: specdec_np.verify_ragged(**ragged, uniforms=u[:4, :6]),
        "EngineVerifier": lambda u: specdec_np.EngineVerifier("block")(
            **ragged, uniforms=u[:4, :6]),
        "verify_tree": lambda u: specdec_np.verify_tree(
            num_nodes=layout.num_nodes, tree_parents=layout.tree_parents,
            draft_token_ids=layout.draft_token_ids, target_logits=tree_target,
            method="traversal", uniforms=u[:2, :4]),
    }
    for name in registry.names(stochastic=True):
        entry = registry.get(name)
        function = getattr(specdec_np, entry.function_name)
        surfaces[entry.function_name] = lambda u, function=function: function(
            target, bonus, draft, padded_ids, uniforms=u[:batch, : k + 1])
        sampler_class = getattr(specdec_np, entry.sampler_name)

        def sampler_call(u: Any, sampler_class: Any = sampler_class) -> Any:
            sampler = sampler_class(seed=0)
            sampler.init_tensors("cpu")
            return sampler(target, bonus, draft, padded_ids, uniforms=u[:batch, : k + 1])

        surfaces[entry.sampler_name] = sampler_call
    return surfaces


SURFACES = _uniform_surfaces()


def _uniforms(seed: int) -> np.ndarray:
    # Uniforms in [0, 1) as float32 holds them (jax.random.uniform's values).
    return np.random.default_rng(seed).random((T_ROWS, 8)).astype(np.float32)


T_ROWS = sum(COUNTS) + len(COUNTS)


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_float32_uniforms_are_widened_exactly(surface: str) -> None:
    call = SURFACES[surface]
    single = _uniforms(27)
    expected = _numpy(call(single.astype(np.float64)))
    found = _numpy(call(single))
    for got, want in zip(found if isinstance(found, tuple) else (found,),
                         expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("surface", sorted(SURFACES))
@pytest.mark.parametrize(
    ("dtype", "advice"),
    [
        (np.float16, "too coarse for uniforms in \\[0, 1\\); draw them in float32 or float64"),
        (ml_dtypes.bfloat16, "too coarse"),
        (np.int64, "convert them with .astype\\(numpy.float64\\)"),
        (np.bool_, "convert them"),
    ],
)
def test_other_uniform_dtypes_are_refused_saying_what_to_do(
    surface: str, dtype: Any, advice: str
) -> None:
    uniforms = np.zeros((T_ROWS, 8), dtype=dtype)
    refused = f"^uniforms must be a float64 or float32 array .*{advice}"
    with pytest.raises(TypeError, match=refused):
        SURFACES[surface](uniforms)


def test_float32_uniforms_of_jax_and_torch() -> None:
    """Foreign float32 uniforms (DLPack) are widened too."""
    single = _uniforms(28)
    call = SURFACES["verify_ragged"]
    expected = _numpy(call(single.astype(np.float64)))
    for library in ("torch", "jax"):
        try:
            module = __import__("torch" if library == "torch" else "jax.numpy",
                                fromlist=["asarray"])
        except ImportError:
            continue
        foreign = module.from_numpy(single) if library == "torch" else module.asarray(single)
        for got, want in zip(_numpy(call(foreign)), expected):
            np.testing.assert_array_equal(got, want)


def test_strict_mode_widens_float32_uniforms_too() -> None:
    """The widening changes no value, so strict mode (exact dtypes of the rows and ids)
    takes float32 uniforms as well."""
    batch, k = 2, 3
    target, draft = _probabilities(29, (batch, k + 1, V)), _probabilities(30, (batch, k, V))
    bonus, ids = np.zeros((batch, 1), np.int64), np.ones((batch, k), np.int64)
    single = _uniforms(31)[:batch, : k + 1]
    results = [
        specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=u, strict_mode=True)
        for u in (single, single.astype(np.float64))
    ]
    np.testing.assert_array_equal(results[0].output_token_ids, results[1].output_token_ids)
