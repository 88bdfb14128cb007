"""Error quality (docs/semantics.md §8): exact messages, state untouched by failed calls, NaN.

* Every exception is a ``TypeError`` (type or dtype) or a ``ValueError`` (shape, value,
  token id), and its message names the argument, what was expected and what was found;
  token-id errors give the first offending ``(row, position)`` in row-major order.
* A call that raises changes no counter and no generator: the sampler's own generator and
  the ``seeded_seqs`` generators continue exactly as if the call had never been made.
* Non-strict mode never checks the values of the probabilities.  Whatever NaN, infinities
  or negative numbers do to the decisions, the output stays valid: ids in ``[-1, V)``, an
  emitted prefix of the drafts, then the recovered or bonus token, then -1.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import registry

B, K, V = 3, 3, 5
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def valid_inputs(seed: int = 0, batch: int = B, k: int = K, vocab: int = V) -> dict[str, Any]:
    """Valid strict-mode inputs: float32 probability rows, int64 ids."""
    rng = np.random.default_rng(seed)
    target = rng.random((batch, k + 1, vocab)).astype(np.float32) + np.float32(0.05)
    target /= target.sum(axis=-1, keepdims=True)
    draft = rng.random((batch, k, vocab)).astype(np.float32) + np.float32(0.05)
    draft /= draft.sum(axis=-1, keepdims=True)
    return {
        "target": target,
        "bonus": rng.integers(0, vocab, (batch, 1)),
        "draft_probs": draft,
        "draft_ids": rng.integers(0, vocab, (batch, k)),
    }


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this message."""
    return "^" + re.escape(message) + "$"


# Every verifier entry point of the registry (its sampler class and its stateless
# function), called as ``call(target, bonus, draft_probs, draft_ids, strict)``; the
# deterministic ones ignore ``draft_probs``.
Verifier = Callable[[Any, Any, Any, Any, bool], Any]


def _sampler_call(entry: registry.Verifier) -> Verifier:
    cls = getattr(specdec_np, entry.sampler_name)
    if entry.stochastic:
        return lambda t, b, q, d, strict: cls(strict, seed=0)(t, b, q, d)
    return lambda t, b, q, d, strict: cls(strict_mode=strict)(t, b, q, d)


def _function_call(entry: registry.Verifier) -> Verifier:
    function = getattr(specdec_np, entry.function_name)
    if entry.stochastic:
        return lambda t, b, q, d, strict: function(
            t, b, q, d, strict_mode=strict, generator=np.random.default_rng(0)
        )
    return lambda t, b, q, d, strict: function(t, b, d, strict_mode=strict)


VERIFIERS: dict[str, Verifier] = {
    **{entry.sampler_name: _sampler_call(entry) for entry in registry.VERIFIERS},
    **{entry.function_name: _function_call(entry) for entry in registry.VERIFIERS},
}
# The entry points that draw uniforms and read draft probabilities.
REJECTION = tuple(
    name
    for entry in registry.VERIFIERS
    if entry.stochastic
    for name in (entry.sampler_name, entry.function_name)
)


def call(name: str, inputs: dict[str, Any], strict: bool = False) -> Any:
    return VERIFIERS[name](
        inputs["target"], inputs["bonus"], inputs["draft_probs"], inputs["draft_ids"], strict
    )


def output_of(result: Any) -> np.ndarray:
    return getattr(result, "output_token_ids", result)


# --------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------

SHAPE_ERRORS = [
    (
        "target 2-D",
        {"target": np.zeros((3, 4), np.float32)},
        "target_with_bonus_probs must have shape [B, k+1, V] (3 dimensions); found shape [3, 4]",
    ),
    (
        "k = 0",
        {"target": np.zeros((3, 1, 5), np.float32), "draft_ids": np.zeros((3, 0), np.int64)},
        "target_with_bonus_probs must have at least 2 positions (k >= 1 draft tokens plus the "
        "bonus position); found shape [3, 1, 5]",
    ),
    (
        "V = 0",
        {"target": np.zeros((3, 4, 0), np.float32), "draft_probs": np.zeros((3, 3, 0))},
        "target_with_bonus_probs must have a vocabulary of at least 1 token; found shape "
        "[3, 4, 0]",
    ),
    (
        "draft ids",
        {"draft_ids": np.zeros((3, 2), np.int64)},
        "draft_token_ids must have shape [B, k] = [3, 3] to match target_with_bonus_probs "
        "[3, 4, 5]; found shape [3, 2]",
    ),
    (
        "bonus",
        {"bonus": np.zeros((2, 1), np.int64)},
        "bonus_token_ids must have shape [B, 1] = [3, 1]; found shape [2, 1]",
    ),
    (
        "bonus 0-d",
        {"bonus": np.array(1)},
        "bonus_token_ids must have shape [B, 1] = [3, 1]; found shape []",
    ),
]


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize(
    ("case", "changes", "message"), SHAPE_ERRORS, ids=[case[0] for case in SHAPE_ERRORS]
)
def test_shape_errors(name: str, case: str, changes: dict, message: str) -> None:
    inputs = {**valid_inputs(), **changes}
    for strict in (False, True):
        with pytest.raises(ValueError, match=exactly(message)):
            call(name, inputs, strict)


@pytest.mark.parametrize("name", REJECTION)
def test_draft_probs_shape_error(name: str) -> None:
    inputs = {**valid_inputs(), "draft_probs": np.zeros((3, 3, 4), np.float32)}
    message = (
        "draft_probs must have shape [B, k, V] = [3, 3, 5] to match target_with_bonus_probs "
        "[3, 4, 5]; found shape [3, 3, 4]"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        call(name, inputs)


CREATE_OUTPUT_SHAPE_ERRORS = [
    (
        "accepted",
        np.ones((3, 4), bool),
        "accepted must have the shape of draft_token_ids [3, 3]; found [3, 4]",
    ),
    (
        "substitute_token_ids",
        np.zeros((2, 3), np.int64),
        "substitute_token_ids must have the shape of draft_token_ids [3, 3]; found [2, 3]",
    ),
    (
        "draft_token_ids",
        np.zeros(3, np.int64),
        "draft_token_ids must have shape [B, k] with k >= 1; found [3]",
    ),
    (
        "bonus_token_ids",
        np.zeros((3, 2), np.int64),
        "bonus_token_ids must have shape [B, 1] = [3, 1]; found shape [3, 2]",
    ),
]


def create_output_inputs() -> dict[str, Any]:
    inputs = valid_inputs()
    return {
        "accepted": np.array([[True, False, True], [True, True, True], [False, True, False]]),
        "substitute_token_ids": np.array([[1, 2, 3], [4, 0, 1], [2, 2, 2]]),
        "draft_token_ids": inputs["draft_ids"],
        "bonus_token_ids": inputs["bonus"],
    }


def create_output_entries() -> dict[str, Callable[..., Any]]:
    return {
        "create_output": lambda *args, **kwargs: specdec_np.create_output(*args, **kwargs),
        "_create_output": lambda *args, **kwargs: specdec_np.GreedySampler()._create_output(
            *args, **kwargs
        ),
    }


@pytest.mark.parametrize("entry", ["create_output", "_create_output"])
@pytest.mark.parametrize(
    ("argument", "value", "message"),
    CREATE_OUTPUT_SHAPE_ERRORS,
    ids=[case[0] for case in CREATE_OUTPUT_SHAPE_ERRORS],
)
def test_create_output_shape_errors(entry: str, argument: str, value: Any, message: str) -> None:
    arguments = {**create_output_inputs(), argument: value}
    if argument == "draft_token_ids":
        arguments["accepted"] = np.ones(3, bool)
        arguments["substitute_token_ids"] = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match=exactly(message)):
        create_output_entries()[entry](*arguments.values(), vocab_size=V)


