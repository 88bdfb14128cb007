"""What the benchmark scripts share: timing, the bandwidth probe, run metadata and output.

* **Timing policy.**  :class:`Policy` says how many calls to time: one first call, warm-up
  calls worth ``warmup_s``, then ``budget_s / first call`` timed calls clamped to
  ``[min_repeats, max_repeats]`` (a call slower than the budget may count its first call
  alone).  :func:`time_calls` applies it with ``time.perf_counter_ns`` and the garbage
  collector off and reports the median (and mean and fastest); :func:`time_cuda_calls`
  does the same with CUDA events; :func:`best_seconds` is the best of a few rounds, for
  the C row passes of ``row_scans.py`` and ``logits_bench.py``.
* **Bandwidth.**  :func:`measure_bandwidth` is the streaming read bandwidth of this
  machine (the roofline's denominator), measured at the start and the end of a run;
  :func:`finish_roofline` takes the larger of the two so that a slow probe never flatters.
  :func:`measure_cuda_bandwidth` is the device's.
* **Run metadata.**  :func:`run_metadata`: date, command, machine, CPUs, the versions of
  Python, NumPy and specdec_np, the git commit, and the load (``uptime``).
* **Output.**  :func:`write_jsonl` / :func:`read_jsonl` for the JSON lines of a run,
  :func:`render_table` for its tables (aligned text or markdown), :func:`log` for progress
  on stderr.
* **Baselines and C passes.**  :func:`load_torch_baseline` imports a torch baseline module
  of this directory with its thread count pinned (or says why not);
  :func:`compile_library` builds a C source against the package's headers.

Every benchmark script imports this module (``run.py`` is a script that nothing imports).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import dataclasses
import datetime
import gc
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import specdec_np
from specdec_np._runtime import contract as _contract

HERE = Path(__file__).resolve().parent
#: The package's C headers (``rowscan.h``, ``logits_law.h``, ...): those of the package being
#: measured (shipped with it), whether it runs from a checkout or from an installed wheel.
# The CPU kernels' headers; the per-element header shared with CUDA is found after them.
HEADERS = Path(specdec_np.__file__).resolve().parent / "_kernels" / "src" / "cpu"
COMMON_HEADERS = HEADERS.parent / "common"


def log(message: str) -> None:
    """Progress and notes go to stderr, results to stdout."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    """How many calls to time: ``budget_s / first call``, clamped to the repeat limits."""

    budget_s: float
    min_repeats: int
    max_repeats: int
    warmup_s: float = 0.05
    max_warmups: int = 20
    # A call slower than the budget is timed once: its warm-up call is the sample.
    first_call_counts: bool = False

    @property
    def max_calls(self) -> int:
        """Most calls :func:`time_calls` makes: first call, warm-ups, timed calls."""
        return 1 + self.max_warmups + self.max_repeats

    def limited(self, repeats: int | None, min_repeats: int | None = None) -> Policy:
        """At most ``repeats`` timed calls, at least ``min_repeats`` (a noisy machine)."""
        policy = self
        if repeats is not None:
            policy = dataclasses.replace(
                policy,
                min_repeats=min(policy.min_repeats, repeats),
                max_repeats=repeats,
                max_warmups=min(policy.max_warmups, repeats),
            )
        if min_repeats is not None:
            floor = min(min_repeats, policy.max_repeats) if repeats is not None else min_repeats
            policy = dataclasses.replace(
                policy,
                min_repeats=floor,
                max_repeats=max(policy.max_repeats, floor),
                first_call_counts=False,
            )
        return policy


#: The policies of a ``--quick`` run (the smoke tests): a few calls, no real budget.
QUICK_POLICY = Policy(budget_s=0.01, min_repeats=2, max_repeats=3)
QUICK_BASELINE_POLICY = Policy(budget_s=0.01, min_repeats=1, max_repeats=2)


@dataclasses.dataclass
class Timing:
    """What :func:`time_calls` measured, in nanoseconds, and each timed call's result."""

    median_ns: float
    repeats: int
    results: list[Any]
    mean_ns: float | None = None
    min_ns: float | None = None


