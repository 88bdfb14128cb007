"""Fuzz worker of ``tests/errors/test_fuzz.py``: corrupted inputs for every public entry point.

Run by the test in a subprocess, so that a crash inside a kernel (segfault, abort) ends
this process and not the test run::

    python tests/errors/fuzz_worker.py --family arrays --group rejection --seed 1 --calls 2000 \
        --log /tmp/last_call.txt

Each call is generated from ``numpy.random.default_rng([seed, family, group, index])``, so
one case can be replayed alone with ``--only INDEX`` (its full description and outcome are
printed).  Before each call the worker writes the call's description to ``--log``
(overwritten in place, flushed to the OS), so that the parent can show the call that was
running when the process died.

Outcome of a call: it returned a valid output, or raised ``TypeError`` or ``ValueError``
whose message names one of the call's arguments.  Anything else is a failure: another
exception type, an invalid output (dtype, shape, id out of ``[-1, V)``, not a prefix, not
the drafts, counters inconsistent with the output), an exception message that names no
argument, or a failed call that changed a counter or a generator.  The last line of
stdout is a JSON summary: counts per outcome and the distinct failures.

Families:

* ``arrays``: the array arguments are corrupted (ids, dtypes, ranks, shapes, empty
  dimensions, non-finite values, layouts, containers) — the memory-safety fuzz;
* ``arguments``: the other arguments (uniforms with seeds, ``seeded_seqs``,
  ``counter_seeds``, ``generator``, posteriors, ``vocab_size``, ``strict_mode``);
* ``hardening``: the input classes of the second outside attack, each with the outcome
  it must have: byte-swapped arrays give the native result, ``longdouble`` is refused,
  generator subclasses and look-alikes are refused, masked arrays and ``numpy.matrix``
  are refused, broken DLPack producers get a TypeError that says so, foreign float64
  uniforms are taken, 0-d uniforms report shape ``[]``;
* ``kernel``: negative or NaN draft probabilities (a token of target probability 0 is
  never emitted) and target rows whose float64 sum overflows (drawn without bias).

Groups: one per registered verifier (its sampler and its function), ``output`` (vLLM's
``_create_output``), and the flat layouts ``ragged`` (``verify_ragged``) and ``tree``
(``verify_tree``), fuzzed by the families ``arrays`` and ``arguments``; a layout case takes
its method from ``registry.VERIFIERS`` or ``registry.TREE_METHODS``.  Besides the chain
corruptions they get bad counts (negative, huge, sums that wrap around int64), bad parents
(forward, out of the request, below -1, huge), trees deeper than ``MAX_TREE_DEPTH``,
logits, sampling parameters, method names and ``out=`` buffers.  A returned layout output
must have its shapes, the accepted drafts (for trees: a path from the root, each node the
child of the one before, with its draft tokens), ids in ``[0, V)`` and ``-1`` after the
length; a request sampled by a lossless method never emits a token without target mass
(probability 0, negative or NaN; logit -inf or NaN); a seeded request's generator is
consumed by exactly its draws (none for a greedy one).

``KNOWN_BUGS`` lists inputs that package code mishandles today: a full run counts their
cases as ``known_bug`` without calling; ``--only`` replays one anyway.
"""

from __future__ import annotations

import argparse
import faulthandler
import inspect
import json
import os
import random
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import specdec_np
from specdec_np import registry

try:  # optional: foreign arrays that come in through DLPack
    import array_api_strict
except ImportError:  # pragma: no cover - depends on the installation
    array_api_strict = None

try:  # optional: bfloat16 NumPy arrays
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the installation
    ml_dtypes = None

FAMILIES = ("arrays", "arguments", "hardening", "kernel")
# The flat layouts (families arrays and arguments only); each case takes its method from
# registry.VERIFIERS or registry.TREE_METHODS.
LAYOUT_GROUPS = ("ragged", "tree")
# The verifiers with padded fronts (a sampler class and a stateless function); one reached
# through method= only is fuzzed by the ragged group.
PADDED_VERIFIERS = tuple(v for v in registry.VERIFIERS if v.sampler_name is not None)
# One group per padded verifier, vLLM's _create_output, and the layouts of verify_ragged
# and verify_tree.
GROUPS = (*(v.name for v in PADDED_VERIFIERS), "output", *LAYOUT_GROUPS)

ENTRIES = {
    **{v.name: (v.sampler_name, v.function_name) for v in PADDED_VERIFIERS},
    "output": ("create_output", "_create_output"),
}


def is_stochastic(group: str) -> bool:
    """Whether the group's verifier draws uniforms and reads draft probabilities."""
    return group in registry.names(stochastic=True)


def takes_generator(entry: str) -> bool:
    """Whether the entry point has a ``generator=`` argument (every stateless front of a
    stochastic verifier, and the engine layouts'), asked of its signature."""
    function = getattr(specdec_np, entry, None)
    if function is None or isinstance(function, type):
        return False
    return "generator" in inspect.signature(function).parameters


def parameters_of(group: str) -> tuple[registry.Parameter, ...]:
    return () if group == "output" else registry.get(group).parameters


# Names an exception message may use to say which argument is wrong.
ARGUMENT_NAMES = (
    "target_with_bonus_probs",
    "bonus_token_ids",
    "draft_probs",
    "draft_token_ids",
    "uniforms",
    "seeded_seqs",
    "counter_seeds",
    "generator",
    *(p.name for v in registry.VERIFIERS for p in v.parameters),
    "accepted",
    "substitute_token_ids",
    "vocab_size",
    "strict_mode",
)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MISSING = object()  # an argument that is not passed at all
MAX_FAILURES = 40  # distinct failure signatures kept in the summary
# Inputs that package code mishandles today, found by this fuzz and reported: a full run
# counts their cases as "known_bug" without making the call, and ``--only`` replays one
# anyway.  Mutation label patterns -> reason; empty while every bug found is fixed (the
# fixed ones are replayed by tests/errors/test_fuzz.py's FIXED_BUG_CASES).
KNOWN_BUGS: dict[str, str] = {}


def known_bug(case: Case) -> str | None:
    """The reason of the known bug a case runs into, or None."""
    for pattern, reason in KNOWN_BUGS.items():
        if any(re.search(pattern, mutation) for mutation in case.mutations):
            return reason
    return None


WORKER_FILE = os.path.relpath(__file__)


def bad_ids(vocab_size: int) -> list[int]:
    """Token ids outside ``[0, vocab_size)``."""
    return [
        vocab_size,
        vocab_size + 1,
        -1,
        -2,
        2**31 - 1,
        2**31,
        -(2**31),
        2**40,
        -(2**40),
        INT64_MIN,
        INT64_MAX,
    ]


def corrupt_dtypes() -> list[Any]:
    """Every dtype an argument may be cast to (valid ones included)."""
    dtypes: list[Any] = [
        np.float16,
        np.float32,
        np.float64,
        np.longdouble,
        np.complex64,
        np.complex128,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint32,
        np.uint64,
        np.bool_,
        object,
        np.dtype(">f4"),
        np.dtype(">f8"),
        np.dtype(">i8"),
        np.dtype(">i4"),
        "U3",
        "datetime64[s]",
    ]
    if ml_dtypes is not None:
        dtypes += [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn]
    return dtypes


# --------------------------------------------------------------------------------------
# Descriptions
# --------------------------------------------------------------------------------------


def describe(value: Any) -> str:
    """A short, exact description of an argument (values of small arrays included)."""
    if value is MISSING:
        return "<not passed>"
    if isinstance(value, np.ndarray):
        flags = "".join(
            letter
            for letter, on in (
                ("C", value.flags.c_contiguous),
                ("F", value.flags.f_contiguous),
                ("W", value.flags.writeable),
            )
            if on
        )
        text = (
            f"{type(value).__name__}(shape={value.shape}, dtype={value.dtype}, "
            f"strides={value.strides}, flags={flags or '-'}"
        )
        if value.size <= 24:
            try:
                text += f", values={value.ravel().tolist()!r}"
            except Exception:  # exotic dtypes
                pass
        return text + ")"
    if isinstance(value, dict):
        items = ", ".join(f"{describe(key)}: {describe(item)}" for key, item in value.items())
        return "{" + items + "}"
    if isinstance(value, np.random.Generator):
        return f"Generator({type(value.bit_generator).__name__})"
    text = repr(value)
    if len(text) > 120:
        text = text[:117] + "..."
    return f"{type(value).__name__}: {text}"


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One call: the entry point, its arguments and how they were corrupted."""

    index: int
    family: str
    group: str
    entry: str
    strict: Any
    args: dict[str, Any]
    batch: int = 0
    k: int = 1
    vocab: int = 1
    mutations: list[str] = field(default_factory=list)
    constructor: dict[str, Any] = field(default_factory=dict)
    # What the call must do (families hardening and kernel): "native" (the result of the
    # same call with ``native`` arguments), "TypeError:<argument>", "ValueError:<text>",
    # "positive" (only tokens of positive target probability) or "even" (see below).
    expect: str | None = None
    native: dict[str, Any] | None = None

    def description(self, seed: int) -> str:
        lines = [
            f"case {self.index} (--family {self.family} --group {self.group} --seed {seed} "
            f"--only {self.index}): {self.entry}, strict_mode={self.strict!r}",
            f"  mutations: {', '.join(self.mutations) or 'none'}",
        ]
        for name, value in self.constructor.items():
            lines.append(f"  constructor {name} = {describe(value)}")
        for name, value in self.args.items():
            lines.append(f"  {name} = {describe(value)}")
        return "\n".join(lines)


def probabilities(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Random probability rows in several styles (some unnormalised, some with zeros)."""
    style = rng.choice(
        ["random", "peaked", "sparse", "uniform", "unnormalised", "zeros"],
        p=[0.35, 0.2, 0.15, 0.1, 0.15, 0.05],
    )
    if style == "uniform":
        x = np.ones(shape)
    elif style == "zeros":
        x = np.zeros(shape)
    else:
        x = rng.random(shape) ** rng.choice([1.0, 4.0])
        if style == "peaked" and shape[-1] > 0:
            x[..., rng.integers(shape[-1])] += 50.0
        if style == "sparse":
            x *= rng.random(shape) < 0.3
    if style != "unnormalised":
        sums = x.sum(axis=-1, keepdims=True)
        x = np.divide(x, sums, out=np.zeros_like(x), where=sums > 0)
    return x.astype(dtype)


def pick(rng: np.random.Generator, options: list[Any] | tuple[Any, ...]) -> Any:
    """One element of a list (``rng.choice`` would turn mixed objects into an array)."""
    return options[int(rng.integers(len(options)))]


def dimensions(rng: np.random.Generator) -> tuple[int, int, int]:
    """``(B, k, V)``: mostly tiny; now and then a vocabulary over one scan block."""
    batch = pick(rng, [0, 1, 1, 2, 2, 3, 4, 7])
    k = pick(rng, [1, 1, 2, 3, 5])
    vocab = pick(rng, [1, 1, 2, 3, 4, 5, 8, 16, 33, 64])
    if rng.random() < 0.02:
        batch, k, vocab = min(batch, 2), 1, pick(rng, [1025, 2049, 2500])
    return batch, k, vocab


