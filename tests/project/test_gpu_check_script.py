"""``benchmarks/gpu_check.sh``, the device script, checked on a machine without a GPU.

It cannot run here, so what can be checked without a device is: the shell parses
(``bash -n``; ``shellcheck`` too where installed), its benchmark grid is accepted by
``benchmarks/studies/run.py``'s own parser (``--dry-run``), its summary of the benchmark's JSON
prints time and GB/s and fails when nothing was timed on CuPy, and the script fails, before
building anything, where there is no usable device.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_np._runtime.arrays import cuda_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
BASH = shutil.which("bash")

needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not on PATH")


def _bash_syntax(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, "-n", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@needs_bash
def test_script_parses(tmp_path: Path) -> None:
    result = _bash_syntax(SCRIPT)
    assert result.returncode == 0, result.stderr
    # Negative control: the same check on a copy with an unclosed ``if`` must fail.
    broken = tmp_path / "broken.sh"
    broken.write_text(SCRIPT.read_text().replace("\nfi\n", "\n", 1))
    assert _bash_syntax(broken).returncode != 0


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_script_is_shellcheck_clean() -> None:
    result = subprocess.run(
        ["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _bench_args() -> list[str]:
    match = re.search(r"^bench_args=\((.*?)\)$", SCRIPT.read_text(), re.MULTILINE | re.DOTALL)
    assert match, "benchmarks/gpu_check.sh no longer defines bench_args=(...)"
    return shlex.split(match.group(1))


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "studies" / "run.py"), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_benchmark_grid_is_accepted_by_the_harness() -> None:
    completed = _run_script(*_bench_args(), "--dry-run")
    assert completed.returncode == 0, completed.stderr
    args = json.loads(completed.stdout)
    assert args["backends"] == ["cupy"]
    assert args["batch"] == [1, 8, 64] and args["k"] == [4] and args["vocab"] == [32000, 128256]
    # Negative control: the parser does reject bad options.
    rejected = _run_script(*_bench_args(), "--no-such-option", "--dry-run")
    assert rejected.returncode == 2 and "--no-such-option" in rejected.stderr


def _summary_code() -> str:
    """The script's Python heredoc that summarises the benchmark's JSON lines."""
    blocks = re.findall(r"<<'EOF'[^\n]*\n(.*?)\nEOF\n", SCRIPT.read_text(), re.DOTALL)
    found = [block for block in blocks if "GB/s" in block]
    assert len(found) == 1, "expected one heredoc that prints GB/s in benchmarks/gpu_check.sh"
    return found[0]


def _summarise(tmp_path: Path, records: list[dict]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return subprocess.run(
        [sys.executable, "-c", _summary_code(), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_summary_prints_time_and_bandwidth(tmp_path: Path) -> None:
    meta = {"kind": "meta", "cuda_bandwidth_gb_per_s": 4000.0}
    cell = {"kind": "cell", "verifier": "v", "regime": "flat", "B": 8, "k": 4, "V": 32000}
    cupy_row = dict(cell, backend="cupy", time_us=10.0, bytes=2.5e7)  # 2.5e7 B / 10 us
    numpy_row = dict(cell, backend="numpy", time_us=1000.0, bytes=2.5e7)
    result = _summarise(tmp_path, [meta, cupy_row, numpy_row])
    assert result.returncode == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("| v |")]
    assert table == ["| v | flat | 8 | 4 | 32000 | 10.0 | 25.00 | 2500 |"]
    # Negative control: a run that timed nothing on CuPy must fail the device check.
    failed = _summarise(tmp_path, [meta, numpy_row])
    assert failed.returncode != 0 and "nothing on CuPy" in failed.stderr


@needs_bash
@pytest.mark.skipif(cuda_available(), reason="a usable device is here: the script would run")
def test_script_fails_without_a_device(tmp_path: Path) -> None:
    """No usable device (this machine): the script must stop with an error before building."""
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    result = subprocess.run(
        [BASH, str(SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "== build" not in result.stdout, "the script went on to build without a device"
    assert not (tmp_path / "specdec_gpu_check" / "build.log").exists()
