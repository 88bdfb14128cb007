"""The engine layout from logits: ``specdec_np.verify_ragged`` against the reference adapter
``ragged_reference.verify_ragged``, the exact law with sampling transforms, chi-square tests on the
real kernel with negative controls, ragged invariances, bad input and mixed batches.

What may differ between the kernel and the reference on the same uniforms, and why:

* **Probabilities.**  The kernel's ``p(y)`` comes from ``logits_law.h``, the reference's from
  :func:`~specdec_np._reference.chains.process_logits`.  For float32 rows both compute ``w`` with
  the same fast exponential, bit for bit; the normalisers differ by summation order (at
  most ``4 V 2^-53`` relative), by the online pass's per-lane rescaling when no filter is
  on (``2 u ln V + 8 u``, ``u`` the unit roundoff of the dtype), and the materialised rows
  that the residual scans read are rounded once more to the dtype (``u``).  Twice that sum
  is :func:`relative_allowance`: ``2.0e-6`` for float32 at ``V = 40``, ``4e-14`` for
  float64.  Nothing is compared with it directly; it sizes the knife-edges below.
* **Kept sets.**  min-p and top-k keep identical sets (same ``w`` and ``z`` bits; float64
  rows may see one ulp between libm's and NumPy's ``exp``, so a token whose ``w`` is within
  4 ulp of ``min_p`` is a knife-edge); top-p's masses are summed in another order, so a tie
  group whose cumulative mass lies within ``(4 V + 8) 2^-53`` of ``top_p`` times the total
  may fall on either side.  A request with such a row may differ anywhere, and only its
  format is checked.
* **Acceptance decisions** must be equal, except where the compared quantities are within
  the allowance: ``|u q - p| <= delta (u q + p)`` for rejection; for block verification
  ``|eta_i - h_i|`` within the propagated bound of ``h = Z / (Z + 1 - rho)``, or a path
  step ``rho p`` within ``delta`` of ``q``; for typical acceptance ``p(x)`` within the
  entropy bound of ``tests/verifiers/test_typical_acceptance.py`` plus ``2 delta`` of its
  threshold, or a recovered argmax whose top two processed probabilities are within ``2 delta``.
* **Residual and bonus draws** may differ only where ``v * Z`` lies within rounding of a
  CDF boundary (:func:`draw_checks.assert_draw_consistent`), with the CDF tolerance widened
  to ``delta`` times the mass the weights are made of (the weights are differences of rows
  that are themselves ``delta``-close); a residual whose total is within that tolerance
  of 0 may fall back to ``p`` on one side only, so there any token of positive ``p`` is
  allowed.

A difference is accepted only if one of these explains it: outputs that agree are never
examined, and outputs that differ without a knife-edge fail.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from draw_checks import LARGEST_BELOW_ONE, assert_draw_consistent, boundary_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import registry
from specdec_np._reference import chains as _reference
from specdec_np._reference import ragged as ragged_reference
from specdec_np._reference.chains import _processed_law, fast_expf, process_logits
from specdec_np._runtime.contract import FILTER_ORDER_CODES
from specdec_np.testing import _monte_carlo, _oracles, _statistics

METHODS = registry.names()
LOSSLESS = registry.names(lossless=True)
#: The entry that decides a temperature-0 request of a sampling verifier.
GREEDY_DECODING = registry.get("greedy")


# --------------------------------------------------------------------------------------
# Allowances
# --------------------------------------------------------------------------------------


def relative_allowance(dtype: Any, vocab_size: int) -> float:
    """``delta``: how far the kernel's processed probabilities may be from the reference's,
    relative to them (module docstring)."""
    u = 2.0**-24 if np.dtype(dtype) == np.float32 else 2.0**-53
    sums = 4 * vocab_size * 2.0**-53
    online = 2 * u * math.log(max(vocab_size, 2)) + 8 * u
    return 2 * (sums + online + u)


def _law_weights(row: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(z with NaN as -inf, w = exp(z - max z) in float64) as the law defines them."""
    z = (row / row.dtype.type(temperature)).astype(row.dtype)
    z = np.where(np.isnan(z), -np.inf, z)
    with np.errstate(invalid="ignore"):
        x = z - z.max()
    w = fast_expf(x).astype(np.float64) if row.dtype == np.float32 else np.exp(x)
    return z, w


def kept_set_knife_edge(
    row: np.ndarray, setting: tuple[float, int, float, float], filter_order: str = "vllm"
) -> bool:
    """Whether the kernel may keep another set than the reference on this row (in
    llama.cpp's order the filters' knife-edges are those of the logits at temperature 1)."""
    temperature, top_k, top_p, min_p = setting
    z, w = _law_weights(row, temperature)
    if not np.isfinite(z.max()):
        return False  # +inf entries (uniform over them) or no mass: no filter applies
    if filter_order == "llama.cpp":
        # top-p weighs top-k's set at temperature 1; min-p comes after it.
        z, w = _law_weights(row, 1.0)
        temperature, min_p_before_top_p = 1.0, 0.0
    else:
        min_p_before_top_p = min_p
    if row.dtype == np.float64 and min_p > 0.0:
        if np.any(np.abs(w - min_p) <= 4 * np.spacing(min_p)):
            return True
    if top_p >= 1.0:
        return False
    _, before, _ = _processed_law(
        row[None, :],
        np.array([temperature]),
        np.array([top_k]),
        np.array([1.0]),
        np.array([min_p_before_top_p]),
    )
    before = before[0] & (w > 0)
    total = math.fsum(w[before].tolist())
    edge = (4 * row.size + 8) * 2.0**-53 * total
    for value in np.unique(z[before]):
        mass = math.fsum(w[before & (z >= value)].tolist())
        if abs(mass - top_p * total) <= edge:
            return True
    return False


# --------------------------------------------------------------------------------------
# One request as the reference sees it
# --------------------------------------------------------------------------------------


