"""CUDA kernels of the CuPy backend: the kernel files, their compilation and their launches.

The CUDA C++ sources are files beside this module, read the way ``cupyx`` reads its kernel
files: one ``.cu`` per kernel family in ``specdec_np/_kernels/src/cuda/``
(``chain_driver.cu``, ``tree_driver.cu``, ``output_formatting.cu``, ``processed_rows.cu``,
``shard_passes.cu``)
and ``.cuh`` headers by concept (the block and its shared memory, block reductions and row
visits, the processed law of a logits row, the inverse-CDF draw, a request's row readers,
the registry's chain row functors and tree
steps).  Every per-element formula they compute (the float32 exponential, the keys of ``z``,
the weights, the law's entries, the residual weight and update, the entropy term, the radix
select's and the draw's decisions, ...) comes from
``specdec_np/_kernels/src/common/elementwise.h``, the header
that the CPU kernels include too, so that both backends run the same code.

:func:`cuda_sources` joins each ``.cu`` file with the files it includes (``#include "name"``,
searched in ``src/cuda/`` then ``src/common/``; each file once per source), so that
the text handed to :class:`cupy.RawModule` is complete: the compile cache is keyed on all of
it, and NVRTC needs no include path (the shared header guards its system includes).  Only
three included parts are generated here, from the contract and the registry:

* ``generated/contract.cuh``: the constants of ``specdec_np/_runtime/contract.py`` as macros
  and the launch constants (:data:`BLOCK_SIZE`, :data:`CREATE_OUTPUT_BLOCK`);
* ``generated/chain_rows.cuh``: per registry verifier code, whether it reads uniforms and
  whether a lazy bonus is its row's argmax (tables), each row functor's code, and
  ``MixedRow``, a switch over the registry's ``cuda_row`` functors by ``Verifier.code``;
* ``generated/tree_walks.cuh``: per registry tree-method code whether the walk is
  stochastic, and ``tree_step``, a switch over the registry's ``cuda_walk`` steps by
  ``TreeMethod.code``.

A code outside the registry is never walked as some other method: the kernels report it as
``specdec_np._runtime.contract.STATUS_BAD_METHOD``.  Each source is compiled with
``cupy.RawModule`` (NVRTC,
``--std=c++17 --fmad=false``: no product is fused with a sum, so every operation rounds as
the CPU's) the first time one of its kernels is needed on a device, and cached per
``(device id, source)``.  Every kernel is a template, instantiated through
``name_expressions`` for ``float``/``double`` rows and ``int``/``long long`` token ids (see
:func:`instantiation_names`).

This module never imports CuPy at import time: every function that needs it imports it
lazily, so ``import specdec_np._kernels.cuda`` works (and :func:`cuda_sources` can be compiled with
``nvcc`` by the test-suite) on a machine without CuPy.

Kernels
-------
``verify_chains_kernel<Row, ProbT, IdT>`` (``chain_driver.cu``) is the chain driver of
``specdec_np._core``: one thread block of :data:`BLOCK_SIZE` threads per request (grid
``B``) reads the request's draft offsets, checks its token ids against ``V``, runs
``Row::run`` (the verifier's row functor) and writes the output row, the per-request
statistics and ``row_status`` exactly where and as the CPU driver does (``0``; ``1 + column``
for an id outside ``[0, V)``, column ``k_b`` being the bonus id; ``-(1 + r)`` for a draw at
position ``r`` from a target row without mass).  The engine layout's options are arguments
of the same kernel, as they are of the CPU driver: ``request_methods`` (then ``Row`` is
``MixedRow``), ``causal``, ``draw_bonus`` and ``sampling`` (the rows are logits, read
through the processed law of ``logits_law.h``, computed by the block in the CPU's order; a row
scanned whole is materialised into the request's two scratch rows of one per-call
``[B, 2 V]`` buffer).  ``docs/semantics.md`` says where a real device can differ.

``verify_trees_kernel<ProbT, IdT>`` (``tree_driver.cu``) is the tree driver's
(``_core.verify_trees``): one block per request walks its tree, from the root reading only
the rows on the walked path and the children tested there (traversal: what its post-order
visits), with the float64 working rows of one ``[B, R V]`` buffer per call (``R`` the
method's ``TreeMethod.working_rows``: a pair, or one per level for traversal); its row
status is the CPU tree driver's.

``shard_stats_kernel<ProbT>`` and the other kernels of ``shard_passes.cu`` are a rank's
passes in verification across vocabulary shards on device rows (``specdec_np._sharded``):
the twins of ``specdec_np/_kernels/src/cpu/shardscan.h``, launched by
:mod:`specdec_np._kernels.cuda_shard_passes` with ``_core``'s ``shard_*`` calling convention
(the rows on the device, the per-row numbers on the host).

``create_output_kernel<IdT>`` (``output_formatting.cu``, vLLM's ``_create_output``) runs one
thread per row, :data:`CREATE_OUTPUT_BLOCK` threads per block.

:data:`core_like` exposes them with ``specdec_np._core``'s calling convention; its kernels
return None instead of the first failed row, which the caller reads from ``row_status``
(``specdec_np._runtime.arrays.first_failed_row``: the one host synchronisation of a call).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import registry
from .._runtime import contract as _contract

__all__ = [
    "BLOCK_SIZE",
    "CREATE_OUTPUT_BLOCK",
    "KERNEL_DIR",
    "SOURCE_NAMES",
    "core_like",
    "cuda_sources",
    "instantiation_names",
]

#: Threads per block of ``verify_chains_kernel`` and ``verify_trees_kernel`` (one block per
#: request).
BLOCK_SIZE = 512
#: Threads per block of ``create_output_kernel`` (one thread per row).
CREATE_OUTPUT_BLOCK = 256

#: The folder of the CUDA files (``.cu`` and ``.cuh``).
KERNEL_DIR = Path(__file__).resolve().parent / "src" / "cuda"
#: The CUDA sources, one ``KERNEL_DIR / f"{name}.cu"`` each.
SOURCE_NAMES = (
    "output_formatting", "processed_rows", "chain_driver", "tree_driver", "shard_passes"
)
# Where an ``#include "name"`` of a kernel file is looked for, in order: the kernel files,
# then the package's C headers (the shared per-element header).
_INCLUDE_DIRS = (KERNEL_DIR, KERNEL_DIR.parent / "common")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)

# --fmad=false: no multiply-add is contracted, so the arithmetic of the shared header rounds
# on the device as it does on the CPU.
_COMPILE_OPTIONS = ("--std=c++17", "--fmad=false")
_PROB_CTYPES: dict[str, str] = {"float32": "float", "float64": "double"}
_ID_CTYPES: dict[str, str] = {"int32": "int", "int64": "long long"}

# ---------------------------------------------------------------------------------------------
# The generated parts: the contract and the registry, written into the sources
# ---------------------------------------------------------------------------------------------

#: The row functor of a batch with per-request methods (``request_methods``).
MIXED_ROW = "MixedRow"


def _c_bool(flag: bool) -> str:
    return "true" if flag else "false"


def _contract_prelude() -> str:
    """``generated/contract.cuh``: the contract's macros and the launch constants."""
    macros = [f"#define {name} {value}" for name, value in _contract.compile_time_macros()]
    # -2**63 has no literal of its own in C++: write it as INT64_MIN is usually written.
    bad_method = f"({_contract.STATUS_BAD_METHOD + 1}LL - 1)"
    lines = [
        "// Generated by specdec_np/_kernels/cuda.py: the kernel contract",
        "// (specdec_np/_runtime/contract.py)",
        "// and the launch constants.",
        *macros,
        "namespace specdec {",
        "// Not every source uses every constant, hence [[maybe_unused]].",
        f"[[maybe_unused]] constexpr int kBlock = {BLOCK_SIZE};",
        f"[[maybe_unused]] constexpr int kRowsPerBlock = {CREATE_OUTPUT_BLOCK};",
        "[[maybe_unused]] constexpr double kGreedyMargin = SPECDEC_GREEDY_MARGIN;",
        f"[[maybe_unused]] constexpr long long kStatusBadMethod = {bad_method};",
        '[[maybe_unused]] constexpr long long kNone = 0x7fffffffffffffffLL;  // "no index"',
        "}  // namespace specdec",
    ]
    return "\n".join(lines) + "\n"


