"""Input checks (``docs/semantics.md`` §8): one place for every message.

Every check raises (``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong
shape, value or device) with a message that names the argument, what was expected and
what was found.  None of them uses ``assert``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .contract import FILTER_ORDER_CODES, ROW_SUM_TOLERANCE


def shape_text(shape: tuple[int, ...]) -> str:
    """``(2, 3)`` → ``'[2, 3]'``, the notation of the messages."""
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def check_shapes(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any | None,
    draft_token_ids: Any,
) -> tuple[int, int, int]:
    """Check the four shapes against each other (docs/semantics.md §1) and return ``(B, k, V)``.

    Parameters
    ----------
    target_with_bonus_probs : array [B, k+1, V]
    bonus_token_ids : array [B, 1] or [B]
    draft_probs : array [B, k, V] or None
    draft_token_ids : array [B, k]

    Returns
    -------
    tuple of int
        Batch size ``B``, number of draft tokens ``k`` and vocabulary size ``V``.

    Raises
    ------
    ValueError
        On any rank or size mismatch, ``k < 1`` or ``V < 1``.
    """
    target_shape = tuple(target_with_bonus_probs.shape)
    if len(target_shape) != 3:
        raise ValueError(
            "target_with_bonus_probs must have shape [B, k+1, V] (3 dimensions); "
            f"found shape {shape_text(target_shape)}"
        )
    batch_size, positions, vocab_size = target_shape
    if positions < 2:
        raise ValueError(
            "target_with_bonus_probs must have at least 2 positions (k >= 1 draft tokens plus "
            f"the bonus position); found shape {shape_text(target_shape)}"
        )
    if vocab_size < 1:
        raise ValueError(
            "target_with_bonus_probs must have a vocabulary of at least 1 token; "
            f"found shape {shape_text(target_shape)}"
        )
    k = positions - 1
    draft_shape = tuple(draft_token_ids.shape)
    if draft_shape != (batch_size, k):
        raise ValueError(
            f"draft_token_ids must have shape [B, k] = {shape_text((batch_size, k))} to match "
            f"target_with_bonus_probs {shape_text(target_shape)}; found shape "
            f"{shape_text(draft_shape)}"
        )
    bonus_shape = tuple(bonus_token_ids.shape)
    if bonus_shape not in ((batch_size, 1), (batch_size,)):
        raise ValueError(
            f"bonus_token_ids must have shape [B, 1] = {shape_text((batch_size, 1))}; "
            f"found shape {shape_text(bonus_shape)}"
        )
    if draft_probs is not None:
        probs_shape = tuple(draft_probs.shape)
        if probs_shape != (batch_size, k, vocab_size):
            raise ValueError(
                "draft_probs must have shape [B, k, V] = "
                f"{shape_text((batch_size, k, vocab_size))} to match target_with_bonus_probs "
                f"{shape_text(target_shape)}; found shape {shape_text(probs_shape)}"
            )
    return batch_size, k, vocab_size


def check_output_shapes(
    accepted: Any, substitute_token_ids: Any, draft_token_ids: Any, bonus_token_ids: Any
) -> tuple[int, int]:
    """Shapes of ``_create_output``'s arguments: ``[B, k]`` three times and ``[B, 1]``.

    Returns
    -------
    tuple of int
        ``(B, k)``.
    """
    draft_shape = tuple(draft_token_ids.shape)
    if len(draft_shape) != 2 or draft_shape[1] < 1:
        raise ValueError(
            f"draft_token_ids must have shape [B, k] with k >= 1; found {shape_text(draft_shape)}"
        )
    for name, array in (("accepted", accepted), ("substitute_token_ids", substitute_token_ids)):
        if tuple(array.shape) != draft_shape:
            raise ValueError(
                f"{name} must have the shape of draft_token_ids {shape_text(draft_shape)}; "
                f"found {shape_text(tuple(array.shape))}"
            )
    batch_size = draft_shape[0]
    if tuple(bonus_token_ids.shape) not in ((batch_size, 1), (batch_size,)):
        raise ValueError(
            f"bonus_token_ids must have shape [B, 1] = {shape_text((batch_size, 1))}; "
            f"found shape {shape_text(tuple(bonus_token_ids.shape))}"
        )
    return draft_shape


def check_token_id_range(vocab_size: int, draft_token_ids: Any, bonus_token_ids: Any) -> None:
    """``ValueError`` naming the first (row, position) whose id is outside ``[0, V)``.

    Parameters
    ----------
    vocab_size : int
    draft_token_ids : int [B, k]
    bonus_token_ids : int [B, 1] or [B]
    """
    for name, ids in (("draft_token_ids", draft_token_ids), ("bonus_token_ids", bonus_token_ids)):
        xp = ids.__array_namespace__()
        outside = xp.logical_or(ids < 0, ids >= vocab_size)
        if bool(xp.any(outside)):
            index = first_index(outside, xp)
            raise ValueError(
                f"{name} must lie in [0, {vocab_size}) (the vocabulary of "
                f"target_with_bonus_probs); found {int(ids[index])} at (row, position) = "
                f"{index if len(index) == 2 else (index[0], 0)}"
            )


def check_probability_dtype(name: str, dtype: Any, *, strict: bool) -> None:
    """Check a probability array's dtype.

    Non-strict: float64, float32, float16 or bfloat16 (the last two are upcast by the
    caller); wider floats (longdouble) are refused.
    Strict: exactly float32, the sampler's ``probs_dtype``, as in vLLM's strict mode.
    """
    if strict:
        if dtype != np.float32:
            raise TypeError(f"{name} must have dtype float32 in strict mode; found {dtype}")
        return
    kind = getattr(dtype, "kind", None)
    if kind == "f" and dtype.itemsize > 8:
        raise TypeError(
            f"{name} must have dtype float64 or float32 (floats wider than float64 are not "
            f"narrowed silently; convert them first); found {dtype}"
        )
    if kind != "f" and str(dtype) != "bfloat16":
        raise TypeError(
            f"{name} must have a floating dtype (float32 or float64; float16 and bfloat16 "
            f"are upcast); found {dtype}"
        )


def check_token_id_dtype(name: str, dtype: Any, *, strict: bool) -> None:
    """Check a token-id array's dtype: int64, or int32 outside strict mode."""
    allowed = (np.int64,) if strict else (np.int64, np.int32)
    if dtype not in allowed:
        expected = "int64" if strict else "int64 or int32"
        mode = " in strict mode" if strict else ""
        raise TypeError(f"{name} must have dtype {expected}{mode}; found {dtype}")


