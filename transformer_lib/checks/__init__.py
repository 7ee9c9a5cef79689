"""Checkers for the exercises: each compares a student's function with the library's reference.

Call a checker with the function to check, e.g. ``check_score_scale(score_scale)``. It runs
the function on several seeded inputs, edge cases included, prints a short verdict (each
check passed, or what is wrong in words a student can act on) and returns a
:class:`CheckResult`, truthy when every check passed, so a reference notebook can
``assert check_score_scale(score_scale)``.

A checker never raises. A function that raises gets the exception's one-line summary, and a
stub whose own ``raise NotImplementedError()`` line still runs is "not attempted yet" (any
other NotImplementedError, such as PyTorch's for a missing dtype kernel, is a failure), so a
student's notebook always runs to the end. Inputs come from a private generator: a check
leaves the global random state alone.

Layout: ``_harness`` holds the machinery every checker shares (running the cases, calling the
student's function safely, comparing tensors, recognising common mistakes), and one module per
chapter, named ``chNN_topic`` after the chapter's notebook (``ch01_attention`` for
``chapters/01_attention.ipynb``), holds that chapter's checkers and their references.

To add a chapter's checkers, write ``chNN_topic.py`` here with one public ``check_<exercise>``
function per exercise, built on the harness. This package finds the module itself and
re-exports its checkers (``from transformer_lib.checks import check_<exercise>``); the tests
in ``tests/test_checks_contract.py`` find them too and need only the exercise's reference
solution in its chapter (the ``### BEGIN SOLUTION`` region, read by
``tests/chapter_solutions.py``).
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from types import FunctionType

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import CheckResult
from transformer_lib.checks._messages import say

_CHAPTER_MODULE = re.compile(r"ch\d\d_\w+")  # e.g. ch01_attention


def _chapter_rules() -> dict[str, Rules]:
    """Every exercise's :class:`~._guard.Rules`, by the name of the function it asks for,
    from the ``RULES`` of each chapter module."""
    found: dict[str, Rules] = {}
    for name in sorted(m.name for m in pkgutil.iter_modules(__path__)
                       if _CHAPTER_MODULE.fullmatch(m.name)):
        found.update(importlib.import_module(__name__ + "." + name).RULES)
    return found


def _chapter_checkers() -> dict[str, FunctionType]:
    """Every ``check_*`` function defined in a chapter module of this package, by name, in
    chapter order and then in the order of each module."""
    found: dict[str, FunctionType] = {}
    modules = sorted(m.name for m in pkgutil.iter_modules(__path__)
                     if _CHAPTER_MODULE.fullmatch(m.name))
    for name in modules:
        module = importlib.import_module(__name__ + "." + name)
        for attr, value in vars(module).items():
            if not (attr.startswith("check_") and isinstance(value, FunctionType)
                    and value.__module__ == module.__name__):
                continue  # not a checker, or one imported from elsewhere
            if attr in found:
                raise ImportError(say("{attr} is defined in both {first} and {second}: each "
                                      "checker belongs to one chapter", attr=attr,
                                      first=found[attr].__module__, second=module.__name__))
            found[attr] = value
    return found


_CHECKERS = _chapter_checkers()
#: Every chapter's ``RULES`` merged: exercise function name -> :class:`Rules`, what the
#: student's code may call while that function runs.
EXERCISE_RULES = _chapter_rules()
globals().update(_CHECKERS)
__all__ = ["CheckResult", "EXERCISE_RULES", "Rules", *_CHECKERS]
