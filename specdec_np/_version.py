"""The version of specdec_np: the one place it is written.

The build reads it (``[tool.setuptools.dynamic]`` in ``pyproject.toml``, by parsing this
file, not importing the package) and :data:`specdec_np.__version__` re-exports it, so the
wheel's metadata, ``specdec-np --version`` and static tools agree.
"""

__version__ = "0.1.0"
