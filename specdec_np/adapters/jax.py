"""JAX: :func:`specdec_np.verify_ragged` and :func:`specdec_np.sample_tokens` inside
``jax.jit``.

Both functions take the library's keywords and run the library's CPU kernels through
``jax.pure_callback``, so they work eagerly, under ``jax.jit``, inside ``lax.scan`` /
``lax.while_loop`` bodies and under ``jax.vmap`` (one call per example).  Every shape
is static, as XLA needs:

* ``max_spec_len`` (a Python int) fixes ``output_token_ids`` to ``[B, max_spec_len + 1]``
  (``-1`` after each request's tokens, as in vLLM), whatever the drafts of the step;
* ``B`` is ``num_draft_tokens``'s length and ``T`` is ``draft_token_ids``'s length, so the
  counts may be traced but must add up to ``T``.

**Randomness.** A ``numpy.random.Generator`` cannot cross ``jit``, and a callback that
drew from one would be impure (JAX may drop or repeat a pure callback).  Pass explicit
``uniforms``, made the JAX way from a key, e.g. ``jax.random.uniform(key, (B, max_spec_len
+ 2))`` for :func:`verify_ragged` and ``jax.random.uniform(key, (N,))`` for
:func:`sample_tokens`: float32 (JAX's default) is widened exactly to float64.  The same
key gives the same tokens.  A call whose requests are all greedy (temperature 0) needs
none; a call with a sampled request and no uniforms raises.

**Dtypes.** Logits and probabilities in float32, float64, float16 or bfloat16 (read as
float32); ids in int32 or int64.  The results follow JAX's rules: integer arrays of JAX's
default integer dtype, int32 unless 64-bit mode is on (``jax_enable_x64``), then int64.

**Errors.** The library's checks run in the callback: under ``jit`` a bad input raises
when the computation runs (JAX wraps the library's ``ValueError`` or ``TypeError`` in its
own runtime error, with the library's message); eagerly too.  The arguments this module
can check while tracing (``max_spec_len``, the method, the shapes' ranks) fail at trace
time.

The computation runs on the host: under ``jit`` on a GPU backend, the callback copies the
rows to the host.  JAX is imported only when a function is called, so this module imports
without JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import registry
from .._layouts.processed import sample_tokens as _sample_tokens
from .._layouts.ragged import verify_ragged as _verify_ragged
from .._runtime import checks as _validate

__all__ = ["JaxVerificationResult", "sample_tokens", "verify_ragged"]

#: The placeholder after a request's tokens in ``output_token_ids``.
PLACEHOLDER_TOKEN_ID = -1


class JaxVerificationResult(NamedTuple):  # numpydoc ignore=PR01
    """What :func:`verify_ragged` returns: JAX arrays of JAX's default integer dtype
    (a pytree, so a jitted function can return it or carry it through a loop).

    Attributes
    ----------
    output_token_ids : int [B, max_spec_len + 1]
        Each request's accepted drafts, then its new token, then ``-1``.
    accepted_lengths : int [B]
        Accepted drafts per request; request ``b`` emits ``accepted_lengths[b] + 1``
        tokens.
    num_accepted : int [B]
        Equal to ``accepted_lengths`` (every request stops at its first rejection).
    num_draft_tokens : int []
        The drafts the call verified, ``T``.

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> from specdec_np.adapters import jax as specdec_jax
    >>> logits = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]))
    >>> result = specdec_jax.verify_ragged(
    ...     max_spec_len=2, num_draft_tokens=[1, 0], draft_token_ids=jnp.array([0]),
    ...     target_logits=logits, temperature=0.0)
    >>> result.output_token_ids.tolist(), result.accepted_lengths.tolist()
    ([[0, 2, -1], [2, -1, -1]], [1, 0])
    """

    output_token_ids: Any
    accepted_lengths: Any
    num_accepted: Any
    num_draft_tokens: Any


def _jax() -> Any:
    """Import JAX (only when a function of this module is called)."""
    try:
        import jax
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError(
            "specdec_np.adapters.jax needs JAX; install it with pip install 'jax[cpu]' "
            "(or specdec_np[jax])"
        ) from error
    return jax


@registry.document_methods
def verify_ragged(
    *,
    max_spec_len: int,
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_logits: Any = None,
    target_probs: Any = None,
    draft_logits: Any = None,
    draft_probs: Any = None,
    method: str = "rejection",
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    bonus_token_ids: Any = None,
    uniforms: Any = None,
    strict_mode: bool = False,
    **method_parameters: float,
) -> JaxVerificationResult:
    """:func:`specdec_np.verify_ragged` for JAX arrays, inside ``jax.jit`` or outside.

    Parameters
    ----------
    max_spec_len : int
        A Python int ``>= max(num_draft_tokens)``: the output is ``[B, max_spec_len + 1]``.
    num_draft_tokens : int array [B] or list of int
        ``k_b >= 0`` drafts per request; they must add up to ``T``, the length of
        ``draft_token_ids`` (a static shape).
    draft_token_ids : int32 or int64 [T]
        The drafts, request by request.
    target_logits, target_probs, draft_logits, draft_probs : float [T + B, V] / [T, V]
        As :func:`specdec_np.verify_ragged` takes them; float16 and bfloat16 are read as
        float32.
    method : str
        The verifier of the requests with ``temperature != 0``:
        [[verifier names]]
    temperature, top_k, top_p, min_p : scalar or array [B], optional
        As :func:`specdec_np.verify_ragged` takes them (arrays may be traced).
    filter_order : {"vllm", "llama.cpp"}
        As :func:`specdec_np.verify_ragged` takes it.
    bonus_token_ids : int [B], optional
        As :func:`specdec_np.verify_ragged` takes them (None: drawn from the bonus rows).
    uniforms : float32 or float64 [B, max_spec_len + 2] or [B, max_k + 2], optional
        Needed when a request is sampled (the module docstring), e.g.
        ``jax.random.uniform(key, (B, max_spec_len + 2))``: request ``b`` reads columns
        ``0 .. k_b + 1``, as :func:`specdec_np.verify_ragged` reads them.
    strict_mode : bool
        Also check exact dtypes (float32 rows, int64 ids) and finite rows.
    **method_parameters : float
        The method's parameters (typical acceptance: ``posterior_threshold``,
        ``posterior_alpha``).

    Returns
    -------
    JaxVerificationResult
        JAX arrays of JAX's default integer dtype (int32 without 64-bit mode).

    Raises
    ------
    TypeError, ValueError
        At trace time for ``max_spec_len`` and ``method``; the library's checks when the
        computation runs (under ``jit``, wrapped by JAX's runtime error).
    ImportError
        Without JAX.

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from specdec_np.adapters import jax as specdec_jax
    >>> @jax.jit
    ... def step(logits, drafts, key):
    ...     uniforms = jax.random.uniform(key, (2, 2 + 2))
    ...     return specdec_jax.verify_ragged(
    ...         max_spec_len=2, num_draft_tokens=[2, 1], draft_token_ids=drafts,
    ...         target_logits=logits, temperature=jnp.array([1.0, 0.0]), uniforms=uniforms)
    >>> logits = jax.random.normal(jax.random.key(0), (5, 8))
    >>> step(logits, jnp.array([1, 2, 3]), jax.random.key(1)).output_token_ids.shape
    (2, 3)
    """
    jax = _jax()
    width = _validate.check_integer("max_spec_len", max_spec_len) + 1
    entry = registry.get(method)
    arguments = {
        "num_draft_tokens": num_draft_tokens,
        "draft_token_ids": draft_token_ids,
        "target_logits": target_logits,
        "target_probs": target_probs,
        "draft_logits": draft_logits,
        "draft_probs": draft_probs,
        "method": method,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "filter_order": filter_order,
        "bonus_token_ids": bonus_token_ids,
        "uniforms": uniforms,
        "strict_mode": strict_mode,
        **method_parameters,
    }
    batch_size = len(num_draft_tokens) if isinstance(num_draft_tokens, (list, tuple)) else (
        _static_shape(num_draft_tokens, "num_draft_tokens", 1)[0]
    )
    _static_shape(draft_token_ids, "draft_token_ids", 1)
    integer = jax.dtypes.canonicalize_dtype(np.int64)

    if not isinstance(temperature, (jax.Array, np.ndarray)):
        _check_uniforms_given(arguments, entry.stochastic)  # known while tracing

    def verify(called: dict[str, Any]) -> tuple[np.ndarray, ...]:
        _check_uniforms_given(called, entry.stochastic)
        _fit_uniforms(called, width)
        result = _verify_ragged(**called)
        tokens = np.full((batch_size, width), PLACEHOLDER_TOKEN_ID, dtype=integer)
        given = result.output_token_ids
        tokens[:, : given.shape[1]] = given
        return (
            tokens,
            result.accepted_lengths.astype(integer),
            result.num_accepted.astype(integer),
            np.asarray(result.num_draft_tokens, dtype=integer),
        )

    shapes = (
        jax.ShapeDtypeStruct((batch_size, width), integer),
        jax.ShapeDtypeStruct((batch_size,), integer),
        jax.ShapeDtypeStruct((batch_size,), integer),
        jax.ShapeDtypeStruct((), integer),
    )
    return JaxVerificationResult(*_pure_call(jax, verify, shapes, arguments))


def sample_tokens(
    *,
    logits: Any = None,
    probs: Any = None,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    uniforms: Any = None,
    return_probs: bool = False,
) -> Any:
    """:func:`specdec_np.sample_tokens` for JAX arrays, inside ``jax.jit`` or outside: one
    token per row from its processed law.

    Parameters
    ----------
    logits, probs : float [N, V]
        Exactly one, as :func:`specdec_np.sample_tokens` takes them; float16 and
        bfloat16 are read as float32.
    temperature, top_k, top_p, min_p : scalar or array [N], optional
        As :func:`specdec_np.sample_tokens` takes them (arrays may be traced).
    filter_order : {"vllm", "llama.cpp"}
        As :func:`specdec_np.sample_tokens` takes it.
    uniforms : float32 or float64 [N], optional
        Row ``i``'s token is the inverse-CDF draw at ``uniforms[i]``
        (``jax.random.uniform(key, (N,))``); needed unless every row is greedy.
    return_probs : bool
        A Python bool (static): also return each drawn token's probability, as
        :func:`specdec_np.sample_tokens` does.

    Returns
    -------
    int array [N], or (int array [N], float array [N])
        JAX's default integer dtype (int32 without 64-bit mode); with ``return_probs``
        the pair ``(token_ids, probs)``, ``probs`` of JAX's default float dtype (float64
        in 64-bit mode, else rounded to float32).

    Raises
    ------
    TypeError, ValueError
        The library's checks, when the computation runs.
    ImportError
        Without JAX.

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from specdec_np.adapters import jax as specdec_jax
    >>> draw = jax.jit(lambda logits, uniforms: specdec_jax.sample_tokens(
    ...     logits=logits, uniforms=uniforms))
    >>> draw(jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])), jnp.array([0.6, 0.05]))
    Array([1, 0], dtype=int32)
    """
    jax = _jax()
    if type(return_probs) is not bool:
        raise TypeError(f"return_probs must be a bool; found {type(return_probs).__name__}")
    rows = logits if logits is not None else probs
    count = _static_shape(rows, "logits" if logits is not None else "probs", 2)[0]
    integer = jax.dtypes.canonicalize_dtype(np.int64)
    arguments = {
        "logits": logits,
        "probs": probs,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "filter_order": filter_order,
        "uniforms": uniforms,
    }

    if not isinstance(temperature, (jax.Array, np.ndarray)):
        _check_uniforms_given(arguments, True)  # known while tracing

    def sample(called: dict[str, Any]) -> np.ndarray:
        _check_uniforms_given(called, True)
        return np.asarray(_sample_tokens(**called), dtype=integer)

    if not return_probs:
        return _pure_call(jax, sample, jax.ShapeDtypeStruct((count,), integer), arguments)
    real = jax.dtypes.canonicalize_dtype(np.float64)

    def sample_with_probs(called: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        _check_uniforms_given(called, True)
        token_ids, drawn = _sample_tokens(**called, return_probs=True)
        return np.asarray(token_ids, dtype=integer), np.asarray(drawn, dtype=real)

    shapes = (jax.ShapeDtypeStruct((count,), integer), jax.ShapeDtypeStruct((count,), real))
    return _pure_call(jax, sample_with_probs, shapes, arguments)


def _static_shape(value: Any, name: str, ndim: int) -> tuple[int, ...]:
    """The static shape of an array argument, which the output's shape depends on."""
    shape = getattr(value, "shape", None)
    if shape is None:
        shape = np.shape(value)
    if len(shape) != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''}; found shape "
            f"{_validate.shape_text(tuple(shape))}"
        )
    return tuple(int(size) for size in shape)


