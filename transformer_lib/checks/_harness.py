"""The harness every checker runs on: the result, calling the student's function safely,
and comparing its output (a tensor or a number) with the reference.

A checker is a list of cases, each a description and a function that raises :class:`_Failure`
when something is wrong; :func:`_run` runs them, prints the verdict and returns a
:class:`CheckResult`. Inside a case, :func:`_call` runs the student's function,
:func:`_items` unpacks a returned pair (or triple), and :func:`_compare` says what is wrong
with a tensor, in order: type, shape, dtype, NaN or inf, properties, values, with a hint when
the answer matches a known mistake; :func:`_compare_number` does the same for a number, with
:func:`_known_mistakes` turning a table of wrong formulas into its known mistakes.
"""
from __future__ import annotations

import contextvars
import os
import traceback
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lib.checks import _guard
from transformer_lib.checks._compare import (  # noqa: F401 - the harness's names, in one place
    ATOL,
    RTOL,
    _as_number,
    _compare,
    _compare_number,
    _known_mistakes,
    _matches,
)
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._messages import say
from transformer_lib.checks._results import (  # noqa: F401
    Case,
    CheckResult,
    _cell_number,
    _describe,
    _Failure,
    _NotAttempted,
)

SEED = 0



def _generator(seed: int = SEED) -> torch.Generator:
    """A private generator for a checker's inputs: the global random state stays as it was."""
    return torch.Generator().manual_seed(seed)


# What the student's code may call while the current checker runs (see :mod:`._guard`).
# Outside a checker (a test calling _call directly) nothing of the library may be called.
_RULES: contextvars.ContextVar[Rules | None] = contextvars.ContextVar("rules", default=None)
_DENY_ALL = Rules()


def _run(exercise: str, fn: Any, cases: Sequence[Case], *, rules: Rules,
         kind: str = "function") -> CheckResult:
    """Run every case, print the verdict, return it. Never raises.

    Args:
        exercise: the name of what the exercise asks for, e.g. ``"softmax"``.
        fn: the student's function (or class).
        cases: ``(description, run)`` pairs; ``run()`` raises :class:`_Failure` (or
            :class:`_NotAttempted`) when the check fails.
        rules: what the student's code may call (:class:`~._guard.Rules`); every call of
            the student's code in the cases (:func:`_call`) runs under them.
        kind: ``"function"``, or ``"class"`` for an exercise that asks for a class (its
            constructor and methods are called through :func:`_call`).

    Returns:
        The :class:`CheckResult`, after printing its report.
    """
    name = getattr(fn, "__name__", exercise)
    if not (isinstance(fn, type) if kind == "class" else callable(fn)):
        head = say("{exercise}: expected a {kind} to check, got {got}.", exercise=exercise,
                   kind=kind, got=_describe(fn))
        return _finish(exercise, False, False, [head], [head])
    token = _RULES.set(rules)
    try:
        return _run_cases(exercise, fn, name, cases)
    finally:
        _RULES.reset(token)


def _run_cases(exercise: str, fn: Any, name: str, cases: Sequence[Case]) -> CheckResult:
    lines: list[str] = []
    failures: list[str] = []
    hints: set[str] = set()
    for index, (description, run) in enumerate(cases):
        try:
            run()
        except _NotAttempted as exc:
            if exc.where in (None, name, "<lambda>"):
                head = say("{exercise}: not attempted yet: `{name}` still raises "
                           "NotImplementedError. Replace `# YOUR CODE HERE` and the `raise` line "
                           "with your code, then run this cell again.", exercise=exercise,
                           name=name)
            elif isinstance(fn, type) and callable(getattr(fn, exc.where, None)):
                head = say("{exercise}: not attempted yet: `{name}.{where}` still raises "
                           "NotImplementedError. Replace `# YOUR CODE HERE` and the `raise` line "
                           "of each method with your code, then run this cell again.",
                           exercise=exercise, name=name, where=exc.where)
            else:
                head = say("{exercise}: not attempted yet: `{name}` calls `{where}`, which "
                           "still raises NotImplementedError. Complete `{where}` first.",
                           exercise=exercise, name=name, where=exc.where)
            return _finish(exercise, False, False, [head], [head])
        except _Failure as exc:
            failures.append(say("{description}: {message}", description=description,
                                message=exc.message))
            lines.append(say("  ✗ {description}: {message}", description=description,
                             message=exc.message))
            if exc.hint and exc.hint not in hints:  # each hint once
                hints.add(exc.hint)
                lines.append(say("      Hint: {hint}", hint=exc.hint))
            if exc.refused:  # the same call would be refused in every case: stop here
                rest = cases[index + 1:]
                failures += [say("{description}: not run after the refused call",
                                 description=d) for d, _ in rest]
                if rest:
                    lines.append(say("  … {n} more check(s) not run after the refused call",
                                     n=len(rest)))
                break
        except Exception as exc:  # noqa: BLE001 - whatever happens, the notebook goes on
            message = say("could not be checked ({error})", error=_one_line(exc))
            failures.append(say("{description}: {message}", description=description,
                                message=message))
            lines.append(say("  ✗ {description}: {message}", description=description,
                             message=message))
        else:
            lines.append(say("  ✓ {description}", description=description))
    n = len(cases)
    if failures:
        head = say("{exercise}: {passed} of {n} checks passed.", exercise=exercise,
                   passed=n - len(failures), n=n)
    else:
        head = say("{exercise}: all {n} checks passed.", exercise=exercise, n=n)
    return _finish(exercise, not failures, True, [head, *lines], failures)


