"""examples/sharded_mpi.py on real processes: ``mpiexec -n 2`` and ``-n 4`` (skipped
without mpi4py or the mpiexec beside the interpreter, which ``pip install
"specdec_np[mpi]"`` installs)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 4])
def test_example_matches_the_unsharded_call(processes):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [environment.get("PYTHONPATH")])]
    )
    # Root runs MPI only when it says so (CI and these machines run as root); more ranks
    # than cores are fine for a correctness run.
    environment.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    completed = subprocess.run(
        [str(MPIEXEC), "-n", str(processes), "--oversubscribe", sys.executable,
         str(ROOT / "examples" / "sharded_mpi.py")],
        capture_output=True, text=True, timeout=300, env=environment, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "all steps matched" in completed.stdout
    assert completed.stdout.count("matches the unsharded call") == 5
