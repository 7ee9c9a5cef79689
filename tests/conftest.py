"""Shared fixtures: seeds, weight randomisation, and access to the optional reference library."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub

# The time of each stage, printed at the end of a run (tests/stage_times.py); the equality
# ledger (tests/ledger_plugin.py): the `ledger` fixture of the tests marked `equality`, and the
# hooks that check them.
pytest_plugins = ["stage_times", "ledger_plugin"]

# The device of the tests marked `gpu` (tests/test_gpu.py): CUDA, unless
# TRANSFORMER_LIB_TEST_DEVICE names another (e.g. "cpu", to run their logic on a machine
# without a GPU).
TEST_DEVICE = os.environ.get("TRANSFORMER_LIB_TEST_DEVICE", "cuda")


# nbval waits 5 s for a cell's output messages once the kernel has replied; on a loaded
# machine they can come later, and the cell would fail with "Timeout of 5 seconds exceeded
# waiting for output" although it ran. The cells' own time limit is --nbval-cell-timeout.
NBVAL_OUTPUT_TIMEOUT = 60


def pytest_collection_modifyitems(config, items):
    """Give nbval's cells time to deliver their outputs; skip the tests marked `gpu`, with
    the reason, where they would need a missing CUDA device."""
    for item in items:
        if hasattr(item, "output_timeout"):  # a notebook cell collected by nbval
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT
    if not TEST_DEVICE.startswith("cuda"):
        return
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(no_cuda)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# _build/ holds what `make book` generates; a fresh clone has none of it. In a run that leaves
# the `book` tests out (`make check`), a test that is not marked `book` or `browser` must not
# look there: it would pass on a machine that built the book and fail on a fresh clone. The
# files it opens and lists are seen by an audit hook, its existence checks through os.stat.
BUILD = str(Path(__file__).resolve().parent.parent / "_build")
_build_reads: list[str] | None = None  # while a watched test runs: what it read under _build/


def _under_build(path) -> str | None:
    """``path`` as a string if it lies under _build/ (an open file descriptor never does)."""
    if path is None or isinstance(path, int):
        return None
    try:
        text = os.path.abspath(os.fsdecode(path))
    except TypeError:
        return None
    return text if text == BUILD or text.startswith(BUILD + os.sep) else None


def _audit(event: str, args: tuple) -> None:
    if _build_reads is not None and event in ("open", "os.listdir", "os.scandir") and args:
        path = _under_build(args[0])
        if path is not None:
            _build_reads.append(path)


def pytest_configure(config):
    if "not book" in (config.option.markexpr or ""):
        sys.addaudithook(_audit)  # for the life of the process; idle unless a test is watched


@pytest.fixture(autouse=True)
def _no_build_outputs(request, monkeypatch):
    """Fail a test of a run without the `book` tests that reads or checks a path under
    _build/, unless it is marked `book` or `browser`."""
    global _build_reads
    watched = ("not book" in (request.config.option.markexpr or "")
               and request.node.get_closest_marker("book") is None
               and request.node.get_closest_marker("browser") is None)
    if not watched:
        yield
        return
    stat = os.stat

    def watched_stat(path, *args, **kwargs):
        found = _under_build(path)
        if found is not None:
            _build_reads.append(found)
        return stat(path, *args, **kwargs)

    _build_reads = []
    monkeypatch.setattr(os, "stat", watched_stat)
    try:
        yield
    finally:
        reads, _build_reads = _build_reads, None
    if reads:
        pytest.fail(f"reads the book's build output {sorted(set(reads))[:3]} in a run without "
                    "the `book` tests (a fresh clone has no _build/): mark it `book`, or leave "
                    "_build/ out", pytrace=False)


@torch.no_grad()
def randomize_(module: torch.nn.Module, std: float = 0.2) -> torch.nn.Module:
    """Give every parameter random values, norm weights included (around 1, never all ones),
    so that a wrong mapping between two implementations cannot hide behind ones and zeros."""
    for name, p in module.named_parameters():
        if "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
        else:
            p.normal_(0.0, std)
    return module


def require(package: str):
    """Import ``package`` for a reference comparison. Outside CI a missing package skips the
    test with the reason; in CI (``CI`` set) it fails, so reference tests can never be skipped.
    A test that calls it is a comparison: it must be marked ``equality`` (tests/ledger_plugin.py)."""
    from ledger_plugin import reference_loaded  # registered above, by pytest_plugins

    reference_loaded(package)
    try:
        return importlib.import_module(package)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{package} is required in CI for the reference tests")
        pytest.skip(f"{package} is not installed: reference comparison skipped "
                    f"(pip install -r requirements.txt)")


def run_check(check, fn, capsys):
    """Run an exercise checker on ``fn``: its result and what it printed. A checker must never
    raise, and what it prints is its report."""
    result = check(fn)
    printed = capsys.readouterr().out
    assert printed.strip() == result.report.strip()
    return result, printed


def checkers_in(module) -> list[str]:
    """The names of the exercise checkers that ``module`` defines (its ``check_*`` functions),
    in the order of the module."""
    return [name for name, value in vars(module).items()
            if name.startswith("check_") and callable(value)
            and getattr(value, "__module__", None) == module.__name__]


@contextlib.contextmanager
def trusting(*functions):
    """Within the block, the student's code may call ``functions`` (a checker's reference),
    so that a test can build a wrong answer from the reference with one thing changed. It
    edits the guard's set directly: a call into the guard from "student" code is refused."""
    from transformer_lib.checks import _guard

    codes = {f.__code__ for f in functions} - _guard._GIVEN
    _guard._GIVEN.update(codes)
    try:
        yield
    finally:
        _guard._GIVEN.difference_update(codes)


def assert_rejected(check, wrong, fragments, capsys) -> None:
    """``check`` fails the attempted solution ``wrong`` and its report contains each of
    ``fragments``: what is wrong, and the hint for this mistake."""
    result, printed = run_check(check, wrong, capsys)
    assert not result and result.attempted and result.failures
    for fragment in fragments:
        assert fragment in printed, f"{fragment!r} not in:\n{printed}"


def mistake_tests(wrong, chapter_module):
    """The two tests every chapter's checkers get, over ``wrong``, a list of (checker, wrong
    solution, fragments its report must contain): each wrong solution is rejected with its
    reason, and each checker of ``chapter_module`` is tried on at least two mistakes. A test
    file binds them to test names: ``test_rejected, test_two_mistakes = mistake_tests(...)``."""

    @pytest.mark.parametrize("check, attempt, fragments", wrong,
                             ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(wrong)])
    def test_wrong_solution_is_rejected_with_the_reason(check, attempt, fragments, capsys):
        assert_rejected(check, attempt, fragments, capsys)

    @pytest.mark.parametrize("name", checkers_in(chapter_module))
    def test_every_checker_knows_at_least_two_mistakes(name):
        assert sum(check.__name__ == name for check, _, _ in wrong) >= 2

    return test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes
