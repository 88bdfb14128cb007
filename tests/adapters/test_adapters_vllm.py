"""vLLM v1's ``rejection_sample`` through ``specdec_np.adapters.vllm``: vLLM's calling
convention and output, the scenarios its own v1 tests cover (written here), and the law."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from specdec_np.adapters import vllm
from specdec_np.testing import _statistics

torch = pytest.importorskip("torch")


@dataclass
class SamplingMetadata:
    """The attributes of vLLM's ``SamplingMetadata`` the adapter reads."""

    temperature: Any
    all_greedy: bool
    all_random: bool
    top_k: Any = None
    top_p: Any = None
    generators: dict = field(default_factory=dict)


def greedy_metadata() -> SamplingMetadata:
    return SamplingMetadata(temperature=None, all_greedy=True, all_random=False)


def batch(drafts: list[list[int]], vocab: int = 8, favourite: list[list[int]] | None = None,
          bonus: list[int] | None = None) -> dict:
    """A vLLM batch whose target logits peak at ``favourite`` (the drafts by default)."""
    favourite = favourite or drafts
    counts = [len(d) for d in drafts]
    logits = torch.full((sum(counts), vocab), -100.0)
    row = 0
    for tokens in favourite:
        for token in tokens:
            logits[row, token] = 100.0
            row += 1
    return {
        "draft_token_ids": torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        "num_draft_tokens": counts,
        "max_spec_len": max(counts),
        "cu_num_draft_tokens": torch.tensor(np.cumsum(counts), dtype=torch.int32),
        "draft_probs": None,
        "target_logits": logits,
        "bonus_token_ids": torch.tensor(bonus or [[7]] * len(drafts), dtype=torch.int64)
        .reshape(-1, 1),
    }


def test_perfect_match_emits_the_drafts_and_the_bonus() -> None:
    output = vllm.rejection_sample(**batch([[1, 2, 3]], bonus=[[4]]),
                                   sampling_metadata=greedy_metadata())
    assert output.dtype == torch.int32
    assert output.tolist() == [[1, 2, 3, 4]]


def test_early_mismatch_emits_the_target_token_then_placeholders() -> None:
    output = vllm.rejection_sample(
        **batch([[1, 2, 3]], favourite=[[1, 5, 3]]), sampling_metadata=greedy_metadata()
    )
    assert output.tolist() == [[1, 5, -1, -1]]


def test_ragged_batch_and_a_wider_max_spec_len() -> None:
    arguments = batch([[1, 2], [3], [4, 5, 6]], favourite=[[1, 2], [0], [4, 5, 6]],
                      bonus=[[7], [7], [1]])
    arguments["max_spec_len"] = 4
    output = vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
    assert output.tolist() == [[1, 2, 7, -1, -1], [0, -1, -1, -1, -1], [4, 5, 6, 1, -1]]


def test_empty_drafts_in_a_batch() -> None:
    arguments = batch([[1], [2]], bonus=[[3], [4]])
    arguments.update(num_draft_tokens=[1, 0, 1],
                     cu_num_draft_tokens=torch.tensor([1, 1, 2], dtype=torch.int32),
                     bonus_token_ids=torch.tensor([[3], [5], [4]]))
    output = vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
    assert output.tolist() == [[1, 3], [5, -1], [2, 4]]


def test_mixed_greedy_and_sampled_requests() -> None:
    """vLLM marks greedy requests with a temperature of 0 (or -1) in a mixed batch; a peaked
    target accepts its drafts under sampling too."""
    arguments = batch([[1, 2], [3, 4]])
    for greedy_mark in (0.0, -1.0):
        metadata = SamplingMetadata(temperature=torch.tensor([greedy_mark, 1.0]),
                                    all_greedy=False, all_random=False)
        output = vllm.rejection_sample(**arguments, sampling_metadata=metadata)
        assert output.tolist() == [[1, 2, 7], [3, 4, 7]]


