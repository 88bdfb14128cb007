# --------------------------------------------------------------------------------------
# Direct calls: the chain driver and the ragged layout's checks on NumPy arrays read
# through NumPy's own C structures.  Taking a typed memoryview costs about half a
# microsecond (a buffer request, a format check, a memoryview object), so a kernel call
# that takes fifteen arrays pays several microseconds before it reads a row: most of a
# small batch's kernel call.  These entries check what a memoryview would (dimensions,
# kind and size of the items, native byte order, C-contiguity, writeability of what they
# write) on the array itself (take_array, argument_checks.pxi), then run the same code as
# the memoryview entries.
# --------------------------------------------------------------------------------------

def verify_chains_direct(
    int method,
    object target_rows,
    object draft_rows,
    bint point_mass_drafts,
    object draft_token_ids,
    object bonus_token_ids,
    object draft_offsets,
    object uniforms,
    object parameters,
    object output,
    object accepted_lengths,
    object num_accepted,
    object row_status,
    int num_threads,
    object request_methods=None,
    bint causal=False,
    bint draw_bonus=False,
    object sampling=None,
    object scratch=None,
    bint target_logits=True,
    bint draft_logits=True,
    bint bonus_rows=True,
    int row_threads=1,
    bint finds_overflow=False,
    object target_adjustments=None,
    object draft_adjustments=None,
    object adjusted_rows=None,
):
    """:func:`verify_chains` on NumPy arrays taken directly (no typed memoryviews): the
    same arguments, checks, results and row statuses, microseconds sooner.

    Parameters
    ----------
    method, target_rows, draft_rows, point_mass_drafts, draft_token_ids, bonus_token_ids, \
draft_offsets, uniforms, parameters, output, accepted_lengths, num_accepted, row_status, \
num_threads, request_methods, causal, draw_bonus, sampling, scratch, target_logits, \
draft_logits, bonus_rows, row_threads, finds_overflow
        As :func:`verify_chains` takes them; every array a NumPy array (float32 or float64
        rows, one dtype; int32 or int64 ids, one dtype; int64 offsets and outputs; float64
        uniforms, parameters and sampling table; int8 ``request_methods``).
    target_adjustments, draft_adjustments : tuple, optional
        The sampling surface's adjustments of the target and draft logits rows
        (``specdec_np._layouts.row_adjustments.RowAdjustments``), applied where a row is read:
        ``(bitmask, offsets, ids, values)``: ``bitmask`` int32 ``[rows, ceil(V / 32)]``
        or None (bit ``j`` of word ``w`` allows token ``32 w + j``; a clear bit makes the
        entry -inf), then per row ``r`` the entries ``ids[offsets[r] .. offsets[r + 1]]``
        set to ``values`` (int64 ``offsets [rows + 1]`` from 0, int64 ids in ``[0, V)``,
        values of the rows' dtype; None offsets: none).  Only with ``sampling``, and
        only for rows that are logits.
    adjusted_rows : same dtype as the rows [num_threads, 2 * V], optional
        Working rows for the adjustments (a thread's adjusted target and draft row);
        required with them.

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1 if every request verified.

    Raises
    ------
    TypeError
        For an argument that is not a NumPy array.
    ValueError
        For an array of the wrong kind, size, dimensions, byte order or layout, a
        read-only output, and what :func:`verify_chains` refuses.
    RuntimeError
        When the row functions were never bound (:func:`bind_chain_rows`).
    """
    cdef ArrayView target, draft, ids, bonus, offsets, uniform_view, parameter_view
    cdef ArrayView out, accepted, counted, status, codes, table, working
    cdef ChainCall call
    cdef RowAdjust target_adjust, draft_adjust
    cdef void* scratch_data = NULL
    cdef void* target_data
    cdef void* draft_data
    cdef void* ids_data
    take_array(target_rows, "target_rows", 2, FLOAT_ITEMS, 0, False, &target)
    take_array(draft_rows, "draft_rows", 2, FLOAT_ITEMS, target.itemsize, False, &draft)
    take_array(draft_token_ids, "draft_token_ids", 1, SIGNED_ITEMS, 0, False, &ids)
    take_array(bonus_token_ids, "bonus_token_ids", 1, SIGNED_ITEMS, ids.itemsize, False, &bonus)
    take_array(draft_offsets, "draft_offsets", 1, SIGNED_ITEMS, 8, False, &offsets)
    take_array(uniforms, "uniforms", 2, FLOAT_ITEMS, 8, False, &uniform_view)
    take_array(parameters, "parameters", 1, FLOAT_ITEMS, 8, False, &parameter_view)
    take_array(output, "output", 2, SIGNED_ITEMS, 8, True, &out)
    take_array(accepted_lengths, "accepted_lengths", 1, SIGNED_ITEMS, 8, True, &accepted)
    take_array(num_accepted, "num_accepted", 1, SIGNED_ITEMS, 8, True, &counted)
    take_array(row_status, "row_status", 1, SIGNED_ITEMS, 8, True, &status)
    call.method = method
    call.B = offsets.rows - 1
    call.V = target.columns
    call.T = ids.rows
    call.target_count = target.rows
    call.point_mass_drafts = point_mass_drafts
    call.draft_count = draft.rows
    call.draft_width = draft.columns
    call.bonus_count = bonus.rows
    call.offsets = <const int64_t*>offsets.data
    call.offset_count = offsets.rows
    call.uniform_count = uniform_view.rows
    call.uniform_width = uniform_view.columns
    call.parameter_count = parameter_view.rows
    call.output_count = out.rows
    call.width = out.columns
    call.accepted_count = accepted.rows
    call.num_accepted_count = counted.rows
    call.status_count = status.rows
    call.per_request = request_methods is not None
    call.request_methods = NULL
    call.request_method_count = 0
    if call.per_request:
        take_array(request_methods, "request_methods", 1, SIGNED_ITEMS, 1, False, &codes)
        call.request_methods = <const int8_t*>codes.data
        call.request_method_count = codes.rows
    call.causal = causal
    call.draw_bonus = draw_bonus
    call.bonus_rows = bonus_rows
    call.has_sampling = sampling is not None
    call.sampling_count = 0
    call.sampling_width = 0
    call.sampling = NULL
    if call.has_sampling:
        take_array(sampling, "sampling", 2, FLOAT_ITEMS, 8, False, &table)
        call.sampling_count = table.rows
        call.sampling_width = table.columns
        call.sampling = <const double*>table.data
    call.has_scratch = scratch is not None
    call.scratch_count = 0
    call.scratch_width = 0
    if call.has_scratch:
        take_array(scratch, "scratch", 2, FLOAT_ITEMS, target.itemsize, True, &working)
        call.scratch_count = working.rows
        call.scratch_width = working.columns
        if call.has_sampling:
            scratch_data = working.data
    call.target_logits = target_logits
    call.draft_logits = draft_logits
    call.num_threads = num_threads
    call.row_threads = row_threads
    call.finds_overflow = finds_overflow
    call.target_adjust = NULL
    call.draft_adjust = NULL
    call.adjusted = NULL
    check_chain_call(&call)
    if target_adjustments is not None or draft_adjustments is not None:
        require(call.has_sampling, "row adjustments need logits rows (sampling)")
        take_array(adjusted_rows, "adjusted_rows", 2, FLOAT_ITEMS, target.itemsize, True, &working)
        require(
            working.rows >= (num_threads if num_threads > 1 else 1)
            and working.columns == 2 * call.V,
            "adjusted_rows must be [num_threads, 2 V]",
        )
        call.adjusted = working.data
        if target_adjustments is not None and call.target_logits:
            take_adjustments(
                target_adjustments, "target_adjustments", call.target_count, call.V,
                target.itemsize, &target_adjust,
            )
            call.target_adjust = &target_adjust
        if draft_adjustments is not None and call.draft_logits and not point_mass_drafts:
            take_adjustments(
                draft_adjustments, "draft_adjustments", call.draft_count, call.V,
                target.itemsize, &draft_adjust,
            )
            call.draft_adjust = &draft_adjust
    if call.B == 0:
        return -1
    call.uniforms = <const double*>uniform_view.data if call.stochastic else NULL
    call.parameters = <const double*>parameter_view.data if call.parameter_count > 0 else NULL
    call.output = <int64_t*>out.data
    call.accepted_lengths = <int64_t*>accepted.data
    call.num_accepted = <int64_t*>counted.data
    call.row_status = <int64_t*>status.data
    target_data = target.data if target.rows > 0 else NULL
    draft_data = NULL if point_mass_drafts or call.T == 0 else draft.data
    ids_data = ids.data if call.T > 0 else NULL
    if target.itemsize == 4:
        if ids.itemsize == 4:
            return drive_chains(
                &call, <const float*>target_data, <const float*>draft_data,
                <const int32_t*>ids_data, <const int32_t*>bonus.data, <float*>scratch_data,
            )
        return drive_chains(
            &call, <const float*>target_data, <const float*>draft_data,
            <const int64_t*>ids_data, <const int64_t*>bonus.data, <float*>scratch_data,
        )
    if ids.itemsize == 4:
        return drive_chains(
            &call, <const double*>target_data, <const double*>draft_data,
            <const int32_t*>ids_data, <const int32_t*>bonus.data, <double*>scratch_data,
        )
    return drive_chains(
        &call, <const double*>target_data, <const double*>draft_data,
        <const int64_t*>ids_data, <const int64_t*>bonus.data, <double*>scratch_data,
    )


