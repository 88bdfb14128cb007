# --------------------------------------------------------------------------------------
# The tree driver (docs/semantics.md, trees).  Request b owns nodes node_offsets[b] ..
# node_offsets[b + 1] - 1; its N_b + 1 target rows start at node_offsets[b] + b (the root
# row, then one row per node) and its draft rows at node_offsets[b].  Each request walks
# from the root with the tree step bound to its code.
# --------------------------------------------------------------------------------------

cdef bint layout_is_valid(
    const int64_t[::1] num_nodes, const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids, int64_t vocab_size, int64_t max_depth,
    int64_t[::1] node_offsets, int64_t[::1] depths,
) noexcept nogil:
    cdef Py_ssize_t B = num_nodes.shape[0], N = tree_parents.shape[0]
    cdef Py_ssize_t b, j, start = 0
    cdef int64_t count, parent, token, depth
    node_offsets[0] = 0
    for b in range(B):
        count = num_nodes[b]
        # Compared with what is left of N, so that the running sum never wraps.
        if count < 0 or count > N - start:
            return False
        for j in range(count):
            parent = tree_parents[start + j]
            if parent < -1 or parent >= j:
                return False
            token = draft_token_ids[start + j]
            if vocab_size >= 0 and (token < 0 or token >= vocab_size):
                return False
            depth = 1 if parent < 0 else depths[start + parent] + 1
            if depth > max_depth:
                return False
            depths[start + j] = depth
        start += count
        node_offsets[b + 1] = start
    return start == N


def tree_layout_is_valid(
    const int64_t[::1] num_nodes,
    const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids,
    int64_t vocab_size,
    int64_t max_depth,
    int64_t[::1] node_offsets,
    int64_t[::1] depths,
):
    """Check a tree layout in one O(N) pass, filling its offsets and depths.

    The checks of ``specdec_np._layouts.tree.validate_tree``, whose NumPy passes have fixed costs
    that dominate a small batch: the tree layer calls this first and runs those passes
    (which say what is wrong) only when it fails.

    Parameters
    ----------
    num_nodes : int64 [B]
    tree_parents : int64 [N]
    draft_token_ids : int64 [N]
    vocab_size : int
        Tokens must lie in ``0 .. vocab_size - 1``; negative: not checked.
    max_depth : int
        The deepest node allowed (a child of the root has depth 1).
    node_offsets : int64 [B + 1]
        Written: ``[0, cumsum(num_nodes)]``.
    depths : int64 [N]
        Written: each node's depth.

    Returns
    -------
    bool
        True when every count is ``>= 0`` and they sum to ``N``, every parent lies in
        ``-1 .. node index - 1`` of its request, every token in the vocabulary and every
        depth ``<= max_depth``; False at the first violation (the outputs are then
        partial).
    """
    cdef bint valid
    if (
        node_offsets.shape[0] != num_nodes.shape[0] + 1
        or depths.shape[0] != tree_parents.shape[0]
        or draft_token_ids.shape[0] != tree_parents.shape[0]
    ):
        return False
    with nogil:
        valid = layout_is_valid(
            num_nodes, tree_parents, draft_token_ids, vocab_size, max_depth, node_offsets,
            depths,
        )
    return valid


cdef enum:
    # small_tree_links gives up on a sibling list with more distinct tokens than this.
    MAX_SMALL_DISTINCT = 16


cdef bint links_of_small_lists(
    const int64_t[::1] node_offsets, const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids, int64_t[::1] first_child, int64_t[::1] next_sibling,
    int64_t[::1] next_distinct_sibling, int8_t[::1] repeated_token,
) noexcept nogil:
    cdef Py_ssize_t B = node_offsets.shape[0] - 1, N = tree_parents.shape[0]
    cdef Py_ssize_t b, j, start, count, root, node, child, first, last, earlier, distinct
    cdef int64_t token
    cdef int8_t repeated
    for b in range(B):
        start = node_offsets[b]
        count = node_offsets[b + 1] - start
        # Trusted, but checked in O(1) per node: nothing below leaves the arrays.
        if start < 0 or count < 0 or count > N - start:
            return False
        for j in range(count):
            if tree_parents[start + j] < -1 or tree_parents[start + j] >= j:
                return False
        root = start + b  # the root's entry of first_child
        for j in range(count + 1):
            first_child[root + j] = -1
        # Pushed in reverse node order, each list comes out in node order.
        for j in range(count - 1, -1, -1):
            next_sibling[start + j] = first_child[root + tree_parents[start + j] + 1]
            first_child[root + tree_parents[start + j] + 1] = j
        for node in range(-1, count):
            first = first_child[root + node + 1]
            child = first
            last = -1
            distinct = 0
            while child != -1:
                token = draft_token_ids[start + child]
                next_distinct_sibling[start + child] = -1
                repeated = 0
                earlier = first if last != -1 else -1
                while earlier != -1:
                    if draft_token_ids[start + earlier] == token:
                        repeated = 1
                        break
                    earlier = next_distinct_sibling[start + earlier]
                repeated_token[start + child] = repeated
                if not repeated:
                    if distinct == MAX_SMALL_DISTINCT:
                        return False
                    if last != -1:
                        next_distinct_sibling[start + last] = child
                    last = child
                    distinct += 1
                child = next_sibling[start + child]
    return True