def test_seeded_requests_are_reproducible_and_independent() -> None:
    rng = np.random.default_rng(0)
    vocab, counts = 50, [3, 3]
    logits = torch.tensor(rng.normal(size=(6, vocab)), dtype=torch.float32)
    probs = torch.softmax(torch.tensor(rng.normal(size=(6, vocab)), dtype=torch.float32), -1)
    arguments = {
        "draft_token_ids": torch.tensor(rng.integers(0, vocab, 6)),
        "num_draft_tokens": counts, "max_spec_len": 3,
        "cu_num_draft_tokens": torch.tensor([3, 6]), "draft_probs": probs,
        "target_logits": logits, "bonus_token_ids": torch.tensor([[0], [1]]),
    }

    def run(seed: int) -> list:
        generator = torch.Generator().manual_seed(seed)
        metadata = SamplingMetadata(temperature=torch.tensor([1.0, 1.0]), all_greedy=False,
                                    all_random=True, generators={0: generator})
        return vllm.rejection_sample(**arguments, sampling_metadata=metadata)[0].tolist()

    first = [run(5) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    assert len({tuple(run(seed)) for seed in range(40)}) > 1


def test_top_k_is_applied_to_the_target() -> None:
    """No emitted token lies outside the request's top-k of its target logits."""
    rng = np.random.default_rng(1)
    vocab, n = 20, 400
    logits = torch.tensor(rng.normal(size=(n, vocab)), dtype=torch.float32)
    drafts = torch.tensor(rng.integers(0, vocab, n))
    metadata = SamplingMetadata(temperature=torch.ones(n), all_greedy=False, all_random=True,
                                top_k=torch.full((n,), 3))
    output = vllm.rejection_sample(
        draft_token_ids=drafts, num_draft_tokens=[1] * n, max_spec_len=1,
        cu_num_draft_tokens=torch.arange(1, n + 1), draft_probs=None, target_logits=logits,
        bonus_token_ids=torch.zeros((n, 1), dtype=torch.int64), sampling_metadata=metadata,
    )
    top3 = torch.topk(logits, 3, dim=1).indices
    first = output[:, 0:1].to(torch.int64)
    assert bool((first == top3).any(dim=1).all())


def test_the_first_token_has_the_target_law_with_draft_probabilities() -> None:
    rng = np.random.default_rng(2)
    vocab, n = 5, 40_000
    logits = torch.tensor([[0.5, 1.5, -1.0, 0.0, 0.7]]).repeat(n, 1)
    q = np.array([0.4, 0.1, 0.2, 0.2, 0.1])
    metadata = SamplingMetadata(temperature=torch.full((n,), 0.8), all_greedy=False,
                                all_random=True)
    torch.manual_seed(3)
    output = vllm.rejection_sample(
        draft_token_ids=torch.tensor(rng.choice(vocab, size=n, p=q)), num_draft_tokens=[1] * n,
        max_spec_len=1, cu_num_draft_tokens=torch.arange(1, n + 1),
        draft_probs=torch.tensor(q, dtype=torch.float32).repeat(n, 1), target_logits=logits,
        bonus_token_ids=torch.zeros((n, 1), dtype=torch.int64), sampling_metadata=metadata,
    )
    p = torch.softmax(logits[0] / 0.8, -1).numpy().astype(np.float64)
    counts = np.bincount(output[:, 0].numpy(), minlength=vocab)
    assert _statistics.chi_square_test(counts, p) > 1e-4


def test_numpy_inputs_give_numpy_outputs() -> None:
    output = vllm.rejection_sample(
        draft_token_ids=np.array([1, 2]), num_draft_tokens=[2], max_spec_len=3,
        cu_num_draft_tokens=np.array([2]), draft_probs=None,
        target_logits=np.eye(4)[[1, 2]] * 50, bonus_token_ids=np.array([[3]]),
        sampling_metadata=greedy_metadata(),
    )
    assert isinstance(output, np.ndarray) and output.dtype == np.int32
    assert output.tolist() == [[1, 2, 3, -1]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cu_num_draft_tokens": torch.tensor([2, 2])}, "cu_num_draft_tokens"),
        ({"max_spec_len": 1}, "max_spec_len"),
    ],
)
def test_inconsistent_metadata_is_refused(change: dict, message: str) -> None:
    arguments = batch([[1, 2], [3]])
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())


# --------------------------------------------------------------------------------------
# The logits processors' fields of SamplingMetadata: vLLM v1's own scenarios for frequency
# penalties, bad words and allowed token ids (greedy, the bonus given)
# --------------------------------------------------------------------------------------


@dataclass
class SurfaceMetadata(SamplingMetadata):
    """``SamplingMetadata`` with the penalty, bad-word and allowed-token fields, by vLLM's
    names and in vLLM's forms (the mask True where a token is *not* allowed)."""

    no_penalties: bool = True
    frequency_penalties: Any = None
    presence_penalties: Any = None
    repetition_penalties: Any = None
    prompt_token_ids: Any = None
    output_token_ids: list = field(default_factory=list)
    allowed_token_ids_mask: Any = None
    bad_words_token_ids: dict = field(default_factory=dict)


