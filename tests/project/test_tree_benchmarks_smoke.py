"""The tree benchmark must not rot: a tiny grid, its columns, its bytes model, the torch
baseline's agreement with ``verify_tree`` and a clean skip where torch is missing (no timing
assertions)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_np import registry
from specdec_np._layouts import tree as _trees

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "benchmarks" / "studies" / "tree.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
# Written out here, not taken from the harness: a column the harness drops must fail the test.
COLUMNS = (
    "method", "form", "regime", "B", "nodes", "depth", "V", "time_us", "best_us", "torch_us",
    "x_torch", "ref_us", "x_ref", "len", "mean_len", "rows", "MB_read", "roofline",
)  # fmt: skip
TINY = ["--quick", "--batch", "1", "3", "--nodes", "5", "--vocab", "300"]


def load_harness():
    sys.path.insert(0, str(HARNESS.parent))
    try:
        spec = importlib.util.spec_from_file_location("tree_benchmark", HARNESS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HARNESS.parent))
    return module


def run_harness(tmp_path: Path, *extra: str, hide_torch: bool = False) -> tuple[str, list[dict]]:
    json_path = tmp_path / "tree.jsonl"
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
    names = {method.name for method in registry.TREE_METHODS}
    assert {(cell["method"], cell["form"], cell["regime"], cell["B"]) for cell in cells} == {
        (name, form, regime, batch)
        for name in names
        for form in ("logits", "probs")
        for regime in ("flat", "realistic")
        for batch in (1, 3)
    }
    for cell in cells:
        missing = set(COLUMNS).difference(cell)
        assert not missing, missing
        assert cell["time_us"] > 0 and cell["roofline"] > 0 and cell["MB_read"] > 0
        assert 0 <= cell["mean_len"] <= cell["depth"]
        # The tiny cells are small enough for the reference, which must agree bit for bit.
        assert cell["ref_equal"] is True
    meta = records[0]
    assert meta["uptime"] and meta["bandwidth_gb_per_s"] > 0 and "bytes_model" in meta
    return cells


@pytest.mark.skipif(not HAS_TORCH, reason="torch is a benchmark-only dependency")
def test_tiny_grid_with_torch(tmp_path: Path) -> None:
    output, records = run_harness(tmp_path)
    cells = check_cells(records)
    assert all(cell["torch_us"] > 0 and cell["x_torch"] > 0 for cell in cells)
    # The baseline walks point_mass's and greedy's tokens and must agree with them.
    checked = [cell for cell in cells if cell["torch_equal"] is not None]
    assert {cell["method"] for cell in checked} == {
        method.name for method in registry.TREE_METHODS if not method.reads_draft_probs
    }
    assert all(cell["torch_equal"] for cell in checked)
    for column in COLUMNS:
        assert column in output


def test_tiny_grid_skips_torch_cleanly_when_missing(tmp_path: Path) -> None:
    output, records = run_harness(tmp_path, "--regimes", "realistic", hide_torch=True)
    cells = [record for record in records if record["kind"] == "cell"]
    assert cells and all(cell["torch_us"] is None and cell["x_torch"] is None for cell in cells)
    assert "torch baseline skipped" in records[0]["torch"]
    assert "torch baseline skipped" in output


def test_inputs_follow_the_shape_and_each_method_drafting() -> None:
    bench = load_harness()
    chain = list(range(-1, 5))
    inputs = bench.TreeInputs("realistic", 2, 6, 50, seed=0, flat_draft_scale=3.0, shape=chain)
    assert inputs.shape == chain and inputs.depth == 6
    default = bench.TreeInputs("flat", 2, 6, 50, seed=0, flat_draft_scale=3.0)
    assert default.shape == bench.best_first_tree(6)
    for method in registry.TREE_METHODS:
        tokens = default.tokens_for(method)
        assert tokens.shape == (12,) and tokens.min() >= 0 and tokens.max() < 50
    # Fixed candidates are the top-ranked tokens of the siblings' shared draft row.
    fixed = default.tokens["fixed"]
    root_children = [j for j, parent in enumerate(default.shape) if parent < 0]
    order = np.argsort(-default.draft[root_children[0]], kind="stable")
    np.testing.assert_array_equal(fixed[root_children], order[: len(root_children)])
    with pytest.raises(ValueError, match="shape"):
        bench.TreeInputs("flat", 1, 3, 50, seed=0, flat_draft_scale=3.0, shape=[-1])


def test_bytes_model_counts_the_walked_path() -> None:
    bench = load_harness()
    # Request 0: root -> {0, 3}; 0 -> {1, 2}.  Request 1: root -> {0}.
    layout = _trees.validate_tree([4, 1], [-1, 0, 0, -1, -1], [1, 2, 3, 4, 5])
    # Request 0 accepts node 0, then rejects both of its children; request 1 accepts node 0.
    nodes = np.array([[0, -1], [0, -1]])
    lengths = np.array([1, 1])
    # Target rows: (root + node 0) + (root + node 0).  Tests: 1 at the root (node 0 first)
    # + 2 under node 0; 1 at request 1's root + 0 at its leaf.
    assert bench.walked_rows(layout, nodes, lengths, reads_draft=False) == (4, 0, 4)
    assert bench.walked_rows(layout, nodes, lengths, reads_draft=True) == (4, 4, 4)
    # Node 3 accepted after node 0 was rejected: two tests at the root, node 3 is a leaf.
    assert bench.walked_rows(layout, np.array([[3, -1], [-1, -1]]), np.array([1, 0]), True) == (
        3, 3, 3,
    )  # fmt: skip
    assert bench.walked_bytes(layout, nodes, lengths, False, 100) == 4 * 100 * 4 + 4 * 16 + 2 * 8


@pytest.mark.skipif(not HAS_TORCH, reason="torch is a benchmark-only dependency")
@pytest.mark.parametrize("form", ["logits", "probs"])
@pytest.mark.parametrize("regime", ["flat", "realistic"])
def test_torch_baseline_equals_verify_tree(regime: str, form: str) -> None:
    bench = load_harness()
    inputs = bench.TreeInputs(regime, 5, 12, 200, seed=3, flat_draft_scale=1.0)
    if form == "probs":
        inputs.to_probs()
    args = bench.parse_args(["--quick"])
    torch_tree, _ = bench.harness.load_torch_baseline("torch_tree", args.threads, skip=False)
    baseline = bench.time_baseline(torch_tree, inputs, args)
    assert baseline["greedy_equal"] and baseline["sampled_equal"]


GAIN = ROOT / "benchmarks" / "studies" / "tree_gain.py"


def test_gain_script_quick_rows(tmp_path: Path) -> None:
    json_path = tmp_path / "gain.jsonl"
    completed = subprocess.run(
        [sys.executable, str(GAIN), "--quick", "--json", str(json_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    rows = [json.loads(line) for line in json_path.read_text().splitlines()]
    sampled = [method.name for method in registry.TREE_METHODS if method.stochastic]
    for kind in ("exact", "monte_carlo"):
        assert [row["method"] for row in rows if row["kind"] == kind] == sampled
    exact = {row["method"]: row for row in rows if row["kind"] == "exact"}
    # On a chain every node is an only child: SpecInfer and RRS are the same walk.
    independent = [m.name for m in registry.TREE_METHODS if m.drafting == "independent"]
    without = [m.name for m in registry.TREE_METHODS if m.drafting == "without_replacement"]
    assert exact[independent[0]]["chain"] == pytest.approx(exact[without[0]]["chain"])
    for row in (row for row in rows if row["kind"] != "versus"):
        assert 0 <= row["chain"] <= row["nodes"] and 0 <= row["tree"] <= row["nodes"]
        if row["chain"]:
            assert row["gain"] == pytest.approx(row["tree"] / row["chain"])
    # Each sequence-level method against each token-level method with draft rows.
    versus = [row for row in rows if row["kind"] == "versus"]
    expected = [
        (m.name, other.name)
        for m in registry.TREE_METHODS if m.sequence_level
        for other in registry.TREE_METHODS
        if other.stochastic and other.reads_draft_probs and not other.sequence_level
    ]  # fmt: skip
    assert [(row["method"], row["baseline"]) for row in versus] == expected
    for row in versus:
        assert row["difference"] == pytest.approx(row["accepted"] - row["baseline_accepted"])
        assert row["tokens_per_step"] == pytest.approx(row["accepted"] + 1)
        assert row["difference_se"] >= 0 and row["tokens_gain_se"] >= 0


def test_exact_gain_matches_a_hand_computed_chain() -> None:
    sys.path.insert(0, str(GAIN.parent))
    try:
        spec = importlib.util.spec_from_file_location("tree_gain", GAIN)
        gain = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gain)
    finally:
        sys.path.remove(str(GAIN.parent))
    pair = gain.SyntheticPair(3, 0, 1.5, 0.5)
    point_mass = next(m for m in registry.TREE_METHODS if m.drafting == "fixed")
    # A one-node chain accepts its fixed candidate x with probability p(x) under the root row.
    (token,) = pair.fixed_tokens([-1])
    assert gain.exact_length(pair, point_mass, [-1]) == pytest.approx(pair.target(())[token])