def check_same_float_dtype(target_dtype: Any, draft_dtype: Any) -> None:
    """``draft_probs`` must have the target's floating dtype (docs/semantics.md §1)."""
    if target_dtype != draft_dtype:
        raise TypeError(
            f"draft_probs must have the same dtype as target_with_bonus_probs ({target_dtype}); "
            f"found {draft_dtype}"
        )


def check_probability_values(name: str, array: Any, xp: Any) -> None:
    """Strict mode: every probability finite and non-negative (a full pass)."""
    if array is None:
        return
    finite = xp.isfinite(array)
    if not bool(xp.all(finite)):
        index = first_index(xp.logical_not(finite), xp)
        raise ValueError(
            f"{name} must be finite; found {float(array[index])} at index {list(index)}"
        )
    negative = array < 0
    if bool(xp.any(negative)):
        index = first_index(negative, xp)
        raise ValueError(
            f"{name} must be non-negative; found {float(array[index])} at index {list(index)}"
        )


def check_row_sums(name: str, array: Any, xp: Any) -> None:
    """Strict mode for the greedy verifier: each row sums to one within ROW_SUM_TOLERANCE."""
    sums = array.astype(xp.float64).sum(axis=-1)
    bad = xp.abs(sums - 1.0) > ROW_SUM_TOLERANCE
    if bool(xp.any(bad)):
        index = first_index(bad, xp)
        raise ValueError(
            f"{name} rows must sum to 1 (within {ROW_SUM_TOLERANCE}) for greedy verification; "
            f"row {list(index)} sums to {float(sums[index])}"
        )


