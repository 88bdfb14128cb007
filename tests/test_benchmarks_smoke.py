"""The benchmark harness must not rot: run it on a tiny grid (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specdec_np
from specdec_np import _reference

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "benchmarks" / "run.py"
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
    "MB_read",
    "roofline",
)


def test_quick_grid_runs_and_prints_the_table(tmp_path: Path) -> None:
    json_path = tmp_path / "bench.jsonl"
    command = [
        sys.executable,
        str(HARNESS),
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
    # 3 verifiers x 2 regimes x 2 batch sizes x 2 draft lengths, one backend.
    body = [
        line.split()
        for line in lines
        if line.split()[:1] in (["rejection"], ["typical"], ["greedy"])
    ]
    table_rows = [fields for fields in body if len(fields) == len(COLUMNS)]
    assert len(table_rows) == 24
    assert {fields[2] for fields in table_rows} == {"flat", "realistic"}
    assert "streaming read bandwidth" in completed.stdout
    assert "B = 1 profile" in completed.stdout

    records = [json.loads(line) for line in json_path.read_text().splitlines()]
    meta = records[0]
    assert meta["kind"] == "meta" and meta["roofline_bandwidth_gb_per_s"] > 0
    cells = [r for r in records if r["kind"] == "cell"]
    assert len(cells) == 24
    for cell in cells:
        assert cell["time_us"] > 0 and cell["bytes"] > 0 and cell["roofline"] > 0
        assert 0.0 <= cell["accepted"] <= 1.0
        assert cell["ref_us"] > 0 and cell["x_ref"] > 0
        assert (cell["torch_us"] is not None) == HAS_TORCH
    profiles = [r for r in records if r["kind"] == "profile"]
    assert {(p["verifier"], p["B"]) for p in profiles} == {
        (v, 1) for v in ("rejection", "typical", "greedy")
    }
    # The regimes are what SPEC 8 says: flat rejects nearly every draft, realistic accepts most.
    # --render reprints the same table from the JSON lines without measuring.
    rendered = subprocess.run(
        [sys.executable, str(HARNESS), "--render", str(json_path)],
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


def test_bad_arguments_exit_2() -> None:
    completed = subprocess.run(
        [sys.executable, str(HARNESS), "--batch", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "--batch" in completed.stderr


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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import torch_baselines
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
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
