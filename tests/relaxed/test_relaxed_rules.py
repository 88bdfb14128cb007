"""Each relaxed rule on constructed cases where each of its conditions decides, its
parameters' errors, and the bias in the metrics."""

from __future__ import annotations

import numpy as np
import pytest

import specdec_np
from specdec_np import registry

#: Position 0, position 1 and the bonus row of one request on V = 4.
TARGET = np.array([[0.5, 0.3, 0.2, 0.0], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
DRAFT = np.array([[0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]])


def _run(method, drafts, uniforms=(0.0, 0.0, 0.0, 0.0), *, greedy=False, draft=True, **kw):
    result = specdec_np.verify_ragged(
        num_draft_tokens=np.array([2]), draft_token_ids=np.array(drafts),
        target_probs=TARGET, draft_probs=DRAFT if draft else None, method=method,
        uniforms=np.array([uniforms], dtype=np.float64),
        temperature=0.0 if greedy else None, **kw,
    )
    return result.output_token_ids[0].tolist()


def test_registry_lists_the_relaxed_methods_as_lossy() -> None:
    for name in registry.relaxed_names():
        entry = registry.chain_method(name)
        assert entry.lossless is False and entry.name == name
    assert not set(registry.relaxed_names()) & set(registry.names())


FLY = dict(window_size=1, entropy_threshold=0.5, entropy_top_k=3)


def test_fly_defers_a_failed_draft_only_when_every_condition_holds() -> None:
    # Draft 1 at position 0: p/q = 0.5, so u = 0.9 fails its own test; the top-3 entropy of
    # row 0 is 1.03 nats; draft 0 at position 1 passes with u = 0 (the window).
    failing = (0.9, 0.0, 0.0, 0.0)
    assert _run("fly", [1, 0], failing, **FLY)[:2] == [1, 0]
    # The window fails: position 1's u = 0.99 against p/q = 0.57.
    assert _run("fly", [1, 0], (0.9, 0.99, 0.0, 0.0), **FLY)[0] != 1
    # The entropy is under the threshold.
    assert _run("fly", [1, 0], failing, **{**FLY, "entropy_threshold": 1.1})[0] != 1
    # One token's entropy (0.35) is under it too.
    assert _run("fly", [1, 0], failing, **{**FLY, "entropy_top_k": 1})[0] != 1
    # The window reaches past the last draft.
    assert _run("fly", [1, 0], failing, **{**FLY, "window_size": 2})[0] != 1
    # A draft the target cannot emit (p = 0) is never deferred.
    assert _run("fly", [3, 0], failing, **FLY)[0] != 3


def test_fly_defers_a_greedy_mismatch_and_rejects_with_the_argmax() -> None:
    assert _run("fly", [1, 0], greedy=True, **FLY)[:2] == [1, 0]
    assert _run("fly", [1, 0], greedy=True, **{**FLY, "entropy_threshold": 5.0})[:2] == [0, -1]


def test_synthetic_keeps_a_position_by_its_conditional_rate_whatever_the_token() -> None:
    rates = dict(acceptance_rates=[0.5, 0.25])  # conditional: 0.5, then 0.5
    assert _run("synthetic", [3, 2], (0.49, 0.49, 0.0, 0.0), **rates) [:2] == [3, 2]
    assert _run("synthetic", [3, 2], (0.49, 0.51, 0.0, 0.0), **rates)[0] == 3
    assert _run("synthetic", [3, 2], (0.49, 0.51, 0.0, 0.0), **rates)[1] != 2
    # A greedy request reads its uniforms too, and emits its argmax on a rejection.
    assert _run("synthetic", [3, 2], (0.49, 0.49, 0.0, 0.0), greedy=True, **rates)[:2] == [3, 2]
    assert _run("synthetic", [3, 2], (0.51, 0.0, 0.0, 0.0), greedy=True, **rates)[:2] == [0, -1]


def test_synthetic_greedy_requests_consume_their_draws() -> None:
    seeds = {0: (7, 0)}
    common = dict(num_draft_tokens=np.array([2]), draft_token_ids=np.array([1, 0]),
                  target_probs=TARGET, temperature=0.0, counter_seeds=seeds)
    explicit = specdec_np.counter_uniforms(np.array([7]), np.array([0]), 4)
    for rates in ([0.9, 0.5], [0.2, 0.1]):
        drawn = specdec_np.verify_ragged(method="synthetic", acceptance_rates=rates, **common)
        given = specdec_np.verify_ragged(
            method="synthetic", acceptance_rates=rates, uniforms=explicit,
            **{k: v for k, v in common.items() if k != "counter_seeds"},
        )
        assert drawn.output_token_ids.tolist() == given.output_token_ids.tolist()


def test_relaxed_keeps_a_close_top_k_token() -> None:
    # Greedy: token 1 (0.3) is second; kept with top-2 and delta 0.25, not with delta 0.1.
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=2, delta=0.25)[:2] == [1, 0]
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=2, delta=0.1)[:2] == [0, -1]
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=1, delta=0.25)[:2] == [0, -1]
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=2, ratio=0.5,
                relaxed_rule="ratio")[:2] == [1, 0]
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=2, ratio=0.7,
                relaxed_rule="ratio")[:2] == [0, -1]
    assert _run("relaxed", [1, 0], greedy=True, relaxed_top_k=2, delta=0.25,
                relaxed_requests=np.array([False]))[:2] == [0, -1]
    # Sampled: u = 0.9 fails the own test of draft 1 (p/q = 0.5); the relaxation keeps it.
    assert _run("relaxed", [1, 0], (0.9, 0.0, 0.0, 0.0), relaxed_top_k=2, delta=0.25)[0] == 1
    assert _run("relaxed", [1, 0], (0.9, 0.0, 0.0, 0.0), relaxed_top_k=2, delta=0.1)[0] != 1


