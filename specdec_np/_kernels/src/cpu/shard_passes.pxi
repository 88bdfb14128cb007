# --------------------------------------------------------------------------------------
# A rank's passes over its slice of columns (verification across vocabulary shards,
# specdec_np._sharded): shardscan.h's statistics, weights and candidate scans on blocks
# of rows, one thread (the ranks of a machine share its cores).
# --------------------------------------------------------------------------------------

cdef extern from "shardscan.h" nogil:
    void specdec_shard_row_stats_f(
        const float* row, Py_ssize_t width, float temperature, Py_ssize_t groups,
        double* stats, float* group_max,
    )
    void specdec_shard_row_stats_d(
        const double* row, Py_ssize_t width, double temperature, Py_ssize_t groups,
        double* stats, double* group_max,
    )
    Py_ssize_t specdec_shard_at_least_f(
        const float* row, Py_ssize_t width, float temperature, float threshold,
        int64_t* columns, float* values,
    )
    Py_ssize_t specdec_shard_at_least_d(
        const double* row, Py_ssize_t width, double temperature, double threshold,
        int64_t* columns, double* values,
    )
    void specdec_shard_divided_f(
        const float* weights, Py_ssize_t width, double normaliser, double* out
    )
    void specdec_shard_divided_d(
        const double* weights, Py_ssize_t width, double normaliser, double* out
    )
    void specdec_shard_residual(double* row, const double* q, Py_ssize_t width, double scale)
    double specdec_shard_positive_sum(const double* row, Py_ssize_t width)
    Py_ssize_t specdec_shard_first_crossing(const double* row, Py_ssize_t width, double inside)
    void specdec_shard_exp_f(const float* x, const float* m, Py_ssize_t count, float* out)
    void specdec_shard_exp_d(const double* x, const double* m, Py_ssize_t count, double* out)
    double specdec_shard_weights_f(
        const float* row, Py_ssize_t width, float temperature, float z_max, float cutoff,
        float* weights,
    )
    double specdec_shard_weights_d(
        const double* row, Py_ssize_t width, double temperature, double z_max,
        double cutoff, double* weights,
    )


cdef void check_shard_rows(
    Py_ssize_t num_rows, const int64_t[::1] indices, Py_ssize_t per_row
) except *:
    """Raise unless every index names a row of the block and per-row arrays fit."""
    cdef Py_ssize_t i
    if per_row < indices.shape[0]:
        raise ValueError("shard pass: a per-row array is shorter than the row indices")
    for i in range(indices.shape[0]):
        if indices[i] < 0 or indices[i] >= num_rows:
            raise ValueError(
                f"shard pass: row index {indices[i]} is outside the block of {num_rows} rows"
            )


def shard_stats(
    const probability_t[:, ::1] rows,
    const probability_t[::1] temperature,
    Py_ssize_t groups,
    double[:, ::1] stats,
    probability_t[:, ::1] group_max,
):
    """Per row of a slice: the largest ``z = rows / temperature`` (NaN never), its count of
    ``+inf`` ``z`` and the largest finite logit (``stats[i]``, float64), and with ``groups``
    (0, or at most half the width) the largest logit of each set of columns ``g, g +
    groups, ...`` (``group_max[i]``, ``-inf`` where a set holds only NaN)."""
    cdef Py_ssize_t n = rows.shape[0], width = rows.shape[1], i
    if temperature.shape[0] < n or stats.shape[0] < n or stats.shape[1] != 3:
        raise ValueError("shard_stats: temperature [n] and stats [n, 3] must fit the rows")
    if groups < 0 or 2 * groups > width:
        raise ValueError(f"shard_stats: groups = {groups} must lie in 0 .. width / 2")
    if groups and (group_max.shape[0] < n or group_max.shape[1] != groups):
        raise ValueError("shard_stats: group_max must be [n, groups]")
    with nogil:
        for i in range(n):
            if probability_t is float:
                specdec_shard_row_stats_f(
                    &rows[i, 0] if width else NULL, width, temperature[i], groups,
                    &stats[i, 0], &group_max[i, 0] if groups else NULL,
                )
            else:
                specdec_shard_row_stats_d(
                    &rows[i, 0] if width else NULL, width, temperature[i], groups,
                    &stats[i, 0], &group_max[i, 0] if groups else NULL,
                )


