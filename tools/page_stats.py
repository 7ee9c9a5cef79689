"""How long each page of the book is: its words of prose, its visible code, its opening, its
self-checks and its exercises.

    python tools/page_stats.py              # one row per page of chapters/
    python tools/page_stats.py --sections   # and, under each page, its ## sections' words
    python tools/page_stats.py --max 4500   # exit 1 if a page (chapter 0 aside) is longer

Prose is the Markdown cells' words, directives (exercises, admonitions, answers) included,
code blocks, display math, directive options and a quiz's feedback (shown one answer at a
time) left out; a word is a run of letters (inline
math's letters count, as a reader reads them). Visible code is the lines of code cells a
reader sees (cells tagged ``remove-cell`` or ``remove-input`` are not shown). The opening is
the "After this page you can" list (or "this chapter"); a self-check is a question under
"## Self-check"; an exercise is an ``{exercise}`` directive, named by its label.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import quizzes

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
WHOLE = ("00_setup",)  # pages that stay one page whatever their length

_CODE_FENCE = re.compile(r"^(`{3,}|~{3,})(?!\{)[^\n]*\n.*?^\1\s*$", re.M | re.S)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_OPTION = re.compile(r"^:[\w-]+:.*$", re.M)
_DIRECTIVE_FENCE = re.compile(r"^(`{3,}|~{3,})(\{[\w-]+\})?", re.M)  # the title after it is prose
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")
_LABEL = re.compile(r"```\{exercise\}[^\n]*\n:label: ([\w-]+)")
_QUESTION = re.compile(r"^\*\*\d+\.\*\*", re.M)
_HEADING = re.compile(r"^##[ \t]+(.+)$", re.M)
OPENING = re.compile(r"\*\*After this (?:page|chapter) you can\*\*")


def prose_words(markdown: str) -> int:
    """The words a reader reads in a Markdown cell (code, display math and options aside)."""
    text = _CODE_FENCE.sub("", markdown)
    text = _DISPLAY_MATH.sub("", text)
    text = _OPTION.sub("", text)
    text = _DIRECTIVE_FENCE.sub("", text)
    return len(_WORD.findall(text))


@dataclass
class Page:
    name: str
    words: int = 0
    code_lines: int = 0
    opening: bool = False
    self_checks: int = 0
    exercises: list[str] = field(default_factory=list)
    sections: list[tuple[str, int]] = field(default_factory=list)


def measure(path: Path) -> Page:
    """One page's numbers (see the module's docstring)."""
    page = Page(path.stem)
    in_self_check = False
    for cell in nbformat.read(path, as_version=4).cells:
        source = cell.source
        if cell.cell_type == "code":
            tags = cell.metadata.get("tags", [])
            if "remove-cell" not in tags and "remove-input" not in tags:
                page.code_lines += len(source.splitlines())
            continue
        quiz = quizzes.parse(source)
        if quiz is not None:  # its feedback is read one answer at a time: not counted
            source = "\n\n".join([quiz.question, *(shown for shown, _ in quiz.answers)])
        # The words before a cell's first ## heading belong to the section above it.
        pieces = _HEADING.split(source)
        for index, piece in enumerate(pieces):
            if index % 2:  # a heading's title
                page.sections.append((piece.strip(), 0))
                in_self_check = piece.strip() == "Self-check"
                continue
            words = prose_words(piece)
            page.words += words
            if page.sections:
                title, count = page.sections[-1]
                page.sections[-1] = (title, count + words)
            if in_self_check:
                page.self_checks += len(_QUESTION.findall(piece))
        page.opening |= bool(OPENING.search(source))
        page.exercises += _LABEL.findall(source)
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", action="store_true", help="each ## section's words")
    parser.add_argument("--max", type=int, help="fail when a page has more words than this")
    args = parser.parse_args(argv)
    pages = [measure(path) for path in sorted(CHAPTERS.glob("*.ipynb"))]
    print(f"{'page':30s} {'words':>6s} {'code':>5s} {'opening':>8s} {'checks':>7s}  exercises")
    for page in pages:
        print(f"{page.name:30s} {page.words:6d} {page.code_lines:5d} "
              f"{'yes' if page.opening else 'NO':>8s} {page.self_checks:7d}  "
              f"{len(page.exercises)}: {', '.join(page.exercises)}")
        if args.sections:
            for title, words in page.sections:
                print(f"    {words:6d}  {title}")
    too_long = [page for page in pages
                if args.max and page.name not in WHOLE and page.words > args.max]
    for page in too_long:
        print(f"{page.name}: {page.words} words, over {args.max}", file=sys.stderr)
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
