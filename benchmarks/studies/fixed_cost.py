#!/usr/bin/env python
"""One call's fixed cost: the public engine calls at ``B = 1``, ``V = 16``, and where the
time of each goes.

At ``V = 16`` the rows cost nothing to read, so a call's time is its fixed cost: intake,
checks, the sampling table, the uniforms, the output block, dispatch and the kernel
call's own argument handling.  For each public call this script prints the median over
many calls (``--calls``), then the same calls again with a timer around each stage to say
where that time goes.  On a checkout with the ragged call's fast path
(:mod:`specdec_np._layouts.fast_path`, which every engine call here takes) the stages are
the checked sampling parameters, the compiled checks of the batch, the kernel's plan, the
output block, the draw, the kernel and the record (``EngineVerifier``'s record of a call:
its lock and the metrics' update); on an older checkout, those of
the general engine call (:mod:`specdec_np._layouts.engine_call`).  "front" is what is
left outside the stages (the public function, its decorator, its records and the fast
path's own steps).  ``sample_tokens`` on a checkout with the sampling step's lane
(``fast_path.sample_lane``) runs only the output block, the draw and the kernel after its
first call: its checks, sampling and plan stages are empty.  The stage timers read the
wall clock whatever ``--clock`` says (the
CPU clock is a system call of about a microsecond on some machines, which would swamp the
stages), so the breakdown is a wall-clock median a little above the untimed one.

Run it on one thread, against this checkout or another (``PYTHONPATH`` picks which)::

    OMP_NUM_THREADS=1 python benchmarks/studies/fixed_cost.py
    OMP_NUM_THREADS=1 python benchmarks/studies/fixed_cost.py --quick   # the smoke test
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (run metadata and tables)

import specdec_np  # noqa: E402
from specdec_np import _core  # noqa: E402
from specdec_np._kernels import dispatch as _dispatch  # noqa: E402
from specdec_np._layouts import engine_call as _engine_call  # noqa: E402
from specdec_np._layouts import ragged as _ragged  # noqa: E402
from specdec_np._layouts import sampling as _sampling  # noqa: E402
from specdec_np._runtime import uniforms as _uniforms  # noqa: E402
from specdec_np.engine import EngineVerifier  # noqa: E402

try:
    from specdec_np._layouts import fast_path as _fast  # noqa: E402
except ImportError:  # a checkout from before the fast path
    _fast = None

#: The stages of an engine call, in the order they run: the fast path's, or the general
#: engine call's on a checkout without it.
FAST_STAGES = ("sampling", "checks", "plan", "out block", "draw", "kernel", "record")
GENERAL_STAGES = ("build", "sampling", "uniforms", "out block", "options", "draw", "kernel",
                  "run other")
ENGINE_STAGES = FAST_STAGES if _fast is not None else GENERAL_STAGES
#: The stages of processed_probs.
PROCESSED_STAGES = ("sampling", "kernel")


def calls(batch: int, vocab: int) -> dict[str, Callable[[], Any]]:
    """The public calls, each with its inputs made once (seed 0): a sampled request with
    two drafts for the chain calls, one row for the others; uniforms from a generator, or
    explicit ones ("uniforms")."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    chain_logits = rng.standard_normal((3 * batch, vocab)).astype(np.float32)
    counts = np.full(batch, 2, dtype=np.int64)
    drafts = rng.integers(0, vocab, 2 * batch).astype(np.int64)
    generator = np.random.default_rng(1)
    engine = specdec_np.EngineVerifier(seed=0)
    filters = {"temperature": 0.8, "top_k": 8, "top_p": 0.9}
    # Explicit uniforms: one per row for sample_tokens, [B, max_k + 2] for a chain call.
    row_uniforms = rng.random(batch)
    chain_uniforms = rng.random((batch, 4))
    return {
        "sample_tokens": lambda: specdec_np.sample_tokens(logits=logits, generator=generator),
        "sample_tokens (filters)": lambda: specdec_np.sample_tokens(
            logits=logits, generator=generator, **filters
        ),
        "sample_tokens (uniforms)": lambda: specdec_np.sample_tokens(
            logits=logits, uniforms=row_uniforms
        ),
        "processed_probs": lambda: specdec_np.processed_probs(logits),
        "processed_probs (filters)": lambda: specdec_np.processed_probs(logits, **filters),
        "verify_ragged": lambda: specdec_np.verify_ragged(
            num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
            generator=generator,
        ),
        "verify_ragged (filters)": lambda: specdec_np.verify_ragged(
            num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
            generator=generator, **filters,
        ),
        "verify_ragged (uniforms)": lambda: specdec_np.verify_ragged(
            num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
            uniforms=chain_uniforms,
        ),
        "EngineVerifier": lambda: engine(
            num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits
        ),
        "EngineVerifier (filters)": lambda: engine(
            num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
            **filters,
        ),
    }


