"""Student copies of the chapters: the same notebooks with the solutions taken out.

    python tools/make_student.py           # write exercises/<chapter>.ipynb for every chapter
    python tools/make_student.py --check   # exit 1 and name the copies that are out of date

An exercise in a chapter is four cells in a row:

1. Markdown: one ``{exercise}`` directive, titled ``Warm-up: ...``, ``Core: ...`` or
   ``Challenge: ...``, with a ``:label:`` unique in the book; the task says what to write;
2. code, tagged ``remove-cell``: the function with a docstring that states its contract
   (arguments, result, shapes) and never the solution; the reference code sits between
   ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers) inside the function.
   An exercise may ask for a class instead: its statement and docstring, then only methods,
   each with its signature and docstring followed by one solution region that holds the whole
   rest of its body (``__init__`` included), so that the stub keeps the outline and nothing
   of the code;
3. code, tagged ``remove-cell``: ``assert check_<name>(<name>)``;
4. Markdown: one ``{solution} <label>`` directive with ``:class: dropdown``, holding a fenced
   ``python`` block equal to cell 2 without its two marker lines, then why it works and the
   mistakes the checker recognises.

A capstone gathers the student's own functions from several chapters: a code cell tagged
``paste`` (and ``remove-cell``) holds the references of those functions, each body a solution
region, and is no exercise of its own (the capstone's exercises use them). In the copy it
becomes the stubs, where the student pastes the functions that passed in their chapters.

The book executes cells 2 and 3 without showing them and shows the reference code only in
the folded solution. A self-check answer is a Markdown cell of its own, tagged ``answer``,
holding one ``{admonition}`` directive with ``:class: dropdown``. A self-check question is
a Markdown cell that is one ``{quiz}`` directive (``_ext/quiz.py``); the keys of a page's
numeric quizzes are computed by one code cell tagged ``quiz-keys``.

What changes from a chapter (``chapters/*.ipynb``) to its student copy:

- the lines between the two markers become ``# YOUR CODE HERE`` and
  ``raise NotImplementedError()``, indented like the markers (in a class, every method's
  body becomes this stub);
- a Markdown cell holding a ``{solution}`` directive, a Markdown cell tagged ``answer``, the
  cell tagged ``quiz-keys`` and every cell tagged ``instructor`` are left out;
- a ``{quiz}`` cell becomes its question and, for a multiple choice, its choices as a list
  (tools/quizzes.py): the right answer, the key's name and the feedback are left out;
- ``assert check_...(...)`` becomes a plain call, so that an unfinished exercise is reported
  by its checker ("not attempted yet") instead of stopping the notebook;
- the cell with a solution region (now the stub) and the cell with a check lose the tags
  that hide them in the book (``remove-cell``, ``remove-input``, ``hide-input``,
  ``hide-cell``), so the student sees them;
- a Markdown cell that is one ``{exercise}`` directive becomes plain Markdown headed
  "**Exercise N (title)**", numbered in page order as the book numbers them, since Jupyter
  and Colab do not render MyST directives;
- the copy's metadata names its chapter, the library version and the ids of its exercises
  (``metadata["transformer_lib"]``: ``{"chapter": "01_attention", "version": "0.2.0",
  "exercises": ["attention-ex-masked-softmax", ...]}``; an exercise's id is its
  ``:label:``), and its setup cell installs the library at the tag ``v<version>`` instead
  of the branch, so handouts do not change under the students when the course moves on;
- outputs and execution counts are cleared. Every other cell is kept as it is.

The chapters are only read. The same chapters give byte-identical copies, and copies whose
chapter is gone are removed. A marker out of place (an END without a BEGIN, a BEGIN without
an END, one region inside another, a region outside a function), a class with a solution
region that holds anything but its docstring and methods, or a method of it whose body is not
its docstring and one region, a ``{solution}`` directive that is not a cell of its own, or a
code cell tagged ``answer`` stops the script with the notebook, the cell and the line, before
anything is written.
"""
from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat
import quizzes

