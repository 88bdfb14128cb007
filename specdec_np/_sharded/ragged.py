"""The ragged call on one rank's vocabulary shard (:func:`specdec_np.sharded.verify_ragged`).

The call runs in rounds, every rank through the same ones (the decisions that choose a
round are computed from gathered, identical numbers):

1. agreement: each rank's columns, its vocabulary size and a digest of everything that
   must be shared (:func:`~specdec_np._sharded.exchange.agree`);
2. maxima: per row the largest ``z``, its count of ``+inf`` and the largest finite logit
   (sampled requests' logits rows), the largest raw value and its first id (greedy
   requests' rows), and in the same ``allgather`` top-k's candidate lists
   (:mod:`~specdec_np._sharded.filters`);
3. the filters' floors: none more for top-k (up to its lists' length), top-p over top-k's
   set and min-p; one for top-p alone; radix selects where the lists leave a cutoff open;
   one for llama.cpp's lowest kept logit;
4. per row the kept mass and the drafted token's weight (its owner's);
5. the two rounds of the residual and bonus draws, when a request draws.

Then every rank decides every acceptance from the same numbers, all requests at once.
Logits rows handed over as CuPy arrays stay on their device (the passes of
:mod:`.laws` and :mod:`.rows` run there); probability rows are read on the host.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import _core, registry
from .._reference.chains import _path_weights
from .._runtime import checks as _validate
from .._runtime.arrays import is_cupy_array
from .._runtime.contract import ENTROPY_EPSILON
from .._runtime.results import VerificationResult
from .._runtime.uniforms import RejectionUniforms
from . import filters as _filters
from . import laws as _laws
from . import rows as _rows
from .exchange import Exchange, agree, digest

__all__ = ["ShardedResult", "verify_ragged"]

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False
_NO_WEIGHTS = np.zeros(0)
_NO_WEIGHTS.flags.writeable = False
#: The sparse part of rows held whole (read only: shared by every call).
_NO_ENTRIES = _rows.Sparse(_NO_ROWS, _NO_ROWS, _NO_WEIGHTS)

#: The chain methods a sharded call verifies with: every registry verifier has its rounds
#: here (a new one must add its own before it is listed).
METHODS = registry.names()


class ShardedResult(VerificationResult):  # numpydoc ignore=PR01
    """:class:`~specdec_np.VerificationResult`, the same on every rank, plus what the call
    cost in communication.

    Attributes
    ----------
    exchanged_bytes : int
        The bytes this rank handed ``allgather``.
    gather_bytes : int
        What all-gathering this call's rows would have cost this rank: ``rows x
        vocab_size x itemsize`` (target and draft rows).
    rounds : int
        The allgather calls the call made.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec_np import VerificationResult, sharded
    >>> def rank(communicator):
    ...     return sharded.verify_ragged(
    ...         communicator=communicator, vocab_start=0, vocab_size=3,
    ...         num_draft_tokens=np.array([0]), draft_token_ids=np.array([], dtype=np.int64),
    ...         target_logits=np.array([[0.0, 2.0, 1.0]]), temperature=0.0)
    >>> result = sharded.run_local(1, rank)[0]
    >>> isinstance(result, VerificationResult), result.output_token_ids, result.rounds > 0
    (True, array([[1]]), True)
    """

    exchanged_bytes: int
    gather_bytes: int
    rounds: int


def _per_request(name: str, value: Any, batch_size: int, off: float) -> np.ndarray:
    """A scalar, ``[B]`` array or None as float64 ``[B]``."""
    if value is None:
        return _rows.filled(batch_size, off, dtype=np.float64)
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        return _rows.filled(batch_size, float(array), dtype=np.float64)
    if array.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or have shape [B] = [{batch_size}]; found shape "
            f"{_validate.shape_text(array.shape)}"
        )
    return array.copy()


def _scalars_pass(temperature: Any, top_k: Any, top_p: Any, min_p: Any) -> bool:
    """Whether the settings given as None or Python scalars pass :func:`_check_settings`'s
    rules, decided without NumPy (False: let the arrays' check decide, and name the
    request)."""
    values = []
    for value, off in ((temperature, 1.0), (top_k, 0.0), (top_p, 1.0), (min_p, 0.0)):
        if value is None:
            values.append(off)
        elif type(value) in (int, float):
            values.append(float(value))
        else:
            return False
    t, k, p, m = values
    return (
        0.0 <= t < math.inf
        and 0.0 <= k < math.inf
        and k == math.floor(k)
        and 0.0 < p <= 1.0
        and 0.0 <= m <= 1.0
    )


def _check_settings(
    temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray
) -> None:
    checks = (
        ("temperature", temperature, (temperature >= 0) & np.isfinite(temperature), ">= 0"),
        ("top_k", top_k, (top_k >= 0) & (top_k == np.floor(top_k)), "an int >= 0"),
        ("top_p", top_p, (top_p > 0) & (top_p <= 1), "in (0, 1]"),
        ("min_p", min_p, (min_p >= 0) & (min_p <= 1), "in [0, 1]"),
    )
    for name, values, good, rule in checks:
        bad = (~good).nonzero()[0]
        if bad.size:
            raise ValueError(
                f"{name} must be {rule} for every request; found {values[bad[0]]!r} for "
                f"request {int(bad[0])}"
            )


def _ids(name: str, value: Any, shape: tuple[int, ...], vocab_size: int) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers; found dtype {array.dtype}")
    if array.shape != shape:
        raise ValueError(
            f"{name} must have shape {list(shape)}; found shape "
            f"{_validate.shape_text(array.shape)}"
        )
    array = array.astype(np.int64)
    bad = ((array < 0) | (array >= vocab_size)).nonzero()[0]
    if bad.size:
        raise ValueError(
            f"{name}[{int(bad[0])}] = {int(array[bad[0]])} is outside the vocabulary "
            f"0 .. {vocab_size - 1}"
        )
    return array


def _row_block(name: str, value: Any, num_rows: int, width: int | None) -> Any:
    array = value if is_cupy_array(value) else np.asarray(value)
    if array.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64; found dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] != num_rows or (
        width is not None and array.shape[1] != width
    ):
        expected = f"[{num_rows}, {'width' if width is None else width}]"
        raise ValueError(
            f"{name} must have shape {expected} (this rank's columns); found shape "
            f"{_validate.shape_text(array.shape)}"
        )
    return array


class _Call:
    """One rank's checked call: its rows, the shared settings and the uniforms."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        a = arguments
        self.vocab_size = _validate.check_integer("vocab_size", a["vocab_size"], 1)
        self.start = _validate.check_integer("vocab_start", a["vocab_start"])
        self.method = str(a["method"])
        if self.method not in METHODS:
            raise ValueError(
                f"method={self.method!r} is not verified across shards yet; use one of "
                f"{list(METHODS)} (temperature 0 makes a request greedy)"
            )
        self.verifier = registry.get(self.method)
        self.parameters = _validate.check_method_parameters(
            self.verifier, a["method_parameters"]
        )
        if a["filter_order"] not in ("vllm", "llama.cpp"):
            raise ValueError(
                f"filter_order must be 'vllm' or 'llama.cpp'; found {a['filter_order']!r}"
            )
        self.filter_order = a["filter_order"]
        counts = np.asarray(a["num_draft_tokens"])
        if counts.ndim != 1 or (counts.size and counts.dtype.kind not in "iu"):
            raise ValueError("num_draft_tokens must be an int array of shape [B]")
        counts = counts.astype(np.int64)
        if np.count_nonzero(counts < 0):
            raise ValueError("num_draft_tokens must be >= 0 for every request")
        self.counts = counts
        batch_size = self.batch_size = int(counts.shape[0])
        self.offsets = np.zeros(batch_size + 1, dtype=np.int64)
        counts.cumsum(out=self.offsets[1:])
        total = self.total = int(self.offsets[-1])
        self.max_k = int(counts.max(initial=0))
        self.draft_ids = _ids("draft_token_ids", a["draft_token_ids"], (total,), self.vocab_size)
        self.bonus_ids = None
        if a["bonus_token_ids"] is not None:
            self.bonus_ids = _ids(
                "bonus_token_ids",
                np.reshape(np.asarray(a["bonus_token_ids"]), (-1,)),
                (batch_size,),
                self.vocab_size,
            )
        if (a["target_logits"] is None) == (a["target_probs"] is None):
            raise ValueError("give exactly one of target_logits and target_probs")
        if a["draft_logits"] is not None and a["draft_probs"] is not None:
            raise ValueError("give at most one of draft_logits and draft_probs")
        self.from_logits = a["target_logits"] is not None
        target_name = "target_logits" if self.from_logits else "target_probs"
        target_value = a[target_name]
        self.bonus_rows = not (
            self.bonus_ids is not None and np.shape(target_value)[:1] == (total,)
        )
        num_rows = total + batch_size * self.bonus_rows
        self.target = _row_block(target_name, target_value, num_rows, None)
        self.width = int(self.target.shape[1])
        self.draft_from_logits = a["draft_logits"] is not None
        draft_name = "draft_logits" if self.draft_from_logits else "draft_probs"
        self.draft = None
        if a[draft_name] is not None and self.verifier.reads_draft_probs:
            self.draft = _row_block(draft_name, a[draft_name], total, self.width)
            if self.draft.dtype != self.target.dtype:
                raise TypeError(
                    f"{draft_name} must have the target's dtype {self.target.dtype}; found "
                    f"{self.draft.dtype}"
                )
        # CuPy rows stay on their device for the passes over them; probability rows (and
        # their draft rows) are read on the host.
        if self.draft is not None and is_cupy_array(self.draft) != is_cupy_array(self.target):
            raise TypeError(
                f"{draft_name} must be the same kind of array as {target_name} (both CuPy "
                "arrays or neither)"
            )
        if is_cupy_array(self.target) and not self.from_logits:
            self.target = self.target.get()
            self.draft = None if self.draft is None else self.draft.get()
        if self.start + self.width > self.vocab_size:
            raise ValueError(
                f"vocab_start + width = {self.start} + {self.width} exceeds vocab_size = "
                f"{self.vocab_size}"
            )
        self.temperature = _per_request("temperature", a["temperature"], batch_size, 1.0)
        self.top_k = _per_request("top_k", a["top_k"], batch_size, 0.0)
        self.top_p = _per_request("top_p", a["top_p"], batch_size, 1.0)
        self.min_p = _per_request("min_p", a["min_p"], batch_size, 0.0)
        if not _scalars_pass(a["temperature"], a["top_k"], a["top_p"], a["min_p"]):
            _check_settings(self.temperature, self.top_k, self.top_p, self.min_p)
        filtered = a["top_k"] is not None or a["top_p"] is not None or a["min_p"] is not None
        # Without top_k, top_p and min_p no row is filtered: the filters' rounds and lists
        # are skipped without looking at the settings.
        self.filters_given = filtered
        if not self.from_logits and filtered:
            raise ValueError(
                "top_k, top_p and min_p filter logits rows; target_probs are taken as "
                "already processed"
            )
        self.greedy = (self.temperature == 0.0) | (self.method == "greedy")
        self.any_greedy = bool(np.count_nonzero(self.greedy))
        widths = np.where(self.greedy, 0, counts + 2) if self.any_greedy else counts + 2
        self.source = RejectionUniforms(
            batch_size,
            self.max_k + 1,
            np,
            uniforms=a["uniforms"],
            generator=a["generator"],
            seeded_seqs=a["seeded_seqs"],
            counter_seeds=a["counter_seeds"],
            row_widths=widths,
        )
        if (
            np.count_nonzero(widths)
            and a["uniforms"] is None
            and a["generator"] is None
            and len(a["seeded_seqs"] or {}) + len(a["counter_seeds"] or {})
            < int(np.count_nonzero(widths))
        ):
            raise ValueError(
                "a sharded call needs the same randomness on every rank: give uniforms, "
                "counter_seeds, seeded_seqs or a generator seeded alike on every rank (a "
                "fresh unseeded generator per rank would draw other uniforms on each)"
            )
        self.widths = widths
        self.uniforms = np.empty((batch_size, self.max_k + 2))

    def settings_digest(self) -> np.ndarray:
        """Everything every rank must share, the uniforms it will use included."""
        row_width = self.max_k + 2
        uniforms = self.uniforms
        if int(self.widths.min(initial=row_width)) < row_width:
            # Uniforms no request reads may differ between ranks: they digest as 0.
            used = np.arange(row_width)[None, :] < self.widths[:, None]
            uniforms = np.where(used, uniforms, 0.0)
        return digest(
            self.method,
            self.parameters,
            self.filter_order,
            self.from_logits,
            self.draft_from_logits,
            self.draft is not None,
            self.bonus_rows,
            self.target.dtype.str,
            self.vocab_size,
            self.counts,
            self.draft_ids,
            self.bonus_ids,
            self.temperature,
            self.top_k,
            self.top_p,
            self.min_p,
            uniforms,
        )


