"""Small fixes to the pages that Jupyter Book 1.0 writes with Sphinx 7.4.

sphinx-thebe's inline configuration (``const THEBE_JS_URL = ...``) and sphinx-togglebutton's
selector end up twice in every page, so the browser logs "Identifier 'THEBE_JS_URL' has
already been declared". This extension keeps the first copy of every script that is exactly
repeated (same file or same inline body, same attributes), whatever priority it was given.
"""
from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def _script_key(script: Any) -> tuple:
    filename = getattr(script, "filename", script) or ""  # inline scripts: "" or None
    attributes = getattr(script, "attributes", {}) or {}
    return (filename, tuple(sorted(attributes.items())))


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str,
                           context: dict, doctree: Any) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    # In place: Sphinx restores the list from its own copy before the next page.
    scripts[:] = unique


def setup(app: Sphinx) -> dict:
    # A late priority, so that scripts that other extensions add for this page are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
