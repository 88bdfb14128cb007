"""CPU-side checks of the CUDA backend, for machines without a GPU.

* Every CUDA source of :mod:`specdec_np._kernels.cuda` (a ``.cu`` file of
  ``specdec_np/_kernels/src/cuda/``
  with its includes expanded) is compiled to PTX with ``nvcc`` for ``sm_90`` and for the
  oldest architecture >= ``sm_75`` that this ``nvcc`` lists, with every template
  instantiation the CuPy backend asks for, so a syntax or template error in a kernel file
  fails CI on any machine with the CUDA toolkit (skipped where there is no ``nvcc``).
* A deliberately broken source must fail through the same helper (negative control).
* ``import specdec_np._kernels.cuda`` must not import CuPy.
* One source of the per-element maths: the CUDA files restate no formula of the shared
  header ``specdec_np/_kernels/src/common/elementwise.h`` (its constants and the
  transcendental calls appear
  there only), and the CPU build includes the very header that every CUDA source carries.
* The kernels' *logic* runs on the CPU: the very same sources (and so the same shared
  header) are compiled with the host C++ compiler against a small emulation of the CUDA
  features they use (every CUDA thread of a block is a fiber, ``__syncthreads`` a
  scheduling point, so a divergent barrier is caught too), each source as a translation
  unit of its own as on the device, and must agree with the CPU kernels of
  ``specdec_np._core`` on the same
  inputs: ``verify_chains_kernel`` instantiated for every verifier of the registry against
  ``_core.verify_chains`` on 2,000 random batches (padded and ragged, dense and point-mass
  drafts, every dtype pair, boundary uniforms, negative and NaN draft entries, float64 rows
  whose residual sums overflow, bad ids, rows without mass): identical row status,
  decisions and written cells; residual draws equal except where ``v * Z`` lies within
  rounding of a CDF boundary, and block decisions except where ``eta_i`` lies within
  rounding of ``h_i`` (both checked explicitly).  Mutated sources (negative controls, one
  per rule: the draft in the residual, negative draft entries, overflow rescaling, argmax
  ties, block verification's top-down scan) must disagree.
* ``verify_trees_kernel`` against ``_core.verify_trees`` on random trees (every walk, both
  dtypes of each kind, mixed batches, zero-node requests, wide sibling lists, repeated sibling
  tokens, bad ids, rows without mass): identical statuses and written cells, except where a
  uniform lies within rounding of a boundary (a nudge of that uniform gives the CPU the
  emulated result); five mutated tree kernels must disagree.
* A method code outside the registry is an error status (``_contract.STATUS_BAD_METHOD``),
  never a walk of another method.
* The launch surface ``_cuda.core_like`` runs against a stand-in ``cupy`` whose kernels
  are the emulated ones: argument order, instantiation, launch shape, memory guards.

None of these needs a GPU or CuPy.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_headers import build_library
from draw_checks import assert_draw_consistent, weighted_residual

from specdec_np import registry
from specdec_np._kernels import cuda as _cuda
from specdec_np._layouts import tree_links as _tree_links
from specdec_np._reference import chains as _reference
from specdec_np._runtime import contract as _contract

# Compiles and emulates every CUDA source (minutes on 2 cores): the full suite only.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
NEWEST_ARCH = 90
OLDEST_ARCH = 75
# verify_trees for two architectures takes about 80 s on 2 idle cores and over 200 s under
# load: the limit catches a hung compiler, not a slow machine.
COMPILE_TIMEOUT_S = 600


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    candidates = []
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(Path(cuda_home) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def nvcc() -> str:
    path = _find_nvcc()
    if path is None:
        pytest.skip("nvcc not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin")
    return path


@pytest.fixture(scope="module")
def archs(nvcc: str) -> list[str]:
    """``sm_90`` plus the oldest architecture >= ``sm_75`` that this ``nvcc`` supports."""
    result = subprocess.run(
        [nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=False
    )
    listed = sorted(
        {int(m) for m in re.findall(r"compute_(\d+)", result.stdout)}
        if result.returncode == 0
        else set()
    )
    if not listed:  # an nvcc without --list-gpu-arch: assume the usual range
        listed = [OLDEST_ARCH, NEWEST_ARCH]
    if NEWEST_ARCH not in listed:
        pytest.skip(f"this nvcc cannot target sm_{NEWEST_ARCH} (lists {listed})")
    older = [a for a in listed if OLDEST_ARCH <= a < NEWEST_ARCH]
    if not older:
        pytest.skip(f"this nvcc lists no architecture in [sm_{OLDEST_ARCH}, sm_{NEWEST_ARCH})")
    return [f"sm_{NEWEST_ARCH}", f"sm_{older[0]}"]


def _translation_unit(source: str, names: list[str]) -> str:
    """The source plus a host function that takes every kernel's address.

    Taking ``&kernel<...>`` instantiates each template exactly as CuPy's ``name_expressions``
    does, and fails to compile if a name expression does not match the source.
    """
    table = ",\n        ".join(f"reinterpret_cast<void*>(&{name})" for name in names)
    return (
        f"{source}\n\n"
        "// ---- test-only: instantiate every name expression ----\n"
        "void* specdec_test_instance(int i) {\n"
        f"    void* const table[] = {{\n        {table}}};\n"
        "    return table[i];\n"
        "}\n"
    )


def _compile_ptx(
    nvcc: str, tmp_path: Path, stem: str, source: str, names: list[str], archs: list[str]
) -> list[tuple[str, int, str, str]]:
    """Compile ``source`` to PTX for each arch (in parallel); return (arch, rc, stderr, ptx)."""
    cu = tmp_path / f"{stem}.cu"
    cu.write_text(_translation_unit(source, names))
    procs = []
    for arch in archs:
        ptx = tmp_path / f"{stem}.{arch}.ptx"
        cmd = [nvcc, "--ptx", f"-arch={arch}", "-std=c++17", str(cu), "-o", str(ptx)]
        procs.append((arch, ptx, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
    results = []
    for arch, ptx, proc in procs:
        try:
            _, stderr = proc.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            stderr = f"nvcc timed out after {COMPILE_TIMEOUT_S} s\n{stderr}"
        text = ptx.read_text() if proc.returncode == 0 and ptx.is_file() else ""
        results.append((arch, proc.returncode, stderr, text))
    return results


@pytest.mark.parametrize("source_name", sorted(_cuda.cuda_sources()))
def test_cuda_source_compiles_to_ptx(
    nvcc: str, archs: list[str], tmp_path: Path, source_name: str
) -> None:
    source = _cuda.cuda_sources()[source_name]
    names = _cuda.instantiation_names(source_name)
    for arch, returncode, stderr, ptx in _compile_ptx(
        nvcc, tmp_path, source_name, source, names, archs
    ):
        assert returncode == 0, f"nvcc failed for {source_name} on {arch}:\n{stderr}"
        entries = re.findall(r"^\.visible \.entry (\S+)\(", ptx, flags=re.MULTILINE)
        assert len(entries) == len(set(names)), (
            f"{source_name} on {arch}: expected one kernel entry per name expression "
            f"{names}, found {entries}"
        )


def test_broken_source_fails_to_compile(nvcc: str, archs: list[str], tmp_path: Path) -> None:
    """Negative control: the helper above must report a syntax error as a failure."""
    good = _cuda.cuda_sources()["output_formatting"]
    broken = good.replace("long long r = k;", "long long r = k", 1)
    assert broken != good, "the negative control no longer edits the source; update it"
    names = _cuda.instantiation_names("output_formatting")
    for arch, returncode, stderr, _ in _compile_ptx(
        nvcc, tmp_path, "broken", broken, names, archs[:1]
    ):
        assert returncode != 0, f"a source with a syntax error compiled on {arch}"
        assert "error" in stderr.lower()


def test_unknown_name_expression_fails_to_compile(
    nvcc: str, archs: list[str], tmp_path: Path
) -> None:
    """Negative control: a name expression that matches no template must not compile."""
    names = ["verify_chains_kernel<GreedyRow, float, int>", "no_such_kernel<float>"]
    results = _compile_ptx(
        nvcc, tmp_path, "badname", _cuda.cuda_sources()["chain_driver"], names, archs[:1]
    )
    assert results[0][1] != 0


def test_instantiation_names_cover_the_registry_and_dtypes() -> None:
    names = _cuda.instantiation_names()
    for verifier in registry.VERIFIERS:
        for prob in ("float", "double"):
            for ids in ("int", "long long"):
                assert f"verify_chains_kernel<{verifier.cuda_row}, {prob}, {ids}>" in names
    assert "create_output_kernel<int>" in names
    assert "create_output_kernel<long long>" in names
    trees = _cuda.instantiation_names("tree_driver")
    for prob in ("float", "double"):
        for ids in ("int", "long long"):
            assert f"verify_trees_kernel<{prob}, {ids}>" in trees
    assert sorted(names) == sorted(
        name for source in _cuda.cuda_sources() for name in _cuda.instantiation_names(source)
    )
    for source_name in _cuda.cuda_sources():
        for name in _cuda.instantiation_names(source_name):
            assert name.split("<")[0] in _cuda.cuda_sources()[source_name]
    with pytest.raises(KeyError):
        _cuda.instantiation_names("no_such_source")


def test_every_registry_verifier_has_its_row_functor() -> None:
    source = _cuda.cuda_sources()["chain_driver"]
    for verifier in registry.VERIFIERS:
        assert re.search(rf"^struct {verifier.cuda_row} {{$", source, flags=re.MULTILINE), (
            f"no CUDA row functor {verifier.cuda_row} for {verifier.name}"
        )
    # One skeleton: the verifier kernels are all instances of one template.
    assert len(re.findall(r"__global__", source)) == 1


def test_sources_carry_the_contract_and_launch_constants() -> None:
    for source in _cuda.cuda_sources().values():
        assert f"constexpr int kBlock = {_cuda.BLOCK_SIZE};" in source
        assert f"constexpr int kRowsPerBlock = {_cuda.CREATE_OUTPUT_BLOCK};" in source
        for name, value in _contract.compile_time_macros():
            assert f"#define {name} {value}\n" in source
        # NVRTC gets no include path from us: every file is in the source, and the only
        # includes left are the shared header's system headers, which NVRTC skips.
        assert not re.search(r'^\s*#\s*include\s*"', source, flags=re.MULTILINE)
        system = re.findall(r"^\s*#\s*include\s*<([^>]+)>", source, flags=re.MULTILINE)
        assert set(system) <= set(_guarded_system_includes()), system
    # The contract's numbers are written into the sources once, as macros, never as literals.
    body = _cuda.cuda_sources()["chain_driver"].split("namespace specdec {", 1)[1]
    for literal in ("1e-5", "1e-05", "0.0005", "5e-4", "-64"):
        assert literal not in body, f"literal {literal} in the CUDA source"


def test_import_does_not_import_cupy(tmp_path: Path) -> None:
    """Importing the module (and listing its sources) must not touch CuPy.

    A poisoned ``cupy`` package first on the path makes the test fail even where CuPy is not
    installed.
    """
    poison = tmp_path / "poison" / "cupy"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('specdec_np imported cupy')\n")
    code = textwrap.dedent(
        """
        import sys
        import specdec_np._kernels.cuda as cuda
        assert cuda.cuda_sources() and cuda.instantiation_names()
        assert "cupy" not in sys.modules, "cupy was imported"
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path / "poison"), str(REPO_ROOT), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------
# One source of the per-element maths: the shared header, and only it, holds the formulas
# ---------------------------------------------------------------------------------------------

PACKAGE_DIR = REPO_ROOT / "specdec_np"
SOURCE_DIR = PACKAGE_DIR / "_kernels" / "src"
SHARED_HEADER = SOURCE_DIR / "common" / "elementwise.h"
CPU_SOURCE_DIR = SOURCE_DIR / "cpu"
CPU_HEADERS = ("logits_law.h", "exponentials.h", "rowscan.h", "rowthreads.h", "selections.h",
               "survivors.h", "treescan.h", "shardscan.h")


