"""Small fixes to the pages that Jupyter Book 1.0 writes with Sphinx 7.4.

sphinx-thebe's inline configuration (``const THEBE_JS_URL = ...``) and sphinx-togglebutton's
selector end up twice in every page, so the browser logs "Identifier 'THEBE_JS_URL' has
already been declared". This extension keeps the first copy of every script that is exactly
repeated (same file or same inline body, same attributes), whatever priority it was given.

It also leaves out pydata-sphinx-theme's top navigation bar (see ``drop_navbar``), keeps
punctuation on the line of the inline formula before it, and lets long names in inline
code break after a dot or an underscore rather than anywhere (see ``fix_body``), and puts
a link to the same page in the book's other language at the top of every page (see
``edition_switch``), makes the glossary's table translatable (see ``SourceOfEveryText``) and
translates the captions of the table of contents (see ``TranslateTocCaptions``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform


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


# Inline math as Sphinx writes it, then the punctuation that follows it (Chinese full-width
# punctuation too, for the Chinese edition).
_MATH_THEN_PUNCTUATION = re.compile(
    r'(<span class="math notranslate nohighlight">[^<]*</span>)([.,;:!?)\]’”，。；：！？）、]+)')
# The text of inline code (``<code class="... literal ..."><span class="pre">...</span>``).
_CODE_TEXT = re.compile(r'(<span class="pre">)([^<]*)(</span>)')
# Where a long name may break: before a dot and after an underscore that join two parts of
# a name (so not inside ``__init__``, nor in a number such as ``0.5``).
_NAME_BREAK = re.compile(r"(?<=\w)(?=\.[A-Za-z_])|(?<=[^\W_]_)(?=[^\W_])")


def _breakable(match: re.Match) -> str:
    return match.group(1) + _NAME_BREAK.sub("<wbr>", match.group(2)) + match.group(3)


def fix_body(app: Sphinx, pagename: str, templatename: str, context: dict,
             doctree: Any) -> None:
    """Two line-breaking fixes to the page's HTML.

    - An inline formula and the punctuation after it go into one ``span.math-nowrap``
      (``white-space: nowrap`` in book.css), so that a comma or full stop never starts a line.
    - In inline code, ``<wbr>`` marks where a long name may break (before ``.``, after ``_``):
      book.css then breaks names there instead of anywhere, and a table whose names do not fit
      a phone scrolls in its own box instead of breaking them mid-word.
    """
    body = context.get("body")
    if not body:
        return
    body = _MATH_THEN_PUNCTUATION.sub(r'<span class="math-nowrap">\1\2</span>', body)
    context["body"] = _CODE_TEXT.sub(_breakable, body)


def _chinese(app: Sphinx) -> bool:
    """Whether this build is the Chinese edition (tools/zh_config.py sets its language)."""
    return (app.config.language or "en").startswith("zh")


# The book's two editions: the English one at the site's root, the Chinese one under zh/.
# (label, language of the label, folder of the other edition seen from this one's root)
_OTHER_EDITION = {"en": ("中文", "zh-CN", "zh/"), "zh": ("English", "en", "../")}


def edition_switch(app: Sphinx, pagename: str, templatename: str, context: dict,
                   doctree: Any) -> None:
    """A link to the same page in the other edition, first in the page's body, and the
    ``<link rel="alternate" hreflang>`` that tells search engines the two pages are one.

    The page's name is the same in both editions (tools/zh_config.py builds the Chinese one
    from the same sources), so the link is this page's path from the other edition's root.
    """
    body = context.get("body")
    if body is None:
        return
    edition = "zh" if _chinese(app) else "en"
    label, language, other_root = _OTHER_EDITION[edition]
    href = "../" * pagename.count("/") + other_root + pagename + ".html"
    context["body"] = (f'<p class="edition-switch"><a href="{href}" hreflang="{language}" '
                       f'lang="{language}">{label}</a></p>\n' + body)
    context["metatags"] = (context.get("metatags", "")
                           + f'\n<link rel="alternate" hreflang="{language}" href="{href}" />')


EDITION_FONT = "_static/fonts/book-zh.woff"  # _assets/book.css: "Book Noto Sans SC"
# A link that opens one of the course's notebooks in Colab (the exercise page's), up to the
# folder of the notebook: .../blob/<branch>/ then exercises/ or chapters/.
_COLAB_NOTEBOOK = re.compile(
    r'(https://colab\.research\.google\.com/github/[^"\s/]+/[^"\s/]+/blob/[^"\s/]+/)'
    r'(exercises|chapters)/')


def chinese_notebook_links(app: Sphinx, pagename: str, templatename: str, context: dict,
                           doctree: Any) -> None:
    """In the Chinese edition, links that open a course notebook in Colab open its Chinese
    copy, ``zh/exercises/`` or ``zh/chapters/`` (tools/zh_notebooks.py), as the Chinese pages'
    launch buttons do (``repository.path_to_book``)."""
    if not _chinese(app) or not context.get("body"):
        return
    context["body"] = _COLAB_NOTEBOOK.sub(r"\1zh/\2/", context["body"])


def preload_edition_font(app: Sphinx, pagename: str, templatename: str, context: dict,
                         doctree: Any) -> None:
    """Chinese pages fetch their font before the first layout.

    Where no system font has Chinese glyphs, the page's own subset font arrives after
    Chromium has laid out the text, and some runs (measured: the first sidebar caption, a
    bold paragraph) kept the empty boxes of the fallback until something forced a new layout.
    Preloading the font, which every Chinese page needs, removes the window.
    """
    if not _chinese(app) or "pathto" not in context:
        return
    href = context["pathto"](EDITION_FONT, 1)
    context["metatags"] = (context.get("metatags", "") + f'\n<link rel="preload" href="{href}" '
                           'as="font" type="font/woff" crossorigin="anonymous" />')


def _exercise_titles(doctree: nodes.document) -> list[nodes.subtitle]:
    """The title of every exercise (sphinx-exercise's ``exercise_subtitle``), as read."""
    return [node for node in doctree.findall(nodes.subtitle)
            if type(node).__name__ == "exercise_subtitle"]


class SourceOfEveryText(SphinxTransform):
    """Give every text node without a source and line those of its nearest ancestor that has
    them.

    MyST leaves them out on the cells of a table written inside a ``{table}`` directive (the
    glossary), and Sphinx neither extracts for translation nor translates a text without a
    source: the glossary's meanings would stay English in the Chinese edition. The titles of
    exercises get their text as raw source, for the same reason. Runs before
    Sphinx's translation transform (``Locale``, priority 20).
    """

    default_priority = 5

    def apply(self, **kwargs: Any) -> None:
        for node in _exercise_titles(self.document):
            # sphinx-exercise parses an exercise's title (its directive argument) into a
            # subtitle with no raw source; Sphinx extracts a message from the raw source.
            node.rawsource = node.rawsource or node.astext()
        for node in self.document.findall(nodes.TextElement):
            if node.source and node.line is not None:
                continue
            ancestor = node.parent
            while ancestor is not None and not (ancestor.source and ancestor.line is not None):
                ancestor = ancestor.parent
            if ancestor is not None:
                node.source = node.source or ancestor.source
                node.line = ancestor.line if node.line is None else node.line


class TranslateTocCaptions(SphinxTransform):
    """Translate the captions of the table of contents (the parts in the sidebar).

    Jupyter Book inserts the toctrees of ``_toc.yml`` into the root page (priority 100) after
    Sphinx has translated the page (``Locale``, priority 20), so their captions, which the
    extraction does find in the root page's catalog, would stay English.
    """

    default_priority = 150

    def apply(self, **kwargs: Any) -> None:
        if not _chinese(self.app) or not self.config.locale_dirs:
            return
        language = self.config.language
        from sphinx.locale import init as init_locale
        from sphinx.util.i18n import docname_to_domain

        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [str(Path(self.env.srcdir) / d) for d in self.config.locale_dirs]
        catalog, found = init_locale(dirs, language, domain)
        if not found:
            return
        for toctree in self.document.findall(addnodes.toctree):
            if toctree.get("caption"):
                toctree["caption"] = catalog.gettext(toctree["caption"])


_EXERCISES = ("exercise_node", "exercise_enumerable_node")


def keep_exercise_titles(app: Sphinx, doctree: nodes.document) -> None:
    """Note each exercise's title (text, source, line) on the exercise node, for the
    extraction of messages (see extract_exercise_titles)."""
    if app.builder.name != "gettext":
        return
    for node in _exercise_titles(doctree):
        node.parent.parent["title_message"] = (node.rawsource, node.source, node.line)


def extract_exercise_titles(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Add the exercises' titles to the page's message catalog (the gettext builder only).

    Sphinx translates an exercise's title where the page is read (SourceOfEveryText gives it
    a raw source), but it extracts the messages of a page as written, after sphinx-exercise
    has folded the title into "Exercise N (title)", so the title alone would never reach the
    catalog.
    """
    if app.builder.name != "gettext":
        return
    from sphinx.builders.gettext import MsgOrigin
    from sphinx.util.i18n import docname_to_domain

    catalog = app.builder.catalogs[docname_to_domain(docname, app.config.gettext_compact)]
    for node in doctree.findall(lambda n: type(n).__name__ in _EXERCISES):
        if "title_message" in node:
            text, source, line = node["title_message"]
            catalog.add(text, MsgOrigin(source, line))


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", drop_navbar)
    # A late priority, so that scripts that other extensions add for this page are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", fix_body)
    app.connect("html-page-context", edition_switch)
    app.connect("html-page-context", preload_edition_font)
    app.connect("html-page-context", chinese_notebook_links)
    app.add_transform(SourceOfEveryText)
    app.add_transform(TranslateTocCaptions)
    app.connect("doctree-read", keep_exercise_titles)
    app.connect("doctree-resolved", extract_exercise_titles)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