class Request:
    """Request ``b`` of a case: its rows, processed rows (float64) and uniforms."""

    def __init__(self, case: dict[str, Any], b: int) -> None:
        counts = case["num_draft_tokens"]
        start = int(counts[:b].sum())
        self.k = k = int(counts[b])
        self.dtype = case["target_logits"].dtype
        self.vocab_size = case["target_logits"].shape[1]
        self.raw_target = case["target_logits"][start + b : start + b + k + 1]
        draft = case["draft_logits"]
        self.raw_draft = None if draft is None else draft[start : start + k]
        self.ids = case["draft_token_ids"][start : start + k].astype(np.int64)
        self.setting = tuple(case[name][b] for name in ("temperature", "top_k", "top_p", "min_p"))
        self.filter_order = case.get("filter_order", "vllm")
        self.greedy = registry.get(case["method"]).greedy or self.setting[0] == 0.0
        self.uniforms = case["uniforms"][b]
        self.bonus_given = case["bonus_token_ids"] is not None
        self.delta = relative_allowance(self.dtype, self.vocab_size)
        if self.greedy:
            return
        self.p = self._process(self.raw_target)
        self.q = None if self.raw_draft is None else self._process(self.raw_draft)

    def _process(self, rows: np.ndarray) -> np.ndarray:
        n = rows.shape[0]
        t, top_k, top_p, min_p = self.setting
        return process_logits(
            rows, np.full(n, t), np.full(n, int(top_k)), np.full(n, top_p), np.full(n, min_p),
            self.filter_order,
        )  # fmt: skip

    def q_rows(self) -> np.ndarray:
        """Draft rows as float64 distributions (one-hot for point-mass drafts)."""
        if self.q is not None:
            return self.q
        one_hot = np.zeros((self.k, self.vocab_size))
        one_hot[np.arange(self.k), self.ids] = 1.0
        return one_hot

    def any_kept_set_knife_edge(self) -> bool:
        rows = [self.raw_target] + ([] if self.raw_draft is None else [self.raw_draft])
        return any(
            kept_set_knife_edge(row, self.setting, self.filter_order) for r in rows for row in r
        )


def _near(a: float, b: float, relative: float) -> bool:
    return abs(a - b) <= relative * (abs(a) + abs(b)) + 1e-300


def _draw_explained(token: int, expected: int, weights: np.ndarray, v: float, tol: float):
    """assert_draw_consistent with the CDF tolerance ``tol`` (absolute)."""
    mass = tol / boundary_tolerance(weights.size)
    assert_draw_consistent(token, expected, weights, v, mass=mass)


def _residual_explained(request: Request, token: int, expected: int, weights, p_row, tol):
    """A residual draw: within a CDF boundary of the reference's, or any token of positive
    ``p`` when the residual mass is within ``tol`` of 0 (one side may fall back to ``p``)."""
    total = math.fsum(np.maximum(weights, 0.0).tolist())
    if total <= tol:
        assert p_row[token] > 0, f"token {token} has target probability 0"
        return
    _draw_explained(token, expected, np.maximum(weights, 0.0), request.uniforms[request.k], tol)


def _argmax_near_tie(row: np.ndarray, relative: float) -> bool:
    """Whether the two largest distinct values of a row are within ``relative`` of each
    other (two roundings of the row may then disagree on its argmax)."""
    # Distinct values: where the largest is tied, the value below it is the one a rounding
    # may merge with it (float32 weights of logits 2^-52 apart are equal).
    ordered = np.unique(row)[::-1]
    return ordered.size > 1 and ordered[0] > 0 and _near(ordered[0], ordered[1], relative)


def _argmax_merged_by_rounding(
    logits: np.ndarray, p: np.ndarray, token: int, expected: int
) -> bool:
    """Whether the reference's rounding tied the kernel's token with its own at its
    maximum while the kernel's token has the larger logit (logits 2^-52 apart give one
    weight): its first-index rule then picked the lower logit.  Equal logits stay a tie
    that the first index must break."""
    return bool(
        p[token] == p[expected] == p.max() and logits[token] > logits[expected]
    )


def check_request(
    request: Request,
    method: str,
    kernel: np.ndarray,
    kernel_length: int,
    reference: np.ndarray,
    reference_length: int,
    parameters: dict[str, float],
) -> str:
    """Assert that the kernel's output row equals the reference's or that a documented
    knife-edge explains the difference; returns which ("equal" or the reason)."""
    k = request.k
    assert kernel_length == reference_length or not request.greedy
    if np.array_equal(kernel, reference) and kernel_length == reference_length:
        return "equal"
    assert not request.greedy, "greedy requests are exact"
    assert np.all(kernel[:kernel_length] == request.ids[:kernel_length])
    assert np.all(kernel[kernel_length + 1 :] == -1)
    if request.any_kept_set_knife_edge():
        return "kept set"
    verifier = registry.get(method)
    decisions = _reference.decisions_for(verifier)(
        request.p.astype(request.dtype), request.q, request.ids, request.uniforms, **parameters
    )
    if kernel_length != reference_length:
        upto = min(kernel_length, reference_length) + 1
        assert decisions.knife_edge(request.delta, min(upto, k)), (
            f"accepted {kernel_length} (kernel) vs {reference_length} (reference) with no "
            "acceptance knife-edge"
        )
        return "decision"
    token, expected = int(kernel[kernel_length]), int(reference[reference_length])
    r = kernel_length
    if r == k:
        assert not request.bonus_given, "a given bonus token is emitted as given"
        _draw_explained(token, expected, request.p[k], request.uniforms[k + 1], 2 * request.delta)
        return "bonus draw"
    if not verifier.stochastic:
        # A deterministic verifier emits the argmax at its first rejection.
        assert (
            decisions.knife_edge(request.delta, r + 1)
            or _argmax_near_tie(request.p[r], 2 * request.delta)
            or _argmax_merged_by_rounding(request.raw_target[r], request.p[r], token, expected)
        ), (token, expected)
        return "argmax near-tie"
    weights = decisions.rho[r] * request.p[r] - request.q_rows()[r]
    tol = decisions.residual_rounding * request.delta
    _residual_explained(request, token, expected, weights, request.p[r], tol)
    return "residual draw"


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@st.composite
def logits_rows(draw: Any, rng: np.random.Generator, n: int, vocab: int, dtype: Any):
    """Rows built from a few repeated levels (ties at every boundary), sometimes with
    noise, sometimes with -inf entries; every row keeps a finite entry."""
    levels = np.asarray(
        draw(st.lists(st.floats(-6.0, 6.0, allow_nan=False), min_size=1, max_size=5, unique=True))
    )
    rows = rng.choice(levels, size=(n, vocab))
    if draw(st.booleans()):
        rows = rows + rng.standard_normal((n, vocab)) * draw(st.sampled_from([1e-3, 0.5, 2.0]))
    if draw(st.integers(0, 3)) == 0:
        rows[rng.random((n, vocab)) < 0.2] = -np.inf
        rows[np.arange(n), rng.integers(0, vocab, n)] = levels[0]
    return rows.astype(dtype)


