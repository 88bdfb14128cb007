"""Compile the kernels' C headers (``specdec_np/*.h``) into small shared libraries for
ctypes, so that tests can call a header's functions without the built extension: the vector
build, the scalar fallback (``-DSPECDEC_NO_VECTOR_EXTENSIONS``) and deliberately wrong
variants of the same source."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specdec_np._runtime import contract as _contract

# The headers of the package under test (shipped with it), so that an installed wheel is
# tested against its own headers.
SOURCE_DIR = Path(_contract.__file__).resolve().parents[1] / "_kernels" / "src"
HEADER_DIRS = (SOURCE_DIR / "common", SOURCE_DIR / "cpu")
COMPILE_TIMEOUT_S = 120


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build_library(tmp: Path, stem: str, source_text: str, *defines: str) -> ctypes.CDLL:
    """``source_text`` (C11 that includes the headers) as a loaded shared library, built
    with the contract's macros and ``defines``; skips the test without a C compiler and
    fails it on any compiler warning."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang or $CC) to build the kernel headers")
    source = tmp / f"{stem}.c"
    lib = tmp / f"lib{stem}.so"
    source.write_text(source_text)
    macros = [f"-D{name}={value}" for name, value in _contract.compile_time_macros()]
    cmd = [
        cc, "-O2", "-shared", "-fPIC", "-std=c11", "-fno-math-errno", "-Wall", "-Wno-psabi",
        "-Wno-unused-function", *macros, *defines,
        *(f"-I{folder}" for folder in HEADER_DIRS), str(source), "-o",
        str(lib), "-lm",
    ]  # fmt: skip
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, f"compiling {stem} failed:\n{result.stderr}"
    assert "warning" not in result.stderr, result.stderr
    return ctypes.CDLL(str(lib))