def _finish(exercise: str, passed: bool, attempted: bool, lines: list[str],
            failures: list[str]) -> CheckResult:
    report = "\n".join(lines)
    print(report)
    return CheckResult(exercise, passed, attempted, report, failures)


# Calling the student's function -------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_CHECKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package


def _error_hints() -> list[tuple[tuple[str, ...], str]]:
    """PyTorch's error messages that have a usual cause, and what to do about it: the words
    of the error (matched as they are, joined by spaces) and the hint."""
    return [
        (("view", "size", "is", "not", "compatible"),
         say("after a transpose the tensor is no longer contiguous, so .view cannot merge its "
             "axes: use .reshape (or .contiguous().view)")),
        (("must", "match", "the", "size", "of", "tensor"),
         say("two shapes do not broadcast: a reduction such as .sum(dim) or .amax(dim) drops "
             "that axis unless you pass keepdim=True")),
        (("cannot", "be", "multiplied"),
         say("check which axes the matmul contracts: the scores are q @ kᵀ, with "
             "k.transpose(-2, -1)")),
        (("batch2", "tensor"),
         say("check which axes the matmul contracts: the scores are q @ kᵀ, with "
             "k.transpose(-2, -1)")),
        (("expected", "scalar", "type"),
         say("the two tensors have different dtypes: convert one with .to(other.dtype)")),
    ]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    summary = say("{kind}: {text}", kind=type(exc).__name__, text=text[0]) if text else (
        type(exc).__name__)
    return summary if len(summary) <= 200 else summary[:197] + "..."


def _outside_checks(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that are not the checkers' own."""
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if not os.path.abspath(f.filename).startswith(_CHECKS_DIR)]


def _student_line(exc: BaseException) -> str | None:
    """The line of the student's code where ``exc`` was raised (not torch's, not ours)."""
    frames = [f for f in _outside_checks(exc) if not f.filename.startswith(_TORCH_DIR)]
    return frames[-1].line.strip() if frames and frames[-1].line else None


_STUB_LINE = ("raise", "NotImplementedError")  # how the stub's line starts, word by word


def _is_stub(exc: NotImplementedError) -> bool:
    """Whether ``exc`` comes from an exercise's stub, the ``raise NotImplementedError()`` line
    the student has not replaced yet, rather than from code that runs (PyTorch raises
    NotImplementedError too, e.g. for ``&`` on float tensors).

    The raising line is read from the traceback (:func:`_student_line`): it must be a
    ``raise NotImplementedError`` line. Where the source cannot be read, an
    exception without arguments, as the stub raises it, counts as the stub."""
    line = _student_line(exc)
    if line is None:
        return exc.args == ()
    return line.startswith(" ".join(_STUB_LINE))


def _attempt(fn: Callable, args: Sequence[Any]) -> Any:
    """``fn(*args)`` under the current exercise's rules (:mod:`._guard`), where the stub's
    NotImplementedError means "not attempted yet": it becomes _NotAttempted, naming the
    function that raised it. A call the rules refuse, caught by the student's code or not,
    is a _Failure naming it. Other exceptions, another NotImplementedError included
    (:func:`_is_stub`), pass through."""
    rules = _RULES.get() or _DENY_ALL
    with _guard.guard(rules) as watch:
        try:
            result = _guard.call_as_student(fn, args)
        except NotImplementedError as exc:
            if watch.refusals or not _is_stub(exc):
                raise
            frames = _outside_checks(exc)
            raise _NotAttempted(frames[-1].name if frames else None) from None
        except Exception:
            if not watch.refusals:
                raise
    if watch.refusals:
        raise _Failure(say("this exercise asks you to write it yourself: `{name}` is not "
                           "allowed here", name=watch.refusals[0]),
                       say("{rules}; write the rest with tensor operations",
                           rules=rules.explain()), refused=True) from None
    return result