def first_index(mask: Any, xp: Any) -> tuple[int, ...]:
    """Index tuple of the first true entry of a boolean array (row-major order)."""
    position = int(mask.reshape(-1).astype(xp.int8).argmax())
    index = []
    for size in reversed(tuple(mask.shape)):
        index.append(position % size)
        position //= size
    return tuple(reversed(index))


def check_uniform_dtype(dtype: Any) -> None:
    """Explicit uniforms: float64, or float32 (JAX's default; widened exactly to float64).

    float16 and bfloat16 are refused rather than widened: their steps in ``[0, 1)`` (as
    coarse as ``2**-11`` and ``2**-8``) would move every acceptance test by that much.
    Integers, booleans and complex numbers are not uniforms.
    """
    if dtype == np.float64 or dtype == np.float32:
        return
    if getattr(dtype, "kind", None) == "f" or str(dtype) == "bfloat16":
        advice = "too coarse for uniforms in [0, 1); draw them in float32 or float64"
    else:
        advice = "convert them with .astype(numpy.float64) if they are uniforms in [0, 1)"
    raise TypeError(
        f"uniforms must be a float64 or float32 array (float32 is widened exactly to float64); "
        f"found {dtype}: {advice}"
    )


def check_uniforms(uniforms: np.ndarray, batch_size: int, k: int) -> None:
    """Explicit uniforms: ``[B, k+1]`` in ``[0, 1)`` (cheap, always checked)."""
    if uniforms.shape != (batch_size, k + 1):
        raise ValueError(
            f"uniforms must have shape [B, k+1] = {shape_text((batch_size, k + 1))}; "
            f"found shape {shape_text(uniforms.shape)}"
        )
    if uniforms.size and not bool(((uniforms >= 0.0) & (uniforms < 1.0)).all()):
        bad = (uniforms >= 0.0) & (uniforms < 1.0)
        index = first_index(~bad, np) if isinstance(uniforms, np.ndarray) else None
        found = float(uniforms[index]) if index is not None else "a value outside"
        raise ValueError(f"uniforms must lie in [0, 1); found {found} at index {index}")


def check_posterior(name: str, value: Any) -> float:
    """Typical-acceptance constructor arguments: finite, non-negative real numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; found {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if not np.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be finite and non-negative; found {number}")
    return number


def check_integer(name: str, value: Any, minimum: int = 0) -> int:
    """A count or size: a Python or NumPy integer in ``[minimum, 2**63)``.

    Floats (even ``1.0``), bools and strings are refused rather than converted: ``int()``
    would truncate ``2.7`` to 2 and turn ``"3"`` into 3 without a word.

    Raises
    ------
    TypeError
        For a value that is not an integer, naming the argument and the type found.
    ValueError
        For an integer outside ``[minimum, 2**63)``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; found {type(value).__name__}")
    if not minimum <= int(value) < 2**63:
        raise ValueError(f"{name} must lie in [{minimum}, 2**63); found {int(value)}")
    return int(value)


def check_vocab_size(vocab_size: Any) -> int:
    """``_create_output``'s optional vocabulary size: an int in ``[1, 2**63)``; None gives
    ``2**63 - 1`` (ids then only have to be non-negative)."""
    if vocab_size is None:
        return 2**63 - 1
    return check_integer("vocab_size", vocab_size, minimum=1)


