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


# --------------------------------------------------------------------------------------
# The host side of the filters' rounds (specdec_np._sharded.filters and .rows): the
# order-preserving keys of float values and back, the merge of the ranks' candidate lists
# and top-k's floor in them.  Bit and integer work only: each gives the NumPy
# expressions' own arrays (those are the tests' oracles), in one call instead of a few
# dozen small NumPy operations a step.
# --------------------------------------------------------------------------------------

# The sign bits of a float32's and a float64's bits, and a float32's bits all set.
cdef uint64_t _SIGN_32 = (<uint64_t>1) << 31
cdef uint64_t _LOW_32 = ((<uint64_t>1) << 32) - 1
cdef uint64_t _SIGN_64 = (<uint64_t>1) << 63


ctypedef struct _ListEntry:
    uint64_t key
    int64_t count
    Py_ssize_t index


cdef int _descending_entries(const void* a, const void* b) noexcept nogil:
    """Keys descending, and equal keys by descending index: NumPy's stable ascending
    argsort, reversed (a total order, so any sort gives the same sequence)."""
    cdef const _ListEntry* x = <const _ListEntry*>a
    cdef const _ListEntry* y = <const _ListEntry*>b
    if x.key != y.key:
        return -1 if x.key > y.key else 1
    if x.index != y.index:
        return -1 if x.index > y.index else 1
    return 0


cdef inline uint64_t _key_of_float(float value) noexcept nogil:
    """The key of a float32 (``-0`` as ``+0``)."""
    cdef uint32_t bits32
    cdef uint64_t bits
    if value == 0:
        value = 0  # -0 is +0
    memcpy(&bits32, &value, 4)
    bits = bits32
    return (_LOW_32 ^ bits) if bits & _SIGN_32 else (bits | _SIGN_32)


cdef inline uint64_t _key_of_double(double value) noexcept nogil:
    """The key of a float64 (``-0`` as ``+0``)."""
    cdef uint64_t bits
    if value == 0:
        value = 0
    memcpy(&bits, &value, 8)
    return (~bits) if bits & _SIGN_64 else (bits | _SIGN_64)


cdef inline float _float_of_key(uint64_t key) noexcept nogil:
    """The float32 of a key (its low 32 bits)."""
    cdef uint32_t bits32 = <uint32_t>((key ^ _SIGN_32) if key & _SIGN_32 else (_LOW_32 ^ key))
    cdef float value
    memcpy(&value, &bits32, 4)
    return value


cdef inline double _double_of_key(uint64_t key) noexcept nogil:
    """The float64 of a key."""
    cdef uint64_t bits = (key ^ _SIGN_64) if key & _SIGN_64 else (~key)
    cdef double value
    memcpy(&value, &bits, 8)
    return value


def float_keys(const probability_t[::1] values, uint64_t[::1] keys):
    """``keys[i]``: the uint64 key of ``values[i]`` (no NaN) in the order of the values,
    ``-0`` and ``+0`` one key: the float's bits with negative values flipped whole and
    positive ones lifted by the sign bit."""
    cdef Py_ssize_t n = values.shape[0], i
    if keys.shape[0] != n:
        raise ValueError("float_keys: values and keys must have one length")
    with nogil:
        for i in range(n):
            if probability_t is float:
                keys[i] = _key_of_float(values[i])
            else:
                keys[i] = _key_of_double(values[i])


def key_floats(const uint64_t[::1] keys, probability_t[::1] values):
    """``values[i]``: the float whose :func:`float_keys` key is ``keys[i]`` (the key of
    ``-0`` gives ``+0``; a float32 key is read from its low 32 bits)."""
    cdef Py_ssize_t n = keys.shape[0], i
    if values.shape[0] != n:
        raise ValueError("key_floats: keys and values must have one length")
    with nogil:
        for i in range(n):
            if probability_t is float:
                values[i] = _float_of_key(keys[i])
            else:
                values[i] = _double_of_key(keys[i])