# --------------------------------------------------------------------------------------
# Dtypes
# --------------------------------------------------------------------------------------

STRICT_DTYPE_ERRORS = [
    (
        "target",
        np.float64,
        "target_with_bonus_probs must have dtype float32 in strict mode; found float64",
    ),
    (
        "target",
        np.float16,
        "target_with_bonus_probs must have dtype float32 in strict mode; found float16",
    ),
    ("draft_ids", np.int32, "draft_token_ids must have dtype int64 in strict mode; found int32"),
    ("bonus", np.int32, "bonus_token_ids must have dtype int64 in strict mode; found int32"),
]
NON_STRICT_DTYPE_ERRORS = [
    (
        "target",
        np.int64,
        "target_with_bonus_probs must have a floating dtype (float32 or float64; float16 and "
        "bfloat16 are upcast); found int64",
    ),
    (
        "target",
        np.complex64,
        "target_with_bonus_probs must have a floating dtype (float32 or float64; float16 and "
        "bfloat16 are upcast); found complex64",
    ),
    ("draft_ids", np.float32, "draft_token_ids must have dtype int64 or int32; found float32"),
    ("draft_ids", np.uint64, "draft_token_ids must have dtype int64 or int32; found uint64"),
    ("bonus", np.bool_, "bonus_token_ids must have dtype int64 or int32; found bool"),
    ("bonus", np.int8, "bonus_token_ids must have dtype int64 or int32; found int8"),
]


def dtype_ids(cases: list[tuple[str, Any, str]]) -> list[str]:
    return [f"{argument}-{np.dtype(dtype)}" for argument, dtype, _ in cases]


def with_dtype(argument: str, dtype: Any) -> dict[str, Any]:
    inputs = valid_inputs()
    inputs[argument] = inputs[argument].astype(dtype)
    if argument == "target":  # the draft probabilities must have the target's dtype
        inputs["draft_probs"] = inputs["draft_probs"].astype(dtype)
    return inputs


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize(
    ("argument", "dtype", "message"), STRICT_DTYPE_ERRORS, ids=dtype_ids(STRICT_DTYPE_ERRORS)
)
def test_dtype_errors_in_strict_mode(name: str, argument: str, dtype: Any, message: str) -> None:
    inputs = with_dtype(argument, dtype)
    with pytest.raises(TypeError, match=exactly(message)):
        call(name, inputs, strict=True)
    assert_valid_output(call(name, inputs, strict=False), inputs)  # accepted otherwise


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize(
    ("argument", "dtype", "message"),
    NON_STRICT_DTYPE_ERRORS,
    ids=dtype_ids(NON_STRICT_DTYPE_ERRORS),
)
def test_dtype_errors_in_every_mode(name: str, argument: str, dtype: Any, message: str) -> None:
    inputs = with_dtype(argument, dtype)
    with pytest.raises(TypeError, match=exactly(message)):
        call(name, inputs, strict=False)
    with pytest.raises(TypeError, match="^" + ARGUMENT_NAMES[argument]):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("name", REJECTION)
def test_draft_probs_dtype_errors(name: str) -> None:
    inputs = valid_inputs()
    inputs["draft_probs"] = inputs["draft_probs"].astype(np.float64)
    message = (
        "draft_probs must have the same dtype as target_with_bonus_probs (float32); found float64"
    )
    with pytest.raises(TypeError, match=exactly(message)):
        call(name, inputs)
    with pytest.raises(
        TypeError,
        match=exactly("draft_probs must have dtype float32 in strict mode; found float64"),
    ):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("entry", ["create_output", "_create_output"])
def test_create_output_dtype_errors(entry: str) -> None:
    function = create_output_entries()[entry]
    arguments = create_output_inputs()
    with pytest.raises(TypeError, match=exactly("accepted must have dtype bool; found int64")):
        function(*{**arguments, "accepted": np.ones((3, 3), np.int64)}.values())
    bad = {**arguments, "substitute_token_ids": np.ones((3, 3), np.float64)}
    message = "substitute_token_ids must have dtype int64 or int32; found float64"
    with pytest.raises(TypeError, match=exactly(message)):
        function(*bad.values())


# --------------------------------------------------------------------------------------
# Token ids out of range
# --------------------------------------------------------------------------------------

BAD_IDS_INT64 = [V, V + 1, -1, 2**31, 2**40, -(2**40), INT64_MIN, INT64_MAX]
BAD_IDS_INT32 = [V, -1, 2**31 - 1, -(2**31)]


def id_message(name: str, vocab: Any, value: int, row: int, position: int) -> str:
    return (
        f"{name} must lie in [0, {vocab}) (the vocabulary of target_with_bonus_probs); "
        f"found {value} at (row, position) = ({row}, {position})"
    )


def id_cases() -> list[tuple[Any, int]]:
    return [(np.int64, value) for value in BAD_IDS_INT64] + [
        (np.int32, value) for value in BAD_IDS_INT32
    ]


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize(("dtype", "value"), id_cases())
def test_the_first_bad_draft_id_in_row_major_order_is_reported(
    name: str, dtype: Any, value: int
) -> None:
    inputs = valid_inputs()
    draft_ids = inputs["draft_ids"].copy()
    # Three bad ids; (1, 1) comes first in row-major order.
    for row, position in [(2, 0), (1, 2), (1, 1)]:
        draft_ids[row, position] = value
    inputs["draft_ids"] = draft_ids.astype(dtype)
    inputs["bonus"] = inputs["bonus"].astype(dtype)
    for strict in (False, True) if dtype == np.int64 else (False,):
        with pytest.raises(
            ValueError, match=exactly(id_message("draft_token_ids", V, value, 1, 1))
        ):
            call(name, inputs, strict)


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize(("dtype", "value"), id_cases())
def test_the_first_bad_bonus_id_is_reported(name: str, dtype: Any, value: int) -> None:
    inputs = valid_inputs()
    bonus = inputs["bonus"].copy()
    bonus[2, 0] = value
    bonus[1, 0] = V + 7 if value != V + 7 else V
    inputs["bonus"] = bonus.astype(dtype)
    inputs["draft_ids"] = inputs["draft_ids"].astype(dtype)
    expected = id_message("bonus_token_ids", V, int(bonus[1, 0]), 1, 0)
    for strict in (False, True) if dtype == np.int64 else (False,):
        with pytest.raises(ValueError, match=exactly(expected)):
            call(name, inputs, strict)
    inputs["bonus"] = inputs["bonus"].reshape(B)  # [B] is accepted as well as [B, 1]
    with pytest.raises(ValueError, match=exactly(expected)):
        call(name, inputs)


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_draft_and_bonus_ids_together_report_the_first_bad_row(name: str) -> None:
    """Documents the order across the two arguments: rows first, and in a row the drafts
    before the bonus (the virtual [B, k+1] id array of the kernels)."""
    inputs = valid_inputs()
    inputs["draft_ids"] = inputs["draft_ids"].copy()
    inputs["bonus"] = inputs["bonus"].copy()
    inputs["draft_ids"][2, 0] = -1
    inputs["bonus"][1, 0] = V
    with pytest.raises(ValueError, match=exactly(id_message("bonus_token_ids", V, V, 1, 0))):
        call(name, inputs)
    inputs["draft_ids"][1, 2] = V + 3
    with pytest.raises(ValueError, match=exactly(id_message("draft_token_ids", V, V + 3, 1, 2))):
        call(name, inputs)


