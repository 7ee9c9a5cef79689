"""The time each stage of the test run took, printed at the end of the run; and the order in
which the test files are handed to the parallel workers, the longest first.

A stage is a group of test files (``STAGES``): the Colab-like environment, Binder, the
grader, the student copies, the browser, the notebooks under nbval, and so on. Its time is the
sum of its tests' durations (setup, call and teardown, where the expensive fixtures live), in
seconds of one worker: with two workers the run takes about half the sum. CONTRIBUTING's
table of what CI costs ("What CI runs, and what it costs") is read from this summary.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

# The first stage whose test-file prefix matches names a file's stage; the rest is "library".
STAGES = (
    ("nbval (chapters, appendix)", ("chapters/", "appendix/")),
    ("student copies", ("tests/test_student.py",)),
    ("Colab-like", ("tests/test_colab.py",)),
    ("Binder", ("tests/test_binder.py",)),
    ("grader", ("tests/test_grade.py",)),
    ("Gradescope", ("tests/test_gradescope.py",)),
    ("browser", ("tests/test_browser", "tests/test_accessibility")),
    ("editions in other languages", ("tests/test_i18n.py",)),
    ("planted bugs", ("tests/test_planted_bugs.py",)),
    ("built book", ("tests/test_book.py", "tests/test_publishing.py")),
)
LIBRARY = "library and tools"

# The files that take longest, longest first (seconds of one worker, measured on the 2-core
# machine). pytest-xdist's --dist loadfile hands whole files to the workers in collection
# order (the Makefile turns off its own reordering by number of tests): the long files start
# first and the run ends on short ones, not with one worker running Binder's environment
# alone while the other waits. Then the notebooks under nbval (5-60 s each), then the rest.
LONGEST_FIRST = (
    "tests/test_browser.py",  # about 550 s: one load per page, every probe and the gate
    "tests/test_colab.py",  # about 280 s: the Colab-like environment
    "tests/test_browser_i18n.py",  # about 250 s
    "tests/test_binder.py",  # about 180 s
    "tests/test_student.py",  # about 100 s
    "tests/test_gradescope.py",  # about 90 s
    "tests/test_grade.py",  # about 75 s
    "tests/test_browser_reading.py",  # about 40 s
    "tests/test_i18n.py",  # about 35 s
)
NOTEBOOKS = ("chapters/", "appendix/")

_seconds: dict[str, float] = defaultdict(float)


def stage_of(nodeid: str) -> str:
    """The stage of a test, from its node id (``tests/test_colab.py::test_x[...]``)."""
    path = str(PurePosixPath(nodeid.split("::", 1)[0]))
    for stage, prefixes in STAGES:
        if path.startswith(prefixes):
            return stage
    return LIBRARY


def _rank(path: str) -> int:
    if path in LONGEST_FIRST:
        return LONGEST_FIRST.index(path)
    return len(LONGEST_FIRST) + (0 if path.startswith(NOTEBOOKS) else 1)


def pytest_collection_modifyitems(items):
    """Files in the order of :data:`LONGEST_FIRST` (a stable sort: the tests of a file keep
    their order)."""
    items.sort(key=lambda item: _rank(str(PurePosixPath(item.nodeid.split("::", 1)[0]))))


def pytest_runtest_logreport(report):
    _seconds[stage_of(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section("time per stage (seconds of one worker)")
    for stage, seconds in sorted(_seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{stage:30s} {seconds:7.1f}")
    terminalreporter.write_line(f"{'all':30s} {sum(_seconds.values()):7.1f}")
