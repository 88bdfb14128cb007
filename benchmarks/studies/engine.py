#!/usr/bin/env python
"""Benchmark of the engine entry point ``specdec_np.verify_ragged`` from logits (CPU).

The flat batch of an engine: request ``b`` has ``k_b`` drafts drawn from ``0 .. k``, target
logits ``[T + B, V]`` and draft logits ``[T, V]`` (float32), per-request temperature
(``0`` = greedy, a share of the requests), optionally top-k 50 and top-p 0.95, and the
bonus token drawn by the verifier (``bonus_token_ids=None``).  Each cell is timed against
baselines measured in the same run:

* ``torch``: vLLM v1's rejection sampler on the flat layout, written from its description
  in ``benchmarks/studies/torch_baselines.py`` (``v1_rejection_sample_flat``): softmax of
  every row, top-k/top-p by sorting every row, a ``[B, V]`` exponential race for the
  recovered token of every position and for the bonus, greedy requests by the argmax of
  the raw logits;
* ``padded``: what a user does today: a NumPy softmax (with temperature, top-k and top-p
  masking, top-p by sorting) of every row, the bonus drawn from every processed bonus row,
  then ``specdec_np.rejection_sample`` / ``greedy_sample`` on padded ``[n, k_b + 1, V]``
  blocks of the requests with the same ``k_b``;
* ``reference``: the array-API reference, where ``specdec_np._reference.ragged`` has a
  function for
  the ragged layout (it has none yet: skipped with a note);
* ``argmax``: a plain ``np.argmax`` over the target rows the greedy requests must read
  (gathered before the clock starts), the bar of the greedy target;
* the roofline: :func:`must_read_bytes` over the streaming read bandwidth of one thread,
  measured at the start and the end of the same run.

Run it single-threaded on a loaded machine (the engine's OpenMP, NumPy and torch all get
one thread)::

    OMP_NUM_THREADS=1 python benchmarks/studies/engine.py --json engine.jsonl
    python benchmarks/studies/engine.py --quick            # tiny grid (the smoke test)
    python benchmarks/studies/engine.py --render FILE.jsonl  # reprint a saved run
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (timing, bandwidth, metadata, JSON lines, tables)

import specdec_np  # noqa: E402
from specdec_np._reference import ragged as _reference  # noqa: E402

REGIMES = ("flat", "realistic")
FULL_BATCH = (1, 8, 64)
FULL_K = (1, 4, 8)
FULL_VOCAB = (32000, 128256)
FULL_GREEDY = (0.0, 0.5, 1.0)
QUICK_BATCH = (1, 4)
QUICK_K = (2,)
QUICK_VOCAB = (1000,)
FILTERS = {"off": (None, None), "k50_p0.95": (50, 0.95)}
FLOAT_BYTES = 4
#: The name ``_reference`` would give a ragged-layout function (none exists yet).
REFERENCE_RAGGED = "verify_ragged"

# The targets of the engine layout from logits (single thread): a roofline of at least 0.5
# at B >= 8, and sampled requests at least 20x vLLM v1's sampler in torch at B = 64.
ROOFLINE_TARGET = 0.5
ROOFLINE_MIN_BATCH = 8
TORCH_TARGET = 20.0
TORCH_TARGET_BATCH = 64

ENGINE_POLICY = harness.Policy(budget_s=0.3, min_repeats=5, max_repeats=100)
BASELINE_POLICY = harness.Policy(
    budget_s=0.6, min_repeats=1, max_repeats=7, max_warmups=1, first_call_counts=True
)
ARGMAX_POLICY = harness.Policy(budget_s=0.1, min_repeats=5, max_repeats=100)

COLUMNS = (
    "regime", "B", "k", "V", "filters", "greedy", "T", "acc", "time_us", "torch_us",
    "x_torch", "padded_us", "x_padded", "ref_us", "x_ref", "argmax_us", "x_argmax",
    "MB_read", "roofline", "ns_el",
)  # fmt: skip


log = harness.log


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


class Inputs:
    """One (regime, B, k, V) input set, shared by every filter and greedy share.

    * ``num_draft_tokens`` ``k_b`` uniform on ``0 .. k``;
    * flat: target logits standard normal; draft logits ``flat_draft_scale`` x independent
      normals (a confident drafter unrelated to the target: nearly every draft rejected);
    * realistic: target logits standard normal with one random top token per row raised so
      that its softmax mass is U(0.35, 0.65); draft logits = target logits + 0.3 x normals
      (close to the target: most drafts accepted);
    * sampled requests' drafts are drawn from their processed draft row (the filters of
      the cell), greedy requests' drafts are the argmax of their draft row.
    """

    def __init__(
        self, regime: str, batch: int, k: int, vocab: int, *, seed: int, flat_draft_scale: float
    ) -> None:
        rng = np.random.default_rng([seed, REGIMES.index(regime), batch, k, vocab])
        self.regime, self.batch, self.k, self.vocab = regime, batch, k, vocab
        self.counts = rng.integers(0, k + 1, size=batch).astype(np.int64)
        num_drafts = int(self.counts.sum())
        self.num_drafts = num_drafts
        self.target = rng.standard_normal((num_drafts + batch, vocab), dtype=np.float32)
        self.draft = np.empty((num_drafts, vocab), dtype=np.float32)
        self.starts = np.cumsum(self.counts + 1) - (self.counts + 1)
        self.draft_starts = np.cumsum(self.counts) - self.counts
        # Target row of each draft position.
        request_of_draft = np.repeat(np.arange(batch), self.counts)
        self.request_of_draft = request_of_draft
        self.draft_rows = (
            self.starts[request_of_draft]
            + np.arange(num_drafts)
            - self.draft_starts[request_of_draft]
        )
        if regime == "flat":
            self.draft[:] = rng.standard_normal(self.draft.shape, dtype=np.float32)
            self.draft *= np.float32(flat_draft_scale)
        else:
            rows = np.arange(len(self.target))
            top = rng.integers(0, vocab, size=len(self.target))
            self.target[rows, top] = -np.inf
            tail = np.log(np.exp(self.target.astype(np.float64)).sum(axis=1))
            mass = rng.uniform(0.35, 0.65, size=len(self.target))
            self.target[rows, top] = (tail + np.log(mass / (1 - mass))).astype(np.float32)
            self.draft[:] = self.target[self.draft_rows]
            self.draft += np.float32(0.3) * rng.standard_normal(self.draft.shape, dtype=np.float32)
        self._rng = rng
        self._ids: dict[tuple[str, float], np.ndarray] = {}

    def greedy_mask(self, share: float) -> np.ndarray:
        """The first ``floor(share * B)`` requests of a fixed permutation are greedy."""
        order = np.random.default_rng([self.batch, 7]).permutation(self.batch)
        mask = np.zeros(self.batch, dtype=bool)
        mask[order[: int(share * self.batch)]] = True
        return mask

    def draft_ids(self, filters: str, share: float) -> np.ndarray:
        """Draft ids: drawn from the processed draft row (sampled requests), its argmax
        (greedy requests)."""
        key = (filters, share)
        if key not in self._ids:
            top_k, top_p = FILTERS[filters]
            greedy = self.greedy_mask(share)[self.request_of_draft]
            ids = np.empty(self.num_drafts, dtype=np.int64)
            for j in range(self.num_drafts):
                row = self.draft[j]
                if greedy[j]:
                    ids[j] = int(np.argmax(row))
                    continue
                candidates = (
                    np.arange(self.vocab)
                    if top_k is None
                    else np.argpartition(row, -top_k)[-top_k:]
                )
                weights = np.exp(row[candidates].astype(np.float64) - row[candidates].max())
                if top_p is not None:
                    order = np.argsort(-weights, kind="stable")
                    mass = np.cumsum(weights[order]) / weights.sum()
                    keep = order[: int(np.searchsorted(mass, top_p)) + 1]
                    candidates, weights = candidates[keep], weights[keep]
                ids[j] = candidates[self._rng.choice(len(weights), p=weights / weights.sum())]
            self._ids[key] = ids
        return self._ids[key]


def sampling_arrays(inputs: Inputs, filters: str, share: float) -> dict[str, Any]:
    """Per-request temperature (0 greedy, 1 sampled), top-k and top-p (None when off)."""
    greedy = inputs.greedy_mask(share)
    top_k, top_p = FILTERS[filters]
    return {
        "temperature": np.where(greedy, 0.0, 1.0),
        "top_k": None if top_k is None else np.full(inputs.batch, top_k, dtype=np.int64),
        "top_p": None if top_p is None else np.full(inputs.batch, top_p, dtype=np.float64),
    }


# --------------------------------------------------------------------------------------
# The bytes that must be read
# --------------------------------------------------------------------------------------


def must_read_rows(
    counts: np.ndarray, accepted_lengths: np.ndarray, greedy: np.ndarray
) -> tuple[int, int]:
    """(target rows, draft rows) a verifier must read for one outcome.

    Request ``b`` with ``k_b`` drafts and ``a_b`` accepted must read its target rows up to
    and including its first rejection, or its ``k_b`` draft positions and its bonus row when
    every draft was accepted: ``a_b + 1`` target rows either way (the bonus is drawn from,
    or for a greedy request is the argmax of, the bonus row).  A sampled request also
    reads the draft row of each of those positions that has a draft, ``min(a_b + 1,
    k_b)`` rows (``q(x)`` from logits needs the row's normaliser; the residual needs the
    row); a greedy request reads no draft row.
    """
    accepted_lengths = np.asarray(accepted_lengths, dtype=np.int64)
    target_rows = int(np.sum(accepted_lengths + 1))
    draft_rows = int(np.sum(np.where(greedy, 0, np.minimum(accepted_lengths + 1, counts))))
    return target_rows, draft_rows


def must_read_bytes(
    counts: np.ndarray, accepted_lengths: np.ndarray, greedy: np.ndarray, vocab: int
) -> int:
    """``(target rows + draft rows) * V * 4`` of :func:`must_read_rows` (float32 rows; the
    per-request scalars, ids and uniforms, under 0.1 % of it, are not counted)."""
    target_rows, draft_rows = must_read_rows(counts, accepted_lengths, greedy)
    return (target_rows + draft_rows) * vocab * FLOAT_BYTES


# --------------------------------------------------------------------------------------
# The calls
# --------------------------------------------------------------------------------------


def engine_call(inputs: Inputs, ids: np.ndarray, sampling: dict[str, Any], seed: int) -> Any:
    """``specdec_np.verify_ragged`` with one generator that every call advances (as an
    engine's verifier would)."""
    generator = np.random.default_rng(seed)
    counts, target, draft = inputs.counts, inputs.target, inputs.draft
    return lambda: specdec_np.verify_ragged(
        num_draft_tokens=counts,
        draft_token_ids=ids,
        target_logits=target,
        draft_logits=draft,
        generator=generator,
        **sampling,
    )


def torch_call(tb: Any, inputs: Inputs, ids: np.ndarray, sampling: dict[str, Any], seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    counts, ids_t, target, draft = (
        torch.from_numpy(array) for array in (inputs.counts, ids, inputs.target, inputs.draft)
    )
    temperature = torch.from_numpy(sampling["temperature"].astype(np.float32))
    top_k = None if sampling["top_k"] is None else torch.from_numpy(sampling["top_k"])
    top_p = (
        None
        if sampling["top_p"] is None
        else torch.from_numpy(sampling["top_p"].astype(np.float32))
    )
    return lambda: tb.v1_rejection_sample_flat(
        counts, ids_t, target, draft, temperature, top_k, top_p, generator=generator
    )


def numpy_process_rows(
    logits: np.ndarray, temperature: np.ndarray, top_k: int | None, top_p: float | None
) -> np.ndarray:
    """What a user writes today: softmax with temperature, top-k by partition, top-p by
    sorting, in NumPy, every row (float32 out)."""
    out = np.empty_like(logits)
    for start in range(0, len(logits), 32):
        z = logits[start : start + 32] / temperature[start : start + 32, None].astype(np.float32)
        if top_k is not None:
            kth = np.partition(z, -top_k, axis=1)[:, -top_k, None]
            z[z < kth] = -np.inf
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        if top_p is not None:
            order = np.argsort(-z, axis=1)
            mass = np.cumsum(np.take_along_axis(z, order, axis=1), axis=1)
            # Drop a token once the mass before it reaches top_p.
            drop = (mass - np.take_along_axis(z, order, axis=1)) >= top_p
            np.put_along_axis(
                z, order, np.where(drop, 0, np.take_along_axis(z, order, axis=1)), axis=1
            )
            z /= z.sum(axis=1, keepdims=True)
        out[start : start + 32] = z
    return out


def padded_call(inputs: Inputs, ids: np.ndarray, sampling: dict[str, Any], seed: int):
    """NumPy processing of every row, then the padded entry points group by group."""
    generator = np.random.default_rng(seed)
    top_k = None if sampling["top_k"] is None else int(sampling["top_k"][0])
    top_p = None if sampling["top_p"] is None else float(sampling["top_p"][0])
    temperature = sampling["temperature"]
    greedy = temperature == 0
    counts, batch = inputs.counts, inputs.batch
    row_request = np.repeat(np.arange(batch), counts + 1)
    draft_request = inputs.request_of_draft
    groups = [
        (np.flatnonzero((counts == k_b) & (greedy == g)), k_b, g)
        for k_b in range(inputs.k + 1)
        for g in (False, True)
    ]
    groups = [group for group in groups if len(group[0])]
    width = int(counts.max()) + 1 if batch else 1

    def call() -> np.ndarray:
        row_temperature = np.where(greedy, 1.0, temperature)
        row_k = None if greedy.all() else top_k
        row_p = None if greedy.all() else top_p
        # Greedy rows get a plain softmax, sampled rows the filters.
        target = numpy_process_rows(inputs.target, row_temperature[row_request], row_k, row_p)
        draft = numpy_process_rows(inputs.draft, row_temperature[draft_request], row_k, row_p)
        if greedy.any() and not greedy.all():
            plain_rows = greedy[row_request]
            target[plain_rows] = numpy_process_rows(
                inputs.target[plain_rows], np.ones(int(plain_rows.sum())), None, None
            )
        bonus_rows = inputs.starts + counts
        bonus = np.empty(batch, dtype=np.int64)
        cdf = np.cumsum(target[bonus_rows], axis=1, dtype=np.float64)
        draws = generator.random(batch) * cdf[:, -1]
        for b in range(batch):
            bonus[b] = (
                int(np.argmax(target[bonus_rows[b]]))
                if greedy[b]
                else min(int(np.searchsorted(cdf[b], draws[b], side="right")), inputs.vocab - 1)
            )
        output = np.full((batch, width), -1, dtype=np.int64)
        for members, k_b, is_greedy in groups:
            if k_b == 0:
                output[members, 0] = bonus[members]
                continue
            rows = inputs.starts[members, None] + np.arange(k_b + 1)
            block = target[rows]
            draft_rows = inputs.draft_starts[members, None] + np.arange(k_b)
            draft_ids = ids[draft_rows]
            if is_greedy:
                result = specdec_np.greedy_sample(block, bonus[members, None], draft_ids)
            else:
                result = specdec_np.rejection_sample(
                    block, bonus[members, None], draft[draft_rows], draft_ids, generator=generator
                )
            output[members, : k_b + 1] = result.output_token_ids
        return output

    return call


def argmax_call(inputs: Inputs, accepted_lengths: np.ndarray, greedy: np.ndarray):
    """``np.argmax`` over the target rows the greedy requests must read (gathered into one
    contiguous array before the clock starts); None without greedy requests."""
    rows = [
        inputs.starts[b] + np.arange(int(accepted_lengths[b]) + 1) for b in np.flatnonzero(greedy)
    ]
    if not rows:
        return None
    gathered = np.ascontiguousarray(inputs.target[np.concatenate(rows)])
    return lambda: np.argmax(gathered, axis=1)


# --------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------


def run_cell(
    inputs: Inputs, filters: str, share: float, args: argparse.Namespace, tb: Any, bandwidth: float
) -> dict[str, Any]:
    ids = inputs.draft_ids(filters, share)
    sampling = sampling_arrays(inputs, filters, share)
    greedy = inputs.greedy_mask(share)
    row: dict[str, Any] = {
        "regime": inputs.regime,
        "B": inputs.batch,
        "k": inputs.k,
        "V": inputs.vocab,
        "filters": filters,
        "greedy": share,
        "T": inputs.num_drafts,
        "num_draft_tokens": inputs.counts.tolist(),
    }
    timing = harness.time_calls(engine_call(inputs, ids, sampling, args.seed), args.engine_policy)
    lengths = [np.asarray(result.accepted_lengths) for result in timing.results]
    row["time_us"] = timing.median_ns / 1e3
    row["best_us"] = timing.min_ns / 1e3 if timing.min_ns is not None else row["time_us"]
    row["repeats"] = timing.repeats
    row["acc"] = (
        float(np.mean([lengths_.sum() for lengths_ in lengths])) / inputs.num_drafts
        if inputs.num_drafts
        else None
    )
    nbytes = float(
        np.mean([must_read_bytes(inputs.counts, a, greedy, inputs.vocab) for a in lengths])
    )
    row["MB_read"] = nbytes / 1e6
    row["roofline"] = (nbytes / bandwidth) / timing.median_ns
    row["ns_el"] = ns_per_element(row)
    if tb is not None:
        torch_timing = harness.time_calls(
            torch_call(tb, inputs, ids, sampling, args.seed), args.baseline_policy
        )
        row["torch_us"] = torch_timing.median_ns / 1e3
        row["torch_repeats"] = torch_timing.repeats
        row["x_torch"] = torch_timing.median_ns / timing.median_ns
    else:
        row["torch_us"] = row["x_torch"] = None
    if args.skip_padded:
        row["padded_us"] = row["x_padded"] = None
    else:
        padded_timing = harness.time_calls(
            padded_call(inputs, ids, sampling, args.seed), args.baseline_policy
        )
        row["padded_us"] = padded_timing.median_ns / 1e3
        row["padded_repeats"] = padded_timing.repeats
        row["x_padded"] = padded_timing.median_ns / timing.median_ns
    # No ragged adapter in _reference yet (see REFERENCE_RAGGED): the column stays empty.
    row["ref_us"] = row["x_ref"] = None
    argmax = argmax_call(inputs, lengths[len(lengths) // 2], greedy)
    if argmax is None:
        row["argmax_us"] = row["x_argmax"] = None
    else:
        argmax_timing = harness.time_calls(argmax, ARGMAX_POLICY)
        row["argmax_us"] = argmax_timing.median_ns / 1e3
        row["x_argmax"] = argmax_timing.median_ns / timing.median_ns
    return row


def grid(args: argparse.Namespace):
    for regime in args.regimes:
        for batch in args.batch:
            for k in args.k:
                for vocab in args.vocab:
                    cells = [
                        (filters, share)
                        for share in args.greedy
                        for filters in args.filters
                        # Filters do not apply to greedy requests: one all-greedy cell.
                        if not (share == 1.0 and filters != args.filters[0])
                        # floor(0.5 * 1) = 0: the B = 1 half-greedy cell is the share-0 one.
                        and not (0 < share < 1 and int(share * batch) == 0)
                    ]
                    yield regime, batch, k, vocab, cells


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def ns_per_element(row: dict[str, Any]) -> float | None:
    """Median time per float the call must read (``ns_el``); streaming at the measured
    bandwidth costs ``4 / GB/s`` ns per float, so the ratio of the two is the roofline."""
    if not row.get("MB_read"):
        return None
    return row["time_us"] * 1e3 / (row["MB_read"] * 1e6 / FLOAT_BYTES)


def _value(row: dict[str, Any], key: str) -> Any:
    return ns_per_element(row) if key == "ns_el" else row.get(key)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("time_us", "torch_us", "padded_us", "ref_us", "argmax_us"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if key.startswith("x_"):
        return f"{value:.2f}" if value < 10 else f"{value:.0f}"
    if key in ("acc", "roofline", "ns_el"):
        return f"{value:.2f}"
    if key == "MB_read":
        return f"{value:.2f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], markdown: bool) -> str:
    cells = [[_fmt(key, _value(row, key)) for key in COLUMNS] for row in rows]
    return harness.render_table(COLUMNS, cells, markdown, align="none")


def targets(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The engine layout's targets, each with the cells that meet it and the worst cell."""
    report = []

    def line(name: str, selected: list[dict[str, Any]], key: str, bar: float) -> None:
        values = [row for row in selected if row.get(key) is not None]
        if not values:
            report.append(f"{name}: no cell measured")
            return
        met = [row for row in values if row[key] >= bar]
        worst = min(values, key=lambda row: row[key])
        report.append(
            f"{name}: {'MET' if len(met) == len(values) else 'MISSED'}, met in "
            f"{len(met)}/{len(values)} cells; worst {worst[key]:.2f} at "
            f"{worst['regime']} B={worst['B']} k={worst['k']} V={worst['V']} "
            f"{worst['filters']} greedy={worst['greedy']}"
        )

    line(
        f"roofline >= {ROOFLINE_TARGET} at B >= {ROOFLINE_MIN_BATCH}",
        [row for row in rows if row["B"] >= ROOFLINE_MIN_BATCH],
        "roofline",
        ROOFLINE_TARGET,
    )
    line(
        "greedy (all-greedy cells) at least as fast as np.argmax of its rows",
        [row for row in rows if row["greedy"] == 1.0],
        "x_argmax",
        1.0,
    )
    line(
        f"sampled (greedy share 0) >= {TORCH_TARGET}x torch v1 at B = {TORCH_TARGET_BATCH}",
        [row for row in rows if row["greedy"] == 0.0 and row["B"] == TORCH_TARGET_BATCH],
        "x_torch",
        TORCH_TARGET,
    )
    line(
        "never slower than torch v1 (cells with sampled requests)",
        [row for row in rows if row["greedy"] < 1.0],
        "x_torch",
        1.0,
    )
    return report


def render(path: str, markdown: bool) -> int:
    records = harness.read_jsonl(path)
    rows = [record for record in records if record.get("kind") == "cell"]
    keys = ("date", "uptime_start", "uptime", "torch", "reference", "bandwidth_gb_per_s")
    harness.print_meta(records, keys)
    print(format_table(rows, markdown))
    print("\n".join(targets(rows)))
    return 0


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+")
    parser.add_argument("--k", type=int, nargs="+")
    parser.add_argument("--vocab", type=int, nargs="+")
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--filters", nargs="+", choices=tuple(FILTERS), default=list(FILTERS))
    parser.add_argument("--greedy", type=float, nargs="+", default=list(FULL_GREEDY))
    parser.add_argument("--quick", action="store_true", help="tiny grid (smoke test)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-padded", action="store_true")
    harness.add_run_options(parser, flat_draft_scale=3.0)
    args = parser.parse_args(argv)
    args.batch = args.batch or list(QUICK_BATCH if args.quick else FULL_BATCH)
    args.k = args.k or list(QUICK_K if args.quick else FULL_K)
    args.vocab = args.vocab or list(QUICK_VOCAB if args.quick else FULL_VOCAB)
    if args.quick:
        args.bandwidth_mib = min(args.bandwidth_mib, 16)
        args.engine_policy, args.baseline_policy = (
            harness.QUICK_POLICY,
            harness.QUICK_BASELINE_POLICY,
        )
    else:
        args.engine_policy, args.baseline_policy = ENGINE_POLICY, BASELINE_POLICY
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args.markdown)
    tb, torch_note = harness.load_torch_baseline(
        "torch_baselines", args.threads, skip=args.skip_torch
    )
    log(torch_note)
    reference_note = (
        "reference: run"
        if hasattr(_reference, REFERENCE_RAGGED)
        else "reference skipped: specdec_np._reference.ragged has no ragged adapter "
        f"({REFERENCE_RAGGED})"
    )
    log(reference_note)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        log("note: OMP_NUM_THREADS is not 1; the engine may use several OpenMP threads")
    nbytes = args.bandwidth_mib << 20
    start_bandwidth = harness.measure_bandwidth(nbytes, threads=1)
    bandwidth = start_bandwidth["bandwidth_gb_per_s"]
    log(f"streaming read bandwidth (1 thread): {bandwidth:.2f} GB/s")
    meta = {
        **harness.run_metadata(),
        "torch": torch_note,
        "reference": reference_note,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "bandwidth_start": start_bandwidth,
        "bytes_model": must_read_rows.__doc__.split("\n\n")[0].strip(),
    }
    rows = []
    for regime, batch, k, vocab, cells in grid(args):
        inputs = Inputs(
            regime, batch, k, vocab, seed=args.seed, flat_draft_scale=args.flat_draft_scale
        )
        for filters, share in cells:
            row = run_cell(inputs, filters, share, args, tb, bandwidth)
            row["kind"] = "cell"
            rows.append(row)
            log(
                f"{regime:>9} B={batch:<3} k={k} V={vocab:<6} {filters:>9} greedy={share:<4} "
                f"{_fmt('time_us', row['time_us']):>8} us  "
                f"x_torch {_fmt('x_torch', row['x_torch'])}"
                f"  x_padded {_fmt('x_padded', row['x_padded'])}  roofline "
                f"{_fmt('roofline', row['roofline'])}"
            )
        del inputs
    harness.finish_roofline(meta, rows, nbytes, 1, bandwidth)
    print(format_table(rows, args.markdown))
    report = targets(rows)
    print("\n".join(report))
    meta["targets"] = report
    if args.json:
        harness.write_jsonl(args.json, (meta, *rows), append=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
