"""The bad-input checks (docs/semantics.md §8) on every sampler, in both modes: type,
message and no side effect."""

from __future__ import annotations

import numpy as np
import pytest

import specdec_np
from specdec_np import registry

B, K, V = 3, 2, 7
ALL = registry.names()
STOCHASTIC = registry.names(stochastic=True)
READS_DRAFT_PROBS = tuple(v.name for v in registry.VERIFIERS if v.reads_draft_probs)
WITH_PARAMETERS = [(v.name, p.name) for v in registry.VERIFIERS for p in v.parameters]


def make_sampler(name: str, strict: bool):
    """The registered verifier's sampler: stochastic ones seeded, deterministic ones with
    their registry parameters."""
    entry = registry.get(name)
    sampler_class = getattr(specdec_np, entry.sampler_name)
    if entry.stochastic:
        return sampler_class(strict, seed=0)
    parameters = {p.name: p.default for p in entry.parameters}
    return sampler_class(**parameters, strict_mode=strict)


def valid_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "target_with_bonus_probs": rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(np.float32),
        "bonus_token_ids": rng.integers(0, V, (B, 1)),
        "draft_probs": rng.dirichlet(np.ones(V), size=(B, K)).astype(np.float32),
        "draft_token_ids": rng.integers(0, V, (B, K)),
    }


def call(sampler, inputs):
    return sampler(
        inputs["target_with_bonus_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
    )


def counters(sampler):
    if sampler.num_accepted_tokens is None:
        return None
    return (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )


def generator_state(sampler):
    """The sampler's own generator state (None for the deterministic samplers)."""
    generator = getattr(sampler, "_generator", None)
    return None if generator is None else generator.bit_generator.state


def assert_raises_untouched(sampler, inputs, error, pattern):
    call(sampler, valid_inputs())
    before = counters(sampler), generator_state(sampler)
    with pytest.raises(error, match=pattern):
        call(sampler, inputs)
    assert (counters(sampler), generator_state(sampler)) == before


SHAPE_CASES = [
    ("target_with_bonus_probs", np.zeros((B, K + 1), np.float32), "target_with_bonus_probs"),
    ("target_with_bonus_probs", np.zeros((B, 1, V), np.float32), "target_with_bonus_probs"),
    ("target_with_bonus_probs", np.zeros((B, K + 1, 0), np.float32), "target_with_bonus_probs"),
    ("draft_token_ids", np.zeros((B, K + 1), np.int64), "draft_token_ids"),
    ("draft_token_ids", np.zeros((B + 1, K), np.int64), "draft_token_ids"),
    ("bonus_token_ids", np.zeros((B, 2), np.int64), "bonus_token_ids"),
    ("bonus_token_ids", np.zeros((B + 1, 1), np.int64), "bonus_token_ids"),
]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(("argument", "value", "named"), SHAPE_CASES)
def test_shapes_always_checked(kind, strict, argument, value, named):
    inputs = valid_inputs()
    inputs[argument] = value
    assert_raises_untouched(make_sampler(kind, strict), inputs, ValueError, named)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", READS_DRAFT_PROBS)
def test_draft_probs_shape_checked(kind, strict):
    inputs = valid_inputs()
    inputs["draft_probs"] = np.zeros((B, K, V + 1), np.float32)
    sampler = make_sampler(kind, strict)
    assert_raises_untouched(sampler, inputs, ValueError, r"draft_probs.*\[3, 2, 7\].*\[3, 2, 8\]")


DTYPE_ALWAYS = [
    ("target_with_bonus_probs", np.int64, "target_with_bonus_probs"),
    ("target_with_bonus_probs", np.complex64, "target_with_bonus_probs"),
    ("draft_token_ids", np.float32, "draft_token_ids"),
    ("draft_token_ids", np.uint8, "draft_token_ids"),
    ("bonus_token_ids", np.bool_, "bonus_token_ids"),
]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(("argument", "dtype", "named"), DTYPE_ALWAYS)
def test_wrong_dtype_families_always_raise(kind, strict, argument, dtype, named):
    inputs = valid_inputs()
    inputs[argument] = inputs[argument].astype(dtype)
    assert_raises_untouched(make_sampler(kind, strict), inputs, TypeError, f"{named}.*found")


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    ("argument", "dtype"),
    [
        ("target_with_bonus_probs", np.float64),
        ("draft_token_ids", np.int32),
        ("bonus_token_ids", np.int32),
        ("target_with_bonus_probs", np.float16),
    ],
)
def test_exact_dtypes_only_in_strict_mode(kind, argument, dtype):
    inputs = valid_inputs()
    if argument == "target_with_bonus_probs":
        inputs["draft_probs"] = inputs["draft_probs"].astype(dtype)
    inputs[argument] = inputs[argument].astype(dtype)
    output = call(make_sampler(kind, False), inputs)
    assert output.shape == (B, K + 1) and output.dtype == np.int64
    assert_raises_untouched(make_sampler(kind, True), inputs, TypeError, f"{argument}.*strict")


@pytest.mark.parametrize("kind", READS_DRAFT_PROBS)
def test_draft_probs_must_match_target_dtype(kind):
    inputs = valid_inputs()
    inputs["draft_probs"] = inputs["draft_probs"].astype(np.float64)
    with pytest.raises(TypeError, match="draft_probs.*same dtype"):
        call(make_sampler(kind, False), inputs)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("argument", ["draft_token_ids", "bonus_token_ids"])
