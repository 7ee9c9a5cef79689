"""The import statements of a notebook's code cells, for the tests that check the docs
against what the chapters import (test_readme.py, test_contributing.py)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import nbformat


def import_nodes(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every ``import`` and ``from … import`` statement in the code cells of ``path``
    (shell and magic lines, ``!pip …`` or ``%time``, are skipped)."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("!", "%")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