def _switch(subject: str, cases: list[tuple[int, str]], indent: str) -> str:
    """A C++ switch of ``return`` statements, one ``case code: return call;`` per case."""
    lines = [f"{indent}switch ({subject}) {{"]
    for code, call in cases:
        lines += [f"{indent}case {code}:", f"{indent}    return {call};"]
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _chain_rows_generated() -> str:
    """``generated/chain_rows.cuh``: what the skeleton knows of each registry verifier, by
    code, and ``MixedRow``."""
    verifiers = registry.VERIFIERS
    names = ", ".join(verifier.name for verifier in verifiers)
    reads = ", ".join(_c_bool(verifier.stochastic) for verifier in verifiers)
    argmax = ", ".join(_c_bool(verifier.bonus_by_argmax) for verifier in verifiers)
    rows = [(verifier.cuda_row, verifier.code) for verifier in verifiers] + [(MIXED_ROW, -1)]
    codes = [
        f"template <>\nstruct VerifierCode<{row}> {{\n"
        f"    static constexpr int value = {code};\n}};"
        for row, code in rows
    ]
    cases = [(verifier.code, f"{verifier.cuda_row}::run(a, s)") for verifier in verifiers]
    lines = [
        "// Generated by specdec_np/_kernels/cuda.py from specdec_np/registry.py:",
        "// the chain verifiers",
        "// by registry code.",
        "namespace specdec {",
        f"constexpr int kVerifiers = {len(verifiers)};",
        f"// By code ({names}):",
        "// the verifier reads uniforms (Verifier.stochastic), and a lazy bonus is the argmax",
        "// of the raw bonus row (Verifier.bonus_by_argmax).",
        f"__device__ constexpr bool kReadsUniforms[kVerifiers] = {{{reads}}};",
        f"__device__ constexpr bool kBonusByArgmax[kVerifiers] = {{{argmax}}};",
        "}  // namespace specdec",
        "",
        "// The registry code of a row functor; -1 for MixedRow, whose requests carry theirs.",
        "template <class Row>",
        "struct VerifierCode;",
        f"struct {MIXED_ROW};",
        *codes,
        "",
        "// One request's row functor, chosen by its registry code (a per-request method).",
        f"struct {MIXED_ROW} {{",
        "    template <typename ProbT, typename IdT>",
        "    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,",
        "                                             specdec::Scratch& s) {",
        _switch("a.method", cases, " " * 8),
        "        // The skeleton checks the code before it calls run.",
        "        return specdec::RowResult{-1, 0, 0, specdec::kStatusBadMethod};",
        "    }",
        "};",
    ]
    return "\n".join(lines) + "\n"


