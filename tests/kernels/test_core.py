"""The CPU kernel module's dispatch: tables of row functions and tree steps bound from the
registry (``_core.bind_chain_rows``, ``_core.bind_tree_steps``, ``specdec_np._kernels.dispatch``).

The drivers know no verifier: they call the function bound to a request's registry code
and check their arguments with that code's bound flags.  These tests pin the binding API
(unknown names, rebinding, codes outside the table) and, in a fresh interpreter that loads
the compiled module without the package, that an unbound driver refuses to run and that a
different binding really changes what the drivers call.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specdec_np import _core, registry
from specdec_np._kernels import dispatch as _dispatch
from specdec_np._layouts import tree_links as _tree_links

V = 6


def chain_arguments(
    method: int, *, request_methods: Any = None, uniforms: Any = None, parameters: Any = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A padded batch of two requests with two drafts each, as ``verify_chains`` takes it."""
    rng = np.random.default_rng(3)
    batch, k = 2, 2
    target = rng.random((batch * (k + 1), V))
    target /= target.sum(axis=1, keepdims=True)
    ids = np.array([1, 2, 3, 4], np.int64)
    if uniforms is None:
        uniforms = np.full((batch, k + 1), 0.5)
    if parameters is None:
        parameters = np.array([0.09, 0.3])
    outputs = (
        np.full((batch, k + 1), -7, np.int64),
        np.full(batch, -7, np.int64),
        np.full(batch, -7, np.int64),
        np.full(batch, -7, np.int64),
    )
    arguments = (
        method, target, target, True, ids, np.array([0, 5], np.int64),
        np.array([0, 2, 4], np.int64), uniforms, parameters, *outputs, 1,
    )
    return arguments, {"request_methods": request_methods}


