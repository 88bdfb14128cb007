"""Relaxed (lossy) methods, written once, and the bias of any method, measured exactly.

Map of this folder:

* :mod:`.laws`: the dense laws a rule reads, a chunk of requests at a time, written by
  the kernels' own law functions;
* :mod:`.rules`: each relaxed rule of :data:`specdec_np.registry.RELAXED_METHODS` (and
  typical acceptance's, for its bias): what it accepts with this call's uniforms, and
  with what probability every token would pass;
* :mod:`.bias`: the exact total-variation distance per position from those
  probabilities;
* :mod:`.runner`: a relaxed call over a checked chain batch (draws, rule, emission,
  bias), and the bias of a registry verifier's result;
* :mod:`.trees`: SGLang's thresholds on draft trees, walked request by request, with
  their bias per depth.

The engine call (:mod:`specdec_np._layouts.engine_call`) runs :func:`.runner.run` where a
kernel would run; ``docs/semantics.md`` ("Relaxed methods") states every rule.
"""
