"""The runtime under every front: what happens to a call's arrays before and after a kernel.

Map of this folder (each module has one job):

* :mod:`.arrays`: array intake (NumPy, CuPy, DLPack producers), device and dtype policy,
  thread counts, and answering in the inputs' own library;
* :mod:`.checks`: every check of bad input and every message it raises;
* :mod:`.uniforms`: every source of uniforms (generators, seeded requests, counter
  streams), drawn all-or-nothing;
* :mod:`.philox`: the counter-based generator (Philox4x32-10) on any array namespace;
* :mod:`.contract`: the kernel contract shared with the C and CUDA sides (constants, row
  status codes and their messages, the output block);
* :mod:`.results`: the result records returned to the caller.

Nothing here knows a verifier or a layout; ``docs/semantics.md`` section 10 has the whole
house.
"""