ctypedef fused list_word_t:
    uint32_t
    uint64_t


cdef int _descending_keys(const void* a, const void* b) noexcept nogil:
    cdef uint64_t x = (<const uint64_t*>a)[0], y = (<const uint64_t*>b)[0]
    return -1 if x > y else (1 if x < y else 0)


cdef void _sort_descending(uint64_t* keys, Py_ssize_t n) noexcept nogil:
    """``keys[0 .. n)`` in descending order.  A row gathers about ``size`` candidates
    (``8 size`` column sets' maxima bound them), which an insertion sort orders without the
    C library's call of a comparison per step; longer runs go to ``qsort``.  Equal keys
    are one value, so either gives the same sequence."""
    cdef Py_ssize_t i, j
    cdef uint64_t key
    if n > 256:
        qsort(keys, n, sizeof(uint64_t), _descending_keys)
        return
    for i in range(1, n):
        key = keys[i]
        j = i
        while j > 0 and keys[j - 1] < key:
            keys[j] = keys[j - 1]
            j -= 1
        keys[j] = key


def list_record(
    const int64_t[::1] row_of,
    const probability_t[::1] values,
    Py_ssize_t size,
    list_word_t[:, ::1] record,
):
    """A rank's candidate lists from its candidates (entry ``e`` of row ``row_of[e]``, of
    value ``values[e]``, no NaN): per row ``i`` the ``size`` largest keys of its entries,
    descending, into ``record[i, :size]`` (the rest left as they are: zeros), then into
    ``record[i, size]`` the count of its entries at or above the last key where it has
    ``size`` or more, else its count."""
    cdef Py_ssize_t count = record.shape[0], entries = row_of.shape[0], e, i, j
    cdef Py_ssize_t sent, start, length, at_or_above
    cdef Py_ssize_t* firsts
    cdef uint64_t* keys
    cdef uint64_t last
    if values.shape[0] != entries:
        raise ValueError("list_record: row_of and values must have one length")
    if size < 1 or record.shape[1] < size + 1:
        raise ValueError("list_record: record must be [n, size + 1 + ...], size >= 1")
    for e in range(entries):
        if row_of[e] < 0 or row_of[e] >= count:
            raise ValueError(f"list_record: row {row_of[e]} is outside the {count} rows")
    firsts = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    keys = <uint64_t*>malloc(max(entries, 1) * sizeof(uint64_t))
    if firsts == NULL or keys == NULL:
        free(firsts)
        free(keys)
        raise MemoryError("list_record: no memory for the rows' keys")
    with nogil:
        # The entries bucketed by row (a counting sort), each row's keys sorted descending.
        for i in range(count + 1):
            firsts[i] = 0
        for e in range(entries):
            firsts[row_of[e] + 1] += 1
        for i in range(count):
            firsts[i + 1] += firsts[i]
        for e in range(entries):
            i = row_of[e]
            if probability_t is float:
                keys[firsts[i]] = _key_of_float(values[e])
            else:
                keys[firsts[i]] = _key_of_double(values[e])
            firsts[i] += 1
        for i in range(count - 1, -1, -1):
            firsts[i + 1] = firsts[i]
        firsts[0] = 0
        for i in range(count):
            start = firsts[i]
            length = firsts[i + 1] - start
            _sort_descending(&keys[start], length)
            sent = length if length < size else size
            for j in range(sent):
                record[i, j] = <list_word_t>keys[start + j]
            if sent == size:
                last = keys[start + size - 1]
                at_or_above = size
                while at_or_above < length and keys[start + at_or_above] >= last:
                    at_or_above += 1
                record[i, size] = <list_word_t>at_or_above
            else:
                record[i, size] = <list_word_t>sent
    free(firsts)
    free(keys)


