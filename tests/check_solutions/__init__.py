"""One reference solution per exercise checker, as the chapters write them, by checker name.

One module per chapter (``ch01.py`` for ``transformer_lib/checks/ch01_attention.py``), each
with a ``SOLUTIONS`` dict; this package merges them. ``tests/test_checks_contract.py`` runs
every checker of ``transformer_lib.checks`` on its solution here (and on broken versions of
it): a new checker needs its solution in its chapter's module and nothing else to be covered.
"""
from __future__ import annotations

import importlib
import pkgutil

SOLUTIONS: dict = {}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    _solutions = importlib.import_module(f"{__name__}.{_module}").SOLUTIONS
    _twice = SOLUTIONS.keys() & _solutions.keys()
    if _twice:
        raise ImportError(f"solutions given twice: {sorted(_twice)}")
    SOLUTIONS.update(_solutions)
