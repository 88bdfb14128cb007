"""Fuzz every public entry point with corrupted inputs (SPEC 6, issue 7).

The kernels run with Cython's bounds checks off, so a missed check is memory corruption.
``tests/fuzz_worker.py`` makes thousands of calls with corrupted inputs in a subprocess,
so that a crash (segfault, abort) is seen here as a crash, with the call that caused it;
every call must return a valid output or raise ``TypeError``/``ValueError`` that names an
argument, and a call that raises must leave counters and generators as they were.

Environment knobs (for longer local runs): ``SPECDEC_FUZZ_CALLS`` (calls per worker,
default 6000) and ``SPECDEC_FUZZ_SEED``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specdec_np import registry

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().with_name("fuzz_worker.py")
# One group per registered verifier, and vLLM's _create_output.
GROUPS = (*registry.names(), "output")
CALLS = int(os.environ.get("SPECDEC_FUZZ_CALLS", "6000"))
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "20240607"))
TIMEOUT_S = 300


@dataclass
class WorkerRun:
    """What one worker process did."""

    command: list[str]
    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    last_call: str
    summary: dict[str, Any] | None

    @property
    def crashed(self) -> bool:
        """Died, hung, or ended without its summary: a crash inside a call."""
        return self.returncode != 0 or self.summary is None

    def how_it_ended(self) -> str:
        if self.returncode is None:
            return f"hung (killed after {TIMEOUT_S} s)"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"crashed with {name} (return code {self.returncode})"
        if self.returncode:
            return f"exited with status {self.returncode}"
        return "exited without a summary"

    def report(self) -> str:
        """A readable account of a crash: how, which call, and the end of stderr."""
        return "\n".join(
            [
                f"fuzz worker {self.how_it_ended()}",
                f"command: {' '.join(self.command)}",
                "call in progress:",
                textwrap.indent(self.last_call.rstrip() or "(none logged)", "    "),
                "end of stderr:",
                textwrap.indent(self.stderr[-3000:].rstrip() or "(empty)", "    "),
            ]
        )


def run_worker(log_dir: Path, *arguments: str, timeout: float = TIMEOUT_S) -> WorkerRun:
    """Run ``fuzz_worker.py`` with ``arguments`` and collect how it ended."""
    log = log_dir / "last_call.txt"
    command = [sys.executable, str(WORKER), *arguments, "--log", str(log)]
    try:
        process = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        returncode, stdout, stderr = process.returncode, process.stdout, process.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = None
        stdout = _text(expired.stdout)
        stderr = _text(expired.stderr)
    last_call = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    summary = None
    if returncode == 0 and stdout.strip():
        try:
            summary = json.loads(stdout.strip().splitlines()[-1])
        except json.JSONDecodeError:
            summary = None
    return WorkerRun(command, returncode, stdout, stderr, last_call, summary)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def failure_report(run: WorkerRun) -> str:
    """The distinct failures of a finished run, one example call each."""
    summary = run.summary or {}
    lines = [
        f"{summary.get('failed')} of {summary.get('calls')} calls failed "
        f"({len(summary.get('failures', []))} distinct); command: {' '.join(run.command)}"
    ]
    for failure in summary.get("failures", []):
        lines.append(f"[{failure['count']}x] {failure['signature']}")
        lines.append(textwrap.indent(failure["detail"][:600], "      "))
        lines.append(textwrap.indent(failure["case"], "      "))
    return "\n".join(lines)


def check_fuzz_run(run: WorkerRun, calls: int) -> dict[str, Any]:
    assert not run.crashed, run.report()
    summary = run.summary
    assert summary is not None
    print(
        f"fuzz {' '.join(run.command[2:-2])}: {summary['calls']} calls, "
        f"{summary['returned']} returned, {summary['TypeError']} TypeError, "
        f"{summary['ValueError']} ValueError, {summary['failed']} failed"
    )
    assert summary["calls"] == calls
    outcomes = ("returned", "TypeError", "ValueError", "failed")
    assert sum(summary[name] for name in outcomes) == calls
    assert not summary["failures"], failure_report(run)
    # Both paths were exercised many times.
    assert summary["returned"] >= calls // 20, summary
    assert summary["TypeError"] >= calls // 50, summary
    assert summary["ValueError"] >= calls // 50, summary
    return summary


@pytest.mark.parametrize("group", GROUPS)
def test_fuzz_array_arguments(group: str, tmp_path: Path) -> None:
    """Corrupted arrays: ids out of range, dtypes, ranks, shapes, empty dimensions,
    non-finite values, layouts (strided, broadcast, read-only, Fortran, byte-swapped,
    foreign DLPack arrays) and non-arrays where an array belongs."""
    arguments = ("--family", "arrays", "--group", group, "--seed", str(SEED))
    run = run_worker(tmp_path, *arguments, "--calls", str(CALLS))
    check_fuzz_run(run, CALLS)


@pytest.mark.parametrize("group", GROUPS)
def test_fuzz_other_arguments(group: str, tmp_path: Path) -> None:
    """Corrupted non-array arguments: uniforms with seeds, ``seeded_seqs``,
    ``counter_seeds``, ``generator``, posteriors, ``vocab_size`` and ``strict_mode``."""
    calls = max(1, 2 * CALLS // 3)
    arguments = ("--family", "arguments", "--group", group, "--seed", str(SEED + 1))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    check_fuzz_run(run, calls)


@pytest.mark.parametrize(
    ("kind", "signal_number"), [("abort", signal.SIGABRT), ("segv", signal.SIGSEGV)]
)
def test_a_crashing_worker_is_reported_as_a_crash(
    kind: str, signal_number: int, tmp_path: Path
) -> None:
    run = run_worker(tmp_path, "--self-test-crash", kind, timeout=60)
    assert run.crashed
    assert run.returncode == -signal_number
    assert run.summary is None
    assert f"self-test crash ({kind})" in run.last_call
    report = run.report()
    assert signal.Signals(signal_number).name in report
    assert f"self-test crash ({kind})" in report


def test_a_case_can_be_replayed_alone(tmp_path: Path) -> None:
    """The ``--only`` command printed with every failure reproduces that one call."""
    arguments = ("--family", "arrays", "--group", "greedy", "--seed", str(SEED))
    run = run_worker(tmp_path, *arguments, "--only", "5", timeout=60)
    assert not run.crashed, run.report()
    assert f"case 5 (--family arrays --group greedy --seed {SEED} --only 5)" in run.stdout
    assert "outcome: " in run.stdout
    assert run.summary is not None and run.summary["calls"] == 1
    assert run.last_call.startswith("case 5 ")


WRONG_SHAPE_GENERATOR = """
import numpy as np
import specdec_np


