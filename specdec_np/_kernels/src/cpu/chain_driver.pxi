# --------------------------------------------------------------------------------------
# The chain driver (padded and ragged batches): each request's rows, ids and uniforms go
# to the row function bound to its code.
# --------------------------------------------------------------------------------------

cdef inline int64_t verify_request(
    int method, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, int64_t bonus_id, bint draw_bonus, Py_ssize_t k,
    Py_ssize_t V, const double* uniforms, const double* parameters, bint causal,
    const double* sampling, int row_forms, probability_t* scratch,
    specdec_law_scratch* law_scratch, Py_ssize_t width, int64_t* out,
    int64_t* accepted_length, int64_t* num_accepted, const RowAdjust* target_adjust,
    const RowAdjust* draft_adjust, Py_ssize_t target_first_row, Py_ssize_t draft_first_row,
    probability_t* adjusted
) noexcept nogil:
    """The skeleton every verifier shares: id check, the row function bound to code
    ``method``, bonus, output row.

    ``sampling`` (temperature, top-k, top-p, min-p) is NULL for probability rows, and
    ``scratch`` then unused; with logits, ``scratch`` is the thread's two rows of V and
    ``law_scratch`` its law scratch (NULL when its allocation failed: the row status is
    then SPECDEC_STATUS_NO_MEMORY).  The sampling surface's row adjustments
    (``target_adjust`` and ``draft_adjust``, NULL for none; applied to logits rows only)
    index the request's rows from ``target_first_row`` and ``draft_first_row``; the
    adjusted rows are made in ``adjusted``, the thread's two rows of V.
    """
    cdef int64_t status, last_token = 0
    cdef Request request_fields
    cdef Request* request = &request_fields
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, 0 if draw_bonus else bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
    if sampling != NULL and law_scratch == NULL:
        return SPECDEC_STATUS_NO_MEMORY
    init_request(
        request, k, V, uniforms, parameters, causal, sampling, row_forms, scratch, law_scratch
    )
    bind_adjustments(
        request, target_adjust, draft_adjust, target_first_row, draft_first_row, adjusted
    )
    status = call_chain_row(
        method, target, draft, draft_ids, bonus_id, request, &last_token, accepted_length,
        num_accepted,
    )
    if status == 0 and draw_bonus and accepted_length[0] == k:
        # The bonus row is read only now that every draft was accepted: its raw argmax for
        # a code that says so (greedy), otherwise a draw from its processed law with the
        # last uniform.
        if bound_chain_rows[method].bonus_by_argmax:
            last_token = raw_argmax(request, target, k)
        else:
            last_token = row_token(request, target, k, uniforms[k + 1])
            if last_token < 0:
                status = -(1 + k)
    if status == 0:
        write_output_row(draft_ids, accepted_length[0], last_token, width, out)
    return status


cdef struct ChainCall:
    # One verify_chains call as sizes and pointers, filled by an entry (typed memoryviews
    # in verify_chains, NumPy arrays in verify_chains_direct), checked by
    # check_chain_call and run by drive_chains.  The rows, ids and scratch travel as typed
    # pointers beside it (they pick the fused specialisation).
    int method
    Py_ssize_t B
    Py_ssize_t V
    Py_ssize_t T
    Py_ssize_t target_count
    bint point_mass_drafts
    Py_ssize_t draft_count
    Py_ssize_t draft_width
    Py_ssize_t bonus_count
    const int64_t* offsets
    Py_ssize_t offset_count
    const double* uniforms
    Py_ssize_t uniform_count
    Py_ssize_t uniform_width
    const double* parameters
    Py_ssize_t parameter_count
    int64_t* output
    Py_ssize_t output_count
    Py_ssize_t width
    int64_t* accepted_lengths
    int64_t* num_accepted
    int64_t* row_status
    Py_ssize_t accepted_count
    Py_ssize_t num_accepted_count
    Py_ssize_t status_count
    bint per_request
    const int8_t* request_methods
    Py_ssize_t request_method_count
    bint causal
    bint draw_bonus
    bint bonus_rows
    bint has_sampling
    const double* sampling
    Py_ssize_t sampling_count
    Py_ssize_t sampling_width
    bint has_scratch
    Py_ssize_t scratch_count
    Py_ssize_t scratch_width
    bint target_logits
    bint draft_logits
    int num_threads
    int row_threads
    # The temperatures' overflow check of the rows the law reads is the law's
    # (new_law_scratch's finds_overflow).
    bint finds_overflow
    # The sampling surface's row adjustments (NULL: none), with their working rows
    # ([threads, 2 V] of the rows' dtype), set by the entry after check_chain_call.
    const RowAdjust* target_adjust
    const RowAdjust* draft_adjust
    void* adjusted
    # Set by check_chain_call.
    Py_ssize_t max_k
    bint stochastic


