#!/usr/bin/env python
"""Benchmark grid of specdec_np's verifiers against the reference, torch and the roofline.

Times every verifier of ``specdec_np.registry.VERIFIERS`` on NumPy (and on CuPy when
``cupy.is_available()``) over B x k x V in two input regimes (flat and realistic), against

* the array-API reference (``specdec_np._reference.chains``) on NumPy, where it has the verifier's
  function (``--skip-reference``);
* torch baselines (``benchmarks/studies/torch_baselines.py``: vLLM v0's algorithms, and block
  verification as an engine would write it in torch), for the verifiers that have one;
  skipped with a note if torch is missing, or with ``--skip-torch``;
* the memory roofline: the bytes each algorithm must read for the outcome it actually had,
  divided by the streaming read bandwidth measured at the start and end of the same run.

What is timed is what a user pays: the public entry point (e.g.
``specdec_np.rejection_sample`` with a ``numpy.random.Generator`` made once per call before
the clock starts, so uniform generation, validation and dispatch are included), one warm-up
call or more, then the median of N calls measured with ``time.perf_counter_ns`` (N adapts
to the call's cost, within ``--min-repeats`` and ``--repeats``).  For B = 1 the run also
splits the entry point's time into its stages (intake, id check, uniforms, output block,
kernel, finish; ``--no-profile`` skips it).  Every stochastic verifier also gets its mean
accepted length over ``--paired-draws`` rounds (fresh draft ids drawn from ``draft_probs``
and fresh explicit uniforms per round, shared by all of them), and its ratio to token-wise
rejection's on the same ids and uniforms.

Usage::

    python benchmarks/studies/run.py                          # full grid, ~10 minutes on 2 cores
    python benchmarks/studies/run.py --quick                  # tiny grid (smoke test)
    python benchmarks/studies/run.py --batch 64 --k 4 --vocab 128256 --verifiers rejection block
    python benchmarks/studies/run.py --json out.jsonl --plot out.png --markdown
    python benchmarks/studies/run.py --backends cupy --k 4 --dry-run   # the options, as JSON

The cells, read models and timed calls are ``benchmarks/studies/chain_cells.py``; timing, the
bandwidth probe, metadata, JSON lines and tables are ``benchmarks/studies/harness.py``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (timing, bandwidth, metadata, JSON lines, tables)
from chain_cells import (  # noqa: E402  (the grid's inputs, read models and calls)
    BYTES_MODELS,
    REGIMES,
    TOKENWISE,
    VERIFIER_NAMES,
    Cell,
    class_call,
    make_cell,
    paired_lengths,
    parameters_of,
    reference_call,
    rows_equal,
    specdec_call,
    stage_calls,
    torch_call,
)

from specdec_np import _core, registry  # noqa: E402

FULL_BATCH = (1, 8, 64)
FULL_K = (1, 4, 8)
FULL_VOCAB = (32000, 128256, 256000)
QUICK_BATCH = (1, 2)
QUICK_K = (1, 2)
QUICK_VOCAB = (1000,)

# The padded layout's targets (speed-ups over the torch baseline and a roofline, on the
# 2-core development machine).
REJECTION_MIN_SPEEDUP = 50.0
REJECTION_KEY_CELL = (64, 4, 128256)
REJECTION_KEY_SPEEDUP = 150.0
REJECTION_KEY_ROOFLINE = 0.5
DETERMINISTIC_MIN_SPEEDUP = {"flat": 5.0, "realistic": 20.0}

SPECDEC_POLICY = harness.Policy(budget_s=0.25, min_repeats=5, max_repeats=300)
TORCH_POLICY = harness.Policy(budget_s=1.0, min_repeats=2, max_repeats=30)
REFERENCE_POLICY = harness.Policy(
    budget_s=0.5, min_repeats=1, max_repeats=10, first_call_counts=True
)
log = harness.log


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def load_cupy(args: argparse.Namespace) -> Any:
    if "cupy" not in args.backends:
        return None
    try:
        import cupy
    except ImportError:
        return None
    return cupy if cupy.is_available() else None


def run_cell(
    cell: Cell, args: argparse.Namespace, tb: Any, cupy: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, profiles = [], []
    host_arrays = {
        "target": cell.target,
        "bonus": cell.bonus_ids,
        "draft": cell.draft_probs,
        "ids": cell.draft_ids,
    }
    device_arrays = None
    if cupy is not None:
        device_arrays = {name: cupy.asarray(array) for name, array in host_arrays.items()}
    selected = [registry.get(name) for name in args.verifiers]
    paired: dict[str, dict[str, float]] = {}
    stochastic = [v for v in selected if v.stochastic]
    if args.paired_draws and stochastic:
        # The token-wise baseline joins every paired comparison, selected or not.
        compared = list(stochastic)
        if TOKENWISE not in {v.name for v in compared}:
            compared.insert(0, registry.get(TOKENWISE))
        paired = paired_lengths(cell, compared, args.paired_draws, args.seed)
    for verifier in selected:
        name = verifier.name
        parameters = parameters_of(verifier)
        base = {
            "verifier": name,
            "regime": cell.regime,
            "B": cell.batch,
            "k": cell.k,
            "V": cell.vocab,
        }
        ref_ns = torch_ns = torch_min_ns = None
        if not args.skip_reference:
            call = reference_call(verifier, cell)
            if call is None:
                log(f"  no reference timing for {name}: no _reference.{verifier.reference_name}")
            else:
                ref_ns = harness.time_calls(call, REFERENCE_POLICY.limited(args.repeats)).median_ns
        torch_output = None
        if tb is not None:
            call = torch_call(tb, verifier, cell)
            if call is None:
                log(f"  no torch baseline for {name}")
            else:
                timing = harness.time_calls(
                    call, TORCH_POLICY.limited(args.repeats, args.min_repeats)
                )
                torch_ns, torch_output = timing.median_ns, timing.results[-1].output_token_ids
                torch_min_ns = timing.min_ns
        for backend in ("numpy", "cupy"):
            if backend == "numpy" and "numpy" in args.backends:
                # A fresh generator with the same seed for every call (made before timing):
                # every call draws the same uniforms, so the outcome, and with it the bytes
                # read, is the same in every timed call and the median is well defined.
                policy = SPECDEC_POLICY.limited(args.repeats, args.min_repeats)
                pool = [np.random.default_rng(args.seed) for _ in range(policy.max_calls)]
                timing = harness.time_calls(
                    specdec_call(verifier, host_arrays, iter(pool).__next__), policy
                )
            elif backend == "cupy" and device_arrays is not None:
                shared = cupy.random.default_rng(args.seed)
                timing = harness.time_cuda_calls(
                    cupy,
                    specdec_call(verifier, device_arrays, itertools.repeat(shared).__next__),
                    SPECDEC_POLICY.limited(args.repeats, args.min_repeats),
                )
            else:
                continue
            lengths = [
                cupy.asnumpy(r.accepted_lengths) if backend == "cupy" else r.accepted_lengths
                for r in timing.results
            ]
            last_output = timing.results[-1].output_token_ids
            if backend == "cupy":
                last_output = cupy.asnumpy(last_output)
            model = BYTES_MODELS.get(name)
            nbytes = None if model is None else float(model(cell, lengths, parameters))
            median = timing.median_ns
            row = dict(
                base,
                backend=backend,
                time_us=median / 1e3,
                mean_us=None if timing.mean_ns is None else timing.mean_ns / 1e3,
                min_us=None if timing.min_ns is None else timing.min_ns / 1e3,
                repeats=timing.repeats,
                ref_us=None if ref_ns is None or backend != "numpy" else ref_ns / 1e3,
                torch_us=None if torch_ns is None or backend != "numpy" else torch_ns / 1e3,
                accepted=float(np.mean([np.mean(x) for x in lengths]) / cell.k),
                bytes=nbytes,
            )
            if name in paired:
                mean, tokenwise = paired[name]["mean"], paired[TOKENWISE]["mean"]
                row["mean_length"] = mean
                row["tokenwise_length"] = tokenwise
                row["x_tokenwise_length"] = mean / tokenwise if tokenwise > 0 else None
                row["length_gain"] = paired[name]["gain"]
                row["length_gain_se"] = paired[name]["gain_se"]
                row["paired_draws"] = args.paired_draws
            row["x_ref"] = None if row["ref_us"] is None else row["ref_us"] / row["time_us"]
            row["x_torch"] = None if row["torch_us"] is None else row["torch_us"] / row["time_us"]
            # Fastest call against fastest call: what is left when the OS never preempted
            # either side (on a shared machine the medians of 2-thread code are not).
            if backend == "numpy" and torch_min_ns is not None and row["min_us"]:
                row["torch_min_us"] = torch_min_ns / 1e3
                row["x_torch_best"] = row["torch_min_us"] / row["min_us"]
            if torch_output is not None and not verifier.stochastic:
                # Deterministic: the same rows up to float32 rounding at a threshold.
                row["rows_equal_torch"] = rows_equal(last_output, torch_output)
                if row["rows_equal_torch"] != 1.0:
                    log(f"  note: {name} output differs from torch's on {base}")
            rows.append(row)
            if backend == "numpy" and cell.batch == 1 and args.profile:
                profiles.append(profile_b1(verifier, cell, median, args))
    return rows, profiles


def profile_b1(
    verifier: registry.Verifier, cell: Cell, entry_ns: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Where the time of a B = 1 call goes: its stages one by one, the kernel among them,
    and the class call.  A stage that fails raises: a profile is never partial."""
    policy = SPECDEC_POLICY.limited(args.repeats, args.min_repeats)
    class_ns = harness.time_calls(
        class_call(verifier, cell, args.seed, policy.max_calls), policy
    ).median_ns
    stages = {
        name: harness.time_calls(fn, policy).median_ns / 1e3
        for name, fn in stage_calls(verifier, cell, args.seed, policy.max_calls).items()
    }
    profile = {
        "verifier": verifier.name,
        "regime": cell.regime,
        "B": cell.batch,
        "k": cell.k,
        "V": cell.vocab,
        "entry_us": entry_ns / 1e3,
        "class_us": class_ns / 1e3,
        "kernel_us": stages["kernel"],
        "stages_us": stages,
        "overhead_us": entry_ns / 1e3 - stages["kernel"],
        # What the stages do not account for: glue between them in the entry point.
        "unstaged_us": entry_ns / 1e3 - sum(stages.values()),
    }
    return profile


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

