"""The self-check quizzes as Markdown text: what the student copies and the Colab copies need.

    python tools/quizzes.py   # list every chapter's quizzes: kind, right answer or key

A quiz is a Markdown cell that is one ``{quiz}`` directive (``_ext/quiz.py`` reads and draws it
in the book): options (``:answer: N``, or ``:key: NAME`` for a number), the question, then a
list whose items are the answers, each its answer as shown (first paragraph) and its feedback
(the paragraphs under it, indented two spaces).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_OPEN = re.compile(r"^(`{3,}|:{3,})\{quiz\}[ \t]*$")
_OPTION = re.compile(r"^:([\w-]+):[ \t]*(.*)$")
_ITEM = re.compile(r"^[-*+][ \t]+")


@dataclass
class Quiz:
    """A quiz's parts as written."""

    options: dict[str, str]
    question: str  # the paragraphs before the list
    answers: list[tuple[str, str]]  # (the answer as shown, its feedback), in order

    @property
    def numeric(self) -> bool:
        return "key" in self.options


def parse(source: str) -> Quiz | None:
    """The quiz that a Markdown cell is, or None when it is not exactly one ``{quiz}``.

    Raises:
        ValueError: for a quiz cell without a list of answers.
    """
    lines = source.strip("\n").split("\n")
    opening = _OPEN.match(lines[0]) if lines else None
    if not opening or len(lines) < 2 or lines[-1].strip() != opening.group(1):
        return None
    return parse_body(lines[1:-1])


def parse_body(lines: list[str]) -> Quiz:
    """A quiz from the lines inside its fences (options first)."""
    lines = list(lines)
    options = {}
    while lines and _OPTION.match(lines[0]):
        name, value = _OPTION.match(lines.pop(0)).groups()
        options[name] = value.strip()
    starts = [i for i, line in enumerate(lines) if _ITEM.match(line)]
    if not starts:
        raise ValueError("a {quiz} needs a list of answers after its question")
    question = "\n".join(lines[:starts[0]]).strip("\n")
    answers = []
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        item = [_ITEM.sub("", lines[start])] + [line[2:] if line.startswith("  ") else line
                                                 for line in lines[start + 1:end]]
        shown, _, feedback = "\n".join(item).strip("\n").partition("\n\n")
        answers.append((shown.strip(), feedback.strip("\n")))
    return Quiz(options, question, answers)


def student_markdown(quiz: Quiz) -> str:
    """A quiz in a student copy: the question and, for a multiple choice, the choices as a
    list; no key and no feedback."""
    if quiz.numeric:
        return quiz.question
    choices = "\n".join("- " + shown.replace("\n", "\n  ") for shown, _ in quiz.answers)
    return f"{quiz.question}\n\n{choices}"


def chapter_quizzes(chapters: Path = ROOT / "chapters") -> dict[str, list[Quiz]]:
    """Every chapter's quizzes, in page order (chapters without one left out)."""
    found = {}
    for path in sorted(chapters.glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        page = [quiz for quiz in (parse("".join(c["source"])) for c in cells
                                  if c["cell_type"] == "markdown") if quiz is not None]
        if page:
            found[path.stem] = page
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for page, found in chapter_quizzes().items():
        for number, quiz in enumerate(found, start=1):
            right = (f"key {quiz.options['key']}" if quiz.numeric
                     else f"answer {quiz.options.get('answer', '?')}")
            print(f"{page} quiz {number}: {len(quiz.answers)} answers, {right}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
