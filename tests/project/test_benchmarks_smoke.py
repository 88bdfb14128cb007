"""The chain benchmark must not rot: run it on a tiny grid (no timing assertions).

``benchmarks/studies/run.py`` is a script (run here as one); its cells, read models and
staged calls are ``benchmarks/studies/chain_cells.py``, loaded as a module; the shared
timing, metadata and output code is ``benchmarks/studies/harness.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specdec_np
from specdec_np import _core, registry
from specdec_np._reference import chains as _reference

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "studies" / "run.py"
CELLS = ROOT / "benchmarks" / "studies" / "chain_cells.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
COLUMNS = (
    "verifier",
    "backend",
    "regime",
    "B",
    "k",
    "V",
    "time_us",
    "best_us",
    "ref_us",
    "torch_us",
    "x_ref",
    "x_torch",
    "x_torch_best",
    "acc",
    "mean_len",
    "x_len_rej",
    "MB_read",
    "roofline",
)
NAMES = tuple(verifier.name for verifier in registry.VERIFIERS)
# Written out here, not taken from the script: a stage the script drops must fail the test.
STAGES = {"intake", "id_check", "output_block", "kernel", "finish"}
STOCHASTIC_STAGES = STAGES | {"uniforms"}


def expected_stages(name: str) -> set[str]:
    return STOCHASTIC_STAGES if registry.get(name).stochastic else STAGES


def test_quick_grid_runs_and_prints_the_table(tmp_path: Path) -> None:
    json_path = tmp_path / "bench.jsonl"
    command = [
        sys.executable,
        str(SCRIPT),
        "--quick",
        "--backends",
        "numpy",
        "--json",
        str(json_path),
    ]
    if not HAS_TORCH:
        command.append("--skip-torch")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["verifier"])
    assert header.split() == list(COLUMNS)
    # Every registered verifier x 2 regimes x 2 batch sizes x 2 draft lengths, one backend.
    body = [line.split() for line in lines if line.split()[:1] in ([n] for n in NAMES)]
    table_rows = [fields for fields in body if len(fields) == len(COLUMNS)]
    assert len(table_rows) == 8 * len(NAMES)
    assert {fields[0] for fields in table_rows} == set(NAMES)
    assert {fields[2] for fields in table_rows} == {"flat", "realistic"}
    assert "streaming read bandwidth" in completed.stdout
    assert "B = 1 profile" in completed.stdout
    assert "accepted-length gain over token-wise rejection" in completed.stdout

    records = [json.loads(line) for line in json_path.read_text().splitlines()]
    meta = records[0]
    assert meta["kind"] == "meta" and meta["roofline_bandwidth_gb_per_s"] > 0
    assert meta["uptime_start"] and meta["uptime_end"]
    cells = [r for r in records if r["kind"] == "cell"]
    assert len(cells) == 8 * len(NAMES)
    for cell in cells:
        verifier = registry.get(cell["verifier"])
        assert cell["time_us"] > 0 and cell["bytes"] > 0 and cell["roofline"] > 0
        assert 0.0 <= cell["accepted"] <= 1.0
        if hasattr(_reference, verifier.reference_name):
            assert cell["ref_us"] > 0 and cell["x_ref"] > 0
        else:
            assert cell["ref_us"] is None
        assert (cell["torch_us"] is not None) == HAS_TORCH
        # Paired accepted lengths: every stochastic verifier, on rejection's uniforms.
        if verifier.stochastic:
            assert 0.0 <= cell["mean_length"] <= cell["k"]
            assert 0.0 <= cell["tokenwise_length"] <= cell["k"]
            if cell["verifier"] == "rejection":
                assert cell["mean_length"] == cell["tokenwise_length"]
                assert cell["length_gain"] == 0.0
        else:
            assert "mean_length" not in cell
    profiles = [r for r in records if r["kind"] == "profile"]
    # One profile per verifier, regime and k at B = 1, each with every stage timed.
    assert len(profiles) == 4 * len(NAMES)
    assert {p["verifier"] for p in profiles} == set(NAMES) and {p["B"] for p in profiles} == {1}
    for profile in profiles:
        assert set(profile["stages_us"]) == expected_stages(profile["verifier"]), profile
        assert all(us > 0 for us in profile["stages_us"].values()), profile
        assert profile["kernel_us"] == profile["stages_us"]["kernel"]
        # Both are positive; their order is not asserted, because the kernel and the
        # entry point are timed at different moments and a loaded machine can invert them.
        assert profile["kernel_us"] > 0 and profile["entry_us"] > 0
        assert profile["overhead_us"] == profile["entry_us"] - profile["kernel_us"]
    # The regimes mean what their names say: flat rejects nearly every draft, realistic
    # accepts most.
    # --render reprints the same table from the JSON lines without measuring.
    rendered = subprocess.run(
        [sys.executable, str(SCRIPT), "--render", str(json_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    assert header in rendered.stdout.splitlines()
    flat = [c["accepted"] for c in cells if c["verifier"] == "rejection" and c["regime"] == "flat"]
    realistic = [
        c["accepted"] for c in cells if c["verifier"] == "rejection" and c["regime"] == "realistic"
    ]
    assert np.mean(flat) < 0.3 < np.mean(realistic)


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_every_script_shares_the_harness_and_nothing_imports_run() -> None:
    benchmarks = ROOT / "benchmarks" / "studies"
    scripts = [path for path in sorted(benchmarks.glob("*.py")) if "__main__" in path.read_text()]
    assert {path.name for path in scripts} >= {
        "run.py", "engine.py", "tree.py", "tree_gain.py", "row_scans.py", "logits_bench.py"
    }  # fmt: skip
    for path in scripts:
        assert "harness" in _imported_modules(path), f"{path.name} does not use the harness"
    # Neither imported nor loaded from its path: run.py is a script, run as one.
    loads_run = re.compile(r"(spec_from_file_location|run_path)\([^)]*run\.py")
    for path in [*benchmarks.glob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        assert "run" not in _imported_modules(path), f"{path.name} imports studies/run.py"
        assert not loads_run.search(path.read_text()), f"{path.name} loads studies/run.py"


def test_bad_arguments_exit_2() -> None:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--batch", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "--batch" in completed.stderr


@pytest.fixture(scope="module")
def cells():  # noqa: ANN201 - a module
    spec = importlib.util.spec_from_file_location("benchmark_chain_cells", CELLS)
    module = importlib.util.module_from_spec(spec)
    # The module's dataclasses look their module up while being created.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize("name", NAMES)
def test_stage_profile_has_every_stage_and_matches_the_entry_point(cells, name: str) -> None:
    cell = cells.make_cell("realistic", 1, 3, 500, seed=0, flat_draft_scale=4.0)
    stages = cells.stage_calls(registry.get(name), cell, seed=0, calls=3)
    assert set(stages) == expected_stages(name)
    for stage in stages.values():
        stage()


def test_stage_profile_does_not_swallow_a_failing_stage(cells, monkeypatch) -> None:  # noqa: ANN001
    cell = cells.make_cell("flat", 1, 2, 300, seed=0, flat_draft_scale=4.0)

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("first_invalid_id moved")

    monkeypatch.setattr(_core, "first_invalid_id", broken)
    with pytest.raises(RuntimeError, match="first_invalid_id moved"):
        cells.stage_calls(registry.get("rejection"), cell, seed=0, calls=3)["id_check"]()


def test_stage_profile_rejects_stages_that_diverge_from_the_entry_point(
    cells, monkeypatch
) -> None:  # noqa: ANN001
    cell = cells.make_cell("flat", 1, 2, 300, seed=0, flat_draft_scale=4.0)
    # A profile timing another computation than the entry point must not pass for it.
    monkeypatch.setattr(
        cells,
        "specdec_call",
        lambda *a: (
            lambda: specdec_np.greedy_sample(
                cell.target, cell.bonus_ids, np.zeros_like(cell.draft_ids)
            )
        ),
    )
    with pytest.raises(RuntimeError, match="no longer mirror"):
        cells.stage_calls(registry.get("rejection"), cell, seed=0, calls=3)


def test_paired_lengths_redraw_the_drafts_each_round(cells) -> None:  # noqa: ANN001
    # This cell's one drafted path lies in the tails (p(x) < q(x) at three of four
    # positions): on that fixed path block verification accepts about a third of what
    # rejection does, while over drafts drawn from q it accepts at least as much.
    cell = cells.make_cell("realistic", 1, 4, 32000, seed=0, flat_draft_scale=4.0)
    verifiers = [registry.get("rejection"), registry.get("block")]
    paired = cells.paired_lengths(cell, verifiers, 300, seed=0)
    assert paired["rejection"]["mean"] > 3.0
    assert paired["block"]["mean"] > 0.95 * paired["rejection"]["mean"]
    assert paired["rejection"]["gain"] == 0.0 and paired["rejection"]["gain_se"] == 0.0
    difference = paired["block"]["mean"] - paired["rejection"]["mean"]
    assert paired["block"]["gain"] == pytest.approx(difference)


def test_block_bytes_count_the_rows_the_scan_reads(cells) -> None:
    cell = cells.make_cell("flat", 3, 4, 100, seed=1, flat_draft_scale=4.0)
    # Point the drafts at the target's own probabilities, so that every rho is 1: the scan
    # reads no row, and only a row that stops below k draws (one pair of rows).
    cell.draft_probs[:] = cell.target[:, :4]
    scalars = cells._stochastic_scalars(cell)
    pair = 2 * cell.vocab * cell.target.itemsize
    lengths = [np.array([4, 2, 0])]
    assert cells.block_bytes(cell, lengths, {}) == scalars + 2 * pair
    assert cells.block_bytes(cell, [np.array([4, 4, 4])], {}) == scalars


# --- the torch baselines compute what they claim (only where torch is installed) -------


def _inputs(seed: int, batch: int = 6, k: int = 3, vocab: int = 50) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    target = rng.random((batch, k + 1, vocab), dtype=np.float32) ** 4
    target /= target.sum(axis=-1, keepdims=True)
    draft = rng.random((batch, k, vocab), dtype=np.float32)
    draft /= draft.sum(axis=-1, keepdims=True)
    argmax = target[:, :k].argmax(axis=-1)
    # Mix right and wrong drafts so that every output shape occurs.
    ids = np.where(rng.random((batch, k)) < 0.6, argmax, rng.integers(0, vocab, (batch, k)))
    bonus = rng.integers(0, vocab, (batch, 1))
    return target, draft, ids.astype(np.int64), bonus.astype(np.int64)


@pytest.fixture(scope="module")
def baselines():  # noqa: ANN201 - a module
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        import torch_baselines
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    torch_baselines.configure(2)
    return torch_baselines


@pytest.mark.parametrize("seed", range(5))
def test_torch_greedy_and_typical_match_the_reference(baselines, seed: int) -> None:  # noqa: ANN001
    target, _, ids, bonus = _inputs(seed)
    tensors = baselines.as_tensors(target, bonus, ids)
    greedy = baselines.greedy_sample(*tensors)
    expected = _reference.greedy_sample(target, bonus, ids)
    np.testing.assert_array_equal(greedy.output_token_ids.numpy(), expected[0])
    assert int(greedy.num_accepted) == int(expected[2].sum())
    assert int(greedy.num_emitted) == int((expected[1] + 1).sum())
    typical = baselines.typical_acceptance_sample(*tensors, 0.09, 0.3)
    expected = _reference.typical_acceptance_sample(target, bonus, ids, 0.09, 0.3)
    np.testing.assert_array_equal(typical.output_token_ids.numpy(), expected[0])
    np.testing.assert_array_equal(
        typical.output_token_ids.numpy(),
        specdec_np.typical_acceptance_sample(target, bonus, ids).output_token_ids,
    )


def test_torch_rejection_output_format_and_edge_cases(baselines) -> None:  # noqa: ANN001
    import torch

    target, draft, ids, bonus = _inputs(7, batch=64, k=4, vocab=30)
    generator = torch.Generator().manual_seed(0)
    out = baselines.rejection_sample(
        *baselines.as_tensors(target, bonus, draft, ids), generator=generator
    )
    output = out.output_token_ids.numpy()
    for b in range(len(output)):
        emitted = int(np.count_nonzero(output[b] != -1))
        assert np.all(output[b, emitted:] == -1)
        np.testing.assert_array_equal(output[b, : emitted - 1], ids[b, : emitted - 1])
        if emitted == 5:
            assert output[b, 4] == bonus[b, 0]
        else:  # the recovered token comes from the residual max(p - q, 0), not clamped noise
            position = emitted - 1
            assert (
                target[b, position, output[b, position]] > draft[b, position, output[b, position]]
            )
    assert int(out.num_emitted) == int(np.count_nonzero(output != -1))
    # p == q: every draft is accepted (u < min(1, 1)) and the bonus token follows.
    same = baselines.rejection_sample(
        *baselines.as_tensors(target, bonus, np.ascontiguousarray(target[:, :4]), ids),
        generator=generator,
    )
    expected = np.concatenate([ids, bonus], axis=1)
    np.testing.assert_array_equal(same.output_token_ids.numpy(), expected)


@pytest.mark.parametrize("seed", range(4))
def test_torch_block_verification_accepts_what_the_kernel_accepts(baselines, seed: int) -> None:  # noqa: ANN001
    import torch

    target, draft, ids, bonus = _inputs(seed, batch=64, k=4, vocab=40)
    # float64 rows: the same float64 checks as the kernel, so tau must agree exactly.
    target, draft = target.astype(np.float64), draft.astype(np.float64)
    target /= target.sum(axis=-1, keepdims=True)
    draft /= draft.sum(axis=-1, keepdims=True)
    uniforms = np.random.default_rng(seed).random((64, 5))
    out = baselines.block_verification_sample(
        *baselines.as_tensors(target, bonus, draft, ids),
        generator=torch.Generator().manual_seed(seed),
        uniforms=torch.from_numpy(uniforms),
    )
    output = out.output_token_ids.numpy()
    lengths = np.count_nonzero(output != -1, axis=1) - 1
    expected = specdec_np.block_verification_sample(target, bonus, draft, ids, uniforms=uniforms)
    np.testing.assert_array_equal(lengths, expected.accepted_lengths)
    assert int(out.num_accepted) == int(expected.num_accepted.sum())
    # Not token-wise rejection in disguise: on these uniforms some rows accept other lengths.
    tokenwise = specdec_np.rejection_sample(target, bonus, draft, ids, uniforms=uniforms)
    assert np.any(tokenwise.accepted_lengths != expected.accepted_lengths)
    for b, tau in enumerate(lengths):
        np.testing.assert_array_equal(output[b, :tau], ids[b, :tau])
        if tau == 4:
            assert output[b, 4] == bonus[b, 0]
            continue
        # The recovered token has weight in the weighted residual max(rho p - q, 0).
        rho = 1.0
        for j in range(tau):
            p_x, q_x = target[b, j, ids[b, j]], draft[b, j, ids[b, j]]
            rho = 1.0 if rho * p_x >= q_x else rho * p_x / q_x
        token = output[b, tau]
        assert rho * target[b, tau, token] - draft[b, tau, token] > 0


def test_the_front_page_figure_is_drawn_from_the_committed_run(tmp_path: Path) -> None:
    """``benchmarks/studies/plot_summary.py`` draws the README's figure from the committed
    JSON, and the README's summary table quotes that file's cells."""
    source = ROOT / "benchmarks" / "results" / "2026-12-01-padded-cpu" / "reduced-grid.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines() if line]
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        spec = importlib.util.spec_from_file_location(
            "plot_summary", ROOT / "benchmarks" / "studies" / "plot_summary.py"
        )
        assert spec is not None and spec.loader is not None
        plot_summary = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plot_summary)
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    cells = plot_summary.summary_cells(records, 128256)
    assert {cell["verifier"] for cell in cells} == set(registry.names())
    readme = (ROOT / "README.md").read_text()
    assert "benchmarks/summary.png" in readme and (ROOT / "benchmarks" / "summary.png").exists()
    for cell in cells:
        if cell["B"] != 64:
            continue
        row = f"| {cell['verifier']} | {cell['regime']} | 64 | "
        if row in readme:
            quoted = readme.split(row, 1)[1].split("\n", 1)[0]
            assert f"{cell['x_torch']:.0f}x" in quoted, (row, quoted)
    if importlib.util.find_spec("matplotlib") is not None:
        out = tmp_path / "summary.png"
        assert plot_summary.draw(records, 128256, out) == len(cells)
        assert out.stat().st_size > 10_000