TABLE_COLUMNS = (
    ("verifier", "verifier"),
    ("backend", "backend"),
    ("regime", "regime"),
    ("B", "B"),
    ("k", "k"),
    ("V", "V"),
    ("time_us", "time_us"),
    ("min_us", "best_us"),
    ("ref_us", "ref_us"),
    ("torch_us", "torch_us"),
    ("x_ref", "x_ref"),
    ("x_torch", "x_torch"),
    ("x_torch_best", "x_torch_best"),
    ("accepted", "acc"),
    ("mean_length", "mean_len"),
    ("x_tokenwise_length", "x_len_rej"),
    ("bytes", "MB_read"),
    ("roofline", "roofline"),
)
GAIN_COLUMNS = (
    ("regime", "regime"),
    ("B", "B"),
    ("k", "k"),
    ("V", "V"),
    ("verifier", "verifier"),
    ("mean_length", "mean_len"),
    ("tokenwise_length", "rejection_len"),
    ("x_tokenwise_length", "ratio"),
    ("length_gain", "gain"),
    ("length_gain_se", "gain_se"),
    ("roofline", "roofline"),
    ("roofline_best", "roofline_best"),
)
PROFILE_COLUMNS = (
    ("verifier", "verifier"),
    ("regime", "regime"),
    ("k", "k"),
    ("V", "V"),
    ("entry_us", "entry_us"),
    ("class_us", "class_us"),
    ("kernel_us", "kernel_us"),
    ("overhead_us", "overhead_us"),
    ("unstaged_us", "unstaged_us"),
    ("stages", "stages (us)"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "bytes":
        return f"{value / 1e6:.3f}" if value < 1e7 else f"{value / 1e6:.1f}"
    if key in ("x_ref", "x_torch", "x_torch_best"):
        return f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    if key in ("accepted", "roofline", "roofline_best", "mean_length", "tokenwise_length"):
        return f"{value:.2f}"
    if key in ("x_tokenwise_length", "length_gain", "length_gain_se"):
        return f"{value:.3f}"
    if key == "stages":
        return " ".join(f"{name}={us:.1f}" for name, us in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.1f}" if value < 1e5 else f"{value:.0f}"
    return str(value)


def format_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], markdown: bool
) -> str:
    cells = [
        [_fmt(key, row.get(key if key != "stages" else "stages_us")) for key, _ in columns]
        for row in rows
    ]
    return harness.render_table([title for _, title in columns], cells, markdown)