def tree_arguments(
    method: int, *, request_methods: Any = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Two requests of two nodes (a root child and its child), as ``verify_trees`` takes."""
    target = np.full((6, V), 1.0 / V)
    ids, parents = np.array([1, 2, 3, 4], np.int64), np.array([-1, 0, -1, 0], np.int64)
    offsets = np.array([0, 2, 4], np.int64)
    arguments = (
        method, target, target, True, ids, parents, offsets,
        *_tree_links.tree_links(offsets, parents, ids), np.full(6, 0.5),
        np.full((2, 2), -7, np.int64), np.full((2, 3), -7, np.int64),
        np.full(2, -7, np.int64), np.full(2, -7, np.int64), 1,
    )
    return arguments, {"request_methods": request_methods, "working": np.zeros((1, 2 * V))}


def test_the_build_defines_every_registered_kernel() -> None:
    assert {verifier.row_function for verifier in registry.VERIFIERS} <= set(
        _core.row_function_names()
    )
    assert {method.walk for method in registry.TREE_METHODS} <= set(_core.tree_step_names())


def test_the_dispatch_module_binds_the_registry_in_code_order() -> None:
    rows, uniforms, argmax, parameters = _dispatch.CHAIN_ROW_BINDING
    for code, verifier in enumerate(registry.VERIFIERS):
        assert verifier.code == code
        assert rows[code] == verifier.row_function
        assert uniforms[code] == verifier.stochastic
        assert argmax[code] == verifier.bonus_by_argmax
        assert parameters[code] == len(verifier.parameters)
    steps, tree_uniforms, drafts = _dispatch.TREE_STEP_BINDING
    for code, method in enumerate(registry.TREE_METHODS):
        assert method.code == code
        assert (steps[code], tree_uniforms[code], drafts[code]) == (
            method.walk, method.stochastic, method.reads_draft_probs,
        )


def test_binding_again_with_the_same_arguments_is_a_no_op() -> None:
    assert _core.bind_chain_rows(*_dispatch.CHAIN_ROW_BINDING) is None
    assert _core.bind_tree_steps(*_dispatch.TREE_STEP_BINDING) is None
    # Lists and numpy flags that mean the same binding are the same binding.
    rows, uniforms, argmax, parameters = _dispatch.CHAIN_ROW_BINDING
    _core.bind_chain_rows(list(rows), np.array(uniforms), list(argmax), np.array(parameters))


def test_binding_again_with_different_arguments_is_refused() -> None:
    arguments, options = chain_arguments(registry.get("greedy").code)
    before = _core.verify_chains(*arguments, **options), [a.copy() for a in arguments[9:13]]
    rows, uniforms, argmax, parameters = _dispatch.CHAIN_ROW_BINDING
    with pytest.raises(RuntimeError, match="already bound"):
        _core.bind_chain_rows(rows[::-1], uniforms[::-1], argmax[::-1], parameters[::-1])
    with pytest.raises(RuntimeError, match="already bound"):
        _core.bind_chain_rows(rows, uniforms, tuple(not flag for flag in argmax), parameters)
    steps, tree_uniforms, drafts = _dispatch.TREE_STEP_BINDING
    with pytest.raises(RuntimeError, match="already bound"):
        _core.bind_tree_steps(steps, tree_uniforms, tuple(not flag for flag in drafts))
    # A refused binding leaves the table as it was.
    arguments, options = chain_arguments(registry.get("greedy").code)
    after = _core.verify_chains(*arguments, **options), arguments[9:13]
    assert before[0] == after[0]
    for old, new in zip(before[1], after[1]):
        np.testing.assert_array_equal(old, new)


def test_an_unknown_name_is_a_value_error_that_lists_the_defined_ones() -> None:
    with pytest.raises(ValueError, match="no_such_row") as raised:
        _core.bind_chain_rows(
            ("rejection_row", "no_such_row"), (True, False), (False, False), (0, 0)
        )
    for name in _core.row_function_names():
        assert repr(name) in str(raised.value)
    with pytest.raises(ValueError, match="no_such_step") as raised:
        _core.bind_tree_steps(("no_such_step",), (True,), (False,))
    for name in _core.tree_step_names():
        assert repr(name) in str(raised.value)


@pytest.mark.parametrize(
    "arguments",
    [
        (("rejection_row",), (True, False), (False,), (0,)),
        (("rejection_row",), (True,), (False,), ()),
        ((), (), (), ()),
        (("typical_acceptance_row",), (False,), (False,), (-1,)),
    ],
    ids=["lengths", "no_parameter_counts", "empty", "negative_count"],
)
def test_malformed_chain_bindings_are_value_errors(arguments: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError, match="bind"):
        _core.bind_chain_rows(*arguments)


def test_malformed_tree_bindings_are_value_errors() -> None:
    with pytest.raises(ValueError, match="one entry per code"):
        _core.bind_tree_steps(("greedy_tree_step",), (False, True), (False,))
    with pytest.raises(ValueError, match="expected 1"):
        _core.bind_tree_steps((), (), ())


#: The chain driver's two entries: typed memoryviews, and NumPy arrays taken directly.
CHAIN_DRIVERS = [_core.verify_chains, _core.verify_chains_direct]
DRIVER_IDS = ["memoryviews", "direct"]


@pytest.mark.parametrize("driver", CHAIN_DRIVERS, ids=DRIVER_IDS)
@pytest.mark.parametrize("code", [-1, len(registry.VERIFIERS), 127])
def test_a_chain_code_outside_the_table_is_a_value_error(code: int, driver: Any) -> None:
    arguments, options = chain_arguments(code)
    with pytest.raises(ValueError, match=f"unknown row function code {code}"):
        driver(*arguments, **options)
    greedy = registry.get("greedy").code
    arguments, options = chain_arguments(greedy, request_methods=np.array([greedy, code], np.int8))
    with pytest.raises(ValueError, match=f"unknown row function code {code}"):
        driver(*arguments, **options)


@pytest.mark.parametrize("code", [-1, len(registry.TREE_METHODS), 127])
def test_a_tree_code_outside_the_table_is_a_value_error(code: int) -> None:
    arguments, options = tree_arguments(code)
    with pytest.raises(ValueError, match=f"unknown tree walk code {code}"):
        _core.verify_trees(*arguments, **options)
    greedy = registry.get_tree_method("greedy").code
    arguments, options = tree_arguments(greedy, request_methods=np.array([code, greedy], np.int8))
    with pytest.raises(ValueError, match=f"unknown tree walk code {code}"):
        _core.verify_trees(*arguments, **options)


@pytest.mark.parametrize("driver", CHAIN_DRIVERS, ids=DRIVER_IDS)
def test_uniforms_and_parameters_follow_the_bound_flags_of_every_code_in_use(
    driver: Any,
) -> None:
    greedy = registry.get("greedy").code
    no_uniforms = np.empty((2, 0))
    arguments, options = chain_arguments(greedy, uniforms=no_uniforms, parameters=np.empty(0))
    assert driver(*arguments, **options) == -1
    for verifier in registry.VERIFIERS:
        methods = np.array([greedy, verifier.code], np.int8)
        arguments, options = chain_arguments(
            greedy, request_methods=methods, uniforms=no_uniforms, parameters=np.empty(0)
        )
        if verifier.stochastic:
            with pytest.raises(ValueError, match="uniforms"):
                driver(*arguments, **options)
        elif verifier.parameters:
            with pytest.raises(ValueError, match=f"parameters must hold the "
                               f"{len(verifier.parameters)} values"):
                driver(*arguments, **options)
        else:
            assert driver(*arguments, **options) == -1
    arguments, options = tree_arguments(registry.get_tree_method("greedy").code)
    options["working"] = None
    assert _core.verify_trees(*arguments, **options) == -1
    arguments, options = tree_arguments(registry.get_tree_method("point_mass").code)
    options["working"] = None
    with pytest.raises(ValueError, match="working"):
        _core.verify_trees(*arguments, **options)


def _run_unbound(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter with the compiled module loaded on its own as
    ``core`` (the package, and so its binding, never imported)."""
    script = tmp_path / "unbound.py"
    script.write_text(
        "import importlib.util, sys\n"
        "import numpy as np\n"
        f"spec = importlib.util.spec_from_file_location('specdec_np._core', {_core.__file__!r})\n"
        "core = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(core)\n"
        "assert 'specdec_np' not in sys.modules\n" + textwrap.dedent(body)
    )
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )


