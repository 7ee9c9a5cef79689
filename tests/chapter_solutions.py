"""The chapters' reference solutions, read from the chapters themselves.

Each exercise's reference code is the cell of its chapter that holds the ``### BEGIN
SOLUTION`` / ``### END SOLUTION`` region, parsed by the parser that makes the student copies
(``tools/make_student.py``: :func:`make_student.exercises`). Its source, without the two marker
lines, runs in a namespace of its own chapter's imports (every top-level ``import`` of the
chapter's code cells but the setup cell, cut down to the names the solutions use), so a solution
that needs a name the chapter does not import fails here as it would in the chapter. Each
notebook is read once per test process.

    from chapter_solutions import SOLUTIONS, references
    SOLUTIONS["check_split_qkv"]                      # by checker name
    split_qkv, = references("03_multi_head", "split_qkv")  # by chapter and function name
"""
from __future__ import annotations

import ast
import functools
import linecache
from collections.abc import Callable
from pathlib import Path

import nbformat

import make_student  # tools/make_student.py
from setup_cell import is_setup_cell

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"


def _bound(alias: ast.alias) -> str:
    """The name an import binds (``np`` for ``import numpy as np``)."""
    return alias.asname or alias.name.split(".")[0]


def _imports(nb, needed: set[str]) -> list[ast.stmt]:
    """The top-level imports of the code cells of ``nb`` (the setup cell aside) that bind a name
    in ``needed``, each cut down to those names."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code" or is_setup_cell(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell with IPython syntax (%magic, !shell) imports nothing here
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias for alias in node.names if _bound(alias) in needed]
                if names:
                    found.append(type(node)(**{**vars(node), "names": names}))
    return found


def _run(source: str, filename: str, namespace: dict) -> None:
    """Execute ``source`` in ``namespace``, its lines known to tracebacks as ``filename``."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)  # the book's own code


@functools.cache
def _notebook(chapter: str):
    path = CHAPTERS / f"{chapter}.ipynb"
    if not path.exists():
        raise ValueError(f"no chapter {chapter!r} in {CHAPTERS}")
    return nbformat.read(path, as_version=4)


@functools.cache
def chapter_namespace(chapter: str) -> dict:
    """The namespace in which chapter ``chapter`` (a file stem, ``"03_multi_head"``) defines
    its reference solutions: the chapter's imports of the names they use, then every solution
    cell, in page order."""
    nb = _notebook(chapter)
    cells = {e.cell: e.solution for e in make_student.exercises(nb, f"{chapter}.ipynb")}
    for index, cell in enumerate(nb.cells):  # a capstone's functions of earlier chapters
        if make_student.PASTE_TAG in cell.get("metadata", {}).get("tags", []):
            cells[index] = make_student.solution_source(cell.source, f"{chapter}, cell {index}")
    needed = {node.id for source in cells.values() for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Name)}
    namespace: dict = {"__name__": f"chapters.{chapter}"}
    imports = ast.Module(body=_imports(nb, needed), type_ignores=[])
    _run(ast.unparse(imports), f"<{chapter}.ipynb: imports>", namespace)
    for index in sorted(cells):
        _run(cells[index], f"<{chapter}.ipynb, cell {index}>", namespace)
    return namespace


@functools.cache
def chapter_exercises() -> dict[str, list[make_student.Exercise]]:
    """Chapter (file stem) -> its exercises, for every chapter that has some."""
    found = {}
    for path in sorted(CHAPTERS.glob("*.ipynb")):
        listed = make_student.exercises(_notebook(path.stem), path.name)
        if listed:
            found[path.stem] = listed
    return found


def references(chapter: str, *functions: str) -> tuple[Callable, ...]:
    """The reference solutions named ``functions`` of chapter ``chapter``, in that order,
    from whichever of the chapter's pages asks for each (``04_normalisation`` names chapter
    4, whose exercises are on ``04_normalisation`` and ``04b_training_recipe``)."""
    home = {e.function: page for page, listed in chapter_exercises().items()
            if page[:2] == chapter[:2] for e in listed}
    unknown = [name for name in functions if name not in home]
    if unknown:
        raise ValueError(f"chapter {chapter!r} has no exercise {unknown}; it has {sorted(home)}")
    return tuple(chapter_namespace(home[name])[name] for name in functions)


def _by_checker() -> dict[str, Callable]:
    solutions: dict[str, Callable] = {}
    for chapter, listed in chapter_exercises().items():
        for exercise in listed:
            if exercise.checker in solutions:
                raise ValueError(f"{exercise.checker} is asserted in two chapters' exercises")
            solutions[exercise.checker] = chapter_namespace(chapter)[exercise.function]
    return solutions


SOLUTIONS: dict[str, Callable] = _by_checker()  # checker name -> the chapter's reference
