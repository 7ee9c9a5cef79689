"""The API reference page (appendix/api.md): autodoc with napoleon reads the library's
docstrings. Two things are settled here.

The docstrings are the code's reference and stay in English in every edition: what autodoc
writes is not a message to translate, so the catalogs hold only the page's own prose (its
title, introduction and headings) and a docstring can change without touching them.

For an attribute, a module constant or a property, napoleon reads a first line ``X: text``
as ``type: description`` and turns ``X`` into a type to link. The library's doc comments use
the colon as prose (``d_model: int = 64  #: C: width of the residual stream``), so the page
would show "C" as the field's type, and ``-n`` would fail to find it. Such a docstring is one
paragraph with no napoleon sections, so it is kept as written: taken before napoleon runs and
put back after it. (The fields' types come from their annotations, which autodoc shows apart.)
"""
from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx import addnodes

_AS_WRITTEN = ("attribute", "data", "property")
_kept: dict[str, list[str]] = {}


def keep(app, what: str, name: str, obj: Any, options, lines: list[str]) -> None:
    """``autodoc-process-docstring`` before napoleon's (priority 500): remember the lines."""
    if what in _AS_WRITTEN:
        _kept[name] = list(lines)


def put_back(app, what: str, name: str, obj: Any, options, lines: list[str]) -> None:
    """``autodoc-process-docstring`` after napoleon's: the lines as they were written."""
    if what in _AS_WRITTEN and name in _kept:
        lines[:] = _kept.pop(name)


def not_messages(app, doctree: nodes.document) -> None:
    """``doctree-read``: every text autodoc wrote (an entry, or a module's docstring) is marked
    not translatable, so the gettext builder leaves it out and a translation never applies."""
    for node in doctree.findall(nodes.TextElement):
        source = node.source or ""
        inside_entry = any(isinstance(parent, addnodes.desc) for parent in _parents(node))
        if inside_entry or ":docstring of " in source:
            node["translatable"] = False


def _parents(node: nodes.Node):
    while node.parent is not None:
        node = node.parent
        yield node


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", keep, priority=400)
    app.connect("autodoc-process-docstring", put_back, priority=600)
    app.connect("doctree-read", not_messages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
