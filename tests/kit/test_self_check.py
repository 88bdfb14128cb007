"""``specdec-np check``: the conformance kit over the registry and the reference checks.

The runner must cover every registry verifier, pass on the package's own kernels, and fail,
naming the property, when a kernel is swapped for a broken one.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdec_np import registry, testing, verify
from specdec_np._reference import chains as _reference
from specdec_np.testing import _self_check

# The block kernel's chi-square of the whole chain (the kit's Monte Carlo).
BLOCK_KERNEL_CHECK = "block: Monte Carlo chi-square"


@pytest.fixture(scope="module")
def numpy_checks() -> list:
    """One full run of the checks on the NumPy backend, shared by the tests that read it."""
    return _self_check.run_checks()


def test_run_checks_all_pass_on_numpy(numpy_checks):
    results = numpy_checks
    assert len(results) >= 8
    names = [r.name for r in results]
    assert len(set(names)) == len(names)
    assert BLOCK_KERNEL_CHECK in names
    for result in results:
        assert isinstance(result, _self_check.CheckResult)
        assert isinstance(result.passed, bool)
        assert result.passed, f"{result.name}: {result.detail}"
    # Every registered verifier has at least one row of its own.
    for name in registry.names():
        assert any(n.startswith(name) for n in names), name


def test_check_covers_every_registry_verifier(numpy_checks):
    """The kit's properties for every verifier it knows, the reference comparison for every
    deterministic one; nothing else."""
    names = [r.name for r in numpy_checks]
    for verifier in registry.VERIFIERS:
        own = {n.split(": ", 1)[1] for n in names if n.split(": ", 1)[0] == verifier.name}
        expected = set()
        if verifier.name in testing.KINDS:
            report = testing.check_verifier(getattr(verify, verifier.function_name), verifier.name)
            expected |= {row.name for row in report.rows}
        if not verifier.stochastic:
            expected.add("kernel equals reference")
        assert expected, f"{verifier.name} is checked by nothing"
        assert own == expected, verifier.name
    assert {n.split(": ", 1)[0] for n in names} == set(registry.names())


def test_run_checks_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        _self_check.run_checks("tpu")


@pytest.mark.slow  # a full run per control: the block and crash controls stay fast
def test_run_checks_fails_for_a_lossy_rejection_sampler(monkeypatch):
    real = verify.rejection_sample

    def always_accept(target, bonus, draft_probs, draft_ids, **kwargs):
        result = real(target, bonus, draft_probs, draft_ids, **kwargs)
        k = draft_ids.shape[1]
        output = np.hstack([draft_ids.astype(np.int64), bonus.astype(np.int64)])
        batch = draft_ids.shape[0]
        return verify.VerificationResult(output, np.full(batch, k, np.int64), result.num_accepted)

    monkeypatch.setattr(verify, "rejection_sample", always_accept)
    failed = {r.name for r in _self_check.run_checks() if not r.passed}
    assert "rejection: Monte Carlo chi-square" in failed
    assert "rejection: acceptance rate = sum(min(p, q))" in failed
    assert "rejection: exact law equals the target" in failed
    assert "rejection: exact law equals the oracle" in failed
    assert not any(name.startswith("block") for name in failed)


@pytest.mark.slow  # a full run per control: the block and crash controls stay fast
def test_run_checks_fails_for_a_wrong_greedy_kernel(monkeypatch):
    real = verify.greedy_sample

    def off_by_one(*args, **kwargs):
        result = real(*args, **kwargs)
        return result._replace(num_accepted=result.num_accepted + 1)

    monkeypatch.setattr(verify, "greedy_sample", off_by_one)
    failed = {r.name for r in _self_check.run_checks() if not r.passed}
    assert failed == {"greedy: kernel equals reference"}


def _reference_block(first_failure=False):
    """The array-API reference as a kernel; ``first_failure`` stops at the first failed
    check instead of taking the largest passing position (the classic bug)."""

    def function(target, bonus, draft_probs, draft_ids, *, uniforms=None, generator=None):
        if uniforms is None:
            uniforms = generator.random((draft_ids.shape[0], draft_ids.shape[1] + 1))
        if not first_failure:
            outputs = _reference.block_verification_sample(
                target, bonus, draft_probs, draft_ids, uniforms
            )
            return verify.VerificationResult(*outputs)
        k = draft_ids.shape[1]
        residual, h = _reference._block_thresholds(np, target, draft_probs, draft_ids)
        failed = uniforms[:, :k] >= h
        tau = np.where(failed.any(axis=1), np.argmax(failed, axis=1), k)
        outputs = _reference._block_emit(
            np, target, bonus, draft_ids, residual, tau, uniforms[:, k]
        )
        return verify.VerificationResult(*outputs)

    return function


def test_run_checks_block_kernel_check_passes_and_fails(monkeypatch):
    monkeypatch.setattr(verify, "block_verification_sample", _reference_block())
    results = {r.name: r for r in _self_check.run_checks()}
    assert results[BLOCK_KERNEL_CHECK].passed, results[BLOCK_KERNEL_CHECK].detail
    assert all(r.passed for name, r in results.items() if name.startswith("block")), results
    monkeypatch.setattr(verify, "block_verification_sample", _reference_block(True))
    results = {r.name: r for r in _self_check.run_checks()}
    assert not results[BLOCK_KERNEL_CHECK].passed, results[BLOCK_KERNEL_CHECK].detail
    assert not results["block: exact law equals the target"].passed
    monkeypatch.delattr(verify, "block_verification_sample")
    results = {r.name: r for r in _self_check.run_checks()}
    block = [r for name, r in results.items() if name.startswith("block")]
    assert block and not any(r.passed for r in block)
    assert all("missing" in r.detail for r in block)


def test_run_checks_reports_a_crash_as_a_failure(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(verify, "typical_acceptance_sample", crash)
    results = _self_check.run_checks()
    crashed = [r for r in results if "boom" in r.detail]
    assert crashed and not any(r.passed for r in crashed)
    # The kit checks typical acceptance too: its rule and batch invariance crash as well.
    names = [r.name for r in crashed]
    assert "typical: kernel equals reference" in names
    assert "typical: typical rule of the reference" in names
    assert all(name.startswith("typical: ") for name in names)


def test_check_backends_rows_and_failures(monkeypatch, numpy_checks):
    told = []
    monkeypatch.setattr(_self_check, "run_checks", lambda backend: numpy_checks)
    rows = _self_check.check_backends(["numpy"])
    assert rows and all(row.backend == "numpy" and row.passed for row in rows)
    monkeypatch.setattr(_self_check, "run_checks", lambda backend: [])
    rows = _self_check.check_backends(["numpy", "cupy"], told.append)
    assert [(r.name, r.backend, r.passed) for r in rows] == [
        ("run_checks", "numpy", False),
        ("run_checks", "cupy", False),
    ]
    assert told == [f"running the conformance checks on {b}..." for b in ("numpy", "cupy")]

    def crash(backend):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(_self_check, "run_checks", crash)
    (row,) = _self_check.check_backends(["numpy"])
    assert not row.passed and "kernel exploded" in row.detail


def test_usable_backends(monkeypatch):
    monkeypatch.setattr(_self_check._backend, "cuda_available", lambda: False)
    assert _self_check.usable_backends() == ["numpy"]
    monkeypatch.setattr(_self_check._backend, "cuda_available", lambda: True)
    assert _self_check.usable_backends() == ["numpy", "cupy"]