def merge_shard_lists(
    const uint64_t[:, :, ::1] gathered,
    Py_ssize_t size,
    uint64_t[:, ::1] keys,
    int64_t[:, ::1] counts,
    uint64_t[::1] known,
):
    """The ranks' candidate lists ``gathered[r, i] = (size keys descending, 0 for none;
    the count at or above the last key)`` merged per row ``i``: ``S size + S`` keys
    descending with their multiplicities into ``keys[i]`` and ``counts[i]`` (a full list's
    ties at its last key beyond the one sent as one more entry, after the lists' own
    entries), and the largest last key of a full list into ``known[i]`` (0: none)."""
    cdef Py_ssize_t ranks = gathered.shape[0], n = gathered.shape[1]
    cdef Py_ssize_t length = ranks * size + ranks, i, r, j, sent, place
    cdef uint64_t last, row_known
    cdef int64_t extra
    cdef _ListEntry* entries
    cdef Py_ssize_t* heads
    cdef bint* pending
    if size < 1 or gathered.shape[2] != size + 1:
        raise ValueError("merge_shard_lists: gathered must be [S, n, size + 1], size >= 1")
    if keys.shape[0] < n or counts.shape[0] < n or known.shape[0] < n or (
        keys.shape[1] != length or counts.shape[1] != length
    ):
        raise ValueError("merge_shard_lists: keys and counts must be [n, S size + S]")
    entries = <_ListEntry*>malloc(max(length, 1) * sizeof(_ListEntry))
    heads = <Py_ssize_t*>malloc(max(ranks, 1) * sizeof(Py_ssize_t))
    pending = <bint*>malloc(max(ranks, 1) * sizeof(bint))
    if entries == NULL or heads == NULL or pending == NULL:
        free(entries)
        free(heads)
        free(pending)
        raise MemoryError("merge_shard_lists: no memory for a row's entries")
    with nogil:
        for i in range(n):
            row_known = 0
            for r in range(ranks):
                sent = 0
                for j in range(size):
                    if gathered[r, i, j] != 0:
                        sent += 1
                last = gathered[r, i, sent - 1] if sent > 0 else 0
                extra = <int64_t>gathered[r, i, size] - size if sent == size else 0
                if sent == size and last > row_known:
                    row_known = last
                for j in range(size):
                    place = r * size + j
                    entries[place].key = gathered[r, i, j]
                    entries[place].count = 1 if gathered[r, i, j] > 0 else 0
                    entries[place].index = place
                place = ranks * size + r
                entries[place].key = last if extra > 0 else 0
                entries[place].count = extra if extra > 0 else 0
                entries[place].index = place
            if _lists_descend(gathered, i, ranks, size):
                _merge_descending(entries, ranks, size, heads, pending, &keys[i, 0],
                                  &counts[i, 0])
            else:
                qsort(entries, length, sizeof(_ListEntry), _descending_entries)
                for j in range(length):
                    keys[i, j] = entries[j].key
                    counts[i, j] = entries[j].count
            known[i] = row_known
    free(entries)
    free(heads)
    free(pending)


cdef bint _lists_descend(
    const uint64_t[:, :, ::1] gathered, Py_ssize_t i, Py_ssize_t ranks, Py_ssize_t size
) noexcept nogil:
    """Whether every rank's list of row ``i`` is non-increasing (as a rank sends it)."""
    cdef Py_ssize_t r, j
    for r in range(ranks):
        for j in range(1, size):
            if gathered[r, i, j] > gathered[r, i, j - 1]:
                return False
    return True


