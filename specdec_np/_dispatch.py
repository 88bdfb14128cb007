"""Backend dispatch: the kernels' tables, bound once from the registry.

The kernels of both backends dispatch on registry codes (:attr:`Verifier.code`,
:attr:`TreeMethod.code`) and know no verifier by name.  On the CPU, ``_core`` calls
through tables of function pointers indexed by code; this module binds those tables
from :data:`registry.VERIFIERS` and :data:`registry.TREE_METHODS` when it is imported
(``specdec_np.verify`` imports it first, so the binding is done before any kernel call).
The position of an entry in the registry is its code; each entry names its kernel
(``row_function``, ``walk``) and gives the flags the drivers check arguments with.
Binding again with the same arguments is a no-op, so importing this module twice (or a
reload) is harmless.
"""

from __future__ import annotations

from . import _core, registry

__all__ = ["CHAIN_ROW_BINDING", "TREE_STEP_BINDING"]

#: The arguments of ``_core.bind_chain_rows``: per code, the row function, whether it
#: reads uniforms, whether a drawn bonus is the raw argmax, and its parameter count.
CHAIN_ROW_BINDING: tuple[tuple[object, ...], ...] = (
    tuple(verifier.row_function for verifier in registry.VERIFIERS),
    tuple(verifier.stochastic for verifier in registry.VERIFIERS),
    tuple(verifier.bonus_by_argmax for verifier in registry.VERIFIERS),
    tuple(len(verifier.parameters) for verifier in registry.VERIFIERS),
)

#: The arguments of ``_core.bind_tree_steps``: per code, the walk step, whether the walk
#: reads uniforms, and whether its step reads draft rows when they are given.
TREE_STEP_BINDING: tuple[tuple[object, ...], ...] = (
    tuple(method.walk for method in registry.TREE_METHODS),
    tuple(method.stochastic for method in registry.TREE_METHODS),
    tuple(method.reads_draft_probs for method in registry.TREE_METHODS),
)

_core.bind_chain_rows(*CHAIN_ROW_BINDING)
_core.bind_tree_steps(*TREE_STEP_BINDING)
