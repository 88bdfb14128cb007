# --------------------------------------------------------------------------------------
# Tree steps (the registry's ``walk``), with the signature of the ``*_tree_step`` pointers
# (registry_binding.pxi); each is registered under its name right after its definition.
# A node's children are the later nodes whose parent it is, tried in node order; a step
# only moves to a higher node index, so a walk ends within N_b steps whatever the parents
# say.  Children are found through the request's links (specdec_np._layouts.tree_links), which the
# driver checked: each lookup is O(1), so a step costs O(1) per child plus its row passes.
# --------------------------------------------------------------------------------------

cdef inline Py_ssize_t next_child(
    const Request* request, Py_ssize_t node, Py_ssize_t after
) noexcept nogil:
    """The child of ``node`` (-1: the root) after ``after``: its first child when ``after``
    is ``node``, else the sibling after the child ``after``; -1 when there is none."""
    if after == node:
        return request.first_child[node + 1]
    return request.next_sibling[after]


cdef inline Py_ssize_t next_distinct_child(
    const Request* request, Py_ssize_t node, Py_ssize_t after
) noexcept nogil:
    """:func:`next_child` among the children whose token no earlier sibling proposed."""
    if after == node:
        return request.first_child[node + 1]
    return request.next_distinct_sibling[after]


cdef inline bint tried_before(const Request* request, Py_ssize_t child) noexcept nogil:
    """Whether a sibling tried before ``child`` proposed the same token."""
    return request.repeated_token[child] != 0


cdef inline double residual_update(
    const probability_t* p, const double* residual, double mass, const probability_t* q,
    double q_mass, Py_ssize_t V, double* out
) noexcept nogil:
    """out = (r - q / q_mass)+ with r = residual / mass, or the target row p while no
    residual was kept; returns its float64 sum (``treescan.h``)."""
    if residual == NULL:
        if probability_t is float:
            return specdec_residual_update_ff(p, 1.0, q, q_mass, V, out)
        else:
            return specdec_residual_update_dd(p, 1.0, q, q_mass, V, out)
    if probability_t is float:
        return specdec_residual_update_df(residual, mass, q, q_mass, V, out)
    else:
        return specdec_residual_update_dd(residual, mass, q, q_mass, V, out)


cdef inline double draft_row_mass(const probability_t* q, Py_ssize_t V) noexcept nogil:
    if probability_t is float:
        return specdec_clean_sum_f(q, V)
    else:
        return specdec_clean_sum_d(q, V)


cdef inline void clean_copy(const probability_t* src, Py_ssize_t V, double* out) noexcept nogil:
    if probability_t is float:
        specdec_clean_copy_f(src, V, out)
    else:
        specdec_clean_copy_d(src, V, out)


cdef enum:
    # The point-mass step keeps at most this many distinct child tokens on the stack.
    MAX_EXCLUDED = 256


cdef Py_ssize_t children_tokens(
    const token_id_t* ids, const Request* request, Py_ssize_t node, Py_ssize_t first,
    int64_t* excluded
) noexcept nogil:
    """The distinct tokens of ``node``'s children (from child ``first`` on; -1: none),
    sorted into ``excluded[0 ..]``: their count, or -1 past ``MAX_EXCLUDED``.  Only the
    children with a token new among their siblings are read."""
    cdef Py_ssize_t child = first, count = 0, e, j
    cdef int64_t token
    while child >= 0:
        token = ids[child]
        # Insertion into the sorted distinct tokens.
        e = count
        while e > 0 and excluded[e - 1] > token:
            e -= 1
        if e == 0 or excluded[e - 1] != token:
            if count == MAX_EXCLUDED:
                return -1
            for j in range(count, e, -1):
                excluded[j] = excluded[j - 1]
            excluded[e] = token
            count += 1
        child = next_distinct_child(request, node, child)
    return count


cdef Py_ssize_t draw_without_children(
    const probability_t* p, const token_id_t* ids, const Request* request, Py_ssize_t node,
    Py_ssize_t first, Py_ssize_t V, double v, double* working
) noexcept nogil:
    """Inverse-CDF draw at ``v`` from the row ``p`` without the tokens of ``node``'s
    children (from child ``first`` on; -1: none); -1 if nothing with mass is left.

    The children's tokens are few: :func:`draw_by_blocks` takes them out of its block sums
    and skips them in its scan, so the row is read about once and never copied.  Past
    ``MAX_EXCLUDED`` distinct tokens the row is copied to ``working`` with them zeroed
    instead."""
    cdef int64_t excluded[MAX_EXCLUDED]
    cdef Py_ssize_t child
    cdef Py_ssize_t count = children_tokens(ids, request, node, first, excluded)
    if count >= 0:
        return draw_by_blocks(
            <Request*>NULL, p, <const probability_t*>NULL, 0, -1, 1.0, V, v, excluded, count
        )
    clean_copy(p, V, working)
    child = first
    while child >= 0:
        working[ids[child]] = 0.0
        child = next_distinct_child(request, node, child)
    return draw_inverse_cdf(<const double*>working, <const double*>NULL, -1, 1.0, V, v)