def _fit_uniforms(called: dict[str, Any], width: int) -> None:
    """Check that the drafts fit in ``width = max_spec_len + 1`` columns, and cut uniforms
    of the static width ``max_spec_len + 2`` to the ``max_k + 2`` columns the library reads
    (request ``b`` reads columns ``0 .. k_b + 1`` either way)."""
    counts = np.asarray(called["num_draft_tokens"])
    if counts.ndim != 1 or not counts.size or counts.dtype.kind not in "iu":
        return  # the library's checks will say what is wrong, or there is nothing to cut
    if int(counts.max()) >= width:
        raise ValueError(
            f"max_spec_len must be at least the most drafts of a request "
            f"({int(counts.max())}); found {width - 1}"
        )
    uniforms = called["uniforms"]
    if uniforms is not None and uniforms.ndim == 2 and uniforms.shape[1] == width + 1:
        called["uniforms"] = uniforms[:, : int(counts.max()) + 2]


def _check_uniforms_given(called: dict[str, Any], stochastic: bool) -> None:
    """A sampled request needs explicit uniforms: the library's own generator would make
    the callback impure and the tokens irreproducible."""
    if called["uniforms"] is not None or not stochastic:
        return
    temperature = called["temperature"]
    if temperature is None or bool(np.any(np.asarray(temperature) != 0)):
        raise ValueError(
            "uniforms are needed for sampled requests (temperature != 0) under JAX: pass "
            "uniforms=jax.random.uniform(key, shape) (a generator cannot cross jax.jit)"
        )


def _pure_call(
    jax: Any, function: Callable[[dict[str, Any]], Any], shapes: Any, arguments: dict[str, Any]
) -> Any:
    """``function(arguments)`` through ``jax.pure_callback``: the arrays (traced or not)
    cross as operands and reach ``function`` as NumPy arrays; everything else (None,
    Python numbers, lists, strings) is closed over as it is."""
    operands = {
        name: value
        for name, value in arguments.items()
        if isinstance(value, (jax.Array, np.ndarray, np.generic))
    }
    fixed = {name: value for name, value in arguments.items() if name not in operands}

    def call(crossed: dict[str, Any]) -> Any:
        return function({**fixed, **{name: np.asarray(value) for name, value in crossed.items()}})

    return jax.pure_callback(call, shapes, operands, vmap_method="sequential")