@st.composite
def ragged_cases(draw: Any, method: str | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    vocab = draw(st.integers(2, 40))
    counts = np.asarray(draw(st.lists(st.integers(0, 3), min_size=1, max_size=5)), np.int64)
    batch, total = counts.size, int(counts.sum())
    target = draw(logits_rows(rng, total + batch, vocab, dtype))
    draft = draw(logits_rows(rng, total, vocab, dtype)) if draw(st.booleans()) else None

    def choose(options: list[float]) -> np.ndarray:
        return np.asarray([draw(st.sampled_from(options)) for _ in range(batch)], np.float64)

    case = {
        "method": method or draw(st.sampled_from(METHODS)),
        "num_draft_tokens": counts,
        "target_logits": target,
        "draft_logits": draft,
        "temperature": choose([0.0, 0.5, 1.0, 1.0, 1.7]),
        "top_k": choose([0, 0, 1, 2, 3, vocab - 1, vocab, vocab + 2]).astype(np.int64),
        "top_p": choose([1.0, 1.0, 0.95, 0.5, 0.2]),
        "min_p": choose([0.0, 0.0, 0.05, 0.3]),
        "filter_order": draw(st.sampled_from(sorted(FILTER_ORDER_CODES))),
    }
    case["top_k"] = np.maximum(case["top_k"], 0)
    uniforms = rng.random((batch, int(counts.max()) + 2))
    extremes = rng.random(uniforms.shape) < 0.05
    uniforms[extremes] = rng.choice([0.0, LARGEST_BELOW_ONE], size=int(extremes.sum()))
    case["uniforms"] = uniforms
    # Half the drafts from the processed target (so that chains get accepted), half anywhere.
    ids = rng.integers(0, vocab, total)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for b in range(batch):
        setting = [case[name][b : b + 1] for name in ("temperature", "top_k", "top_p", "min_p")]
        rows = target[offsets[b] + b : offsets[b + 1] + b]
        if rows.shape[0] == 0 or not draw(st.booleans()):
            continue
        if setting[0][0] == 0.0:
            ids[offsets[b] : offsets[b + 1]] = np.argmax(rows, axis=1)
            continue
        n = rows.shape[0]
        p = process_logits(rows, *(np.repeat(s, n) for s in setting), case["filter_order"])
        for i in range(n):
            ids[offsets[b] + i] = _monte_carlo.draw_from(p[i], 1, rng)[0]
    case["draft_token_ids"] = ids
    case["bonus_token_ids"] = rng.integers(0, vocab, batch) if draw(st.booleans()) else None
    return case


def _kernel(case: dict[str, Any], **overrides: Any) -> Any:
    arguments = {
        name: case[name]
        for name in (
            "num_draft_tokens",
            "draft_token_ids",
            "target_logits",
            "draft_logits",
            "method",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "filter_order",
            "bonus_token_ids",
            "uniforms",
        )
        if name in case
    }
    arguments.update(overrides)
    return specdec_np.verify_ragged(**arguments)


def _reference_of(case: dict[str, Any], xp: Any = np) -> tuple[np.ndarray, np.ndarray]:
    def convert(value: Any) -> Any:
        return None if value is None else xp.asarray(value)

    output, lengths = ragged_reference.verify_ragged(
        convert(case["num_draft_tokens"]),
        convert(case["draft_token_ids"]),
        convert(case["target_logits"]),
        convert(case["draft_logits"]),
        method=case["method"],
        from_logits=True,
        filter_order=case.get("filter_order", "vllm"),
        **{
            name: convert(case[name])
            for name in (
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "bonus_token_ids",
                "uniforms",
            )
        },
    )
    return np.asarray(output), np.asarray(lengths)


def check_case(case: dict[str, Any], result: Any, reference: tuple[Any, Any]) -> list[str]:
    output, lengths = reference
    kernel_output = np.asarray(result.output_token_ids)
    kernel_lengths = np.asarray(result.accepted_lengths)
    assert kernel_output.shape == output.shape
    reasons = []
    for b in range(case["num_draft_tokens"].size):
        request = Request(case, b)
        reasons.append(
            check_request(
                request,
                case["method"],
                kernel_output[b],
                int(kernel_lengths[b]),
                output[b],
                int(lengths[b]),
                {},
            )
        )
    return reasons


# --------------------------------------------------------------------------------------
# Equivalence
# --------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(ragged_cases())
def test_kernel_equals_reference_adapter(case: dict[str, Any]) -> None:
    check_case(case, _kernel(case), _reference_of(case))


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=60)
@given(data=st.data())
def test_kernel_equals_reference_adapter_per_method(method: str, data: Any) -> None:
    case = data.draw(ragged_cases(method))
    reasons = check_case(case, _kernel(case), _reference_of(case))
    # The allowances are knife-edges, not a loosening: almost every request is equal.
    assert reasons.count("equal") >= len(reasons) - 1, reasons


@settings(max_examples=25)
@given(ragged_cases())
def test_reference_adapter_on_array_api_strict(case: dict[str, Any]) -> None:
    xps = pytest.importorskip("array_api_strict")
    output, lengths = _reference_of(case)
    strict_output, strict_lengths = _reference_of(case, xps)
    np.testing.assert_array_equal(strict_output, output)
    np.testing.assert_array_equal(strict_lengths, lengths)


