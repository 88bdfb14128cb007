"""``specdec-np check``: the conformance kit run over the registry, on every backend.

For each registry verifier the kit knows (:data:`specdec_np.testing.KINDS`), the
package's own stateless function (``registry entry.function_name`` of
:mod:`specdec_np.verify`) goes through :func:`specdec_np.testing.check_verifier`, one
check per property of its report.  Every deterministic verifier's kernel is also compared
with its array-API reference (:func:`specdec_np._reference.chains.reference_for`) on fixed random
batches, float32 and float64, field by field (output, accepted lengths and counts: the
kit reads the output only).  Each check runs on NumPy and, when usable, on CuPy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import registry, testing, verify
from .._layouts import ragged as _ragged
from .._reference import chains as _reference
from .._runtime import arrays as _backend
from ._monte_carlo import array_module, to_numpy

__all__ = ["CheckResult", "CheckRow", "check_backends", "run_checks", "usable_backends"]

#: The seed of the kit's inputs and of the reference batches: the same report every run.
SEED = 0


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check.

    Attributes
    ----------
    name : str
        ``"<verifier>: <property>"``.
    passed : bool
        False for a check that failed, and for one that did not run.
    detail : str
        The measured numbers (or the exception), for a human.
    skipped : bool
        The check did not run (a kit property reported as skipped): neither passed nor
        failed.
    """

    name: str
    passed: bool
    detail: str
    skipped: bool = False


@dataclass(frozen=True)
class CheckRow:
    """One row of the ``specdec-np check`` table: a check on one backend.

    Attributes
    ----------
    name : str
    backend : str
    passed : bool
    detail : str
    skipped : bool
        Did not run; neither passed nor failed.
    """

    name: str
    backend: str
    passed: bool
    detail: str
    skipped: bool = False


def usable_backends() -> list[str]:
    """``["numpy"]``, and ``"cupy"`` after it when CuPy has a usable device."""
    return ["numpy"] + (["cupy"] if _backend.cuda_available() else [])


def _package_verifier(verifier: registry.Verifier, xp: Any) -> Any:
    """The package's function of ``verifier`` for the kit, its inputs moved to ``xp``.

    Whether it takes explicit uniforms, and its positional arguments, are the registry's
    facts, not read from the signature: a stand-in that hides its keywords behind
    ``**kwargs`` still gets the exact-law checks.  ``generator=`` and ``seeded_seqs=`` are
    exercised where the signature shows them.
    """
    function = getattr(verify, verifier.function_name)
    adapter = testing.DLPackAdapter(function, from_numpy=xp.asarray)
    adapter.takes_uniforms = verifier.stochastic
    # The deterministic functions take no draft rows: (target, bonus, draft_token_ids).
    adapter.positional_arguments = 4 if verifier.stochastic else 3
    adapter.__name__ = f"specdec_np.{verifier.function_name}"
    return adapter


def _kit_checks(verifier: registry.Verifier, xp: Any) -> list[CheckResult]:
    if getattr(verify, verifier.function_name, None) is None:
        return [
            CheckResult(
                f"{verifier.name}: conformance kit",
                False,
                f"specdec_np.verify.{verifier.function_name} is missing",
            )
        ]
    report = testing.check_verifier(_package_verifier(verifier, xp), verifier.name, seed=SEED)
    return [
        CheckResult(f"{verifier.name}: {row.name}", row.passed, f"{row.figure}; {row.detail}",
                    row.skipped)
        for row in report.rows
    ]