def base_case(rng: np.random.Generator, index: int, family: str, group: str) -> Case:
    """A valid call of one of the group's entry points."""
    entry = pick(rng, ENTRIES[group])
    strict = bool(rng.random() < 0.4)
    batch, k, vocab = dimensions(rng)
    if strict:
        float_dtype, id_dtype = np.float32, np.int64
    else:
        float_dtype = pick(rng, [np.float32, np.float32, np.float64, np.float16])
        id_dtype = pick(rng, [np.int64, np.int64, np.int32])
    target = probabilities(rng, (batch, k + 1, vocab), float_dtype)
    draft_ids = rng.integers(0, vocab, (batch, k)).astype(id_dtype)
    if rng.random() < 0.4 and batch:
        draft_ids = target[:, :k].astype(np.float64).argmax(axis=-1).astype(id_dtype)
    bonus = rng.integers(0, vocab, (batch, 1)).astype(id_dtype)
    if rng.random() < 0.2:
        bonus = bonus.reshape(batch)
    case = Case(index, family, group, entry, strict, {}, batch, k, vocab)
    if group == "output":
        accepted = rng.random((batch, k)) < pick(rng, [0.2, 0.7, 1.0])
        case.args = {
            "accepted": accepted,
            "substitute_token_ids": rng.integers(0, vocab, (batch, k)).astype(id_dtype),
            "draft_token_ids": draft_ids,
            "bonus_token_ids": bonus,
            "vocab_size": pick(rng, [vocab, vocab, None, MISSING, np.int64(vocab)]),
        }
        return case
    case.args = {"target_with_bonus_probs": target, "bonus_token_ids": bonus}
    if is_stochastic(group):
        draft_probs = None
        if rng.random() < 0.75:
            draft_probs = probabilities(rng, (batch, k, vocab), float_dtype)
        case.args["draft_probs"] = draft_probs
        case.args["draft_token_ids"] = draft_ids
        rejection_sources(rng, case, batch, k)
    else:
        if entry[0].isupper():  # the samplers take (and ignore) draft_probs
            case.args["draft_probs"] = pick(rng, [None, target[:, :k]])
        case.args["draft_token_ids"] = draft_ids
    if parameters_of(group):
        values = {
            p.name: pick(rng, [p.default, 0.0, 1e-3, 0.5, 0.9, 1, 10, 100.0])
            for p in parameters_of(group)
        }
        if entry[0].isupper():  # a sampler takes its parameters at construction
            case.constructor = values
        else:
            case.args.update(values)
    return case


def rejection_sources(rng: np.random.Generator, case: Case, batch: int, k: int) -> None:
    """Valid uniforms sources of a rejection call (docs/semantics.md §5), chosen at random."""
    source = pick(rng, ["none", "uniforms", "seeded", "counter", "mixed"])
    rows = [b for b in range(batch) if rng.random() < 0.5]
    if source == "uniforms":
        uniforms = rng.random((batch, k + 1))
        if uniforms.size and rng.random() < 0.3:
            uniforms.flat[rng.integers(uniforms.size)] = pick(rng, [0.0, np.nextafter(1.0, 0.0)])
        case.args["uniforms"] = uniforms
    if source in ("seeded", "mixed"):
        case.args["seeded_seqs"] = {b: np.random.default_rng([case.index, b]) for b in rows}
    if source in ("counter", "mixed"):
        others = [b for b in range(batch) if source == "counter" or b not in rows]
        case.args["counter_seeds"] = {
            b: (int(rng.integers(2**63)) * 2 + 1, int(rng.integers(2**40))) for b in others
        }
    if takes_generator(case.entry):
        case.args["generator"] = pick(rng, [None, MISSING, np.random.default_rng(case.index)])


# --------------------------------------------------------------------------------------
# Array mutations
# --------------------------------------------------------------------------------------

ID_ARGUMENTS = ("bonus_token_ids", "draft_token_ids", "substitute_token_ids")
PROBABILITY_ARGUMENTS = ("target_with_bonus_probs", "draft_probs", "uniforms")


def array_arguments(case: Case) -> list[str]:
    names = [
        name
        for name in (*ID_ARGUMENTS, *PROBABILITY_ARGUMENTS, "accepted")
        if name in case.args and isinstance(case.args[name], np.ndarray)
    ]
    if is_stochastic(case.group) and "uniforms" not in case.args:
        names.append("uniforms")  # adds explicit (possibly bad) uniforms
    return names


def set_bad_ids(rng: np.random.Generator, x: np.ndarray, vocab: int) -> tuple[np.ndarray, str]:
    if x.size == 0 or x.dtype.kind not in "iu":
        return x, "bad_id skipped"
    x = x.copy()
    values = []
    for _ in range(int(rng.integers(1, 4))):
        value = pick(rng, bad_ids(vocab))
        if not np.can_cast(np.min_scalar_type(value), x.dtype):
            x = x.astype(np.int64)
        x.flat[int(rng.integers(x.size))] = value
        values.append(value)
    return x, f"bad_id{values}"


def set_bad_probabilities(rng: np.random.Generator, x: np.ndarray) -> tuple[np.ndarray, str]:
    if x.size == 0 or x.dtype.kind != "f":
        return x, "bad_probability skipped"
    value = pick(rng, [np.nan, np.inf, -np.inf, -1.0, -1e-30, 1e30, 1e308, -0.0, 5e-324, 1.0, 2.0])
    with np.errstate(over="ignore"):
        x = x.astype(x.dtype, copy=True)
        where = pick(rng, ["one", "some", "row", "all"])
        if where == "all":
            x[...] = value
        elif where == "row" and x.ndim >= 2:
            x[tuple(rng.integers(n) for n in x.shape[:-1])] = value
        else:
            for _ in range(1 if where == "one" else int(rng.integers(2, 6))):
                x.flat[int(rng.integers(x.size))] = value
    return x, f"probability={value} ({where})"


def change_shape(rng: np.random.Generator, x: np.ndarray) -> tuple[np.ndarray, str]:
    how = pick(rng, ["rank_up", "rank_down", "reshape", "shrink", "grow", "empty", "zero_d"])
    axis = int(rng.integers(x.ndim)) if x.ndim else 0
    if how == "rank_up":
        return np.expand_dims(x, int(rng.integers(x.ndim + 1))), how
    if how == "rank_down" and x.ndim:
        return (x[0] if x.shape[0] else x.reshape(-1)), how
    if how == "reshape" and x.ndim:
        shape = pick(rng, [(-1,), x.shape[::-1], (1, *x.shape), (*x.shape[:-1], 1, -1)])
        try:
            return x.reshape(shape), "reshape"
        except ValueError:
            return x.reshape(-1), "reshape(-1)"
    if how == "shrink" and x.ndim and x.shape[axis]:
        return np.take(x, range(x.shape[axis] - 1), axis=axis), f"shrink axis {axis}"
    if how == "grow" and x.ndim:
        return np.concatenate([x, x], axis=axis), f"grow axis {axis}"
    if how == "empty" and x.ndim:
        return np.take(x, [], axis=axis).astype(x.dtype), f"empty axis {axis}"
    if x.size:
        return np.asarray(x.ravel()[0]), "zero_d"
    return np.zeros((), dtype=x.dtype), "zero_d"


def change_layout(rng: np.random.Generator, x: np.ndarray) -> tuple[Any, str]:
    """Same values (or the same shape and dtype), unusual memory layout or array type."""
    how = pick(
        rng,
        ["strided", "reversed", "broadcast", "readonly", "fortran", "masked", "foreign", "swap"],
    )
    if how == "strided" and x.ndim:
        wide = np.repeat(x, 2, axis=-1)
        return wide[..., ::2], how
    if how == "reversed" and x.ndim:
        return x[::-1], how
    if how == "broadcast" and x.ndim and x.shape[0]:
        return np.broadcast_to(x[:1], x.shape), how
    if how == "readonly":
        x = x.copy()
        x.flags.writeable = False
        return x, how
    if how == "masked":
        return np.ma.masked_array(x), how
    if how == "foreign" and array_api_strict is not None:
        try:
            return array_api_strict.asarray(x), how
        except Exception:  # dtypes the array API does not have
            return x, "foreign skipped"
    if how == "swap":
        try:
            return x.astype(x.dtype.newbyteorder()), "byteswapped dtype"
        except (TypeError, ValueError):
            return x, "swap skipped"
    return np.asfortranarray(x), "fortran"


def replace_container(rng: np.random.Generator, x: np.ndarray) -> tuple[Any, str]:
    how = pick(rng, ["list", "tuple", "str", "None", "int", "float", "bytes", "dict", "memory"])
    value: Any = {
        "list": x.tolist,
        "tuple": lambda: tuple(x.tolist()) if x.ndim else x.tolist(),
        "str": lambda: "abc",
        "None": lambda: None,
        "int": lambda: 3,
        "float": lambda: 0.5,
        "bytes": lambda: b"\x00" * 8,
        "dict": lambda: {"shape": x.shape},
        "memory": lambda: memoryview(np.ascontiguousarray(x)),
    }[how]
    try:
        value = value()
    except (TypeError, ValueError):
        value, how = x.tolist(), "list"
    return value, f"container {how}"


def mutate_array(rng: np.random.Generator, case: Case, name: str, vocab: int) -> str:
    """Corrupt one array argument in place in ``case.args``; returns a label."""
    x = case.args.get(name)
    if name == "uniforms" and not isinstance(x, np.ndarray):
        x = rng.random((case.batch, case.k + 1))
        case.args["uniforms"] = x
        if "seeded_seqs" in case.args or "counter_seeds" in case.args:
            case.args.pop("seeded_seqs", None)
            case.args.pop("counter_seeds", None)
    kinds = ["dtype", "shape", "layout", "container"]
    if name in ID_ARGUMENTS:
        kinds += ["bad_id"] * 4
    if name in PROBABILITY_ARGUMENTS:
        kinds += ["bad_probability"] * 3
    kind = pick(rng, kinds)
    try:
        value, label = apply_mutation(rng, kind, x, vocab)
    except Exception as error:  # NumPy cannot build this input (e.g. a datetime cast)
        value, label = x, f"{kind} skipped ({type(error).__name__})"
    case.args[name] = value
    return f"{name}: {label}"


def apply_mutation(rng: np.random.Generator, kind: str, x: Any, vocab: int) -> tuple[Any, str]:
    if kind == "bad_id":
        return set_bad_ids(rng, x, vocab)
    if kind == "bad_probability":
        return set_bad_probabilities(rng, x)
    if kind == "dtype":
        dtype = pick(rng, corrupt_dtypes())
        with np.errstate(all="ignore"):
            return x.astype(dtype), f"dtype {np.dtype(dtype)}"
    if kind == "shape":
        return change_shape(rng, x)
    if kind == "layout":
        return change_layout(rng, x)
    return replace_container(rng, x)


def mutate_dimensions(rng: np.random.Generator, case: Case) -> str:
    """Consistent but invalid dimensions: k = 0 or V = 0 in every argument."""
    which = pick(rng, ["k=0", "V=0"])
    for name, x in list(case.args.items()):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            continue
        if which == "k=0" and name in ("target_with_bonus_probs",):
            case.args[name] = x[:, :1]
        elif which == "k=0" and name != "bonus_token_ids":
            case.args[name] = x[:, :0]
        elif which == "V=0" and name in ("target_with_bonus_probs", "draft_probs"):
            case.args[name] = x[..., :0]
    return f"dimensions {which}"


def mutate_arrays(rng: np.random.Generator, case: Case, vocab: int) -> None:
    count = pick(rng, [0, 1, 1, 1, 1, 2, 2, 3])
    for _ in range(count):
        if rng.random() < 0.05:
            case.mutations.append(mutate_dimensions(rng, case))
            continue
        names = array_arguments(case)
        if not names:
            break
        case.mutations.append(mutate_array(rng, case, pick(rng, names), vocab))


# --------------------------------------------------------------------------------------
# Argument mutations
# --------------------------------------------------------------------------------------