cdef Py_ssize_t first_decrease(const int64_t* offsets, Py_ssize_t rows) noexcept nogil:
    """The first ``r`` with ``offsets[r] > offsets[r + 1]``, or -1."""
    cdef Py_ssize_t r
    for r in range(rows):
        if offsets[r] > offsets[r + 1]:
            return r
    return -1


cdef Py_ssize_t first_outside(const int64_t* ids, Py_ssize_t count, Py_ssize_t V) noexcept nogil:
    """The first ``e`` with ``ids[e]`` outside ``[0, V)``, or -1."""
    cdef Py_ssize_t e
    for e in range(count):
        if ids[e] < 0 or ids[e] >= V:
            return e
    return -1


cdef int take_adjustments(
    object adjustments, str name, Py_ssize_t rows, Py_ssize_t V, Py_ssize_t itemsize,
    RowAdjust* adjust
) except -1:
    """Fill ``adjust`` from ``(bitmask, offsets, ids, values)`` (see
    :func:`verify_chains_direct`), every offset and id checked: O(rows + entries)."""
    cdef ArrayView mask_view, offset_view, id_view, value_view
    cdef const int64_t* offsets
    cdef const int64_t* ids
    cdef Py_ssize_t count, bad_offset, bad_id
    bitmask, offset_array, id_array, value_array = adjustments
    adjust.bitmask = NULL
    adjust.words = (V + MASK_WORD_BITS - 1) // MASK_WORD_BITS
    adjust.offsets = NULL
    adjust.ids = NULL
    adjust.values = NULL
    if bitmask is not None:
        take_array(bitmask, name + " bitmask", 2, SIGNED_ITEMS, 4, False, &mask_view)
        require(
            mask_view.rows == rows and mask_view.columns == adjust.words,
            f"{name} bitmask must be [rows, ceil(V / 32)] = [{rows}, {adjust.words}]",
        )
        adjust.bitmask = <const int32_t*>mask_view.data
    if offset_array is None:
        return 0
    take_array(offset_array, name + " offsets", 1, SIGNED_ITEMS, 8, False, &offset_view)
    take_array(id_array, name + " ids", 1, SIGNED_ITEMS, 8, False, &id_view)
    take_array(value_array, name + " values", 1, FLOAT_ITEMS, itemsize, False, &value_view)
    require(offset_view.rows == rows + 1, f"{name} offsets must have rows + 1 entries")
    offsets = <const int64_t*>offset_view.data
    ids = <const int64_t*>id_view.data
    count = id_view.rows
    require(value_view.rows == count, f"{name} ids and values must have one length")
    require(offsets[0] == 0 and offsets[rows] == count,
            f"{name} offsets must run from 0 to the number of entries")
    # The messages are made only for a failed check (a loop of f-strings would cost more
    # than the call's adjustments themselves).
    with nogil:
        bad_offset = first_decrease(offsets, rows)
        bad_id = first_outside(ids, count, V)
    if bad_offset >= 0:
        require(False, f"{name} offsets must not decrease (row {bad_offset})")
    if bad_id >= 0:
        require(False, f"{name} ids must be in [0, V); found {ids[bad_id]}")
    adjust.offsets = offsets
    adjust.ids = ids
    adjust.values = value_view.data
    return 0


