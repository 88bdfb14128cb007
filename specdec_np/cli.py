"""The ``specdec-np`` command line (also ``python -m specdec_np``).

Subcommands
-----------
``demo`` (the default when no subcommand is given)
    An end-to-end speculative-decoding session: an n-gram draft and target trained on the
    standard library's docstrings, verified by this package's samplers.  Prints generated
    text and a summary (``--json``: the summary only, as JSON).  ``demo --tree`` compares a
    tree drafter with a chain of the same node budget instead, verified with
    :func:`specdec_np.verify_tree`, and prints the tokens per request-step of each.
``check``
    The conformance self-test of this installation on every available backend (the kit
    over the registry, :mod:`specdec_np.testing._self_check`); exit status 1 if any check fails.
    ``check --verifier module:function [--kind ...]`` runs the conformance kit
    (:mod:`specdec_np.testing`) on a user's verifier instead.
``info``
    Versions and build facts: specdec_np, numpy, Python, Cython, OpenMP, CuPy and CUDA.

Results go to stdout, progress and diagnostics to stderr: on a terminal one line rewritten
in place, elsewhere a line per stage and one every few seconds (``--quiet``: none); usage
errors exit with status 2.  A *request-step* is one request in one batched target call:
the demo's "tokens per request-step" is what one target call yields a request, and
"batched target calls" counts the calls themselves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import registry
from ._runtime import arrays as _backend
from .testing import _self_check

__all__ = ["build_parser", "main"]

_SUBCOMMANDS = ("demo", "check", "info")
_QUIET_HELP = "print no progress on stderr (results and errors only)"
_TOP_LEVEL_FLAGS = ("-h", "--help", "--version")


# -- small helpers ---------------------------------------------------------------------------


def _int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer ``>= minimum`` (and ``<= maximum`` if given); otherwise
    a usage error, exit 2."""
    expected = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer {expected}; found {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer {expected}; found {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer {expected} (at most {maximum}); found {value}"
            )
        return value

    return parse


# Upper bounds of the demo's sizes: generous for a demo, and small enough that no
# combination of them can ask for more than a few hundred MiB (checked jointly below).
MAX_K = 64
MAX_BATCH = 4096
MAX_TOKENS = 100_000
MAX_VOCAB_SIZE = 100_000
MAX_SAMPLES = 4096
# float32 elements of one step's [B, k+1, V] target (and [B, k, V] draft): 256 MiB each.
MAX_STEP_ELEMENTS = 1 << 26
# int64 elements of the [B, tokens] sequences: 400 MB.
MAX_SEQUENCE_ELEMENTS = 50_000_000


def _timeout_seconds(text: str) -> float:
    """An argparse type: ``0`` (no limit) or a time limit the kit accepts (positive, finite,
    no longer than this platform's threads can wait); otherwise a usage error."""
    from .testing._report import checked_timeout

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds; found {text!r}") from None
    if value == 0:
        return value
    try:
        checked_timeout(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected 0 (no limit) or {str(error).removeprefix('timeout must be None or ')}"
        ) from None
    return value


def _check_check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors (exit 2) of ``check``: the kit's options without ``--verifier``, and a
    kind its layout does not have."""
    if getattr(args, "command", None) != "check":
        return
    from . import testing

    options = ("layout", "kind", "seed", "timeout")
    if args.verifier is None:
        given = [f"--{name}" for name in options if getattr(args, name) is not None]
        if given:
            parser.error(f"{', '.join(given)} only apply with --verifier")
        return
    layout = args.layout or "padded"
    kinds = testing.kinds_for(layout)
    if args.kind is None:
        # The first method that reads uniforms: the one the kit checks most closely.
        args.kind = registry.get_layout(layout).method_names(stochastic=True)[0]
    if args.kind not in kinds:
        parser.error(f"--kind must be one of {', '.join(kinds)} with --layout {layout}; "
                     f"found {args.kind!r}")
    args.layout = layout
    args.seed = 0 if args.seed is None else args.seed


def _check_demo_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage error (exit 2) for sizes that are each allowed but too large together."""
    if getattr(args, "command", None) not in (None, "demo") or not hasattr(args, "k"):
        return
    # + 2: the demo's <unk> and <eos> tokens.
    step = args.batch * (args.k + 1) * (args.vocab_size + 2)
    if step > MAX_STEP_ELEMENTS:
        parser.error(
            f"--batch x (--k + 1) x (--vocab-size + 2) = {step} is too large: at most "
            f"{MAX_STEP_ELEMENTS} probabilities per step"
        )
    sequences = args.batch * args.tokens
    if sequences > MAX_SEQUENCE_ELEMENTS:
        parser.error(
            f"--batch x --tokens = {sequences} is too large: at most {MAX_SEQUENCE_ELEMENTS}"
        )


def _json_ready(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def _print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(_json_ready(data), indent=2, allow_nan=False) + "\n")


def _number(value: float, digits: int = 4) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.{digits}f}"


