"""Every source of uniforms (``docs/semantics.md`` §5).

Kernels never own a random generator: the verifiers use :class:`RejectionUniforms`, which
gives float64 ``[B, k+1]`` uniforms in ``[0, 1)`` (columns ``0 .. k-1`` for the acceptance
tests, column ``k`` for the residual draw), taken row by row from one of four sources:

1. explicit uniforms given by the caller (validated, used as they are);
2. ``seeded_seqs[b]``: a ``numpy.random.Generator`` (or ``cupy.random.Generator``) owned by
   the caller for row ``b``.  Consumption order: one call ``generator.random(k + 1)`` per
   call of the verifier, i.e. the ``k`` acceptance uniforms in position order, then the
   residual uniform.  The row's uniforms depend on nothing else;
3. ``counter_seeds[b] = (seed, position)``: the counter-based Philox uniforms of
   :func:`specdec_np._runtime.philox.counter_uniforms` with draw indices ``0 .. k``, a pure
   function
   of ``(seed, position, draw index)``, bit-identical on NumPy and CuPy, in the call's
   counter domain (``stream``: ``"verify"`` by default, ``"draft"`` for a drafter);
4. every other row: the sampler's own generator, one ``random((n, k + 1))`` call for the
   ``n`` remaining rows in row order.

No global random state is read or changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .arrays import intake
from .checks import check_uniform_dtype, check_uniforms
from .philox import check_stream, counter_uniforms

__all__ = [
    "CounterStream",
    "DrawLog",
    "OwnGenerator",
    "RejectionUniforms",
    "counter_uniforms",
    "explicit_uniforms",
    "undo_draw",
    "undo_pcg64_draw",
]


def explicit_uniforms(uniforms: Any, like: Any = None) -> Any:
    """A caller's explicit uniforms taken in (:func:`~specdec_np._runtime.arrays.intake`),
    float64 or float32 (JAX's default), the latter widened exactly to float64.

    Parameters
    ----------
    uniforms : array or array_like
    like : array, optional
        As :func:`~specdec_np._runtime.arrays.intake` takes it.

    Returns
    -------
    float64 NumPy or CuPy array
        Not yet checked for shape or range (the caller knows the shape).

    Raises
    ------
    TypeError
        For another dtype, saying what to do (:func:`check_uniform_dtype`).
    """
    array = intake(uniforms, "uniforms", like=like)
    check_uniform_dtype(array.dtype)
    return array if array.dtype == np.float64 else array.astype(np.float64)


def _check_rows(name: str, rows: Any, batch_size: int) -> Mapping[int, Any]:
    if rows is None:
        return {}
    if not isinstance(rows, Mapping):
        raise TypeError(
            f"{name} must be a dict of row index -> value; found {type(rows).__name__}"
        )
    for row in rows:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"{name} keys must be int row indices; found {type(row).__name__}")
        if not 0 <= row < batch_size:
            raise ValueError(
                f"{name} keys must be row indices in [0, {batch_size}); found {int(row)}"
            )
    # Python ints: NumPy keys of mixed signedness would index as floats.
    return {int(row): value for row, value in rows.items()}


class CounterStream:
    """The sampler's own uniforms on a GPU: row ``n`` of the stream is
    ``counter_uniforms(key, n, width)``, so the stream is computed on the device, with no
    host transfer, and can be rewound (its state is one integer), unlike a CuPy generator.

    Parameters
    ----------
    key : int
        Philox key in ``[0, 2**64)``.
    xp : module
        ``cupy`` (or ``numpy``): where the uniforms are made.
    """

    def __init__(self, key: int, xp: Any) -> None:
        self._key = int(key)
        self._xp = xp
        self.state = 0

    def random(self, size: tuple[int, int]) -> Any:
        """The next ``size[0]`` rows of the stream, float64 ``[rows, width]``."""
        rows, width = size
        xp = self._xp
        seeds = xp.full(rows, self._key, dtype=xp.uint64)
        positions = xp.arange(self.state, self.state + rows, dtype=xp.uint64)
        self.state += rows
        return counter_uniforms(seeds, positions, width, xp=xp)

    def random_rows(self, widths: np.ndarray) -> Any:
        """The next ``len(widths)`` rows of the stream, row ``i`` cut to its first
        ``widths[i]`` entries, concatenated: float64 ``[sum(widths)]``."""
        seeds = np.full(widths.size, self._key, dtype=np.uint64)
        positions = np.arange(self.state, self.state + widths.size, dtype=np.uint64)
        self.state += int(widths.size)
        return _counter_rows_flat(self._xp, seeds, positions, widths)


def _counter_rows_flat(
    xp: Any,
    seeds: np.ndarray,
    positions: np.ndarray,
    widths: np.ndarray,
    stream: str = "verify",
) -> Any:
    """``counter_uniforms`` of each ``(seeds[i], positions[i])`` cut to ``widths[i]``
    draws, concatenated row by row (float64 ``[sum(widths)]``), in ``stream``'s domain.

    A row's draws do not depend on how many are asked for, so rows of one width are made
    together and no ``rows x max(widths)`` block is ever allocated.
    """
    result = xp.empty(int(widths.sum()), dtype=xp.float64)
    starts = np.cumsum(widths) - widths
    for width in np.unique(widths[widths > 0]):
        rows = np.flatnonzero(widths == width)
        block = counter_uniforms(
            xp.asarray(seeds[rows]), xp.asarray(positions[rows]), int(width), xp=xp,
            stream=stream,
        )
        places = starts[rows][:, None] + np.arange(int(width))[None, :]
        result[xp.asarray(places.ravel())] = block.ravel()
    return result


def _slot_positions(offsets: np.ndarray, widths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The flat positions of the leading ``widths[b]`` slots of each row ``b`` with
    ``rows[b]`` (row ``b``'s slots start at ``offsets[b]``), row by row."""
    counts = np.where(rows, widths, 0)
    starts = np.repeat(offsets[:-1], counts)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + within


class OwnGenerator:
    """A sampler's own source of uniforms, on any device.

    On the CPU, a ``numpy.random.Generator`` (PCG64) seeded with ``seed``; for CuPy inputs,
    a :class:`CounterStream` made on the device the first time it is needed.  The stream's
    key is fixed at construction from a child of the seed, so that no call draws it (a call
    that then failed would have moved the generator).

    Parameters
    ----------
    seed : int or None
        None seeds from the OS.
    """

    def __init__(self, seed: int | None) -> None:
        seed_sequence = np.random.SeedSequence(seed)
        self.numpy = np.random.Generator(np.random.PCG64(seed_sequence))
        (child,) = seed_sequence.spawn(1)
        self._cuda_key = int(child.generate_state(1, np.uint64)[0])
        self._cuda_stream: CounterStream | None = None

    def for_device(self, device: int | None) -> Any:
        """The generator for inputs on ``device`` (None: the CPU)."""
        if device is None:
            return self.numpy
        if self._cuda_stream is None:
            from .arrays import cuda_module

            self._cuda_stream = CounterStream(self._cuda_key, cuda_module())
        return self._cuda_stream


def _is_generator(generator: Any) -> bool:
    """Exactly a ``numpy.random.Generator``, a ``cupy.random.Generator`` or a
    :class:`CounterStream`: the only sources whose ``random(shape)`` is trusted to return
    float64 uniforms in ``[0, 1)`` of that shape.  Subclasses may override ``random`` and
    are refused, as are classes that merely carry the name (the CuPy class is compared by
    identity, imported only when the object's type claims to come from cupy)."""
    kind = type(generator)
    if kind is np.random.Generator or kind is CounterStream:
        return True
    if kind.__module__.split(".", 1)[0] != "cupy":
        return False
    try:
        import cupy
    except ImportError:
        return False
    return kind is getattr(getattr(cupy, "random", None), "Generator", None)


def _check_generator(name: str, generator: Any) -> None:
    if not _is_generator(generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (or a cupy.random.Generator); found "
            f"{type(generator).__name__}"
        )


class _Draw(NamedTuple):
    """One call ``generator.random(size)`` of a verifier call, and the state before it."""

    generator: Any
    size: Any
    before: Any


class DrawLog:
    """The draws a call made from the generators it consumed, so that a call that fails
    after drawing can put them back without rewinding over draws that other threads made.

    A draw is undone only when nothing else drew from its generator between the state saved
    before it and now: the generator is in the state that replaying the draw from the saved
    one reaches, checked under the bit generator's lock.  Otherwise it is left as it is:
    its next uniforms are fresh ones either way, and rewinding would hand another thread's
    uniforms out a second time.  CuPy generators cannot be saved cheaply and are not
    logged: a caller's CuPy generator in ``seeded_seqs`` may have moved after a call that
    failed on the device.
    """

    __slots__ = ("_draws",)

    def __init__(self) -> None:
        self._draws: list[_Draw] = []

    def random(self, generator: Any, size: Any) -> Any:
        """``generator.random(size)``, logged."""
        if isinstance(generator, np.random.Generator):
            self._draws.append(_Draw(generator, size, generator.bit_generator.state))
        elif isinstance(generator, CounterStream):
            self._draws.append(_Draw(generator, size, generator.state))
        return generator.random(size)

    def record_counter_rows(self, stream: CounterStream, rows: int) -> None:
        """Log that ``rows`` rows of ``stream`` are about to be taken (by
        :meth:`CounterStream.random_rows`, whose rows may differ in width)."""
        self._draws.append(_Draw(stream, (rows, 0), stream.state))

    def undo(self) -> None:
        """Put back every logged draw that nothing else drew around, newest first."""
        while self._draws:
            draw = self._draws.pop()
            if isinstance(draw.generator, CounterStream):
                rows = draw.size[0]
                if draw.generator.state == draw.before + rows:
                    draw.generator.state = draw.before
                continue
            after = _state_after(draw)
            bit_generator = draw.generator.bit_generator
            with bit_generator.lock:
                if _same_state(bit_generator.state, after):
                    bit_generator.state = draw.before


def undo_draw(generator: Any, size: Any, before: Any) -> None:
    """Put back one ``generator.random(size)`` made from the state ``before``, where
    nothing else drew around it (:meth:`DrawLog.undo` of a log of that one draw)."""
    log = DrawLog()
    log._draws.append(_Draw(generator, size, before))
    log.undo()


def undo_pcg64_draw(generator: np.random.Generator, drawn: np.ndarray) -> None:
    """Put back ``drawn``, the float64 uniforms of one ``generator.random(size)`` from a
    PCG64 generator, where nothing else drew after it: the check of :meth:`DrawLog.undo`
    made from the draw itself rather than from a state saved before it (reading a state
    costs more than a small call's draw).

    Each float64 uniform takes one 64-bit output, and PCG64 steps back as well as forward
    (``advance`` wraps around its period), so the state ``drawn.size`` outputs before now
    is the state before the draw if replaying the draw from it gives ``drawn`` and ends in
    the state now; otherwise the generator moved since, and is left as it is.

    Parameters
    ----------
    generator : numpy.random.Generator
        Exactly a ``numpy.random.Generator`` on ``numpy.random.PCG64``.
    drawn : float64 numpy array
        What the draw returned.
    """
    bit_generator = generator.bit_generator
    count = int(drawn.size)
    replica = np.random.PCG64()
    with bit_generator.lock:
        now = bit_generator.state
        replica.state = now
        replica.advance(-count)
        before = replica.state
        # advance() clears the buffered 32-bit half, which a float64 draw never touches.
        before["has_uint32"], before["uinteger"] = now["has_uint32"], now["uinteger"]
        replica.state = before
        replayed = np.random.Generator(replica).random(count)
        if replayed.tobytes() == np.ascontiguousarray(drawn).tobytes() and _same_state(
            replica.state, now
        ):
            bit_generator.state = before


def _state_after(draw: _Draw) -> Any:
    """The state ``random(size)`` leaves from the state before the draw (on a replica)."""
    bit_generator = draw.generator.bit_generator
    replica = np.random.Generator(type(bit_generator)())
    replica.bit_generator.state = draw.before
    replica.random(draw.size)
    return replica.bit_generator.state


def _same_state(first: Any, second: Any) -> bool:
    """Equality of two bit-generator states (dicts that may hold arrays)."""
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(
            _same_state(first[key], second[key]) for key in first
        )
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return bool(np.array_equal(first, second))
    return bool(first == second)


class RejectionUniforms:
    """The checked uniform sources of one rejection-sampling call.

    The constructor checks every source, so that a bad argument raises before any generator
    has moved; :meth:`undo` puts back what :meth:`draw` drew when the call fails later.

    Parameters
    ----------
    batch_size, k : int
        ``B`` and the number of draft tokens.
    xp : module
        ``numpy`` or ``cupy``: the namespace of the uniforms.
    uniforms : float64 or float32 array [B, k+1], optional
        Explicit uniforms (float32 widened exactly); excludes ``seeded_seqs`` and
        ``counter_seeds``.
    generator : numpy.random.Generator or cupy.random.Generator, optional
        Source for the rows that have no seed of their own; a fresh, unseeded
        ``numpy.random.default_rng()`` when None.
    seeded_seqs : dict[int, Generator], optional
    counter_seeds : dict[int, tuple[int, int]], optional
        Row index → ``(seed, position)`` with both in ``[0, 2**64)``.
    stream : {"verify", "draft"}
        The counter domain of the ``counter_seeds`` rows
        (:func:`~specdec_np._runtime.philox.counter_uniforms`); the other sources have
        none.
    generator_for : callable, optional
        ``generator_for(device)`` gives the generator when ``generator`` is None; called
        after every other source has been checked (a sampler's own generator).
    device : int or None
        The inputs' device, handed to ``generator_for``.
    row_widths : int64 numpy array [B], optional
        Draws per row, at most ``k + 1`` (a ragged batch: ``k_b + 2`` for a sampled
        request, 0 for a greedy one).  A row's source is consumed by exactly that many
        draws; the columns past them are left undefined.  None: every row ``k + 1``.
    row_offsets : int64 numpy array [B + 1], optional
        Lay the drawn uniforms out flat, in memory proportional to the batch rather than
        to ``B x (k + 1)`` (a tree batch: ``node_offsets[b] + b``): :meth:`draw` returns
        float64 ``[row_offsets[B]]`` with row ``b``'s draws from ``row_offsets[b]`` on.
        Requires ``row_widths`` (each at most the row's slots).  Explicit ``uniforms``
        keep their ``[B, k + 1]`` form and are compacted into the flat copy.
    """

    def __init__(
        self,
        batch_size: int,
        k: int,
        xp: Any,
        *,
        uniforms: Any = None,
        generator: Any = None,
        seeded_seqs: Any = None,
        counter_seeds: Any = None,
        stream: str = "verify",
        generator_for: Any = None,
        device: Any = None,
        row_widths: Any = None,
        row_offsets: Any = None,
    ) -> None:
        check_stream(stream)
        self._stream = stream
        self._shape = (batch_size, k + 1)
        self._row_widths = row_widths
        self._row_offsets = row_offsets
        # A batch of greedy requests draws nothing: draw() and snapshot() then skip the
        # sources altogether (they are still checked below).
        self._draws_nothing = row_widths is not None and not np.count_nonzero(row_widths)
        self._xp = xp
        self._explicit = None
        self._seeded = _check_rows("seeded_seqs", seeded_seqs, batch_size)
        counter_rows = _check_rows("counter_seeds", counter_seeds, batch_size)
        if uniforms is not None:
            if self._seeded or counter_rows:
                raise ValueError(
                    "uniforms cannot be combined with seeded_seqs or counter_seeds: explicit "
                    "uniforms already fix every row"
                )
            uniforms = explicit_uniforms(uniforms)
            # The values are checked on a private copy, which is what the kernels read: a
            # caller's thread writing its own array during the call cannot slip an
            # unchecked value past the check.
            uniforms = xp.array(uniforms, dtype=xp.float64, order="C", copy=True)
            check_uniforms(uniforms, batch_size, k)
            self._explicit = uniforms
        for row, row_generator in self._seeded.items():
            _check_generator(f"seeded_seqs[{row}]", row_generator)
        both = set(self._seeded).intersection(counter_rows)
        if both:
            raise ValueError(
                f"row {min(both)} is in both seeded_seqs and counter_seeds; give each row one "
                "source"
            )
        self._counter_rows = sorted(counter_rows)
        if self._counter_rows:
            self._seeds = _uint64_column("seed", counter_rows, self._counter_rows, 0)
            self._positions = _uint64_column("position", counter_rows, self._counter_rows, 1)
        if generator is None and generator_for is not None:
            # A sampler's own source, asked for only now that every argument is checked.
            generator = generator_for(device)
        if generator is not None:
            _check_generator("generator", generator)
        elif self._needs_own_generator(batch_size):
            # Seeding from the OS costs tens of microseconds: only when rows draw from it.
            generator = np.random.default_rng()
        self._generator = generator
        self._log = DrawLog()

    def _needs_own_generator(self, batch_size: int) -> bool:
        if self._explicit is not None:
            return False
        taken = len(self._seeded) + len(self._counter_rows)
        if self._row_widths is None:
            return taken < batch_size
        if not taken:
            return not self._draws_nothing
        own = np.ones(batch_size, dtype=bool)
        own[[*self._seeded, *self._counter_rows]] = False
        return bool((self._row_widths[own] > 0).any())

    def undo(self) -> None:
        """Put back what :meth:`draw` drew, where nothing else drew around it
        (:class:`DrawLog`); called by a call that fails after drawing."""
        self._log.undo()

    def draw(self) -> Any:
        """The float64 ``[B, k+1]`` uniforms (explicit, or drawn from the sources); flat
        ``[row_offsets[B]]`` when the constructor was given ``row_offsets``."""
        if self._row_offsets is not None:
            return self._draw_flat()
        log = self._log
        if self._explicit is not None:
            return self._explicit
        xp = self._xp
        batch_size, width = self._shape
        widths = self._row_widths
        if self._draws_nothing or (
            self._generator is None and not self._seeded and not self._counter_rows
        ):
            return xp.empty(self._shape, dtype=xp.float64)  # no row draws anything
        if widths is None and not self._seeded and not self._counter_rows:
            # The kernels read [B, k+1] row-major; a counter stream with an odd width
            # returns a column slice.
            return xp.ascontiguousarray(xp.asarray(log.random(self._generator, self._shape)))
        result = xp.empty(self._shape, dtype=xp.float64)
        if self._seeded or self._counter_rows:
            taken = set(self._seeded).union(self._counter_rows)
            own_rows = [b for b in range(batch_size) if b not in taken]
        else:
            own_rows = range(batch_size)
        if own_rows and widths is None:
            result[own_rows] = xp.asarray(log.random(self._generator, (len(own_rows), width)))
        elif own_rows and isinstance(self._generator, CounterStream):
            # A counter stream is counted in rows: each row that draws takes one stream row
            # (its leading widths[b] entries are used), made on the device.
            drawing = [b for b in own_rows if widths[b] > 0]
            if drawing:
                result[drawing] = log.random(self._generator, (len(drawing), width))
        elif len(own_rows) == 1:
            # One row: its count of draws, in its leading columns.
            row = own_rows[0]
            count = int(widths[row])
            if count:
                result[row, :count] = xp.asarray(log.random(self._generator, count))
        elif own_rows:
            # One flat draw of exactly the rows' counts, laid out row by row: a boolean
            # mask assigns in row-major order.
            mask = np.arange(width)[None, :] < widths[:, None]
            if not isinstance(own_rows, range):
                own = np.zeros(batch_size, dtype=bool)
                own[own_rows] = True
                mask &= own[:, None]
            count = int(np.count_nonzero(mask))
            if count:
                result[xp.asarray(mask)] = xp.asarray(log.random(self._generator, count))
        for row, row_generator in self._seeded.items():
            row_width = width if widths is None else int(widths[row])
            if row_width:
                result[row, :row_width] = xp.asarray(log.random(row_generator, row_width))
        if self._counter_rows:
            result[self._counter_rows] = counter_uniforms(
                xp.asarray(self._seeds), xp.asarray(self._positions), width, xp=xp,
                stream=self._stream,
            )
        return result

    def _draw_flat(self) -> Any:
        """:meth:`draw` for the flat layout: the same draws from the same sources, in the
        same order, as the ``[B, k + 1]`` layout, placed at the rows' offsets."""
        xp, log = self._xp, self._log
        offsets, widths = self._row_offsets, self._row_widths
        batch_size = self._shape[0]
        result = xp.empty(int(offsets[-1]), dtype=xp.float64)
        every_row = np.ones(batch_size, dtype=bool)
        if self._explicit is not None:
            explicit = self._explicit
            used = np.arange(explicit.shape[1])[None, :] < widths[:, None]
            places = _slot_positions(offsets, widths, every_row)
            if places.size:
                result[xp.asarray(places)] = explicit[xp.asarray(used)]
            return result
        if self._draws_nothing:
            return result
        own = every_row.copy()
        own[[*self._seeded, *self._counter_rows]] = False
        drawing = own & (widths > 0)
        if drawing.any():
            places = xp.asarray(_slot_positions(offsets, widths, drawing))
            if isinstance(self._generator, CounterStream):
                log.record_counter_rows(self._generator, int(drawing.sum()))
                result[places] = self._generator.random_rows(widths[drawing])
            else:
                result[places] = xp.asarray(log.random(self._generator, int(places.size)))
        for row, row_generator in self._seeded.items():
            row_width = int(widths[row])
            if row_width:
                start = int(offsets[row])
                values = log.random(row_generator, row_width)
                result[start : start + row_width] = xp.asarray(values)
        if self._counter_rows:
            rows = np.asarray(self._counter_rows)
            counted = np.zeros(batch_size, dtype=bool)
            counted[rows] = True
            places = _slot_positions(offsets, widths, counted)
            if places.size:
                values = _counter_rows_flat(
                    xp, self._seeds, self._positions, widths[rows], self._stream
                )
                result[xp.asarray(places)] = values
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