cdef int check_chain_call(ChainCall* call) except -1:
    """The O(B) guards of a chain call (verify_chains' Raises), on its sizes and offsets;
    sets ``max_k`` and ``stochastic`` (whether the uniforms are read)."""
    cdef Py_ssize_t B = call.B
    cdef Py_ssize_t T = call.T
    cdef Py_ssize_t b, num_parameters
    cdef int request_method
    cdef bint stochastic
    require(B >= 0, "draft_offsets must have B + 1 entries")
    require_chain_row_code(call.method)
    stochastic = call.draw_bonus or bound_chain_rows[call.method].reads_uniforms
    num_parameters = bound_chain_rows[call.method].num_parameters
    require(call.V >= 1, "the vocabulary must not be empty")
    call.max_k = require_offsets_at(call.offsets, call.offset_count, B, T)
    require(call.bonus_count == B, "bonus_token_ids must have B entries")
    require(
        call.target_count == T + (B if call.bonus_rows else 0),
        "target_rows must have T + B rows (T without bonus rows)",
    )
    require(call.bonus_rows or not call.draw_bonus, "a drawn bonus needs the bonus rows")
    require(
        call.point_mass_drafts or (call.draft_count == T and call.draft_width == call.V),
        "draft_rows must be [T, V]",
    )
    require(
        call.output_count == B and call.width >= call.max_k + 1 and call.accepted_count == B
        and call.num_accepted_count == B and call.status_count == B,
        "outputs must be [B, >= max k + 1] and [B]",
    )
    if call.per_request:
        require(call.request_method_count == B, "request_methods must have B entries")
        for b in range(B):
            request_method = call.request_methods[b]
            require_chain_row_code(request_method)
            stochastic = stochastic or bound_chain_rows[request_method].reads_uniforms
            if bound_chain_rows[request_method].num_parameters > num_parameters:
                num_parameters = bound_chain_rows[request_method].num_parameters
    require(
        not stochastic or (
            call.uniform_count == B and call.uniform_width >= call.max_k + 1 + call.draw_bonus
        ),
        "uniforms must be [B, >= max k + 1 (+ 1 to draw the bonus)]",
    )
    if call.parameter_count < num_parameters:
        require(False, f"parameters must hold the {num_parameters} values its verifiers read")
    if call.has_sampling:
        require(
            call.sampling_count == B and call.sampling_width == 5, "sampling must be [B, 5]"
        )
        require(
            call.has_scratch
            and call.scratch_count >= (call.num_threads if call.num_threads > 1 else 1)
            and call.scratch_width == 2 * call.V,
            "scratch must be [num_threads, 2 V]",
        )
    call.stochastic = stochastic
    return 0


