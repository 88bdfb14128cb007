"""The conformance kit (``specdec_np.testing``): every check must fail its control.

Each deliberately broken verifier (``tests/kit/broken_verifiers.py``) must be reported as
failing with the property that names its bug; the package's own verifiers and the correct
controls must pass.  Torch implementations of Hugging Face's ``_speculative_sampling``
algorithm and of vLLM v0's are checked where torch is installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import broken_verifiers as bv
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import cli, testing
from specdec_np.testing import _padded as _kit_padded

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent

# The property each bug must be caught by (more may fail too).
EXPECTED = {
    "always_accept": {"acceptance rate = sum(min(p, q))", "exact law equals the target"},
    "reused_uniform": {"residual uses its own uniform", "exact law equals the target"},
    "less_equal": {"zero-probability tokens never emitted", "boundary uniforms (0 and 1 - 2^-53)"},
    "token0_fallback": {"zero residual falls back to p (not token 0)"},
    "wrong_row": {"residual from the right row", "exact law equals the target"},
    "point_mass_on_sampled": {"point-mass rule not applied to sampled drafts",
                              "exact law equals the target"},
}


@pytest.mark.parametrize("bug", bv.BUGS)
def test_each_bug_is_named(bug: str) -> None:
    report = testing.check_verifier(getattr(bv, bug))
    assert not report.passed
    assert EXPECTED[bug] <= set(report.failed()), str(report)
    assert "FAIL" in str(report)


def test_monte_carlo_only_controls() -> None:
    assert testing.check_verifier(bv.correct_own_randomness).passed
    report = testing.check_verifier(bv.always_accept_own_randomness)
    assert {"Monte Carlo chi-square", "acceptance rate = sum(min(p, q))"} <= set(report.failed())
    skipped = {row.name for row in report.rows if row.figure == "skipped"}
    assert {"exact law equals the target", "residual uses its own uniform"} <= skipped


def test_own_verifiers_pass() -> None:
    for verifier in (specdec_np.rejection_sample, bv.correct):
        report = testing.check_verifier(verifier)
        assert report.passed, str(report)
    names = {row.name for row in testing.check_verifier(specdec_np.rejection_sample).rows}
    assert {"seeded_seqs rows reproducible and batch-invariant",
            "counter_seeds rows reproducible and batch-invariant", "generator reproducible",
            "Monte Carlo chi-square (generator=)",
            "Monte Carlo chi-square (seeded_seqs=)"} <= names
    assert testing.check_verifier(specdec_np.greedy_sample, "greedy").passed


def test_block_verification() -> None:
    report = testing.check_verifier(bv.block, "block")
    assert report.passed, str(report)
    oracle = next(row for row in report.rows if row.name == "exact law equals the oracle")
    if not hasattr(_kit_padded._oracles, "block_verification_law"):
        assert oracle.figure == "skipped" and "no oracle for block" in oracle.detail
    wrong = testing.check_verifier(bv.block_first_failure, "block")
    assert "exact law equals the target" in wrong.failed()
    # Token-wise rejection is lossless (the target's law) but not block verification's law.
    tokenwise = testing.check_verifier(bv.correct, "block")
    expected = {"exact law equals the oracle"} if oracle.figure != "skipped" else set()
    assert set(tokenwise.failed()) == expected, str(tokenwise)
    ours = getattr(specdec_np, "block_verification_sample", None)
    if ours is not None:
        assert testing.check_verifier(ours, "block").passed


# -- greedy -------------------------------------------------------------------------------


def _greedy(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, argmax: Any = None) -> Any:
    target = np.asarray(target)
    k = draft_ids.shape[1]
    best = (argmax or (lambda rows: rows.argmax(axis=-1)))(target[:, :k])
    accepted = draft_ids == best
    return specdec_np.create_output(accepted, best, draft_ids, bonus).output_token_ids


def greedy_last_index(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any) -> Any:
    last = lambda rows: rows.shape[-1] - 1 - rows[..., ::-1].argmax(axis=-1)  # noqa: E731
    return _greedy(target, bonus, draft_probs, draft_ids, last)


def greedy_batch_dependent(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any) -> Any:
    first_row = lambda rows: np.broadcast_to(rows[:1].argmax(axis=-1), rows.shape[:2])  # noqa
    return _greedy(target, bonus, draft_probs, draft_ids, first_row)


def test_greedy_controls() -> None:
    assert testing.check_verifier(_greedy, "greedy").passed
    assert "first-index ties" in testing.check_verifier(greedy_last_index, "greedy").failed()
    assert {"argmax rule", "batch invariance"} <= set(
        testing.check_verifier(greedy_batch_dependent, "greedy").failed()
    )
    accept_all = lambda t, b, q, d: bv.always_accept(t, b, q, d, uniforms=np.zeros(  # noqa
        (len(d), d.shape[1] + 1)))
    assert "argmax rule" in testing.check_verifier(accept_all, "greedy").failed()


# -- batch invariance, seeds, format ------------------------------------------------------


def residual_of_next_batch_row(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                               uniforms: Any) -> Any:
    """Rejects with the row's own uniforms but recovers from the next batch row's inputs."""
    own = bv.correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
    rolled = bv.correct(np.roll(target, 1, axis=0), bonus, np.roll(draft_probs, 1, axis=0),
                        draft_ids, uniforms=uniforms)
    lengths = (own != -1).sum(axis=1)
    return np.where(np.arange(own.shape[1]) == (lengths - 1)[:, None], rolled, own)


def seeds_ignored(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                  generator: Any = None, seeded_seqs: Any = None) -> Any:
    """Draws from a fresh unseeded generator whatever it is given."""
    uniforms = np.random.default_rng().random((len(draft_ids), draft_ids.shape[1] + 1))
    return bv.correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)


def minus_one_as_zero(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                      uniforms: Any) -> Any:
    output = bv.correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
    return np.where(output == -1, 0, output)


def float_output(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                 uniforms: Any) -> Any:
    return bv.correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms).astype(float)


def test_batch_and_seed_controls() -> None:
    assert "batch invariance" in testing.check_verifier(residual_of_next_batch_row).failed()
    failed = testing.check_verifier(seeds_ignored).failed()
    assert {"seeded_seqs rows reproducible and batch-invariant",
            "generator reproducible"} <= set(failed)


def test_format_controls() -> None:
    assert "output format" in testing.check_verifier(minus_one_as_zero).failed()
    report = testing.check_verifier(float_output)
    assert "output format" in report.failed()
    assert "integer dtype" in next(r for r in report.rows if r.name == "output format").detail


@pytest.mark.slow  # a sweep: the default size is checked, with its controls, by the tests above
@settings(max_examples=6, deadline=None, derandomize=True)
@given(k=st.integers(1, 4), vocab_size=st.integers(3, 12), seed=st.integers(0, 2**32 - 1))
def test_sizes_and_seeds(k: int, vocab_size: int, seed: int) -> None:
    options = {"k": k, "vocab_size": vocab_size, "seed": seed, "num_rows": 20_000}
    good = testing.check_verifier(specdec_np.rejection_sample, **options)
    assert good.passed, str(good)
    assert "acceptance rate = sum(min(p, q))" in testing.check_verifier(
        bv.always_accept, **options
    ).failed()


# -- report, arguments, adapters ----------------------------------------------------------


def test_report_api() -> None:
    report = testing.check_verifier(bv.token0_fallback)
    text = str(report)
    assert text.splitlines()[1].split() == ["property", "result", "figure", "detail"]
    assert "token0_fallback" in text and "1 FAILED" in text
    with pytest.raises(testing.ConformanceError, match="zero residual") as caught:
        report.raise_if_failed()
    assert isinstance(caught.value, AssertionError)
    testing.check_verifier(bv.correct).raise_if_failed()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        testing.check_verifier(bv.correct, "no_such_kind")
    with pytest.raises(ValueError, match="kind must be one of"):
        testing.check_verifier(bv.correct, "point_mass")
    with pytest.raises(ValueError, match="layout must be one of"):
        testing.check_verifier(bv.correct, layout="dense")
    for timeout in (0, -1.0, float("nan"), float("inf"), "5", True, 1e10,
                    threading.TIMEOUT_MAX * 2):
        with pytest.raises(ValueError, match="timeout"):
            testing.check_verifier(bv.correct, timeout=timeout)
    with pytest.raises(TypeError, match="verifier must be callable"):
        testing.check_verifier(3)
    with pytest.raises(ValueError, match="num_rows"):
        testing.check_verifier(bv.correct, num_rows=10)


def test_the_longest_timeout_of_the_platform_is_accepted() -> None:
    """A limit as long as the platform's threads can wait is a limit, not an
    OverflowError in every property."""
    assert testing.check_verifier(bv.correct, timeout=threading.TIMEOUT_MAX, num_rows=1000).passed


def test_a_crashing_verifier_fails_every_property() -> None:
    def crash(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *, uniforms: Any) -> Any:
        raise RuntimeError("boom")

    report = testing.check_verifier(crash)
    assert not report.passed
    assert all(not row.passed for row in report.rows if row.figure != "skipped")


class _NotAnException(BaseException):
    """A BaseException that is no Exception, as some frameworks raise."""


def _raises_base(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                 uniforms: Any) -> Any:
    raise _NotAnException("stop")


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["caller's thread", "time limit"])
@pytest.mark.parametrize("verifier", [bv.exits, _raises_base], ids=["sys.exit", "BaseException"])
def test_a_verifier_that_exits_fails_the_property_it_was_in(verifier: Any,
                                                            timeout: float | None) -> None:
    report = testing.check_verifier(verifier, timeout=timeout, num_rows=1000)
    assert not report.passed
    raised = [row for row in report.rows if row.figure == "raised"]
    assert raised and all(not row.passed for row in raised), str(report)
    name = "SystemExit" if verifier is bv.exits else "_NotAnException"
    assert all(row.detail.startswith(name) for row in raised), str(report)


def test_a_keyboard_interrupt_stops_the_kit() -> None:
    def interrupted(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                    uniforms: Any) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        testing.check_verifier(interrupted, timeout=None, num_rows=1000)


class _Boxed:
    """A foreign array type that only speaks DLPack."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()