def shard_weights(
    const probability_t[:, ::1] rows,
    const int64_t[::1] indices,
    const probability_t[::1] temperature,
    const probability_t[::1] z_max,
    const probability_t[::1] cutoff,
    probability_t[:, ::1] weights,
    double[::1] masses,
):
    """The weights' pass of rows ``indices`` of a slice: ``w = exp(z - z_max)`` over ``z >=
    cutoff`` (0 elsewhere, NaN never), written to ``weights[i]``, and their sum (the law's
    eight lanes) to ``masses[i]``."""
    cdef Py_ssize_t n = indices.shape[0], width = rows.shape[1], i
    check_shard_rows(rows.shape[0], indices, min(
        temperature.shape[0], z_max.shape[0], cutoff.shape[0], masses.shape[0]
    ))
    if width and (weights.shape[0] < n or weights.shape[1] != width):
        raise ValueError("shard_weights: weights must be [len(indices), width]")
    with nogil:
        for i in range(n):
            if width == 0:
                masses[i] = 0.0
            elif probability_t is float:
                masses[i] = specdec_shard_weights_f(
                    &rows[indices[i], 0], width, temperature[i], z_max[i], cutoff[i],
                    &weights[i, 0],
                )
            else:
                masses[i] = specdec_shard_weights_d(
                    &rows[indices[i], 0], width, temperature[i], z_max[i], cutoff[i],
                    &weights[i, 0],
                )


def shard_at_least(
    const probability_t[:, ::1] rows,
    const int64_t[::1] indices,
    const probability_t[::1] temperature,
    const probability_t[::1] thresholds,
    int64_t[::1] counts,
    int64_t[::1] columns,
    probability_t[::1] values,
):
    """The entries of rows ``indices`` of a slice whose ``z = rows / temperature`` reaches
    the row's threshold (NaN never): each row's count into ``counts[i]``, and the entries,
    row by row and column by column, their columns and ``z`` into ``columns`` and
    ``values`` while a row finds ``width + 1`` free places there (the pass writes an entry
    before the test that keeps it).  Returns ``(total, written)``: ``written`` is False
    when the places ran out (a call with ``total + width + 1`` of them writes all)."""
    cdef Py_ssize_t n = indices.shape[0], width = rows.shape[1], i, at = 0, found
    cdef Py_ssize_t capacity = min(columns.shape[0], values.shape[0])
    cdef bint written = True
    check_shard_rows(rows.shape[0], indices, min(
        temperature.shape[0], thresholds.shape[0], counts.shape[0]
    ))
    with nogil:
        for i in range(n):
            if width == 0:
                counts[i] = 0
                continue
            written = written and at + width + 1 <= capacity
            if probability_t is float:
                found = specdec_shard_at_least_f(
                    &rows[indices[i], 0], width, temperature[i], thresholds[i],
                    &columns[at] if written else NULL, &values[at] if written else NULL,
                )
            else:
                found = specdec_shard_at_least_d(
                    &rows[indices[i], 0], width, temperature[i], thresholds[i],
                    &columns[at] if written else NULL, &values[at] if written else NULL,
                )
            counts[i] = found
            at += found
    return at, written


def shard_exp(const probability_t[::1] x, const probability_t[::1] z_max,
              probability_t[::1] out):
    """``out = exp(x - z_max)`` by the law's rule (its float32 exponential for float32
    entries, ``exp`` for float64; 0 for NaN)."""
    cdef Py_ssize_t count = x.shape[0]
    if z_max.shape[0] != count or out.shape[0] != count:
        raise ValueError("shard_exp: x, z_max and out must have one length")
    if count == 0:
        return
    with nogil:
        if probability_t is float:
            specdec_shard_exp_f(&x[0], &z_max[0], count, &out[0])
        else:
            specdec_shard_exp_d(&x[0], &z_max[0], count, &out[0])


