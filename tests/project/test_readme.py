"""The README's usage example runs as printed."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_usage_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2, "README.md should show the padded and the engine example"
    for block in blocks:
        completed = subprocess.run(
            [sys.executable, "-c", block], capture_output=True, text=True, timeout=60
        )
        assert completed.returncode == 0, completed.stderr
        first_row = completed.stdout.splitlines()[0]
        assert first_row.startswith("[[")


def test_install_and_test_commands_are_documented():
    text = README.read_text()
    assert 'pip install -e ".[test]"' in text
    assert "\npytest\n" in text