cdef Py_ssize_t first_invalid_request(
    const token_id_t* ids, const token_id_t* bonus, const int64_t* offsets, Py_ssize_t B,
    int64_t V
) noexcept nogil:
    """The first request with a draft or bonus id outside ``[0, V)``, or -1."""
    cdef Py_ssize_t b
    for b in range(B):
        if invalid_id_column(ids + offsets[b], bonus[b], offsets[b + 1] - offsets[b], V) >= 0:
            return b
    return -1


def check_ragged_call(
    object counts,
    object draft_token_ids,
    object bonus_token_ids,
    bint bonus_given,
    object target_rows,
    object draft_rows,
    object temperature,
    object greedy,
    bint target_logits,
    bint draft_logits,
    bint law_reads_lone_rows=False,
):
    """Every check of a ragged engine call that reads its arrays, before anything is
    drawn, in one call: the offsets of ``num_draft_tokens``, the shapes, the token ids and
    the temperatures' overflow (``specdec_np._layouts.ragged``, ``check_tempered_rows``).

    Parameters
    ----------
    counts : int64 [B]
        ``k_b`` per request, read once (into the copy this returns).
    draft_token_ids : int32 or int64 [T]
    bonus_token_ids : same dtype [B]
        The bonus ids (zeros when the bonus is drawn).
    bonus_given : bool
        The caller gave the bonus ids: the target may then leave its bonus rows out.
    target_rows : float32 or float64 [T + B, V] (or [T, V] with the bonus ids)
    draft_rows : same dtype [T, V], or None
        The draft rows the call reads (None: none).
    temperature : float64 [B], or None
        The checked temperatures (None: 1 everywhere).
    greedy : bool or uint8 [B]
        Non-zero for a request that reads its rows raw.
    target_logits, draft_logits : bool
        Which rows the temperatures divide.
    law_reads_lone_rows : bool
        The kernel's law checks the temperatures' overflow of the rows it reads
        (``finds_overflow``), and reads the one row of each sampled request without drafts
        (its bonus row, drawn): those rows are not read here.

    Returns
    -------
    tuple of (array, array, int, int, bool, int), or None
        ``(offsets, counts, max k_b, T, bonus_rows, greedy requests)`` when every check
        passes: int64 ``[B + 1]`` offsets ``[0, cumsum(counts)]``, a private int64 copy of
        the counts, and ``bonus_rows`` whether the target holds each request's bonus
        row; None when one fails (a negative count, counts whose sum overflows, a shape,
        an id outside ``[0, V)``, a temperature that makes a finite logit overflow): the
        caller then takes the general path, which says why.

    Raises
    ------
    TypeError, ValueError
        For arrays of other kinds or layouts than these (a caller's mistake).
    """
    cdef ArrayView count_view, ids, bonus, target, draft, temperature_view, greedy_view
    cdef const int64_t* given_counts
    cdef int64_t* count_data
    cdef int64_t* offset_data
    cdef const uint8_t* greedy_data
    cdef cnp.ndarray offsets, copied
    cdef cnp.npy_intp length
    cdef Py_ssize_t B, T, V, b, bad, greedy_count = 0
    cdef int64_t count, running = 0, largest = 0
    cdef bint bonus_rows
    cdef bint has_draft = draft_rows is not None
    take_array(counts, "counts", 1, SIGNED_ITEMS, 8, False, &count_view)
    take_array(draft_token_ids, "draft_token_ids", 1, SIGNED_ITEMS, 0, False, &ids)
    take_array(bonus_token_ids, "bonus_token_ids", 1, SIGNED_ITEMS, ids.itemsize, False, &bonus)
    take_array(target_rows, "target_rows", 2, FLOAT_ITEMS, 0, False, &target)
    if has_draft:
        take_array(draft_rows, "draft_rows", 2, FLOAT_ITEMS, target.itemsize, False, &draft)
    take_array(greedy, "greedy", 1, UNSIGNED_ITEMS, 1, False, &greedy_view)
    B = count_view.rows
    require(greedy_view.rows == B, "greedy must have B entries")
    require(bonus.rows == B, "bonus_token_ids must have B entries")
    greedy_data = <const uint8_t*>greedy_view.data
    length = B
    copied = cnp.PyArray_EMPTY(1, &length, cnp.NPY_INT64, 0)
    length = B + 1
    offsets = cnp.PyArray_EMPTY(1, &length, cnp.NPY_INT64, 0)
    given_counts = <const int64_t*>count_view.data
    count_data = <int64_t*>cnp.PyArray_DATA(copied)
    offset_data = <int64_t*>cnp.PyArray_DATA(offsets)
    offset_data[0] = 0
    for b in range(B):
        count = given_counts[b]
        if count < 0:
            return None
        count_data[b] = count
        # Wrapping as NumPy's cumsum does (signed overflow would be undefined in C).
        running = <int64_t>(<uint64_t>running + <uint64_t>count)
        largest = count if count > largest else largest
        offset_data[b + 1] = running
    if B > 0 and largest > INT64_MAX // B:
        return None  # the sum may have wrapped around: no array is that long anyway
    T = running
    V = target.columns
    bonus_rows = not (bonus_given and target.rows == T)
    if ids.rows != T or V < 1 or target.rows != T + (B if bonus_rows else 0):
        return None
    if has_draft and (draft.rows != T or draft.columns != V):
        return None
    with nogil:
        if ids.itemsize == 4:
            bad = first_invalid_request(
                <const int32_t*>ids.data, <const int32_t*>bonus.data, offset_data, B, V
            )
        else:
            bad = first_invalid_request(
                <const int64_t*>ids.data, <const int64_t*>bonus.data, offset_data, B, V
            )
    if bad >= 0:
        return None
    if temperature is not None:
        take_array(temperature, "temperature", 1, FLOAT_ITEMS, 8, False, &temperature_view)
        require(temperature_view.rows == B, "temperature must have B entries")
        if target_logits and overflow_row(
            &target, <const double*>temperature_view.data, greedy_data, count_data,
            1 if bonus_rows else 0, B, law_reads_lone_rows and bonus_rows,
        ) >= 0:
            return None
        if draft_logits and has_draft and overflow_row(
            &draft, <const double*>temperature_view.data, greedy_data, count_data, 0, B,
        ) >= 0:
            return None
    with nogil:
        for b in range(B):
            greedy_count += greedy_data[b] != 0
    return offsets, copied, largest, T, bonus_rows, greedy_count


