"""A conformance kit for speculative-decoding verifiers written anywhere.

Map of this package (the public names are this module's; the rest is private):

* :mod:`._report`: a property's result, the report, time limits and keyword probing;
* :mod:`._padded`, :mod:`._ragged`, :mod:`._tree`: the properties of each layout
  (``specdec_np.registry.LAYOUTS`` names each layout's kit module);
* :mod:`._oracles`: exact output laws on small vocabularies;
* :mod:`._statistics`: chi-square and z tests without SciPy;
* :mod:`._monte_carlo`: Monte Carlo runs of a verifier against the oracles;
* :mod:`._drafting`: :func:`check_drafting`, a drafter and a verifier end to end;
* :mod:`._self_check`: ``specdec-np check`` of the package's own backends.

:func:`check_verifier` treats a verifier as a black box and reports, property by property,
whether its outputs have the distribution and the format a lossless verifier must have.
It needs only NumPy; torch, JAX or CuPy verifiers are checked through
:class:`TorchAdapter` and :class:`DLPackAdapter`.  ``docs/testing.md`` is the user guide.

The verifier's calling convention (the stateless chain form)::

    verifier(target_with_bonus_probs,  # float64 (or probs_dtype) [B, k+1, V]
             bonus_token_ids,          # int64 [B, 1]
             draft_probs,              # same dtype [B, k, V], or None (point-mass drafts)
             draft_token_ids,          # int64 [B, k]
             *, uniforms=...)          # float64 [B, k+1]: columns 0..k-1 accept, k residual

For ``kind="greedy"`` the call is ``verifier(target, bonus, draft_probs, draft_token_ids)``
(``draft_probs`` is None) or, for a callable with three positional parameters,
``verifier(target, bonus, draft_token_ids)``.  The verifier may return the ``[B, k+1]``
output (NumPy, or anything DLPack or ``__array__`` can read) or an object with an
``output_token_ids`` attribute.  A callable without a ``uniforms`` keyword (seen by
``inspect.signature``, or declared by a ``takes_uniforms`` attribute; ``**kwargs`` takes
every keyword) is tested by Monte Carlo only.  ``generator``, ``seeded_seqs`` and
``counter_seeds`` keywords, where present, are each exercised by their own Monte Carlo test
and reproducibility check.

``layout="ragged"`` calls a verifier with :func:`specdec_np.verify_ragged`'s keywords and
``layout="tree"`` one with :func:`specdec_np.verify_tree`'s (:mod:`specdec_np.testing._ragged`
and :mod:`specdec_np.testing._tree` say what they check); :func:`kinds_for` gives each
layout's kinds, all read from the registry.  :func:`check_drafting` checks the draft side:
it runs a drafter as an engine does (draft logits, settings and each request's
``counter_seeds``), hands its tokens and rows to a ragged verifier, and checks the output's
law, the drafts against the rows reported, and the draft noise against the uniforms the
verifier reads (:mod:`specdec_np.testing._drafting`).  A property that did not run is reported as
skipped (``PropertyResult.skipped``, a ``SKIP`` row), never as passed, and every call to
the verifier has a time limit (``timeout``); ``docs/testing.md`` documents both.

The exact laws and threshold grids are those of :mod:`specdec_np.testing._oracles`, the chi-square
tests and sigma rules those of :mod:`specdec_np.testing._statistics`, the draws and the output
format rule those of :mod:`specdec_np.testing._monte_carlo`; per-kind facts come from the
registry entry (``stochastic``, ``reads_draft_probs``, ``causal_counts``,
``oracle_name``).  ``specdec-np check`` runs this kit over the registry
(:mod:`specdec_np.testing._self_check`).
"""

from __future__ import annotations

import importlib
import inspect
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import registry
from . import _monte_carlo
from ._drafting import check_drafting
from ._report import (
    DEFAULT_TIMEOUT,
    ConformanceError,
    ConformanceReport,
    PropertyResult,
    TimeLimit,
    checked_timeout,
    has_keyword,
    positional_count,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "KINDS",
    "LAYOUTS",
    "ConformanceError",
    "ConformanceReport",
    "DLPackAdapter",
    "PropertyResult",
    "TorchAdapter",
    "check_drafting",
    "check_verifier",
    "kinds_for",
]

#: The layouts the kit calls a verifier in (``specdec_np.registry.LAYOUTS``): the padded
#: chain form, ``verify_ragged``'s keywords and ``verify_tree``'s keywords.
LAYOUTS = registry.layout_names()

#: The kinds of the padded layout: every verifier of the registry (the lossless ones
#: against their exact law, the deterministic ones against their rule or reference).
KINDS = registry.names()