def test_relaxed_follows_the_thinking_phase_through_context_and_drafts() -> None:
    phase = dict(relaxed_top_k=2, delta=0.25, begin_token_id=3, end_token_id=2)
    assert _run("relaxed", [1, 0], greedy=True, **phase)[:2] == [0, -1]
    assert _run("relaxed", [1, 0], greedy=True, prompt_token_ids=[[3]], **phase)[:2] == [1, 0]
    assert _run("relaxed", [1, 0], greedy=True, prompt_token_ids=[[3]],
                output_token_ids=[[2]], **phase)[:2] == [0, -1]
    # Row 1's second token (1, 0.3 against 0.4) is relaxed once the draft 3 opened the phase.
    rows = TARGET.copy()
    rows[0] = [0.1, 0.1, 0.1, 0.7]
    result = specdec_np.verify_ragged(
        num_draft_tokens=np.array([2]), draft_token_ids=np.array([3, 1]), target_probs=rows,
        method="relaxed", temperature=0.0, **phase,
    )
    assert result.output_token_ids[0].tolist()[:2] == [3, 1]


def test_threshold_accepts_by_single_or_accumulated_probability() -> None:
    # Draft 0 (p = 0.5): kept by threshold_single 0.5 whatever u.
    assert _run("threshold", [0, 0], (0.99, 0.0, 0.0, 0.0), threshold_single=0.5)[0] == 0
    # Draft 1 (p = 0.3) with threshold_acc 0.5: u <= 0.6 passes, 0.61 does not.
    assert _run("threshold", [1, 0], (0.6, 0.0, 0.0, 0.0), threshold_acc=0.5)[0] == 1
    rejected = _run("threshold", [1, 0], (0.61, 0.0, 0.0, 0.0), threshold_acc=0.5)
    assert rejected[0] != 1 and rejected[1] == -1


def test_threshold_rejection_draws_from_the_target_without_the_draft() -> None:
    # Row 0 without token 1: 0.5, 0, 0.2, 0 out of 0.7; residual uniforms across [0, 1).
    found = []
    for v in (np.arange(70) + 0.5) / 70:
        found.append(_run("threshold", [1, 0], (0.99, 0.0, v, 0.0))[0])
    counts = np.bincount(found, minlength=4)
    assert counts.tolist() == [50, 0, 20, 0]


@pytest.mark.parametrize(
    ("method", "parameters", "error", "named"),
    [
        ("fly", dict(entropy_threshold=1.0), TypeError, "window_size"),
        ("fly", dict(window_size=0, entropy_threshold=1.0), ValueError, "window_size"),
        ("fly", dict(window_size=1.5, entropy_threshold=1.0), TypeError, "window_size"),
        ("fly", dict(window_size=1, entropy_threshold=-1.0), ValueError, "entropy_threshold"),
        ("fly", dict(window_size=1, entropy_threshold=1.0, bogus=1), TypeError, "bogus"),
        ("synthetic", dict(acceptance_rates=[0.5, 0.6]), ValueError, "acceptance_rates"),
        ("synthetic", dict(acceptance_rates=[0.5]), ValueError, "acceptance_rates"),
        ("synthetic", dict(acceptance_rates=[1.5, 0.5]), ValueError, "acceptance_rates"),
        ("synthetic", dict(acceptance_rates="ab"), TypeError, "acceptance_rates"),
        ("relaxed", dict(relaxed_rule="both"), ValueError, "relaxed_rule"),
        ("relaxed", dict(ratio=2.0), ValueError, "ratio"),
        ("relaxed", dict(relaxed_requests=[True, False]), ValueError, "relaxed_requests"),
        ("relaxed", dict(begin_token_id=4), ValueError, "begin_token_id"),
        ("threshold", dict(threshold_acc=float("nan")), ValueError, "threshold_acc"),
        ("rejection", dict(report_bias=1), TypeError, "report_bias"),
    ],
)
def test_bad_parameters_are_refused_by_name(method, parameters, error, named) -> None:
    with pytest.raises(error, match=named):
        _run(method, [1, 0], **parameters)