def test_raise_if_out_of_bounds_vocab_reports_the_first_bad_id() -> None:
    sampler = specdec_np.RejectionSampler()
    draft_ids = np.array([[0, 1, 2], [3, V, 4], [-1, 0, 0]])
    with pytest.raises(ValueError, match=exactly(id_message("draft_token_ids", V, V, 1, 1))):
        sampler._raise_if_out_of_bounds_vocab(V, draft_ids, np.zeros((3, 1), np.int64))
    bonus = np.array([[0], [0], [V + 2]])
    with pytest.raises(ValueError, match=exactly(id_message("bonus_token_ids", V, V + 2, 2, 0))):
        sampler._raise_if_out_of_bounds_vocab(V, np.zeros((3, 3), np.int64), bonus)


@pytest.mark.parametrize("entry", ["create_output", "_create_output"])
@pytest.mark.parametrize("value", [V, -1, 2**40, INT64_MIN])
def test_create_output_id_errors(entry: str, value: int) -> None:
    """The range is ``[0, vocab_size)``; without vocab_size ids must only be >= 0.
    Substitute ids are checked where they are emitted (the first rejected position)."""
    function = create_output_entries()[entry]
    arguments = create_output_inputs()
    draft = arguments["draft_token_ids"].copy()
    draft[2, 1] = value
    draft[1, 2] = value
    pattern = r"^draft_token_ids must lie in \[0, 5\).*; found {} at \(row, position\) = \(1, 2\)$"
    with pytest.raises(ValueError, match=pattern.format(value)):
        function(*{**arguments, "draft_token_ids": draft}.values(), vocab_size=V)
    substitute = arguments["substitute_token_ids"].copy()
    substitute[0, 0] = value  # not emitted: row 0 is rejected at position 1
    substitute[2, 0] = value  # emitted
    pattern = (
        r"^substitute_token_ids must lie in \[0, 5\).*; found {} at \(row, position\) = \(2, 0\)$"
    )
    with pytest.raises(ValueError, match=pattern.format(value)):
        function(*{**arguments, "substitute_token_ids": substitute}.values(), vocab_size=V)
    if value < 0:
        with pytest.raises(ValueError, match=r"^draft_token_ids must lie in \[0, "):
            function(*{**arguments, "draft_token_ids": draft}.values())
    else:
        function(*{**arguments, "draft_token_ids": draft}.values())  # no upper bound


# --------------------------------------------------------------------------------------
# Probability values (strict mode)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_probabilities_in_strict_mode(name: str, value: float) -> None:
    inputs = valid_inputs()
    target = inputs["target"].copy()
    target[2, 0, 1] = value
    target[1, 3, 4] = value  # the bonus position is checked as well; first in row-major order
    inputs["target"] = target
    message = f"target_with_bonus_probs must be finite; found {value} at index [1, 3, 4]"
    with pytest.raises(ValueError, match=exactly(message)):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_negative_probabilities_in_strict_mode(name: str) -> None:
    inputs = valid_inputs()
    target = inputs["target"].copy()
    target[0, 2, 3] = -0.5
    inputs["target"] = target
    message = "target_with_bonus_probs must be non-negative; found -0.5 at index [0, 2, 3]"
    with pytest.raises(ValueError, match=exactly(message)):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("name", REJECTION)
def test_bad_draft_probabilities_in_strict_mode(name: str) -> None:
    inputs = valid_inputs()
    draft = inputs["draft_probs"].copy()
    draft[1, 1, 1] = np.nan
    inputs["draft_probs"] = draft
    message = "draft_probs must be finite; found nan at index [1, 1, 1]"
    with pytest.raises(ValueError, match=exactly(message)):
        call(name, inputs, strict=True)
    draft[1, 1, 1] = -2.0
    message = "draft_probs must be non-negative; found -2.0 at index [1, 1, 1]"
    with pytest.raises(ValueError, match=exactly(message)):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("name", ["GreedySampler", "greedy_sample"])
def test_greedy_strict_mode_checks_row_sums(name: str) -> None:
    inputs = valid_inputs()
    inputs["target"] = inputs["target"] * np.float32(0.5)
    with pytest.raises(
        ValueError,
        match=r"^target_with_bonus_probs rows must sum to 1 \(within 0\.001\) for greedy "
        r"verification; row \[0, 0\] sums to 0\.5",
    ):
        call(name, inputs, strict=True)


@pytest.mark.parametrize("name", REJECTION)
def test_a_target_row_without_mass_where_a_token_must_be_drawn(name: str) -> None:
    inputs = valid_inputs()
    target = inputs["target"].copy()
    target[1, 0] = 0.0  # row 1 must be rejected at position 0 and has nothing to draw from
    inputs["target"] = target
    message = (
        "target_with_bonus_probs[1, 0] has no positive probability, so no token can be drawn "
        "there; the target rows must be probability distributions"
    )
    for strict in (False, True):
        with pytest.raises(ValueError, match=exactly(message)):
            call(name, inputs, strict)


# --------------------------------------------------------------------------------------
# Array types
# --------------------------------------------------------------------------------------

ARGUMENT_NAMES = {
    "target": "target_with_bonus_probs",
    "bonus": "bonus_token_ids",
    "draft_probs": "draft_probs",
    "draft_ids": "draft_token_ids",
}


