"""Chains of drafts: vLLM's padded layout and the engines' ragged layout.

* :class:`TimePadded`: every verifier of the registry through its stateless function
  (``specdec_np.<function_name>``) and its vLLM-style sampler class
  (``specdec_np.<sampler_name>``) on padded probability blocks ``[B, k + 1, V]``;
* :class:`TimeRagged`: every verifier through ``verify_ragged`` and ``EngineVerifier`` on a
  flat batch with ragged ``k_b`` (0 to k), from logits (temperature 1) and from
  probabilities, the bonus token drawn by the verifier.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import specdec_np
from specdec_np import registry

from . import common


class TimePadded:
    """The padded layout: ``B`` requests of ``k`` drafts each, probability rows."""

    params = (common.VERIFIER_NAMES, common.BATCHES, common.VOCABS)
    param_names = ("verifier", "B", "V")
    timeout = 300

    def setup(self, verifier_name: str, batch: int, vocab: int) -> None:
        """Make the inputs and the call of one verifier.

        Parameters
        ----------
        verifier_name : str
        batch, vocab : int
        """
        verifier = registry.get(verifier_name)
        function = common.front(verifier.function_name)
        sampler_class = common.front(verifier.sampler_name)
        # A verifier reached through method= only has no padded front to time.
        common.skip_unless(function is not None or sampler_class is not None)
        generator = common.rng()
        target_logits = common.peaked_logits(generator, batch * (common.K + 1), vocab)
        target_logits = target_logits.reshape(batch, common.K + 1, vocab)
        draft_probs = common.softmax(common.near(generator, target_logits[:, : common.K]))
        self.target = common.softmax(target_logits)
        self.draft_probs = draft_probs
        self.draft_ids = common.draw(generator, draft_probs)
        self.bonus_ids = generator.integers(0, vocab, size=(batch, 1))
        self.keywords: dict[str, Any] = {}
        if verifier.stochastic:
            self.keywords["uniforms"] = generator.random((batch, common.K + 1))
        self.function = function
        self.reads_draft_probs = verifier.reads_draft_probs
        if sampler_class is None:
            self.sampler = None
        elif verifier.stochastic:
            self.sampler = sampler_class(seed=common.SEED)
        else:
            self.sampler = sampler_class()
        common.warm_up(self, verifier_name, batch, vocab)

    def time_function(self, verifier_name: str, batch: int, vocab: int) -> None:
        """The stateless function (``rejection_sample``, ...)."""
        if self.function is None:
            raise NotImplementedError
        # Only the verifiers that read draft rows take them (registry flag).
        if self.reads_draft_probs:
            arguments = (self.target, self.bonus_ids, self.draft_probs, self.draft_ids)
        else:
            arguments = (self.target, self.bonus_ids, self.draft_ids)
        self.function(*arguments, **self.keywords)

    def time_sampler(self, verifier_name: str, batch: int, vocab: int) -> None:
        """The vLLM-style sampler call (``RejectionSampler(seed=0)(...)``), counters
        included."""
        if self.sampler is None:
            raise NotImplementedError
        self.sampler(
            self.target, self.bonus_ids, self.draft_probs, self.draft_ids, **self.keywords
        )


class TimeRagged:
    """The engine layout: ragged drafts in one flat batch, the bonus drawn lazily."""

    params = (common.LAYOUTS["ragged"], common.VERIFIER_NAMES, common.BATCHES, common.VOCABS)
    param_names = ("form", "verifier", "B", "V")
    timeout = 300

    def setup(self, form: str, verifier_name: str, batch: int, vocab: int) -> None:
        """Make the flat batch and the keywords of one verifier.

        Parameters
        ----------
        form : str
            ``"logits"`` or ``"probs"``: the rows given.
        verifier_name : str
        batch, vocab : int
        """
        verifier = registry.get(verifier_name)
        generator = common.rng()
        # k_b cycles k, k - 1, ..., 0: ragged, with a request without drafts from B = 5 on.
        drafts = common.K - np.arange(batch) % (common.K + 1)
        total = int(drafts.sum())
        target_logits = common.peaked_logits(generator, total + batch, vocab)
        # Draft position i of request b tests target row i + b (each request's k_b draft
        # rows, then its bonus row).
        request_of_draft = np.repeat(np.arange(batch), drafts)
        tested_rows = np.arange(total) + request_of_draft
        draft_logits = common.near(generator, target_logits[tested_rows])
        draft_probs = common.softmax(draft_logits)
        self.keywords: dict[str, Any] = {
            "num_draft_tokens": drafts,
            "draft_token_ids": common.draw(generator, draft_probs),
        }
        if form == "logits":
            self.keywords.update(target_logits=target_logits, temperature=1.0)
            if verifier.reads_draft_probs:
                self.keywords["draft_logits"] = draft_logits
        else:
            self.keywords["target_probs"] = common.softmax(target_logits)
            if verifier.reads_draft_probs:
                self.keywords["draft_probs"] = draft_probs
        if verifier.stochastic:
            self.keywords["uniforms"] = generator.random((batch, common.K + 2))
        self.verifier_name = verifier_name
        self.engine = specdec_np.EngineVerifier(verifier_name, seed=common.SEED)
        common.warm_up(self, form, verifier_name, batch, vocab)

    def time_verify_ragged(self, form: str, verifier_name: str, batch: int, vocab: int) -> None:
        """``verify_ragged(..., method=name)``."""
        specdec_np.verify_ragged(method=self.verifier_name, **self.keywords)

    def time_engine_verifier(self, form: str, verifier_name: str, batch: int, vocab: int) -> None:
        """``EngineVerifier(name)(...)``, metrics included."""
        self.engine(**self.keywords)
