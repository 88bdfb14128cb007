"""Thin adapters that give specdec_np the calling conventions of engines.

* :mod:`specdec_np.adapters.vllm`: vLLM v1's ``rejection_sample``.
"""