def not_an_array(name: str, found: str) -> str:
    return (
        f"{name} must be an array (NumPy, CuPy, or one that exports DLPack) or array_like "
        f"(a list, tuple or number); found {found}"
    )


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize("argument", list(ARGUMENT_NAMES))
@pytest.mark.parametrize("replacement", ["None", "str", "dict"])
def test_a_non_array_among_arrays_names_its_argument(
    name: str, argument: str, replacement: str
) -> None:
    inputs = valid_inputs()
    value = {"None": None, "str": "abc", "dict": {0: 1}}[replacement]
    found = {"None": "NoneType", "str": "str", "dict": "dict"}[replacement]
    inputs[argument] = value
    if argument == "draft_probs" and (name not in REJECTION or replacement == "None"):
        call(name, inputs)  # ignored by the deterministic verifiers; None means point mass
        return
    with pytest.raises(TypeError, match=exactly(not_an_array(ARGUMENT_NAMES[argument], found))):
        call(name, inputs)


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize("argument", list(ARGUMENT_NAMES))
def test_array_like_arguments_are_taken_as_numpy_takes_them(name: str, argument: str) -> None:
    """Lists give the arrays' results; a scalar where an array is needed is a shape or
    dtype error that names the argument, and a ragged list a TypeError."""
    # A list of floats is float64, as in NumPy; the rows must share one dtype.
    inputs = {
        key: value.astype(np.float64) if value.dtype.kind == "f" else value
        for key, value in valid_inputs().items()
    }
    expected = call(name, dict(inputs))
    listed = dict(inputs, **{argument: inputs[argument].tolist()})
    for got, want in zip(call(name, listed), expected):
        np.testing.assert_array_equal(got, want)
    if argument == "draft_probs" and name not in REJECTION:
        return
    with pytest.raises((TypeError, ValueError), match=ARGUMENT_NAMES[argument]):
        call(name, dict(inputs, **{argument: 1.0}))
    with pytest.raises(TypeError, match=f"{ARGUMENT_NAMES[argument]} must form an array"):
        call(name, dict(inputs, **{argument: [[0.5], [0.25, 0.25]]}))


@pytest.mark.parametrize("entry", ["create_output", "_create_output"])
@pytest.mark.parametrize(
    "argument", ["accepted", "substitute_token_ids", "draft_token_ids", "bonus_token_ids"]
)
def test_create_output_takes_lists(entry: str, argument: str) -> None:
    arguments = create_output_inputs()
    expected = create_output_entries()[entry](*arguments.values())
    arguments[argument] = arguments[argument].tolist()
    got = create_output_entries()[entry](*arguments.values())
    np.testing.assert_array_equal(getattr(got, "output_token_ids", got),
                                  getattr(expected, "output_token_ids", expected))


# --------------------------------------------------------------------------------------
# Uniforms, seeds and posteriors
# --------------------------------------------------------------------------------------


def rejection_entries() -> dict[str, Callable[..., Any]]:
    """Every stochastic entry point with the keyword arguments of the stateless function
    (``generator`` only where the stateless function is used)."""

    def sampler_of(entry: registry.Verifier) -> Callable[..., Any]:
        def sampler(*args: Any, generator: Any = None, **kwargs: Any) -> Any:
            return getattr(specdec_np, entry.sampler_name)(seed=0)(*args, **kwargs)

        return sampler

    entries: dict[str, Callable[..., Any]] = {}
    for entry in registry.VERIFIERS:
        if entry.stochastic:
            entries[entry.sampler_name] = sampler_of(entry)
            entries[entry.function_name] = getattr(specdec_np, entry.function_name)
    return entries


def positional(inputs: dict[str, Any]) -> tuple[Any, ...]:
    return inputs["target"], inputs["bonus"], inputs["draft_probs"], inputs["draft_ids"]


UNIFORM_ERRORS = [
    ("nan", "uniforms must lie in [0, 1); found nan at index (1, 2)"),
    ("one", "uniforms must lie in [0, 1); found 1.0 at index (1, 2)"),
    ("negative", "uniforms must lie in [0, 1); found -1e-300 at index (1, 2)"),
    ("inf", "uniforms must lie in [0, 1); found inf at index (1, 2)"),
    ("shape", "uniforms must have shape [B, k+1] = [3, 4]; found shape [3, 3]"),
    ("transposed", "uniforms must have shape [B, k+1] = [3, 4]; found shape [4, 3]"),
    ("0-d", "uniforms must have shape [B, k+1] = [3, 4]; found shape []"),
    (
        "float16",
        "uniforms must be a float64 or float32 array (float32 is widened exactly to float64); "
        "found float16: too coarse for uniforms in [0, 1); draw them in float32 or float64",
    ),
    (
        "int64",
        "uniforms must be a float64 or float32 array (float32 is widened exactly to float64); "
        "found int64: convert them with .astype(numpy.float64) if they are uniforms in [0, 1)",
    ),
    (
        "str",
        "uniforms must be an array (NumPy, CuPy, or one that exports DLPack) or array_like "
        "(a list, tuple or number); found str",
    ),
    ("list of nan", "uniforms must lie in [0, 1); found nan at index (1, 2)"),
]


def bad_uniforms(kind: str) -> Any:
    uniforms = np.full((B, K + 1), 0.5)
    if kind in ("nan", "one", "negative", "inf"):
        uniforms[1, 2] = {"nan": np.nan, "one": 1.0, "negative": -1e-300, "inf": np.inf}[kind]
        uniforms[2, 0] = np.nan  # a later bad value is not the one reported
        return uniforms
    return {
        "shape": uniforms[:, :K],
        "transposed": uniforms.T,
        "0-d": np.array(0.5),
        "float16": uniforms.astype(np.float16),
        "int64": np.zeros((B, K + 1), dtype=np.int64),
        "str": "0.5",
        "list of nan": [[0.5] * (K + 1), [0.5, 0.5, np.nan, 0.5], [0.5] * (K + 1)],
    }[kind]


@pytest.mark.parametrize("entry", REJECTION)
@pytest.mark.parametrize(("kind", "message"), UNIFORM_ERRORS, ids=[c[0] for c in UNIFORM_ERRORS])
def test_bad_uniforms(entry: str, kind: str, message: str) -> None:
    error = TypeError if kind in ("float16", "int64", "str") else ValueError
    with pytest.raises(error, match=exactly(message)):
        rejection_entries()[entry](*positional(valid_inputs()), uniforms=bad_uniforms(kind))