cdef void _merge_descending(
    const _ListEntry* entries, Py_ssize_t ranks, Py_ssize_t size, Py_ssize_t* heads,
    bint* pending, uint64_t* keys, int64_t* counts,
) noexcept nogil:
    """The order of :func:`_descending_entries` (keys descending, equal keys by
    descending index) of non-increasing lists, merged: per key from the largest, the
    extra entries (the highest indices) by descending rank, then each rank's run of that
    key, from the last rank, each run backwards.  ``heads`` and ``pending`` are the
    caller's ``ranks`` entries of working memory."""
    cdef Py_ssize_t out = 0, r, j, end, length = ranks * size + ranks
    cdef uint64_t key
    cdef bint found
    for r in range(ranks):
        heads[r] = 0
        pending[r] = True
    while out < length:
        found = False
        key = 0
        for r in range(ranks):
            if heads[r] < size and (not found or entries[r * size + heads[r]].key > key):
                key = entries[r * size + heads[r]].key
                found = True
            if pending[r] and (not found or entries[ranks * size + r].key > key):
                key = entries[ranks * size + r].key
                found = True
        for r in range(ranks - 1, -1, -1):
            if pending[r] and entries[ranks * size + r].key == key:
                keys[out] = key
                counts[out] = entries[ranks * size + r].count
                out += 1
                pending[r] = False
        for r in range(ranks - 1, -1, -1):
            end = heads[r]
            while end < size and entries[r * size + end].key == key:
                end += 1
            for j in range(end - 1, heads[r] - 1, -1):
                keys[out] = key
                counts[out] = entries[r * size + j].count
                out += 1
            heads[r] = end


def top_k_keys(
    const uint64_t[:, ::1] keys,
    const int64_t[:, ::1] counts,
    const int64_t[::1] top_k,
    const uint8_t[::1] on,
    uint64_t[::1] floors,
):
    """Top-k's floor per row of merged lists (:func:`merge_shard_lists`): the key at
    which the running count first reaches ``top_k[i]``, where ``on[i]``; 0 where the
    lists hold fewer entries (top-k then keeps them all) or ``on[i]`` is 0."""
    cdef Py_ssize_t n = keys.shape[0], length = keys.shape[1], i, j
    cdef int64_t running
    if counts.shape[0] != n or counts.shape[1] != length or top_k.shape[0] < n or (
        on.shape[0] < n or floors.shape[0] < n
    ):
        raise ValueError("top_k_keys: counts [n, L], top_k, on and floors [n] must fit")
    with nogil:
        for i in range(n):
            floors[i] = 0
            if not on[i]:
                continue
            running = 0
            for j in range(length):
                running += counts[i, j]
                if running >= top_k[i]:
                    floors[i] = keys[i, j]
                    break


def min_p_keys(
    const probability_t[::1] top,
    const double[::1] min_p,
    const double[::1] log_min_p,
    uint64_t[::1] floors,
    uint8_t[::1] lost,
):
    """Min-p's floor per row: the first key of the window of ``17`` keys around the
    estimate ``top + log(min_p)`` (rounded to the rows' dtype; ``top`` where that is NaN,
    kept between the key of ``-inf`` plus 9 and ``top``'s key; each key at most ``top``'s)
    whose law weight ``exp(value - top)`` (float64) reaches ``min_p``; else the window's
    first key.  ``lost[i]`` is 1 where the window may miss the crossing (no key reached,
    or its first key did and is above the first key past ``-inf``): the bisection then
    decides those rows."""
    cdef Py_ssize_t n = top.shape[0], i, t, first
    cdef uint64_t low_key, high, centre, key, first_key
    cdef probability_t value, weight, top_value, estimate
    if min_p.shape[0] < n or log_min_p.shape[0] < n or floors.shape[0] < n or (
        lost.shape[0] < n
    ):
        raise ValueError("min_p_keys: min_p, log_min_p, floors and lost must fit top")
    with nogil:
        if probability_t is float:
            low_key = _key_of_float(-INFINITY)
        else:
            low_key = _key_of_double(-INFINITY)
        for i in range(n):
            top_value = top[i]
            estimate = <probability_t>(<double>top_value + log_min_p[i])
            if estimate != estimate:
                estimate = top_value
            if probability_t is float:
                high = _key_of_float(top_value)
                centre = _key_of_float(estimate)
            else:
                high = _key_of_double(top_value)
                centre = _key_of_double(estimate)
            if centre < low_key + 9:
                centre = low_key + 9
            if centre > high:
                centre = high
            first = -1
            first_key = centre - 8 if centre - 8 < high else high
            floors[i] = first_key
            for t in range(17):
                key = centre - 8 + t
                if key > high:
                    key = high
                if probability_t is float:
                    value = _float_of_key(key)
                    specdec_shard_exp_f(&value, &top_value, 1, &weight)
                else:
                    value = _double_of_key(key)
                    specdec_shard_exp_d(&value, &top_value, 1, &weight)
                if <double>weight >= min_p[i]:
                    first = t
                    floors[i] = key
                    break
            lost[i] = first < 0 or (first == 0 and first_key > low_key + 1)


