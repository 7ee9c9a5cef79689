"""The smoke subset of a notebook: the cells that prove an environment can run the book.

The book build and nbval execute every cell of every notebook in the maintainers'
environment. The tests of the readers' environments (``test_colab.py``: Colab's versions;
``test_binder.py``: Binder's) execute, of each notebook, only:

- the setup cell (it installs the library where it is missing, as on Colab);
- the first code cell after it, the chapter's imports (every import of the chapter works with
  that environment's versions);
- every explorer cell, a code cell that calls a function of ``transformer_lib.widgets`` or
  uses ``ipywidgets``, so that every widget the book shows is built there;
- the cells those cells need: for each name a kept cell uses and does not define first, the
  last earlier code cell that binds it at the top level, and so on. A name that no earlier
  cell binds (and that is no builtin) keeps every code cell before the cell that uses it.

What a cell binds and uses is read from its syntax (Python's ``ast``): assignments, ``def``,
``class``, imports, ``for``/``with`` targets at the top level; every name loaded, including
the globals that functions defined in the cell read. A cell that is not Python (``%magic``)
binds and needs nothing here.
"""
from __future__ import annotations

import ast
import builtins
import copy
import re

import nbformat

from setup_cell import is_setup_cell

_BUILTINS = set(dir(builtins)) | {"display", "get_ipython", "__name__", "__file__"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _stored(node: ast.AST) -> set[str]:
    """Names that ``node`` binds in its own scope (not inside functions or comprehensions)."""
    names: set[str] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(current.name)
            continue
        if isinstance(current, (ast.Lambda, *_COMPREHENSIONS)):
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, (ast.Store, ast.Del)):
            names.add(current.id)
        elif isinstance(current, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name.split(".")[0]) for a in current.names if a.name != "*"}
        elif isinstance(current, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and getattr(
                current, "name", None):
            names.add(current.name)
        todo.extend(ast.iter_child_nodes(current))
    return names


def _loaded(node: ast.AST) -> set[str]:
    """Names that ``node`` reads from its module: those it loads, less those that a function,
    lambda or comprehension inside it binds for itself (its arguments and locals)."""
    names: set[str] = set()
    todo: list[tuple[ast.AST, frozenset[str]]] = [(node, frozenset())]
    while todo:
        current, local = todo.pop()
        if isinstance(current, _SCOPES + _COMPREHENSIONS):
            inner = set(local)
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                arguments = current.args
                inner |= {a.arg for a in (*arguments.posonlyargs, *arguments.args,
                                          *arguments.kwonlyargs)}
                inner |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a}
                body = current.body if isinstance(current.body, list) else [current.body]
                inner |= set().union(*(_stored(b) for b in body))
                for default in (*arguments.defaults, *arguments.kw_defaults):
                    if default is not None:
                        todo.append((default, local))
                # Annotations are evaluated when the function is defined, like defaults.
                annotations = [a.annotation for a in (*arguments.posonlyargs, *arguments.args,
                                                      *arguments.kwonlyargs, arguments.vararg,
                                                      arguments.kwarg) if a is not None]
                annotations.append(getattr(current, "returns", None))
                todo += [(a, local) for a in annotations if a is not None]
                todo += [(decorator, local) for decorator in getattr(current, "decorator_list",
                                                                      [])]
                todo += [(b, frozenset(inner)) for b in body]
                continue
            if isinstance(current, ast.ClassDef):
                todo += [(b, local) for b in (*current.bases, *current.decorator_list)]
                todo += [(b, frozenset(inner | set().union(*(_stored(s) for s in current.body))))
                         for b in current.body]
                continue
            for generator in current.generators:  # a comprehension: its targets are local
                inner |= _stored(generator.target)
            todo += [(child, frozenset(inner)) for child in ast.iter_child_nodes(current)]
            continue
        if isinstance(current, ast.AugAssign) and isinstance(current.target, ast.Name):
            if current.target.id not in local:  # `x += 1` reads x first
                names.add(current.target.id)
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            if current.id not in local:
                names.add(current.id)
        todo += [(child, local) for child in ast.iter_child_nodes(current)]
    return names


