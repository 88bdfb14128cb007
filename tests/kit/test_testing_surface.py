"""The conformance kit's sampling settings on the ragged layout (``docs/testing.md``,
"Sampling settings"): the library's ``verify_ragged`` passes every property for every
registry verifier and dtype; each negative control of ``broken_surface`` (penalties and
masks without the draft prefix, the bonus row without its bitmask, the bias after the
temperature, a run not cut at a stop token, logprobs from the raw law, greedy requests on
raw rows, the penalties wrong through a generator) fails the property that names it and
nothing else; a verifier without a setting's keyword has that property skipped, never
passed.

The controls declare that they take logits and explicit uniforms only (or a generator
only), so that each report runs in well under a second.
"""

from __future__ import annotations

from typing import Any

import broken_surface as bs
import numpy as np
import pytest

import specdec_np
from specdec_np import registry, testing
from specdec_np.testing import _ragged, _report, _surface

FAST = {"num_rows": 1000}
PREFIX = "sampling settings: "

#: The properties each control fails (each named without the prefix).
CONTROLS = {
    "settings_without_draft_prefix": (_surface.PENALTIES, _surface.MASKS, _surface.GREEDY),
    "bonus_without_bitmask": (_surface.GRAMMAR,),
    "bias_after_temperature": (_surface.BIAS,),
    "stops_not_cut": (_surface.STOPS,),
    "logprobs_from_raw_law": (_surface.LOGPROBS,),
    "greedy_on_raw_rows": (_surface.GREEDY,),
    "monte_carlo_without_draft_prefix": ("Monte Carlo (generator=)", _surface.GREEDY),
}


def _surface_rows(verifier: Any, kind: str, dtype: Any = np.float64) -> list[Any]:
    """The sampling-settings rows alone, without the rest of the ragged kit."""
    target = _ragged.RaggedTarget(verifier, kind, dtype, _report.TimeLimit(None))
    return _surface.run(target, kind, np.random.default_rng(0))


@pytest.mark.parametrize("kind", registry.names())
def test_verify_ragged_passes_every_sampling_setting(kind: str) -> None:
    rows = _surface_rows(specdec_np.verify_ragged, kind)
    assert [row.name for row in rows] == [
        PREFIX + name for name in (*_surface.ASPECTS, _surface.GREEDY, _surface.STOPS,
                                   _surface.LOGPROBS)]
    assert all(row.status == "PASS" for row in rows), "\n".join(
        f"{row.status} {row.name}: {row.detail}" for row in rows)


def test_float32_logits_pass() -> None:
    rows = _surface_rows(specdec_np.verify_ragged, "rejection", np.float32)
    assert all(row.status == "PASS" for row in rows), [row.detail for row in rows]


@pytest.mark.parametrize("name", list(CONTROLS))
def test_each_control_fails_the_property_that_names_it(name: str) -> None:
    report = testing.check_verifier(getattr(bs, name), layout="ragged", **FAST)
    failed = report.failed()
    for expected in CONTROLS[name]:
        assert PREFIX + expected in failed, str(report)
    # The wrapper is verify_ragged where the settings are off: nothing else fails.
    assert all(row.startswith(PREFIX) for row in failed), str(report)


@pytest.mark.parametrize("verifier", [bs.fast_correct, bs.monte_carlo_correct],
                         ids=["uniforms", "generator"])
def test_the_controls_without_their_bug_pass(verifier: Any) -> None:
    report = testing.check_verifier(verifier, layout="ragged", **FAST)
    assert report.passed, str(report)
    ran = [row.name for row in report.rows if row.name.startswith(PREFIX) and not row.skipped]
    if verifier is bs.monte_carlo_correct:
        # Without uniforms= the exact laws cannot run: they are skipped and said so, and
        # the Monte Carlo row checks the law.
        assert PREFIX + "Monte Carlo (generator=)" in ran
        assert {PREFIX + aspect for aspect in _surface.ASPECTS} <= set(report.skipped())
    else:
        assert len(ran) == len(_surface.ASPECTS) + 3


def test_a_deterministic_kind_is_checked_against_the_reference() -> None:
    assert testing.check_verifier(bs.fast_correct, "typical", layout="ragged",
                                  **FAST).passed
    failed = testing.check_verifier(bs.settings_without_draft_prefix, "typical",
                                    layout="ragged", **FAST).failed()
    assert PREFIX + _surface.PENALTIES in failed, failed


def test_a_setting_the_verifier_lacks_is_skipped_never_passed() -> None:
    @bs.functools.wraps(specdec_np.verify_ragged)
    def no_bitmask(**keywords: Any) -> Any:
        return specdec_np.verify_ragged(**keywords)

    no_bitmask.takes_token_bitmask = False  # type: ignore[attr-defined]
    rows = {row.name: row for row in _surface_rows(no_bitmask, "rejection")}
    grammar = rows[PREFIX + _surface.GRAMMAR]
    assert grammar.skipped and not grammar.passed and "token_bitmask" in grammar.detail
    assert all(row.status == "PASS" for name, row in rows.items() if name != grammar.name)

    def without_settings(*, num_draft_tokens: Any, draft_token_ids: Any,
                         target_logits: Any = None, draft_logits: Any = None,
                         temperature: Any = None, uniforms: Any = None) -> Any:
        return specdec_np.verify_ragged(
            num_draft_tokens=num_draft_tokens, draft_token_ids=draft_token_ids,
            target_logits=target_logits, draft_logits=draft_logits, temperature=temperature,
            uniforms=uniforms)

    rows = _surface_rows(without_settings, "rejection")
    assert rows and all(row.skipped and not row.passed for row in rows)