def _tie_case(method: str, dtype: Any) -> dict[str, Any]:
    """Ties exactly at the top-k and top-p boundaries, on logits 3, 3, 2, 2, 2, 0, -1:
    top-k 3 cuts inside the tie group of the 2s (all three are kept); top-p 0.6 is reached
    by the first 3 together with its tie (both kept, 0.63 of the mass), top-p 0.7 only with
    the 2s (all three kept)."""
    row = np.array([3.0, 3.0, 2.0, 2.0, 2.0, 0.0, -1.0], dtype=dtype)
    rows = np.tile(row, (3 * 3, 1))
    counts = np.array([2, 2, 2])
    ids = np.array([4, 2, 3, 0, 1, 4])
    return {
        "method": method,
        "num_draft_tokens": counts,
        "target_logits": rows,
        "draft_logits": None,
        "temperature": np.array([1.0, 1.0, 0.8]),
        "top_k": np.array([3, 0, 3]),
        "top_p": np.array([1.0, 0.6, 0.7]),
        "min_p": np.array([0.0, 0.0, 0.0]),
        "draft_token_ids": ids,
        "bonus_token_ids": None,
        "uniforms": np.full((3, 4), 0.5),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", LOSSLESS)
def test_ties_at_the_top_k_and_top_p_boundaries(method: str, dtype: Any) -> None:
    case = _tie_case(method, dtype)
    rows = case["target_logits"][:1]
    # top_k = 3 keeps every 2 (ties kept): 5 tokens, none of 0 and -1.
    p = process_logits(rows, np.ones(1), np.array([3]), np.ones(1), np.zeros(1))[0]
    assert np.count_nonzero(p) == 5
    # top_p = 0.6: one 3 carries 0.32 of the mass, so its tie joins: exactly the two 3s.
    p = process_logits(rows, np.ones(1), np.array([0]), np.array([0.6]), np.zeros(1))[0]
    assert np.count_nonzero(p) == 2
    # top_p = 0.7 (at temperature 0.8 as request 2): the 3s carry 0.69, so all the 2s join.
    p = process_logits(rows, np.full(1, 0.8), np.array([3]), np.array([0.7]), np.zeros(1))[0]
    assert np.count_nonzero(p) == 5
    for uniform in (0.0, 0.3, 0.5, 0.9, LARGEST_BELOW_ONE):
        case["uniforms"] = np.full((3, 4), uniform)
        reasons = check_case(case, _kernel(case), _reference_of(case))
        assert reasons == ["equal"] * 3, reasons
        # Every emitted token is kept by its request's law: never 5 or 6.
        assert not np.isin(np.asarray(_kernel(case).output_token_ids), [5, 6]).any()


def test_checker_catches_a_wrong_output() -> None:
    """The knife-edge bookkeeping cannot excuse a plain error: a flipped decision and a
    residual token far from any CDF boundary are both refused."""
    case = _tie_case("rejection", np.float64)
    case["uniforms"] = np.full((3, 4), 0.3)
    result = _kernel(case)
    output, lengths = _reference_of(case)
    request = Request(case, 0)
    kernel = np.asarray(result.output_token_ids)[0].copy()
    length = int(np.asarray(result.accepted_lengths)[0])
    assert (
        check_request(request, "rejection", kernel, length, output[0], int(lengths[0]), {})
        == "equal"
    )
    with pytest.raises(AssertionError):
        check_request(request, "rejection", kernel, length + 1, output[0], int(lengths[0]), {})
    wrong = kernel.copy()
    kept = np.flatnonzero(request.p[length] > 0)
    wrong[length] = [y for y in kept if y != kernel[length]][0]
    with pytest.raises(AssertionError):
        check_request(request, "rejection", wrong, length, output[0], int(lengths[0]), {})


# --------------------------------------------------------------------------------------
# Exact oracle and Monte Carlo on the real kernel
# --------------------------------------------------------------------------------------

TRANSFORMS = {
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=2),
    "top_p": dict(top_p=0.7),
    "min_p": dict(min_p=0.15),
    "top_k+top_p": dict(top_k=3, top_p=0.8),
    "temperature+min_p": dict(temperature=1.6, min_p=0.1),
    "all": dict(temperature=0.7, top_k=4, top_p=0.8, min_p=0.05),
}


def _setting(transforms: dict[str, float]) -> tuple[float, int, float, float]:
    return (
        transforms.get("temperature", 1.0),
        int(transforms.get("top_k", 0)),
        transforms.get("top_p", 1.0),
        transforms.get("min_p", 0.0),
    )


