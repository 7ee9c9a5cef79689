"""Build the book with every notebook executed; on failure, show the lines that matter.

    python tools/build_book.py

Runs ``jupyter-book build . --all -W -n --keep-going``: every page is rebuilt and every
notebook executed (with ``execute_notebooks: force`` in ``_config.yml``, a change in
``transformer_lib`` alone shows up), and warnings are errors. The whole output goes to
``_build/book.log``. On success ``_build/book.ok`` is written (the book tests reuse a build
that is newer than its sources) and the time taken is printed. On failure the script prints
the Sphinx warnings and errors, the notebook that failed with its cell and error, the end of
the log, and where the full log and the execution reports are, then exits with the build's
status. ``make book`` runs it.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
LOG = BUILD / "book.log"
OK = BUILD / "book.ok"
INDEX = BUILD / "html" / "index.html"
REPORTS = BUILD / "html" / "reports"  # myst-nb's execution reports, if the build got that far

BUILD_ARGS = ["build", ".", "--all", "-W", "-n", "--keep-going"]
MAX_WARNINGS = 30  # lines of Sphinx warnings and errors shown
MAX_CELL_ERROR = 60  # lines of the failing cell and its traceback shown
TAIL = 12  # last lines of the log shown

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SPHINX_PROBLEM = re.compile(r"(WARNING|ERROR|CRITICAL):")
_FAILED_NOTEBOOK = re.compile(r"ExecutionError: (/.*)$")
_CELL_ERROR_START = re.compile(r"[\w.]*Cell(Execution|Timeout)Error: ")  # the exception line
_CELL_ERROR_END = "The above exception"


def jupyter_book() -> str:
    """The ``jupyter-book`` next to this Python (the virtual environment's), else on PATH."""
    beside = Path(sys.executable).with_name("jupyter-book")
    if beside.exists():
        return str(beside)
    found = shutil.which("jupyter-book")
    if found is None:
        raise FileNotFoundError("jupyter-book is not installed: pip install -r requirements.txt")
    return found


def sphinx_problems(lines: list[str]) -> list[str]:
    """Sphinx's warnings and errors. The kernel's ``[IPKernelApp] WARNING | ... TCP without
    encryption`` line is printed by every notebook run and is not one of them."""
    found = [line for line in lines if _SPHINX_PROBLEM.search(line) and "IPKernelApp" not in line]
    return found[:MAX_WARNINGS]


def failed_notebook(lines: list[str]) -> str | None:
    """The path of the first notebook whose execution failed, if any."""
    for line in lines:
        match = _FAILED_NOTEBOOK.search(line)
        if match:
            return match.group(1).strip()
    return None


def cell_errors(lines: list[str]) -> list[str]:
    """Every block from the ``CellExecutionError: ...`` (or ``CellTimeoutError: ...``) line up to
    the ``The above exception ...`` line that follows it: the failing cell's source and its
    traceback."""
    found: list[str] = []
    inside = False
    for line in lines:
        if not inside and _CELL_ERROR_START.match(line):
            inside = True
        elif inside and line.startswith(_CELL_ERROR_END):
            inside = False
        if inside:
            found.append(line)
    found = found[:MAX_CELL_ERROR]
    while found and not found[-1].strip():
        found.pop()
    return found


def failure_summary(log: str, log_path: Path = LOG, reports: Path = REPORTS) -> str:
    """What to show when the build fails, from the text of its log (colour codes removed)."""
    lines = _ANSI.sub("", log).splitlines()
    notebook = failed_notebook(lines)
    out = ["---- Sphinx warnings and errors ----", *sphinx_problems(lines),
           "---- notebook that failed, the cell and its error ----"]
    if notebook is not None:
        out.append(f"Notebook: {notebook}")
    out += cell_errors(lines)
    out += ["---- end of the log ----", *lines[-TAIL:], "",
            f"Book build FAILED; full log: {log_path.resolve()}"]
    if reports.is_dir():
        out.append(f"Execution reports: {reports.resolve()}")
    return "\n".join(out)


def build() -> int:
    """Run the build, log to ``LOG``, write ``OK`` on success; returns the build's exit status."""
    BUILD.mkdir(exist_ok=True)
    OK.unlink(missing_ok=True)
    print(f"Building the book: every notebook is executed (log: {LOG})", flush=True)
    start = time.monotonic()
    with LOG.open("w", encoding="utf-8") as log:
        status = subprocess.run([jupyter_book(), *BUILD_ARGS], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT).returncode
    if status != 0:
        print(failure_summary(LOG.read_text(encoding="utf-8", errors="replace")))
        return status
    OK.touch()
    print(f"Book built in {time.monotonic() - start:.0f} s: {INDEX}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    return build()


if __name__ == "__main__":
    sys.exit(main())