def top_p_keys(
    const uint64_t[:, ::1] keys,
    const int64_t[:, ::1] counts,
    const uint64_t[::1] known,
    const uint64_t[::1] floors,
    const probability_t[::1] top,
    const double[::1] top_p,
    const double[::1] masses,
    uint64_t[::1] cutoffs,
    uint8_t[::1] open_rows,
):
    """Top-p's cutoff per row of merged lists (:func:`merge_shard_lists`): over the
    entries at or above ``floors[i]``, each weighing ``exp(value - top) * count``
    (float64), the first key from the top, at or above ``known[i]``, whose running mass
    (column order) reaches ``top_p[i]`` of the whole with mass there, else the last key
    with mass (the last key where none has any).  The whole is the entries' mass (NumPy's
    pairwise order) where they hold every entry at or above the floor (``floors[i] >=
    known[i]``), else ``masses[i]``.  ``open_rows[i]`` is 1 (``cutoffs[i]`` 0) where the
    lists do not settle it."""
    cdef Py_ssize_t n = keys.shape[0], length = keys.shape[1], i, j, first, last
    cdef double total, goal, running
    cdef double* mass
    cdef probability_t value, weight, top_value
    cdef bint whole
    if counts.shape[0] != n or counts.shape[1] != length or known.shape[0] < n or (
        floors.shape[0] < n or top.shape[0] < n or top_p.shape[0] < n
        or masses.shape[0] < n or cutoffs.shape[0] < n or open_rows.shape[0] < n
    ):
        raise ValueError("top_p_keys: counts [n, L] and the per-row arrays [n] must fit")
    if length == 0:
        raise ValueError("top_p_keys: the merged lists hold no place")
    mass = <double*>malloc(length * sizeof(double))
    if mass == NULL:
        raise MemoryError("top_p_keys: no memory for a row's masses")
    with nogil:
        for i in range(n):
            top_value = top[i]
            for j in range(length):
                mass[j] = 0.0
                if keys[i, j] >= floors[i] and counts[i, j] > 0:
                    if probability_t is float:
                        value = _float_of_key(keys[i, j])
                        specdec_shard_exp_f(&value, &top_value, 1, &weight)
                    else:
                        value = _double_of_key(keys[i, j])
                        specdec_shard_exp_d(&value, &top_value, 1, &weight)
                    mass[j] = <double>weight * <double>counts[i, j]
            whole = floors[i] >= known[i]
            total = specdec_shard_positive_sum(mass, length) if whole else masses[i]
            goal = top_p[i] * total
            running = 0.0
            first = -1
            last = length - 1
            for j in range(length):
                running = mass[j] if j == 0 else running + mass[j]
                if mass[j] > 0.0:
                    if first < 0 and running >= goal and keys[i, j] >= known[i]:
                        first = j
            for j in range(length - 1, -1, -1):
                if mass[j] > 0.0:
                    last = j
                    break
            open_rows[i] = first < 0 and not whole
            cutoffs[i] = 0 if open_rows[i] else keys[i, first if first >= 0 else last]
    free(mass)


