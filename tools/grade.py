"""Grade a folder of submitted student notebooks into a gradebook and feedback files.

    python tools/grade.py SUBMISSIONS --out gradebook.csv [--jobs N] [--timeout SECONDS]
    make grade SUBMISSIONS=path/to/submissions

``SUBMISSIONS`` holds one folder per student; every ``.ipynb`` below a student's folder is a
submission (nbgrader's ``submitted/<student>/<assignment>/<notebook>.ipynb`` works too: the
student is the first folder under ``SUBMISSIONS``).

For each notebook:

1. Its exercises are found by exercise id: ``make student`` writes the ids of a copy's
   exercises into its metadata, and the grader looks each one up wherever the book has it
   now, so a copy made before a page was split or renamed is still graded. A notebook
   without ids (or none the book still has) is graded on its chapter's exercises; its chapter
   is what the notebook is, not its file name: the chapter id in its metadata, else the title
   of its first cell, else the file name without Colab's "Copy of " prefix. A notebook of no
   known chapter, or a file that is not a notebook, gets that status and is not run.
2. It runs top to bottom in a fresh kernel of this Python (one thread: ``OMP_NUM_THREADS=1``)
   in its own process, under a time limit for the whole notebook. A cell that raises does not
   stop the run.
3. In that kernel, the grader then loads ``transformer_lib.checks`` afresh from the installed
   library (the folder this process imports it from): ``''``, the working directory and the
   student's folder are taken off ``sys.path``, and every ``transformer_lib`` module is
   dropped from ``sys.modules``, so neither a cell that replaced or wrapped a checker nor a
   ``transformer_lib`` package of the submission's own changes anything. If the checkers
   still come from elsewhere, the notebook is ``tampered`` and nothing is graded. Otherwise
   the checker of every exercise of the chapter is called on the function of that name. Only
   a function the notebook itself defines counts: a missing name, or one that resolves to
   the library's own function, is ``missing``. The results are the checkers' return values,
   written to a file the grader names; nothing the notebook printed is read. The program
   that runs the notebook and this grading cell is ``tools/_grade_runner.py``.

The same engine grades one notebook on Gradescope (``tools/gradescope.py`` packs this file
and the runner into each chapter's autograder): :func:`grade_notebook` with ``user``, the
unprivileged account the kernel runs as, and ``expected``, the one chapter graded there. This
file therefore imports only the standard library and ``nbformat`` at the top (the chapters'
parser, :func:`chapters`, is loaded where it is used) and runs on Python 3.10.

Output: ``gradebook.csv`` (one row per student and notebook: ``student``, ``notebook``,
``chapter``, ``passed``, ``total``, ``status`` (a :class:`Status`), then one column per exercise,
named by the exercise's id (the ``:label:`` of its ``{exercise}``, e.g.
``attention-ex-masked-softmax``), with ``pass``, ``fail``, ``not attempted`` or ``missing`` (a
:class:`Result`); when the notebook was not graded, each column says why: ``time limit``,
``kernel died``, ``tampered`` or ``not graded``) and, beside it, ``feedback/<student>.md`` with
each checker's report.

This is not a sandbox: a submission runs with the grader's rights, and one that patches
``torch``, Python's builtins or the files on disk can fool it. Grade untrusted submissions in
a container (see the appendix page for instructors).
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
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
from enum import Enum
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
RUNNER = Path(__file__).resolve().parent / "_grade_runner.py"
# The defaults of `make grade` and of this script (the Makefile passes nothing unless set).
DEFAULT_JOBS = 2  # notebooks run in parallel, each in a single-threaded kernel
DEFAULT_TIMEOUT = 180  # seconds per notebook: the slowest chapter takes ~30 s alone
_COPY_OF = re.compile(r"^(copy of\s+)+", re.I)
_SUFFIX = re.compile(r"\s*\(\d+\)$")  # "01_attention (1)" after a second download
_KERNEL_DIED = 3  # the runner's exit status when the kernel died (_grade_runner.KERNEL_DIED)


class Status(Enum):
    """What became of one submitted notebook: the gradebook's ``status`` column."""

    OK = "ok"  # ran to its end and graded
    TIME_LIMIT = "time limit"  # stopped at the time limit: not graded
    KERNEL_DIED = "kernel died"  # the notebook killed its kernel: not graded
    TAMPERED = "tampered"  # the checkers did not come from the installed library
    NOT_GRADED = "not graded"  # the grading cell did not run (twice), e.g. no kernel started
    NOT_A_NOTEBOOK = "not a notebook"  # invalid JSON, or not a notebook
    UNKNOWN_CHAPTER = "unknown chapter"  # no metadata, title or file name of a chapter
    NO_NOTEBOOK = "no notebook"  # a student's folder without any
    WRONG_CHAPTER = "wrong chapter"  # another chapter than the one expected (Gradescope)


