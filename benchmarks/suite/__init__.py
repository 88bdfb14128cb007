"""specdec_np's regression suite for asv (airspeed velocity), run from ``benchmarks/``.

Every benchmark goes through the public API only (``import specdec_np``), so that one suite
times any two commits of the package, and iterates over ``specdec_np.registry``: a verifier
or a tree method added to the registry is timed without an edit here.

* :mod:`suite.common`: the grid of ``B`` and ``V``, the layouts, the inputs;
* :mod:`suite.bench_chains`: the padded chain layout and the ragged engine layout;
* :mod:`suite.bench_trees`: the tree layout;
* :mod:`suite.bench_processed`: the processed law of logits rows.

The asv configuration is ``benchmarks/asv.conf.json``; ``benchmarks/README.md`` has the
commands.  Nothing here imports asv: ``tests/project/test_asv_suite.py`` runs every benchmark once
without it.
"""
