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
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lib.checks import _guard
from transformer_lib.checks._guard import Rules

# fp32 inputs, and a student may order the operations differently from the reference
# (q / √D before or after the matmul, max subtracted or not): a few ulps of the scores.
ATOL = 1e-5
RTOL = 1e-4
SEED = 0



def _generator(seed: int = SEED) -> torch.Generator:
    """A private generator for a checker's inputs: the global random state stays as it was."""
    return torch.Generator().manual_seed(seed)


# Results ----------------------------------------------------------------------------------


def _cell_number() -> int | None:
    """The number of the notebook cell running now (None outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


@dataclass
class CheckResult:
    """What a checker found; truthy when every check passed."""

    exercise: str  #: the function checked, e.g. "softmax"
    passed: bool  #: every check passed
    attempted: bool  #: False while the function is still the stub (its `raise` line runs)
    report: str  #: the verdict, as printed
    failures: list[str] = field(default_factory=list)  #: one message per failed check
    _cell: int | None = field(default_factory=lambda: _cell_number(), repr=False, compare=False)

    def _ipython_display_(self) -> None:
        # A check cell ends with the checker's call, whose report is printed just above:
        # in that cell the result shows nothing more. Displayed in a later cell, it prints
        # the report again.
        if self._cell is None or self._cell != _cell_number():
            print(self.report)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.report

    def __repr__(self) -> str:
        state = "passed" if self.passed else "not attempted yet" if not self.attempted else (
            f"{len(self.failures)} check(s) failed")
        return f"CheckResult({self.exercise}: {state})"


class _Failure(Exception):
    """One check failed: ``message`` says what is wrong, ``hint`` (optional) how to fix it;
    ``refused``: the student's code called what the exercise refuses (:mod:`._guard`)."""

    def __init__(self, message: str, hint: str | None = None, *, refused: bool = False):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.refused = refused


class _NotAttempted(Exception):
    """The function, or one it calls (``where``), still raises NotImplementedError."""

    def __init__(self, where: str | None):
        super().__init__(where)
        self.where = where


Case = tuple[str, Callable[[], None]]  # (what the check does, run it: raises _Failure)


# What the student's code may call while the current checker runs (see :mod:`._guard`).
# Outside a checker (a test calling _call directly) nothing of the library may be called.
_RULES: contextvars.ContextVar[Rules | None] = contextvars.ContextVar("rules", default=None)
_DENY_ALL = Rules()


def _run(exercise: str, fn: Any, cases: Sequence[Case], *, rules: Rules) -> CheckResult:
    """Run every case, print the verdict, return it. Never raises.

    Args:
        exercise: the name of the function the exercise asks for, e.g. ``"softmax"``.
        fn: the student's function.
        cases: ``(description, run)`` pairs; ``run()`` raises :class:`_Failure` (or
            :class:`_NotAttempted`) when the check fails.
        rules: what the student's code may call (:class:`~._guard.Rules`); every call of
            the student's function in the cases (:func:`_call`) runs under them.

    Returns:
        The :class:`CheckResult`, after printing its report.
    """
    name = getattr(fn, "__name__", exercise)
    if not callable(fn):
        head = f"{exercise}: expected a function to check, got {_describe(fn)}."
        return _finish(exercise, False, False, [head], [head])
    token = _RULES.set(rules)
    try:
        return _run_cases(exercise, name, cases)
    finally:
        _RULES.reset(token)


