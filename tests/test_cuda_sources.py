"""CPU-side checks of the CUDA backend (SPEC 7, issue 5 item 4).

* Every CUDA source string of :mod:`specdec_np._cuda` is compiled to PTX with ``nvcc`` for
  ``sm_90`` and for the oldest architecture >= ``sm_75`` that this ``nvcc`` lists, with every
  template instantiation the CuPy backend asks for, so a syntax or template error in a kernel
  string fails CI on any machine with the CUDA toolkit (skipped where there is no ``nvcc``).
* A deliberately broken source must fail through the same helper (negative control).
* ``import specdec_np._cuda`` must not import CuPy.
* The kernels' *logic* runs on the CPU: the very same source strings are compiled with the
  host C++ compiler against a small emulation of the CUDA features they use (every CUDA
  thread of a block is a fiber, ``__syncthreads`` a scheduling point, so a divergent barrier
  is caught too) and must agree with the CPU kernels of ``specdec_np._core`` on the same
  inputs: identical decisions, row status and tokens, residual draws equal except where
  ``v * Z`` lies within rounding of a CDF boundary (checked explicitly). Mutated sources
  (negative controls) must disagree.

None of these needs a GPU or CuPy.
"""

from __future__ import annotations

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

from specdec_np import _cuda

REPO_ROOT = Path(__file__).resolve().parents[1]
NEWEST_ARCH = 90
OLDEST_ARCH = 75
COMPILE_TIMEOUT_S = 180


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
    good = _cuda.cuda_sources()["create_output"]
    broken = good.replace("long long r = k;", "long long r = k", 1)
    assert broken != good, "the negative control no longer edits the source; update it"
    names = _cuda.instantiation_names("create_output")
    for arch, returncode, stderr, _ in _compile_ptx(
        nvcc, tmp_path, "broken", broken, names, archs[:1]
    ):
        assert returncode != 0, f"a source with a syntax error compiled on {arch}"
        assert "error" in stderr.lower()


def test_unknown_name_expression_fails_to_compile(
    nvcc: str, archs: list[str], tmp_path: Path
) -> None:
    """Negative control: a name expression that matches no template must not compile."""
    names = ["greedy_kernel<float, int>", "no_such_kernel<float>"]
    results = _compile_ptx(
        nvcc, tmp_path, "badname", _cuda.cuda_sources()["greedy"], names, archs[:1]
    )
    assert results[0][1] != 0


def test_instantiation_names_cover_dtypes() -> None:
    names = _cuda.instantiation_names()
    for kernel in ("rejection_sample_kernel", "typical_acceptance_kernel", "greedy_kernel"):
        for prob in ("float", "double"):
            for ids in ("int", "long long"):
                assert f"{kernel}<{prob}, {ids}>" in names
    assert "create_output_kernel<int>" in names
    assert "create_output_kernel<long long>" in names
    for source_name in _cuda.cuda_sources():
        for name in _cuda.instantiation_names(source_name):
            assert name.split("<")[0] in _cuda.cuda_sources()[source_name]
    with pytest.raises(KeyError):
        _cuda.instantiation_names("no_such_source")


def test_sources_carry_the_python_launch_constants() -> None:
    for source in _cuda.cuda_sources().values():
        assert f"constexpr int kBlock = {_cuda.BLOCK_SIZE};" in source
        assert f"constexpr int kRowsPerBlock = {_cuda.CREATE_OUTPUT_BLOCK};" in source
        # NVRTC gets no include path from us: the sources must be self-contained.
        assert not re.search(r"^\s*#\s*include", source, flags=re.MULTILINE)


def test_decode_error_flag() -> None:
    batch, k = 3, 4
    assert _cuda.decode_error_flag(_cuda.NO_ERROR, batch, k) is None
    assert _cuda.decode_error_flag(0, batch, k) == ("draft_token_ids", 0, 0)
    assert _cuda.decode_error_flag(1 * (k + 1) + 3, batch, k) == ("draft_token_ids", 1, 3)
    assert _cuda.decode_error_flag(2 * (k + 1) + k, batch, k) == ("bonus_token_ids", 2, 0)
    cells = batch * (k + 1)
    assert _cuda.decode_error_flag(cells + 1 * (k + 1) + 2, batch, k) == ("zero_mass", 1, 2)
    for bad in (-1, 2 * cells):
        with pytest.raises(ValueError):
            _cuda.decode_error_flag(bad, batch, k)


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
        import specdec_np._cuda as cuda
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
# The kernels' logic, emulated on the CPU and compared with specdec_np._core
# ---------------------------------------------------------------------------------------------

