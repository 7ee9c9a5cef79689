"""The time each stage of the test run took, printed at the end of the run.

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

_seconds: dict[str, float] = defaultdict(float)


def stage_of(nodeid: str) -> str:
    """The stage of a test, from its node id (``tests/test_colab.py::test_x[...]``)."""
    path = str(PurePosixPath(nodeid.split("::", 1)[0]))
    for stage, prefixes in STAGES:
        if path.startswith(prefixes):
            return stage
    return LIBRARY


def pytest_runtest_logreport(report):
    _seconds[stage_of(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section("time per stage (seconds of one worker)")
    for stage, seconds in sorted(_seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{stage:30s} {seconds:7.1f}")
    terminalreporter.write_line(f"{'all':30s} {sum(_seconds.values()):7.1f}")