def missed_targets(rows: Sequence[dict[str, Any]], best: bool = False) -> list[str]:
    """Cells of the numpy backend that miss the padded layout's speed-up and roofline
    targets (on medians; with ``best``, on the fastest call of each side)."""
    missed = []
    for row in rows:
        speedup = row.get("x_torch_best" if best else "x_torch")
        if row["backend"] != "numpy" or speedup is None:
            continue
        where = f"{row['verifier']} {row['regime']} B={row['B']} k={row['k']} V={row['V']}"
        if row["verifier"] == TOKENWISE:
            if speedup < REJECTION_MIN_SPEEDUP:
                missed.append(f"{where}: {speedup:.1f}x vs torch < {REJECTION_MIN_SPEEDUP:.0f}x")
            if (row["B"], row["k"], row["V"]) == REJECTION_KEY_CELL:
                if speedup < REJECTION_KEY_SPEEDUP:
                    missed.append(
                        f"{where}: {speedup:.1f}x vs torch < {REJECTION_KEY_SPEEDUP:.0f}x"
                    )
                roofline = row["roofline"] * (row["time_us"] / row["min_us"] if best else 1.0)
                if roofline < REJECTION_KEY_ROOFLINE:
                    missed.append(f"{where}: roofline {roofline:.2f} < {REJECTION_KEY_ROOFLINE}")
        elif not registry.get(row["verifier"]).stochastic:
            goal = DETERMINISTIC_MIN_SPEEDUP[row["regime"]]
            if speedup < goal:
                missed.append(f"{where}: {speedup:.1f}x vs torch < {goal:.0f}x")
    return missed


