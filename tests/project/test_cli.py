"""The ``specdec-np`` command line: demo, check, info, usage errors, ``python -m``.

In-process runs go through ``cli.main([...])`` with small demo settings; the default demo
runs once in a subprocess, with ``--json``.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from specdec_np import best_first_tree, cli, registry, validate_tree
from specdec_np._demo import chains as _demo
from specdec_np.testing import KINDS, _self_check

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--tokens", "40", "--batch", "2"]


def _strict_json(text: str) -> Any:
    """Parse JSON, rejecting NaN and Infinity (not valid JSON)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def _run_module(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "specdec_np", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def _check_summary(summary: dict[str, Any], batch: int, tokens: int, k: int) -> None:
    """Invariants every demo summary must satisfy."""
    assert summary["target_calls"] > 0 and summary["verifier_ms_per_call"] > 0.0
    # Every request reaches its goal and overshoots by at most k.
    assert batch * tokens <= summary["generated_tokens"] <= batch * (tokens + k)
    # One token per verified request plus the accepted drafts.
    assert summary["generated_tokens"] == summary["verified_requests"] + summary["accepted_tokens"]
    assert 0 <= summary["accepted_tokens"] <= summary["drafted_tokens"]
    assert summary["drafted_tokens"] <= k * summary["verified_requests"]
    # The one acceptance figure is the causal one: accepted drafts over drafted ones.
    if summary["drafted_tokens"]:
        assert math.isclose(
            summary["acceptance_rate"], summary["accepted_tokens"] / summary["drafted_tokens"]
        )
    else:
        assert summary["acceptance_rate"] is None
    assert math.isclose(
        summary["mean_tokens_per_request_step"],
        summary["generated_tokens"] / summary["verified_requests"],
    )
    assert 1.0 <= summary["mean_tokens_per_request_step"] <= k + 1
    # The histogram: of the request-steps that drafted position j, the share accepted.
    accepted_at, drafted_at = summary["accepted_at"], summary["drafted_at"]
    histogram = summary["acceptance_by_position"]
    assert len(histogram) == len(accepted_at) == len(drafted_at) <= k
    assert sum(drafted_at) == summary["drafted_tokens"]
    assert sum(accepted_at) == summary["accepted_tokens"]
    for share, accepted, drafted in zip(histogram, accepted_at, drafted_at):
        assert 0 <= accepted <= drafted
        assert share is None if drafted == 0 else math.isclose(share, accepted / drafted)
    # A request drafting position j + 1 drafted position j too (and accepted it first).
    assert all(a >= b for a, b in zip(drafted_at, drafted_at[1:]))
    assert all(a >= b for a, b in zip(accepted_at, accepted_at[1:]))
    with_drafts = drafted_at[0] if drafted_at else 0
    assert summary["requests_without_drafts"] == summary["verified_requests"] - with_drafts
    assert summary["greedy_requests"] == sum(s["temperature"] == 0 for s in summary["sampling"])
    assert len(summary["sampling"]) == batch
    # vLLM's independent per-position count is not reported: one figure only.
    assert "counters" not in summary and "draft_acceptance_rate" not in json.dumps(summary)


# -- demo ------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", _demo.DRAFTERS)
@pytest.mark.parametrize("verifier", registry.names())
def test_demo_json_for_each_verifier(
    verifier: str, drafter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--verifier", verifier, "--drafter", drafter, *SMALL, "--json"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    summary = _strict_json(captured.out)
    assert (summary["verifier"], summary["drafter"]) == (verifier, drafter)
    assert (summary["batch"], summary["tokens_per_sequence"], summary["k"]) == (2, 40, 4)
    _check_summary(summary, batch=2, tokens=40, k=4)
    if drafter == "ngram":
        # Every request drafts k tokens.
        assert summary["drafted_at"] == [summary["verified_requests"]] * 4
    _check_progress_lines(captured.err, "demo")  # stderr is not a terminal: progress lines


def test_demo_batch_mixes_greedy_and_sampled_requests() -> None:
    result = _demo.run_demo(_demo.DemoConfig(batch=4, tokens=5))
    settings = result.sampling
    assert any(s.greedy for s in settings) and not all(s.greedy for s in settings)
    sampled = [s for s in settings if not s.greedy]
    assert any(s.top_k for s in sampled) and any(s.top_p < 1 for s in sampled)
    assert any(s.temperature != 1 for s in sampled)
    # The temperature-0 verifier decodes every request greedily.
    config = _demo.DemoConfig(verifier=_demo._ARGMAX_DECODING, batch=4, tokens=5)
    assert all(s.greedy for s in config.sampling())


def _argmax_decoding(target: _demo.InterpolatedNGram, prompt: np.ndarray, n: int) -> np.ndarray:
    tokens = list(prompt)
    for _ in range(n):
        history = np.array(tokens[-target.context_length :])[None, :]
        tokens.append(int(target.log_probs(history)[0].argmax()))
    return np.array(tokens)


@pytest.mark.parametrize("drafter", _demo.DRAFTERS)
def test_demo_greedy_requests_are_argmax_decoding(drafter: str) -> None:
    """Whatever was drafted and whatever the sampled requests did, a greedy request's text
    is the target's argmax decoding of its prompt; and prompt lookup leaves some
    request-steps without drafts."""
    config = _demo.DemoConfig(drafter=drafter, batch=6, tokens=60, vocab_size=500)
    result = _demo.run_demo(config)
    target, _ = _demo.build_models(_demo.build_corpus(500))
    greedy_rows = [b for b, s in enumerate(result.sampling) if s.greedy]
    assert greedy_rows
    for b in greedy_rows:
        ids = result.token_ids[b]
        new = ids.size - config.prompt_length
        expected = _argmax_decoding(target, ids[: config.prompt_length], new)
        np.testing.assert_array_equal(ids, expected)
    # The sampled requests are not argmax decoding (they sample at temperature > 0).
    sampled_rows = [b for b, s in enumerate(result.sampling) if not s.greedy]
    assert any(
        not np.array_equal(
            result.token_ids[b],
            _argmax_decoding(target, result.token_ids[b][: config.prompt_length], 60),
        )
        for b in sampled_rows
    )
    summary = result.summary()
    _check_summary(summary, batch=6, tokens=60, k=config.k)
    if drafter == "prompt-lookup":
        assert 0 < summary["requests_without_drafts"] < summary["verified_requests"]
        # Lengths vary: some request-steps drafted fewer than k but more than 0 tokens.
        assert summary["drafted_at"][0] > summary["drafted_at"][-1] > 0


@pytest.mark.parametrize("drafter", _demo.DRAFTERS)
def test_demo_filters_reach_the_verifier(drafter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled requests whose filters keep only the most probable token (top-k 1, or a
    tiny top-p) decode exactly like argmax: the verifier applies each request's filters
    to the target's logits, the bonus and residual draws included."""
    monkeypatch.setattr(
        _demo,
        "SAMPLING_CYCLE",
        (_demo.Sampling(1.0, top_k=1), _demo.Sampling(0.5, top_p=1e-6), _demo.Sampling(2.0)),
    )
    config = _demo.DemoConfig(drafter=drafter, batch=3, tokens=40, vocab_size=500)
    result = _demo.run_demo(config)
    target, _ = _demo.build_models(_demo.build_corpus(500))
    assert not any(s.greedy for s in result.sampling)
    P = config.prompt_length
    decoded = [
        np.array_equal(ids, _argmax_decoding(target, ids[:P], ids.size - P))
        for ids in result.token_ids
    ]
    # The unfiltered request at temperature 2 is the control: it is not argmax decoding.
    assert decoded == [True, True, False]


def test_prompt_lookup_drafts() -> None:
    ids = np.array([5, 6, 7, 8, 9, 5, 6, 7], dtype=np.int64)
    # The last 3 tokens (5 6 7) occurred at 0: what followed them.
    np.testing.assert_array_equal(_demo.prompt_lookup(ids, 4), [8, 9, 5, 6])
    np.testing.assert_array_equal(_demo.prompt_lookup(ids, 2), [8, 9])
    # The latest earlier match wins, and the drafts stop at the end of the context.
    ids = np.array([1, 2, 3, 1, 2, 4, 1, 2], dtype=np.int64)
    np.testing.assert_array_equal(_demo.prompt_lookup(ids, 4), [4, 1, 2])
    # No earlier occurrence of the last 3 or 2 tokens: no draft.
    assert _demo.prompt_lookup(np.array([1, 2, 3, 4], dtype=np.int64), 4).size == 0
    assert _demo.prompt_lookup(np.array([7], dtype=np.int64), 4).size == 0
    # A trigram match is preferred to a later bigram match.
    ids = np.array([9, 1, 2, 3, 0, 2, 3, 7, 9, 1, 2, 3], dtype=np.int64)
    np.testing.assert_array_equal(_demo.prompt_lookup(ids, 2), [0, 2])


def test_demo_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--tokens", "30", "--batch", "3", "--samples", "2"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "[0] (greedy) prompt:" in out and "[1] (T=1) prompt:" in out and "[2]" not in out
    for label in (
        "acceptance rate",
        "accepted drafts / drafted",
        "tokens per request-step",
        "acceptance by draft position",
        "position 1",
        "verifier time per batched call",
        "batched target calls",
        "without drafts",
    ):
        assert label in out
    assert "tokens per target call" not in out
    summary = out.split("summary")[-1]
    # One acceptance figure: vLLM's independent count is gone from the default output.
    assert summary.count("acceptance rate") == 1 and "draft_acceptance_rate" not in out
    _check_progress_lines(captured.err, "demo")


TREE_SMALL = ["demo", "--tree", "--k", "5", "--batch", "3", "--tokens", "12"]
SAMPLED_TREE_METHODS = [method.name for method in registry.TREE_METHODS if method.stochastic]


def test_demo_tree_prints_chain_and_tree_tokens_per_request_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(TREE_SMALL) == 0
    out = capsys.readouterr().out
    labels = ("demo --tree", "node budget  5", "tokens per request-step", "chain", "gain")
    for label in labels:
        assert label in out
    # Each figure names what it counts: request-steps, and batched target calls.
    assert "tokens per target call" not in out and "batched target calls" in out
    table = out.split("tokens per request-step")[1].splitlines()
    for name in SAMPLED_TREE_METHODS:
        row = next(line.split() for line in table if line.split()[:1] == [name])
        chain, tree = float(row[1]), float(row[2])
        # Tokens per call: at least the final token, at most the deepest path plus one.
        assert 1.0 <= chain <= 6.0 and 1.0 <= tree <= 6.0
        assert row[3] == f"{tree / chain:.3f}x" or abs(float(row[3][:-1]) - tree / chain) < 2e-3


def test_demo_tree_json_is_a_paired_same_budget_comparison(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*TREE_SMALL, "--json"]) == 0
    summary = _strict_json(capsys.readouterr().out)
    assert summary["node_budget"] == 5
    assert summary["shapes"] == {
        "chain": [-1, 0, 1, 2, 3],
        "tree": best_first_tree(5),
    }
    assert [m["method"] for m in summary["methods"]] == SAMPLED_TREE_METHODS
    depth = {"chain": 5, "tree": 3}  # best_first_tree(5) = [-1, 0, -1, 1, 0]
    for m in summary["methods"]:
        assert m["chain_nodes_per_request_step"] == 5.0
        assert 0 < m["tree_nodes_per_request_step"] <= 5.0
        for shape in ("chain", "tree"):
            assert 1.0 <= m[f"{shape}_tokens_per_request_step"] <= depth[shape] + 1
        assert m["paired_difference"] == pytest.approx(
            m["tree_tokens_per_request_step"] - m["chain_tokens_per_request_step"]
        )
    # Every request of every step verified one chain and one tree per method.
    assert summary["request_steps"] >= summary["target_calls"] >= 12 // 6


def test_best_first_tree_is_deepest_on_the_top_ranked_branch() -> None:
    from specdec_np._layouts import tree_builders

    assert best_first_tree(0) == []
    assert best_first_tree(8) == [-1, 0, -1, 1, 0, 2, 3, -1]
    for nodes in (1, 4, 16, 64):
        parents = best_first_tree(nodes)
        layout = validate_tree([nodes], parents, [0] * nodes)
        children = layout.children(0)
        assert max(len(kids) for kids in children) <= len(tree_builders.RANK_WEIGHTS)
        depth, node = 0, -1
        while children[node + 1]:
            node, depth = children[node + 1][0], depth + 1
        assert depth == layout.max_depth
    with pytest.raises(ValueError, match="nodes"):
        best_first_tree(-1)


def test_demo_is_reproducible(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--tokens", "25", "--batch", "2", "--seed", "7", "--k", "3"]
    runs = []
    for _ in range(2):
        assert cli.main(args) == 0
        text = capsys.readouterr().out
        runs.append(text.split("summary")[0])  # the text, before any timing
    assert runs[0] == runs[1]
    assert cli.main([*args[:-4], "--seed", "8", "--k", "3"]) == 0
    assert capsys.readouterr().out.split("summary")[0] != runs[0]


def test_options_without_subcommand_run_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli._normalise_argv([]) == ["demo"]
    assert cli._normalise_argv(["--json"]) == ["demo", "--json"]
    assert cli._normalise_argv(["--help"]) == ["--help"]
    assert cli.main(["--tokens", "10", "--batch", "1", "--json"]) == 0
    _check_summary(_strict_json(capsys.readouterr().out), batch=1, tokens=10, k=4)


def _check_progress_lines(err: str, command: str) -> None:
    """Progress off a terminal: whole lines, each naming the command, none rewritten in
    place; the first a stage, the last the end of decoding."""
    lines = err.splitlines()
    assert lines and err.endswith("\n") and "\r" not in err and "\033" not in err
    assert all(line.startswith(f"specdec-np {command}: ") for line in lines), lines
    assert "building the corpus" in lines[0]
    assert re.search(r"decoding: (\d+)/\1 tokens", lines[-1]), lines[-1]


def test_progress_off_a_terminal_is_a_line_per_stage_and_period(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A captured run (stderr a pipe or a file) still shows it is alive: a line per stage
    and at most one every PERIOD seconds while decoding; --quiet silences it."""
    clock = itertools.count(0.0, 2.0)  # every reading of the clock is 2 s later
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(clock))
    assert cli.main(["demo", "--tree", "--k", "3", "--batch", "2", "--tokens", "20"]) == 0
    captured = capsys.readouterr()
    _check_progress_lines(captured.err, "demo --tree")
    decoding = [line for line in captured.err.splitlines() if "decoding:" in line]
    # Steps 2 s apart and a 5 s period: about every third step is shown, and the last.
    assert 2 <= len(decoding) < 20
    assert "tokens per request-step" in captured.out  # stdout keeps the results only
    for command in (
        ["demo", "--tokens", "10", "--batch", "1", "--json", "--quiet"],
        ["demo", "--tree", "--k", "3", "--batch", "1", "--tokens", "5", "-q"],
        ["check", "--backend", "numpy", "--quiet", "--json"],
    ):
        assert cli.main(command) == 0
        assert capsys.readouterr().err == "", command


def test_demo_progress_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["demo", "--tokens", "10", "--batch", "1", "--json"]) == 0
    shown = terminal.getvalue()
    assert "decoding: 10/10 tokens" in shown
    assert "acceptance rate" in shown and "tokens per request-step" in shown
    assert shown.endswith("\r\033[K")  # the line is erased before the results
    _strict_json(capsys.readouterr().out)  # stdout holds the JSON only


def test_default_demo_in_a_subprocess() -> None:
    """The default demo (rejection, prompt lookup, k=4, batch 8, 300 tokens) runs, mixes
    greedy and sampled requests, has request-steps with and without drafts, and gains
    more than one token per target call."""
    result = _run_module("--json", timeout=120)
    assert result.returncode == 0, result.stderr
    summary = _strict_json(result.stdout)
    assert (
        summary["verifier"],
        summary["drafter"],
        summary["k"],
        summary["batch"],
        summary["tokens_per_sequence"],
    ) == ("rejection", "prompt-lookup", 4, 8, 300)
    _check_summary(summary, batch=8, tokens=300, k=4)
    assert 0 < summary["greedy_requests"] < summary["batch"]
    assert 0 < summary["requests_without_drafts"] < summary["verified_requests"]
    assert summary["mean_tokens_per_request_step"] > 1.0


# -- the n-gram models -----------------------------------------------------------------------


def test_ngram_models_give_probability_rows() -> None:
    corpus = _demo.build_corpus(vocab_size=500)
    assert corpus.words[:2] == ("<unk>", "<eos>") and corpus.vocab_size == 502
    target, draft = _demo.build_models(corpus)
    rng = np.random.default_rng(0)
    seen = np.stack([corpus.stream[10:20], corpus.stream[11:21]], axis=1)
    unseen = rng.integers(0, corpus.vocab_size, size=(10, 2))
    for history in (seen, unseen):
        p = target.probs(history)
        q = draft.probs(history[:, 1:])
        for rows in (p, q):
            assert rows.dtype == np.float32 and rows.shape == (10, corpus.vocab_size)
            assert np.all(rows > 0)
            np.testing.assert_allclose(rows.sum(axis=1, dtype=np.float64), 1.0, atol=1e-5)
    # The target has learned something the draft has not: a seen trigram is likelier.
    w = corpus.stream[12:22]
    assert np.mean(np.log(target.probs(seen)[np.arange(10), w])) > np.mean(
        np.log(draft.probs(seen[:, 1:])[np.arange(10), w])
    )


def test_corpus_is_deterministic() -> None:
    first = _demo.build_corpus(vocab_size=300)
    second = _demo.build_corpus(vocab_size=300)
    assert first.words == second.words
    np.testing.assert_array_equal(first.stream, second.stream)
    assert (
        _demo.detokenize(["return", "a", "list", ",", "or", "none", "."])
        == "return a list, or none."
    )


# -- usage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["bogus"],
        ["demo", "--k", "0"],
        ["demo", "--batch", "-1"],
        ["demo", "--tokens", "many"],
        ["demo", "--verifier", "medusa"],
        ["demo", "--vocab-size", "1"],
        ["demo", "--seed", "-3"],
        ["check", "--backend", "tpu"],
        ["info", "--extra"],
        ["--no-such-option"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage:" in captured.err


@pytest.mark.parametrize(
    "argv", [["--help"], ["demo", "--help"], ["check", "--help"], ["info", "--help"]]
)
def test_help_on_every_subcommand(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert "usage: specdec-np" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import specdec_np

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"specdec-np {specdec_np.__version__}"


# -- check -----------------------------------------------------------------------------------


def _fake_checks(outcomes: dict[str, bool]) -> Any:
    """A ``run_checks`` stand-in returning results with ``name``, ``passed``, ``detail``."""

    def run_checks(backend: str = "numpy") -> list[SimpleNamespace]:
        return [
            SimpleNamespace(name=name, passed=passed, detail=f"detail of {name} on {backend}")
            for name, passed in outcomes.items()
        ]

    return run_checks


def _use_checks(monkeypatch: pytest.MonkeyPatch, run_checks: Any) -> None:
    """Make the self-check runner call this ``run_checks`` on each backend."""
    monkeypatch.setattr(_self_check, "run_checks", run_checks)


@pytest.fixture
def numpy_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli._backend, "cuda_available", lambda: False)


@pytest.mark.usefixtures("numpy_only")
def test_check_all_pass(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_checks(monkeypatch, _fake_checks({"oracle": True, "grid": True}))
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 2 and "FAIL" not in out
    assert "detail of grid on numpy" in out and "all passed" in out


@pytest.mark.usefixtures("numpy_only")
def test_check_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_checks(monkeypatch, _fake_checks({"oracle": True, "chi-square": False}))
    assert cli.main(["check"]) == 1
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL" in out and "1 FAILED" in out

    assert cli.main(["check", "--json"]) == 1
    report = _strict_json(capsys.readouterr().out)
    assert report["passed"] is False and report["backends"] == ["numpy"]
    assert [c["passed"] for c in report["checks"]] == [True, False]


@pytest.mark.usefixtures("numpy_only")
def test_check_crash_and_empty_run_fail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def crash(backend: str = "numpy") -> list[SimpleNamespace]:
        raise RuntimeError("kernel exploded")

    _use_checks(monkeypatch, crash)
    assert cli.main(["check"]) == 1
    out = capsys.readouterr().out
    assert "run_checks" in out and "kernel exploded" in out

    _use_checks(monkeypatch, _fake_checks({}))
    assert cli.main(["check"]) == 1
    assert "no check was run" in capsys.readouterr().out


def test_check_runs_every_usable_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli._backend, "cuda_available", lambda: True)
    _use_checks(monkeypatch, _fake_checks({"oracle": True}))
    assert cli.main(["check", "--json"]) == 0
    report = _strict_json(capsys.readouterr().out)
    assert report["backends"] == ["numpy", "cupy"]
    assert [c["backend"] for c in report["checks"]] == ["numpy", "cupy"]


@pytest.mark.usefixtures("numpy_only")
def test_check_cupy_requested_but_unusable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "cupy"]) == 1
    assert "CuPy" in capsys.readouterr().err


def test_check_real_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL" not in out


@pytest.mark.usefixtures("numpy_only")
def test_check_covers_every_registry_verifier(capsys: pytest.CaptureFixture[str]) -> None:
    """Every registry verifier has rows of its own in ``specdec-np check``: the kit's
    properties for those it knows, the kernel-versus-reference check for the deterministic
    ones."""
    assert cli.main(["check", "--json"]) == 0
    checks = _strict_json(capsys.readouterr().out)["checks"]
    names = {check["name"] for check in checks}
    for verifier in registry.VERIFIERS:
        own = {name for name in names if name.startswith(f"{verifier.name}: ")}
        assert own, verifier.name
        if verifier.name in KINDS:
            assert f"{verifier.name}: output format" in own
        if not verifier.stochastic:
            assert f"{verifier.name}: kernel equals reference" in own
        if verifier.lossless:
            assert f"{verifier.name}: exact law equals the oracle" in own
    assert all(check["passed"] and check["backend"] == "numpy" for check in checks)


# -- info ------------------------------------------------------------------------------------


def test_info(capsys: pytest.CaptureFixture[str]) -> None:
    import specdec_np

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("specdec_np:", "numpy:", "Python:", "Cython (build):", "OpenMP:", "cupy:"):
        assert key in out
    assert specdec_np.__version__ in out and np.__version__ in out

    assert cli.main(["info", "--json"]) == 0
    facts = _strict_json(capsys.readouterr().out)
    assert facts["numpy"] == np.__version__
    assert facts["OpenMP"].startswith(("on", "off"))
    assert facts["Cython (build)"] == "unknown" or facts["Cython (build)"][0].isdigit()


def test_cython_build_version_is_read_from_the_module(tmp_path: Path) -> None:
    module = tmp_path / "_core.so"
    module.write_bytes(b"\x00junk_cython_3_0_11.cython_function_or_method\x00")
    assert cli._cython_build_version(str(module)) == "3.0.11"
    module.write_bytes(b"nothing here")
    (tmp_path / "_core.c").write_text("/* Generated by Cython 3.1.2 */\n")
    assert cli._cython_build_version(str(module)) == "3.1.2"
    assert cli._cython_build_version(str(tmp_path / "missing.so")) == "3.1.2"
    (tmp_path / "_core.c").unlink()
    assert cli._cython_build_version(str(module)) == "unknown"
    assert cli._cython_build_version(None) == "unknown"


# -- python -m specdec_np --------------------------------------------------------------------


def test_python_m_help_and_info() -> None:
    help_run = _run_module("--help")
    assert help_run.returncode == 0, help_run.stderr
    assert "usage: python -m specdec_np" in help_run.stdout
    for command in ("demo", "check", "info"):
        assert command in help_run.stdout
    info_run = _run_module("info")
    assert info_run.returncode == 0, info_run.stderr
    assert "numpy:" in info_run.stdout and info_run.stderr == ""
    usage_run = _run_module("demo", "--k", "zero")
    assert usage_run.returncode == 2 and "usage:" in usage_run.stderr