@pytest.mark.parametrize("entry", REJECTION)
@pytest.mark.parametrize("other", ["seeded_seqs", "counter_seeds"])
def test_uniforms_exclude_seeds(entry: str, other: str) -> None:
    value = {"seeded_seqs": {0: np.random.default_rng(0)}, "counter_seeds": {0: (1, 2)}}[other]
    message = (
        "uniforms cannot be combined with seeded_seqs or counter_seeds: explicit uniforms "
        "already fix every row"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        rejection_entries()[entry](
            *positional(valid_inputs()), uniforms=np.full((B, K + 1), 0.5), **{other: value}
        )


SEED_ERRORS = [
    (
        "seeded key range",
        {"seeded_seqs": {3: "g"}},
        ValueError,
        "seeded_seqs keys must be row indices in [0, 3); found 3",
    ),
    (
        "seeded key negative",
        {"seeded_seqs": {-1: "g"}},
        ValueError,
        "seeded_seqs keys must be row indices in [0, 3); found -1",
    ),
    (
        "seeded key type",
        {"seeded_seqs": {1.0: "g"}},
        TypeError,
        "seeded_seqs keys must be int row indices; found float",
    ),
    (
        "seeded key bool",
        {"seeded_seqs": {True: "g"}},
        TypeError,
        "seeded_seqs keys must be int row indices; found bool",
    ),
    (
        "seeded value",
        {"seeded_seqs": {1: 42}},
        TypeError,
        "seeded_seqs[1] must be a numpy.random.Generator (or a cupy.random.Generator); found int",
    ),
    (
        "seeded value None",
        {"seeded_seqs": {0: None}},
        TypeError,
        "seeded_seqs[0] must be a numpy.random.Generator (or a cupy.random.Generator); "
        "found NoneType",
    ),
    (
        "counter key",
        {"counter_seeds": {"0": (1, 2)}},
        TypeError,
        "counter_seeds keys must be int row indices; found str",
    ),
    (
        "counter key range",
        {"counter_seeds": {5: (1, 2)}},
        ValueError,
        "counter_seeds keys must be row indices in [0, 3); found 5",
    ),
    (
        "counter pair",
        {"counter_seeds": {1: 5}},
        TypeError,
        "counter_seeds[1] must be a (seed, position) pair of ints; found 5",
    ),
    (
        "counter triple",
        {"counter_seeds": {1: (1, 2, 3)}},
        TypeError,
        "counter_seeds[1] must be a (seed, position) pair of ints; found (1, 2, 3)",
    ),
    (
        "counter seed negative",
        {"counter_seeds": {0: (-1, 2)}},
        ValueError,
        "counter_seeds[0] seed must lie in [0, 2**64); found -1",
    ),
    (
        "counter seed huge",
        {"counter_seeds": {0: (2**64, 2)}},
        ValueError,
        f"counter_seeds[0] seed must lie in [0, 2**64); found {2**64}",
    ),
    (
        "counter position float",
        {"counter_seeds": {2: (1, 1.5)}},
        TypeError,
        "counter_seeds[2] position must be an int; found float",
    ),
    (
        "counter position bool",
        {"counter_seeds": {2: (1, True)}},
        TypeError,
        "counter_seeds[2] position must be an int; found bool",
    ),
    (
        "both sources",
        {"seeded_seqs": {1: np.random.default_rng(0)}, "counter_seeds": {1: (1, 2)}},
        ValueError,
        "row 1 is in both seeded_seqs and counter_seeds; give each row one source",
    ),
]


@pytest.mark.parametrize("entry", REJECTION)
@pytest.mark.parametrize(
    ("case", "arguments", "error", "message"), SEED_ERRORS, ids=[c[0] for c in SEED_ERRORS]
)
def test_bad_seeds(entry: str, case: str, arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=exactly(message)):
        rejection_entries()[entry](*positional(valid_inputs()), **arguments)


@pytest.mark.parametrize("entry", REJECTION)
@pytest.mark.parametrize(
    "seeded_seqs",
    [[np.random.default_rng(0)], (np.random.default_rng(0),), "abc", 7, [0]],
    ids=["list", "tuple", "str", "int", "list of int"],
)
def test_seeded_seqs_that_is_not_a_mapping_is_a_type_error(entry: str, seeded_seqs: Any) -> None:
    """BUG: ``verify.rejection_sample`` calls ``(seeded_seqs or {}).values()`` before any
    check, so a list, tuple, str or int raises AttributeError."""
    with pytest.raises(TypeError, match="seeded_seqs"):
        rejection_entries()[entry](*positional(valid_inputs()), seeded_seqs=seeded_seqs)


@pytest.mark.parametrize("counter_seeds", [7, 2.5])
def test_counter_seeds_that_is_not_a_mapping_is_a_type_error(counter_seeds: Any) -> None:
    """BUG: iterating a non-iterable ``counter_seeds`` raises Python's bare TypeError
    ("'int' object is not iterable"), which does not name the argument."""
    with pytest.raises(TypeError, match="counter_seeds"):
        specdec_np.rejection_sample(*positional(valid_inputs()), counter_seeds=counter_seeds)


@pytest.mark.parametrize(
    "generator",
    [42, "rng", [0.5], np.random.PCG64(0), random.Random(0)],
    ids=["int", "str", "list", "PCG64", "random.Random"],
)
def test_a_generator_that_is_not_a_generator_is_a_type_error(generator: Any) -> None:
    """BUG: ``rejection_sample(generator=...)`` is used without a check: 42, "rng", a list
    or a bit generator raise AttributeError (``.random``), and random.Random raises a
    TypeError about ``Random.random()`` that does not name the argument."""
    with pytest.raises(TypeError, match="generator"):
        specdec_np.rejection_sample(*positional(valid_inputs()), generator=generator)


@pytest.mark.parametrize("seed", [-1, 1.5, "abc"])
def test_bad_sampler_seed_names_the_argument(seed: Any) -> None:
    """BUG (message quality): the seed goes to numpy.random.default_rng unchecked, whose
    messages ("expected non-negative integer", "SeedSequence expects int ...") do not
    name the ``seed`` argument."""
    with pytest.raises((TypeError, ValueError), match="seed"):
        specdec_np.RejectionSampler(seed=seed)


POSTERIOR_ERRORS = [
    (np.nan, ValueError, "{} must be finite and non-negative; found nan"),
    (np.inf, ValueError, "{} must be finite and non-negative; found inf"),
    (-1, ValueError, "{} must be finite and non-negative; found -1.0"),
    (-1e-300, ValueError, "{} must be finite and non-negative; found -1e-300"),
    ("0.1", TypeError, "{} must be a real number; found str"),
    (None, TypeError, "{} must be a real number; found NoneType"),
    (True, TypeError, "{} must be a real number; found bool"),
    (1j, TypeError, "{} must be a real number; found complex"),
    ([0.1], TypeError, "{} must be a real number; found list"),
]


@pytest.mark.parametrize("argument", ["posterior_threshold", "posterior_alpha"])
@pytest.mark.parametrize(("value", "error", "message"), POSTERIOR_ERRORS)
def test_bad_posteriors(argument: str, value: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=exactly(message.format(argument))):
        specdec_np.TypicalAcceptanceSampler(**{argument: value})
    inputs = valid_inputs()
    with pytest.raises(error, match=exactly(message.format(argument))):
        specdec_np.typical_acceptance_sample(
            inputs["target"], inputs["bonus"], inputs["draft_ids"], **{argument: value}
        )


@pytest.mark.parametrize("argument", ["posterior_threshold", "posterior_alpha"])
@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["10**400", "-10**400"])
def test_posteriors_too_large_for_a_float_are_value_errors(argument: str, value: int) -> None:
    """BUG: ``_validate.check_posterior`` calls ``float(value)`` on any int, which raises
    OverflowError (not a ValueError) for ints beyond the float range."""
    with pytest.raises(ValueError, match=argument):
        specdec_np.TypicalAcceptanceSampler(**{argument: value})


