"""The kernels and the one place that calls them.

Map of this folder:

* :mod:`.dispatch`: which kernel a checked batch needs, its scratch and options, the
  draws, the launch and the row status (CPU and CUDA alike);
* :mod:`.cuda`: the CUDA loader (sources, generated headers, NVRTC through
  ``cupy.RawModule``, launches);
* :mod:`.cuda_shard_passes`: the launchers of ``shard_passes.cu``, ``_core``'s shard
  passes on CuPy rows (verification across vocabulary shards);
* ``src/common/``: C shared by both backends (``elementwise.h``: the per-element maths, so
  that a formula is written once);
* ``src/cpu/``: the CPU side: Cython include files (``.pxi``) that
  ``specdec_np/_core.pyx`` includes, and C headers for the row passes;
* ``src/cuda/``: the CUDA side (``.cu`` kernel families, ``.cuh`` headers).

One file stem per concept on both sides: ``chain_driver``, ``tree_driver``,
``chain_rows``, ``tree_walks``, ``row_readers``, ``inverse_cdf_draws``, ``logits_law``,
``processed_rows`` and ``output_formatting`` each name the same job in ``src/cpu/`` and
``src/cuda/``.  The compiled module itself stays ``specdec_np._core``.
"""