def _tree_walks_generated() -> str:
    """``generated/tree_walks.cuh``: the registry's tree steps by code."""
    methods = registry.TREE_METHODS
    names = ", ".join(method.name for method in methods)
    stochastic = ", ".join(_c_bool(method.stochastic) for method in methods)
    sequence_level = ", ".join(_c_bool(method.sequence_level) for method in methods)
    cases = [
        (method.code, f"{method.cuda_walk}::step(a, node, final_token, s)") for method in methods
    ]
    lines = [
        "// Generated by specdec_np/_kernels/cuda.py from specdec_np/registry.py:",
        "// the tree methods by",
        "// registry code.",
        "namespace specdec {",
        f"constexpr int kTreeMethods = {len(methods)};",
        f"// By code ({names}):",
        "// the walk reads uniforms and working rows (TreeMethod.stochastic).",
        f"__device__ constexpr bool kWalkReadsUniforms[kTreeMethods] = {{{stochastic}}};",
        "// the walk keeps a residual per level (TreeMethod.sequence_level, working_rows).",
        f"__device__ constexpr bool kWalkSequenceLevel[kTreeMethods] = {{{sequence_level}}};",
        "",
        "// One step of a request's walk by the registry's cuda_walk of its method code.",
        "template <typename ProbT, typename IdT>",
        "__device__ long long tree_step(int walk, const TreeArgs<ProbT, IdT>& a, long long node,",
        "                               long long& final_token, Scratch& s) {",
        _switch("walk", cases, " " * 4),
        "    return kStepBadMethod;",
        "}",
        "}  // namespace specdec",
    ]
    return "\n".join(lines) + "\n"


_GENERATED = {
    "generated/contract.cuh": _contract_prelude,
    "generated/chain_rows.cuh": _chain_rows_generated,
    "generated/tree_walks.cuh": _tree_walks_generated,
}

# ---------------------------------------------------------------------------------------------
# The sources: each .cu file with the files it includes
# ---------------------------------------------------------------------------------------------


def _included_text(name: str) -> str:
    """The text of an included file: a generated part, or the first file of that name in
    :data:`_INCLUDE_DIRS`."""
    if name in _GENERATED:
        return _GENERATED[name]()
    for folder in _INCLUDE_DIRS:
        path = folder / name
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(
        f"CUDA include {name!r}: not generated and not found in "
        f"{[str(folder) for folder in _INCLUDE_DIRS]}"
    )


def _expand(text: str, seen: set[str]) -> str:
    """``text`` with every ``#include "name"`` replaced by the file's own expansion, or by
    nothing when ``seen`` already holds it (each file once, as ``#pragma once`` would)."""

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return f'// (#include "{name}": already included)'
        seen.add(name)
        body = _expand(_included_text(name), seen).rstrip("\n")
        return f"// ---- begin {name} ----\n{body}\n// ---- end {name} ----"

    return _INCLUDE.sub(include, text)


_SOURCE_CACHE: dict[str, str] = {}


def _sources() -> dict[str, str]:
    """The CUDA sources by name, read and joined once (and published whole, so that a
    concurrent first call never sees a part of them)."""
    if not _SOURCE_CACHE:
        joined = {
            name: _expand((KERNEL_DIR / f"{name}.cu").read_text(), set()) for name in SOURCE_NAMES
        }
        _SOURCE_CACHE.update(joined)
    return _SOURCE_CACHE


def _verify_name(cuda_row: str, prob_dtype: Any, id_dtype: Any) -> str:
    prob = _PROB_CTYPES[np.dtype(prob_dtype).name]
    return f"verify_chains_kernel<{cuda_row}, {prob}, {_ID_CTYPES[np.dtype(id_dtype).name]}>"


def _tree_name(prob_dtype: Any, id_dtype: Any) -> str:
    prob = _PROB_CTYPES[np.dtype(prob_dtype).name]
    return f"verify_trees_kernel<{prob}, {_ID_CTYPES[np.dtype(id_dtype).name]}>"


def _create_output_name(id_dtype: Any) -> str:
    return f"create_output_kernel<{_ID_CTYPES[np.dtype(id_dtype).name]}>"


def _processed_rows_name(prob_dtype: Any) -> str:
    return f"processed_rows_kernel<{_PROB_CTYPES[np.dtype(prob_dtype).name]}>"


