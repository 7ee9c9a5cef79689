"""Comparing what the student's function returned with the reference: a tensor
(:func:`_compare`) or a number (:func:`_compare_number`), with a hint when the answer matches a
known mistake. Part of the harness (:mod:`._harness` re-exports every name)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from transformer_lib.checks._messages import say
from transformer_lib.checks._results import _describe, _Failure

# fp32 inputs, and a student may order the operations differently from the reference
# (q / √D before or after the matmul, max subtracted or not): a few ulps of the scores.
ATOL = 1e-5
RTOL = 1e-4


# Comparing tensors --------------------------------------------------------------------------


def _where(idx: Sequence[int], axes: Sequence[str] | None) -> str:
    idx = [int(i) for i in idx]
    if axes and len(axes) == len(idx):
        return ", ".join(say("{axis} {index}", axis=a, index=i) for a, i in zip(axes, idx))
    return say("position {index}", index=tuple(idx))


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
        raise _Failure(say("{what} should be a tensor, got {got}", what=what, got=_describe(got)))
    if tuple(got.shape) != tuple(expected.shape):
        hint = (shape_hints or {}).get(tuple(got.shape))
        if letters:
            raise _Failure(say("wrong shape for {what}: expected {letters} = {expected}, got {got}",
                               what=what, letters=letters, expected=tuple(expected.shape),
                               got=tuple(got.shape)), hint)
        raise _Failure(say("wrong shape for {what}: expected {expected}, got {got}", what=what,
                           expected=tuple(expected.shape), got=tuple(got.shape)), hint)
    if got.dtype != expected.dtype:
        raise _Failure(say("wrong dtype for {what}: expected {expected}, got {got}", what=what,
                           expected=expected.dtype, got=got.dtype),
                       say("keep the dtype of the inputs"))
    g, e = got.detach().double(), expected.double()
    problem, hint = None, None
    for bad, name in ((torch.isnan(g) & ~torch.isnan(e), "NaN"),
                      (torch.isinf(g) & ~torch.isinf(e), "inf")):
        if bad.any():
            idx = _first(bad)
            problem = say("{name} appeared in {what} at {where} (expected {expected:.4g})",
                          name=name, what=what, where=_where(idx, axes), expected=e[idx].item())
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
            problem = say("wrong values in {what} at {where}: expected {expected:.4g}, got "
                          "{got:.4g} ({wrong} of {n} entries wrong)", what=what,
                          where=_where(idx, axes), expected=e[idx].item(), got=g[idx].item(),
                          wrong=int((~close).sum()), n=close.numel())
    if problem is not None:
        known = next((h for wrong, h in mistakes if _matches(got, wrong, atol, rtol)), None)
        raise _Failure(problem, known or hint)


# Comparing numbers ----------------------------------------------------------------------------


def _as_number(got: Any, what: str) -> float:
    """``got`` as a float: an int, a float or a one-element tensor; else _Failure."""
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise _Failure(say("{what} should be a number, got {got}", what=what, got=_describe(got)))
    return float(got)


def _compare_number(got: Any, expected: float, what: str, *, rel_tol: float = 1e-6,
                    mistakes: Sequence[tuple[float, str]] = ()) -> None:
    """Raise _Failure unless ``got`` is a number within ``rel_tol`` of ``expected``.

    ``mistakes`` are (wrong value, hint) pairs: when ``got`` is one of them (within
    ``rel_tol``), its hint says what went wrong; the first match wins.
    """
    value = _as_number(got, what)
    if value != value:  # NaN
        raise _Failure(say("NaN appeared in {what} (expected {expected:.6g})", what=what,
                           expected=expected))
    if abs(value - expected) <= rel_tol * abs(expected):
        return
    known = next((hint for wrong, hint in mistakes
                  if abs(value - wrong) <= rel_tol * abs(wrong)), None)
    raise _Failure(say("wrong value for {what}: expected {expected:.6g}, got {value:.6g}",
                       what=what, expected=expected, value=value), known)


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
