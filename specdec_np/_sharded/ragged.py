"""The ragged call on one rank's vocabulary shard (:func:`specdec_np.sharded.verify_ragged`).

The call runs in rounds, every rank through the same ones (the decisions that choose a
round are computed from gathered, identical numbers):

1. agreement: each rank's columns, its vocabulary size and a digest of everything that
   must be shared (:func:`~specdec_np._sharded.exchange.agree`);
2. maxima: per row the largest ``z`` and its count of ``+inf`` (sampled requests' logits
   rows), the largest raw value and its first id (greedy requests' rows);
3. top-k's floor and top-p's cutoff, when a request has them on: radix selects, 4 rounds
   each for float32 rows, 8 for float64;
4. per row the kept mass and the drafted token's weight (its owner's);
5. the two rounds of the residual and bonus draws, when a request draws.

Then every rank decides every acceptance from the same numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import registry
from .._reference.chains import _path_weights
from .._runtime import checks as _validate
from .._runtime.contract import ENTROPY_EPSILON
from .._runtime.results import VerificationResult
from .._runtime.uniforms import RejectionUniforms
from . import rows as _rows
from .exchange import Exchange, agree, digest

__all__ = ["ShardedResult", "verify_ragged"]

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
        return np.full(batch_size, off, dtype=np.float64)
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        return np.full(batch_size, float(array), dtype=np.float64)
    if array.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or have shape [B] = [{batch_size}]; found shape "
            f"{_validate.shape_text(array.shape)}"
        )
    return array.copy()


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
        bad = np.flatnonzero(~good)
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
    bad = np.flatnonzero((array < 0) | (array >= vocab_size))
    if bad.size:
        raise ValueError(
            f"{name}[{int(bad[0])}] = {int(array[bad[0]])} is outside the vocabulary "
            f"0 .. {vocab_size - 1}"
        )
    return array


def _row_block(name: str, value: Any, num_rows: int, width: int | None) -> np.ndarray:
    array = np.asarray(value)
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
        self.parameters = _validate.check_method_parameters(
            registry.get(self.method), a["method_parameters"]
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
        if (counts < 0).any():
            raise ValueError("num_draft_tokens must be >= 0 for every request")
        self.counts = counts
        batch_size = self.batch_size = int(counts.shape[0])
        total = self.total = int(counts.sum())
        self.max_k = int(counts.max(initial=0))
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
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
        if a[draft_name] is not None and registry.get(self.method).reads_draft_probs:
            self.draft = _row_block(draft_name, a[draft_name], total, self.width)
            if self.draft.dtype != self.target.dtype:
                raise TypeError(
                    f"{draft_name} must have the target's dtype {self.target.dtype}; found "
                    f"{self.draft.dtype}"
                )
        if self.start + self.width > self.vocab_size:
            raise ValueError(
                f"vocab_start + width = {self.start} + {self.width} exceeds vocab_size = "
                f"{self.vocab_size}"
            )
        self.temperature = _per_request("temperature", a["temperature"], batch_size, 1.0)
        self.top_k = _per_request("top_k", a["top_k"], batch_size, 0.0)
        self.top_p = _per_request("top_p", a["top_p"], batch_size, 1.0)
        self.min_p = _per_request("min_p", a["min_p"], batch_size, 0.0)
        _check_settings(self.temperature, self.top_k, self.top_p, self.min_p)
        filtered = any(a[name] is not None for name in ("top_k", "top_p", "min_p"))
        if not self.from_logits and filtered:
            raise ValueError(
                "top_k, top_p and min_p filter logits rows; target_probs are taken as "
                "already processed"
            )
        self.greedy = (self.temperature == 0.0) | (self.method == "greedy")
        widths = np.where(self.greedy, 0, counts + 2)
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
            widths.any()
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
        used = np.arange(self.max_k + 2)[None, :] < self.widths[:, None]
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
            np.where(used, self.uniforms, 0.0),
        )

    def request_rows(self, b: int) -> tuple[int, int]:
        """Request ``b``'s first target row and its number of target rows."""
        return int(self.offsets[b]) + b * self.bonus_rows, int(self.counts[b]) + self.bonus_rows


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
    batch_size, counts = call.batch_size, call.counts
    target, draft = call.target, call.draft
    sampled = np.flatnonzero(~call.greedy)
    greedy = np.flatnonzero(call.greedy)
    # The rows each request reads, as target row indices, in request order.
    target_rows = [np.arange(*_span(call.request_rows(b))) for b in range(batch_size)]
    sampled_target = np.concatenate([target_rows[b] for b in sampled] + [np.zeros(0, int)])
    greedy_target = np.concatenate([target_rows[b] for b in greedy] + [np.zeros(0, int)])
    draft_rows = [np.arange(call.offsets[b], call.offsets[b + 1]) for b in range(batch_size)]
    sampled_draft = np.concatenate([draft_rows[b] for b in sampled] + [np.zeros(0, int)])
    # The drafted token each row tests (-1 at a bonus row).
    target_token = np.full(target.shape[0], -1, dtype=np.int64)
    for b in range(batch_size):
        first, _ = call.request_rows(b)
        target_token[first : first + counts[b]] = call.draft_ids[draft_rows[b]]

    # Round: maxima of the sampled logits rows, argmaxes of the greedy rows.
    law_rows: list[np.ndarray] = []
    law_settings: list[np.ndarray] = []
    law_names: list[tuple[str, np.ndarray]] = []  # each row's argument and row index
    request_of_target = np.repeat(np.arange(batch_size), counts + call.bonus_rows)
    if call.from_logits:
        law_rows.append(target[sampled_target])
        law_settings.append(request_of_target[sampled_target])
        law_names.append(("target_logits", sampled_target))
    draft_laws = draft is not None and call.draft_from_logits
    if draft is not None and call.draft_from_logits:
        law_rows.append(draft[sampled_draft])
        law_settings.append(np.repeat(np.arange(batch_size), counts)[sampled_draft])
        law_names.append(("draft_logits", sampled_draft))
    dtype = target.dtype
    logits = np.concatenate(law_rows) if law_rows else np.zeros((0, call.width), dtype)
    requests = np.concatenate(law_settings) if law_settings else np.zeros(0, np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = logits / call.temperature[requests].astype(dtype)[:, None]
    present = ~np.isnan(z)
    z = np.where(present, z, dtype.type(-np.inf))
    # A third column: the largest finite logit, for the temperature overflow check.
    local = np.zeros((z.shape[0] + greedy_target.size, 3))
    local[: z.shape[0], :2] = _rows.maxima_table(z)
    local[: z.shape[0], 2] = np.max(
        np.where(np.isfinite(logits), logits, -np.inf), axis=1, initial=-np.inf
    )
    local[z.shape[0] :, :2] = _rows.argmax_table(target[greedy_target], call.start)
    gathered = exchange.gather(local)
    maxima = np.stack([gathered[:, : z.shape[0], 0].max(axis=0),
                       gathered[:, : z.shape[0], 1].sum(axis=0)], axis=1)
    _check_overflow(call, gathered[:, : z.shape[0], 2].max(axis=0), requests, law_names)
    argmax = np.full(target.shape[0], -1, dtype=np.int64)
    argmax[greedy_target] = _rows.global_argmax(gathered[:, z.shape[0] :, :2])

    # Rounds: the filters, then the kept masses and the drafted tokens' weights.
    top_k = call.top_k[requests].astype(np.int64)
    top_p, min_p = call.top_p[requests], call.min_p[requests]
    # Without a filter both orders keep every entry: llama.cpp's rounds only when one is on.
    filtered = ((top_k > 0) & (top_k < call.vocab_size)) | (top_p < 1.0) | (min_p > 0.0)
    llama_cpp = None
    if call.filter_order == "llama.cpp" and filtered.any():
        llama_cpp = (logits, call.temperature[requests])
    weights = _rows.kept_weights(
        exchange, z, present, maxima, top_k, top_p, min_p, call.vocab_size, llama_cpp
    )
    target_weights = weights[: sampled_target.size] if call.from_logits else (
        target[sampled_target].astype(np.float64)
    )
    if draft is None:
        draft_weights = None
    elif draft_laws:
        draft_weights = weights[weights.shape[0] - sampled_draft.size :]
    else:
        draft_weights = np.maximum(np.nan_to_num(draft[sampled_draft].astype(np.float64)), 0.0)
    tokens = [target_token[sampled_target]]
    stacked = [target_weights]
    if draft_weights is not None:
        tokens.append(call.draft_ids[sampled_draft])
        stacked.append(draft_weights)
    all_weights = np.concatenate(stacked) if stacked else np.zeros((0, call.width))
    all_tokens = np.concatenate(tokens)
    mine = (all_tokens >= call.start) & (all_tokens < call.start + call.width)
    local = np.zeros((all_tokens.size, 2))
    local[:, 0] = all_weights.sum(axis=1)
    local[mine, 1] = all_weights[np.flatnonzero(mine), all_tokens[mine] - call.start]
    totals = _rows.row_totals(exchange, local)
    normaliser = totals[:, 0]
    if not call.from_logits:
        normaliser[: target_weights.shape[0]] = 1.0
    if draft_weights is not None and not draft_laws:
        normaliser[target_weights.shape[0] :] = 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(normaliser > 0.0, totals[:, 1] / normaliser, 0.0)

    # Every rank decides every request from the same numbers.
    output = np.full((batch_size, call.max_k + 1), -1, dtype=np.int64)
    lengths = np.zeros(batch_size, dtype=np.int64)
    draws: list[tuple[int, np.ndarray, np.ndarray, float]] = []
    target_at = {row: i for i, row in enumerate(sampled_target)}
    draft_at = {row: target_weights.shape[0] + i for i, row in enumerate(sampled_draft)}

    def law_row(row: int) -> np.ndarray:
        return all_weights[row] / _safe(normaliser[row])

    def draft_row(b: int, i: int) -> np.ndarray:
        """``q`` of request ``b``'s position ``i`` on this rank (``inf`` at a point-mass
        draft, so that ``p - q`` is never positive there)."""
        if draft is not None:
            return law_row(draft_at[int(call.offsets[b]) + i])
        q = np.zeros(call.width)
        token = int(call.draft_ids[call.offsets[b] + i])
        if call.start <= token < call.start + call.width:
            q[token - call.start] = np.inf
        return q

    def drafted_values(b: int) -> tuple[np.ndarray, np.ndarray]:
        """Request ``b``'s ``p(x_i)`` and ``q(x_i)``, the same on every rank."""
        first, _ = call.request_rows(b)
        k = int(counts[b])
        p_x = np.array([value[target_at[first + i]] for i in range(k)])
        if draft is None:
            return p_x, np.ones(k)
        return p_x, np.array([value[draft_at[int(call.offsets[b]) + i]] for i in range(k)])

    # Block verification's thresholds need the weighted residuals' masses at every
    # position: one more round, of one number a position.
    block = [int(b) for b in sampled if call.method == "block"]
    path: dict[int, np.ndarray] = {}
    residual_local: list[float] = []
    for b in block:
        p_x, q_x = drafted_values(b)
        path[b] = _path_weights(np, p_x[None, :], q_x[None, :])[0]
        first, _ = call.request_rows(b)
        for i in range(int(counts[b])):
            weighted = path[b][i] * law_row(target_at[first + i]) - draft_row(b, i)
            residual_local.append(float(np.maximum(weighted, 0.0).sum()))
    residual_masses = (
        _rows.row_totals(exchange, np.array(residual_local)) if block else np.zeros(0)
    )
    residual_offsets = np.concatenate([[0], np.cumsum([counts[b] for b in block])]).astype(int)
    block_index = {b: j for j, b in enumerate(block)}

    # Typical acceptance needs every draft position's entropy and, where it rejects, the
    # processed row's argmax: one round of three numbers a position.
    typical_rows = [
        target_at[call.request_rows(int(b))[0] + i]
        for b in sampled
        if call.method == "typical"
        for i in range(int(counts[b]))
    ]
    entropy: dict[int, float] = {}
    typical_argmax: dict[int, int] = {}
    if typical_rows:
        p_rows = np.stack([law_row(row) for row in typical_rows])
        local_table = np.empty((len(typical_rows), 3))
        with np.errstate(divide="ignore", invalid="ignore"):
            local_table[:, 0] = -np.sum(p_rows * np.log(p_rows + ENTROPY_EPSILON), axis=1)
        local_table[:, 1:] = _rows.argmax_table(p_rows, call.start)
        table = exchange.gather(local_table)
        entropies = table[:, :, 0].sum(axis=0)
        maxima_ids = _rows.global_argmax(table[:, :, 1:])
        for j, row in enumerate(typical_rows):
            entropy[row], typical_argmax[row] = float(entropies[j]), int(maxima_ids[j])
    for b in range(batch_size):
        k = int(counts[b])
        first, _ = call.request_rows(b)
        ids = call.draft_ids[draft_rows[b]]
        if call.greedy[b]:
            tests = argmax[first : first + k]
            accepted = np.append(ids == tests, False)
            r = int(np.argmin(accepted))
            output[b, :r] = ids[:r]
            if r < k:
                output[b, r] = tests[r]
            elif call.bonus_ids is not None:
                output[b, r] = call.bonus_ids[b]
            else:
                output[b, r] = argmax[first + k]
            lengths[b] = r
            continue
        u = call.uniforms[b]
        p_x, q_x = drafted_values(b)
        if b in block_index:
            rho = path[b]
            j = residual_offsets[block_index[b]]
            masses = residual_masses[j : j + k]
            slack = masses[1:] + (1.0 - rho[1:k])
            h = np.append(
                np.where(slack > 0, masses[1:] / np.where(slack > 0, slack, 1.0), 1.0), rho[k:]
            )
            passing = np.flatnonzero(u[:k] < h)
            r = int(passing[-1]) + 1 if passing.size else 0
            scale = rho[r] if r < k else 1.0
        elif call.method == "typical":
            threshold, alpha = call.parameters
            rows_b = [target_at[first + i] for i in range(k)]
            h = np.array([entropy[row] for row in rows_b])
            scaled = alpha * np.exp(-h) if alpha > 0 else np.zeros(k)
            rejected = np.flatnonzero(~(p_x > np.minimum(threshold, scaled)))
            r = int(rejected[0]) if rejected.size else k
            output[b, :r] = ids[:r]
            lengths[b] = r
            if r < k:
                output[b, r] = typical_argmax[rows_b[r]]
                continue
            scale = 1.0
        else:
            rejected = np.flatnonzero(~(u[:k] * q_x < p_x))
            r = int(rejected[0]) if rejected.size else k
            scale = 1.0
        output[b, :r] = ids[:r]
        lengths[b] = r
        if r < k:
            p = law_row(target_at[first + r])
            residual = np.maximum(scale * p - draft_row(b, r), 0.0)
            draws.append((b, residual, p, float(u[k])))
        elif call.bonus_ids is not None:
            output[b, r] = call.bonus_ids[b]
        else:
            p = law_row(target_at[first + k])
            draws.append((b, p, p, float(u[k + 1])))

    # Rounds: the residual and bonus draws, two-level.
    if draws:
        drawn = _rows.draw(
            exchange,
            shard,
            call.start,
            np.stack([weights_row for _, weights_row, _, _ in draws]),
            np.stack([fallback for _, _, fallback, _ in draws]),
            np.array([v for _, _, _, v in draws]),
        )
        empty = np.flatnonzero(drawn.empty)
        if empty.size:
            b = draws[int(empty[0])][0]
            name = "target_logits" if call.from_logits else "target_probs"
            raise ValueError(
                f"{name}: request {b} must draw a token from a row with no positive "
                "probability"
            )
        for (b, *_), token in zip(draws, drawn.tokens, strict=True):
            output[b, lengths[b]] = token
    itemsize = target.dtype.itemsize
    read_rows = target.shape[0] + (0 if draft is None else draft.shape[0])
    result = ShardedResult(output, lengths, lengths.copy(), call.total)
    result.exchanged_bytes = exchange.sent_bytes
    result.gather_bytes = read_rows * call.vocab_size * itemsize
    result.rounds = exchange.rounds
    return result


def _check_overflow(
    call: _Call, largest: np.ndarray, requests: np.ndarray, names: list[tuple[str, np.ndarray]]
) -> None:
    """The unsharded call's refusal of a temperature that makes a row's largest finite
    logit overflow (``docs/semantics.md`` section 12), on the gathered maxima: the same
    ValueError on every rank."""
    dtype = call.target.dtype
    divisor = call.temperature[requests].astype(dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quotient = largest.astype(dtype) / divisor
    overflow = np.flatnonzero((divisor < 1) & np.isfinite(largest) & np.isinf(quotient))
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


def _span(first_and_count: tuple[int, int]) -> tuple[int, int]:
    first, count = first_and_count
    return first, first + count


def _safe(normaliser: float) -> float:
    return normaliser if normaliser > 0.0 else 1.0
