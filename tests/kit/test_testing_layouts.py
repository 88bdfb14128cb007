"""The conformance kit on every layout: the library's own verifiers pass on each layout,
for every registry verifier and tree method; the negative controls of ``broken_verifiers``
(a filter ignored, a greedy tree walk, a wrong generator path, a hang, the sampling
parameters mishandled per request, a seeded request's draws depending on its batch) fail
the property that names their bug; a ``**kwargs`` verifier is tested in full; skipped
properties are flagged as skipped, and a report in which none ran is no pass; each call
has a time limit.

The fast tests run the kit with ``num_rows=2000`` (the exact-law and rule checks keep their
sizes); the full-size runs over the registry are marked slow.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import broken_verifiers as bv
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import cli, registry, testing

TESTS = Path(__file__).resolve().parent
FAST = {"num_rows": 2000}


def _front(layout: str) -> Any:
    """The function the registry names as the layout's front (``module:attribute``)."""
    module, _, attribute = registry.get_layout(layout).front.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _takes_a_method(layout: str) -> bool:
    """Whether the layout's front is one function for every method (``method=``), rather
    than one stateless function per verifier (vLLM's padded chain)."""
    return "method" in inspect.signature(_front(layout)).parameters


def _first_fast(names: tuple[str, ...], fast: int = 1) -> list[Any]:
    """``names`` as parameters, all but the first ``fast`` marked slow: the fast subset
    keeps one case of each check, the full run all of them."""
    return [name if i < fast else pytest.param(name, marks=pytest.mark.slow)
            for i, name in enumerate(names)]


# -- the library's own verifiers pass on every layout ---------------------------------------


@pytest.mark.parametrize("kind", _first_fast(registry.names()))
def test_verify_ragged_passes_fast(kind: str) -> None:
    report = testing.check_verifier(specdec_np.verify_ragged, kind, layout="ragged", **FAST)
    assert report.passed, str(report)
    assert not report.skipped(), str(report)
    assert report.layout == "ragged"


@pytest.mark.parametrize("kind", _first_fast(registry.tree_method_names(), fast=2))
def test_verify_tree_passes_fast(kind: str) -> None:
    report = testing.check_verifier(specdec_np.verify_tree, kind, layout="tree", **FAST)
    assert report.passed, str(report)
    skipped = report.skipped()
    if registry.get_tree_method(kind).sequence_level:
        # A sequence-level walk has no per-node thresholds to integrate over: its exact
        # laws are skipped (and flagged), its Monte Carlo checks run.
        assert skipped and all(name.startswith("exact law") for name in skipped), str(report)
    else:
        assert not skipped, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("layout", testing.LAYOUTS)
def test_every_registry_verifier_passes_on_every_layout(layout: str) -> None:
    """Full size, iterating over the registry: a verifier or tree method added to it is
    checked here with no edit."""
    for kind in testing.kinds_for(layout):
        if _takes_a_method(layout):
            verifier = _front(layout)
        else:
            function_name = registry.get(kind).function_name
            if function_name is None:  # reached through method= only: the ragged run has it
                continue
            verifier = getattr(specdec_np, function_name)
        report = testing.check_verifier(verifier, kind, layout=layout)
        assert report.passed, str(report)


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "kind"), [("ragged", "block"), ("tree", "specinfer")])
def test_float32_rows_pass(layout: str, kind: str) -> None:
    """Probability rows are multiples of 1/1024 and logits are processed in the rows'
    dtype, so the exact laws hold in float32 too."""
    verifier = _front(layout)
    report = testing.check_verifier(verifier, kind, layout=layout, probs_dtype=np.float32,
                                    **FAST)
    assert report.passed, str(report)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, derandomize=True)
@given(k=st.integers(1, 4), vocab_size=st.integers(3, 12), seed=st.integers(0, 2**32 - 1))
def test_layout_sizes_and_seeds(k: int, vocab_size: int, seed: int) -> None:
    options = {"k": k, "vocab_size": vocab_size, "seed": seed, **FAST}
    for kind in registry.names():
        report = testing.check_verifier(specdec_np.verify_ragged, kind, layout="ragged",
                                        **options)
        assert report.passed, str(report)
    for kind in registry.tree_method_names():
        report = testing.check_verifier(specdec_np.verify_tree, kind, layout="tree", **options)
        assert report.passed, str(report)
    assert not testing.check_verifier(bv.ragged_ignores_top_k, layout="ragged",
                                      **options).passed


