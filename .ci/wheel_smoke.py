"""Smoke test of an installed specdec_np (CI runs it in a fresh venv holding only the wheel).

Run from outside the checkout, so that ``import specdec_np`` can only find the installed
package: it imports the package, checks that it is the installed copy and a release build,
runs every usage example of the README, and runs ``specdec-np --version``, ``info``,
``check`` and a short ``demo``.  Exits non-zero on the first failure.

    python wheel_smoke.py README.md
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def run(*command: str, shown: str | None = None) -> str:
    """Run a command, echo it (or ``shown``) with its time, and return its stdout; exit on a
    non-zero status."""
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    print(f"$ {shown or ' '.join(command)}  [{time.perf_counter() - start:.1f} s]")
    if completed.returncode != 0:
        sys.exit(f"failed with status {completed.returncode}:\n{completed.stdout}\n"
                 f"{completed.stderr}")
    return completed.stdout


def main(readme: Path) -> None:
    import specdec_np
    from specdec_np import _core

    location = Path(specdec_np.__file__).resolve()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    platlib = Path(sysconfig.get_paths()["platlib"]).resolve()
    if not (location.is_relative_to(site) or location.is_relative_to(platlib)):
        sys.exit(f"specdec_np was imported from {location}, not from the installed wheel")
    if _core.debug_build():
        sys.exit("the installed extension is a debug build")
    print(f"specdec_np {specdec_np.__version__} from {location.parent}; "
          f"_core {Path(_core.__file__).stat().st_size:,} bytes")

    examples = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    if not examples:
        sys.exit(f"{readme} has no python example")
    for number, example in enumerate(examples, 1):
        output = run(sys.executable, "-c", example, shown=f"python -c <README example {number}>")
        print(f"  first line: {output.splitlines()[0] if output else '(no output)'}")

    version = run("specdec-np", "--version").strip()
    if version != f"specdec-np {specdec_np.__version__}":
        sys.exit(f"specdec-np --version says {version!r}")
    run("specdec-np", "info")
    checks = json.loads(run("specdec-np", "check", "--json"))
    if not checks["passed"]:
        sys.exit("specdec-np check failed")
    print(f"  specdec-np check: {len(checks['checks'])} checks passed")
    summary = json.loads(run("specdec-np", "demo", "--tokens", "30", "--batch", "2", "--json"))
    print(f"  demo: {summary['mean_tokens_per_request_step']:.3f} tokens per request-step")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