def _run_cases(exercise: str, name: str, cases: Sequence[Case]) -> CheckResult:
    lines: list[str] = []
    failures: list[str] = []
    hints: set[str] = set()
    for index, (description, run) in enumerate(cases):
        try:
            run()
        except _NotAttempted as exc:
            if exc.where in (None, name, "<lambda>"):
                head = (f"{exercise}: not attempted yet: `{name}` still raises "
                        "NotImplementedError. Replace `# YOUR CODE HERE` and the `raise` line "
                        "with your code, then run this cell again.")
            else:
                head = (f"{exercise}: not attempted yet: `{name}` calls `{exc.where}`, which still "
                        f"raises NotImplementedError. Complete `{exc.where}` first.")
            return _finish(exercise, False, False, [head], [head])
        except _Failure as exc:
            failures.append(f"{description}: {exc.message}")
            lines.append(f"  ✗ {description}: {exc.message}")
            if exc.hint and exc.hint not in hints:  # each hint once
                hints.add(exc.hint)
                lines.append(f"      Hint: {exc.hint}")
            if exc.refused:  # the same call would be refused in every case: stop here
                rest = cases[index + 1:]
                failures += [f"{d}: not run after the refused call" for d, _ in rest]
                if rest:
                    lines.append(f"  … {len(rest)} more check(s) not run after the refused "
                                 "call")
                break
        except Exception as exc:  # noqa: BLE001 - whatever happens, the notebook goes on
            message = f"could not be checked ({_one_line(exc)})"
            failures.append(f"{description}: {message}")
            lines.append(f"  ✗ {description}: {message}")
        else:
            lines.append(f"  ✓ {description}")
    n = len(cases)
    if failures:
        head = f"{exercise}: {n - len(failures)} of {n} checks passed."
    else:
        head = f"{exercise}: all {n} checks passed."
    return _finish(exercise, not failures, True, [head, *lines], failures)


def _finish(exercise: str, passed: bool, attempted: bool, lines: list[str],
            failures: list[str]) -> CheckResult:
    report = "\n".join(lines)
    print(report)
    return CheckResult(exercise, passed, attempted, report, failures)


# Calling the student's function -------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_CHECKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package

# Error messages that have a usual cause, and what to do about it.
_ERROR_HINTS = [
    ("view size is not compatible",
     "after a transpose the tensor is no longer contiguous, so .view cannot merge its axes: "
     "use .reshape (or .contiguous().view)"),
    ("must match the size of tensor",
     "two shapes do not broadcast: a reduction such as .sum(dim) or .amax(dim) drops that axis "
     "unless you pass keepdim=True"),
    ("cannot be multiplied",
     "check which axes the matmul contracts: the scores are q @ kᵀ, with k.transpose(-2, -1)"),
    ("batch2 tensor",
     "check which axes the matmul contracts: the scores are q @ kᵀ, with k.transpose(-2, -1)"),
    ("expected scalar type",
     "the two tensors have different dtypes: convert one with .to(other.dtype)"),
]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    summary = type(exc).__name__ + (f": {text[0]}" if text else "")
    return summary if len(summary) <= 200 else summary[:197] + "..."


def _outside_checks(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that are not the checkers' own."""
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if not os.path.abspath(f.filename).startswith(_CHECKS_DIR)]


def _student_line(exc: BaseException) -> str | None:
    """The line of the student's code where ``exc`` was raised (not torch's, not ours)."""
    frames = [f for f in _outside_checks(exc) if not f.filename.startswith(_TORCH_DIR)]
    return frames[-1].line.strip() if frames and frames[-1].line else None


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
    return line.startswith("raise NotImplementedError")


def _attempt(fn: Callable, args: Sequence[Any]) -> Any:
    """``fn(*args)`` under the current exercise's rules (:mod:`._guard`), where the stub's
    NotImplementedError means "not attempted yet": it becomes _NotAttempted, naming the
    function that raised it. A call the rules refuse, caught by the student's code or not,
    is a _Failure naming it. Other exceptions, another NotImplementedError included
    (:func:`_is_stub`), pass through."""
    rules = _RULES.get() or _DENY_ALL
    with _guard.guard(rules) as watch:
        try:
            result = fn(*args)
        except NotImplementedError as exc:
            if watch.refusals or not _is_stub(exc):
                raise
            frames = _outside_checks(exc)
            raise _NotAttempted(frames[-1].name if frames else None) from None
        except Exception:
            if not watch.refusals:
                raise
    if watch.refusals:
        raise _Failure(f"this exercise asks you to write it yourself: `{watch.refusals[0]}` "
                       "is not allowed here", f"{rules.explain()}; write the rest with "
                       "tensor operations", refused=True) from None
    return result


