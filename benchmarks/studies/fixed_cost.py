#!/usr/bin/env python
"""One call's fixed cost: the public engine calls at ``B = 1``, ``V = 16``, and where the
time of each goes.

At ``V = 16`` the rows cost nothing to read, so a call's time is its fixed cost: intake,
checks, the sampling table, the uniforms, the output block, dispatch and the kernel
call's own argument handling.  For each public call this script prints the median over
many calls (``--calls``), then the same calls again with a timer around each stage of
the engine call (:mod:`specdec_np._layouts.engine_call`) to say where that time goes.
The stage timers cost a fraction of a microsecond each, so the stages add up to a little
more than the untimed median; "front" is what is left outside the stages (the public
function, its decorator and the records it fills).

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
from specdec_np._kernels import dispatch as _dispatch  # noqa: E402
from specdec_np._layouts import engine_call as _engine_call  # noqa: E402
from specdec_np._layouts import ragged as _ragged  # noqa: E402
from specdec_np._layouts import sampling as _sampling  # noqa: E402
from specdec_np._runtime import checks as _checks  # noqa: E402
from specdec_np._runtime import uniforms as _uniforms  # noqa: E402

#: The stages of an engine call, in the order they run.
ENGINE_STAGES = ("build", "sampling", "uniforms", "out block", "options", "draw", "kernel",
                 "run other")
#: The stages of processed_probs.
PROCESSED_STAGES = ("parameters", "tempered rows", "table", "kernel")


def calls(batch: int, vocab: int) -> dict[str, Callable[[], Any]]:
    """The public calls, each with its inputs made once (seed 0): a sampled request with
    two drafts for the chain calls, one row for the others."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    chain_logits = rng.standard_normal((3 * batch, vocab)).astype(np.float32)
    counts = np.full(batch, 2, dtype=np.int64)
    drafts = rng.integers(0, vocab, 2 * batch).astype(np.int64)
    generator = np.random.default_rng(1)
    engine = specdec_np.EngineVerifier(seed=0)
    filters = {"temperature": 0.8, "top_k": 8, "top_p": 0.9}
    return {
        "sample_tokens": lambda: specdec_np.sample_tokens(logits=logits, generator=generator),
        "sample_tokens (filters)": lambda: specdec_np.sample_tokens(
            logits=logits, generator=generator, **filters
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
            start = clock_ns()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = clock_ns() - start
                self.current[stage] = self.current.get(stage, 0) + elapsed

        return wrapper

    def call(self, call: Callable[[], Any]) -> None:
        """One call, its stages recorded with its total."""
        self.current = {}
        start = clock_ns()
        call()
        self.current["total"] = clock_ns() - start
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
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def engine_stages(clock: StageClock) -> list[tuple[Any, str, Any]]:
    """Timers around the engine call's stages (and the kernel inside the run)."""
    kernel = _dispatch.kernel
    run = _dispatch.run
    uniforms_class = _uniforms.RejectionUniforms
    draw = uniforms_class.draw

    def timed_kernel(*args: Any) -> Any:
        return clock.timed("kernel", kernel(*args))

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        inner = dict(clock.current)
        start = clock_ns()
        try:
            return run(*args, **kwargs)
        finally:
            elapsed = clock_ns() - start
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
    """Timers around processed_probs' stages."""
    kernels_for = _dispatch.kernels_for

    class TimedKernels:
        def __init__(self, device: Any) -> None:
            self.processed_rows = clock.timed("kernel", kernels_for(device).processed_rows)

    return [
        (_checks, "check_sampling_parameters",
         clock.timed("parameters", _checks.check_sampling_parameters)),
        (_sampling, "check_tempered_rows",
         clock.timed("tempered rows", _sampling.check_tempered_rows)),
        (_sampling, "sampling_table", clock.timed("table", _sampling.sampling_table)),
        (_dispatch, "kernels_for", TimedKernels),
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
    for stages in (ENGINE_STAGES, PROCESSED_STAGES):
        chosen = [r for r in records if set(stages) <= set(r["stages_us"])]
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
