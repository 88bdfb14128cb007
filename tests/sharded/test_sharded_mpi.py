"""Sharded verification on real processes: examples/sharded_mpi.py under ``mpiexec -n 2``
and ``-n 4`` (skipped without mpi4py or the mpiexec beside the interpreter, which ``pip
install "specdec_np[mpi]"`` installs), and a torch.distributed gloo group of 2 processes
through ``TorchCommunicator`` (skipped without torch)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


TORCH_SCRIPT = '''
import sys
import numpy as np
import torch.distributed as distributed
import torch.multiprocessing as multiprocessing

import specdec_np
from specdec_np import sharded


def work(rank, path):
    distributed.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    rng = np.random.default_rng(4)
    counts = np.array([2, 1])
    target = rng.normal(size=(5, 40)).astype(np.float32)
    arguments = dict(num_draft_tokens=counts, draft_token_ids=np.array([1, 2, 3]),
                     target_logits=target, temperature=np.array([0.9, 0.0]), top_p=0.9,
                     uniforms=rng.random((2, 4)))
    expected = specdec_np.verify_ragged(**arguments)
    start, end = (0, 15) if rank == 0 else (15, 40)
    arguments["target_logits"] = target[:, start:end]
    communicator = sharded.TorchCommunicator(distributed)
    result = sharded.verify_ragged(communicator=communicator, vocab_start=start,
                                   vocab_size=40, **arguments)
    assert np.array_equal(result.output_token_ids, expected.output_token_ids)
    distributed.destroy_process_group()


if __name__ == "__main__":
    multiprocessing.spawn(work, args=(sys.argv[1],), nprocs=2)
    print("torch gloo matched")
'''


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_gloo_group_matches_the_unsharded_call(tmp_path):
    script = tmp_path / "torch_gloo.py"
    script.write_text(TORCH_SCRIPT)
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [environment.get("PYTHONPATH")])]
    )
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "rendezvous")],
        capture_output=True, text=True, timeout=300, env=environment, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "torch gloo matched" in completed.stdout
