"""A stand-in for CuPy on a machine without a GPU, to run ``tests/kernels/test_gpu.py`` on the
CPU.

Arrays are NumPy arrays behind a CuPy-like type (``type(x).__module__`` is ``cupy``, so the
library takes its GPU path; like CuPy it refuses implicit conversion to NumPy); functions are
NumPy's, with CuPy arrays unwrapped and results wrapped; ``RawModule`` kernels are the CUDA
sources of ``specdec_np._kernels.cuda`` compiled by the host-compiler emulation of
``tests/kernels/test_cuda_sources.py`` (every CUDA thread a fiber, one device).  Not a test module:
``tests/kernels/test_cuda_sources.py::test_gpu_tests_pass_on_a_fake_cupy`` puts its folder
first on ``PYTHONPATH`` and runs ``tests/kernels/test_gpu.py``; by hand::

    PYTHONPATH=tests/kernels/fake_cupy pytest tests/kernels/test_gpu.py -k "not chi_square"

``SPECDEC_FAKE_CUPY_MUTATION=<name>`` builds one of that file's mutated kernels instead.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import sys
import tempfile
import threading
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__version__ = "0.0-fake"
_current_device = [0]


def _unwrap(value: Any) -> Any:
    if isinstance(value, ndarray):
        return value._array
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _wrap(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ndarray(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class _Flags:
    def __init__(self, array: np.ndarray) -> None:
        self.c_contiguous = array.flags.c_contiguous
        self.f_contiguous = array.flags.f_contiguous
        self.writeable = True


class ndarray(NDArrayOperatorsMixin):  # noqa: N801 (CuPy's name)
    """A device array: a NumPy array on fake device ``device.id``."""

    __array_priority__ = 100

    def __init__(self, array: np.ndarray, device: int | None = None) -> None:
        self._array = array
        self._device = _current_device[0] if device is None else device

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _wrap(getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs)))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly."
        )

    def __array_namespace__(self, api_version: Any = None) -> Any:
        return sys.modules[__name__]

    @property
    def device(self) -> Device:
        return Device(self._device)

    @property
    def flags(self) -> _Flags:
        return _Flags(self._array)

    @property
    def data(self) -> Any:
        class _Pointer:
            ptr = self._array.ctypes.data

        return _Pointer()

    def get(self) -> np.ndarray:
        return self._array.copy()

    def __getitem__(self, index: Any) -> Any:
        return _wrap(self._array[_unwrap(index)])

    def __setitem__(self, index: Any, value: Any) -> None:
        self._array[_unwrap(index)] = _unwrap(value)

    def __len__(self) -> int:
        return len(self._array)

    def __iter__(self) -> Any:
        return (_wrap(row) for row in self._array)

    def __bool__(self) -> bool:
        return bool(self._array)

    def __int__(self) -> int:
        return int(self._array)

    def __float__(self) -> float:
        return float(self._array)

    def __index__(self) -> int:
        return self._array.__index__()

    def __repr__(self) -> str:
        return f"fake cupy {self._array!r}"

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._array, name)
        if callable(attribute):
            return lambda *args, **kwargs: _wrap(attribute(*_unwrap(args), **_unwrap(kwargs)))
        return _wrap(attribute)


def asnumpy(array: Any) -> np.ndarray:
    return array._array.copy() if isinstance(array, ndarray) else np.asarray(array)


def asarray(value: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if isinstance(value, ndarray) and value._device != _current_device[0]:
        return ndarray(np.array(value._array, dtype=dtype, order=order or "K"))
    return ndarray(np.asarray(_unwrap(value), dtype=dtype, order=order))


def array(
    value: Any, dtype: Any = None, copy: bool = True, order: Any = "K", **kw: Any
) -> ndarray:
    return ndarray(np.array(_unwrap(value), dtype=dtype, copy=copy, order=order))


def ascontiguousarray(value: Any, dtype: Any = None) -> ndarray:
    return ndarray(np.ascontiguousarray(_unwrap(value), dtype=dtype))


def from_dlpack(value: Any) -> ndarray:
    return ndarray(np.from_dlpack(value))


def is_available() -> bool:
    return True


def __getattr__(name: str) -> Any:
    attribute = getattr(np, name)
    if isinstance(attribute, type) or not callable(attribute):
        return attribute

    def function(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device", None)  # one device: where the array lives is the current one
        return _wrap(attribute(*_unwrap(args), **_unwrap(kwargs)))

    function.__name__ = name
    return function


# --------------------------------------------------------------------------------------------
# cupy.cuda
# --------------------------------------------------------------------------------------------


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = _current_device[0] if device is None else int(device)
        self._saved: list[int] = []

    def __enter__(self) -> Device:
        if self.id != 0:
            raise RuntimeError(f"the fake CuPy has one device; cuda:{self.id} was asked for")
        self._saved.append(_current_device[0])
        _current_device[0] = self.id
        return self

    def __exit__(self, *exc: object) -> bool:
        _current_device[0] = self._saved.pop()
        return False

    def synchronize(self) -> None:
        pass


class _Runtime:
    @staticmethod
    def getDevice() -> int:  # noqa: N802 (CuPy's names)
        return _current_device[0]

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802
        return 1

    @staticmethod
    def runtimeGetVersion() -> int:  # noqa: N802
        return 13000

    @staticmethod
    def driverGetVersion() -> int:  # noqa: N802
        return 13000


class _CudaModule:
    Device = Device
    runtime = _Runtime


cuda = _CudaModule()


# --------------------------------------------------------------------------------------------
# cupy.random
# --------------------------------------------------------------------------------------------


class Generator:
    def __init__(self, seed: Any = None) -> None:
        self._generator = np.random.default_rng(seed)

    def random(self, size: Any = None, dtype: Any = np.float64) -> ndarray:
        return ndarray(np.asarray(self._generator.random(size, dtype=dtype)))


Generator.__module__ = "cupy.random._generator"


class _RandomModule:
    Generator = Generator

    @staticmethod
    def default_rng(seed: Any = None) -> Generator:
        return Generator(seed)


random = _RandomModule()


# --------------------------------------------------------------------------------------------
# RawModule: the emulated kernels
# --------------------------------------------------------------------------------------------

_LIBRARY: list[Any] = []  # the emulated kernels' library and the symbol of a name expression
#: ``(name expression, grid, block)`` of every launch, and ``(code, options, name
#: expressions)`` of every module compiled, for tests of the launchers.
launches: list[tuple[str, Any, Any]] = []
# The emulation runs one launch at a time (its fibers and blocks are process-wide state):
# ranks that are threads of one process (specdec_np.sharded.run_local) take turns.
_LAUNCH_LOCK = threading.Lock()
compiled: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []


def _emulation() -> Any:
    if not _LIBRARY:
        # tests/kernels (the emulation's test module) and tests/ (the helpers it imports).
        kernels = pathlib.Path(__file__).resolve().parents[2]
        sys.path[:0] = [str(kernels), str(kernels.parent)]
        import test_cuda_sources

        from specdec_np._kernels import cuda as _cuda

        sources = _cuda.cuda_sources()
        mutation = os.environ.get("SPECDEC_FAKE_CUPY_MUTATION")
        if mutation in test_cuda_sources._TREE_MUTATIONS:  # a negative control of the trees
            mutate = test_cuda_sources._TREE_MUTATIONS[mutation]
            sources["tree_driver"] = mutate(sources["tree_driver"])
        elif mutation:  # a negative control: one of the emulation test's mutated kernels
            mutate = test_cuda_sources._MUTATIONS[mutation]
            sources["chain_driver"] = mutate(sources["chain_driver"])
        folder = pathlib.Path(tempfile.mkdtemp(prefix="fake-cupy-"))
        _LIBRARY.append(test_cuda_sources._build_emulation(folder, "fake_cupy", sources))
        _LIBRARY.append(test_cuda_sources._symbol)
    return _LIBRARY


class _Kernel:
    def __init__(self, name: str) -> None:
        library, symbol = _emulation()
        self._name = name
        self._function = getattr(library, symbol(name))

    def __call__(self, grid: Any, block: Any, args: Any) -> None:
        launches.append((self._name, tuple(grid), tuple(block)))
        converted = []
        for arg in args:
            if arg is None:
                converted.append(None)
            elif isinstance(arg, ndarray):
                if arg._device != _current_device[0]:
                    raise ValueError("a kernel argument lives on another device")
                if not arg._array.flags.c_contiguous:
                    raise ValueError("a kernel argument is not C-contiguous")
                converted.append(ctypes.c_void_p(arg._array.ctypes.data))
            elif isinstance(arg, np.int64):
                converted.append(ctypes.c_longlong(int(arg)))
            elif isinstance(arg, np.float64):
                converted.append(ctypes.c_double(float(arg)))
            else:
                raise TypeError(f"kernel argument of type {type(arg).__name__}")
        with _LAUNCH_LOCK:
            self._function(*converted)


class RawModule:
    def __init__(self, code: str, options: Any = (), name_expressions: Any = ()) -> None:
        self._names = list(name_expressions)
        compiled.append((code, tuple(options), tuple(self._names)))

    def get_function(self, name: str) -> _Kernel:
        if name not in self._names:
            raise KeyError(f"{name} was not among the name expressions")
        return _Kernel(name)