def small_tree_links(
    const int64_t[::1] node_offsets,
    const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids,
    int64_t[::1] first_child,
    int64_t[::1] next_sibling,
    int64_t[::1] next_distinct_sibling,
    int8_t[::1] repeated_token,
):
    """The links of :func:`specdec_np._layouts.tree_links.tree_links` in one compiled pass, for
    batches whose sibling lists hold few distinct tokens (the common case).

    Each node's children are listed in O(N); a child's token is compared with its parent's
    distinct tokens so far, at most ``MAX_SMALL_DISTINCT`` (16) of them, so the pass is
    O(16 N) and has none of the fixed costs of the NumPy sorts, which dominate a small batch.

    Parameters
    ----------
    node_offsets : int64 [B + 1]
    tree_parents, draft_token_ids : int64 [N]
        A layout whose parents lie inside their request, before their node.
    first_child : int64 [N + B]
    next_sibling, next_distinct_sibling : int64 [N]
    repeated_token : int8 [N]
        Written: the links.

    Returns
    -------
    bool
        True when every sibling list has at most 16 distinct tokens (the links are
        written); False otherwise (the outputs are then partial), or on inconsistent
        shapes, offsets or parents.
    """
    cdef bint done
    cdef Py_ssize_t B = node_offsets.shape[0] - 1
    cdef Py_ssize_t N = tree_parents.shape[0]
    if (
        B < 0 or node_offsets[B] != N or draft_token_ids.shape[0] != N
        or first_child.shape[0] != N + B or next_sibling.shape[0] != N
        or next_distinct_sibling.shape[0] != N or repeated_token.shape[0] != N
    ):
        return False
    with nogil:
        done = links_of_small_lists(
            node_offsets, tree_parents, draft_token_ids, first_child, next_sibling,
            next_distinct_sibling, repeated_token,
        )
    return done


cdef bint links_are_valid(
    const int64_t[::1] tree_parents, const int64_t[::1] node_offsets,
    const int64_t[::1] first_child, const int64_t[::1] next_sibling,
    const int64_t[::1] next_distinct_sibling, const int8_t[::1] repeated_token,
) noexcept nogil:
    """Whether every request's child lists stay inside it, in O(N): each list strictly
    increasing, of children of its node, every node in its parent's list once and every
    node not marked repeated in its parent's distinct list once."""
    cdef Py_ssize_t B = node_offsets.shape[0] - 1
    cdef Py_ssize_t b, start, count, node, child, previous, reached, distinct, unrepeated
    for b in range(B):
        start = node_offsets[b]
        count = node_offsets[b + 1] - start
        reached = 0
        distinct = 0
        unrepeated = 0
        for node in range(count):
            if repeated_token[start + node] == 0:
                unrepeated += 1
        for node in range(-1, count):
            previous = node
            child = first_child[start + b + node + 1]
            while child != -1:
                if child <= previous or child >= count or tree_parents[start + child] != node:
                    return False
                reached += 1
                previous = child
                child = next_sibling[start + child]
            previous = node
            child = first_child[start + b + node + 1]
            while child != -1:
                if (
                    child <= previous or child >= count
                    or tree_parents[start + child] != node
                    or repeated_token[start + child] != 0
                ):
                    return False
                distinct += 1
                previous = child
                child = next_distinct_sibling[start + child]
        if reached != count or distinct != unrepeated:
            return False
    return True