def _call(fn: Callable, args: Sequence[Any], names: Sequence[str]) -> Any:
    """``fn(*args)`` on copies of the tensor arguments, under the exercise's rules.

    Raises _NotAttempted for the stub's NotImplementedError (:func:`_is_stub`), _Failure for
    a call the rules refuse, for any other exception and for an argument changed in place."""
    inputs = [a.clone() if isinstance(a, Tensor) else a for a in args]
    try:
        result = _attempt(fn, inputs)
    except (_NotAttempted, _Failure):
        raise
    except Exception as exc:  # noqa: BLE001 - reported, never raised into the notebook
        line = _student_line(exc)
        where = f" at `{line}`" if line else ""
        hint = next((h for pattern, h in _ERROR_HINTS if pattern in str(exc)), None)
        raise _Failure(f"raised {_one_line(exc)}{where}", hint) from None
    for arg, original, name in zip(inputs, args, names):
        if isinstance(arg, Tensor) and not torch.equal(arg, original):
            raise _Failure(f"changed its input `{name}` in place",
                           "work on new tensors: write `x = x - m` rather than `x -= m` or "
                           "`x.sub_(m)`; the caller still needs its tensor")
    return result


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
            raise _Failure(f"raised a ValueError, but its message ({str(exc)!r}) does not give "
                           f"the sizes {', '.join(must_name)}",
                           "say what is wrong with which values, e.g. "
                           "\"C (10) must be divisible by n_heads (3)\"") from None
        return
    except Exception as exc:  # noqa: BLE001
        raise _Failure(f"raised {_one_line(exc)} instead of a ValueError",
                       f"check the sizes first: {reason}; raise a ValueError that says "
                       "so") from None
    raise _Failure(f"returned {_describe(result)} instead of raising a ValueError ({reason})")


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
            f"the work grows with the size of a {unit}: {counts[0]} PyTorch operations for "
            f"{sizes[0]}, {counts[1]} for {sizes[1]}, the same number of {unit}s",
            f"compute each {unit} with whole-tensor operations (matrix products over the "
            f"{unit}), not with a loop over its tokens: the number of operations may depend on "
            f"the number of {unit}s, never on their size")


def _describe(value: Any) -> str:
    if value is None:
        return "None (is a `return` missing?)"
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a value of type {type(value).__name__}"


def _items(got: Any, n: int, what: str) -> tuple:
    """``got`` as a tuple of ``n`` items (a tuple or a list), else _Failure: "return ``what``".

    Args:
        got: what the student's function returned.
        n: how many items it should return, e.g. 2 for ``(out, weights)``.
        what: the return value in words, e.g. ``"the pair (out, weights)"``.
    """
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise _Failure(f"returned {_describe(got)}: return {what}")
    return tuple(got)


# Comparing tensors --------------------------------------------------------------------------


def _where(idx: Sequence[int], axes: Sequence[str] | None) -> str:
    idx = [int(i) for i in idx]
    if axes and len(axes) == len(idx):
        return ", ".join(f"{a} {i}" for a, i in zip(axes, idx))
    return f"position {tuple(idx)}"