def plot(rows: Sequence[dict[str, Any]], path: str, meta: dict[str, Any]) -> None:
    """Time vs vocabulary size (log-log): rows = verifiers, columns = regimes; colour = B,
    line style = implementation, at one k (4 when measured)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plot skipped: matplotlib is not installed")
        return
    verifiers = [v for v in VERIFIER_NAMES if any(r["verifier"] == v for r in rows)]
    regimes = [g for g in REGIMES if any(r["regime"] == g for r in rows)]
    ks = sorted({r["k"] for r in rows})
    k = 4 if 4 in ks else ks[-1]
    batches = sorted({r["B"] for r in rows})
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, max(len(batches), 1)))
    styles = {
        "specdec_np numpy": ("time_us", "numpy", "-", "o"),
        "specdec_np cupy": ("time_us", "cupy", "-.", "s"),
        "torch (vLLM v0)": ("torch_us", "numpy", "--", "^"),
        "reference": ("ref_us", "numpy", ":", "x"),
    }
    figure, axes = plt.subplots(
        len(verifiers),
        len(regimes),
        figsize=(5.5 * len(regimes), 3.8 * len(verifiers)),
        squeeze=False,
    )
    for i, verifier in enumerate(verifiers):
        for j, regime in enumerate(regimes):
            ax = axes[i][j]
            for colour, batch in zip(colours, batches, strict=True):
                for label, (key, backend, style, marker) in styles.items():
                    points = sorted(
                        (r["V"], r[key])
                        for r in rows
                        if (r["verifier"], r["regime"], r["B"], r["k"], r["backend"])
                        == (verifier, regime, batch, k, backend)
                        and r.get(key) is not None
                    )
                    if points:
                        ax.plot(
                            *zip(*points, strict=True),
                            style,
                            marker=marker,
                            color=colour,
                            label=f"{label}, B={batch}",
                        )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{verifier}, {regime} regime, k={k}")
            ax.set_xlabel("vocabulary size V")
            ax.set_ylabel("median time per call (µs)")
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(
        handles, labels, loc="lower center", ncol=min(4, max(len(labels), 1)), fontsize="small"
    )
    figure.suptitle(
        f"specdec_np vs baselines ({meta['cpu_count']} CPU cores, "
        f"{meta['roofline_bandwidth_gb_per_s']:.1f} GB/s streaming read)"
    )
    figure.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(labels) / 4), 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    log(f"plot written to {path}")


def report(
    meta: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    profiles: Sequence[dict[str, Any]],
    markdown: bool,
) -> None:
    """Print the header, the cell table, the B = 1 profile and the missed targets."""
    print(f"# specdec_np benchmark, {meta['date']}")
    print(f"# command: {meta['command']}")
    print(
        f"# numpy {meta['numpy']}, python {meta['python']}, {meta['cpu_count']} CPUs; "
        f"{meta['torch']}"
    )
    if meta.get("openmp_max_threads") is not None:
        print(
            f"# specdec_np kernels: at most {meta['openmp_max_threads']} OpenMP threads "
            f"(OMP_NUM_THREADS={meta.get('omp_num_threads_env')})"
        )
    bw, end = meta["bandwidth"], meta["bandwidth_end"]
    print(
        f"# streaming read bandwidth (median of {bw['bytes'] >> 20} MiB float32 reductions, best "
        f"method): start {bw['bandwidth_gb_per_s']:.2f} GB/s ({bw['best']}), end "
        f"{end['bandwidth_gb_per_s']:.2f} GB/s ({end['best']}); roofline uses "
        f"{meta['roofline_bandwidth_gb_per_s']:.2f} GB/s"
    )
    print(f"# all probes (GB/s): start {bw['gb_per_s']}, end {end['gb_per_s']}")
    print(f"# load average at start {bw['loadavg']}, at end {end['loadavg']}")
    for when in ("start", "end"):
        if meta.get(f"uptime_{when}"):
            print(f"# uptime at {when}: {meta[f'uptime_{when}']}")
    if meta.get("cuda_bandwidth_gb_per_s"):
        print(f"# CUDA read bandwidth: {meta['cuda_bandwidth_gb_per_s']:.1f} GB/s (cupy max)")
    print(
        "# time_us: median per call of the public entry point; best_us: fastest call; x_ref, "
        "x_torch: baseline median / time_us; x_torch_best: fastest torch call / best_us; acc: "
        "accepted prefix / k of the timed outcome; mean_len: mean accepted length over the "
        "paired rounds (stochastic verifiers: fresh draft ids and uniforms per round, shared by "
        "all); x_len_rej: mean_len / rejection's on the same ids and uniforms; MB_read: bytes "
        "the algorithm must read; roofline: (MB_read / bandwidth) / time_us"
    )
    print(format_table(rows, TABLE_COLUMNS, markdown))
    if profiles:
        print()
        print(
            "# B = 1 profile: entry = public function, class = sampler call, stages = median of "
            "each stage alone (intake = padded_chain, id_check = first_invalid_id, uniforms = "
            "RejectionUniforms + snapshot + draw, output_block, kernel = verify_chains, finish = "
            "status check + result), overhead = entry - kernel, unstaged = entry - sum(stages)"
        )
        print(format_table(profiles, PROFILE_COLUMNS, markdown))
    gains = [
        row
        for row in rows
        if row["backend"] == "numpy"
        and row.get("x_tokenwise_length") is not None
        and row["verifier"] != TOKENWISE
    ]
    if gains:
        gains = sorted(
            gains,
            key=lambda r: (REGIMES.index(r["regime"]), r["verifier"], r["B"], r["k"], r["V"]),
        )
        print()
        print(
            f"# accepted-length gain over token-wise {TOKENWISE} (paired: "
            f"{gains[0]['paired_draws']} rounds per cell, each with fresh draft ids drawn from "
            "draft_probs and fresh explicit uniforms, the same for both verifiers; mean_len = "
            "mean accepted prefix per row; gain = mean paired difference, gain_se its standard "
            "error; roofline_best = roofline on the fastest call)"
        )
        print(format_table(gains, GAIN_COLUMNS, markdown))
        for regime in REGIMES:
            for name in dict.fromkeys(r["verifier"] for r in gains):
                ratios = [
                    r["x_tokenwise_length"]
                    for r in gains
                    if r["regime"] == regime and r["verifier"] == name
                ]
                if ratios:
                    print(
                        f"# {name} / {TOKENWISE}, {regime}: mean ratio {np.mean(ratios):.3f} "
                        f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} cells"
                    )
    if any(row.get("torch_us") is not None for row in rows):
        for best in (False, True):
            missed = missed_targets(rows, best=best)
            timings = "fastest call vs fastest call" if best else "medians"
            print()
            print(f"# targets missed ({timings}): {len(missed)}")
            for line in missed:
                print(f"#   {line}")
    print(f"# elapsed: {meta['elapsed_s']} s")


def render(path: str, args: argparse.Namespace) -> int:
    """Print (and plot) the results of an earlier ``--json`` file without measuring."""
    records = harness.read_jsonl(path)
    meta = next(r for r in records if r["kind"] == "meta")

    def selected(record: dict) -> bool:
        # The grid options select rows of the saved run (all of them when not given).
        return (
            (args.batch is None or record["B"] in args.batch)
            and (args.k is None or record["k"] in args.k)
            and (args.vocab is None or record["V"] in args.vocab)
            and record["verifier"] in args.verifiers
            and record["regime"] in args.regimes
        )

    rows = [r for r in records if r["kind"] == "cell" and selected(r)]
    profiles = [r for r in records if r["kind"] == "profile" and selected(r)]
    report(meta, rows, profiles, args.markdown)
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark specdec_np's verifiers against the array-API reference, torch "
        "implementations of vLLM v0's algorithms and the memory roofline."
    )
    parser.add_argument("--batch", type=int, nargs="+", help=f"batch sizes (default {FULL_BATCH})")
    parser.add_argument("--k", type=int, nargs="+", help=f"draft lengths (default {FULL_K})")
    parser.add_argument(
        "--vocab", type=int, nargs="+", help=f"vocabulary sizes (default {FULL_VOCAB})"
    )
    parser.add_argument(
        "--verifiers",
        nargs="+",
        choices=VERIFIER_NAMES,
        default=list(VERIFIER_NAMES),
        help="registry names (default: every verifier of specdec_np.registry)",
    )
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32",
        help="dtype of the probability rows (float64: the float32 rows widened)",
    )  # fmt: skip
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=("numpy", "cupy"),
        default=["numpy", "cupy"],
        help="cupy is used only when cupy.is_available()",
    )
    parser.add_argument(
        "--repeats", type=int, help="at most this many timed calls per measurement"
    )
    parser.add_argument(
        "--min-repeats",
        type=int,
        help="at least this many timed calls per measurement (on a noisy machine)",
    )
    parser.add_argument(
        "--paired-draws",
        type=int,
        help="rounds of shared explicit uniforms for the accepted-length comparison of the "
        "stochastic verifiers (default 200, quick 5; 0 skips it)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny grid for smoke tests: B {QUICK_BATCH}, k {QUICK_K}, V {QUICK_VOCAB}, 1 repeat",
    )
    parser.add_argument(
        "--skip-reference", action="store_true", help="do not time the array-API reference"
    )
    parser.add_argument(
        "--skip-torch", action="store_true", help="do not time the torch baselines"
    )
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the B = 1 kernel-vs-overhead profile",
    )
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument(
        "--flat-draft-scale",
        type=float,
        default=4.0,
        help="scale of the flat regime's draft logits (default 4: a confident, unrelated "
        "drafter, so nearly every draft is rejected; 1 accepts ~48%%)",
    )
    parser.add_argument(
        "--bandwidth-mib", type=int, help="size of the bandwidth probe (default 1024, quick 64)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write JSON lines (meta, cells, profiles)")
    parser.add_argument("--plot", metavar="FILE.png", help="plot time vs V (needs matplotlib)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument(
        "--render",
        metavar="FILE",
        help="print (and --plot) an earlier --json file, restricted by the grid options; "
        "measure nothing",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the options of the run as JSON and exit, measuring nothing",
    )
    args = parser.parse_args(argv)
    if args.render:
        return args  # the grid options only select rows of the saved run
    if args.quick:
        args.batch = args.batch or list(QUICK_BATCH)
        args.k = args.k or list(QUICK_K)
        args.vocab = args.vocab or list(QUICK_VOCAB)
        args.repeats = args.repeats or 1
        args.bandwidth_mib = args.bandwidth_mib or 64
        args.paired_draws = 5 if args.paired_draws is None else args.paired_draws
    args.batch = args.batch or list(FULL_BATCH)
    args.k = args.k or list(FULL_K)
    args.vocab = args.vocab or list(FULL_VOCAB)
    args.bandwidth_mib = args.bandwidth_mib or 1024
    args.paired_draws = 200 if args.paired_draws is None else args.paired_draws
    for name in ("batch", "k", "vocab"):
        if any(value < 1 for value in getattr(args, name)):
            parser.error(f"--{name} values must be positive")
    for name in ("repeats", "min_repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.paired_draws < 0:
        parser.error("--paired-draws must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args)
    if args.dry_run:
        print(json.dumps(vars(args)))
        return 0
    started = time.perf_counter()
    tb, torch_note = harness.load_torch_baseline(
        "torch_baselines", args.torch_threads, skip=args.skip_torch, what="torch baselines"
    )
    cupy = load_cupy(args)
    log(f"measuring streaming read bandwidth over {args.bandwidth_mib} MiB ...")
    meta: dict[str, Any] = {
        **harness.run_metadata(),
        # The kernels' thread count follows OpenMP's (OMP_NUM_THREADS), capped at B.
        "openmp_max_threads": _core.openmp_max_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch_note,
        "cupy": None if cupy is None else cupy.__version__,
        "bandwidth": harness.measure_bandwidth(args.bandwidth_mib << 20),
    }
    if cupy is not None:
        meta["cuda_bandwidth_gb_per_s"] = harness.measure_cuda_bandwidth(
            cupy, args.bandwidth_mib << 20
        )
    bw = meta["bandwidth"]
    log(f"bandwidth: {bw['bandwidth_gb_per_s']:.2f} GB/s ({bw['best']}); all: {bw['gb_per_s']}")
    if bw["loadavg"] and bw["loadavg"][0] > 1.5 * (os.cpu_count() or 1):
        log(
            f"WARNING: load average {bw['loadavg']} on {os.cpu_count()} CPUs: "
            "timings will be noisy"
        )
    rows: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    cells = [
        (g, v, b, k) for g in args.regimes for v in args.vocab for b in args.batch for k in args.k
    ]
    for index, (regime, vocab, batch, k) in enumerate(cells, 1):
        cell_start = time.perf_counter()
        cell = make_cell(
            regime, batch, k, vocab, seed=args.seed, flat_draft_scale=args.flat_draft_scale
        )
        if args.dtype != "float32":
            # The same float32 rows widened: both dtypes verify the same draws.
            cell.target = cell.target.astype(args.dtype)
            cell.draft_probs = cell.draft_probs.astype(args.dtype)
        cell_rows, cell_profiles = run_cell(cell, args, tb, cupy)
        rows += cell_rows
        profiles += cell_profiles
        del cell
        gc.collect()
        summary = ", ".join(
            f"{r['verifier']}/{r['backend']} {r['time_us']:.1f}us" for r in cell_rows
        )
        log(
            f"[{index}/{len(cells)}] {regime} B={batch} k={k} V={vocab}: {summary} "
            f"({time.perf_counter() - cell_start:.1f}s)"
        )
    log("measuring streaming read bandwidth again ...")
    meta["bandwidth_end"] = harness.measure_bandwidth(args.bandwidth_mib << 20)
    meta["uptime_end"] = harness.uptime()
    # The larger of the two medians: never flatters the roofline fraction.
    bandwidth = max(
        meta["bandwidth"]["bandwidth_gb_per_s"], meta["bandwidth_end"]["bandwidth_gb_per_s"]
    )
    meta["roofline_bandwidth_gb_per_s"] = bandwidth
    for row in rows:
        row_bandwidth = bandwidth if row["backend"] == "numpy" else meta["cuda_bandwidth_gb_per_s"]
        row["roofline"] = (
            None
            if row["bytes"] is None
            else (row["bytes"] / row_bandwidth) / (row["time_us"] * 1e3)
        )
        # On the fastest call: what the code reaches when the OS does not preempt it.
        row["roofline_best"] = (
            None
            if row["bytes"] is None or not row.get("min_us")
            else (row["bytes"] / row_bandwidth) / (row["min_us"] * 1e3)
        )
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)

    report(meta, rows, profiles, args.markdown)
    if args.json:
        records = [
            meta,
            *({"kind": "cell", **r} for r in rows),
            *({"kind": "profile", **p} for p in profiles),
        ]
        harness.write_jsonl(args.json, records, append=False)
        log(f"JSON lines written to {args.json}")
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