def check_strict_mode(value: Any) -> bool:
    """``strict_mode``: a bool (or a NumPy bool); anything else, arrays included, is a
    TypeError rather than a truth value guessed from it."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"strict_mode must be a bool; found {type(value).__name__}")


def check_seed(seed: Any) -> Any:
    """A sampler seed: None or a non-negative int (what ``numpy.random.default_rng`` takes)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative int or None; found {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int or None; found {int(seed)}")
    return int(seed)


def _per_request(name: str, value: Any, batch_size: int, dtype: Any) -> np.ndarray:
    """A scalar or a ``[B]`` array of one sampling parameter, as a host array."""
    if type(value) is float or (type(value) is int and -(2**63) <= value < 2**63):
        # What the path below makes of a Python number (an int64 then cast), in one step.
        return np.full(batch_size, value, dtype=dtype)
    if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
        value = value.get()  # CuPy: the parameters are O(B) host work
    refuse_array_subclass(value, name)
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real number or a [B] array; found {array.dtype}")
    if array.ndim == 0:
        array = np.full(batch_size, array)
    if array.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or have shape [B] = [{batch_size}]; found shape "
            f"{shape_text(array.shape)}"
        )
    return array.astype(dtype)


def _within(values: np.ndarray, low: float, high: float, low_open: bool) -> bool:
    """Whether every value lies in ``[low, high]`` (``(low, high]`` if ``low_open``); NaN
    fails.  A small batch is tested on Python floats: a NumPy reduction has a fixed cost
    of about a microsecond, far more than a few comparisons."""
    if values.shape[0] <= _PYTHON_CHECK_MAX:
        if low_open:
            return all(low < value <= high for value in values.tolist())
        return all(low <= value <= high for value in values.tolist())
    # A NaN makes the minimum NaN, which fails the comparison.
    smallest = np.minimum.reduce(values)
    return bool(
        (smallest > low if low_open else smallest >= low) and np.maximum.reduce(values) <= high
    )


_PYTHON_CHECK_MAX = 16
_FLOAT64_MAX = float(np.finfo(np.float64).max)


def _whole(values: np.ndarray) -> bool:
    """Whether every value (none NaN) is a whole number or infinite, as ``numpy.floor``
    leaves it; on Python floats for a small batch (:func:`_within`)."""
    if values.shape[0] <= _PYTHON_CHECK_MAX:
        return all(value == int(value) for value in values.tolist() if abs(value) != np.inf)
    return bool((values == np.floor(values)).all())


def _first_bad(name: str, values: np.ndarray, bad: np.ndarray, expected: str) -> None:
    where = np.flatnonzero(bad)
    if where.size:
        request = int(where[0])
        raise ValueError(
            f"{name} must be {expected}; found {values[request]} for request {request}"
        )


