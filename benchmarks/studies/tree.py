#!/usr/bin/env python
"""Benchmark of tree verification ``specdec_np.verify_tree`` (CPU), every method of the registry.

Each request verifies an EAGLE-like tree of ``n`` nodes
(``specdec_np.best_first_tree``, the shape of ``specdec-np demo --tree``:
best-first growth with up to three children per node, so the top-ranked branch is deep and
the first levels are wide), at batch ``B`` and vocabulary ``V``, from logits (temperature
1) and from probabilities.  Every method of ``specdec_np.registry.TREE_METHODS`` is timed
on the same target rows; each method's draft tokens are drawn as its ``drafting`` says
(fixed: the top-ranked tokens of the draft row; independent: i.i.d. from it; without
replacement: from it without replacement).  Baselines measured in the same run:

* ``torch``: SGLang's target-only tree verification written in torch
  (``benchmarks/studies/torch_tree.py``): the softmax (or argmax) of **every** one of the ``N + B``
  rows, then the walk.  It has the semantics of ``point_mass`` (and ``greedy``) and is timed
  once per cell on the fixed tokens; every method's ``x_torch`` is that time over the
  method's own: the cost an engine pays today to verify the tree;
* ``reference``: ``specdec_np._reference.trees.verify_tree_requests`` where the cell is
  small (``--reference-elements``), checked equal to the kernel on the same uniforms;
* the roofline: :func:`walked_bytes` (the rows on the walked path) over the streaming read
  bandwidth of ``benchmarks/studies/run.py``'s probe, at the start and the end of the run (the
  larger is used).

Every call gets the same explicit uniforms (drawn before the clock), so each timed call has
the same outcome.  ``mean_len`` is the mean accepted length per request over ``--draws``
rounds of fresh uniforms on the same tokens.

Run it single-threaded (the kernels' OpenMP and torch get one thread)::

    OMP_NUM_THREADS=1 python benchmarks/studies/tree.py --json tree_cpu.jsonl
    python benchmarks/studies/tree.py --quick            # tiny grid (the smoke test)
    python benchmarks/studies/tree.py --render FILE.jsonl --markdown  # reprint a saved run
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
from specdec_np import (
    best_first_tree,  # noqa: E402
    registry,  # noqa: E402
)
from specdec_np._layouts import tree as _trees  # noqa: E402
from specdec_np._reference import trees as _tree_reference  # noqa: E402

METHODS = registry.TREE_METHODS
METHOD_NAMES = tuple(method.name for method in METHODS)
REGIMES = ("flat", "realistic")
FORMS = ("logits", "probs")
FULL_BATCH = (1, 8, 64)
FULL_NODES = (8, 16, 32, 64)
FULL_VOCAB = (32000, 128256)
QUICK_BATCH = (1, 3)
QUICK_NODES = (6,)
QUICK_VOCAB = (500,)
FLOAT_BYTES = 4
ID_BYTES = 8
UNIFORM_BYTES = 8

ROOFLINE_TARGET = 0.5
ROOFLINE_MIN_BATCH = 8

SPECDEC_POLICY = harness.Policy(budget_s=0.25, min_repeats=5, max_repeats=200)
TORCH_POLICY = harness.Policy(
    budget_s=1.0, min_repeats=1, max_repeats=20, max_warmups=1, first_call_counts=True
)
REFERENCE_POLICY = harness.Policy(
    budget_s=0.5, min_repeats=1, max_repeats=3, max_warmups=0, first_call_counts=True
)

COLUMNS = (
    "method", "form", "regime", "B", "nodes", "depth", "V", "time_us", "best_us", "torch_us",
    "x_torch", "ref_us", "x_ref", "len", "mean_len", "rows", "MB_read", "roofline",
)  # fmt: skip


log = harness.log


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def _softmax_rows(logits: np.ndarray, out: np.ndarray | None = None, chunk: int = 256):
    """Float32 softmax of each row, ``chunk`` rows at a time (``out`` may be ``logits``)."""
    out = np.empty_like(logits) if out is None else out
    for start in range(0, logits.shape[0], chunk):
        block = logits[start : start + chunk]
        shifted = block - block.max(axis=1, keepdims=True)
        np.exp(shifted, out=shifted)
        shifted /= shifted.sum(axis=1, keepdims=True)
        out[start : start + chunk] = shifted
    return out


def _depths(parents: Sequence[int]) -> list[int]:
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


class TreeInputs:
    """One (regime, B, nodes, V) input set, shared by every method and form.

    * every request has the same shape: ``shape`` (parents of one request), by default
      :func:`best_first_tree` of ``nodes``;
    * flat: target logits standard normal; a node's draft row is ``flat_draft_scale`` x
      independent normals (a confident drafter unrelated to the target: early rejections);
    * realistic: target logits standard normal with one random top token per row raised so
      that its softmax mass is U(0.35, 0.65); a node's draft row is its parent's target row
      (the row that tests it) plus ``realistic_draft_noise`` (default 0.3) x normals (close
      to the target: deep walks);
    * siblings share one draft row (they were drafted from the same context);
    * the draft tokens of each drafting (``registry.TreeMethod.drafting``) are drawn from
      the draft rows' softmax once, at construction.
    """

    def __init__(
        self, regime: str, batch: int, nodes: int, vocab: int, *, seed: int,
        flat_draft_scale: float, shape: Sequence[int] | None = None,
        realistic_draft_noise: float = 0.3,
    ) -> None:  # fmt: skip
        rng = np.random.default_rng([seed, REGIMES.index(regime), batch, nodes, vocab])
        self.regime, self.batch, self.nodes, self.vocab = regime, batch, nodes, vocab
        self.form = "logits"
        self.shape = best_first_tree(nodes) if shape is None else [int(p) for p in shape]
        if len(self.shape) != nodes:
            raise ValueError(f"shape must have {nodes} parents; found {len(self.shape)}")
        self.depth = max(_depths(self.shape), default=0)
        self.num_nodes = np.full(batch, nodes, dtype=np.int64)
        self.tree_parents = np.tile(np.asarray(self.shape, dtype=np.int64), batch)
        total = batch * nodes
        self.target = rng.standard_normal((total + batch, vocab), dtype=np.float32)
        if regime == "realistic":
            self._raise_top_tokens(rng)
        # Global target row of each node's parent (the root row for a child of the root).
        request = np.repeat(np.arange(batch), nodes)
        local_parent = self.tree_parents
        self.parent_rows = request * (nodes + 1) + local_parent + 1
        self.draft = np.empty((total, vocab), dtype=np.float32)
        # One draft row per sibling group: the first child of each parent draws it.
        first_child = {}
        for node in range(total):
            key = int(self.parent_rows[node])
            if key in first_child:
                self.draft[node] = self.draft[first_child[key]]
                continue
            first_child[key] = node
            noise = rng.standard_normal(vocab, dtype=np.float32)
            if regime == "realistic":
                self.draft[node] = self.target[key] + np.float32(realistic_draft_noise) * noise
            else:
                self.draft[node] = np.float32(flat_draft_scale) * noise
        groups = sorted(first_child.items())  # (parent row, first child)
        self.tokens = {drafting: np.empty(total, dtype=np.int64) for drafting in _draftings()}
        group_rows = np.asarray([child for _, child in groups], dtype=np.int64)
        probs = _softmax_rows(self.draft[group_rows]).astype(np.float64)
        for (key, _), q in zip(groups, probs):
            members = np.flatnonzero(self.parent_rows == key)
            q = q / q.sum()
            for drafting in _draftings():
                self.tokens[drafting][members] = _draw_siblings(rng, q, len(members), drafting)
        self.layout = _trees.validate_tree(self.num_nodes, self.tree_parents, self.tokens["fixed"])
        self.uniforms = rng.random((batch, nodes + 1))
        self.draw_seed = int(rng.integers(2**31))

    def _raise_top_tokens(self, rng: np.random.Generator) -> None:
        rows = self.target.shape[0]
        top = rng.integers(0, self.vocab, size=rows)
        mass = rng.uniform(0.35, 0.65, size=rows)
        self.target[np.arange(rows), top] = -np.inf
        peak = np.max(self.target, axis=1)
        rest = np.log(np.exp(self.target - peak[:, None]).sum(axis=1)) + peak
        self.target[np.arange(rows), top] = (rest + np.log(mass / (1.0 - mass))).astype(np.float32)

    def to_probs(self) -> None:
        """Replace the logits by their softmax, in place (the probabilities form)."""
        _softmax_rows(self.target, out=self.target)
        _softmax_rows(self.draft, out=self.draft)
        self.form = "probs"

    def tokens_for(self, method: registry.TreeMethod) -> np.ndarray:
        return self.tokens[method.drafting or "fixed"]


def _draftings() -> tuple[str, ...]:
    return tuple(dict.fromkeys(method.drafting or "fixed" for method in METHODS))


def _draw_siblings(rng: np.random.Generator, q: np.ndarray, count: int, drafting: str):
    if drafting == "fixed":
        return np.argsort(-q, kind="stable")[:count]
    if drafting == "independent":
        return rng.choice(q.shape[0], size=count, p=q)
    if drafting == "without_replacement":
        return rng.choice(q.shape[0], size=count, p=q, replace=False)
    raise ValueError(f"unknown drafting {drafting!r}")


# --------------------------------------------------------------------------------------
# Bytes on the walked path
# --------------------------------------------------------------------------------------


def walked_rows(
    layout: Any, accepted_nodes: np.ndarray, accepted_lengths: np.ndarray, reads_draft: bool
) -> tuple[int, int, int]:
    """Rows and tests on the walked path of an outcome: ``(target rows, draft rows, tests)``.

    Per request: the root's target row and each accepted node's (the rows the walk stands
    on), the draft row of every child tested there when the method reads draft rows (the
    children before the accepted one and the accepted one; at the final node all of its
    children), and one test per tested child.
    """
    target_rows = draft_rows = tests = 0
    for b in range(layout.batch_size):
        children = layout.children(b)
        length = int(accepted_lengths[b])
        path = [int(node) for node in accepted_nodes[b, :length]]
        target_rows += 1 + length
        stood = [-1, *path]
        for level, node in enumerate(stood):
            kids = children[node + 1]
            tested = kids.index(path[level]) + 1 if level < length else len(kids)
            tests += tested
            if reads_draft:
                draft_rows += tested
    return target_rows, draft_rows, tests


def walked_bytes(
    layout: Any, accepted_nodes: np.ndarray, accepted_lengths: np.ndarray, reads_draft: bool,
    vocab: int,
) -> float:  # fmt: skip
    """Bytes the walk must read: full rows of :func:`walked_rows`, plus per test its draft id
    and uniform, plus per request the final uniform."""
    target_rows, draft_rows, tests = walked_rows(
        layout, accepted_nodes, accepted_lengths, reads_draft
    )
    rows = target_rows + draft_rows
    return float(
        rows * vocab * FLOAT_BYTES
        + tests * (ID_BYTES + UNIFORM_BYTES)
        + layout.batch_size * UNIFORM_BYTES
    )


# --------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------


def row_arguments(inputs: TreeInputs, method: registry.TreeMethod) -> dict[str, Any]:
    draft = inputs.draft if method.reads_draft_probs else None
    if inputs.form == "logits":
        return {"target_logits": inputs.target, "draft_logits": draft, "temperature": 1.0}
    return {"target_probs": inputs.target, "draft_probs": draft}


def specdec_call(inputs: TreeInputs, method: registry.TreeMethod, uniforms: np.ndarray):
    tokens = inputs.tokens_for(method)
    rows = row_arguments(inputs, method)

    def call():
        return specdec_np.verify_tree(
            num_nodes=inputs.num_nodes, tree_parents=inputs.tree_parents,
            draft_token_ids=tokens, method=method.name,
            uniforms=None if not method.stochastic else uniforms, **rows,
        )  # fmt: skip

    return call


def reference_call(inputs: TreeInputs, method: registry.TreeMethod, uniforms: np.ndarray):
    tokens = inputs.tokens_for(method)
    draft = inputs.draft if method.reads_draft_probs else None
    from_logits = inputs.form == "logits"

    def call():
        return _tree_reference.verify_tree_requests(
            inputs.num_nodes, inputs.tree_parents, tokens, inputs.target, draft,
            uniforms if method.stochastic else None, method=method.name,
            from_logits=from_logits, temperature=1.0 if from_logits else None,
        )  # fmt: skip

    return call


def torch_call(tt: Any, inputs: TreeInputs, greedy: bool):
    import torch

    tables = tt.tree_tables(inputs.layout)
    rows = torch.from_numpy(inputs.target)
    uniforms = torch.from_numpy(inputs.uniforms)
    num_nodes = torch.from_numpy(inputs.num_nodes)
    from_logits = inputs.form == "logits"

    def call():
        with torch.inference_mode():
            return tt.target_only_tree_verify(
                tables, rows, uniforms, num_nodes, from_logits=from_logits, greedy=greedy
            )

    return call


def _greedy_method() -> registry.TreeMethod:
    return next(method for method in METHODS if not method.stochastic)


def _point_mass_method() -> registry.TreeMethod:
    return next(m for m in METHODS if m.drafting == "fixed" and not m.reads_draft_probs)


def run_cell(
    inputs: TreeInputs, method: registry.TreeMethod, args: argparse.Namespace,
    baseline: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {
        "method": method.name, "form": inputs.form, "regime": inputs.regime, "B": inputs.batch,
        "nodes": inputs.nodes, "depth": inputs.depth, "V": inputs.vocab,
    }  # fmt: skip
    timing = harness.time_calls(specdec_call(inputs, method, inputs.uniforms), args.policy)
    result = timing.results[0]
    row["time_us"] = timing.median_ns / 1e3
    row["best_us"] = (timing.min_ns or timing.median_ns) / 1e3
    row["repeats"] = timing.repeats
    lengths = np.asarray(result.accepted_lengths)
    row["len"] = float(lengths.mean())
    target_rows, draft_rows, tests = walked_rows(
        inputs.layout, np.asarray(result.accepted_nodes), lengths, method.reads_draft_probs
    )
    row["rows"] = target_rows + draft_rows
    row["target_rows"], row["draft_rows"], row["tests"] = target_rows, draft_rows, tests
    nbytes = walked_bytes(
        inputs.layout, np.asarray(result.accepted_nodes), lengths, method.reads_draft_probs,
        inputs.vocab,
    )  # fmt: skip
    row["MB_read"] = nbytes / 1e6
    row["all_rows_MB"] = (inputs.target.nbytes + inputs.draft.nbytes) / 1e6
    row["roofline"] = (nbytes / args.bandwidth) / timing.median_ns
    if method.stochastic and args.draws:
        rng = np.random.default_rng(inputs.draw_seed)
        means = []
        for _ in range(args.draws):
            fresh = specdec_call(inputs, method, rng.random(inputs.uniforms.shape))()
            means.append(float(np.mean(fresh.accepted_lengths)))
        row["mean_len"] = float(np.mean(means))
    else:
        row["mean_len"] = row["len"]
    key = "greedy" if not method.stochastic else "sampled"
    torch_us = baseline.get(key)
    row["torch_us"] = torch_us
    row["x_torch"] = None if torch_us is None else torch_us * 1e3 / timing.median_ns
    row["torch_equal"] = (
        baseline.get(f"{key}_equal")
        if method in (_greedy_method(), _point_mass_method())
        else None
    )
    elements = int(inputs.target.size + inputs.draft.size)
    if args.skip_reference or elements > args.reference_elements:
        row["ref_us"] = row["x_ref"] = row["ref_equal"] = None
    else:
        reference = harness.time_calls(
            reference_call(inputs, method, inputs.uniforms), REFERENCE_POLICY
        )
        row["ref_us"] = reference.median_ns / 1e3
        row["x_ref"] = reference.median_ns / timing.median_ns
        nodes, tokens, ref_lengths = reference.results[0]
        row["ref_equal"] = bool(
            np.array_equal(np.asarray(ref_lengths), lengths)
            and np.array_equal(np.asarray(tokens), np.asarray(result.output_token_ids))
        )
    return row


def time_baseline(tt: Any, inputs: TreeInputs, args: argparse.Namespace) -> dict[str, Any]:
    """The torch target-only baseline, greedy and sampled, on the fixed tokens."""
    if tt is None:
        return {}
    out: dict[str, Any] = {}
    for key, method in (("greedy", _greedy_method()), ("sampled", _point_mass_method())):
        timing = harness.time_calls(torch_call(tt, inputs, key == "greedy"), args.torch_policy)
        out[key] = timing.median_ns / 1e3
        lengths, tokens = timing.results[0]
        ours = specdec_call(inputs, method, inputs.uniforms)()
        out[f"{key}_equal"] = bool(
            np.array_equal(lengths.numpy(), ours.accepted_lengths)
            and np.array_equal(tokens.numpy(), ours.output_token_ids)
        )
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("time_us", "best_us", "torch_us", "ref_us"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if key.startswith("x_"):
        return f"{value:.2f}" if value < 10 else f"{value:,.0f}"
    if key in ("len", "mean_len", "roofline"):
        return f"{value:.2f}"
    if key == "MB_read":
        return f"{value:.3f}" if value < 1 else f"{value:.2f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], markdown: bool) -> str:
    cells = [[_fmt(key, row.get(key)) for key in COLUMNS] for row in rows]
    return harness.render_table(COLUMNS, cells, markdown)


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The roofline target (0.5 at B >= 8), the torch speed-ups and the checks, one line
    each."""
    lines = []
    selected = [row for row in rows if row["B"] >= ROOFLINE_MIN_BATCH]
    for name in METHOD_NAMES:
        mine = [row for row in selected if row["method"] == name]
        if not mine:
            continue
        met = [row for row in mine if row["roofline"] >= ROOFLINE_TARGET]
        worst = min(mine, key=lambda row: row["roofline"])
        lines.append(
            f"roofline >= {ROOFLINE_TARGET} at B >= {ROOFLINE_MIN_BATCH}, {name}: met in "
            f"{len(met)}/{len(mine)} cells; worst {worst['roofline']:.2f} at {worst['form']} "
            f"{worst['regime']} B={worst['B']} nodes={worst['nodes']} V={worst['V']}"
        )
    speedups = [row["x_torch"] for row in rows if row.get("x_torch") is not None]
    if speedups:
        lines.append(
            f"x_torch (target-only baseline / verify_tree): min {min(speedups):.2f}, median "
            f"{float(np.median(speedups)):.1f}, max {max(speedups):.0f}"
        )
    for key in ("torch_equal", "ref_equal"):
        checked = [row for row in rows if row.get(key) is not None]
        if checked:
            bad = [row for row in checked if not row[key]]
            lines.append(f"{key}: {len(checked) - len(bad)}/{len(checked)} cells equal")
    return lines


