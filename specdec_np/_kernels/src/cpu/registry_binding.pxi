# --------------------------------------------------------------------------------------
# The dispatch tables.  Each chain row function and tree step registers itself once, by
# name, next to its definition (define_chain_row, define_tree_step); specdec_np._kernels.dispatch
# binds the registry's codes to those names once (bind_chain_rows, bind_tree_steps).  The
# drivers index the bound tables by code and read the bound flags: they know no verifier.
# One pointer per fused specialisation (float or double rows, int32 or int64 ids), since a
# C function pointer has one type.
# --------------------------------------------------------------------------------------

cdef enum:
    # Room for the functions a build defines and for the codes a registry binds.  Codes
    # travel as int8 (``request_methods``), so this must stay below 128.
    MAX_TABLE_ENTRIES = 32

# A chain row function gets one request's k + 1 target rows (contiguous, row stride V),
# its k draft rows (NULL: point-mass drafts), its k draft ids (already checked against V),
# its bonus id and its Request; it writes the token after the accepted prefix, the
# accepted length and the acceptance count, and returns a row status.
ctypedef int64_t (*float_int32_chain_row)(
    const float* target, const float* draft, const int32_t* draft_ids, int64_t bonus_id,
    Request* request, int64_t* last_token, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil
ctypedef int64_t (*float_int64_chain_row)(
    const float* target, const float* draft, const int64_t* draft_ids, int64_t bonus_id,
    Request* request, int64_t* last_token, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil
ctypedef int64_t (*double_int32_chain_row)(
    const double* target, const double* draft, const int32_t* draft_ids, int64_t bonus_id,
    Request* request, int64_t* last_token, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil
ctypedef int64_t (*double_int64_chain_row)(
    const double* target, const double* draft, const int64_t* draft_ids, int64_t bonus_id,
    Request* request, int64_t* last_token, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil

# A tree step gets one request's N + 1 target rows (the root's, then one per node), its N
# draft rows (NULL: none to read), its node ids and parents, its Request, the node it
# stands on (-1: the root) and its thread's two float64 working rows of V; it returns the
# accepted child, or -1 with the final token written, or -2 when that row has no mass.
ctypedef Py_ssize_t (*float_int32_tree_step)(
    const float* target, const float* draft, const int32_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, double* working, int64_t* final_token
) noexcept nogil
ctypedef Py_ssize_t (*float_int64_tree_step)(
    const float* target, const float* draft, const int64_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, double* working, int64_t* final_token
) noexcept nogil
ctypedef Py_ssize_t (*double_int32_tree_step)(
    const double* target, const double* draft, const int32_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, double* working, int64_t* final_token
) noexcept nogil
ctypedef Py_ssize_t (*double_int64_tree_step)(
    const double* target, const double* draft, const int64_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, double* working, int64_t* final_token
) noexcept nogil


cdef struct ChainRow:
    # A row function's specialisations, and (once bound to a code) that code's flags.
    float_int32_chain_row float_int32
    float_int64_chain_row float_int64
    double_int32_chain_row double_int32
    double_int64_chain_row double_int64
    bint reads_uniforms
    bint bonus_by_argmax
    Py_ssize_t num_parameters


cdef struct TreeStep:
    # A tree step's specialisations, and (once bound to a code) that code's flags.
    float_int32_tree_step float_int32
    float_int64_tree_step float_int64
    double_int32_tree_step double_int32
    double_int64_tree_step double_int64
    bint reads_uniforms
    bint reads_draft_rows


# What this build defines, in definition order (names and pointers at the same index).
cdef ChainRow defined_chain_rows[MAX_TABLE_ENTRIES]
cdef list defined_chain_row_names = []
cdef TreeStep defined_tree_steps[MAX_TABLE_ENTRIES]
cdef list defined_tree_step_names = []

# What the registry bound, by code.  The counts stay 0 until a binding is complete, so a
# driver that finds them 0 refuses to run instead of calling through an empty table.
cdef ChainRow bound_chain_rows[MAX_TABLE_ENTRIES]
cdef Py_ssize_t num_bound_chain_rows = 0
cdef tuple chain_row_binding = None
cdef TreeStep bound_tree_steps[MAX_TABLE_ENTRIES]
cdef Py_ssize_t num_bound_tree_steps = 0
cdef tuple tree_step_binding = None


cdef int define_chain_row(
    str name, float_int32_chain_row float_int32, float_int64_chain_row float_int64,
    double_int32_chain_row double_int32, double_int64_chain_row double_int64
) except -1:
    """Register the row function ``name`` with its four specialisations (at import)."""
    cdef Py_ssize_t index = len(defined_chain_row_names)
    if name in defined_chain_row_names or index == MAX_TABLE_ENTRIES:
        raise RuntimeError(f"the row function {name!r} cannot be defined twice or past "
                           f"{MAX_TABLE_ENTRIES} entries")
    defined_chain_rows[index].float_int32 = float_int32
    defined_chain_rows[index].float_int64 = float_int64
    defined_chain_rows[index].double_int32 = double_int32
    defined_chain_rows[index].double_int64 = double_int64
    defined_chain_row_names.append(name)
    return 0


cdef int define_tree_step(
    str name, float_int32_tree_step float_int32, float_int64_tree_step float_int64,
    double_int32_tree_step double_int32, double_int64_tree_step double_int64
) except -1:
    """Register the tree step ``name`` with its four specialisations (at import)."""
    cdef Py_ssize_t index = len(defined_tree_step_names)
    if name in defined_tree_step_names or index == MAX_TABLE_ENTRIES:
        raise RuntimeError(f"the tree step {name!r} cannot be defined twice or past "
                           f"{MAX_TABLE_ENTRIES} entries")
    defined_tree_steps[index].float_int32 = float_int32
    defined_tree_steps[index].float_int64 = float_int64
    defined_tree_steps[index].double_int32 = double_int32
    defined_tree_steps[index].double_int64 = double_int64
    defined_tree_step_names.append(name)
    return 0


def row_function_names() -> tuple:
    """The chain row functions this build defines, in definition order.

    Returns
    -------
    tuple of str
        The names :func:`bind_chain_rows` accepts.
    """
    return tuple(defined_chain_row_names)


def tree_step_names() -> tuple:
    """The tree steps this build defines, in definition order.

    Returns
    -------
    tuple of str
        The names :func:`bind_tree_steps` accepts.
    """
    return tuple(defined_tree_step_names)


cdef list binding_indices(str what, tuple names, list defined, tuple flags):
    """The definition index of each name; ValueError for unequal lengths, an empty or too
    long table, or a name this build does not define."""
    cdef list indices = []
    for entries in flags:
        if len(entries) != len(names):
            raise ValueError(
                f"bind: every tuple must have one entry per code ({len(names)} {what} "
                f"names); found {len(entries)}"
            )
    if not 0 < len(names) <= MAX_TABLE_ENTRIES:
        raise ValueError(
            f"bind: expected 1 .. {MAX_TABLE_ENTRIES} {what}s; found {len(names)}"
        )
    for name in names:
        if name not in defined:
            raise ValueError(
                f"unknown {what} {name!r}: this build defines "
                f"{', '.join(repr(known) for known in defined)}"
            )
        indices.append(defined.index(name))
    return indices


cdef bint already_bound(str what, tuple binding, tuple arguments) except -1:
    """Whether an identical binding is in place; RuntimeError for a different one."""
    if binding is None:
        return False
    if binding != arguments:
        raise RuntimeError(
            f"the {what}s are already bound to {binding}; binding them again with "
            f"different arguments {arguments} would change what running code dispatches to"
        )
    return True


def bind_chain_rows(row_functions, reads_uniforms, bonus_by_argmax, num_parameters) -> None:
    """Bind the chain codes to row functions, once (``specdec_np._kernels.dispatch`` does).

    Position ``c`` of every tuple describes code ``c`` (``registry.VERIFIERS[c]``).

    Parameters
    ----------
    row_functions : tuple of str [C]
        The row function of each code, among :func:`row_function_names`.
    reads_uniforms : tuple of bool [C]
        Whether the code reads uniforms (its acceptance ones and its residual one).
    bonus_by_argmax : tuple of bool [C]
        Whether a bonus token the driver draws (``draw_bonus``) is the argmax of the raw
        bonus row rather than a draw from its processed law with the last uniform.
    num_parameters : tuple of int [C]
        How many entries of ``parameters`` the code reads.

    Raises
    ------
    ValueError
        For a name this build does not define (the message lists those it does), tuples
        of different lengths, no code or more than the table holds, or a negative count.
    RuntimeError
        When the table is bound already with different arguments (the same arguments
        again are a no-op).
    """
    global num_bound_chain_rows, chain_row_binding
    cdef Py_ssize_t code
    cdef list indices
    arguments = (
        tuple(row_functions),
        tuple(bool(flag) for flag in reads_uniforms),
        tuple(bool(flag) for flag in bonus_by_argmax),
        tuple(int(count) for count in num_parameters),
    )
    indices = binding_indices("row function", arguments[0], defined_chain_row_names,
                              arguments[1:])
    if any(count < 0 for count in arguments[3]):
        raise ValueError(f"bind: num_parameters must be >= 0; found {arguments[3]}")
    if already_bound("row function", chain_row_binding, arguments):
        return
    for code in range(len(indices)):
        bound_chain_rows[code] = defined_chain_rows[<Py_ssize_t>indices[code]]
        bound_chain_rows[code].reads_uniforms = arguments[1][code]
        bound_chain_rows[code].bonus_by_argmax = arguments[2][code]
        bound_chain_rows[code].num_parameters = arguments[3][code]
    chain_row_binding = arguments
    num_bound_chain_rows = len(indices)


def bind_tree_steps(steps, reads_uniforms, reads_draft_rows) -> None:
    """Bind the tree codes to tree steps, once (``specdec_np._kernels.dispatch`` does).

    Position ``c`` of every tuple describes code ``c`` (``registry.TREE_METHODS[c]``).

    Parameters
    ----------
    steps : tuple of str [C]
        The step of each code, among :func:`tree_step_names`.
    reads_uniforms : tuple of bool [C]
        Whether the code's walk is stochastic (reads a uniform per node and a final one,
        and needs the working rows).
    reads_draft_rows : tuple of bool [C]
        Whether the code's step reads the draft rows when a call gives them.

    Raises
    ------
    ValueError
        As :func:`bind_chain_rows`.
    RuntimeError
        As :func:`bind_chain_rows`.
    """
    global num_bound_tree_steps, tree_step_binding
    cdef Py_ssize_t code
    cdef list indices
    arguments = (
        tuple(steps),
        tuple(bool(flag) for flag in reads_uniforms),
        tuple(bool(flag) for flag in reads_draft_rows),
    )
    indices = binding_indices("tree step", arguments[0], defined_tree_step_names,
                              arguments[1:])
    if already_bound("tree step", tree_step_binding, arguments):
        return
    for code in range(len(indices)):
        bound_tree_steps[code] = defined_tree_steps[<Py_ssize_t>indices[code]]
        bound_tree_steps[code].reads_uniforms = arguments[1][code]
        bound_tree_steps[code].reads_draft_rows = arguments[2][code]
    tree_step_binding = arguments
    num_bound_tree_steps = len(indices)


cdef int require_chain_row_code(Py_ssize_t code) except -1:
    # The message is built only on failure: this runs once per request.
    if num_bound_chain_rows == 0:
        raise RuntimeError(
            "the chain row functions are not bound: import specdec_np (its _kernels.dispatch "
            "module binds them from the registry) before calling the kernels"
        )
    if not 0 <= code < num_bound_chain_rows:
        raise ValueError(
            f"kernel arguments are inconsistent: unknown row function code {code} (the "
            f"bound codes are 0 .. {num_bound_chain_rows - 1})"
        )
    return 0


cdef int require_tree_step_code(Py_ssize_t code) except -1:
    # The message is built only on failure: this runs once per request.
    if num_bound_tree_steps == 0:
        raise RuntimeError(
            "the tree steps are not bound: import specdec_np (its _kernels.dispatch module "
            "binds them from the registry) before calling the kernels"
        )
    if not 0 <= code < num_bound_tree_steps:
        raise ValueError(
            f"kernel arguments are inconsistent: unknown tree walk code {code} (the bound "
            f"codes are 0 .. {num_bound_tree_steps - 1})"
        )
    return 0


cdef inline int64_t call_chain_row(
    Py_ssize_t code, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, int64_t bonus_id, Request* request, int64_t* last_token,
    int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    """The row function bound to ``code`` (checked by the driver), for these dtypes."""
    cdef const ChainRow* row = &bound_chain_rows[code]
    if probability_t is float:
        if token_id_t is int32_t:
            return row.float_int32(target, draft, draft_ids, bonus_id, request, last_token,
                                   accepted_length, num_accepted)
        else:
            return row.float_int64(target, draft, draft_ids, bonus_id, request, last_token,
                                   accepted_length, num_accepted)
    else:
        if token_id_t is int32_t:
            return row.double_int32(target, draft, draft_ids, bonus_id, request, last_token,
                                    accepted_length, num_accepted)
        else:
            return row.double_int64(target, draft, draft_ids, bonus_id, request, last_token,
                                    accepted_length, num_accepted)


cdef inline Py_ssize_t call_tree_step(
    Py_ssize_t code, const probability_t* target, const probability_t* draft,
    const token_id_t* ids, const int64_t* parents, Request* request, Py_ssize_t node,
    double* working, int64_t* final_token
) noexcept nogil:
    """The tree step bound to ``code`` (checked by the driver), for these dtypes."""
    cdef const TreeStep* step = &bound_tree_steps[code]
    if probability_t is float:
        if token_id_t is int32_t:
            return step.float_int32(target, draft, ids, parents, request, node, working,
                                    final_token)
        else:
            return step.float_int64(target, draft, ids, parents, request, node, working,
                                    final_token)
    else:
        if token_id_t is int32_t:
            return step.double_int32(target, draft, ids, parents, request, node, working,
                                     final_token)
        else:
            return step.double_int64(target, draft, ids, parents, request, node, working,
                                     final_token)
