"""The processed law of logits rows: ``processed_probs`` and ``sample_tokens``.

``B`` rows of ``V`` logits at temperature 1, unfiltered and with vLLM's common filters
(top-k 50 and top-p 0.95), which take another path through the kernels.
"""

from __future__ import annotations

from typing import Any

import specdec_np

from . import common

#: Filter set -> the keywords that apply it.
FILTERS: dict[str, dict[str, Any]] = {
    "off": {},
    "top_k_top_p": {"top_k": common.TOP_K, "top_p": common.TOP_P},
}


class TimeProcessed:
    """``B`` logits rows through the law every engine call applies."""

    params = (common.LAYOUTS["processed"], tuple(FILTERS), common.BATCHES, common.VOCABS)
    param_names = ("form", "filters", "B", "V")
    timeout = 300

    def setup(self, form: str, filters: str, batch: int, vocab: int) -> None:
        """Make the rows and the keywords.

        Parameters
        ----------
        form : str
            ``"logits"``: the law is that of logits rows.
        filters : str
            A key of :data:`FILTERS`.
        batch, vocab : int
        """
        generator = common.rng()
        self.logits = common.peaked_logits(generator, batch, vocab)
        self.keywords = dict(temperature=1.0, **FILTERS[filters])
        self.uniforms = generator.random(batch)
        common.warm_up(self, form, filters, batch, vocab)

    def time_processed_probs(self, form: str, filters: str, batch: int, vocab: int) -> None:
        """``processed_probs(logits, ...)``: every row's law, materialised."""
        specdec_np.processed_probs(self.logits, **self.keywords)

    def time_sample_tokens(self, form: str, filters: str, batch: int, vocab: int) -> None:
        """``sample_tokens(logits=..., ...)``: one draw per row, on explicit uniforms."""
        specdec_np.sample_tokens(logits=self.logits, uniforms=self.uniforms, **self.keywords)