def test_a_driver_called_before_binding_raises_runtime_error(tmp_path: Path) -> None:
    chain, chain_options = chain_arguments(0)
    tree, tree_options = tree_arguments(0)
    np.savez(tmp_path / "chain.npz", *chain[1:])
    np.savez(tmp_path / "tree.npz", *tree[1:], working=tree_options["working"])
    done = _run_unbound(
        tmp_path,
        """
        chain = np.load("chain.npz")
        chain = [chain[f"arr_{i}"] for i in range(len(chain.files))]
        tree = np.load("tree.npz")
        working = tree["working"]
        tree = [tree[f"arr_{i}"] for i in range(len(tree.files) - 1)]
        for call in (
            lambda: core.verify_chains(0, *chain),
            lambda: core.verify_trees(0, *tree, working=working),
        ):
            try:
                call()
            except RuntimeError as error:
                assert "not bound" in str(error), error
            else:
                raise AssertionError("an unbound driver ran")
        print("refused")
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused"]


def test_the_drivers_call_what_was_bound(tmp_path: Path) -> None:
    """Bound in another order, code 0 is greedy: the driver calls greedy's row (and reads
    no uniforms for it), and rejection's row under code 1, as the registry's codes do."""
    greedy, rejection = registry.get("greedy"), registry.get("rejection")
    expected = {}
    for verifier in (greedy, rejection):
        arguments, options = chain_arguments(verifier.code)
        _core.verify_chains(*arguments, **options)
        expected[verifier.name] = arguments[9]
    arguments, _ = chain_arguments(0)
    np.savez(tmp_path / "chain.npz", *arguments[1:])
    done = _run_unbound(
        tmp_path,
        f"""
        core.bind_chain_rows(
            ({greedy.row_function!r}, {rejection.row_function!r}), (False, True),
            (True, False), (0, 0),
        )
        chain = np.load("chain.npz")
        chain = [chain[f"arr_{{i}}"] for i in range(len(chain.files))]
        for code in (0, 1):
            output = chain[8].copy()
            arguments = list(chain)
            arguments[8] = output
            core.verify_chains(code, *arguments)
            print(" ".join(str(int(token)) for token in output.ravel()))
        chain[6] = np.empty((2, 0))
        core.verify_chains(0, *chain)
        print("greedy reads no uniforms")
        """,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [str(int(token)) for token in expected["greedy"].ravel()]
    assert lines[1].split() == [str(int(token)) for token in expected["rejection"].ravel()]
    assert lines[2] == "greedy reads no uniforms"


# --------------------------------------------------------------------------------------
# The direct entries: NumPy arrays taken without typed memoryviews
# --------------------------------------------------------------------------------------


def _random_chain_call(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A random ragged chain call with every option (logits or probabilities, mixed codes,
    given or drawn bonus, with or without bonus rows, one or two threads)."""
    batch = int(rng.integers(1, 6))
    counts = rng.integers(0, 4, batch)
    total = int(counts.sum())
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dtype = rng.choice([np.float32, np.float64])
    id_dtype = rng.choice([np.int32, np.int64])
    draw_bonus = bool(rng.random() < 0.5)
    bonus_rows = draw_bonus or bool(rng.random() < 0.5)
    rows = total + (batch if bonus_rows else 0)
    logits = bool(rng.random() < 0.5)
    target = (rng.standard_normal((rows, V)) if logits else rng.dirichlet(np.ones(V), rows))
    draft = rng.dirichlet(np.ones(V), total).astype(dtype)
    point_mass = bool(rng.random() < 0.5)
    codes = rng.choice([verifier.code for verifier in registry.VERIFIERS], batch)
    threads = int(rng.choice([1, 2]))
    width = int(counts.max()) + 1
    arguments = (
        int(codes[0]), target.astype(dtype), target.astype(dtype) if point_mass else draft,
        point_mass, rng.integers(0, V, total).astype(id_dtype),
        rng.integers(0, V, batch).astype(id_dtype), offsets, rng.random((batch, width + 1)),
        np.array([0.09, 0.3]), np.full((batch, width), -7, np.int64),
        *(np.full(batch, -7, np.int64) for _ in range(3)), threads,
    )  # fmt: skip
    options: dict[str, Any] = {
        "request_methods": codes.astype(np.int8) if rng.random() < 0.5 else None,
        "causal": bool(rng.random() < 0.5), "draw_bonus": draw_bonus, "bonus_rows": bonus_rows,
    }  # fmt: skip
    if logits:
        table = np.column_stack([
            rng.uniform(0.5, 1.5, batch), rng.integers(0, V + 1, batch),
            rng.uniform(0.3, 1.0, batch), np.zeros(batch), rng.integers(0, 2, batch),
        ])  # fmt: skip
        options.update(
            sampling=table, scratch=np.empty((threads, 2 * V), dtype),
            target_logits=True, draft_logits=False,
        )
    return arguments, options


