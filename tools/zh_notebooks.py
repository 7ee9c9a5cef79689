"""The Chinese notebooks for Colab, Binder and download, written from the English ones.

    python tools/zh_notebooks.py --write   # write zh/chapters/*.ipynb and zh/exercises/*.ipynb
    python tools/zh_notebooks.py --check   # exit 1 and list the notebooks that are stale

The Chinese edition's pages are built from the English notebooks and the catalogs of
``locales/zh_CN``; a reader who opens a Chinese page in Colab, in Binder or as a download
should get the same text. This script writes, for every chapter, ``zh/chapters/<name>.ipynb``
from ``chapters/<name>.ipynb`` and ``zh/exercises/<name>.ipynb`` from the student copy
``exercises/<name>.ipynb``: every Markdown cell with each translated message of the chapter's
catalog put in place of its English text (a message is found across the cell's line breaks
and indentation); code cells, outputs and metadata are left exactly as they are, so a student
copy keeps the chapter id the grader reads, and the code is byte for byte the English one
(CI executes the English notebooks only). Messages without a translation, fuzzy ones and
display math stay English. The folder ``zh/`` lies outside ``chapters/``, so nbval does not
collect it.

The Chinese edition's launch buttons open these notebooks (``repository.path_to_book: zh`` in
the config of ``tools/zh_config.py``), and ``tools/build_book.py`` serves them as the pages'
downloads. ``tests/test_zh.py`` checks that regenerating them changes nothing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from babel.messages.pofile import read_po

import zh_messages

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "zh"
SOURCES = ("chapters", "exercises")


def translations(page: str) -> list[tuple[str, str]]:
    """The usable translations of a page's catalog, longest English text first.

    Args:
        page: the page's path without suffix, e.g. ``chapters/01_attention``.

    Returns:
        ``(english, chinese)`` pairs: translated, not fuzzy, not display math, and different
        from the English (so that a message kept as it is, such as ``B``, is not searched for).
    """
    path = zh_messages.catalog(page)
    if not path.exists():
        return []
    with path.open("rb") as f:
        messages = [m for m in read_po(f) if m.id and m.string and not m.fuzzy]
    pairs = [(m.id, m.string) for m in messages
             if m.string != m.id and not zh_messages._DISPLAY_MATH.search(m.id)]
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
            for english, chinese in pairs:
                text = _pattern(english).sub(lambda _match, zh=chinese: zh, text)
        out.append(text)
    return "".join(out)


# A student copy's exercise heading (tools/make_student.py), whose title the catalog translates.
_EXERCISE_HEAD = re.compile(r"^\*\*Exercise (\d+)(?: \((.*)\))?\*\*", re.M)


def _exercise_head(match: re.Match) -> str:
    title = f"（{match.group(2)}）" if match.group(2) else ""
    return f"**练习 {match.group(1)}{title}**"


def translated_notebook(path: Path, page: str) -> str:
    """The text of the Chinese copy of the notebook at ``path``.

    Args:
        path: an English notebook (a chapter or its student copy).
        page: the chapter's page, whose catalog translates it.

    Returns:
        The notebook's JSON, written as the English notebooks are (indent 1, UTF-8, final
        line break).
    """
    notebook = json.loads(path.read_text(encoding="utf-8"))
    pairs = translations(page)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = translate_markdown("".join(cell["source"]), pairs)
            text = _EXERCISE_HEAD.sub(_exercise_head, text)
            cell["source"] = text.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def targets() -> dict[Path, str]:
    """Every Chinese notebook this script writes, with its text."""
    found = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            page = f"chapters/{path.stem}"
            found[OUT / folder / path.name] = translated_notebook(path, page)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        print("stale (run python tools/zh_notebooks.py --write):\n" + "\n".join(stale))
        return 1
    print(f"{len(stale)} written" if args.write else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
