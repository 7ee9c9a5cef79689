"""Grade one Gradescope submission of a chapter: the program ``run_autograder`` starts.

    python3 _gradescope_run.py            # the root is $AUTOGRADER_ROOT, else /autograder

``tools/gradescope.py`` packs this file beside ``grade.py`` and ``_grade_runner.py`` (the
engine of ``make grade``, unchanged) and ``assignment.json`` (the chapter, its exercises and
their points, the time limit, who sees what) into ``source/grader/`` of a chapter's
autograder. Gradescope unpacks the zip into ``<root>/source``, puts the student's files in
``<root>/submission`` and reads ``<root>/results/results.json``.

The submitted notebook is graded by ``grade.grade_notebook``: a fresh kernel, the time limit,
the checkers loaded from the installed library only, the functions looked up in the
notebook's own namespace. One test per exercise (its points when the checker passes it,
else 0; its output the checker's report), the total and a message for the student are
written in Gradescope's format.

Run as root (as Gradescope does), the kernel runs as the unprivileged account
``$AUTOGRADER_USER`` (default ``student``, made by ``setup.sh``; made here if missing), and
``source/``, ``submission/`` and ``results/`` are closed to everyone but root first: the
notebook can neither write the results nor read the grader's files. Run as another user (a
test, a trial on one's own machine), the kernel runs as that user and stdout says so.

This file runs on the container's ``python3`` (Ubuntu 22.04: Python 3.10).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

import grade  # the engine, beside this file

HERE = Path(__file__).resolve().parent
ROOT_VARIABLE = "AUTOGRADER_ROOT"
USER_VARIABLE = "AUTOGRADER_USER"
DEFAULT_USER = "student"

_MESSAGES = {
    grade.Status.TIME_LIMIT: "The notebook did not finish within the time limit of {timeout} s, "
    "so nothing was graded. Look for a cell that runs too long (an endless loop, a long "
    "training run), then submit again.",
    grade.Status.KERNEL_DIED: "The notebook's Python process stopped before the end (a cell "
    "exited Python or used too much memory), so nothing was graded.",
    grade.Status.TAMPERED: "The exercises' checkers were not the course library's ({detail}), "
    "so nothing was graded.",
    grade.Status.NOT_GRADED: "The grading step did not run ({detail}), so nothing was graded. "
    "Submit again; if this happens twice, tell the course staff.",
    grade.Status.NOT_A_NOTEBOOK: "{notebook} is not a Jupyter notebook (it is not valid "
    "notebook JSON). Download the notebook again (File > Download > .ipynb) and submit that "
    "file.",
    grade.Status.UNKNOWN_CHAPTER: "{notebook} is not one of the course's chapter notebooks. "
    "This assignment grades chapter {chapter} ({title}): submit that notebook.",
    grade.Status.WRONG_CHAPTER: "{notebook} is the notebook of chapter {found} ({found_title}), "
    "but this assignment grades chapter {chapter} ({title}): submit that notebook instead.",
    grade.Status.NO_NOTEBOOK: "No notebook (.ipynb) was found in the submission. This "
    "assignment grades chapter {chapter} ({title}): submit its .ipynb file.",
}


def load_assignment(path: Path = HERE / "assignment.json") -> dict:
    """The assignment ``tools/gradescope.py`` wrote: ``chapter``, ``title``, ``exercises``
    (``function``, ``checker``, ``name``, ``points``), ``chapters`` (every chapter's
    ``title`` and ``exercises``, to recognise another chapter's notebook), ``timeout``
    (seconds) and ``test_visibility``."""
    return json.loads(path.read_text(encoding="utf-8"))


def known_chapters(assignment: dict) -> dict[str, grade.Chapter]:
    """The course's chapters as ``grade`` knows them, from the assignment's list."""
    return {cid: grade.Chapter(cid, c["title"], [tuple(pair) for pair in c["exercises"]],
                               c.get("ids", {}))
            for cid, c in assignment["chapters"].items()}


def find_notebook(submission: Path, assignment: dict) -> Path | None:
    """The notebook to grade: of the submitted ``.ipynb`` files (checkpoints left out), the
    first of the assignment's chapter, else the first; None when there is none."""
    found = sorted(p for p in submission.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    known = known_chapters(assignment)
    for path in found:
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - not a notebook: graded (and reported) if alone
            continue
        if grade.identify(nb, path.name, known) == assignment["chapter"]:
            return path
    return found[0] if found else None


def kernel_user(name: str) -> str | None:
    """The account the kernel runs as: ``name`` when this process is root (made if it is
    missing), None otherwise (the kernel then runs as this process's user)."""
    if os.geteuid() != 0:
        return None
    exists = subprocess.run(["id", "-u", name], capture_output=True).returncode == 0
    if not exists:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True)
    return name


def close_to_others(root: Path) -> None:
    """Let no one but root into the grader's folders (``source``, ``submission``,
    ``results``): the notebook's kernel must not read or write them."""
    for name in ("source", "submission", "results"):
        folder = root / name
        if folder.is_dir():
            os.chmod(folder, 0o700)


def results(row: grade.Row, assignment: dict, seconds: float) -> dict:
    """Gradescope's ``results.json`` for the graded ``row``.

    Returns:
        ``score`` (the sum of the tests'), ``execution_time`` (whole seconds), ``output``
        (the message for the student), ``visibility``, ``stdout_visibility`` (hidden: the
        grader's log) and ``tests``: per exercise ``name``, ``number``, ``score``,
        ``max_score``, ``status`` (``passed`` or ``failed``), ``output`` (the checker's
        report, or why it did not run) and ``visibility``."""
    chapter, title = assignment["chapter"], assignment["title"]
    ok = row.status is grade.Status.OK
    tests = []
    for number, exercise in enumerate(assignment["exercises"], start=1):
        result = row.results.get(exercise["function"]) if ok else None
        passed = result is grade.Result.PASS
        report = row.reports.get(exercise["function"], "") if ok else ""
        tests.append({
            "name": exercise["name"], "number": str(number),
            "score": exercise["points"] if passed else 0, "max_score": exercise["points"],
            "status": "passed" if passed else "failed",
            "output": report.strip() or f"{exercise['function']}: not graded: "
                                        f"{row.status.value}.",
            "visibility": assignment["test_visibility"]})
    score = sum(t["score"] for t in tests)
    total = sum(t["max_score"] for t in tests)
    if ok:
        passed = sum(t["status"] == "passed" for t in tests)
        message = (f"Chapter {chapter} ({title}): {passed} of {len(tests)} exercises passed, "
                   f"{score:g} of {total:g} points. Each test shows its checker's report.")
    else:
        found = assignment["chapters"].get(row.chapter, {}).get("title", "")
        message = _MESSAGES[row.status].format(
            timeout=assignment["timeout"], detail=row.detail or "no detail",
            notebook=row.notebook or "the submission", chapter=chapter, title=title,
            found=row.chapter, found_title=found)
    return {"score": score, "execution_time": int(round(seconds)), "output": message,
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def grade_submission(root: Path, user_name: str = DEFAULT_USER) -> dict:
    """Grade the notebook in ``root/submission``; write and return ``results.json``."""
    start = time.perf_counter()
    assignment = load_assignment()
    (root / "results").mkdir(parents=True, exist_ok=True)
    user = kernel_user(user_name)
    if user is None:
        print(f"not root (uid {os.geteuid()}): the kernel runs as this user")
    else:
        close_to_others(root)
        print(f"the kernel runs as {user}")
    submission = root / "submission"
    path = find_notebook(submission, assignment) if submission.is_dir() else None
    if path is None:
        row = grade.Row("submission", "", status=grade.Status.NO_NOTEBOOK)
    else:
        row = grade.grade_notebook(path, "submission", known_chapters(assignment),
                                   assignment["timeout"], folder=submission, user=user,
                                   expected=assignment["chapter"])
    print(f"{row.notebook or 'no notebook'}: {row.status.value} {row.detail}".rstrip())
    graded = results(row, assignment, time.perf_counter() - start)
    target = root / "results" / "results.json"
    target.write_text(json.dumps(graded, indent=1) + "\n", encoding="utf-8")
    return graded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path,
                        default=Path(os.environ.get(ROOT_VARIABLE) or "/autograder"),
                        help=f"the autograder's root (default: ${ROOT_VARIABLE}, else "
                             "/autograder)")
    parser.add_argument("--user", default=os.environ.get(USER_VARIABLE) or DEFAULT_USER,
                        help=f"the account the kernel runs as, as root (default: "
                             f"${USER_VARIABLE}, else {DEFAULT_USER})")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    graded = grade_submission(args.root, args.user)
    print(f"score {graded['score']:g}; results in {args.root / 'results' / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