@pytest.mark.parametrize("entry", ["create_output", "_create_output"])
@pytest.mark.parametrize("vocab_size", [2**63, 2**64, -(2**70), float("inf"), float("nan"), "abc"])
def test_bad_vocab_size_is_a_value_or_type_error_naming_it(entry: str, vocab_size: Any) -> None:
    """BUG: ``create_output`` passes ``int(vocab_size)`` on unchecked: ints outside int64
    and inf raise OverflowError; NaN and "abc" raise ValueErrors from ``int()`` that do
    not name ``vocab_size``."""
    with pytest.raises((TypeError, ValueError), match="vocab_size"):
        create_output_entries()[entry](*create_output_inputs().values(), vocab_size=vocab_size)


# --------------------------------------------------------------------------------------
# init_tensors
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls", [getattr(specdec_np, entry.sampler_name) for entry in registry.VERIFIERS]
)
def test_init_tensors_twice(cls: type) -> None:
    sampler = cls()
    sampler.init_tensors("cpu")
    sampler.num_accepted_tokens += 3
    message = "the counters already exist: init_tensors was called before"
    with pytest.raises(RuntimeError, match=exactly(message)):
        sampler.init_tensors("cpu")
    with pytest.raises(RuntimeError, match=exactly(message)):
        sampler.init_tensors(0, device_type="cpu")
    assert int(sampler.num_accepted_tokens) == 3  # the counters were kept
    # A call creates the counters too; init_tensors after it is the same error.
    fresh = cls()
    inputs = valid_inputs()
    fresh(*positional(inputs))
    with pytest.raises(RuntimeError, match=exactly(message)):
        fresh.init_tensors("cpu")


def test_init_tensors_bad_device() -> None:
    sampler = specdec_np.GreedySampler()
    with pytest.raises(TypeError, match=exactly("device must be an int or a str; found float")):
        sampler.init_tensors(1.5)
    with pytest.raises(
        ValueError, match=exactly("device must be 'cpu', 'cuda' or 'cuda:N'; found 'tpu'")
    ):
        sampler.init_tensors("tpu")
    assert sampler.num_accepted_tokens is None  # nothing was created


# --------------------------------------------------------------------------------------
# Failed calls change no counter and no generator
# --------------------------------------------------------------------------------------

SAMPLER_SEED = 1234
ROW_SEED = 99


def counters(sampler: Any) -> tuple[Any, Any, int]:
    accepted, emitted = sampler.num_accepted_tokens, sampler.num_emitted_tokens
    return (
        None if accepted is None else int(accepted),
        None if emitted is None else int(emitted),
        sampler.num_draft_tokens,
    )


def with_changes(**changes: Any) -> dict[str, Any]:
    """Valid inputs (seed 1) with some arrays changed by ``changes[name](array)``."""
    inputs = valid_inputs(1)
    for name, change in changes.items():
        inputs[name] = change(inputs[name].copy())
    return inputs


def set_item(index: tuple, value: Any) -> Callable[[np.ndarray], np.ndarray]:
    def change(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array

    return change


# Each failing call gets (sampler, row_generator); row_generator is in seeded_seqs where
# the call gets that far, so a draw from it would show.
FAILING_REJECTION_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "shape": lambda s, g: s(*positional(with_changes(target=lambda t: t[:, :2])), {0: g}),
    "dtype": lambda s, g: s(
        *positional(with_changes(draft_ids=lambda d: d.astype(np.float64))), {0: g}
    ),
    "not an array": lambda s, g: s(*positional({**valid_inputs(1), "bonus": "abc"}), {0: g}),
    # Found by the kernel, after the uniforms were drawn: the draws must be undone.
    "draft id": lambda s, g: s(*positional(with_changes(draft_ids=set_item((2, 1), V))), {0: g}),
    "bonus id": lambda s, g: s(*positional(with_changes(bonus=set_item((1, 0), -1))), {0: g}),
    "no mass": lambda s, g: s(*positional(with_changes(target=set_item((2, 0), 0.0))), {0: g}),
    "draft id, unseeded": lambda s, g: s(
        *positional(with_changes(draft_ids=set_item((0, 0), 2**40)))
    ),
    "draft id, counter seeds": lambda s, g: s(
        *positional(with_changes(draft_ids=set_item((2, 1), V))),
        {0: g},
        counter_seeds={1: (5, 6)},
    ),
    "seeded key": lambda s, g: s(*positional(valid_inputs(1)), {0: g, 3: g}),
    "seeded value": lambda s, g: s(*positional(valid_inputs(1)), {0: g, 2: "g"}),
    "counter seed": lambda s, g: s(
        *positional(valid_inputs(1)), {0: g}, counter_seeds={1: (-1, 0)}
    ),
    "both sources": lambda s, g: s(
        *positional(valid_inputs(1)), {0: g}, counter_seeds={0: (1, 1)}
    ),
    "uniforms": lambda s, g: s(*positional(valid_inputs(1)), uniforms=np.full((B, K + 1), 1.0)),
    # BUG: the bad generator of row 2 raises after the sampler's generator (rows without a
    # seed) and the generator of row 0 were consumed; nothing restores them.
    "seeded value random.Random": lambda s, g: s(
        *positional(valid_inputs(1)), {0: g, 2: random.Random(0)}
    ),
}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("case", list(FAILING_REJECTION_CALLS))
def test_a_failed_rejection_call_leaves_counters_and_generators_unchanged(
    case: str, strict: bool
) -> None:
    sampler = specdec_np.RejectionSampler(strict, seed=SAMPLER_SEED)
    row_generator = np.random.default_rng(ROW_SEED)
    # Two successful calls: every row from the sampler's generator, then row 0 seeded.
    sampler(*positional(valid_inputs(2)))
    sampler(*positional(valid_inputs(3)), {0: row_generator})
    before = counters(sampler)
    with pytest.raises((TypeError, ValueError)):
        FAILING_REJECTION_CALLS[case](sampler, row_generator)
    assert counters(sampler) == before
    # The generators continue as if the failed call had not been made.
    reference = np.random.default_rng(SAMPLER_SEED)
    reference.random((B, K + 1))
    reference.random((B - 1, K + 1))
    np.testing.assert_array_equal(sampler._generator.random(16), reference.random(16))
    row_reference = np.random.default_rng(ROW_SEED)
    row_reference.random(K + 1)
    np.testing.assert_array_equal(row_generator.random(16), row_reference.random(16))


def test_a_failed_stateless_call_leaves_its_generators_unchanged() -> None:
    generator = np.random.default_rng(SAMPLER_SEED)
    row_generator = np.random.default_rng(ROW_SEED)
    inputs = with_changes(bonus=set_item((2, 0), V))  # found by the kernel, after the draws
    with pytest.raises(ValueError, match="^bonus_token_ids must lie in"):
        specdec_np.rejection_sample(
            *positional(inputs), generator=generator, seeded_seqs={1: row_generator}
        )
    np.testing.assert_array_equal(
        generator.random(8), np.random.default_rng(SAMPLER_SEED).random(8)
    )
    np.testing.assert_array_equal(
        row_generator.random(8), np.random.default_rng(ROW_SEED).random(8)
    )