def render(path: str, markdown: bool) -> int:
    records = harness.read_jsonl(path)
    keys = ("date", "command", "uptime_start", "uptime", "torch", "bandwidth_gb_per_s")
    harness.print_meta(records, keys)
    rows = [record for record in records if record.get("kind") == "cell"]
    print(format_table(rows, markdown))
    print("\n".join(summary(rows)))
    return 0


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+")
    parser.add_argument("--nodes", type=int, nargs="+")
    parser.add_argument("--vocab", type=int, nargs="+")
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument("--methods", nargs="+", choices=METHOD_NAMES, default=list(METHOD_NAMES))
    parser.add_argument("--quick", action="store_true", help="tiny grid (smoke test)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument(
        "--reference-elements", type=int, default=2_500_000,
        help="time the reference only where target + draft rows hold at most this many floats",
    )  # fmt: skip
    parser.add_argument("--draws", type=int, default=20, help="rounds for mean_len (0: none)")
    harness.add_run_options(parser, flat_draft_scale=3.0)
    args = parser.parse_args(argv)
    args.batch = args.batch or list(QUICK_BATCH if args.quick else FULL_BATCH)
    args.nodes = args.nodes or list(QUICK_NODES if args.quick else FULL_NODES)
    args.vocab = args.vocab or list(QUICK_VOCAB if args.quick else FULL_VOCAB)
    if args.quick:
        args.bandwidth_mib = min(args.bandwidth_mib, 16)
        args.draws = min(args.draws, 3)
        args.policy, args.torch_policy = harness.QUICK_POLICY, harness.QUICK_BASELINE_POLICY
    else:
        args.policy, args.torch_policy = SPECDEC_POLICY, TORCH_POLICY
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args.markdown)
    tt, torch_note = harness.load_torch_baseline("torch_tree", args.threads, skip=args.skip_torch)
    log(torch_note)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        log("note: OMP_NUM_THREADS is not 1; the kernels may use several OpenMP threads")
    nbytes = args.bandwidth_mib << 20
    start_bandwidth = harness.measure_bandwidth(nbytes)
    args.bandwidth = start_bandwidth["bandwidth_gb_per_s"]
    log(f"streaming read bandwidth: {args.bandwidth:.2f} GB/s ({start_bandwidth['best']})")
    meta = {
        **harness.run_metadata(),
        "cpus": os.cpu_count(),
        "torch": torch_note,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "bandwidth_start": start_bandwidth,
        "tree_shapes": {n: best_first_tree(n) for n in args.nodes},
        "bytes_model": walked_rows.__doc__.split("\n\n")[1].strip(),
    }
    methods = [method for method in METHODS if method.name in args.methods]
    rows = []
    for regime in args.regimes:
        for batch in args.batch:
            for nodes in args.nodes:
                for vocab in args.vocab:
                    inputs = TreeInputs(
                        regime, batch, nodes, vocab, seed=args.seed,
                        flat_draft_scale=args.flat_draft_scale,
                    )  # fmt: skip
                    for form in FORMS:
                        if form == "probs":
                            if "probs" not in args.forms:
                                break
                            inputs.to_probs()
                        elif form not in args.forms:
                            continue
                        baseline = time_baseline(tt, inputs, args)
                        for method in methods:
                            row = run_cell(inputs, method, args, baseline)
                            row["kind"] = "cell"
                            rows.append(row)
                            log(
                                f"{method.name:>10} {form:>6} {regime:>9} B={batch:<3} "
                                f"n={nodes:<3} V={vocab:<6} {_fmt('time_us', row['time_us']):>8}"
                                f" us  x_torch {_fmt('x_torch', row['x_torch'])}  roofline "
                                f"{_fmt('roofline', row['roofline'])}  len "
                                f"{_fmt('mean_len', row['mean_len'])}"
                            )
                    del inputs
    args.bandwidth = harness.finish_roofline(meta, rows, nbytes, 2, args.bandwidth)
    print(format_table(rows, args.markdown))
    lines = summary(rows)
    print("\n".join(lines))
    meta["summary"] = lines
    if args.json:
        harness.write_jsonl(args.json, (meta, *rows), append=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
