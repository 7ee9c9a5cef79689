"""Build the book with every notebook executed; on failure, show the lines that matter.

    python tools/build_book.py

Builds both editions with ``jupyter-book build . --all -W -n --keep-going``: every page is
rebuilt and warnings are errors. The English edition is built into ``_build/html``, every
notebook executed into an execute cache emptied first (so a change in ``transformer_lib`` alone
shows up); the Chinese edition (``tools/zh_config.py zh``: the translations of
``locales/zh_CN``) is then built from the same notebooks, reusing the executed ones from the
cache, and copied to ``_build/html/zh``. ``--edition en`` builds the English one alone;
``--edition zh`` the Chinese one alone, from the last English build's cache (after a change
to the translations only; it leaves ``_build/book.ok`` as it was). The
whole output goes to ``_build/book.log``. On success ``_build/book.ok`` is written (the book
tests reuse a build that is newer than its sources) and the time each edition took is printed.
On failure the script prints the Sphinx warnings and errors, the notebook that failed with
its cell and error, the end of the log, and where the full log and the execution reports are,
then exits with the build's status. ``make book`` runs it.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from execute_notebooks import execute_into_cache

import zh_config

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
LOG = BUILD / "book.log"
OK = BUILD / "book.ok"
INDEX = BUILD / "html" / "index.html"
REPORTS = BUILD / "html" / "reports"  # myst-nb's execution reports, if the build got that far
CONFIGS = BUILD / "configs"  # the generated configs of both editions (tools/zh_config.py)
ZH_BUILD = BUILD / "zh"  # jupyter-book's own output folder of the Chinese edition
ZH_HTML = INDEX.parent / zh_config.ZH_FOLDER  # where the Chinese edition is published

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


def _run(args: list[str], log_path: Path, mode: str) -> int:
    """Run ``jupyter-book`` with ``args``, its output appended to ``log_path``."""
    with log_path.open(mode, encoding="utf-8") as log:
        return subprocess.run([jupyter_book(), *args], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT).returncode


def _failed(status: int) -> int:
    print(failure_summary(LOG.read_text(encoding="utf-8", errors="replace")))
    return status


def serve_chinese_notebooks(html: Path, notebooks: Path = ROOT / zh_config.ZH_FOLDER) -> int:
    """Put the Chinese notebooks (tools/zh_notebooks.py) where the Chinese pages' download
    button finds its notebook, ``_sources/<page>.ipynb``, in place of the English one.

    Args:
        html: the Chinese edition's HTML folder.
        notebooks: the folder of the Chinese notebooks (``zh`` in the repository).

    Returns:
        How many notebooks were put in place.
    """
    count = 0
    for notebook in sorted((notebooks / "chapters").glob("*.ipynb")):
        target = html / "_sources" / "chapters" / notebook.name
        if target.exists():
            shutil.copyfile(notebook, target)
            count += 1
    return count


def build(editions: tuple[str, ...] = ("en", "zh")) -> int:
    """Run the builds, log to ``LOG``, write ``OK`` on success; returns the first failing
    build's exit status, else 0.

    Args:
        editions: ``("en", "zh")``, ``("en",)``, or ``("zh",)``: the English edition executes
            the notebooks into the cache that the Chinese one reuses, so the Chinese edition
            alone (a translation's quick check) needs an English build before it.
    """
    BUILD.mkdir(exist_ok=True)
    if "en" in editions:
        OK.unlink(missing_ok=True)
        shutil.rmtree(zh_config.CACHE, ignore_errors=True)  # every notebook executed once, afresh
        print(f"Building the book: every notebook is executed (log: {LOG})", flush=True)
        start = time.monotonic()
        LOG.write_text("", encoding="utf-8")
        execute_into_cache(zh_config.CACHE, output=LOG)  # all cores; a failure: see the build
        print(f"Notebooks executed in {time.monotonic() - start:.0f} s", flush=True)
        english = zh_config.write("en", CONFIGS / "en.yml")
        status = _run([*BUILD_ARGS, "--config", str(english)], LOG, "a")
        if status != 0:
            return _failed(status)
        print(f"English edition built in {time.monotonic() - start:.0f} s: {INDEX}", flush=True)
    elif not zh_config.CACHE.exists():
        print("the Chinese edition reuses the English one's executed notebooks: build both "
              "(make book) first")
        return 2
    if "zh" in editions:
        start = time.monotonic()
        chinese = zh_config.write("zh", CONFIGS / "zh.yml")
        status = _run([*BUILD_ARGS, "--config", str(chinese), "--path-output", str(ZH_BUILD)],
                      LOG, "a" if "en" in editions else "w")
        if status != 0:
            return _failed(status)
        shutil.rmtree(ZH_HTML, ignore_errors=True)
        shutil.copytree(ZH_BUILD / "_build" / "html", ZH_HTML)
        serve_chinese_notebooks(ZH_HTML)
        print(f"Chinese edition built in {time.monotonic() - start:.0f} s: "
              f"{ZH_HTML / INDEX.name}")
    if editions == ("en", "zh"):
        OK.touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edition", choices=("all", "en", "zh"), default="all",
                        help="en: the English edition alone; zh: the Chinese one alone, from "
                             "the notebooks the last English build executed (default: both)")
    args = parser.parse_args(argv)
    return build({"all": ("en", "zh"), "en": ("en",), "zh": ("zh",)}[args.edition])


if __name__ == "__main__":
    sys.exit(main())
