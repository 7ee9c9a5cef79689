"""Build the book with every notebook executed; on failure, show the lines that matter.

    python tools/build_book.py

Builds every edition (``book_languages`` in ``_config.yml``) with ``jupyter-book build . --all
-W -n --keep-going``: every page is rebuilt and warnings are errors. The source (English)
edition is built into ``_build/html``, every notebook executed into an execute cache emptied
first (so a change in ``transformer_lib`` alone shows up), as many at once as there are cores
(``tools/execute_notebooks.py``); each translated edition (its config
from ``tools/i18n/editions.py``: the translations of ``locales/<code>``) is built from the
same notebooks, reusing the executed ones from the cache, at the same time as the English
one, and copied to ``_build/html/<folder>``. ``--edition en`` builds the English one
alone; ``--edition zh`` (a translated edition's folder) that one alone, from the last English
build's cache (after a change to the translations only; it leaves ``_build/book.ok`` as it
was). The whole output goes to ``_build/book.log``. On success ``_build/book.ok`` is written
(the book tests reuse a build that is newer than its sources) and the time each edition took
is printed.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from execute_notebooks import execute_into_cache

from i18n import editions, languages

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
LOG = BUILD / "book.log"
OK = BUILD / "book.ok"
INDEX = BUILD / "html" / "index.html"
REPORTS = BUILD / "html" / "reports"  # myst-nb's execution reports, if the build got that far
CONFIGS = BUILD / "configs"  # the generated configs of the editions (tools/i18n/editions.py)
# A translated edition is built in BUILD / <folder> (jupyter-book's own output folder) and
# published in INDEX.parent / <folder>.

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


def serve_edition_notebooks(html: Path, notebooks: Path) -> int:
    """Put a translated edition's notebooks (tools/i18n/notebooks.py) where its pages'
    download button finds its notebook, ``_sources/<page>.ipynb``, in place of the source's.

    Args:
        html: the edition's HTML folder.
        notebooks: the folder of the edition's notebooks (its ``folder`` in the repository).

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


def _execute() -> None:
    """Execute every notebook into an emptied execute cache (all cores), which every edition's
    build then reads; the log ``LOG`` is started afresh."""
    shutil.rmtree(editions.CACHE, ignore_errors=True)  # every notebook executed once, afresh
    print(f"Building the book: every notebook is executed (log: {LOG})", flush=True)
    start = time.monotonic()
    LOG.write_text("", encoding="utf-8")
    execute_into_cache(editions.CACHE, output=LOG)  # all cores; a failure: see the build
    print(f"Notebooks executed in {time.monotonic() - start:.0f} s", flush=True)


def _sphinx(language: languages.Language, log_path: Path) -> tuple[int, float]:
    """Build ``language``'s edition from the execute cache, its output in ``log_path``:
    the source edition into ``_build/html``, a translation into ``BUILD / <folder>``.

    Returns:
        The build's exit status and how long it took (s).
    """
    start = time.monotonic()
    config = editions.write(language.edition, CONFIGS / f"{language.edition}.yml")
    args = [*BUILD_ARGS, "--config", str(config)]
    if language != languages.source():
        args += ["--path-output", str(BUILD / language.folder)]
    log_path.write_text("", encoding="utf-8")
    return _run(args, log_path, "a"), time.monotonic() - start


def _publish(language: languages.Language) -> None:
    """Copy a translated edition to ``_build/html/<folder>``, its own notebooks as the pages'
    downloads."""
    published = INDEX.parent / language.folder
    shutil.rmtree(published, ignore_errors=True)
    shutil.copytree(BUILD / language.folder / "_build" / "html", published)
    serve_edition_notebooks(published, ROOT / language.folder)


def build(chosen: tuple[str, ...] | None = None) -> int:
    """Run the builds, log to ``LOG``, write ``OK`` on success; returns the first failing
    build's exit status, else 0.

    The editions' Sphinx builds run at the same time (each is one process, and they only
    read the execute cache): on two cores the translated edition's build no longer waits for
    the English one. Each writes a log of its own, appended to ``LOG`` in order at the end;
    a translation is published into ``_build/html/<folder>`` once every build has finished.

    Args:
        chosen: editions by name (``Language.edition``: ``"en"``, ``"zh"``), default every
            edition. The source edition executes the notebooks into the cache that the
            translated ones reuse, so a translated edition alone (a translation's quick check)
            needs a source build before it.
    """
    every = tuple(language.edition for language in languages.languages())
    chosen = every if chosen is None else chosen
    BUILD.mkdir(exist_ok=True)
    source = languages.source()
    if source.edition in chosen:
        OK.unlink(missing_ok=True)
        _execute()
    elif not editions.CACHE.exists():
        print("a translated edition reuses the English one's executed notebooks: build both "
              "(make book) first")
        return 2
    else:
        LOG.write_text("", encoding="utf-8")
    builds = [language for language in languages.languages() if language.edition in chosen]
    logs = [BUILD / f"book.{language.edition}.log" for language in builds]
    with ThreadPoolExecutor(max_workers=len(builds)) as pool:
        results = list(pool.map(_sphinx, builds, logs))
    with LOG.open("a", encoding="utf-8") as log:
        for part in logs:
            log.write(part.read_text(encoding="utf-8", errors="replace"))
            part.unlink()
    for language, (status, seconds) in zip(builds, results):
        if status != 0:
            return _failed(status)
        if language != source:
            _publish(language)
        where = INDEX if language == source else INDEX.parent / language.folder / INDEX.name
        code = "" if language == source else f" ({language.code})"
        print(f"{language.label} edition{code} built in {seconds:.0f} s: {where}", flush=True)
    if set(chosen) == set(every):
        OK.touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    every = tuple(language.edition for language in languages.languages())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edition", choices=("all", *every), default="all",
                        help=f"{every[0]}: the English edition alone; a translated edition's "
                             "folder: that one alone, from the notebooks the last English "
                             "build executed (default: every edition)")
    args = parser.parse_args(argv)
    return build(None if args.edition == "all" else (args.edition,))


if __name__ == "__main__":
    sys.exit(main())