def verify_ragged(*, communicator: Any, **arguments: Any) -> ShardedResult:
    """The rank-local ragged call (see :func:`specdec_np.sharded.verify_ragged`).

    Parameters
    ----------
    communicator : Communicator
    **arguments
        The checked front's keywords.

    Returns
    -------
    ShardedResult
    """
    exchange = Exchange(communicator)
    call: _Call | None = None
    error: BaseException | None = None
    try:
        call = _Call(arguments)
        call.uniforms[:, : call.max_k + 2] = call.source.draw()
        settings = call.settings_digest()
    except (TypeError, ValueError) as refused:
        error, settings = refused, None
    start = 0 if call is None else call.start
    width = 0 if call is None else call.width
    vocab_size = 0 if call is None else call.vocab_size
    try:
        shard = agree(exchange, start, width, vocab_size, settings, error)
    except ValueError:
        if call is not None:
            call.source.undo()
        raise
    if call is None:
        # agree() raises on every rank when any rank's own checks refused its input.
        raise RuntimeError("the sharded call's agreement passed a rank whose input was refused")
    return _verify(exchange, shard, call)


def _verify(exchange: Exchange, shard: Any, call: _Call) -> ShardedResult:
    rows = _Rows(call)
    dtype = call.target.dtype
    # Round: maxima of the sampled logits rows, argmaxes of the greedy rows, and the
    # top-k rows' candidate lists (which need no maximum).
    law = _law_rows(call, rows)
    z, requests = law.z, law.requests
    count = z.count
    top_k: np.ndarray | None = None
    top_p = min_p = top_k
    filtering = llama_cpp = False
    size = 0
    if call.filters_given:
        top_k = call.top_k[requests].astype(np.int64)
        top_p, min_p = call.top_p[requests], call.min_p[requests]
        # Without a filter both orders keep every entry: llama.cpp's rounds only when one
        # is on.
        any_filter = ((top_k > 0) & (top_k < call.vocab_size)) | (top_p < 1.0) | (min_p > 0.0)
        filtering = bool(np.count_nonzero(any_filter))
        llama_cpp = call.filter_order == "llama.cpp" and filtering
        # The same pass as the maxima finds the maxima of sets of columns, a bound for the
        # candidates.
        size = _filters.candidate_count(top_k, top_p, call.vocab_size)
    # What the filters select on: z in vLLM's order, the logits in llama.cpp's.
    values = z.with_divisor(np.ones(count, dtype=dtype)) if llama_cpp else z
    greedy_rows = rows.greedy_target.size
    local = np.zeros((count + greedy_rows, 3))
    local[:count], group_maxima = z.maxima(8 * size)
    if greedy_rows:
        local[count:, :2] = _rows.argmax_table(call.target[rows.greedy_target], call.start)
    early = _NO_ROWS if top_k is None else _filters.early_rows(top_k, call.vocab_size)
    listing = None
    if early.size and top_k is not None:
        listing = _filters.list_candidates(
            values, early, int(top_k[early].max()), None,
            None if group_maxima is None else group_maxima[early],
        )
        gathered, gathered_lists = exchange.gather_many([local, listing.record])
    else:
        gathered = exchange.gather(local)
    z_top = gathered[:, :count, 0].max(axis=0)
    infinite = gathered[:, :count, 1].sum(axis=0) > 0
    largest_logit = gathered[:, :count, 2].max(axis=0)
    _check_overflow(call, largest_logit, requests, law.names, z.divisor)
    argmax = _rows.filled(call.target.shape[0], -1, dtype=np.int64)
    if greedy_rows:
        argmax[rows.greedy_target] = _rows.global_argmax(gathered[:, count:, :2])

    # Rounds: the filters (none without one), then the kept masses and the drafted tokens'
    # weights.
    no_mass = ~(z_top > -np.inf)
    on = ~infinite & ~no_mass
    floors = None
    kept = covered = None
    if filtering and top_k is not None and top_p is not None and min_p is not None:
        values_top = largest_logit.astype(dtype) if llama_cpp else z_top.astype(dtype)
        found = _filters.select_floors(
            exchange, values, values_top, on, top_k, top_p, min_p, call.vocab_size, llama_cpp,
            group_maxima, None if listing is None else (listing, gathered_lists),
        )
        filtered = found.filtered & on
        floors = _rows.filled(count, np.nan, dtype=dtype)
        if llama_cpp:
            # The law keeps z >= c_low / t, c_low the lowest logit the filters keep.
            floor_values = _rows.key_values(found.keys, dtype)
            lowest_local = _rows.filled(count, np.inf)
            at = filtered.nonzero()[0]
            if at.size:
                chosen = values.values(at)
                lowest_local[at] = np.min(
                    np.where(chosen >= floor_values[at, None], chosen, np.inf),
                    axis=1, initial=np.inf,
                )
            lowest = exchange.gather(lowest_local).min(axis=0)
            temperature = call.temperature[requests].astype(dtype)
            floors[at] = lowest[at].astype(dtype) / temperature[at]
        else:
            floors[filtered] = _rows.key_values(found.keys[filtered], dtype)
            # The candidates hold every kept entry of a row whose floor reaches them.
            kept = found.candidates
            covered = filtered & (floors >= found.thresholds)
    laws = _laws.LawRows(z, z_top.astype(dtype), infinite, no_mass, floors, kept, covered)
    read = rows.read
    local = np.zeros((read.total, 2))
    owner = (read.tokens >= call.start) & (read.tokens < call.start + call.width)
    column = np.where(owner, read.tokens - call.start, 0)
    # Every row read a law row, in the same order: one lookup of the drafted tokens'
    # weights for all of them.
    all_laws = call.from_logits and (call.draft is None or rows.draft_laws)
    if all_laws:
        local[:, 0] = laws.masses
        mine = owner.nonzero()[0]
        local[mine, 1] = laws.token_weights(mine, column[mine])
    else:
        local[: law.target_count, 0] = laws.masses[: law.target_count]
        if law.draft_count:
            local[read.draft_first :, 0] = laws.masses[law.target_count :]
        if call.from_logits:
            mine = owner[: read.draft_first].nonzero()[0]
            local[mine, 1] = laws.token_weights(mine, column[mine])
        else:
            target_rows = call.target[rows.sampled_target].astype(np.float64)
            local[: read.draft_first, 0] = target_rows.sum(axis=1)
            mine = owner[: read.draft_first].nonzero()[0]
            local[mine, 1] = target_rows[mine, column[mine]]
        if call.draft is not None:
            mine = read.draft_first + owner[read.draft_first :].nonzero()[0]
            if rows.draft_laws:
                law_rows = law.target_count + (mine - read.draft_first)
                local[mine, 1] = laws.token_weights(law_rows, column[mine])
            else:
                draft_rows = _clean(call.draft[rows.sampled_draft])
                local[read.draft_first :, 0] = _rows.to_host(draft_rows.sum(axis=1))
                local[mine, 1] = _rows.to_host(
                    draft_rows[mine - read.draft_first, column[mine]]
                )
    totals = _rows.row_totals(exchange, local)
    normaliser = totals[:, 0].copy()
    if not call.from_logits:
        normaliser[: read.draft_first] = 1.0
    if call.draft is not None and not rows.draft_laws:
        normaliser[read.draft_first :] = 1.0
    positive = normaliser > 0.0
    value = np.where(positive, totals[:, 1] / np.where(positive, normaliser, 1), 0.0)
    # The law rows' probabilities as the kernels store them, in the rows' dtype.
    if all_laws:
        value = value.astype(dtype).astype(np.float64)
    else:
        law_read = np.zeros(read.total, dtype=bool)
        law_read[: read.draft_first] = call.from_logits
        law_read[read.draft_first :] = rows.draft_laws
        value[law_read] = value[law_read].astype(dtype).astype(np.float64)

    rows_of = _RowSource(call, rows, law, laws, normaliser)
    decided = _decide(exchange, call, rows, rows_of, value)
    output, lengths = decided.output, decided.lengths
    # Greedy requests.
    if call.any_greedy:
        _greedy(call, rows, argmax, call.greedy.nonzero()[0], output, lengths)
    # Rounds: the residual and bonus draws, two-level.
    if decided.draws.size:
        draws = decided.draws
        positions = lengths[draws]
        bonus = positions == call.counts[draws]
        scale = decided.scale[draws]
        draft_rows = call.offsets[draws] + positions
        v = call.uniforms[draws, call.counts[draws] + bonus]
        target_rows = rows.first_target[draws] + positions
        dense = rows_of.dense_draws(target_rows, draft_rows, bonus, scale)
        if dense is not None:
            # Rows without a filter: p, the residuals and both masses by one compiled call.
            p, weights, masses = dense
            drawn = _rows.draw(exchange, shard, call.start, weights, p, v, masses)
        else:
            drawn = _draw_rows(exchange, shard, call, rows_of, target_rows, draft_rows, bonus,
                               scale, v)
        empty = drawn.empty.nonzero()[0]
        if empty.size:
            name = "target_logits" if call.from_logits else "target_probs"
            raise ValueError(
                f"{name}: request {int(draws[empty[0]])} must draw a token from a row with "
                "no positive probability"
            )
        output[draws, positions] = drawn.tokens
    itemsize = dtype.itemsize
    read_rows = call.target.shape[0] + (0 if call.draft is None else call.draft.shape[0])
    result = ShardedResult(output, lengths, lengths.copy(), call.total)
    result.exchanged_bytes = exchange.sent_bytes
    result.gather_bytes = read_rows * call.vocab_size * itemsize
    result.rounds = exchange.rounds
    return result