class OneValue:
    # Duck-typed generator (it has .random) that ignores the requested size.
    def random(self, size=None):
        return np.full((1, 1), 0.5)


B, k, V = 4, 3, 8
target = np.full((B, k + 1, V), 1.0 / V, dtype=np.float32)
draft_ids = np.zeros((B, k), dtype=np.int64)
bonus = np.zeros((B, 1), dtype=np.int64)
try:
    specdec_np.rejection_sample(target, bonus, None, draft_ids, generator=OneValue())
except (TypeError, ValueError) as error:
    print("raised", type(error).__name__, error)
else:
    print("returned")
"""


def test_generator_uniforms_of_the_wrong_shape_never_reach_the_kernel() -> None:
    """A ``generator`` whose ``random`` returns a [1, 1] array for a [B, k+1] request must
    be refused: without seeded rows its draws went to the kernel unchecked, which then
    read ``uniforms[b, i]`` past the end of the array (a segfault for large B)."""
    process = subprocess.run(
        [sys.executable, "-c", WRONG_SHAPE_GENERATOR],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout.startswith("raised"), (
        "rejection_sample used a generator's [1, 1] uniforms for a [4, 4] batch: " + process.stdout
    )
    assert "generator" in process.stdout


@pytest.mark.parametrize("group", GROUPS)
def test_fuzz_hardening_classes(group: str, tmp_path: Path) -> None:
    """Issue 11's input classes with their required outcomes: byte-swapped arrays give the
    native result, longdouble, generator subclasses and look-alikes, masked arrays,
    matrices and broken DLPack producers are refused naming the argument, foreign float64
    uniforms are taken, 0-d uniforms report shape []."""
    calls = max(1, CALLS // 3)
    arguments = ("--family", "hardening", "--group", group, "--seed", str(SEED + 2))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    assert not run.crashed, run.report()
    summary = run.summary
    assert summary is not None and summary["calls"] == calls
    assert not summary["failures"], failure_report(run)
    assert summary["returned"] >= calls // 20, summary
    assert summary["TypeError"] >= calls // 10, summary


@pytest.mark.parametrize("group", registry.names())
def test_fuzz_kernel_classes(group: str, tmp_path: Path) -> None:
    """Negative or NaN draft entries never let a token of target probability 0 out, and
    a residual whose float64 sum overflows is drawn without bias (issue 11)."""
    calls = max(1, CALLS // 6)
    arguments = ("--family", "kernel", "--group", group, "--seed", str(SEED + 3))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    assert not run.crashed, run.report()
    summary = run.summary
    assert summary is not None and summary["calls"] == calls
    assert not summary["failures"], failure_report(run)
    assert summary["returned"] >= calls // 2, summary
