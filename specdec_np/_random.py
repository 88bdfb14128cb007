"""Every source of uniforms of SPEC section 5.

Kernels never own a random generator: the verifiers call :func:`rejection_uniforms`, which
returns float64 ``[B, k+1]`` uniforms in ``[0, 1)`` (columns ``0 .. k-1`` for the acceptance
tests, column ``k`` for the residual draw), taken row by row from one of four sources:

1. explicit uniforms given by the caller (validated, used as they are);
2. ``seeded_seqs[b]``: a ``numpy.random.Generator`` (or ``cupy.random.Generator``) owned by
   the caller for row ``b``.  Consumption order: one call ``generator.random(k + 1)`` per
   call of the verifier, i.e. the ``k`` acceptance uniforms in position order, then the
   residual uniform.  The row's uniforms depend on nothing else;
3. ``counter_seeds[b] = (seed, position)``: the counter-based Philox uniforms of
   :func:`specdec_np._philox.counter_uniforms` with draw indices ``0 .. k``, a pure function
   of ``(seed, position, draw index)``, bit-identical on NumPy and CuPy;
4. every other row: the sampler's own generator, one ``random((n, k + 1))`` call for the
   ``n`` remaining rows in row order.

No global random state is read or changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._philox import counter_uniforms
from ._validate import check_uniforms

__all__ = ["GeneratorSnapshot", "counter_uniforms", "rejection_uniforms"]


def _check_row_keys(name: str, rows: Mapping[Any, Any], batch_size: int) -> None:
    for row in rows:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"{name} keys must be int row indices; found {type(row).__name__}")
        if not 0 <= row < batch_size:
            raise ValueError(
                f"{name} keys must be row indices in [0, {batch_size}); found {int(row)}"
            )


class GeneratorSnapshot:
    """Saved states of the generators a call may consume, restored if the call fails.

    Parameters
    ----------
    generators : iterable of numpy.random.Generator or None
        ``None`` entries and generators without a ``bit_generator`` (CuPy's) are skipped.
    """

    __slots__ = ("_saved",)

    def __init__(self, generators: Any) -> None:
        self._saved = [
            (generator.bit_generator, generator.bit_generator.state)
            for generator in generators
            if generator is not None and hasattr(generator, "bit_generator")
        ]

    def restore(self) -> None:
        """Put every saved generator back in the state it had at construction."""
        for bit_generator, state in self._saved:
            bit_generator.state = state


def rejection_uniforms(
    batch_size: int,
    k: int,
    xp: Any,
    *,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
) -> Any:
    """Uniforms for one rejection-sampling call, from the sources in the module docstring.

    Parameters
    ----------
    batch_size, k : int
        ``B`` and the number of draft tokens.
    xp : module
        ``numpy`` or ``cupy``: the namespace of the result.
    uniforms : float64 array [B, k+1], optional
        Explicit uniforms; excludes ``seeded_seqs`` and ``counter_seeds``.
    generator : numpy.random.Generator or cupy.random.Generator, optional
        Source for the rows that have no seed of their own; a fresh, unseeded
        ``numpy.random.default_rng()`` when None.
    seeded_seqs : dict[int, Generator], optional
    counter_seeds : dict[int, tuple[int, int]], optional
        Row index → ``(seed, position)`` with both in ``[0, 2**64)``.

    Returns
    -------
    float64 array [B, k+1] of namespace ``xp``.
    """
    if uniforms is not None:
        if seeded_seqs or counter_seeds:
            raise ValueError(
                "uniforms cannot be combined with seeded_seqs or counter_seeds: explicit "
                "uniforms already fix every row"
            )
        if not hasattr(uniforms, "dtype") or uniforms.dtype != np.float64:
            found = getattr(uniforms, "dtype", type(uniforms).__name__)
            raise TypeError(f"uniforms must be a float64 array; found {found}")
        explicit = xp.ascontiguousarray(uniforms)
        check_uniforms(explicit, batch_size, k)
        return explicit
    seeded_seqs = seeded_seqs or {}
    counter_seeds = counter_seeds or {}
    # Everything is checked before the first draw, so a bad argument moves no generator.
    _check_row_keys("seeded_seqs", seeded_seqs, batch_size)
    _check_row_keys("counter_seeds", counter_seeds, batch_size)
    for row, row_generator in seeded_seqs.items():
        if not callable(getattr(row_generator, "random", None)):
            raise TypeError(
                f"seeded_seqs[{row}] must be a numpy.random.Generator (or cupy's); found "
                f"{type(row_generator).__name__}"
            )
    both = set(seeded_seqs).intersection(counter_seeds)
    if both:
        raise ValueError(
            f"row {min(both)} is in both seeded_seqs and counter_seeds; give each row one source"
        )
    counter_rows = sorted(counter_seeds)
    seeds = _uint64_column("seed", counter_seeds, counter_rows, 0)
    positions = _uint64_column("position", counter_seeds, counter_rows, 1)
    if generator is None:
        generator = np.random.default_rng()
    width = k + 1
    if not seeded_seqs and not counter_seeds:
        return xp.asarray(generator.random((batch_size, width)))
    result = xp.empty((batch_size, width), dtype=xp.float64)
    own_rows = [b for b in range(batch_size) if b not in seeded_seqs and b not in counter_seeds]
    if own_rows:
        result[own_rows] = xp.asarray(generator.random((len(own_rows), width)))
    for row, row_generator in seeded_seqs.items():
        result[row] = xp.asarray(row_generator.random(width))
    if counter_rows:
        result[counter_rows] = counter_uniforms(
            xp.asarray(seeds), xp.asarray(positions), width, xp=xp
        )
    return result


def _uint64_column(
    field: str, counter_seeds: Mapping[int, Any], rows: list[int], index: int
) -> np.ndarray:
    """One field of the ``(seed, position)`` pairs as uint64, checked."""
    values = np.empty(len(rows), dtype=np.uint64)
    for slot, row in enumerate(rows):
        pair = counter_seeds[row]
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"counter_seeds[{row}] must be a (seed, position) pair of ints; found {pair!r}"
            )
        value = pair[index]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"counter_seeds[{row}] {field} must be an int; found {type(value).__name__}"
            )
        if not 0 <= int(value) < 2**64:
            raise ValueError(
                f"counter_seeds[{row}] {field} must lie in [0, 2**64); found {int(value)}"
            )
        values[slot] = int(value)
    return values