def _draw_rows(
    exchange: Exchange, shard: Any, call: _Call, rows_of: _RowSource, target_rows: np.ndarray,
    draft_rows: np.ndarray, bonus: np.ndarray, scale: np.ndarray, v: np.ndarray,
) -> _rows.Draws:
    """The draws of any rows: ``p`` where it may be positive, the residual ``max(rho p - q,
    0)`` (0 elsewhere), and the two-level draw."""
    p = rows_of.target_rows(target_rows)
    residual = p.dense.copy()
    rejected = (~bonus[p.dense_rows]).nonzero()[0]
    if rejected.size:
        chosen = p.dense_rows[rejected]
        q = rows_of.draft(draft_rows[chosen])
        # max(rho p - q, 0) in place, one compiled pass a row (the NumPy expression's
        # bits, but for the sign of a zero, which weighs nothing).
        _rows.passes(residual).shard_residuals(
            residual, rejected.astype(np.int64),
            np.ascontiguousarray(scale[chosen], dtype=np.float64),
            _rows.library(q).ascontiguousarray(q, dtype=np.float64),
        )
    entries = p.sparse
    sparse_residual = entries.weights.copy()
    rejected = (~bonus[entries.rows]).nonzero()[0]
    if rejected.size:
        chosen = entries.rows[rejected]
        q_entries = rows_of.draft_entries(draft_rows[chosen], entries.columns[rejected])
        sparse_residual[rejected] = np.maximum(
            scale[chosen] * entries.weights[rejected] - q_entries, 0.0
        )
    weights = _rows.RowSet(
        p.num_rows, p.dense_rows, residual,
        _rows.Sparse(entries.rows, entries.columns, sparse_residual),
    )
    return _rows.draw(exchange, shard, call.start, weights, p, v)


