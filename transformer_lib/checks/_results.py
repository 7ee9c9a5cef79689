"""What a checker finds: the :class:`CheckResult` it returns, the failure of one check, the
stub's "not attempted yet", and a returned value in words. Part of the harness
(:mod:`._harness` re-exports every name)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import Tensor

from transformer_lib.checks._messages import say

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
        state = say("passed") if self.passed else say("not attempted yet") if not (
            self.attempted) else say("{failed} check(s) failed", failed=len(self.failures))
        return say("CheckResult({exercise}: {state})", exercise=self.exercise, state=state)


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



def _describe(value: Any) -> str:
    if value is None:
        return say("None (is a `return` missing?)")
    if isinstance(value, Tensor):
        return say("a tensor of shape {shape}", shape=tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return say("a {kind} of {n} items", kind=type(value).__name__, n=len(value))
    return say("a value of type {kind}", kind=type(value).__name__)
