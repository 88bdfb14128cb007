"""Verification across vocabulary shards on CuPy rows: the CUDA shard passes
(``specdec_np/_kernels/src/cuda/shard_passes.cu`` through
``specdec_np._kernels.cuda_shard_passes.shard_like``), run by the host emulation of
``tests/kernels/test_cuda_sources.py`` behind the stand-in CuPy of ``tests/kernels/fake_cupy``.

Each pass is compared, bit for bit, with the compiled CPU pass it mirrors (``_core``'s,
itself tested against exact oracles in ``test_shard_passes.py``), with a mutated kernel as
the negative control; the whole call on device rows is compared with the CPU sharded call
on the same uniforms (token for token, identical on every rank, for 1, 2, 3 and 4 uneven
shards, the filters' kept sets spanning shards), through the in-process communicator and
through the NCCL adapter over a fake NCCL group, and no row crosses to the host on the way.
The one-shard comparison with the unsharded CuPy call needs the chain kernels' emulation and
lives in ``tests/kernels/test_cuda_sources.py``.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import test_cuda_sources as emulation_kit
import test_shard_passes as cpu_cases
import test_sharded as sharded_cases

from specdec_np import _core, registry, sharded
from specdec_np._kernels import cuda as _cuda
from specdec_np._kernels.cuda_shard_passes import shard_like

DTYPES = [np.float32, np.float64]


def _emulate(tmp, stem, mutate=None):
    source = _cuda.cuda_sources()["shard_passes"]
    if mutate is not None:
        source = mutate(source)
    return emulation_kit._build_emulation(tmp, stem, {"shard_passes": source})


@pytest.fixture(scope="module")
def emulation(tmp_path_factory):
    return _emulate(tmp_path_factory.mktemp("shard_passes"), "shard_passes")


def _install(emulated, monkeypatch):
    fake = emulation_kit._fake_cupy_module()
    fake._LIBRARY[:] = [emulated, emulation_kit._symbol]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_cuda, "_MODULES", {})
    return fake


@pytest.fixture
def cupy(emulation, monkeypatch):
    return _install(emulation, monkeypatch)


# ---- each pass against the CPU pass it mirrors ---------------------------------------------


def _bits_equal(found, expected):
    found, expected = np.asarray(found), np.asarray(expected)
    assert found.shape == expected.shape and found.dtype == expected.dtype
    kind = {4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(found.view(kind), expected.view(kind))
    else:
        np.testing.assert_array_equal(found, expected)


def _compare_passes(cp, dtype, width):
    """Every shard pass on the same inputs through ``_core`` and through the device
    launchers; returns the first pass whose results differ (None: all equal)."""
    rows = cpu_cases._rows(dtype, 8, width, seed=width)
    device_rows = cp.asarray(rows)
    temperature = np.array([0.8, 1, 1, 2, 0.5, 1.3, 1, 0.7], dtype=dtype)
    mismatches = []

    def check(name, found, expected):
        try:
            _bits_equal(found, expected)
        except AssertionError:
            mismatches.append(name)

    for groups in sorted({0, 1, 5, width // 2}):
        if 2 * groups > width:
            continue
        results = []
        for kernels, block in ((_core, rows), (shard_like, device_rows)):
            stats, group_max = np.zeros((8, 3)), np.zeros((8, groups), dtype=dtype)
            kernels.shard_stats(block, temperature, groups, stats, group_max)
            results.append((stats, group_max))
        check("stats", results[1][0], results[0][0])
        check("stats", results[1][1], results[0][1])
    if width == 0:
        return mismatches
    table = [np.zeros((8, 2)), np.zeros((8, 2))]
    _core.shard_argmax(rows, 5, table[0])
    shard_like.shard_argmax(device_rows, 5, table[1])
    check("argmax", table[1], table[0])

    indices = np.array([0, 2, 5, 7, 1, 4], dtype=np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        z = rows[indices] / temperature[indices, None]
        z_max = np.fmax.reduce(z, axis=1, initial=-np.inf).astype(dtype)
    z_max = np.where(np.isfinite(z_max), z_max, 0).astype(dtype)
    cutoff = np.array([-np.inf, 0.5, -1.0, -np.inf, 2.0, -0.5], dtype=dtype)
    masses = [np.zeros(6), np.zeros(6)]
    weights = np.zeros((6, width), dtype=dtype)
    device_weights = cp.zeros((6, width), dtype=dtype)
    _core.shard_weights(rows, indices, temperature[indices], z_max, cutoff, weights, masses[0])
    shard_like.shard_weights(device_rows, indices, temperature[indices], z_max, cutoff,
                                   device_weights, masses[1])
    check("weights", device_weights.get(), weights)
    check("weights", masses[1], masses[0])

    thresholds = np.array([1.0, -np.inf, np.nan, 0.0, 3.0, -1.5], dtype=dtype)
    found = []
    for kernels, block in ((_core, rows), (shard_like, device_rows)):
        counts = np.zeros(6, dtype=np.int64)
        columns = np.zeros(6 * width + width + 1, dtype=np.int64)
        values = np.zeros(6 * width + width + 1, dtype=dtype)
        total, written = kernels.shard_at_least(block, indices, temperature[indices],
                                                thresholds, counts, columns, values)
        assert written
        found.append((counts, columns[:total], values[:total]))
    for part in range(3):
        check("at_least", found[1][part], found[0][part])

    x = z[np.isfinite(z)].astype(dtype)[:50]
    m = np.full(x.size, x.max(initial=0), dtype=dtype)
    out = [np.zeros(x.size, dtype=dtype), np.zeros(x.size, dtype=dtype)]
    _core.shard_exp(x, m, out[0])
    shard_like.shard_exp(x, m, out[1], device_rows)
    check("exp", out[1], out[0])

    divisors = masses[0] + 0.25
    out_rows = np.array([3, 0, 5, 1, 2, 4], dtype=np.int64)
    divided = np.zeros((6, width))
    device_divided = cp.zeros((6, width))
    order = np.arange(6, dtype=np.int64)
    _core.shard_divided(weights, order, divisors, divided, out_rows)
    shard_like.shard_divided(device_weights, order, divisors, device_divided, out_rows)
    check("divided", device_divided.get(), divided)

    rng = np.random.default_rng(width)
    draws = rng.standard_normal((6, width))
    draws[0, ::3] = np.nan
    draws[1] = -np.abs(draws[1])  # nothing positive
    q = np.abs(rng.standard_normal((3, width)))
    scale = np.array([1.0, 0.5, 2.0])
    chosen = np.array([2, 0, 4], dtype=np.int64)
    residual, device_residual = draws.copy(), cp.asarray(draws.copy())
    _core.shard_residuals(residual, chosen, scale, q)
    shard_like.shard_residuals(device_residual, chosen, scale, cp.asarray(q))
    check("residuals", device_residual.get(), residual)
    sums = [np.zeros(6), np.zeros(6)]
    _core.shard_positive_sums(residual, sums[0])
    shard_like.shard_positive_sums(device_residual, sums[1])
    check("positive_sums", sums[1], sums[0])
    inside = sums[0] * np.array([0.0, 0.3, 0.999, 0.5, 1.0, 0.7])
    crossings = [np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64)]
    _core.shard_first_crossings(residual, order, inside, crossings[0])
    shard_like.shard_first_crossings(device_residual, order, inside, crossings[1])
    check("first_crossings", crossings[1], crossings[0])
    return mismatches


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_pass_equals_the_cpu_pass(cupy, dtype):
    for width in (0, 1, 13, 64, 300):
        assert _compare_passes(cupy, dtype, width) == [], width
    assert cupy._LIBRARY[0].emu_errors_seen() == 0


def test_mutated_passes_are_caught(tmp_path, monkeypatch):
    """Negative control: the pairwise sum split anywhere but at multiples of 8, and the
    weights' pass keeping the entries below the cutoff, must show."""

    def mutate(source):
        mutated = source.replace("half -= half % 8;", "half -= half % 3;")
        mutated = mutated.replace("out[y] = z >= cutoff[i] ?", "out[y] = z == z ?")
        assert mutated.count("half % 3") == 2 and "out[y] = z == z ?" in mutated
        return mutated

    fake = _install(_emulate(tmp_path, "mutated", mutate), monkeypatch)
    found = _compare_passes(fake, np.float32, 300)
    assert "positive_sums" in found and "weights" in found