def cuda_sources() -> dict[str, str]:
    """Return every CUDA source compiled by this module.

    Returns
    -------
    dict of str to str
        Source name (:data:`SOURCE_NAMES`: ``"output_formatting"``, ``"processed_rows"``,
        ``"chain_driver"``, ``"tree_driver"``, ``"shard_passes"``) to the full CUDA C++ text
        handed
        to
        :class:`cupy.RawModule`: ``KERNEL_DIR / f"{name}.cu"`` with its includes expanded
        (the kernel files, the shared header
        ``specdec_np/_kernels/src/common/elementwise.h`` and the
        generated parts).  Each text
        compiles on its own, with no include path.
    """
    return dict(_sources())


def instantiation_names(source: str | None = None) -> list[str]:
    """Return the kernel name expressions (template instantiations) compiled for a source.

    Parameters
    ----------
    source : str, optional
        A key of :func:`cuda_sources`. ``None`` (default) lists the names of every source.

    Returns
    -------
    list of str
        Name expressions such as ``"verify_chains_kernel<RejectionRow, float, long long>"``
        (one per registry verifier, probability and id dtype) and
        ``"verify_trees_kernel<float, int>"`` (one per probability and id dtype), exactly as
        passed to ``cupy.RawModule(name_expressions=...)`` and to ``get_function``.

    Raises
    ------
    KeyError
        If ``source`` is not a source name.
    """
    if source is not None and source not in SOURCE_NAMES:
        raise KeyError(f"unknown CUDA source {source!r}; expected one of {list(SOURCE_NAMES)}")
    names: list[str] = []
    if source in (None, "output_formatting"):
        names.extend(_create_output_name(id_dtype) for id_dtype in _ID_CTYPES)
    if source in (None, "processed_rows"):
        names.extend(_processed_rows_name(prob_dtype) for prob_dtype in _PROB_CTYPES)
    if source in (None, "chain_driver"):
        rows = [verifier.cuda_row for verifier in registry.VERIFIERS] + [MIXED_ROW]
        names.extend(
            _verify_name(row, prob_dtype, id_dtype)
            for row in rows
            for prob_dtype in _PROB_CTYPES
            for id_dtype in _ID_CTYPES
        )
    if source in (None, "tree_driver"):
        names.extend(
            _tree_name(prob_dtype, id_dtype)
            for prob_dtype in _PROB_CTYPES
            for id_dtype in _ID_CTYPES
        )
    if source in (None, "shard_passes"):
        names.extend(f"{kernel}<{prob}>" for kernel in _SHARD_TEMPLATES
                     for prob in _PROB_CTYPES.values())
        names.extend(_SHARD_FLOAT64_KERNELS)
    return names


# ---------------------------------------------------------------------------------------------
# Compilation cache
# ---------------------------------------------------------------------------------------------

_MODULES: dict[tuple[int, str], Any] = {}
_MODULES_LOCK = threading.Lock()


