"""The fast paths of a call's fixed cost refuse and compute exactly what the general paths
do: the cache of sampling parameters given as Python numbers, the compiled temperature
overflow test, and the metrics of small batches."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

import specdec_np
from specdec_np import _core, registry
from specdec_np._layouts import fast_path as _fast
from specdec_np._layouts import ragged as _ragged
from specdec_np._layouts import sampling as _sampling
from specdec_np._layouts.sampling import SamplingParameters
from specdec_np._runtime import checks as _validate
from specdec_np.metrics import VerificationMetrics


def _checked(parameters: SamplingParameters, vocab: int = 16, dtype: type = np.float32) -> Any:
    return _sampling.checked_parameters(
        2, vocab, parameters, from_logits=True, divides_logits=True, row_dtype=dtype,
        every_request_greedy=False, table=True,
    )  # fmt: skip


def test_numbers_are_checked_once_per_value_and_shape() -> None:
    parameters = SamplingParameters(0.8, 8, 0.9, 0.05)
    first = _checked(parameters)
    assert _checked(SamplingParameters(0.8, 8, 0.9, 0.05)) is first
    assert not first.table.flags.writeable and not first.greedy.flags.writeable
    # The vocabulary is part of the key: top-k 8 is off at V = 5.
    assert first.table[0, 1] == 8 and _checked(parameters, vocab=5).table[0, 1] == 0
    # So is the rows' dtype: 1e-40 is a normal float64 but not a normal float32.
    assert _checked(SamplingParameters(1e-40), dtype=np.float64).table[0, 0] == 1e-40
    with pytest.raises(ValueError, match="normal float32"):
        _checked(SamplingParameters(1e-40))
    # A refused value is never cached: it is refused again.
    for _ in range(2):
        with pytest.raises(ValueError, match="top_p must be in"):
            _checked(SamplingParameters(top_p=0.0))


def test_negative_zero_and_arrays_are_not_cached() -> None:
    assert _sampling.parameters_key(SamplingParameters(min_p=-0.0)) is None
    assert _sampling.parameters_key(SamplingParameters(min_p=0.0)) is not None
    assert _sampling.parameters_key(SamplingParameters(np.float64(0.8))) is None
    assert _sampling.parameters_key(SamplingParameters(True)) is None
    # A filter order that is not a string (unhashable, even) is refused with its message.
    assert _sampling.parameters_key(SamplingParameters(filter_order=["vllm"])) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="filter_order must be one of"):
        _checked(SamplingParameters(0.8, filter_order=["vllm"]))  # type: ignore[arg-type]
    table = _checked(SamplingParameters(0.8, min_p=-0.0)).table
    assert np.signbit(table[0, 3])  # the sign the general path keeps
    array = np.array([0.8, 0.7])
    checked = _checked(SamplingParameters(array))
    assert checked.table.flags.writeable and checked.table[1, 0] == 0.7


def _overflow_reference(rows: np.ndarray, temperature: np.ndarray, greedy: np.ndarray,
                        counts: np.ndarray) -> int:
    divisor = temperature.astype(rows.dtype)
    request = np.repeat(np.arange(counts.shape[0]), counts)
    for row in range(int(counts.sum())):
        b = request[row]
        if greedy[b] or not divisor[b] < 1:
            continue
        finite = rows[row][np.isfinite(rows[row])]
        if finite.size:
            with np.errstate(over="ignore"):
                if np.isinf(finite.max() / divisor[b]):
                    return row
    return -1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_compiled_overflow_test_is_the_numpy_one(dtype: type) -> None:
    rng = np.random.default_rng(0)
    big = np.finfo(dtype).max / 4
    found = set()
    for _ in range(300):
        counts = rng.integers(0, 3, 4)
        rows = rng.standard_normal((int(counts.sum()), 6)).astype(dtype)
        mask = rng.random(rows.shape)
        rows[mask < 0.1] = np.nan
        rows[(mask >= 0.1) & (mask < 0.2)] = np.inf
        rows[(mask >= 0.2) & (mask < 0.3)] = -np.inf
        rows[(mask >= 0.3) & (mask < 0.35)] = big
        temperature = rng.choice([0.1, 0.3, 1.0, 2.0, 0.0], 4)
        greedy = temperature == 0
        expected = _overflow_reference(rows, temperature, greedy, counts)
        assert _core.first_tempered_overflow(rows, temperature, greedy.view(np.uint8), counts) \
            == expected
        found.add(expected >= 0)
    assert found == {True, False}  # both outcomes were exercised


def test_the_overflow_message_names_the_row() -> None:
    rows = np.zeros((3, 4), dtype=np.float32)
    rows[2, 1] = np.finfo(np.float32).max / 2
    with pytest.raises(ValueError, match="request 1, which divides the largest finite logit"):
        _sampling.check_tempered_rows(
            np.array([0.1, 0.1]), np.zeros(2, bool), "target_logits", rows,
            np.array([1, 2]), np,
        )  # fmt: skip
    # Greedy requests never divide their rows.
    _sampling.check_tempered_rows(
        np.array([0.1, 0.1]), np.array([False, True]), "target_logits", rows,
        np.array([1, 2]), np,
    )  # fmt: skip


@pytest.mark.parametrize("batch", [1, 16, 17, 40])
def test_small_and_large_batches_record_the_same_metrics(batch: int) -> None:
    rng = np.random.default_rng(batch)
    metrics = VerificationMetrics()
    drafted_at = np.zeros(9, np.int64)
    accepted_at = np.zeros(9, np.int64)
    for _ in range(3):
        drafted = rng.integers(0, 9, batch)
        accepted = np.minimum(rng.integers(0, 9, batch), drafted)
        metrics.record(drafted, accepted)
        for j in range(9):
            drafted_at[j] += int((drafted > j).sum())
            accepted_at[j] += int((accepted > j).sum())
    width = metrics.drafted_at.shape[0]
    assert np.array_equal(metrics.drafted_at, drafted_at[:width])
    assert np.array_equal(metrics.accepted_at, accepted_at[:width])
    assert not drafted_at[width:].any()


# --------------------------------------------------------------------------------------
# The ragged call's fast path (specdec_np._layouts.fast_path) against the general path
# --------------------------------------------------------------------------------------


def _random_call(rng: np.random.Generator, verifier: registry.Verifier) -> dict[str, Any]:
    """The keywords of a random ragged call on the fast path's ground: any verifier, row
    forms, dtypes, bonus forms and sampling parameters; some calls with a bad input."""
    # Few shapes, so that calls which differ in one respect meet the kept plans.
    batch_size = int(rng.integers(1, 4))
    vocab = int(rng.choice([1, 4, 6]))
    counts = rng.integers(0, 4, batch_size)
    total = int(counts.sum())
    dtype = rng.choice([np.float32, np.float64])
    id_dtype = rng.choice([np.int32, np.int64])
    bonus_form = rng.choice(["drawn", "given", "given without bonus rows"])
    rows = total + (0 if bonus_form == "given without bonus rows" else batch_size)
    logits = bool(rng.random() < 0.6)
    target = rng.standard_normal((rows, vocab)) * 3
    if not logits:
        target = rng.dirichlet(np.ones(vocab), size=rows)
        if vocab > 1:
            target[rng.random((rows, vocab)) < 0.3] = 0.0  # some rows without mass: refused
    keywords: dict[str, Any] = {
        "method": verifier.name,
        "num_draft_tokens": counts,
        "draft_token_ids": rng.integers(0, vocab, total).astype(id_dtype),
        ("target_logits" if logits else "target_probs"): target.astype(dtype),
    }
    draft_form = rng.choice(["none", "probs", "logits"] if logits else ["none", "probs"])
    if draft_form == "probs":
        keywords["draft_probs"] = rng.dirichlet(np.ones(vocab), size=total).astype(dtype)
    elif draft_form == "logits":
        keywords["draft_logits"] = rng.standard_normal((total, vocab)).astype(dtype)
    if bonus_form != "drawn":
        keywords["bonus_token_ids"] = rng.integers(0, vocab, batch_size).astype(
            rng.choice([np.int32, np.int64])
        )
    temperature = rng.choice(["none", "scalar", "array", "greedy mix"])
    if temperature == "scalar":
        keywords["temperature"] = float(rng.choice([0.0, 0.5, 1.0, 1.5]))
    elif temperature == "array":
        keywords["temperature"] = rng.uniform(0.3, 2.0, batch_size)
    elif temperature == "greedy mix":
        keywords["temperature"] = np.where(rng.random(batch_size) < 0.5, 0.0, 0.7)
    if logits:
        if rng.random() < 0.5:
            keywords["top_k"] = int(rng.integers(0, vocab + 2))
        if rng.random() < 0.5:
            keywords["top_p"] = float(rng.uniform(0.2, 1.0))
        if rng.random() < 0.3:
            keywords["min_p"] = float(rng.uniform(0.0, 0.5))
        keywords["filter_order"] = str(rng.choice(["vllm", "llama.cpp"]))
    bad = rng.choice(["none"] * 8 + ["id", "count", "shape", "overflow"])
    if bad == "id" and total:
        keywords["draft_token_ids"][int(rng.integers(total))] = vocab
    elif bad == "count":
        keywords["num_draft_tokens"] = counts.copy()
        keywords["num_draft_tokens"][0] = -1
    elif bad == "shape":
        keywords["draft_token_ids"] = np.append(keywords["draft_token_ids"], 0)
    elif bad == "overflow" and logits:
        keywords["target_logits"][0, 0] = np.finfo(dtype).max / 2
        keywords["temperature"] = 0.25
    return keywords


def _outcome(call: Any, generator: np.random.Generator) -> tuple[Any, ...]:
    """A call's result (every field) or error (type and message), and the generator's
    state after it."""
    try:
        result = call()
    except (TypeError, ValueError) as error:
        found: Any = (type(error), str(error))
    else:
        found = tuple(
            None if field is None else (np.asarray(field).dtype, np.asarray(field).tolist())
            for field in result
        )
    return found, generator.bit_generator.state


def _call(keywords: dict[str, Any], seed: int, engine: bool) -> tuple[Any, ...]:
    """The outcome of one call (and an engine's metrics after it) from a fresh generator."""
    keywords = dict(keywords)
    if not engine:
        generator = np.random.default_rng(seed)
        return _outcome(lambda: specdec_np.verify_ragged(**keywords, generator=generator),
                        generator)  # fmt: skip
    verifier = specdec_np.EngineVerifier(keywords.pop("method"), seed=seed)
    found = _outcome(lambda: verifier(**keywords), verifier._own_generator.numpy)
    metrics = verifier.metrics
    return (*found, metrics.requests, metrics.drafted, metrics.accepted, metrics.emitted,
            metrics.accepted_at.tolist(), metrics.drafted_at.tolist())  # fmt: skip


@pytest.mark.parametrize("engine", [False, True], ids=["verify_ragged", "EngineVerifier"])
def test_the_fast_path_is_the_general_path(engine: bool, monkeypatch: Any) -> None:
    """Random ragged calls, through the fast path and forced through the general path:
    the same results, errors, generator states (and metrics), for every verifier."""
    fast_calls = []
    fast_verify = _fast._verify
    monkeypatch.setattr(_fast, "_verify", lambda *a: fast_calls.append(1) or fast_verify(*a))
    rng = np.random.default_rng(7)
    outcomes = {"result": 0, "error": 0}
    for case in range(400):
        keywords = _random_call(rng, registry.VERIFIERS[case % len(registry.VERIFIERS)])
        fast = _call(keywords, case, engine)
        with monkeypatch.context() as general_path:
            general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
            general = _call(keywords, case, engine)
        assert fast == general, (case, keywords)
        outcomes["error" if isinstance(fast[0][0], type) else "result"] += 1
    # Both outcomes were exercised, and most calls took the fast path to the kernel.
    assert outcomes["result"] > 100 and outcomes["error"] > 50
    assert len(fast_calls) > 150


def test_kept_plans_serve_only_their_own_calls(monkeypatch: Any) -> None:
    """Calls that differ from one another in one respect each (bonus form, draft form,
    longest chain, method and its parameters, dtypes, greedy requests), made in turn on
    several batches, so that each meets the plans the others left: each is the general
    path's call."""
    vocab = 5
    parameterised = [name for name in registry.names() if registry.get(name).parameter_names]
    for seed in range(40):
        rng = np.random.default_rng(seed)
        logits = (rng.standard_normal((5, vocab)) * 2).astype(np.float32)
        draft = rng.dirichlet(np.ones(vocab), 3).astype(np.float32)
        base: dict[str, Any] = {
            "num_draft_tokens": np.array([2, 1]), "draft_token_ids": rng.integers(0, 3, 3),
            "target_logits": logits, "temperature": 0.7, "top_k": 3,
        }  # fmt: skip
        variants = [
            {},
            {"bonus_token_ids": np.array([4, 3])},
            {"bonus_token_ids": np.array([4, 3]), "target_logits": logits[:3]},
            {"draft_probs": np.full((3, vocab), 0.2, np.float32)},
            {"draft_logits": logits[:3] + 1},
            {"num_draft_tokens": np.array([3, 0])},
            {"target_logits": logits.astype(np.float64)},
            {"draft_token_ids": base["draft_token_ids"].astype(np.int32)},
            {"temperature": 0.0},
            *({"method": name} for name in registry.names()),
            *({"method": name, "draft_probs": draft} for name in registry.names()),
            *(
                {"method": name, **dict.fromkeys(registry.get(name).parameter_names, value)}
                for name in parameterised
                for value in (0.0, 1.0)
            ),
        ]
        for variant in variants:
            keywords = {**base, **variant}
            fast = _call(keywords, seed, False)
            with monkeypatch.context() as general_path:
                general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
                assert fast == _call(keywords, seed, False), (seed, variant)


def test_the_kept_options_follow_the_kernel_signature() -> None:
    """The fast path passes the chain kernel's options by position, in its order."""
    parameters = list(inspect.signature(_core.verify_chains_direct).parameters.values())
    start = [parameter.name for parameter in parameters].index("num_threads") + 1
    assert {parameter.name: parameter.default for parameter in parameters[start:]} == (
        _fast._OPTION_DEFAULTS
    )


@pytest.mark.parametrize("counts", [[1, 1], [2, 0]], ids=["one draw", "scattered draw"])
def test_a_request_that_fails_in_the_kernel_puts_the_draws_back(
    counts: list[int], monkeypatch: Any
) -> None:
    """On the fast path, a row without mass fails the call after the draw: the error is
    the general path's, the generator and the engine's metrics are as they were."""
    fast_calls = []
    fast_verify = _fast._verify
    monkeypatch.setattr(_fast, "_verify", lambda *a: fast_calls.append(1) or fast_verify(*a))
    target = np.full((4, 3), 1 / 3)
    target[0] = 0.0  # request 0's first row: its draft is rejected, nothing to draw from
    keywords = {
        "num_draft_tokens": np.array(counts), "draft_token_ids": np.array([1, 2]),
        "target_probs": target,
    }  # fmt: skip
    generator = np.random.default_rng(5)
    before = generator.bit_generator.state
    with pytest.raises(ValueError, match="no positive probability") as fast_error:
        specdec_np.verify_ragged(**keywords, generator=generator)
    assert generator.bit_generator.state == before and len(fast_calls) == 1
    engine = specdec_np.EngineVerifier(seed=5)
    engine_before = engine._own_generator.numpy.bit_generator.state
    with pytest.raises(ValueError, match="no positive probability"):
        engine(**keywords)
    assert engine._own_generator.numpy.bit_generator.state == engine_before
    assert engine.metrics.requests == 0 and len(fast_calls) == 2
    with monkeypatch.context() as general_path:
        general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
        with pytest.raises(ValueError) as general_error:
            specdec_np.verify_ragged(**keywords, generator=generator)
    assert str(fast_error.value) == str(general_error.value)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("filters", [{}, {"top_k": 40, "top_p": 0.9}], ids=["plain", "top-k"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["to +inf", "to -inf"])
def test_an_overflow_left_to_the_kernel_is_the_general_paths_error(
    dtype: type, filters: dict[str, Any], sign: float, monkeypatch: Any
) -> None:
    """The drawn bonus row of a request without drafts is checked for its temperature's
    overflow by the kernel's law alone: a refused row (a later request's, its maximum as
    large as the dtype allows, +inf entries beside it or not) fails the call with the
    general path's error, the draws put back; a greedy request's row is never refused."""
    fast_calls = []
    fast_verify = _fast._verify
    monkeypatch.setattr(_fast, "_verify", lambda *a: fast_calls.append(1) or fast_verify(*a))
    vocab = 3000  # long enough for top-k's survivors
    rows = np.random.default_rng(0).standard_normal((4, vocab)).astype(dtype)
    rows[2] = sign * np.finfo(dtype).max / 2  # every finite logit of row 2 overflows at 1/4
    rows[2, 7] = np.nan
    for infinite in (False, True):
        if infinite:
            rows[2, 11] = np.inf
        keywords = {"logits": rows, "temperature": np.array([0.25, 0.25, 0.25, 0.5]), **filters}
        generator = np.random.default_rng(5)
        before = generator.bit_generator.state
        with pytest.raises(ValueError, match="overflow") as fast_error:
            specdec_np.sample_tokens(**keywords, generator=generator)
        assert generator.bit_generator.state == before
        with monkeypatch.context() as general_path:
            general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
            with pytest.raises(ValueError) as general_error:
                specdec_np.sample_tokens(**keywords, generator=generator)
        assert str(fast_error.value) == str(general_error.value)
        # The same row read raw by a greedy request.
        keywords["temperature"] = np.array([0.25, 0.25, 0.0, 0.5])
        fast = specdec_np.sample_tokens(**keywords, generator=np.random.default_rng(5))
        with monkeypatch.context() as general_path:
            general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
            general = specdec_np.sample_tokens(**keywords, generator=np.random.default_rng(5))
        np.testing.assert_array_equal(fast, general)
    assert len(fast_calls) == 4


def _parameter(rng: np.random.Generator, name: str, batch: int, vocab: int) -> Any:
    """A random ``[B]`` array of one sampling parameter, now and then out of range or of a
    dtype the compiled pass leaves to the Python checks."""
    dtype = rng.choice([np.float64, np.float32, np.int64, np.int32, np.float16, np.uint8])
    if name == "temperature":
        values = rng.choice([0.0, -0.0, 0.7, 1.0, 2.5, 1e-39, 1e-300, 3.5e38, np.nan, -1.0,
                             np.inf], batch, p=[.2, .05, .2, .1, .1, .05, .05, .05, .05, .1, .05])
    elif name == "top_k":
        values = rng.choice([0.0, 1.0, 3.0, vocab, vocab + 5, 2.5, -1.0, np.inf, np.nan], batch,
                            p=[.2, .2, .2, .1, .1, .05, .05, .05, .05])
    else:
        values = rng.choice([0.0, -0.0, 0.3, 1.0, 1.5, -0.2, np.nan], batch,
                            p=[.15, .05, .4, .2, .1, .05, .05])
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(dtype) if rng.random() < 0.9 else values.tolist()


def _python_parameters(batch: int, vocab: int, parameters: dict[str, Any], **flags: Any) -> Any:
    """The Python checks' record (``check_sampling_parameters``, ``greedy_requests`` and
    ``sampling_table``), or the error they raise."""
    try:
        sampling = _validate.check_sampling_parameters(
            batch, vocab, from_logits=flags["from_logits"], row_dtype=flags["dtype"],
            divides_logits=flags["divides_logits"],
            **{name: parameters.get(name) for name in ("temperature", "top_k", "top_p", "min_p")},
        )  # fmt: skip
    except (TypeError, ValueError) as error:
        return error
    greedy = _sampling.greedy_requests(sampling, flags["every_request_greedy"], batch)
    return sampling, greedy, _sampling.sampling_table(sampling, greedy, batch, "llama.cpp")


#: The parameter dtypes the compiled pass reads itself.
OWN_DTYPES = (np.float32, np.float64, np.int32, np.int64)


def test_the_compiled_parameter_pass_is_the_python_checks() -> None:
    """Random [B] parameters of every dtype, in and out of range: the compiled pass makes
    the Python checks' arrays bit for bit, or answers None where they refuse or where the
    dtype is not its own."""
    rng = np.random.default_rng(17)
    outcomes = {"same": 0, "refused": 0, "left": 0}
    for _ in range(600):
        batch, vocab = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        names = [n for n in ("temperature", "top_k", "top_p", "min_p") if rng.random() < 0.6]
        parameters = {name: _parameter(rng, name, batch, vocab) for name in names}
        flags = {
            "from_logits": bool(rng.random() < 0.9), "divides_logits": bool(rng.random() < 0.8),
            "dtype": np.dtype(rng.choice([np.float32, np.float64])),
            "every_request_greedy": bool(rng.random() < 0.1),
        }  # fmt: skip
        made = _core.sampling_arrays(
            batch, vocab, *(parameters.get(n) for n in ("temperature", "top_k", "top_p", "min_p")),
            1.0, flags["from_logits"], flags["divides_logits"], flags["dtype"].itemsize,
            flags["every_request_greedy"], True,
        )  # fmt: skip
        expected = _python_parameters(batch, vocab, parameters, **flags)
        own = all(type(x) is np.ndarray and x.dtype in OWN_DTYPES for x in parameters.values())
        if isinstance(expected, Exception) or not own:
            assert made is None, (parameters, flags)
            outcomes["refused" if own else "left"] += 1
            continue
        sampling, greedy, table = expected
        for name, found in zip(("temperature", "top_k", "top_p", "min_p"), made[:4]):
            assert (found is None) == (sampling[name] is None)
            if found is not None:
                assert found.dtype == sampling[name].dtype
                assert found.tobytes() == sampling[name].tobytes(), name
        assert made[4].dtype == bool and np.array_equal(made[4], greedy)
        assert made[5].tobytes() == table.tobytes()
        outcomes["same"] += 1
    assert min(outcomes.values()) > 50, outcomes


def test_kept_plans_keep_the_thread_count_of_their_own_shapes(monkeypatch: Any) -> None:
    """Threads change no result, so a plan kept for another batch size or chain length
    would go unseen in the outputs: the kernel is asked here with the thread count the
    general path gives each call."""
    from specdec_np._runtime import arrays as _backend

    monkeypatch.setattr(
        _backend, "thread_count", lambda batch, elements: 1 + (batch > 2) + (elements > 20)
    )
    seen: list[int] = []
    direct = _core.verify_chains_direct
    monkeypatch.setattr(
        _core, "verify_chains_direct", lambda *a, **k: seen.append(a[13]) or direct(*a, **k)
    )
    monkeypatch.setattr(_fast._PLANS, "plans", {}, raising=False)
    rng = np.random.default_rng(2)
    calls = []
    # A deterministic verifier that processes rows, and a stochastic one, from the registry.
    plain = next(n for n in registry.names(stochastic=False) if not registry.get(n).greedy)
    drawn = registry.names(stochastic=True)[0]
    for batch, k, method in [(1, 1, plain), (3, 1, plain), (1, 3, plain),
                             (3, 3, drawn), (1, 1, plain)] * 2:  # fmt: skip
        calls.append({
            "method": method, "num_draft_tokens": np.full(batch, k),
            "draft_token_ids": rng.integers(0, 8, batch * k),
            "target_logits": rng.standard_normal((batch * (k + 1), 8)).astype(np.float32),
            "temperature": 0.9,
        })  # fmt: skip
    for keywords in calls:
        _call(keywords, 0, False)
    fast = list(seen)
    seen.clear()
    with monkeypatch.context() as general_path:
        general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
        for keywords in calls:
            _call(keywords, 0, False)
    assert fast == seen and len(set(seen)) > 1


def test_kept_plans_of_long_rows_follow_the_row_threads_setting(monkeypatch: Any) -> None:
    """Plans are kept for rows long enough for row threads too: the environment's setting
    is part of their key, so a call after the setting changed gets the general path's
    count of row threads."""
    from specdec_np._runtime import arrays as _backend

    monkeypatch.setattr(_backend, "available_cores", lambda: 4)
    monkeypatch.setattr(_core, "openmp_max_threads", lambda: 4)
    seen: list[int] = []
    direct = _core.verify_chains_direct
    signature = inspect.signature(direct)
    monkeypatch.setattr(
        _core, "verify_chains_direct",
        lambda *a, **k: seen.append(signature.bind(*a, **k).arguments.get("row_threads", 1))
        or direct(*a, **k),
    )  # fmt: skip
    monkeypatch.setattr(_fast._PLANS, "plans", {}, raising=False)
    rows = np.random.default_rng(3).standard_normal((1, _backend.ROW_THREADS_MIN_VOCAB))
    rows = rows.astype(np.float32)
    settings = [None, "2", "2", None, "auto", None]
    for setting in settings:
        if setting is None:
            monkeypatch.delenv(_backend.ROW_THREADS_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(_backend.ROW_THREADS_VARIABLE, setting)
        specdec_np.sample_tokens(logits=rows, generator=np.random.default_rng(0))
    assert seen == [1, 2, 2, 1, 4, 1]
    assert len(_fast._PLANS.plans) == 3
    # Shorter rows never read the setting (row_thread_count gives them one thread), so
    # their calls do not look it up; the long rows' calls do (the control).
    looked_up: list[Any] = []
    read_setting = _backend.row_threads_setting

    def recorded_setting() -> Any:
        looked_up.append(read_setting())
        return looked_up[-1]

    monkeypatch.setattr(_backend, "row_threads_setting", recorded_setting)
    short = np.ascontiguousarray(rows[:, : _backend.ROW_THREADS_MIN_VOCAB - 1])
    specdec_np.sample_tokens(logits=short, generator=np.random.default_rng(0))
    assert not looked_up
    specdec_np.sample_tokens(logits=rows, generator=np.random.default_rng(0))
    assert looked_up == [None]


def test_strided_counts_take_the_general_path() -> None:
    # A reversed num_draft_tokens (negative stride), found by the fuzz: the same result as
    # its contiguous copy, never a kernel's internal error.
    rows = np.random.default_rng(0).standard_normal((3, 33)).astype(np.float32)
    common = dict(draft_token_ids=np.array([0]), target_logits=rows,
                  bonus_token_ids=np.array([19, 3]), top_k=38, min_p=0.1)
    strided = specdec_np.verify_ragged(num_draft_tokens=np.array([0, 1])[::-1],
                                       generator=np.random.default_rng(0), **common)
    copied = specdec_np.verify_ragged(num_draft_tokens=np.array([1, 0]),
                                      generator=np.random.default_rng(0), **common)
    assert strided.output_token_ids.tolist() == copied.output_token_ids.tolist()


def _explicit_uniforms(rng: np.random.Generator, keywords: dict[str, Any]) -> tuple[Any, str]:
    """Explicit uniforms for a call, ``[B, max_k + 2]`` in one of the forms the fast path
    serves (float64, float32, not C-contiguous) or one the general path refuses (shape,
    range, NaN, dtype), and which."""
    counts = np.asarray(keywords["num_draft_tokens"])
    shape = (counts.shape[0], int(counts.max(initial=0)) + 2)
    uniforms = rng.random(shape)
    kind = str(rng.choice(["float64", "float32", "fortran", "strided", "float32 strided",
                           "shape", "one", "negative", "nan", "float16", "int", "list"]))
    if kind == "float32":
        uniforms = uniforms.astype(np.float32)
    elif kind == "fortran":
        uniforms = np.asfortranarray(uniforms)
    elif kind in ("strided", "float32 strided"):
        wide = np.repeat(uniforms, 2, axis=1).astype(np.float32 if "32" in kind else np.float64)
        uniforms = wide[:, ::2]
    elif kind == "shape":
        uniforms = rng.random((shape[0], shape[1] + int(rng.choice([-1, 1]))))
    elif kind in ("one", "negative", "nan"):
        uniforms[int(rng.integers(shape[0])), int(rng.integers(shape[1]))] = {
            "one": 1.0, "negative": -1e-300, "nan": np.nan}[kind]
    elif kind == "float16":
        uniforms = uniforms.astype(np.float16)
    elif kind == "int":
        uniforms = np.zeros(shape, dtype=np.int64)
    elif kind == "list":
        uniforms = uniforms.tolist()
    return uniforms, kind


@pytest.mark.parametrize("engine", [False, True], ids=["verify_ragged", "EngineVerifier"])
def test_explicit_uniforms_on_the_fast_path_are_the_general_path(
    engine: bool, monkeypatch: Any
) -> None:
    """Random ragged calls with explicit uniforms, good and bad: the same results and
    errors (and metrics) through the fast path as through the general path, the generator
    untouched, the caller's uniforms unchanged; the good NumPy ones take the fast path."""
    served: list[str] = []
    fast_verify = _fast._verify
    monkeypatch.setattr(
        _fast, "_verify", lambda *a: served.append(kind) or fast_verify(*a)  # type: ignore[has-type]
    )
    rng = np.random.default_rng(11)
    errors = set()
    for case in range(240):
        keywords = _random_call(rng, registry.VERIFIERS[case % len(registry.VERIFIERS)])
        keywords["uniforms"], kind = _explicit_uniforms(rng, keywords)
        given = np.array(keywords["uniforms"], copy=True)
        fast = _call(keywords, case, engine)
        assert np.asarray(keywords["uniforms"]).tobytes() == given.tobytes()
        with monkeypatch.context() as general_path:
            general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
            general = _call(keywords, case, engine)
        assert fast == general, (case, kind, keywords)
        assert fast[1] == np.random.default_rng(case).bit_generator.state or engine
        if isinstance(fast[0][0], type):
            errors.add(kind)
    # Every refusal was met, with the general path's own error, and every served form
    # reached the kernel on the fast path.
    assert {"shape", "one", "negative", "nan", "float16", "int"} <= errors
    assert {"float64", "float32", "fortran", "strided", "float32 strided"} <= set(served)
    assert not {"shape", "one", "negative", "nan", "float16", "int", "list"} & set(served)


def test_explicit_uniforms_of_sample_tokens_take_the_fast_path(monkeypatch: Any) -> None:
    """sample_tokens with explicit uniforms: the fast path's tokens and errors are the
    general path's, for every dtype and range case."""
    served: list[int] = []
    fast_verify = _fast._verify
    monkeypatch.setattr(_fast, "_verify", lambda *a: served.append(1) or fast_verify(*a))
    lane = _fast.sample_lane

    def counted_lane(*arguments: Any) -> Any:
        tokens = lane(*arguments)
        if tokens is not None:
            served.append(1)
        return tokens

    monkeypatch.setattr(_fast, "sample_lane", counted_lane)
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 7)).astype(np.float32)
    cases = [rng.random(3), rng.random(3).astype(np.float32), rng.random(6)[::2],
             np.array([0.0, 0.5, np.nextafter(1.0, 0.0)]), np.array([0.2, 1.0, 0.3]),
             np.array([0.2, np.nan, 0.3]), rng.random(4), rng.random(3).astype(np.float16)]
    for uniforms in cases:
        outcomes = []
        for general in (False, True):
            with monkeypatch.context() as patch:
                if general:
                    patch.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
                    patch.setattr(_fast, "sample_lane", lambda *a: None)
                try:
                    found: Any = specdec_np.sample_tokens(
                        logits=logits, uniforms=uniforms, temperature=0.8, top_k=4
                    ).tolist()
                except (TypeError, ValueError) as error:
                    found = (type(error), str(error))
            outcomes.append(found)
        assert outcomes[0] == outcomes[1], uniforms
    assert len(served) == 4  # the four good cases, once each (the fast path or its lane)


def test_the_records_made_without_constructors_are_the_constructors_records(
    monkeypatch: Any,
) -> None:
    """The fronts and the fast path make their named tuples from every field in order
    (``tuple.__new__``): each record has all its fields, equal to what its constructor
    makes from the same keywords."""
    from specdec_np._layouts import engine_call as _engine_call
    from specdec_np._layouts import padded as _chains

    logits = np.zeros((3, 4), np.float32)
    assert _fast._LOGITS_ONLY + (logits, None) == tuple(
        _sampling.row_form(logits, None, None, None)
    )
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(_ragged.RaggedCall, "fast_call", lambda self, *a: seen.append(a))
    generator = np.random.default_rng(0)
    common = {"temperature": 0.7, "top_k": 3, "stream": "draft"}
    calls = [
        lambda: specdec_np.verify_ragged(
            num_draft_tokens=np.array([2]), draft_token_ids=np.array([1, 2]),
            target_logits=logits, generator=generator, **common,
        ),
        lambda: specdec_np.EngineVerifier(seed=0)(
            num_draft_tokens=np.array([2]), draft_token_ids=np.array([1, 2]),
            target_logits=logits, **common,
        ),
        lambda: specdec_np.sample_tokens(logits=logits, generator=generator, **common),
    ]  # fmt: skip
    for call in calls:
        seen.clear()
        call()  # the patched fast path answers None: the general path answers
        rows, sampling, source = seen[0]
        for record in (rows, sampling, source):
            assert len(record) == len(type(record)._fields)
        assert sampling == SamplingParameters(0.7, 3, None, None, "vllm")
        assert source.stream == "draft" and source.sources_for is None
        assert (source.generator is generator) != (source.generator_for is not None)
        assert rows.target_logits is not None and rows[1:] == (None, None, None)
    assert len(_chains.ChainBatch._fields) == 16  # the fast path's batch gives 16 fields
    assert _engine_call.new_record is tuple.__new__


def _random_step(rng: np.random.Generator) -> dict[str, Any]:
    """A sampling step's keywords (NumPy logits, settings that are Python numbers), good or
    bad: rows without mass, rows that overflow at the temperature, refused settings."""
    batch, vocab = int(rng.integers(1, 4)), int(rng.choice([1, 5, 64, 2500]))
    dtype = rng.choice([np.float32, np.float64])
    rows = (rng.standard_normal((batch, vocab)) * 3).astype(dtype)
    bad = rng.choice(["none"] * 6 + ["no mass", "nan", "overflow", "setting"])
    keywords: dict[str, Any] = {
        "logits": rows,
        "temperature": float(rng.choice([0.0, 0.25, 0.8, 1.0])),
        "filter_order": str(rng.choice(["vllm", "llama.cpp"])),
    }
    if rng.random() < 0.6:
        keywords["top_k"] = int(rng.integers(0, vocab + 2))
    if rng.random() < 0.5:
        keywords["top_p"] = float(rng.uniform(0.3, 1.0))
    if rng.random() < 0.4:
        keywords["min_p"] = float(rng.uniform(0.0, 0.3))
    if bad == "no mass":
        rows[-1] = -np.inf
    elif bad == "nan":
        rows[0, 0] = np.nan
    elif bad == "overflow":
        rows[0, 0] = np.finfo(dtype).max / 2
        keywords["temperature"] = 0.25
    elif bad == "setting":
        keywords["top_p"] = 0.0
    if rng.random() < 0.3:
        keywords["uniforms"] = rng.random(batch).astype(rng.choice([np.float64, np.float32]))
        form = rng.choice(["plain"] * 4 + ["big-endian", "strided", "1.0", "nan", "negative",
                                           "shape"])  # fmt: skip
        if form == "big-endian":
            keywords["uniforms"] = keywords["uniforms"].astype(">f8")
        elif form == "strided":
            keywords["uniforms"] = np.repeat(keywords["uniforms"], 2)[::2]
        elif form == "shape":
            keywords["uniforms"] = keywords["uniforms"][:, None]
        elif form != "plain":
            keywords["uniforms"][-1] = {"1.0": 1.0, "nan": np.nan, "negative": -0.25}[form]
    # The other keywords at their defaults, given (the lane serves them), or not.
    if rng.random() < 0.2:
        keywords.update(probs=None, stream="verify", return_probs=False, token_bitmask=None)
    elif rng.random() < 0.05:
        keywords["return_probs"] = 0  # not a bool: the general path's error
    return keywords


def test_the_sampling_lane_is_the_general_path(monkeypatch: Any) -> None:
    """Random sampling steps, each after a twin of its kind whose rows the kernel takes
    (so that it meets the launch its kind kept) and again after a step of another kind,
    against the general path: the same tokens, errors and generator states; most repeated
    good steps take the lane."""
    _check_the_lane(monkeypatch)


def test_a_lane_that_keeps_a_refused_draw_is_caught(monkeypatch: Any) -> None:
    """Negative control: a lane that does not put its draw back when the kernel refuses a
    row leaves the generator moved, which the comparison above must catch."""
    lane = _fast.sample_lane

    def forgetful_lane(*arguments: Any) -> Any:
        with monkeypatch.context() as patch:
            patch.setattr(_fast, "_put_back", lambda *a: None)
            return lane(*arguments)

    monkeypatch.setattr(_fast, "sample_lane", forgetful_lane)
    with pytest.raises(AssertionError):
        _check_the_lane(monkeypatch)


def _check_the_lane(monkeypatch: Any) -> None:
    hits = []
    lane = _fast.sample_lane

    def counted_lane(*arguments: Any) -> Any:
        tokens = lane(*arguments)
        hits.append(tokens is not None)
        return tokens

    monkeypatch.setattr(_fast, "sample_lane", counted_lane)
    rng = np.random.default_rng(17)
    steps = []
    for _ in range(40):
        step = _random_step(rng)
        # Its twin: the same kind (shape, dtype, settings) with rows the kernel takes, so
        # that the step meets the launch the twin kept, a bad row included.
        rows = step["logits"]
        steps += [{**step, "logits": rng.standard_normal(rows.shape).astype(rows.dtype)}, step]
    # Twin 0, step 0, twin 1, step 1, then each again after a step of another kind.
    order = [first + repeat for first in range(0, 80, 4) for repeat in (0, 1, 2, 3, 1, 3)]
    outcomes = {"result": 0, "error": 0}
    for case, index in enumerate(order):
        keywords, seed = steps[index], index + case
        fast = _outcome_of_step(keywords, seed)
        with monkeypatch.context() as general_path:
            general_path.setattr(_ragged.RaggedCall, "fast_call", lambda *a: None)
            general_path.setattr(_fast, "sample_lane", lambda *a: None)
            general = _outcome_of_step(keywords, seed)
        assert fast == general, (case, keywords)
        outcomes["error" if isinstance(fast[0], tuple) else "result"] += 1
    assert outcomes["result"] > 60 and outcomes["error"] > 20
    assert sum(hits) > 35


def _outcome_of_step(keywords: dict[str, Any], seed: int) -> tuple[Any, ...]:
    generator = np.random.default_rng(seed)
    try:
        found: Any = specdec_np.sample_tokens(**keywords, generator=generator).tolist()
    except (TypeError, ValueError) as error:
        found = (type(error), str(error))
    return found, generator.bit_generator.state


def test_a_lane_kept_for_one_kind_serves_no_other() -> None:
    """The key of a lane holds every setting with its type, the rows' dtype and shape and
    the filter order: a step that differs in one of them finds no lane."""
    rows = np.zeros((2, 8), np.float32)
    base = _fast.lane_key(rows, (0.8, 4, 0.9, None), "vllm")
    others = [
        _fast.lane_key(rows.astype(np.float64), (0.8, 4, 0.9, None), "vllm"),
        _fast.lane_key(rows[:1], (0.8, 4, 0.9, None), "vllm"),
        _fast.lane_key(rows, (0.8, 4.0, 0.9, None), "vllm"),
        _fast.lane_key(rows, (0.8, 4, 0.9, 0.0), "vllm"),
        _fast.lane_key(rows, (0.8, 4, 0.9, None), "llama.cpp"),
    ]
    assert base is not None and all(key is not None and key != base for key in others)
    assert _fast.lane_key(rows, (0.8, 4, 0.9, -0.0), "vllm") is None
    assert _fast.lane_key(rows, (np.float64(0.8), 4, 0.9, None), "vllm") is None
    assert _fast.lane_key(rows, (True, 4, 0.9, None), "vllm") is None
    assert _fast.lane_key(list(rows), (0.8, 4, 0.9, None), "vllm") is None


def test_the_compiled_uniform_block_is_the_general_paths_block() -> None:
    """``_core.explicit_uniform_block`` takes a column the general path takes as it is and
    builds its block (zeros, then the column widened exactly); anything else is None,
    for the general path to check and name."""
    # The largest float32 below 1, so that both dtypes hold the same values.
    column = np.array([0.0, -0.0, 0.5, np.nextafter(np.float32(1.0), np.float32(0.0))])
    for values in (column, column.astype(np.float32)):
        block = _core.explicit_uniform_block(values, values.size)
        assert block.dtype == np.float64 and block.shape == (values.size, 2)
        np.testing.assert_array_equal(block[:, 0], 0.0)
        np.testing.assert_array_equal(block[:, 1], values.astype(np.float64))
    assert _core.explicit_uniform_block(np.zeros(0), 0).shape == (0, 2)
    refused = [
        np.array([0.5, 1.0]), np.array([0.5, np.nan]), np.array([-1e-300, 0.5]),
        np.array([0.5, np.inf]), column.astype(">f8"), np.repeat(column, 2)[::2],
        column[:, None], column.astype(np.float16), column.tolist(), None,
        np.ma.masked_array(column), column.astype(np.int64),
    ]  # fmt: skip
    for values in refused:
        assert _core.explicit_uniform_block(values, 4) is None, values
    assert _core.explicit_uniform_block(column, 3) is None  # not B entries


def test_the_row_threads_setting_without_the_os_mapping(monkeypatch: Any) -> None:
    """Where os.environ has no mapping of its own to read, the setting comes from its
    public get, and changes with it."""
    from specdec_np._runtime import arrays as _arrays

    monkeypatch.setattr(_arrays, "_ENVIRON_DATA", None)
    monkeypatch.setenv(_arrays.ROW_THREADS_VARIABLE, "3")
    assert _arrays.row_threads_setting() == "3"
    monkeypatch.delenv(_arrays.ROW_THREADS_VARIABLE)
    assert _arrays.row_threads_setting() is None
