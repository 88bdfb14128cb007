"""The relaxed methods' study must not rot: a tiny run, its rows and its saved table (no
timing; the figures are in benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from specdec_np import registry

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "studies" / "relaxed_gain.py"


def test_a_quick_run_measures_every_relaxed_method(tmp_path, capsys) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("relaxed_gain", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    saved = tmp_path / "run.jsonl"
    assert module.main(["--quick", "--json", str(saved)]) == 0
    rows = [r for r in module.harness.read_jsonl(str(saved)) if r.get("kind") == "row"]
    methods = {row["method"] for row in rows}
    assert methods >= set(registry.relaxed_names()) | set(registry.names(lossless=True))
    for row in rows:
        if row["method"] in registry.names(lossless=True):
            assert row["mean_tv"] == 0
    capsys.readouterr()
    assert module.main(["--render", str(saved), "--markdown"]) == 0
    assert "| drafter | method |" in capsys.readouterr().out
