"""Thin adapters that give specdec_np the calling conventions of engines.

* :mod:`specdec_np.adapters.vllm`: vLLM v1's ``rejection_sample``;
* :mod:`specdec_np.adapters.jax`: ``verify_ragged`` and ``sample_tokens`` inside
  ``jax.jit`` (JAX is imported only when they are called).
"""