def test_metrics_accumulate_the_bias_and_merge() -> None:
    verifier = specdec_np.EngineVerifier("fly", seed=0, window_size=1, entropy_threshold=0.0)
    lossless = specdec_np.EngineVerifier("block", seed=0)
    for engine in (verifier, lossless):
        for _ in range(3):
            engine(num_draft_tokens=np.array([2]), draft_token_ids=np.array([1, 0]),
                   target_probs=TARGET, draft_probs=DRAFT, report_bias=True)
    assert verifier.metrics.mean_total_variation > 0
    assert lossless.metrics.mean_total_variation == 0
    merged = verifier.metrics + lossless.metrics
    assert merged.measured_positions == (
        verifier.metrics.measured_positions + lossless.metrics.measured_positions
    )
    assert merged.total_variation_sum == verifier.metrics.total_variation_sum
    assert np.isnan(specdec_np.VerificationMetrics().mean_total_variation)


@pytest.mark.parametrize("method", registry.relaxed_names())
def test_requests_without_drafts_get_their_bonus_token(method) -> None:
    parameters = {"fly": FLY, "synthetic": dict(acceptance_rates=[0.5])}.get(method, {})
    batch = dict(
        num_draft_tokens=np.array([0, 0]), draft_token_ids=np.zeros(0, dtype=np.int64),
        target_probs=TARGET[:2], uniforms=np.array([[0.0, 0.7], [0.0, 0.1]]),
        report_bias=True,
    )
    result = specdec_np.verify_ragged(method=method, **batch, **parameters)
    exact = specdec_np.verify_ragged(method="rejection", **batch)
    assert result.output_token_ids.tolist() == exact.output_token_ids.tolist() == [[1], [0]]
    assert result.total_variation.tolist() == [[0.0], [0.0]]


@pytest.mark.parametrize("method", registry.relaxed_names())
def test_the_padded_layout_runs_a_relaxed_method_as_the_ragged_one(method) -> None:
    from specdec_np.verify import run_padded

    parameters = {"fly": FLY, "synthetic": dict(acceptance_rates=[0.6, 0.3])}.get(method, {})
    uniforms = np.array([[0.55, 0.2, 0.4], [0.95, 0.9, 0.7]])
    target = np.stack([TARGET, TARGET[::-1]])
    drafts = np.array([[1, 0], [2, 3]])
    padded = run_padded(
        registry.chain_method(method), target, np.array([[3], [1]]), np.stack([DRAFT, DRAFT]),
        drafts, parameters=parameters, uniforms=uniforms,
    )
    ragged = specdec_np.verify_ragged(
        num_draft_tokens=np.array([2, 2]), draft_token_ids=drafts.ravel(),
        target_probs=target.reshape(-1, 4), draft_probs=np.concatenate([DRAFT, DRAFT]),
        bonus_token_ids=np.array([3, 1]), method=method,
        uniforms=np.concatenate([uniforms, np.zeros((2, 1))], axis=1), **parameters,
    )
    assert padded.output_token_ids.tolist() == ragged.output_token_ids.tolist()
    assert padded.num_draft_tokens == 4
    # A request that accepts both drafts takes its given bonus token.
    full = ragged.accepted_lengths == 2
    assert (ragged.output_token_ids[full, 2] == np.array([3, 1])[full]).all()


def test_the_common_engine_call_keeps_relaxed_methods_and_the_bias() -> None:
    # A NumPy generator and logits: the call an engine makes every step (the fast path's);
    # a relaxed method and report_bias must still be what they are with explicit uniforms.
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(7, 12)).astype(np.float32)
    batch = dict(num_draft_tokens=np.array([3, 2]), draft_token_ids=np.array([1, 4, 2, 0, 5]),
                 target_logits=logits, temperature=np.array([0.8, 1.0]))
    uniforms = np.random.default_rng(9).random((2, 5))
    for method, parameters in (("fly", FLY), ("block", {})):
        drawn = specdec_np.verify_ragged(method=method, generator=np.random.default_rng(9),
                                         report_bias=True, **batch, **parameters)
        given = specdec_np.verify_ragged(method=method, uniforms=uniforms, report_bias=True,
                                         **batch, **parameters)
        assert drawn.output_token_ids.tolist() == given.output_token_ids.tolist()
        assert np.array_equal(drawn.total_variation, given.total_variation, equal_nan=True)
    relaxed = specdec_np.verify_ragged(method="fly", generator=np.random.default_rng(9),
                                       **batch, **FLY)
    assert relaxed.output_token_ids.tolist() == specdec_np.verify_ragged(
        method="fly", uniforms=uniforms, **batch, **FLY).output_token_ids.tolist()
