"""Verification across vocabulary shards: the rank-local pieces behind
:mod:`specdec_np.sharded`.

Map of this folder:

* :mod:`.communicators`: the collective protocol (``rank``, ``size``, ``allgather``), the
  in-process communicator of :func:`~specdec_np.sharded.run_local`, and the thin adapters
  over mpi4py, NCCL (``cupy.cuda.nccl``) and ``torch.distributed``;
* :mod:`.exchange`: the byte-counting wrapper every round goes through, and the agreement
  round (one allgather of a fixed-size digest) that turns disagreeing ranks into a
  ValueError on every rank;
* :mod:`.rows`: the distributed row statistics: maxima, the radix selects of top-k and
  top-p over float keys, normalisers, the drafted tokens' values, greedy argmaxes and the
  two-level inverse-CDF draw;
* :mod:`.ragged`: the ragged call itself (every chain method of the registry).

``docs/semantics.md`` ("Verification across vocabulary shards") states the protocol and
why it is exact.
"""