class WeirdGenerator:
    """Has a callable ``random`` that returns something unusual.

    ``mismatch`` records a draw whose shape was not the requested one.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mismatch: tuple[Any, tuple[int, ...]] | None = None

    def random(self, size: Any = None) -> Any:
        requested = np.zeros(size).shape
        values = self.draw(size)
        shape = np.shape(values)
        if shape != requested:
            self.mismatch = (requested, shape)
        return values

    def draw(self, size: Any) -> Any:
        if self.kind == "nan":
            return np.full(size, np.nan)
        if self.kind == "big":
            return np.full(size, 7.5)
        if self.kind == "short":
            return np.zeros(1)
        if self.kind == "small2d":
            return np.full((1, 1), 0.5)
        if self.kind == "float32":
            return np.full(size, 0.5, dtype=np.float32)
        if self.kind == "fortran":
            return np.asfortranarray(np.full(size, 0.5))
        if self.kind == "text":
            return "abc"
        raise ValueError("WeirdGenerator refuses to draw")

    def __repr__(self) -> str:
        return f"WeirdGenerator({self.kind!r})"


def weird_generators(index: int) -> list[Any]:
    return [
        None,
        0,
        "generator",
        [0.5],
        np.random.default_rng(index),
        np.random.Generator(np.random.Philox(index)),
        np.random.RandomState(index),  # a legacy generator on purpose
        random.Random(index),
        np.random.PCG64(index),
        WeirdGenerator("nan"),
        WeirdGenerator("big"),
        WeirdGenerator("short"),
        WeirdGenerator("small2d"),
        WeirdGenerator("float32"),
        WeirdGenerator("fortran"),
        WeirdGenerator("text"),
        WeirdGenerator("raise"),
    ]


def weird_keys(batch: int) -> list[Any]:
    return [
        0,
        batch - 1,
        -1,
        batch,
        batch + 3,
        2**63,
        -(2**70),
        1.0,
        "0",
        None,
        True,
        np.bool_(False),
        np.int64(0),
        np.uint64(0),
        (0,),
    ]


def weird_seed_pairs() -> list[Any]:
    values = [0, 1, -1, 2**64 - 1, 2**64, -(2**70), 1.5, "1", None, True, np.uint64(2**64 - 1)]
    values += [np.int64(-5), np.float64(2.0)]
    pairs: list[Any] = [(a, b) for a in values[:4] for b in values[:4]]
    pairs += [(value, 0) for value in values] + [(0, value) for value in values]
    pairs += [[1, 2], np.array([1, 2]), (1,), (1, 2, 3), 5, None, "12", {0: 1}]
    return pairs


def weird_posteriors() -> list[Any]:
    return [
        0.0,
        0.09,
        1,
        -1.0,
        -0.0,
        np.nan,
        np.inf,
        -np.inf,
        1e308,
        10**400,
        -(10**400),
        2**1030,
        True,
        "0.1",
        None,
        1j,
        [0.1],
        np.float32(0.3),
        np.float16(np.inf),
        np.int64(2),
        np.uint64(2**64 - 1),
        np.longdouble("1e4000"),
        np.array(0.1),
        np.array([0.1]),
    ]


def weird_vocab_sizes(vocab: int) -> list[Any]:
    return [
        None,
        vocab,
        vocab - 1,
        0,
        -1,
        INT64_MAX,
        2**63,
        2**64,
        -(2**70),
        float(vocab),
        float(vocab) + 0.5,
        np.inf,
        np.nan,
        str(vocab),
        "abc",
        True,
        [vocab],
        np.int32(vocab),
        np.uint64(2**64 - 1),
        np.float64(vocab),
        np.array(vocab),
        np.array([vocab]),
    ]


def weird_strict() -> list[Any]:
    return [False, True, 0, 1, None, "", "yes", np.bool_(True), np.float64(0.0)]


def mutate_rejection_arguments(rng: np.random.Generator, case: Case, batch: int) -> str:
    what = pick(
        rng,
        [
            "seeded_value",
            "seeded_key",
            "seeded_container",
            "counter_value",
            "counter_key",
            "counter_container",
            "overlap",
            "uniforms_and_seeds",
            "generator",
            "strict",
        ],
    )
    if what == "generator" and not takes_generator(case.entry):
        what = "seeded_value"
    if what == "seeded_value":
        seeded = dict(case.args.get("seeded_seqs") or {})
        seeded[int(rng.integers(batch)) if batch else 0] = pick(rng, weird_generators(case.index))
        case.args["seeded_seqs"] = seeded
    elif what == "seeded_key":
        seeded = dict(case.args.get("seeded_seqs") or {})
        seeded[pick(rng, weird_keys(batch))] = np.random.default_rng(case.index)
        case.args["seeded_seqs"] = seeded
    elif what == "seeded_container":
        generator = np.random.default_rng(case.index)
        case.args["seeded_seqs"] = pick(
            rng, [[], (), "", 0, [generator], [0], "abc", 7, np.array([0]), {generator}]
        )
    elif what == "counter_value":
        seeds = dict(case.args.get("counter_seeds") or {})
        seeds[int(rng.integers(batch)) if batch else 0] = pick(rng, weird_seed_pairs())
        case.args["counter_seeds"] = seeds
    elif what == "counter_key":
        seeds = dict(case.args.get("counter_seeds") or {})
        seeds[pick(rng, weird_keys(batch))] = (1, 2)
        case.args["counter_seeds"] = seeds
    elif what == "counter_container":
        case.args["counter_seeds"] = pick(
            rng, [[], (), "", 0, [(1, 2)], [0], [1, 0], "abc", 7, np.array([0]), {(1, 2)}]
        )
    elif what == "overlap":
        case.args["seeded_seqs"] = {0: np.random.default_rng(case.index)}
        case.args["counter_seeds"] = {0: (1, 2)}
    elif what == "uniforms_and_seeds":
        case.args["uniforms"] = rng.random((batch, case.k + 1))
        if rng.random() < 0.5:
            case.args["seeded_seqs"] = {0: np.random.default_rng(case.index)}
        else:
            case.args["counter_seeds"] = {0: (1, 2)}
    elif what == "generator":
        case.args["generator"] = pick(rng, weird_generators(case.index))
    else:
        case.strict = pick(rng, weird_strict())
        return f"strict_mode={case.strict!r}"
    return what


def mutate_arguments(rng: np.random.Generator, case: Case, batch: int, vocab: int) -> None:
    if is_stochastic(case.group):
        case.mutations.append(mutate_rejection_arguments(rng, case, batch))
    elif parameters_of(case.group):
        target = case.constructor if case.entry[0].isupper() else case.args
        for name in (p.name for p in parameters_of(case.group)):
            if rng.random() < 0.6:
                target[name] = pick(rng, weird_posteriors())
                case.mutations.append(f"{name}")
        if rng.random() < 0.3:
            case.strict = pick(rng, weird_strict())
            case.mutations.append("strict_mode")
    elif case.group == "output":
        case.args["vocab_size"] = pick(rng, weird_vocab_sizes(vocab))
        case.mutations.append("vocab_size")
    else:
        case.strict = pick(rng, weird_strict())
        case.mutations.append("strict_mode")
        if "draft_probs" in case.args and rng.random() < 0.5:
            case.args["draft_probs"] = pick(rng, ["abc", 3, [1.0], np.zeros((1, 2, 3, 4))])
            case.mutations.append("draft_probs (ignored)")
    if rng.random() < 0.1:  # now and then an array is wrong as well
        mutate_arrays(rng, case, vocab)


# --------------------------------------------------------------------------------------
# Hardening and kernel families (the second outside attack): corrupted inputs with a known outcome
# --------------------------------------------------------------------------------------


class GeneratorSubclass(np.random.Generator):
    """A ``numpy.random.Generator`` subclass whose uniforms are negative."""

    def random(self, size: Any = None, *args: Any, **kwargs: Any) -> Any:
        return np.full(size, -0.5)


def look_alike(module: str) -> Any:
    """An object of a class called ``Generator`` that claims to live in ``module``."""
    cls = type("Generator", (), {"random": lambda self, size=None: np.full(size, -0.5)})
    cls.__module__ = module
    return cls()


class BrokenDLPack:
    """A DLPack producer that breaks the protocol in one of two ways."""

    def __init__(self, capsule: Any, device: Any) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> Any:
        return self.device

    def __repr__(self) -> str:
        return f"BrokenDLPack(capsule={self.capsule!r}, device={self.device!r})"


def explicit_uniforms(rng: np.random.Generator, case: Case) -> None:
    """Rejection calls: explicit uniforms instead of seeds, so the result is reproducible."""
    if is_stochastic(case.group):
        for name in ("seeded_seqs", "counter_seeds", "generator"):
            case.args.pop(name, None)
        case.args["uniforms"] = rng.random((case.batch, case.k + 1))


def numpy_arrays(case: Case) -> list[str]:
    return [name for name, x in case.args.items() if isinstance(x, np.ndarray)]


def mutate_hardening(rng: np.random.Generator, case: Case) -> str:
    """One input of the second attack's classes (byte order, masked arrays, matrices,
    DLPack producers, long doubles), with the outcome it must have."""
    kinds = ["byteorder", "byteorder", "masked", "matrix", "dlpack_capsule", "dlpack_device"]
    if np.dtype(np.longdouble).itemsize > 8 and case.group != "output":
        kinds.append("longdouble")
    if is_stochastic(case.group):
        kinds += ["generator", "generator", "foreign_uniforms", "zero_d_uniforms"]
    kind = pick(rng, kinds)
    if kind == "byteorder":
        explicit_uniforms(rng, case)
        case.native = dict(case.args)
        names = numpy_arrays(case)
        chosen = [name for name in names if rng.random() < 0.5] or [pick(rng, names)]
        for name in chosen:
            x = case.args[name]
            case.args[name] = x.astype(x.dtype.newbyteorder())
        case.expect = "native"
        return f"byte-swapped {', '.join(chosen)}"
    if kind == "longdouble":
        name = pick(
            rng,
            [
                n
                for n in ("target_with_bonus_probs", "draft_probs")
                if isinstance(case.args.get(n), np.ndarray)
            ],
        )
        if name == "draft_probs" and not is_stochastic(case.group):
            name = "target_with_bonus_probs"
        case.args[name] = case.args[name].astype(np.longdouble)
        case.expect = f"TypeError:{name}"
        return f"{name} longdouble"
    if kind == "generator":
        bad = pick(
            rng,
            [
                GeneratorSubclass(np.random.PCG64(case.index)),
                look_alike("cupy.random"),
                look_alike("cupy"),
                look_alike("cupy._core"),
            ],
        )
        if takes_generator(case.entry) and rng.random() < 0.5:
            case.args["generator"] = bad
            case.args.pop("uniforms", None)
            name = "generator"
        else:
            row = int(rng.integers(max(case.batch, 1)))
            case.args.pop("uniforms", None)
            case.args.pop("counter_seeds", None)
            case.args["seeded_seqs"] = {row: bad}
            name = "seeded_seqs"
        # With B = 0 a row index is out of range: a ValueError naming seeded_seqs.
        case.expect = f"TypeError:{name}" if case.batch or name == "generator" else None
        return f"{name}: {describe(bad)}"
    if kind == "foreign_uniforms":
        if array_api_strict is None:
            return "foreign uniforms skipped"
        explicit_uniforms(rng, case)
        case.native = dict(case.args)
        case.args["uniforms"] = array_api_strict.asarray(case.args["uniforms"])
        case.expect = "native"
        return "array_api_strict float64 uniforms"
    if kind == "zero_d_uniforms":
        explicit_uniforms(rng, case)
        case.args["uniforms"] = np.array(0.5)
        case.expect = "ValueError:found shape []"
        return "0-d uniforms"
    names = numpy_arrays(case)
    if kind == "matrix":
        names = [name for name in names if name != "uniforms"] or names
    name = pick(rng, names)
    x = case.args[name]
    if kind == "masked":
        case.args[name] = np.ma.masked_array(x, mask=rng.random(x.shape) < 0.3)
        label = "masked array"
    elif kind == "matrix":
        rows = x.shape[0] if x.ndim else 1
        case.args[name] = np.asmatrix(x.reshape(rows, x.size // rows if rows else 0))
        label = "numpy.matrix"
    elif kind == "dlpack_capsule":
        case.args[name] = BrokenDLPack(pick(rng, [5, None, "capsule", x]), (1, 0))
        label = "__dlpack__ returns a non-capsule"
    else:
        case.args[name] = BrokenDLPack(None, pick(rng, [None, "cpu", (1,), ("a", 0), 3.5, [1]]))
        label = "__dlpack_device__ returns junk"
    ignored = name == "draft_probs" and not is_stochastic(case.group)
    case.expect = None if ignored else f"TypeError:{name}"
    return f"{name}: {label}"


def mutate_kernel_inputs(rng: np.random.Generator, case: Case) -> str:
    """Negative or NaN draft entries, overflowing rows."""
    case.strict = False
    if not is_stochastic(case.group) or rng.random() < 0.3:
        x = case.args.get("target_with_bonus_probs")
        if isinstance(x, np.ndarray) and x.size:
            x = x.astype(np.float64)
            x[x > 0] = 1e308
            case.args["target_with_bonus_probs"] = x
            if isinstance(case.args.get("draft_probs"), np.ndarray):
                case.args["draft_probs"] = case.args["draft_probs"].astype(np.float64)
        case.expect = "positive" if is_stochastic(case.group) else None
        return "target rows of 1e308"
    if rng.random() < 0.5:
        return overflowing_residual(rng, case)
    target = case.args["target_with_bonus_probs"].astype(np.float64)
    draft = case.args.get("draft_probs")
    draft = np.zeros(target.shape[:1] + (case.k,) + target.shape[2:]) if draft is None else draft
    draft = draft.astype(np.float64)
    if case.vocab > 1 and case.batch:
        zero = rng.random(target.shape) < 0.4
        target[zero] = 0.0
    value = pick(rng, [-1e-9, -1e-300, -1.0, -np.inf, np.nan])
    where = (target[:, : case.k] <= 0) & (rng.random(draft.shape) < 0.7)
    draft[where] = value
    case.args.update(target_with_bonus_probs=target, draft_probs=draft)
    case.expect = "positive"
    return f"draft_probs={value} where the target is 0"


def overflowing_residual(rng: np.random.Generator, case: Case) -> str:
    """Many copies of one row whose residual sums past float64's range; the residual
    uniforms are evenly spaced, so each token of the support must get its share."""
    n, vocab = 300, max(case.vocab, 3)
    support = rng.choice(np.arange(1, vocab), size=int(rng.integers(2, vocab)), replace=False)
    target = np.zeros((n, 2, vocab))
    target[:, :, support] = 1e308
    draft = np.zeros((n, 1, vocab))
    draft[:, 0, 0] = 1.0  # token 0 has p = 0: always rejected
    case.batch, case.k, case.vocab = n, 1, vocab
    case.args = {
        "target_with_bonus_probs": target,
        "bonus_token_ids": np.ones((n, 1), dtype=np.int64),
        "draft_probs": draft,
        "draft_token_ids": np.zeros((n, 1), dtype=np.int64),
    }
    if case.entry[0].isupper():
        case.args["seeded_seqs"] = None
    case.args["uniforms"] = np.column_stack([np.full(n, 0.5), (np.arange(n) + 0.5) / n])
    case.expect = "even"
    return f"residual of 1e308 on {sorted(support.tolist())}"


def expectation_problems(case: Case, result: Any, error: Exception | None) -> list[str]:
    """Whether a call of the hardening and kernel families did what it must."""
    expect = case.expect
    if expect is None:
        return []
    if expect.startswith(("TypeError:", "ValueError:")):
        kind, _, text = expect.partition(":")
        if error is None:
            return [f"returned; expected a {kind} naming {text!r}"]
        if type(error).__name__ != kind or text not in str(error):
            return [f"raised {type(error).__name__}: {error}; expected a {kind} naming {text!r}"]
        return []
    if expect == "native":
        native = Case(**{**case.__dict__, "args": case.native, "expect": None})
        try:
            reference: Any = invoke(native, Samplers(0), None)
        except (TypeError, ValueError) as native_error:
            if error is None or type(error) is not type(native_error):
                return [f"native inputs raised {native_error!r}; this call gave {error!r}"]
            return []
        if error is not None:
            return [f"raised {error!r}; the native inputs returned"]
        if not np.array_equal(output_of(result), output_of(reference)):
            return ["output differs from the output for native inputs"]
        return []
    if error is not None:
        if isinstance(error, ValueError) and "no positive probability" in str(error):
            return []
        return [f"raised {error!r} for valid rows"]
    output = output_of(result)
    target = np.asarray(case.args["target_with_bonus_probs"], dtype=np.float64)
    problems = []
    for b in range(output.shape[0]):
        for i, token in enumerate(output[b, : case.k].tolist()):
            if token >= 0 and not target[b, i, token] > 0:
                problems.append(f"row {b} emitted token {token} of target probability 0")
                break
    if expect == "even" and not problems:
        counts = np.bincount(output[:, 0], minlength=case.vocab)
        support = np.flatnonzero(target[0, 0] > 0)
        share = output.shape[0] / len(support)
        if np.abs(counts[support] - share).max() > 2:
            problems.append(f"residual draws {counts.tolist()} are not even over {support}")
    return problems


def output_of(result: Any) -> np.ndarray:
    return result.output_token_ids if isinstance(result, specdec_np.VerificationResult) else result


# --------------------------------------------------------------------------------------
# The engine and tree layouts: verify_ragged and verify_tree
# --------------------------------------------------------------------------------------

LAYOUT_ARGUMENT_NAMES = (
    "num_draft_tokens",
    "num_nodes",
    "tree_parents",
    "draft_token_ids",
    "target_logits",
    "target_probs",
    "draft_logits",
    "draft_probs",
    "bonus_token_ids",
    "method",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "filter_order",
    "uniforms",
    "generator",
    "seeded_seqs",
    "counter_seeds",
    "strict_mode",
    "out",
    *(p.name for v in registry.VERIFIERS for p in v.parameters),
)
SAMPLING_PARAMETERS = ("temperature", "top_k", "top_p", "min_p")
# The method of a call without ``method=``: the functions' defaults.
DEFAULT_METHODS = {
    group: inspect.signature(getattr(specdec_np, entry)).parameters["method"].default
    for group, entry in (("ragged", "verify_ragged"), ("tree", "verify_tree"))
}
LAYOUT_ID_ARGUMENTS = ("draft_token_ids", "bonus_token_ids")
LAYOUT_ROW_ARGUMENTS = ("target_logits", "target_probs", "draft_logits", "draft_probs")


def layout_counts(rng: np.random.Generator, batch: int, largest: int) -> np.ndarray:
    """Per-request counts, some zero."""
    return rng.integers(0, largest + 1, batch).astype(np.int64)


def random_parents(rng: np.random.Generator, count: int) -> list[int]:
    """A valid tree of ``count`` nodes: chains, bushes and everything between."""
    shape = pick(rng, ["random", "chain", "bush", "binary"])
    parents = []
    for node in range(count):
        if shape == "chain":
            parents.append(node - 1)
        elif shape == "bush":
            parents.append(-1)
        elif shape == "binary":
            parents.append((node - 1) // 2 if node else -1)
        else:
            parents.append(int(rng.integers(-1, node)))
    return parents


def logit_rows(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Logits in several styles, some entries -inf (masked tokens)."""
    scale = pick(rng, [0.1, 1.0, 5.0, 30.0])
    x = rng.normal(0.0, scale, shape)
    if x.size and rng.random() < 0.3:
        masked = rng.random(shape) < 0.3
        x[masked] = -np.inf
        # Keep one finite entry per row: a row without one has no mass (a ValueError).
        x[..., 0] = np.where(np.isfinite(x).any(axis=-1), x[..., 0], 0.0)
    return x.astype(dtype)


