"""Exercises that say "write it yourself": the library's (or PyTorch's) ready-made answer is
made unusable while the student's function runs, so that a checker notices when it does the
work.

Patching the library's modules alone is not enough: the grader imports the checkers afresh,
so the notebook may hold other module objects, and ``from transformer_lib.positional import
apply_rope`` binds the function in the notebook's own namespace. :func:`forbid` therefore
replaces, for the length of a ``with`` block, every binding it can find of each forbidden
name: in the student function's globals (under any alias, matched by the function's
``__name__`` and module), in each ``transformer_lib`` module the notebook or the interpreter
holds (the checkers aside), and for a dotted name such as ``"torch.nn.functional.rms_norm"``,
on its module. Only the library's objects are replaced: a function the notebook defines
itself under a forbidden name (chapter 8 writes its own ``tiled_attention``) is the student's
code and stays. Each stand-in raises :class:`LibraryUsed`, which :func:`_harness._call` turns
into a failure that names the callable.
"""
from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

_LIBRARY = "transformer_lib"
_CHECKS = "transformer_lib.checks"


class LibraryUsed(Exception):
    """The student's code called ``name``, which the exercise asks them to write."""

    def __init__(self, name: str):
        super().__init__(f"`{name}` is not allowed in this exercise")
        self.name = name


def _stand_in(name: str, original: Any) -> Callable:
    def refuse(*args, **kwargs):
        raise LibraryUsed(name)

    refuse.__name__ = getattr(original, "__name__", name)
    refuse.__module__ = getattr(original, "__module__", None)
    return refuse


def _globals_of(fn: Any) -> dict:
    """The namespace ``fn`` looks its global names up in (a class: its module's)."""
    target = getattr(fn, "__func__", fn)  # a bound method
    if hasattr(target, "__globals__"):
        return target.__globals__
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    return vars(module) if module is not None else {}


def _is_library_module(value: Any) -> bool:
    name = getattr(value, "__name__", "")
    return (isinstance(value, types.ModuleType) and name.split(".")[0] == _LIBRARY
            and not name.startswith(_CHECKS))


def _namespaces(fn: Any) -> list[dict]:
    """Every namespace where a forbidden name may be bound for ``fn``."""
    found = [_globals_of(fn)]
    modules = [m for m in list(sys.modules.values()) if _is_library_module(m)]
    modules += [v for v in list(found[0].values()) if _is_library_module(v)]
    seen = {id(found[0])}
    for module in modules:
        if id(vars(module)) not in seen:
            seen.add(id(vars(module)))
            found.append(vars(module))
    return found


def _from_library(value: Any) -> bool:
    """Whether ``value`` is a callable the library defines (not one the notebook defines
    itself, even under the library's name)."""
    return callable(value) and str(getattr(value, "__module__", "")).split(".")[0] == _LIBRARY


def _bindings(namespace: dict, name: str) -> list[str]:
    """Keys of ``namespace`` bound to the library's ``name``: the name itself, or an alias of
    a library object called ``name``. A function of the notebook's own that has the name is
    left alone: it is the student's code."""
    keys = [name] if _from_library(namespace.get(name)) else []
    for key, value in list(namespace.items()):
        if key != name and getattr(value, "__name__", None) == name and _from_library(value):
            keys.append(key)
    return keys


@contextmanager
def forbid(fn: Any, names: Sequence[str]) -> Iterator[None]:
    """While the block runs, each of ``names`` raises :class:`LibraryUsed` when called.

    Args:
        fn: the student's function (or class); its globals are searched.
        names: bare names of library callables (``"apply_rope"``), searched as the module
            docstring says, or dotted names of any callable (``"torch.nn.functional.rms_norm"``),
            replaced on their module.
    """
    undo: list[tuple[Any, str, Any, bool]] = []  # (namespace or module, key, old, is_dict)
    try:
        for name in names:
            if "." in name:
                module_name, attr = name.rsplit(".", 1)
                module = importlib.import_module(module_name)
                old = getattr(module, attr)
                undo.append((module, attr, old, False))
                setattr(module, attr, _stand_in(name, old))
                continue
            for namespace in _namespaces(fn):
                for key in _bindings(namespace, name):
                    old = namespace[key]
                    undo.append((namespace, key, old, True))
                    namespace[key] = _stand_in(name, old)
        yield
    finally:
        for where, key, old, is_dict in reversed(undo):
            if is_dict:
                where[key] = old
            else:
                setattr(where, key, old)
