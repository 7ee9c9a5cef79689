"""The contract every exercise checker keeps, tested on every checker the package exports.

The checkers are found, not listed: each public ``check_*`` of ``transformer_lib.checks``, and
each needs an exercise in a chapter whose reference solution (the chapter's own solution cell,
read by ``chapter_solutions``) it checks. For each: the reference passes; an untouched stub is "not attempted yet", in one line; a raising function gets its
exception's one-line summary; a non-callable and odd return values never escape as
exceptions; NaN in a floating-point output is reported as NaN; the global random state is
left alone.

A function exercise may take keyword arguments as well (chapter 4's training step): the
stand-in submissions below accept them.

An exercise may ask for a class (an ``nn.Module``) instead of a function: its checker builds
the class and calls its ``forward``. For such a checker the same contract is tested on
classes: the stub is the class as the student copy gives it (every method raising
NotImplementedError, ``__init__`` included), the raising submission raises in its constructor,
the odd and the NaN outputs come from ``forward``, and what is not a class is refused as
such."""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import pkgutil
import re

import pytest
import torch

from transformer_lib import checks

from chapter_solutions import SOLUTIONS, chapter_exercises
from conftest import checkers_in, run_check

CHECKERS = {name: fn for name, fn in inspect.getmembers(checks, inspect.isfunction)
            if name.startswith("check_")}
NAMES = sorted(CHECKERS)


def _is_class(name: str) -> bool:
    """Whether checker ``name``'s exercise asks for a class (its reference is one)."""
    return isinstance(SOLUTIONS.get(name), type)


def _with_forward(name: str, forward):
    """For a class exercise: the reference class with ``forward(self, *args)`` replaced."""
    return type("Submission", (SOLUTIONS[name],), {"forward": forward})


def _solution(name: str):
    if name not in SOLUTIONS:
        pytest.fail(f"no chapter asserts {name} on an exercise with a solution region")
    return SOLUTIONS[name]


def _has_float_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    return isinstance(value, (tuple, list)) and any(_has_float_tensor(v) for v in value)


def _returns_floats(name: str) -> bool:
    """Whether the reference solution returns a floating-point tensor on the checker's own
    inputs: run the checker once on the solution and look at what it returned."""
    returned = []

    def recording(*args, **kwargs):
        returned.append(SOLUTIONS[name](*args, **kwargs))
        return returned[-1]

    if _is_class(name):
        def forward(self, *args):
            returned.append(SOLUTIONS[name].forward(self, *args))
            return returned[-1]

        recording = _with_forward(name, forward)
    with contextlib.redirect_stdout(io.StringIO()):
        CHECKERS[name](recording)
    return any(_has_float_tensor(value) for value in returned)


FLOAT_OUTPUT = [name for name in NAMES if name in SOLUTIONS and _returns_floats(name)]


def _with_nan(value):
    """``value`` with NaN in one entry of each floating-point tensor; the rest unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        flat = value.detach().flatten().clone()
        flat[flat.numel() // 2] = float("nan")
        return flat.view_as(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_with_nan(v) for v in value)
    return value


# Which checkers there are -----------------------------------------------------------------


def test_every_checker_has_a_reference_solution():
    assert NAMES, "no checkers found in transformer_lib.checks"
    missing = [name for name in NAMES if name not in SOLUTIONS]
    assert not missing, f"no chapter exercise with a solution region is checked by {missing}"
    stale = sorted(set(SOLUTIONS) - set(CHECKERS))
    assert not stale, f"chapters assert checkers the package does not export: {stale}"


def test_reference_solutions_are_the_chapters_own_cells():
    """Each reference is compiled from its chapter's solution cell, so a fix in the chapter is
    what the tests run: no copy to drift from it."""
    for chapter, listed in chapter_exercises().items():
        for exercise in listed:
            solution = SOLUTIONS[exercise.checker]
            assert solution.__name__ == exercise.function
            functions = ([f for f in vars(solution).values() if inspect.isfunction(f)]
                         if isinstance(solution, type) else [solution])  # a class: its methods
            assert functions
            for function in functions:
                where = f"<{chapter}.ipynb, cell {exercise.cell}>"
                assert function.__code__.co_filename == where
                assert inspect.getsource(function).rstrip() in exercise.solution
            assert "### BEGIN SOLUTION" not in exercise.solution


def test_every_chapter_module_is_exported():
    """Each ``check_*`` of each ``chNN_*`` module is importable from the package, and
    listed in ``__all__`` beside the result type and the exercises' rules."""
    defined = []
    for info in pkgutil.iter_modules(checks.__path__):
        if re.fullmatch(r"ch\d\d_\w+", info.name):
            defined += checkers_in(importlib.import_module(f"{checks.__name__}.{info.name}"))
    assert sorted(defined) == NAMES
    assert sorted(checks.__all__) == sorted(["CheckResult", "EXERCISE_RULES", "Rules", *NAMES])