RUNNER_UP = 15  # every row's second choice, at logit 99 against the favourite's 100


def surface_batch(drafts: list[list[int]], favourite: list[list[int]], bonus: list[int]):
    arguments = batch(drafts, vocab=20, favourite=favourite, bonus=[[b] for b in bonus])
    arguments["target_logits"][:, RUNNER_UP] = 99.0
    return arguments


def surface_cases() -> dict[str, tuple[dict, dict, list[list[int]], list[list[int]]]]:
    """name -> (the batch, the metadata's fields, vLLM's expected output, the output with
    those fields left out)."""
    repeated = surface_batch([[1, 1, 1], [], [1, 1, 1]], [[1, 1, 1], [], [1, 1, 1]],
                             [1, 7, 1])
    # The drafts repeat token 1: each accepted one lowers the next row's 100 by the
    # request's frequency penalty, under the runner-up's 99 after one draft (1.5) or
    # after two (0.7).
    penalties = dict(no_penalties=False, frequency_penalties=torch.tensor([1.5, 1.5, 0.7]),
                     presence_penalties=torch.zeros(3), repetition_penalties=torch.ones(3),
                     prompt_token_ids=torch.tensor([[5, 6, 7], [6, 7, 8], [7, 8, 9]]),
                     output_token_ids=[[2], [3], [4]])
    words = surface_batch([[1, 2, 3], [1, 15, 3], [1, 2, 3]],
                          [[1, 2, 3], [1, 15, 3], [1, 2, 3]], [4, 4, 4])
    # Requests 0 and 2 (not 1) forbid the one-token word 2.
    bad_words = dict(output_token_ids=[[2], [3], [4]], bad_words_token_ids={0: [[2]], 2: [[2]]})
    allowed = surface_batch([[1, 2, 10], [10, 5, 3], [7, 10, 12]],
                            [[1, 2, 10], [10, 5, 10], [7, 10, 12]], [5, 5, 5])
    mask = torch.zeros((3, 20), dtype=torch.bool)
    mask[0, 0:5] = True  # request 0 may not use 0..4, request 2 not 2..6, request 1 all
    mask[2, 2:7] = True
    return {
        "frequency penalties": (repeated, penalties,
                                [[1, 15, -1, -1], [7, -1, -1, -1], [1, 1, 15, -1]],
                                [[1, 1, 1, 1], [7, -1, -1, -1], [1, 1, 1, 1]]),
        "bad words": (words, bad_words,
                      [[1, 15, -1, -1], [1, 15, 3, 4], [1, 15, -1, -1]],
                      [[1, 2, 3, 4], [1, 15, 3, 4], [1, 2, 3, 4]]),
        "allowed token ids": (allowed, dict(output_token_ids=[[], [], []],
                                            allowed_token_ids_mask=mask),
                              [[15, -1, -1, -1], [10, 5, 10, -1], [7, 10, 12, 5]],
                              [[1, 2, 10, 5], [10, 5, 10, -1], [7, 10, 12, 5]]),
    }


@pytest.mark.parametrize("name", list(surface_cases()))
def test_vllm_v1_logits_processor_scenarios(name: str) -> None:
    """vLLM's expected outputs through the shim; the same batch with the fields left out
    (the control) gives the plain greedy outputs, so the fields are what is read."""
    arguments, fields, expected, without = surface_cases()[name]
    metadata = SurfaceMetadata(temperature=None, all_greedy=True, all_random=False, **fields)
    output = vllm.rejection_sample(**arguments, sampling_metadata=metadata)
    assert output.dtype == torch.int32
    assert output.tolist() == expected
    plain = vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())
    assert plain.tolist() == without != expected


# --------------------------------------------------------------------------------------
# Randomness: a seeded request's draws depend on that request alone, and a refused call
# moves no generator.
# --------------------------------------------------------------------------------------


