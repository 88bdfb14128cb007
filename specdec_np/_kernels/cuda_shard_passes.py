"""Launchers of ``shard_passes.cu``: a rank's passes in verification across vocabulary
shards (:mod:`specdec_np._sharded`) on rows that are CuPy arrays.

:data:`shard_like` has ``specdec_np._core``'s ``shard_*`` functions (names, arguments,
meanings), so that the sharded modules call either through one name
(``specdec_np._sharded.rows.passes``): the rows, the weights and the draws' float64 rows
stay on their device, while the per-row arguments and results (temperatures, maxima,
masses, counts, columns, tables) are host NumPy arrays, uploaded or filled in place.  The
kernels are compiled and launched through :mod:`specdec_np._kernels.cuda` (the source
``shard_passes``, its guards and its launch); CuPy is imported only when a launcher runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .cuda import _PROB_CTYPES, BLOCK_SIZE, _guard, _launch

__all__ = ["shard_like"]


def _shard_rows(rows: Any, name: str, dtypes: tuple[str, ...] = tuple(_PROB_CTYPES)) -> int:
    """Check a device block of rows (2-D, C-contiguous, one of ``dtypes``); its row count."""
    _guard(rows, name, dtypes, (None, None))
    return int(rows.shape[0])


def _shard_upload(values: Any, dtype: Any, like: Any) -> Any:
    """A small host array (per-row numbers) onto the device of ``like``."""
    import cupy

    with like.device:
        return cupy.asarray(np.ascontiguousarray(values, dtype=dtype))


def _device_empty(like: Any, shape: Any, dtype: Any, fill: bool = False) -> Any:
    """An array on the device of ``like`` (zeros with ``fill``, else uninitialised)."""
    import cupy

    with like.device:
        return (cupy.zeros if fill else cupy.empty)(shape, dtype=dtype)


def _indexed_rows(rows: Any, width: int, indices: np.ndarray) -> dict[str, Any]:
    """The launch arguments a pass over the rows ``indices`` of ``rows`` starts with."""
    return {"rows": rows, "width": np.int64(width),
            "indices": _shard_upload(indices, np.int64, rows),
            "count": np.int64(indices.size)}


def _shard_indices(indices: Any, num_rows: int, per_row: int, name: str) -> np.ndarray:
    """Host row indices, each inside the block, with per-row arrays long enough (the
    compiled passes' own checks)."""
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    if per_row < indices.size:
        raise ValueError(f"{name}: a per-row array is shorter than the row indices")
    if indices.size and (indices.min() < 0 or indices.max() >= num_rows):
        raise ValueError(f"{name}: a row index lies outside the block of {num_rows} rows")
    return indices


def _shard_launch(name: str, grid: int, block: int, arguments: dict[str, Any]) -> None:
    if grid > 0:
        _launch("shard_passes", name, grid, block, arguments)


class _ShardKernels:
    """``specdec_np._core``'s shard passes (same names, arguments and meanings) on rows that
    are CuPy arrays: the rows, the weights and the draws' float64 rows stay on their device,
    while the per-row arguments and results (temperatures, maxima, masses, counts, columns,
    tables) are host NumPy arrays, uploaded or filled in place.  One block per row
    (:data:`BLOCK_SIZE` threads) for the passes over a row, one thread per row for the
    draws' ordered sums."""

    @staticmethod
    def shard_stats(rows: Any, temperature: Any, groups: int, stats: np.ndarray,
                    group_max: np.ndarray) -> None:
        n = _shard_rows(rows, "rows")
        width = int(rows.shape[1])
        if groups < 0 or 2 * groups > width:
            raise ValueError(f"shard_stats: groups = {groups} must lie in 0 .. width / 2")
        if n == 0:
            return
        table = _device_empty(rows, (n, 3), np.float64)
        grouped = _device_empty(rows, (n, groups), rows.dtype) if groups else None
        arguments = {
            "rows": rows, "count": np.int64(n), "width": np.int64(width),
            "temperature": _shard_upload(np.asarray(temperature)[:n], rows.dtype, rows),
            "groups": np.int64(groups), "stats": table, "group_max": grouped,
        }
        name = f"shard_stats_kernel<{_PROB_CTYPES[np.dtype(rows.dtype).name]}>"
        _shard_launch(name, n, BLOCK_SIZE, arguments)
        stats[:n] = table.get()
        if grouped is not None:
            group_max[:n] = grouped.get()

    @staticmethod
    def shard_argmax(rows: Any, start: int, table: np.ndarray) -> None:
        n = _shard_rows(rows, "rows")
        if int(rows.shape[1]) == 0:
            raise ValueError("shard_argmax: the rows hold no column")
        if n == 0:
            return
        found = _device_empty(rows, (n, 2), np.float64)
        arguments = {"rows": rows, "count": np.int64(n), "width": np.int64(rows.shape[1]),
                     "start": np.int64(start), "table": found}
        name = f"shard_argmax_kernel<{_PROB_CTYPES[np.dtype(rows.dtype).name]}>"
        _shard_launch(name, n, BLOCK_SIZE, arguments)
        table[:n] = found.get()

    @staticmethod
    def shard_weights(rows: Any, indices: Any, temperature: Any, z_max: Any, cutoff: Any,
                      weights: Any, masses: np.ndarray) -> None:
        num_rows, width = _shard_rows(rows, "rows"), int(rows.shape[1])
        per_row = min(len(temperature), len(z_max), len(cutoff), len(masses))
        indices = _shard_indices(indices, num_rows, per_row, "shard_weights")
        n = indices.size
        dtype = np.dtype(rows.dtype)
        _guard(weights, "weights", (dtype.name,), (n, width))
        if width == 0:
            masses[:n] = 0.0
            return
        if n == 0:
            return
        sums = _device_empty(rows, n, np.float64)
        arguments = {
            **_indexed_rows(rows, width, indices),
            **{key: _shard_upload(np.asarray(value)[:n], dtype, rows) for key, value in
               (("temperature", temperature), ("z_max", z_max), ("cutoff", cutoff))},
            "weights": weights, "masses": sums,
        }
        _shard_launch(f"shard_weights_kernel<{_PROB_CTYPES[dtype.name]}>", n, BLOCK_SIZE,
                      arguments)
        masses[:n] = sums.get()

    @staticmethod
    def shard_at_least(rows: Any, indices: Any, temperature: Any, thresholds: Any,
                       counts: np.ndarray, columns: np.ndarray,
                       values: np.ndarray) -> tuple[int, bool]:
        num_rows, width = _shard_rows(rows, "rows"), int(rows.shape[1])
        per_row = min(len(temperature), len(thresholds), len(counts))
        indices = _shard_indices(indices, num_rows, per_row, "shard_at_least")
        n = indices.size
        dtype = np.dtype(rows.dtype)
        if width == 0 or n == 0:
            counts[:n] = 0
            return 0, True
        found = _device_empty(rows, n, np.int64, fill=True)
        arguments = {
            **_indexed_rows(rows, width, indices),
            "temperature": _shard_upload(np.asarray(temperature)[:n], dtype, rows),
            "thresholds": _shard_upload(np.asarray(thresholds)[:n], dtype, rows),
            "offsets": None, "counts": found, "columns": None, "values": None,
        }
        name = f"shard_at_least_kernel<{_PROB_CTYPES[dtype.name]}>"
        _shard_launch(name, n, BLOCK_SIZE, arguments)  # the counts
        counts[:n] = found.get()
        total = int(counts[:n].sum())
        if total > min(columns.shape[0], values.shape[0]):
            return total, False
        if total:
            arguments["columns"] = _device_empty(rows, total, np.int64)
            arguments["values"] = _device_empty(rows, total, dtype)
            offsets = np.concatenate([[0], np.cumsum(counts[: n - 1])])
            arguments["offsets"] = _shard_upload(offsets, np.int64, rows)
            _shard_launch(name, n, BLOCK_SIZE, arguments)  # the entries, in column order
            columns[:total] = arguments["columns"].get()
            values[:total] = arguments["values"].get()
        return total, True

    @staticmethod
    def shard_exp(x: np.ndarray, z_max: np.ndarray, out: np.ndarray, like: Any) -> None:
        """As ``_core.shard_exp`` on host entries, computed on the device of ``like`` (the
        device law's exponential)."""
        count = int(x.shape[0])
        if z_max.shape[0] != count or out.shape[0] != count:
            raise ValueError("shard_exp: x, z_max and out must have one length")
        if count == 0:
            return
        dtype = np.dtype(x.dtype)
        weights = _device_empty(like, count, dtype)
        arguments = {"x": _shard_upload(x, dtype, like),
                     "z_max": _shard_upload(z_max, dtype, like),
                     "count": np.int64(count), "out": weights}
        grid = (count + BLOCK_SIZE - 1) // BLOCK_SIZE
        _shard_launch(f"shard_exp_kernel<{_PROB_CTYPES[dtype.name]}>", grid, BLOCK_SIZE,
                      arguments)
        out[:] = weights.get()

    @staticmethod
    def shard_divided(weights: Any, indices: Any, divisors: Any, out: Any,
                      out_rows: Any) -> None:
        num_rows, width = _shard_rows(weights, "weights"), int(weights.shape[1])
        indices = _shard_indices(indices, num_rows, len(divisors), "shard_divided")
        out_rows = _shard_indices(out_rows, _shard_rows(out, "out", ("float64",)),
                                  indices.size, "shard_divided")
        if int(out.shape[1]) != width or out_rows.size != indices.size:
            raise ValueError("shard_divided: out must be [*, width] with a row per index")
        if width == 0 or indices.size == 0:
            return
        arguments = {
            "weights": weights, "width": np.int64(width),
            "indices": _shard_upload(indices, np.int64, weights),
            "count": np.int64(indices.size),
            "divisors": _shard_upload(np.asarray(divisors)[: indices.size], np.float64, weights),
            "out": out, "out_rows": _shard_upload(out_rows, np.int64, weights),
        }
        name = f"shard_divided_kernel<{_PROB_CTYPES[np.dtype(weights.dtype).name]}>"
        _shard_launch(name, indices.size, BLOCK_SIZE, arguments)

    @staticmethod
    def shard_positive_sums(rows: Any, sums: np.ndarray) -> None:
        n = _shard_rows(rows, "rows", ("float64",))
        if sums.shape[0] < n:
            raise ValueError("shard_positive_sums: sums must have a value per row")
        if n == 0:
            return
        found = _device_empty(rows, n, np.float64)
        arguments = {"rows": rows, "count": np.int64(n), "width": np.int64(rows.shape[1]),
                     "sums": found}
        _shard_launch("shard_positive_sums_kernel", (n + 31) // 32, 32, arguments)
        sums[:n] = found.get()

    @staticmethod
    def shard_first_crossings(rows: Any, indices: Any, inside: Any, found: np.ndarray) -> None:
        num_rows, width = _shard_rows(rows, "rows", ("float64",)), int(rows.shape[1])
        indices = _shard_indices(indices, num_rows, min(len(inside), len(found)),
                                 "shard_first_crossings")
        if width == 0:
            raise ValueError("shard_first_crossings: the rows hold no column")
        n = indices.size
        if n == 0:
            return
        columns = _device_empty(rows, n, np.int64)
        arguments = {
            **_indexed_rows(rows, width, indices),
            "inside": _shard_upload(np.asarray(inside)[:n], np.float64, rows), "found": columns,
        }
        _shard_launch("shard_first_crossings_kernel", (n + 31) // 32, 32, arguments)
        found[:n] = columns.get()

    @staticmethod
    def shard_residuals(rows: Any, indices: Any, scale: Any, q: Any) -> None:
        num_rows, width = _shard_rows(rows, "rows", ("float64",)), int(rows.shape[1])
        indices = _shard_indices(indices, num_rows, min(len(scale), int(q.shape[0])),
                                 "shard_residuals")
        _guard(q, "q", ("float64",), (None, width))
        if width == 0 or indices.size == 0:
            return
        arguments = {
            **_indexed_rows(rows, width, indices),
            "scale": _shard_upload(np.asarray(scale)[: indices.size], np.float64, rows), "q": q,
        }
        _shard_launch("shard_residuals_kernel", indices.size, BLOCK_SIZE, arguments)


#: The shard passes of ``specdec_np._sharded`` on CuPy rows, with ``specdec_np._core``'s
#: calling convention (per-row arguments and results on the host).
shard_like = _ShardKernels()
