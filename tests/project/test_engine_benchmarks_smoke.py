"""The engine benchmark must not rot: a tiny grid, its columns, its bytes model, and a clean
skip of the torch baseline where torch is missing (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "benchmarks" / "studies" / "engine.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
# Written out here, not taken from the harness: a column the harness drops must fail the test.
COLUMNS = (
    "regime", "B", "k", "V", "filters", "greedy", "T", "acc", "time_us", "torch_us",
    "x_torch", "padded_us", "x_padded", "ref_us", "x_ref", "argmax_us", "x_argmax",
    "MB_read", "roofline", "ns_el",
)  # fmt: skip
TINY = ["--quick", "--batch", "1", "3", "--k", "2", "--vocab", "300", "--regimes", "realistic"]


def load_harness():
    sys.path.insert(0, str(HARNESS.parent))
    try:
        spec = importlib.util.spec_from_file_location("engine_benchmark", HARNESS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HARNESS.parent))
    return module


def run_harness(tmp_path: Path, *extra: str, hide_torch: bool = False) -> tuple[str, list[dict]]:
    json_path = tmp_path / "engine.jsonl"
    argv = [str(HARNESS), *TINY, "--json", str(json_path), *extra]
    # None in sys.modules makes `import torch` raise ImportError, as on a machine without it.
    code = (
        "import runpy, sys; "
        + ("sys.modules['torch'] = None; " if hide_torch else "")
        + f"sys.argv = {argv!r}; runpy.run_path({str(HARNESS)!r}, run_name='__main__')"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    records = [json.loads(line) for line in json_path.read_text().splitlines()]
    return completed.stdout + completed.stderr, records


def check_cells(records: list[dict]) -> list[dict]:
    kinds = [record["kind"] for record in records]
    assert kinds[0] == "meta" and kinds.count("meta") == 1
    cells = [record for record in records if record["kind"] == "cell"]
    # B 1 and 3, greedy shares 0 / 0.5 / 1, filters on and off (one all-greedy cell each).
    assert {(cell["B"], cell["greedy"]) for cell in cells} == {
        (1, 0.0), (1, 1.0), (3, 0.0), (3, 0.5), (3, 1.0),
    }  # fmt: skip
    for cell in cells:
        missing = set(COLUMNS).difference(cell)
        assert not missing, missing
        assert cell["time_us"] > 0 and cell["padded_us"] > 0
        assert cell["roofline"] > 0 and cell["MB_read"] > 0
        assert (cell["argmax_us"] is None) == (cell["greedy"] == 0.0)
        # No ragged adapter in the reference yet: the column is present and empty.
        assert cell["ref_us"] is None
    meta = records[0]
    assert meta["uptime"] and meta["bandwidth_gb_per_s"] > 0 and "bytes_model" in meta
    return cells


@pytest.mark.skipif(not HAS_TORCH, reason="torch is a benchmark-only dependency")
def test_tiny_grid_with_torch(tmp_path: Path) -> None:
    output, records = run_harness(tmp_path)
    cells = check_cells(records)
    assert all(cell["torch_us"] > 0 and cell["x_torch"] > 0 for cell in cells)
    for column in COLUMNS:
        assert column in output


def test_tiny_grid_skips_torch_cleanly_when_missing(tmp_path: Path) -> None:
    output, records = run_harness(tmp_path, hide_torch=True)
    cells = check_cells(records)
    assert all(cell["torch_us"] is None and cell["x_torch"] is None for cell in cells)
    assert "torch baseline skipped" in records[0]["torch"]
    assert "torch baseline skipped" in output


def test_bytes_model_counts_rows_up_to_the_first_rejection() -> None:
    engine = load_harness()
    counts = np.array([0, 2, 3, 3])
    accepted = np.array([0, 2, 1, 3])
    greedy = np.array([False, False, False, True])
    # Target: 1 (bonus only) + 3 (all accepted: 2 drafts + bonus) + 2 (rejected at 1) + 4.
    # Draft: 0 (no drafts) + 2 + 2 + 0 (greedy reads no draft row).
    assert engine.must_read_rows(counts, accepted, greedy) == (10, 4)
    assert engine.must_read_bytes(counts, accepted, greedy, 100) == 14 * 100 * 4


@pytest.mark.parametrize("regime", ["flat", "realistic"])
def test_baselines_agree_with_the_engine_on_greedy_batches(regime: str) -> None:
    engine = load_harness()
    inputs = engine.Inputs(regime, 6, 3, 200, seed=1, flat_draft_scale=3.0)
    ids = inputs.draft_ids("off", 1.0)
    sampling = engine.sampling_arrays(inputs, "off", 1.0)
    expected = engine.engine_call(inputs, ids, sampling, 0)().output_token_ids
    np.testing.assert_array_equal(engine.padded_call(inputs, ids, sampling, 0)(), expected)
    if HAS_TORCH:
        sys.path.insert(0, str(HARNESS.parent))
        try:
            import torch_baselines
        finally:
            sys.path.remove(str(HARNESS.parent))
        torch_output = engine.torch_call(torch_baselines, inputs, ids, sampling, 0)()
        np.testing.assert_array_equal(torch_output.numpy(), expected)