def test_some_checkers_return_floats():
    """The NaN contract below runs on the checkers whose reference returns a float tensor."""
    assert "check_chunked_causal_attention" in FLOAT_OUTPUT
    assert "check_grouped_query_attention" in FLOAT_OUTPUT  # a class: its forward's output
    assert "check_left_padded_causal_mask" not in FLOAT_OUTPUT  # a boolean mask


# The contract -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_reference_solution_passes(name, capsys):
    result, printed = run_check(CHECKERS[name], _solution(name), capsys)
    assert result and result.passed and result.attempted and result.failures == []
    assert "checks passed." in printed.splitlines()[0] and "✗" not in printed
    assert repr(result).endswith(": passed)")


@pytest.mark.parametrize("name", NAMES)
def test_untouched_stub_is_not_attempted_yet(name, capsys):
    def stub(*args, **kwargs):
        # YOUR CODE HERE
        raise NotImplementedError()

    class Stub(torch.nn.Module):  # a class exercise's stub: every method, __init__ included
        def __init__(self, *args):
            # YOUR CODE HERE
            raise NotImplementedError()

        def forward(self, *args):
            # YOUR CODE HERE
            raise NotImplementedError()

    submission, named = (Stub, "`Stub.__init__`") if _is_class(name) else (stub, "`stub`")
    result, printed = run_check(CHECKERS[name], submission, capsys)
    assert not result and not result.attempted
    assert "not attempted yet" in printed and f"{named} still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1, "one line, not one per check"
    assert repr(result).endswith(": not attempted yet)")


@pytest.mark.parametrize("name", [n for n in NAMES if _is_class(n)])
def test_a_class_whose_forward_is_the_stub_is_not_attempted_yet(name, capsys):
    def forward(self, *args):
        # YOUR CODE HERE
        raise NotImplementedError()

    result, printed = run_check(CHECKERS[name], _with_forward(name, forward), capsys)
    assert not result and not result.attempted
    assert "not attempted yet: `Submission.forward` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1


@pytest.mark.parametrize("name", NAMES)
def test_raising_solution_gets_a_one_line_summary(name, capsys):
    message = "index 7 is out of bounds\nsecond line of detail"

    def broken(*args, **kwargs):
        raise IndexError(message)

    class Broken(torch.nn.Module):
        def __init__(self, *args):
            raise IndexError(message)

    result, printed = run_check(CHECKERS[name], Broken if _is_class(name) else broken, capsys)
    assert not result and result.attempted and result.failures
    assert all("raised IndexError: index 7 is out of bounds" in f for f in result.failures)
    assert "raised IndexError: index 7 is out of bounds at `raise IndexError(message)`" in printed
    assert "second line" not in printed


@pytest.mark.parametrize("name", NAMES)
def test_not_a_function(name, capsys):
    kind = "class" if _is_class(name) else "function"
    result, printed = run_check(CHECKERS[name], 42, capsys)
    assert not result and not result.attempted
    assert f"expected a {kind} to check, got a value of type int" in printed
    if kind == "class":  # a function is not what a class exercise asks for either
        result, printed = run_check(CHECKERS[name], lambda *args: None, capsys)
        assert not result and not result.attempted
        assert "expected a class to check, got a value of type function" in printed


@pytest.mark.parametrize("value", [None, "a string", 3, (1, 2), [torch.zeros(1)]],
                         ids=["None", "str", "int", "tuple", "list"])
@pytest.mark.parametrize("name", NAMES)
def test_odd_return_values_never_escape(name, value, capsys):
    submission = (_with_forward(name, lambda self, *args: value) if _is_class(name)
                  else lambda *args, **kwargs: value)
    result, printed = run_check(CHECKERS[name], submission, capsys)
    assert not result and result.attempted and "✗" in printed


@pytest.mark.parametrize("name", FLOAT_OUTPUT)
def test_nan_in_the_output_is_reported_as_nan(name, capsys):
    solution = SOLUTIONS[name]

    def nan_somewhere(*args, **kwargs):
        return _with_nan(solution(*args, **kwargs))

    if _is_class(name):
        nan_somewhere = _with_forward(
            name, lambda self, *args: _with_nan(solution.forward(self, *args)))
    result, printed = run_check(CHECKERS[name], nan_somewhere, capsys)
    assert not result and result.attempted
    assert "NaN appeared in " in printed


@pytest.mark.parametrize("name", NAMES)
def test_checking_leaves_the_global_random_state_alone(name, capsys):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    CHECKERS[name](_solution(name))
    assert torch.equal(state, torch.get_rng_state())
