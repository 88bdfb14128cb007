"""benchmarks/studies/fixed_cost.py runs a few calls and reports every public call with
the breakdown of its stages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "benchmarks" / "studies"


def test_quick_run_reports_every_call_and_stage() -> None:
    sys.path.insert(0, str(STUDIES))
    try:
        import fixed_cost
    finally:
        sys.path.remove(str(STUDIES))
    records = fixed_cost.measure(batch=1, vocab=16, repeats=5)
    assert [record["call"] for record in records] == list(fixed_cost.calls(1, 16))
    for record in records:
        processed = record["call"].startswith("processed_probs")
        stages = fixed_cost.PROCESSED_STAGES if processed else fixed_cost.ENGINE_STAGES
        found = record["stages_us"]
        assert set(found) == {*stages, "total", "front"}
        # Every stage ran (the kernel at least), and the parts add up to the total.
        assert found["kernel"] > 0 and record["median_us"] > 0
        assert abs(sum(found[stage] for stage in (*stages, "front")) - found["total"]) < 1e-6
        if not processed:
            # Explicit uniforms are not drawn; a sampling step's lane checks and plans once,
            # on its first call.
            drawn = "uniforms" not in record["call"]
            lane = record["call"].startswith("sample_tokens")
            assert (found["draw"] > 0) == drawn and found["out block"] > 0
            assert (found["checks"] > 0 and found["plan"] > 0) != lane
        if record["call"].startswith("EngineVerifier"):
            assert found["record"] > 0


def test_the_script_runs_against_this_checkout() -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, str(STUDIES / "fixed_cost.py"), "--quick", "--clock", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=environment,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"specdec_np from {ROOT / 'specdec_np'}" in completed.stderr
    for call in ("sample_tokens", "processed_probs (filters)", "EngineVerifier (filters)"):
        assert call in completed.stdout
