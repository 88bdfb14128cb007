"""The engine and tree surfaces fuzzed under attack conditions: writer threads, interrupts,
small stacks, masked and foreign arrays (``tests/errors/fuzz_surfaces.py``, run in a subprocess so
that a crash is seen as a crash; docs/semantics.md §6 and §8)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().with_name("fuzz_surfaces.py")
CALLS = int(os.environ.get("SPECDEC_FUZZ_CALLS", "6000")) // 30
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "20240607"))


def run_worker(mode: str, **environment: str) -> dict:
    # The checkout under test first: an installed copy elsewhere must not answer instead.
    path = os.pathsep.join(filter(None, [str(WORKER.parents[2]), os.environ.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, str(WORKER), mode, "--seed", str(SEED), "--calls", str(CALLS)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": path, **environment},
    )  # fmt: skip
    last_call = completed.stderr.strip().splitlines()[-1:] if completed.stderr else []
    assert completed.returncode == 0, (
        f"worker {mode} exited with {completed.returncode} (a negative code is a signal: a "
        f"crash) at {last_call}:\n{completed.stderr[-3000:]}"
    )
    summary = json.loads(completed.stdout.strip().splitlines()[-1])
    assert summary["calls"] == CALLS
    return summary


def test_writer_threads_never_change_the_tokens() -> None:
    """A thread writing invalid values into an argument during the call: the pristine
    tokens or a clean refusal, and both happen (the races are real)."""
    summary = run_worker("writers")
    assert summary.get("pristine", 0) > 0 and summary.get("refused", 0) > 0, summary


def test_interrupts_leave_metrics_and_generators_together() -> None:
    summary = run_worker("interrupts")
    assert summary.get("interrupted", 0) > 0, summary


@pytest.mark.slow  # the fuzz at length; the hardening tests cover each refusal once
def test_masked_matrix_and_foreign_arrays() -> None:
    """Masked arrays and matrices in any argument, read or not, are a TypeError naming it;
    torch tensors give the same tokens as torch tensors."""
    summary = run_worker("masked")
    assert summary.get("refused", 0) > 0, summary


def test_overflowing_temperatures_and_empty_batches() -> None:
    """processed_probs, sample_tokens, verify_ragged and verify_tree refuse exactly the
    temperatures that overflow a divided row's largest finite logit, and empty batches are
    empty results; both outcomes happen."""
    summary = run_worker("sampling")
    assert summary.get("refused", 0) > 0 and summary.get("accepted", 0) > 0, summary
    assert summary.get("empty", 0) > 0, summary


@pytest.mark.parametrize("omp_stacksize", [None, "16K"])
def test_small_stacks_give_the_same_tokens(omp_stacksize: str | None) -> None:
    """Every call in a thread with Python's smallest stack (32 KiB), and with 16 KiB OpenMP
    worker stacks: no crash, the pristine tokens."""
    environment = {} if omp_stacksize is None else {
        "OMP_STACKSIZE": omp_stacksize, "OMP_NUM_THREADS": "2"
    }  # fmt: skip
    summary = run_worker("small_stack", **environment)
    assert summary.get("pristine", 0) == CALLS, summary


@pytest.mark.parametrize("worker_mode", ["writers"])
def test_the_worker_fails_on_a_broken_copy(worker_mode: str, monkeypatch, tmp_path) -> None:
    """Negative control: with the private copy of the uniforms removed (the kernel reads the
    caller's array in place), the writers' check finds changed tokens."""
    patch = tmp_path / "sitecustomize.py"
    patch.write_text(
        "import numpy as np\n"
        "from specdec_np._runtime import uniforms as _random\n"
        "original = _random.RejectionUniforms.__init__\n"
        "def in_place(self, *args, uniforms=None, **kwargs):\n"
        "    original(self, *args, uniforms=uniforms, **kwargs)\n"
        "    if uniforms is not None and isinstance(uniforms, np.ndarray) and \\\n"
        "            uniforms.dtype == np.float64 and uniforms.flags.c_contiguous:\n"
        "        self._explicit = uniforms\n"
        "_random.RejectionUniforms.__init__ = in_place\n"
        "draw = _random.RejectionUniforms.draw\n"
        "def slow_draw(self):\n"
        "    import time\n"
        "    time.sleep(0.002)  # the writer's moment, every time\n"
        "    return draw(self)\n"
        "_random.RejectionUniforms.draw = slow_draw\n"
    )
    completed = subprocess.run(
        [sys.executable, str(WORKER), worker_mode, "--seed", str(SEED), "--calls", "400"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )  # fmt: skip
    assert completed.returncode != 0 and "changed the tokens" in completed.stderr, (
        completed.stderr[-2000:]
    )


@pytest.mark.slow  # the fuzz at length; tests/adapters covers the contract case by case
def test_the_vllm_adapter_keeps_vllms_randomness_contract() -> None:
    """Random vLLM batches through the adapter (NumPy and torch inputs, seeded requests,
    bfloat16 rows): vLLM's output, each seeded generator moved by its own request's draws,
    the same tokens alone; a corrupted call is refused, names the argument and moves no
    generator, torch's global one included."""
    summary = run_worker("adapter")
    assert summary.get("refused numpy", 0) > 0, summary
    if importlib.util.find_spec("torch") is not None:
        assert summary.get("refused torch", 0) > 0, summary


@pytest.mark.slow  # the negative control of the slow adapter fuzz above
def test_the_adapter_fuzz_fails_on_batch_dependent_draws(tmp_path: Path) -> None:
    """Negative control: with every seeded request drawing as many uniforms as the
    batch's longest one, the worker finds the generators moved otherwise."""
    pytest.importorskip("torch")
    patch = tmp_path / "sitecustomize.py"
    patch.write_text(
        "import numpy as np\n"
        "from specdec_np.adapters import vllm\n"
        "original = vllm._TorchUniforms.__init__\n"
        "def widest(self, torch, generators, device, row_widths, shape):\n"
        "    row_widths = np.where(row_widths > 0, row_widths.max(initial=0), 0)\n"
        "    original(self, torch, generators, device, row_widths, shape)\n"
        "vllm._TorchUniforms.__init__ = widest\n"
    )
    completed = subprocess.run(
        [sys.executable, str(WORKER), "adapter", "--seed", str(SEED), "--calls", "100"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )  # fmt: skip
    assert completed.returncode != 0 and "drew other than" in completed.stderr, (
        completed.stderr[-2000:]
    )
