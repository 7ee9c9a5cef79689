"""Exercises that say "write it yourself": while the student's function runs, a call that the
student's own code makes to a ready-made answer is refused.

What is refused, at the call (:class:`Rules`, one per exercise):

* anything in ``transformer_lib.checks``, the checkers' references included;
* any private (``_``-prefixed) function, method or module of the library;
* any other library function or class that the exercise does not list in ``allow`` (default
  deny: the library's own answer to the exercise is never listed);
* the framework's ready-made answers the exercise lists in ``refuse``, such as
  ``"torch.nn.functional.scaled_dot_product_attention"`` or ``"torch.nn.MultiheadAttention"``
  (a name ending in ``.*`` refuses a whole package, e.g. ``"tiktoken.*"``).

*Who calls* is decided by the calling frame, not by the name used: the nearest frame, walking
out from the call, that is not the framework's (the standard library, installed packages such
as torch). When that frame is the library's, the call is the library's
own (an allowed ``MultiHeadAttention`` calls its private helpers freely); when it is anything
else (a notebook cell, a test file, code built with ``exec``), the call is the student's. So
an alias, ``from … import … as``, an attribute fetched before or during the call, an import
inside the function, ``importlib``, ``getattr``, ``functools.partial`` or ``map`` all lead to
the same verdict. Python functions and classes are seen by ``sys.setprofile``; PyTorch's
functions and tensor methods (many of them written in C) by a ``TorchFunctionMode``, which sees
them however they are reached.

A refused call raises :class:`Refused` into the student's code and is recorded, so catching
the exception does not help: :func:`_harness._call` reports any recorded refusal as a failed
check, "this exercise asks you to write it yourself: `name` is not allowed here".

Library code is recognised by where its code object comes from, the library's files (or code
Python generated for a library class, such as a dataclass's ``__init__``), not by the name of
the module it runs in: the student's code run on globals named like the library's is the
student's, and the library's code object copied into a new function is still the
library's. A refused package's code is recognised by its files in the same way. The
framework's ready-made answers are also refused at the level of PyTorch's operators
(``torch.ops.aten._softmax``, reached by ``F.softmin`` or ``torch.ops`` as well), by a
``TorchDispatchMode`` (:mod:`._watched` lists them). A thread started with ``_thread`` (which
would run without the watch) is refused, and so is a change to the guard's code or to a
checker's rules while the submission runs (it is undone).

What this cannot catch: the library's (or PyTorch's) source pasted into the notebook and run as
the student's own code, work handed to a thread or process that was started before the check,
and code compiled under a file name that pretends to be the framework's.
``CONTRIBUTING.md`` says so too.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import site
import sys
import sysconfig
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_lib.checks._messages import say
from transformer_lib.checks._watched import _OPS, _restore, _snapshot

_LIBRARY = "transformer_lib"
_CHECKS = "transformer_lib.checks"
_LIBRARY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_GUARD_FILE = os.path.abspath(__file__)
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")


def _framework_dirs() -> tuple[str, ...]:
    """Where the framework's code lives: the standard library and every package folder this
    Python sees, including one a ``.pth`` file or Colab's ``dist-packages`` adds."""
    folders = {sysconfig.get_paths().get(key) for key in
               ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    folders.update(p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in _PACKAGE_FOLDERS)
    return tuple(sorted(os.path.abspath(p) + os.sep for p in folders if p))


_FRAMEWORK_DIRS = _framework_dirs()


@dataclass(frozen=True)
class Rules:
    """What an exercise lets the student's code call.

    Attributes:
        allow: public names of the library that the student's code may call: a function or a
            class (e.g. ``"causal_mask"``, ``"RMSNorm"``: any of its methods) or one method
            (``"Decoder.new_cache"``); every other library function and class is refused.
        refuse: dotted names of the framework's ready-made answers to refuse, e.g.
            ``"torch.nn.functional.softmax"``, ``"torch.Tensor.softmax"``; ``"pkg.*"`` refuses
            everything in package ``pkg``.
    """

    allow: tuple[str, ...] = ()
    refuse: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in self.allow:
            parts = name.split(".")
            if len(parts) > 2 or any(not p or p.startswith("_") for p in parts):
                raise ValueError(say("allow lists public library names such as 'causal_mask' or "
                                     "'Decoder.new_cache', got {name!r}", name=name))

    def explain(self) -> str:
        """The rules in words, for a checker's hint."""
        allowed = ", ".join("`" + n + "`" for n in self.allow) or say("nothing")
        return say("allowed from the library: {allowed}", allowed=allowed)

    def sentence(self) -> str:
        """The rules as the exercise's text states them, one line: "Allowed from the library:
        `causal_mask`. Not allowed: `torch.softmax`." (``tests/test_cheats.py`` checks that
        every exercise's text holds this line.)"""
        allowed = ", ".join("`" + n + "`" for n in self.allow) or say("nothing")
        if not self.refuse:
            return say("Allowed from the library: {allowed}.", allowed=allowed)
        return say("Allowed from the library: {allowed}. Not allowed: {refused}.",
                   allowed=allowed, refused=", ".join("`" + n + "`" for n in self.refuse))


_GIVEN: set[CodeType] = set()


def given(obj: Any) -> Any:
    """Mark a checker's function or class as one the student's code may run: a model handed to
    the student's function, a hook or a ``TorchFunctionMode`` that watches it. Returns ``obj``
    (a decorator)."""
    _GIVEN.update(_codes_of(obj))
    return obj


class Refused(Exception):
    """The student's code called ``name``, which the exercise asks them to write."""

    def __init__(self, name: str):
        super().__init__(say("this exercise asks you to write it yourself: `{name}` is not "
                             "allowed here", name=name))
        self.name = name


# Whose code is a frame? ------------------------------------------------------------------------

_LIB, _FRAMEWORK, _STUDENT, _GUARD = "library", "framework", "student", "guard"
_kinds: dict[tuple[CodeType, str], str] = {}
_generated: frozenset[CodeType] = frozenset()  # _generated_codes(), found as a block starts


def call_as_student(fn: Any, args: Any) -> Any:
    """``fn(*args)``, where this frame counts as the student's: a submission that *is* a
    library or checker function (or a ``partial`` of one) is a call the student made."""
    return fn(*args)


def _kind(frame: FrameType) -> str:
    code = frame.f_code
    if code is call_as_student.__code__:
        return _STUDENT
    module = frame.f_globals.get("__name__") or ""
    key = (code, module)
    kind = _kinds.get(key)
    if kind is None:
        filename = os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") \
            else code.co_filename
        if filename == _GUARD_FILE:
            kind = _GUARD
        elif filename.startswith(_LIBRARY_DIR) or (
                filename.startswith("<") and code in _generated):
            kind = _LIB  # its code object copied into a new function included
        elif filename.startswith(_FRAMEWORK_DIRS) or filename.startswith("<frozen"):
            kind = _FRAMEWORK
        else:
            kind = _STUDENT
        _kinds[key] = kind
    return kind


def _generated_codes() -> frozenset[CodeType]:
    """The code that Python generated for the library's classes (a dataclass's ``__init__``,
    compiled from a string): the only library code whose file name is not a library file."""
    found = set()
    for name, module in list(sys.modules.items()):
        if module is None or not (name == _LIBRARY or name.startswith(_LIBRARY + ".")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                found.update(code for code in _codes_of(value)
                             if code.co_filename.startswith("<"))
    return frozenset(found)


def _caller(frame: FrameType | None, skip: tuple[str, ...] = (_FRAMEWORK,)) -> str | None:
    """The kind of the nearest frame from ``frame`` outwards whose kind is not in ``skip``
    (the framework's, by default); None when there is none."""
    while frame is not None:
        kind = _kind(frame)
        if kind not in skip:
            return kind
        frame = frame.f_back
    return None


def _package_folders(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The folders that hold the code of ``packages`` (those installed)."""
    folders = []
    for package in packages:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        folders += [os.path.abspath(p) + os.sep
                    for p in (spec.submodule_search_locations or []) if spec] if spec else []
    return tuple(folders)


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


# The framework's refused answers ---------------------------------------------------------------


def _resolve(dotted: str) -> Any:
    """The object a dotted name such as ``"torch.nn.functional.softmax"`` names."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(say("cannot find {dotted!r} to refuse it", dotted=dotted))


def _codes_of(obj: Any) -> list[CodeType]:
    """The code objects that run when ``obj`` (a function or a class) is called."""
    if isinstance(obj, type):
        found = []
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)
            if hasattr(value, "__code__"):
                found.append(value.__code__)
        return found
    obj = getattr(obj, "__func__", obj)
    return [obj.__code__] if hasattr(obj, "__code__") else []


# Switching the watch off is refused in every exercise, and so is a thread that starts without
# it (``threading.Thread`` passes the watch on to its thread; ``_thread`` does not).
_SWITCHES = ("sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
             "torch._C._pop_torch_function_stack", "torch._C._pop_torch_dispatch_stack",
             "_thread.start_new_thread", "_thread.start_joinable_thread", "_thread.start_new",
             "concurrent.futures.ThreadPoolExecutor.submit",
             "concurrent.futures.ProcessPoolExecutor.submit")

class _Guard(TorchFunctionMode):
    def __init__(self, rules: Rules):
        super().__init__()
        self.rules = rules
        self.allow = frozenset(rules.allow)
        self.refused_codes: dict[CodeType, str] = {}
        self.refused_torch: dict[int, str] = {}  # id of a torch callable -> its name
        self.refused_packages = tuple(n[:-2] for n in rules.refuse if n.endswith(".*"))
        self.refused_folders = _package_folders(self.refused_packages)
        self.refused_builtins: dict[int, str] = {}
        for name in _SWITCHES:
            try:
                obj = _resolve(name)
            except (ValueError, AttributeError):  # not in this version of torch
                continue
            self.refused_builtins[id(obj)] = name
            for code in _codes_of(obj):
                self.refused_codes[code] = name
        for name in rules.refuse:
            if name.endswith(".*"):
                continue
            obj = _resolve(name)
            while obj is not None:  # the object, and what it wraps (functools.wraps)
                for code in _codes_of(obj):
                    self.refused_codes[code] = name
                self.refused_torch[id(obj)] = name
                self.refused_builtins[id(obj)] = name  # a direct call, even with modes off
                obj = getattr(obj, "__wrapped__", None)
        self.ops = {op: "torch.ops.aten." + op for name in rules.refuse
                    for op in _OPS.get(name, ())}
        self.switch_types = tuple(t for t in (getattr(torch._C, "DisableTorchFunction", None),
                                              getattr(torch._C, "DisableTorchFunctionSubclass",
                                                      None)) if isinstance(t, type))
        self.refusals: list[str] = []

    # A refusal is recorded before it is raised: catching it does not undo it.
    def _refuse(self, name: str) -> None:
        self.refusals.append(name)
        raise Refused(name)

    def _library_verdict(self, frame: FrameType) -> str | None:
        """The name to refuse for a call into the library's ``frame``, or None."""
        module = frame.f_globals.get("__name__", "")
        qualname = _qualname(frame.f_code)
        if frame.f_code in _GIVEN:  # a checker's tool
            return None
        if qualname == "<module>" and getattr(getattr(sys.modules.get(module), "__spec__", None),
                                              "_initializing", False):
            return None  # the module's own code, while it is imported
        parts = [p for p in qualname.split(".") if p != "<locals>"]
        owner = frame.f_locals.get("self") if frame.f_code.co_argcount else None
        if frame.f_code.co_filename.startswith("<") and owner is not None:
            # Code generated for a class (a dataclass's __init__): named after the class.
            parts = [type(owner).__name__, frame.f_code.co_name]
        # A constructor or a dunder method is shown as its class: `attention.MultiHeadAttention`.
        public = parts[:-1] if len(parts) > 1 and parts[-1].startswith("__") else parts
        shown = module + "." + ".".join(public)
        if module.startswith(_CHECKS):
            return shown
        if any(_is_private(p) for p in module.split(".")) or any(_is_private(p) for p in parts):
            return shown
        if parts[0] not in self.allow and ".".join(parts[:2]) not in self.allow:
            return shown
        return None

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            name = self.refused_builtins.get(id(arg))
            if name is None and isinstance(getattr(arg, "__self__", None), self.switch_types):
                name = "torch._C." + type(arg.__self__).__name__
                if getattr(arg, "__name__", "") == "__exit__":
                    # A `with` block calls __enter__ unseen and __exit__ as a call: record
                    # the switch, but let the exit run, so that the modes come back on.
                    if _kind(frame) == _STUDENT:
                        self.refusals.append(name)
                    return
            if name is not None and _kind(frame) == _STUDENT:  # called by the student's line
                self._refuse(name)
            return
        if event != "call":
            return
        kind = _kind(frame)
        if kind == _LIB:
            name = self._library_verdict(frame)
        elif kind == _GUARD:  # the guard's own functions, but for its hooks, run by Python
            code = frame.f_code
            name = None if code in _HOOKS else __name__ + "." + _qualname(code)
        elif kind == _FRAMEWORK:
            code = frame.f_code
            name = self.refused_codes.get(code)
            if name is None and code in _OP_CALLS and self.ops:  # torch.ops.aten.<op>(...)
                op = frame.f_locals.get("self")
                packet = getattr(op, "_overloadpacket", op)
                name = self.ops.get(getattr(packet, "__name__", ""))
            if name is None and self.refused_packages:
                module = frame.f_globals.get("__name__", "")
                if module.startswith(self.refused_packages) or (
                        self.refused_folders and code.co_filename.startswith(self.refused_folders)):
                    name = module + "." + _qualname(code)
        else:
            return
        if name is not None and _caller(frame.f_back) == _STUDENT:
            self._refuse(name)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.refused_torch.get(id(func))
        if name is not None and _caller(sys._getframe(1)) == _STUDENT:
            self._refuse(name)
        return func(*args, **(kwargs or {}))


class _OpWatch(TorchDispatchMode):
    """Sees every operator that runs, however the Python code reached it, and refuses those
    under a refused answer when the student's code asked for them."""

    def __init__(self, watcher: _Guard):
        super().__init__()
        self.watcher = watcher

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Left unwrapped: torch would wrap __torch_dispatch__ in a Dynamo switch whose first
        # call imports torch._dynamo (over a second, and several under the watch). A
        # checker never compiles.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = self.watcher.ops.get(func.overloadpacket.__name__)
        if name is not None and _caller(sys._getframe(1), (_FRAMEWORK, _GUARD)) == _STUDENT:
            self.watcher._refuse(name)
        return func(*args, **(kwargs or {}))


_HOOKS = frozenset(_codes_of(_Guard)) | frozenset(_codes_of(_OpWatch))
# Calling an operator by name, ``torch.ops.aten.rms_norm(...)``: seen here even when the
# operator is made of others by the time it reaches the dispatcher.
_OP_CALLS = frozenset(_codes_of(torch._ops.OpOverloadPacket.__call__)
                      + _codes_of(torch._ops.OpOverload.__call__))


@contextmanager
def guard(rules: Rules) -> Iterator[_Guard]:
    """While the block runs, the student's calls that ``rules`` refuse raise :class:`Refused`;
    the guard's ``refusals`` lists every one, caught or not."""
    global _FRAMEWORK_DIRS, _generated
    if (folders := _framework_dirs()) != _FRAMEWORK_DIRS:  # a package folder added since
        _FRAMEWORK_DIRS = folders
        _kinds.clear()
    _generated = _generated_codes()  # classes made since the last block included
    watcher = _Guard(rules)
    ops = _OpWatch(watcher) if watcher.ops else contextlib.nullcontext()
    before = _snapshot([sys.modules[__name__], _Guard, _OpWatch])
    previous = sys.getprofile()
    previous_thread = threading.getprofile() if hasattr(threading, "getprofile") else None
    sys.setprofile(watcher.profile)
    threading.setprofile(watcher.profile)
    try:
        with watcher, ops:
            yield watcher
            if sys.getprofile() != watcher.profile and not watcher.refusals:
                watcher.refusals.append("sys.setprofile")  # switched off some other way
    finally:
        sys.setprofile(previous)
        threading.setprofile(previous_thread)
    if _restore(before):
        watcher.refusals.append(say("{checks} (its code or rules changed)", checks=_CHECKS))


_HOOKS |= {guard.__wrapped__.__code__}  # its generator, resumed when the block ends

__all__ = ["Refused", "Rules", "call_as_student", "given", "guard"]
