"""Grade a folder of submitted student notebooks into a gradebook and feedback files.

    python tools/grade.py SUBMISSIONS --out gradebook.csv [--jobs N] [--timeout SECONDS]
    make grade SUBMISSIONS=path/to/submissions

``SUBMISSIONS`` holds one folder per student; every ``.ipynb`` below a student's folder is a
submission (nbgrader's ``submitted/<student>/<assignment>/<notebook>.ipynb`` works too: the
student is the first folder under ``SUBMISSIONS``).

For each notebook:

1. Its chapter is what the notebook is, not its file name: the chapter id that ``make
   student`` writes into every copy's metadata, else the title of its first cell, else the
   file name without Colab's "Copy of " prefix. A notebook of no known chapter, or a file
   that is not a notebook, gets that status and is not run.
2. It runs top to bottom in a fresh kernel of this Python (one thread: ``OMP_NUM_THREADS=1``)
   in its own process, under a time limit for the whole notebook. A cell that raises does not
   stop the run.
3. In that kernel, the grader then imports ``transformer_lib.checks`` afresh (every
   ``transformer_lib`` module is dropped from ``sys.modules`` and loaded again from disk, so a
   cell that replaced or wrapped a checker changes nothing) and calls the checker of every
   exercise of the chapter on the function of that name. Only a function the notebook itself
   defines counts: a missing name, or one that resolves to the library's own function, is
   ``missing``. The results are the checkers' return values, written to a file the grader
   names; nothing the notebook printed is read.

Output: ``gradebook.csv`` (one row per student and notebook: ``student``, ``notebook``,
``chapter``, ``passed``, ``total``, ``status``, then one column per exercise
``<chapter>:<function>`` with ``pass``, ``fail``, ``not attempted`` or ``missing``) and,
beside it, ``feedback/<student>.md`` with each checker's report.

This is not a sandbox: a submission runs with the grader's rights, and one that patches
``torch``, Python's builtins or the files on disk can fool it. Grade untrusted submissions in
a container (see the appendix page for instructors).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
DEFAULT_TIMEOUT = 180  # seconds per notebook: the slowest chapter takes ~30 s alone
_CHECK = re.compile(r"^\s*assert\s+(check_\w+)\((\w+)\)\s*$", re.M)
_COPY_OF = re.compile(r"^(copy of\s+)+", re.I)
_SUFFIX = re.compile(r"\s*\(\d+\)$")  # "01_attention (1)" after a second download


@dataclass
class Chapter:
    """A chapter that has exercises: its id (file stem), title and (function, checker) pairs."""

    id: str
    title: str
    exercises: list[tuple[str, str]]


@dataclass
class Row:
    """One line of the gradebook, and the checkers' reports for the feedback file."""

    student: str
    notebook: str
    chapter: str = ""
    status: str = "ok"
    results: dict[str, str] = field(default_factory=dict)  # function -> pass/fail/...
    reports: dict[str, str] = field(default_factory=dict)  # function -> checker's report


def _title(nb) -> str:
    first = nb.cells[0].source.strip().splitlines() if nb.cells else []
    return first[0].lstrip("#").strip() if first else ""


