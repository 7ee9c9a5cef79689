"""The contract every exercise checker keeps, tested on every checker the package exports.

The checkers are found, not listed: each public ``check_*`` of ``transformer_lib.checks``, and
each needs an exercise in a chapter whose reference solution (the chapter's own solution cell,
read by ``chapter_solutions``) it checks. For each: the reference passes; an untouched stub is "not attempted yet", in one line; a raising function gets its
exception's one-line summary; a non-callable and odd return values never escape as
exceptions; NaN in a floating-point output is reported as NaN; the global random state is
left alone."""
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

    def recording(*args):
        returned.append(SOLUTIONS[name](*args))
        return returned[-1]

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
            assert solution.__code__.co_filename == f"<{chapter}.ipynb, cell {exercise.cell}>"
            assert inspect.getsource(solution).rstrip() in exercise.solution
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
    def stub(*args):
        # YOUR CODE HERE
        raise NotImplementedError()

    result, printed = run_check(CHECKERS[name], stub, capsys)
    assert not result and not result.attempted
    assert "not attempted yet" in printed and "`stub` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1, "one line, not one per check"
    assert repr(result).endswith(": not attempted yet)")


@pytest.mark.parametrize("name", NAMES)
def test_raising_solution_gets_a_one_line_summary(name, capsys):
    message = "index 7 is out of bounds\nsecond line of detail"

    def broken(*args):
        raise IndexError(message)

    result, printed = run_check(CHECKERS[name], broken, capsys)
    assert not result and result.attempted and result.failures
    assert all("raised IndexError: index 7 is out of bounds" in f for f in result.failures)
    assert "raised IndexError: index 7 is out of bounds at `raise IndexError(message)`" in printed
    assert "second line" not in printed


@pytest.mark.parametrize("name", NAMES)
def test_not_a_function(name, capsys):
    result, printed = run_check(CHECKERS[name], 42, capsys)
    assert not result and not result.attempted
    assert "expected a function to check, got a value of type int" in printed


@pytest.mark.parametrize("value", [None, "a string", 3, (1, 2), [torch.zeros(1)]],
                         ids=["None", "str", "int", "tuple", "list"])
@pytest.mark.parametrize("name", NAMES)
def test_odd_return_values_never_escape(name, value, capsys):
    result, printed = run_check(CHECKERS[name], lambda *args: value, capsys)
    assert not result and result.attempted and "✗" in printed


@pytest.mark.parametrize("name", FLOAT_OUTPUT)
def test_nan_in_the_output_is_reported_as_nan(name, capsys):
    solution = SOLUTIONS[name]

    def nan_somewhere(*args):
        return _with_nan(solution(*args))

    result, printed = run_check(CHECKERS[name], nan_somewhere, capsys)
    assert not result and result.attempted
    assert "NaN appeared in " in printed


@pytest.mark.parametrize("name", NAMES)
def test_checking_leaves_the_global_random_state_alone(name, capsys):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    CHECKERS[name](_solution(name))
    assert torch.equal(state, torch.get_rng_state())