def _reference_batch(
    rng: np.random.Generator, dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax rows of varied sharpness, drafts mostly the argmax, random bonus ids."""
    batch_size, k, vocab_size = 64, 4, 50
    logits = rng.standard_normal((batch_size, k + 1, vocab_size)) * rng.uniform(
        0.5, 6.0, (batch_size, k + 1, 1)
    )
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    probs = probs.astype(dtype)
    argmax = probs[:, :k].argmax(axis=-1)
    random_ids = rng.integers(0, vocab_size, (batch_size, k))
    draft_ids = np.where(rng.random((batch_size, k)) < 0.7, argmax, random_ids).astype(np.int64)
    bonus = rng.integers(0, vocab_size, (batch_size, 1)).astype(np.int64)
    return probs, bonus, draft_ids


def _parameter_settings(verifier: registry.Verifier) -> list[dict[str, float]]:
    """The defaults, and (for a verifier with parameters) each default tripled."""
    defaults = dict(zip(verifier.parameter_names, verifier.parameter_defaults))
    if not defaults:
        return [{}]
    return [defaults, {name: round(3.0 * value, 6) for name, value in defaults.items()}]


def _compare(label: str, fast: Any, expected: Sequence[Any]) -> tuple[bool, str]:
    pairs = zip(
        ("output_token_ids", "accepted_lengths", "num_accepted"),
        (fast.output_token_ids, fast.accepted_lengths, fast.num_accepted),
        expected,
    )
    for field, got, wanted in pairs:
        got, wanted = to_numpy(got), to_numpy(wanted)
        if not np.array_equal(got, wanted):
            rows = np.flatnonzero(np.any((got != wanted).reshape(got.shape[0], -1), axis=1))
            return False, f"{label}: {field} differs from the reference in rows {rows[:8]}"
    return True, f"{label}: equal to the reference"


def _padded_kernel(verifier: registry.Verifier) -> Callable[..., Any]:
    """The verifier's padded function; for one reached through ``method=`` only (no
    ``function_name``), :func:`specdec_np.verify_ragged` on the same rows, every
    ``k_b = k``."""
    if verifier.function_name is not None:
        return getattr(verify, verifier.function_name)

    def through_ragged(target: Any, bonus: Any, draft_ids: Any, **parameters: Any) -> Any:
        batch_size, positions, vocab_size = target.shape
        xp = target.__array_namespace__()
        return _ragged.verify_ragged(
            num_draft_tokens=xp.full((batch_size,), positions - 1, dtype=xp.int64),
            draft_token_ids=xp.reshape(draft_ids, (-1,)),
            target_probs=xp.reshape(target, (batch_size * positions, vocab_size)),
            bonus_token_ids=xp.reshape(bonus, (batch_size,)),
            method=verifier.name,
            **parameters,
        )

    return through_ragged


def _kernel_equals_reference(verifier: registry.Verifier, xp: Any) -> CheckResult:
    function = _padded_kernel(verifier)
    reference = _reference.reference_for(verifier)
    rng = np.random.default_rng(777)
    passed, texts = True, []
    for dtype in (np.float32, np.float64):
        probs, bonus, draft_ids = _reference_batch(rng, dtype)
        target, bonus_x, draft_x = xp.asarray(probs), xp.asarray(bonus), xp.asarray(draft_ids)
        for parameters in _parameter_settings(verifier):
            fast = function(target, bonus_x, draft_x, **parameters)
            expected = reference(target, bonus_x, None, draft_x, **parameters)
            values = ", ".join(f"{name}={value:g}" for name, value in parameters.items())
            label = np.dtype(dtype).name + (f" ({values})" if values else "")
            ok, text = _compare(label, fast, expected)
            passed &= ok
            texts.append(text)
    return CheckResult(f"{verifier.name}: kernel equals reference", passed, "; ".join(texts))


def _steps(xp: Any) -> list[tuple[str, Callable[[], list[CheckResult] | CheckResult]]]:
    steps: list[tuple[str, Callable[[], Any]]] = []
    for verifier in registry.VERIFIERS:
        if verifier.name in testing.KINDS:
            steps.append(
                (
                    f"{verifier.name}: conformance kit",
                    lambda verifier=verifier: _kit_checks(verifier, xp),
                )
            )
        if not verifier.stochastic:
            steps.append(
                (
                    f"{verifier.name}: kernel equals reference",
                    lambda verifier=verifier: _kernel_equals_reference(verifier, xp),
                )
            )
    return steps


def run_checks(backend: str = "numpy") -> list[CheckResult]:
    """Run the self-check of every registry verifier on one backend.

    The conformance kit on the package's function of every verifier in
    :data:`specdec_np.testing.KINDS` (exact law against the target and the oracle, Monte
    Carlo chi-square, acceptance, the bug catalogue, batch invariance, seeds, output
    format), and the kernel of every deterministic verifier against its reference.

    Parameters
    ----------
    backend : {"numpy", "cupy"}
        Where the kernels run.  The oracles and statistics are pure NumPy either way.

    Returns
    -------
    list of CheckResult
        One per property and verifier; a step that raises is reported as one failed check
        with the exception.

    Raises
    ------
    ValueError
        For an unknown backend.
    """
    xp = array_module(backend)
    results: list[CheckResult] = []
    for name, step in _steps(xp):
        start = time.perf_counter()
        try:
            outcome = step()
        except Exception as error:  # a crash is a failed check, with its reason
            results.append(CheckResult(name, False, f"raised {type(error).__name__}: {error}"))
            continue
        elapsed = time.perf_counter() - start
        for result in outcome if isinstance(outcome, list) else [outcome]:
            results.append(
                CheckResult(result.name, result.passed, f"{result.detail} [{elapsed:.2f} s]",
                            result.skipped)
            )
    return results


def check_backends(
    backends: Iterable[str], progress: Callable[[str], None] | None = None
) -> list[CheckRow]:
    """:func:`run_checks` on each backend, as table rows.

    Parameters
    ----------
    backends : iterable of {"numpy", "cupy"}
    progress : callable, optional
        Told ``"running the conformance checks on <backend>..."`` before each.

    Returns
    -------
    list of CheckRow
        A run that raises, or returns no check, is one failed row named ``run_checks``.
    """
    rows: list[CheckRow] = []
    for backend in backends:
        if progress is not None:
            progress(f"running the conformance checks on {backend}...")
        try:
            results = run_checks(backend)
        except Exception as error:  # a crashed run is a failed check, with its reason
            rows.append(
                CheckRow("run_checks", backend, False, f"raised {type(error).__name__}: {error}")
            )
            continue
        if not results:
            rows.append(CheckRow("run_checks", backend, False, "no check was run"))
        rows.extend(CheckRow(r.name, backend, bool(r.passed), str(r.detail),
                             bool(getattr(r, "skipped", False))) for r in results)
    return rows