def layout_rows(
    rng: np.random.Generator, case: Case, rows: int, draft_rows: int, reads_draft: bool
) -> None:
    """Target and draft rows, as probabilities or logits, into ``case.args``."""
    vocab = case.vocab
    dtype = np.float32 if case.strict else pick(rng, [np.float32, np.float32, np.float64])
    logits = bool(rng.random() < 0.5)
    make = logit_rows if logits else probabilities
    form = "logits" if logits else "probs"
    case.args[f"target_{form}"] = make(rng, (rows, vocab), dtype)
    if reads_draft or rng.random() < 0.3:
        if rng.random() < 0.75:
            case.args[f"draft_{form}"] = make(rng, (draft_rows, vocab), dtype)
    case.mutations.append(f"rows as {form}")


def sampling_values(rng: np.random.Generator, case: Case) -> None:
    """Valid per-request sampling parameters (filters only with logits)."""
    batch = case.batch
    choice = rng.random()
    if choice < 0.3:
        pass
    elif choice < 0.55:
        case.args["temperature"] = pick(rng, [0.0, 0.5, 1.0, 2.0, 0])
    else:
        temperature = rng.choice([0.0, 0.7, 1.0, 1.5], batch)
        case.args["temperature"] = pick(rng, [temperature, temperature.tolist()])
    if "target_logits" not in case.args:
        return
    if rng.random() < 0.3:
        case.args["top_k"] = pick(
            rng, [0, 1, 2, case.vocab, case.vocab + 5, rng.integers(0, 4, batch)]
        )
    if rng.random() < 0.3:
        case.args["top_p"] = pick(rng, [1.0, 0.5, 0.9, 1e-9, rng.uniform(0.1, 1.0, batch)])
    if rng.random() < 0.3:
        case.args["min_p"] = pick(rng, [0.0, 0.1, 0.9, 1.0, rng.uniform(0.0, 0.5, batch)])
    if rng.random() < 0.4:
        case.args["filter_order"] = pick(rng, ["vllm", "llama.cpp"])


def layout_sources(rng: np.random.Generator, case: Case) -> None:
    """A valid source of uniforms: those of the chain verifiers, or a generator."""
    rejection_sources(rng, case, case.batch, case.k)
    if "uniforms" not in case.args and rng.random() < 0.2:
        case.args["generator"] = np.random.default_rng(case.index)


def layout_base_case(rng: np.random.Generator, index: int, family: str, group: str) -> Case:
    """A valid call of ``verify_ragged`` or ``verify_tree``."""
    strict = bool(rng.random() < 0.3)
    batch = pick(rng, [0, 1, 1, 2, 3, 4, 6])
    vocab = pick(rng, [1, 2, 3, 5, 8, 16, 33])
    if rng.random() < 0.02:
        batch, vocab = min(batch, 2), pick(rng, [1025, 2500])
    id_dtype = np.int64 if strict else pick(rng, [np.int64, np.int64, np.int32])
    entry = "verify_ragged" if group == "ragged" else "verify_tree"
    case = Case(index, family, group, entry, strict, {}, batch, 1, vocab)
    if group == "ragged":
        verifier = pick(rng, registry.VERIFIERS)
        counts = layout_counts(rng, batch, pick(rng, [1, 3, 5]))
        total = int(counts.sum())
        case.k = (int(counts.max()) if batch else 0) + 1  # uniforms are [B, max_k + 2]
        # A list is refused (a TypeError): now and then only.
        case.args["num_draft_tokens"] = counts.tolist() if rng.random() < 0.1 else counts
        layout_rows(rng, case, total + batch, total, verifier.reads_draft_probs)
        case.args["draft_token_ids"] = rng.integers(0, vocab, total).astype(id_dtype)
        if rng.random() < 0.5:
            case.args["bonus_token_ids"] = rng.integers(0, vocab, batch).astype(id_dtype)
        method, parameters = verifier.name, verifier.parameters
        if rng.random() < 0.15:
            case.args["out"] = specdec_np.output_buffers(batch, case.k - 1 + int(rng.integers(2)))
    else:
        tree_method = pick(rng, registry.TREE_METHODS)
        counts = layout_counts(rng, batch, pick(rng, [2, 4, 7]))
        parents = [p for count in counts.tolist() for p in random_parents(rng, count)]
        total = int(counts.sum())
        case.k = int(counts.max()) if batch else 0  # uniforms are [B, max_nodes + 1]
        case.args["num_nodes"] = pick(rng, [counts, counts, counts.tolist()])
        case.args["tree_parents"] = pick(
            rng, [np.asarray(parents, dtype=np.int64), np.asarray(parents, dtype=np.int32)]
        )
        layout_rows(rng, case, total + batch, total, tree_method.reads_draft_probs)
        case.args["draft_token_ids"] = rng.integers(0, vocab, total).astype(id_dtype)
        method, parameters = tree_method.name, ()
        if rng.random() < 0.15:
            depth = tree_depth(counts.tolist(), parents)
            case.args["out"] = specdec_np.tree_output_buffers(batch, depth)
    if rng.random() < 0.9 or method != "rejection" or group != "ragged":
        case.args["method"] = method
    for parameter in parameters:
        if rng.random() < 0.5:
            case.args[parameter.name] = pick(rng, [parameter.default, 0.0, 0.5, 1])
    sampling_values(rng, case)
    layout_sources(rng, case)
    return case