def shard_divided(
    const probability_t[:, ::1] weights,
    const int64_t[::1] indices,
    const double[::1] divisors,
    double[:, ::1] out,
    const int64_t[::1] out_rows,
):
    """``out[out_rows[i]] = weights[indices[i]] / divisors[i]``, each rounded to the
    weights' dtype as the kernels store a probability (float64 division, then the dtype),
    held in float64."""
    cdef Py_ssize_t n = indices.shape[0], width = weights.shape[1], i
    check_shard_rows(weights.shape[0], indices, divisors.shape[0])
    check_shard_rows(out.shape[0], out_rows, n)
    if out.shape[1] != width or out_rows.shape[0] != n:
        raise ValueError("shard_divided: out must be [*, width] with a row per index")
    if width == 0:
        return
    with nogil:
        for i in range(n):
            if probability_t is float:
                specdec_shard_divided_f(
                    &weights[indices[i], 0], width, divisors[i], &out[out_rows[i], 0]
                )
            else:
                specdec_shard_divided_d(
                    &weights[indices[i], 0], width, divisors[i], &out[out_rows[i], 0]
                )


def shard_positive_sums(const double[:, ::1] rows, double[::1] sums):
    """``sums[i]``: the sum of row ``i``'s positive entries (NaN and the rest weigh
    nothing), in the order NumPy sums a float64 row (pairwise)."""
    cdef Py_ssize_t n = rows.shape[0], width = rows.shape[1], i
    if sums.shape[0] < n:
        raise ValueError("shard_positive_sums: sums must have a value per row")
    with nogil:
        for i in range(n):
            sums[i] = specdec_shard_positive_sum(&rows[i, 0], width) if width else 0.0


def shard_first_crossings(
    const double[:, ::1] rows,
    const int64_t[::1] indices,
    const double[::1] inside,
    int64_t[::1] found,
):
    """``found[i]``: the column of the first positive entry of row ``indices[i]`` whose
    running sum (column order) exceeds ``inside[i]``; else its last positive entry; else
    its last column."""
    cdef Py_ssize_t n = indices.shape[0], width = rows.shape[1], i
    check_shard_rows(rows.shape[0], indices, min(inside.shape[0], found.shape[0]))
    if width == 0:
        raise ValueError("shard_first_crossings: the rows hold no column")
    with nogil:
        for i in range(n):
            found[i] = specdec_shard_first_crossing(&rows[indices[i], 0], width, inside[i])


def shard_residuals(
    double[:, ::1] rows,
    const int64_t[::1] indices,
    const double[::1] scale,
    const double[:, ::1] q,
):
    """In place, row ``indices[i]`` becomes ``max(scale[i] * row - q[i], 0)`` (a rejected
    draw's residual; NaN stays NaN)."""
    cdef Py_ssize_t n = indices.shape[0], width = rows.shape[1], i
    check_shard_rows(rows.shape[0], indices, min(scale.shape[0], q.shape[0]))
    if q.shape[1] != width:
        raise ValueError("shard_residuals: q must have the rows' width")
    if width == 0:
        return
    with nogil:
        for i in range(n):
            specdec_shard_residual(&rows[indices[i], 0], &q[i, 0], width, scale[i])


def shard_argmax(const probability_t[:, ::1] rows, Py_ssize_t start, double[:, ::1] table):
    """Per row (the greedy rows of the maxima round): ``table[i] = (largest value, start +
    the first column holding it)``, NaN never the largest (``-inf`` and column 0 for a row
    with nothing above ``-inf``): the unsharded greedy argmax (``specdec_row_argmax``)."""
    cdef Py_ssize_t n = rows.shape[0], width = rows.shape[1], i, first
    cdef double value
    if table.shape[0] < n or table.shape[1] != 2:
        raise ValueError("shard_argmax: table must be [n, 2]")
    if width == 0:
        raise ValueError("shard_argmax: the rows hold no column")
    with nogil:
        for i in range(n):
            if probability_t is float:
                first = specdec_row_argmax_f(&rows[i, 0], width)
            else:
                first = specdec_row_argmax_d(&rows[i, 0], width)
            value = rows[i, first]
            table[i, 0] = value if value == value else -INFINITY
            table[i, 1] = <double>(start + first)
