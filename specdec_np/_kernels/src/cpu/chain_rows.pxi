# --------------------------------------------------------------------------------------
# Chain row functions (the registry's ``row_function``): one request of any chain layout,
# with the signature of the ``*_chain_row`` pointers (registry_binding.pxi).  Each is
# registered under its name right after its definition.
# --------------------------------------------------------------------------------------

cdef int64_t rejection_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef const double* uniforms = request.uniforms
    cdef Py_ssize_t i, r = k, token
    cdef int64_t passed = 0
    cdef double p_x, q_x
    for i in range(k):
        # Each position is tested independently, as vLLM counts acceptances.
        p_x = target_probability(request, target, i, draft_ids[i])
        q_x = draft_probability(request, draft, i, draft_ids[i])
        if uniforms[i] * q_x < p_x:
            passed += 1
        elif r == k:
            r = i
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    if r == k:
        last_token[0] = bonus_id
        return 0
    token = residual_token(request, target, draft, r, draft_ids[r], 1.0, uniforms[k])
    if token < 0:
        return -(1 + r)
    last_token[0] = token
    return 0


define_chain_row(
    "rejection_row",
    rejection_row[float, int32_t],
    rejection_row[float, int64_t],
    rejection_row[double, int32_t],
    rejection_row[double, int64_t],
)


cdef enum:
    # Block verification keeps the path's p(x_j) and q(x_j) on the stack up to this k.
    PATH_STACK = 64


cdef void path_weights(
    Request* request, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, double* rho
) noexcept nogil:
    """rho_0 .. rho_k of block verification into ``rho``, in one forward pass: each p(x_j)
    and q(x_j) is read once (from logits, one pass over row j), so the scan below costs no
    ``k^2`` term."""
    cdef Py_ssize_t j
    rho[0] = 1.0
    for j in range(request.k):
        rho[j + 1] = specdec_next_block_weight(
            rho[j], target_probability(request, target, j, draft_ids[j]),
            draft_probability(request, draft, j, draft_ids[j]),
        )


cdef int64_t block_verification_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef const double* uniforms = request.uniforms
    cdef Py_ssize_t i, tau = 0, token
    cdef double rho_i, h, total
    cdef double rho_stack[PATH_STACK + 1]
    cdef double* rho = rho_stack
    if k > PATH_STACK:
        # Long chains: the path's weights on the heap (a thread's small stack must do).
        rho = <double*>malloc((k + 1) * sizeof(double))
        if rho == NULL:
            return SPECDEC_STATUS_NO_MEMORY
    path_weights(request, target, draft, draft_ids, rho)
    # tau is the largest i whose check passes: scan down and stop there, so that no row
    # below tau is read (a later position can rescue an earlier failed check).
    i = k
    while i >= 1:
        rho_i = rho[i]
        if i == k or rho_i >= 1.0 or rho_i == 0.0:
            # h_k = rho_k; rho_i = 1 gives h_i = 1 and rho_i = 0 gives h_i = 0 unread.
            h = rho_i
        else:
            total = row_residual_total(
                request, target, draft, i, -1 if draft != NULL else draft_ids[i], rho_i
            )
            h = specdec_block_check(total, rho_i)
        if uniforms[i - 1] < h:
            tau = i
            break
        i -= 1
    num_accepted[0] = tau
    accepted_length[0] = tau
    rho_i = rho[tau]
    if rho != rho_stack:
        free(rho)
    if tau == k:
        last_token[0] = bonus_id
        return 0
    token = residual_token(request, target, draft, tau, draft_ids[tau], rho_i, uniforms[k])
    if token < 0:
        return -(1 + tau)
    last_token[0] = token
    return 0


define_chain_row(
    "block_verification_row",
    block_verification_row[float, int32_t],
    block_verification_row[float, int64_t],
    block_verification_row[double, int32_t],
    block_verification_row[double, int64_t],
)


cdef int64_t typical_acceptance_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef Py_ssize_t i, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef double p_x, entropy, threshold
    cdef double posterior_threshold = request.parameters[0]
    cdef double posterior_alpha = request.parameters[1]
    for i in range(k):
        p_x = target_probability(request, target, i, draft_ids[i])
        # The threshold never exceeds posterior_threshold: above it, no entropy is needed.
        if p_x > posterior_threshold:
            passed += 1
            continue
        # The argmax is only needed at the first rejection, so only while none was seen.
        entropy = row_entropy_and_argmax(request, target, i, &argmax if r == k else NULL)
        threshold = specdec_typical_threshold(-entropy, posterior_alpha, posterior_threshold)
        if p_x > threshold:
            passed += 1
        elif r == k:
            r = i
            recovered = argmax
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    last_token[0] = bonus_id if r == k else recovered
    return 0


define_chain_row(
    "typical_acceptance_row",
    typical_acceptance_row[float, int32_t],
    typical_acceptance_row[float, int64_t],
    typical_acceptance_row[double, int32_t],
    typical_acceptance_row[double, int64_t],
)


cdef bint is_first_argmax(const probability_t* row, Py_ssize_t V, Py_ssize_t x) noexcept nogil:
    """Whether x is the first index of the maximum: stops at the first block with an entry
    that beats row[x] (larger, or equal at a lower index)."""
    cdef probability_t p_x = row[x]
    cdef Py_ssize_t start, stop, beaten
    if p_x != p_x or p_x == -1.0 / 0.0:
        # NaN and -inf never win the scan's comparisons; the argmax rule decides for them
        # (a row with nothing above -inf has argmax 0), as at the first rejection.
        return row_argmax(row, V) == x
    start = 0
    while start < V:
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        if probability_t is float:
            beaten = specdec_count_beating_f(row, start, stop, p_x, x)
        else:
            beaten = specdec_count_beating_d(row, start, stop, p_x, x)
        if beaten:
            return False
        start += SCAN_BLOCK
    return True


cdef int64_t greedy_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k, V = request.V
    cdef Py_ssize_t i, x, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef bint accepted
    for i in range(k):
        x = draft_ids[i]
        if request.logits:
            # Raw logits: no probability shortcut, the full argmax decides.
            argmax = raw_argmax(request, target, i)
            accepted = argmax == x
        elif target[i * V + x] > 0.5 + SPECDEC_GREEDY_MARGIN:
            accepted = True
        elif r == k:
            argmax = row_argmax(target + i * V, V)
            accepted = argmax == x
        else:
            accepted = is_first_argmax(target + i * V, V, x)
        if accepted:
            passed += 1
        elif r == k:
            r = i
            recovered = argmax
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    last_token[0] = bonus_id if r == k else recovered
    return 0


define_chain_row(
    "greedy_row",
    greedy_row[float, int32_t],
    greedy_row[float, int64_t],
    greedy_row[double, int32_t],
    greedy_row[double, int64_t],
)