from setup_cell import is_setup_cell, setup_cell_source

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "chapters"
STUDENT_DIR = ROOT / "exercises"

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
INSTRUCTOR_TAG = "instructor"
ANSWER_TAG = "answer"
PASTE_TAG = "paste"  # a capstone's cell of functions written in earlier chapters
QUIZ_KEYS_TAG = "quiz-keys"  # the code cell that computes a self-check's numeric keys
# Tags that hide a cell or its code in the book; taken off the stub and the check cell.
HIDING_TAGS = ("remove-cell", "remove-input", "hide-input", "hide-cell")
_SOLUTION_OPEN = re.compile(r"^(`{3,}|:{3,})\{solution\}")
_EXERCISE_OPEN = re.compile(r"^(`{3,}|:{3,})\{exercise\}\s*(.*)$")
_OPTION = re.compile(r"^:[\w-]+:")
_LABEL = re.compile(r"^:label:\s*(\S+)", re.M)
_CHECK_ASSERT = re.compile(r"^(\s*)assert\s+(check_\w+\(.*\))\s*$")
_CHECKED_FUNCTION = re.compile(r"^\s*assert\s+(check_\w+)\((\w+)\)\s*$")  # check_x(fn)


class MarkerError(ValueError):
    """A solution region or a solution directive that cannot be taken out cleanly."""


def _where(name: str, index: int, cell, line: int | None = None) -> str:
    first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
    at = f", line {line}" if line is not None else ""
    return f"{name}, cell {index} (counting from 0, starts {first[:40]!r}){at}"


def _marked_lines(source: str, where: str = "<cell>"):
    """The lines of a code cell's ``source``, each as ``(kind, line)``.

    ``kind`` is ``"begin"`` or ``"end"`` for a marker, ``"solution"`` for a line between two
    markers and ``"code"`` for any other line. A marker out of place raises
    :class:`MarkerError` naming ``where`` and the line."""
    begin_line = None  # line number of the open region's BEGIN marker, if inside one
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if begin_line is not None:
                raise MarkerError(f"{where}, line {number}: {BEGIN!r} inside the region opened "
                                  f"at line {begin_line}; close it with {END!r} first")
            if not line[: len(line) - len(line.lstrip())]:
                raise MarkerError(f"{where}, line {number}: a solution region at the top level; "
                                  "put it inside the function the student completes, or the "
                                  "student copy stops at this cell")
            begin_line = number
            yield "begin", line
        elif marker == END:
            if begin_line is None:
                raise MarkerError(f"{where}, line {number}: {END!r} without a {BEGIN!r} before it")
            begin_line = None
            yield "end", line
        else:
            yield ("code" if begin_line is None else "solution"), line
    if begin_line is not None:
        raise MarkerError(f"{where}, line {begin_line}: {BEGIN!r} without an {END!r} after it")


def _check_classes(source: str, where: str = "<cell>") -> None:
    """In a code cell with a solution region, each class that holds a region is an exercise's
    outline: its docstring and methods only, and each method its docstring followed by exactly
    one solution region that holds the rest of its body, so that the stub keeps the class
    statement and each method's signature and docstring and nothing of the code. Anything
    else raises :class:`MarkerError` naming ``where`` and the line."""
    kinds = [kind for kind, _ in _marked_lines(source, where)]  # kinds[n - 1]: line n
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax: no class to look at
        return
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or "begin" not in kinds[
                node.lineno - 1:node.end_lineno + 1]:
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        for item in body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                raise MarkerError(f"{where}, line {item.lineno}: class {node.name} holds "
                                  "something other than its docstring and methods; the "
                                  "student copy keeps only those")
            name = f"{node.name}.{item.name}"
            if ast.get_docstring(item) is None:
                raise MarkerError(f"{where}, line {item.lineno}: {name} has no docstring; in "
                                  "a class exercise each method states its contract in one")
            start = item.body[0].end_lineno + 1  # the line after the docstring
            end = next((n for n in range(start, len(kinds) + 1) if kinds[n - 1] == "end"),
                       None)
            rest = kinds[start - 1:end]
            if (end is None or rest.count("begin") != 1 or item.end_lineno > end
                    or any(k == "code" and line.strip() for k, line in zip(
                        rest, source.split("\n")[start - 1:end]))):
                raise MarkerError(f"{where}, line {start}: the body of {name} after its "
                                  "docstring must be exactly one solution region, or its code "
                                  "reaches the student copy")


def strip_solutions(source: str, where: str = "<cell>") -> str:
    """Replace every solution region of a code cell's ``source`` by the stub."""
    if BEGIN in source:
        _check_classes(source, where)
    out: list[str] = []
    for kind, line in _marked_lines(source, where):
        if kind == "begin":
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + STUB[0], indent + STUB[1]]
        elif kind == "code":
            out.append(_CHECK_ASSERT.sub(r"\1\2", line))
    return "\n".join(out)