cdef Py_ssize_t drive_chains(
    ChainCall* call, const probability_t* target_base, const probability_t* draft_base,
    const token_id_t* ids_base, const token_id_t* bonus_token_ids, probability_t* scratch_base
) noexcept:
    """Each request of a checked call (``B >= 1``) through the row function of its code;
    the first failed request, or -1.  ``target_base`` is NULL without target rows,
    ``draft_base`` for point-mass drafts or ``T == 0``, ``ids_base`` for ``T == 0`` and
    ``scratch_base`` without sampling."""
    cdef Py_ssize_t B = call.B
    cdef Py_ssize_t V = call.V
    cdef Py_ssize_t b, start
    cdef int request_method
    cdef int method = call.method
    cdef bint per_request = call.per_request
    cdef bint bonus_rows = call.bonus_rows
    cdef bint draw_bonus = call.draw_bonus
    cdef bint causal = call.causal
    cdef const int64_t* draft_offsets = call.offsets
    cdef const int8_t* request_methods = call.request_methods
    cdef const double* uniform_base = call.uniforms
    cdef Py_ssize_t uniform_width = call.uniform_width
    cdef const double* parameter_base = call.parameters
    cdef const double* sampling_base = call.sampling
    cdef Py_ssize_t width = call.width
    cdef int64_t* output = call.output
    cdef int64_t* accepted_lengths = call.accepted_lengths
    cdef int64_t* num_accepted = call.num_accepted
    cdef int64_t* row_status = call.row_status
    cdef int num_threads = call.num_threads
    cdef int row_forms = (TARGET_LOGITS if call.target_logits else 0) | (
        DRAFT_LOGITS if call.draft_logits else 0
    )
    cdef specdec_law_scratch* law_scratch = NULL
    cdef specdec_law_scratch* serial_scratch = NULL
    cdef probability_t* adjusted_base = <probability_t*>call.adjusted
    if num_threads <= 1:
        # One thread, outside any OpenMP region (the loop below, on thread 0): row threads'
        # teams nested in an inactive region would be new threads every time (libgomp
        # wakes its pool only for a team at the outer level), hundreds of microseconds a
        # row, and a one-thread call skips the region's own cost too.
        serial_scratch = take_law_scratch(
            sampling_base != NULL, call.row_threads, call.finds_overflow
        )
        with nogil:
            for b in range(B):
                start = draft_offsets[b]
                request_method = request_methods[b] if per_request else method
                row_status[b] = verify_request(
                    request_method,
                    target_base + (start + (b if bonus_rows else 0)) * V,
                    NULL if draft_base == NULL else draft_base + start * V,
                    ids_base + start if ids_base != NULL else ids_base,
                    bonus_token_ids[b], draw_bonus, draft_offsets[b + 1] - start, V,
                    NULL if uniform_base == NULL else uniform_base + b * uniform_width,
                    parameter_base, causal,
                    NULL if sampling_base == NULL else sampling_base + 5 * b, row_forms,
                    scratch_base, serial_scratch, width, output + b * width,
                    accepted_lengths + b, num_accepted + b, call.target_adjust,
                    call.draft_adjust, start + (b if bonus_rows else 0), start, adjusted_base,
                )
        give_back_law_scratch(serial_scratch)
        return first_failed_row_at(row_status, B)
    # Each thread of the team allocates its law scratch once for the call.  Its rows run on
    # that thread alone (specdec_row_threads: no team is nested in a parallel loop).
    with nogil, parallel(num_threads=num_threads):
        law_scratch = new_law_scratch(sampling_base != NULL, 1, call.finds_overflow)
        for b in prange(B, schedule="dynamic"):
            start = draft_offsets[b]
            request_method = request_methods[b] if per_request else method
            row_status[b] = verify_request(
                request_method,
                target_base + (start + (b if bonus_rows else 0)) * V,
                NULL if draft_base == NULL else draft_base + start * V,
                ids_base + start if ids_base != NULL else ids_base,
                bonus_token_ids[b], draw_bonus, draft_offsets[b + 1] - start, V,
                NULL if uniform_base == NULL else uniform_base + b * uniform_width,
                parameter_base, causal,
                NULL if sampling_base == NULL else sampling_base + 5 * b, row_forms,
                NULL if scratch_base == NULL else scratch_base + threadid() * 2 * V,
                law_scratch, width, output + b * width, accepted_lengths + b,
                num_accepted + b, call.target_adjust, call.draft_adjust,
                start + (b if bonus_rows else 0), start,
                NULL if adjusted_base == NULL else adjusted_base + threadid() * 2 * V,
            )
        free(law_scratch)
    return first_failed_row_at(row_status, B)