class _Read(NamedTuple):
    """The rows whose masses and drafted values the totals round carries: the sampled
    requests' target rows, then their draft rows (when draft rows are given)."""

    total: int
    draft_first: int
    tokens: np.ndarray


class _Rows:
    """Where each request's rows lie (every array in request order)."""

    def __init__(self, call: _Call) -> None:
        batch_size, counts = call.batch_size, call.counts
        requests = np.arange(batch_size)
        self.first_target = call.offsets[:-1] + requests * call.bonus_rows
        per_request = counts + call.bonus_rows
        request_of_target = self.request_of_target = requests.repeat(per_request)
        request_of_draft = self.request_of_draft = requests.repeat(counts)
        num_rows = call.target.shape[0]
        if call.any_greedy:
            sampled = ~call.greedy
            self.sampled_target = sampled[request_of_target].nonzero()[0]
            self.greedy_target = call.greedy[request_of_target].nonzero()[0]
            self.sampled_draft = sampled[request_of_draft].nonzero()[0]
        else:
            self.sampled_target = np.arange(num_rows)
            self.greedy_target = _NO_ROWS
            self.sampled_draft = np.arange(call.total)
        # The drafted token each target row tests (-1 at a bonus row).
        # Draft position d of request b tests target row d + b (d without bonus rows).
        self.target_token = _rows.filled(num_rows, -1, dtype=np.int64)
        if call.bonus_rows:
            self.target_token[np.arange(call.total) + request_of_draft] = call.draft_ids
        else:
            self.target_token[: call.total] = call.draft_ids
        # Row index -> its place among the rows read (-1: not read).  Without greedy
        # requests every row is read, in order: the places are the rows (one array, which
        # nothing writes after this).
        self.draft_laws = call.draft is not None and call.draft_from_logits
        draft_first = self.sampled_target.size
        read_drafts = 0 if call.draft is None else self.sampled_draft.size
        all_tokens = np.empty(draft_first + read_drafts, dtype=np.int64)
        if call.any_greedy:
            self.target_at = _rows.filled(num_rows, -1, dtype=np.int64)
            self.target_at[self.sampled_target] = np.arange(self.sampled_target.size)
            self.draft_at = _rows.filled(call.total, -1, dtype=np.int64)
            if call.draft is not None:
                self.draft_at[self.sampled_draft] = draft_first + np.arange(read_drafts)
            all_tokens[:draft_first] = self.target_token[self.sampled_target]
            all_tokens[draft_first:] = call.draft_ids[self.sampled_draft[:read_drafts]]
        else:
            self.target_at = self.sampled_target
            self.draft_at = (_rows.filled(call.total, -1, dtype=np.int64) if call.draft is None
                             else draft_first + self.sampled_draft)
            all_tokens[:draft_first] = self.target_token
            all_tokens[draft_first:] = call.draft_ids[:read_drafts]
        self.read = _Read(all_tokens.size, draft_first, all_tokens)


