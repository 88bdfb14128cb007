"""The grid, the layouts and the inputs shared by the suite's benchmarks.

The grid is small by default, so that ``asv run --quick`` finishes in minutes on a 2-core
machine; ``SPECDEC_ASV_FULL=1`` in the environment of the asv command enlarges it to the
grid of the studies (``B`` in {1, 8, 64}, ``V`` in {32000, 128256, 256000}).

The inputs are made once per benchmark and parameter set, from a fixed seed, in the
*realistic* regime of the studies: each target row's top token holds about half of the
row's mass, the draft rows are the target's logits plus normal noise (so that most drafts,
not all, are accepted), and the drafts are drawn from the draft rows.  Stochastic
verifiers get explicit uniforms, so that every timed call has the same outcome and reads
the same bytes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from specdec_np import registry

#: Drafts per request of the chain layouts (the studies' k = 4), and the depth of each of
#: the two draft chains of a tree.
K = 4
#: The seed of every input.
SEED = 0
#: Scale of the normal noise between a target row's logits and its draft row's: close
#: enough that most drafts are accepted, far enough that some rows are rejected and read.
DRAFT_NOISE = 0.5
#: The filters of the filtered cells (vLLM's common top-k and top-p).
TOP_K = 50
TOP_P = 0.95

#: Set to 1 to time the studies' grid instead of the quick one.
FULL_GRID = os.environ.get("SPECDEC_ASV_FULL", "").strip().lower() in {"1", "true", "yes"}
BATCHES: tuple[int, ...] = (1, 8, 64) if FULL_GRID else (1, 8)
VOCABS: tuple[int, ...] = (32000, 128256, 256000) if FULL_GRID else (1024, 32000)

#: Layout -> the forms of rows the suite gives it: every layout of
#: ``specdec_np.registry.LAYOUTS`` with its own row forms, and the processed law as a
#: function beside them.
LAYOUTS: dict[str, tuple[str, ...]] = {
    **{layout.name: layout.row_forms for layout in registry.LAYOUTS},
    "processed": ("logits",),
}

#: Every chain verifier and every tree method, in registry order.
VERIFIER_NAMES: tuple[str, ...] = tuple(verifier.name for verifier in registry.VERIFIERS)
TREE_METHOD_NAMES: tuple[str, ...] = tuple(method.name for method in registry.TREE_METHODS)


def rng() -> np.random.Generator:
    """A generator at the suite's seed: the same inputs for every commit timed."""
    return np.random.default_rng(SEED)


def peaked_logits(generator: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Standard-normal logits with one random top token per row holding about half of the
    row's mass.

    Parameters
    ----------
    generator : numpy.random.Generator
    rows, vocab : int

    Returns
    -------
    float32 [rows, vocab]
    """
    logits = generator.standard_normal((rows, vocab), dtype=np.float32)
    top = generator.integers(0, vocab, size=rows)
    # The other entries' weights sum to about V exp(1/2) (the mean of exp of a standard
    # normal), so a top logit raised by log V + 1/2 takes about half of the mass.
    logits[np.arange(rows), top] += np.float32(np.log(vocab) + 0.5)
    return logits


def near(generator: np.random.Generator, logits: np.ndarray) -> np.ndarray:
    """Draft logits close to ``logits``: the same rows plus normal noise.

    Parameters
    ----------
    generator : numpy.random.Generator
    logits : float32 array

    Returns
    -------
    float32 array of the shape of ``logits``
    """
    noise = generator.standard_normal(logits.shape, dtype=np.float32)
    return logits + np.float32(DRAFT_NOISE) * noise


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, in float32.

    Parameters
    ----------
    logits : float32 array

    Returns
    -------
    float32 array of the shape of ``logits``
    """
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def draw(generator: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One token per row of ``probs``, by inverse CDF.

    Parameters
    ----------
    generator : numpy.random.Generator
    probs : float32 [..., V]

    Returns
    -------
    int64 array of ``probs.shape[:-1]``
    """
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    points = generator.random(probs.shape[:-1]) * cdf[..., -1]
    tokens = (cdf < points[..., None]).sum(axis=-1)
    return np.minimum(tokens, probs.shape[-1] - 1).astype(np.int64)


def skip_unless(condition: bool) -> None:
    """Skip a parameter set that does not apply (asv skips a benchmark whose ``setup``
    raises ``NotImplementedError``).

    Parameters
    ----------
    condition : bool
        False skips.

    Raises
    ------
    NotImplementedError
        When ``condition`` is false.
    """
    if not condition:
        raise NotImplementedError


def front(name: str | None) -> Any:
    """A public name of ``specdec_np`` (a sampler class or a stateless function), or
    None.

    Parameters
    ----------
    name : str or None

    Returns
    -------
    object or None
    """
    import specdec_np

    return None if name is None else getattr(specdec_np, name)


def warm_up(benchmark: Any, *parameters: Any) -> None:
    """Call each of ``benchmark``'s timed methods once, from its ``setup``.

    asv forks a fresh process per benchmark, and ``asv run --quick`` times one call with
    no warm-up: without this, that call would include the one-off costs of a process's
    first call (measured: about 12 ms for a ``processed_probs`` call of 0.3 ms).

    Parameters
    ----------
    benchmark : object
        A benchmark instance whose ``setup`` has made its inputs.
    *parameters
        Its parameters, as asv passes them.
    """
    for name in dir(benchmark):
        if name.startswith("time_"):
            try:
                getattr(benchmark, name)(*parameters)
            except NotImplementedError:
                # A method that does not apply to these parameters; asv skips it.
                pass
