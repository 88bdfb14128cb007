"""pytest plugin of the conformance kit: the ``verifier_conformance`` fixture.

Installed with specdec_np (entry point ``pytest11``), so an engine's test-suite can write::

    def test_my_verifier_is_lossless(verifier_conformance):
        verifier_conformance(my_verifier, kind="rejection")

The plugin is a top-level module of its own, not a module of the package: pytest loads
every installed plugin into every session, and importing anything inside ``specdec_np``
runs the package's ``__init__`` (its compiled kernels and their OpenMP runtime).  Loading
it imports nothing but pytest; the kit is imported when the fixture is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["verifier_conformance"]


@pytest.fixture
def verifier_conformance() -> Callable[..., Any]:
    """A function ``check(verifier, kind="rejection", **options)`` that runs
    :func:`specdec_np.testing.check_verifier` and fails the test, with the report as the
    message, if any property fails; it returns the report otherwise.

    Returns
    -------
    callable
    """

    def check(verifier: Callable[..., Any], kind: str = "rejection", **options: Any) -> Any:
        from specdec_np.testing import check_verifier

        report = check_verifier(verifier, kind, **options)
        if not report.passed:
            pytest.fail(f"{report.verifier} fails {', '.join(report.failed())}\n\n{report}",
                        pytrace=False)
        return report

    return check
