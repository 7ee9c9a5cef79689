"""Small fixes to the pages that Jupyter Book 1.0 writes with Sphinx 7.4.

sphinx-thebe's inline configuration (``const THEBE_JS_URL = ...``) and sphinx-togglebutton's
selector end up twice in every page, so the browser logs "Identifier 'THEBE_JS_URL' has
already been declared". This extension keeps the first copy of every script that is exactly
repeated (same file or same inline body, same attributes), whatever priority it was given.

It also leaves out pydata-sphinx-theme's top navigation bar (see ``drop_navbar``), keeps
punctuation on the line of the inline formula before it, and lets long names in inline
code break after a dot or an underscore rather than anywhere (see ``fix_body``), and points
the Colab button of a chapter at its Colab copy (see ``open_colab_copies``). What the
editions in other languages need is in ``i18n_editions.py``.
"""
from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
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


def drop_navbar(app: Sphinx, config: Any) -> None:
    """Leave out pydata-sphinx-theme's top navigation bar (``#pst-header``).

    Under sphinx-book-theme it holds only a second search box (the sidebar and the article
    header have one each), and pydata-sphinx-theme 0.17 puts a second ``.primary-toggle`` and
    ``.secondary-toggle`` button in it. Both themes' scripts bind ``querySelector`` of these
    classes, that is the first match: the bar's hidden button, so the visible ☰ and "contents"
    buttons of the article header did nothing (pydata-sphinx-theme issue #2451,
    sphinx-book-theme issue #988). The bar is drawn only when one of its ``navbar_*`` lists is
    set, and pydata-sphinx-theme sets ``navbar_persistent`` to the search field unless the
    book sets it: an empty list leaves the bar, and its duplicate buttons, out.

    Once sphinx-book-theme drops these buttons from the bar itself (its pull requests #991 and
    #1000), this function can go, with the pins of both themes in requirements.txt.
    """
    config.html_theme_options.setdefault("navbar_persistent", [])


# Inline math as Sphinx writes it, then the punctuation that follows it (full-width
# punctuation too, as CJK scripts write it).
_MATH_THEN_PUNCTUATION = re.compile(
    r'(<span class="math notranslate nohighlight">[^<]*</span>)([.,;:!?)\]’”，。；：！？）、]+)')
# Inline code as Sphinx writes it: each word in its own ``<span class="pre">``, words
# separated by plain spaces.
_INLINE_CODE = re.compile(r'(<code class="[^"]*\bliteral\b[^"]*">)(.*?)(</code>)', re.S)
# The text of one word of inline code.
_CODE_TEXT = re.compile(r'(<span class="pre">)([^<]*)(</span>)')
_TAG = re.compile(r"<[^>]+>")
# Characters: inline code this short (a shape such as ``(B, H, T, D)``, ``nn.Linear``) is
# kept on one line; a longer name breaks only where _NAME_BREAK allows.
SHORT_CODE = 20
# Where a long name may break: before a dot and after an underscore that join two parts of
# a name (so not inside ``__init__``, nor in a number such as ``0.5``).
_NAME_BREAK = re.compile(r"(?<=\w)(?=\.[A-Za-z_])|(?<=[^\W_]_)(?=[^\W_])")


def _breakable(match: re.Match) -> str:
    return match.group(1) + _NAME_BREAK.sub("<wbr>", match.group(2)) + match.group(3)


def _line_breaks_in_code(match: re.Match) -> str:
    opening, inner, closing = match.groups()
    if len(html.unescape(_TAG.sub("", inner))) <= SHORT_CODE:  # whole: no break at all
        return opening + inner.replace("</span> <span", "</span>&#160;<span") + closing
    return opening + _CODE_TEXT.sub(_breakable, inner) + closing


# A signature as Sphinx writes it (``<dt class="sig ...">``), which puts the parameters of a
# long signature one per line in a ``<dl>`` of ``<dd>`` alone: a definition list without
# terms, which screen readers announce as such (axe: definition-list).
_SIGNATURE = re.compile(r'(<dt class="sig[ "][^>]*>)(.*?)(</dt>)', re.S)


def _signature_lines(match: re.Match) -> str:
    inner = (match.group(2).replace("<dl>", '<div class="sig-params">').replace("</dl>", "</div>")
             .replace("<dd>", '<div class="sig-param-line">').replace("</dd>", "</div>"))
    return match.group(1) + inner + match.group(3)


def fix_body(app: Sphinx, pagename: str, templatename: str, context: dict,
             doctree: Any) -> None:
    """Fixes to the page's HTML: line breaks, and a signature's markup.

    - An inline formula and the punctuation after it go into one ``span.math-nowrap``
      (``white-space: nowrap`` in book.css), so that a comma or full stop never starts a line.
    - In inline code, ``<wbr>`` marks where a long name may break (before ``.``, after ``_``):
      book.css then breaks names there instead of anywhere, and a table whose names do not fit
      a phone scrolls in its own box instead of breaking them mid-word. Inline code of at most
      ``SHORT_CODE`` characters does not break at all (its spaces become no-break spaces), so
      a shape such as ``(B, H, T, D)`` or a name such as ``nn.Linear`` stays whole.
    - A long signature's one-parameter-a-line list is a ``div`` of lines, not a definition
      list without terms (book.css indents the lines as before).
    """
    body = context.get("body")
    if not body:
        return
    body = _MATH_THEN_PUNCTUATION.sub(r'<span class="math-nowrap">\1\2</span>', body)
    body = _SIGNATURE.sub(_signature_lines, body)
    context["body"] = _INLINE_CODE.sub(_line_breaks_in_code, body)


# The Colab copies' folder, written by tools/colab_copies.py (its FOLDER).
COLAB_FOLDER = "colab"
# The Colab button's address (sphinx-book-theme): Colab's, then the notebook's path in the
# repository at the branch, ``chapters/01_attention.ipynb`` or ``zh/chapters/...``.
_COLAB_LAUNCH = re.compile(
    r"^(https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/)([^?#]+\.ipynb)$")


def colab_copy_url(url: str, has_copy: Callable[[str], bool]) -> str:
    """The address of a Colab button that opens the notebook's Colab copy,
    ``colab/<path>``, where ``has_copy(path)`` says there is one; any other address as it is."""
    found = _COLAB_LAUNCH.match(url)
    if not found or not has_copy(found.group(2)):
        return url
    return f"{found.group(1)}{COLAB_FOLDER}/{found.group(2)}"


def open_colab_copies(app: Sphinx, pagename: str, templatename: str, context: dict,
                      doctree: Any) -> None:
    """The Colab button of a page opens its Colab copy, where the repository has one.

    sphinx-book-theme builds the button from the page's source (``chapters/<page>.ipynb``,
    ``zh/chapters/<page>.ipynb`` in the Chinese edition), whose MyST markup (exercises,
    folded solutions and answers, links to labels) Colab shows as raw text; the copies under
    ``colab/`` have it as plain Markdown and the same code cells. Runs after the theme has
    made its buttons (priority 501).
    """
    root = Path(app.srcdir)
    for group in context.get("header_buttons") or []:
        for button in group.get("buttons") or []:
            if button.get("url"):
                button["url"] = colab_copy_url(
                    button["url"], lambda path: (root / COLAB_FOLDER / path).is_file())


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", drop_navbar)
    # A late priority, so that scripts that other extensions add for this page are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", fix_body)
    app.connect("html-page-context", open_colab_copies, priority=600)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
