"""Batch layouts: how a caller's arrays become one batch the kernels walk.

Map of this folder (the layout is kept apart from the per-row algorithm, as
``specdec_np.registry.LAYOUTS`` declares each layout once):

* :mod:`.sampling`: the per-request sampling parameters, the row forms (probabilities,
  logits, mixed) and the kernel's sampling table;
* :mod:`.padded`: vLLM's padded chain ``[B, k+1, V]`` (the sampler classes and
  :func:`specdec_np.verify`);
* :mod:`.engine_call`: the one engine call under every engine-layout front (its
  records of row sources and uniform sources, the layout protocol, the kernel options);
* :mod:`.ragged`: the engine's flat ragged batch (:func:`specdec_np.verify_ragged`);
* :mod:`.fast_path`: the ragged batch's common CPU call (NumPy arrays, a NumPy
  generator, no ``out=``, no sampling-surface setting) without the generic machinery,
  with the general path's results and errors;
* :mod:`.tree_builders`: draft trees as flat arrays: their record, validation and builders;
* :mod:`.tree`: the tree batch and :func:`specdec_np.verify_tree`;
* :mod:`.tree_links`: a tree batch's parent and sibling links in the kernel's form;
* :mod:`.processed`: the processed law as a function (:func:`specdec_np.processed_probs`,
  :func:`specdec_np.sample_tokens`);
* :mod:`.surface`: the whole sampling surface per draft position (context, penalties,
  bias, masks, stops, logprobs): the settings checked, the rows adjusted before the law,
  the runs cut and the logprobs added after the kernel;
* :mod:`.row_adjustments`: the surface's row settings as the chain kernels (and the CUDA
  tree kernel) apply them where they read a row (a bitmask and sparse final values per
  row).

Each layout hands :mod:`specdec_np._kernels.dispatch` a checked batch; ``docs/semantics.md``
section 11 says what a new layout touches (section 10 maps the whole house).
"""
