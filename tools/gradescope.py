"""Gradescope autograders: one zip per page, grading with the same engine as ``make grade``.

    python tools/gradescope.py CHAPTER... --out DIR [--points NAME=N ...] [--timeout SECONDS]
                               [--hide-tests-until-due]
    make gradescope [CHAPTERS="01 03"] [OUT=dist/gradescope]

``CHAPTER`` is a chapter's id (``01_attention``), its number (``01`` or ``1``), its notebook's
path, or ``all`` (every chapter with exercises; what ``make gradescope`` builds by default).
Each zip, ``DIR/<chapter>-autograder.zip``, follows Gradescope's autograder specification:

- ``setup.sh`` (at the root) installs into the container's ``python3`` PyTorch's CPU build,
  the library at the release the handouts pin (``git+<repository.url>@v<version>``, from
  ``_config.yml`` and ``pyproject.toml`` as ``tools/release.py`` pins them;
  ``TRANSFORMER_LIB_SOURCE`` overrides it, as in the setup cell), nbclient and ipykernel at
  the versions of ``requirements.txt``, and makes the account ``student``;
- ``run_autograder`` (at the root) runs ``grader/_gradescope_run.py`` on the ``python3`` on
  ``PATH``, which grades ``/autograder/submission`` (the root moves with
  ``AUTOGRADER_ROOT``) and writes ``/autograder/results/results.json``;
- ``grader/`` holds ``grade.py`` and ``_grade_runner.py`` (the engine of ``make grade``, as
  they are in ``tools/``), ``_gradescope_run.py`` and ``assignment.json``: the chapter, its
  exercises read from the notebook now (function, checker, Gradescope test name, points),
  every chapter's title (to recognise another chapter's notebook), the time limit and who
  sees the tests' output.

Points: Warm-up 1, Core 2, Challenge 3 (:data:`POINTS`); ``--points Core=4`` changes a level,
``--points mh-ex-gqa-layer=5`` (an exercise's id) or ``--points split_heads=5`` (its function)
one exercise. The zips are the same bytes for the same chapters.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path
from string import ascii_lowercase

import nbformat

import grade
from make_student import exercises
from release import project_version
from setup_cell import install_source, repository

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
TEMPLATES = TOOLS / "autograder"  # setup.sh and run_autograder
ENGINE = ("grade.py", "_grade_runner.py", "_gradescope_run.py")  # copied into grader/
POINTS = {"Warm-up": 1, "Core": 2, "Challenge": 3}  # the one place points come from
DEFAULT_TIMEOUT = 240  # seconds for a notebook: twice that stays under Gradescope's 10 min
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
VISIBILITY = {False: "visible", True: "after_due_date"}  # by --hide-tests-until-due
_EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}\s*(.*)$")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # a fixed timestamp: the same bytes every time


def resolve(name: str, known: dict[str, grade.Chapter]) -> list[str]:
    """The chapter ids that ``name`` (an id, a number, a notebook's path or ``all``) means:
    a number means every page of that chapter (``4``: ``04_normalisation`` and
    ``04b_training_recipe``), one autograder each.

    Raises:
        ValueError: no chapter with exercises matches ``name``."""
    if name == "all":
        return list(known)
    stem = Path(name).stem if name.endswith(".ipynb") else name
    if stem.isdigit():
        found = [cid for cid in known if cid.split("_")[0].rstrip(ascii_lowercase)
                 == f"{int(stem):02d}"]
    else:
        found = [stem] if stem in known else []
    if not found:
        raise ValueError(f"no chapter with exercises is {name!r}; known: {', '.join(known)}")
    return found


def parse_points(overrides: list[str]) -> dict[str, float]:
    """``["Core=4", "split_heads=5"]`` as ``{"Core": 4.0, "split_heads": 5.0}``.

    Raises:
        ValueError: an entry is not ``NAME=N`` with ``N >= 0``."""
    parsed = {}
    for text in overrides:
        key, sep, value = text.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or not key or number < 0:
            raise ValueError(f"--points takes NAME=N with N >= 0, got {text!r}")
        parsed[key] = int(number) if number.is_integer() else number
    return parsed


def _heading(nb, cell: int) -> str:
    """The title of the ``{exercise}`` directive above code cell ``cell``."""
    for index in range(cell - 1, -1, -1):
        source = nb.cells[index].source.strip()
        found = _EXERCISE.match(source.splitlines()[0]) if source else None
        if nb.cells[index].cell_type == "markdown" and found:
            return found.group(2).strip()
    return ""


def chapter_exercises(path: Path, points: dict[str, float]) -> list[dict]:
    """The exercises of the chapter notebook ``path``, in page order, with their points.

    Returns:
        One dict per exercise: ``id`` (its ``:label:``), ``function``, ``checker``,
        ``level``, ``name`` (the Gradescope test's: ``"Core: <title> (<function>)"``) and
        ``points`` (the override of its id or its function, else its level's, else
        :data:`POINTS`).

    Raises:
        ValueError: an exercise's title does not start with a level of :data:`POINTS`."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for exercise in exercises(nb, path.name):
        title = _heading(nb, exercise.cell)
        level = title.partition(":")[0].strip()
        if level not in POINTS:
            raise ValueError(f"{path.name}: the exercise of {exercise.function} is titled "
                             f"{title!r}, not '<level>: ...' with a level of {list(POINTS)}")
        own = points.get(exercise.id, points.get(exercise.function))
        found.append({"id": exercise.id, "function": exercise.function,
                      "checker": exercise.checker, "level": level,
                      "name": f"{title} ({exercise.function})",
                      "points": own if own is not None else points.get(level, POINTS[level])})
    return found


def assignment(chapter: str, known: dict[str, grade.Chapter], source_dir: Path,
               points: dict[str, float], timeout: float, hide_tests: bool) -> dict:
    """What ``grader/assignment.json`` holds for ``chapter`` (see the module's docstring)."""
    return {"chapter": chapter, "title": known[chapter].title,
            "version": project_version(ROOT),
            "exercises": chapter_exercises(source_dir / f"{chapter}.ipynb", points),
            "chapters": {cid: {"title": c.title, "exercises": [list(e) for e in c.exercises],
                               "ids": c.ids} for cid, c in known.items()},
            "timeout": timeout, "test_visibility": VISIBILITY[hide_tests]}


def pinned(names: tuple[str, ...], requirements: Path = ROOT / "requirements.txt") -> list[str]:
    """``name==version`` for each of ``names`` as ``requirements.txt`` pins it (else
    ``name``): the versions the course is tested with."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", requirements.read_text("utf-8"), re.M))
    return [f"{name}=={pins[name]}" if name in pins else name for name in names]


def setup_script() -> str:
    """``setup.sh`` with the library's release, the CPU index and the pinned versions."""
    url, _ = repository(ROOT / "_config.yml")
    torch, *packages = pinned(("torch", "nbclient", "ipykernel"))
    text = (TEMPLATES / "setup.sh").read_text(encoding="utf-8")
    for key, value in {"@LIBRARY@": install_source(url, f"v{project_version(ROOT)}"),
                       "@TORCH_INDEX@": TORCH_INDEX, "@TORCH@": torch,
                       "@GRADING_PACKAGES@": " ".join(f'"{p}"' for p in packages)}.items():
        text = text.replace(key, value)
    return text


def _add(archive: zipfile.ZipFile, name: str, data: str, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build(chapter: str, out_dir: Path, known: dict[str, grade.Chapter] | None = None,
          source_dir: Path = ROOT / "chapters", points: dict[str, float] | None = None,
          timeout: float = DEFAULT_TIMEOUT, hide_tests: bool = False) -> Path:
    """Write the autograder of ``chapter`` as ``out_dir/<chapter>-autograder.zip``.

    Args:
        chapter: a chapter id with exercises, e.g. ``"01_attention"``.
        out_dir: the folder for the zip (made if missing).
        known: the chapters with exercises (default: ``grade.chapters(source_dir)``).
        points: overrides of :data:`POINTS`, by level or by function.
        timeout: seconds the notebook may run, start to end.
        hide_tests: show each test's output only after the due date.

    Returns:
        The zip's path.

    Raises:
        ValueError: ``chapter`` has no exercises, or ``timeout`` is not positive."""
    known = grade.chapters(source_dir) if known is None else known
    if chapter not in known:
        raise ValueError(f"{chapter!r} is not a chapter with exercises: {', '.join(known)}")
    if timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {timeout}")
    spec = assignment(chapter, known, source_dir, points or {}, timeout, hide_tests)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{chapter}-autograder.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        _add(archive, "setup.sh", setup_script(), executable=True)
        _add(archive, "run_autograder",
             (TEMPLATES / "run_autograder").read_text(encoding="utf-8"), executable=True)
        for name in ENGINE:
            _add(archive, f"grader/{name}", (TOOLS / name).read_text(encoding="utf-8"))
        _add(archive, "grader/assignment.json", json.dumps(spec, indent=1) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="+", help="chapter ids, numbers, paths, or all")
    parser.add_argument("--out", type=Path, required=True, help="the folder for the zips")
    parser.add_argument("--points", action="append", default=[], metavar="NAME=N",
                        help=f"a level's or a function's points (default {POINTS})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds for a notebook, start to end (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--hide-tests-until-due", action="store_true",
                        help="students see each test's output only after the due date")
    args = parser.parse_args(argv)
    try:
        known = grade.chapters()
        chosen = list(dict.fromkeys(c for name in args.chapters for c in resolve(name, known)))
        points = parse_points(args.points)
        names = set(POINTS) | {name for c in chosen for fn, _ in known[c].exercises
                               for name in (fn, known[c].exercise_id(fn))}
        unknown = sorted(set(points) - names)
        if unknown:
            raise ValueError(f"--points names neither a level nor an exercise: {unknown}")
        for chapter in chosen:
            path = build(chapter, args.out, known, points=points, timeout=args.timeout,
                         hide_tests=args.hide_tests_until_due)
            with zipfile.ZipFile(path) as archive:
                spec = json.loads(archive.read("grader/assignment.json"))
            total = sum(e["points"] for e in spec["exercises"])
            print(f"{path}: {len(spec['exercises'])} exercises, {total:g} points")
    except ValueError as exc:
        print(f"gradescope: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