class Result(Enum):
    """What the checker said of one exercise: a cell of the gradebook."""

    PASS = "pass"
    FAIL = "fail"
    NOT_ATTEMPTED = "not attempted"  # the stub still raises NotImplementedError
    MISSING = "missing"  # the notebook does not define the function (renamed, or the library's)
    NOT_GRADED = "not graded"  # no checker ran: the gradebook shows the notebook's status


@dataclass
class Chapter:
    """A chapter that has exercises: its id (file stem), title, (function, checker) pairs and
    each function's exercise id (the ``:label:`` of its ``{exercise}``, which stays when the
    exercise moves to another page)."""

    id: str
    title: str
    exercises: list[tuple[str, str]]
    ids: dict[str, str] = field(default_factory=dict)

    def exercise_id(self, function: str) -> str:
        """The id of the exercise that asks for ``function``: its gradebook column."""
        return self.ids.get(function) or f"{self.id}:{function}"


@dataclass
class Row:
    """One line of the gradebook, and the checkers' reports for the feedback file."""

    student: str
    notebook: str
    chapter: str = ""
    status: Status = Status.OK
    detail: str = ""  # why, for the instructor, when the status is not OK
    results: dict[str, Result] = field(default_factory=dict)  # function -> its result
    reports: dict[str, str] = field(default_factory=dict)  # function -> checker's report
    ids: dict[str, str] = field(default_factory=dict)  # exercise id -> its function

    def cell(self, function: str) -> str:
        """The gradebook's entry for ``function``: its result, or why it has none."""
        result = self.results[function]
        return self.status.value if result is Result.NOT_GRADED else result.value


@dataclass
class Run:
    """What one run of a notebook gave: its status, the results file's content and why."""

    status: Status
    results: dict = field(default_factory=dict)
    detail: str = ""


def _title(nb) -> str:
    first = nb.cells[0].source.strip().splitlines() if nb.cells else []
    return first[0].lstrip("#").strip() if first else ""