def test_dlpack_adapter() -> None:
    def foreign(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                uniforms: Any) -> Any:
        assert all(isinstance(a, _Boxed) for a in (target, bonus, draft_ids, uniforms))
        unbox = lambda a: None if a is None else np.from_dlpack(a)  # noqa: E731
        return _Boxed(bv.correct(*map(unbox, (target, bonus, draft_probs, draft_ids)),
                                 uniforms=np.from_dlpack(uniforms)))

    adapter = testing.DLPackAdapter(foreign, from_numpy=_Boxed)
    assert adapter.takes_uniforms
    assert testing.check_verifier(adapter).passed
    broken = testing.DLPackAdapter(
        lambda t, b, q, d, *, uniforms: bv.wrong_row(
            *(None if a is None else np.from_dlpack(a) for a in (t, b, q, d)),
            uniforms=np.from_dlpack(uniforms)),
        from_numpy=_Boxed,
    )
    assert "residual from the right row" in testing.check_verifier(broken).failed()


def test_importing_the_kit_does_not_import_torch() -> None:
    code = ("import sys, specdec_np.testing, specdec_np_pytest_plugin, specdec_np.cli; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_loading_the_pytest_plugin_imports_nothing_of_the_package(tmp_path: Any) -> None:
    """pytest loads the plugin into every session of the environment: it must not import
    the package (its compiled kernels and OpenMP runtime) until the fixture is used."""
    (tmp_path / "test_probe.py").write_text(
        "import sys\n"
        "def test_probe():\n"
        "    assert not [m for m in sys.modules if m.split('.')[0] == 'specdec_np']\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--trace-config", "--co", "-q", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert "specdec_np_pytest_plugin" in listed.stdout, "the plugin is not registered"


def test_pytest_fixture(verifier_conformance: Any) -> None:
    assert verifier_conformance(bv.correct).passed
    with pytest.raises(pytest.fail.Exception, match="residual from the right row"):
        verifier_conformance(bv.wrong_row)


# -- command line -------------------------------------------------------------------------


def test_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    assert cli.main(["check", "--verifier", "broken_verifiers:wrong_row"]) == 1
    assert "residual from the right row" in capsys.readouterr().out
    assert cli.main(["check", "--verifier", "broken_verifiers:correct"]) == 0
    assert cli.main(["check", "--verifier", "broken_verifiers:block", "--kind", "block"]) == 0
    assert cli.main(["check", "--verifier", "specdec_np:greedy_sample", "--kind", "greedy"]) == 0
    capsys.readouterr()
    # sys.exit(0) in the verifier fails the properties it was in: status 1, with the report.
    assert cli.main(["check", "--verifier", "broken_verifiers:exits"]) == 1
    assert "SystemExit: 0" in capsys.readouterr().out
    assert cli.main(["check", "--verifier", "broken_verifiers:nothing"]) == 2
    assert "cannot load --verifier" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["check", "--verifier", "broken_verifiers:correct", "--kind", "no_such_kind"])


def test_cli_subprocess() -> None:
    def run(spec: str) -> int:
        return subprocess.run(
            [sys.executable, "-m", "specdec_np", "check", "--verifier", spec, "--json"],
            cwd=TESTS, capture_output=True, text=True, timeout=120,
        ).returncode

    assert run("broken_verifiers:token0_fallback") == 1
    assert run("broken_verifiers:correct") == 0


# -- torch implementations written elsewhere ----------------------------------------------


def hf_speculative_sampling(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                            generator: Any = None) -> Any:
    """The algorithm of Hugging Face transformers' ``_speculative_sampling``, batched.

    Accept while ``r <= p / q`` (probability ratios, ``r ~ U[0, 1)``); at the first
    rejection sample ``clamp(p - q, min=0)`` normalised with ``torch.multinomial``; if all
    are accepted, sample the bonus from the last target row.  ``bonus`` is not used.
    """
    import torch

    batch_size, k = draft_ids.shape
    p = target[:, :k].gather(2, draft_ids.unsqueeze(-1)).squeeze(-1)
    q = draft_probs.gather(2, draft_ids.unsqueeze(-1)).squeeze(-1)
    ratio = p / q
    r = torch.rand(ratio.shape, dtype=ratio.dtype, generator=generator)
    rejected = ~(r <= ratio)
    n_matches = (rejected.cumsum(dim=-1) < 1).sum(dim=-1)
    rows = torch.arange(batch_size)
    at = n_matches.clamp(max=k - 1)
    p_prime = torch.clamp(target[rows, at] - draft_probs[rows, at], min=0)
    p_prime = p_prime / p_prime.sum(dim=-1, keepdim=True)
    last = torch.where((n_matches == k).unsqueeze(-1), target[:, k], p_prime)
    sampled = torch.multinomial(last, 1, generator=generator).squeeze(-1)
    output = torch.full((batch_size, k + 1), -1, dtype=torch.int64)
    keep = torch.arange(k).unsqueeze(0) < n_matches.unsqueeze(1)
    output[:, :k] = torch.where(keep, draft_ids, output[:, :k])
    output[rows, n_matches] = sampled
    return output


@pytest.fixture(scope="module")
def torch_baselines() -> Any:
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        import torch_baselines
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    torch_baselines.configure(2)
    return torch_baselines


def test_torch_hugging_face_algorithm(torch_baselines: Any) -> None:
    report = testing.check_verifier(testing.TorchAdapter(hf_speculative_sampling))
    print(report)
    # Lossless on ordinary inputs; crashes where the residual is zero (p == q at a rejected
    # draft outside both supports): torch.multinomial refuses the all-NaN row.
    assert set(report.failed()) == {"zero residual falls back to p (not token 0)"}, str(report)
    row = next(r for r in report.rows if r.name.startswith("zero residual"))
    assert "raised RuntimeError" in row.detail


def test_torch_vllm_v0_algorithm(torch_baselines: Any) -> None:
    report = testing.check_verifier(testing.TorchAdapter(torch_baselines.rejection_sample))
    print(report)
    # The residual clamped to the smallest float turns a zero residual into the uniform
    # distribution over the vocabulary, which emits tokens of target probability zero.
    assert set(report.failed()) == {"zero residual falls back to p (not token 0)"}, str(report)


def test_torch_adapter_declares_keywords(torch_baselines: Any) -> None:
    adapter = testing.TorchAdapter(torch_baselines.rejection_sample)
    assert adapter.takes_generator and not adapter.takes_uniforms


# -- the documentation shows real output --------------------------------------------------


def _without_timing(text: str) -> list[str]:
    return [re.sub(r"\[\d+\.\d s\]$", "[t]", line.rstrip()) for line in text.splitlines()]


def test_docs_example_is_the_real_report() -> None:
    page = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"```console\n\$ cd tests/kit && specdec-np check --verifier "
                      r"broken_verifiers:wrong_row\n(.*?)\n\$ echo", page, re.S)
    assert block is not None
    assert _without_timing(block.group(1)) == _without_timing(
        str(testing.check_verifier(bv.wrong_row)))