def _code(text: str) -> str:
    """C or C++ text without its comments (a comment may name a formula it does not state)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL)


def _guarded_system_includes() -> list[str]:
    """The system headers of the shared header: all inside its branch for compilers other
    than NVRTC."""
    text = SHARED_HEADER.read_text()
    guarded = re.search(r"#if defined\(__CUDACC_RTC__\)(.*?)#else(.*?)#endif", text, re.DOTALL)
    assert guarded, "the shared header no longer guards its includes from NVRTC"
    assert "#include" not in guarded.group(1)
    outside = text.replace(guarded.group(0), "")
    assert not re.search(r"^\s*#\s*include", outside, flags=re.MULTILINE)
    return re.findall(r"#\s*include\s*<([^>]+)>", guarded.group(2))


# A formula's fingerprints: its float constants (hex, or decimal with six or more digits),
# its bit masks, and the libm functions that only the shared header calls.
_CONSTANT = re.compile(
    r"0x[0-9a-fA-F]*\.[0-9a-fA-F]*p[+-]?\d+f?|\b\d+\.\d{6,}(?:e[+-]?\d+)?f?"
    r"|\b0x[0-9a-fA-F]{6,}(?:u|ull|LL)?\b"
)
_LIBM_CALL = re.compile(r"\b(?:exp|expf|exp2|exp2f|log|logf|log1p|log1pf|ldexp|ldexpf)\s*\(")


def _restated_formulas(text: str) -> list[str]:
    """The shared header's formula constants and libm calls found in ``text``'s code."""
    code = _code(text)
    shared = set(_CONSTANT.findall(_code(SHARED_HEADER.read_text())))
    found = sorted({constant for constant in _CONSTANT.findall(code) if constant in shared})
    return found + sorted(set(_LIBM_CALL.findall(code)))


def _kernel_files() -> list[Path]:
    return sorted(_cuda.KERNEL_DIR.glob("*.cu")) + sorted(_cuda.KERNEL_DIR.glob("*.cuh"))


def test_no_formula_is_restated_outside_the_shared_header() -> None:
    """The CUDA files, the generated parts of the CUDA sources and the CPU headers take every
    per-element formula from ``elementwise.h``: none of its constants (the exponential's
    and the logarithm's polynomials, the keys' masks, the infinities' bits) and no libm call
    appears anywhere else."""
    texts = {str(path.relative_to(REPO_ROOT)): path.read_text() for path in _kernel_files()}
    texts.update({name: generate() for name, generate in _cuda._GENERATED.items()})
    texts.update({name: (CPU_SOURCE_DIR / name).read_text() for name in CPU_HEADERS})
    assert len(texts) > 10
    for name, text in texts.items():
        assert not _restated_formulas(text), f"{name} restates {_restated_formulas(text)}"
    # The exponential's constants, in particular, are in the shared header only.
    for constant in ("0x1.715476p+0f", "0x1.6a243ap-10f", "0x1.fffffcp-2f"):
        assert constant in SHARED_HEADER.read_text()


def test_the_restated_formula_check_catches_a_copy() -> None:
    """Negative control: the fast exponential's old CUDA copy, or a libm weight, is found."""
    copy = "float r = __fsub_rn(clamped, __fmul_rn(n_float, 0x1.63p-1f)); // exp(x)"
    assert _restated_formulas(copy) == ["0x1.63p-1f"]
    assert _restated_formulas("const double w = x == x ? exp(x) : 0.0;") == ["exp("]
    assert _restated_formulas("return bits ^ 0x80000000u;") == ["0x80000000u"]


def _extern_headers() -> set[str]:
    """The C headers that the Cython kernels declare their C functions from."""
    sources = [PACKAGE_DIR / "_core.pyx", *sorted(CPU_SOURCE_DIR.glob("*.pxi"))]
    found = set()
    for source in sources:
        found.update(re.findall(r'cdef extern from "([^"]+\.h)"', source.read_text()))
    return found


def test_cpu_build_includes_the_shared_header_of_the_cuda_sources(tmp_path: Path) -> None:
    """The headers the Cython build declares its C functions from include ``elementwise.h``
    (the dependencies the C compiler reports, with the build's include path), the very file
    whose text every CUDA source carries, and every CPU header is among what they include."""
    compilers = (os.environ.get("CC"), "cc", "gcc", "clang")
    cc = next((name for name in compilers if name and shutil.which(name)), None)
    if cc is None:
        pytest.skip("no C compiler to list the headers' dependencies")
    headers = _extern_headers()
    compiled: set[Path] = set()
    macros = [f"-D{name}={value}" for name, value in _contract.compile_time_macros()]
    for header in sorted(headers):
        result = subprocess.run(
            [cc, "-std=c11", "-MM", *macros, f"-I{SHARED_HEADER.parent}", f"-I{CPU_SOURCE_DIR}",
             str(next(folder / header for folder in (CPU_SOURCE_DIR, SHARED_HEADER.parent)
                      if (folder / header).exists()))],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        dependencies = {Path(d).resolve() for d in result.stdout.replace("\\\n", " ").split()[1:]}
        assert SHARED_HEADER.resolve() in dependencies, (header, dependencies)
        compiled |= dependencies
    assert {(CPU_SOURCE_DIR / name).resolve() for name in CPU_HEADERS} <= compiled, compiled
    text = SHARED_HEADER.read_text().rstrip("\n")
    assert _cuda._included_text("elementwise.h").rstrip("\n") == text
    for name in ("chain_driver", "tree_driver"):
        assert text in _cuda.cuda_sources()[name], name


def test_the_kernel_files_are_the_sources_and_are_packaged() -> None:
    """One ``.cu`` file per source, and the package data (wheel) and the manifest (sdist)
    carry every kernel file and the shared header."""
    assert {path.stem for path in _cuda.KERNEL_DIR.glob("*.cu")} == set(_cuda.SOURCE_NAMES)
    assert sorted(_cuda.cuda_sources()) == sorted(_cuda.SOURCE_NAMES)
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    data = re.search(r'^"specdec_np\._kernels" = \[(.*?)\]', pyproject,
                     flags=re.MULTILINE | re.DOTALL)  # fmt: skip
    assert data, "no package-data for specdec_np._kernels in pyproject.toml"
    patterns = re.findall(r'"([^"]+)"', data.group(1))
    # The manifest's recursive-include lines: (folder, file patterns).
    manifest = [
        (REPO_ROOT / line.split()[1], line.split()[2:])
        for line in (REPO_ROOT / "MANIFEST.in").read_text().splitlines()
        if line.startswith("recursive-include ")
    ]
    files = [*_kernel_files(), SHARED_HEADER, *(CPU_SOURCE_DIR / name for name in CPU_HEADERS)]
    for path in files:
        relative = path.relative_to(PACKAGE_DIR / "_kernels")
        assert any(relative.match(pattern) for pattern in patterns), f"{relative} not packaged"
        assert any(
            path.is_relative_to(folder) and any(path.match(pattern) for pattern in names)
            for folder, names in manifest
        ), f"{path.relative_to(REPO_ROOT)} not in MANIFEST"


# ---------------------------------------------------------------------------------------------
# The kernels' logic, emulated on the CPU and compared with specdec_np._core
# ---------------------------------------------------------------------------------------------

_EMULATION_PRELUDE = r"""
// Single-threaded CPU emulation of the CUDA subset used by specdec_np's kernels (the shared
// header elementwise.h takes its C++ path here: __CUDACC__ is not defined). Every CUDA
// thread of a block is a fiber (started with makecontext, switched with _setjmp/_longjmp,
// which save no signal mask and so cost nanoseconds, not a system call); __syncthreads()
// yields to a scheduler that runs each fiber up to its next barrier, round after round. A
// round in which some threads of a block finished while others wait at a barrier (a
// divergent __syncthreads) sets an error.
#undef _FORTIFY_SOURCE  // its longjmp check refuses jumps onto another stack
#include <ucontext.h>
#include <setjmp.h>
#include <math.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>
struct EmuDim3 { unsigned x = 0, y = 0, z = 0; };
static EmuDim3 threadIdx, blockIdx, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict
struct EmuFiber { jmp_buf jump; ucontext_t start; bool started; bool done; };
static jmp_buf emu_scheduler;
static std::vector<EmuFiber> emu_fibers;
static std::vector<char> emu_stacks;
static int emu_current = 0;
static int emu_errors = 0;
static int emu_block_size = 0;
static std::function<void()> emu_body;
// Runs fiber t from where it stopped (or from its start).
static void emu_enter(int t) {
    emu_current = t;
    threadIdx.x = (unsigned)t;
    EmuFiber& fiber = emu_fibers[t];
    if (fiber.started) _longjmp(fiber.jump, 1);
    fiber.started = true;
    setcontext(&fiber.start);
}
// The rest of a round: the next unfinished fiber after the current one, else the scheduler.
// Fibers hand over to each other directly, one jump per switch.
static void emu_next() {
    for (int t = emu_current + 1; t < emu_block_size; ++t) {
        if (!emu_fibers[t].done) emu_enter(t);
    }
    _longjmp(emu_scheduler, 1);
}
static void emu_yield() {
    if (!_setjmp(emu_fibers[emu_current].jump)) emu_next();
}
static void __syncthreads() { emu_yield(); }
template <class T> T atomicAdd(T* a, T v) { T old = *a; *a = old + v; return old; }
template <class T> T atomicMin(T* a, T v) { T old = *a; if (v < old) *a = v; return old; }
template <class T> T atomicMax(T* a, T v) { T old = *a; if (v > old) *a = v; return old; }
// A fiber runs the body once per block and then waits for the next block, so that fibers
// (and their stacks) are made once per process, not once per block.
static void emu_trampoline() {
    for (;;) {
        emu_body();
        emu_fibers[emu_current].done = true;
        emu_yield();
    }
}
// Kernel frames are small; a canary at the bottom of every stack catches an overflow.
static const size_t emu_stack = 16 * 1024;
static const size_t emu_canary = 256;
static void emu_check_stacks() {
    for (size_t t = 0; t < emu_fibers.size(); ++t) {
        for (size_t i = 0; i < emu_canary; ++i) {
            if (emu_stacks[emu_stack * t + i] != (char)0x5a) {
                ++emu_errors;
                std::fprintf(stderr, "fiber %zu overflowed its stack\n", t);
                return;
            }
        }
    }
}
static void emu_make_fibers(int block) {
    const size_t stack = emu_stack;
    if ((int)emu_fibers.size() >= block) return;
    emu_fibers.assign(block, EmuFiber{});  // the old fibers are between blocks: drop them
    emu_stacks.assign(stack * block, (char)0x5a);
    ucontext_t model;
    getcontext(&model);
    for (int t = 0; t < block; ++t) {
        emu_fibers[t].start = model;
        emu_fibers[t].start.uc_stack.ss_sp = emu_stacks.data() + stack * t;
        emu_fibers[t].start.uc_stack.ss_size = stack;
        emu_fibers[t].start.uc_link = nullptr;
        makecontext(&emu_fibers[t].start, emu_trampoline, 0);
    }
}
static void emu_launch(long long grid, int block, std::function<void()> body) {
    emu_make_fibers(block);
    emu_block_size = block;
    emu_body = std::move(body);
    gridDim.x = (unsigned)grid;
    for (long long b = 0; b < grid; ++b) {
        blockIdx.x = (unsigned)b;
        for (int t = 0; t < block; ++t) emu_fibers[t].done = false;
        for (;;) {
            if (!_setjmp(emu_scheduler)) {
                emu_current = -1;
                emu_next();
            }
            int finished = 0;
            for (int t = 0; t < block; ++t) finished += emu_fibers[t].done;
            if (finished == block) break;
            if (finished > 0) {
                ++emu_errors;
                std::fprintf(stderr, "divergent __syncthreads in block %lld\n", b);
                // Fibers stopped inside the body cannot start the next block: make new ones.
                emu_fibers.clear();
                emu_make_fibers(block);
                break;
            }
        }
    }
    emu_check_stacks();
}
extern "C" int emu_errors_seen() { return emu_errors; }
"""

# The parameter list of each kernel template (P: probability type, I: id type) and its
# launch configuration, as the launchers of specdec_np._kernels.cuda use them.
_KERNEL_SIGNATURES = {
    "verify_chains_kernel": (
        "const P* target_rows, const P* draft_rows, const I* draft_token_ids, "
        "const I* bonus_token_ids, const long long* draft_offsets, const double* uniforms, "
        "long long uniform_width, const double* parameters, long long batch, "
        "long long num_drafts, long long vocab, long long width, long long* output, "
        "long long* accepted_lengths, long long* num_accepted, long long* row_status, "
        "const signed char* request_methods, long long causal, long long draw_bonus, "
        "const double* sampling, P* scratch, long long target_logits, long long draft_logits, "
        "long long bonus_rows, const int* target_mask, const long long* target_entry_offsets, "
        "const long long* target_entry_ids, const P* target_entry_values, "
        "const int* draft_mask, const long long* draft_entry_offsets, "
        "const long long* draft_entry_ids, const P* draft_entry_values, long long mask_words, "
        "P* adjusted",
        "batch, specdec::kBlock",
    ),
    "verify_trees_kernel": (
        "const P* target_rows, const P* draft_rows, const I* draft_token_ids, "
        "const long long* tree_parents, const long long* node_offsets, "
        "const long long* first_child, const long long* next_sibling, "
        "const long long* next_distinct_sibling, const signed char* repeated_token, "
        "const double* uniforms, long long uniform_count, const signed char* request_methods, "
        "long long method, "
        "long long batch, long long num_nodes, long long vocab, long long depth_width, "
        "double* working, long long* accepted_nodes, long long* output, "
        "long long* accepted_lengths, long long* row_status, const double* sampling, "
        "P* scratch, long long target_logits, long long draft_logits, "
        "const int* target_mask, const long long* target_entry_offsets, "
        "const long long* target_entry_ids, const P* target_entry_values, "
        "const int* draft_mask, const long long* draft_entry_offsets, "
        "const long long* draft_entry_ids, const P* draft_entry_values, long long mask_words, "
        "P* adjusted",
        "batch, specdec::kBlock",
    ),
    "processed_rows_kernel": (
        "const P* logits, long long rows, long long vocab, const double* sampling, P* out",
        "rows, specdec::kBlock",
    ),
    "shard_stats_kernel": (
        "const P* rows, long long count, long long width, const P* temperature, "
        "long long groups, double* stats, P* group_max",
        "count, specdec::kBlock",
    ),
    "shard_argmax_kernel": (
        "const P* rows, long long count, long long width, long long start, double* table",
        "count, specdec::kBlock",
    ),
    "shard_weights_kernel": (
        "const P* rows, long long width, const long long* indices, long long count, "
        "const P* temperature, const P* z_max, const P* cutoff, P* weights, double* masses",
        "count, specdec::kBlock",
    ),
    "shard_at_least_kernel": (
        "const P* rows, long long width, const long long* indices, long long count, "
        "const P* temperature, const P* thresholds, const long long* offsets, "
        "long long* counts, long long* columns, P* values",
        "count, specdec::kBlock",
    ),
    "shard_exp_kernel": (
        "const P* x, const P* z_max, long long count, P* out",
        "(count + specdec::kBlock - 1) / specdec::kBlock, specdec::kBlock",
    ),
    "shard_divided_kernel": (
        "const P* weights, long long width, const long long* indices, long long count, "
        "const double* divisors, double* out, const long long* out_rows",
        "count, specdec::kBlock",
    ),
    "shard_residuals_kernel": (
        "double* rows, long long width, const long long* indices, long long count, "
        "const double* scale, const double* q",
        "count, specdec::kBlock",
    ),
    "shard_positive_sums_kernel": (
        "const double* rows, long long count, long long width, double* sums",
        "(count + specdec::kWarp - 1) / specdec::kWarp, specdec::kWarp",
    ),
    "shard_first_crossings_kernel": (
        "const double* rows, long long width, const long long* indices, long long count, "
        "const double* inside, long long* found",
        "(count + specdec::kWarp - 1) / specdec::kWarp, specdec::kWarp",
    ),
    "create_output_kernel": (
        "const unsigned char* accepted, const I* substitute_token_ids, "
        "const I* draft_token_ids, const I* bonus_token_ids, long long batch, long long k, "
        "long long vocab, long long* output, long long* accepted_lengths, "
        "long long* num_accepted, long long* row_status",
        "(batch + specdec::kRowsPerBlock - 1) / specdec::kRowsPerBlock, specdec::kRowsPerBlock",
    ),
}


def _symbol(name_expression: str) -> str:
    """The C symbol of the emulated launch of a name expression."""
    return "emu_" + re.sub(r"\W+", "_", name_expression).strip("_")


def _emulation_unit(name: str, source: str) -> str:
    """One C++ translation unit for one source, as the device compiles each source on its
    own: the prelude, the source, and one ``extern "C"`` launch per name expression of
    :func:`_cuda.instantiation_names`."""
    parts = [_EMULATION_PRELUDE, source]
    for expression in _cuda.instantiation_names(name):
        template, _, arguments = expression.rstrip(">").partition("<")  # or a plain name
        types = arguments.split(", ")
        prob = next((t for t in types if t in ("float", "double")), "float")
        ids = next((t for t in types if t in ("int", "long long")), "long long")
        parameters, launch = _KERNEL_SIGNATURES[template]
        parameters = re.sub(r"\bP\b", prob, re.sub(r"\bI\b", ids, parameters))
        names = ", ".join(part.split()[-1].lstrip("*") for part in parameters.split(", "))
        parts.append(
            f'extern "C" void {_symbol(expression)}({parameters}) {{\n'
            f"    emu_launch({launch}, [&] {{ {expression}({names}); }});\n}}\n"
        )
    return "\n".join(parts)


class Emulation:
    """The emulated kernels of several sources, one shared library each: a launch symbol is
    looked up in every library, and ``emu_errors_seen`` adds up their errors."""

    def __init__(self, libraries: list[Any]) -> None:
        self._libraries = libraries

    def emu_errors_seen(self) -> int:
        return sum(int(library.emu_errors_seen()) for library in self._libraries)

    def __getattr__(self, symbol: str) -> Any:
        for library in self._libraries:
            try:
                return getattr(library, symbol)
            except AttributeError:
                continue
        raise AttributeError(f"no emulated kernel {symbol}")


def _find_cxx() -> str | None:
    for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build_emulation(tmp: Path, stem: str, sources: dict[str, str]) -> Emulation:
    """Each source (name to text) emulated in a shared library of its own, compiled in
    parallel."""
    units = {f"{stem}_{name}": _emulation_unit(name, text) for name, text in sources.items()}
    return Emulation(_compile_libraries(tmp, units))


def _compile_library(tmp: Path, stem: str, unit: str) -> Any:
    """``unit`` (C++ with the emulation prelude) as a loaded shared library."""
    return _compile_libraries(tmp, {stem: unit})[0]


def _compile_libraries(tmp: Path, units: dict[str, str]) -> list[Any]:
    """Each unit (stem to C++ with the emulation prelude) as a loaded shared library; the
    compilers run in parallel."""
    import ctypes

    if not sys.platform.startswith("linux"):
        pytest.skip("the kernel emulation uses ucontext fibers (Linux only)")
    cxx = _find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (g++, clang++ or $CXX) for the kernel emulation")
    cmd = [cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-w"]
    running = []
    for stem, unit in units.items():
        cpp = tmp / f"{stem}.cpp"
        lib = tmp / f"lib{stem}.so"
        cpp.write_text(unit)
        process = subprocess.Popen(
            [*cmd, str(cpp), "-o", str(lib)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running.append((stem, lib, process))
    libraries = []
    for stem, lib, process in running:
        try:
            _, stderr = process.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        assert process.returncode == 0, f"host compile of {stem} failed:\n{stderr}"
        libraries.append(ctypes.CDLL(str(lib)))
    return libraries


@pytest.fixture(scope="module")
def core() -> Any:
    return pytest.importorskip("specdec_np._core", reason="the CPU kernels are not built")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Emulation:
    return _build_emulation(tmp_path_factory.mktemp("emu"), "emu", _cuda.cuda_sources())


def _ptr(array: np.ndarray | None) -> Any:
    import ctypes

    return None if array is None else ctypes.c_void_p(array.ctypes.data)



class Chains:
    """One ``verify_chains`` call's inputs, in the flat layout of
    ``specdec_np._layouts.padded``."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update({"target_logits": True, "draft_logits": True, **fields})

    def row_forms(self) -> tuple[Any, Any]:
        """The kernels' ``target_logits`` and ``draft_logits`` arguments."""
        import ctypes

        return ctypes.c_longlong(int(self.target_logits)), ctypes.c_longlong(
            int(self.draft_logits)
        )

    @property
    def batch(self) -> int:
        return int(self.bonus.shape[0])

    def request(self, b: int) -> tuple[np.ndarray, Any, np.ndarray, int]:
        """Request b's target rows [k_b + 1, V], draft rows (None: point mass), ids, k_b."""
        start, stop = int(self.offsets[b]), int(self.offsets[b + 1])
        rows = self.target[start + b : stop + b + 1]
        draft = None if self.draft is None else self.draft[start:stop]
        return rows, draft, self.ids[start:stop], stop - start

    def buffers(self, width: int) -> list[np.ndarray]:
        """Outputs filled with a sentinel, so that cells a kernel leaves alone are compared."""
        return [np.full((self.batch, width), -7, np.int64)] + [
            np.full(self.batch, -7, np.int64) for _ in range(3)
        ]


def _run_cpu(core: Any, method: int, c: Chains, parameters: np.ndarray) -> list[np.ndarray]:
    out = c.buffers(c.width)
    draft = c.target if c.draft is None else c.draft
    core.verify_chains(
        method, c.target, draft, c.draft is None, c.ids, c.bonus, c.offsets, c.uniforms,
        parameters, *out, 1,
    )  # fmt: skip
    return out


def _no_adjustments() -> tuple[Any, ...]:
    """The chain kernel's sampling-surface arguments of a call without settings."""
    import ctypes

    return (None,) * 8 + (ctypes.c_longlong(0), None)


def _run_emulated(
    lib: Any, verifier: registry.Verifier, c: Chains, parameters: np.ndarray, out: Any = None
) -> list[np.ndarray]:
    import ctypes

    out = c.buffers(c.width) if out is None else out
    name = _cuda._verify_name(verifier.cuda_row, c.target.dtype, c.ids.dtype)
    sizes = [ctypes.c_longlong(n) for n in (c.batch, c.ids.shape[0], c.target.shape[1], c.width)]
    getattr(lib, _symbol(name))(
        _ptr(c.target), _ptr(c.draft), _ptr(c.ids), _ptr(c.bonus), _ptr(c.offsets),
        _ptr(c.uniforms), ctypes.c_longlong(c.uniforms.shape[1]), _ptr(parameters), *sizes,
        *(_ptr(a) for a in out), None, ctypes.c_longlong(0), ctypes.c_longlong(0), None, None,
        *c.row_forms(), ctypes.c_longlong(1), *_no_adjustments(),
    )  # fmt: skip
    return out


def _probabilities(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, kind: str) -> Any:
    if kind == "ties":
        return rng.choice(np.array([0.0, 0.125, 0.25], dtype=dtype), size=shape)
    if kind == "noise":  # unnormalised, as vLLM's typical-acceptance tests use
        return rng.random(shape).astype(dtype)
    if kind == "huge":  # float64 rows whose residual sums overflow: the kernels must rescale
        return (rng.random(shape) * 1.5e308).astype(dtype)
    logits = rng.standard_normal(shape) * (4.0 if kind == "peaked" else 1.0)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if kind == "sparse":
        p[rng.random(shape) < 0.7] = 0.0
    return p.astype(dtype)


def _misaligned(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    """The same values in a C-contiguous array whose start is 1-3 elements off alignment."""
    offset = int(rng.integers(1, 4))
    buffer = np.empty(array.size + offset, array.dtype)
    view = buffer[offset:].reshape(array.shape)
    view[...] = array
    return view


FLOAT_TYPES = (np.float32, np.float64)
ID_TYPES = (np.int32, np.int64)
VOCABULARIES = (1, 2, 7, 33, 64, 513, 1000, 2049, 9000)
VOCABULARY_WEIGHTS = np.array([2, 3, 4, 4, 3, 2, 2, 1, 1], dtype=np.float64)


def _boundary_uniforms(rng: np.random.Generator, uniforms: np.ndarray) -> None:
    """Sometimes set every uniform, or some cells, to a boundary value (0, 0.5, below 1)."""
    extreme = rng.random()
    if extreme < 0.1:
        uniforms[:] = np.nextafter(1.0, 0.0)
    elif extreme < 0.2:
        uniforms[:] = 0.0
    elif extreme < 0.35:  # boundary values cell by cell
        cells = rng.random(uniforms.shape) < 0.4
        uniforms[cells] = rng.choice([0.0, np.nextafter(1.0, 0.0), 0.5], cells.sum())


def _spoilt_rows(rng: np.random.Generator, target: np.ndarray, draft: Any) -> tuple[Any, Any]:
    """Sometimes a NaN or all-zero target row (a row without mass where one is drawn), and
    target or draft rows that start off alignment."""
    if rng.random() < 0.15:
        target[rng.integers(target.shape[0])] = rng.choice([np.nan, 0.0])
    if rng.random() < 0.3:
        target = _misaligned(rng, target)
    if draft is not None and rng.random() < 0.3:
        draft = _misaligned(rng, draft)
    return target, draft


def _case(
    rng: np.random.Generator,
    prob_dtype: Any = None,
    id_dtype: Any = None,
    point_mass: bool | None = None,
    padded: bool | None = None,
) -> Chains:
    """Random chains: padded or ragged (some k_b = 0), dense or point-mass drafts, both
    dtypes of each kind, boundary uniforms, negative and NaN draft entries, rows whose
    float64 residual sums overflow, bad ids, rows without mass, misaligned rows.  The
    keyword arguments fix a choice instead of drawing it."""
    batch = int(rng.integers(1, 5))
    padded = rng.random() < 0.5 if padded is None else padded
    if padded:
        lengths = np.full(batch, int(rng.integers(1, 5)))
    else:
        lengths = rng.integers(0, 5, batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    num_drafts = int(offsets[-1])
    vocab = int(rng.choice(VOCABULARIES, p=VOCABULARY_WEIGHTS / VOCABULARY_WEIGHTS.sum()))
    pdt = (np.float32, np.float64)[int(rng.integers(2))] if prob_dtype is None else prob_dtype
    idt = (np.int32, np.int64)[int(rng.integers(2))] if id_dtype is None else id_dtype
    kinds = ["flat", "peaked", "sparse", "ties", "noise"] + (["huge"] if pdt == np.float64 else [])
    kind = str(rng.choice(kinds))
    target = _probabilities(rng, (num_drafts + batch, vocab), pdt, kind)
    draft = None
    if not (rng.random() < 0.5 if point_mass is None else point_mass):
        draft_kind = "huge" if kind == "huge" and rng.random() < 0.5 else "flat"
        draft = _probabilities(rng, (num_drafts, vocab), pdt, draft_kind)
        if rng.random() < 0.2:  # negative and NaN draft entries count as 0
            spoilt = rng.random(draft.shape) < 0.3
            draft[spoilt] = rng.choice(np.array([-0.5, np.nan, -0.0], dtype=pdt), spoilt.sum())
    ids = np.empty(num_drafts, idt)
    for b in range(batch):
        for i in range(int(offsets[b]), int(offsets[b + 1])):
            row = target[i + b] if draft is None else draft[i]
            w = np.nan_to_num(row.astype(np.float64), nan=0.0).clip(0.0, 1e300)
            good = w.sum() > 0 and rng.random() < 0.8
            ids[i] = rng.choice(vocab, p=w / w.sum()) if good else rng.integers(0, vocab)
    bonus = rng.integers(0, vocab, size=batch).astype(idt)
    width = int(lengths.max()) + 1
    uniforms = rng.random((batch, width + int(rng.integers(0, 3))))
    _boundary_uniforms(rng, uniforms)
    if rng.random() < 0.15:  # an out-of-range id
        if num_drafts and rng.random() < 0.6:
            ids[rng.integers(num_drafts)] = rng.choice([-1, vocab, vocab + 5])
        else:
            bonus[rng.integers(batch)] = rng.choice([-1, vocab])
    target, draft = _spoilt_rows(rng, target, draft)
    if rng.random() < 0.15:  # outputs wider than the longest chain
        width += int(rng.integers(1, 3))
    posterior = np.array([rng.choice([0.09, 0.3, 0.7]), rng.choice([0.3, 0.05, 0.0])])
    return Chains(
        target=target, draft=draft, ids=ids, bonus=bonus, offsets=offsets, uniforms=uniforms,
        width=width, posterior=posterior, kind=kind,
    )  # fmt: skip


def _q_row(draft: Any, ids: np.ndarray, i: int, vocab: int) -> np.ndarray:
    """Draft row i of a request, or its point mass at x_i."""
    return np.eye(1, vocab, int(ids[i]))[0] if draft is None else draft[i]


def _residual(rows: np.ndarray, draft: Any, ids: np.ndarray, r: int, rho: float) -> np.ndarray:
    """The draw weights at position r, scaled as the kernels scale an overflowing sum."""
    weights = weighted_residual(rows[r], _q_row(draft, ids, r, rows.shape[1]), rho)
    with np.errstate(over="ignore"):
        overflows = np.isinf(weights.sum())
    if overflows:
        weights = weights * 2.0**_contract.OVERFLOW_EXPONENT
    return weights


#: How far the emulated and the CPU kernels' float64 sums (the same terms in another order,
#: V of a few hundred at most) may move a compared quantity, relative to it: the ``delta``
#: of the reference's knife-edge rule (:class:`specdec_np._reference.chains.Decisions`),
#: whose floors add each verifier's own rounding (typical acceptance's float32 logarithms).
EMULATION_ROUNDING = 1e-12


def _decisions(verifier: registry.Verifier, c: Chains, b: int) -> Any:
    """The reference's decisions of request ``b`` under ``verifier`` (its registry entry
    names them): how close each is to its boundary, and the residual's scale ``rho``."""
    rows, draft, ids, _ = c.request(b)
    parameters = dict(zip(verifier.parameter_names, (float(v) for v in c.posterior)))
    with np.errstate(all="ignore"):
        return _reference.decisions_for(verifier)(rows, draft, ids, c.uniforms[b], **parameters)


class Comparison:
    """Counts of what the emulated kernels were compared on, and every disagreement."""

    def __init__(self) -> None:
        self.cases = 0
        self.requests = 0
        self.draws = 0
        self.boundary_draws = 0
        self.close_decisions = 0
        self.problems: list[str] = []


def _compare_request(
    verifier: registry.Verifier, c: Chains, b: int, mine: list, cpu: list, where: str,
    tally: Comparison,
) -> None:  # fmt: skip
    out, lengths, passed, status = mine
    cpu_out, cpu_lengths, cpu_passed, cpu_status = cpu
    rows, draft, ids, k = c.request(b)
    if status[b] != cpu_status[b]:
        tally.problems.append(f"{where}: row {b} status {status[b]} != CPU {cpu_status[b]}")
        return
    if (lengths[b], passed[b]) != (cpu_lengths[b], cpu_passed[b]):
        # Two summation orders may decide differently only on a knife edge of the
        # verifier's own rule; an exact rule (greedy's comparisons) has none.
        close = status[b] == 0 and _decisions(verifier, c, b).knife_edge(EMULATION_ROUNDING)
        if close:
            tally.close_decisions += 1
        else:
            tally.problems.append(
                f"{where}: row {b} (accepted length, count) = ({lengths[b]}, {passed[b]}) != "
                f"CPU ({cpu_lengths[b]}, {cpu_passed[b]})"
            )
        return
    r = int(lengths[b])
    if status[b] != 0 or np.array_equal(out[b], cpu_out[b]):
        if status[b] == 0 and verifier.stochastic and r < k:
            tally.draws += 1
        if not np.array_equal(out[b], cpu_out[b]):
            tally.problems.append(f"{where}: row {b} output {out[b]} != CPU {cpu_out[b]}")
        return
    others = np.arange(c.width) != r
    if not np.array_equal(out[b][others], cpu_out[b][others]) or not (
        verifier.stochastic and r < k
    ):
        tally.problems.append(f"{where}: row {b} output {out[b]} != CPU {cpu_out[b]}")
        return
    tally.draws += 1
    rho = float(_decisions(verifier, c, b).rho[r])
    weights = _residual(rows, draft, ids, r, rho)
    try:
        assert_draw_consistent(
            out[b, r], cpu_out[b, r], weights, c.uniforms[b, k], names=("emulated", "CPU")
        )
        tally.boundary_draws += 1
    except AssertionError as error:
        tally.problems.append(f"{where}: row {b}: {error}")


def _compare(lib: Any, core: Any, seed: int, cases: int) -> Comparison:
    """Every verifier of the registry, emulated CUDA against ``_core.verify_chains``."""
    rng = np.random.default_rng(seed)
    tally = Comparison()
    for number in range(cases):
        c = _case(rng)
        tally.cases += 1
        for verifier in registry.VERIFIERS:
            method = verifier.code
            parameters = c.posterior if verifier.parameters else np.empty(0)
            shape = "padded" if len(set(np.diff(c.offsets))) == 1 else "ragged"
            where = (
                f"case {number} {verifier.name} {shape} {c.kind} V={c.target.shape[1]} "
                f"{c.target.dtype} {c.ids.dtype} {'point mass' if c.draft is None else 'dense'}"
            )
            with np.errstate(all="ignore"):
                cpu = _run_cpu(core, method, c, parameters)
                mine = _run_emulated(lib, verifier, c, parameters)
            tally.requests += c.batch
            for b in range(c.batch):
                _compare_request(verifier, c, b, mine, cpu, where, tally)
    if lib.emu_errors_seen():
        tally.problems.append("a divergent __syncthreads was detected")
    return tally


EMULATED_CASES = 2000


def test_emulated_kernels_match_cpu_kernels(emulated: Any, core: Any) -> None:
    """The CUDA skeleton and every row functor agree with the CPU driver on random cases:
    statuses, decisions, counts and the cells written (a sentinel marks those left alone);
    residual draws are equal or straddle a CDF boundary within rounding."""
    tally = _compare(emulated, core, seed=20240611, cases=EMULATED_CASES)
    assert not tally.problems, "\n".join(tally.problems[:20])
    print(
        f"\nemulated {tally.cases} cases, {tally.requests} requests x verifier, "
        f"{tally.draws} residual draws ({tally.boundary_draws} differing at a CDF boundary), "
        f"{tally.close_decisions} decisions within rounding of their threshold"
    )
    # The random cases must exercise what they claim to.
    assert tally.draws > 1000 and tally.close_decisions < tally.cases // 100


def test_emulated_create_output_matches_cpu_kernel(emulated: Any, core: Any) -> None:
    import ctypes

    rng = np.random.default_rng(7)
    for _ in range(30):
        batch, k, vocab = int(rng.integers(0, 300)), int(rng.integers(1, 5)), 50
        idt = (np.int32, np.int64)[int(rng.integers(2))]
        accepted = (rng.random((batch, k)) < 0.6).view(np.uint8)
        low = -1 if rng.random() < 0.3 else 0
        high = vocab + 1 if rng.random() < 0.3 else vocab
        sub, d = (rng.integers(low, high, (batch, k)).astype(idt) for _ in range(2))
        bo = rng.integers(low, high, batch).astype(idt)
        out = [np.full((batch, k + 1), -7, np.int64)]
        out += [np.full(batch, -7, np.int64) for _ in range(3)]
        function = getattr(emulated, _symbol(_cuda._create_output_name(idt)))
        sizes = (ctypes.c_longlong(n) for n in (batch, k, vocab))
        function(_ptr(accepted), _ptr(sub), _ptr(d), _ptr(bo), *sizes, *(_ptr(a) for a in out))
        cpu = [np.full_like(a, -7) for a in out]
        core.create_output(accepted, sub, d, bo, vocab, *cpu)
        for mine, theirs in zip(out, cpu):  # the same cells written, with the same values
            assert np.array_equal(mine, theirs)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"mutation target {old!r} is not in the source; update the mutation"
    return text.replace(old, new)


_MUTATIONS: dict[str, Callable[[str], str]] = {
    # The residual forgets the draft: tokens drawn from p instead of max(p - q, 0).
    "residual_ignores_draft": lambda s: _replace(s, "HasQ ? static_cast<double>(qv) : ", ""),
    # Negative and NaN draft entries used as they are (the CUDA source's copy of the shared
    # header's clean value: the CPU kernels keep theirs).
    "draft_not_cleaned": lambda s: _replace(
        s, "return x > 0.0 ? x : 0.0;", "return x == x ? x : 0.0;"
    ),
    # An overflowing residual sum drawn without rescaling (v * inf picks the last token).
    "no_overflow_rescale": lambda s: _replace(s, "if (total == infinity()) {", "if (false) {"),
    # Ties go to the last index instead of the first.
    "argmax_last_on_ties": lambda s: _replace(
        s, "(v == r.value[t] && i < r.index[t])", "(v == r.value[t])"
    ),
    # Block verification stops at the first failed check, scanning upward (the classic
    # wrong implementation: a later position can no longer rescue an earlier failure).
    "block_stops_at_first_failure": lambda s: _replace(
        _replace(
            s, "for (long long i = a.k; i >= 1; --i) {", "for (long long i = 1; i <= a.k; ++i) {"
        ),
        "                tau = i;\n                break;\n",
        "                tau = i;\n            } else {\n                break;\n",
    ),
}


@pytest.mark.parametrize("mutation", sorted(_MUTATIONS))
def test_emulation_detects_mutated_kernels(
    core: Any, tmp_path_factory: pytest.TempPathFactory, mutation: str
) -> None:
    """Negative controls: a wrong kernel must disagree with the CPU kernels."""
    source = _cuda.cuda_sources()["chain_driver"]
    mutated = {"chain_driver": _MUTATIONS[mutation](source)}
    lib = _build_emulation(tmp_path_factory.mktemp(mutation), mutation, mutated)
    tally = _compare(lib, core, seed=20240611, cases=300)
    assert tally.problems, f"mutation {mutation} went unnoticed"


# ---------------------------------------------------------------------------------------------
# The Python launch surface, driven through a stand-in ``cupy`` whose kernels are the emulated
# ones
# ---------------------------------------------------------------------------------------------


def _fake_cupy_module() -> Any:
    """A fresh import of the stand-in CuPy of ``tests/kernels/fake_cupy`` (not put on sys.path)."""
    import importlib.util

    path = REPO_ROOT / "tests" / "kernels" / "fake_cupy" / "cupy" / "__init__.py"
    spec = importlib.util.spec_from_file_location("cupy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_cupy(emulated: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = _fake_cupy_module()
    fake._LIBRARY[:] = [emulated, _symbol]  # the emulation this module built already
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_cuda, "_MODULES", {})
    return fake


def _launch(c: Chains, method: int, parameters: np.ndarray, **moved: int) -> list[np.ndarray]:
    """``core_like.verify_chains`` on fake device arrays (``moved``: argument -> device)."""
    fake = sys.modules["cupy"]
    host = {
        "target_rows": c.target,
        "draft_rows": c.target if c.draft is None else c.draft,
        "draft_token_ids": c.ids,
        "bonus_token_ids": c.bonus,
        "draft_offsets": c.offsets,
        "uniforms": c.uniforms,
        "parameters": parameters,
    }
    a = {name: fake.ndarray(array, moved.get(name, 0)) for name, array in host.items()}
    out = [fake.asarray(buffer) for buffer in c.buffers(c.width)]
    result = _cuda.core_like.verify_chains(
        method, a["target_rows"], a["draft_rows"], c.draft is None, a["draft_token_ids"],
        a["bonus_token_ids"], a["draft_offsets"], a["uniforms"], a["parameters"], *out, 3,
    )  # fmt: skip
    assert result is None, "the CUDA kernels report through row_status only"
    return [fake.asnumpy(x) for x in out]


def test_launcher_drives_the_skeleton_for_every_verifier(fake_cupy: Any, core: Any) -> None:
    """End to end through ``core_like.verify_chains``: argument order, null pointers, the
    instantiation chosen and the launch shape, for every verifier, both dtypes of each kind,
    padded and ragged batches, dense and point-mass drafts."""
    rng = np.random.default_rng(3)
    tally = Comparison()
    seen = set()
    choices = itertools.product(FLOAT_TYPES, ID_TYPES, (True, False), (True, False), range(3))
    for prob_dtype, id_dtype, point_mass, padded, _ in choices:
        c = _case(rng, prob_dtype, id_dtype, point_mass, padded)
        for verifier in registry.VERIFIERS:
            method = verifier.code
            parameters = c.posterior if verifier.parameters else np.empty(0)
            with np.errstate(all="ignore"):
                launched = _launch(c, method, parameters)
                direct = _run_emulated(fake_cupy._LIBRARY[0], verifier, c, parameters)
                cpu = _run_cpu(core, method, c, parameters)
            for mine, theirs in zip(launched, direct):
                assert np.array_equal(mine, theirs)
            for b in range(c.batch):
                _compare_request(verifier, c, b, launched, cpu, verifier.name, tally)
            name = _cuda._verify_name(verifier.cuda_row, c.target.dtype, c.ids.dtype)
            assert fake_cupy.launches[-1] == (name, (c.batch,), (_cuda.BLOCK_SIZE,))
            seen.add((name, point_mass, padded))
    assert not tally.problems, "\n".join(tally.problems[:20])
    padded_names = [
        n for n in _cuda.instantiation_names("chain_driver") if _cuda.MIXED_ROW not in n
    ]
    assert len(seen) == 2 * 2 * len(padded_names)
    # One RawModule per (device, source): compiled once, reused.
    source = _cuda.cuda_sources()["chain_driver"]
    names = tuple(_cuda.instantiation_names("chain_driver"))
    assert fake_cupy.compiled == [(source, ("--std=c++17", "--fmad=false"), names)]


def test_launcher_memory_guards(fake_cupy: Any, core: Any) -> None:
    """O(1) guards before a launch: dtypes, contiguity, consistent shapes, one device; an
    empty batch launches nothing."""
    wrap = fake_cupy.asarray
    rng = np.random.default_rng(5)
    c = _case(rng)
    rejection = registry.get("rejection").code
    typical = registry.get("typical").code
    with pytest.raises(ValueError, match="uniforms on device 1"):
        _launch(c, rejection, np.empty(0), uniforms=1)
    with pytest.raises(ValueError, match="parameters: expected 2 for typical, found 1"):
        _launch(c, typical, np.array([0.1]))
    short = Chains(
        **{**c.__dict__, "uniforms": c.uniforms[:-1] if c.batch > 1 else c.uniforms[:0]}
    )
    with pytest.raises(ValueError, match="uniforms: expected shape"):
        _launch(short, rejection, np.empty(0))
    cut = Chains(**{**c.__dict__, "target": c.target[1:]})
    with pytest.raises(ValueError, match="target_rows: expected shape"):
        _launch(cut, rejection, np.empty(0))
    wide = Chains(**{**c.__dict__, "ids": c.ids.astype(np.float64)})
    with pytest.raises(TypeError, match="draft_token_ids: expected dtype"):
        _launch(wide, rejection, np.empty(0))
    with pytest.raises(ValueError, match="method: expected a registry verifier code"):
        _launch(c, len(registry.VERIFIERS), np.empty(0))
    strided = wrap(np.zeros((c.batch, 2 * c.width), np.int64))[:, ::2]
    with pytest.raises(ValueError, match="output: expected a C-contiguous array"):
        _cuda.core_like.verify_chains(
            rejection, wrap(c.target), wrap(c.target), True, wrap(c.ids), wrap(c.bonus),
            wrap(c.offsets), wrap(c.uniforms), wrap(np.empty(0)), strided,
            *(wrap(np.zeros(c.batch, np.int64)) for _ in range(3)),
        )  # fmt: skip
    assert not fake_cupy.launches
    empty = Chains(
        target=np.zeros((0, 5), np.float32), draft=None, ids=np.zeros(0, np.int64),
        bonus=np.zeros(0, np.int64), offsets=np.zeros(1, np.int64), uniforms=np.zeros((0, 1)),
        width=1, posterior=None, kind="empty",
    )  # fmt: skip
    _launch(empty, rejection, np.empty(0))
    assert not fake_cupy.launches and not fake_cupy.compiled


def test_launcher_guards_the_engine_options(fake_cupy: Any, core: Any) -> None:
    """The engine options are checked before a launch (dtype and shape of
    ``request_methods``, ``sampling`` and ``scratch``; a lazy bonus needs its uniform
    column), and a batch with per-request methods launches the ``MixedRow`` instance."""
    wrap = fake_cupy.asarray
    rng = np.random.default_rng(9)
    c = _engine_case(rng, logits=True)
    vocab = c.target.shape[1]
    rejection = registry.get("rejection").code
    methods = np.full(c.batch, rejection, np.int8)
    good = {
        "request_methods": wrap(methods),
        "sampling": wrap(c.sampling),
        "scratch": wrap(np.zeros((c.batch, 2 * vocab), c.target.dtype)),
        "draw_bonus": True,
        "causal": True,
    }

    def launch(**changed: Any) -> None:
        options = {**good, **changed}
        _cuda.core_like.verify_chains(
            rejection, wrap(c.target), wrap(c.target), True, wrap(c.ids), wrap(c.bonus),
            wrap(c.offsets), wrap(c.uniforms), wrap(np.empty(0)),
            *(wrap(buffer) for buffer in c.buffers(c.width)), 1, **options,
        )  # fmt: skip

    with pytest.raises(TypeError, match="request_methods: expected dtype"):
        launch(request_methods=wrap(methods.astype(np.int64)))
    with pytest.raises(ValueError, match="sampling: expected shape"):
        launch(sampling=wrap(c.sampling[:, :3].copy()))
    with pytest.raises(ValueError, match="scratch: expected a"):
        launch(scratch=None)
    with pytest.raises(ValueError, match="scratch: expected shape"):
        launch(scratch=wrap(np.zeros((1, 2 * vocab), c.target.dtype)))
    with pytest.raises(ValueError, match="uniforms: expected at least 2 column"):
        _cuda.core_like.verify_chains(
            rejection, wrap(c.target), wrap(c.target), True, wrap(c.ids), wrap(c.bonus),
            wrap(c.offsets), wrap(c.uniforms[:, :1].copy()), wrap(np.empty(0)),
            *(wrap(buffer) for buffer in c.buffers(c.width)), 1, **good,
        )  # fmt: skip
    # The sampling surface's adjustments: each part's shape and dtype, and their rows.
    rows = c.target.shape[0]
    words = -(-vocab // 32)
    adjust = (wrap(np.full((rows, words), -1, np.int32)), wrap(np.zeros(rows + 1, np.int64)),
              wrap(np.zeros(0, np.int64)), wrap(np.zeros(0, c.target.dtype)))
    adjusted = wrap(np.zeros((c.batch, 2 * vocab), c.target.dtype))
    with pytest.raises(ValueError, match="target_adjustments bitmask: expected shape"):
        launch(target_adjustments=(wrap(np.full((rows, words + 1), -1, np.int32)),
                                   *adjust[1:]), adjusted_rows=adjusted)
    with pytest.raises(TypeError, match="target_adjustments bitmask: expected dtype"):
        launch(target_adjustments=(wrap(np.full((rows, words), -1, np.int64)), *adjust[1:]),
               adjusted_rows=adjusted)
    with pytest.raises(ValueError, match="target_adjustments offsets: expected shape"):
        launch(target_adjustments=(adjust[0], wrap(np.zeros(rows, np.int64)), *adjust[2:]),
               adjusted_rows=adjusted)
    with pytest.raises(TypeError, match="target_adjustments values: expected dtype"):
        launch(target_adjustments=(*adjust[:3], wrap(np.zeros(0, np.float16))),
               adjusted_rows=adjusted)
    with pytest.raises(ValueError, match="adjusted_rows: expected a"):
        launch(target_adjustments=adjust)
    with pytest.raises(ValueError, match="adjusted_rows: expected shape"):
        launch(target_adjustments=adjust, adjusted_rows=wrap(np.zeros((c.batch, vocab),
                                                                       c.target.dtype)))
    assert not fake_cupy.launches
    launch()
    name = _cuda._verify_name(_cuda.MIXED_ROW, c.target.dtype, c.ids.dtype)
    assert fake_cupy.launches[-1] == (name, (c.batch,), (_cuda.BLOCK_SIZE,))


def test_offsets_never_make_a_block_leave_the_arrays(emulated: Any, core: Any) -> None:
    """Inconsistent offsets from a direct caller (decreasing, outside [0, T], wider than the
    outputs or the uniforms) are clamped on the device: no cell past any output is written,
    and every verified row is a well-formed prefix of its clamped request."""
    rng = np.random.default_rng(11)
    vocab, batch, num_drafts, width = 9, 3, 5, 2
    for offsets in ([0, 4, 2, 5], [0, 9, 9, 5], [-3, 1, 2, 99], [0, 5, 5, 5]):
        for verifier in registry.VERIFIERS:
            c = Chains(
                target=_probabilities(rng, (num_drafts + batch, vocab), np.float64, "flat"),
                draft=None, ids=rng.integers(0, vocab, num_drafts).astype(np.int64),
                bonus=rng.integers(0, vocab, batch).astype(np.int64),
                offsets=np.array(offsets, np.int64), uniforms=rng.random((batch, width)),
                width=width, posterior=np.array([0.09, 0.3]), kind="clamped",
            )  # fmt: skip
            tails = [np.full(batch * width + 8, -7, np.int64)]
            tails += [np.full(batch + 8, -7, np.int64) for _ in range(3)]
            out = [tails[0][: batch * width].reshape(batch, width)]
            out += [tail[:batch] for tail in tails[1:]]
            with np.errstate(all="ignore"):
                _run_emulated(emulated, verifier, c, c.posterior, out)
            assert all((tail[-8:] == -7).all() for tail in tails), verifier.name
            for b in range(batch):
                start = min(max(offsets[b], 0), num_drafts)
                assert out[3][b] in (0, 1, 2) or out[3][b] < 0
                if out[3][b] == 0:
                    r = int(out[1][b])
                    assert 0 <= r < width
                    assert out[0][b, :r].tolist() == c.ids[start : start + r].tolist()
                    assert (out[0][b, r + 1 :] == -1).all()


# ---------------------------------------------------------------------------------------------
# tests/kernels/test_gpu.py itself, on a stand-in CuPy (tests/kernels/fake_cupy) whose kernels
# are emulated
# ---------------------------------------------------------------------------------------------

# Chi-square and Monte-Carlo tests launch 10**5 blocks or more: minutes in the emulation.
FAKE_CUPY_SELECTION = "not chi_square and not conformance"


def _run_gpu_tests_on_fake_cupy(selection: str, mutation: str | None = None) -> Any:
    env = dict(os.environ)
    fake_cupy_folder = REPO_ROOT / "tests" / "kernels" / "fake_cupy"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(fake_cupy_folder), str(REPO_ROOT), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env["SPECDEC_REQUIRE_GPU"] = "1"  # a skip for want of a device is a failure
    env.pop("SPECDEC_FAKE_CUPY_MUTATION", None)
    if mutation is not None:
        env["SPECDEC_FAKE_CUPY_MUTATION"] = mutation
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
    command += ["tests/kernels/test_gpu.py", "-k", selection]
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_gpu_tests_pass_on_a_fake_cupy(emulated: Any) -> None:
    """The GPU test-suite, every verifier of the registry through the library's CuPy path and
    the launch surface, with the emulated kernels as the device: so its comparisons run (and
    must pass) on every machine, not only where a GPU is."""
    result = _run_gpu_tests_on_fake_cupy(FAKE_CUPY_SELECTION)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed > 200, summary


def test_gpu_tests_fail_on_a_fake_cupy_with_a_broken_kernel(emulated: Any) -> None:
    """Negative control: the same GPU tests catch block verification stopping at the first
    failed check."""
    result = _run_gpu_tests_on_fake_cupy("block_gpu_matches_cpu", "block_stops_at_first_failure")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "failed" in result.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# The engine layout's options: per-request methods, causal counting, the lazy bonus, logits
# ---------------------------------------------------------------------------------------------


def _logit_rows(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Logits with ties at the top-k/top-p boundaries, masked (-inf) and NaN entries, and
    now and then a row with +inf entries or without a finite maximum."""
    kind = rng.integers(4)
    if kind == 0:  # few distinct values: every filter boundary falls inside a tie group
        rows = rng.choice(np.array([0.0, 1.0, 2.0, 2.5, 3.0]), size=shape)
    elif kind == 1:
        rows = rng.standard_normal(shape) * 3.0
    elif kind == 2:  # ties between pairs of tokens, random otherwise
        rows = np.repeat(rng.standard_normal((*shape[:-1], (shape[-1] + 1) // 2)), 2, -1)
        rows = rows[..., : shape[-1]]
    else:
        rows = rng.standard_normal(shape)
        rows[rng.random(shape) < 0.3] = -np.inf
    rows = rows.astype(dtype)
    if rows.size and rng.random() < 0.2:
        rows[rng.random(shape) < 0.05] = np.nan
    if rows.size and rng.random() < 0.1:
        rows[rng.integers(shape[0]), rng.integers(shape[1])] = np.inf
    if rows.size and rng.random() < 0.05:
        rows[rng.integers(shape[0])] = -np.inf
    return rows


def _sampling_table(
    rng: np.random.Generator, batch: int, vocab: int, top_ks: Any = None
) -> np.ndarray:
    """Per-request (temperature, top-k, top-p, min-p, filter order) ``[B, 5]``: top-k 0
    (off), 1, small, ``V`` and above ``V`` (or one of ``top_ks``); top-p and min-p on and
    off; both orders."""
    top_ks = [0, 1, 2, 5, vocab, vocab + 3] if top_ks is None else top_ks
    return np.stack(
        [
            rng.choice([0.5, 1.0, 1.7], batch),
            rng.choice(top_ks, batch).astype(np.float64),
            rng.choice([1.0, 0.9, 0.5, 0.3], batch),
            rng.choice([0.0, 0.0, 0.05, 0.2], batch),
            rng.choice(sorted(_contract.FILTER_ORDER_CODES.values()), batch).astype(np.float64),
        ],
        axis=1,
    )


def _flat_probabilities(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> Any:
    return _probabilities(rng, shape, dtype, "flat")


def _engine_case(rng: np.random.Generator, logits: bool, long_rows: bool = False) -> Chains:
    """A ragged engine batch (some k_b = 0) with per-request methods, the lazy bonus or not,
    and for logits rows per-request temperature, top-k, top-p and min-p; ``long_rows``:
    fewer, longer rows with top-k on (its survivors' path)."""
    batch = int(rng.integers(1, 3 if long_rows else 5))
    lengths = rng.integers(0, 3 if long_rows else 5, batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    num_drafts = int(offsets[-1])
    vocab = int(rng.choice([4096, 5003] if long_rows else [1, 2, 7, 33, 64, 65, 200, 513, 1000]))
    pdt = FLOAT_TYPES[int(rng.integers(2))]
    idt = ID_TYPES[int(rng.integers(2))]
    # Logits cases mix the row forms now and then: target logits with draft probabilities
    # (vLLM v1's form), or target probabilities with draft logits.
    target_logits = draft_logits = True
    if logits:
        form = rng.random()
        target_logits, draft_logits = (form >= 0.2), (form < 0.2 or form >= 0.4)
        target = (_logit_rows if target_logits else _flat_probabilities)(
            rng, (num_drafts + batch, vocab), pdt
        )
        draft = None if rng.random() < 0.4 else (
            _logit_rows if draft_logits else _flat_probabilities
        )(rng, (num_drafts, vocab), pdt)
    else:
        target = _probabilities(rng, (num_drafts + batch, vocab), pdt, "flat")
        draft = (
            None if rng.random() < 0.4 else _probabilities(rng, (num_drafts, vocab), pdt, "flat")
        )
    ids = rng.integers(0, vocab, num_drafts).astype(idt)
    for i in range(num_drafts):  # mostly the row's argmax, so that chains get accepted
        if rng.random() < 0.6:
            ids[i] = int(
                np.argmax(
                    np.nan_to_num(
                        target[i + np.searchsorted(offsets, i, "right") - 1], nan=-np.inf
                    )
                )
            )
    sampling = None
    if logits:
        sampling = _sampling_table(rng, batch, vocab, [1, 5, 40] if long_rows else None)
    width = int(lengths.max()) + 1
    return Chains(
        target=target, draft=draft, ids=ids, bonus=rng.integers(0, vocab, batch).astype(idt),
        offsets=offsets, uniforms=rng.random((batch, width + 1)), width=width,
        posterior=np.array([rng.choice([0.09, 0.3]), rng.choice([0.3, 0.05])]), kind="engine",
        sampling=sampling, causal=bool(rng.random() < 0.8), draw_bonus=bool(rng.random() < 0.6),
        mixed=bool(rng.random() < 0.6), target_logits=target_logits, draft_logits=draft_logits,
    )  # fmt: skip


def _engine_methods(core: Any, c: Chains, verifier: registry.Verifier, rng: Any) -> Any:
    if not c.mixed:
        return None
    greedy = registry.get("greedy").code
    own = verifier.code
    return np.where(rng.random(c.batch) < 0.5, greedy, own).astype(np.int8)


def _run_cpu_engine(core: Any, method: int, c: Chains, parameters: Any, methods: Any) -> list:
    out = c.buffers(c.width)
    vocab = c.target.shape[1]
    scratch = None if c.sampling is None else np.empty((1, 2 * vocab), c.target.dtype)
    core.verify_chains(
        method, c.target, c.target if c.draft is None else c.draft, c.draft is None, c.ids,
        c.bonus, c.offsets, c.uniforms, parameters, *out, 1, request_methods=methods,
        causal=c.causal, draw_bonus=c.draw_bonus, sampling=c.sampling, scratch=scratch,
        target_logits=c.target_logits, draft_logits=c.draft_logits,
    )  # fmt: skip
    return out


def _run_emulated_engine(lib: Any, row: str, c: Chains, parameters: Any, methods: Any) -> list:
    import ctypes

    out = c.buffers(c.width)
    vocab = c.target.shape[1]
    scratch = None if c.sampling is None else np.full((c.batch, 2 * vocab), np.nan, c.target.dtype)
    name = _cuda._verify_name(row, c.target.dtype, c.ids.dtype)
    sizes = [ctypes.c_longlong(n) for n in (c.batch, c.ids.shape[0], vocab, c.width)]
    getattr(lib, _symbol(name))(
        _ptr(c.target), _ptr(c.draft), _ptr(c.ids), _ptr(c.bonus), _ptr(c.offsets),
        _ptr(c.uniforms), ctypes.c_longlong(c.uniforms.shape[1]), _ptr(parameters), *sizes,
        *(_ptr(a) for a in out), _ptr(methods), ctypes.c_longlong(int(c.causal)),
        ctypes.c_longlong(int(c.draw_bonus)), _ptr(c.sampling), _ptr(scratch),
        *c.row_forms(), ctypes.c_longlong(1), *_no_adjustments(),
    )  # fmt: skip
    return out


def _compare_engine(
    lib: Any, core: Any, seed: int, cases: int, logits: bool, long_rows: bool = False
) -> Comparison:
    """Every verifier with the engine options, emulated CUDA against ``_core.verify_chains``:
    every cell equal (status, outputs, lengths, counts)."""
    rng = np.random.default_rng(seed)
    tally = Comparison()
    for number in range(cases):
        c = _engine_case(rng, logits, long_rows)
        tally.cases += 1
        for verifier in registry.VERIFIERS:
            method = verifier.code
            methods = _engine_methods(core, c, verifier, rng)
            parameters = c.posterior if verifier.parameters else np.empty(0)
            row = _cuda.MIXED_ROW if methods is not None else verifier.cuda_row
            with np.errstate(all="ignore"):
                cpu = _run_cpu_engine(core, method, c, parameters, methods)
                mine = _run_emulated_engine(lib, row, c, parameters, methods)
            tally.requests += c.batch
            for b in range(c.batch):
                sampling = None if c.sampling is None else c.sampling[b]
                if c.draw_bonus and cpu[3][b] == 0 and cpu[1][b] == np.diff(c.offsets)[b]:
                    tally.draws += 1
                for name, theirs, ours in zip(("output", "length", "count", "status"), cpu, mine):
                    if not np.array_equal(theirs[b], ours[b]):
                        tally.problems.append(
                            f"case {number} {verifier.name} {row} {c.target.dtype} "
                            f"V={c.target.shape[1]} request {b}: {name} {ours[b]} != CPU "
                            f"{theirs[b]} (sampling {sampling}, "
                            f"causal {c.causal}, lazy bonus {c.draw_bonus})"
                        )
    if lib.emu_errors_seen():
        tally.problems.append("a divergent __syncthreads was detected")
    return tally


ENGINE_CASES = 300


@pytest.mark.parametrize("logits", [True, False], ids=["logits", "probabilities"])
def test_emulated_engine_options_match_cpu_kernels(emulated: Any, core: Any, logits: bool) -> None:
    """Per-request methods, causal counting and the lazy bonus, on probability rows and on
    logits rows processed on the device (temperature, top-k and top-p with ties at their
    boundaries, min-p, masked, NaN and +inf entries): the emulated kernel writes exactly the
    CPU driver's cells."""
    tally = _compare_engine(emulated, core, seed=20261201, cases=ENGINE_CASES, logits=logits)
    assert not tally.problems, "\n".join(tally.problems[:20])
    assert tally.draws > 50, "too few lazy bonus draws were exercised"


def test_emulated_engine_reads_long_logits_rows(emulated: Any, core: Any) -> None:
    """Long logits rows with top-k on (the law from top-k's survivors, read by the row
    readers: single entries, processed rows, the lazy bonus), greedy requests mixed in: the
    emulated kernel writes exactly the CPU driver's cells."""
    tally = _compare_engine(emulated, core, seed=20261207, cases=40, logits=True, long_rows=True)
    assert not tally.problems, "\n".join(tally.problems[:20])


_ENGINE_MUTATIONS: dict[str, Callable[[str], str]] = {
    # The radix select stops one tie group too late: top-k keeps the (K+1)-th value.
    "select_needs_more_than_need": lambda s: _replace(
        s, "*above + count >= need", "*above + count > need"
    ),
    # The lazy bonus drawn with the residual's uniform instead of its own.
    "bonus_reuses_residual_uniform": lambda s: _replace(
        s, "args.uniforms[k + 1], shared.draw);", "args.uniforms[k], shared.draw);"
    ),
    # Top-p measured over the whole row instead of what min-p and top-k kept.
    "top_p_ignores_the_floor": lambda s: _replace(
        s, "z_max, floor_key, true, top_p, s);", "z_max, Key(1), true, top_p, s);"
    ),
}


@pytest.mark.parametrize("mutation", sorted(_ENGINE_MUTATIONS))
def test_engine_emulation_detects_mutated_kernels(
    core: Any, tmp_path_factory: pytest.TempPathFactory, mutation: str
) -> None:
    """Negative controls of the engine options and the logits law."""
    source = _cuda.cuda_sources()["chain_driver"]
    mutated = {"chain_driver": _ENGINE_MUTATIONS[mutation](source)}
    lib = _build_emulation(tmp_path_factory.mktemp(mutation), mutation, mutated)
    tally = _compare_engine(lib, core, seed=20261201, cases=80, logits=True)
    assert tally.problems, f"mutation {mutation} went unnoticed"


# ---------------------------------------------------------------------------------------------
# The processed law itself, bit for bit: the CUDA row_law against logits_law.h's
# ---------------------------------------------------------------------------------------------

_LAW_PROBE = r"""
// Test only: the law of each row (one block per row), its float64 probabilities and the
// materialised row, as the kernel's row readers compute them.
template <typename T>
__global__ void law_probe(const T* rows, long long vocab, const double* sampling, double* laws,
                          double* probabilities, T* materialised) {
    __shared__ specdec::Scratch s;
    const long long r = blockIdx.x;
    const double* p = sampling + 5 * r;
    const T* row = rows + r * vocab;
    const specdec_row_law law = specdec::row_law(row, vocab, static_cast<T>(p[0]),
                                                 static_cast<long long>(p[1]), p[2], p[3],
                                                 static_cast<int>(p[4]), s);
    if (threadIdx.x == 0) {
        double* out = laws + 5 * r;
        out[0] = law.z_max; out[1] = law.cutoff; out[2] = law.normaliser;
        out[3] = (double)law.num_infinite; out[4] = (double)law.status;
    }
    for (long long y = threadIdx.x; y < vocab; y += specdec::kBlock) {
        probabilities[r * vocab + y] = specdec::law_probability(row, y, static_cast<T>(p[0]), law);
        materialised[r * vocab + y] = specdec::materialised(row, y, static_cast<T>(p[0]), law);
    }
}
#define SPECDEC_LAW_ENTRY(SUFFIX, T)                                                        \
    extern "C" void gpu_law_##SUFFIX(const T* rows, long long count, long long vocab,       \
                                     const double* sampling, double* laws, double* p, T* m) { \
        emu_launch(count, specdec::kBlock, [&] {                                            \
            law_probe<T>(rows, vocab, sampling, laws, p, m);                                \
        });                                                                                 \
    }
SPECDEC_LAW_ENTRY(f, float)
SPECDEC_LAW_ENTRY(d, double)
"""

# The same probe of specdec_np/_kernels/src/cpu/logits_law.h, built as the CPU kernels are (C11).
_CPU_LAW_PROBE = r"""
#include <stdlib.h>
#include "logits_law.h"

#define SPECDEC_LAW_ENTRY(SUFFIX, T)                                                        \
    void cpu_law_##SUFFIX(const T *rows, long long count, long long vocab,                 \
                          const double *sampling, double *laws, double *p, T *m)           \
    {                                                                                      \
        for (long long r = 0; r < count; ++r) {                                            \
            const double *s = sampling + 5 * r;                                            \
            specdec_row_law law;                                                           \
            specdec_law_scratch *scratch = specdec_law_scratch_new();                        \
            specdec_row_law_##SUFFIX(rows + r * vocab, vocab, (T)s[0], (int64_t)s[1], s[2], \
                                     s[3], (int)s[4], scratch, NULL, &law);                \
            free(scratch);                                                                 \
            double *out = laws + 5 * r;                                                    \
            out[0] = law.z_max;                                                            \
            out[1] = law.cutoff;                                                           \
            out[2] = law.normaliser;                                                       \
            out[3] = (double)law.num_infinite;                                             \
            out[4] = (double)law.status;                                                   \
            for (long long y = 0; y < vocab; ++y)                                          \
                p[r * vocab + y] =                                                         \
                    specdec_law_probability_##SUFFIX(rows + r * vocab, y, (T)s[0], &law);  \
            specdec_law_materialise_##SUFFIX(rows + r * vocab, vocab, (T)s[0], &law,       \
                                             m + r * vocab);                               \
        }                                                                                  \
    }
SPECDEC_LAW_ENTRY(f, float)
SPECDEC_LAW_ENTRY(d, double)
"""


@pytest.fixture(scope="module")
def cpu_law(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The CPU law of ``logits_law.h`` (compiled as the extension is), built once."""
    return build_library(tmp_path_factory.mktemp("cpu_law"), "law_cpu", _CPU_LAW_PROBE)


def _build_law_probe(tmp: Path, stem: str, source: str, cpu: Any) -> tuple[Any, Any]:
    """The CPU law (the ``cpu_law`` fixture) and the emulated CUDA source's, two libraries."""
    gpu = _compile_library(tmp, f"{stem}_gpu", f"{_EMULATION_PRELUDE}\n{source}\n{_LAW_PROBE}")
    return cpu, gpu


def _law_rows(rng: np.random.Generator, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    count, vocab = int(rng.integers(1, 6)), int(rng.choice([1, 3, 8, 64, 65, 200, 1000, 3000]))
    rows = _logit_rows(rng, (count, vocab), dtype)
    sampling = np.stack(
        [
            rng.choice([0.3, 1.0, 1.7], count),
            rng.choice([0, 1, 2, 3, 7, vocab - 1, vocab], count).astype(np.float64),
            rng.choice([1.0, 0.95, 0.6, 0.2, 1e-9], count),
            rng.choice([0.0, 0.0, 0.01, 0.3], count),
            rng.choice(sorted(_contract.FILTER_ORDER_CODES.values()), count).astype(np.float64),
        ],
        axis=1,
    )
    return rows, sampling


def _long_law_rows(rng: np.random.Generator, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rows long enough for top-k's survivors (``V > 2048``), with top-k on: ties at the
    bound (logits of one decimal), -inf, NaN and +inf entries, blocks of NaN, rows whose
    maximum is a signed zero, logits that overflow at the temperature, and rows with fewer
    finite (or non-NaN) entries than ``k``; both orders, every filter."""
    count, vocab = int(rng.integers(1, 4)), int(rng.choice([2049, 4096, 5000, 9001]))
    rows = np.round(rng.standard_normal((count, vocab)) * rng.choice([1.0, 3.0]), 1)
    for row in rows:
        kind = rng.integers(7)
        if kind == 0:  # masked entries and whole blocks of NaN
            row[rng.random(vocab) < 0.3] = -np.inf
            start = int(rng.integers(vocab - 200))
            row[start : start + int(rng.integers(16, 200))] = np.nan
        elif kind == 1:  # few entries that are not NaN: top-k past them
            row[:] = np.nan
            row[rng.integers(0, vocab, 30)] = rng.choice([-np.inf, 0.5, 1.0, 2.0], 30)
        elif kind == 2:  # the maximum is a signed zero (both signs, in several lanes)
            row[:] = -np.abs(row) - 0.1
            row[rng.integers(0, vocab, 6)] = rng.choice([0.0, -0.0], 6)
        elif kind == 3:  # +inf entries, or logits that overflow below temperature 1
            row[rng.integers(0, vocab, 3)] = rng.choice([np.inf, 3e38, 1e308], 3)
        elif kind == 4:  # a sprinkle of NaN
            row[rng.random(vocab) < 0.05] = np.nan
    with np.errstate(over="ignore"):
        rows = rows.astype(dtype)
    sampling = np.stack(
        [
            rng.choice([0.3, 1.0, 1.7], count),
            rng.choice([1, 2, 5, 40, 40, 100, 1000, 1500, vocab - 1], count).astype(np.float64),
            rng.choice([1.0, 1.0, 0.95, 0.6, 1e-9], count),
            rng.choice([0.0, 0.0, 0.01, 0.3], count),
            rng.choice(sorted(_contract.FILTER_ORDER_CODES.values()), count).astype(np.float64),
        ],
        axis=1,
    )
    return rows, sampling


def _law_mismatches(
    libraries: tuple[Any, Any],
    seed: int,
    cases: int,
    make_rows: Callable[..., Any] = _law_rows,
    reference: str = "cpu",
    zero_sign: bool = True,
) -> list[str]:
    """Where the laws of ``libraries`` (the reference's, whose symbols start with
    ``reference``, then the emulated CUDA source's) differ in their bits on ``cases`` random
    calls; ``zero_sign`` False compares the sign of a zero maximum as a value."""
    import ctypes

    rng = np.random.default_rng(seed)
    problems = []
    for number in range(cases):
        dtype = FLOAT_TYPES[number % 2]
        rows, sampling = make_rows(rng, dtype)
        count, vocab = rows.shape
        results = {}
        for side in ("cpu", "gpu"):
            laws = np.zeros((count, 5))
            p = np.zeros((count, vocab))
            m = np.zeros((count, vocab), dtype)
            library = libraries[0] if side == "cpu" else libraries[1]
            prefix = reference if side == "cpu" else side
            function = getattr(library, f"{prefix}_law_{'f' if dtype == np.float32 else 'd'}")
            sizes = (ctypes.c_longlong(count), ctypes.c_longlong(vocab))
            function(_ptr(rows), *sizes, _ptr(sampling), _ptr(laws), _ptr(p), _ptr(m))
            if not zero_sign:
                laws[:, 0] += 0.0
            results[side] = (laws, p, m)
        for name, theirs, ours in zip(
            ("law", "p", "materialised"), results["cpu"], results["gpu"]
        ):
            # Bits, not values: -0.0 against 0.0 or two NaN payloads would count too.
            if theirs.tobytes() != ours.tobytes():
                problems.append(f"case {number} {dtype.__name__} V={vocab}: {name} differs")
    if libraries[1].emu_errors_seen():
        problems.append("a divergent __syncthreads was detected")
    return problems


LAW_CASES = 400


def test_cuda_law_equals_the_cpu_law_bit_for_bit(
    tmp_path_factory: pytest.TempPathFactory, cpu_law: Any
) -> None:
    """The CUDA source's processed law (maximum, cutoff, normaliser, float64 probabilities
    and the materialised row) has the bits of ``logits_law.h``'s on logits with ties at the
    top-k and top-p boundaries, masked, NaN and +inf entries, every filter, both dtypes."""
    source = _cuda.cuda_sources()["chain_driver"]
    lib = _build_law_probe(tmp_path_factory.mktemp("law"), "law", source, cpu_law)
    problems = _law_mismatches(lib, seed=5, cases=LAW_CASES)
    assert not problems, "\n".join(problems[:20])


#: The survivors' path turned off: every law reads the whole row, as before that path.
_WHOLE_ROW_LAW = ("if (vocab <= 2 * kSurvivors ||", "if (true || vocab <= 2 * kSurvivors ||")

#: Wrong on purpose: each survivor summed on the lane of its rank, not of its index.
_SURVIVORS_BY_RANK = ("if (list->position[i] % kLanes == l) f(i);", "if (i % kLanes == l) f(i);")

LONG_LAW_CASES = 60


def test_cuda_law_from_top_k_survivors_keeps_its_bits(
    tmp_path_factory: pytest.TempPathFactory, cpu_law: Any
) -> None:
    """On long rows with top-k on, the law from top-k's survivors (the blocks' maxima, their
    k-th largest as a bound, the entries gathered above it) has the bits of the whole-row
    law that it replaced, signs of zeros included, and those of ``logits_law.h``'s (whose
    maximum may be a zero of the other sign: no probability reads that sign); a negative
    control sums the survivors on the lanes of their ranks and must be caught."""
    source = _cuda.cuda_sources()["processed_rows"]  # the law's source, and little else
    tmp = tmp_path_factory.mktemp("long_law")
    units = {
        stem: f"{_EMULATION_PRELUDE}\n{_replace(source, *change) if change else source}\n"
        f"{_LAW_PROBE}"
        for stem, change in (
            ("long_law_gpu", None),
            ("long_law_whole", _WHOLE_ROW_LAW),
            ("long_law_by_rank", _SURVIVORS_BY_RANK),
        )
    }
    gpu, whole, by_rank = _compile_libraries(tmp, units)
    run = dict(seed=7, cases=LONG_LAW_CASES, make_rows=_long_law_rows)
    problems = _law_mismatches((whole, gpu), reference="gpu", **run)
    problems += _law_mismatches((cpu_law, gpu), zero_sign=False, **run)
    assert not problems, "\n".join(problems[:20])
    assert _law_mismatches((whole, by_rank), reference="gpu", **run), "the mutation went unnoticed"


_LAW_MUTATIONS: dict[str, Callable[[str], str]] = {
    # The float32 exponential loses a bit of its last polynomial coefficient.
    "exp_coefficient": lambda s: _replace(s, "0x1.fffffcp-2f", "0x1.fffff8p-2f"),
    # The row's lanes (the maximum pass and the kept sum) taken as one instead of the CPU's
    # eight.
    "kept_sum_one_lane": lambda s: _replace(
        s,
        "for (long long y = l; y < count; y += kLanes) f(y);",
        "for (long long y = l * count; y < count; y += 1) f(y);",
    ),
    # The radix select stops one tie group too late: top-k keeps the (K+1)-th value.
    "select_strict": lambda s: _replace(
        s, "*above + count >= need", "*above + count > need"
    ),
    # llama.cpp's order filters at the temperature's maximum instead of the logits'.
    "llama_cpp_maximum_at_the_temperature": lambda s: _replace(
        s,
        "temperature == one ? z_max : extreme_logit<T>(logits, false, Key(0), s)",
        "z_max",
    ),
    # llama.cpp's order takes the cutoff from min-p's bisection key, not the lowest logit.
    "llama_cpp_cutoff_from_the_key": lambda s: _replace(
        s, "lowest = extreme_logit<T>(logits, true, floor_key, s);", "(void)s;"
    ),
}


@pytest.mark.parametrize("mutation", sorted(_LAW_MUTATIONS))
def test_law_probe_detects_mutated_laws(
    tmp_path_factory: pytest.TempPathFactory, cpu_law: Any, mutation: str
) -> None:
    """Negative controls: a law that is off by one rounding must be caught."""
    source = _LAW_MUTATIONS[mutation](_cuda.cuda_sources()["chain_driver"])
    lib = _build_law_probe(tmp_path_factory.mktemp(mutation), mutation, source, cpu_law)
    assert _law_mismatches(lib, seed=5, cases=100), f"mutation {mutation} went unnoticed"


def test_gpu_tree_tests_fail_on_a_fake_cupy_with_a_broken_tree_kernel(emulated: Any) -> None:
    """Negative control: the GPU tree tests catch SpecInfer testing an unnormalised residual."""
    result = _run_gpu_tests_on_fake_cupy(
        "verify_tree_gpu_matches_cpu", "tree_residual_not_renormalised"
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "failed" in result.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# The tree kernel, emulated on the CPU and compared with specdec_np._core.verify_trees
# ---------------------------------------------------------------------------------------------

# (CPU walk name, registry code) of every tree method: the code is what both backends take.
TREE_WALKS = tuple((method.walk, method.code) for method in registry.TREE_METHODS)


class Trees:
    """One ``verify_trees`` call's inputs (the tree layout of ``specdec_np._layouts.tree``)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update({"target_logits": True, "draft_logits": True, **fields})

    row_forms = Chains.row_forms

    @property
    def batch(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def buffers(self) -> list[np.ndarray]:
        """Outputs filled with a sentinel, so that cells a kernel leaves alone are compared."""
        return [
            np.full((self.batch, self.depth), -7, np.int64),
            np.full((self.batch, self.depth + 1), -7, np.int64),
            np.full(self.batch, -7, np.int64),
            np.full(self.batch, -7, np.int64),
        ]

    def links(self) -> _tree_links.TreeLinks:
        """The child lists both kernels walk, as the tree layer computes them."""
        return _tree_links.tree_links(self.offsets, self.parents, self.ids)

    def flat_uniforms(self) -> np.ndarray:
        """The uniforms as the drivers read them: request b's N_b + 1 from offsets[b] + b."""
        counts = np.diff(self.offsets) + 1
        rows = [self.uniforms[b, : counts[b]] for b in range(self.batch)]
        return np.concatenate(rows) if rows else np.zeros(0)

    def request(self, b: int, uniforms: np.ndarray | None = None) -> Trees:
        """Request b alone (with other uniforms if given)."""
        start, stop = int(self.offsets[b]), int(self.offsets[b + 1])
        return Trees(
            target=self.target[start + b : stop + b + 1],
            draft=None if self.draft is None else self.draft[start:stop],
            ids=self.ids[start:stop],
            parents=self.parents[start:stop],
            offsets=np.array([0, stop - start], np.int64),
            uniforms=(self.uniforms[b] if uniforms is None else uniforms)[None, :],
            methods=None if self.methods is None else self.methods[b : b + 1],
            depth=self.depth,
            kind=self.kind,
            sampling=None if self.sampling is None else self.sampling[b : b + 1],
        )


def _tree_case(
    rng: np.random.Generator,
    prob_dtype: Any = None,
    id_dtype: Any = None,
    logits: bool = False,
    long_rows: bool = False,
) -> Trees:
    """Random trees: zero-node requests, deep chains and wide sibling lists, repeated sibling
    tokens, both dtypes of each kind, dense (with negative and NaN entries) or no draft
    rows, boundary uniforms, bad ids, rows without mass, misaligned rows, deeper outputs.
    With ``logits``, the rows are logits (ties at the filter boundaries, masked, NaN and
    ``+inf`` entries) with per-request temperature, top-k, top-p and min-p; ``long_rows``:
    fewer nodes on longer logits rows with top-k on (its survivors' path)."""
    batch = int(rng.integers(1, 3 if long_rows else 5))
    shape = str(rng.choice(["random", "wide", "chain"]))
    most = 4 if long_rows else 24 if shape == "wide" else 8
    counts = rng.integers(0, most + 1, batch)
    counts[rng.random(batch) < 0.2] = 0
    parents = []
    for n in counts:
        for j in range(int(n)):
            if shape == "wide":
                parents.append(-1 if j < 2 or rng.random() < 0.7 else int(rng.integers(-1, 2)))
            elif shape == "chain":
                parents.append(j - 1)
            else:
                parents.append(int(rng.integers(-1, j)))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    weights = VOCABULARY_WEIGHTS[:-1]  # trees walk many rows: the largest V is left out
    vocab = int(rng.choice(VOCABULARIES[:-1], p=weights / weights.sum()))
    vocab = int(rng.choice([4096, 5003])) if long_rows else vocab
    pdt = FLOAT_TYPES[int(rng.integers(2))] if prob_dtype is None else prob_dtype
    idt = ID_TYPES[int(rng.integers(2))] if id_dtype is None else id_dtype
    kind = "logits" if logits else str(rng.choice(["flat", "peaked", "sparse", "ties", "noise"]))
    if logits:
        target = _logit_rows(rng, (total + batch, vocab), pdt)
    else:
        target = _probabilities(rng, (total + batch, vocab), pdt, kind)
    draft = None
    draft_logits = True
    if rng.random() < 0.75 and logits:
        draft = _logit_rows(rng, (total, vocab), pdt)
    elif rng.random() < 0.75:
        # With logits targets, probability drafts are used as given (vLLM v1's mixed form).
        draft_logits = not logits
        draft = _probabilities(rng, (total, vocab), pdt, str(rng.choice(["flat", "peaked"])))
        if rng.random() < 0.2:  # negative and NaN draft entries count as 0
            spoilt = rng.random(draft.shape) < 0.3
            draft[spoilt] = rng.choice(np.array([-0.5, np.nan, -0.0], dtype=pdt), spoilt.sum())
    ids = np.empty(total, idt)
    popular = rng.integers(0, vocab, 3)  # repeated sibling tokens
    for b in range(batch):
        for i in range(int(offsets[b]), int(offsets[b + 1])):
            row = target[int(offsets[b]) + b + 1 + int(parents[i])]  # the parent's row
            w = np.nan_to_num(row.astype(np.float64), nan=0.0).clip(0.0, None)
            if logits:  # a peaked law of the logits, so that children get accepted
                z = np.nan_to_num(row.astype(np.float64), nan=-np.inf, neginf=-np.inf)
                z = np.minimum(z, 50.0)
                w = np.exp(2.0 * (z - z.max())) if np.isfinite(z.max()) else np.zeros(vocab)
            choice = rng.random()
            if choice < 0.3:
                ids[i] = rng.choice(popular)
            elif choice < 0.8 and w.sum() > 0:
                ids[i] = rng.choice(vocab, p=w / w.sum())
            else:
                ids[i] = rng.integers(0, vocab)
    width = int(counts.max(initial=0)) + 1 + int(rng.integers(0, 3))
    uniforms = rng.random((batch, width))
    _boundary_uniforms(rng, uniforms)
    if total and rng.random() < 0.1:  # an out-of-range id
        ids[rng.integers(total)] = rng.choice([-1, vocab, vocab + 5])
    if not logits:
        target, draft = _spoilt_rows(rng, target, draft)
    parents = np.asarray(parents, np.int64)
    depths = np.zeros(total, np.int64)
    for b in range(batch):
        for i in range(int(offsets[b]), int(offsets[b + 1])):
            p = int(parents[i])
            depths[i] = 1 if p < 0 else depths[int(offsets[b]) + p] + 1
    depth = int(depths.max(initial=0)) + (int(rng.integers(1, 3)) if rng.random() < 0.15 else 0)
    methods = None
    if rng.random() < 0.2:  # a mixed batch: per-request walks
        methods = rng.integers(0, len(TREE_WALKS), batch).astype(np.int8)
    sampling = None
    if logits:
        sampling = _sampling_table(rng, batch, vocab, [1, 5, 40] if long_rows else None)
    return Trees(
        target=target, draft=draft, ids=ids, parents=parents, offsets=offsets,
        uniforms=uniforms, methods=methods, depth=depth, kind=kind, sampling=sampling,
        draft_logits=draft_logits,
    )  # fmt: skip


def _working_rows(method: int, depth: int) -> int:
    """The working rows of V a call of tree method code ``method`` passes (the registry's
    ``working_rows``; 2 for a code outside it)."""
    if 0 <= method < len(registry.TREE_METHODS):
        return registry.TREE_METHODS[method].working_rows(depth)
    return 2


def _run_trees_cpu(core: Any, method: int, c: Trees) -> list[np.ndarray]:
    out = c.buffers()
    vocab = int(c.target.shape[1])
    options: dict[str, Any] = {} if c.methods is None else {"request_methods": c.methods}
    if c.sampling is not None:
        options["sampling"] = c.sampling
        options["scratch"] = np.empty((1, 2 * vocab), c.target.dtype)
        options["target_logits"] = c.target_logits
        options["draft_logits"] = c.draft_logits
    core.verify_trees(
        method, c.target, c.target if c.draft is None else c.draft, c.draft is None, c.ids,
        c.parents, c.offsets, *c.links(), c.flat_uniforms(), *out, 1,
        working=np.empty((1, _working_rows(method, c.depth) * vocab)), **options,
    )  # fmt: skip
    return out


def _run_trees_emulated(lib: Any, method: int, c: Trees, working: bool = True) -> list:
    import ctypes

    out = c.buffers()
    vocab = int(c.target.shape[1])
    # Stale rows must never be read; working=False passes none (a direct caller's error).
    width = _working_rows(method, c.depth) * vocab
    rows = np.full((c.batch, width), np.nan) if working else None
    scratch = None if c.sampling is None else np.full((c.batch, 2 * vocab), np.nan, c.target.dtype)
    name = _cuda._tree_name(c.target.dtype, c.ids.dtype)
    uniforms = c.flat_uniforms()
    links = c.links()  # kept alive through the call: the library reads the pointers
    getattr(lib, _symbol(name))(
        _ptr(c.target), _ptr(c.draft), _ptr(c.ids), _ptr(c.parents), _ptr(c.offsets),
        *(_ptr(link) for link in links), _ptr(uniforms), ctypes.c_longlong(uniforms.shape[0]),
        _ptr(c.methods),
        ctypes.c_longlong(method), ctypes.c_longlong(c.batch), ctypes.c_longlong(c.ids.shape[0]),
        ctypes.c_longlong(vocab), ctypes.c_longlong(c.depth), _ptr(rows),
        *(_ptr(a) for a in out), _ptr(c.sampling), _ptr(scratch), *c.row_forms(),
        *_no_adjustments(),
    )  # fmt: skip
    return out


# A sum taken in another order differs by rounding: at most about V * 2**-53 relative, far
# below this nudge (so a result it explains lies within rounding of a decision boundary) and
# far above it (so a wrong kernel is not explained away: a random nudge of 1e-9 almost never
# changes a decision).
TREE_NUDGE = 1e-9


def _request_result(out: list[np.ndarray], b: int) -> tuple:
    nodes, tokens, lengths, status = out
    return (nodes[b].tolist(), tokens[b].tolist(), int(lengths[b]), int(status[b]))


def _explained_by_rounding(core: Any, method: int, c: Trees, b: int, mine: tuple) -> bool:
    """Whether the CPU gives the emulated result of request b once one of its uniforms is
    nudged by TREE_NUDGE (relative and absolute): the two differ only at a boundary."""
    row = c.uniforms[b]
    n = int(c.offsets[b + 1] - c.offsets[b])
    for column in range(n + 1):
        for sign in (1.0, -1.0):
            nudged = row.copy()
            value = row[column] * (1.0 + sign * TREE_NUDGE) + sign * TREE_NUDGE
            nudged[column] = min(max(value, 0.0), float(np.nextafter(1.0, 0.0)))
            with np.errstate(all="ignore"):
                theirs = _run_trees_cpu(core, method, c.request(b, nudged))
            if _request_result(theirs, 0) == mine:
                return True
    return False


def _compare_trees(
    lib: Any, core: Any, seed: int, cases: int, logits: bool = False, long_rows: bool = False
) -> Comparison:
    """Every walk, emulated CUDA against ``_core.verify_trees``: statuses and the cells
    written identical, except where a uniform lies within rounding of a boundary."""
    rng = np.random.default_rng(seed)
    tally = Comparison()
    for number in range(cases):
        c = _tree_case(rng, logits=logits, long_rows=long_rows)
        tally.cases += 1
        for walk, method in TREE_WALKS:
            where = (
                f"case {number} {walk} {c.kind} V={c.target.shape[1]} {c.target.dtype} "
                f"{c.ids.dtype} {'no drafts' if c.draft is None else 'drafts'}"
                f"{' mixed' if c.methods is not None else ''}"
            )
            with np.errstate(all="ignore"):
                cpu = _run_trees_cpu(core, method, c)
                mine = _run_trees_emulated(lib, method, c)
            tally.requests += c.batch
            for b in range(c.batch):
                tally.draws += int(cpu[3][b] == 0)
                ours, theirs = _request_result(mine, b), _request_result(cpu, b)
                if ours == theirs:
                    continue
                if _explained_by_rounding(core, method, c, b, ours):
                    tally.boundary_draws += 1
                else:
                    tally.problems.append(f"{where}: request {b} {ours} != CPU {theirs}")
    if lib.emu_errors_seen():
        tally.problems.append("a divergent __syncthreads was detected")
    return tally


TREE_CASES = 300


def test_dispatch_follows_the_registry_codes() -> None:
    """The generated parts dispatch on registry codes: each tree method's code runs its
    ``cuda_walk`` step, each verifier's code its ``cuda_row`` functor, and the per-code
    tables hold the registry's flags."""
    trees = _cuda.cuda_sources()["tree_driver"]
    for method in registry.TREE_METHODS:
        defined = rf"^(struct {method.cuda_walk} {{|using {method.cuda_walk} = .*;)$"
        assert re.search(defined, trees, flags=re.MULTILINE), method.cuda_walk
        step = f"case {method.code}:\n        return {method.cuda_walk}::step("
        assert step in trees, method.name
    flags = ", ".join("true" if m.stochastic else "false" for m in registry.TREE_METHODS)
    assert f"kWalkReadsUniforms[kTreeMethods] = {{{flags}}};" in trees
    flags = ", ".join("true" if m.sequence_level else "false" for m in registry.TREE_METHODS)
    assert f"kWalkSequenceLevel[kTreeMethods] = {{{flags}}};" in trees
    chains = _cuda.cuda_sources()["chain_driver"]
    for verifier in registry.VERIFIERS:
        assert f"case {verifier.code}:\n            return {verifier.cuda_row}::run(" in chains
        code = f"struct VerifierCode<{verifier.cuda_row}> {{\n    static constexpr int value"
        assert f"{code} = {verifier.code};" in chains, verifier.name
    for table, flag in (("kReadsUniforms", "stochastic"), ("kBonusByArgmax", "bonus_by_argmax")):
        values = ", ".join("true" if getattr(v, flag) else "false" for v in registry.VERIFIERS)
        assert f"{table}[kVerifiers] = {{{values}}};" in chains
    # No hand-kept per-verifier flags in the functors.
    for name in ("reads_uniforms(", "bonus_by_argmax("):
        assert name not in chains


@pytest.mark.parametrize("logits", [False, True], ids=["probabilities", "logits"])
def test_emulated_tree_kernel_matches_cpu_driver(emulated: Any, core: Any, logits: bool) -> None:
    """``verify_trees_kernel`` agrees with ``_core.verify_trees`` on random trees for every
    walk, both dtypes of each kind, mixed batches, zero-node requests and wide sibling lists,
    on probability rows and on logits rows processed on the device: statuses and every cell
    written (a sentinel marks those left alone), except where a uniform lies within rounding
    of a decision or CDF boundary (checked by nudging it)."""
    tally = _compare_trees(emulated, core, seed=20260101, cases=TREE_CASES, logits=logits)
    assert not tally.problems, "\n".join(tally.problems[:20])
    print(
        f"\nemulated {tally.cases} tree cases, {tally.requests} requests x walk, "
        f"{tally.boundary_draws} differing within rounding of a boundary"
    )
    assert tally.draws > 1000 and tally.boundary_draws < tally.requests // 100


def test_emulated_tree_kernel_reads_long_logits_rows(emulated: Any, core: Any) -> None:
    """Long logits rows with top-k on (the law from top-k's survivors) through every walk:
    the emulated tree kernel writes the CPU driver's cells."""
    tally = _compare_trees(emulated, core, seed=20261207, cases=20, logits=True, long_rows=True)
    assert not tally.problems, "\n".join(tally.problems[:20])
    assert tally.draws > 20


_TREE_MUTATIONS: dict[str, Callable[[str], str]] = {
    # SpecInfer/RRS test r(x) without dividing by the residual's mass.
    "tree_residual_not_renormalised": lambda s: _replace(
        s, "if (mass != 1.0) r_x = r_x / mass;", ""
    ),
    # Point-mass candidates: a rejected sibling's token stays in r.
    "tree_siblings_not_removed": lambda s: _replace(s, "removed += r_x;", ""),
    # RRS: the tried siblings' tokens are not restored to the residual.
    "tree_rrs_no_fix_up": lambda s: _replace(s, "update[t] = value;", ""),
    # Traversal: a rejected child leaves its parent's weight as it was.
    "tree_traversal_weight_kept": lambda s: _replace(
        s, "if (d > 0 && level->rho < 1.0) level->rho = specdec_block_check(total, level->rho);",
        "",
    ),
    # Traversal: a rejected child's update is never swapped in.
    "tree_traversal_residual_dropped": lambda s: _replace(
        s, "level->has_residual = true;", "level->has_residual = false;"
    ),
    # Logits: point-mass candidates' final draw reads the raw logits row.
    "tree_logits_draw_unprocessed": lambda s: _replace(
        s, "const ProbT* p = processed_row(a, s, node + 1, false);",
        "const ProbT* p = a.target + (node + 1) * vocab;",
    ),
    # Logits: a rejected SpecInfer/RRS child's residual update reads its raw draft logits.
    "tree_logits_update_unprocessed": lambda s: _replace(
        s, "if (q == nullptr) q = processed_row(a, s, child, true);",
        "if (q == nullptr) q = a.draft + child * vocab;",
    ),
}  # fmt: skip


@pytest.mark.parametrize("mutation", sorted(_TREE_MUTATIONS))
def test_emulation_detects_mutated_tree_kernels(
    core: Any, tmp_path_factory: pytest.TempPathFactory, mutation: str
) -> None:
    """Negative controls: a wrong tree kernel must disagree with the CPU driver (on
    probability rows or on logits rows)."""
    sources = _cuda.cuda_sources()
    mutated = {"tree_driver": _TREE_MUTATIONS[mutation](sources["tree_driver"])}
    lib = _build_emulation(tmp_path_factory.mktemp(mutation), mutation, mutated)
    tallies = [
        _compare_trees(lib, core, seed=20260101, cases=100, logits=logits)
        for logits in (False, True)
    ]
    assert any(tally.problems for tally in tallies), f"mutation {mutation} went unnoticed"


def _launch_trees(c: Trees, method: int, **changes: Any) -> list[np.ndarray]:
    """``core_like.verify_trees`` on fake device arrays (``changes``: arguments replaced)."""
    fake = sys.modules["cupy"]
    vocab = int(c.target.shape[1])
    wrap = fake.asarray
    out = [wrap(buffer) for buffer in c.buffers()]
    arguments = {
        "method": method,
        "target_rows": wrap(c.target),
        "draft_rows": wrap(c.target if c.draft is None else c.draft),
        "point_mass_drafts": c.draft is None,
        "draft_token_ids": wrap(c.ids),
        "tree_parents": wrap(c.parents),
        "node_offsets": wrap(c.offsets),
        **{name: wrap(link) for name, link in c.links()._asdict().items()},
        "uniforms": wrap(c.flat_uniforms()),
        "accepted_nodes": out[0],
        "output": out[1],
        "accepted_lengths": out[2],
        "row_status": out[3],
        "num_threads": 3,
        "request_methods": None if c.methods is None else wrap(c.methods),
        "working": wrap(np.empty((c.batch, _working_rows(method, c.depth) * vocab))),
    }
    if c.sampling is not None:
        arguments["sampling"] = wrap(c.sampling)
        arguments["scratch"] = wrap(np.empty((c.batch, 2 * vocab), c.target.dtype))
    arguments.update(changes)
    assert _cuda.core_like.verify_trees(**arguments) is None, "reports through row_status"
    return [fake.asnumpy(x) for x in out]


def test_unknown_method_codes_are_an_error_status(emulated: Any, core: Any) -> None:
    """A method code outside the registry (per request, or of a whole tree call), or a
    stochastic walk without uniforms or working rows, is the request's row status
    ``STATUS_BAD_METHOD`` with nothing else of it written, never a walk of another method;
    the other requests of the batch are verified as the CPU verifies them."""
    rng = np.random.default_rng(23)
    bad = _contract.STATUS_BAD_METHOD
    for number in range(12):
        c = _engine_case(rng, logits=bool(number % 2))
        codes = rng.integers(0, len(registry.VERIFIERS), c.batch).astype(np.int8)
        wrong = int(rng.integers(c.batch))
        good = codes.copy()
        codes[wrong] = rng.choice([len(registry.VERIFIERS), -1, 100])
        parameters = c.posterior  # every verifier ignores what it does not read
        with np.errstate(all="ignore"):
            mine = _run_emulated_engine(emulated, _cuda.MIXED_ROW, c, parameters, codes)
            cpu = _run_cpu_engine(core, 0, c, parameters, good)
        assert mine[3][wrong] == bad
        assert (mine[0][wrong] == -7).all() and mine[1][wrong] == mine[2][wrong] == -7
        for b in range(c.batch):
            if b != wrong:
                for theirs, ours in zip(cpu, mine):
                    assert np.array_equal(theirs[b], ours[b]), (number, b)
    for number in range(12):
        c = _tree_case(rng, logits=bool(number % 2))
        c.methods = None  # one method for the whole call
        with np.errstate(all="ignore"):
            out = _run_trees_emulated(emulated, len(registry.TREE_METHODS), c)
        assert (out[3] == bad).all() and all((a == -7).all() for a in out[:3])
        rrs = registry.get_tree_method("rrs").code
        with np.errstate(all="ignore"):
            out = _run_trees_emulated(emulated, rrs, c, working=False)
        assert (out[3] == bad).all() and all((a == -7).all() for a in out[:3])
        methods = rng.integers(0, len(registry.TREE_METHODS), c.batch).astype(np.int8)
        wrong = int(rng.integers(c.batch))
        valid = Trees(**{**c.__dict__, "methods": methods.copy()})
        methods[wrong] = -3
        mixed = Trees(**{**c.__dict__, "methods": methods})
        with np.errstate(all="ignore"):
            mine = _run_trees_emulated(emulated, 0, mixed)
            theirs = _run_trees_emulated(emulated, 0, valid)
        assert mine[3][wrong] == bad
        for b in range(c.batch):
            if b != wrong:
                assert _request_result(mine, b) == _request_result(theirs, b)
    assert not emulated.emu_errors_seen()


def test_tree_launcher_drives_the_kernel(fake_cupy: Any, core: Any) -> None:
    """End to end through ``core_like.verify_trees``: argument order, null pointers, the
    instantiation chosen and the launch shape, for every walk and dtype pair; one
    ``RawModule`` for the tree source, compiled once; probability and logits rows."""
    rng = np.random.default_rng(13)
    seen = set()
    for prob_dtype, id_dtype, logits in itertools.product(FLOAT_TYPES, ID_TYPES, [0, 1, 0, 1]):
        c = _tree_case(rng, prob_dtype, id_dtype, logits=bool(logits))
        for _, method in TREE_WALKS:
            with np.errstate(all="ignore"):
                launched = _launch_trees(c, method)
                direct = _run_trees_emulated(fake_cupy._LIBRARY[0], method, c)
            for mine, theirs in zip(launched, direct):
                np.testing.assert_array_equal(mine, theirs)
            name = _cuda._tree_name(c.target.dtype, c.ids.dtype)
            assert fake_cupy.launches[-1] == (name, (c.batch,), (_cuda.BLOCK_SIZE,))
            seen.add(name)
    assert seen == set(_cuda.instantiation_names("tree_driver"))
    source = _cuda.cuda_sources()["tree_driver"]
    names = tuple(_cuda.instantiation_names("tree_driver"))
    assert fake_cupy.compiled == [(source, _cuda._COMPILE_OPTIONS, names)]


def test_tree_launcher_guards(fake_cupy: Any, core: Any) -> None:
    """O(1) guards before a launch (sampling and scratch rows, walks, dtypes, shapes, working
    rows, one device); an empty batch launches nothing; a greedy call needs neither uniforms
    nor working rows."""
    rng = np.random.default_rng(17)
    c = _tree_case(rng)
    while c.methods is not None or c.ids.shape[0] == 0:
        c = _tree_case(rng)
    wrap = fake_cupy.asarray
    vocab = int(c.target.shape[1])
    rrs = registry.get_tree_method("rrs").code
    sampling = wrap(np.ones((c.batch, _contract.SAMPLING_COLUMNS)))
    with pytest.raises(ValueError, match="scratch: expected a"):
        _launch_trees(c, rrs, sampling=sampling)
    with pytest.raises(ValueError, match="sampling: expected shape"):
        _launch_trees(c, rrs, sampling=wrap(np.ones((c.batch, 3))))
    other = np.float64 if c.target.dtype == np.float32 else np.float32
    with pytest.raises(TypeError, match="scratch: expected dtype"):
        _launch_trees(
            c, rrs, sampling=sampling, scratch=wrap(np.empty((c.batch, 2 * vocab), other))
        )
    with pytest.raises(ValueError, match="scratch: expected shape"):
        _launch_trees(
            c, rrs, sampling=sampling, scratch=wrap(np.empty((c.batch, vocab), c.target.dtype))
        )
    with pytest.raises(ValueError, match="method: expected a registry tree-method code"):
        _launch_trees(c, len(registry.TREE_METHODS))
    with pytest.raises(ValueError, match="working: expected float64"):
        _launch_trees(c, rrs, working=None)
    with pytest.raises(ValueError, match="working: expected shape"):
        _launch_trees(c, rrs, working=wrap(np.empty((1 + c.batch, 2 * vocab))))
    with pytest.raises(ValueError, match="target_rows: expected shape"):
        _launch_trees(c, rrs, target_rows=wrap(c.target[1:]))
    with pytest.raises(TypeError, match="tree_parents: expected dtype"):
        _launch_trees(c, rrs, tree_parents=wrap(c.parents.astype(np.int32)))
    with pytest.raises(ValueError, match="uniforms on device 1"):
        _launch_trees(c, rrs, uniforms=fake_cupy.ndarray(c.flat_uniforms(), 1))
    with pytest.raises(ValueError, match="output: expected shape"):
        _launch_trees(c, rrs, output=wrap(np.zeros((c.batch, c.depth + 2), np.int64)))
    assert not fake_cupy.launches
    greedy = registry.get_tree_method("greedy").code
    with np.errstate(all="ignore"):
        mine = _launch_trees(c, greedy, uniforms=wrap(np.empty(0)), working=None)
        cpu = _run_trees_cpu(core, greedy, c)
    for a, b in zip(mine, cpu):
        np.testing.assert_array_equal(a, b)
    empty = Trees(
        target=np.zeros((0, 5), np.float32), draft=None, ids=np.zeros(0, np.int64),
        parents=np.zeros(0, np.int64), offsets=np.zeros(1, np.int64), uniforms=np.zeros((0, 1)),
        methods=None, depth=0, kind="empty", sampling=None,
    )  # fmt: skip
    count = len(fake_cupy.launches)
    _launch_trees(empty, rrs)
    assert len(fake_cupy.launches) == count