def rejection_lengths(
    const int64_t[::1] sampled,
    const int64_t[::1] counts,
    const int64_t[::1] first_target,
    const int64_t[::1] target_at,
    const int64_t[::1] offsets,
    const int64_t[::1] draft_at,
    const int64_t[::1] draft_ids,
    const double[::1] value,
    const double[:, ::1] uniforms,
    bint drafts,
    int64_t[:, ::1] output,
    int64_t[::1] lengths,
):
    """Rejection sampling's decisions of the sampled requests ``sampled`` from the
    gathered probabilities ``value`` (of the rows read: target row ``t`` at
    ``target_at[t]``, draft row ``d`` at ``draft_at[d]``; a point-mass draft's ``q`` is 1
    where ``drafts`` is False): request ``b`` accepts its drafts while ``u[b, i] * q < p``
    (NaN rejects), the accepted ids into ``output[b, :r]`` and ``r`` into
    ``lengths[b]``."""
    cdef Py_ssize_t n = sampled.shape[0], batch = counts.shape[0], i, b, r, k, t, d
    cdef double p, q
    if first_target.shape[0] < batch or offsets.shape[0] < batch + 1 or (
        lengths.shape[0] < batch or output.shape[0] < batch or uniforms.shape[0] < batch
    ):
        raise ValueError("rejection_lengths: the per-request arrays must fit counts")
    for i in range(n):
        b = sampled[i]
        if b < 0 or b >= batch:
            raise ValueError(f"rejection_lengths: request {b} is outside the batch")
        k = counts[b]
        if k < 0 or k > output.shape[1] or k > uniforms.shape[1] or (
            offsets[b] < 0 or offsets[b] + k > draft_ids.shape[0]
            or (drafts and offsets[b] + k > draft_at.shape[0])
            or first_target[b] < 0 or first_target[b] + k > target_at.shape[0]
        ):
            raise ValueError(f"rejection_lengths: request {b}'s rows do not fit")
        for r in range(k):
            t = target_at[first_target[b] + r]
            d = draft_at[offsets[b] + r] if drafts else 0
            if t < 0 or t >= value.shape[0] or d < 0 or d >= value.shape[0]:
                raise ValueError(f"rejection_lengths: request {b} reads a row not gathered")
    with nogil:
        for i in range(n):
            b = sampled[i]
            k = counts[b]
            r = k
            for t in range(k):
                p = value[target_at[first_target[b] + t]]
                q = value[draft_at[offsets[b] + t]] if drafts else 1.0
                if not (uniforms[b, t] * q < p):
                    r = t
                    break
                output[b, t] = draft_ids[offsets[b] + t]
            lengths[b] = r


def draw_shards(
    const double[:, ::1] masses,
    const int64_t[::1] order,
    const double[::1] v,
    Py_ssize_t rank,
    int64_t[::1] position,
    double[::1] inside,
    uint8_t[::1] empty,
    uint8_t[::1] mine,
):
    """The first level of the draws, given each shard's mass ``masses[s, d]`` with the
    shards in vocabulary order (rank ``order[s]``): the shard whose running mass (in that
    order, the cumulative sum's bits) first exceeds ``v[d]`` times the whole, with mass
    there, else the last shard with mass, else the last (``position[d]``, its place in
    that order); the part of ``v[d]`` times the whole left inside it (``inside[d]``); no
    mass at all (``empty[d]``); and whether the shard is ``rank``'s (``mine[d]``, never
    where empty)."""
    cdef Py_ssize_t ranks = masses.shape[0], count = masses.shape[1], d, s, found
    cdef double running, before, threshold, chosen
    if ranks < 1 or order.shape[0] != ranks:
        raise ValueError("draw_shards: masses must be [S >= 1, D] with an order of S")
    for s in range(ranks):
        if order[s] < 0 or order[s] >= ranks:
            raise ValueError(f"draw_shards: rank {order[s]} is outside the {ranks} ranks")
    if v.shape[0] < count or position.shape[0] < count or inside.shape[0] < count or (
        empty.shape[0] < count or mine.shape[0] < count
    ):
        raise ValueError("draw_shards: the per-draw arrays must fit the masses")
    with nogil:
        for d in range(count):
            running = 0.0
            for s in range(ranks):
                running = masses[s, d] if s == 0 else running + masses[s, d]
            empty[d] = not (running > 0.0)
            threshold = v[d] * running
            found = -1
            running = 0.0
            before = 0.0
            for s in range(ranks):
                chosen = masses[s, d]
                before = running
                running = chosen if s == 0 else running + chosen
                if chosen > 0.0 and running > threshold:
                    found = s
                    break
            if found < 0:
                found = ranks - 1
                for s in range(ranks - 1, -1, -1):
                    if masses[s, d] > 0.0:
                        found = s
                        break
                # The running mass before that shard, as the cumulative sum holds it.
                running = 0.0
                before = 0.0
                for s in range(found + 1):
                    before = running
                    running = masses[s, d] if s == 0 else running + masses[s, d]
            position[d] = found
            inside[d] = threshold - before
            mine[d] = order[found] == rank and not empty[d]


