"""benchmarks/studies/row_scans.py runs on a tiny grid and reports every pass it defines."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "studies" / "row_scans.py"

pytestmark = pytest.mark.skipif(
    not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")), reason="needs a C compiler"
)


def _run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def test_quick_run_reports_every_pass(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        import row_scans
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    out = tmp_path / "scans.jsonl"
    completed = _run("--quick", "--json", str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["pass"] for row in rows] == list(row_scans.PASSES)
    for row in rows:
        assert row["V"] == 1000 and row["rows"] == 4
        for key in ("us_per_row", "ns_per_element", "gb_per_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["pass"], key)
        assert f"| {row['pass']} |" in completed.stdout


def test_headers_from_elsewhere_and_bad_arguments(tmp_path: Path) -> None:
    # A directory without the headers fails to compile: the run stops with an error.
    assert _run("--quick", "--include", str(tmp_path)).returncode != 0
    assert _run("--vocab", "4").returncode == 2