FAILING_DETERMINISTIC_CALLS: dict[str, Callable[[Any], Any]] = {
    "shape": lambda s: s(*positional(with_changes(target=lambda t: t[..., :0]))),
    "dtype": lambda s: s(*positional(with_changes(bonus=lambda b: b.astype(np.uint8)))),
    "draft id": lambda s: s(*positional(with_changes(draft_ids=set_item((2, 2), -1)))),
    "bonus id": lambda s: s(*positional(with_changes(bonus=set_item((0, 0), V)))),
    "not an array": lambda s: s(*positional({**valid_inputs(1), "draft_ids": "abc"})),
    "_create_output substitute": lambda s: s._create_output(
        np.zeros((B, K), bool), np.full((B, K), -1), np.zeros((B, K), np.int64), np.zeros(B, int)
    ),
    "_create_output vocab_size": lambda s: s._create_output(
        np.ones((B, K), bool),
        np.zeros((B, K), int),
        np.zeros((B, K), int),
        np.full(B, V),
        vocab_size=V,
    ),
    "_create_output accepted dtype": lambda s: s._create_output(
        np.zeros((B, K), int), np.zeros((B, K), int), np.zeros((B, K), int), np.zeros(B, int)
    ),
}


@pytest.mark.parametrize(
    "cls", [getattr(specdec_np, entry.sampler_name) for entry in registry.VERIFIERS]
)
@pytest.mark.parametrize("case", list(FAILING_DETERMINISTIC_CALLS))
def test_a_failed_call_leaves_the_counters_unchanged(cls: type, case: str) -> None:
    sampler = cls()
    sampler(*positional(valid_inputs(2)))
    sampler._create_output(
        np.ones((B, K), bool), np.zeros((B, K), int), np.zeros((B, K), int), np.zeros(B, int)
    )
    before = counters(sampler)
    assert before[2] == 2 * B * K
    with pytest.raises((TypeError, ValueError)):
        FAILING_DETERMINISTIC_CALLS[case](sampler)
    assert counters(sampler) == before


def test_a_first_call_that_fails_creates_no_counters() -> None:
    sampler = specdec_np.GreedySampler()
    with pytest.raises(ValueError):
        sampler(*positional(with_changes(draft_ids=set_item((0, 0), V))))
    assert counters(sampler) == (None, None, 0)


# --------------------------------------------------------------------------------------
# NaN, infinities and negative values outside strict mode
# --------------------------------------------------------------------------------------


def assert_valid_output(result: Any, inputs: dict[str, Any]) -> np.ndarray:
    """The output format (docs/semantics.md §1): int64 [B, k+1], ids in [-1, V), the drafts'
    prefix, then one recovered or bonus token, then -1."""
    output = output_of(result)
    draft_ids, bonus = inputs["draft_ids"], np.asarray(inputs["bonus"]).reshape(-1)
    batch, k = draft_ids.shape
    vocab = inputs["target"].shape[-1]
    assert isinstance(output, np.ndarray) and output.dtype == np.int64
    assert output.shape == (batch, k + 1)
    assert ((output >= -1) & (output < vocab)).all(), output
    for b in range(batch):
        emitted = int((output[b] != -1).sum())
        assert emitted >= 1 and (output[b, :emitted] != -1).all(), output[b]
        r = emitted - 1
        np.testing.assert_array_equal(output[b, :r], draft_ids[b, :r])
        if r == k:
            assert output[b, k] == bonus[b]
        if hasattr(result, "accepted_lengths"):
            assert result.accepted_lengths[b] == r
            assert r <= result.num_accepted[b] <= k
    return output


NAN_PATTERNS = [
    "target all nan",
    "draft all nan",
    "target rows with nan",
    "draft rows with nan",
    "target nan at drafts",
    "target inf",
    "target -inf",
    "target negative",
    "draft inf",
    "target huge",
    "mixed",
]