def _kernel(source: str, name_expression: str) -> Any:
    """The compiled kernel ``name_expression`` of ``source`` on the current device; the
    source's ``RawModule`` is compiled once per device."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), source)
    module = _MODULES.get(key)
    if module is None:
        with _MODULES_LOCK:
            module = _MODULES.get(key)
            if module is None:
                module = cupy.RawModule(
                    code=_sources()[source],
                    options=_COMPILE_OPTIONS,
                    name_expressions=instantiation_names(source),
                )
                _MODULES[key] = module
    return module.get_function(name_expression)


# ---------------------------------------------------------------------------------------------
# Memory guards: O(1) checks of what a kernel's indexing relies on (dtypes, contiguity, shapes
# consistent with each other, one device). The values were validated by the Python layer.
# ---------------------------------------------------------------------------------------------


def _guard(array: Any, name: str, dtypes: tuple[str, ...], shape: tuple[int | None, ...]) -> None:
    """``array`` has one of ``dtypes``, is C-contiguous and has ``shape`` (None: any size)."""
    found = tuple(int(n) for n in array.shape)
    if len(found) != len(shape) or any(s is not None and s != n for s, n in zip(shape, found)):
        expected = tuple("any" if s is None else s for s in shape)
        raise ValueError(f"{name}: expected shape {expected}, found {found}")
    if np.dtype(array.dtype).name not in dtypes:
        raise TypeError(f"{name}: expected dtype in {dtypes}, found {array.dtype}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")


_OUTPUT_NAMES = ("output", "accepted_lengths", "num_accepted", "row_status")
#: The chain kernel's arguments of the target rows' sampling-surface settings (the draft
#: rows' are named alike, ``draft_`` for ``target_``).
_ADJUST_NAMES = ("target_mask", "target_entry_offsets", "target_entry_ids",
                 "target_entry_values")


def _guard_outputs(batch: int, width: int | None, buffers: tuple[Any, Any, Any, Any]) -> None:
    for name, array in zip(_OUTPUT_NAMES, buffers):
        _guard(array, name, ("int64",), (batch, width) if name == "output" else (batch,))


def _guard_sampling(batch: int, vocab: int, dtype: Any, sampling: Any, scratch: Any) -> None:
    """With logits rows, ``sampling`` is float64 ``[B, 5]`` and ``scratch`` the rows' dtype
    ``[B, 2 V]`` (a request's processed target and draft row)."""
    if sampling is None:
        return
    _guard(sampling, "sampling", ("float64",), (batch, _contract.SAMPLING_COLUMNS))
    if scratch is None:
        raise ValueError("scratch: expected a [B, 2 V] array with sampling, found None")
    _guard(scratch, "scratch", (np.dtype(dtype).name,), (batch, 2 * vocab))


def _guard_adjustments(
    name: str, adjustments: Any, rows: int, vocab: int, dtype: Any
) -> tuple[Any, Any, Any, Any]:
    """The sampling surface's settings of one rows array, ``(bitmask, offsets, ids,
    values)`` as ``_core.verify_chains_direct`` takes them (None: none): bitmask int32
    ``[rows, ceil(V / 32)]`` or None, offsets int64 ``[rows + 1]`` or None, ids int64
    ``[E]``, values ``[E]`` in the rows' dtype."""
    if adjustments is None:
        return (None, None, None, None)
    if not isinstance(adjustments, tuple) or len(adjustments) != 4:
        raise ValueError(f"{name}: expected (bitmask, offsets, ids, values)")
    bitmask, offsets, ids, values = adjustments
    if bitmask is not None:
        _guard(bitmask, f"{name} bitmask", ("int32",), (rows, -(-vocab // 32)))
    if offsets is None:
        return (bitmask, None, None, None)
    if ids is None or values is None:
        raise ValueError(f"{name}: expected ids and values with offsets, found None")
    _guard(offsets, f"{name} offsets", ("int64",), (rows + 1,))
    _guard(ids, f"{name} ids", ("int64",), (None,))
    _guard(values, f"{name} values", (np.dtype(dtype).name,), (int(ids.shape[0]),))
    return (bitmask, offsets, ids, values)


def _adjust_arguments(
    batch: int,
    vocab: int,
    dtype: Any,
    target_count: int,
    draft_count: int,
    target_adjustments: Any,
    draft_adjustments: Any,
    adjusted_rows: Any,
) -> dict[str, Any]:
    """The kernels' sampling-surface arguments, by name, from the launcher's options (the
    target rows' ``target_count`` and the draft rows' ``draft_count`` rows; nullptr for
    what is absent, ``adjusted_rows`` ``[B, 2 V]`` required with any setting)."""
    target = _guard_adjustments("target_adjustments", target_adjustments, target_count,
                                vocab, dtype)
    draft = _guard_adjustments("draft_adjustments", draft_adjustments, draft_count, vocab,
                               dtype)
    adjusts = any(part is not None for part in (*target, *draft))
    if adjusts:
        if adjusted_rows is None:
            raise ValueError(
                "adjusted_rows: expected a [B, 2 V] array with adjustments, found None"
            )
        _guard(adjusted_rows, "adjusted_rows", (np.dtype(dtype).name,), (batch, 2 * vocab))
    return {
        **dict(zip(_ADJUST_NAMES, target)),
        **{f"draft_{name[7:]}": part for name, part in zip(_ADJUST_NAMES, draft)},
        "mask_words": np.int64(-(-vocab // 32)),
        "adjusted": adjusted_rows if adjusts else None,
    }


def _launch(source: str, name: str, grid: int, block: int, arguments: dict[str, Any]) -> None:
    """Launch kernel ``name`` of ``source`` with ``arguments`` (the kernel's parameters, by
    name, in order) on the device of its arrays, after checking that they share one (O(1),
    no synchronisation; ``None`` is a null pointer)."""
    arrays = {
        key: value
        for key, value in arguments.items()
        if value is not None and not isinstance(value, np.generic)
    }
    devices = {key: array.device.id for key, array in arrays.items()}
    if len(set(devices.values())) > 1:
        found = ", ".join(f"{key} on device {device}" for key, device in devices.items())
        raise ValueError(f"expected every array on one CUDA device, found {found}")
    with next(iter(arrays.values())).device:
        _kernel(source, name)((grid,), (block,), tuple(arguments.values()))


def _registry_entry(entries: tuple[Any, ...], method: int, kind: str) -> Any:
    """The entry of ``entries`` (:data:`registry.VERIFIERS` or :data:`registry.TREE_METHODS`)
    whose code is ``method``, the number the kernels of both backends dispatch on."""
    if not 0 <= method < len(entries):
        raise ValueError(
            f"method: expected a registry {kind} code (0 .. {len(entries) - 1}), found {method}"
        )
    return entries[method]


# ---------------------------------------------------------------------------------------------
# The launch surface: specdec_np._core's calling convention on CuPy arrays
# ---------------------------------------------------------------------------------------------


class _CoreLikeKernels:
    """The kernels behind the signatures of ``specdec_np/_core.pyi``, on CuPy arrays.

    The caller allocates every output; the kernels write them as ``_core``'s do, ``row_status``
    included.  ``num_threads`` is accepted and ignored.  Asynchronous: nothing here waits for
    the device, and the kernels return None (reading ``row_status`` is the caller's one
    synchronisation).
    """

    @staticmethod
    def verify_chains(
        method: int,
        target_rows: Any,
        draft_rows: Any,
        point_mass_drafts: bool,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_offsets: Any,
        uniforms: Any,
        parameters: Any,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
        num_threads: int = 1,
        request_methods: Any = None,
        causal: bool = False,
        draw_bonus: bool = False,
        sampling: Any = None,
        scratch: Any = None,
        target_logits: bool = True,
        draft_logits: bool = True,
        bonus_rows: bool = True,
        target_adjustments: Any = None,
        draft_adjustments: Any = None,
        adjusted_rows: Any = None,
    ) -> None:
        """Verify a batch of draft chains (``_core.verify_chains``'s signature and meaning).

        Launches ``verify_chains_kernel<Row, ProbT, IdT>`` for the registry verifier whose
        code is ``method`` (``MixedRow`` when ``request_methods`` is given): grid ``B``,
        :data:`BLOCK_SIZE` threads.  Offsets are used as given, clamped on the device to the
        arrays (and ``k_b`` to the output and uniform widths).  The engine options are
        ``_core.verify_chains``'s, except that ``scratch`` is float ``[B, 2 V]`` (one pair of
        processed rows per request, not per thread) and that the values of
        ``request_methods`` are trusted (the engine layout writes them; a code outside the
        registry gets row status ``specdec_np._runtime.contract.STATUS_BAD_METHOD``).
        The sampling surface's ``target_adjustments`` and ``draft_adjustments``
        (:meth:`specdec_np._layouts.row_adjustments.RowAdjustments.kernel_arguments`, on the
        device; applied to logits rows where they are read) are ``_core``'s too, and
        ``adjusted_rows`` is then ``[B, 2 V]`` in the rows' dtype (a request's adjusted
        target and draft row).  The bitmasks must agree on their words per row.
        """
        verifier = _registry_entry(registry.VERIFIERS, method, "verifier")
        batch = int(bonus_token_ids.shape[0]) if bonus_token_ids.ndim == 1 else -1
        _guard(bonus_token_ids, "bonus_token_ids", tuple(_ID_CTYPES), (batch,))
        num_drafts = int(draft_token_ids.shape[0]) if draft_token_ids.ndim == 1 else -1
        _guard(
            draft_token_ids, "draft_token_ids", (np.dtype(bonus_token_ids.dtype).name,), (None,)
        )
        rows = num_drafts + (batch if bonus_rows else 0)
        _guard(target_rows, "target_rows", tuple(_PROB_CTYPES), (rows, None))
        if draw_bonus and not bonus_rows:
            raise ValueError("draw_bonus: a drawn bonus needs the bonus rows (bonus_rows)")
        vocab = int(target_rows.shape[1])
        if vocab < 1:
            raise ValueError("target_rows: expected a non-empty vocabulary, found V = 0")
        draft = None if point_mass_drafts else draft_rows
        if draft is not None:
            dtype = (np.dtype(target_rows.dtype).name,)
            _guard(draft, "draft_rows", dtype, (num_drafts, vocab))
        _guard(draft_offsets, "draft_offsets", ("int64",), (batch + 1,))
        if request_methods is not None:
            _guard(request_methods, "request_methods", ("int8",), (batch,))
        draws = verifier.stochastic or draw_bonus or request_methods is not None
        _guard(uniforms, "uniforms", ("float64",), (batch if draws else None, None))
        least = int(verifier.stochastic or request_methods is not None) + int(bool(draw_bonus))
        if draws and int(uniforms.shape[1]) < least:
            raise ValueError(
                f"uniforms: expected at least {least} column(s), found {int(uniforms.shape[1])}"
            )
        _guard(parameters, "parameters", ("float64",), (None,))
        if int(parameters.shape[0]) < len(verifier.parameters):
            raise ValueError(
                f"parameters: expected {len(verifier.parameters)} for {verifier.name}, "
                f"found {int(parameters.shape[0])}"
            )
        _guard_sampling(batch, vocab, target_rows.dtype, sampling, scratch)
        adjust = _adjust_arguments(
            batch, vocab, target_rows.dtype, rows, num_drafts, target_adjustments,
            None if draft is None else draft_adjustments, adjusted_rows,
        )
        buffers = (output, accepted_lengths, num_accepted, row_status)
        _guard_outputs(batch, None, buffers)
        width = int(output.shape[1])
        if width < 1:
            raise ValueError("output: expected at least one column, found 0")
        if batch == 0:
            return
        arguments = {
            "target_rows": target_rows,
            "draft_rows": draft,
            "draft_token_ids": draft_token_ids,
            "bonus_token_ids": bonus_token_ids,
            "draft_offsets": draft_offsets,
            "uniforms": uniforms,
            "uniform_width": np.int64(uniforms.shape[1]),
            "parameters": parameters,
            "batch": np.int64(batch),
            "num_drafts": np.int64(num_drafts),
            "vocab": np.int64(vocab),
            "width": np.int64(width),
            **dict(zip(_OUTPUT_NAMES, buffers)),
            "request_methods": request_methods,
            "causal": np.int64(bool(causal)),
            "draw_bonus": np.int64(bool(draw_bonus)),
            "sampling": sampling,
            "scratch": scratch if sampling is not None else None,
            "target_logits": np.int64(bool(target_logits)),
            "draft_logits": np.int64(bool(draft_logits)),
            "bonus_rows": np.int64(bool(bonus_rows)),
            **adjust,
        }
        row = MIXED_ROW if request_methods is not None else verifier.cuda_row
        name = _verify_name(row, target_rows.dtype, draft_token_ids.dtype)
        _launch("chain_driver", name, batch, BLOCK_SIZE, arguments)

    @staticmethod
    def create_output(
        accepted: Any,
        substitute_token_ids: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        vocab_size: int,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
    ) -> None:
        """``_create_output`` into caller buffers (``_core.create_output``'s signature), ids
        checked against ``vocab_size``.  One thread per row, :data:`CREATE_OUTPUT_BLOCK`
        threads per block."""
        batch = int(accepted.shape[0]) if accepted.ndim == 2 else -1
        k = int(accepted.shape[1]) if accepted.ndim == 2 else -1
        _guard(accepted, "accepted", ("bool", "uint8"), (batch, k))
        _guard(draft_token_ids, "draft_token_ids", tuple(_ID_CTYPES), (batch, k))
        same = (np.dtype(draft_token_ids.dtype).name,)
        _guard(substitute_token_ids, "substitute_token_ids", same, (batch, k))
        _guard(bonus_token_ids, "bonus_token_ids", same, (batch,))
        buffers = (output, accepted_lengths, num_accepted, row_status)
        _guard_outputs(batch, k + 1, buffers)
        if vocab_size < 0:
            raise ValueError(f"vocab_size: expected a non-negative int, found {vocab_size}")
        if batch == 0:
            return
        arguments = {
            "accepted": accepted,
            "substitute_token_ids": substitute_token_ids,
            "draft_token_ids": draft_token_ids,
            "bonus_token_ids": bonus_token_ids,
            "batch": np.int64(batch),
            "k": np.int64(k),
            "vocab": np.int64(vocab_size),
            **dict(zip(_OUTPUT_NAMES, buffers)),
        }
        grid = (batch + CREATE_OUTPUT_BLOCK - 1) // CREATE_OUTPUT_BLOCK
        name = _create_output_name(draft_token_ids.dtype)
        _launch("output_formatting", name, grid, CREATE_OUTPUT_BLOCK, arguments)

    @staticmethod
    def processed_rows(logits: Any, sampling: Any, out: Any, num_threads: int = 1) -> None:
        """The processed law of logits rows (``_core.processed_rows``'s signature and
        meaning): ``processed_rows_kernel<ProbT>``, grid ``rows``, :data:`BLOCK_SIZE`
        threads, one block per row.  ``num_threads`` is accepted and ignored."""
        rows = int(logits.shape[0]) if logits.ndim == 2 else -1
        _guard(logits, "logits", tuple(_PROB_CTYPES), (rows, None))
        vocab = int(logits.shape[1])
        if vocab < 1:
            raise ValueError("logits: expected a non-empty vocabulary, found V = 0")
        _guard(sampling, "sampling", ("float64",), (rows, _contract.SAMPLING_COLUMNS))
        _guard(out, "out", (np.dtype(logits.dtype).name,), (rows, vocab))
        if rows == 0:
            return
        arguments = {
            "logits": logits,
            "rows": np.int64(rows),
            "vocab": np.int64(vocab),
            "sampling": sampling,
            "out": out,
        }
        name = _processed_rows_name(logits.dtype)
        _launch("processed_rows", name, rows, BLOCK_SIZE, arguments)

    @staticmethod
    def verify_trees(
        method: int,
        target_rows: Any,
        draft_rows: Any,
        point_mass_drafts: bool,
        draft_token_ids: Any,
        tree_parents: Any,
        node_offsets: Any,
        first_child: Any,
        next_sibling: Any,
        next_distinct_sibling: Any,
        repeated_token: Any,
        uniforms: Any,
        accepted_nodes: Any,
        output: Any,
        accepted_lengths: Any,
        row_status: Any,
        num_threads: int = 1,
        request_methods: Any = None,
        sampling: Any = None,
        scratch: Any = None,
        working: Any = None,
        target_logits: bool = True,
        draft_logits: bool = True,
        target_adjustments: Any = None,
        draft_adjustments: Any = None,
        adjusted_rows: Any = None,
    ) -> None:
        """Verify a batch of draft trees (``_core.verify_trees``'s signature and meaning).

        Launches ``verify_trees_kernel<ProbT, IdT>``: grid ``B``, :data:`BLOCK_SIZE` threads,
        one block walking each request with the registry tree method whose code is
        ``method`` (or, with ``request_methods``, its own; those codes are trusted as in
        :meth:`verify_chains`).  ``working`` must be float64 ``[B, R V]`` (a request's
        residual rows, not a thread's: ``R = TreeMethod.working_rows`` of ``method`` at the
        depth of ``accepted_nodes``) whenever a walk is stochastic, and with
        ``sampling`` (logits rows) ``scratch`` must be ``[B, 2 V]`` in the rows' dtype
        (one
        processed target and draft row per request).  Offsets are used as given, clamped on
        the device to the arrays (and ``N_b`` to the uniforms), and the links
        (:func:`specdec_np._layouts.tree_links.tree_links`) likewise: one that does not move
        forward
        inside its request ends its list.  A walk deeper than ``accepted_nodes`` reports
        ``1 + node`` in ``row_status``.  The sampling surface's settings are
        :meth:`verify_chains`'s (``target_adjustments`` of the ``[N + B, V]`` target rows,
        ``draft_adjustments`` of the draft rows, ``adjusted_rows`` ``[B, 2 V]``).

        Raises
        ------
        TypeError
            For arrays of the wrong dtype.
        ValueError
            For an unknown walk, inconsistent shapes or arrays on several devices.
        """
        tree_method = _registry_entry(registry.TREE_METHODS, method, "tree-method")
        batch = int(node_offsets.shape[0]) - 1 if node_offsets.ndim == 1 else -1
        _guard(node_offsets, "node_offsets", ("int64",), (max(batch, 0) + 1,))
        num_nodes = int(draft_token_ids.shape[0]) if draft_token_ids.ndim == 1 else -1
        _guard(draft_token_ids, "draft_token_ids", tuple(_ID_CTYPES), (num_nodes,))
        _guard(tree_parents, "tree_parents", ("int64",), (num_nodes,))
        _guard(first_child, "first_child", ("int64",), (num_nodes + max(batch, 0),))
        _guard(next_sibling, "next_sibling", ("int64",), (num_nodes,))
        _guard(next_distinct_sibling, "next_distinct_sibling", ("int64",), (num_nodes,))
        _guard(repeated_token, "repeated_token", ("int8",), (num_nodes,))
        _guard(target_rows, "target_rows", tuple(_PROB_CTYPES), (num_nodes + batch, None))
        vocab = int(target_rows.shape[1])
        if vocab < 1:
            raise ValueError("target_rows: expected a non-empty vocabulary, found V = 0")
        draft = None if point_mass_drafts else draft_rows
        if draft is not None:
            dtype = (np.dtype(target_rows.dtype).name,)
            _guard(draft, "draft_rows", dtype, (num_nodes, vocab))
        if request_methods is not None:
            _guard(request_methods, "request_methods", ("int8",), (batch,))
        stochastic = tree_method.stochastic or request_methods is not None
        if stochastic:
            _guard(uniforms, "uniforms", ("float64",), (num_nodes + batch,))
        depth = int(accepted_nodes.shape[1]) if accepted_nodes.ndim == 2 else -1
        if stochastic:
            width = tree_method.working_rows(depth) * vocab
            if working is None:
                raise ValueError(f"working: expected float64 [B, {width}] for a stochastic walk")
            _guard(working, "working", ("float64",), (batch, width))
        _guard(accepted_nodes, "accepted_nodes", ("int64",), (batch, depth))
        _guard(output, "output", ("int64",), (batch, depth + 1))
        _guard(accepted_lengths, "accepted_lengths", ("int64",), (batch,))
        _guard(row_status, "row_status", ("int64",), (batch,))
        _guard_sampling(batch, vocab, target_rows.dtype, sampling, scratch)
        adjust = _adjust_arguments(
            batch, vocab, target_rows.dtype, num_nodes + batch, num_nodes,
            target_adjustments, None if draft is None else draft_adjustments, adjusted_rows,
        )
        if batch == 0:
            return
        arguments = {
            "target_rows": target_rows,
            "draft_rows": draft,
            "draft_token_ids": draft_token_ids,
            "tree_parents": tree_parents,
            "node_offsets": node_offsets,
            "first_child": first_child,
            "next_sibling": next_sibling,
            "next_distinct_sibling": next_distinct_sibling,
            "repeated_token": repeated_token,
            "uniforms": uniforms if stochastic else None,
            "uniform_count": np.int64(uniforms.shape[0] if stochastic else 0),
            "request_methods": request_methods,
            "method": np.int64(method),
            "batch": np.int64(batch),
            "num_nodes": np.int64(num_nodes),
            "vocab": np.int64(vocab),
            "depth_width": np.int64(depth),
            "working": working if stochastic else None,
            "accepted_nodes": accepted_nodes,
            "output": output,
            "accepted_lengths": accepted_lengths,
            "row_status": row_status,
            "sampling": sampling,
            "scratch": scratch if sampling is not None else None,
            "target_logits": np.int64(bool(target_logits)),
            "draft_logits": np.int64(bool(draft_logits)),
            **adjust,
        }
        name = _tree_name(target_rows.dtype, draft_token_ids.dtype)
        _launch("tree_driver", name, batch, BLOCK_SIZE, arguments)


#: The kernels with ``specdec_np._core``'s calling convention, so that the chain driver's
#: caller runs on CuPy arrays unchanged.
core_like = _CoreLikeKernels()


#: The kernels of ``shard_passes.cu`` compiled for float and double rows, and those of the
#: draws' float64 rows (launched by :mod:`specdec_np._kernels.cuda_shard_passes`).
_SHARD_TEMPLATES = (
    "shard_stats_kernel", "shard_argmax_kernel", "shard_weights_kernel",
    "shard_at_least_kernel", "shard_exp_kernel", "shard_divided_kernel",
)
_SHARD_FLOAT64_KERNELS = (
    "shard_residuals_kernel", "shard_positive_sums_kernel", "shard_first_crossings_kernel",
)