def chapters(source_dir: Path = CHAPTERS) -> dict[str, Chapter]:
    """The chapters with exercises, by id, read from the book's notebooks by the parser that
    makes the student copies (``make_student.exercises``)."""
    from make_student import exercises  # tools/ only: not in the Gradescope autograder

    found = {}
    for path in sorted(source_dir.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        listed = exercises(nb, path.name)
        if listed:
            found[path.stem] = Chapter(path.stem, _title(nb),
                                       [(e.function, e.checker) for e in listed],
                                       {e.function: e.id for e in listed})
    return found


def _stamped(nb) -> list[str]:
    """The exercise ids a student copy was made with (``make student`` writes them)."""
    ids = (nb.metadata.get("transformer_lib") or {}).get("exercises")
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def to_grade(nb, chapter_id: str | None, known: dict[str, Chapter]) -> Chapter | None:
    """The exercises to grade in a submitted notebook, found by exercise id: those the copy
    was made with, wherever the book has them now (a page split or renamed since), else those
    of its chapter. None when neither is known."""
    where = {c.exercise_id(fn): (c, fn, check) for c in known.values()
             for fn, check in c.exercises}
    found = [where[i] for i in _stamped(nb) if i in where]
    if not found:
        return known.get(chapter_id) if chapter_id else None
    home = chapter_id if chapter_id in known else found[0][0].id
    return Chapter(home, known[home].title, [(fn, check) for _, fn, check in found],
                   {fn: c.exercise_id(fn) for c, fn, _ in found})


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


def installed_library() -> Path:
    """The folder of the ``transformer_lib`` package this Python imports (not a submission's:
    this process's path holds no submission)."""
    spec = importlib.util.find_spec("transformer_lib")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("transformer_lib is not installed in this Python: pip install -e .")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _run_one(path: Path, chapter: Chapter, timeout: float, workdir: Path,
             untrusted: list[Path], user: str | None = None) -> Run:
    """Execute ``path`` and grade it with ``tools/_grade_runner.py`` in a separate process
    whose working directory is ``workdir``; the kernel runs as ``user`` when given (the
    grader then runs as root), in a folder of its own below ``workdir`` that the runner hands
    over to ``user`` once the kernel's connection file is written (a second attempt gets
    another, so nothing left from the first can reach it)."""
    if user is not None:
        workdir.chmod(0o711)  # the kernel may pass through, not look in
        workdir = workdir / f"kernel-{secrets.token_hex(4)}"
        workdir.mkdir(mode=0o700)
    out_path = workdir / f"results-{secrets.token_hex(8)}.json"
    command = [sys.executable, str(RUNNER), str(Path(path).resolve()), "--results", str(out_path),
               "--library", str(installed_library()), "--timeout", str(int(timeout)),
               *[f"--exercise={fn}:{check}" for fn, check in chapter.exercises],
               *[f"--untrusted={folder}" for folder in untrusted]]
    if user is not None:
        command.append(f"--user={user}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    process = subprocess.Popen(command, env=env, cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the runner and its kernel
        process.communicate()
        return Run(Status.TIME_LIMIT, detail=f"stopped after {timeout:g} s")
    if process.returncode == _KERNEL_DIED or "DeadKernelError" in (stderr or ""):
        return Run(Status.KERNEL_DIED, detail="the notebook's kernel died")
    if not out_path.exists():
        # The runner stopped before the grading cell wrote its results (e.g. a kernel that
        # failed to start on a busy machine): say why, in one line, for the instructor.
        lines = [line for line in (stderr or "").splitlines() if line.strip()]
        why = f" ({lines[-1].strip()[:200]})" if lines else ""
        return Run(Status.NOT_GRADED, detail=f"the grading cell did not run{why}")
    try:
        results = json.loads(out_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # e.g. overwritten by the notebook's own process
        return Run(Status.NOT_GRADED, detail=f"unreadable results ({type(exc).__name__})")
    if not isinstance(results, dict):
        return Run(Status.NOT_GRADED, detail="unreadable results (not a JSON object)")
    if "tampered" in results:
        return Run(Status.TAMPERED, detail=str(results["tampered"]))
    return Run(Status.OK, results)


def _run_with_retry(path: Path, chapter: Chapter, timeout: float, workdir: Path,
                    untrusted: list[Path], user: str | None = None) -> Run:
    """``_run_one``, run a second time when the grading cell did not run: that happens when a
    kernel fails to start, which says nothing about the student's notebook."""
    run = _run_one(path, chapter, timeout, workdir, untrusted, user)
    if run.status is Status.NOT_GRADED:
        run = _run_one(path, chapter, timeout, workdir, untrusted, user)
    return run


_WHY_NOT_GRADED = {
    Status.TIME_LIMIT: "the notebook did not finish within the time limit",
    Status.KERNEL_DIED: "the notebook's kernel died before the end",
    Status.TAMPERED: "the checkers were not the installed ones",
    Status.NOT_GRADED: "the grading cell did not run",
}


def grade_notebook(path: Path, student: str, known: dict[str, Chapter], timeout: float,
                   folder: Path | None = None, user: str | None = None,
                   expected: str | None = None) -> Row:
    """Grade the notebook at ``path``, submitted by ``student`` whose folder is ``folder``
    (default: the notebook's own folder): nothing under it is imported by the grading.

    Args:
        user: the account the kernel runs as (this process must then be root), or None to
            run it as this process's own.
        expected: the one chapter to grade: a notebook of another known chapter then gets
            ``Status.WRONG_CHAPTER`` (its id in ``Row.chapter``) and is not run.

    Returns:
        The notebook's row: status, and each exercise's result and checker's report."""
    row = Row(student, path.name)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - invalid JSON, not a notebook, unreadable
        row.status = Status.NOT_A_NOTEBOOK
        return row
    chapter = to_grade(nb, identify(nb, path.name, known), known)
    if chapter is None:
        row.status = Status.UNKNOWN_CHAPTER
        return row
    row.chapter = chapter.id
    if expected is not None and chapter.id != expected:
        row.status = Status.WRONG_CHAPTER
        return row
    row.ids = {chapter.exercise_id(fn): fn for fn, _ in chapter.exercises}
    untrusted = sorted({path.parent.resolve(), (folder or path.parent).resolve()})
    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:
        run = _run_with_retry(path, chapter, timeout, Path(workdir), untrusted, user)
    row.status, row.detail = run.status, run.detail
    for function, _ in chapter.exercises:
        entry = run.results.get(function)
        if run.status is not Status.OK:
            row.results[function] = Result.NOT_GRADED
            row.reports[function] = (f"{function}: not graded: {_WHY_NOT_GRADED[run.status]} "
                                     f"({run.status.value}).")
        elif entry is None:  # the grading cell wrote no result for it: treat as undefined
            row.results[function] = Result.MISSING
            row.reports[function] = f"{function}: not defined in the notebook."
        else:
            row.results[function] = Result(entry["result"])
            row.reports[function] = entry["report"]
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
    """One column per exercise, named by its id, in the book's order."""
    columns = [c.exercise_id(fn) for c in known.values() for fn, _ in c.exercises]
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "notebook", "chapter", "passed", "total", "status",
                         *columns])
        for row in rows:
            total = len(row.ids)
            passed = sum(result is Result.PASS for result in row.results.values())
            cells = [row.cell(row.ids[column]) if column in row.ids else ""
                     for column in columns]
            writer.writerow([row.student, row.notebook, row.chapter, passed, total,
                             row.status.value, *cells])


def write_feedback(rows: list[Row], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    by_student: dict[str, list[Row]] = {}
    for row in rows:
        by_student.setdefault(row.student, []).append(row)
    for student, student_rows in by_student.items():
        lines = [f"# Feedback for {student}", ""]
        for row in student_rows:
            passed = sum(r is Result.PASS for r in row.results.values())
            lines += [f"## {row.notebook}", ""]
            if row.status is not Status.OK:
                why = f": {_WHY_NOT_GRADED[row.status]}" if row.status in _WHY_NOT_GRADED else ""
                lines += [f"Status: {row.status.value}{why}.", ""]
                if row.detail:
                    lines += [f"Detail: {row.detail}.", ""]
            if row.chapter:
                lines += [f"Chapter `{row.chapter}`: {passed} of {len(row.results)} exercises "
                          "passed.", ""]
            for function, report in row.reports.items():
                lines += [f"### `{function}`: {row.cell(function)}", "", "```text",
                          report.strip(), "```", ""]
        (folder / f"{student}.md").write_text("\n".join(lines), encoding="utf-8")


def grade(folder: Path, out: Path, jobs: int = DEFAULT_JOBS, timeout: float = DEFAULT_TIMEOUT,
          progress: bool = True) -> list[Row]:
    """Grade every submission under ``folder``; write the gradebook to ``out`` and the
    feedback beside it. Returns the rows."""
    if not folder.is_dir():
        raise ValueError(f"SUBMISSIONS must be a folder with one folder per student, got {folder}")
    if jobs < 1 or timeout <= 0:
        raise ValueError(f"--jobs ({jobs}) and --timeout ({timeout}) must be positive")
    known = chapters()
    found, empty = submissions(folder)
    rows = [Row(student, "", status=Status.NO_NOTEBOOK) for student in empty]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(found), unit="notebook", desc="grading")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(grade_notebook, path, student, known, timeout, folder / student)
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
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"notebooks run in parallel (default {DEFAULT_JOBS})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds for a notebook, start to end (default {DEFAULT_TIMEOUT})")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        rows = grade(args.submissions, args.out, args.jobs, args.timeout)
    except ValueError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    problems = [r for r in rows if r.status is not Status.OK]
    print(f"graded {len(rows) - len(problems)} notebook(s); {len(problems)} with problems "
          f"({', '.join(sorted({r.status.value for r in problems})) or 'none'}); "
          f"{time.perf_counter() - start:.0f} s; gradebook: {args.out}, feedback: "
          f"{args.out.parent / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