cdef object int64_view(cnp.ndarray block, Py_ssize_t start, int nd, cnp.npy_intp* dims):
    """A C-contiguous int64 view of ``block`` from entry ``start`` on."""
    cdef cnp.ndarray view = cnp.PyArray_SimpleNewFromData(
        nd, dims, cnp.NPY_INT64, <int64_t*>cnp.PyArray_DATA(block) + start
    )
    cnp.set_array_base(view, block)
    return view


def output_block(Py_ssize_t batch_size, Py_ssize_t width):
    """The four output arrays of a chain call, views of one int64 allocation (the
    ``OutputBlock`` of ``specdec_np._runtime.contract``, made without NumPy's indexing).

    Parameters
    ----------
    batch_size, width : int
        ``B`` and the output width (``max k_b + 1``), both >= 0.

    Returns
    -------
    tuple of arrays
        ``output_token_ids`` int64 ``[B, width]``, then ``accepted_lengths``,
        ``num_accepted`` and ``row_status``, int64 ``[B]`` each; uninitialised.
    """
    cdef cnp.npy_intp cells, total
    cdef cnp.npy_intp dims[2]
    cdef cnp.ndarray block
    require(batch_size >= 0 and width >= 0, "batch_size and width must be >= 0")
    cells = batch_size * width
    total = cells + 3 * batch_size
    block = cnp.PyArray_EMPTY(1, &total, cnp.NPY_INT64, 0)
    dims[0] = batch_size
    dims[1] = width
    return (
        int64_view(block, 0, 2, dims),
        int64_view(block, cells, 1, dims),
        int64_view(block, cells + batch_size, 1, dims),
        int64_view(block, cells + 2 * batch_size, 1, dims),
    )