def verify_chains(
    int method,
    const probability_t[:, ::1] target_rows,
    const probability_t[:, ::1] draft_rows,
    bint point_mass_drafts,
    const token_id_t[::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    const int64_t[::1] draft_offsets,
    const double[:, ::1] uniforms,
    const double[::1] parameters,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
    int num_threads,
    const int8_t[::1] request_methods=None,
    bint causal=False,
    bint draw_bonus=False,
    const double[:, ::1] sampling=None,
    probability_t[:, ::1] scratch=None,
    bint target_logits=True,
    bint draft_logits=True,
    bint bonus_rows=True,
    int row_threads=1,
    bint finds_overflow=False,
):
    """Verify a batch of draft chains with the row functions bound to the registry codes.

    Parameters
    ----------
    method : int
        The registry code (:attr:`specdec_np.registry.Verifier.code`) of every request's
        verifier, unless ``request_methods`` is given (it is checked either way).
    target_rows : float32 or float64 [T + B, V], C-contiguous
        Request ``b`` owns the ``k_b + 1`` rows from ``draft_offsets[b] + b`` on: its draft
        positions, then its bonus position.
    draft_rows : same dtype [T, V]
        Ignored (pass any array of the right dtype) when ``point_mass_drafts``.
    point_mass_drafts : bool
        Drafts are point masses at their token ids.
    draft_token_ids : int32 or int64 [T]
    bonus_token_ids : same dtype [B]
        Ignored (pass any ``[B]`` array) when ``draw_bonus``.
    draft_offsets : int64 [B + 1]
        ``0 = draft_offsets[0] <= ... <= draft_offsets[B] = T``; ``k_b`` is the difference.
    uniforms : float64 [B, W]
        Request ``b`` reads columns ``0 .. k_b``: acceptance uniforms, then the residual
        one, then (``draw_bonus``) the bonus one.  ``W >= max k_b + 1 + draw_bonus`` when
        a code in use reads uniforms or the bonus is drawn; ``[B, 0]`` otherwise.
    parameters : float64 [P]
        The verifiers' parameters (typical acceptance: threshold, alpha); ``P`` at least
        the bound parameter count of every code in use.
    output : int64 [B, width], ``width >= max k_b + 1``
    accepted_lengths, num_accepted, row_status : int64 [B]
        Accepted prefix length, acceptance count and row status (``specdec_np._runtime.contract``).
    num_threads : int
        Threads for the loop over requests.
    request_methods : int8 [B], optional
        Per-request registry code (mixed greedy and sampled batches).
    causal : bool
        Stop at the first rejection (``num_accepted`` = accepted prefix; later rows are
        never read) instead of testing every position as vLLM counts them.
    draw_bonus : bool
        Draw each fully accepted request's bonus token from its bonus row instead of
        taking ``bonus_token_ids``.
    sampling : float64 [B, 5], optional
        The rows are logits: per request ``(temperature, top_k, top_p, min_p, filter order
        code)`` of the processed law (top-k 0 = off); greedy requests read their rows raw.
    scratch : same dtype as the rows [num_threads, 2 * V], optional
        Working rows for logits (a thread's processed target and draft row).
    target_logits, draft_logits : bool
        With ``sampling``: whether the target rows and the draft rows are logits (else
        probabilities, used as they are: vLLM v1 hands target logits with the drafter's
        probabilities).
    bonus_rows : bool
        Whether the target holds each request's bonus row (``[T + B, V]``); without them
        (``[T, V]``, request ``b``'s rows from ``draft_offsets[b]``, as vLLM v1 holds them)
        the bonus ids must be given (``draw_bonus`` False): no bonus row is read then.
    row_threads : int
        With ``sampling``: threads for the passes over one logits row (its maximum and its
        exponentials) when the loop over requests runs on one thread (``num_threads`` <= 1;
        a parallel loop never nests them); 0 or 1: one.  The bits of one thread either way.
    finds_overflow : bool
        The caller left the temperatures' overflow check (``specdec_np._layouts.sampling``,
        ``check_tempered_rows``) of the rows the law reads to the law: such a row then has
        no law, and its request fails (the fast path then hands the call to the general
        one, which words the error).

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1 if every request verified.

    Raises
    ------
    ValueError
        For inconsistent shapes or offsets, or a code (``method`` or an entry of
        ``request_methods``) outside the bound table.
    RuntimeError
        When the row functions were never bound (:func:`bind_chain_rows`).
    """
    cdef ChainCall call
    call.method = method
    call.B = draft_offsets.shape[0] - 1
    call.V = target_rows.shape[1]
    call.T = draft_token_ids.shape[0]
    call.target_count = target_rows.shape[0]
    call.point_mass_drafts = point_mass_drafts
    call.draft_count = draft_rows.shape[0]
    call.draft_width = draft_rows.shape[1]
    call.bonus_count = bonus_token_ids.shape[0]
    call.offsets = &draft_offsets[0] if draft_offsets.shape[0] > 0 else NULL
    call.offset_count = draft_offsets.shape[0]
    call.uniform_count = uniforms.shape[0]
    call.uniform_width = uniforms.shape[1]
    call.parameter_count = parameters.shape[0]
    call.output_count = output.shape[0]
    call.width = output.shape[1]
    call.accepted_count = accepted_lengths.shape[0]
    call.num_accepted_count = num_accepted.shape[0]
    call.status_count = row_status.shape[0]
    call.request_methods = NULL
    call.request_method_count = 0
    if request_methods is not None:
        call.request_methods = &request_methods[0] if request_methods.shape[0] > 0 else NULL
        call.request_method_count = request_methods.shape[0]
    call.per_request = request_methods is not None
    call.causal = causal
    call.draw_bonus = draw_bonus
    call.bonus_rows = bonus_rows
    call.has_sampling = sampling is not None
    call.sampling_count = sampling.shape[0] if sampling is not None else 0
    call.sampling_width = sampling.shape[1] if sampling is not None else 0
    call.has_scratch = scratch is not None
    call.scratch_count = scratch.shape[0] if scratch is not None else 0
    call.scratch_width = scratch.shape[1] if scratch is not None else 0
    call.target_logits = target_logits
    call.draft_logits = draft_logits
    call.num_threads = num_threads
    call.row_threads = row_threads
    call.finds_overflow = finds_overflow
    call.target_adjust = NULL
    call.draft_adjust = NULL
    call.adjusted = NULL
    check_chain_call(&call)
    if call.B == 0:
        return -1
    # The data of every array the check found non-empty, or NULL (a pointer is taken only
    # where a row or entry exists; the driver reads none past the checked shapes).
    call.uniforms = &uniforms[0, 0] if call.stochastic else NULL
    call.parameters = &parameters[0] if parameters.shape[0] > 0 else NULL
    call.sampling = &sampling[0, 0] if call.has_sampling else NULL
    call.output = &output[0, 0]
    call.accepted_lengths = &accepted_lengths[0]
    call.num_accepted = &num_accepted[0]
    call.row_status = &row_status[0]
    return drive_chains(
        &call,
        &target_rows[0, 0] if target_rows.shape[0] > 0 else NULL,
        NULL if point_mass_drafts or call.T == 0 else &draft_rows[0, 0],
        &draft_token_ids[0] if call.T > 0 else NULL,
        &bonus_token_ids[0],
        &scratch[0, 0] if call.has_sampling else NULL,
    )


def ragged_offsets(const int64_t[::1] counts, int64_t[::1] offsets):
    """``offsets = [0, cumsum(counts)]`` and the largest count, in one O(B) pass.

    The ragged layout's Python layer calls this instead of three NumPy reductions, whose
    fixed costs dominate a small batch.

    Parameters
    ----------
    counts : int64 [B]
        ``k_b`` per request.
    offsets : int64 [B + 1]
        Written: ``offsets[b]`` is the sum of the counts before request ``b``.

    Returns
    -------
    tuple of int
        ``(max k_b, first request with k_b < 0)``; the second is -1 when there is none
        (then the offsets are complete; otherwise they stop at that request), and the
        first is 0 for an empty batch.
    """
    cdef Py_ssize_t B = counts.shape[0]
    cdef Py_ssize_t b
    cdef int64_t running = 0, largest = 0
    require(offsets.shape[0] == B + 1, "offsets must have B + 1 entries")
    offsets[0] = 0
    for b in range(B):
        if counts[b] < 0:
            return largest, b
        # Wrapping as NumPy's cumsum does (signed overflow would be undefined in C).
        running = <int64_t>(<uint64_t>running + <uint64_t>counts[b])
        largest = counts[b] if counts[b] > largest else largest
        offsets[b + 1] = running
    return largest, -1