def test_device_launchers_refuse_bad_arguments(cupy):
    rows = cupy.zeros((3, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="rows"):
        shard_like.shard_argmax(cupy.zeros((3, 8), dtype=np.int32), 0, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="groups"):
        shard_like.shard_stats(rows, np.ones(3, np.float32), 5, np.zeros((3, 3)),
                                     np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="outside the block"):
        shard_like.shard_weights(rows, np.array([3]), *[np.ones(1, np.float32)] * 3,
                                       cupy.zeros((1, 8), dtype=np.float32), np.zeros(1))
    with pytest.raises(ValueError, match="shape"):
        shard_like.shard_residuals(cupy.zeros((3, 8)), np.array([0]), np.ones(1),
                                         cupy.zeros((1, 7)))


# ---- the whole call on device rows against the CPU sharded call ----------------------------


def _on_device(cp, arguments):
    names = ("target_logits", "target_probs", "draft_logits", "draft_probs")
    return {name: cp.asarray(value) if name in names else value
            for name, value in arguments.items()}


def _same_as_cpu(cp, widths, arguments, rng, trials=2, on_device=True):
    counts = arguments["num_draft_tokens"]
    for _ in range(trials):
        uniforms = rng.random((counts.size, int(counts.max()) + 2))
        expected = sharded_cases.run_sharded(widths, uniforms=uniforms, **arguments)
        found = sharded_cases.run_sharded(widths, uniforms=uniforms, **_on_device(cp, arguments))
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)
        np.testing.assert_array_equal(found.accepted_lengths, expected.accepted_lengths)
        assert found.exchanged_bytes == expected.exchanged_bytes
    # Probability rows are read on the host; logits rows by the device passes.
    assert bool(cp.launches) == on_device