def explicit_uniform_block(object column, Py_ssize_t batch_size):
    """The uniforms block of a step without drafts from a row's explicit uniforms: float64
    ``[B, 2]``, zeros and then the column (float32 widened exactly), as the general path
    makes it; None where it does not take the column as it is, for the general path to
    check it and say why.

    Parameters
    ----------
    column : object
        The explicit uniforms: taken when a C-contiguous NumPy float64 or float32 array of
        shape ``[batch_size]`` in native byte order whose every entry lies in ``[0, 1)``.
    batch_size : int
        ``B``.

    Returns
    -------
    float64 array [B, 2] or None
    """
    cdef cnp.ndarray values, block
    cdef cnp.npy_intp dims[2]
    cdef Py_ssize_t i
    cdef int kind
    cdef double value
    cdef double* out
    if type(column) is not cnp.ndarray:
        return None
    values = <cnp.ndarray>column
    kind = cnp.PyArray_TYPE(values)
    if (cnp.PyArray_NDIM(values) != 1 or cnp.PyArray_DIM(values, 0) != batch_size
            or not cnp.PyArray_IS_C_CONTIGUOUS(values) or not cnp.PyArray_ISNOTSWAPPED(values)
            or (kind != cnp.NPY_FLOAT64 and kind != cnp.NPY_FLOAT32)):
        return None
    dims[0] = batch_size
    dims[1] = 2
    block = cnp.PyArray_ZEROS(2, dims, cnp.NPY_FLOAT64, 0)
    out = <double*>cnp.PyArray_DATA(block)
    for i in range(batch_size):
        if kind == cnp.NPY_FLOAT64:
            value = (<const double*>cnp.PyArray_DATA(values))[i]
        else:
            value = (<const float*>cnp.PyArray_DATA(values))[i]
        # NaN fails both comparisons.
        if not (value >= 0.0 and value < 1.0):
            return None
        out[2 * i + 1] = value
    return block