def tree_depth(counts: list[int], parents: list[int]) -> int:
    """The deepest node of a valid flat tree batch (0 without nodes)."""
    deepest, start = 0, 0
    for count in counts:
        depth: list[int] = []
        for parent in parents[start : start + count]:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        deepest = max([deepest, *depth])
        start += count
    return deepest


def integers_of(value: Any, size: int) -> np.ndarray:
    """``value`` as 1-D int64, or ``size`` zeros when an earlier mutation made it junk."""
    try:
        return np.asarray(value).astype(np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        return np.zeros(size, dtype=np.int64)


def mutate_counts(rng: np.random.Generator, case: Case, name: str) -> str:
    """Counts that are negative, huge (sums that wrap around int64) or off by some."""
    counts = integers_of(case.args[name], case.batch)
    how = pick(rng, ["negative", "huge", "wrap", "wrap", "off", "uint64", "extreme"])
    if counts.size == 0:
        counts = np.zeros(1, dtype=np.int64)
    counts = counts.copy()
    b = int(rng.integers(counts.size))
    if how == "negative":
        counts[b] = pick(rng, [-1, -2, -(2**31), INT64_MIN])
    elif how == "huge":
        counts[b] = pick(rng, [2**31, 2**40, 2**62, INT64_MAX])
    elif how == "wrap":
        # Appended entries whose int64 sum is 2**64, so the sum wraps around to the true
        # N: a check of the sum alone lets them through.
        extra = pick(rng, [[2**62] * 4, [INT64_MAX, INT64_MAX, 2], [2**63 - 2**40, 2**63, 2**40]])
        counts = np.concatenate([counts, np.array(extra, dtype=np.uint64).astype(np.int64)])
        if rng.random() < 0.5:  # target rows for the larger B: only the counts are wrong
            for rows_name in ("target_probs", "target_logits"):
                rows = case.args.get(rows_name)
                if isinstance(rows, np.ndarray) and rows.ndim == 2:
                    padding = np.zeros((len(extra), rows.shape[1]), dtype=rows.dtype)
                    case.args[rows_name] = np.concatenate([rows, padding])
        case.args[name] = counts
        return f"{name}: huge entries whose int64 sum wraps to N ({counts.tolist()})"
    elif how == "off":
        counts[b] += pick(rng, [1, -1, 2])
    elif how == "uint64":
        wide = counts.astype(np.uint64)
        wide[b] = np.uint64(2**64 - 1)
        case.args[name] = wide
        return f"{name}: uint64 {wide.tolist()}"
    else:
        counts[b] = pick(rng, [INT64_MAX, INT64_MIN])
    case.args[name] = counts
    return f"{name}: {how} {counts.tolist()}"


def mutate_parents(rng: np.random.Generator, case: Case) -> str:
    """Parents that point forward, at themselves, out of the request, below -1 or far."""
    parents = integers_of(case.args["tree_parents"], 0)
    if parents.size == 0:
        case.args["tree_parents"] = np.array([pick(rng, [-1, 0, 5])], dtype=np.int64)
        return "tree_parents: one entry for no node"
    counts = integers_of(case.args["num_nodes"], case.batch)
    if (counts < 0).any() or counts.sum() != parents.size or counts.max() > 2**20:
        parents[int(rng.integers(parents.size))] = -2  # counts already corrupted
        case.args["tree_parents"] = parents
        return "tree_parents: one entry -2"
    request = np.repeat(np.arange(counts.size), counts)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    i = int(rng.integers(parents.size))
    local = i - int(offsets[request[i]])
    size = int(counts[request[i]])
    how = pick(rng, ["self", "forward", "request", "below", "huge"])
    value = {
        "self": local,
        "forward": local + 1 + int(rng.integers(3)),
        "request": size + int(rng.integers(3)),
        "below": pick(rng, [-2, -3, -(2**31)]),
        "huge": pick(rng, [2**31, 2**40, INT64_MAX, INT64_MIN]),
    }[how]
    parents[i] = value
    case.args["tree_parents"] = parents
    return f"tree_parents[{i}] = {value} ({how}, node {local} of {size})"


def deep_chain(rng: np.random.Generator, case: Case) -> str:
    """One request whose chain reaches MAX_TREE_DEPTH, or one node beyond it."""
    from specdec_np._layouts import tree as _trees

    depth = _trees.MAX_TREE_DEPTH + pick(rng, [0, 1, 2])
    vocab = case.vocab
    case.batch, case.k = 1, depth
    form = "logits" if "target_logits" in case.args else "probs"
    for name in (*LAYOUT_ROW_ARGUMENTS, "uniforms", "seeded_seqs", "counter_seeds", "out"):
        case.args.pop(name, None)
    for name in SAMPLING_PARAMETERS:
        case.args.pop(name, None)
    case.args["num_nodes"] = np.array([depth], dtype=np.int64)
    case.args["tree_parents"] = np.arange(-1, depth - 1, dtype=np.int64)
    case.args["draft_token_ids"] = rng.integers(0, vocab, depth).astype(np.int64)
    make = logit_rows if form == "logits" else probabilities
    case.args[f"target_{form}"] = make(rng, (depth + 1, vocab), np.float32)
    return f"a chain of depth {depth}"


def layout_array_names(case: Case) -> list[str]:
    names = [
        name
        for name in (*LAYOUT_ID_ARGUMENTS, *LAYOUT_ROW_ARGUMENTS, "uniforms", "tree_parents")
        if isinstance(case.args.get(name), np.ndarray)
    ]
    names += [n for n in SAMPLING_PARAMETERS if isinstance(case.args.get(n), np.ndarray)]
    if "uniforms" not in case.args:
        names.append("uniforms")
    return names


def mutate_layout_arrays(rng: np.random.Generator, case: Case) -> None:
    """The arrays family for the layouts: one to three corruptions."""
    count_name = "num_draft_tokens" if case.group == "ragged" else "num_nodes"
    for _ in range(pick(rng, [0, 1, 1, 1, 2, 2, 3])):
        roll = rng.random()
        if roll < 0.12:
            case.mutations.append(mutate_counts(rng, case, count_name))
            continue
        if case.group == "tree" and roll < 0.27:
            case.mutations.append(mutate_parents(rng, case))
            continue
        if case.group == "tree" and roll < 0.30:
            case.mutations.append(deep_chain(rng, case))
            continue
        if roll < 0.36:
            name = count_name
            x = np.asarray(case.args[name])
            kind = pick(rng, ["dtype", "shape", "layout", "container"])
        else:
            names = layout_array_names(case)
            if not names:
                break
            name = pick(rng, names)
            if name == "uniforms" and not isinstance(case.args.get(name), np.ndarray):
                case.args["uniforms"] = rng.random((case.batch, case.k + 1))
                case.args.pop("seeded_seqs", None)
                case.args.pop("counter_seeds", None)
                case.args.pop("generator", None)
            x = case.args[name]
            kinds = ["dtype", "shape", "layout", "container"]
            if name in LAYOUT_ID_ARGUMENTS or name == "tree_parents":
                kinds += ["bad_id"] * 3
            if name in (*LAYOUT_ROW_ARGUMENTS, "uniforms", *SAMPLING_PARAMETERS):
                kinds += ["bad_probability"] * 4
            kind = pick(rng, kinds)
        try:
            value, label = apply_mutation(rng, kind, x, case.vocab)
        except Exception as error:  # NumPy cannot build this input
            value, label = x, f"{kind} skipped ({type(error).__name__})"
        case.args[name] = value
        case.mutations.append(f"{name}: {label}")


def weird_sampling_values(batch: int) -> list[Any]:
    return [
        -1.0,
        -1e-30,
        np.nan,
        np.inf,
        -np.inf,
        1.5,
        0.0,
        1e308,
        2**70,
        True,
        "0.5",
        1j,
        [0.5],
        np.zeros(batch + 1),
        np.zeros((batch, 1)),
        np.full(batch, np.nan),
        np.full(batch, -1),
        np.array(["a"] * batch),
        np.zeros(batch, dtype=object),
        np.zeros(batch, dtype=np.complex128),
        np.float16(np.inf),
        np.longdouble("1e4000"),
        np.uint64(2**64 - 1),
        0.5,
        3,
    ]


def weird_methods(group: str) -> list[Any]:
    other = registry.TREE_METHODS if group == "ragged" else registry.VERIFIERS
    return [
        None,
        "",
        "unknown",
        3,
        b"rejection",
        ["greedy"],
        *(method.name.upper() for method in other[:1]),
        *(method.name for method in other),
    ]


def weird_out(rng: np.random.Generator, case: Case) -> Any:
    """Output buffers of the wrong kind, shape, dtype or layout."""
    batch = case.batch
    if case.group == "ragged":
        width = case.k  # max_k + 1
        good = specdec_np.output_buffers(batch, width - 1)
        other = specdec_np.tree_output_buffers(batch, width)
    else:
        depth = max(case.k, 1)
        good = specdec_np.tree_output_buffers(batch, depth)
        other = specdec_np.output_buffers(batch, depth)
    how = pick(rng, ["other", "tuple", "rows", "narrow", "dtype", "strided", "readonly", "junk"])
    fields = list(good)
    if how == "other":
        return other
    if how == "tuple":
        return tuple(fields)
    if how == "junk":
        return pick(rng, [np.zeros((batch, 3), dtype=np.int64), "out", 0, [None]])
    i = int(rng.integers(len(fields)))
    x = fields[i]
    if how == "rows":
        fields[i] = np.zeros((x.shape[0] + 1, *x.shape[1:]), dtype=np.int64)
    elif how == "narrow" and x.ndim == 2:
        fields[i] = np.zeros((x.shape[0], max(x.shape[1] - 1, 0)), dtype=np.int64)
    elif how == "dtype":
        fields[i] = x.astype(pick(rng, [np.int32, np.float64, np.dtype(">i8"), np.uint64]))
    elif how == "strided" and x.ndim == 2:
        fields[i] = np.zeros((x.shape[0], 2 * x.shape[1]), dtype=np.int64)[:, ::2]
    else:
        x.flags.writeable = False
    return type(good)(*fields)


def valid_edge(rng: np.random.Generator, case: Case) -> str:
    """A valid argument at the edge of its range: the call must return (or fail for the
    rows' own reasons, e.g. a row without mass)."""
    batch, logits = case.batch, "target_logits" in case.args
    how = pick(rng, ["temperature", "filters", "uniforms", "strict", "keys"])
    if how == "temperature" or (how == "filters" and not logits):
        value = pick(rng, [1e-30, 1e-6, 1e30, np.float32(0.5), np.int64(0), np.zeros(batch)])
        case.args["temperature"] = value
        return f"temperature edge {describe(value)}"
    if how == "filters":
        name = pick(rng, ["top_k", "top_p", "min_p"])
        value = {
            "top_k": pick(rng, [1, case.vocab, 2**62, np.int32(1), np.full(batch, 1.0)]),
            "top_p": pick(rng, [5e-324, 1.0, np.nextafter(1.0, 0.0), np.full(batch, 1e-12)]),
            "min_p": pick(rng, [0.0, 1.0, 5e-324, np.ones(batch, dtype=np.float32)]),
        }[name]
        case.args[name] = value
        return f"{name} edge {describe(value)}"
    if how == "uniforms":
        for name in ("seeded_seqs", "counter_seeds", "generator"):
            case.args.pop(name, None)
        value = pick(rng, [0.0, np.nextafter(1.0, 0.0), 0.5])
        uniforms = np.full((batch, case.k + 1), value)
        case.args["uniforms"] = pick(
            rng, [uniforms, np.asfortranarray(uniforms), uniforms.tolist()]
        )
        return f"uniforms all {value}"
    if how == "strict":
        case.strict = pick(rng, [np.bool_(False), 0, False])
        return f"strict_mode={case.strict!r}"
    # Request keys of other integer types, each request once.
    case.args.pop("uniforms", None)
    case.args.pop("counter_seeds", None)
    key_type = pick(rng, [int, np.int64, np.int32, np.uint8])
    case.args["seeded_seqs"] = {
        key_type(b): np.random.default_rng([case.index, b]) for b in range(batch)
    }
    return f"seeded_seqs keys {key_type.__name__}"


def mutate_layout_arguments(rng: np.random.Generator, case: Case) -> None:
    """The arguments family for the layouts: one corrupted non-array argument."""
    what = pick(
        rng,
        ["sources", "sources", "sampling", "sampling", "method", "strict", "out", "forms"]
        + ["edge"] * 2,
    )
    if what == "edge":
        case.mutations.append(valid_edge(rng, case))
    elif what == "sources":
        case.mutations.append(mutate_rejection_arguments(rng, case, case.batch))
    elif what == "sampling":
        for name in SAMPLING_PARAMETERS:
            if rng.random() < 0.4:
                case.args[name] = pick(rng, weird_sampling_values(case.batch))
                case.mutations.append(name)
        if rng.random() < 0.2:
            case.args["filter_order"] = pick(rng, ["sglang", None, 1, "LLAMA.CPP", b"vllm"])
            case.mutations.append("filter_order")
        if not case.mutations[1:]:
            case.args["temperature"] = pick(rng, weird_sampling_values(case.batch))
            case.mutations.append("temperature")
        parameters = (
            registry.get(case.args["method"]).parameters
            if (case.group == "ragged" and case.args.get("method") in registry.names())
            else ()
        )
        for parameter in parameters:
            if rng.random() < 0.5:
                case.args[parameter.name] = pick(rng, weird_posteriors())
                case.mutations.append(parameter.name)
    elif what == "method":
        case.args["method"] = pick(rng, weird_methods(case.group))
        case.mutations.append("method")
        if case.group == "ragged" and rng.random() < 0.3:
            name = pick(rng, [p.name for v in registry.VERIFIERS for p in v.parameters])
            case.args[name] = 0.1
            case.mutations.append(f"{name} for another method")
    elif what == "strict":
        case.strict = pick(rng, weird_strict())
        case.mutations.append(f"strict_mode={case.strict!r}")
    elif what == "out":
        case.args["out"] = weird_out(rng, case)
        case.mutations.append("out")
    else:
        # Both forms of the target, none, or the draft in the other form.
        form = "logits" if "target_logits" in case.args else "probs"
        other = "probs" if form == "logits" else "logits"
        how = pick(rng, ["both", "none", "draft_other", "draft_both"])
        rows = case.args[f"target_{form}"]
        if how == "both":
            case.args[f"target_{other}"] = rows
        elif how == "none":
            del case.args[f"target_{form}"]
        elif how == "draft_other":
            case.args.pop(f"draft_{form}", None)
            case.args[f"draft_{other}"] = rows[: rows.shape[0] - case.batch]
        else:
            case.args[f"draft_{other}"] = rows[: rows.shape[0] - case.batch]
            case.args[f"draft_{form}"] = rows[: rows.shape[0] - case.batch]
        case.mutations.append(f"rows: {how}")
    if rng.random() < 0.1:  # now and then an array is wrong as well
        mutate_layout_arrays(rng, case)


def invoke_layout(case: Case) -> Any:
    function = getattr(specdec_np, case.entry)
    arguments = {name: value for name, value in case.args.items() if value is not MISSING}
    return function(strict_mode=case.strict, **arguments)


def request_offsets(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def layout_inputs(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray, str] | None:
    """(counts, draft ids, float64 target rows, form) as the library saw them."""
    name = "num_draft_tokens" if case.group == "ragged" else "num_nodes"
    form = "logits" if "target_logits" in case.args else "probs"
    try:
        counts = np.asarray(case.args[name])
        ids = as_numpy(case.args["draft_token_ids"])
        target = as_numpy(case.args[f"target_{form}"])
        if ids is None or target is None:
            return None
        target = np.asarray(target, dtype=np.float64)
        return counts.astype(np.int64), ids.astype(np.int64), target, form
    except Exception:
        return None


def greedy_requests(case: Case, batch: int) -> np.ndarray:
    """bool [B]: the requests verified greedily (a greedy method, or temperature 0), which
    draw no uniform."""
    method = case.args.get("method", DEFAULT_METHODS[case.group])
    if case.group == "ragged":
        sampled = not registry.get(method).greedy
    else:
        sampled = registry.get_tree_method(method).stochastic
    if not sampled:
        return np.ones(batch, dtype=bool)
    temperature = case.args.get("temperature")
    if temperature is None:
        return np.zeros(batch, dtype=bool)
    return np.broadcast_to(np.asarray(temperature, dtype=np.float64) == 0, (batch,))


def mass_checked(case: Case, batch: int) -> np.ndarray:
    """bool [B]: the requests that must never emit a token without target mass: those a
    lossless sampling method verifies (greedy and typical take argmaxes, which a row
    without a positive entry resolves to token 0)."""
    method = case.args.get("method", DEFAULT_METHODS[case.group])
    if case.group == "ragged":
        verifier = registry.get(method)
        lossless = verifier.stochastic and verifier.lossless
    else:
        lossless = registry.get_tree_method(method).stochastic
    return ~greedy_requests(case, batch) & lossless


def positive(target: np.ndarray, row: int, token: int, form: str) -> bool:
    """Whether a token has positive mass in a row (a NaN or -inf logit has none)."""
    value = target[row, token]
    if form == "logits":
        return not (np.isnan(value) or value == -np.inf)
    return bool(value > 0)


def generator_problems(case: Case) -> list[str]:
    """A returned call whose generator gave draws of the wrong shape: nothing checked them
    before the kernel read them."""
    generator = case.args.get("generator")
    seeded = case.args.get("seeded_seqs")
    generators = [generator, *(seeded.values() if isinstance(seeded, dict) else ())]
    return [
        f"returned after {g!r}.random({g.mismatch[0]}) gave shape {g.mismatch[1]}"
        for g in generators
        if isinstance(g, WeirdGenerator) and g.mismatch is not None
    ]


#: The arguments whose arrays decide the outputs' library (the rows and ids).
DATA_ARGUMENTS = frozenset(
    {
        "target_with_bonus_probs", "bonus_token_ids", "draft_probs", "draft_token_ids",
        "accepted", "substitute_token_ids", "num_draft_tokens", "target_logits",
        "target_probs", "draft_logits", "num_nodes", "tree_parents",
    }
)


def foreign_library(case: Case) -> str | None:
    """The array library the outputs must come back in (docs/semantics.md §1): that of
    the first input that is neither NumPy nor array_like and exports DLPack, when the
    library has a ``from_dlpack``; None for NumPy outputs."""
    for name, value in case.args.items():
        if name not in DATA_ARGUMENTS:
            continue  # uniforms, seeds and out= buffers do not decide the library
        if value is None or value is MISSING or isinstance(
            value, (np.ndarray, list, tuple, int, float, dict, np.generic)
        ):
            continue
        if not hasattr(value, "__dlpack__"):
            continue
        root = type(value).__module__.split(".", 1)[0]
        module = sys.modules.get(root)
        if callable(getattr(module, "from_dlpack", None)) or callable(
            getattr(getattr(module, "numpy", None), "from_dlpack", None)
        ):
            return root
        return None
    return None


def host_outputs(case: Case, result: Any) -> tuple[list[str], Any]:
    """The result with its arrays as NumPy arrays, after checking that they came back in
    the inputs' array library."""
    library = foreign_library(case)
    if library is None:
        return [], result

    def host(array: Any) -> Any:
        if type(array).__module__.split(".", 1)[0] != library:
            raise TypeError(f"an output is a {type(array).__name__}, not a {library} array")
        return np.from_dlpack(array)

    try:
        if isinstance(result, tuple) and hasattr(result, "_replace"):
            return [], result._replace(**{
                name: host(value) for name, value in result._asdict().items()
                if hasattr(value, "__dlpack__")
            })
        return [], host(result)
    except TypeError as error:
        return [str(error)], None


def returned_layout(case: Case, result: Any, result_type: type) -> tuple[list[str], Any]:
    """Problems of a returned layout call found before its rows are read, and the inputs
    as the library saw them (None when there are problems)."""
    problems = generator_problems(case)
    if problems:
        return problems, None
    if not isinstance(result, result_type):
        return [f"returned {type(result).__name__}, not a {result_type.__name__}"], None
    inputs = layout_inputs(case)
    if inputs is None:
        return ["returned although an input is not an array"], None
    return [], (inputs, result)


def shape_problems(expected: tuple[tuple[str, Any, tuple[int, ...]], ...]) -> list[str]:
    """The first of ``(name, array, shape)`` that is not an int64 NumPy array of its shape."""
    for name, array, shape in expected:
        if type(array) is not np.ndarray or array.dtype != np.int64 or array.shape != shape:
            return [f"{name} is {describe(array)}, expected int64 {shape}"]
    return []


def massless_token(
    target: np.ndarray, rows: list[int], tokens: np.ndarray, form: str, request: int
) -> list[str]:
    """The first token emitted under ``rows[i]`` without target mass there."""
    for i, row in enumerate(rows):
        if not positive(target, row, int(tokens[i]), form):
            return [
                f"request {request} (sampled) emitted token {tokens[i]} at position {i}, "
                f"whose target value is {target[row, tokens[i]]}"
            ]
    return []


def ragged_output_problems(case: Case, result: Any) -> list[str]:
    problems, returned = returned_layout(case, result, specdec_np.VerificationResult)
    if problems:
        return problems
    (counts, ids, target, form), result = returned
    batch = counts.shape[0]
    width = (int(counts.max()) if batch else 0) + 1
    out = case.args.get("out")
    output, lengths = result.output_token_ids, result.accepted_lengths
    problems = shape_problems(
        (("output_token_ids", output, (batch, width)), ("accepted_lengths", lengths, (batch,)))
    )
    if problems:
        return problems
    if out is not None and output.size and not np.shares_memory(output, out.output_token_ids):
        return ["out= was given but output_token_ids is not in its buffer"]
    vocab = target.shape[1]
    offsets = request_offsets(counts)
    bonus = case.args.get("bonus_token_ids")
    bonus = None if bonus is None else np.asarray(as_numpy(bonus)).astype(np.int64)
    checks_mass = mass_checked(case, batch)
    for b in range(batch):
        k, r, row = int(counts[b]), int(lengths[b]), output[b]
        if not 0 <= r <= k:
            problems.append(f"request {b}: accepted length {r} outside [0, {k}]")
            continue
        drafts = ids[offsets[b] : offsets[b + 1]]
        if not np.array_equal(row[:r], drafts[:r]):
            problems.append(f"request {b}: accepted {row[:r].tolist()} are not its drafts")
        if not 0 <= row[r] < vocab or not (row[r + 1 :] == -1).all():
            problems.append(f"request {b}: row {row.tolist()} is not r + 1 ids then -1")
            continue
        if r == k and bonus is not None and row[k] != bonus[b]:
            problems.append(f"request {b}: bonus {row[k]} != bonus_token_ids {bonus[b]}")
        if checks_mass[b]:
            # A given bonus is the caller's token, not a draw.
            last = r + 1 if (r < k or bonus is None) else r
            rows = [int(offsets[b]) + b + i for i in range(last)]
            problems += massless_token(target, rows, row, form, b)
    return problems


def tree_output_problems(case: Case, result: Any) -> list[str]:
    problems, returned = returned_layout(case, result, specdec_np.TreeVerificationResult)
    if problems:
        return problems
    (counts, ids, target, form), result = returned
    parents = np.asarray(case.args["tree_parents"]).astype(np.int64)
    batch = counts.shape[0]
    offsets = request_offsets(counts)
    depth = tree_depth(counts.tolist(), parents.tolist())
    out = case.args.get("out")
    nodes, output, lengths = (
        result.accepted_nodes,
        result.output_token_ids,
        result.accepted_lengths,
    )
    problems = shape_problems(
        (
            ("accepted_nodes", nodes, (batch, depth)),
            ("output_token_ids", output, (batch, depth + 1)),
            ("accepted_lengths", lengths, (batch,)),
        )
    )
    if problems:
        return problems
    if out is not None and nodes.size and not np.shares_memory(nodes, out.accepted_nodes):
        return ["out= was given but accepted_nodes is not in its buffer"]
    vocab = target.shape[1]
    checks_mass = mass_checked(case, batch)
    for b in range(batch):
        start, size, length = int(offsets[b]), int(counts[b]), int(lengths[b])
        request_parents = parents[start : start + size]
        path, tokens = nodes[b], output[b]
        if not 0 <= length <= size or length > path.shape[0]:
            problems.append(f"request {b}: accepted length {length} outside [0, {size}]")
            continue
        previous = -1
        for i in range(length):
            node = int(path[i])
            if not 0 <= node < size or request_parents[node] != previous:
                problems.append(f"request {b}: {path[:length].tolist()} is not a root path")
                break
            if tokens[i] != ids[start + node]:
                problems.append(f"request {b}: token {tokens[i]} is not node {node}'s draft")
                break
            previous = node
        else:
            if not (path[length:] == -1).all() or not (tokens[length + 1 :] == -1).all():
                problems.append(f"request {b}: not -1 after the length: {path.tolist()}")
            elif not 0 <= tokens[length] < vocab:
                problems.append(f"request {b}: final token {tokens[length]} outside [0, V)")
            elif checks_mass[b]:
                # Token i is drawn or accepted under its parent's row: the root's, then the
                # accepted nodes' in order.
                rows = [start + b] + [start + b + 1 + int(n) for n in path[:length]]
                problems += massless_token(target, rows, tokens, form, b)
    return problems


def layout_consumption_problems(case: Case, states: list, result: Any) -> list[str]:
    """A sampled request's generator is consumed by exactly its width of draws; a greedy
    request's not at all."""
    inputs = layout_inputs(case)
    if inputs is None or "uniforms" in case.args:
        return []
    counts = inputs[0]
    greedy = greedy_requests(case, counts.shape[0])
    problems = []
    seeded = case.args.get("seeded_seqs")
    bits = {
        id(value.bit_generator): key
        for key, value in (seeded or {}).items()
        if isinstance(value, np.random.Generator)
    }
    for name, bit, state in states:
        if not name.startswith("seeded_seqs") or id(bit) not in bits:
            continue
        b = int(bits[id(bit)])
        draws = 0 if greedy[b] else int(counts[b]) + (2 if case.group == "ragged" else 1)
        if not consumed_exactly(bit, state, draws):
            problems.append(f"{name} was not consumed by exactly {draws} draws")
    return problems


def make_case(seed: int, family: str, group: str, index: int) -> Case:
    """The case of ``index`` (a pure function of its four arguments)."""
    rng = np.random.default_rng([seed, FAMILIES.index(family), GROUPS.index(group), index])
    if group in LAYOUT_GROUPS:
        if family not in ("arrays", "arguments"):
            raise SystemExit(f"group {group} has the families arrays and arguments only")
        case = layout_base_case(rng, index, family, group)
        if family == "arrays":
            mutate_layout_arrays(rng, case)
        else:
            mutate_layout_arguments(rng, case)
        return case
    case = base_case(rng, index, family, group)
    if family == "arrays":
        mutate_arrays(rng, case, case.vocab)
    elif family == "arguments":
        mutate_arguments(rng, case, case.batch, case.vocab)
    elif family == "hardening":
        case.mutations.append(mutate_hardening(rng, case))
    else:
        case.mutations.append(mutate_kernel_inputs(rng, case))
    return case


# --------------------------------------------------------------------------------------
# Calls and their checks
# --------------------------------------------------------------------------------------


class Samplers:
    """Sampler instances shared by the calls of one worker, so that counters accumulate."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.pool: dict[tuple[str, bool], Any] = {}

    def get(self, case: Case) -> Any:
        cls_name = case.entry if case.entry[0].isupper() else None
        if case.entry == "_create_output":
            cls_name = PADDED_VERIFIERS[case.index % len(PADDED_VERIFIERS)].sampler_name
        verifier = next(v for v in registry.VERIFIERS if v.sampler_name == cls_name)
        values = case.constructor if verifier.parameters else {}
        cls = getattr(specdec_np, cls_name)
        if values and case.family == "arguments":
            # A fresh instance: the constructor's arguments are fuzzed.
            return cls(*values.values(), strict_mode=case.strict)
        key = (cls_name, bool(case.strict), *values.values())
        if key not in self.pool:
            if verifier.stochastic:
                self.pool[key] = cls(case.strict, seed=self.seed)
            else:
                self.pool[key] = cls(*values.values(), strict_mode=case.strict)
        return self.pool[key]


def keyword_arguments(case: Case, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: case.args[name]
        for name in names
        if name in case.args and case.args[name] is not MISSING
    }


def invoke(case: Case, samplers: Samplers, sampler: Any) -> Any:
    """Make the call that ``case`` describes (constructors included)."""
    if case.group in LAYOUT_GROUPS:
        return invoke_layout(case)
    a = case.args
    entry = case.entry
    verifier = next((v for v in registry.VERIFIERS if v.function_name == entry), None)
    if verifier is not None and verifier.stochastic:
        return getattr(specdec_np, entry)(
            a["target_with_bonus_probs"],
            a["bonus_token_ids"],
            a["draft_probs"],
            a["draft_token_ids"],
            strict_mode=case.strict,
            **keyword_arguments(case, ("uniforms", "generator", "seeded_seqs", "counter_seeds")),
        )
    if verifier is not None:
        return getattr(specdec_np, entry)(
            a["target_with_bonus_probs"],
            a["bonus_token_ids"],
            a["draft_token_ids"],
            strict_mode=case.strict,
            **keyword_arguments(case, verifier.parameter_names),
        )
    if entry == "create_output":
        return specdec_np.create_output(
            a["accepted"],
            a["substitute_token_ids"],
            a["draft_token_ids"],
            a["bonus_token_ids"],
            **keyword_arguments(case, ("vocab_size",)),
        )
    if sampler is None:
        sampler = samplers.get(case)
    if entry == "_create_output":
        return sampler._create_output(
            a["accepted"],
            a["substitute_token_ids"],
            a["draft_token_ids"],
            a["bonus_token_ids"],
            **keyword_arguments(case, ("vocab_size",)),
        )
    positional = [
        a["target_with_bonus_probs"],
        a["bonus_token_ids"],
        a.get("draft_probs"),
        a["draft_token_ids"],
    ]
    if is_stochastic(case.group):
        if "seeded_seqs" in a:
            positional.append(a["seeded_seqs"])
        return sampler(*positional, **keyword_arguments(case, ("counter_seeds", "uniforms")))
    return sampler(*positional)


def as_numpy(x: Any) -> np.ndarray | None:
    """The values the library saw, for the semantic checks (None if unknown)."""
    if isinstance(x, np.ndarray):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except Exception:
            return None
    if isinstance(x, (list, tuple, int, float, np.generic)) and not isinstance(x, bool):
        # array_like, as the library takes it (docs/semantics.md §1).
        try:
            array = np.asarray(x)
        except (ValueError, TypeError):
            return None
        return array if array.dtype.kind in "biuf" else None
    return None


def vocabulary_limit(case: Case) -> int | None:
    """The ``V`` that output ids must stay below, or None if it cannot be known."""
    if case.group != "output":
        target = as_numpy(case.args["target_with_bonus_probs"])
        return None if target is None or target.ndim != 3 else int(target.shape[-1])
    vocab_size = case.args.get("vocab_size")
    if vocab_size is None or vocab_size is MISSING:
        return INT64_MAX
    try:
        return int(vocab_size)
    except Exception:
        return None


def output_problems(case: Case, result: Any) -> list[str]:
    """Everything wrong with a returned value (the output format of docs/semantics.md §1)."""
    if case.group == "ragged":
        return ragged_output_problems(case, result)
    if case.group == "tree":
        return tree_output_problems(case, result)
    stateless = not (case.entry[0].isupper() or case.entry == "_create_output")
    if stateless:
        if not isinstance(result, specdec_np.VerificationResult):
            return [f"returned {type(result).__name__}, not a VerificationResult"]
        output = result.output_token_ids
    else:
        output = result
    if type(output) is not np.ndarray:
        return [f"output is a {type(output).__name__}, not a numpy.ndarray"]
    if output.dtype != np.int64:
        return [f"output dtype is {output.dtype}, not int64"]
    draft = as_numpy(case.args["draft_token_ids"])
    bonus = as_numpy(case.args["bonus_token_ids"])
    if draft is None or bonus is None or draft.ndim != 2:
        return ["returned although draft_token_ids or bonus_token_ids is not an array [B, k]"]
    batch, k = draft.shape
    if output.shape != (batch, k + 1):
        return [f"output shape {output.shape}, expected {(batch, k + 1)}"]
    vocab = vocabulary_limit(case)
    problems = []
    if vocab is None:
        problems.append("returned although the vocabulary size is not an integer")
        vocab = INT64_MAX
    if output.size and (output.min() < -1 or output.max() >= vocab):
        problems.append(f"id outside [-1, {vocab}): min {output.min()}, max {output.max()}")
    emitted = (output != -1).sum(axis=1)
    bonus = bonus.reshape(-1)
    for b in range(batch):
        m = int(emitted[b])
        row = output[b]
        if m < 1 or not (row[:m] != -1).all() or not (row[m:] == -1).all():
            problems.append(f"row {b} is not an emitted prefix followed by -1: {row.tolist()}")
            continue
        r = m - 1
        if not np.array_equal(row[:r], draft[b, :r].astype(np.int64)):
            problems.append(f"row {b}: accepted prefix {row[:r].tolist()} is not the drafts")
        if r == k and row[k] != bonus[b]:
            problems.append(f"row {b}: all drafts accepted but last id {row[k]} != bonus")
    generator = case.args.get("generator")
    if isinstance(generator, WeirdGenerator) and generator.mismatch is not None:
        requested, shape = generator.mismatch
        if not case.args.get("seeded_seqs") and not case.args.get("counter_seeds"):
            # Nothing between the generator and the kernel checked the shape: the kernel
            # (bounds checks off) read uniforms[b, i] for every row from a smaller array.
            problems.append(
                f"returned after generator.random({requested}) gave shape {shape}: the "
                "kernel read uniforms outside the generator's array"
            )
    if problems:
        return problems
    r = emitted - 1
    if case.group == "output":
        accepted = as_numpy(case.args["accepted"])
        substitute = as_numpy(case.args["substitute_token_ids"])
        if accepted is not None and accepted.dtype == np.bool_:
            first_false = np.where(accepted.all(axis=1), k, (~accepted).argmax(axis=1))
            if not np.array_equal(first_false, r):
                problems.append(f"accepted lengths {r.tolist()} != {first_false.tolist()}")
            elif substitute is not None:
                for b in np.flatnonzero(r < k):
                    if output[b, r[b]] != substitute[b, r[b]]:
                        problems.append(f"row {b}: emitted id is not the substitute id")
    if stateless:
        lengths, passed = result.accepted_lengths, result.num_accepted
        if not np.array_equal(lengths, r) or lengths.dtype != np.int64:
            problems.append(f"accepted_lengths {lengths!r} != {r.tolist()}")
        if passed.shape != (batch,) or (passed < r).any() or (passed > k).any():
            problems.append(f"num_accepted {passed!r} outside [accepted_lengths, k]")
        if ((r == k) & (passed != k)).any():
            problems.append(f"num_accepted {passed!r} != k in a fully accepted row")
    return problems


def generator_states(case: Case, sampler: Any) -> list[tuple[str, Any, Any]]:
    """(name, bit generator, state) of every NumPy generator the call may consume."""
    found: list[tuple[str, Any, Any]] = []
    if sampler is not None and hasattr(sampler, "_generator"):
        found.append(("sampler._generator", sampler._generator.bit_generator, None))
    generator = case.args.get("generator")
    if isinstance(generator, np.random.Generator):
        found.append(("generator", generator.bit_generator, None))
    seeded = case.args.get("seeded_seqs")
    if isinstance(seeded, dict):
        for row, value in seeded.items():
            if isinstance(value, np.random.Generator):
                found.append((f"seeded_seqs[{row!r}]", value.bit_generator, None))
    return [(name, bit, bit.state) for name, bit, _ in found]


def same_state(a: Any, b: Any) -> bool:
    """Equality of two bit-generator states (dicts that may hold arrays)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[key], b[key]) for key in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return bool(a == b)


def counters(sampler: Any) -> tuple[Any, Any, int]:
    if sampler is None:
        return (None, None, 0)
    accepted, emitted = sampler.num_accepted_tokens, sampler.num_emitted_tokens
    return (
        None if accepted is None else int(accepted),
        None if emitted is None else int(emitted),
        sampler.num_draft_tokens,
    )


def counter_problems(case: Case, output: np.ndarray, before: tuple, after: tuple) -> list[str]:
    """Counters after a successful sampler call, against the output."""
    batch, width = output.shape
    accepted0, emitted0, drafts0 = (0 if v is None else v for v in before)
    accepted1, emitted1, drafts1 = after
    problems = []
    if batch == 0:
        # An empty batch changes no counter and creates none.
        return [] if after == before else [f"an empty batch changed the counters: {after}"]
    if not isinstance(accepted1, int) or not isinstance(emitted1, int):
        return ["counters missing after a successful call"]
    emitted = int((output != -1).sum())
    if emitted1 - emitted0 != emitted:
        problems.append(f"num_emitted_tokens grew by {emitted1 - emitted0}, emitted {emitted}")
    if drafts1 - drafts0 != batch * (width - 1):
        problems.append(f"num_draft_tokens grew by {drafts1 - drafts0}, not B*k")
    lengths = int(emitted - batch)
    if not lengths <= accepted1 - accepted0 <= batch * (width - 1):
        problems.append(f"num_accepted_tokens grew by {accepted1 - accepted0}")
    if case.entry == "_create_output":
        accepted = as_numpy(case.args["accepted"])
        if accepted is not None and accepted1 - accepted0 != int(accepted.sum()):
            problems.append("num_accepted_tokens did not grow by accepted.sum()")
    return problems


def consumed_exactly(bit: Any, state: Any, draws: int) -> bool:
    """Whether a bit generator went from ``state`` to where it is by ``draws`` uniforms."""
    clone = np.random.Generator(type(bit)())
    clone.bit_generator.state = state
    clone.random(draws)
    return same_state(clone.bit_generator.state, bit.state)


def consumption_problems(case: Case, states: list, output: np.ndarray) -> list[str]:
    """A seeded row's generator is consumed by exactly one ``random(k + 1)``."""
    problems = []
    width = output.shape[1]
    for name, bit, state in states:
        if not name.startswith("seeded_seqs") or "uniforms" in case.args:
            continue
        if not consumed_exactly(bit, state, width):
            problems.append(f"{name} was not consumed by exactly one random(k + 1)")
    return problems


def innermost_frame(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{os.path.relpath(frame.filename)}:{frame.lineno}"


@dataclass
class Tally:
    calls: int = 0
    returned: int = 0
    type_error: int = 0
    value_error: int = 0
    failed: int = 0
    known_bug: int = 0
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fail(self, signature: str, case: Case, seed: int, detail: str) -> None:
        self.failed += 1
        if signature not in self.failures and len(self.failures) >= MAX_FAILURES:
            signature = "(more distinct failures)"
        entry = self.failures.setdefault(
            signature,
            {"count": 0, "detail": detail, "case": case.description(seed)},
        )
        entry["count"] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "returned": self.returned,
            "TypeError": self.type_error,
            "ValueError": self.value_error,
            "failed": self.failed,
            "known_bug": self.known_bug,
            "failures": [{"signature": key, **value} for key, value in self.failures.items()],
        }


def run_case(
    case: Case, samplers: Samplers, tally: Tally, seed: int, log: Any, replay: bool = False
) -> str:
    """Make one call and classify it; returns the outcome's name.  A case of a known bug
    is only counted, unless it is replayed alone."""
    log(case)
    tally.calls += 1
    if not replay and known_bug(case) is not None:
        tally.known_bug += 1
        return "known_bug"
    sampler = None
    uses_sampler = case.entry[0].isupper() or case.entry == "_create_output"
    if uses_sampler:
        try:
            sampler = samplers.get(case)
        except (TypeError, ValueError) as error:
            # A fuzzed constructor argument: the constructor is the call.
            return classify_error(case, error, tally, seed)
        except Exception as error:  # any other type is a failure
            tally.fail(
                f"exception {type(error).__name__} at {innermost_frame(error)}",
                case,
                seed,
                f"{type(error).__name__}: {error}",
            )
            return "failed"
    states = generator_states(case, sampler)
    before = counters(sampler)
    try:
        result = invoke(case, samplers, sampler)
    except (TypeError, ValueError) as error:
        changed = [name for name, bit, state in states if not same_state(bit.state, state)]
        if counters(sampler) != before:
            changed.append("counters")
        if changed:
            tally.fail(
                f"state changed by a failed call ({type(error).__name__} at "
                f"{innermost_frame(error)})",
                case,
                seed,
                f"changed: {', '.join(changed)}; {type(error).__name__}: {error}",
            )
            return "failed"
        expected = expectation_problems(case, None, error)
        if expected:
            tally.fail(
                f"{case.family} case of {case.entry}: {case.mutations[0][:60]}",
                case,
                seed,
                "; ".join(expected),
            )
            return "failed"
        return classify_error(case, error, tally, seed)
    except Exception as error:  # any other type is a failure
        tally.fail(
            f"exception {type(error).__name__} at {innermost_frame(error)}",
            case,
            seed,
            f"{type(error).__name__}: {error}",
        )
        return "failed"
    problems, result = host_outputs(case, result)
    if not problems:
        problems = output_problems(case, result)
    if not problems and uses_sampler:
        problems = counter_problems(case, result, before, counters(sampler))
    if not problems and case.group in LAYOUT_GROUPS:
        problems = layout_consumption_problems(case, states, result)
    elif not problems and isinstance(result, np.ndarray | specdec_np.VerificationResult):
        output = result if isinstance(result, np.ndarray) else result.output_token_ids
        problems = consumption_problems(case, states, output)
    if not problems:
        problems = expectation_problems(case, result, None)
    if problems:
        # Numbers (rows, shapes, ids) vary between calls of one bug: not in the signature.
        signature = f"invalid output of {case.entry}: {re.sub(r'-?[0-9]+', 'N', problems[0])[:70]}"
        tally.fail(signature, case, seed, "; ".join(problems))
        return "failed"
    tally.returned += 1
    return "returned"


def classify_error(case: Case, error: Exception, tally: Tally, seed: int) -> str:
    message = str(error)
    raised_by_caller_object = innermost_frame(error).startswith(WORKER_FILE)
    if case.group in LAYOUT_GROUPS:
        # Whole words: "out" must not be found in "outside".
        names_one = any(re.search(rf"\b{name}\b", message) for name in LAYOUT_ARGUMENT_NAMES)
    else:
        names_one = any(name in message for name in ARGUMENT_NAMES)
    if not raised_by_caller_object and not names_one:
        tally.fail(
            f"message names no argument: {type(error).__name__} at {innermost_frame(error)}",
            case,
            seed,
            f"{type(error).__name__}: {message}",
        )
        return "failed"
    if isinstance(error, TypeError):
        tally.type_error += 1
        return "TypeError"
    tally.value_error += 1
    return "ValueError"


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def call_logger(path: str | None, seed: int) -> Callable[[Case], None]:
    """Writes a call's description over the log file before the call (unbuffered)."""
    if path is None:
        return lambda case: None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def log(case: Case) -> None:
        data = (case.description(seed) + "\n").encode("utf-8", "backslashreplace")
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, data)
        os.ftruncate(fd, len(data))

    return log