def _call(fn: Callable, args: Sequence[Any], names: Sequence[str], *,
          in_place: Sequence[str] = ()) -> Any:
    """``fn(*args)`` on copies of the tensor arguments, under the exercise's rules.

    Raises _NotAttempted for the stub's NotImplementedError (:func:`_is_stub`), _Failure for
    a call the rules refuse, for any other exception and for an argument changed in place.

    Args:
        in_place: the names of the arguments that the function is meant to change in place
            (a preallocated cache it writes into): these are passed as they are, not copied,
            and the checker compares them itself afterwards."""
    kept = {i for i, name in enumerate(names) if name in in_place}
    inputs = [a.clone() if isinstance(a, Tensor) and i not in kept else a
              for i, a in enumerate(args)]
    try:
        result = _attempt(fn, inputs)
    except (_NotAttempted, _Failure):
        raise
    except Exception as exc:  # noqa: BLE001 - reported, never raised into the notebook
        line = _student_line(exc)
        hint = next((h for words, h in _error_hints() if " ".join(words) in str(exc)), None)
        if line:
            raise _Failure(say("raised {error} at `{line}`", error=_one_line(exc), line=line),
                           hint) from None
        raise _Failure(say("raised {error}", error=_one_line(exc)), hint) from None
    for arg, original, name in zip(inputs, args, names):
        if isinstance(arg, Tensor) and not torch.equal(arg, original):
            raise _Failure(say("changed its input `{name}` in place", name=name),
                           say("work on new tensors: write `x = x - m` rather than `x -= m` or "
                               "`x.sub_(m)`; the caller still needs its tensor"))
    odd = _disguised(result)
    if odd is not None:
        raise _Failure(say("returned a value of type `{odd}`, a subclass of a tensor or a "
                           "number", odd=odd),
                       say("return plain tensors and numbers: a subclass can change what a "
                           "comparison says"))
    return result


_PLAIN_MODULES = ("builtins", "torch", "numpy")


def _disguised(value: Any, depth: int = 0) -> str | None:
    """The name of the first type in ``value`` (a tuple, list or dict of results, searched a
    few levels deep) that subclasses a tensor or a number outside PyTorch and NumPy: such a
    value can override ``==``, ``allclose`` or ``__torch_function__`` and fool a comparison."""
    kind = type(value)
    if isinstance(value, (Tensor, int, float, complex, str)) and (
            kind.__module__.split(".")[0] not in _PLAIN_MODULES):
        return kind.__qualname__
    if depth < 3 and isinstance(value, (tuple, list)):
        return next((n for v in value if (n := _disguised(v, depth + 1))), None)
    if depth < 3 and isinstance(value, dict):
        return next((n for v in value.values() if (n := _disguised(v, depth + 1))), None)
    return None


def _expect_value_error(fn: Callable, args: Sequence[Any], reason: str,
                        must_name: Sequence[str]) -> None:
    """``fn(*args)`` must raise a ValueError whose message names ``must_name``."""
    try:
        result = _attempt(fn, args)
    except (_NotAttempted, _Failure):
        raise
    except ValueError as exc:
        missing = [v for v in must_name if v not in str(exc)]
        if missing:
            raise _Failure(say("raised a ValueError, but its message ({message!r}) does not "
                               "give the sizes {sizes}", message=str(exc),
                               sizes=", ".join(must_name)),
                           say("say what is wrong with which values, e.g. "
                               "\"C (10) must be divisible by n_heads (3)\"")) from None
        return
    except Exception as exc:  # noqa: BLE001
        raise _Failure(say("raised {error} instead of a ValueError", error=_one_line(exc)),
                       say("check the sizes first: {reason}; raise a ValueError that says "
                           "so", reason=reason)) from None
    raise _Failure(say("returned {got} instead of raising a ValueError ({reason})",
                       got=_describe(result), reason=reason))


@_guard.given
class _CountOps(TorchFunctionMode):
    """Counts the PyTorch functions, tensor methods and operators called within the block
    (those the library calls on the student's behalf included)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _fixed_work(fn: Callable, small: Sequence[Any], large: Sequence[Any], names: Sequence[str],
                unit: str, sizes: tuple[str, str]) -> None:
    """Raise _Failure unless ``fn`` calls as many PyTorch operations on ``large`` as on
    ``small``: two inputs with the same number of ``unit`` (chunks, tiles), each of the large
    one twice the size. An algorithm that works a ``unit`` at a time does the same work on
    both; a loop over tokens (or queries, or rows) does twice as much on the large one.

    Args:
        sizes: the two inputs in words, e.g. ``("T = 8 in chunks of 4", "T = 16 in chunks of
            8")``.
    """
    counts = []
    for args in (small, large):
        with _CountOps() as ops:
            _call(fn, args, names)
        counts.append(ops.count)
    if counts[1] > counts[0]:
        raise _Failure(
            say("the work grows with the size of a {unit}: {small} PyTorch operations for "
                "{small_input}, {large} for {large_input}, the same number of {unit}s",
                unit=unit, small=counts[0], small_input=sizes[0], large=counts[1],
                large_input=sizes[1]),
            say("compute each {unit} with whole-tensor operations (matrix products over the "
                "{unit}), not with a loop over its tokens: the number of operations may depend "
                "on the number of {unit}s, never on their size", unit=unit))


def _items(got: Any, n: int, what: str) -> tuple:
    """``got`` as a tuple of ``n`` items (a tuple or a list), else _Failure: "return ``what``".

    Args:
        got: what the student's function returned.
        n: how many items it should return, e.g. 2 for ``(out, weights)``.
        what: the return value in words, e.g. ``"the pair (out, weights)"``.
    """
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise _Failure(say("returned {got}: return {what}", got=_describe(got), what=what))
    return tuple(got)