_EMULATION_PRELUDE = r"""
// Single-threaded CPU emulation of the CUDA subset used by specdec_np's kernels. Every CUDA
// thread of a block is a ucontext fiber; __syncthreads() yields to a scheduler that runs each
// fiber up to its next barrier, round after round. A round in which some threads of a block
// finished while others wait at a barrier (a divergent __syncthreads) sets an error.
#include <ucontext.h>
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
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict
static ucontext_t emu_scheduler;
static std::vector<ucontext_t> emu_fibers;
static std::vector<char> emu_done;
static std::vector<char> emu_stacks;
static int emu_current = 0;
static int emu_errors = 0;
static std::function<void()> emu_body;
static void __syncthreads() { swapcontext(&emu_fibers[emu_current], &emu_scheduler); }
static void __threadfence() {}
template <class T> T atomicAdd(T* a, T v) { T old = *a; *a = old + v; return old; }
template <class T> T atomicMin(T* a, T v) { T old = *a; if (v < old) *a = v; return old; }
template <class T> T atomicMax(T* a, T v) { T old = *a; if (v > old) *a = v; return old; }
static double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static void emu_trampoline() {
    emu_body();
    emu_done[emu_current] = 1;
    swapcontext(&emu_fibers[emu_current], &emu_scheduler);
}
static void emu_launch(long long grid, int block, std::function<void()> body) {
    const size_t stack = 128 * 1024;
    if (emu_stacks.size() < stack * block) emu_stacks.resize(stack * block);
    emu_body = std::move(body);
    gridDim.x = (unsigned)grid;
    for (long long b = 0; b < grid; ++b) {
        blockIdx.x = (unsigned)b;
        emu_fibers.assign(block, ucontext_t{});
        emu_done.assign(block, 0);
        for (int t = 0; t < block; ++t) {
            getcontext(&emu_fibers[t]);
            emu_fibers[t].uc_stack.ss_sp = emu_stacks.data() + stack * t;
            emu_fibers[t].uc_stack.ss_size = stack;
            emu_fibers[t].uc_link = nullptr;
            makecontext(&emu_fibers[t], emu_trampoline, 0);
        }
        for (;;) {
            int finished = 0;
            for (int t = 0; t < block; ++t) {
                if (!emu_done[t]) {
                    emu_current = t;
                    threadIdx.x = (unsigned)t;
                    swapcontext(&emu_scheduler, &emu_fibers[t]);
                }
                finished += emu_done[t];
            }
            if (finished == block) break;
            if (finished > 0) {
                ++emu_errors;
                std::fprintf(stderr, "divergent __syncthreads in block %lld\n", b);
                break;
            }
        }
    }
}
extern "C" int emu_errors_seen() { return emu_errors; }
"""

_PROB_TYPES = {"f": ("float", np.float32), "d": ("double", np.float64)}
_ID_TYPES = {"i": ("int", np.int32), "l": ("long long", np.int64)}


def _emulation_unit(sources: dict[str, str]) -> str:
    """One C++ translation unit: the prelude, each source in its own namespace, C wrappers."""
    parts = [_EMULATION_PRELUDE]
    for name, source in sources.items():
        parts.append(f"namespace emu_{name} {{\n{source}\n}}  // namespace emu_{name}\n")
    ll = "long long"
    tail = f"{ll} B, {ll} k, {ll} V, {ll}* out, {ll}* al, {ll}* na, {ll}* c, {ll}* st, {ll}* rs"
    targs = "B, k, V, out, al, na, c, st, rs"
    block = "emu_rejection_sample::specdec::kBlock"
    parts.append(
        f'extern "C" void emu_init({ll}* state) {{\n'
        "    emu_launch(1, 1, [&] { emu_rejection_sample::init_call_state_kernel(state); });\n"
        "}\n"
    )
    for ik, (it, _) in _ID_TYPES.items():
        parts.append(
            f'extern "C" void emu_create_output_{ik}(const unsigned char* a, const {it}* s, '
            f"const {it}* d, const {it}* bo, {ll} B, {ll} k, {ll} V, {ll}* out, {ll}* al, "
            f"{ll}* na, {ll}* c, {ll}* rs) {{\n"
            f"    emu_launch((B + 255) / 256, 256, [&] {{ emu_create_output::create_output_kernel"
            f"<{it}>(a, s, d, bo, B, k, V, out, al, na, c, rs); }});\n}}\n"
        )
        for pk, (pt, _) in _PROB_TYPES.items():
            parts.append(
                f'extern "C" void emu_rejection_{pk}{ik}(const {pt}* t, const {pt}* q, '
                f"const {it}* d, const {it}* bo, const double* u, {tail}) {{\n"
                f"    emu_launch(B, {block}, [&] {{ emu_rejection_sample::rejection_sample_kernel"
                f"<{pt}, {it}>(t, q, d, bo, u, {targs}); }});\n}}\n"
                f'extern "C" void emu_typical_{pk}{ik}(const {pt}* t, const {it}* d, '
                f"const {it}* bo, double th, double alpha, {tail}) {{\n"
                f"    emu_launch(B, {block}, [&] {{ emu_typical_acceptance::"
                f"typical_acceptance_kernel<{pt}, {it}>(t, d, bo, th, alpha, {targs}); }});\n}}\n"
                f'extern "C" void emu_greedy_{pk}{ik}(const {pt}* t, const {it}* d, '
                f"const {it}* bo, {tail}) {{\n"
                f"    emu_launch(B, {block}, [&] {{ emu_greedy::greedy_kernel<{pt}, {it}>"
                f"(t, d, bo, {targs}); }});\n}}\n"
            )
    return "\n".join(parts)