WIDTHS = [[37], [12, 25], [5, 0, 19, 13]]


@pytest.mark.parametrize("draft_form", ["logits", "probs", None])
@pytest.mark.parametrize("setting", ["plain", "all", "greedy_mixed", "top_p"])
def test_device_rows_give_the_cpu_sharded_tokens(cupy, setting, draft_form):
    rng = np.random.default_rng(sorted(sharded_cases.SETTINGS).index(setting))
    arguments = sharded_cases._batch(rng, 37, [2, 0, 3, 1], np.float32, draft_form)
    arguments.update(sharded_cases._settings(setting))
    for widths in WIDTHS:
        _same_as_cpu(cupy, widths, arguments, rng)


#: Every registry method (with its parameters' defaults), then the other order and bonus ids.
EXTRAS = {
    **{verifier.name: {"method": verifier.name,
                       **{parameter.name: parameter.default for parameter in verifier.parameters}}
       for verifier in registry.VERIFIERS},
    "llama_cpp": {"filter_order": "llama.cpp"},
    "bonus_ids": {"bonus_token_ids": np.array([1, 2, 3, 4])},
}


@pytest.mark.parametrize("extra", list(EXTRAS.values()), ids=list(EXTRAS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_rows_methods_orders_and_dtypes(cupy, extra, dtype):
    rng = np.random.default_rng(5)
    arguments = sharded_cases._batch(rng, 31, [3, 1, 0, 2], dtype, "logits")
    arguments.update(sharded_cases._settings("all"), **extra)
    for widths in ([31], [9, 0, 22]):
        _same_as_cpu(cupy, widths, arguments, rng)


def test_device_target_probabilities_and_special_rows(cupy):
    rng = np.random.default_rng(3)
    arguments = sharded_cases._batch(rng, 24, [2, 2, 1], np.float64, "probs")
    logits = arguments.pop("target_logits")
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    arguments["target_probs"] = probs / probs.sum(axis=1, keepdims=True)
    arguments["temperature"] = np.array([1.0, 0.0, 1.0])
    _same_as_cpu(cupy, [10, 14], arguments, rng, trials=3, on_device=False)
    # +inf entries in two shards, a mask leaving ties across shards, NaN entries.
    arguments = sharded_cases._batch(rng, 24, [2, 2, 1], np.float32, "logits")
    target = arguments["target_logits"]
    target[0, [2, 20]] = np.inf
    target[3, :] = -np.inf
    target[3, [5, 6, 19]] = [1.0, 1.0, 0.5]
    target[4, ::3] = np.nan
    arguments["top_k"] = np.array([0, 2, 30])
    arguments["top_p"] = np.array([0.7, 1.0, 0.5])
    _same_as_cpu(cupy, [6, 0, 7, 11], arguments, rng, trials=3)


def test_device_rows_and_host_rows_do_not_mix(cupy):
    rng = np.random.default_rng(2)
    arguments = sharded_cases._batch(rng, 8, [1], np.float32, "logits")
    arguments["target_logits"] = cupy.asarray(arguments["target_logits"])
    with pytest.raises((TypeError, ValueError), match="same kind of array"):
        sharded_cases.run_sharded([8], uniforms=rng.random((1, 3)), **arguments)


# ---- the NCCL adapter, emulated, on device rows: only per-row numbers reach the host --------


def test_nccl_path_on_device_rows(cupy, monkeypatch):
    copies = []
    get = cupy.ndarray.get

    def recorded_get(self):
        copies.append(self.shape)
        return get(self)

    monkeypatch.setattr(cupy.ndarray, "get", recorded_get)
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.NCCL_UINT8 = 7
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.get_current_stream, cuda.runtime = nccl, lambda: stream, cupy.cuda.runtime
    cuda.Device = cupy.cuda.Device
    monkeypatch.setattr(cupy, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)

    rng = np.random.default_rng(21)
    widths = [11, 19]
    arguments = sharded_cases._batch(rng, 30, [2, 3], np.float32, "logits")
    arguments["temperature"] = np.array([0.8, 1.2])
    uniforms = rng.random((2, 5))
    expected = sharded_cases.run_sharded(widths, uniforms=uniforms, **arguments)
    group = sharded_cases._FakeNcclGroup(2)
    device = _on_device(cupy, arguments)

    def rank_call(communicator):
        nccl_communicator = sharded.NCCLCommunicator(
            sharded_cases._FakeNcclCommunicator(group, communicator.rank)
        )
        start, end = [(0, 11), (11, 30)][nccl_communicator.rank]
        local = dict(device)
        for name in ("target_logits", "draft_logits"):
            local[name] = device[name][:, start:end]
        return sharded.verify_ragged(communicator=nccl_communicator, vocab_start=start,
                                     vocab_size=30, uniforms=uniforms, **local)

    for result in sharded.run_local(2, rank_call, timeout=sharded_cases.TIMEOUT):
        np.testing.assert_array_equal(result.output_token_ids, expected.output_token_ids)
    launched = {name.split("<")[0] for name, *_ in cupy.launches}
    assert {"shard_stats_kernel", "shard_weights_kernel", "shard_positive_sums_kernel",
            "shard_first_crossings_kernel"} <= launched
    # Per-row numbers only: no copy to the host holds a row of either shard.
    assert copies and all(len(shape) < 2 or shape[-1] not in widths for shape in copies)