@pytest.mark.parametrize("bad", [V, -1, 2**31, 2**40, -(2**40)])
def test_out_of_range_ids_always_raise(kind, strict, argument, bad):
    inputs = valid_inputs()
    inputs[argument][1, -1] = bad
    position = K - 1 if argument == "draft_token_ids" else 0
    pattern = rf"{argument}.*\[0, {V}\).*found {bad} at \(row, position\) = \(1, {position}\)"
    assert_raises_untouched(make_sampler(kind, strict), inputs, ValueError, pattern)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    ("value", "message"), [(np.nan, "finite"), (np.inf, "finite"), (-0.25, "non-negative")]
)
def test_probability_values_checked_in_strict_mode(kind, value, message):
    inputs = valid_inputs()
    inputs["target_with_bonus_probs"][2, 1, 3] = value
    assert_raises_untouched(
        make_sampler(kind, True),
        inputs,
        ValueError,
        rf"target_with_bonus_probs must be {message}.*\[2, 1, 3\]",
    )
    output = call(make_sampler(kind, False), inputs)
    assert output.shape == (B, K + 1)
    assert ((output >= -1) & (output < V)).all()


@pytest.mark.parametrize("kind", READS_DRAFT_PROBS)
def test_draft_probs_values_checked_in_strict_mode(kind):
    inputs = valid_inputs()
    inputs["draft_probs"][0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="draft_probs must be finite"):
        call(make_sampler(kind, True), inputs)


@pytest.mark.parametrize("kind", ALL)
def test_strict_mode_checks_row_sums_where_the_verifier_needs_them(kind):
    inputs = valid_inputs()
    inputs["target_with_bonus_probs"][1, 0] *= 1.5
    if registry.get(kind).requires_normalised_rows:
        with pytest.raises(ValueError, match=r"target_with_bonus_probs rows must sum to 1"):
            call(make_sampler(kind, True), inputs)
    else:
        # The other verifiers take unnormalised rows, in strict mode too.
        assert call(make_sampler(kind, True), inputs).shape == (B, K + 1)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    "argument", ["target_with_bonus_probs", "draft_token_ids", "bonus_token_ids"]
)
@pytest.mark.parametrize("value", [None, "ids", [[1, 2]], 3.0])
def test_non_arrays_raise_type_error(kind, argument, value):
    """Non-arrays are a TypeError; array_like values of the wrong shape or dtype are the
    shape or dtype error of an array (both name the argument)."""
    inputs = valid_inputs()
    inputs[argument] = value
    error = TypeError if value is None or isinstance(value, str) else (TypeError, ValueError)
    with pytest.raises(error, match=argument):
        call(make_sampler(kind, False), inputs)


@pytest.mark.parametrize("kind", ALL)
def test_vllm_raise_methods(kind):
    sampler = make_sampler(kind, False)
    inputs = valid_inputs()
    args = (
        inputs["target_with_bonus_probs"],
        inputs["draft_token_ids"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
    )
    sampler._raise_if_incorrect_input(*args)
    with pytest.raises(TypeError, match="draft_token_ids.*int64"):
        sampler._raise_if_incorrect_dtype(args[0], args[1].astype(np.int32), *args[2:])
    with pytest.raises(ValueError, match="bonus_token_ids"):
        sampler._raise_if_incorrect_shape(args[0], args[1], args[2][:1], args[3])
    bad = args[1].copy()
    bad[2, 1] = V
    with pytest.raises(ValueError, match=r"draft_token_ids.*\(2, 1\)"):
        sampler._raise_if_out_of_bounds_vocab(V, bad, args[2])
    with pytest.raises(
        ValueError, match=r"bonus_token_ids.*found -1 at \(row, position\) = \(0, 0\)"
    ):
        sampler._raise_if_out_of_bounds_vocab(V, args[1], np.full((B, 1), -1))
    sampler._raise_if_inconsistent_device(*args)


@pytest.mark.parametrize(("kind", "name"), WITH_PARAMETERS)
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-0.1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("0.3", TypeError),
        (None, TypeError),
    ],
)
def test_parameter_validation(kind, name, value, error):
    sampler_class = getattr(specdec_np, registry.get(kind).sampler_name)
    with pytest.raises(error, match=name):
        sampler_class(**{name: value})
    function = getattr(specdec_np, registry.get(kind).function_name)
    inputs = valid_inputs()
    with pytest.raises(error, match=name):
        function(
            inputs["target_with_bonus_probs"],
            inputs["bonus_token_ids"],
            inputs["draft_token_ids"],
            **{name: value},
        )


@pytest.mark.parametrize("kind", STOCHASTIC)
def test_explicit_uniforms_validated(kind):
    inputs = valid_inputs()
    sampler = make_sampler(kind, False)
    with pytest.raises(ValueError, match=r"uniforms must have shape \[B, k\+1\]"):
        sampler(*call_args(inputs), uniforms=np.zeros((B, K)))
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        sampler(*call_args(inputs), uniforms=np.ones((B, K + 1)))
    with pytest.raises(TypeError, match="uniforms must be a float64 or float32 array"):
        sampler(*call_args(inputs), uniforms=np.zeros((B, K + 1), np.float16))


def call_args(inputs):
    return (
        inputs["target_with_bonus_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
    )