def test_the_direct_chain_entry_is_the_memoryview_one() -> None:
    """The same statuses and outputs on random calls with every option."""
    rng = np.random.default_rng(11)
    for _ in range(80):
        arguments, options = _random_chain_call(rng)
        first = _core.verify_chains(*arguments, **options)
        outputs = [array.copy() for array in arguments[9:13]]
        second = _core.verify_chains_direct(*arguments, **options)
        assert first == second
        for before, after in zip(outputs, arguments[9:13]):
            assert np.array_equal(before, after)


@pytest.mark.parametrize(
    ("index", "value", "error"),
    [
        (1, [[0.5, 0.5]], TypeError),  # not a NumPy array
        (1, np.full((6, V), 1 / V, np.float16), ValueError),  # a row dtype the kernels lack
        (2, np.full((6, V), 1 / V, np.float32), ValueError),  # draft dtype unlike the target's
        (4, np.array([1, 2, 3, 4], np.int16), ValueError),
        (5, np.array([0, 5], np.int32), ValueError),  # bonus ids unlike the draft ids
        (6, np.array([0, 2, 4], np.int32), ValueError),
        (7, np.full((2, 3), 0.5, np.float32), ValueError),
        (1, np.full((6, 2 * V), 1 / V)[:, ::2], ValueError),  # not C-contiguous
        (1, np.full((6, V), 1 / V).astype(">f8"), ValueError),  # not native
        (1, np.full(6 * V, 1 / V), ValueError),  # one dimension
    ],
)
def test_the_direct_chain_entry_refuses_what_a_memoryview_refuses(
    index: int, value: Any, error: type
) -> None:
    arguments, options = chain_arguments(0)
    changed = list(arguments)
    changed[index] = value
    with pytest.raises(error, match="kernel arguments are inconsistent"):
        _core.verify_chains_direct(*changed, **options)