def dense_draw_rows(
    const probability_t[:, ::1] weights,
    const int64_t[::1] p_rows,
    const double[::1] p_masses,
    const int64_t[::1] q_rows,
    const double[::1] q_masses,
    const double[::1] scale,
    double[:, ::1] p_out,
    double[:, ::1] residual_out,
    double[:, ::1] masses,
):
    """The draws' rows of rows without a filter, in one call: ``p_out[d]`` the stored
    probabilities of weights row ``p_rows[d]`` of whole mass ``p_masses[d]``
    (:func:`shard_divided` by the mass, by ``inf`` where it is not positive);
    ``residual_out[d]`` that row, or where ``q_rows[d] >= 0`` the residual ``max(scale[d]
    p - q, 0)`` with ``q`` weights row ``q_rows[d]`` of mass ``q_masses[d]`` divided the
    same way (:func:`shard_residuals`); ``masses[d]`` the residual's and ``p``'s positive
    sums (:func:`shard_positive_sums`)."""
    cdef Py_ssize_t n = p_rows.shape[0], width = weights.shape[1], d
    cdef double* q
    cdef double divisor
    if width == 0:
        raise ValueError("dense_draw_rows: the rows hold no column")
    for d in range(n):
        if p_rows[d] < 0 or p_rows[d] >= weights.shape[0] or q_rows[d] >= weights.shape[0]:
            raise ValueError(f"dense_draw_rows: row {d}'s weights row is outside the block")
    if p_masses.shape[0] < n or q_rows.shape[0] < n or q_masses.shape[0] < n or (
        scale.shape[0] < n or p_out.shape[0] < n or residual_out.shape[0] < n
        or masses.shape[0] < n or masses.shape[1] != 2
        or p_out.shape[1] != width or residual_out.shape[1] != width
    ):
        raise ValueError("dense_draw_rows: the per-draw arrays must fit the rows")
    q = <double*>malloc(width * sizeof(double))
    if q == NULL:
        raise MemoryError("dense_draw_rows: no memory for a draft row")
    with nogil:
        for d in range(n):
            divisor = p_masses[d] if p_masses[d] > 0.0 else INFINITY
            if probability_t is float:
                specdec_shard_divided_f(&weights[p_rows[d], 0], width, divisor, &p_out[d, 0])
            else:
                specdec_shard_divided_d(&weights[p_rows[d], 0], width, divisor, &p_out[d, 0])
            memcpy(&residual_out[d, 0], &p_out[d, 0], width * sizeof(double))
            if q_rows[d] >= 0:
                divisor = q_masses[d] if q_masses[d] > 0.0 else INFINITY
                if probability_t is float:
                    specdec_shard_divided_f(&weights[q_rows[d], 0], width, divisor, q)
                else:
                    specdec_shard_divided_d(&weights[q_rows[d], 0], width, divisor, q)
                specdec_shard_residual(&residual_out[d, 0], q, width, scale[d])
            masses[d, 0] = specdec_shard_positive_sum(&residual_out[d, 0], width)
            masses[d, 1] = specdec_shard_positive_sum(&p_out[d, 0], width)
    free(q)