class _LawBlocks(NamedTuple):
    """The sampled logits rows, target then draft, seen as ``z``; every row's request and
    the argument names."""

    z: _laws.LogitRows
    requests: np.ndarray
    names: list[tuple[str, np.ndarray]]
    target_count: int
    draft_count: int


def _law_rows(call: _Call, rows: _Rows) -> _LawBlocks:
    dtype = call.target.dtype
    parts: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    if call.from_logits:
        parts.append(("target_logits", call.target, rows.sampled_target,
                      rows.request_of_target[rows.sampled_target]))
    if rows.draft_laws and call.draft is not None:
        parts.append(("draft_logits", call.draft, rows.sampled_draft,
                      rows.request_of_draft[rows.sampled_draft]))
    arrays = []
    for _, source, indices, _ in parts:
        whole = indices.size == source.shape[0]
        arrays.append(_rows.library(source).ascontiguousarray(source if whole
                                                              else source[indices]))
    requests = (np.concatenate([owners for *_, owners in parts]) if parts
                else np.zeros(0, dtype=np.int64))
    temperature = call.temperature[requests].astype(dtype)
    if not arrays:
        arrays = [np.zeros((0, call.width), dtype=dtype)]
    target_count = parts[0][2].size if parts and parts[0][0] == "target_logits" else 0
    return _LawBlocks(
        _laws.LogitRows(arrays, temperature), requests,
        [(name, indices) for name, _, indices, _ in parts],
        target_count, int(requests.size) - target_count,
    )