def test_the_direct_chain_entry_refuses_read_only_outputs() -> None:
    arguments, options = chain_arguments(0)
    for index in range(9, 13):
        changed = list(arguments)
        changed[index] = arguments[index].copy()
        changed[index].flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            _core.verify_chains_direct(*changed, **options)


def test_the_output_block_is_four_views_of_one_allocation() -> None:
    output, accepted, counted, status = _core.output_block(3, 4)
    assert output.shape == (3, 4) and accepted.shape == counted.shape == status.shape == (3,)
    for array in (output, accepted, counted, status):
        assert array.dtype == np.int64 and array.flags.c_contiguous and array.flags.writeable
        assert array.base is output.base
    output[:] = 1
    accepted[:], counted[:], status[:] = 2, 3, 4
    assert output.base.tolist() == [1] * 12 + [2] * 3 + [3] * 3 + [4] * 3
    assert [array.shape for array in _core.output_block(0, 0)] == [(0, 0), (0,), (0,), (0,)]
    with pytest.raises(ValueError, match="must be >= 0"):
        _core.output_block(-1, 2)


def _ragged_check(**changes: Any) -> Any:
    """``check_ragged_call`` on two requests of two and one drafts (``changes`` replace
    its arguments)."""
    arguments = {
        "counts": np.array([2, 1]), "draft_token_ids": np.array([1, 2, 3]),
        "bonus_token_ids": np.zeros(2, np.int64), "bonus_given": False,
        "target_rows": np.zeros((5, V), np.float32), "draft_rows": None,
        "temperature": None, "greedy": np.zeros(2, bool), "target_logits": True,
        "draft_logits": False,
    }  # fmt: skip
    arguments.update(changes)
    return _core.check_ragged_call(*arguments.values())


def test_the_ragged_check_passes_a_good_call_with_the_offsets_and_a_copy() -> None:
    counts = np.array([2, 1])
    offsets, copied, *found = _ragged_check(counts=counts)
    assert found == [2, 3, True, 0] and offsets.tolist() == [0, 2, 3]
    assert copied.tolist() == [2, 1] and not np.shares_memory(copied, counts)
    # With the bonus ids given, the target may leave its bonus rows out.
    assert _ragged_check(bonus_given=True, target_rows=np.zeros((3, V)))[2:] == (2, 3, False, 0)
    assert _ragged_check(greedy=np.array([True, False]))[2:] == (2, 3, True, 1)


@pytest.mark.parametrize(
    "changes",
    [
        {"counts": np.array([2, -1])},
        {"counts": np.array([2, 2**62, 2**62])},
        {"draft_token_ids": np.array([1, 2])},
        {"draft_token_ids": np.array([1, V, 3])},
        {"draft_token_ids": np.array([1, -1, 3])},
        {"bonus_token_ids": np.array([0, V]), "bonus_given": True},
        {"target_rows": np.zeros((4, V), np.float32)},
        {"target_rows": np.zeros((5, 0), np.float32)},
        {"draft_rows": np.zeros((3, V + 1), np.float32)},
        {
            "target_rows": np.full((5, V), np.finfo(np.float32).max / 2, np.float32),
            "temperature": np.array([0.25, 1.0]),
        },
    ],
)
def test_the_ragged_check_answers_none_for_what_the_general_path_refuses(
    changes: dict[str, Any],
) -> None:
    if "counts" in changes:
        batch = changes["counts"].shape[0]
        changes.update(greedy=np.zeros(batch, bool), bonus_token_ids=np.zeros(batch, np.int64))
    assert _ragged_check(**changes) is None


def test_position_counts_add_the_requests_above_each_position() -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        lengths = rng.integers(-1, 6, int(rng.integers(0, 9)))
        counts = rng.integers(0, 9, 6)
        expected = counts + (lengths[:, None] > np.arange(6)).sum(axis=0)
        _core.add_position_counts(lengths, counts)
        assert np.array_equal(counts, expected)
    with pytest.raises(ValueError, match="as long as every length"):
        _core.add_position_counts(np.array([3]), np.zeros(2, np.int64))