def _find_cxx() -> str | None:
    for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build_emulation(tmp: Path, stem: str, sources: dict[str, str]) -> Any:
    import ctypes

    if not sys.platform.startswith("linux"):
        pytest.skip("the kernel emulation uses ucontext fibers (Linux only)")
    cxx = _find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (g++, clang++ or $CXX) for the kernel emulation")
    cpp = tmp / f"{stem}.cpp"
    lib = tmp / f"lib{stem}.so"
    cpp.write_text(_emulation_unit(sources))
    cmd = [cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", str(cpp), "-o", str(lib)]
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, f"host compile of the emulated kernels failed:\n{result.stderr}"
    return ctypes.CDLL(str(lib))


@pytest.fixture(scope="module")
def core() -> Any:
    return pytest.importorskip("specdec_np._core", reason="the CPU kernels are not built")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _build_emulation(tmp_path_factory.mktemp("emu"), "emu", _cuda.cuda_sources())


class _Kernels:
    """ctypes calls of the emulated kernels and of ``specdec_np._core``, on NumPy arrays."""

    def __init__(self, lib: Any, core: Any) -> None:
        self.lib, self.core = lib, core

    @staticmethod
    def _ptr(array: np.ndarray | None) -> Any:
        import ctypes

        return None if array is None else ctypes.c_void_p(array.ctypes.data)

    def emulated(
        self, kind: str, t: np.ndarray, d: np.ndarray, bo: np.ndarray, *extra: Any, flag_mode: bool
    ) -> tuple[np.ndarray, ...]:
        """(out, accepted_lengths, num_accepted, row_status, counters, [flag, blocks done]).

        ``flag_mode``: as ``_cuda.rejection_sample`` & co. launch (call state initialised by
        its kernel, counters committed by the last block); otherwise as ``_cuda.core_like``
        (row status only).
        """
        import ctypes

        batch, k = d.shape
        vocab = t.shape[2]
        out = np.full((batch, k + 1), -7, np.int64)
        lengths, accepted = np.full(batch, -7, np.int64), np.full(batch, -7, np.int64)
        status = None if flag_mode else np.full(batch, -7, np.int64)
        state = np.full(4, -7, np.int64) if flag_mode else None
        counters = np.zeros(2, np.int64) if flag_mode else None
        if flag_mode:
            self.lib.emu_init(self._ptr(state))
        pk = "f" if t.dtype == np.float32 else "d"
        ik = "i" if d.dtype == np.int32 else "l"
        function = getattr(self.lib, f"emu_{kind}_{pk}{ik}")
        head: tuple[Any, ...] = (self._ptr(t),)
        if kind == "rejection":
            q, u = extra
            head += (self._ptr(q), self._ptr(d), self._ptr(bo), self._ptr(u))
        elif kind == "typical":
            head += (self._ptr(d), self._ptr(bo), ctypes.c_double(extra[0]))
            head += (ctypes.c_double(extra[1]),)
        else:
            head += (self._ptr(d), self._ptr(bo))
        sizes = tuple(ctypes.c_longlong(n) for n in (batch, k, vocab))
        buffers = (out, lengths, accepted, counters, state, status)
        function(*head, *sizes, *(self._ptr(a) for a in buffers))
        flag_and_blocks = np.array([-1, -1]) if state is None else state[2:]
        return out, lengths, accepted, status, counters, flag_and_blocks

    def cpu(
        self, kind: str, t: np.ndarray, d: np.ndarray, bo: np.ndarray, *extra: Any
    ) -> tuple[np.ndarray, ...]:
        batch, k = d.shape
        out = np.full((batch, k + 1), -7, np.int64)
        rows = [np.full(batch, -7, np.int64) for _ in range(3)]
        if kind == "rejection":
            q, u = extra
            self.core.rejection_sample(
                t, t if q is None else q, q is None, d, bo, u, out, *rows, 1
            )
        elif kind == "typical":
            self.core.typical_acceptance_sample(t, d, bo, *extra, out, *rows, 1)
        else:
            self.core.greedy_sample(t, d, bo, out, *rows, 1)
        return (out, *rows)


def _probabilities(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, kind: str) -> Any:
    if kind == "ties":
        return rng.choice(np.array([0.0, 0.125, 0.25], dtype=dtype), size=shape)
    if kind == "noise":  # unnormalised, as vLLM's typical-acceptance tests use
        return rng.random(shape).astype(dtype)
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


def _residual(t: np.ndarray, q: Any, d: np.ndarray, b: int, r: int) -> np.ndarray:
    p = t[b, r].astype(np.float64)
    if q is not None:
        w = p - q[b, r].astype(np.float64)
    else:
        w = p.copy()
        w[d[b, r]] -= 1.0
    w = np.where(w > 0, w, 0.0)
    return w if w.sum() > 0 else np.where(p > 0, p, 0.0)


def _case(rng: np.random.Generator) -> dict[str, Any]:
    batch, k = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    vocab = int(rng.choice([1, 2, 7, 33, 512, 513, 1000, 9000, 20001]))
    pdt = (np.float32, np.float64)[int(rng.integers(2))]
    idt = (np.int32, np.int64)[int(rng.integers(2))]
    kind = str(rng.choice(["flat", "peaked", "sparse", "ties", "noise"]))
    t = _probabilities(rng, (batch, k + 1, vocab), pdt, kind)
    q = _probabilities(rng, (batch, k, vocab), pdt, "flat") if rng.random() < 0.5 else None
    source = t[:, :k] if q is None else q
    d = np.empty((batch, k), idt)
    for b in range(batch):
        for i in range(k):
            w = source[b, i].astype(np.float64)
            good = w.sum() > 0 and rng.random() < 0.8
            d[b, i] = rng.choice(vocab, p=w / w.sum()) if good else rng.integers(0, vocab)
    bo = rng.integers(0, vocab, size=batch).astype(idt)
    u = rng.random((batch, k + 1))
    extreme = rng.random()
    if extreme < 0.1:
        u[:] = np.nextafter(1.0, 0.0)
    elif extreme < 0.2:
        u[:] = 0.0
    if rng.random() < 0.15:  # an out-of-range id
        if k and rng.random() < 0.6:
            d[rng.integers(batch), rng.integers(k)] = rng.choice([-1, vocab, vocab + 5])
        else:
            bo[rng.integers(batch)] = rng.choice([-1, vocab])
    if rng.random() < 0.15:  # a NaN or all-zero row (zero-mass rows for the rejection sampler)
        t[rng.integers(batch), rng.integers(k + 1)] = rng.choice([np.nan, 0.0])
    if rng.random() < 0.3:
        t = _misaligned(rng, t)
    if q is not None and rng.random() < 0.3:
        q = _misaligned(rng, q)
    posterior = (float(rng.choice([0.09, 0.3, 0.7])), float(rng.choice([0.3, 0.05, 0.0])))
    return {"t": t, "q": q, "d": d, "bo": bo, "u": u, "posterior": posterior}


def _disagreements(kernels: _Kernels, seed: int, cases: int) -> list[str]:
    """Every way the emulated kernels differ from the CPU kernels on random cases."""
    rng = np.random.default_rng(seed)
    problems: list[str] = []
    for number in range(cases):
        c = _case(rng)
        t, q, d, bo, u = c["t"], c["q"], c["d"], c["bo"], c["u"]
        batch, k = d.shape
        width = k + 1
        for kind, extra in (("rejection", (q, u)), ("typical", c["posterior"]), ("greedy", ())):
            where = f"case {number} {kind} V={t.shape[2]} {t.dtype} {d.dtype}"
            with np.errstate(all="ignore"):
                out, lengths, accepted, status, _, _ = kernels.emulated(
                    kind, t, d, bo, *extra, flag_mode=False
                )
                flagged = kernels.emulated(kind, t, d, bo, *extra, flag_mode=True)
                cpu_out, cpu_lengths, cpu_accepted, cpu_status = kernels.cpu(
                    kind, t, d, bo, *extra
                )
            for mine, theirs in zip(flagged[:3], (out, lengths, accepted)):
                if not np.array_equal(mine, theirs):
                    problems.append(f"{where}: flag mode and row-status mode differ")
            if not np.array_equal(status, cpu_status):
                problems.append(f"{where}: row status {status} != CPU {cpu_status}")
                continue
            expected_flag = _cuda.NO_ERROR
            for b in range(batch):
                if status[b] > 0:
                    expected_flag = min(expected_flag, b * width + int(status[b]) - 1)
                elif status[b] < 0:
                    expected_flag = min(expected_flag, (batch + b) * width - int(status[b]) - 1)
            ok = expected_flag == _cuda.NO_ERROR
            expected_counters = [accepted.sum(), (lengths + 1).sum()] if ok else [0, 0]
            if flagged[5][0] != expected_flag or not np.array_equal(flagged[4], expected_counters):
                problems.append(f"{where}: flag {flagged[5][0]} / counters {flagged[4]} wrong")
            if flagged[5][1] != batch:
                problems.append(f"{where}: {flagged[5][1]} blocks finished, expected {batch}")
            for b in range(batch):
                if status[b] > 0:
                    if not ((out[b] == -1).all() and lengths[b] == 0 and accepted[b] == 0):
                        problems.append(f"{where}: row {b} with a bad id not cleared: {out[b]}")
                    continue
                if (lengths[b], accepted[b]) != (cpu_lengths[b], cpu_accepted[b]):
                    problems.append(
                        f"{where}: row {b} decisions (r, accepted) = ({lengths[b]}, "
                        f"{accepted[b]}) != CPU ({cpu_lengths[b]}, {cpu_accepted[b]})"
                    )
                    continue
                if status[b] < 0:
                    continue
                r = int(lengths[b])
                others = np.arange(width) != r
                if not np.array_equal(out[b][others], cpu_out[b][others]):
                    problems.append(f"{where}: row {b} output {out[b]} != CPU {cpu_out[b]}")
                elif out[b, r] != cpu_out[b, r]:
                    if kind != "rejection" or r == k:
                        problems.append(f"{where}: row {b} token {out[b]} != CPU {cpu_out[b]}")
                        continue
                    # A residual draw may differ only where v * Z is within rounding of the
                    # CDF boundary between the two tokens.
                    w = _residual(t, q, d, b, r)
                    cdf = np.cumsum(w)
                    total = cdf[-1]
                    target = u[b, k] * total
                    tol = 4 * len(w) * np.finfo(np.float64).eps * total
                    for y in (int(out[b, r]), int(cpu_out[b, r])):
                        below = cdf[y - 1] if y else 0.0
                        if not (w[y] > 0 and below - tol <= target < cdf[y] + tol):
                            problems.append(
                                f"{where}: row {b} draws {out[b, r]} vs CPU {cpu_out[b, r]}, "
                                f"not at a CDF boundary (v * Z = {target}, token {y} covers "
                                f"({below}, {cdf[y]}])"
                            )
    if kernels.lib.emu_errors_seen():
        problems.append("a divergent __syncthreads was detected")
    return problems


def test_emulated_kernels_match_cpu_kernels(emulated: Any, core: Any) -> None:
    problems = _disagreements(_Kernels(emulated, core), seed=20240611, cases=40)
    assert not problems, "\n".join(problems[:20])


def test_emulated_create_output_matches_cpu_kernel(emulated: Any, core: Any) -> None:
    import ctypes

    rng = np.random.default_rng(7)
    ptr = _Kernels._ptr
    for _ in range(30):
        batch, k, vocab = int(rng.integers(0, 300)), int(rng.integers(1, 5)), 50
        idt = (np.int32, np.int64)[int(rng.integers(2))]
        accepted = (rng.random((batch, k)) < 0.6).view(np.uint8)
        low = -1 if rng.random() < 0.3 else 0
        high = vocab + 1 if rng.random() < 0.3 else vocab
        sub, d = (rng.integers(low, high, (batch, k)).astype(idt) for _ in range(2))
        bo = rng.integers(low, high, batch).astype(idt)
        results = []
        for limit in (vocab, -1):  # checked as core_like does; verbatim as create_output does
            out = np.full((batch, k + 1), -7, np.int64)
            rows = [np.full(batch, -7, np.int64) for _ in range(3)]
            counters = np.zeros(2, np.int64)
            function = getattr(emulated, f"emu_create_output_{'i' if idt == np.int32 else 'l'}")
            sizes = (ctypes.c_longlong(n) for n in (batch, k, limit))
            function(ptr(accepted), ptr(sub), ptr(d), ptr(bo), *sizes, ptr(out), ptr(rows[0]),
                     ptr(rows[1]), ptr(counters), ptr(rows[2]))  # fmt: skip
            results.append((out, *rows, counters))
        cpu_out = np.full((batch, k + 1), -7, np.int64)
        cpu_rows = [np.full(batch, -7, np.int64) for _ in range(3)]
        core.create_output(accepted, sub, d, bo, vocab, cpu_out, *cpu_rows)
        out, lengths, num, status, counters = results[0]
        assert np.array_equal(status, cpu_rows[2])
        good = status == 0
        assert np.array_equal(out[good], cpu_out[good])
        assert np.array_equal(lengths[good], cpu_rows[0][good])
        assert np.array_equal(num[good], cpu_rows[1][good])
        assert (out[~good] == -1).all()
        assert counters.tolist() == [num[good].sum(), (lengths[good] + 1).sum()]
        # Unchecked: ids copied verbatim, every row counted (vLLM's _create_output).
        out, lengths, num, status, counters = results[1]
        assert (status == 0).all()
        rejected = ~accepted.astype(bool)
        r = np.array([np.flatnonzero(row)[0] if row.any() else k for row in rejected], np.int64)
        for b in range(batch):
            expected = np.full(k + 1, -1)
            expected[: r[b]] = d[b, : r[b]]
            expected[r[b]] = bo[b] if r[b] == k else sub[b, r[b]]
            assert out[b].tolist() == expected.tolist()
        assert counters.tolist() == [int(accepted.astype(bool).sum()), int((r + 1).sum())]


_MUTATIONS: dict[str, Callable[[dict[str, str]], dict[str, str]]] = {
    # The residual forgets the draft: tokens drawn from p instead of max(p - q, 0).
    "residual_ignores_draft": lambda s: {
        **s,
        "rejection_sample": s["rejection_sample"].replace(
            "if (Mode == kDenseResidual) w -= static_cast<double>(qv);", ""
        ),
    },
    # Ties go to the last index instead of the first.
    "argmax_last_on_ties": lambda s: {
        **s,
        "greedy": s["greedy"].replace(
            "(v == value_buf[t] && i < index_buf[t])", "(v == value_buf[t])"
        ),
    },
}


@pytest.mark.parametrize("mutation", sorted(_MUTATIONS))
def test_emulation_detects_mutated_kernels(
    core: Any, tmp_path_factory: pytest.TempPathFactory, mutation: str
) -> None:
    """Negative controls: a wrong kernel must disagree with the CPU kernels."""
    original = _cuda.cuda_sources()
    mutated = _MUTATIONS[mutation](original)
    assert mutated != original, f"mutation {mutation} no longer applies; update it"
    lib = _build_emulation(tmp_path_factory.mktemp(mutation), mutation, mutated)
    assert _disagreements(_Kernels(lib, core), seed=20240611, cases=40)


# ---------------------------------------------------------------------------------------------
# The Python launchers, driven through a stand-in ``cupy`` whose kernels are the emulated ones
# ---------------------------------------------------------------------------------------------


class _FakeDevice:
    def __init__(self, device_id: int = 0) -> None:
        self.id = device_id

    def __enter__(self) -> _FakeDevice:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


class _FakeArray(np.ndarray):
    """A NumPy array with CuPy's ``device`` context manager (device 0 unless moved)."""

    device_id = 0

    @property
    def device(self) -> _FakeDevice:  # type: ignore[override]
        return _FakeDevice(self.device_id)


class _FakeCupy:
    """Just enough of ``cupy`` for ``specdec_np._cuda``: host arrays, emulated kernels."""

    int64 = np.int64

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.launches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        self.compiled: list[tuple[str, tuple[str, ...]]] = []
        fake = self

        class _Runtime:
            @staticmethod
            def getDevice() -> int:  # noqa: N802 (CuPy's name)
                return 0

        class _Cuda:
            runtime = _Runtime

        class _Kernel:
            def __init__(self, name: str) -> None:
                self.name = name
                template = name.split("<")[0]
                types = name[len(template) :].strip("<>").split(", ") if "<" in name else []
                codes = {"float": "f", "double": "d", "int": "i", "long long": "l"}
                suffix = "".join(codes[t] for t in types)
                stem = {
                    "create_output_kernel": "create_output",
                    "rejection_sample_kernel": "rejection",
                    "typical_acceptance_kernel": "typical",
                    "greedy_kernel": "greedy",
                    "init_call_state_kernel": "init",
                }[template]
                self.function = getattr(lib, f"emu_{stem}_{suffix}" if suffix else f"emu_{stem}")

            def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: Any) -> None:
                import ctypes

                fake.launches.append((self.name, grid, block))
                converted = []
                for arg in args:
                    if arg is None:
                        converted.append(None)
                    elif isinstance(arg, np.ndarray):
                        converted.append(ctypes.c_void_p(arg.ctypes.data))
                    elif isinstance(arg, np.int64):
                        converted.append(ctypes.c_longlong(int(arg)))
                    elif isinstance(arg, np.float64):
                        converted.append(ctypes.c_double(float(arg)))
                    else:
                        raise TypeError(f"kernel argument of type {type(arg)}: not a CuPy type")
                self.function(*converted)

        class _RawModule:
            def __init__(self, code: str, options: tuple[str, ...], name_expressions: Any):
                assert options == ("--std=c++17",)
                assert code in _cuda.cuda_sources().values()
                self.names = list(name_expressions)
                fake.compiled.append((code, tuple(self.names)))

            def get_function(self, name: str) -> _Kernel:
                assert name in self.names, f"{name} was not in name_expressions"
                return _Kernel(name)

        self.cuda = _Cuda
        self.RawModule = _RawModule

    @staticmethod
    def _wrap(array: np.ndarray) -> _FakeArray:
        return np.ascontiguousarray(array).view(_FakeArray)

    def empty(self, shape: Any, dtype: Any) -> _FakeArray:
        return self._wrap(np.empty(shape, dtype))

    def zeros(self, shape: Any, dtype: Any) -> _FakeArray:
        return self._wrap(np.zeros(shape, dtype))

    def full(self, shape: Any, value: Any, dtype: Any) -> _FakeArray:
        return self._wrap(np.full(shape, value, dtype))

    def ascontiguousarray(self, array: np.ndarray) -> _FakeArray:
        return self._wrap(array)