def add_position_counts(object lengths, object counts):
    """Add to ``counts[j]`` the number of entries of ``lengths`` above ``j``, for every
    ``j``: the per-position counts of ``specdec_np.metrics.VerificationMetrics``, in
    O(B + sum of lengths) without a Python loop over requests.

    Parameters
    ----------
    lengths : int64 [B]
        Lengths (drafts proposed or accepted per request); one <= 0 adds nothing.
    counts : int64 [n], ``n >= max(lengths)``
        Written in place.
    """
    cdef ArrayView length_view, count_view
    cdef const int64_t* length_data
    cdef int64_t* count_data
    cdef Py_ssize_t b, j
    take_array(lengths, "lengths", 1, SIGNED_ITEMS, 8, False, &length_view)
    take_array(counts, "counts", 1, SIGNED_ITEMS, 8, True, &count_view)
    length_data = <const int64_t*>length_view.data
    count_data = <int64_t*>count_view.data
    for b in range(length_view.rows):
        require(length_data[b] <= count_view.rows, "counts must be as long as every length")
    with nogil:
        for b in range(length_view.rows):
            for j in range(length_data[b]):
                count_data[j] += 1


cdef bint native_int64_vector(object x) noexcept:
    """Whether ``x`` is exactly a NumPy array of native int64 items, 1-D and C-contiguous
    (what ``VerificationMetrics`` reads as it is)."""
    cdef cnp.ndarray array
    if type(x) is not cnp.ndarray:
        return False
    array = <cnp.ndarray>x
    return (
        cnp.PyArray_NDIM(array) == 1 and cnp.PyArray_ISSIGNED(array)
        and cnp.PyArray_ITEMSIZE(array) == 8 and cnp.PyArray_ISNOTSWAPPED(array)
        and cnp.PyArray_IS_C_CONTIGUOUS(array)
    )


cdef bint length_sums(
    const int64_t* lengths, Py_ssize_t count, int64_t* total, int64_t* largest
) noexcept:
    """The sum of ``count`` lengths and the largest of them and 0; False where the sum
    leaves int64 (the caller then sums on Python ints)."""
    cdef Py_ssize_t b
    cdef int64_t value, running = 0, top = 0
    for b in range(count):
        value = lengths[b]
        if value > 0 and running > INT64_MAX - value:
            return False
        if value < 0 and running < -INT64_MAX - 1 - value:
            return False
        running += value
        if value > top:
            top = value
    total[0] = running
    largest[0] = top
    return True


cdef object counts_with(object counts, const int64_t* lengths, Py_ssize_t count):
    """A copy of the per-position ``counts`` (native, C-contiguous, long enough for every
    length; its type number kept, as ``ndarray.copy`` keeps it) with
    :func:`add_position_counts` of ``lengths`` added."""
    cdef cnp.ndarray source = <cnp.ndarray>counts
    cdef cnp.npy_intp width = cnp.PyArray_DIM(source, 0)
    cdef cnp.ndarray copy = cnp.PyArray_EMPTY(1, &width, cnp.PyArray_TYPE(source), 0)
    cdef const int64_t* old = <const int64_t*>cnp.PyArray_DATA(source)
    cdef int64_t* data = <int64_t*>cnp.PyArray_DATA(copy)
    cdef Py_ssize_t b, j
    for j in range(width):
        data[j] = old[j]
    for b in range(count):
        for j in range(lengths[b]):
            data[j] += 1
    return copy


def record_metrics(
    dict fields not None, object num_draft_tokens, object accepted_lengths, object commit,
    object lock=None,
):
    """One verification call added to ``VerificationMetrics`` (``fields``: its instance
    dictionary) in one compiled step: what its ``record`` does without ``emitted`` and
    ``total_variation``, the same sums, per-position counts and fields, with no Python
    step between the first field set and ``commit.done``.

    Parameters
    ----------
    fields : dict
        The metrics' instance dictionary; its fields are replaced (the per-position counts
        by new arrays), all or none of them.
    num_draft_tokens, accepted_lengths : int64 [B]
        ``k_b`` and the causal accepted length per request.
    commit : object with a ``done`` attribute, or None
        Set to True last; the fields are put back if that raises.
    lock : object with ``acquire`` and ``release``, optional
        Held around the record (an engine's lock of its metrics), taken and given back
        here, so that no interrupt can land between the two and leave it held.

    Returns
    -------
    bool
        True when recorded; False, with nothing changed, where the call is not the common
        one (the Python record then runs): an argument that is not a native, C-contiguous
        1-D int64 NumPy array, a sum that leaves int64, counts that must grow (a longer
        draft than any before) or a field missing or of another kind.
    """
    if lock is None:
        return record_into(fields, num_draft_tokens, accepted_lengths, commit)
    lock.acquire()
    try:
        return record_into(fields, num_draft_tokens, accepted_lengths, commit)
    finally:
        lock.release()