def test_readme_excerpt_is_from_the_real_report() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Testing your own verifier", 1)[1].split("## Performance", 1)[0]
    excerpt = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    real = _without_timing(str(testing.check_verifier(bv.token0_fallback)))
    for line in _without_timing(excerpt):
        assert line == "..." or line in real, line


def _grid_law(verifier: Any) -> Any:
    """A ``ChainLaw``-shaped exact law of a verifier, by the kit's exact grid, standing in
    for the oracles' module (to test the hook, not the laws)."""

    def law(p: np.ndarray, q: np.ndarray) -> Any:
        batch = _kit_padded._oracles.threshold_batch(p, q, refine=8)
        n, k = batch.draft_token_ids.shape
        output = verifier(np.broadcast_to(p, (n, *p.shape)), np.zeros((n, 1), dtype=np.int64),
                          np.broadcast_to(q, (n, *q.shape)), batch.draft_token_ids,
                          uniforms=batch.uniforms)
        length = float(np.dot((output != -1).sum(axis=1) - 1, batch.weights))
        output[:, k] = -1  # the bonus: continued by p_k, as the oracle does
        return SimpleNamespace(law=_kit_padded._completed_law(output, batch.weights, p),
                               expected_accepted_length=length)

    return law


def test_block_oracle_is_used_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kit_padded._oracles, "block_verification_law", _grid_law(bv.block),
                        raising=False)
    report = testing.check_verifier(bv.block, "block")
    assert report.passed, str(report)
    oracle = next(row for row in report.rows if row.name == "exact law equals the oracle")
    assert oracle.figure != "skipped"
    # Token-wise rejection is lossless (the target check passes) but is not block's law.
    failed = testing.check_verifier(bv.correct, "block").failed()
    assert failed == ["exact law equals the oracle"]


def test_rejection_oracle_is_used_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kit_padded._oracles, "rejection_law", _grid_law(bv.correct),
                        raising=False)
    assert testing.check_verifier(specdec_np.rejection_sample).passed
    assert "exact law equals the oracle" in testing.check_verifier(bv.block).failed()


def float32_only(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                 uniforms: Any) -> Any:
    """A verifier that, like many engines, takes float32 probabilities only."""
    if target.dtype != np.float32 or (draft_probs is not None and draft_probs.dtype != np.float32):
        raise TypeError(f"float32 probabilities expected; found {target.dtype}")
    return bv.correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)


def test_float32_probabilities() -> None:
    for verifier in (float32_only, specdec_np.rejection_sample):
        report = testing.check_verifier(verifier, probs_dtype=np.float32)
        assert report.passed, str(report)
    assert not testing.check_verifier(float32_only).passed
    assert "exact law equals the target" in testing.check_verifier(
        bv.wrong_row, probs_dtype=np.float32).failed()
    assert testing.check_verifier(bv.block, "block", probs_dtype=np.float32).passed
    with pytest.raises(ValueError, match="probs_dtype"):
        testing.check_verifier(bv.correct, probs_dtype=np.float16)