def time_calls(fn: Callable[[], Any], policy: Policy) -> Timing:
    """Warm up, then time ``fn`` with ``perf_counter_ns``; keep each call's result."""
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        result = fn()
        first_ns = max(time.perf_counter_ns() - start, 1)
        if policy.first_call_counts and first_ns >= policy.budget_s * 1e9:
            return Timing(float(first_ns), 1, [result])
        for _ in range(min(policy.max_warmups, int(policy.warmup_s * 1e9 / first_ns))):
            fn()
        repeats = int(policy.budget_s * 1e9 / first_ns)
        repeats = max(policy.min_repeats, min(policy.max_repeats, repeats))
        times = np.empty(max(repeats, 1), dtype=np.int64)
        results = []
        for j in range(len(times)):
            start = time.perf_counter_ns()
            result = fn()
            times[j] = time.perf_counter_ns() - start
            results.append(result)
        return Timing(
            float(np.median(times)), len(times), results, float(np.mean(times)), float(times.min())
        )
    finally:
        if gc_enabled:
            gc.enable()


def time_cuda_calls(cupy: Any, fn: Callable[[], Any], policy: Policy) -> Timing:
    """CuPy timing: warm-up and synchronise, then CUDA events around each call."""
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    repeats = max(policy.min_repeats, min(policy.max_repeats, 50))
    times, results = [], []
    for _ in range(repeats):
        start.record()
        result = fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e6)  # ms -> ns
        results.append(result)
    return Timing(float(np.median(times)), repeats, results)


def best_seconds(call: Callable[[], Any], rounds: int) -> float:
    """The fastest of ``rounds`` calls, in seconds (``perf_counter``): what a pass costs
    when nothing else runs, for passes that do a fixed amount of work per call."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


# --------------------------------------------------------------------------------------
# Streaming bandwidth (the roofline's denominator)
# --------------------------------------------------------------------------------------


def measure_bandwidth(nbytes: int, threads: int = 2, repeats: int = 9) -> dict[str, Any]:
    """Streaming read bandwidth of this machine, measured with NumPy reductions.

    ``np.maximum.reduce`` (SIMD, no float rounding work, releases the GIL) and ``np.sum``
    over a float32 array of ``nbytes``, on 1 thread and on ``threads`` threads (each
    reducing one contiguous slice); the best median is the roofline bandwidth.
    """
    array = np.ones(nbytes // 4, dtype=np.float32)  # also faults every page in
    slices = np.array_split(array, threads)
    measured: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for name, reduce in (("max", np.maximum.reduce), ("sum", np.add.reduce)):
            reduce(array)
            single, multi = [], []
            for _ in range(repeats):
                start = time.perf_counter_ns()
                reduce(array)
                single.append(time.perf_counter_ns() - start)
                start = time.perf_counter_ns()
                list(pool.map(reduce, slices))
                multi.append(time.perf_counter_ns() - start)
            measured[f"{name}_1t"] = float(array.nbytes / np.median(single))  # B/ns = GB/s
            measured[f"{name}_{threads}t"] = float(array.nbytes / np.median(multi))
    best = max(measured, key=measured.get)
    del array, slices
    return {
        "bytes": nbytes,
        "gb_per_s": {name: round(value, 3) for name, value in measured.items()},
        "best": best,
        "bandwidth_gb_per_s": measured[best],
        "loadavg": loadavg(),
    }


def measure_cuda_bandwidth(cupy: Any, nbytes: int) -> float:
    """Device read bandwidth (GB/s) from the median time of ``cupy.max`` over nbytes."""
    array = cupy.ones(nbytes // 4, dtype=cupy.float32)
    timing = time_cuda_calls(cupy, lambda: array.max(), Policy(0, 10, 10))
    return nbytes / timing.median_ns


def finish_roofline(
    meta: dict[str, Any], rows: Sequence[dict[str, Any]], nbytes: int, threads: int,
    bandwidth: float,
) -> float:  # fmt: skip
    """Probe the bandwidth again at the end of a run and keep the larger of the two.

    The rows' ``roofline`` was computed with the start probe's ``bandwidth``; where the end
    probe is faster it is scaled down to it.  ``meta`` gets ``bandwidth_end``, ``uptime``
    and ``bandwidth_gb_per_s`` (the one used).

    Returns
    -------
    float
        The bandwidth of the rooflines, GB/s.
    """
    end = measure_bandwidth(nbytes, threads=threads)
    meta["bandwidth_end"] = end
    meta["uptime"] = uptime()
    if end["bandwidth_gb_per_s"] > bandwidth:
        scale = bandwidth / end["bandwidth_gb_per_s"]
        for row in rows:
            row["roofline"] *= scale
        bandwidth = end["bandwidth_gb_per_s"]
    meta["bandwidth_gb_per_s"] = bandwidth
    return bandwidth


# --------------------------------------------------------------------------------------
# Run metadata
# --------------------------------------------------------------------------------------


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages; None where the platform has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def uptime() -> str | None:
    """What ``uptime`` prints (the machine's load, for the record); None without it."""
    try:
        completed = subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def git_commit() -> str | None:
    """The checkout's commit (``-dirty`` when it has uncommitted changes); None outside a
    git checkout."""
    try:
        completed = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=HERE, capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    return completed.stdout.strip() or None


def run_metadata() -> dict[str, Any]:
    """The ``meta`` record every run starts with (scripts add their own keys).

    Returns
    -------
    dict
        ``kind`` ("meta"), ``date`` (UTC, ISO 8601), ``command``, ``machine``,
        ``cpu_count``, ``python``, ``numpy``, ``specdec_np``, ``commit`` and
        ``uptime_start``.
    """
    return {
        "kind": "meta",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "specdec_np": specdec_np.__version__,
        "commit": git_commit(),
        "uptime_start": uptime(),
    }


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------


def write_jsonl(path: str, records: Iterable[dict[str, Any]], *, append: bool) -> None:
    """One JSON object a line (NumPy scalars written as floats)."""
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=float) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def print_meta(records: Iterable[dict[str, Any]], keys: Sequence[str]) -> None:
    """Print ``keys`` of each ``meta`` record of a saved run, one JSON object a line."""
    for record in records:
        if record.get("kind") == "meta":
            print(json.dumps({key: record.get(key) for key in keys}))


