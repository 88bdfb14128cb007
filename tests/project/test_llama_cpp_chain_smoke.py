"""The llama.cpp comparison must not rot: a tiny run where llama-cpp-python is installed
(CI builds it for the examples), a clean message where it is not (no timing assertions)."""

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
