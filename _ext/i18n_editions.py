"""The book's editions in other languages, on the Sphinx side: one list of languages.

The list is the config value ``book_languages`` (set in ``_config.yml`` under ``sphinx:
config:``, registered here so that Sphinx knows it), the source language first; the language
of a build is the entry whose ``code`` is Sphinx's ``language`` (the source's when none is).
tools/i18n writes each translated edition's config and keeps its catalogs; this extension,
loaded by every edition, gives the pages what a second language needs:

- a link to the same page in every other edition, first in the page's body, and the
  ``<link rel="alternate" hreflang>`` that tells search engines the pages are one
  (``edition_switch``);
- in a translated edition, links that open a course notebook in Colab open the edition's
  copy under its folder (``edition_notebook_links``), and the edition's subset font, if its
  entry has one, is preloaded (``preload_edition_font``);
- the texts that Sphinx would leave untranslated: the glossary's table and the exercises'
  titles (``SourceOfEveryText``, ``keep_exercise_titles``, ``extract_exercise_titles``) and
  the captions of the table of contents (``TranslateTocCaptions``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform


def edition_of(config: Any) -> tuple[dict, bool]:
    """The entry of ``book_languages`` that this build is, and whether it is a translation.

    Args:
        config: Sphinx's config (``language``, ``book_languages``).

    Returns:
        ``(entry, translated)``; an empty source entry when the list is empty.
    """
    entries = list(getattr(config, "book_languages", None) or [])
    if not entries:
        return {}, False
    for entry in entries[1:]:
        if entry.get("code") == config.language:
            return entry, True
    return entries[0], False


def load_catalog(path: Path) -> dict[str, str]:
    """The finished translations of a catalog: neither empty nor fuzzy."""
    from babel.messages.pofile import read_po

    if not path.exists():
        return {}
    with path.open("rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}


def edition_catalog(app: Sphinx, name: str) -> dict[str, str]:
    """The finished translations of the catalog ``name`` (e.g. ``"quiz.po"``) in this build's
    edition, from every folder of ``locale_dirs``; none in the source edition."""
    _, translated = edition_of(app.config)
    found: dict[str, str] = {}
    for folder in app.config.locale_dirs if translated else ():
        found.update(load_catalog(Path(app.srcdir) / folder / app.config.language
                                  / "LC_MESSAGES" / name))
    return found


def _root_of(entry: dict) -> str:
    """The edition's root seen from the source edition's root (``""``, ``"zh/"``)."""
    return f"{entry['folder']}/" if entry.get("folder") else ""


def edition_switch(app: Sphinx, pagename: str, templatename: str, context: dict,
                   doctree: Any) -> None:
    """A link to the same page in every other edition, first in the page's body, and the
    ``<link rel="alternate" hreflang>`` of each.

    The page's name is the same in every edition (tools/i18n builds them from the same
    sources), so a link is this page's path from the other edition's root.
    """
    body = context.get("body")
    entries = list(app.config.book_languages or [])
    if body is None or len(entries) < 2:
        return
    this, _ = edition_of(app.config)
    to_source = "../" * (_root_of(this).count("/"))  # from this edition's root
    links, alternates = [], []
    for other in entries:
        if other is this:
            continue
        href = "../" * pagename.count("/") + to_source + _root_of(other) + pagename + ".html"
        language = other["hreflang"]
        links.append(f'<a href="{href}" hreflang="{language}" lang="{language}">'
                     f'{other["label"]}</a>')
        alternates.append(f'\n<link rel="alternate" hreflang="{language}" href="{href}" />')
    context["body"] = f'<p class="edition-switch">{" · ".join(links)}</p>\n' + body
    context["metatags"] = context.get("metatags", "") + "".join(alternates)


# A link that opens one of the course's notebooks in Colab (the exercise page's), up to the
# folder of the notebook: .../blob/<branch>/ then exercises/ or chapters/.
_COLAB_NOTEBOOK = re.compile(
    r'(https://colab\.research\.google\.com/github/[^"\s/]+/[^"\s/]+/blob/[^"\s/]+/)'
    r'(exercises|chapters)/')


def edition_notebook_links(app: Sphinx, pagename: str, templatename: str, context: dict,
                           doctree: Any) -> None:
    """In a translated edition, links that open a course notebook in Colab open the
    edition's copy, ``<folder>/exercises/`` or ``<folder>/chapters/`` (tools/i18n/notebooks.py),
    as its pages' launch buttons do (``repository.path_to_book``)."""
    entry, translated = edition_of(app.config)
    if not translated or not context.get("body"):
        return
    context["body"] = _COLAB_NOTEBOOK.sub(rf"\g<1>{entry['folder']}/\2/", context["body"])


def _static_path(app: Sphinx, file: str) -> str | None:
    """Where a file of one of the static folders is served (``_static/...``)."""
    for folder in app.config.html_static_path:
        prefix = str(folder).rstrip("/") + "/"
        if file.startswith(prefix):
            return "_static/" + file[len(prefix):]
    return None


def preload_edition_font(app: Sphinx, pagename: str, templatename: str, context: dict,
                         doctree: Any) -> None:
    """A translated edition whose entry has a font fetches it before the first layout.

    Where no system font has the script's glyphs, the page's own subset font arrives after
    Chromium has laid out the text, and some runs (measured for Chinese: the first sidebar
    caption, a bold paragraph) kept the empty boxes of the fallback until something forced
    a new layout. Preloading the font, which every page of the edition needs, removes the
    window.
    """
    entry, translated = edition_of(app.config)
    font = (entry.get("font") or {}).get("file") if translated else None
    if not font or "pathto" not in context:
        return
    served = _static_path(app, font)
    if served is None:
        return
    href = context["pathto"](served, 1)
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
    source: the glossary's meanings would stay English in a translated edition. The titles of
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
        _, translated = edition_of(self.config)
        if not translated or not self.config.locale_dirs:
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
    # The book's languages, source first (_config.yml, sphinx: config: book_languages).
    app.add_config_value("book_languages", [], "env", types=[list])
    app.connect("html-page-context", edition_switch)
    app.connect("html-page-context", preload_edition_font)
    app.connect("html-page-context", edition_notebook_links)
    app.add_transform(SourceOfEveryText)
    app.add_transform(TranslateTocCaptions)
    app.connect("doctree-read", keep_exercise_titles)
    app.connect("doctree-resolved", extract_exercise_titles)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
