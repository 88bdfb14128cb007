"""Array intake, device and dtype policy, and the choice of kernels.

* NumPy arrays are used as they are; CuPy arrays too (recognised by their type's module, so
  that ``import specdec_np`` never imports cupy).  Any other object that exports DLPack is
  taken zero-copy with ``numpy.from_dlpack`` (CPU) or ``cupy.from_dlpack`` (CUDA).
* Probabilities: float32 and float64 are kept, float16 and bfloat16 upcast to float32.
  Token ids: int64 and int32 (both id arrays end up with one dtype).  Output: int64.
* Non-contiguous, read-only and broadcast inputs work; they are copied only when they are
  not already C-contiguous.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _core, _validate

__all__ = [
    "array_namespace",
    "check_one_device",
    "cuda_available",
    "cuda_module",
    "device_of",
    "intake",
    "is_cupy_array",
    "first_failed_row",
    "kernels_for",
    "on_inputs_device",
    "probabilities",
    "thread_count",
    "token_ids",
]

_DLPACK_CPU = 1
_DLPACK_CUDA = 2
# Below this many probabilities read per call, starting OpenMP threads costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 20


def is_cupy_array(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing cupy)."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def cuda_module() -> Any:
    """Import and return cupy (only ever called on the GPU path)."""
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise TypeError(
            "the CUDA path needs CuPy, which is not installed; install specdec_np[cuda12] "
            "or specdec_np[cuda13]"
        ) from error
    return cupy


def cuda_available() -> bool:
    """Whether CuPy imports and has a usable CUDA device (never raises)."""
    try:
        import cupy
    except Exception:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def intake(x: Any, name: str) -> Any:
    """Return ``x`` as a NumPy or CuPy array without copying.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or DLPack producer
    name : str
        Argument name for the error messages.

    Raises
    ------
    TypeError
        For anything that is not an array (lists, scalars, strings, None), a torch tensor
        that requires grad, or a DLPack device other than CPU and CUDA.
    """
    if isinstance(x, np.ndarray):
        return x
    if is_cupy_array(x):
        return x
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        if getattr(x, "requires_grad", False):
            raise TypeError(
                f"{name} requires grad; call .detach() before passing it to the verifier"
            )
        device_type = int(x.__dlpack_device__()[0])
        try:
            if device_type == _DLPACK_CPU:
                return np.from_dlpack(x)
            if device_type == _DLPACK_CUDA:
                return cuda_module().from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as error:
            raise TypeError(
                f"{name} could not be taken through DLPack ({error}); bfloat16 tensors must "
                "be converted to float32 by the caller"
            ) from error
        raise TypeError(
            f"{name} is on DLPack device type {device_type}; only CPU (1) and CUDA (2) "
            "arrays are supported"
        )
    raise TypeError(
        f"{name} must be a NumPy array, a CuPy array or an array that exports DLPack; "
        f"found {type(x).__name__}"
    )


def array_namespace(x: Any) -> Any:
    """``numpy`` or ``cupy``: the module that owns an array returned by :func:`intake`."""
    if isinstance(x, np.ndarray):
        return np
    return cuda_module()


def device_of(x: Any) -> int | None:
    """None for a NumPy array, the CUDA device id for a CuPy array."""
    return None if isinstance(x, np.ndarray) else int(x.device.id)


def _device_text(device: Any) -> str:
    return "cpu" if device is None else f"cuda:{device}"


def check_one_device(named: dict[str, Any]) -> int | None:
    """Raise ``ValueError`` unless all the non-None arrays share one device; return it.

    Parameters
    ----------
    named : dict[str, array or None]
        Argument name → array (NumPy or CuPy; None entries are skipped).
    """
    arrays = [array for array in named.values() if array is not None]
    if all(isinstance(array, np.ndarray) for array in arrays):
        return None
    devices = {name: device_of(array) for name, array in named.items() if array is not None}
    if len(set(devices.values())) > 1:
        found = ", ".join(f"{name} on {_device_text(device)}" for name, device in devices.items())
        raise ValueError(f"all inputs must be on one device; found {found}")
    return next(iter(devices.values()), None)


_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def probabilities(x: Any, name: str, xp: Any, strict: bool) -> Any:
    """A probability array in a kernel dtype (float32 or float64), C-contiguous.

    float16 and bfloat16 are upcast to float32; strict mode accepts float32 only.
    """
    if x.dtype not in _KERNEL_FLOATS or strict:
        _validate.check_probability_dtype(name, x.dtype, strict=strict)
        if x.dtype not in _KERNEL_FLOATS:
            # float16 and bfloat16 (the only other dtypes the check lets through).
            x = x.astype(np.float32)
    return xp.ascontiguousarray(x)


def token_ids(named: dict[str, Any], xp: Any, strict: bool) -> list[Any]:
    """Private, C-contiguous copies of token-id arrays, all of one dtype.

    The copy is what makes the ids read once: a caller's thread that writes its own array
    during the call cannot change what the kernels check and then index with.  Copying
    ``O(B * k)`` ids costs nothing next to the rows the kernels read.

    Parameters
    ----------
    named : dict[str, array]
        Argument name -> id array (int64, or int32 outside strict mode).
    xp : module
    strict : bool

    Returns
    -------
    list of arrays
        In the order of ``named``; int64 unless every array is int32.
    """
    for name, ids in named.items():
        _validate.check_token_id_dtype(name, ids.dtype, strict=strict)
    dtypes = {ids.dtype for ids in named.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int64)
    return [xp.array(ids, dtype=dtype, order="C", copy=True) for ids in named.values()]


def thread_count(batch_size: int, elements_per_row: int) -> int:
    """OpenMP threads for a kernel call over ``batch_size`` rows.

    Parameters
    ----------
    batch_size : int
    elements_per_row : int
        Probabilities the kernel may read per row (``2 V`` for rejection sampling, ``k V``
        for the deterministic verifiers).  Threads pay off only when the call reads several
        megabytes; below that, waking them costs more than the split saves, and far more
        on a loaded machine.
    """
    if batch_size < 2 or batch_size * elements_per_row < PARALLEL_MIN_ELEMENTS:
        return 1
    return max(1, min(batch_size, _core.openmp_max_threads()))


def kernels_for(device: int | None) -> Any:
    """The kernels for a device, with the signatures of ``_core.pyi``: ``_core`` (NumPy,
    CPU) or ``_cuda.core_like`` (CuPy; its kernels return None, see :func:`first_failed_row`).
    """
    if device is None:
        return _core
    from . import _cuda

    return _cuda.core_like


def on_inputs_device(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``function`` with the CUDA device of its first argument current (CuPy arrays and
    CUDA DLPack producers), so that copies, buffers and uniforms are made on the inputs'
    device and not on whichever device happened to be current.  NumPy inputs pass straight
    through."""

    @functools.wraps(function)
    def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(first, np.ndarray):
            return function(first, *args, **kwargs)
        if is_cupy_array(first):
            device = int(first.device.id)
        else:
            try:
                device_type, device = first.__dlpack_device__()
            except Exception:  # not an array: the function's own checks will say so
                return function(first, *args, **kwargs)
            if int(device_type) != _DLPACK_CUDA:
                return function(first, *args, **kwargs)
        with cuda_module().cuda.Device(int(device)):
            return function(first, *args, **kwargs)

    return wrapper


def first_failed_row(reported: int | None, row_status: Any) -> int:
    """The first row whose kernel status is not 0, or -1.

    The CPU kernels report it (``reported``); the CUDA kernels leave it in ``row_status`` on
    the device, and reading it here is the GPU path's one host synchronisation per call,
    the documented point where an input error found on the device (an out-of-range token
    id, a target row without mass) becomes an exception.
    """
    if reported is not None:
        return int(reported)
    if row_status.size == 0:
        return -1
    failed = row_status != 0
    first = int(failed.argmax())
    return first if bool(failed[first]) else -1
