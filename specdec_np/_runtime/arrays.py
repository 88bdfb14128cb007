"""Array intake, device and dtype policy.

* NumPy arrays are used as they are; CuPy arrays too (recognised by their type's module, so
  that ``import specdec_np`` never imports cupy).  Any other object that exports DLPack is
  taken zero-copy with ``numpy.from_dlpack`` (CPU) or ``cupy.from_dlpack`` (CUDA).
* Probabilities: float32 and float64 are kept, float16 and bfloat16 upcast to float32.
  Token ids: int64 and int32 (both id arrays end up with one dtype).  Output: int64.
* Non-contiguous, read-only and broadcast inputs work; they are copied only when they are
  not already C-contiguous.

Which kernels run a checked batch is :mod:`specdec_np._kernels.dispatch`'s choice.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from .. import _core
from . import checks as _validate

__all__ = [
    "array_namespace",
    "available_cores",
    "check_one_device",
    "cuda_available",
    "cuda_module",
    "device_context",
    "device_of",
    "array_front",
    "in_inputs_library",
    "inputs_library",
    "intake",
    "is_array_of",
    "is_cupy_array",
    "first_failed_row",
    "on_inputs_device",
    "kernel_rows",
    "probabilities",
    "ROW_THREADS_VARIABLE",
    "row_thread_count",
    "row_threads_setting",
    "thread_block",
    "thread_count",
    "token_ids",
]

_DLPACK_CPU = 1
_DLPACK_CUDA = 2
# Below this many probabilities read per call, starting OpenMP threads costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 20
# Below this vocabulary, a logits row's passes are too short to split between threads.
ROW_THREADS_MIN_VOCAB = 1 << 15


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


def intake(x: Any, name: str, like: Any = None) -> Any:
    """Return ``x`` as a NumPy or CuPy array, without copying unless its byte order is not
    the machine's (then a native copy of the same dtype).

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray, DLPack producer, or array_like
        Lists, tuples and Python or NumPy scalars are taken as NumPy would take them
        (``numpy.asarray``), on the backend of ``like``.
    name : str
        Argument name for the error messages.
    like : array, optional
        An array already taken in (the call's target rows): an array_like becomes a CuPy
        array on the current device when ``like`` is one.

    Raises
    ------
    TypeError
        For what is not an array nor array_like (strings, None, dicts, sets), a nested
        sequence that does not form an array of numbers, a masked array or a
        ``numpy.matrix`` (their mask and their 2-d semantics would be ignored), a torch
        tensor that requires grad, a DLPack device other than CPU and CUDA, and a producer
        whose ``__dlpack__`` or ``__dlpack_device__`` does not follow the protocol.

    Notes
    -----
    A torch or JAX bfloat16 array is converted to float32 in its own library, on its own
    device, before the DLPack hand-over (one copy): neither NumPy nor CuPy takes bfloat16
    through DLPack, and the kernels read float32 anyway.  Torch and JAX float16 arrays cross
    DLPack as they are and are read as float32 by :func:`probabilities`, as NumPy float16
    and ``ml_dtypes`` bfloat16 arrays are.
    """
    if isinstance(x, np.ndarray):
        if type(x) is not np.ndarray:
            _validate.refuse_array_subclass(x, name)
        if not x.dtype.isnative:
            # The kernels read native numbers; the same dtype in native order keeps every
            # value (a byte-swapped float64 must not become float32).
            return x.astype(x.dtype.newbyteorder("="))
        return x
    if is_cupy_array(x):
        return x
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        if getattr(x, "requires_grad", False):
            raise TypeError(
                f"{name} requires grad; call .detach() before passing it to the verifier"
            )
        x = _bfloat16_as_float32(x)
        device_type = _dlpack_device_type(x, name)
        try:
            if device_type == _DLPACK_CPU:
                return np.from_dlpack(x)
            if device_type == _DLPACK_CUDA:
                return cuda_module().from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as error:
            _raise_unless_capsule(x, name, device_type)
            raise TypeError(f"{name} could not be taken through DLPack ({error})") from error
        raise TypeError(
            f"{name} is on DLPack device type {device_type}; only CPU (1) and CUDA (2) "
            "arrays are supported"
        )
    if isinstance(x, _ARRAY_LIKE):
        return _from_array_like(x, name, like)
    raise TypeError(
        f"{name} must be an array (NumPy, CuPy, or one that exports DLPack) or array_like "
        f"(a list, tuple or number); found {type(x).__name__}"
    )


def _bfloat16_as_float32(x: Any) -> Any:
    """A torch or JAX bfloat16 array as float32 in its own library and on its own device
    (one copy), any other producer as it is; asked without importing torch or jax."""
    root = type(x).__module__.split(".", 1)[0]
    dtype = str(getattr(x, "dtype", ""))
    if root == "torch" and dtype == "torch.bfloat16":
        return x.float()
    if root in ("jax", "jaxlib") and dtype == "bfloat16":
        return x.astype(np.float32)
    return x


def intake_if_read(x: Any, name: str, read: bool, like: Any = None) -> Any:
    """:func:`intake` of an argument the call reads only when ``read`` (draft rows that a
    deterministic verifier ignores), else None; an ignored masked array or matrix is still
    refused, so that what a call accepts does not depend on the method."""
    if x is None:
        return None
    if read:
        return intake(x, name, like=like)
    if isinstance(x, np.ndarray) and type(x) is not np.ndarray:
        _validate.refuse_array_subclass(x, name)
    return None


_ARRAY_LIKE = (list, tuple, int, float, np.generic)


def _from_array_like(x: Any, name: str, like: Any) -> Any:
    """A list, tuple or number as NumPy takes it, refusing what is not an array of
    numbers (strings, ragged nesting, objects)."""
    try:
        array = np.asarray(x)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{name} must form an array of numbers; {error}") from None
    if array.dtype.kind not in "biuf" and not (array.size == 0 and array.ndim == 1):
        raise TypeError(f"{name} must form an array of numbers; found dtype {array.dtype}")
    if like is not None and is_cupy_array(like):
        return cuda_module().asarray(array)
    return array


def _dlpack_device_type(x: Any, name: str) -> int:
    """The device type of a DLPack producer, checked: the protocol says a pair of ints."""
    try:
        device = x.__dlpack_device__()
    except Exception as error:
        raise TypeError(f"{name}.__dlpack_device__() failed: {error!r}") from error
    if (
        not isinstance(device, (tuple, list))
        or len(device) != 2
        or not all(isinstance(part, (int, np.integer)) for part in device)
    ):
        raise TypeError(
            f"{name}.__dlpack_device__() must return a (device_type, device_id) pair of ints; "
            f"found {device!r}"
        )
    return int(device[0])


def _raise_unless_capsule(x: Any, name: str, device_type: int) -> None:
    """After a failed import: if ``__dlpack__`` did not even return a capsule, say that."""
    try:
        capsule = x.__dlpack__()
    except Exception:
        return
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError(
            f"{name}.__dlpack__() must return a DLPack capsule (PyCapsule); found "
            f"{type(capsule).__name__}"
        )


def is_array_of(x: Any, xp: Any) -> bool:
    """Whether ``x`` is an array of the backend ``xp`` (``numpy`` or ``cupy``)."""
    # Exactly an ndarray: a masked array or a matrix would be written without its meaning.
    return type(x) is np.ndarray if xp is np else is_cupy_array(x)


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
    for array in named.values():
        if array is not None and not isinstance(array, np.ndarray):
            break
    else:
        return None  # every array is on the host
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


def kernel_rows(
    target: Any, drafts: Any, target_name: str, draft_name: str, xp: Any, strict: bool
) -> tuple[Any, Any]:
    """Target and draft rows (None: point-mass drafts) as the kernels read them: C-contiguous
    float32 or float64 of one dtype (:func:`probabilities`).

    Raises
    ------
    TypeError
        If the draft rows' dtype is not the target's.
    """
    target = probabilities(target, target_name, xp, strict)
    if drafts is not None:
        drafts = probabilities(drafts, draft_name, xp, strict)
        if drafts.dtype != target.dtype:
            raise TypeError(
                f"{draft_name} must have the same dtype as {target_name} ({target.dtype}); "
                f"found {drafts.dtype}"
            )
    return target, drafts


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
    # An empty id array has no id to misread: any dtype will do (``np.array([])`` is
    # float64), and it takes the dtype of the others.
    named = {
        name: ids if ids.size else ids.astype(np.int64) for name, ids in named.items()
    }
    for name, ids in named.items():
        _validate.check_token_id_dtype(name, ids.dtype, strict=strict)
    dtypes = {ids.dtype for ids in named.values() if ids.size} or {
        ids.dtype for ids in named.values()
    }
    dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int64)
    return [xp.array(ids, dtype=dtype, order="C", copy=True) for ids in named.values()]


_THREAD_BLOCKS = threading.local()


def thread_block(slot: str, rows: int, width: int, dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous ``[rows, width]`` host block, kept per Python thread
    under ``slot`` and grown when a call needs more.

    A working block of megabytes made afresh is mapped anew by the allocator, and its pages
    zeroed by the operating system at their first write, on every call; one buffer per
    thread and slot (never shared by two concurrent calls) serves every call of that thread.
    The caller writes every entry it reads.

    Parameters
    ----------
    slot : str
        The buffer's name; a call that holds two blocks at once names two slots.
    rows, width : int
    dtype : numpy dtype

    Returns
    -------
    numpy.ndarray
        ``[rows, width]`` of ``dtype``, a view of the thread's buffer.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np._runtime.arrays import thread_block
    >>> thread_block("example", 2, 3, np.float32).shape
    (2, 3)
    """
    size = rows * width * np.dtype(dtype).itemsize
    buffer = getattr(_THREAD_BLOCKS, slot, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, dtype=np.uint8)
        setattr(_THREAD_BLOCKS, slot, buffer)
    return buffer[:size].view(dtype).reshape(rows, width)


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
    # OMP_NUM_THREADS is not trusted: libgomp keeps per-thread data of a team on the
    # caller's stack, so a team far larger than the machine crashes the process.
    return max(1, min(batch_size, _core.openmp_max_threads(), available_cores()))


#: The environment variable that turns threads inside a row on: an int (at most that many
#: threads for one row) or ``auto`` (every core the loop over requests leaves idle).
ROW_THREADS_VARIABLE = "SPECDEC_ROW_THREADS"


def row_thread_count(threads: int, vocab_size: int) -> int:
    """OpenMP threads for the passes over one logits row (its maximum and its exponentials,
    the kernels' ``row_threads``): 1 unless :data:`ROW_THREADS_VARIABLE` asks for more.

    Parameters
    ----------
    threads : int
        The threads of the call's loop over requests (:func:`thread_count`).
    vocab_size : int
        ``V``, the length of a row.

    Returns
    -------
    int
        1 by default.  With ``SPECDEC_ROW_THREADS`` set to ``n`` (or ``auto``), a call
        whose loop over requests runs on one thread (``threads == 1``: one request, or a
        call too small to split between requests) on rows of at least
        ``ROW_THREADS_MIN_VOCAB`` entries splits each row between up to ``n`` threads (all
        the cores with ``auto``), capped as :func:`thread_count` caps a team.

    Raises
    ------
    ValueError
        For a ``SPECDEC_ROW_THREADS`` that is neither a positive int nor ``auto``.

    Notes
    -----
    Off by default because a row split between threads hands work between them several
    times per row: on a machine whose cores are busy, a descheduled thread stalls every
    hand-off, and the call runs 10 to 100 times slower than on one thread.  On idle
    cores a long row (``B = 1``, ``V`` = 128256) runs up to about twice as fast on two.
    A row split between threads gives the bits of one thread (``logits_law.h``: the
    maximum is a selection, and the weights are summed in the one-thread order), so the
    count changes the time of a call, never its result.
    """
    if threads != 1 or vocab_size < ROW_THREADS_MIN_VOCAB:
        return 1
    wanted = _row_threads_wanted(os.environ.get(ROW_THREADS_VARIABLE, ""))
    if wanted <= 1:
        return 1
    return max(1, min(wanted, _core.openmp_max_threads(), available_cores()))


# os.environ's own mapping of encoded names to encoded values (CPython's), which
# os.environ.get reaches only after encoding the name and before decoding the value: about
# 0.7 us a call, a tenth of a short call's whole cost.  Where it is missing, the public get.
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENVIRON_ENCODE = getattr(os.environ, "encodekey", None)
_ROW_THREADS_KEY = _ENVIRON_ENCODE(ROW_THREADS_VARIABLE) if callable(_ENVIRON_ENCODE) else None


def row_threads_setting() -> Any:
    """The raw value of :data:`ROW_THREADS_VARIABLE` (encoded as the OS holds it; None when
    unset), read cheaply for a key that must change when the setting does.

    Returns
    -------
    bytes, str or None
        The same type on every call of a process; equal values for equal settings.

    Examples
    --------
    >>> import os
    >>> from specdec_np._runtime.arrays import row_threads_setting
    >>> before = row_threads_setting()
    >>> os.environ["SPECDEC_ROW_THREADS"] = "2"
    >>> row_threads_setting() != before
    True
    >>> del os.environ["SPECDEC_ROW_THREADS"]
    >>> row_threads_setting() == before
    True
    """
    if type(_ENVIRON_DATA) is dict and _ROW_THREADS_KEY is not None:
        return _ENVIRON_DATA.get(_ROW_THREADS_KEY)
    return os.environ.get(ROW_THREADS_VARIABLE)


@functools.lru_cache(maxsize=8)
def _row_threads_wanted(setting: str) -> int:
    """The most threads ``SPECDEC_ROW_THREADS`` asks for one row (1 when unset)."""
    text = setting.strip().lower()
    if text in ("", "0", "1"):
        return 1
    if text == "auto":
        return sys.maxsize
    if text.isdigit():
        return int(text)
    raise ValueError(
        f"{ROW_THREADS_VARIABLE} must be a positive int or 'auto'; found {setting!r}"
    )


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:  # pragma: no cover - depends on the OS
            pass
    return max(1, os.cpu_count() or 1)


def device_context(first: Any) -> Any:
    """A context that makes the CUDA device of ``first`` current (CuPy arrays and CUDA
    DLPack producers), so that copies, buffers and uniforms are made on the inputs' device
    and not on whichever device happened to be current; a null context otherwise (NumPy
    inputs, or anything that is not an array: the checks will say so)."""
    if isinstance(first, np.ndarray):
        return contextlib.nullcontext()
    if is_cupy_array(first):
        device = int(first.device.id)
    else:
        try:
            device_type, device = first.__dlpack_device__()
            device_type, device = int(device_type), int(device)
        except Exception:  # not an array: the function's own checks will say so
            return contextlib.nullcontext()
        if device_type != _DLPACK_CUDA:
            return contextlib.nullcontext()
    return cuda_module().cuda.Device(int(device))


# A decorated function keeps its own type.
_Function = TypeVar("_Function", bound=Callable[..., Any])


def on_inputs_device(function: _Function) -> _Function:
    """Run ``function`` in the :func:`device_context` of its first argument, and return its
    arrays in the array library of its inputs (:func:`in_inputs_library`); its signature
    stays visible to static tools."""
    return array_front()(function)


def array_front(
    device_from: tuple[str, ...] = (),
    method: bool = False,
    library_from: tuple[str, ...] = (),
    lane: Callable[[dict[str, Any]], Any] | None = None,
) -> Callable[[_Function], _Function]:
    """Decorate a public front so that it runs on its inputs' device and answers in their
    array library.

    Parameters
    ----------
    device_from : tuple of str
        Keyword arguments whose array (the first given) picks the CUDA device; the first
        positional argument when empty.
    method : bool
        The front is a method: its first positional argument is ``self``.
    library_from : tuple of str
        The keyword arguments whose arrays decide the results' library, besides the
        positional ones: the rows and ids, not the uniforms, seeds or ``out=`` buffers.
    lane : callable, optional
        Asked first with a call made of keywords alone (its dict of them): its answer,
        unless None, is the call's, and the front is not entered (a NumPy call that a
        kept launch serves, :func:`specdec_np._layouts.fast_path.sample_lane`).  It must
        answer None for any call it does not serve exactly as the front would.
    """

    def decorate(function: _Function) -> _Function:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if lane is not None and not args:
                answer = lane(kwargs)
                if answer is not None:
                    return answer
            arrays = args[1:] if method else args
            # The common call (NumPy arrays, array_likes, None and plain settings throughout)
            # runs on the host and answers in NumPy: one type test per argument decides it.
            for x in kwargs.values():
                if type(x) not in _PLAIN_TYPES:
                    break
            else:
                for x in arrays:
                    if type(x) not in _PLAIN_TYPES:
                        break
                else:
                    return function(*args, **kwargs)
            for x in arrays:
                if type(x) not in _HOST_TYPES:
                    break
            else:
                for name in library_from:
                    if type(kwargs.get(name)) not in _HOST_TYPES:
                        break
                else:
                    for name in device_from:
                        if type(kwargs.get(name)) not in _HOST_TYPES:
                            break
                    else:
                        return function(*args, **kwargs)
            if device_from:
                first = next((kwargs[n] for n in device_from if kwargs.get(n) is not None), None)
            else:
                first = arrays[0] if arrays else None
            convert = inputs_library(*arrays, *(kwargs.get(name) for name in library_from))
            if isinstance(first, np.ndarray) or first is None:
                result = function(*args, **kwargs)
            else:
                with device_context(first):
                    result = function(*args, **kwargs)
            return result if convert is None else in_inputs_library(result, convert)

        return cast(_Function, wrapper)

    return decorate


# Inputs that run on the host and answer in NumPy, by exact type (what
# :func:`inputs_library` skips and :func:`device_context` gives a null context for).
_HOST_TYPES = frozenset({np.ndarray, type(None), list, tuple, int, float, dict})
# The host types and the settings that are no array of any library (strings, bools, NumPy
# generators): a call whose every argument has one of these types answers as the rule
# below would (no conversion, no device), so the wrapper need not look at which argument
# is which.
_PLAIN_TYPES = _HOST_TYPES | {str, bool, np.random.Generator}


def inputs_library(*inputs: Any) -> Callable[[Any], Any] | None:
    """The ``from_dlpack`` of the array library of the first input that is neither NumPy,
    CuPy nor array_like (torch, JAX, ...), or None: results then stay NumPy or CuPy.

    The rule, stated once for every public function (``docs/semantics.md`` §1): NumPy
    arrays and array_like inputs give NumPy arrays, CuPy arrays give CuPy arrays, and
    arrays of another library that exports DLPack give that library's arrays (through its
    own ``from_dlpack``), on the inputs' device.
    """
    for x in inputs:
        if x is None or isinstance(x, (np.ndarray, *_ARRAY_LIKE, dict)) or is_cupy_array(x):
            continue
        if not hasattr(x, "__dlpack__"):
            continue
        root = type(x).__module__.split(".", 1)[0]
        module = sys.modules.get("jax" if root in ("jax", "jaxlib") else root)
        for owner in (module, getattr(module, "numpy", None)):
            convert = getattr(owner, "from_dlpack", None)
            if callable(convert):
                return convert
        return None
    return None


def in_inputs_library(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` (an array, or a named tuple of arrays and numbers) with each NumPy or
    CuPy array converted by ``convert``."""
    if isinstance(value, np.ndarray) or is_cupy_array(value):
        return convert(value)
    if isinstance(value, tuple) and hasattr(value, "_replace"):
        return value._replace(
            **{
                name: convert(field)
                for name, field in value._asdict().items()
                if isinstance(field, np.ndarray) or is_cupy_array(field)
            }
        )
    return value


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