def _chain_logits(vocab: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Target rows [k + 1, V] whose largest logit is repeated (a tie at every top-k and
    top-p boundary it reaches) and draft rows [k, V]."""
    rng = np.random.default_rng(seed)
    target = rng.normal(0.0, 1.5, (k + 1, vocab))
    largest = np.argsort(target, axis=1)[:, -2:]
    target[np.arange(k + 1), largest[:, 0]] = target[np.arange(k + 1), largest[:, 1]]
    draft = rng.normal(0.0, 1.5, (k, vocab))
    return target, draft


def _process(rows: np.ndarray, setting: tuple[float, int, float, float]) -> np.ndarray:
    n = rows.shape[0]
    return process_logits(rows, *(np.full(n, value) for value in setting))


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("vocab", [3, 4, 5])
@pytest.mark.parametrize("method", LOSSLESS)
def test_exact_law_with_sampling_transforms(method: str, vocab: int, k: int, transform: str):
    setting = _setting(TRANSFORMS[transform])
    target, draft = _chain_logits(vocab, k, seed=vocab * 10 + k)
    p, q = _process(target, setting), _process(draft, setting)
    law = _oracles.oracle_for(registry.get(method))(p, q)
    expected = _oracles.target_chain_law(p)
    np.testing.assert_allclose(law.law, expected, rtol=0, atol=1e-9)
    # The processed law is what is being proven: a transform that keeps nothing out would
    # make this the plain softmax test.
    plain = _process(target, (1.0, 0, 1.0, 0.0))
    assert not np.allclose(p, plain, atol=1e-3)


MC_REQUESTS = 30_000
MC_ALPHA = 1e-3
MC_CONTROL_P = 1e-6


def _mc_setup(vocab: int, k: int):
    transforms = TRANSFORMS["all"] if vocab == 5 else TRANSFORMS["top_k+top_p"]
    setting = _setting(transforms)
    target, draft = _chain_logits(vocab, k, seed=vocab * 10 + k)
    return setting, target, draft


def _continued_tuples(output, lengths, p, rng) -> np.ndarray:
    """The first k + 1 tokens of every request, continued by the processed target rows
    after the emitted ones; int64 [N, k + 1]."""
    k = p.shape[0] - 1
    tuples = np.asarray(output).copy()
    for j in range(k + 1):
        later = np.asarray(lengths) < j
        tuples[later, j] = _monte_carlo.draw_from(p[j], int(later.sum()), rng)
    return tuples


def _chi_square(tuples: np.ndarray, p: np.ndarray) -> tuple[float, float, int]:
    vocab = p.shape[1]
    cells = np.ravel_multi_index(tuples.T, (vocab,) * tuples.shape[1])
    counts = np.bincount(cells, minlength=vocab ** tuples.shape[1])
    expected = _oracles.target_chain_law(p).reshape(-1)
    statistic, dof = _statistics.chi_square_statistic(counts, expected)
    return statistic, _statistics.chi_square_p_value(statistic, dof), dof


def _engine_batch(target, draft, setting, drafts, n):
    k = target.shape[0] - 1
    return dict(
        num_draft_tokens=np.full(n, k),
        draft_token_ids=drafts.reshape(-1),
        target_logits=np.tile(target, (n, 1)),
        draft_logits=np.tile(draft, (n, 1)),
        temperature=setting[0],
        top_k=setting[1],
        top_p=setting[2],
        min_p=setting[3],
    )


def _draw_drafts(q: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([_monte_carlo.draw_from(row, n, rng) for row in q], axis=1)


MC_CASES = [(5, 2), (4, 1)]


@pytest.mark.slow
@pytest.mark.parametrize(("vocab", "k"), MC_CASES)
@pytest.mark.parametrize("method", LOSSLESS)
def test_kernel_output_law_chi_square(method: str, vocab: int, k: int) -> None:
    setting, target, draft = _mc_setup(vocab, k)
    p, q = _process(target, setting), _process(draft, setting)
    rng = np.random.default_rng(20261201 + vocab)
    drafts = _draw_drafts(q, MC_REQUESTS, rng)
    result = specdec_np.verify_ragged(
        method=method,
        generator=np.random.default_rng(7),
        **_engine_batch(target, draft, setting, drafts, MC_REQUESTS),
    )
    tuples = _continued_tuples(result.output_token_ids, result.accepted_lengths, p, rng)
    statistic, p_value, dof = _chi_square(tuples, p)
    print(f"{method} V={vocab} k={k}: chi2={statistic:.1f} dof={dof} p={p_value:.3g}")
    assert p_value > MC_ALPHA, (statistic, dof, p_value)
    lengths = np.asarray(result.accepted_lengths, dtype=np.float64)
    expected = _oracles.oracle_for(registry.get(method))(p, q).expected_accepted_length
    sigma = lengths.std() / math.sqrt(lengths.size)
    print(f"  mean accepted {lengths.mean():.4f} vs oracle {expected:.4f} (sigma {sigma:.4f})")
    assert abs(lengths.mean() - expected) <= 5 * sigma


def _control_residual_without_top_p(target, draft, setting, drafts, uniforms):
    """A broken verifier built from the reference adapter: acceptance and bonus with the
    full processing, but the residual drawn as if top-p were off."""
    n, k = drafts.shape
    batch = _engine_batch(target, draft, setting, drafts, n)
    output, lengths = ragged_reference.verify_ragged(
        batch.pop("num_draft_tokens"),
        batch.pop("draft_token_ids"),
        batch.pop("target_logits"),
        batch.pop("draft_logits"),
        method="rejection",
        from_logits=True,
        uniforms=uniforms,
        **batch,
    )
    unfiltered = (setting[0], setting[1], 1.0, setting[3])
    p_wrong, q_wrong = _process(target, unfiltered), _process(draft, setting)
    for b in np.flatnonzero(lengths < k):
        r = int(lengths[b])
        weights = np.maximum(p_wrong[r] - q_wrong[r], 0.0)[None, :]
        token = int(_reference.residual_draw(weights, uniforms[b, k : k + 1])[0])
        output[b, r] = token if token >= 0 else output[b, r]
    return output, lengths


@pytest.mark.slow
@pytest.mark.parametrize(
    "control",
    ["residual without top-p", "draft processed otherwise", "bonus from the unprocessed row"],
)
def test_negative_controls_fail_the_chi_square(control: str) -> None:
    vocab, k = MC_CASES[0]
    setting, target, draft = _mc_setup(vocab, k)
    p, q = _process(target, setting), _process(draft, setting)
    rng = np.random.default_rng(99)
    n = MC_REQUESTS
    if control == "residual without top-p":
        # Meaningful only where top-p drops tokens that the other filters keep.
        assert np.any((_process(target, setting[:2] + (1.0, setting[3])) > 0) & (p == 0))
        drafts = _draw_drafts(q, n, rng)
        output, lengths = _control_residual_without_top_p(
            target, draft, setting, drafts, rng.random((n, k + 2))
        )
    elif control == "draft processed otherwise":
        # Drawn from q at temperature 1, verified with q at the request's temperature.
        q_drawn = _process(draft, (1.0,) + setting[1:])
        drafts = _draw_drafts(q_drawn, n, rng)
        result = specdec_np.verify_ragged(
            method="rejection", generator=rng, **_engine_batch(target, draft, setting, drafts, n)
        )
        output, lengths = result.output_token_ids, result.accepted_lengths
    else:
        drafts = _draw_drafts(q, n, rng)
        raw_bonus = np.exp(target[k] - target[k].max())
        bonus = _monte_carlo.draw_from(raw_bonus / raw_bonus.sum(), n, rng)
        result = specdec_np.verify_ragged(
            method="rejection",
            generator=rng,
            bonus_token_ids=bonus,
            **_engine_batch(target, draft, setting, drafts, n),
        )
        output, lengths = result.output_token_ids, result.accepted_lengths
    tuples = _continued_tuples(output, lengths, p, rng)
    statistic, p_value, dof = _chi_square(tuples, p)
    print(f"control {control!r}: chi2={statistic:.1f} dof={dof} p={p_value:.3g}")
    assert p_value < MC_CONTROL_P, (statistic, dof, p_value)


def _first_decision_boundary(method: str, request: Request, uniforms: np.ndarray):
    """The smallest uniform of position 0 at which the reference flips its decision there,
    found by bisection on the verifier's own reference (whatever its rule: ``u q = p`` for
    token-wise rejection, ``eta_1 = h_1`` for block verification), or None where that
    uniform decides nothing."""
    reference = _reference.reference_for(registry.get(method))
    draft = None if request.q is None else request.q[None]
    bonus = np.zeros((1, 1), np.int64)

    def accepted(u0: float) -> int:
        row = np.array(uniforms[: request.k + 1], dtype=np.float64)
        row[0] = u0
        _, lengths, _ = reference(request.p[None], bonus, draft, request.ids[None], row[None])
        return int(np.asarray(lengths)[0])

    low, high = 0.0, LARGEST_BELOW_ONE
    below = accepted(low)
    if accepted(high) == below:
        return None
    while (middle := (low + high) / 2) not in (low, high):
        low, high = (middle, high) if accepted(middle) == below else (low, middle)
    return high


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", LOSSLESS)
def test_knife_edges_are_explained_not_ignored(method: str, dtype: Any) -> None:
    """Uniforms placed exactly on the reference's decision and CDF boundaries: the kernel
    may fall on either side there, and the checker must accept either."""
    case = _tie_case(method, dtype)
    case["top_p"] = np.array([1.0, 1.0, 0.7])
    reasons, boundaries = [], 0
    for b in range(3):
        request = Request(case, b)
        uniforms = np.full((3, 4), 0.5)
        edge = _first_decision_boundary(method, request, uniforms[b])
        if edge is not None:
            uniforms[b, 0], boundaries = edge, boundaries + 1
        # v * Z on the boundary after token 2 of the row the residual or bonus reads.
        row = request.p[1]
        uniforms[b, 2] = math.fsum(row[:3].tolist())
        uniforms[b, 3] = math.fsum(request.p[2][:3].tolist())
        case["uniforms"] = uniforms
        reasons += check_case(case, _kernel(case), _reference_of(case))
    assert boundaries, "no request's first decision has a boundary to stand on"
    assert set(reasons) <= {"equal", "decision", "residual draw", "bonus draw"}, reasons


# --------------------------------------------------------------------------------------
# Ragged invariances
# --------------------------------------------------------------------------------------


def _subcase(case: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """The requests ``order`` of ``case`` as a batch of their own, each with its own rows,
    parameters and uniform row (cut to the new width)."""
    counts = case["num_draft_tokens"]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    target, draft, ids = [], [], []
    for b in order:
        target.append(case["target_logits"][offsets[b] + b : offsets[b + 1] + b + 1])
        ids.append(case["draft_token_ids"][offsets[b] : offsets[b + 1]])
        if case["draft_logits"] is not None:
            draft.append(case["draft_logits"][offsets[b] : offsets[b + 1]])
    sub = dict(case)
    sub["num_draft_tokens"] = counts[order]
    sub["target_logits"] = np.concatenate(target)
    sub["draft_logits"] = None if case["draft_logits"] is None else np.concatenate(draft)
    sub["draft_token_ids"] = np.concatenate(ids).astype(np.int64)
    for name in ("temperature", "top_k", "top_p", "min_p"):
        sub[name] = case[name][order]
    if case["bonus_token_ids"] is not None:
        sub["bonus_token_ids"] = case["bonus_token_ids"][order]
    width = int(sub["num_draft_tokens"].max()) + 2
    sub["uniforms"] = np.full((len(order), width), 0.5)
    for row, b in enumerate(order):
        sub["uniforms"][row, : counts[b] + 2] = case["uniforms"][b, : counts[b] + 2]
    return sub


def _rows(result: Any, order: list[int], counts: np.ndarray) -> list[list[int]]:
    output = np.asarray(result.output_token_ids)
    return [output[row, : counts[b] + 1].tolist() for row, b in enumerate(order)]


@settings(max_examples=60)
@given(ragged_cases(), st.randoms(use_true_random=False))
def test_request_output_is_batch_invariant(case: dict[str, Any], random: Any) -> None:
    counts = case["num_draft_tokens"]
    batch = list(range(counts.size))
    full = _rows(_kernel(case), batch, counts)
    for b in batch:
        alone = _rows(_kernel(_subcase(case, [b])), [b], counts)
        assert alone == [full[b]]
        if counts[b] == 0:
            # k_b = 0 emits the bonus token only.
            assert len(full[b]) == 1
    shuffled = batch + batch  # another order, and a batch with other requests in it
    random.shuffle(shuffled)
    assert _rows(_kernel(_subcase(case, shuffled)), shuffled, counts) == [
        full[b] for b in shuffled
    ]


@settings(max_examples=40)
@given(ragged_cases(), st.sampled_from(["counter_seeds", "seeded_seqs"]))
def test_seeded_requests_are_reproducible_and_invariant(case: dict[str, Any], source: str):
    counts = case["num_draft_tokens"]
    seeds = {b: (1000 + 17 * b, 5 * b) for b in range(counts.size)}

    def sources(order: list[int]) -> dict[str, Any]:
        if source == "counter_seeds":
            return {"counter_seeds": {row: seeds[b] for row, b in enumerate(order)}}
        return {
            "seeded_seqs": {row: np.random.default_rng(seeds[b][0]) for row, b in enumerate(order)}
        }

    batch = list(range(counts.size))
    full = _rows(_kernel(case, uniforms=None, **sources(batch)), batch, counts)
    again = _rows(_kernel(case, uniforms=None, **sources(batch)), batch, counts)
    assert again == full
    order = batch[::-1]
    sub = _subcase(case, order)
    assert _rows(_kernel(sub, uniforms=None, **sources(order)), order, counts) == [
        full[b] for b in order
    ]


# --------------------------------------------------------------------------------------
# Mixed batches: greedy requests are argmax decoding of their raw logits
# --------------------------------------------------------------------------------------


@settings(max_examples=100)
@given(ragged_cases())
def test_greedy_requests_are_argmax_decoding(case: dict[str, Any]) -> None:
    result = _kernel(case)
    counts = case["num_draft_tokens"]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    verifier = registry.get(case["method"])
    for b in range(counts.size):
        # Greedy decoding: every request an argmax entry decides by its rule, and the
        # temperature-0 requests of a sampling entry, which the engine hands to the greedy
        # entry; another argmax entry's rule is its own (its own tests).
        if verifier.greedy:
            deciding = verifier
        else:
            deciding = GREEDY_DECODING if case["temperature"][b] == 0.0 else None
        if deciding is not GREEDY_DECODING:
            continue
        rows = case["target_logits"][offsets[b] + b : offsets[b + 1] + b + 1]
        expected = []
        for i, x in enumerate(case["draft_token_ids"][offsets[b] : offsets[b + 1]]):
            best = int(np.argmax(rows[i]))
            expected.append(best)
            if best != x:
                break
        else:
            bonus = case["bonus_token_ids"]
            expected.append(int(np.argmax(rows[-1])) if bonus is None else int(bonus[b]))
        emitted = np.asarray(result.output_token_ids)[b]
        assert emitted[: len(expected)].tolist() == expected
        assert int(np.asarray(result.accepted_lengths)[b]) == len(expected) - 1


def test_greedy_requests_draw_nothing() -> None:
    """A greedy request consumes no uniform: its neighbours' outputs do not move when it
    is turned greedy, and its own output ignores its uniform row."""
    case = _tie_case("rejection", np.float32)
    case["temperature"] = np.array([1.0, 0.0, 0.8])
    first = np.asarray(_kernel(case).output_token_ids)
    case["uniforms"] = case["uniforms"].copy()
    case["uniforms"][1] = 0.999
    second = np.asarray(_kernel(case).output_token_ids)
    np.testing.assert_array_equal(first, second)


# --------------------------------------------------------------------------------------
# Bad input on logits
# --------------------------------------------------------------------------------------


def _one_request(rows: Any, k: int, **arguments: Any) -> Any:
    rows = np.asarray(rows, dtype=arguments.pop("dtype", np.float32))
    defaults = dict(
        num_draft_tokens=np.array([k]),
        draft_token_ids=np.ones(k, np.int64),
        target_logits=rows,
        uniforms=np.full((1, k + 2), 0.5),
    )
    defaults.update(arguments)
    return specdec_np.verify_ragged(**defaults)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["target_logits", "draft_logits"])
def test_nan_and_inf_logits_are_refused_in_strict_mode(value: float, where: str) -> None:
    target = np.zeros((2, 4), np.float32)
    draft = np.zeros((1, 4), np.float32)
    (target if where == "target_logits" else draft)[0, 2] = value
    with pytest.raises(ValueError, match=f"{where} must not be NaN or \\+inf in strict mode"):
        _one_request(target, 1, draft_logits=draft, strict_mode=True)
    # -inf masks a token and is allowed.
    target[0, 2] = draft[0, 2] = -np.inf
    _one_request(target, 1, draft_logits=draft, strict_mode=True)


@settings(max_examples=100)
@given(ragged_cases(), st.integers(0, 2**32 - 1))
def test_nan_logits_never_emit_their_token(case: dict[str, Any], seed: int) -> None:
    """Outside strict mode NaN counts as -inf: never kept, never the argmax, so no
    emitted token has a NaN logit in the row of its position; and the kernel still equals
    the reference adapter."""
    rng = np.random.default_rng(seed)
    target = case["target_logits"].copy()
    nan = rng.random(target.shape) < 0.3
    nan[np.arange(target.shape[0]), np.argmax(np.isfinite(target), axis=1)] = False
    target[nan] = np.nan
    case = dict(case, target_logits=target)
    result = _kernel(case)
    check_case(case, result, _reference_of(case))
    counts = case["num_draft_tokens"]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    output = np.asarray(result.output_token_ids)
    for b in range(counts.size):
        length = int(np.asarray(result.accepted_lengths)[b])
        given_bonus = length == counts[b] and case["bonus_token_ids"] is not None
        for j in range(length + (0 if given_bonus else 1)):
            assert not nan[offsets[b] + b + j, output[b, j]], (b, j, output[b])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_infinite_logits_make_the_row_uniform_over_them(dtype: Any) -> None:
    row = [0.0, np.inf, 1.0, np.inf, -np.inf]
    for v, expected in ((0.0, 1), (0.49, 1), (0.5, 3), (LARGEST_BELOW_ONE, 3)):
        for top_k, top_p in ((None, None), (1, 0.1)):
            result = _one_request(
                [row], 0, dtype=dtype, uniforms=np.array([[0.1, v]]), top_k=top_k, top_p=top_p
            )
            assert int(result.output_token_ids[0, 0]) == expected
    # A draft on a +inf entry has p = 1/2: accepted iff u * q < 1/2.
    for u, accepted in ((0.49, 1), (0.51, 0)):
        result = _one_request(
            [row, row],
            1,
            dtype=dtype,
            draft_token_ids=np.array([3]),
            uniforms=np.array([[u, 0.0, 0.0]]),
        )
        assert int(result.accepted_lengths[0]) == accepted
        # The residual of the point mass at 3 is the other +inf entry.
        assert int(result.output_token_ids[0, accepted]) in ((1,) if not accepted else (1, 3))
    # Greedy: the first +inf entry is the argmax.
    result = _one_request([row], 0, temperature=0.0)
    assert int(result.output_token_ids[0, 0]) == 1


@pytest.mark.parametrize("k", [0, 1])
def test_a_row_without_mass_that_must_be_drawn_from_raises(k: int) -> None:
    rows = [[0.0, 1.0, 2.0, 3.0]] * (k + 1) + [[-np.inf] * 4]
    counts = np.array([k, 0])
    ids = np.zeros(k, np.int64)
    generator = np.random.default_rng(3)
    state = generator.bit_generator.state
    with pytest.raises(ValueError, match="no positive probability"):
        specdec_np.verify_ragged(
            num_draft_tokens=counts,
            draft_token_ids=ids,
            target_logits=np.asarray(rows),
            generator=generator,
        )
    assert generator.bit_generator.state == state
    # Not drawn from: a given bonus, or a greedy request (argmax 0 of a row of -inf).
    result = specdec_np.verify_ragged(
        num_draft_tokens=counts,
        draft_token_ids=ids,
        target_logits=np.asarray(rows),
        bonus_token_ids=np.array([0, 2]),
        uniforms=np.full((2, k + 2), 0.0),
    )
    assert int(result.output_token_ids[1, 0]) == 2
    result = specdec_np.verify_ragged(
        num_draft_tokens=counts,
        draft_token_ids=ids,
        target_logits=np.asarray(rows),
        temperature=np.array([1.0, 0.0]),
        uniforms=np.full((2, k + 2), 0.0),
    )
    assert int(result.output_token_ids[1, 0]) == 0


def test_the_no_mass_error_names_target_logits() -> None:
    rows = np.array([[0.0, 1.0, 2.0, 3.0], [-np.inf] * 4])
    with pytest.raises(ValueError, match=r"^target_logits\b.*no positive probability"):
        specdec_np.verify_ragged(
            num_draft_tokens=np.array([0, 0]),
            draft_token_ids=np.zeros(0, np.int64),
            target_logits=rows,
            uniforms=np.zeros((2, 2)),
        )


def test_the_no_mass_error_locates_the_row() -> None:
    rows = np.array([[0.0, 1.0, 2.0, 3.0]] * 3 + [[-np.inf] * 4])
    with pytest.raises(ValueError, match=r"request 1|target_logits\[3\b"):
        specdec_np.verify_ragged(
            num_draft_tokens=np.array([2, 0]),
            draft_token_ids=np.zeros(2, np.int64),
            target_logits=rows,
            uniforms=np.zeros((2, 4)),
        )


@pytest.mark.parametrize(
    ("name", "values", "shown"),
    [
        ("temperature", [1.0, -0.5, 1.0], "-0.5"),
        ("temperature", [1.0, 1.0, np.inf], "inf"),
        ("top_k", [0, 2, -1], "-1.0"),
        ("top_k", [1.5, 0, 0], "1.5"),
        ("top_p", [1.0, 0.0, 1.0], "0.0"),
        ("top_p", [1.0, 1.0, 1.5], "1.5"),
        ("top_p", [np.nan, 1.0, 1.0], "nan"),
        ("min_p", [0.0, -0.1, 0.0], "-0.1"),
        ("min_p", [0.0, 0.0, 1.1], "1.1"),
    ],
)
def test_sampling_parameters_out_of_range(name: str, values: list[float], shown: str) -> None:
    bad = int(np.flatnonzero([shown in repr(float(v)) for v in values])[0])
    with pytest.raises(ValueError, match=rf"^{name} must .*found {shown} for request {bad}"):
        specdec_np.verify_ragged(
            num_draft_tokens=np.array([1, 0, 2]),
            draft_token_ids=np.array([0, 1, 2]),
            target_logits=np.zeros((6, 4), np.float32),
            uniforms=np.full((3, 4), 0.5),
            **{name: np.asarray(values)},
        )


@pytest.mark.parametrize("batch_size", [3, 40])  # checked on Python floats, by NumPy reductions
@pytest.mark.parametrize(
    "name, bad_value, good_value",
    [
        ("temperature", -0.5, 1.0),
        ("temperature", np.inf, 0.0),
        ("temperature", np.nan, 1.0),
        ("top_k", -1.0, 0.0),
        ("top_k", 1.5, 3.0),
        ("top_k", np.nan, 0.0),
        ("top_p", 0.0, 1.0),
        ("top_p", 1.5, 0.5),
        ("top_p", np.nan, 1.0),
        ("min_p", -0.1, 0.0),
        ("min_p", 1.1, 1.0),
        ("min_p", np.nan, 0.0),
    ],
)
def test_sampling_parameter_checks_at_every_batch_size(
    batch_size: int, name: str, bad_value: float, good_value: float
) -> None:
    """Small batches are range-checked on Python floats and large ones by NumPy reductions:
    both refuse the one bad request (NaN included) and name it, and both accept the edges."""
    arrays = {
        "num_draft_tokens": np.zeros(batch_size, dtype=np.int64),
        "draft_token_ids": np.zeros(0, dtype=np.int64),
        "target_logits": np.zeros((batch_size, 4), np.float32),
        "uniforms": np.full((batch_size, 2), 0.5),
    }
    values = np.full(batch_size, good_value)
    specdec_np.verify_ragged(**arrays, **{name: values})  # the edge values pass
    bad = batch_size - 2
    values[bad] = bad_value
    with pytest.raises(ValueError, match=rf"^{name} must .*for request {bad}$"):
        specdec_np.verify_ragged(**arrays, **{name: values})


@pytest.mark.parametrize("batch_size", [1, 40])
def test_negative_draft_counts_name_their_request(batch_size: int) -> None:
    counts = np.ones(batch_size, dtype=np.int64)
    counts[-1] = -3
    with pytest.raises(ValueError, match=rf"found -3 for request {batch_size - 1}$"):
        specdec_np.verify_ragged(
            num_draft_tokens=counts,
            draft_token_ids=np.zeros(0, dtype=np.int64),  # the counts are checked first
            target_logits=np.zeros((batch_size, 4), np.float32),
        )