cdef object record_into(
    dict fields, object num_draft_tokens, object accepted_lengths, object commit
):
    """:func:`record_metrics` without its lock."""
    cdef const int64_t* drafted
    cdef const int64_t* accepted
    cdef Py_ssize_t size, accepted_count, positions
    cdef int64_t drafted_sum, accepted_sum, drafted_top, accepted_top
    cdef object requests, drafted_total, accepted_total, emitted, accepted_at, drafted_at
    cdef object new_requests, new_drafted, new_accepted, new_emitted
    cdef object new_accepted_at, new_drafted_at
    if not (native_int64_vector(num_draft_tokens) and native_int64_vector(accepted_lengths)):
        return False
    # The Python record reads the two fields it keeps too: without them, it says so.
    if "total_variation_sum" not in fields or "measured_positions" not in fields:
        return False
    requests = fields.get("requests")
    drafted_total = fields.get("drafted")
    accepted_total = fields.get("accepted")
    emitted = fields.get("emitted")
    accepted_at = fields.get("accepted_at")
    drafted_at = fields.get("drafted_at")
    if (
        requests is None or drafted_total is None or accepted_total is None
        or emitted is None
        or not native_int64_vector(accepted_at) or not native_int64_vector(drafted_at)
    ):
        return False
    size = cnp.PyArray_DIM(<cnp.ndarray>num_draft_tokens, 0)
    accepted_count = cnp.PyArray_DIM(<cnp.ndarray>accepted_lengths, 0)
    drafted = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>num_draft_tokens)
    accepted = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>accepted_lengths)
    if not (
        length_sums(drafted, size, &drafted_sum, &drafted_top)
        and length_sums(accepted, accepted_count, &accepted_sum, &accepted_top)
    ):
        return False
    positions = min(
        cnp.PyArray_DIM(<cnp.ndarray>accepted_at, 0), cnp.PyArray_DIM(<cnp.ndarray>drafted_at, 0)
    )
    if drafted_top > positions or accepted_top > positions:
        return False
    # Every new value first (in the Python record's order), then the fields.
    new_accepted_at = counts_with(accepted_at, accepted, accepted_count)
    new_drafted_at = counts_with(drafted_at, drafted, size)
    new_requests = requests + size
    new_drafted = drafted_total + drafted_sum
    new_accepted = accepted_total + accepted_sum
    new_emitted = emitted + (<object>accepted_sum + size)
    # No Python code runs from here to the return (the old values stay referenced, so
    # replacing them frees nothing), unless ``commit`` is a Python class of its own.
    try:
        fields["requests"] = new_requests
        fields["drafted"] = new_drafted
        fields["accepted"] = new_accepted
        fields["emitted"] = new_emitted
        fields["accepted_at"] = new_accepted_at
        fields["drafted_at"] = new_drafted_at
        if commit is not None:
            commit.done = True
    except BaseException:
        fields["requests"] = requests
        fields["drafted"] = drafted_total
        fields["accepted"] = accepted_total
        fields["emitted"] = emitted
        fields["accepted_at"] = accepted_at
        fields["drafted_at"] = drafted_at
        raise
    return True


cdef bint read_parameter(object x, Py_ssize_t B, double* values) noexcept:
    """Read a ``[B]`` NumPy array of float32, float64, int32 or int64 (native,
    C-contiguous) into ``values`` as NumPy's ``astype(float64)`` does; False (nothing
    read) for anything else."""
    cdef cnp.ndarray array
    cdef Py_ssize_t b, size
    cdef void* data
    if type(x) is not cnp.ndarray:
        return False
    array = <cnp.ndarray>x
    if (
        cnp.PyArray_NDIM(array) != 1 or cnp.PyArray_DIM(array, 0) != B
        or not cnp.PyArray_ISNOTSWAPPED(array) or not cnp.PyArray_IS_C_CONTIGUOUS(array)
    ):
        return False
    size = cnp.PyArray_ITEMSIZE(array)
    data = cnp.PyArray_DATA(array)
    if cnp.PyArray_ISFLOAT(array) and size == 4:
        for b in range(B):
            values[b] = (<const float*>data)[b]
    elif cnp.PyArray_ISFLOAT(array) and size == 8:
        for b in range(B):
            values[b] = (<const double*>data)[b]
    elif cnp.PyArray_ISSIGNED(array) and size == 4:
        for b in range(B):
            values[b] = (<const int32_t*>data)[b]
    elif cnp.PyArray_ISSIGNED(array) and size == 8:
        for b in range(B):
            values[b] = <double>(<const int64_t*>data)[b]
    else:
        return False
    return True


cdef object float64_array(Py_ssize_t B, double** data):
    """A new float64 ``[B]`` array, its data at ``data``."""
    cdef cnp.npy_intp length = B
    cdef cnp.ndarray array = cnp.PyArray_EMPTY(1, &length, cnp.NPY_FLOAT64, 0)
    data[0] = <double*>cnp.PyArray_DATA(array)
    return array


