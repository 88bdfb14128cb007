"""Counter-based uniforms: Philox4x32-10 written once against the Python array API.

This module backs the counter-based seeding mode (``docs/semantics.md`` §5.1): a row that carries
an integer seed and an absolute position gets uniforms that are a pure function of
``(seed, position, draw index)``.  The code uses only array API standard functions and
operators, so NumPy, CuPy and ``array_api_strict`` produce bit-identical results.

The cipher
----------
Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2,
3", SC'11; the Random123 library).  State is four 32-bit words ``(c0, c1, c2, c3)`` and a
two-word key ``(k0, k1)``.  One round is::

    p0 = 0xD2511F53 * c0            (exact 64-bit product)
    p1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) <- (hi(p1) ^ c1 ^ k0, lo(p1), hi(p0) ^ c3 ^ k1, lo(p0))

where ``hi``/``lo`` are the upper/lower 32 bits.  Ten rounds are applied; between two
consecutive rounds the key is bumped by the Weyl increments
``k0 <- (k0 + 0x9E3779B9) mod 2**32`` and ``k1 <- (k1 + 0xBB67AE85) mod 2**32``
(nine bumps in all; the first round uses the key as given).  This matches the published
Random123 known-answer vectors (``philox4x32 10`` rows of ``tests/kat_vectors``).

The uniforms (normative; other engines must reproduce this bit for bit)
-----------------------------------------------------------------------
For a row with integer ``seed`` and ``position`` (both in ``[0, 2**64)``), the draw with
index ``d = 0, 1, 2, ...`` is computed as follows.

1. Key: ``k0 = seed & 0xFFFFFFFF``, ``k1 = seed >> 32``.
2. Block index ``j = d // 2``.  Counter:
   ``c0 = position & 0xFFFFFFFF``, ``c1 = position >> 32``, ``c2 = j``,
   ``c3`` the domain tag of the stream: ``0x5D5EC0DE`` for ``stream="verify"`` (the
   default: acceptance tests, residual and bonus draws) and ``0x5D5ED2AF`` for
   ``stream="draft"`` (a drafter's own draws).  The tag separates these draws from any
   other use of Philox with the same seed.
3. ``(w0, w1, w2, w3) = Philox4x32-10(counter, key)``.
4. Draw ``2j`` uses ``(wa, wb) = (w0, w1)``; draw ``2j + 1`` uses ``(wa, wb) = (w2, w3)``.
5. ``u = ((wa << 21) | (wb >> 11)) * 2**-53`` evaluated on 64-bit unsigned integers, then
   converted to an IEEE-754 double.  The integer has 53 random bits, so the conversion
   is exact and ``u`` lies in ``[0, 1 - 2**-53]``; it is never 1.0.

Draw ``d`` of a row is therefore independent of ``num_draws``, of the batch size and of
the other rows of the batch.

The two streams never overlap: for one key (one seed) Philox is a bijection of the
128-bit counter, and a counter of the draft stream differs from every counter of the
verify stream in ``c3``, so no Philox block of one stream is a block of the other, for any
positions and draw indices.  A drafter that draws its tokens from the draft stream and a
verifier that tests them with the verify stream, both keyed by the same
``(seed, position)``, therefore never share noise (shared noise correlates the draft with
its own acceptance test and biases the output).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DOMAIN_TAG",
    "DRAFT_DOMAIN_TAG",
    "STREAM_TAGS",
    "check_stream",
    "counter_uniforms",
    "philox4x32_10",
]

# Philox4x32 round multipliers and Weyl key increments (Random123 constants).
_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_ROUNDS = 10
_MASK32 = 0xFFFFFFFF

#: Fourth counter word of every block of the verify stream (``stream="verify"``, the
#: default) of :func:`counter_uniforms`.
DOMAIN_TAG = 0x5D5EC0DE

#: Fourth counter word of every block of the draft stream (``stream="draft"``).
DRAFT_DOMAIN_TAG = 0x5D5ED2AF

#: The counter domain of each stream, by name.
STREAM_TAGS = {"verify": DOMAIN_TAG, "draft": DRAFT_DOMAIN_TAG}

_TWO_POW_M53 = 2.0**-53


def check_stream(stream: Any) -> int:
    """The domain tag of a stream name.

    Parameters
    ----------
    stream : {"verify", "draft"}
        The counter domain: ``"verify"`` for acceptance, residual and bonus draws,
        ``"draft"`` for a drafter's own draws.

    Returns
    -------
    int
        :data:`DOMAIN_TAG` or :data:`DRAFT_DOMAIN_TAG`.

    Raises
    ------
    ValueError
        For anything else, naming ``stream``.

    Examples
    --------
    >>> hex(check_stream("draft"))
    '0x5d5ed2af'
    """
    if type(stream) is str and stream in STREAM_TAGS:
        return STREAM_TAGS[stream]
    raise ValueError(f'stream must be "verify" or "draft"; found {stream!r}')


def _namespace_of(x: Any) -> Any | None:
    """Return the array namespace of ``x``, or None for non-arrays (Python sequences)."""
    if hasattr(x, "__array_namespace__"):
        return x.__array_namespace__()
    # NumPy < 2 arrays have no __array_namespace__ but the main namespace is close enough
    # for the handful of functions used here.
    if isinstance(x, np.ndarray):
        return np
    return None


def _astype(x: Any, dtype: Any, xp: Any) -> Any:
    # xp.astype is the standard spelling; older NumPy/CuPy only have the method, and
    # array_api_strict only has the function.
    astype = getattr(xp, "astype", None)
    if astype is not None:
        return astype(x, dtype)
    return x.astype(dtype)


def _integer_dtypes(xp: Any) -> tuple[Any, ...]:
    return (
        xp.int8,
        xp.int16,
        xp.int32,
        xp.int64,
        xp.uint8,
        xp.uint16,
        xp.uint32,
        xp.uint64,
    )


def _is_integer_dtype(dtype: Any, xp: Any) -> bool:
    # Compared against the explicit list rather than xp.isdtype, which older CuPy lacks;
    # bool is deliberately not an integer here.
    return any(dtype == d for d in _integer_dtypes(xp))


def _is_signed_dtype(dtype: Any, xp: Any) -> bool:
    return any(dtype == d for d in (xp.int8, xp.int16, xp.int32, xp.int64))


def _rounds(c0: Any, c1: Any, c2: Any, c3: Any, k0: Any, k1: Any) -> tuple[Any, Any, Any, Any]:
    """Apply the ten Philox4x32 rounds to word arrays.

    Every argument is a uint64 array (all broadcastable to one shape) holding values below
    2**32.  Keeping the 32-bit words in uint64 lets the 32x32 multiply give its exact
    64-bit product and lets the key bumps be reduced with a mask instead of relying on
    uint32 wrap-around, whose behaviour the array API standard leaves unspecified.
    Returns four uint64 arrays with values below 2**32.
    """
    for r in range(_ROUNDS):
        if r > 0:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = c0 * _M0
        p1 = c2 * _M1
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
    return c0, c1, c2, c3


def philox4x32_10(counter: Any, key: Any) -> Any:
    """Philox4x32-10 block function, applied row by row.

    Parameters
    ----------
    counter : array of uint32, shape ``[N, 4]``
        Counter words ``(c0, c1, c2, c3)`` of each row.  Any array API namespace.
    key : array of uint32, shape ``[N, 2]``
        Key words ``(k0, k1)`` of each row, from the same namespace as ``counter``.

    Returns
    -------
    array of uint32, shape ``[N, 4]``
        The output words ``(w0, w1, w2, w3)`` of each row, in the namespace of
        ``counter``.  Row ``i`` depends only on ``counter[i]`` and ``key[i]``.

    Raises
    ------
    TypeError
        If an argument is not an array, the two come from different namespaces, or a
        dtype is not uint32.
    ValueError
        If the shapes are not ``[N, 4]`` and ``[N, 2]`` with the same ``N``.

    Notes
    -----
    More generally ``counter`` may have shape ``[..., 4]`` and ``key`` shape ``[..., 2]``
    with equal leading dimensions.  See the module docstring for the round definition.
    """
    xp = _namespace_of(counter)
    if xp is None:
        raise TypeError("counter must be an array (uint32, shape [N, 4])")
    if _namespace_of(key) is not xp:
        raise TypeError("key must be an array from the same namespace as counter")
    if counter.dtype != xp.uint32:
        raise TypeError(f"counter must have dtype uint32, got {counter.dtype}")
    if key.dtype != xp.uint32:
        raise TypeError(f"key must have dtype uint32, got {key.dtype}")
    if counter.ndim < 1 or counter.shape[-1] != 4:
        raise ValueError(f"counter must have shape [N, 4], got {tuple(counter.shape)}")
    if key.ndim < 1 or key.shape[-1] != 2:
        raise ValueError(f"key must have shape [N, 2], got {tuple(key.shape)}")
    if tuple(counter.shape[:-1]) != tuple(key.shape[:-1]):
        raise ValueError(
            "counter and key must have the same leading shape, got "
            f"{tuple(counter.shape)} and {tuple(key.shape)}"
        )
    c = _astype(counter, xp.uint64, xp)
    k = _astype(key, xp.uint64, xp)
    words = _rounds(c[..., 0], c[..., 1], c[..., 2], c[..., 3], k[..., 0], k[..., 1])
    # Every word is below 2**32 already, so the narrowing cast is exact.
    return _astype(xp.stack(words, axis=-1), xp.uint32, xp)


def _as_u64_vector(x: Any, name: str, xp: Any) -> Any:
    """Validate a seeds/positions argument and return it as a 1-D uint64 array of ``xp``."""
    if _namespace_of(x) is None:
        if isinstance(x, (str, bytes)) or not isinstance(x, Sequence):
            raise TypeError(f"{name} must be a 1-D integer array or a sequence of ints")
        values = list(x)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"{name} must contain integers, got {type(v).__name__}")
        values = [int(v) for v in values]
        if values and min(values) < 0:
            raise ValueError(f"{name} must be non-negative, got {min(values)}")
        if values and max(values) >= 2**64:
            raise ValueError(f"{name} must be below 2**64, got {max(values)}")
        return xp.asarray(values, dtype=xp.uint64)

    if _namespace_of(x) is not xp:
        try:
            x = xp.asarray(x)
        except Exception as exc:
            raise TypeError(f"{name} could not be converted to the output namespace") from exc
    if not _is_integer_dtype(x.dtype, xp):
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D (shape [B]), got shape {tuple(x.shape)}")
    if _is_signed_dtype(x.dtype, xp) and bool(xp.any(x < 0)):
        raise ValueError(f"{name} must be non-negative")
    # Non-negative signed values are preserved exactly by the cast to uint64.
    return _astype(x, xp.uint64, xp)


def _block_index(n_blocks: int, like: Any, xp: Any) -> Any:
    # Place the block index on the inputs' device; CuPy's arange has no device keyword
    # and uses the current device, which is where its inputs live in practice.
    device = getattr(like, "device", None)
    if device is not None:
        try:
            return xp.arange(n_blocks, dtype=xp.uint64, device=device)
        except TypeError:
            pass
    return xp.arange(n_blocks, dtype=xp.uint64)


def counter_uniforms(
    seeds: Any | Sequence[int],
    positions: Any | Sequence[int],
    num_draws: int,
    xp: Any | None = None,
    *,
    stream: str = "verify",
) -> Any:
    """Uniforms in [0, 1) that are a pure function of ``(seed, position, draw index)``.

    Parameters
    ----------
    seeds : integer array or sequence of int, shape ``[B]``
        Per-row seed, each value in ``[0, 2**64)``.  Any integer dtype (signed arrays must
        hold non-negative values).
    positions : integer array or sequence of int, shape ``[B]``
        Per-row absolute position (e.g. tokens generated so far), each in ``[0, 2**64)``.
    num_draws : int
        Number of uniforms per row, ``>= 0``.
    xp : array namespace, optional
        Namespace of the result.  Defaults to the namespace of ``seeds`` (or of
        ``positions`` when ``seeds`` is a Python sequence), and to NumPy when both are
        Python sequences.
    stream : {"verify", "draft"}
        The counter domain (the fourth counter word): ``"verify"`` (the default, tag
        ``0x5D5EC0DE``) for acceptance, residual and bonus draws, ``"draft"`` (tag
        ``0x5D5ED2AF``) for a drafter's own draws.  The two never share a Philox block.

    Returns
    -------
    array of float64, shape ``[B, num_draws]``
        ``out[i, d]`` is draw ``d`` for ``(seeds[i], positions[i])`` as defined in the
        module docstring; every value lies in ``[0, 1 - 2**-53]``.

    Raises
    ------
    TypeError
        If ``seeds`` or ``positions`` is not of an integer dtype (the message names the
        argument), or ``num_draws`` is not an int.
    ValueError
        If a seed or position is negative or ``>= 2**64`` (the message names the
        argument), the arguments are not 1-D with equal lengths, ``num_draws < 0``, or
        ``stream`` is neither ``"verify"`` nor ``"draft"``.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import counter_uniforms
    >>> uniforms = counter_uniforms([7, 7], [0, 1], 3)  # seed 7 at positions 0 and 1
    >>> uniforms.shape, bool(((0 <= uniforms) & (uniforms < 1)).all())
    ((2, 3), True)
    >>> np.array_equal(uniforms[1], counter_uniforms([7], [1], 3)[0])
    True
    >>> draft = counter_uniforms([7], [1], 3, stream="draft")  # the drafter's domain
    >>> bool((draft != uniforms[1]).all())
    True
    """
    tag = check_stream(stream)
    if xp is None:
        xp = _namespace_of(seeds) or _namespace_of(positions) or np
    if isinstance(num_draws, bool) or not isinstance(num_draws, numbers.Integral):
        raise TypeError(f"num_draws must be an int, got {type(num_draws).__name__}")
    num_draws = int(num_draws)
    if num_draws < 0:
        raise ValueError(f"num_draws must be >= 0, got {num_draws}")
    # The block index occupies one 32-bit counter word.
    if num_draws > 2**33:
        raise ValueError(f"num_draws must be <= 2**33, got {num_draws}")

    s = _as_u64_vector(seeds, "seeds", xp)
    p = _as_u64_vector(positions, "positions", xp)
    if s.shape[0] != p.shape[0]:
        raise ValueError(
            f"seeds and positions must have the same length, got {s.shape[0]} and {p.shape[0]}"
        )
    b = s.shape[0]
    n_blocks = (num_draws + 1) // 2
    shape = (b, n_blocks)

    # Every per-row word is broadcast over the block axis so that row i's words depend
    # only on row i: this is what makes a row's draws independent of the batch.
    c0 = xp.broadcast_to(xp.reshape(p & _MASK32, (b, 1)), shape)
    c1 = xp.broadcast_to(xp.reshape(p >> 32, (b, 1)), shape)
    c2 = xp.broadcast_to(xp.reshape(_block_index(n_blocks, s, xp), (1, n_blocks)), shape)
    c3 = xp.zeros_like(c0) + tag
    k0 = xp.broadcast_to(xp.reshape(s & _MASK32, (b, 1)), shape)
    k1 = xp.broadcast_to(xp.reshape(s >> 32, (b, 1)), shape)
    w0, w1, w2, w3 = _rounds(c0, c1, c2, c3, k0, k1)

    # 32 bits of the first word and the top 21 of the second: 53 bits, exactly
    # representable in a double, so the scaled value can never round up to 1.0.
    even = _astype((w0 << 21) | (w1 >> 11), xp.float64, xp) * _TWO_POW_M53
    odd = _astype((w2 << 21) | (w3 >> 11), xp.float64, xp) * _TWO_POW_M53
    # Interleave so column 2j is the (w0, w1) draw and column 2j+1 the (w2, w3) draw.
    out = xp.reshape(xp.stack((even, odd), axis=-1), (b, 2 * n_blocks))
    if 2 * n_blocks != num_draws:
        out = out[:, :num_draws]
    return out