#: The clock of every timing: ``time.perf_counter_ns`` (wall) or ``time.thread_time_ns``
#: (the CPU time of this thread, which a loaded machine inflates far less: a call that is
#: descheduled is not charged for the wait).
CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}
clock_ns = time.perf_counter_ns
#: The stage timers' clock (the wall clock: see the module docstring).
stage_clock_ns = time.perf_counter_ns


def median_us(call: Callable[[], Any], repeats: int) -> float:
    """The median of ``repeats`` timed calls after a warm-up, in microseconds (the garbage
    collector off)."""
    for _ in range(max(repeats // 10, 10)):
        call()
    times = np.empty(repeats)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for index in range(repeats):
            start = clock_ns()
            call()
            times[index] = clock_ns() - start
    finally:
        if enabled:
            gc.enable()
    return float(np.median(times)) / 1e3


class StageClock:
    """Per-call time of each named stage (summed within a call)."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}
        self.calls: list[dict[str, int]] = []

    def timed(self, stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` with its time added to ``stage``."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = stage_clock_ns()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = stage_clock_ns() - start
                self.current[stage] = self.current.get(stage, 0) + elapsed

        return wrapper

    def call(self, call: Callable[[], Any]) -> None:
        """One call, its stages recorded with its total."""
        self.current = {}
        start = stage_clock_ns()
        call()
        self.current["total"] = stage_clock_ns() - start
        self.calls.append(self.current)

    def medians(self, stages: tuple[str, ...]) -> dict[str, float]:
        """The median of each stage over the calls (us); "front" is the total less them."""
        found = {
            stage: float(np.median([c.get(stage, 0) for c in self.calls])) / 1e3
            for stage in (*stages, "total")
        }
        found["front"] = found["total"] - sum(found[stage] for stage in stages)
        return found


@contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    missing = object()
    saved = [(owner, name, getattr(owner, name, missing)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def engine_stages(clock: StageClock) -> list[tuple[Any, str, Any]]:
    """Timers around the engine call's stages: the fast path's, or the general call's."""
    if _fast is None:
        return general_stages(clock)
    return [
        (_sampling, "checked_parameters",
         clock.timed("sampling", _sampling.checked_parameters)),
        (_core, "check_ragged_call", clock.timed("checks", _core.check_ragged_call)),
        (_fast, "_launch", clock.timed("plan", _fast._launch)),
        (_core, "output_block", clock.timed("out block", _core.output_block)),
        (_fast, "_draw", clock.timed("draw", _fast._draw)),
        (_core, "verify_chains_direct", clock.timed("kernel", _core.verify_chains_direct)),
        # The engine's whole record (a checkout may record the common call without
        # VerificationMetrics.record).
        (EngineVerifier, "_record", clock.timed("record", EngineVerifier._record)),
        # The plans keep the kernel they were made with: made afresh with the timed one.
        (_fast._PLANS, "plans", {}),
        # So do the sampling steps' lanes (a checkout may have none).
        *([(_fast._LANES, "lanes", {})] if hasattr(_fast, "_LANES") else []),
    ]  # fmt: skip


def general_stages(clock: StageClock) -> list[tuple[Any, str, Any]]:
    """Timers around the general engine call's stages (and the kernel inside the run)."""
    kernel = _dispatch.kernel
    run = _dispatch.run
    uniforms_class = _uniforms.RejectionUniforms
    draw = uniforms_class.draw

    def timed_kernel(*args: Any) -> Any:
        return clock.timed("kernel", kernel(*args))

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        inner = dict(clock.current)
        start = stage_clock_ns()
        try:
            return run(*args, **kwargs)
        finally:
            elapsed = stage_clock_ns() - start
            nested = sum(clock.current.get(s, 0) - inner.get(s, 0) for s in ("draw", "kernel"))
            clock.current["run other"] = clock.current.get("run other", 0) + elapsed - nested

    return [
        (_ragged.RaggedCall, "build", clock.timed("build", _ragged.RaggedCall.build)),
        (_ragged.RaggedCall, "output_block",
         clock.timed("out block", _ragged.RaggedCall.output_block)),
        (_sampling, "request_sampling", clock.timed("sampling", _sampling.request_sampling)),
        (_engine_call._random, "RejectionUniforms", clock.timed("uniforms", uniforms_class)),
        (uniforms_class, "draw", clock.timed("draw", draw)),
        (_engine_call, "kernel_options", clock.timed("options", _engine_call.kernel_options)),
        (_dispatch, "kernel", timed_kernel),
        (_dispatch, "run", timed_run),
    ]  # fmt: skip


def processed_stages(clock: StageClock) -> list[tuple[Any, str, Any]]:
    """Timers around processed_probs' stages: its per-request sampling and its kernel."""
    return [
        (_sampling, "request_sampling", clock.timed("sampling", _sampling.request_sampling)),
        (_core, "processed_rows", clock.timed("kernel", _core.processed_rows)),
    ]  # fmt: skip


def measure(batch: int, vocab: int, repeats: int) -> list[dict[str, Any]]:
    """Each call's median, then its stage breakdown."""
    records = []
    for name, call in calls(batch, vocab).items():
        record: dict[str, Any] = {"call": name, "B": batch, "V": vocab}
        record["median_us"] = median_us(call, repeats)
        processed = name.startswith("processed_probs")
        stages = PROCESSED_STAGES if processed else ENGINE_STAGES
        clock = StageClock()
        patches = processed_stages(clock) if processed else engine_stages(clock)
        with _patched(patches):
            for _ in range(max(repeats // 10, 10)):
                call()
            gc.disable()
            try:
                for _ in range(repeats):
                    clock.call(call)
            finally:
                gc.enable()
        record["stages_us"] = clock.medians(stages)
        records.append(record)
    return records


def render(records: list[dict[str, Any]], markdown: bool) -> str:
    """The medians, then the stage breakdown (us)."""
    rows = [[r["call"], f"{r['median_us']:.1f}"] for r in records]
    batch, vocab = records[0]["B"], records[0]["V"]
    text = harness.render_table(
        [f"call (B={batch}, V={vocab})", "median us"], rows, markdown=markdown
    )
    for processed, stages in ((False, ENGINE_STAGES), (True, PROCESSED_STAGES)):
        chosen = [r for r in records if r["call"].startswith("processed_probs") == processed]
        header = ["call", "timed total", "front", *stages]
        body = [
            [r["call"], *(f"{r['stages_us'][s]:.1f}" for s in ("total", "front", *stages))]
            for r in chosen
        ]
        text += "\n\n" + harness.render_table(header, body, markdown=markdown)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per public call")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a few calls (the smoke test)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    parser.add_argument("--markdown", action="store_true")
    arguments = parser.parse_args(argv)
    global clock_ns
    clock_ns = CLOCKS[arguments.clock]
    repeats = 20 if arguments.quick else arguments.calls
    harness.log(
        f"specdec_np from {os.path.dirname(specdec_np.__file__)}, {arguments.clock} clock, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    records = measure(arguments.batch, arguments.vocab, repeats)
    print(render(records, arguments.markdown))


if __name__ == "__main__":
    main()