def solution_source(source: str, where: str = "<cell>") -> str:
    """A code cell's ``source`` with its two marker lines taken out: the reference solution as
    the book runs it (and as its ``{solution}`` directive shows it)."""
    if BEGIN in source:
        _check_classes(source, where)
    return "\n".join(line for kind, line in _marked_lines(source, where)
                     if kind in ("code", "solution"))


@dataclass(frozen=True)
class Exercise:
    """One exercise of a chapter: the function (or class) the student writes and its
    checker."""

    function: str  # the function (or class) the solution region sits in, e.g. "split_qkv"
    checker: str  # the checker the chapter asserts on it, e.g. "check_split_qkv"
    cell: int  # the index of the cell with the solution region
    solution: str  # that cell's source without the marker lines
    id: str = ""  # the label of the {exercise} directive before it: the exercise's id in the
    # book, which stays when the exercise moves to another page (the grader keys on it)


def exercises(nb, name: str = "<notebook>") -> list[Exercise]:
    """The exercises of chapter ``nb``, in page order: every function (or class) holding a
    solution region whose name a later code cell checks with ``assert check_<name>(<name>)``.

    Raises:
        MarkerError: a marker out of place, or a solution region whose function no cell
            checks."""
    checked = {}  # function -> checker, from every `assert check_x(fn)` of the chapter
    for cell in nb.cells:
        if cell.cell_type == "code":
            for line in cell.source.split("\n"):
                found = _CHECKED_FUNCTION.match(line)
                if found:
                    checked.setdefault(found.group(2), found.group(1))
    found_exercises = []
    label = ""  # the label of the last {exercise} directive
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and "{exercise}" in cell.source:
            found = _LABEL.search(cell.source)
            label = found.group(1) if found else ""
        if (cell.cell_type != "code" or BEGIN not in cell.source
                or PASTE_TAG in cell.get("metadata", {}).get("tags", [])):
            continue
        where = _where(name, index, cell)
        solution = solution_source(cell.source, where)
        functions = [node.name for node in ast.parse(solution).body
                     if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        names = [fn for fn in functions if fn in checked]
        if not names:
            raise MarkerError(f"{where}: no cell checks a function of this cell "
                              f"({', '.join(functions) or 'none defined'}) with "
                              "`assert check_<name>(<name>)`")
        found_exercises += [Exercise(fn, checked[fn], index, solution, label or fn)
                            for fn in names]
    return found_exercises


def _is_solution_cell(cell, where: str) -> bool:
    """A Markdown cell that is exactly one ``{solution}`` directive (to be left out)."""
    if cell.cell_type != "markdown" or "{solution" not in cell.source:
        return False
    lines = cell.source.strip().splitlines()
    opening = _SOLUTION_OPEN.match(lines[0])
    if not opening or lines[-1].strip() != opening.group(1):
        raise MarkerError(f"{where}: a {{solution}} directive must be a Markdown cell of its "
                          "own, from its opening fence to its closing one")
    return True


def exercise_as_markdown(source: str, number: int) -> str | None:
    """A cell that is exactly one ``{exercise}`` directive, as plain Markdown (else None)."""
    lines = source.strip().splitlines()
    opening = _EXERCISE_OPEN.match(lines[0]) if lines else None
    if not opening or len(lines) < 2 or lines[-1].strip() != opening.group(1):
        return None
    body = lines[1:-1]
    while body and _OPTION.match(body[0]):  # :label:, :class:, ...
        body.pop(0)
    title = opening.group(2).strip()
    head = f"**Exercise {number}" + (f" ({title})**" if title else "**")
    return "\n".join([head, *body])


def _has_check(source: str) -> bool:
    """Whether a code cell asserts a checker (``assert check_...(...)`` on a line of its own)."""
    return any(_CHECK_ASSERT.match(line) for line in source.split("\n"))


def _show(cell) -> None:
    """Take off ``cell`` the tags that hide it (or its code) in the book."""
    tags = [t for t in cell.metadata.get("tags", []) if t not in HIDING_TAGS]
    if tags:
        cell.metadata["tags"] = tags
    else:
        cell.metadata.pop("tags", None)


def library_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The version of transformer_lib the copies are made with (``[project].version``)."""
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]


def student_notebook(nb, name: str = "<notebook>", chapter: str | None = None,
                     version: str | None = None):
    """The student copy of notebook ``nb`` (which is left unchanged).

    ``chapter`` (the chapter's file stem) and ``version`` (the library's) are stamped into the
    copy's metadata (``metadata["transformer_lib"]``), where the grader finds the chapter
    whatever the file is called; with ``version`` the setup cell installs the library at the
    tag ``v<version>``, so a term's copies install the same library in week 12 as in week 1."""
    student = copy.deepcopy(nb)
    if chapter is not None:
        try:
            ids = [e.id for e in exercises(nb, name)]
        except MarkerError:  # a region no cell checks: no exercise to list (the rest below
            ids = []  # reports what is out of place)
        student.metadata["transformer_lib"] = {"chapter": chapter, "version": version,
                                               "exercises": ids}
    cells = []
    numbered = 0  # exercises so far
    for index, cell in enumerate(nb.cells):
        where = _where(name, index, cell)
        tags = cell.get("metadata", {}).get("tags", [])
        if INSTRUCTOR_TAG in tags or QUIZ_KEYS_TAG in tags:
            continue
        if ANSWER_TAG in tags:
            if cell.cell_type != "markdown":
                raise MarkerError(f"{where}: the tag {ANSWER_TAG!r} is for the Markdown cell "
                                  "that holds a self-check answer, not for a code cell")
            continue
        if _is_solution_cell(cell, where):
            continue
        cell = copy.deepcopy(cell)
        if cell.cell_type == "code" and version is not None and is_setup_cell(cell):
            cell.source = setup_cell_source(ref=f"v{version}")
        if cell.cell_type == "code":
            if BEGIN in cell.source or _has_check(cell.source):
                _show(cell)
            cell.source = strip_solutions(cell.source, where)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            text = exercise_as_markdown(cell.source, numbered + 1)
            if text is not None:
                numbered += 1
                cell.source = text
            found = quizzes.parse(cell.source)
            if found is not None:
                cell.source = quizzes.student_markdown(found)
        cells.append(cell)
    student.cells = cells
    nbformat.validate(student)
    return student


def _render(nb) -> bytes:
    text = nbformat.writes(nb)
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


def student_copies(source_dir: Path = SOURCE_DIR) -> dict[str, bytes]:
    """File name -> bytes of the student copy, for every notebook in ``source_dir``."""
    copies = {}
    version = library_version()
    for path in sorted(source_dir.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        copies[path.name] = _render(student_notebook(nb, _display(path), path.stem, version))
    return copies


def write_student_copies(source_dir: Path = SOURCE_DIR, out_dir: Path = STUDENT_DIR) -> list[str]:
    """Write every student copy into ``out_dir`` and remove those without a chapter.

    Returns the names of the files written or removed (those that changed)."""
    copies = student_copies(source_dir)  # every notebook converts before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, data in copies.items():
        target = out_dir / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
            changed.append(name)
    for old in sorted(out_dir.glob("*.ipynb")):
        if old.name not in copies:
            old.unlink()
            changed.append(old.name)
    return changed


def stale_copies(source_dir: Path = SOURCE_DIR, out_dir: Path = STUDENT_DIR) -> list[str]:
    """Names of the copies in ``out_dir`` that are missing, out of date, or without a chapter."""
    copies = student_copies(source_dir)
    stale = [name for name, data in copies.items()
             if not (out_dir / name).exists() or (out_dir / name).read_bytes() != data]
    stale += [p.name for p in sorted(out_dir.glob("*.ipynb")) if p.name not in copies]
    return stale


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a copy is missing or out of date")
    parser.add_argument("--source", type=Path, default=SOURCE_DIR, help="the chapters")
    parser.add_argument("--out", type=Path, default=STUDENT_DIR, help="where the copies go")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_copies(args.source, args.out)
            for name in stale:
                print(f"{_display(args.out / name)} is out of date: run `make student`",
                      file=sys.stderr)
            return 1 if stale else 0
        changed = write_student_copies(args.source, args.out)
    except MarkerError as exc:
        print(f"make_student: {exc}", file=sys.stderr)
        return 1
    count = len(list(args.out.glob("*.ipynb")))
    print(f"{count} student notebook(s) in {_display(args.out)}; "
          f"{len(changed)} changed{': ' + ', '.join(changed) if changed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