def self_test_crash(kind: str, path: str | None) -> None:
    """Die the way a kernel bug would, after logging a recognisable call."""
    if path is not None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"self-test crash ({kind})\n")
    if kind == "segv":
        faulthandler._sigsegv()
    os.abort()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="arrays")
    parser.add_argument("--group", choices=GROUPS, default="rejection")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--only", type=int, help="replay one case and print it")
    parser.add_argument("--log", help="file that holds the description of the running call")
    parser.add_argument("--self-test-crash", nargs="?", const="abort", choices=("abort", "segv"))
    options = parser.parse_args(argv)
    faulthandler.enable()
    # Warnings (complex casts, array_api_strict dtype comparisons) are not outcomes.
    warnings.simplefilter("ignore")
    if options.self_test_crash:
        self_test_crash(options.self_test_crash, options.log)
    log = call_logger(options.log, options.seed)
    samplers = Samplers(options.seed)
    tally = Tally()
    if options.only is not None:
        case = make_case(options.seed, options.family, options.group, options.only)
        print(case.description(options.seed))
        reason = known_bug(case)
        if reason is not None:
            print(f"known bug: {reason}")
        sys.stdout.flush()  # before a call that may crash
        outcome = run_case(case, samplers, tally, options.seed, log, replay=True)
        print("outcome:", outcome)
        for failure in tally.failures.values():
            print(failure["detail"])
        print(json.dumps(tally.summary(), default=str))
        return 0
    with np.errstate(all="ignore"):
        for index in range(options.start, options.start + options.calls):
            case = make_case(options.seed, options.family, options.group, index)
            run_case(case, samplers, tally, options.seed, log)
    sys.stdout.write(json.dumps(tally.summary(), default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
