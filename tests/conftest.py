"""Shared test configuration: the ``gpu`` marker, the NumPy/CuPy backend fixtures and the
shared helper modules.

The test files live in folders that mirror the package (``runtime/``, ``layouts/``,
``kernels/``, ``reference/``, ``verifiers/``, ``kit/``, ``errors/``, ``adapters/``,
``project/``); the helpers several folders share (``c_headers.py``, ``draw_checks.py``) stay
here.  This folder and each of its test folders are put on ``sys.path``, so that every
test file imports a helper, or another test file's helpers (``test_tree``'s cases in
``reference/test_traversal.py``), by its name whatever file is collected first and
whatever pytest's import mode: test file names are unique across the folders.

Tests marked ``gpu`` run only where CuPy is importable and ``cupy.is_available()``; they are
skipped otherwise, unless ``SPECDEC_REQUIRE_GPU=1``, which turns the skip into a failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from specdec_np._runtime.arrays import cuda_available

_TESTS = Path(__file__).resolve().parent
for _folder in [_TESTS, *sorted(p for p in _TESTS.iterdir() if any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "gpu" not in item.keywords or cuda_available():
        return
    reason = "needs CuPy and a usable CUDA device"
    if os.environ.get("SPECDEC_REQUIRE_GPU", "") == "1":
        pytest.fail(f"SPECDEC_REQUIRE_GPU=1 but this test {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> int:
    """Force the OpenMP row loop for every batch of two or more rows; returns the thread
    count the kernels will use (1 on a build without OpenMP)."""
    from specdec_np import _core
    from specdec_np._runtime import arrays as _backend

    monkeypatch.setattr(_backend, "PARALLEL_MIN_ELEMENTS", 0)
    return _core.openmp_max_threads()
