"""The dishonest and broken submissions that the grader's tests share (``tests/test_grade.py``
for ``make grade``, ``tests/test_gradescope.py`` for the Gradescope autograder)."""
from __future__ import annotations

from pathlib import Path

import nbformat

# A checkers package that passes everything, as a submission would plant it.
FAKE_CHECKS = """
class _Passed:
    passed, attempted, failures = True, True, []
    report = "all 3 checks passed."

    def __bool__(self):
        return True


def __getattr__(name):
    if name.startswith("check_"):
        return lambda fn: _Passed()
    raise AttributeError(name)
"""


# A cell that never ends. It sleeps in its loop, so that the core stays free for the other
# submissions and tests while the grader waits out the time limit (a clock, not CPU time).
ENDLESS = "import time\nwhile True:\n    time.sleep(0.05)"


def wrong(function: str) -> str:
    """A definition of ``function`` that every checker fails: it returns None."""
    return f"def {function}(*args, **kwargs):\n    return None\n"


def with_cell(source_nb: Path, code: str, index: int | None = None):
    """The notebook at ``source_nb`` with a code cell ``code`` inserted at ``index`` (default:
    at the end)."""
    nb = nbformat.read(source_nb, as_version=4)
    cell = nbformat.v4.new_code_cell(code)
    nb.cells.insert(len(nb.cells) if index is None else index, cell)
    return nb


def renamed(nb, old: str, new: str):
    """``nb`` with the function ``old`` defined as ``new`` in every code cell."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = cell.source.replace(f"def {old}(", f"def {new}(")
    return nb


def plant_fake_package(folder: Path) -> None:
    """Write a ``transformer_lib`` package whose checkers pass everything into ``folder``."""
    (folder / "transformer_lib" / "checks").mkdir(parents=True, exist_ok=True)
    (folder / "transformer_lib" / "__init__.py").write_text("", encoding="utf-8")
    (folder / "transformer_lib" / "checks" / "__init__.py").write_text(FAKE_CHECKS,
                                                                       encoding="utf-8")


def plant_at_run_time(function: str) -> str:
    """A cell that writes the fake package into the kernel's working directory, puts that
    directory first on sys.path (where '' already is) and imports it in place of the real
    one, then defines ``function`` wrongly."""
    return f"""
import os, sys
from pathlib import Path
(Path.cwd() / "transformer_lib" / "checks").mkdir(parents=True, exist_ok=True)
(Path.cwd() / "transformer_lib" / "__init__.py").write_text("")
(Path.cwd() / "transformer_lib" / "checks" / "__init__.py").write_text({FAKE_CHECKS!r})
sys.path.insert(0, os.getcwd())
for name in [m for m in sys.modules if m.startswith("transformer_lib")]:
    del sys.modules[name]
import transformer_lib.checks
{wrong(function)}"""


def import_hook(function: str) -> str:
    """A cell that serves the fake checkers through an import hook, whatever sys.path holds,
    then defines ``function`` wrongly."""
    return f"""
import importlib.abc, importlib.util, os, sys
FAKE = os.path.join(os.getcwd(), "fake_checks.py")
with open(FAKE, "w") as f:
    f.write({FAKE_CHECKS!r})


class FakeChecks(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "transformer_lib.checks":
            return importlib.util.spec_from_file_location(name, FAKE)
        return None


sys.meta_path.insert(0, FakeChecks())
{wrong(function)}"""


def replaced_checker(function: str, checker: str) -> str:
    """A cell that replaces ``checker`` in the library by one that passes everything, defines
    ``function`` wrongly and prints a pass."""
    return (f"import transformer_lib.checks as checks\n"
            f"checks.{checker} = lambda f: True\n"
            f"{wrong(function)}"
            f"print('{function}: all 3 checks passed.')")
