"""The kit's drafting check (``specdec_np.testing.check_drafting``) and its controls.

A correct drafter, on ``specdec_np.sample_tokens`` with noise of its own, must pass with the
package's verifier of every lossless stochastic kind; the drafter that draws with the
verifier's acceptance uniforms, and the one that samples the processed draft law but reports
the raw softmax, must fail the law of the output and the property that names their bug
(``tests/kit/broken_drafters.py``).
"""

from __future__ import annotations

import doctest
from typing import Any

import broken_drafters as bd
import numpy as np
import pytest

import specdec_np
from specdec_np import registry, testing
from specdec_np.testing import _drafting

LAW = "emitted law equals the target (drafter and verifier)"
ROWS = "drafts follow the reported draft rows"
NOISE = "draft noise independent of the verifier's uniforms"
REPRODUCIBLE = "drafts reproducible and batch-invariant (counter_seeds)"
SIZE = 4000


@pytest.mark.parametrize("kind", registry.names(stochastic=True, lossless=True))
def test_a_correct_drafter_passes(kind: str) -> None:
    report = testing.check_drafting(bd.correct, kind=kind, num_requests=SIZE)
    assert report.passed, str(report)
    assert not report.skipped()
    assert "correct drafting for verify_ragged" in str(report)


@pytest.mark.parametrize(("drafter", "named"), [
    (bd.shared_noise, NOISE),
    (bd.raw_softmax_reported, ROWS),
])
def test_each_broken_drafter_fails(drafter: Any, named: str) -> None:
    report = testing.check_drafting(drafter, num_requests=SIZE)
    assert set(report.failed()) == {LAW, named}, str(report)


def test_the_bugs_move_the_law_for_other_sizes_and_seeds() -> None:
    for vocab_size, k, seed in ((4, 1, 3), (8, 3, 5)):
        for drafter in (bd.shared_noise, bd.raw_softmax_reported):
            report = testing.check_drafting(drafter, vocab_size=vocab_size, k=k, seed=seed,
                                            num_requests=2000)
            assert LAW in report.failed(), str(report)
        assert testing.check_drafting(bd.correct, vocab_size=vocab_size, k=k, seed=seed,
                                      num_requests=2000).passed


def test_the_same_seed_gives_the_same_report() -> None:
    first = testing.check_drafting(bd.correct, num_requests=2000, seed=3)
    again = testing.check_drafting(bd.correct, num_requests=2000, seed=3)
    assert [row.figure for row in first.rows] == [row.figure for row in again.rows]


# -- the other properties' own controls -----------------------------------------------------


def unseeded(*, num_draft_tokens: Any, draft_logits: Any, counter_seeds: dict) -> Any:
    """Lossless, but its noise ignores the seeds: not reproducible."""
    rows = np.asarray(specdec_np.processed_probs(draft_logits))
    noise = np.random.default_rng().random(rows.shape[0])
    return specdec_np.sample_tokens(probs=rows, uniforms=noise), rows


def without_seeds(*, num_draft_tokens: Any, draft_logits: Any) -> Any:
    """Lossless at temperature 1 without filters, its noise from a generator of its own."""
    rows = np.asarray(specdec_np.processed_probs(draft_logits))
    noise = np.random.default_rng(11).random(rows.shape[0])
    return specdec_np.sample_tokens(probs=rows, uniforms=noise), rows


def point_masses(**keywords: Any) -> Any:
    """The correct drafter's tokens, reported as point masses (``draft_probs`` None)."""
    return bd.correct(**keywords)[0], None


def unnormalised(**keywords: Any) -> Any:
    ids, rows = bd.correct(**keywords)
    return ids, rows * 2


def test_the_other_properties_fail_their_controls() -> None:
    report = testing.check_drafting(unseeded, num_requests=2000)
    assert report.failed() == [REPRODUCIBLE], str(report)
    # A drafter that takes no seeds draws its own noise: nothing to compare with the
    # verifier's uniforms or to reproduce.
    report = testing.check_drafting(without_seeds, num_requests=2000)
    assert report.passed and report.skipped() == [NOISE, REPRODUCIBLE], str(report)
    report = testing.check_drafting(point_masses, num_requests=2000)
    assert report.passed and report.skipped() == [ROWS], str(report)
    report = testing.check_drafting(unnormalised, num_requests=2000)
    assert report.failed() == ["drafter output format"], str(report)
    assert set(report.skipped()) == {ROWS, NOISE, REPRODUCIBLE, LAW}


def test_a_verifier_without_seeds_or_logits() -> None:
    def own_randomness(*, num_draft_tokens: Any, draft_token_ids: Any, target_logits: Any,
                       draft_probs: Any, temperature: Any, top_k: Any, top_p: Any,
                       min_p: Any) -> Any:
        return specdec_np.verify_ragged(
            num_draft_tokens=num_draft_tokens, draft_token_ids=draft_token_ids,
            target_logits=target_logits, draft_probs=draft_probs, temperature=temperature,
            top_k=top_k, top_p=top_p, min_p=min_p, generator=np.random.default_rng(5))

    report = testing.check_drafting(bd.correct, own_randomness, num_requests=2000)
    assert report.passed, str(report)
    assert "the verifier's own randomness" in str(report)

    def probabilities_only(*, num_draft_tokens: Any, draft_token_ids: Any, target_probs: Any,
                           draft_probs: Any, counter_seeds: Any) -> Any:
        raise AssertionError("never called")

    report = testing.check_drafting(bd.correct, probabilities_only, num_requests=2000)
    assert report.skipped() == [LAW] and "target_logits" in str(report)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="drafter must be callable"):
        testing.check_drafting(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verifier must be callable"):
        testing.check_drafting(bd.correct, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind must be one of"):
        testing.check_drafting(bd.correct, kind="greedy")
    with pytest.raises(ValueError, match="num_draft_tokens and draft_logits"):
        testing.check_drafting(lambda *, draft_logits: None)
    for name, value in (("vocab_size", 3), ("k", 0), ("num_requests", 100), ("k", True)):
        with pytest.raises(ValueError, match=name):
            testing.check_drafting(bd.correct, **{name: value})
    with pytest.raises(ValueError, match="timeout"):
        testing.check_drafting(bd.correct, timeout=-1)


def test_a_drafter_that_raises_or_returns_nonsense_fails() -> None:
    def raises(**keywords: Any) -> Any:
        raise RuntimeError("boom")

    report = testing.check_drafting(raises, num_requests=2000)
    assert report.failed() == ["drafter output format"] and "boom" in str(report)
    report = testing.check_drafting(lambda **keywords: "ab", num_requests=2000)
    assert report.failed() == ["drafter output format"]


def test_the_homogeneity_test() -> None:
    rng = np.random.default_rng(0)
    independent = np.stack([rng.multinomial(1000, [0.5, 0.3, 0.2]) for _ in range(4)])
    assert _drafting.homogeneity_p_value(independent) > 1e-3
    dependent = np.array([[1000, 0, 0], [0, 1000, 0], [500, 500, 0], [0, 0, 1000]])
    assert _drafting.homogeneity_p_value(dependent) == 0.0
    assert _drafting.homogeneity_p_value(np.array([[5, 5], [0, 0]])) == 1.0


def test_the_docstring_example_runs() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(testing.check_drafting, "check_drafting"):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