def chapters(source_dir: Path = CHAPTERS) -> dict[str, Chapter]:
    """The chapters with exercises, by id, read from the book's notebooks (their
    ``assert check_x(x)`` cells)."""
    found = {}
    for path in sorted(source_dir.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        pairs = [(fn, check) for cell in nb.cells if cell.cell_type == "code"
                 for check, fn in _CHECK.findall(cell.source)]
        if pairs:
            found[path.stem] = Chapter(path.stem, _title(nb), pairs)
    return found


def identify(nb, filename: str, known: dict[str, Chapter]) -> str | None:
    """The chapter id of a submitted notebook: its metadata, else its title, else its name."""
    stamped = (nb.metadata.get("transformer_lib") or {}).get("chapter")
    if stamped in known:
        return stamped
    title = _title(nb)
    for chapter in known.values():
        if title and title == chapter.title:
            return chapter.id
    stem = _SUFFIX.sub("", _COPY_OF.sub("", Path(filename).stem)).strip()
    return stem if stem in known else None


# What runs in the student's kernel after the notebook: fresh checkers, called on the
# notebook's own functions; the results go to a file whose name the notebook cannot know.
_GRADING_CELL = '''
def __grade(exercises, out_path):
    import importlib, json, sys
    for name in [m for m in sys.modules if m == "transformer_lib" or m.startswith("transformer_lib.")]:
        del sys.modules[name]
    checks = importlib.import_module("transformer_lib.checks")
    namespace = globals()
    results = {}
    for function, checker in exercises:
        fn = namespace.get(function)
        if not callable(fn) or getattr(fn, "__module__", None) != "__main__":
            results[function] = {"result": "missing", "report": f"{function}: not defined in the notebook."}
            continue
        result = getattr(checks, checker)(fn)
        outcome = "pass" if result.passed is True else (
            "fail" if result.attempted else "not attempted")
        results[function] = {"result": outcome, "report": str(result.report)}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f)
__grade(%r, %r)
'''


def _run_one(path: Path, chapter: Chapter, timeout: float, workdir: Path) -> tuple[str, dict]:
    """Execute ``path`` and grade it in a separate process; returns ``(status, results)``."""
    out_path = workdir / f"results-{secrets.token_hex(8)}.json"
    program = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "from nbclient.exceptions import DeadKernelError\n"
        f"nb = nbformat.read({str(path)!r}, as_version=4)\n"
        f"nb.cells.append(nbformat.v4.new_code_cell({_GRADING_CELL % (chapter.exercises, str(out_path))!r}))\n"
        f"client = NotebookClient(nb, timeout={int(timeout)}, allow_errors=True, "
        f"kernel_name='python3', resources={{'metadata': {{'path': {str(workdir)!r}}}}})\n"
        "try:\n"
        "    client.execute()\n"
        "except DeadKernelError:\n"
        "    sys.exit(3)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    process = subprocess.Popen([sys.executable, "-c", program], env=env, cwd=workdir,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True, text=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the runner and its kernel
        process.communicate()
        return "time limit", {}
    if process.returncode == 3 or "DeadKernelError" in (stderr or ""):
        return "kernel died", {}
    if not out_path.exists():
        # The runner stopped before the grading cell (e.g. a kernel that failed to start on
        # a busy machine): say why, in one line, for the instructor.
        lines = [line for line in (stderr or "").splitlines() if line.strip()]
        why = f" ({lines[-1].strip()[:200]})" if lines else ""
        return f"not graded: the grading cell did not run{why}", {}
    return "ok", json.loads(out_path.read_text(encoding="utf-8"))


def _run_with_retry(path: Path, chapter: Chapter, timeout: float,
                    workdir: Path) -> tuple[str, dict]:
    """``_run_one``, run a second time when the grading cell did not run: that happens when a
    kernel fails to start, which says nothing about the student's notebook."""
    status, results = _run_one(path, chapter, timeout, workdir)
    if status.startswith("not graded"):
        status, results = _run_one(path, chapter, timeout, workdir)
    return status, results


def grade_notebook(path: Path, student: str, known: dict[str, Chapter], timeout: float) -> Row:
    row = Row(student, path.name)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - invalid JSON, not a notebook, unreadable
        row.status = "not a notebook"
        return row
    chapter_id = identify(nb, path.name, known)
    if chapter_id is None:
        row.status = "unknown chapter"
        return row
    row.chapter = chapter_id
    chapter = known[chapter_id]
    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:
        row.status, results = _run_with_retry(path, chapter, timeout, Path(workdir))
    for function, _ in chapter.exercises:
        entry = results.get(function)
        row.results[function] = entry["result"] if entry else "missing"
        row.reports[function] = entry["report"] if entry else f"{function}: not graded ({row.status})."
    return row


def submissions(folder: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """``(student, notebook path)`` for every ``.ipynb`` below a student's folder, and the
    students whose folder holds none."""
    found, empty = [], []
    for student_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        notebooks = sorted(p for p in student_dir.rglob("*.ipynb")
                           if ".ipynb_checkpoints" not in p.parts)
        if notebooks:
            found += [(student_dir.name, p) for p in notebooks]
        else:
            empty.append(student_dir.name)
    return found, empty


def write_gradebook(rows: list[Row], known: dict[str, Chapter], out: Path) -> None:
    columns = [f"{c.id}:{fn}" for c in known.values() for fn, _ in c.exercises]
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "notebook", "chapter", "passed", "total", "status", *columns])
        for row in rows:
            total = len(known[row.chapter].exercises) if row.chapter else 0
            passed = sum(result == "pass" for result in row.results.values())
            cells = [row.results.get(col.split(":", 1)[1], "") if col.startswith(f"{row.chapter}:")
                     else "" for col in columns]
            writer.writerow([row.student, row.notebook, row.chapter, passed, total, row.status,
                             *cells])


def write_feedback(rows: list[Row], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    by_student: dict[str, list[Row]] = {}
    for row in rows:
        by_student.setdefault(row.student, []).append(row)
    for student, student_rows in by_student.items():
        lines = [f"# Feedback for {student}", ""]
        for row in student_rows:
            passed = sum(r == "pass" for r in row.results.values())
            lines += [f"## {row.notebook}", ""]
            if row.status != "ok":
                lines += [f"Status: {row.status}.", ""]
            if row.chapter:
                lines += [f"Chapter `{row.chapter}`: {passed} of {len(row.results)} exercises "
                          "passed.", ""]
            for function, report in row.reports.items():
                lines += [f"### `{function}`: {row.results[function]}", "", "```text",
                          report.strip(), "```", ""]
        (folder / f"{student}.md").write_text("\n".join(lines), encoding="utf-8")


def grade(folder: Path, out: Path, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
          progress: bool = True) -> list[Row]:
    """Grade every submission under ``folder``; write the gradebook to ``out`` and the
    feedback beside it. Returns the rows."""
    if not folder.is_dir():
        raise ValueError(f"SUBMISSIONS must be a folder with one folder per student, got {folder}")
    if jobs < 1 or timeout <= 0:
        raise ValueError(f"--jobs ({jobs}) and --timeout ({timeout}) must be positive")
    known = chapters()
    found, empty = submissions(folder)
    rows = [Row(student, "", status="no notebook") for student in empty]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(found), unit="notebook", desc="grading")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(grade_notebook, path, student, known, timeout)
                   for student, path in found]
        for future in as_completed(futures):
            rows.append(future.result())
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    rows.sort(key=lambda r: (r.student, r.notebook))
    write_gradebook(rows, known, out)
    write_feedback(rows, out.parent / "feedback")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="one folder per student")
    parser.add_argument("--out", type=Path, default=Path("gradebook.csv"))
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run in parallel")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds allowed for one notebook, start to end")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        rows = grade(args.submissions, args.out, args.jobs, args.timeout)
    except ValueError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    problems = [r for r in rows if r.status != "ok"]
    print(f"graded {len(rows) - len(problems)} notebook(s); {len(problems)} with problems "
          f"({', '.join(sorted({r.status for r in problems})) or 'none'}); "
          f"{time.perf_counter() - start:.0f} s; gradebook: {args.out}, feedback: "
          f"{args.out.parent / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
