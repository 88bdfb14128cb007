"""The README's usage example runs as printed."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_usage_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    completed = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    first_row = completed.stdout.splitlines()[0]
    assert first_row.startswith("[[")


def test_install_and_test_commands_are_documented():
    text = README.read_text()
    assert 'pip install -e ".[test]"' in text
    assert "\npytest\n" in text