def _clean(rows: Any) -> Any:
    """Draft probabilities as the kernels read them: negative and NaN entries as 0 (where
    the rows lie)."""
    xp = _rows.library(rows)
    return xp.maximum(xp.nan_to_num(rows.astype(np.float64)), 0.0)


class _RowSource:
    """Dense rows on this rank's columns, float64: ``p`` of target rows, ``q`` of draft
    rows (``inf`` at a point-mass draft's token, so that ``p - q`` is never positive
    there)."""

    def __init__(self, call: _Call, rows: _Rows, law: _LawBlocks, laws: _laws.LawRows,
                 normaliser: np.ndarray) -> None:
        self.call, self.rows, self.law, self.laws = call, rows, law, laws
        self.normaliser = normaliser

    def target(self, indices: np.ndarray) -> np.ndarray:
        """``p`` of target rows ``indices``."""
        read = self.rows.target_at[indices]
        if self.call.from_logits:
            return self.laws.probabilities(read, self.normaliser[read])
        return self.call.target[indices].astype(np.float64)

    def draft(self, indices: np.ndarray) -> np.ndarray:
        """``q`` of draft rows ``indices`` (flat draft positions)."""
        call = self.call
        if call.draft is None:
            q = _rows.library(call.target).zeros((indices.size, call.width))
            tokens = call.draft_ids[indices]
            owned = ((tokens >= call.start) & (tokens < call.start + call.width)).nonzero()[0]
            q[owned, tokens[owned] - call.start] = np.inf
            return q
        read = self.rows.draft_at[indices]
        if self.rows.draft_laws:
            law_rows = self.law.target_count + (read - self.rows.read.draft_first)
            return self.laws.probabilities(law_rows, self.normaliser[read])
        return _clean(call.draft[indices])

    def dense_draws(
        self, target_rows: np.ndarray, draft_rows: np.ndarray, bonus: np.ndarray,
        scale: np.ndarray,
    ) -> tuple[_rows.RowSet, _rows.RowSet, np.ndarray] | None:
        """Where every draw reads logits rows without a filter or ``+inf`` (and a draft
        law row where it draws a residual), on the host: ``p`` and the residuals as
        :class:`~.rows.RowSet` s held whole and the masses ``[D, 2]`` (residual, ``p``)
        by ``_core``'s ``dense_draw_rows`` (the general path's passes, one call); else
        None."""
        call, laws = self.call, self.laws
        if not call.from_logits or laws.library is not np or not laws.width:
            return None
        read = self.rows.target_at[target_rows]
        p_rows = laws.dense_at[read]
        if np.count_nonzero(p_rows < 0):
            return None
        count = target_rows.size
        q_rows = _rows.filled(count, -1, dtype=np.int64)
        q_masses = np.zeros(count)
        rejected = (~bonus).nonzero()[0]
        if rejected.size:
            if call.draft is None or not self.rows.draft_laws:
                return None
            read_q = self.rows.draft_at[draft_rows[rejected]]
            found = laws.dense_at[self.law.target_count + (read_q - self.rows.read.draft_first)]
            if np.count_nonzero(found < 0):
                return None
            q_rows[rejected] = found
            q_masses[rejected] = self.normaliser[read_q]
        p = np.empty((count, laws.width))
        residual = np.empty((count, laws.width))
        masses = np.empty((count, 2))
        _core.dense_draw_rows(laws.dense_weights, p_rows, self.normaliser[read], q_rows,
                              q_masses, np.ascontiguousarray(scale, dtype=np.float64), p,
                              residual, masses)
        every = np.arange(count)
        return (_rows.RowSet(count, every, p, _NO_ENTRIES),
                _rows.RowSet(count, every, residual, _NO_ENTRIES), masses)

    def target_rows(self, indices: np.ndarray) -> _rows.RowSet:
        """``p`` of target rows ``indices`` where it may be positive."""
        read = self.rows.target_at[indices]
        if self.call.from_logits:
            return self.laws.probability_rows(read, self.normaliser[read])
        empty = np.zeros(0, dtype=np.int64)
        return _rows.RowSet(indices.size, np.arange(indices.size),
                            self.call.target[indices].astype(np.float64),
                            _rows.Sparse(empty, empty, np.zeros(0)))

    def draft_entries(self, indices: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``q`` of draft rows ``indices[i]`` at this rank's columns ``columns[i]``."""
        call = self.call
        if call.draft is None:
            hit = call.draft_ids[indices] == call.start + columns
            return np.where(hit, np.inf, 0.0)
        read = self.rows.draft_at[indices]
        if self.rows.draft_laws:
            law_rows = self.law.target_count + (read - self.rows.read.draft_first)
            return self.laws.entry_probabilities(law_rows, columns, self.normaliser[read])
        return _rows.to_host(_clean(call.draft[indices, columns]))


class _Decided(NamedTuple):
    output: np.ndarray
    lengths: np.ndarray
    draws: np.ndarray  # requests that draw, in request order
    scale: np.ndarray  # per request: the residual's scale (block's rho_r, else 1)


def _decide(
    exchange: Exchange, call: _Call, rows: _Rows, source: _RowSource, value: np.ndarray
) -> _Decided:
    """Every sampled request's accepted length, from the gathered numbers alone (plus one
    round for block verification, one for typical acceptance), and the requests that
    draw: a rejection's residual, or the bonus token where no bonus id is given."""
    batch_size, counts = call.batch_size, call.counts
    output = _rows.filled((batch_size, call.max_k + 1), -1, dtype=np.int64)
    lengths = np.zeros(batch_size, dtype=np.int64)
    scale = _rows.filled(batch_size, 1.0)
    sampled = (~call.greedy).nonzero()[0] if call.any_greedy else np.arange(batch_size)
    if not sampled.size:
        return _Decided(output, lengths, sampled, scale)
    verifier = call.verifier
    if verifier.stochastic and not verifier.causal_counts:
        # Token-wise rejection: each request's accepted length and ids by one compiled pass
        # (accept while u q < p), the bonus ids and the draws as below.
        _core.rejection_lengths(
            sampled, counts, rows.first_target, rows.target_at, call.offsets, rows.draft_at,
            call.draft_ids, value, call.uniforms, call.draft is not None, output, lengths,
        )
        k = counts[sampled]
        r = lengths[sampled]
        full = r == k
        if call.bonus_ids is not None:
            output[sampled[full], k[full]] = call.bonus_ids[sampled[full]]
            return _Decided(output, lengths, sampled[~full], scale)
        return _Decided(output, lengths, sampled, scale)
    width = max(call.max_k, 1)
    positions = np.arange(width)
    k = counts[sampled]
    valid = positions[None, :] < k[:, None]
    last_target = call.target.shape[0] - 1
    target_rows = np.minimum(rows.first_target[sampled, None] + positions, last_target)
    p_x = np.where(valid, value[rows.target_at[target_rows]], 1.0)
    if call.total:
        draft_rows = np.minimum(call.offsets[sampled, None] + positions, call.total - 1)
        ids = np.where(valid, call.draft_ids[draft_rows], -1)
        if call.draft is not None:
            q_x = np.where(valid, value[rows.draft_at[draft_rows]], 1.0)
        else:
            q_x = np.ones_like(p_x)
    else:
        ids = _rows.filled(valid.shape, -1, dtype=np.int64)
        q_x = np.ones_like(p_x)
    u = call.uniforms[sampled]
    # Block verification or typical acceptance (greedy requests draw nothing here): every
    # (request, position) with a draft, request by request.
    flat = valid.reshape(-1).nonzero()[0]
    at_request = sampled[flat // width]
    at_position = flat % width
    every = np.arange(sampled.size)
    if verifier.causal_counts:
        rho = _path_weights(np, np.where(valid, p_x, 1.0), np.where(valid, q_x, 1.0))
        # The weighted residuals' masses at every position: one round, one number each.
        local = np.zeros(flat.size)
        if flat.size:
            p = _rows.to_host(source.target(rows.first_target[at_request] + at_position))
            q = _rows.to_host(source.draft(call.offsets[at_request] + at_position))
            weighted = rho[:, :width].reshape(-1)[flat, None] * p - q
            local = np.maximum(weighted, 0.0).sum(axis=1)
        flat_masses = np.zeros(valid.size)
        flat_masses[flat] = _rows.row_totals(exchange, local)
        masses = flat_masses.reshape(valid.shape)
        # h_i = R_i / (R_i + 1 - rho_i) for i = 1 .. k - 1 (1 where that is 0), h_k = rho_k.
        slack = masses[:, 1:] + (1.0 - rho[:, 1:width])
        inner = np.where(slack > 0, masses[:, 1:] / np.where(slack > 0, slack, 1.0), 1.0)
        h = np.concatenate([inner, np.zeros((sampled.size, 1))], axis=1)
        h[every, np.maximum(k - 1, 0)] = rho[every, k]
        passing = valid & (u[:, :width] < h)
        last = width - 1 - passing[:, ::-1].argmax(axis=1)
        r = np.where(passing.any(axis=1), last + 1, 0)
        scale[sampled] = np.where(r < k, rho[every, np.minimum(r, width)], 1.0)
    else:
        threshold, alpha = call.parameters
        flat_entropy = np.zeros(valid.size)
        flat_chosen = np.zeros(valid.size, dtype=np.int64)
        if flat.size:
            p = _rows.to_host(source.target(rows.first_target[at_request] + at_position))
            table = np.empty((flat.size, 3))
            with np.errstate(divide="ignore", invalid="ignore"):
                table[:, 0] = -np.sum(p * np.log(p + ENTROPY_EPSILON), axis=1)
            table[:, 1:] = _rows.argmax_table(p, call.start)
            gathered = exchange.gather(table)
            flat_entropy[flat] = gathered[:, :, 0].sum(axis=0)
            flat_chosen[flat] = _rows.global_argmax(gathered[:, :, 1:])
        entropy = flat_entropy.reshape(valid.shape)
        chosen = flat_chosen.reshape(valid.shape)
        scaled = alpha * np.exp(-entropy) if alpha > 0 else np.zeros_like(entropy)
        rejected = valid & ~(p_x > np.minimum(threshold, scaled))
        r = np.where(rejected.any(axis=1), rejected.argmax(axis=1), k)
        stop = (r < k).nonzero()[0]
        output[sampled[stop], r[stop]] = chosen[stop, r[stop]]
    accepted = positions[None, :] < r[:, None]
    output[sampled, :width] = np.where(accepted, ids, output[sampled, :width])
    lengths[sampled] = r
    full = r == k
    if call.bonus_ids is not None:
        output[sampled[full], k[full]] = call.bonus_ids[sampled[full]]
    draws_bonus = full & (call.bonus_ids is None)
    draws = sampled[(~full | draws_bonus) if verifier.stochastic else draws_bonus]
    return _Decided(output, lengths, draws, scale)


def _greedy(call: _Call, rows: _Rows, argmax: np.ndarray, greedy: np.ndarray,
            output: np.ndarray, lengths: np.ndarray) -> None:
    """Greedy requests: accept while the drafted token is the target row's argmax."""
    width = max(call.max_k, 1)
    positions = np.arange(width)
    k = call.counts[greedy]
    valid = positions[None, :] < k[:, None]
    last_target = call.target.shape[0] - 1
    tests = argmax[np.minimum(rows.first_target[greedy, None] + positions, last_target)]
    ids = _rows.filled(valid.shape, -1, dtype=np.int64)
    if call.total:
        draft_rows = np.minimum(call.offsets[greedy, None] + positions, call.total - 1)
        ids = np.where(valid, call.draft_ids[draft_rows], -1)
    rejected = valid & (ids != tests)
    r = np.where(rejected.any(axis=1), rejected.argmax(axis=1), k)
    output[greedy, :width] = np.where(positions[None, :] < r[:, None], ids, -1)
    stop = (r < k).nonzero()[0]
    output[greedy[stop], r[stop]] = tests[stop, r[stop]]
    full = (r == k).nonzero()[0]
    if call.bonus_ids is not None:
        output[greedy[full], k[full]] = call.bonus_ids[greedy[full]]
    else:
        output[greedy[full], k[full]] = argmax[rows.first_target[greedy[full]] + k[full]]
    lengths[greedy] = r


def _check_overflow(
    call: _Call, largest: np.ndarray, requests: np.ndarray, names: list[tuple[str, np.ndarray]],
    divisor: np.ndarray,
) -> None:
    """The unsharded call's refusal of a temperature that makes a row's largest finite
    logit overflow (``docs/semantics.md`` section 12), on the gathered maxima: the same
    ValueError on every rank (``divisor``: the rows' temperatures in the rows' dtype)."""
    dtype = call.target.dtype
    if not np.count_nonzero(divisor < 1):
        return
    # No quotient overflows where every |largest| is at most half the dtype's largest
    # value times the least divisor (NaN and infinities fail the test and are looked at
    # below): the common case, without the division and its error state.
    if float(np.abs(largest).max()) <= 0.5 * float(np.finfo(dtype).max) * float(divisor.min()):
        return
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quotient = largest.astype(dtype) / divisor
    overflow = ((divisor < 1) & np.isfinite(largest) & np.isinf(quotient)).nonzero()[0]
    if not overflow.size:
        return
    first = int(overflow[0])
    request = int(requests[first])
    # The law rows are the target's rows, then the draft's: find the argument and its row.
    sizes = np.cumsum([rows.size for _, rows in names])
    part = int(np.searchsorted(sizes, first, side="right"))
    name, rows = names[part]
    row = int(rows[first - (int(sizes[part - 1]) if part else 0)])
    raise ValueError(
        f"temperature must not make finite logits overflow in {dtype}; found "
        f"{float(call.temperature[request])!r} for request {request}, which divides the "
        f"largest finite logit {float(largest[first])!r} of {name} row {row} to "
        f"{float(quotient[first])}"
    )