cdef int64_t walk_tree(
    int method, const probability_t* target, const probability_t* draft,
    const token_id_t* ids, const int64_t* parents, const int64_t* first_child,
    const int64_t* next_sibling, const int64_t* next_distinct_sibling,
    const int8_t* repeated_token, Py_ssize_t num_nodes, Py_ssize_t V,
    const double* uniforms, const double* sampling, int row_forms, probability_t* scratch,
    specdec_law_scratch* law_scratch, double* working, Py_ssize_t working_rows,
    Py_ssize_t depth_width, int64_t* nodes_out, int64_t* tokens_out, int64_t* length,
    const RowAdjust* target_adjust, const RowAdjust* draft_adjust, Py_ssize_t first_node,
    Py_ssize_t request_index, probability_t* adjusted
) noexcept nogil:
    """One request's walk with the tree step bound to code ``method``: id check, steps
    from the root, output rows; a row status.

    A step returns the accepted child to descend into, or -1 with the final token (-2:
    that row has no mass).  A step that decides the whole walk at once (traversal) returns
    the deepest accepted node, a descendant, with the final token already written (-2 there
    when that node's row has no mass): the path down to it is recorded and the walk ends.
    ``TREE_STEP_NO_MEMORY``: the step's scratch could not be had.  ``first_child``
    starts at the root's entry and the other links at the request's first node.  The
    sampling surface's adjustments (NULL: none) index the target rows from
    ``first_node + request_index`` and the draft rows from ``first_node``; their adjusted
    rows are made in ``adjusted`` (the thread's two rows of V)."""
    cdef Request request_fields
    cdef Request* request = &request_fields
    cdef Py_ssize_t node = -1, child, depth = 0, i, steps, slot
    cdef int64_t final_token = -1
    cdef Py_ssize_t bad = invalid_id_column(ids, 0, num_nodes, V)
    if bad >= 0:
        return 1 + bad
    if sampling != NULL and law_scratch == NULL:
        return SPECDEC_STATUS_NO_MEMORY
    init_request(
        request, num_nodes, V, uniforms, NULL, True, sampling, row_forms, scratch,
        law_scratch,
    )
    request.first_child = first_child
    request.next_sibling = next_sibling
    request.next_distinct_sibling = next_distinct_sibling
    request.repeated_token = repeated_token
    request.working_rows = working_rows
    bind_adjustments(
        request, target_adjust, draft_adjust, first_node + request_index, first_node, adjusted
    )
    if not bound_tree_steps[method].reads_draft_rows:
        draft = NULL
    while True:
        child = call_tree_step(
            method, target, draft, ids, parents, request, node, working, &final_token
        )
        if child == TREE_STEP_NO_MEMORY:
            return SPECDEC_STATUS_NO_MEMORY
        if child == -2:
            return -(1 + node + 1)
        if child < 0:
            break
        # The nodes from here down to the accepted one (one for a child), parents below
        # their children, so the count is bounded by the request's nodes.
        steps = 0
        i = child
        while i > node:
            steps += 1
            i = parents[i]
        if i != node or depth + steps > depth_width:
            # The driver checked the output against the deepest node; this bound only
            # keeps a write inside the row whatever happens.
            return 1 + child
        slot = depth + steps - 1
        i = child
        while i > node:
            nodes_out[slot] = i
            tokens_out[slot] = ids[i]
            slot -= 1
            i = parents[i]
        depth += steps
        node = child
        if final_token == -2:
            return -(1 + node + 1)
        if final_token >= 0:
            break
    tokens_out[depth] = final_token
    length[0] = depth
    for i in range(depth, depth_width):
        nodes_out[i] = -1
        tokens_out[i + 1] = -1
    return 0