def request_rows(counts: list[int], vocab: int = 6, seeds: list[int] | None = None,
                 library: str = "torch") -> dict:
    """A batch whose request ``b`` has the same drafts, rows and bonus token wherever it
    sits (made from ``seeds[b]``), in NumPy or torch."""
    seeds = seeds or list(range(len(counts)))
    ids, logits, probs = [], [], []
    for count, seed in zip(counts, seeds):
        rng = np.random.default_rng(seed)
        ids.append(rng.integers(0, vocab, count))
        logits.append(rng.normal(size=(count, vocab)) * 2)
        probs.append(rng.dirichlet(np.ones(vocab), size=count))
    arrays = {
        "draft_token_ids": np.concatenate([np.zeros(0, np.int64), *ids]),
        "cu_num_draft_tokens": np.cumsum(counts, dtype=np.int64),
        "draft_probs": np.concatenate([np.zeros((0, vocab)), *probs]).astype(np.float32),
        "target_logits": np.concatenate([np.zeros((0, vocab)), *logits]).astype(np.float32),
        "bonus_token_ids": (np.asarray(seeds, dtype=np.int64) % vocab).reshape(-1, 1),
    }
    if library == "torch":
        arrays = {name: torch.from_numpy(value) for name, value in arrays.items()}
    return {"num_draft_tokens": list(counts), "max_spec_len": max(counts, default=0), **arrays}


def new_generator(library: str, seed: int) -> Any:
    if library == "torch":
        return torch.Generator().manual_seed(seed)
    return np.random.default_rng(seed)


def state_of(generator: Any) -> Any:
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    return repr(generator.bit_generator.state)


def same_state(first: Any, second: Any) -> bool:
    if isinstance(first, torch.Tensor):
        return torch.equal(first, second)
    return first == second


def sampled_metadata(batch_size: int, generators: dict | None = None,
                     temperature: Any = None) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=torch.ones(batch_size) if temperature is None else temperature,
        all_greedy=False, all_random=temperature is None, generators=generators or {},
    )


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_a_seeded_request_draws_the_same_alone_or_batched(library: str) -> None:
    """Its generator ends in the same state, and it emits the same tokens, whether the
    request is verified alone or beside requests with more drafts."""
    for k in (0, 1, 3):
        runs = []
        for counts, seeds in (([k], [7]), ([k, 5, 2, 6], [7, 1, 2, 3])):
            generator = new_generator(library, 11)
            output = vllm.rejection_sample(
                **request_rows(counts, seeds=seeds, library=library),
                sampling_metadata=sampled_metadata(len(counts), {0: generator}),
            )
            runs.append((np.asarray(output)[0, : k + 1].tolist(), state_of(generator)))
        (alone_tokens, alone_state), (batched_tokens, batched_state) = runs
        assert alone_tokens == batched_tokens
        assert same_state(alone_state, batched_state), f"k = {k}"


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_a_seeded_request_draws_k_plus_2_uniforms_and_none_when_greedy(library: str) -> None:
    counts = [3, 1, 4]
    generators = {0: new_generator(library, 5), 1: new_generator(library, 6)}
    temperature = torch.tensor([0.9, 0.0, 1.2])  # request 1 is greedy
    vllm.rejection_sample(
        **request_rows(counts, library=library),
        sampling_metadata=sampled_metadata(3, generators, temperature=temperature),
    )
    expected = new_generator(library, 5)
    if library == "torch":
        torch.rand(5, dtype=torch.float64, generator=expected)
    else:
        expected.random(5)
    assert same_state(state_of(generators[0]), state_of(expected))
    assert same_state(state_of(generators[1]), state_of(new_generator(library, 6)))


def refused_calls() -> list[tuple[str, dict, Any]]:
    """(label, change to a valid three-request call, the refusal it must get)."""
    return [
        ("draft id V", {"draft_token_ids": [0, 6, 1, 2, 3]}, ValueError),
        ("bonus id V", {"bonus_token_ids": [[0], [6], [1]]}, ValueError),
        ("logits shape", {"target_logits": np.zeros((4, 6), np.float32)}, ValueError),
        ("draft_probs V", {"draft_probs": np.full((5, 5), 0.2, np.float32)}, ValueError),
        ("cu counts", {"cu_num_draft_tokens": [2, 3, 4]}, ValueError),
        ("float counts", {"num_draft_tokens": [2.0, 1.0, 2.0]}, TypeError),
        ("float cu", {"cu_num_draft_tokens": [2.0, 3.0, 5.0]}, TypeError),
        ("float max_spec_len", {"max_spec_len": 2.0}, TypeError),
        ("negative key", {"generators": -1}, ValueError),
        ("top_p", {"top_p": [2.0, 1.0, 1.0]}, ValueError),
        ("nan temperature", {"temperature": [float("nan"), 1.0, 1.0]}, ValueError),
    ]