cdef Py_ssize_t greedy_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, double* working,
    int64_t* final_token
) noexcept nogil:
    """The child of ``node`` whose token is the argmax of its row, or -1 with that argmax
    in ``final_token``.  Reads neither draft rows nor uniforms."""
    cdef Py_ssize_t argmax = raw_argmax(request, target, node + 1)
    cdef Py_ssize_t child = next_child(request, node, node)
    while child >= 0:
        if ids[child] == argmax:
            return child
        child = next_child(request, node, child)
    final_token[0] = argmax
    return -1


define_tree_step(
    "greedy_tree_step",
    greedy_tree_step[float, int32_t],
    greedy_tree_step[float, int64_t],
    greedy_tree_step[double, int32_t],
    greedy_tree_step[double, int64_t],
)


cdef Py_ssize_t point_mass_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, double* working,
    int64_t* final_token
) noexcept nogil:
    """Deterministic candidates: accept child j iff u_j (1 - removed) < r(x_j), where r is
    the row with the tokens of the siblings tried before removed (``removed`` their mass);
    if every child fails, draw from the row without them.  Returns the accepted child, or
    -1 with the final token (-2: the row has no mass).  Reads no draft rows."""
    cdef Py_ssize_t V = request.V, row = node + 1
    cdef Py_ssize_t first = next_child(request, node, node)
    cdef Py_ssize_t child = first
    cdef double removed = 0.0, r_x
    cdef int64_t x, last_removed = -1
    cdef Py_ssize_t token
    cdef const probability_t* p
    while child >= 0:
        x = ids[child]
        if tried_before(request, child):
            r_x = 0.0
        else:
            r_x = target_probability(request, target, row, x)
        if request.uniforms[child] * (1.0 - removed) < r_x:
            return child
        if r_x > 0.0:
            removed += r_x
            last_removed = x
        child = next_child(request, node, child)
    p = probability_row(request, target, row, False)
    token = draw_without_children(
        p, ids, request, node, first, V, request.uniforms[request.k], working
    )
    if token < 0 and first >= 0:
        # Only rounding leaves nothing: the last rejection removed the last token with
        # mass, which the exact walk would have accepted.
        token = last_removed
    if token < 0:
        return -2
    final_token[0] = token
    return -1


define_tree_step(
    "point_mass_tree_step",
    point_mass_tree_step[float, int32_t],
    point_mass_tree_step[float, int64_t],
    point_mass_tree_step[double, int32_t],
    point_mass_tree_step[double, int64_t],
)