def test_kinds_come_from_the_registry() -> None:
    assert testing.kinds_for("padded") == testing.KINDS == registry.names()
    assert testing.kinds_for("ragged") == registry.names()
    assert testing.kinds_for("tree") == registry.tree_method_names()
    assert "typical" in testing.KINDS


def test_typical_is_checked_against_its_rule() -> None:
    assert testing.check_verifier(specdec_np.typical_acceptance_sample, "typical").passed

    @functools.wraps(specdec_np.typical_acceptance_sample)
    def strict_threshold(*args: Any, **keywords: Any) -> Any:
        return specdec_np.typical_acceptance_sample(*args, posterior_threshold=0.3)

    failed = testing.check_verifier(strict_threshold, "typical").failed()
    assert failed == ["typical rule of the reference"]

    @functools.wraps(specdec_np.verify_ragged)
    def ragged_strict(**keywords: Any) -> Any:
        return specdec_np.verify_ragged(**keywords, posterior_threshold=0.3)

    failed = testing.check_verifier(ragged_strict, "typical", layout="ragged", **FAST).failed()
    assert {"probabilities: typical rule of the reference",
            "typical from logits equals the reference"} <= set(failed)


@pytest.mark.slow
def test_a_new_tree_method_is_picked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A method added to registry.TREE_METHODS (as "traversal" will be) is a kind of the
    tree layout and is checked by its own registry entry, with no edit to the kit."""
    copy = dataclasses.replace(registry.get_tree_method("rrs"), name="rrs_again")
    monkeypatch.setattr(registry, "TREE_METHODS", (*registry.TREE_METHODS, copy))
    monkeypatch.setitem(registry._TREE_BY_NAME, "rrs_again", copy)
    assert "rrs_again" in testing.kinds_for("tree")

    @functools.wraps(specdec_np.verify_tree)
    def as_rrs(**keywords: Any) -> Any:
        return specdec_np.verify_tree(**{**keywords, "method": "rrs"})

    report = testing.check_verifier(as_rrs, "rrs_again", layout="tree", **FAST)
    assert report.passed, str(report)
    assert any("rrs_again oracle" in row.name for row in report.rows)


# -- negative controls per layout ------------------------------------------------------------


#: The exact-law property a ragged verifier that ignores a sampling parameter fails.
IGNORED_PROPERTIES = {"top_k": "top-k", "temperature": "temperature below 1",
                      "top_p": "top-p", "min_p": "min-p"}


@pytest.mark.parametrize("name", _first_fast(tuple(IGNORED_PROPERTIES)))
def test_a_ragged_verifier_that_ignores_a_filter_fails(name: str) -> None:
    failed = testing.check_verifier(bv.RAGGED_IGNORED[name], layout="ragged", **FAST).failed()
    assert f"exact law from logits: {IGNORED_PROPERTIES[name]}" in failed, failed


#: The property each wrong handling of the sampling parameters or of a seeded request's
#: generator fails, by ``broken_verifiers.LAW_BUGS`` name: the name says what is wrong.
LAW_BUG_PROPERTIES = {
    "min_p_ignored_with_top_p": "exact law from logits: filters together",
    "temperature_clamped": "exact law from logits: temperature above 1",
    "draftless_temperature_ignored": "exact law from logits: requests without drafts",
    "draft_logits_at_temperature_one":
        "exact law from target probabilities: draft logits at each request's temperature",
    "seeded_draws_of_the_widest": "seeded_seqs draws per row independent of the batch",
}


@pytest.mark.parametrize("bug", list(LAW_BUG_PROPERTIES))
def test_a_ragged_law_bug_fails_the_property_that_names_it(bug: str) -> None:
    """Each passed an earlier kit: its batches had one setting for every request, no
    temperature above 1 alone, no sampled request without drafts checked, no draft logits
    at a temperature with target probabilities, and no look at the seeded generators."""
    report = testing.check_verifier(bv.RAGGED_LAW_BUGS[bug], layout="ragged", **FAST)
    assert LAW_BUG_PROPERTIES[bug] in report.failed(), str(report)


@pytest.mark.parametrize(("bug", "kind"), [
    ("min_p_ignored_with_top_p", "point_mass"),
    ("seeded_draws_of_the_widest", "point_mass"),
    pytest.param("temperature_clamped", "point_mass", marks=pytest.mark.slow),
    pytest.param("draftless_temperature_ignored", "rrs", marks=pytest.mark.slow),
    pytest.param("draft_logits_at_temperature_one", "specinfer", marks=pytest.mark.slow),
])
def test_a_tree_law_bug_fails_the_property_that_names_it(bug: str, kind: str) -> None:
    report = testing.check_verifier(bv.TREE_LAW_BUGS[bug], kind, layout="tree", **FAST)
    assert LAW_BUG_PROPERTIES[bug] in report.failed(), str(report)


def test_a_padded_verifier_with_batch_dependent_seeded_draws_fails() -> None:
    failed = testing.check_verifier(bv.padded_seeded_draws_of_the_widest, **FAST).failed()
    assert failed == [LAW_BUG_PROPERTIES["seeded_draws_of_the_widest"]], failed


def test_every_exact_law_setting_moves_the_law() -> None:
    """Each case's rows are drawn so that turning any one of its settings off changes the
    processed law (what makes a verifier that ignores it fail); the draw never runs out."""
    from specdec_np.testing import _ragged as _kit_ragged

    cases = _kit_ragged.SETTING_CASES + _kit_ragged.DRAFT_TEMPERATURE_CASES
    aspects = {case.aspect for case in cases}
    assert {"temperature below 1", "temperature above 1", "top-k", "top-p", "min-p",
            "filters together", "requests without drafts"} < aspects
    assert any(case.settings.get("temperature", 1.0) > 1 for case in cases)
    assert any(case.drafts == 0 and case.settings.get("temperature", 1.0) != 1
               for case in cases)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        for case in cases:
            for dtype in (np.float32, np.float64):
                rows = _kit_ragged.load_bearing_logits(rng, case.drafts + 1, 5,
                                                       case.settings, dtype)
                law = _kit_ragged.process(rows, case.settings, dtype)
                for name in case.settings:
                    off = _kit_ragged.process(
                        rows, {**case.settings, name: _kit_ragged.OFF[name]}, dtype)
                    assert np.max(np.abs(off - law)) > 1e-3, (case, name)


@pytest.mark.parametrize("kind", _first_fast(registry.tree_method_names(stochastic=True)))
def test_a_tree_verifier_that_walks_greedily_fails(kind: str) -> None:
    failed = testing.check_verifier(bv.tree_walks_greedily, kind, layout="tree", **FAST).failed()
    assert f"emission law equals the {kind} oracle (explicit uniforms)" in failed, failed
    assert "continued output has the target's law (explicit uniforms)" in failed, failed


@pytest.mark.parametrize("pair", _first_fast((("specinfer", "rrs"), ("rrs", "specinfer"))),
                         ids=lambda pair: "-".join(pair))
def test_the_exact_tree_law_tells_the_methods_apart(pair: tuple[str, str]) -> None:
    """RRS's walk on independently drafted children is not SpecInfer's law (nor the
    target's), and the reverse: the integration over drafts and uniforms sees both, where
    the Monte Carlo test may not."""
    asked, walked = pair

    @functools.wraps(specdec_np.verify_tree)
    def other_method(**keywords: Any) -> Any:
        return specdec_np.verify_tree(**{**keywords, "method": walked})

    failed = testing.check_verifier(other_method, asked, layout="tree", **FAST).failed()
    assert {f"exact law equals the {asked} oracle",
            "exact law: continued output has the target's law"} <= set(failed), failed


@pytest.mark.parametrize(("verifier", "layout", "kind", "expected"), [
    (bv.padded_wrong_generator, "padded", "rejection", "Monte Carlo chi-square (generator=)"),
    (bv.ragged_wrong_generator, "ragged", "rejection",
     "probabilities: Monte Carlo chi-square (generator=)"),
    (bv.tree_wrong_generator, "tree", "specinfer",
     "emission law equals the specinfer oracle (generator=)"),
], ids=["padded", "ragged", "tree"])
def test_a_wrong_generator_path_fails(verifier: Any, layout: str, kind: str,
                                      expected: str) -> None:
    """Right with explicit uniforms, wrong with generator=: the distribution checks must run
    on every source of uniforms the verifier takes, not on explicit uniforms only."""
    report = testing.check_verifier(verifier, kind, layout=layout, **FAST)
    assert expected in report.failed(), str(report)
    explicit = [row for row in report.rows if "explicit uniforms" in row.name
                or row.name.endswith("Monte Carlo chi-square")]
    assert explicit and all(row.passed for row in explicit), str(report)


@pytest.mark.parametrize(("verifier", "layout", "kind"), [
    (bv.padded_hangs, "padded", "rejection"),
    (bv.ragged_hangs, "ragged", "block"),
    (bv.tree_hangs, "tree", "point_mass"),
], ids=["padded", "ragged", "tree"])
def test_a_verifier_that_hangs_fails_with_a_clear_message(verifier: Any, layout: str,
                                                          kind: str) -> None:
    report = testing.check_verifier(verifier, kind, layout=layout, timeout=0.5, **FAST)
    assert not report.passed
    timed_out = [row for row in report.rows if row.figure == "timed out"]
    assert len(timed_out) == 1 and not timed_out[0].passed, str(report)
    assert "did not return within the time limit of 0.5 s" in timed_out[0].detail
    after = report.rows[report.rows.index(timed_out[0]) + 1:]
    ran = [row for row in after if not row.skipped]
    # The verifier is not called again: what follows is skipped, or checks no output.
    assert all(row.passed for row in ran), str(report)
    assert any("not run" in row.detail for row in after if row.skipped), str(report)


def test_the_library_passes_with_a_time_limit_and_without() -> None:
    for timeout in (None, 30, 30.0):
        assert testing.check_verifier(specdec_np.rejection_sample, timeout=timeout,
                                      **FAST).passed


# -- the verifiers people write: **kwargs ---------------------------------------------------


def _keywords_only(function: Any) -> Any:
    """The usual adapter: every keyword passed on, no signature of its own."""

    def verify(**keywords: Any) -> Any:
        return function(**keywords)

    return verify


@pytest.mark.parametrize(("layout", "kind"), [("ragged", "rejection"), ("tree", "point_mass")])
def test_a_keywords_only_verifier_is_tested_in_full(layout: str, kind: str) -> None:
    function = _front(layout)
    report = testing.check_verifier(_keywords_only(function), kind, layout=layout, **FAST)
    assert report.passed, str(report)
    assert report.ran() == len(report.rows) - len(report.skipped())
    flagged = [name for name in report.skipped() if "takes no" in report.rows[
        [row.name for row in report.rows].index(name)].detail]
    assert not flagged, str(report)
    assert any(row.name.startswith("exact law from logits") and row.passed
               for row in report.rows), str(report)


def test_a_keywords_only_verifier_with_a_bug_fails() -> None:
    verifier = _keywords_only(bv.RAGGED_IGNORED["top_k"])
    failed = testing.check_verifier(verifier, layout="ragged", **FAST).failed()
    assert "exact law from logits: top-k" in failed, failed


def test_a_report_in_which_nothing_ran_is_not_a_pass() -> None:
    def takes_no_rows(*, num_draft_tokens: Any, draft_token_ids: Any) -> Any:
        raise AssertionError("never called: the kit has no rows to give it")

    report = testing.check_verifier(takes_no_rows, layout="ragged", **FAST)
    assert report.rows and report.skipped() == [row.name for row in report.rows]
    assert report.ran() == 0 and not report.passed and not report.failed()
    summary = str(report).splitlines()[-1]
    assert "none ran" in summary and "NOT PASSED" in summary, summary
    assert "all passed" not in str(report)
    with pytest.raises(testing.ConformanceError, match="none ran"):
        report.raise_if_failed()
    assert "all passed" not in str(testing.ConformanceReport("rejection", "empty"))


# -- skipped properties ----------------------------------------------------------------------


def test_skipped_properties_are_flagged_not_passed() -> None:
    report = testing.check_verifier(bv.correct_own_randomness)
    skipped = [row for row in report.rows if row.skipped]
    assert {row.name for row in skipped} >= {"exact law equals the target",
                                             "residual uses its own uniform",
                                             "batch invariance", "seed reproducibility"}
    assert all(not row.passed and row.status == "SKIP" for row in skipped)
    assert report.passed and report.skipped() == [row.name for row in skipped]
    assert not set(report.failed()) & set(report.skipped())
    text = str(report)
    assert all(f"{row.name}" in text for row in skipped)
    lines = {line.split("  ")[0]: line for line in text.splitlines()[3:-1]}
    assert all("  SKIP  " in lines[row.name] for row in skipped)
    assert f"{len(skipped)} skipped" in text.splitlines()[-1]


def test_a_ragged_verifier_without_logits_skips_those_properties() -> None:
    def probabilities_only(*, num_draft_tokens: Any, draft_token_ids: Any, target_probs: Any,
                           draft_probs: Any = None, method: str = "rejection",
                           bonus_token_ids: Any = None, uniforms: Any = None,
                           temperature: Any = None) -> Any:
        return specdec_np.verify_ragged(
            num_draft_tokens=num_draft_tokens, draft_token_ids=draft_token_ids,
            target_probs=target_probs, draft_probs=draft_probs, method=method,
            bonus_token_ids=bonus_token_ids, uniforms=uniforms, temperature=temperature)

    report = testing.check_verifier(probabilities_only, layout="ragged", **FAST)
    assert report.passed, str(report)
    skipped = report.skipped()
    assert "exact law from logits: top-k" in skipped
    assert "ragged batch invariance" in skipped
    assert "probabilities: exact law equals the target" not in skipped


# -- adapters and arguments ------------------------------------------------------------------


def test_the_pytest_fixture_takes_a_layout(verifier_conformance: Any) -> None:
    assert verifier_conformance(specdec_np.verify_tree, "greedy", layout="tree").passed

    @functools.wraps(specdec_np.verify_tree)
    def samples_when_asked_greedy(**keywords: Any) -> Any:
        return specdec_np.verify_tree(**{**keywords, "method": "point_mass"})

    with pytest.raises(pytest.fail.Exception, match="greedy walk of the reference"):
        verifier_conformance(samples_when_asked_greedy, "greedy", layout="tree")


def test_the_dlpack_adapter_carries_every_layout_keyword() -> None:
    adapter = testing.DLPackAdapter(specdec_np.verify_ragged, from_numpy=np.asarray)
    assert testing.check_verifier(adapter, "greedy", layout="ragged", **FAST).passed
    adapter = testing.DLPackAdapter(specdec_np.verify_tree, from_numpy=np.asarray)
    report = testing.check_verifier(adapter, "point_mass", layout="tree", **FAST)
    assert report.passed, str(report)


def test_bad_layout_arguments() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        testing.kinds_for("dense")
    with pytest.raises(ValueError, match="on layout 'tree'"):
        testing.check_verifier(specdec_np.verify_tree, "rejection", layout="tree")
    with pytest.raises(ValueError, match="on layout 'ragged'"):
        testing.check_verifier(specdec_np.verify_ragged, "specinfer", layout="ragged")


# -- command line ----------------------------------------------------------------------------


def test_cli_layouts(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    assert cli.main(["check", "--verifier", "specdec_np:verify_tree", "--layout", "tree",
                     "--kind", "greedy"]) == 0
    assert "layout 'tree'" in capsys.readouterr().out
    assert cli.main(["check", "--verifier", "broken_verifiers:tree_hangs", "--layout", "tree",
                     "--kind", "rrs", "--timeout", "0.5", "--json"]) == 1
    out = capsys.readouterr().out
    assert '"layout": "tree"' in out and "timed out" in out and '"status": "SKIP"' in out


@pytest.mark.parametrize("arguments", [
    ["--layout", "ragged"],
    ["--timeout", "5"],
    ["--verifier", "specdec_np:verify_tree", "--layout", "tree", "--kind", "rejection"],
    ["--verifier", "specdec_np:verify_ragged", "--layout", "ragged", "--kind", "rrs"],
    ["--verifier", "specdec_np:verify_ragged", "--layout", "grid"],
    ["--verifier", "specdec_np:verify_ragged", "--timeout", "-1"],
    ["--verifier", "specdec_np:verify_ragged", "--timeout", "soon"],
    ["--verifier", "specdec_np:verify_ragged", "--timeout", "inf"],
    ["--verifier", "specdec_np:verify_ragged", "--timeout", "1e10"],
    ["--verifier", "specdec_np:verify_ragged", "--timeout", "nan"],
])
def test_cli_misuse_is_a_usage_error(arguments: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "specdec_np", "check", *arguments],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run
    assert "error:" in run.stderr and "Traceback" not in run.stderr


def test_cli_non_callable_verifier_is_a_usage_error() -> None:
    run = subprocess.run([sys.executable, "-m", "specdec_np", "check", "--verifier",
                          "specdec_np:__version__"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "is not callable" in run.stderr, run
    assert "Traceback" not in run.stderr