@pytest.mark.parametrize("library", ["torch", "numpy"])
@pytest.mark.parametrize(("label", "change", "error"), refused_calls(),
                         ids=[case[0] for case in refused_calls()])
def test_a_refused_call_moves_no_generator(library: str, label: str, change: dict,
                                           error: type) -> None:
    arguments = request_rows([2, 1, 2], library=library)
    metadata = sampled_metadata(3, {0: new_generator(library, 1), 2: new_generator(library, 2)})
    for name, value in change.items():
        if name == "generators":
            metadata.generators = {value: new_generator(library, 3), **metadata.generators}
        elif name in ("temperature", "top_p"):
            setattr(metadata, name, torch.tensor(value))
        elif name in ("num_draft_tokens", "max_spec_len"):
            arguments[name] = value
        else:
            array = np.asarray(value)
            arguments[name] = torch.from_numpy(array) if library == "torch" else array
    states = {row: state_of(generator) for row, generator in metadata.generators.items()}
    global_state = torch.get_rng_state()
    with pytest.raises(error):
        vllm.rejection_sample(**arguments, sampling_metadata=metadata)
    for row, generator in metadata.generators.items():
        assert same_state(state_of(generator), states[row]), f"generator {row} moved"
    assert torch.equal(torch.get_rng_state(), global_state), "torch's generator moved"


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_a_row_refused_after_the_draws_puts_the_generators_back(library: str) -> None:
    """A row with no mass is found by the kernel, after the uniforms were drawn."""
    arguments = request_rows([2, 1, 2], library=library)
    arguments["target_logits"][3] = float("nan")
    generators = {0: new_generator(library, 1), 2: new_generator(library, 2)}
    states = {row: state_of(generator) for row, generator in generators.items()}
    global_state = torch.get_rng_state()
    with pytest.raises(ValueError, match="target_logits"):
        vllm.rejection_sample(**arguments, sampling_metadata=sampled_metadata(3, generators))
    for row, generator in generators.items():
        assert same_state(state_of(generator), states[row]), f"generator {row} moved"
    assert torch.equal(torch.get_rng_state(), global_state)


def test_unseeded_requests_draw_from_torchs_generator() -> None:
    arguments = request_rows([2, 3])
    outputs = []
    for _ in range(2):
        torch.manual_seed(4)
        outputs.append(vllm.rejection_sample(**arguments,
                                             sampling_metadata=sampled_metadata(2)).tolist())
    assert outputs[0] == outputs[1]


# --------------------------------------------------------------------------------------
# Clear errors, never a silent coercion
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("num_draft_tokens", [2.0, 1.0]),
        ("num_draft_tokens", [True, False]),
        ("cu_num_draft_tokens", torch.tensor([2.0, 3.0])),
        ("max_spec_len", 2.0),
        ("max_spec_len", True),
    ],
)
def test_counts_that_are_not_integers_are_refused(name: str, value: Any) -> None:
    arguments = batch([[1, 2], [3]])
    arguments[name] = value
    with pytest.raises(TypeError, match=name):
        vllm.rejection_sample(**arguments, sampling_metadata=greedy_metadata())


@pytest.mark.parametrize(("key", "error"), [(-1, ValueError), (2, ValueError),
                                            ("0", TypeError), (True, TypeError)])
def test_generator_keys_outside_the_batch_are_refused(key: Any, error: type) -> None:
    metadata = sampled_metadata(2, {key: torch.Generator().manual_seed(0)})
    with pytest.raises(error, match="generators"):
        vllm.rejection_sample(**request_rows([2, 1]), sampling_metadata=metadata)


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_generators_of_the_other_library_are_refused(library: str) -> None:
    other = new_generator("numpy" if library == "torch" else "torch", 0)
    with pytest.raises(TypeError, match=r"generators\[1\]"):
        vllm.rejection_sample(**request_rows([2, 1], library=library),
                              sampling_metadata=sampled_metadata(2, {1: other}))


@pytest.mark.parametrize("all_random", [True, False])
def test_temperatures_left_out_of_a_batch_that_is_not_all_greedy_are_refused(
    all_random: bool,
) -> None:
    """vLLM leaves them out only when every request is greedy: verifying the batch as
    greedy would be a silent change of law."""
    metadata = SamplingMetadata(temperature=None, all_greedy=False, all_random=all_random)
    with pytest.raises(ValueError, match="temperature"):
        vllm.rejection_sample(**request_rows([2, 1]), sampling_metadata=metadata)