cdef Py_ssize_t residual_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, bint without_replacement,
    double* working, int64_t* final_token
) noexcept nogil:
    """SpecInfer (and, ``without_replacement``, RRS): accept child j iff u_j q_j(x_j) <
    r(x_j); on rejection r <- (r - q_j)+ renormalised, kept only if it has mass.  For RRS
    q_j is the draft row with the tokens of the siblings tried before taken out and
    renormalised.  ``working`` holds two rows of V (the residual and its update).
    Returns the accepted child, or -1 with the final token (-2: no mass)."""
    cdef Py_ssize_t V = request.V, row = node + 1
    cdef Py_ssize_t first = next_child(request, node, node)
    cdef Py_ssize_t child = first, sibling
    cdef double* residual = NULL
    cdef double* update
    cdef double mass = 1.0, q_mass, r_x, q_x, updated_mass, a
    cdef int64_t x, t
    cdef Py_ssize_t token
    cdef const probability_t* p = NULL
    cdef const probability_t* q
    while child >= 0:
        x = ids[child]
        q = NULL
        q_mass = 1.0
        if without_replacement and child != first:
            q = probability_row(request, draft, child, True)
            q_mass = draft_row_mass(q, V)
            # The distinct tokens tried before: at most min(child, V) of them.
            sibling = first
            while 0 <= sibling < child:
                q_mass -= specdec_clean(q[ids[sibling]])
                sibling = next_distinct_child(request, node, sibling)
            if tried_before(request, child):
                q_x = 0.0
            else:
                q_x = specdec_clean(q[x])
            if not q_mass > 0.0:
                q_mass = 1.0
            elif q_mass != 1.0:
                q_x = q_x / q_mass
        else:
            q_x = draft_probability(request, draft, child, x)
        if residual != NULL:
            r_x = residual[x]
        else:
            r_x = target_probability(request, target, row, x)
        if mass != 1.0:
            r_x = r_x / mass
        if request.uniforms[child] * q_x < r_x:
            return child
        if q == NULL:
            q = probability_row(request, draft, child, True)
        if residual == NULL and p == NULL:
            p = probability_row(request, target, row, False)
        if residual == NULL and q_mass == 1.0 and next_child(request, node, child) < 0:
            # The last child of a node whose residual is still its row (a chain's case):
            # the draw from (p - q)+, or from p if that has no mass, reads both rows as the
            # chain verifiers do, instead of writing the update first.  The weights, block
            # sums and fallback are those of the update and the draw below.
            token = draw_residual(p, q, -1, 1.0, V, request.uniforms[request.k])
            if token < 0:
                return -2
            final_token[0] = token
            return -1
        update = working if residual != working else working + V
        updated_mass = residual_update(p, residual, mass, q, q_mass, V, update)
        if without_replacement and child != first:
            # The tried siblings' tokens are out of q_j: their residual is r alone.
            sibling = first
            while 0 <= sibling < child:
                t = ids[sibling]
                a = residual[t] if residual != NULL else <double>p[t]
                if mass != 1.0:
                    a = a / mass
                a = specdec_clean(a)
                updated_mass += a - update[t]
                update[t] = a
                sibling = next_distinct_child(request, node, sibling)
        if updated_mass > 0.0:
            residual = update
            mass = updated_mass
        child = next_child(request, node, child)
    if residual != NULL:
        token = draw_inverse_cdf(
            <const double*>residual, <const double*>NULL, -1, 1.0, V, request.uniforms[request.k]
        )
    else:
        if p == NULL:
            p = probability_row(request, target, row, False)
        token = draw_inverse_cdf(
            p, <const probability_t*>NULL, -1, 1.0, V, request.uniforms[request.k]
        )
    if token < 0:
        return -2
    final_token[0] = token
    return -1


cdef Py_ssize_t specinfer_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, double* working,
    int64_t* final_token
) noexcept nogil:
    """SpecInfer: :func:`residual_tree_step` with independently drafted children; without
    draft rows, the point-mass walk."""
    if draft == NULL:
        return point_mass_tree_step(
            target, draft, ids, parents, request, node, working, final_token
        )
    return residual_tree_step(
        target, draft, ids, parents, request, node, False, working, final_token
    )


define_tree_step(
    "specinfer_tree_step",
    specinfer_tree_step[float, int32_t],
    specinfer_tree_step[float, int64_t],
    specinfer_tree_step[double, int32_t],
    specinfer_tree_step[double, int64_t],
)


cdef Py_ssize_t rrs_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, double* working,
    int64_t* final_token
) noexcept nogil:
    """Recursive rejection sampling: :func:`residual_tree_step` with the siblings drafted
    without replacement; without draft rows, the point-mass walk."""
    if draft == NULL:
        return point_mass_tree_step(
            target, draft, ids, parents, request, node, working, final_token
        )
    return residual_tree_step(
        target, draft, ids, parents, request, node, True, working, final_token
    )


define_tree_step(
    "rrs_tree_step",
    rrs_tree_step[float, int32_t],
    rrs_tree_step[float, int64_t],
    rrs_tree_step[double, int32_t],
    rrs_tree_step[double, int64_t],
)


cdef enum:
    # A step's answer when its heap scratch cannot be allocated, or when the working rows
    # it was given are too few for the request's depth.
    TREE_STEP_NO_MEMORY = -4


cdef struct TraversalLevel:
    # One node of the walked path (the root at level 0): its index (-1: the root), the
    # child being walked below it, its weight rho and, once a child of it was rejected, its
    # residual (a working row) and that residual's mass.
    Py_ssize_t node
    Py_ssize_t child
    double rho
    double mass
    Py_ssize_t row
    bint has_residual


cdef double weighted_update(
    const probability_t* p, const double* residual, double mass, double rho,
    const probability_t* q, Py_ssize_t V, double* out
) noexcept nogil:
    """out = max(rho r - max(q, 0), 0) with r = residual / mass (the row p while no residual
    was kept): block verification's weighted residual, element for element
    (``specdec_residual_weight``); returns its float64 sum."""
    cdef Py_ssize_t y
    cdef double total = 0.0, r, w
    for y in range(V):
        r = residual[y] if residual != NULL else <double>p[y]
        if mass != 1.0:
            r = r / mass
        w = specdec_residual_weight(r, <double>q[y], rho, 1.0)
        out[y] = w
        total += w
    return total


