"""Build script: cythonizes ``specdec_np/_core.pyx`` (everything else is in pyproject.toml).

Environment switches
--------------------
SPECDEC_DEBUG=1
    Turn Cython's ``boundscheck``, ``wraparound`` and ``initializedcheck`` back on, so an
    out-of-bounds access inside a kernel raises ``IndexError`` instead of corrupting memory,
    and keep debug information (``-O1 -g``).  Without it the extension is a release build:
    ``-O3 -g0`` (overriding the ``-g`` that Python's own CFLAGS often carry) and, on Linux,
    stripped at link time (``-s``), so the wheel ships no debug information.
SPECDEC_NO_OPENMP=1
    Build without OpenMP; ``prange`` loops then run serially.
SPECDEC_NO_AVX512=1
    Build the x86-64 kernels without their AVX-512 code (the AVX2 clones and paths only, the
    same bits), so that an AVX-512 machine can time what an AVX2 machine runs.
"""

import os
import runpy
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


# The kernel contract's constants, loaded by path (the package itself is not importable
# before it is built) and handed to the C compiler, so that every backend compiles them.
contract = runpy.run_path(
    os.path.join(os.path.dirname(__file__), "specdec_np", "_runtime", "contract.py")
)

debug = _flag("SPECDEC_DEBUG")
use_openmp = not _flag("SPECDEC_NO_OPENMP")
vector_macros = []
if _flag("SPECDEC_NO_AVX512"):
    vector_macros = [
        ("SPECDEC_AVX512_PATH", "0"),
        ("SPECDEC_CLONES", '__attribute__((target_clones("arch=x86-64-v3", "default")))'),
    ]

compile_args = ["-O3", "-g0"] if not debug else ["-O1", "-g"]
link_args = []
if not debug and sys.platform.startswith("linux"):
    # The release extension carries no symbol table or debug sections either; Python finds
    # PyInit__core in the dynamic symbol table, which stripping keeps.
    link_args.append("-s")
if sys.platform != "win32":
    # The kernels never rely on errno from libm, and the fast log is our own code.
    compile_args += ["-fno-math-errno", "-std=c11", "-Wno-psabi"]
if use_openmp:
    if sys.platform == "win32":
        compile_args.append("/openmp")
    else:
        compile_args.append("-fopenmp")
        link_args.append("-fopenmp")

extension = Extension(
    "specdec_np._core",
    sources=["specdec_np/_core.pyx"],
    include_dirs=[
        numpy.get_include(),
        "specdec_np/_kernels/src/common",
        "specdec_np/_kernels/src/cpu",
    ],
    define_macros=[
        ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
        ("SPECDEC_OPENMP", "1" if use_openmp else "0"),
        ("SPECDEC_DEBUG_BUILD", "1" if debug else "0"),
        *contract["compile_time_macros"](),
        *vector_macros,
    ],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
)

directives = {
    "language_level": 3,
    "boundscheck": debug,
    "wraparound": debug,
    "initializedcheck": debug,
    "cdivision": True,
    "nonecheck": False,
    "embedsignature": True,
}

setup(
    ext_modules=cythonize(
        [extension],
        compiler_directives=directives,
        # Cython decides what to regenerate from timestamps, not directives: keep the C
        # of the debug build apart so that switching modes always recompiles.
        build_dir="build/cython-debug" if debug else "build/cython",
    ),
)