@pytest.mark.parametrize(
    ("metadata", "error", "message"),
    [
        (None, TypeError, "sampling_metadata"),
        (object(), TypeError, "sampling_metadata.*all_greedy"),
        (SamplingMetadata(temperature=None, all_greedy="yes", all_random=False), TypeError,
         "sampling_metadata.all_greedy"),
        (SamplingMetadata(temperature=None, all_greedy=True, all_random=True), ValueError,
         "all_random"),
        (SamplingMetadata(temperature=torch.ones(3), all_greedy=False, all_random=False),
         ValueError, "sampling_metadata.temperature"),
        (SamplingMetadata(temperature=torch.ones(2), all_greedy=False, all_random=False,
                          generators=[torch.Generator()]), TypeError, "generators"),
    ],
    ids=["none", "no attributes", "flag", "both flags", "temperature shape", "generator list"],
)
def test_a_missing_or_malformed_sampling_metadata_is_named(metadata: Any, error: type,
                                                           message: str) -> None:
    with pytest.raises(error, match=message):
        vllm.rejection_sample(**request_rows([2, 1]), sampling_metadata=metadata)


def test_metadata_missing_one_attribute_is_named() -> None:
    class WithoutTopP:
        temperature, all_greedy, all_random, top_k, generators = None, True, False, None, {}

    with pytest.raises(TypeError, match="without top_p"):
        vllm.rejection_sample(**request_rows([2, 1]), sampling_metadata=WithoutTopP())


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_an_empty_batch_gives_the_empty_result(library: str) -> None:
    arguments = request_rows([], library=library)
    arguments["max_spec_len"] = 3
    for metadata in (greedy_metadata(), sampled_metadata(0)):
        output = vllm.rejection_sample(**arguments, sampling_metadata=metadata)
        assert tuple(output.shape) == (0, 4)
        assert output.dtype == (torch.int32 if library == "torch" else np.int32)


# --------------------------------------------------------------------------------------
# bfloat16
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rows_are_read_as_float32(dtype: Any) -> None:
    """The same tokens as the rows rounded to ``dtype`` and given in float32, under the
    same seeds; half-precision sampling parameters are taken too."""
    counts = [3, 0, 2, 4]
    arguments = request_rows(counts)
    for name in ("target_logits", "draft_probs"):
        arguments[name] = arguments[name].to(dtype)
    rounded = {**arguments, **{name: arguments[name].float()
                               for name in ("target_logits", "draft_probs")}}

    def run(rows: dict, temperature: Any) -> list:
        generators = {b: torch.Generator().manual_seed(b) for b in range(len(counts))}
        metadata = sampled_metadata(len(counts), generators, temperature=temperature)
        metadata.top_p = torch.tensor([0.9, 1.0, 0.8, 1.0], dtype=dtype)
        return vllm.rejection_sample(**rows, sampling_metadata=metadata).tolist()

    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3])
    assert run(arguments, temperature.to(dtype)) == run(rounded, temperature.to(dtype).float())


def test_seeded_requests_of_mixed_lengths_keep_the_target_law() -> None:
    """Each request drawing from its own generator, beside requests of other lengths:
    the first token still has the target's law."""
    rng = np.random.default_rng(5)
    vocab, n = 5, 20_000
    counts = [1, 3] * (n // 2)
    total = sum(counts)
    q = np.array([0.4, 0.1, 0.2, 0.2, 0.1])
    logits = torch.tensor([[0.5, 1.5, -1.0, 0.0, 0.7]]).repeat(total, 1)
    generators = {b: torch.Generator().manual_seed(1000 + b) for b in range(n)}
    output = vllm.rejection_sample(
        draft_token_ids=torch.tensor(rng.choice(vocab, size=total, p=q)),
        num_draft_tokens=counts, max_spec_len=3,
        cu_num_draft_tokens=torch.tensor(np.cumsum(counts)),
        draft_probs=torch.tensor(q, dtype=torch.float32).repeat(total, 1), target_logits=logits,
        bonus_token_ids=torch.zeros((n, 1), dtype=torch.int64),
        sampling_metadata=sampled_metadata(n, generators, temperature=torch.full((n,), 0.8)),
    )
    p = torch.softmax(logits[0] / 0.8, -1).numpy().astype(np.float64)
    for first in (output[0::2, 0], output[1::2, 0]):
        assert _statistics.chi_square_test(np.bincount(first.numpy(), minlength=vocab), p) > 1e-4