def check_sampling_parameters(
    batch_size: int,
    vocab_size: int,
    *,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    from_logits: bool,
    row_dtype: Any = np.float64,
    divides_logits: bool | None = None,
) -> dict[str, np.ndarray | None]:
    """The per-request sampling parameters of the engine layout, checked.

    Parameters
    ----------
    batch_size, vocab_size : int
    temperature, top_k, top_p, min_p : scalar, array [B] or None
        ``temperature >= 0`` (0: greedy); ``top_k >= 0`` (0 or >= V: off);
        ``0 < top_p <= 1`` (1: off); ``0 <= min_p <= 1`` (0: off).  None: off.
    from_logits : bool
        With probabilities only ``temperature`` may be given, and only to say which
        requests are greedy; the filters must be None.
    row_dtype : dtype
        The dtype logits are divided by the temperature in: a positive temperature must be
        a normal, finite number of that dtype (a float32 1e-50 is 0, and 1e300 is inf).
    divides_logits : bool, optional
        Whether some rows are logits divided by the temperature (the draft rows may be
        when the target's are not); ``from_logits`` by default.

    Returns
    -------
    dict
        Host arrays ``temperature`` float64, ``top_k`` int64 (0 where off), ``top_p`` and
        ``min_p`` float64, each ``[B]`` or None when not given.

    Raises
    ------
    TypeError, ValueError
        Naming the argument and the first bad request.
    """
    if not from_logits:
        for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
            if value is not None:
                raise ValueError(
                    f"{name} needs target_logits: probabilities given directly are taken as "
                    "already processed, so a filter would be silently ignored"
                )
    result: dict[str, np.ndarray | None] = {}
    if temperature is None:
        result["temperature"] = None
    else:
        values = _per_request("temperature", temperature, batch_size, np.float64)
        if not _within(values, 0.0, _FLOAT64_MAX, False):
            _first_bad(
                "temperature", values, ~(np.isfinite(values) & (values >= 0)), "finite and >= 0"
            )
        if from_logits if divides_logits is None else divides_logits:
            _check_temperature_in(values, np.dtype(row_dtype))
        result["temperature"] = values
    if top_k is None:
        result["top_k"] = None
    else:
        raw = _per_request("top_k", top_k, batch_size, np.float64)
        if not _within(raw, 0.0, np.inf, False) or not _whole(raw):
            _first_bad("top_k", raw, ~((raw >= 0) & (raw == np.floor(raw))), "an integer >= 0")
        values = np.minimum(raw, vocab_size).astype(np.int64)
        values[values >= vocab_size] = 0
        result["top_k"] = values
    for name, value, low_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if value is None:
            result[name] = None
            continue
        values = _per_request(name, value, batch_size, np.float64)
        if not _within(values, 0.0, 1.0, low_open):
            low_ok = values > 0 if low_open else values >= 0
            expected = "in (0, 1]" if low_open else "in [0, 1]"
            _first_bad(name, values, ~(low_ok & (values <= 1)), expected)
        result[name] = values
    return result


def _check_temperature_in(values: np.ndarray, dtype: np.dtype) -> None:
    """Positive temperatures must survive the cast to the rows' dtype as normal numbers."""
    if values.shape[0] <= _PYTHON_CHECK_MAX:
        # A number between the dtype's smallest normal and its largest casts to a number
        # between them (rounding is monotone): accepted on Python floats; anything else
        # (closer to the limits, or refused) takes the exact test below.
        low, high = _normal_range(dtype)
        if all(value == 0.0 or low <= value <= high for value in values.tolist()):
            return
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):
        cast = values.astype(dtype)
    bad = (values > 0) & ~((cast >= info.tiny) & np.isfinite(cast))
    if not bad.any():
        return  # the message below costs far more than the check: only on failure
    _first_bad(
        "temperature", values, bad,
        f"0 or a normal {dtype} number (in [{info.tiny:.3g}, {info.max:.3g}]: the logits "
        f"are divided by it in {dtype})",
    )


_NORMAL_RANGES: dict[np.dtype, tuple[float, float]] = {}


def _normal_range(dtype: np.dtype) -> tuple[float, float]:
    """The smallest normal and the largest finite number of a float dtype (cached: asking
    ``numpy.finfo`` costs more than the test it serves)."""
    found = _NORMAL_RANGES.get(dtype)
    if found is None:
        info = np.finfo(dtype)
        found = _NORMAL_RANGES[dtype] = (float(info.tiny), float(info.max))
    return found


def refuse_array_subclass(x: Any, name: str) -> None:
    """Masked arrays and matrices are ndarrays whose meaning the kernels would not honour
    (the mask would be ignored, a matrix is always 2-d): refuse them rather than guess.

    Raises
    ------
    TypeError
        Naming the argument and what to pass instead.
    """
    if type(x) is np.ndarray or not isinstance(x, np.ndarray):
        return  # only subclasses are refused (and ``np.ma`` costs a lookup every time)
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(
            f"{name} must be a plain NumPy array, not a masked array (the mask would be "
            "ignored); pass numpy.ma.filled(x, fill_value) or x.data; found MaskedArray"
        )
    if isinstance(x, np.matrix):
        raise TypeError(
            f"{name} must be a plain NumPy array, not a numpy.matrix; pass numpy.asarray(x); "
            "found matrix"
        )


