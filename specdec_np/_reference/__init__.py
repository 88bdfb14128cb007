"""The slow, obviously correct twins: the array-API reference of every verifier.

Map of this folder (the oracle the fast paths are tested against; array-API code, run on
``array_api_strict`` in the tests):

* :mod:`.chains`: the chain verifiers (rejection, typical acceptance, greedy, block
  verification), their per-position decisions, the processed law of logits rows and the
  ragged layout's adapter;
* :mod:`.trees`: the tree walks and their exact output laws;
* :mod:`.traversal`: traversal verification's walk and law.

The registry names each verifier's reference function
(:attr:`specdec_np.registry.Verifier.reference_name`); ``docs/semantics.md`` section 10 says
where a new verifier's reference goes.
"""