def kinds_for(layout: str) -> tuple[str, ...]:
    """The kinds :func:`check_verifier` checks on ``layout``.

    Parameters
    ----------
    layout : {"padded", "ragged", "tree"}

    Returns
    -------
    tuple of str
        The registry's verifier names for the chain layouts, its tree method names
        (:func:`specdec_np.registry.tree_method_names`) for ``"tree"``.

    Raises
    ------
    ValueError
        For an unknown layout.

    Examples
    --------
    >>> from specdec_np import registry
    >>> from specdec_np.testing import kinds_for
    >>> kinds_for("tree") == registry.tree_method_names()
    True
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; found {layout!r}")
    return registry.get_layout(layout).method_names()


# --------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------


class _Adapter:
    """Shared part of the adapters: convert arguments in, outputs out, declare keywords."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable; found {type(fn).__name__}")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        # The wrapped signature, so that the kit sees every keyword the function takes.
        try:
            self.__signature__ = inspect.signature(fn)
        except (TypeError, ValueError):
            pass
        self.takes_uniforms = has_keyword(fn, "uniforms")
        self.takes_seeded_seqs = has_keyword(fn, "seeded_seqs")
        self.takes_generator = has_keyword(fn, "generator")
        self.positional_arguments = positional_count(fn)

    def _to(self, value: Any) -> Any:
        raise NotImplementedError

    def _generator(self, generator: np.random.Generator) -> Any:
        return generator

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        converted = [None if a is None else self._to(a) for a in args]
        keywords: dict[str, Any] = {}
        for name, value in kwargs.items():
            if isinstance(value, np.ndarray):  # uniforms, and every array of a layout
                keywords[name] = self._to(value)
            elif name == "generator":
                keywords[name] = self._generator(value)
            elif name == "seeded_seqs":
                keywords[name] = {row: self._generator(g) for row, g in value.items()}
            else:
                keywords[name] = value
        result = self.fn(*converted, **keywords)
        if not hasattr(result, "output_token_ids"):
            return _monte_carlo.to_numpy(result)
        # A result object (the tree layout reads its accepted nodes and lengths too, the
        # sampling settings' checks its finished flags and logprobs).
        return types.SimpleNamespace(**{
            name: _monte_carlo.to_numpy(getattr(result, name))
            for name in ("output_token_ids", "accepted_nodes", "accepted_lengths", "finished",
                         "logprobs", "raw_logprobs", "top_token_ids", "top_logprobs")
            if getattr(result, name, None) is not None})


def _torch() -> Any:
    """torch, imported only when an adapter is used: it is never a dependency."""
    return importlib.import_module("torch")


class TorchAdapter(_Adapter):
    """Check a torch verifier: NumPy inputs become tensors on ``device``, outputs NumPy.

    torch is imported on the first call, never by ``import specdec_np.testing``.
    ``numpy.random.Generator`` objects passed as ``generator=`` or in ``seeded_seqs`` are
    turned into ``torch.Generator`` objects on ``device`` seeded by one 63-bit draw each.

    Parameters
    ----------
    fn : callable
        The torch verifier, with the stateless chain signature (see the module docstring).
    device : str
        Where the tensors go (``"cpu"``, ``"cuda"``, ...).

    Examples
    --------
    :func:`specdec_np.greedy_sample` takes torch tensors too, so it can stand for a torch
    verifier:

    >>> import torch
    >>> import specdec_np
    >>> from specdec_np.testing import TorchAdapter, check_verifier
    >>> check_verifier(TorchAdapter(specdec_np.greedy_sample), "greedy", num_rows=1000).passed
    True
    """

    def __init__(self, fn: Callable[..., Any], device: str = "cpu") -> None:
        super().__init__(fn)
        self.device = device

    def _to(self, value: Any) -> Any:
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(value)).to(self.device)

    def _generator(self, generator: np.random.Generator) -> Any:
        torch = _torch()
        seeded = torch.Generator(device=self.device)
        seeded.manual_seed(int(generator.integers(2**63 - 1)))
        return seeded


