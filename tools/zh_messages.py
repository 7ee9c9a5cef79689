"""The Chinese edition's message catalogs: extracted from the English pages, and checked.

    python tools/zh_messages.py update   # extract the messages, bring locales/zh_CN in step
    python tools/zh_messages.py check    # list what is missing in the translated pages

The English notebooks and pages are the only source. ``update`` extracts their Markdown (prose,
headings, admonitions, exercises; one message per paragraph, inline math inside its message;
code is not extracted) into ``.pot`` templates with Sphinx's gettext builder (nothing is
executed), then ``sphinx-intl update`` merges them into one catalog per page,
``locales/zh_CN/LC_MESSAGES/<page>.po``: a new English paragraph arrives untranslated, a
changed one arrives marked fuzzy with the old translation beside it, and the Chinese edition
shows both in English until a translator deals with them. A change to English text therefore
runs ``update`` and commits the catalogs with it (CONTRIBUTING.md).

The explorers' own words (captions, control names, option labels) are not in the pages'
Markdown but in the saved state of their widgets: ``update`` also collects them from the
built English edition (``_build/html``, so after ``make book``) into one more catalog,
``widgets.po``, which the Chinese build applies (``_ext/zh_widgets.py``).

``COMPLETE`` lists the pages whose translation is finished; ``check`` (and tests/test_zh.py)
fail when one of their messages is untranslated or fuzzy, when a translation's inline math
differs from its English message's, when its bold, italics, inline code or links do (as MyST
parses them), or when display math was translated.
"""
from __future__ import annotations

import argparse
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

import zh_config
from build_book import jupyter_book

ROOT = Path(__file__).resolve().parent.parent
CATALOGS = ROOT / "locales" / zh_config.LANGUAGE / "LC_MESSAGES"
GETTEXT = ROOT / "_build" / "gettext"  # jupyter-book's output folder of the extraction
ENGLISH_HTML = ROOT / "_build" / "html"  # the English edition, as `make book` writes it
WIDGETS = "widgets"  # the catalog of the explorers' words (_ext/zh_widgets.py)

# The pages whose Chinese translation is finished: every message translated, none fuzzy.
COMPLETE: tuple[str, ...] = (
    "intro",
    "chapters/00_setup", "chapters/01_attention", "chapters/02_qkv_roles",
    "chapters/03_multi_head", "chapters/04_normalisation", "chapters/05_positional",
    "chapters/06_modern_decoder", "chapters/07_kv_cache", "chapters/08_fast_attention",
    "chapters/09_attention_variants",
    "appendix/notation", "appendix/glossary", "appendix/references",
    "appendix/interactive_figures", "appendix/exercise_notebooks", "appendix/instructors",
    "appendix/ledger",
)

# Inline math in a message: $...$ (not $$), or MyST's {math}`...` role.
_INLINE_MATH = re.compile(r"(?<![$\\])\$(?!\$)((?:\\.|[^$\\])+?)\$(?!\$)|\{math\}`[^`]*`")
# Display math: a message that is a formula block. Sphinx extracts a math block's source as
# it is, starting with the line break after $$ (a paragraph's message is stripped), or with
# the amsmath environment written without $$.
_DISPLAY_MATH = re.compile(r"^(\n|\s*\$\$|\s*\\begin\{)")


def extract(out: Path = GETTEXT) -> Path:
    """Extract the book's messages into ``.pot`` templates, one per page.

    Args:
        out: jupyter-book's output folder (``--path-output``); emptied first.

    Returns:
        The folder of the templates (``<page>.pot`` beside the page's path).

    Raises:
        RuntimeError: if the extraction fails (with the end of its output).
    """
    shutil.rmtree(out, ignore_errors=True)
    config = zh_config.write("gettext", out / "config.yml")
    result = subprocess.run(
        [jupyter_book(), "build", ".", "--all", "--builder", "custom", "--custom-builder",
         "gettext", "--config", str(config), "--path-output", str(out)],
        cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"message extraction failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return out / "_build" / "gettext"


def update(templates: Path) -> None:
    """Merge the templates into the catalogs (``sphinx-intl update``).

    Args:
        templates: the folder ``extract`` returned.
    """
    subprocess.run([sys.executable, "-m", "sphinx_intl", "update", "-p", str(templates),
                    "-l", zh_config.LANGUAGE, "-d", str(ROOT / "locales"), "-w", "0", "-j", "1"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def _zh_widgets():
    """``_ext/zh_widgets.py``: where the explorers' words are in a widget state."""
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        import zh_widgets
    finally:
        sys.path.pop(0)
    return zh_widgets


def widget_messages(html: Path = ENGLISH_HTML) -> dict[str, list[str]]:
    """The explorers' words on each page of the built English edition (see _ext/zh_widgets.py).

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
    zh_widgets = _zh_widgets()
    found = {}
    for path in sorted(html.glob("chapters/*.html")):
        state = zh_widgets.page_state(path.read_text(encoding="utf-8"))
        if state is not None:
            found[f"chapters/{path.stem}"] = zh_widgets.strings(state["state"])
    return found


def update_widgets(html: Path = ENGLISH_HTML) -> Path:
    """Bring ``widgets.po`` in step with the explorers' words of the built English edition:
    new strings arrive untranslated, changed ones fuzzy beside the old translation, and
    strings no page shows any more are dropped.

    Args:
        html: as in ``widget_messages``.

    Returns:
        The catalog's path.
    """
    template = Catalog(project=zh_config.TITLE, fuzzy=False)
    for page, texts in widget_messages(html).items():
        for text in texts:
            template.add(text, locations=[(page, 0)])
    path = catalog(WIDGETS)
    if path.exists():
        with path.open("rb") as f:
            held = read_po(f)
    else:
        held = Catalog(locale=zh_config.LANGUAGE, project=zh_config.TITLE, fuzzy=False)
    held.update(template, update_header_comment=False, update_creation_date=False)
    held.obsolete.clear()
    with path.open("wb") as f:
        write_po(f, held, width=0, omit_header=False)
    return path


def catalog(page: str) -> Path:
    """The catalog of a page, e.g. ``chapters/01_attention`` (a path without suffix)."""
    return CATALOGS / f"{page}.po"


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


def problems(page: str) -> list[str]:
    """What is wrong with a page's translation, one line per message.

    Args:
        page: the page's path without suffix.

    Returns:
        Lines naming each untranslated, fuzzy, math-changing or display-math-translating
        message (empty when the page is finished).
    """
    path = catalog(page)
    if not path.exists():
        return [f"{page}: no catalog ({path.name})"]
    with path.open("rb") as f:
        messages = [m for m in read_po(f) if m.id]
    found = []
    for message in messages:
        where = f"{page}:{message.lineno or '?'}: {str(message.id)[:60]!r}"
        if _DISPLAY_MATH.search(message.id):
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("update", "check"))
    args = parser.parse_args(argv)
    if args.command == "update":
        update(extract())
        print(f"catalogs updated: {CATALOGS.relative_to(ROOT)}")
        try:
            path = update_widgets()
        except FileNotFoundError as error:  # the pages' catalogs are done all the same
            print(f"explorers' words not updated: {error}")
            return 0
        print(f"explorers' words updated from the built English edition: {path.relative_to(ROOT)}")
        return 0
    found = [line for page in (*COMPLETE, WIDGETS) for line in problems(page)]
    print("\n".join(found) or f"{len(COMPLETE)} translated pages and the explorers' words complete")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
