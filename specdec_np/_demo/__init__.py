"""The end-to-end demo that ``specdec-np`` runs with no arguments.

Map of this folder:

* :mod:`.chains`: the n-gram target and drafters on a corpus the package ships (its own
  docstrings), the chain demo and its text output;
* :mod:`.trees`: the tree demo (``specdec-np demo --tree``) on the same models.
"""