class DLPackAdapter(_Adapter):
    """Check a verifier on any DLPack array library (JAX, CuPy, ...).

    Parameters
    ----------
    fn : callable
        The verifier, with the stateless chain signature (see the module docstring).
    from_numpy : callable
        Turns a NumPy array into the library's array (``jax.numpy.asarray``,
        ``cupy.asarray``, ``torch.from_numpy``).  Outputs come back through DLPack, or
        ``.get()`` / ``__array__`` where DLPack cannot reach the host.

    Examples
    --------
    ``from_numpy`` is the library's ``asarray`` (``jax.numpy.asarray``, ``cupy.asarray``);
    NumPy's own here:

    >>> import numpy as np
    >>> import specdec_np
    >>> from specdec_np.testing import DLPackAdapter, check_verifier
    >>> adapter = DLPackAdapter(specdec_np.greedy_sample, from_numpy=np.asarray)
    >>> check_verifier(adapter, "greedy", num_rows=1000).passed
    True
    """

    def __init__(self, fn: Callable[..., Any], from_numpy: Callable[[np.ndarray], Any]) -> None:
        super().__init__(fn)
        if not callable(from_numpy):
            raise TypeError(f"from_numpy must be callable; found {type(from_numpy).__name__}")
        self.from_numpy = from_numpy

    def _to(self, value: Any) -> Any:
        return self.from_numpy(np.ascontiguousarray(value))


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def check_verifier(
    verifier: Callable[..., Any],
    kind: str = "rejection",
    *,
    layout: str = "padded",
    vocab_size: int = 8,
    k: int = 3,
    seed: int = 0,
    num_rows: int = 100_000,
    probs_dtype: Any = np.float64,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> ConformanceReport:
    """Run the conformance kit on a verifier and report every property.

    Parameters
    ----------
    verifier : callable
        The verifier in ``layout``'s calling convention (``docs/testing.md``), or an
        adapter (:class:`TorchAdapter`, :class:`DLPackAdapter`) around one.
    kind : str
        What the verifier claims to be, one of :func:`kinds_for` ``(layout)``: a verifier
        of the registry (the lossless ones checked for the target's law, the others
        against their rule) or, on the tree layout, a tree method of the registry.
    layout : {"padded", "ragged", "tree"}
        ``"padded"``: the stateless chain form of the samplers; ``"ragged"``: a callable
        with :func:`specdec_np.verify_ragged`'s keywords, checked from probabilities and
        from logits with sampling filters, greedy requests mixed in; ``"tree"``: a callable
        with :func:`specdec_np.verify_tree`'s keywords.
    vocab_size : int
        V of the Monte Carlo, batch-invariance and greedy batches (the exact law uses
        V <= 5 and k <= 2 to stay small).  At least 3.
    k : int
        Draft length of those batches (chain layouts); at least 1.
    seed : int
        Seed of every random input; the same seed gives the same report.
    num_rows : int
        Rows of the Monte Carlo batches; at least 1000.
    probs_dtype : {numpy.float64, numpy.float32}
        dtype of the probability and logit arrays fed to the verifier (uniforms are always
        float64).  The exact-law inputs are multiples of 1/1024, the same in both dtypes.
    timeout : float or None
        Time limit of each call to the verifier, in seconds (:data:`DEFAULT_TIMEOUT` by
        default, at most ``threading.TIMEOUT_MAX``); a call that does not return in time
        fails its property, and the properties after it are skipped.  None: no limit (the
        calls run in the caller's thread).

    Returns
    -------
    ConformanceReport
        ``report.passed`` is True iff no property failed and at least one ran;
        ``print(report)`` shows the table (``SKIP`` rows did not run);
        ``report.raise_if_failed()`` raises with it.  A verifier that raises (``sys.exit``
        and other ``BaseException`` subclasses too) fails the property it was in; only
        ``KeyboardInterrupt`` propagates.

    Raises
    ------
    TypeError
        If ``verifier`` is not callable.
    ValueError
        If ``layout`` or ``kind`` is unknown, or a size or the timeout is out of range (a
        timeout must be positive, finite and no longer than this platform's threads can
        wait).

    Examples
    --------
    A verifier of the padded layout, checked as lossless rejection sampling (small sizes,
    so that it takes a fraction of a second):

    >>> import specdec_np
    >>> from specdec_np.testing import check_verifier
    >>> report = check_verifier(specdec_np.rejection_sample, "rejection", vocab_size=4, k=1,
    ...                         num_rows=1000)
    >>> report.passed, report.failed()
    (True, [])
    """
    if not callable(verifier):
        raise TypeError(f"verifier must be callable; found {type(verifier).__name__}")
    kinds = kinds_for(layout)
    if kind not in kinds:
        raise ValueError(f"kind must be one of {kinds} on layout {layout!r}; found {kind!r}")
    for name, value, minimum in (("vocab_size", vocab_size, 3), ("k", k, 1),
                                 ("num_rows", num_rows, 1000)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}; found {value!r}")
    if np.dtype(probs_dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"probs_dtype must be float32 or float64; found {probs_dtype!r}")
    limit = TimeLimit(checked_timeout(timeout))
    start = time.perf_counter()
    label = getattr(verifier, "__qualname__", None) or getattr(verifier, "__name__", None)
    report = ConformanceReport(kind, str(label or type(verifier).__name__), layout=layout)
    rng = np.random.default_rng(seed)
    dtype = np.dtype(probs_dtype)
    kit = importlib.import_module(registry.get_layout(layout).kit)
    report.rows += kit.check(verifier, kind, dtype=dtype, limit=limit, k=k,
                             vocab_size=vocab_size, num_rows=num_rows, rng=rng)
    report.seconds = time.perf_counter() - start
    return report