def empty_sequence_as_integers(x: Any) -> Any:
    """``x``, or an empty int64 array when ``x`` is an empty list or tuple.

    NumPy makes ``[]`` a float64 array, so an empty batch given as a list would be refused
    as float counts; an empty sequence holds no value that could be a float.
    """
    if isinstance(x, (list, tuple)) and len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    return x


def host_integers(x: Any, name: str) -> np.ndarray:
    """``x`` as a private 1-D int64 NumPy array, refusing non-integer dtypes, masked arrays
    and matrices, and values outside int64 (the tree layouts' arrays: O(N) host work)."""
    x = empty_sequence_as_integers(x)
    if isinstance(x, (list, tuple)):
        array = np.asarray(x)
    elif isinstance(x, np.ndarray):
        refuse_array_subclass(x, name)
        array = x
    elif hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        array = x.get()  # CuPy
    elif not (hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "__getitem__")):
        raise TypeError(
            f"{name} must be a 1-D integer array or a list of ints; found {type(x).__name__}"
        )
    else:
        # Other array-API arrays (the reference accepts array_api_strict): element by
        # element, since not every namespace offers DLPack on the host.
        kind = str(x.dtype)
        if "int" not in kind:
            raise TypeError(f"{name} must have an integer dtype; found {kind}")
        if len(x.shape) != 1:
            raise ValueError(f"{name} must be 1-D; found {len(x.shape)} dimensions")
        values = [int(x[i]) for i in range(x.shape[0])]
        array = np.asarray(values, dtype=np.uint64 if "uint" in kind else np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype; found {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D; found {array.ndim} dimensions")
    return int64_values(array, name)


def token_id(value: Any, where: str) -> int:
    """A tree builder's token as a Python int: an int or a NumPy integer, nothing that
    merely converts to one (``1.0`` or ``"1"`` is not a token id).

    Raises
    ------
    TypeError
        Naming where the value is.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where} must be an integer token id; found {type(value).__name__}")
    if not -(2**63) <= int(value) < 2**63:
        raise ValueError(f"{where} must fit in int64; found {int(value)}")
    return int(value)


def sequence(value: Any, where: str, holds: str) -> Any:
    """A tree builder's sequence argument (a list, a tuple or a plain array of at least one
    dimension), as given: what is not one would otherwise fail deep inside with NumPy's
    own words.

    Raises
    ------
    TypeError
        Naming where the value is and what it must hold.
    """
    if isinstance(value, np.ndarray):
        refuse_array_subclass(value, where)
        if value.ndim >= 1:
            return value
    elif isinstance(value, (list, tuple)):
        return value
    raise TypeError(f"{where} must be a sequence of {holds}; found {type(value).__name__}")


def int64_values(array: np.ndarray, name: str) -> np.ndarray:
    """An integer host array as a private int64 copy, refusing values above the int64
    range (a uint64 2**64 - 1 would otherwise wrap to -1).

    Raises
    ------
    TypeError
        For a dtype that is not an integer one (bool, float and string dtypes included:
        ``1.0`` is not a token id).
    ValueError
        For a value above ``2**63 - 1``, naming its index and its true value.
    """
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype; found {array.dtype}")
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size:
        too_large = array > np.uint64(np.iinfo(np.int64).max)
        if too_large.any():
            index = first_index(too_large, np)
            raise ValueError(
                f"{name} must fit in int64; found {int(array[index])} at index "
                f"{index[0] if len(index) == 1 else index}"
            )
    return array.astype(np.int64)


#: The orders in which the sampling filters are applied (docs/semantics.md §12).
FILTER_ORDERS = tuple(FILTER_ORDER_CODES)


def check_filter_order(filter_order: Any) -> str:
    """``filter_order`` checked: one of :data:`FILTER_ORDERS`.

    Raises
    ------
    ValueError
        For another value; the message lists the known ones.
    """
    if not isinstance(filter_order, str) or filter_order not in FILTER_ORDERS:
        raise ValueError(
            f"filter_order must be one of {', '.join(repr(o) for o in FILTER_ORDERS)}; "
            f"found {filter_order!r}"
        )
    return filter_order


def check_logit_values(name: str, array: Any, xp: Any) -> None:
    """Strict mode for logits: no NaN and no +inf (``-inf`` masks a token and is allowed)."""
    if array is None:
        return
    bad = xp.isnan(array) | (array == xp.inf)
    if bool(xp.any(bad)):
        index = first_index(bad, xp)
        raise ValueError(
            f"{name} must not be NaN or +inf in strict mode; found {float(array[index])} at "
            f"index {list(index)}"
        )


def check_out_block(
    out: Any,
    block_type: type,
    maker: str,
    shapes: Any,
    is_ours: Any,
    device_of: Any,
    device: Any,
    xp: Any = np,
    inputs: dict[str, Any] | None = None,
) -> None:
    """Check ``out=`` buffers against the shapes a call writes.

    Parameters
    ----------
    out : object
        What the caller passed.
    block_type : type
        The output block the layout expects (``OutputBlock``, ``TreeOutputBlock``).
    maker : str
        The public function that makes such buffers, for the message.
    shapes : callable
        ``shapes(out) -> dict`` of field name to the shape the call needs; called once
        every field is known to be an int64 array (it may raise its own ValueError).
    is_ours : callable
        ``is_ours(array)``: an array of the inputs' backend.
    device_of : callable
        ``device_of(array)``: its device (None on the CPU).
    device : int or None
        The inputs' device.
    xp : module
        ``numpy`` or ``cupy``.
    inputs : dict[str, array or None], optional
        The arrays the kernel reads while it writes the buffers.

    Raises
    ------
    TypeError
        For another type of block, or a field that is not an int64 array of the inputs'
        backend.
    ValueError
        For a field of another shape, not C-contiguous or read-only, on another device, or
        sharing memory with another field or an input (the kernel would read what it
        writes).
    """
    if not isinstance(out, block_type):
        raise TypeError(
            f"out must be the {block_type.__name__} of specdec_np.{maker}; "
            f"found {type(out).__name__}"
        )
    for name, array in zip(out._fields, out):
        if not is_ours(array) or array.dtype != np.int64:
            raise TypeError(f"out.{name} must be an int64 array of the inputs' backend")
    expected = shapes(out)
    for name, array in zip(out._fields, out):
        if tuple(array.shape) != expected[name]:
            raise ValueError(
                f"out.{name} must have shape {list(expected[name])}; found "
                f"{shape_text(array.shape)}"
            )
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"out.{name} must be C-contiguous and writeable")
    if device_of(out[0]) != device:
        raise ValueError("out must be on the inputs' device")
    fields = list(zip(out._fields, out))
    for position, (name, array) in enumerate(fields):
        # The buffers are C-contiguous, so overlapping bounds are overlapping memory.
        for other, other_array in fields[position + 1 :]:
            if xp.may_share_memory(array, other_array):
                raise ValueError(f"out.{name} and out.{other} share memory; give separate buffers")
        for input_name, input_array in (inputs or {}).items():
            if input_array is not None and xp.may_share_memory(array, input_array):
                raise ValueError(f"out.{name} shares memory with {input_name}")


def check_method_parameters(verifier: Any, given: Any) -> tuple[float, ...]:
    """A registry verifier's parameters from keyword arguments, checked, in registry order.

    Parameters
    ----------
    verifier : specdec_np.registry.Verifier
    given : mapping of str to real number

    Raises
    ------
    TypeError
        For an unknown keyword or a parameter that is not a real number.
    ValueError
        For a parameter that is negative or not finite.
    """
    if not given and not verifier.parameters:
        return ()
    unknown = set(given).difference(verifier.parameter_names)
    if unknown:
        expected = ", ".join(verifier.parameter_names) or "none"
        raise TypeError(
            f"{verifier.function_name or verifier.name}() got unexpected keyword argument(s) "
            f"{', '.join(sorted(unknown))}; its parameters are: {expected}"
        )
    return tuple(
        check_posterior(p.name, given.get(p.name, p.default)) for p in verifier.parameters
    )


def check_flag(name: str, value: Any) -> bool:
    """A keyword that must be a bool (``report_bias``, say), not something truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; found {type(value).__name__}")
    return bool(value)


def check_relaxed_parameters(
    method: Any, given: Any, batch_size: int, max_k: int, vocab_size: int
) -> dict[str, Any]:
    """A relaxed method's parameters from keyword arguments, checked by kind, defaults
    filled in (:class:`specdec_np.registry.RelaxedParameter` says the kinds).

    Raises
    ------
    TypeError
        For an unknown keyword, a missing required one, or a value of the wrong type.
    ValueError
        For a value out of its range, naming it.
    """
    unknown = set(given).difference(method.parameter_names)
    if unknown:
        raise TypeError(
            f"method {method.name!r} got unexpected keyword argument(s) "
            f"{', '.join(sorted(unknown))}; its parameters are: "
            f"{', '.join(method.parameter_names)}"
        )
    checked: dict[str, Any] = {}
    for parameter in method.parameters:
        name, kind = parameter.name, parameter.kind
        value = given.get(name, parameter.default)
        if value is None:
            if kind in ("requests", "token"):
                checked[name] = None
                continue
            raise TypeError(f"method {method.name!r} needs the keyword argument {name}")
        if kind == "count":
            checked[name] = check_integer(name, value, 1)
        elif kind == "real":
            checked[name] = check_posterior(name, value)
        elif kind == "fraction":
            number = check_posterior(name, value)
            if number > 1:
                raise ValueError(f"{name} must be in [0, 1]; found {number}")
            checked[name] = number
        elif kind == "choice":
            if not isinstance(value, str) or value not in parameter.choices:
                raise ValueError(
                    f"{name} must be one of {', '.join(map(repr, parameter.choices))}; "
                    f"found {value!r}"
                )
            checked[name] = value
        elif kind == "token":
            checked[name] = check_integer(name, value)
            if checked[name] >= vocab_size:
                raise ValueError(f"{name} must be a token id below V = {vocab_size}; "
                                 f"found {checked[name]}")
        elif kind == "requests":
            flags = np.asarray(value)
            if flags.dtype != np.bool_ or flags.shape != (batch_size,):
                raise ValueError(
                    f"{name} must be a bool array of shape [B] = [{batch_size}]; found "
                    f"{flags.dtype} {shape_text(flags.shape)}"
                )
            checked[name] = flags.copy()
        else:  # "rates"
            checked[name] = _check_rates(name, value, max_k)
    return checked


def _check_rates(name: str, value: Any, max_k: int) -> np.ndarray:
    """Unconditional acceptance rates: a 1-D sequence of reals in ``[0, 1]``, not
    increasing, one per draft position of the batch at least."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of real numbers; found {value!r}")
    try:
        rates = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of real numbers") from None
    if rates.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional; found shape {shape_text(rates.shape)}")
    if rates.size < max_k:
        raise ValueError(
            f"{name} must give a rate for each of the batch's {max_k} draft positions; "
            f"found {rates.size}"
        )
    if not np.all(np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > 1):
        raise ValueError(f"{name} must hold rates in [0, 1]")
    if np.any(np.diff(rates) > 0):
        raise ValueError(f"{name} must not increase from one position to the next")
    return rates