@pytest.fixture
def fake_cupy(emulated: Any, monkeypatch: pytest.MonkeyPatch) -> _FakeCupy:
    fake = _FakeCupy(emulated)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_cuda, "_MODULES", {})
    return fake


def test_launchers_drive_the_kernels(fake_cupy: _FakeCupy, core: Any) -> None:
    """End to end through the Python launchers: argument order, null pointers, launch shapes,
    counters committed on device, the error flag and its decoding."""
    wrap = _FakeCupy._wrap
    rng = np.random.default_rng(3)
    batch, k, vocab = 5, 3, 700
    for pdt, idt in ((np.float32, np.int64), (np.float64, np.int32)):
        t = _probabilities(rng, (batch, k + 1, vocab), pdt, "peaked")
        q = _probabilities(rng, (batch, k, vocab), pdt, "flat")
        # Likely accepted drafts (the target's argmax), except position 0 of odd rows: so
        # accepted lengths and accepted counts differ, and a swap of the two is caught.
        d = t[:, :k].argmax(-1).astype(idt)
        d[1::2, 0] = (d[1::2, 0] + 1) % vocab
        bo = rng.integers(0, vocab, batch).astype(idt)
        u = rng.random((batch, k + 1))
        counters = wrap(np.array([10, 20], np.int64))
        for probs in (q, None):
            out, lengths, num, flag = _cuda.rejection_sample(
                wrap(t), None if probs is None else wrap(probs), wrap(d), wrap(bo), wrap(u),
                counters,
            )  # fmt: skip
            expected = _Kernels(fake_cupy.lib, core).cpu("rejection", t, d, bo, probs, u)
            assert np.array_equal(out, expected[0]) and np.array_equal(lengths, expected[1])
            assert np.array_equal(num, expected[2]) and flag[0] == _cuda.NO_ERROR
            assert not np.array_equal(lengths, num), "test data no longer tells them apart"
            assert fake_cupy.launches[-2] == ("init_call_state_kernel", (1,), (1,))
            assert fake_cupy.launches[-1][1:] == ((batch,), (_cuda.BLOCK_SIZE,))
            _cuda.check_error_flag(flag, d, bo, vocab)
        before = counters.copy()
        out, lengths, num, flag = _cuda.greedy_sample(wrap(t), wrap(d), wrap(bo), counters)
        expected = _Kernels(fake_cupy.lib, core).cpu("greedy", t, d, bo)
        assert np.array_equal(out, expected[0]) and flag[0] == _cuda.NO_ERROR
        assert counters.tolist() == [before[0] + num.sum(), before[1] + (lengths + 1).sum()]
        # Flat rows (exp(-H) about 1/400) put p(x) around both thresholds, so that each of
        # posterior_threshold and posterior_alpha decides some positions: a launcher that
        # swapped or dropped one of them would disagree with the CPU kernel.
        rows = 16
        flat = _probabilities(rng, (rows, k + 1, vocab), pdt, "flat")
        flat_ids = rng.integers(0, vocab, (rows, k)).astype(idt)
        flat_bonus = rng.integers(0, vocab, rows).astype(idt)
        cpu = _Kernels(fake_cupy.lib, core).cpu
        for other in ((0.5, 0.5), (0.0003, 0.0003)):
            assert not np.array_equal(
                cpu("typical", flat, flat_ids, flat_bonus, 0.0003, 0.5)[2],
                cpu("typical", flat, flat_ids, flat_bonus, *other)[2],
            ), "test data no longer lets both posterior parameters decide positions"
        results = []
        for posterior in ((0.0003, 0.5), (0.5, 0.0003)):
            out, lengths, num, flag = _cuda.typical_acceptance_sample(
                wrap(flat), wrap(flat_ids), wrap(flat_bonus), *posterior, counters
            )
            expected = cpu("typical", flat, flat_ids, flat_bonus, *posterior)
            assert np.array_equal(out, expected[0]) and np.array_equal(num, expected[2])
            results.append(num)
        assert not np.array_equal(*results), "test data no longer tells the posteriors apart"
        for posterior in ((0.0003, 0.5), (0.5, 0.0003)):
            buffers = [wrap(np.full((rows, k + 1), -7, np.int64))]
            buffers += [wrap(np.full(rows, -7, np.int64)) for _ in range(3)]
            _cuda.core_like.typical_acceptance_sample(
                wrap(flat), wrap(flat_ids), wrap(flat_bonus), *posterior, *buffers, 2
            )
            expected = cpu("typical", flat, flat_ids, flat_bonus, *posterior)
            assert all(np.array_equal(a, b) for a, b in zip(buffers, expected))
        buffers = [wrap(np.full((batch, k + 1), -7, np.int64))]
        buffers += [wrap(np.full(batch, -7, np.int64)) for _ in range(3)]
        _cuda.core_like.greedy_sample(wrap(t), wrap(d), wrap(bo), *buffers, 2)
        assert all(np.array_equal(a, b) for a, b in zip(buffers, cpu("greedy", t, d, bo)))
        # core_like: caller buffers and row status, as specdec_np._core
        buffers = [wrap(np.full((batch, k + 1), -7, np.int64))]
        buffers += [wrap(np.full(batch, -7, np.int64)) for _ in range(3)]
        _cuda.core_like.rejection_sample(
            wrap(t), wrap(t), True, wrap(d), wrap(bo), wrap(u), *buffers, 4
        )
        expected = _Kernels(fake_cupy.lib, core).cpu("rejection", t, d, bo, None, u)
        assert all(np.array_equal(a, b) for a, b in zip(buffers, expected))
        accepted = wrap((rng.random((batch, k)) < 0.5).view(np.uint8))
        sub = rng.integers(0, vocab, (batch, k)).astype(idt)
        _cuda.core_like.create_output(accepted, wrap(sub), wrap(d), wrap(bo), vocab, *buffers)
        cpu_buffers = [np.full_like(b, -7) for b in buffers]
        core.create_output(accepted, sub, d, bo, vocab, *cpu_buffers)
        assert all(np.array_equal(a, b) for a, b in zip(buffers, cpu_buffers))
        out = _cuda.create_output(accepted.view(bool), wrap(sub), wrap(d), wrap(bo), counters)
        assert np.array_equal(out, cpu_buffers[0])

    # An out-of-range id: flagged on the device, counters untouched, raised by the check.
    counters = wrap(np.array([10, 20], np.int64))
    bad = d.copy()
    bad[3, 1] = vocab
    out, lengths, num, flag = _cuda.rejection_sample(
        wrap(t), None, wrap(bad), wrap(bo), wrap(u), counters
    )
    assert _cuda.decode_error_flag(int(flag[0]), batch, k) == ("draft_token_ids", 3, 1)
    assert counters.tolist() == [10, 20]
    assert (out[3] == -1).all()
    with pytest.raises(ValueError, match=r"found 700 at \(row, position\) = \(3, 1\)"):
        _cuda.check_error_flag(flag, bad, bo, vocab)

    # B == 0: empty results, nothing launched or compiled.
    launched = len(fake_cupy.launches)
    empty = np.zeros((0, k + 1, vocab), np.float32)
    out, lengths, num, flag = _cuda.greedy_sample(
        wrap(empty), wrap(np.zeros((0, k), np.int64)), wrap(np.zeros(0, np.int64)), counters
    )
    assert out.shape == (0, k + 1) and lengths.shape == (0,) and flag[0] == _cuda.NO_ERROR
    assert len(fake_cupy.launches) == launched
    # One RawModule per (device, source): compiled once, reused.
    assert len(fake_cupy.compiled) == len({code for code, _ in fake_cupy.compiled})


def test_launchers_reject_mixed_devices(fake_cupy: _FakeCupy) -> None:
    wrap = _FakeCupy._wrap
    target = wrap(np.full((2, 2, 4), 0.25, np.float32))
    ids, bonus = wrap(np.zeros((2, 1), np.int64)), wrap(np.zeros(2, np.int64))
    uniforms = wrap(np.zeros((2, 2)))
    counters = wrap(np.zeros(2, np.int64))
    counters.device_id = 1
    with pytest.raises(ValueError, match="counters on device 1"):
        _cuda.rejection_sample(target, None, ids, bonus, uniforms, counters)
    with pytest.raises(ValueError, match="counters on device 1"):
        _cuda.greedy_sample(target, ids, bonus, counters)
    assert not fake_cupy.launches


def test_greedy_margin_matches_cpu_kernel(core: Any) -> None:
    """Both backends take the same greedy shortcut, so they make the same decisions."""
    assert _cuda.GREEDY_MARGIN == core.GREEDY_MARGIN
    assert f"kGreedyMargin = {_cuda.GREEDY_MARGIN!r};" in _cuda.cuda_sources()["greedy"]
