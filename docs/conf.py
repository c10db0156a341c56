"""Sphinx configuration of svmkit's documentation (``sphinx-build -W -b html docs docs/_build``)."""

from __future__ import annotations

import os

# The API is documented from the installed svmkit (`pip install -e ".[docs]"`), whose
# native helpers are built; importing it needs no OpenCL driver registration here.
os.environ.setdefault("SVMKIT_WHEEL_DRIVERS", "0")

from svmkit import __version__

project = "svmkit"
author = "svmkit contributors"
copyright = "svmkit contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3  # links such as RELIABILITY.md#defects-found resolve

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "alabaster"
html_title = f"svmkit {__version__}"
