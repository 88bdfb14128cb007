"""Verification across vocabulary shards: the rank-local pieces behind
:mod:`specdec_np.sharded`.

Map of this folder:

* :mod:`.communicators`: the collective protocol (``rank``, ``size``, ``allgather``), the
  in-process communicator of :func:`~specdec_np.sharded.run_local`, and the thin adapters
  over mpi4py, NCCL (``cupy.cuda.nccl``) and ``torch.distributed``;
* :mod:`.exchange`: the byte-counting wrapper every round goes through, and the agreement
  round (one allgather of a fixed-size digest) that turns disagreeing ranks into a
  ValueError on every rank;
* :mod:`.laws`: this rank's part of the processed law of the sampled logits rows (the
  rows as handed over, ``z`` only where read, the kept entries' weights and their sums),
  its passes over the slice compiled in the kernel headers (``shardscan.h``), or on the
  device for CuPy rows (``shard_passes.cu``, through :func:`.rows.passes`);
* :mod:`.filters`: top-k, top-p and min-p across shards: min-p's floor from the maximum,
  each rank's short candidate lists merged the same way on every rank, and the radix
  select where they leave a cutoff open;
* :mod:`.rows`: the row statistics every round shares: order-preserving keys, the radix
  select, greedy argmaxes, per-row sums and the two-level inverse-CDF draw, and the
  dispatch on the rows' array library (NumPy rows to ``_core``'s passes, CuPy rows to the
  CUDA ones, which leave the rows on their device and hand back per-row numbers);
* :mod:`.ragged`: the ragged call itself (every chain method of the registry).

``docs/semantics.md`` ("Verification across vocabulary shards") states the protocol and
why it is exact.
"""
