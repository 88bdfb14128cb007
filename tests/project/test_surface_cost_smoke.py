"""The sampling surface's cost study must not rot: a tiny run prints its three settings
(no timing assertions; the figures are in benchmarks/README.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "surface_cost.py"


def test_a_quick_run_prints_every_setting() -> None:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], cwd=SCRIPT.parent, capture_output=True,
        text=True, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    for setting in ("plain", "penalties and bias", "bitmask"):
        assert f"| {setting} |" in completed.stdout