def _first(mask: Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def _matches(got: Tensor, candidate: Tensor, atol: float, rtol: float) -> bool:
    """``got`` equals a known wrong answer: close wherever both are finite, and non-finite
    only where the wrong answer is too."""
    if got.shape != candidate.shape:
        return False
    g, c = got.detach().double(), candidate.detach().double()
    finite = torch.isfinite(g) & torch.isfinite(c)
    if not finite.any() or (~torch.isfinite(g) & torch.isfinite(c)).any():
        return False
    return torch.allclose(g[finite], c[finite], atol=atol, rtol=rtol)


Property = Callable[[Tensor], str | None]  # a message when the output lacks the property


def _compare(got: Any, expected: Tensor, what: str, *, letters: str | None = None,
             axes: Sequence[str] | None = None, atol: float = ATOL, rtol: float = RTOL,
             nan_hint: str | None = None, properties: Sequence[Property] = (),
             mistakes: Sequence[tuple[Tensor, str]] = (),
             shape_hints: dict[tuple[int, ...], str] | None = None) -> None:
    """Raise _Failure for the first thing wrong with ``got``.

    In order: not a tensor, shape, dtype, NaN or inf, each of ``properties`` (a function
    returning a message or None), values. ``mistakes`` are (wrong answer, hint) pairs: when
    ``got`` matches one, its hint says what went wrong.

    Args:
        got: the student's output.
        expected: the reference output.
        what: the output in words, e.g. ``"the weights"``.
        letters: its shape in letters, e.g. ``"(B, H, T, S)"``, shown with a wrong shape.
        axes: a name for each axis, to say where the first wrong entry is.
        nan_hint: the hint when NaN or inf appears where the reference has none.
        shape_hints: wrong shape -> hint.
    """
    if not isinstance(got, Tensor):
        raise _Failure(f"{what} should be a tensor, got {_describe(got)}")
    if tuple(got.shape) != tuple(expected.shape):
        named = f"{letters} = " if letters else ""
        hint = (shape_hints or {}).get(tuple(got.shape))
        raise _Failure(f"wrong shape for {what}: expected {named}{tuple(expected.shape)}, "
                       f"got {tuple(got.shape)}", hint)
    if got.dtype != expected.dtype:
        raise _Failure(f"wrong dtype for {what}: expected {expected.dtype}, got {got.dtype}",
                       "keep the dtype of the inputs")
    g, e = got.detach().double(), expected.double()
    problem, hint = None, None
    for bad, name in ((torch.isnan(g) & ~torch.isnan(e), "NaN"),
                      (torch.isinf(g) & ~torch.isinf(e), "inf")):
        if bad.any():
            idx = _first(bad)
            problem = (f"{name} appeared in {what} at {_where(idx, axes)} "
                       f"(expected {e[idx].item():.4g})")
            hint = nan_hint
            break
    for prop in properties if problem is None else ():
        problem = prop(g)
        if problem:
            break
    if problem is None:
        close = torch.isclose(g, e, rtol=rtol, atol=atol)
        if not close.all():
            idx = _first(~close)
            problem = (f"wrong values in {what} at {_where(idx, axes)}: expected "
                       f"{e[idx].item():.4g}, got {g[idx].item():.4g} "
                       f"({int((~close).sum())} of {close.numel()} entries wrong)")
    if problem is not None:
        known = next((h for wrong, h in mistakes if _matches(got, wrong, atol, rtol)), None)
        raise _Failure(problem, known or hint)


# Comparing numbers ----------------------------------------------------------------------------


def _as_number(got: Any, what: str) -> float:
    """``got`` as a float: an int, a float or a one-element tensor; else _Failure."""
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise _Failure(f"{what} should be a number, got {_describe(got)}")
    return float(got)


def _compare_number(got: Any, expected: float, what: str, *, rel_tol: float = 1e-6,
                    mistakes: Sequence[tuple[float, str]] = ()) -> None:
    """Raise _Failure unless ``got`` is a number within ``rel_tol`` of ``expected``.

    ``mistakes`` are (wrong value, hint) pairs: when ``got`` is one of them (within
    ``rel_tol``), its hint says what went wrong; the first match wins.
    """
    value = _as_number(got, what)
    if value != value:  # NaN
        raise _Failure(f"NaN appeared in {what} (expected {expected:.6g})")
    if abs(value - expected) <= rel_tol * abs(expected):
        return
    known = next((hint for wrong, hint in mistakes
                  if abs(value - wrong) <= rel_tol * abs(wrong)), None)
    raise _Failure(f"wrong value for {what}: expected {expected:.6g}, got {value:.6g}", known)


def _known_mistakes(formula: Callable[..., float], args: Sequence[Any], names: Sequence[str],
                    table: Sequence[tuple[dict[str, Any], str]]) -> list[tuple[float, str]]:
    """The ``mistakes`` of :func:`_compare_number` from a table of wrong answers.

    Args:
        formula: the reference formula; its keyword arguments make it commit one mistake each
            (e.g. ``factor=1``: keys or values, not both).
        args: the case's arguments, as the student's function gets them.
        names: the name of each argument; a keyword in ``table`` whose value is one of these
            names takes that argument's value (``heads="n_heads"``).
        table: ``(keyword arguments, hint)`` rows.

    Returns:
        ``(wrong value, hint)`` pairs, in the table's order, for the rows whose wrong value
        differs from the right one on these arguments.
    """
    want = formula(*args)
    found = []
    for kwargs, hint in table:
        kwargs = {k: (args[names.index(v)] if isinstance(v, str) and v in names else v)
                  for k, v in kwargs.items()}
        wrong = formula(*args, **kwargs)
        if wrong != want:
            found.append((wrong, hint))
    return found
