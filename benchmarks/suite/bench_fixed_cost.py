"""One call's fixed cost: each public engine call at ``B = 1``, ``V = 16``.

At ``V = 16`` the rows cost nothing to read, so the time is what a call costs whatever
its rows: intake, checks, the sampling table, the uniforms, dispatch and the kernel
call's own argument handling (``benchmarks/studies/fixed_cost.py`` breaks it down by
stage).  The grid is fixed, not the suite's ``B`` x ``V``: a larger row would time the
rows.  Every call draws from a seeded generator with temperature 0.8 and top-p 0.9 (the
filtered path), as an engine's sampled request does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import specdec_np

from . import common

#: The fixed cell.
B = 1
V = 16
#: The sampling parameters of every call.
FILTERS: dict[str, Any] = {"temperature": 0.8, "top_p": 0.9}


class TimeFixedCost:
    """The public engine calls at ``B = 1``, ``V = 16``: their fixed cost."""

    params = (("sample_tokens", "processed_probs", "verify_ragged", "EngineVerifier"),)
    param_names = ("call",)
    timeout = 120

    def setup(self, call: str) -> None:
        """Make one call's inputs (two drafts for the chain calls).

        Parameters
        ----------
        call : str
            The public call timed.
        """
        generator = common.rng()
        logits = common.peaked_logits(generator, B, V)
        chain_logits = common.peaked_logits(generator, 3 * B, V)
        counts = np.full(B, 2, dtype=np.int64)
        drafts = generator.integers(0, V, 2 * B).astype(np.int64)
        engine = specdec_np.EngineVerifier(seed=common.SEED)
        calls: dict[str, Callable[[], Any]] = {
            "sample_tokens": lambda: specdec_np.sample_tokens(
                logits=logits, generator=generator, **FILTERS
            ),
            "processed_probs": lambda: specdec_np.processed_probs(logits, **FILTERS),
            "verify_ragged": lambda: specdec_np.verify_ragged(
                num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
                generator=generator, **FILTERS,
            ),
            "EngineVerifier": lambda: engine(
                num_draft_tokens=counts, draft_token_ids=drafts, target_logits=chain_logits,
                **FILTERS,
            ),
        }  # fmt: skip
        self.call = calls[call]
        common.warm_up(self, call)

    def time_call(self, call: str) -> None:
        """The call, once."""
        self.call()