def render_table(
    headers: Sequence[str],
    cells: Sequence[Sequence[str]],
    markdown: bool,
    align: str | Sequence[str] = "right",
) -> str:
    """A table of formatted cells: right-aligned text columns two spaces apart, or markdown.

    Parameters
    ----------
    headers : sequence of str
    cells : sequence of rows, each a sequence of str (one per header)
    markdown : bool
    align : {"right", "left", "none"} or a sequence of them, one per column
        The markdown alignment rule of each column (``---:``, ``:---``, ``---``); text
        columns are always right-aligned.

    Returns
    -------
    str
    """
    if markdown:
        aligns = [align] * len(headers) if isinstance(align, str) else list(align)
        rule = {"right": "---:", "left": ":---", "none": "---"}
        lines = ["| " + " | ".join(headers) + " |", "|" + "".join(rule[a] + "|" for a in aligns)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [
        max(len(header), *(len(row[j]) for row in cells)) for j, header in enumerate(headers)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def add_run_options(parser: argparse.ArgumentParser, *, flat_draft_scale: float) -> None:
    """The options the grid scripts share, after their own: ``--threads`` (torch),
    ``--flat-draft-scale``, ``--bandwidth-mib``, ``--seed``, ``--json`` (appended),
    ``--markdown`` and ``--render``."""
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--flat-draft-scale", type=float, default=flat_draft_scale)
    parser.add_argument("--bandwidth-mib", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="append JSON lines (meta, cells)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="reprint a saved run")


# --------------------------------------------------------------------------------------
# Baselines and C passes
# --------------------------------------------------------------------------------------


def load_torch_baseline(
    module: str, threads: int, *, skip: bool, what: str = "torch baseline"
) -> tuple[Any, str]:
    """Import the torch baseline ``module`` of this directory with ``threads`` threads.

    Returns
    -------
    (module or None, str)
        The module, or None when skipped (``skip``, or torch missing), and a note for the
        run's metadata saying which.
    """
    if skip:
        return None, f"{what} skipped (--skip-torch)"
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    try:
        baseline = importlib.import_module(module)
    except ImportError as error:
        return None, f"{what} skipped: torch is not installed ({error})"
    import torch

    torch.set_num_threads(threads)
    return baseline, f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def c_compiler() -> str:
    """``$CC``, else the first of cc, gcc and clang on PATH."""
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    raise SystemExit("this benchmark needs a C compiler (cc, gcc, clang or $CC)")


def compile_library(
    source: str, directory: Path, *, include: Path = HEADERS, flags: Sequence[str] = ()
) -> ctypes.CDLL:
    """``source`` built with ``-O3`` against the headers in ``include`` and the contract's
    macros (the constants the extension is compiled with), loaded.

    Raises
    ------
    SystemExit
        With the compiler's messages, if the build fails.
    """
    path, library = directory / "bench.c", directory / "libbench.so"
    path.write_text(source)
    macros = [f"-D{name}={value}" for name, value in _contract.compile_time_macros()]
    command = [
        c_compiler(), "-O3", "-shared", "-fPIC", "-std=c11", "-Wno-psabi", *flags, *macros,
        f"-I{include}", f"-I{COMMON_HEADERS}", str(path), "-o", str(library), "-lm",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"compiling against the headers of {include} failed:\n{result.stderr}")
    return ctypes.CDLL(str(library))
