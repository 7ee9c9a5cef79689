"""The translated editions' message catalogs: extracted from the source pages, and checked.

    python tools/i18n messages update   # extract the messages, bring locales/<code> in step
    python tools/i18n messages check    # list what is missing in the finished translations

The source (English) notebooks and pages are the only source. ``update`` extracts their
Markdown (prose, headings, admonitions, exercises; one message per paragraph, inline math
inside its message; code is not extracted) into ``.pot`` templates with Sphinx's gettext
builder (nothing is executed), then ``sphinx-intl update`` merges them into one catalog per
page and language, ``locales/<code>/LC_MESSAGES/<page>.po`` (a language's first ``update``
creates them): a new English paragraph arrives untranslated, a changed one arrives marked
fuzzy with the old translation beside it, and the edition shows both in English until a
translator deals with them. A change to English text therefore runs ``update`` and commits
the catalogs with it (CONTRIBUTING.md).

The explorers' own words (captions, control names, option labels) are not in the pages'
Markdown but in the saved state of their widgets: ``update`` also collects them from the
built source edition (``_build/html``, so after ``make book``) into one more catalog per
language, ``widgets.po``, which the translated builds apply (``_ext/i18n_widgets.py``).

The quizzes' own words (their buttons and messages, ``UI_STRINGS`` of ``_ext/quiz.py``) are
in one more catalog per language, ``quiz.po``, which ``update`` keeps in step with that list
and the translated builds and Colab copies apply.

A language's ``complete`` (``_config.yml``) lists the pages whose translation is finished
(``true``: every page of the book); ``check`` (and tests/test_i18n.py) fail when one of their
messages is untranslated or fuzzy, when a translation's inline math differs from its English
message's, when its bold, italics, inline code or links do (as MyST parses them), or when
display math was translated. A language with a finished page has finished explorers' words.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

from i18n import editions
from i18n.languages import LOCALES, ROOT, Language, translations

GETTEXT = ROOT / "_build" / "gettext"  # jupyter-book's output folder of the extraction
SOURCE_HTML = ROOT / "_build" / "html"  # the source edition, as `make book` writes it
WIDGETS = "widgets"  # the catalog of the explorers' words (_ext/i18n_widgets.py)
QUIZ = "quiz"  # the catalog of the quizzes' own words (_ext/quiz.py, CATALOG)


def toc_pages() -> list[str]:
    """Every page of the book's table of contents, root first, as paths without suffix."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return names


def complete(language: Language) -> tuple[str, ...]:
    """The pages whose translation into ``language`` is finished: every message translated,
    none fuzzy (``complete: true`` in its entry: every page of the book)."""
    if language.complete is True:
        return tuple(toc_pages())
    return tuple(language.complete or ())

# Inline math in a message: $...$ (not $$), or MyST's {math}`...` role.
_INLINE_MATH = re.compile(r"(?<![$\\])\$(?!\$)((?:\\.|[^$\\])+?)\$(?!\$)|\{math\}`[^`]*`")
# Display math: a message that is a formula block. Sphinx extracts a math block's source as
# it is, starting with the line break after $$ (a paragraph's message is stripped), or with
# the amsmath environment written without $$.
DISPLAY_MATH = re.compile(r"^(\n|\s*\$\$|\s*\\begin\{)")