def corrupted_inputs(pattern: str, dtype: Any, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    inputs = valid_inputs(seed, batch=6, k=3, vocab=7)
    target = inputs["target"].astype(dtype)
    draft = inputs["draft_probs"].astype(dtype)
    rows = rng.random(target.shape[:2]) < 0.5
    ids = inputs["draft_ids"]
    with np.errstate(all="ignore"):
        if pattern == "target all nan":
            target[...] = np.nan
        elif pattern == "draft all nan":
            draft[...] = np.nan
        elif pattern == "target rows with nan":
            target[rows] = np.nan
        elif pattern == "draft rows with nan":
            draft[rows[:, :3]] = np.nan
        elif pattern == "target nan at drafts":
            for b, i in zip(*np.nonzero(rows[:, :3])):
                target[b, i, ids[b, i]] = np.nan
        elif pattern == "target inf":
            target[rows] = np.where(rng.random(target[rows].shape) < 0.3, np.inf, target[rows])
        elif pattern == "target -inf":
            target[rows] = -np.inf
        elif pattern == "target negative":
            target[rows] = -target[rows]
        elif pattern == "draft inf":
            draft[rows[:, :3]] = np.inf
        elif pattern == "target huge":
            target *= np.finfo(dtype).max
        else:
            values = np.array([np.nan, np.inf, -np.inf, -1.0, 0.0, 1e30])
            mask = rng.random(target.shape) < 0.4
            target[mask] = rng.choice(values, size=int(mask.sum()))
            mask = rng.random(draft.shape) < 0.4
            draft[mask] = rng.choice(values, size=int(mask.sum()))
    return {**inputs, "target": target, "draft_probs": draft}


NO_MASS = r"^target_with_bonus_probs\[\d+, \d+\] has no positive probability"


@pytest.mark.parametrize("name", list(VERIFIERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pattern", NAN_PATTERNS)
def test_non_finite_probabilities_outside_strict_mode_give_valid_output(
    name: str, dtype: Any, pattern: str
) -> None:
    """Outside strict mode nothing checks the values; the output format holds whatever
    they are.  The only error: the rejection sampler refuses to draw from a target row
    with no positive (non-NaN) probability."""
    for seed in range(8):
        inputs = corrupted_inputs(pattern, dtype, seed)
        for draft_probs in (inputs["draft_probs"], None):
            try:
                result = call(name, {**inputs, "draft_probs": draft_probs})
            except ValueError as error:
                assert name in REJECTION, error
                assert re.match(NO_MASS, str(error)), error
                continue
            assert_valid_output(result, inputs)
        # Strict mode refuses the same (float32) inputs where it reads a bad value; the
        # deterministic verifiers never read draft_probs.
        reads_bad_value = pattern.startswith("target") or pattern == "mixed"
        if pattern.startswith("draft"):
            reads_bad_value = name in REJECTION
        if dtype == np.float32 and reads_bad_value and pattern != "target huge":
            with pytest.raises(ValueError, match="must be (finite|non-negative)"):
                call(name, inputs, strict=True)


STOCHASTIC = registry.names(stochastic=True)


def one_row(target_row: list[float], draft_row: list[float] | None, draft_id: int) -> dict:
    """A batch of one row, k = 1, V = len(target_row); the bonus position is uniform."""
    vocab = len(target_row)
    target = np.array([[target_row, [1.0 / vocab] * vocab]], dtype=np.float64)
    draft = None if draft_row is None else np.array([[draft_row]], dtype=np.float64)
    return {
        "target": target,
        "bonus": np.array([[vocab - 1]]),
        "draft_probs": draft,
        "draft_ids": np.array([[draft_id]]),
    }


@pytest.mark.parametrize("u", [0.0, 0.5, np.nextafter(1.0, 0.0)])
@pytest.mark.parametrize("q_x", [0.0, 0.5, 1.0, None])
def test_rejection_never_accepts_a_nan_target_probability(u: float, q_x: Any) -> None:
    """``u * q(x) < p(x)`` is false for p(x) = NaN, whatever u and q(x) (even 0 < NaN):
    the draft is rejected and the token comes from the NaN-free part of the residual."""
    draft_row = None if q_x is None else [q_x, 1.0 - q_x, 0.0, 0.0]
    inputs = one_row([np.nan, 0.0, 0.6, 0.4], draft_row, draft_id=0)
    for v in (0.0, 0.3, 0.9):
        result = specdec_np.rejection_sample(
            *positional(inputs), uniforms=np.array([[u, v]], dtype=np.float64)
        )
        output = assert_valid_output(result, inputs)
        assert result.accepted_lengths[0] == 0 and result.num_accepted[0] == 0
        assert output[0, 0] in (2, 3)  # never the NaN token 0, never the massless 1


@pytest.mark.parametrize("u", [0.0, 0.5])
@pytest.mark.parametrize("q_x", [np.nan, -1e-9, -np.inf])
@pytest.mark.parametrize("name", STOCHASTIC)
def test_nan_or_negative_draft_probability_counts_as_zero(u: float, q_x: float, name: str) -> None:
    """A NaN or negative q entry counts as 0: ``q = 0 < p`` accepts a token of positive
    target probability, and the residual never weighs it (p - NaN is not a weight)."""
    inputs = one_row([0.5, 0.5, 0.0], [q_x, 0.1, 0.9], draft_id=0)
    for v in (0.0, 0.5, 0.99):
        result = getattr(specdec_np, registry.get(name).function_name)(
            *positional(inputs), uniforms=np.array([[u, v]], dtype=np.float64)
        )
        output = assert_valid_output(result, inputs)
        assert output[0].tolist() == [0, int(inputs["bonus"][0, 0])]


@pytest.mark.parametrize("q_x", [np.nan, -1e-9, 0.0])
@pytest.mark.parametrize("name", STOCHASTIC)
def test_zero_probability_draft_is_never_accepted_or_emitted(q_x: float, name: str) -> None:
    """p(x) = 0 is never accepted, whatever q(x) holds (negative, NaN or 0), and no token
    of zero target probability is drawn from the residual."""
    inputs = one_row([0.0, 0.7, 0.3, 0.0], [q_x, 0.2, 0.3, -0.5], draft_id=0)
    function = getattr(specdec_np, registry.get(name).function_name)
    for u in (0.0, 0.5, 0.999):
        for v in (0.0, 0.3, 0.6, 0.999):
            result = function(*positional(inputs), uniforms=np.array([[u, v]], dtype=np.float64))
            output = assert_valid_output(result, inputs)
            assert result.accepted_lengths[0] == 0
            assert output[0, 0] in (1, 2)


def test_rejection_infinite_target_probability_is_accepted() -> None:
    """p(x) = inf passes ``u * q(x) < p(x)`` for any finite q(x)."""
    inputs = one_row([np.inf, 0.5, 0.5], [0.2, 0.4, 0.4], draft_id=0)
    result = specdec_np.rejection_sample(
        *positional(inputs), uniforms=np.array([[0.9, 0.5]], dtype=np.float64)
    )
    output = assert_valid_output(result, inputs)
    assert output[0].tolist() == [0, 2]  # accepted, then the bonus token


def test_rejection_target_row_all_nan_has_nothing_to_draw() -> None:
    inputs = one_row([np.nan] * 4, [0.25] * 4, draft_id=1)
    with pytest.raises(
        ValueError,
        match=exactly(
            "target_with_bonus_probs[0, 0] has no positive probability, so no token can be drawn "
            "there; the target rows must be probability distributions"
        ),
    ):
        specdec_np.rejection_sample(*positional(inputs), uniforms=np.zeros((1, 2)))


@pytest.mark.parametrize("name", ["GreedySampler", "greedy_sample"])
def test_greedy_nan_never_wins_the_argmax(name: str) -> None:
    """Unlike numpy.argmax, NaN entries never win; a draft on a NaN is rejected."""
    rejected = one_row([np.nan, 0.2, 0.7, 0.1], None, draft_id=0)
    assert output_of(call(name, rejected)).tolist() == [[2, -1]]
    accepted = one_row([np.nan, 0.2, 0.7, 0.1], None, draft_id=2)
    assert output_of(call(name, accepted)).tolist() == [[2, 3]]
    infinite = one_row([0.2, np.inf, np.nan, 0.4], None, draft_id=0)
    assert output_of(call(name, infinite)).tolist() == [[1, -1]]


@pytest.mark.parametrize("name", ["GreedySampler", "greedy_sample"])
def test_greedy_shortcut_outside_strict_mode(name: str) -> None:
    """A draft with p(x) > 0.5005 is accepted without reading its row: the argmax of a
    row that sums to one.  Rows that do not (here an inf elsewhere in the row) break
    that contract, which only strict mode checks; the output is still valid."""
    inputs = one_row([0.2, np.inf, np.nan, 0.7], None, draft_id=3)
    assert output_of(call(name, inputs)).tolist() == [[3, 3]]
    with pytest.raises(ValueError, match="must be finite"):
        call(name, {**inputs, "target": inputs["target"].astype(np.float32)}, strict=True)


@pytest.mark.parametrize("name", ["GreedySampler", "greedy_sample"])
def test_greedy_row_without_a_number_has_argmax_zero(name: str) -> None:
    """A row of NaN (or -inf) has no maximum; its argmax is taken to be token 0."""
    for value in (np.nan, -np.inf):
        row = [value] * 4
        assert output_of(call(name, one_row(row, None, draft_id=2))).tolist() == [[0, -1]]
        assert output_of(call(name, one_row(row, None, draft_id=0))).tolist() == [[0, 3]]


@pytest.mark.parametrize("name", ["TypicalAcceptanceSampler", "typical_acceptance_sample"])
def test_typical_never_accepts_nan_and_recovers_the_argmax_of_the_numbers(name: str) -> None:
    """p(x) = NaN fails ``p(x) > threshold``; the recovered token is the argmax of the
    non-NaN entries; a row of NaN recovers token 0; p(x) = inf is accepted."""
    inputs = one_row([np.nan, 0.2, 0.7, 0.1], None, draft_id=0)
    assert output_of(call(name, inputs)).tolist() == [[2, -1]]
    inputs = one_row([np.nan] * 4, None, draft_id=1)
    assert output_of(call(name, inputs)).tolist() == [[0, -1]]
    inputs = one_row([0.1, np.inf, 0.2, np.nan], None, draft_id=1)
    assert output_of(call(name, inputs)).tolist() == [[1, 3]]