class _Progress:
    """Progress of a long command on stderr, so that stdout keeps only the results.

    On a terminal, one line rewritten in place (at most ten times a second) and erased
    before the results.  Elsewhere (a pipe, a log file, a captured run) a line per stage
    and a periodic line every :attr:`PERIOD` seconds, so that a run that takes a minute
    shows it is alive without flooding the log.  ``--quiet`` turns both off.
    """

    #: Seconds between two progress lines when stderr is not a terminal.
    PERIOD = 5.0

    def __init__(self, stream: TextIO, *, quiet: bool = False, command: str = "") -> None:
        self._stream = stream
        self.enabled = not quiet
        self.terminal = bool(getattr(stream, "isatty", lambda: False)())
        self._prefix = f"specdec-np {command}: " if command else "specdec-np: "
        self._start = time.perf_counter()
        self._last = -math.inf
        self._dirty = False

    def message(self, text: str) -> None:
        """Show a stage: replace the terminal line, or write a line of its own."""
        if not self.enabled:
            return
        if self.terminal:
            self._stream.write("\r\033[K" + text)
            self._dirty = True
        else:
            elapsed = time.perf_counter() - self._start
            self._stream.write(f"{self._prefix}{text} [{elapsed:.1f} s]\n")
        self._stream.flush()

    def tokens(self, done: int, total: int, detail: str = "") -> None:
        """Progress callback of the demo loops: tokens generated so far, of ``total``."""
        now = time.perf_counter()
        period = 0.1 if self.terminal else self.PERIOD
        if self.enabled and (now - self._last >= period or done >= total):
            self._last = now
            self.message(f"decoding: {done}/{total} tokens" + (f", {detail}" if detail else ""))

    def clear(self) -> None:
        """Erase the terminal's progress line (lines written elsewhere stay)."""
        if self.enabled and self._dirty:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._dirty = False


# -- demo ------------------------------------------------------------------------------------


def _run_demo(args: argparse.Namespace) -> int:
    from ._demo import chains as _demo

    if args.tree:
        return _run_tree_demo(args)
    config = _demo.DemoConfig(
        verifier=args.verifier,
        drafter=args.drafter,
        k=args.k,
        batch=args.batch,
        tokens=args.tokens,
        seed=args.seed,
        vocab_size=args.vocab_size,
    )
    progress = _Progress(sys.stderr, quiet=args.quiet, command="demo")
    progress.message("building the corpus and the n-gram models...")

    def report(done: int, total: int, metrics: Any) -> None:
        progress.tokens(
            done,
            total,
            f"acceptance rate {_number(metrics.acceptance_rate, 3)}, "
            f"{_number(metrics.mean_accepted_length, 2)} tokens per request-step",
        )

    try:
        result = _demo.run_demo(config, progress=report)
    except RuntimeError as error:
        progress.clear()
        print(f"specdec-np demo: error: {error}", file=sys.stderr)
        return 1
    progress.clear()
    summary = result.summary()
    if args.json:
        _print_json(summary, sys.stdout)
        return 0
    out = sys.stdout
    for line in _demo_header(summary):
        print(line, file=out)
    print(file=out)
    for line in _demo.format_text(result, samples=args.samples):
        print(line, file=out)
    for line in _demo_summary(summary):
        print(line, file=out)
    return 0