def sampling_arrays(
    Py_ssize_t batch_size,
    Py_ssize_t vocab_size,
    object temperature,
    object top_k,
    object top_p,
    object min_p,
    double filter_code,
    bint from_logits,
    bint divides_logits,
    int row_itemsize,
    bint every_request_greedy,
    bint table,
):
    """The per-request sampling parameters given as ``[B]`` NumPy arrays, checked and made
    into the kernels' table in one compiled pass: what
    ``specdec_np._runtime.checks.check_sampling_parameters``,
    ``specdec_np._layouts.sampling.greedy_requests`` and ``sampling_table`` make of them,
    value for value.

    Parameters
    ----------
    batch_size, vocab_size : int
        ``B`` and ``V``.
    temperature, top_k, top_p, min_p : array [B] or None
        float32, float64, int32 or int64, native and C-contiguous; None is off.
    filter_code : float
        The filter order's code (``specdec_np._runtime.contract.FILTER_ORDER_CODES``).
    from_logits, divides_logits : bool
        As ``check_sampling_parameters`` takes them.
    row_itemsize : int
        4 or 8: the rows' dtype, in which a positive temperature must be normal.
    every_request_greedy : bool
        The call's method is greedy: every request is.
    table : bool
        Make the float64 ``[B, 5]`` table too.

    Returns
    -------
    tuple or None
        ``(temperature, top_k, top_p, min_p, greedy, table)``: float64 ``[B]`` (int64
        for top-k, 0 where off) or None each, bool ``[B]``, float64 ``[B, 5]`` or None;
        None for any other input or any value a check refuses (the Python checks then
        word the error).
    """
    cdef Py_ssize_t B = batch_size, b
    cdef double* values[4]
    cdef double* column
    cdef double value
    cdef float narrowed
    cdef int64_t* kept_k = NULL
    cdef uint8_t* greedy_data
    cdef double* table_data
    cdef cnp.npy_intp dims[2]
    cdef cnp.ndarray greedy, made
    cdef int which
    given = (temperature, top_k, top_p, min_p)
    arrays = [None, None, None, None]
    if B < 1 or (not from_logits and (top_k is not None or top_p is not None
                                      or min_p is not None)):
        return None
    for which in range(4):
        values[which] = NULL
        if given[which] is not None:
            arrays[which] = float64_array(B, &values[which])
            if not read_parameter(given[which], B, values[which]):
                return None
    if values[0] != NULL:
        for b in range(B):
            value = values[0][b]
            # NaN fails every comparison.
            if not (0.0 <= value <= DBL_MAX):
                return None
            if divides_logits and value > 0.0:
                # A normal number of the rows' dtype once cast (rounding is the cast's).
                if row_itemsize == 4:
                    narrowed = <float>value
                    if not (narrowed >= FLT_MIN and narrowed <= FLT_MAX):
                        return None
                elif not value >= DBL_MIN:
                    return None
    if values[1] != NULL:
        dims[0] = B
        made = cnp.PyArray_EMPTY(1, dims, cnp.NPY_INT64, 0)
        kept_k = <int64_t*>cnp.PyArray_DATA(made)
        for b in range(B):
            value = values[1][b]
            # An integer >= 0 or +inf (NaN fails); V or more is off.
            if not (value >= 0.0 and (isinf(value) or value == floor(value))):
                return None
            kept_k[b] = 0 if value >= vocab_size else <int64_t>value
        arrays[1] = made
    if values[2] != NULL:
        for b in range(B):
            if not (0.0 < values[2][b] <= 1.0):
                return None
    if values[3] != NULL:
        for b in range(B):
            if not (0.0 <= values[3][b] <= 1.0):
                return None
    dims[0] = B
    greedy = cnp.PyArray_EMPTY(1, dims, cnp.NPY_BOOL, 0)
    greedy_data = <uint8_t*>cnp.PyArray_DATA(greedy)
    for b in range(B):
        greedy_data[b] = every_request_greedy or (values[0] != NULL and values[0][b] == 0.0)
    made = None
    if table:
        dims[1] = 5
        made = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT64, 0)
        table_data = <double*>cnp.PyArray_DATA(made)
        for b in range(B):
            column = table_data + 5 * b
            column[0] = 1.0 if values[0] == NULL or greedy_data[b] else values[0][b]
            column[1] = 0.0 if kept_k == NULL else <double>kept_k[b]
            column[2] = 1.0 if values[2] == NULL else values[2][b]
            column[3] = 0.0 if values[3] == NULL else values[3][b]
            column[4] = filter_code
    return arrays[0], arrays[1], arrays[2], arrays[3], greedy, made
