"""The asv regression suite (``benchmarks/suite``) must not rot: every benchmark's setup and
one call of each timed method, at the smallest ``B`` and ``V`` of its grid, run here
directly, without an asv process.  Importing the suite needs no asv; only the check that
asv itself accepts the suite does, and it skips without asv.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from specdec_np import registry

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SUITE = BENCHMARKS / "suite"
CONFIG = BENCHMARKS / "asv.conf.json"


def suite_modules() -> list[ModuleType]:
    """The suite's benchmark modules, imported as asv imports them (``benchmarks/`` on the
    path, the suite a package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return [
            importlib.import_module(f"suite.{path.stem}")
            for path in sorted(SUITE.glob("bench_*.py"))
        ]
    finally:
        sys.path.remove(str(BENCHMARKS))


def benchmark_classes() -> Iterator[type]:
    """Every class of the suite with a timed method, as asv discovers them."""
    for module in suite_modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__ and any(
                name.startswith("time_") for name in dir(value)
            ):
                yield value


def smallest_cells(benchmark: type) -> list[tuple]:
    """Every parameter set of ``benchmark`` at the smallest ``B`` and ``V`` of its grid."""
    choices = [
        (min(values),) if name in ("B", "V") else values
        for name, values in zip(benchmark.param_names, benchmark.params)
    ]
    return list(itertools.product(*choices))


def test_suite_has_the_expected_benchmarks() -> None:
    names = {benchmark.__name__ for benchmark in benchmark_classes()}
    assert names == {"TimePadded", "TimeRagged", "TimeTree", "TimeProcessed", "TimeFixedCost"}


def test_the_grid_is_b_and_v_and_iterates_over_the_registry() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        common = importlib.import_module("suite.common")
    finally:
        sys.path.remove(str(BENCHMARKS))
    seen_layouts: set[str] = set()
    for benchmark in benchmark_classes():
        parameters = dict(zip(benchmark.param_names, benchmark.params))
        if benchmark.__name__ == "TimeFixedCost":
            # One fixed cell (B = 1, V = 16): a call's fixed cost, not its rows.
            assert "B" not in parameters and "V" not in parameters
            continue
        assert parameters["B"] == common.BATCHES and parameters["V"] == common.VOCABS
        if "verifier" in parameters:
            assert parameters["verifier"] == registry.names()
        if "method" in parameters:
            assert parameters["method"] == registry.tree_method_names()
        layout = benchmark.__name__.removeprefix("Time").lower()
        seen_layouts.add(layout)
        assert parameters.get("form", common.LAYOUTS[layout]) == common.LAYOUTS[layout]
    assert seen_layouts == set(common.LAYOUTS)


@pytest.mark.parametrize(
    "benchmark", list(benchmark_classes()), ids=lambda benchmark: benchmark.__name__
)
def test_every_benchmark_runs_once_at_the_smallest_cells(benchmark: type) -> None:
    ran = 0
    for cell in smallest_cells(benchmark):
        instance = benchmark()
        try:
            instance.setup(*cell)
        except NotImplementedError:
            continue
        for name in sorted(dir(instance)):
            if name.startswith("time_"):
                try:
                    getattr(instance, name)(*cell)
                except NotImplementedError:
                    continue
                ran += 1
    assert ran > 0


def test_the_suite_uses_the_public_api_only() -> None:
    private = re.compile(r"\bspecdec_np\.\_|from specdec_np\.\_|from specdec_np import \_")
    for path in SUITE.glob("*.py"):
        text = path.read_text()
        assert not private.search(text), f"{path.name} reaches a private module"
        assert "import asv" not in text, f"{path.name} imports asv"


def test_configuration_points_at_the_suite() -> None:
    # asv reads JSON with // comments; so does this.
    text = "\n".join(
        line for line in CONFIG.read_text().splitlines() if not line.lstrip().startswith("//")
    )
    config = json.loads(text)
    assert (BENCHMARKS / config["benchmark_dir"]).resolve() == SUITE
    assert (BENCHMARKS / config["repo"]).resolve() == ROOT
    # asv's environments and results stay out of benchmarks/: not among the studies'
    # results, and not in the sdist, which ships benchmarks/'s files.
    for key in ("env_dir", "results_dir", "html_dir"):
        assert not (BENCHMARKS / config[key]).resolve().is_relative_to(BENCHMARKS), key


@pytest.mark.skipif(
    importlib.util.find_spec("asv") is None or shutil.which("asv") is None,
    reason="asv is not installed (pip install asv, or the bench extra)",
)
def test_asv_discovers_the_suite() -> None:
    # asv check imports the suite in its own process and validates every benchmark's
    # parameters and attributes.  ASV_PYTHONPATH: the package of this checkout, whatever
    # the environment has installed.
    environment = dict(os.environ, ASV_PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        ["asv", "check", "--python=same"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    assert "No problems found" in output, output[-3000:]