cdef Py_ssize_t traversal_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, double* working,
    int64_t* final_token
) noexcept nogil:
    """Traversal verification (docs/semantics.md, the traversal walk): the whole walk in
    one call, post-order from the leaves up.  A child's weight is
    min(1, rho r(x) / q(x)) from its parent's state (rho, r); a node is tested, u_j < rho_j,
    once every child's subtree was rejected; a rejected child c updates its parent to
    r <- max(rho r - q_c, 0) renormalised (kept if that has no mass) and
    rho <- Z / (Z + 1 - rho) (the root's rho stays 1).  Returns the deepest accepted node
    with the final token in ``final_token`` (-2 there: that node's row has no mass), or -1
    with the final token when only the root is accepted (-2: the root's row has no mass),
    or ``TREE_STEP_NO_MEMORY``.  ``working`` holds ``request.working_rows`` rows of V: one
    per level of the path that is not a leaf, and one for the update (max depth + 1).
    Without draft rows, the point-mass walk."""
    cdef Py_ssize_t V = request.V, n = request.k, rows = request.working_rows
    cdef Py_ssize_t j, d = 0, spare, c, b, swap, token, accepted
    cdef double r_x, q_x, w, total
    cdef const probability_t* p
    cdef const probability_t* q
    cdef const double* residual
    cdef TraversalLevel* levels
    cdef TraversalLevel* level
    if draft == NULL:
        return point_mass_tree_step(
            target, draft, ids, parents, request, node, working, final_token
        )
    # The path's levels on the heap (n + 1 bound the depth), one block per request.
    levels = <TraversalLevel*>malloc((n + 1) * sizeof(TraversalLevel))
    if levels == NULL:
        return TREE_STEP_NO_MEMORY
    # Level l owns working row l (levels from rows - 1 on own none: a node there with
    # children finds too few rows); the last row is the spare the next update is written
    # to, swapped in when the update has mass, so the rows stay distinct.
    for j in range(n + 1):
        levels[j].row = j if j < rows - 1 else -1
    spare = rows - 1
    levels[0].node = -1
    levels[0].child = next_child(request, -1, -1)
    levels[0].rho = 1.0
    levels[0].mass = 1.0
    levels[0].has_residual = False
    while True:
        level = &levels[d]
        b = level.node
        c = level.child
        if c >= 0:
            w = 0.0
            if level.rho > 0.0:
                if level.has_residual:
                    r_x = working[level.row * V + ids[c]]
                else:
                    r_x = target_probability(request, target, b + 1, ids[c])
                if level.mass != 1.0:
                    r_x = r_x / level.mass
                q_x = draft_probability(request, draft, c, ids[c])
                w = specdec_next_block_weight(level.rho, r_x, q_x)
            if w > 0.0:
                d += 1
                levels[d].node = c
                levels[d].child = next_child(request, c, c)
                levels[d].rho = w
                levels[d].mass = 1.0
                levels[d].has_residual = False
                continue
            # A child of weight 0: its subtree is rejected whatever its uniforms, unread.
        elif d == 0 or request.uniforms[b] < level.rho:
            break
        else:
            # Every child of b failed and so did b's own test: b is its parent's rejected
            # child.
            d -= 1
            level = &levels[d]
            c = level.child
        if level.rho > 0.0:
            if level.row < 0:
                free(levels)
                return TREE_STEP_NO_MEMORY
            q = probability_row(request, draft, c, True)
            if level.has_residual:
                residual = working + level.row * V
                p = NULL
            else:
                residual = NULL
                p = probability_row(request, target, level.node + 1, False)
            total = weighted_update(
                p, residual, level.mass, level.rho, q, V, working + spare * V
            )
            if d > 0 and level.rho < 1.0:
                level.rho = specdec_block_check(total, level.rho)
            if total > 0.0:
                swap = level.row
                level.row = spare
                spare = swap
                level.mass = total
                level.has_residual = True
        level.child = next_child(request, level.node, c)
    accepted = levels[d].node
    if levels[d].has_residual:
        token = draw_inverse_cdf(
            <const double*>(working + levels[d].row * V), <const double*>NULL, -1, 1.0, V,
            request.uniforms[n],
        )
    else:
        p = probability_row(request, target, accepted + 1, False)
        token = draw_inverse_cdf(p, <const probability_t*>NULL, -1, 1.0, V, request.uniforms[n])
    free(levels)
    if accepted < 0:
        if token < 0:
            return -2
        final_token[0] = token
        return -1
    final_token[0] = token if token >= 0 else -2
    return accepted


define_tree_step(
    "traversal_tree_step",
    traversal_tree_step[float, int32_t],
    traversal_tree_step[float, int64_t],
    traversal_tree_step[double, int32_t],
    traversal_tree_step[double, int64_t],
)
