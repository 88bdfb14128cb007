"""Sphinx configuration of the specdec_np documentation: the API reference from the
docstrings (autodoc and numpydoc) and the project's Markdown pages (myst-parser).

Build: ``sphinx-build -W -b html docs docs/_build/html`` (CI builds it with warnings as
errors, so a docstring that numpydoc cannot parse, or a public name left out of the
reference, fails the build).
"""

from __future__ import annotations

import specdec_np

project = "specdec_np"
author = "the specdec_np authors"
copyright = "2026, the specdec_np authors"
release = specdec_np.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# The Markdown pages link to files of the repository (README.md, source files) that are not
# pages of this site; those links stay plain links instead of failing the -W build.
suppress_warnings = ["myst.xref_missing"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "member-order": "bysource"}
# The signatures are the documentation's types; numpydoc's Parameters sections give the
# shapes and dtypes that type hints cannot say.
autodoc_typehints = "signature"
autodoc_preserve_defaults = False
autodoc_mock_imports = ["cupy", "torch"]

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# numpydoc validation of every documented object: the sections a public name must have
# (Parameters and Returns that match its signature); the style-only checks stay off.
numpydoc_validation_checks = {
    "all",
    "ES01",  # extended summary
    "EX01",  # examples section
    "SA01",  # see also section
    "SS05",  # summary starts with an infinitive verb
    "SS06",  # summary fits on one line
    "GL01",  # summary on the first line after the quotes
    "GL02",  # closing quotes on their own line
    "RT02",  # return value names
    "PR06",  # "integer" instead of "int"
    "PR08",  # parameter descriptions start with a capital
    "PR09",  # parameter descriptions end with a full stop
    "RT04",
    "RT05",
    "YD01",
}
# Record types (named tuples, frozen dataclasses) document their fields once, under
# Attributes, and carry ``# numpydoc ignore=PR01`` for their generated constructors.  The
# generated field properties of a named tuple say "Alias for field number N".
numpydoc_validation_overrides = {"SS03": [r"^Alias for field number \d+$"]}
# Module constants are validated by their type's docstring (int's, tuple's): their own
# documentation is the ``#:`` comment above them.
numpydoc_validation_exclude = {
    r"\.MAX_TREE_DEPTH$",
    r"\.VERIFIERS$",
    r"\.TREE_METHODS$",
    r"\.DRAFTINGS$",
    r"\.KINDS$",
    r"\.__version__$",
    r"\.PLACEHOLDER_TOKEN_ID$",
    r"\.GREEDY_EPSILON$",
}


html_theme = "alabaster"
html_title = f"specdec_np {release}"
html_static_path: list[str] = []
