"""Every CUDA source compiles through CuPy's own ``RawModule``/NVRTC path, without a GPU.

``tests/kernels/test_cuda_sources.py`` compiles the sources with ``nvcc``; what the library really
runs is ``cupy.RawModule(code, options, name_expressions)``, which adds CuPy's own options,
include paths and name-expression handling before NVRTC sees the text. This file drives that
path on a machine without a driver:

* ``cupy._core.raw._get_raw_module`` and ``cupy.cuda.compiler._get_arch_for_options_for_nvrtc``
  are memoized per device (asking the driver which device is current), so their
  ``__wrapped__`` functions are used instead;
* ``cupy.cuda.compiler._get_arch`` (which asks the device for its compute capability) returns
  the target architecture;
* the compiler's ``function.Module`` is replaced by a subclass whose ``load`` keeps the cubin
  instead of handing it to ``cuModuleLoadData``;
* ``CUPY_CACHE_IN_MEMORY=1`` so that a kernel cache on disk can never stand in for a compile.

Each source of ``specdec_np._kernels.cuda.cuda_sources()`` is compiled for ``sm_90`` with every
name expression of ``instantiation_names``, and for ``sm_75`` with every kernel in float32 with
int32 ids; the cubin must be an ELF for that
architecture holding one symbol per name expression. Negative controls: a source with a
syntax error and an unknown name expression must fail through the same path.

The tests need CuPy and NVRTC (``pip install -e ".[nvrtc-check]"``), not a GPU. They skip only
where CuPy or one of the private names above is missing, and the skip reason names it.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from typing import Any

import pytest

from specdec_np._kernels import cuda as _cuda

# Compiles every CUDA source through NVRTC for two architectures: the full suite only.
pytestmark = pytest.mark.slow

TARGET_ARCHS = ("90", "75")
#: How a name expression spells the float64 rows and int64 ids that sm_75 leaves out.
_WIDE_CTYPES = ("double", "long long")
SOURCE_NAMES = sorted(_cuda.cuda_sources())
ELF_MAGIC = b"\x7fELF"


def _private(module_name: str, *attributes: str) -> Any:
    """``module_name.attr1.attr2...``, or a skip that names the first missing part."""
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        pytest.skip(f"CuPy is missing: cannot import {module_name} ({error})")
    dotted = module_name
    for attribute in attributes:
        dotted += f".{attribute}"
        if not hasattr(found, attribute):
            import cupy

            pytest.skip(f"CuPy {cupy.__version__} lacks the private name {dotted}")
        found = getattr(found, attribute)
    return found


def _cubin_arch(cubin: bytes) -> int:
    """The SM number a CUDA ELF is built for, read from its header's ``e_flags``.

    CUDA ELFs carry ABI version 8 and later (CUDA 12.8+) with the SM number in bits 8..15 of
    ``e_flags``; older ones keep it in bits 0..7.
    """
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    abi_version = cubin[8]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF


@pytest.fixture
def nvrtc_compile(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, list[str], str], Any]:
    """Compile ``(source, name_expressions, arch)`` with ``cupy.RawModule``; return the kept
    module (``.cubin``: the bytes NVRTC produced, ``.mapping``: name expression to symbol)."""
    cupy = _private("cupy")
    get_raw_module = _private("cupy._core.raw", "_get_raw_module", "__wrapped__")
    arch_options = _private("cupy.cuda.compiler", "_get_arch_for_options_for_nvrtc", "__wrapped__")
    _private("cupy.cuda.compiler", "_get_arch")
    module_type = _private("cupy.cuda.compiler", "function", "Module")
    _private("cupy.cuda.compiler", "CompileException")
    _private("cupy", "RawModule", "module")
    raw = importlib.import_module("cupy._core.raw")
    compiler = importlib.import_module("cupy.cuda.compiler")
    function = compiler.function

    class KeptModule(module_type):  # type: ignore[misc, valid-type]
        """A ``cupy.cuda.function.Module`` that keeps its cubin instead of loading it."""

        cubin: bytes | None = None

        def load(self, cubin: bytes) -> None:
            self.cubin = bytes(cubin)

    class FunctionWithKeptModules:
        """``cupy.cuda.function`` as the compiler sees it, with ``Module`` replaced."""

        Module = KeptModule

        def __getattr__(self, name: str) -> Any:
            return getattr(function, name)

    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    # CuPy emits PTX instead of a cubin when this is set; the cubin is what a device loads.
    monkeypatch.delenv("CUPY_COMPILE_WITH_PTX", raising=False)
    monkeypatch.setattr(compiler, "_use_ptx", False, raising=False)
    monkeypatch.setattr(raw, "_get_raw_module", get_raw_module)
    monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc", arch_options)
    monkeypatch.setattr(compiler, "function", FunctionWithKeptModules())

    def compile_source(source: str, names: list[str], arch: str) -> Any:
        monkeypatch.setattr(compiler, "_get_arch", lambda: arch)
        module = cupy.RawModule(
            code=source, options=_cuda._COMPILE_OPTIONS, name_expressions=names
        ).module
        assert isinstance(module, KeptModule), (
            f"CuPy returned a {type(module).__name__}, not the module this test keeps: the "
            "compile did not go through cupy.cuda.compiler.function.Module"
        )
        assert module.cubin is not None, "CuPy compiled the source but never loaded a cubin"
        return module

    return compile_source


@pytest.fixture
def compile_exception() -> type[Exception]:
    return _private("cupy.cuda.compiler", "CompileException")


@pytest.mark.parametrize("arch", TARGET_ARCHS)
@pytest.mark.parametrize("source_name", SOURCE_NAMES)
def test_source_compiles_through_raw_module(
    nvrtc_compile: Callable[[str, list[str], str], Any], source_name: str, arch: str
) -> None:
    names = _cuda.instantiation_names(source_name)
    assert names, f"{source_name} lists no name expressions"
    if arch != TARGET_ARCHS[0]:
        # The older architecture: every kernel and row functor in float32 with int32 ids.
        # An instantiation's code generation is most of a compile (chain_driver: 5 s for
        # one, minutes for all), and the wider dtypes change only template arguments.
        names = [name for name in names if not any(wide in name for wide in _WIDE_CTYPES)]
    module = nvrtc_compile(_cuda.cuda_sources()[source_name], names, arch)
    cubin = module.cubin
    assert cubin[:4] == ELF_MAGIC, f"{source_name} on sm_{arch}: not an ELF: {cubin[:16]!r}"
    assert _cubin_arch(cubin) == int(arch), (
        f"{source_name}: asked for sm_{arch}, the cubin is for sm_{_cubin_arch(cubin)}"
    )
    missing = [name for name in names if name not in module.mapping]
    assert not missing, f"{source_name} on sm_{arch}: no symbol for {missing}"
    symbols = {module.mapping[name] for name in names}
    assert len(symbols) == len(set(names)), (
        f"{source_name} on sm_{arch}: {len(set(names))} name expressions, {len(symbols)} symbols"
    )
    for name in names:
        symbol = module.mapping[name].encode()
        assert b"\0" + symbol + b"\0" in cubin, (
            f"{source_name} on sm_{arch}: the cubin has no symbol {symbol!r} for {name}"
        )


def test_the_cubin_follows_the_target_arch(
    nvrtc_compile: Callable[[str, list[str], str], Any],
) -> None:
    """Negative control of the architecture check: two targets give two different cubins
    (of the source with the fewest instantiations: the check reads only the header)."""
    source_name = min(SOURCE_NAMES, key=lambda name: len(_cuda.instantiation_names(name)))
    names = _cuda.instantiation_names(source_name)
    source = _cuda.cuda_sources()[source_name]
    archs = {_cubin_arch(nvrtc_compile(source, names, arch).cubin) for arch in TARGET_ARCHS}
    assert archs == {int(arch) for arch in TARGET_ARCHS}


def _broken(source: str) -> str:
    """``source`` without its last closing brace: a syntax error in any C++ source."""
    cut = source.rstrip().rfind("}")
    if cut < 0:
        raise ValueError("the source has no closing brace; update the negative control")
    return source[:cut]


@pytest.mark.parametrize("arch", TARGET_ARCHS)
@pytest.mark.parametrize("source_name", SOURCE_NAMES)
def test_broken_source_fails_through_raw_module(
    nvrtc_compile: Callable[[str, list[str], str], Any],
    compile_exception: type[Exception],
    source_name: str,
    arch: str,
) -> None:
    names = _cuda.instantiation_names(source_name)
    with pytest.raises(compile_exception, match="error"):
        nvrtc_compile(_broken(_cuda.cuda_sources()[source_name]), names, arch)


@pytest.mark.parametrize("source_name", SOURCE_NAMES)
def test_unknown_name_expression_fails_through_raw_module(
    nvrtc_compile: Callable[[str, list[str], str], Any],
    compile_exception: type[Exception],
    source_name: str,
) -> None:
    # One real name beside the unknown one: the same path, one instantiation to generate.
    names = [_cuda.instantiation_names(source_name)[0], "specdec_no_such_kernel<float>"]
    with pytest.raises(compile_exception, match="specdec_no_such_kernel"):
        nvrtc_compile(_cuda.cuda_sources()[source_name], names, TARGET_ARCHS[0])


def test_toolkit_headers_resolve(nvrtc_compile: Callable[[str, list[str], str], Any]) -> None:
    """CuPy's include path reaches the CUDA headers (toolkit or the ``nvidia-cuda-runtime``
    wheel), so a source that includes one compiles; a missing header must fail."""
    kernel = 'extern "C" __global__ void halve(__half* x) { x[threadIdx.x] = __hmul(x[0], x[0]); }'
    module = nvrtc_compile(f"#include <cuda_fp16.h>\n{kernel}\n", ["halve"], TARGET_ARCHS[0])
    assert module.cubin[:4] == ELF_MAGIC
    with pytest.raises(_private("cupy.cuda.compiler", "CompileException"), match="no_such"):
        nvrtc_compile(f"#include <specdec_no_such_header.h>\n{kernel}\n", ["halve"], "90")