def extract(out: Path = GETTEXT) -> Path:
    """Extract the book's messages into ``.pot`` templates, one per page.

    Args:
        out: jupyter-book's output folder (``--path-output``); emptied first.

    Returns:
        The folder of the templates (``<page>.pot`` beside the page's path).

    Raises:
        RuntimeError: if the extraction fails (with the end of its output).
    """
    from build_book import jupyter_book

    shutil.rmtree(out, ignore_errors=True)
    config = editions.write(editions.EXTRACTION, out / "config.yml")
    result = subprocess.run(
        [jupyter_book(), "build", ".", "--all", "--builder", "custom", "--custom-builder",
         "gettext", "--config", str(config), "--path-output", str(out)],
        cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"message extraction failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return out / "_build" / "gettext"


def update(templates: Path, language: Language) -> None:
    """Merge the templates into a language's catalogs (``sphinx-intl update``), creating
    them on the language's first update. A paragraph that moved to another page (a page
    split in two, a section moved) keeps its translation: every catalog's finished
    translations, read before the merge, serve as a compendium for the messages the merge
    left untranslated or fuzzy, when the English is exactly the same.

    Args:
        templates: the folder ``extract`` returned.
        language: a translated edition's language.
    """
    known = _translations(language.catalogs)
    subprocess.run([sys.executable, "-m", "sphinx_intl", "update", "-p", str(templates),
                    "-l", language.code, "-d", str(LOCALES), "-w", "0", "-j", "1"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    paths = sorted(language.catalogs.rglob("*.po"))
    held = {}
    for path in paths:
        with path.open("rb") as f:
            held[path] = read_po(f)
    live = {message.id for catalog in held.values() for message in catalog if message.id}
    for path, catalog in held.items():
        filled = 0
        for message in catalog:
            if message.id and message.id in known and (not message.string or message.fuzzy):
                message.string = known[message.id]
                message.flags.discard("fuzzy")
                message.previous_id = []
                filled += 1
        moved = [key for key in catalog.obsolete if key in live]  # now on another page
        for key in moved:
            del catalog.obsolete[key]
        if filled or moved:
            with path.open("wb") as f:
                write_po(f, catalog, width=0, omit_header=False)


def _translations(catalogs: Path) -> dict[str, str]:
    """Every finished translation (not fuzzy) of the catalogs in a folder, by English text."""
    found = {}
    for path in sorted(catalogs.rglob("*.po")):
        with path.open("rb") as f:
            for message in read_po(f):
                if message.id and message.string and not message.fuzzy:
                    found.setdefault(message.id, message.string)
    return found


def _extension(name: str):
    """A module of ``_ext/`` (the book's Sphinx extensions, not a package)."""
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def update_quiz(language: Language) -> Path:
    """Bring a language's ``quiz.po`` in step with the quizzes' own words (``UI_STRINGS`` of
    ``_ext/quiz.py``: the buttons and messages of every quiz): new words arrive untranslated,
    changed ones fuzzy beside the old translation, words no longer used are dropped.

    Args:
        language: a translated edition's language.

    Returns:
        The catalog's path.
    """
    template = Catalog(project=language.title, fuzzy=False)
    for name, text in _extension("quiz").UI_STRINGS.items():
        template.add(text, locations=[(f"_ext/quiz.py:{name}", 0)])
    return _merge(template, catalog(QUIZ, language.catalogs), language)


def _merge(template: Catalog, path: Path, language: Language) -> Path:
    """Merge ``template`` into the catalog at ``path`` (made if missing), obsolete ones out."""
    if path.exists():
        with path.open("rb") as f:
            held = read_po(f)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        held = Catalog(locale=language.code, project=language.title, fuzzy=False)
    held.update(template, update_header_comment=False, update_creation_date=False)
    held.obsolete.clear()
    with path.open("wb") as f:
        write_po(f, held, width=0, omit_header=False)
    return path


def _i18n_widgets():
    """``_ext/i18n_widgets.py``: where the explorers' words are in a widget state."""
    return _extension("i18n_widgets")


def widget_messages(html: Path = SOURCE_HTML) -> dict[str, list[str]]:
    """The explorers' words on each page of the built source edition (see
    _ext/i18n_widgets.py).

    Args:
        html: the English edition's folder (``make book`` writes it).

    Returns:
        Page (path without suffix) -> the strings of its widget state, in order; pages
        without widgets are left out.

    Raises:
        FileNotFoundError: if the English edition has not been built.
    """
    if not (html / "index.html").exists():
        raise FileNotFoundError(f"{html} holds no built book: run `make book` first")
    widgets = _i18n_widgets()
    found = {}
    for path in sorted(html.glob("chapters/*.html")):
        state = widgets.page_state(path.read_text(encoding="utf-8"))
        if state is not None:
            found[f"chapters/{path.stem}"] = widgets.strings(state["state"])
    return found


def update_widgets(language: Language, html: Path = SOURCE_HTML) -> Path:
    """Bring a language's ``widgets.po`` in step with the explorers' words of the built
    source edition: new strings arrive untranslated, changed ones fuzzy beside the old
    translation, and strings no page shows any more are dropped.

    Args:
        language: a translated edition's language.
        html: as in ``widget_messages``.

    Returns:
        The catalog's path.
    """
    template = Catalog(project=language.title, fuzzy=False)
    for page, texts in widget_messages(html).items():
        for text in texts:
            template.add(text, locations=[(page, 0)])
    return _merge(template, catalog(WIDGETS, language.catalogs), language)


def catalog(page: str, catalogs: Path) -> Path:
    """The catalog of a page, e.g. ``chapters/01_attention`` (a path without suffix), in a
    language's folder of catalogs (``Language.catalogs``)."""
    return catalogs / f"{page}.po"


def inline_math(text: str) -> Counter:
    """The inline formulas of a message, counted (their order may change in a translation)."""
    return Counter(match.group(0) for match in _INLINE_MATH.finditer(text))


_MARKDOWN = MarkdownIt("commonmark").use(dollarmath_plugin)
_MARKUP = ("strong_open", "em_open", "code_inline", "link_open")


def markup(text: str) -> Counter:
    """The inline markup of a message as MyST parses it: bold, italics, inline code and links,
    counted. A translation must keep them: CommonMark's rules for ``**`` and ``*`` next to
    Chinese punctuation can leave the asterisks as text."""
    found: Counter = Counter()
    for token in _MARKDOWN.parseInline(text):
        found.update(child.type for child in token.children or [] if child.type in _MARKUP)
    return found


def problems(page: str, catalogs: Path) -> list[str]:
    """What is wrong with a page's translation, one line per message.

    Args:
        page: the page's path without suffix.
        catalogs: the language's folder of catalogs (``Language.catalogs``).

    Returns:
        Lines naming each untranslated, fuzzy, math-changing or display-math-translating
        message (empty when the page is finished).
    """
    path = catalog(page, catalogs)
    if not path.exists():
        return [f"{page}: no catalog ({path.name})"]
    with path.open("rb") as f:
        messages = [m for m in read_po(f) if m.id]
    found = []
    for message in messages:
        where = f"{page}:{message.lineno or '?'}: {str(message.id)[:60]!r}"
        if DISPLAY_MATH.search(message.id):
            if message.string and message.string != message.id:
                found.append(f"{where}: display math must stay untranslated")
        elif not message.string:
            found.append(f"{where}: untranslated")
        elif message.fuzzy:
            found.append(f"{where}: fuzzy (the English changed)")
        elif inline_math(message.id) != inline_math(message.string):
            found.append(f"{where}: the inline math differs from the English")
        elif markup(message.id) != markup(message.string):
            found.append(f"{where}: bold, italics, code or links differ from the English")
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tools/i18n messages",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("update", "check"))
    args = parser.parse_args(argv)
    if args.command == "update":
        templates = extract()
        for language in translations():
            update(templates, language)
            print(f"catalogs updated: {language.catalogs.relative_to(ROOT)}")
        for language in translations():
            path = update_quiz(language)
            print(f"the quizzes' words updated: {path.relative_to(ROOT)}")
        for language in translations():
            try:
                path = update_widgets(language)
            except FileNotFoundError as error:  # the pages' catalogs are done all the same
                print(f"explorers' words not updated: {error}")
                return 0
            print(f"explorers' words updated from the built source edition: "
                  f"{path.relative_to(ROOT)}")
        return 0
    found, summary = [], []
    for language in translations():
        pages = complete(language)
        checked = (*pages, WIDGETS, QUIZ) if pages else ()
        found += [f"{language.code}: {line}" for page in checked
                  for line in problems(page, language.catalogs)]
        summary.append(f"{language.code}: {len(pages)} translated pages"
                       + (" and the explorers' and quizzes' words" if pages else "")
                       + " complete")
    print("\n".join(found or summary))
    return 1 if found else 0
