"""Fuzz every public entry point with corrupted inputs (docs/semantics.md §8), the padded vLLM
API and the flat layouts of ``verify_ragged`` and ``verify_tree`` alike.

The kernels run with Cython's bounds checks off, so a missed check is memory corruption.
``tests/errors/fuzz_worker.py`` makes thousands of calls with corrupted inputs in a subprocess,
so that a crash (segfault, abort) is seen here as a crash, with the call that caused it;
every call must return a valid output or raise ``TypeError``/``ValueError`` that names an
argument, and a call that raises must leave counters and generators as they were.

Environment knobs (for longer local runs): ``SPECDEC_FUZZ_CALLS`` (calls per worker,
default 6000) and ``SPECDEC_FUZZ_SEED``.

A bug the fuzz finds and that is not fixed yet is listed in the worker's ``KNOWN_BUGS``: a
full run counts its cases without calling them.  The cases of the bugs found so far, all
fixed, are replayed by ``test_fixed_bug_reproducer``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specdec_np import registry

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("fuzz_worker.py")
# One group per verifier with padded fronts (one reached through method= only is fuzzed
# by the ragged group), and vLLM's _create_output.
PADDED_NAMES = tuple(v.name for v in registry.VERIFIERS if v.sampler_name is not None)
CHAIN_GROUPS = (*PADDED_NAMES, "output")
# verify_ragged and verify_tree; each case takes its method from registry.VERIFIERS or
# registry.TREE_METHODS.  Fuzzed by the families arrays and arguments.
LAYOUT_GROUPS = ("ragged", "tree")
GROUPS = (*CHAIN_GROUPS, *LAYOUT_GROUPS)
CALLS = int(os.environ.get("SPECDEC_FUZZ_CALLS", "6000"))
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "20240607"))
TIMEOUT_S = 300
# Calls per layout worker: CALLS would add about 40 s to a 2-core CI run.
LAYOUT_CALLS = max(1, CALLS * 2 // 3)


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
    outcomes = ("returned", "TypeError", "ValueError", "failed", "known_bug")
    assert sum(summary[name] for name in outcomes) == calls
    assert not summary["failures"], failure_report(run)
    # Both paths were exercised many times.
    assert summary["returned"] >= calls // 20, summary
    assert summary["TypeError"] >= calls // 50, summary
    assert summary["ValueError"] >= calls // 50, summary
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_fuzz_array_arguments(group: str, tmp_path: Path) -> None:
    """Corrupted arrays: ids out of range, dtypes, ranks, shapes, empty dimensions,
    non-finite values, layouts (strided, broadcast, read-only, Fortran, byte-swapped,
    foreign DLPack arrays) and non-arrays where an array belongs; for the layouts also
    counts (negative, huge, sums that wrap around int64), parents (forward, out of the
    request, below -1, huge) and trees deeper than ``MAX_TREE_DEPTH``."""
    calls = LAYOUT_CALLS if group in LAYOUT_GROUPS else CALLS
    arguments = ("--family", "arrays", "--group", group, "--seed", str(SEED))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    check_fuzz_run(run, calls)


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_fuzz_other_arguments(group: str, tmp_path: Path) -> None:
    """Corrupted non-array arguments: uniforms with seeds, ``seeded_seqs``,
    ``counter_seeds``, ``generator``, posteriors, ``vocab_size`` and ``strict_mode``; for
    the layouts also sampling parameters, method names, ``out=`` buffers, the row forms
    (logits or probabilities) and valid values at the edges of their ranges."""
    calls = max(1, 2 * (LAYOUT_CALLS if group in LAYOUT_GROUPS else CALLS) // 3)
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


@pytest.mark.slow
@pytest.mark.parametrize("group", CHAIN_GROUPS)
def test_fuzz_hardening_classes(group: str, tmp_path: Path) -> None:
    """The hardening input classes with their required outcomes (docs/semantics.md §8):
    byte-swapped arrays give the native result, longdouble, generator subclasses and
    look-alikes, masked arrays, matrices and broken DLPack producers are refused naming
    the argument, foreign float64 uniforms are taken, 0-d uniforms report shape []."""
    calls = max(1, CALLS // 3)
    arguments = ("--family", "hardening", "--group", group, "--seed", str(SEED + 2))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    assert not run.crashed, run.report()
    summary = run.summary
    assert summary is not None and summary["calls"] == calls
    assert not summary["failures"], failure_report(run)
    assert summary["returned"] >= calls // 20, summary
    assert summary["TypeError"] >= calls // 10, summary


@pytest.mark.slow
@pytest.mark.parametrize("group", PADDED_NAMES)
def test_fuzz_kernel_classes(group: str, tmp_path: Path) -> None:
    """Negative or NaN draft entries never let a token of target probability 0 out, and
    a residual whose float64 sum overflows is drawn without bias."""
    calls = max(1, CALLS // 6)
    arguments = ("--family", "kernel", "--group", group, "--seed", str(SEED + 3))
    run = run_worker(tmp_path, *arguments, "--calls", str(calls))
    assert not run.crashed, run.report()
    summary = run.summary
    assert summary is not None and summary["calls"] == calls
    assert not summary["failures"], failure_report(run)
    assert summary["returned"] >= calls // 2, summary


# Cases that found bugs, now fixed, replayed alone: (family, group, seed, index).  Each
# must return a valid output or a TypeError/ValueError naming an argument.
FIXED_BUG_CASES = [
    ("arrays", "tree", 20240607, 5),  # num_nodes whose sum wrapped: segfault
    ("arrays", "ragged", 20240607, 4311),  # num_draft_tokens whose sum wrapped: segfault
    ("arrays", "tree", 20240607, 29),  # a non-array tree_parents: AttributeError
    ("arrays", "tree", 20240607, 5586),  # temperature={...}: TypeError naming nothing
    ("arguments", "tree", 20240607, 1107),  # uint64 and int request keys: IndexError
]


@pytest.mark.parametrize(("family", "group", "seed", "index"), FIXED_BUG_CASES)
def test_fixed_bug_reproducer(
    family: str, group: str, seed: int, index: int, tmp_path: Path
) -> None:
    arguments = ("--family", family, "--group", group, "--seed", str(seed))
    run = run_worker(tmp_path, *arguments, "--only", str(index), timeout=60)
    assert not run.crashed, failure_report(run)
    assert not run.summary["failed"], failure_report(run)


def load_worker() -> Any:
    """The worker as a module, for the checks of its output checks."""
    spec = importlib.util.spec_from_file_location("fuzz_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_worker", module)
    spec.loader.exec_module(module)
    return module


def test_the_worker_knows_the_layout_groups() -> None:
    assert load_worker().LAYOUT_GROUPS == LAYOUT_GROUPS


def layout_case(worker: Any, group: str, **args: Any) -> Any:
    entry = "verify_ragged" if group == "ragged" else "verify_tree"
    return worker.Case(0, "arrays", group, entry, False, args, 1, 1, 4)


# Every row gives token 3 no mass; uniforms of 0 accept every draft of positive mass.
NO_MASS_TOKEN = 3


def rows_without_token_3(rows: int) -> np.ndarray:
    target = np.full((rows, 4), 1.0 / 3.0)
    target[:, NO_MASS_TOKEN] = 0.0
    return target


def tamper(result: Any, **changes: tuple[tuple[int, int] | int, int]) -> Any:
    """A copy of a result with entries of its arrays changed."""
    arrays = {name: getattr(result, name).copy() for name in changes}
    for name, (where, value) in changes.items():
        arrays[name][where] = value
    return result._replace(**arrays)


RAGGED_TAMPERING = {
    "accepted prefix not the drafts": {"output_token_ids": ((0, 0), 2)},
    "token without mass emitted": {"output_token_ids": ((1, 1), NO_MASS_TOKEN)},
    "gap before the end": {"output_token_ids": ((0, 1), -1)},
    "id past V": {"output_token_ids": ((0, 2), 4)},
    "length past k": {"accepted_lengths": (1, 2)},
}


@pytest.mark.parametrize("how", RAGGED_TAMPERING)
def test_the_ragged_output_check_finds_a_broken_output(how: str) -> None:
    worker = load_worker()
    case = layout_case(
        worker,
        "ragged",
        num_draft_tokens=np.array([2, 1]),
        draft_token_ids=np.array([0, 1, 2]),
        target_probs=rows_without_token_3(5),
        uniforms=np.zeros((2, 4)),
    )
    result = worker.invoke_layout(case)
    assert result.accepted_lengths.tolist() == [2, 1]
    assert worker.ragged_output_problems(case, result) == []
    broken = tamper(result, **RAGGED_TAMPERING[how])
    assert worker.ragged_output_problems(case, broken)


def tree_rows() -> np.ndarray:
    """Rows of the tree root -> node 0 (token 0) -> node 1 (token 1), plus node 2: the
    root's argmax is token 0 and node 0's is token 1, so every method walks to node 1."""
    target = rows_without_token_3(4)
    target[0, :3] = [0.5, 0.25, 0.25]
    target[1, :3] = [0.25, 0.5, 0.25]
    return target


TREE_TAMPERING = {
    "not a root path": {"accepted_nodes": ((0, 1), 2)},
    "token not the node's draft": {"output_token_ids": ((0, 0), 2)},
    "final token without mass": {"output_token_ids": ((0, 2), NO_MASS_TOKEN)},
    "final token past V": {"output_token_ids": ((0, 2), 4)},
    "no -1 after the length": {"accepted_lengths": (0, 1)},
}


@pytest.mark.parametrize("method", [m.name for m in registry.TREE_METHODS])
@pytest.mark.parametrize("how", TREE_TAMPERING)
def test_the_tree_output_check_finds_a_broken_output(how: str, method: str) -> None:
    worker = load_worker()
    case = layout_case(
        worker,
        "tree",
        num_nodes=np.array([3]),
        tree_parents=np.array([-1, 0, -1]),
        draft_token_ids=np.array([0, 1, 2]),
        target_probs=tree_rows(),
        method=method,
        uniforms=np.zeros((1, 4)),
    )
    result = worker.invoke_layout(case)
    assert result.accepted_nodes.tolist() == [[0, 1]]
    assert worker.tree_output_problems(case, result) == []
    broken = tamper(result, **TREE_TAMPERING[how])
    problems = worker.tree_output_problems(case, broken)
    walks_by_argmax = not registry.get_tree_method(method).stochastic
    if how == "final token without mass" and walks_by_argmax:
        assert problems == []  # a greedy walk takes the argmax, mass or not
    else:
        assert problems


@pytest.mark.parametrize("group", LAYOUT_GROUPS)
def test_the_consumption_check_finds_an_extra_draw(group: str) -> None:
    worker = load_worker()
    generator = np.random.default_rng(5)
    if group == "ragged":
        arrays = {"num_draft_tokens": np.array([1]), "draft_token_ids": np.array([0])}
    else:
        arrays = {
            "num_nodes": np.array([1]),
            "tree_parents": np.array([-1]),
            "draft_token_ids": np.array([0]),
        }
    case = layout_case(
        worker, group, target_probs=rows_without_token_3(2), seeded_seqs={0: generator}, **arrays
    )
    states = worker.generator_states(case, None)
    result = worker.invoke_layout(case)
    assert worker.layout_consumption_problems(case, states, result) == []
    generator.random()
    assert worker.layout_consumption_problems(case, states, result)


def test_the_layout_check_finds_a_generator_draw_of_the_wrong_shape() -> None:
    worker = load_worker()
    generator = worker.WeirdGenerator("short")
    case = layout_case(worker, "ragged", generator=generator)
    assert worker.generator_problems(case) == []
    generator.random(4)  # returns one value for four
    assert worker.generator_problems(case)