def verify_trees(
    int method,
    const probability_t[:, ::1] target_rows,
    const probability_t[:, ::1] draft_rows,
    bint point_mass_drafts,
    const token_id_t[::1] draft_token_ids,
    const int64_t[::1] tree_parents,
    const int64_t[::1] node_offsets,
    const int64_t[::1] first_child,
    const int64_t[::1] next_sibling,
    const int64_t[::1] next_distinct_sibling,
    const int8_t[::1] repeated_token,
    const double[::1] uniforms,
    int64_t[:, ::1] accepted_nodes,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] row_status,
    int num_threads,
    const int8_t[::1] request_methods=None,
    const double[:, ::1] sampling=None,
    probability_t[:, ::1] scratch=None,
    double[:, ::1] working=None,
    bint target_logits=True,
    bint draft_logits=True,
    int row_threads=1,
    object target_adjustments=None,
    object draft_adjustments=None,
    object adjusted_rows=None,
):
    """Verify a batch of draft trees with the tree steps bound to the registry codes.

    Parameters
    ----------
    method : int
        The registry code (:attr:`specdec_np.registry.TreeMethod.code`) of every request's
        walk, unless ``request_methods`` is given (it is checked either way).
    target_rows : float32 or float64 [N + B, V], C-contiguous
        Request ``b`` owns the ``N_b + 1`` rows from ``node_offsets[b] + b`` on: its root
        row, then one row per node.
    draft_rows : same dtype [N, V]
        The row each node was drawn from; ignored when ``point_mass_drafts`` and by the
        codes bound as reading no draft rows.
    point_mass_drafts : bool
    draft_token_ids : int32 or int64 [N]
    tree_parents : int64 [N]
        Parent of each node within its request (``-1``: the root), below the node's index.
    node_offsets : int64 [B + 1]
        ``0 = node_offsets[0] <= ... <= node_offsets[B] = N``.
    first_child : int64 [N + B]
    next_sibling, next_distinct_sibling : int64 [N]
    repeated_token : int8 [N]
        The child lists of :func:`specdec_np._layouts.tree_links.tree_links` (of these parents and
        ids), through which the steps find children in O(1).  Checked in O(N) to stay
        inside each request and agree with the parents; lists that do, but are not those
        of ``tree_links``, give other results, never a read out of bounds.
    uniforms : float64 [N + B]
        Flat: request ``b``'s ``N_b + 1`` uniforms start at ``node_offsets[b] + b``; it
        reads entry ``j`` for node ``j``'s test and entry ``N_b`` for the final token.
        Any length when no code in use reads uniforms.
    accepted_nodes : int64 [B, D]
        ``D`` at least the deepest node of the batch; written ``-1`` padded.
    output : int64 [B, D + 1]
    accepted_lengths, row_status : int64 [B]
        Row status: 0, ``1 + j`` for a bad token id at node ``j``, ``-(1 + i)`` for a row
        without mass (``i = 0`` the root, ``j + 1`` node ``j``).
    num_threads : int
    request_methods : int8 [B], optional
        Per-request registry code (mixed greedy and sampled batches).
    sampling : float64 [B, 5], optional
        The rows are logits: per request ``(temperature, top_k, top_p, min_p, filter order
        code)``.
    scratch : same dtype as the rows [num_threads, 2 V], optional
        With ``sampling``: a thread's processed target and draft row.
    target_logits, draft_logits : bool
        With ``sampling``: whether the target rows and the draft rows are logits (else
        probabilities, used as they are).
    working : float64 [num_threads, R V], optional
        A thread's residual rows, ``R >= 2`` of them; required when a code in use reads
        uniforms.  Traversal keeps one per level of the walked path and one for the
        update: ``R >= max depth + 1`` (a request deeper than that reports
        ``STATUS_NO_MEMORY``).
    row_threads : int
        With ``sampling``: threads for the passes over one logits row, as in
        :func:`verify_chains`.
    target_adjustments, draft_adjustments, adjusted_rows : optional
        The sampling surface's adjustments of the target ``[N + B]`` and draft ``[N]``
        logits rows and their working rows, as :func:`verify_chains_direct` takes them.

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1.

    Raises
    ------
    ValueError
        For inconsistent shapes, offsets, parents or links, or a code (``method`` or an entry of
        ``request_methods``) outside the bound table.
    RuntimeError
        When the tree steps were never bound (:func:`bind_tree_steps`).
    """
    cdef Py_ssize_t B = node_offsets.shape[0] - 1
    cdef Py_ssize_t V = target_rows.shape[1]
    cdef Py_ssize_t N = draft_token_ids.shape[0]
    cdef Py_ssize_t D = accepted_nodes.shape[1]
    cdef Py_ssize_t b, j, start, max_nodes, thread, parent, max_depth = 0
    cdef Py_ssize_t working_rows
    cdef int64_t[::1] depths
    cdef int request_method
    cdef bint stochastic
    cdef bint per_request = request_methods is not None
    cdef Py_ssize_t threads = num_threads if num_threads > 1 else 1
    cdef const probability_t* draft_base
    cdef const token_id_t* ids_base
    cdef const int64_t* parents_base
    cdef const int64_t* first_child_base
    cdef const int64_t* next_sibling_base
    cdef const int64_t* next_distinct_base
    cdef const int8_t* repeated_base
    cdef const double* uniform_base
    cdef const double* sampling_base = NULL
    cdef int row_forms = (TARGET_LOGITS if target_logits else 0) | (
        DRAFT_LOGITS if draft_logits else 0
    )
    cdef probability_t* scratch_base = NULL
    cdef specdec_law_scratch* law_scratch = NULL
    cdef specdec_law_scratch* serial_scratch = NULL
    cdef double* working_base = NULL
    cdef RowAdjust target_adjust, draft_adjust
    cdef const RowAdjust* target_adjusting = NULL
    cdef const RowAdjust* draft_adjusting = NULL
    cdef ArrayView adjusted_view
    cdef probability_t* adjusted_base = NULL
    require(B >= 0, "node_offsets must have B + 1 entries")
    require_tree_step_code(method)
    stochastic = bound_tree_steps[method].reads_uniforms
    require(V >= 1, "the vocabulary must not be empty")
    max_nodes = require_offsets(node_offsets, B, N)
    require(tree_parents.shape[0] == N, "tree_parents must have N entries")
    depths = array((N if N > 0 else 1,), sizeof(int64_t), "q")
    for b in range(B):
        start = node_offsets[b]
        for j in range(node_offsets[b + 1] - start):
            parent = tree_parents[start + j]
            require(
                -1 <= parent < j, "tree_parents must name an earlier node of the request or -1"
            )
            depths[start + j] = 1 if parent < 0 else depths[start + parent] + 1
            max_depth = depths[start + j] if depths[start + j] > max_depth else max_depth
    require(D >= max_depth, "accepted_nodes must be [B, >= the deepest node]")
    require(
        first_child.shape[0] == N + B and next_sibling.shape[0] == N
        and next_distinct_sibling.shape[0] == N and repeated_token.shape[0] == N,
        "the links must be first_child [N + B], next_sibling, next_distinct_sibling and "
        "repeated_token [N]",
    )
    require(
        links_are_valid(
            tree_parents, node_offsets, first_child, next_sibling, next_distinct_sibling,
            repeated_token,
        ),
        "the links must be the child lists of tree_parents (specdec_np._layouts.tree_links)",
    )
    require(target_rows.shape[0] == N + B, "target_rows must have N + B rows")
    require(
        point_mass_drafts or (draft_rows.shape[0] == N and draft_rows.shape[1] == V),
        "draft_rows must be [N, V]",
    )
    require(
        accepted_nodes.shape[0] == B and output.shape[0] == B and output.shape[1] == D + 1
        and accepted_lengths.shape[0] == B and row_status.shape[0] == B,
        "outputs must be [B, D], [B, D + 1] and [B]",
    )
    if per_request:
        require(request_methods.shape[0] == B, "request_methods must have B entries")
        for b in range(B):
            request_method = request_methods[b]
            require_tree_step_code(request_method)
            stochastic = stochastic or bound_tree_steps[request_method].reads_uniforms
    require(not stochastic or uniforms.shape[0] == N + B, "uniforms must be [N + B]")
    working_rows = 2
    if stochastic and working is not None:
        working_rows = working.shape[1] // V
    require(
        not stochastic or (
            working is not None and working.shape[0] >= threads
            and working.shape[1] == working_rows * V and working_rows >= 2
        ),
        "working must be [num_threads, R V] with R >= 2",
    )
    if sampling is not None:
        require(sampling.shape[0] == B and sampling.shape[1] == 5, "sampling must be [B, 5]")
        require(
            scratch is not None and scratch.shape[0] >= threads and scratch.shape[1] == 2 * V,
            "scratch must be [num_threads, 2 V]",
        )
    if target_adjustments is not None or draft_adjustments is not None:
        require(sampling is not None, "row adjustments need logits rows (sampling)")
        take_array(adjusted_rows, "adjusted_rows", 2, FLOAT_ITEMS, sizeof(probability_t), True,
                   &adjusted_view)
        require(
            adjusted_view.rows >= threads and adjusted_view.columns == 2 * V,
            "adjusted_rows must be [num_threads, 2 V]",
        )
        adjusted_base = <probability_t*>adjusted_view.data
        if target_adjustments is not None and target_logits:
            take_adjustments(
                target_adjustments, "target_adjustments", N + B, V, sizeof(probability_t),
                &target_adjust,
            )
            target_adjusting = &target_adjust
        if draft_adjustments is not None and draft_logits and not point_mass_drafts:
            take_adjustments(
                draft_adjustments, "draft_adjustments", N, V, sizeof(probability_t),
                &draft_adjust,
            )
            draft_adjusting = &draft_adjust
    if B == 0:
        return -1
    if sampling is not None:
        sampling_base = &sampling[0, 0]
        scratch_base = &scratch[0, 0]
    if stochastic:
        working_base = &working[0, 0]
    draft_base = NULL if point_mass_drafts or N == 0 else &draft_rows[0, 0]
    ids_base = &draft_token_ids[0] if N > 0 else NULL
    parents_base = &tree_parents[0] if N > 0 else NULL
    first_child_base = &first_child[0]
    next_sibling_base = &next_sibling[0] if N > 0 else NULL
    next_distinct_base = &next_distinct_sibling[0] if N > 0 else NULL
    repeated_base = &repeated_token[0] if N > 0 else NULL
    uniform_base = &uniforms[0] if stochastic else NULL
    if num_threads <= 1:
        # One thread, outside any OpenMP region (the loop below, on thread 0), as in
        # verify_chains: row threads' teams are never nested in an inactive region.
        with nogil:
            serial_scratch = new_law_scratch(sampling_base != NULL, row_threads)
            for b in range(B):
                start = node_offsets[b]
                request_method = request_methods[b] if per_request else method
                row_status[b] = walk_tree(
                    request_method,
                    &target_rows[start + b, 0],
                    NULL if draft_base == NULL else draft_base + start * V,
                    ids_base + start if ids_base != NULL else ids_base,
                    parents_base + start if parents_base != NULL else parents_base,
                    first_child_base + start + b,
                    next_sibling_base + start if next_sibling_base != NULL else NULL,
                    next_distinct_base + start if next_distinct_base != NULL else NULL,
                    repeated_base + start if repeated_base != NULL else NULL,
                    node_offsets[b + 1] - start, V,
                    NULL if uniform_base == NULL else uniform_base + start + b,
                    NULL if sampling_base == NULL else sampling_base + 5 * b, row_forms,
                    scratch_base, serial_scratch, working_base, working_rows, D,
                    &accepted_nodes[b, 0] if D > 0 else NULL, &output[b, 0],
                    &accepted_lengths[b], target_adjusting, draft_adjusting, start, b,
                    adjusted_base,
                )
            free(serial_scratch)
        return first_failed_row(row_status)
    # Each thread of the team allocates its law scratch once for the call.  Its rows run on
    # that thread alone (specdec_row_threads: no team is nested in a parallel loop).
    with nogil, parallel(num_threads=num_threads):
        law_scratch = new_law_scratch(sampling_base != NULL, 1)
        for b in prange(B, schedule="dynamic"):
            start = node_offsets[b]
            thread = threadid()
            request_method = request_methods[b] if per_request else method
            row_status[b] = walk_tree(
                request_method,
                &target_rows[start + b, 0],
                NULL if draft_base == NULL else draft_base + start * V,
                ids_base + start if ids_base != NULL else ids_base,
                parents_base + start if parents_base != NULL else parents_base,
                first_child_base + start + b,
                next_sibling_base + start if next_sibling_base != NULL else next_sibling_base,
                next_distinct_base + start if next_distinct_base != NULL else next_distinct_base,
                repeated_base + start if repeated_base != NULL else repeated_base,
                node_offsets[b + 1] - start, V,
                NULL if uniform_base == NULL else uniform_base + start + b,
                NULL if sampling_base == NULL else sampling_base + 5 * b, row_forms,
                NULL if scratch_base == NULL else scratch_base + thread * 2 * V, law_scratch,
                NULL if working_base == NULL else working_base + thread * working_rows * V,
                working_rows, D, &accepted_nodes[b, 0] if D > 0 else NULL, &output[b, 0],
                &accepted_lengths[b], target_adjusting, draft_adjusting, start, b,
                NULL if adjusted_base == NULL else adjusted_base + thread * 2 * V,
            )
        free(law_scratch)
    return first_failed_row(row_status)