def _run_tree_demo(args: argparse.Namespace) -> int:
    from ._demo import chains as _demo
    from ._demo import trees as _tree_demo

    config = _demo.DemoConfig(
        k=args.k, batch=args.batch, tokens=args.tokens, seed=args.seed,
        vocab_size=args.vocab_size,
    )  # fmt: skip
    progress = _Progress(sys.stderr, quiet=args.quiet, command="demo --tree")
    progress.message("building the corpus and the n-gram models...")
    try:
        result = _tree_demo.run_tree_demo(config, progress=progress.tokens)
    except RuntimeError as error:
        progress.clear()
        print(f"specdec-np demo: error: {error}", file=sys.stderr)
        return 1
    progress.clear()
    summary = result.summary()
    if args.json:
        _print_json(summary, sys.stdout)
        return 0
    for line in _tree_demo_lines(summary):
        print(line)
    return 0


def _tree_demo_lines(s: dict[str, Any]) -> list[str]:
    budget = s["node_budget"]
    lines = [
        "specdec-np demo --tree: a tree drafter against a chain of the same node budget, "
        "verified with specdec_np.verify_tree",
        f"  node budget  {budget} per request and step; chain parents {s['shapes']['chain']}",
        f"  tree parents {s['shapes']['tree']} (EAGLE-2-like, best first)",
        f"  requests     {s['batch']} x {s['tokens_per_sequence']} new tokens, seed={s['seed']};"
        " every draft verified on the same contexts (a paired comparison)",
        "",
        f"tokens per request-step (accepted nodes + 1): {s['request_steps']} request-steps in "
        f"{s['target_calls']} batched target calls",
        "(a request-step is one request verified in one batched target call)",
    ]
    header = ("method", "chain", "tree", "gain", "tree - chain", "tree nodes drafted")
    rows = [
        (
            m["method"],
            _number(m["chain_tokens_per_request_step"], 3),
            _number(m["tree_tokens_per_request_step"], 3),
            f"{_number(m['gain'], 3)}x",
            f"{m['paired_difference']:+.3f} +- {_number(m['paired_standard_error'], 3)}",
            _number(m["tree_nodes_per_request_step"], 2),
        )
        for m in s["methods"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if s["versus"]:
        lines.append("")
        lines.append("on the tree, sequence-level against token-level verification (paired):")
        for v in s["versus"]:
            lines.append(
                f"  {v['method']} vs {v['baseline']}: "
                f"{_number(v['tokens_per_request_step'], 3)} vs "
                f"{_number(v['baseline_tokens_per_request_step'], 3)} tokens per request-step, "
                f"{v['paired_difference']:+.3f} +- {_number(v['paired_standard_error'], 3)} "
                f"({100 * v['gain']:+.1f} % +- {_number(100 * v['gain_standard_error'], 1)} %)"
            )
    lines.append(f"  wall time {s['decode_seconds']:.2f} s")
    return lines


def _sampling_text(sampling: dict[str, Any]) -> str:
    if sampling["temperature"] == 0:
        return "greedy"
    parts = [f"T={sampling['temperature']:g}"]
    if sampling["top_k"]:
        parts.append(f"top-k {sampling['top_k']}")
    if sampling["top_p"] < 1:
        parts.append(f"top-p {sampling['top_p']:g}")
    return " ".join(parts)


def _demo_header(s: dict[str, Any]) -> list[str]:
    counts: dict[str, int] = {}
    for sampling in s["sampling"]:
        text = _sampling_text(sampling)
        counts[text] = counts.get(text, 0) + 1
    requests = ", ".join(f"{count} {text}" for text, count in counts.items())
    return [
        "specdec-np demo: speculative decoding with n-gram models of the stdlib docstrings",
        f"  corpus   {s['corpus_documents']:,} docstrings from {s['corpus_modules']} modules, "
        f"{s['corpus_tokens']:,} tokens; vocabulary {s['vocab_size']:,} "
        "(with <unk>, <eos>)",
        f"  target   {s['target']}",
        f"  drafter  {s['draft']}",
        f"  verifier {s['verifier']} (greedy requests: argmax), up to k={s['k']} drafts, "
        f"seed={s['seed']}",
        f"  requests {s['batch']} x {s['tokens_per_sequence']} new tokens: {requests}",
    ]


def _demo_summary(s: dict[str, Any]) -> list[str]:
    verified = s["verified_requests"]
    rows = [
        (
            "acceptance rate",
            f"{_number(s['acceptance_rate'], 3)}   (accepted drafts / drafted = "
            f"{s['accepted_tokens']} / {s['drafted_tokens']}, causal)",
        ),
        (
            "tokens per request-step",
            f"{_number(s['mean_tokens_per_request_step'], 3)}   "
            f"({s['generated_tokens']} tokens in {verified} request-steps, "
            f"{s['requests_without_drafts']} of them without drafts)",
        ),
    ]
    histogram = [
        (
            f"position {position + 1}",
            f"{_number(share, 3)}  {'#' * round(20 * share) if math.isfinite(share) else ''}"
            f"{' ' * (21 - round(20 * share)) if math.isfinite(share) else ''}"
            f"({accepted} of {drafted})",
        )
        for position, (share, accepted, drafted) in enumerate(
            zip(
                (math.nan if x is None else x for x in s["acceptance_by_position"]),
                s["accepted_at"],
                s["drafted_at"],
            )
        )
    ]
    timing = [
        (
            "verifier time per batched call",
            f"{_number(s['verifier_ms_per_call'], 3)} ms mean, "
            f"{_number(s['verifier_ms_median'], 3)} ms median over {s['target_calls']} calls",
        ),
        (
            "batched target calls",
            f"{s['target_calls']}   (one per decoding step: a request-step for each unfinished "
            "request)",
        ),
        ("wall time", f"{s['build_seconds']:.2f} s build, {s['decode_seconds']:.2f} s decode"),
    ]
    width = max(len(name) for name, _ in rows + histogram + timing) + 4
    lines = ["summary"]
    lines += [f"  {name:<{width}}{value}" for name, value in rows]
    lines.append(
        "  acceptance by draft position (of the request-steps that drafted it, the share "
        "accepted)"
    )
    lines += [f"    {name:<{width - 2}}{value}" for name, value in histogram]
    lines += [f"  {name:<{width}}{value}" for name, value in timing]
    return lines


# -- check -----------------------------------------------------------------------------------


def _load_verifier(spec: str) -> Any:
    """``package.module:function`` (the attribute may be dotted) imported from the current
    directory or ``sys.path``."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--verifier must look like package.module:function; found {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def _run_check_verifier(args: argparse.Namespace) -> int:
    from . import testing

    try:
        verifier = _load_verifier(args.verifier)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # any import failure is the user's to fix: say which
        # (sys.exit() at import too: it would end the command with no report)
        print(f"specdec-np check: error: cannot load --verifier {args.verifier}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if not callable(verifier):
        print(f"specdec-np check: error: --verifier {args.verifier} is not callable (found "
              f"{type(verifier).__name__})", file=sys.stderr)
        return 2
    timeout = testing.DEFAULT_TIMEOUT if args.timeout is None else (args.timeout or None)
    progress = _Progress(sys.stderr, quiet=args.quiet, command="check")
    progress.message(f"running the conformance kit on {args.verifier} (kind {args.kind}, "
                     f"layout {args.layout})...")
    report = testing.check_verifier(verifier, args.kind, layout=args.layout, seed=args.seed,
                                    timeout=timeout)
    progress.clear()
    if args.json:
        rows = [dict(row.__dict__, status=row.status) for row in report.rows]
        _print_json({"verifier": args.verifier, "kind": args.kind, "layout": args.layout,
                     "passed": report.passed, "skipped": report.skipped(),
                     "seconds": report.seconds, "properties": rows}, sys.stdout)
    else:
        print(report)
    return 0 if report.passed else 1


def _run_check(args: argparse.Namespace) -> int:
    if args.verifier is not None:
        return _run_check_verifier(args)
    if args.backend == "all":
        backends = _self_check.usable_backends()
    elif args.backend == "cupy" and not _backend.cuda_available():
        print(
            "specdec-np check: error: CuPy is not installed or has no usable CUDA device",
            file=sys.stderr,
        )
        return 1
    else:
        backends = [args.backend]

    progress = _Progress(sys.stderr, quiet=args.quiet, command="check")
    rows = [
        (row.name, row.backend, "SKIP" if row.skipped else "PASS" if row.passed else "FAIL",
         row.detail)
        for row in _self_check.check_backends(backends, progress.message)
    ]
    progress.clear()

    failures = sum(status == "FAIL" for _, _, status, _ in rows)
    skips = sum(status == "SKIP" for _, _, status, _ in rows)
    if args.json:
        _print_json(
            {
                "backends": backends,
                "passed": failures == 0,
                "checks": [
                    {"name": name, "backend": backend, "passed": status == "PASS",
                     "skipped": status == "SKIP", "detail": detail}
                    for name, backend, status, detail in rows
                ],
            },
            sys.stdout,
        )
    else:
        for line in _check_table(rows):
            print(line)
        print()
        verdict = "all passed" if failures == 0 else f"{failures} FAILED"
        if skips:
            verdict += f", {skips} skipped"
        print(f"{len(rows)} checks on {', '.join(backends)}: {verdict}")
    return 1 if failures else 0


def _check_table(rows: Sequence[tuple[str, str, str, str]]) -> list[str]:
    header = ("check", "backend", "result", "detail")
    table = list(rows)
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(3)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + "  " + cells[3]

    return [
        line(header),
        line(["-" * w for w in widths] + ["-" * len(header[3])]),
        *(line(row) for row in table),
    ]


# -- info ------------------------------------------------------------------------------------


def _cython_build_version(core_file: str | None) -> str:
    """The Cython version that generated ``_core``, read from the compiled module (its
    shared type names embed it, e.g. ``_cython_3_0_11``) or the generated C file next to
    it; ``"unknown"`` otherwise."""
    if not core_file:
        return "unknown"
    try:
        match = re.search(rb"_cython_(\d+(?:_\d+)+(?:[a-z]+\d*)?)", Path(core_file).read_bytes())
        if match:
            return match.group(1).decode("ascii").replace("_", ".")
    except OSError:
        pass
    c_file = Path(core_file).with_name("_core.c")
    try:
        with c_file.open(encoding="utf-8", errors="replace") as handle:
            generated = re.search(r"Generated by Cython (\S+)", handle.readline())
        if generated:
            return generated.group(1)
    except OSError:
        pass
    return "unknown"


def _cuda_facts() -> Iterator[tuple[str, str]]:
    """CuPy and CUDA facts; never raises (absence and errors are reported as text)."""
    try:
        import cupy
    except Exception as error:
        reason = (
            "not installed"
            if isinstance(error, ModuleNotFoundError)
            else f"not importable ({type(error).__name__}: {error})"
        )
        yield "cupy", reason
        return
    yield "cupy", str(getattr(cupy, "__version__", "unknown"))
    try:
        runtime = cupy.cuda.runtime
        version = int(runtime.runtimeGetVersion())
        yield "CUDA runtime", f"{version // 1000}.{version % 1000 // 10}"
        driver = int(runtime.driverGetVersion())
        yield "CUDA driver", f"{driver // 1000}.{driver % 1000 // 10}"
        count = int(runtime.getDeviceCount())
        if count == 0:
            yield "CUDA devices", "none"
        for index in range(count):
            name = runtime.getDeviceProperties(index)["name"]
            if isinstance(name, bytes):
                name = name.decode("utf-8", errors="replace")
            yield f"CUDA device {index}", str(name)
    except Exception as error:
        yield "CUDA", f"unavailable ({type(error).__name__}: {error})"


def _info_facts() -> list[tuple[str, str]]:
    import numpy

    import specdec_np

    facts = [
        ("specdec_np", f"{specdec_np.__version__} ({Path(specdec_np.__file__).parent})"),
        ("numpy", numpy.__version__),
        (
            "Python",
            f"{platform.python_version()} ({platform.python_implementation()}, "
            f"{platform.system()} {platform.machine()})",
        ),
    ]
    try:
        from . import _core
    except ImportError as error:
        facts += [
            ("Cython (build)", "unknown"),
            ("OpenMP", f"unknown: the compiled module cannot be imported ({error})"),
        ]
    else:
        facts.append(("Cython (build)", _cython_build_version(getattr(_core, "__file__", None))))
        try:
            enabled = bool(_core.openmp_enabled())
            threads = int(_core.openmp_max_threads())
            facts.append(("OpenMP", f"{'on' if enabled else 'off'}, {threads} threads"))
        except Exception as error:
            facts.append(("OpenMP", f"unknown ({type(error).__name__}: {error})"))
    if "OMP_NUM_THREADS" in os.environ:
        facts.append(("OMP_NUM_THREADS", os.environ["OMP_NUM_THREADS"]))
    facts.extend(_cuda_facts())
    return facts


def _run_info(args: argparse.Namespace) -> int:
    facts = _info_facts()
    if args.json:
        _print_json(dict(facts), sys.stdout)
        return 0
    width = max(len(key) for key, _ in facts) + 2
    for key, value in facts:
        print(f"{key + ':':<{width}}{value}")
    return 0


# -- parser and entry point --------------------------------------------------------------


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``specdec-np`` (subcommands ``demo``, ``check``, ``info``).

    Parameters
    ----------
    prog : str, optional
        Program name shown in usage messages (default ``"specdec-np"``).

    Returns
    -------
    argparse.ArgumentParser
        The parser; ``parse_args`` gives a namespace whose ``handler`` runs the command.

    Examples
    --------
    >>> from specdec_np.cli import build_parser
    >>> arguments = build_parser().parse_args(["check", "--kind", "block"])
    >>> arguments.command, arguments.kind
    ('check', 'block')
    """
    from . import __version__

    parser = argparse.ArgumentParser(
        prog=prog or "specdec-np",
        description="Speculative-decoding verifiers for NumPy and CuPy. Without a "
        "subcommand, runs the demo.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,check,info}")

    demo = sub.add_parser(
        "demo",
        help="end-to-end speculative decoding with n-gram models (the default)",
        description="Train an interpolated Kneser-Ney trigram target on the standard "
        "library's docstrings, then decode a mixed batch of greedy and sampled requests "
        "(temperature, top-k, top-p) speculatively: the drafter proposes 0 to k tokens per "
        "request, the target scores them in one call, and specdec_np.EngineVerifier "
        "verifies the ragged batch from the target's logits. Prints sample text and a "
        "summary: the acceptance rate, tokens per request-step (a request's tokens per "
        "batched target call) and acceptance by draft position. Progress goes to stderr.",
    )
    demo.add_argument(
        "--verifier",
        choices=registry.names(),
        default="rejection",
        help="the registered verifier of the sampled requests: "
        + ", ".join(
            f"{v.name} ({v.sampler_name})" if v.sampler_name else v.name
            for v in registry.VERIFIERS
        )
        + "; default rejection. Greedy requests are always verified by argmax; the "
        "temperature-0 verifier (greedy) makes every request greedy",
    )
    from ._demo.chains import DRAFTERS

    demo.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default=DRAFTERS[0],
        help="prompt-lookup (default): what followed an earlier occurrence of the "
        "request's last tokens, 0 to k point-mass drafts; ngram: k drafts sampled from "
        "a bigram model, with their probabilities",
    )
    demo.add_argument(
        "--k",
        type=_int_at_least(1, MAX_K),
        default=4,
        help=f"the most draft tokens per request and step (default 4, at most {MAX_K})",
    )
    demo.add_argument(
        "--batch",
        type=_int_at_least(1, MAX_BATCH),
        default=8,
        help=f"sequences decoded together (default 8, at most {MAX_BATCH}; --batch x (--k + 1) x "
        f"(--vocab-size + 2) at most {MAX_STEP_ELEMENTS}, --batch x --tokens at most "
        f"{MAX_SEQUENCE_ELEMENTS}, to keep memory small)",
    )
    demo.add_argument(
        "--tokens",
        type=_int_at_least(1, MAX_TOKENS),
        default=300,
        help=f"new tokens per sequence (default 300, at most {MAX_TOKENS})",
    )
    demo.add_argument(
        "--seed",
        type=_int_at_least(0),
        default=0,
        help="seed of the draft and bonus sampling and the verifier (default 0)",
    )
    demo.add_argument(
        "--vocab-size",
        type=_int_at_least(2, MAX_VOCAB_SIZE),
        default=4000,
        help=f"most frequent words kept, plus <unk> and <eos> (default 4000, at most "
        f"{MAX_VOCAB_SIZE})",
    )
    demo.add_argument(
        "--samples",
        type=_int_at_least(0, MAX_SAMPLES),
        default=3,
        help=f"generated texts to print (default 3, at most {MAX_SAMPLES})",
    )
    demo.add_argument(
        "--tree",
        action="store_true",
        help="compare a tree drafter (the top-ranked continuations of the n-gram draft at "
        "each of the first levels, EAGLE-2-like) with a chain of the same node budget --k, "
        "for every sampled tree method, verified with specdec_np.verify_tree on the same "
        "contexts; prints the tokens per request-step of each (--verifier and --drafter are "
        "not used)",
    )
    demo.add_argument(
        "--json", action="store_true", help="print the summary as JSON (and no text)"
    )
    demo.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)
    demo.set_defaults(handler=_run_demo)

    check = sub.add_parser(
        "check",
        help="conformance self-test on every available backend",
        description="Run the conformance kit (exact law, chi-square, bug catalogue, batch "
        "invariance, output format) on the package's own function of every registry verifier "
        "it knows, and compare the deterministic kernels with the reference, on NumPy (and "
        "CuPy when usable); print a pass/fail table. Exit status 1 if any check fails.",
    )
    check.add_argument(
        "--backend",
        choices=("all", "numpy", "cupy"),
        default="all",
        help="where to run the kernels (default: every available backend)",
    )
    check.add_argument("--json", action="store_true", help="print the results as JSON")
    check.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)
    from .testing import DEFAULT_TIMEOUT, LAYOUTS

    check.add_argument(
        "--verifier",
        metavar="MODULE:FUNCTION",
        help="run the conformance kit on your own verifier instead (importable from the "
        "current directory or sys.path); exit 1 if a property fails",
    )
    check.add_argument("--layout", choices=LAYOUTS, default=None,
                       help="the calling convention of --verifier: the padded chain form, "
                       "verify_ragged's keywords or verify_tree's keywords (default padded)")
    check.add_argument("--kind", default=None,
                       help="what --verifier implements: a registry verifier name for the "
                       "chain layouts (default rejection), a registry tree method for "
                       "--layout tree (default its first stochastic method)")
    check.add_argument("--seed", type=_int_at_least(0), default=None,
                       help="seed of the kit's inputs for --verifier (default 0)")
    check.add_argument("--timeout", type=_timeout_seconds, default=None, metavar="SECONDS",
                       help=f"time limit of each call to --verifier (default "
                       f"{DEFAULT_TIMEOUT:g}; 0: no limit)")
    check.set_defaults(handler=_run_check)

    info = sub.add_parser(
        "info",
        help="versions and build facts",
        description="Print the versions of specdec_np, numpy, Python and Cython (build), "
        "OpenMP on/off and thread count, and CuPy/CUDA when present.",
    )
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    info.set_defaults(handler=_run_info)
    return parser


def _normalise_argv(argv: Sequence[str]) -> list[str]:
    """No arguments, or options only (``specdec-np --json``), mean the demo."""
    argv = list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in _TOP_LEVEL_FLAGS):
        return ["demo", *argv]
    return argv


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; ``sys.argv[1:]`` if None.
    prog : str, optional
        Program name for usage messages.

    Returns
    -------
    int
        Exit status: 0 on success, 1 when a check fails or the demo cannot run.  Usage
        errors raise ``SystemExit(2)`` (argparse).

    Examples
    --------
    >>> from specdec_np.cli import main
    >>> main(["info"])  # doctest: +ELLIPSIS
    specdec_np: ...
    0
    """
    parser = build_parser(prog)
    args = parser.parse_args(_normalise_argv(sys.argv[1:] if argv is None else argv))
    _check_demo_sizes(parser, args)
    _check_check_options(parser, args)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # stdout was closed early (``specdec-np | head``): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