def _read_in_order(statements: list[ast.stmt], binds: set[str], needs: set[str]) -> None:
    """Add to ``needs`` what ``statements`` read before binding it, and to ``binds`` what they
    bind, statement by statement; inside ``if``, ``for``, ``while``, ``with`` and ``try``
    too, so that ``if ok:\n    x = f()\n    g(x)`` needs no earlier ``x``. Each branch starts
    from what was bound before it; after the statement, what any branch binds counts as
    bound (as :func:`_stored` has it)."""
    for statement in statements:
        branches: list[tuple[set[str], list[ast.stmt]]]  # (bound as it starts, statements)
        if isinstance(statement, (ast.If, ast.While)):
            needs |= _loaded(statement.test) - binds
            branches = [(set(), statement.body), (set(), statement.orelse)]
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            needs |= _loaded(statement.iter) - binds
            binds |= _stored(statement.target)
            branches = [(set(), statement.body), (set(), statement.orelse)]
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                needs |= _loaded(item.context_expr) - binds
                if item.optional_vars is not None:
                    binds |= _stored(item.optional_vars)
            branches = [(set(), statement.body)]
        elif isinstance(statement, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            branches = [(set(), statement.body + statement.orelse), (set(), statement.finalbody)]
            for handler in statement.handlers:  # `except E as name:` binds name first
                if handler.type is not None:
                    needs |= _loaded(handler.type) - binds
                branches.append(({handler.name} if handler.name else set(), handler.body))
        else:
            needs |= _loaded(statement) - binds
            binds |= _stored(statement)
            continue
        bound_after = _stored(statement)
        for bound, body in branches:
            branch = binds | bound
            _read_in_order(body, branch, needs)
            bound_after |= branch
        binds |= bound_after


def cell_names(source: str) -> tuple[set[str], set[str]]:
    """``(binds, needs)`` of a code cell: the names it binds at the top level, and the names it
    reads before (or without) binding them itself, builtins aside."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax: not Python
        return set(), set()
    binds: set[str] = set()
    needs: set[str] = set()
    _read_in_order(tree.body, binds, needs)
    return binds, needs - _BUILTINS


def _widget_names(nb) -> set[str]:
    """The names a notebook imports from ``transformer_lib.widgets`` (and ipywidgets' own)."""
    names = {"ipywidgets", "widgets"}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "transformer_lib.widgets":
                names |= {a.asname or a.name for a in node.names}
    return names


def explorer_cells(nb) -> list[int]:
    """Indices of the code cells that build a widget (the book's explorers)."""
    names = _widget_names(nb)
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or is_setup_cell(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        if _loaded(tree) & names:
            found.append(index)
    return found


def _imports_cell(nb) -> int | None:
    """Index of the first code cell after the setup cell (the chapter's imports)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not is_setup_cell(c)]
    return code[0] if code else None


_CHECK_CALL = re.compile(r"^\s*(assert\s+)?check_\w+\(", re.M)
_STUB = re.compile(r"^\s*raise NotImplementedError\b", re.M)


def exercise_cells(nb) -> list[int]:
    """Indices of the cells a student copy adds or changes, and of those that use them: every
    stub (a code cell that raises ``NotImplementedError``), every check cell (it calls a
    ``check_*`` function), and every later code cell that reads a name a stub binds (in the
    chapter it would have read the solution's)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    stubs = [i for i in code if _STUB.search(nb.cells[i].source)]
    stub_names = set().union(*(cell_names(nb.cells[i].source)[0] for i in stubs))
    found = set(stubs)
    for i in code:
        binds, needs = cell_names(nb.cells[i].source)
        if _CHECK_CALL.search(nb.cells[i].source) or (needs & stub_names and i > stubs[0]):
            found.add(i)
    return sorted(found)


_OPTIONAL_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(name, ast.Name) and name.id in _OPTIONAL_ERRORS for name in caught)


def optional_names(source: str) -> set[str]:
    """The names a cell binds from a package it can do without: those bound in a ``try``
    whose ``except`` catches ``ImportError`` (or ``ModuleNotFoundError``), and those assigned
    from an expression that calls ``find_spec``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(map(_catches_import_errors, node.handlers)):
            names |= _stored(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(call, ast.Call) and "find_spec" in ast.unparse(call.func)
                for call in ast.walk(node.value)):
            names |= set().union(*(_stored(target) for target in node.targets))
    return names


def optional_cells(nb) -> list[int]:
    """Indices of the code cells (the setup cell aside) that read a name bound from an
    optional package (:func:`optional_names`): where a chapter's fallback branch runs when the
    package is missing."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not is_setup_cell(c)]
    optional = set().union(*(optional_names(nb.cells[i].source) for i in code))
    return [i for i in code if cell_names(nb.cells[i].source)[1] & optional]


def smoke_cells(nb, seeds: list[int] | None = None) -> list[int]:
    """Indices, in page order, of the cells of the smoke subset of ``nb`` (see the module).

    Args:
        nb: the notebook.
        seeds: the code cells the subset is for (default: the explorer cells); the setup
            cell, the imports and the cells the seeds need are always added.
    """
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    names = {i: cell_names(nb.cells[i].source) for i in code}
    keep = {i for i in code if is_setup_cell(nb.cells[i])}
    seeds = explorer_cells(nb) if seeds is None else seeds
    todo = [i for i in (_imports_cell(nb), *seeds) if i is not None]
    while todo:
        index = todo.pop()
        if index in keep:
            continue
        keep.add(index)
        earlier = [i for i in code if i < index]
        for name in names[index][1]:
            binders = [i for i in earlier if name in names[i][0]]
            todo += [binders[-1]] if binders else earlier  # untraceable: everything before
    return sorted(keep)


def smoke_notebook(nb, seeds: list[int] | None = None):
    """A copy of ``nb`` with only the cells of its smoke subset (``seeds``: as for
    :func:`smoke_cells`), outputs cleared."""
    smoke = copy.deepcopy(nb)
    smoke.cells = [copy.deepcopy(nb.cells[i]) for i in smoke_cells(nb, seeds)]
    for cell in smoke.cells:
        cell.outputs, cell.execution_count = [], None
    nbformat.validate(smoke)
    return smoke
