"""The translated editions' notebooks for Colab, Binder and download, written from the
source ones.

    python tools/i18n notebooks --write   # write <folder>/chapters and <folder>/exercises
    python tools/i18n notebooks --check   # exit 1 and list the notebooks that are stale

A translated edition's pages are built from the source notebooks and the catalogs of
``locales/<code>``; a reader who opens one of its pages in Colab, in Binder or as a download
should get the same text. For every translated language and every chapter, this writes
``<folder>/chapters/<name>.ipynb`` from ``chapters/<name>.ipynb`` and
``<folder>/exercises/<name>.ipynb`` from the student copy ``exercises/<name>.ipynb``: every
Markdown cell with each translated message of the chapter's catalog put in place of its
English text (a message is found across the cell's line breaks and indentation), and the
student copies' exercise headings in the language's words (its entry's ``exercise``); code
cells, outputs and metadata are left exactly as they are, so a student copy keeps the
chapter id the grader reads, and the code is byte for byte the source's (CI executes the
source notebooks only). Messages without a translation, fuzzy ones and display math stay
English. The folders lie outside ``chapters/``, so nbval does not collect them.

A translated edition's launch buttons open these notebooks (``repository.path_to_book`` in
the config of ``tools/i18n/editions.py``), and ``tools/build_book.py`` serves them as the
pages' downloads. ``tests/test_i18n.py`` checks that regenerating them changes nothing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from babel.messages.pofile import read_po

from i18n import languages, messages
from i18n.languages import ROOT, Language

SOURCES = ("chapters", "exercises")


def translations(page: str, language: Language) -> list[tuple[str, str]]:
    """The usable translations of a page's catalog, longest English text first.

    Args:
        page: the page's path without suffix, e.g. ``chapters/01_attention``.
        language: a translated edition's language.

    Returns:
        ``(english, translated)`` pairs: translated, not fuzzy, not display math, and
        different from the English (so that a message kept as it is, such as ``B``, is not
        searched for).
    """
    path = messages.catalog(page, language.catalogs)
    if not path.exists():
        return []
    with path.open("rb") as f:
        usable = [m for m in read_po(f) if m.id and m.string and not m.fuzzy]
    pairs = [(m.id, m.string) for m in usable
             if m.string != m.id and not messages.DISPLAY_MATH.search(m.id)]
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _pattern(english: str) -> re.Pattern:
    """The English message as it stands in a Markdown cell: its spaces may be line breaks
    followed by indentation, and it is not part of a longer word."""
    words = [re.escape(word) for word in english.split(" ")]
    return re.compile(r"(?<![\w])" + r"\s+".join(words) + r"(?![\w])")


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def _segments(source: str) -> list[tuple[bool, str]]:
    """The cell's text cut into ``(is_code, text)`` runs of whole lines. Code is what a
    fence without a directive holds (```python, ```bash, a plain ```): a solution's code
    inside a ````{solution} directive is code, the directive's prose around it is not."""
    segments: list[tuple[bool, str]] = []
    code_fence = None  # the fence that opened the code block we are in
    for line in source.splitlines(keepends=True):
        match = _FENCE.match(line)
        if code_fence is None:
            is_code = False
            if match and not match.group(2).strip().startswith("{"):
                code_fence, is_code = match.group(1), True
        else:
            is_code = True
            if match and match.group(1)[0] == code_fence[0] \
                    and len(match.group(1)) >= len(code_fence) and not match.group(2).strip():
                code_fence = None
        if segments and segments[-1][0] == is_code:
            segments[-1] = (is_code, segments[-1][1] + line)
        else:
            segments.append((is_code, line))
    return segments


def translate_markdown(source: str, pairs: list[tuple[str, str]]) -> str:
    """A Markdown cell's text with every message of ``pairs`` translated, code blocks left
    as they are.

    Args:
        source: the cell's text.
        pairs: ``translations(page)``.

    Returns:
        The text with each English message replaced by its translation (on one line).
    """
    out = []
    for is_code, text in _segments(source):
        if not is_code:
            for english, translated in pairs:
                text = _pattern(english).sub(lambda _match, new=translated: new, text)
        out.append(text)
    return "".join(out)


# A student copy's exercise heading (tools/make_student.py), whose title the catalog translates.
_EXERCISE_HEAD = re.compile(r"^\*\*Exercise (\d+)(?: \((.*)\))?\*\*", re.M)


def exercise_heading(match: re.Match, language: Language) -> str:
    """A student copy's exercise heading in the language's words (its entry's ``exercise``:
    ``heading`` and ``titled``); the heading as it is when the entry gives none."""
    number, title = match.group(1), match.group(2)
    template = language.exercise.get("titled" if title else "heading")
    if not template:
        return match.group(0)
    return "**" + template.format(number=number, title=title) + "**"


def translated_notebook(path: Path, page: str, language: Language) -> str:
    """The text of the translated copy of the notebook at ``path``.

    Args:
        path: a source notebook (a chapter or its student copy).
        page: the chapter's page, whose catalog translates it.
        language: a translated edition's language.

    Returns:
        The notebook's JSON, written as the English notebooks are (indent 1, UTF-8, final
        line break).
    """
    notebook = json.loads(path.read_text(encoding="utf-8"))
    pairs = translations(page, language)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = translate_markdown("".join(cell["source"]), pairs)
            text = _EXERCISE_HEAD.sub(lambda match: exercise_heading(match, language), text)
            cell["source"] = text.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def targets() -> dict[Path, str]:
    """Every translated notebook this module writes, with its text."""
    found = {}
    for language in languages.translations():
        for folder in SOURCES:
            for path in sorted((ROOT / folder).glob("[0-9][0-9]*_*.ipynb")):
                page = f"chapters/{path.stem}"
                found[ROOT / language.folder / folder / path.name] = translated_notebook(
                    path, page, language)
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tools/i18n notebooks",
                                     description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for path, text in targets().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if args.write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("stale (run python tools/i18n notebooks --write):\n" + "\n".join(stale))
        return 1
    print(f"{len(stale)} written" if args.write else "up to date")
    return 0
