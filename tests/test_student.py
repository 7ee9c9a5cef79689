"""Exercises and their student copies (``make student``, ``tools/make_student.py``).

The chapters hold the exercises with their solutions; ``exercises/`` holds the committed
student copies. These tests check that the copies are current, that no solution line reaches
them, that they run to the end reporting every exercise as not attempted yet, that the
generator refuses unbalanced markers, and that the book numbers the exercises and folds the
solutions.
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter

import nbformat
import pytest

import make_student  # tools/make_student.py
from book_support import ROOT, config, ensure_built_book, toc_docnames

CHAPTERS = ROOT / "chapters"
EXERCISES = ROOT / "exercises"
CHAPTER_PATHS = sorted(CHAPTERS.glob("*.ipynb"))
EXERCISE_CHAPTERS = [p for p in CHAPTER_PATHS
                     if make_student.BEGIN in p.read_text(encoding="utf-8")]


def _ids(paths):
    return [p.name for p in paths]


def _solution_lines(nb) -> tuple[list[str], Counter]:
    """The lines inside solution regions and solution cells, and a count of every other
    line of the notebook (code and Markdown), all stripped."""
    hidden, shown = [], Counter()
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "{solution}" in cell.source:
            hidden += [line.strip() for line in cell.source.splitlines()]
            continue
        if "instructor" in cell.metadata.get("tags", []):
            continue
        inside = False
        for line in cell.source.splitlines():
            marker = line.strip()
            if marker in (make_student.BEGIN, make_student.END):
                inside = marker == make_student.BEGIN
            elif inside:
                hidden.append(marker)
            else:
                shown[marker] += 1
    return [line for line in hidden if line and not re.fullmatch(r"[`:]+", line)], shown


# The copies in exercises/ -------------------------------------------------------------------


def test_committed_student_copies_are_up_to_date(tmp_path):
    make_student.write_student_copies(CHAPTERS, tmp_path)
    fresh = {p.name: p.read_bytes() for p in tmp_path.glob("*.ipynb")}
    committed = {p.name: p.read_bytes() for p in EXERCISES.glob("*.ipynb")}
    stale = sorted(name for name in fresh.keys() | committed.keys()
                   if fresh.get(name) != committed.get(name))
    assert not stale, (f"exercises/ is out of date for {stale}: run `make student` and commit "
                       "exercises/")


def test_generation_is_idempotent_and_leaves_the_chapters_alone(tmp_path):
    def digest():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in CHAPTER_PATHS}

    before = digest()
    written = make_student.write_student_copies(CHAPTERS, tmp_path)
    first = {p.name: p.read_bytes() for p in tmp_path.glob("*.ipynb")}
    assert make_student.write_student_copies(CHAPTERS, tmp_path) == [], "a second run changed files"
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.ipynb")} == first
    assert sorted(written) == sorted(p.name for p in CHAPTER_PATHS)
    assert digest() == before
    assert make_student.main(["--check", "--out", str(tmp_path)]) == 0


def test_copies_without_a_chapter_are_removed(tmp_path):
    (tmp_path / "99_gone.ipynb").write_text("{}", encoding="utf-8")
    changed = make_student.write_student_copies(CHAPTERS, tmp_path)
    assert "99_gone.ipynb" in changed and not (tmp_path / "99_gone.ipynb").exists()


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_no_solution_line_reaches_the_student_copy(chapter):
    source = nbformat.read(chapter, as_version=4)
    student = nbformat.read(EXERCISES / chapter.name, as_version=4)
    hidden, shown_in_source = _solution_lines(source)
    in_student = Counter(line.strip() for cell in student.cells
                         for line in cell.source.splitlines())
    # A solution line may appear in the copy only as often as it appears outside the solutions.
    leaked = [line for line in set(hidden) if in_student[line] > shown_in_source[line]]
    assert not leaked, f"solution lines in exercises/{chapter.name}: {leaked}"


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_student_copy_has_stubs_and_plain_checks(chapter):
    source = nbformat.read(chapter, as_version=4)
    student = nbformat.read(EXERCISES / chapter.name, as_version=4)
    text = "\n".join(cell.source for cell in student.cells)
    source_text = "\n".join(cell.source for cell in source.cells)

    for forbidden in (make_student.BEGIN, make_student.END, "{solution}", "assert check_"):
        assert forbidden not in text
    assert not any("instructor" in c.metadata.get("tags", []) for c in student.cells)
    assert all(c.outputs == [] and c.execution_count is None
               for c in student.cells if c.cell_type == "code")
    # One stub per region, indented like its markers.
    begins = re.findall(rf"^( *){re.escape(make_student.BEGIN)}$", source_text, re.M)
    stubs = re.findall(r"^( *)# YOUR CODE HERE\n\1raise NotImplementedError\(\)$", text, re.M)
    assert stubs == begins
    # Each checked exercise is now a plain call.
    assert (re.findall(r"^\s*check_\w+\(.*\)$", text, re.M)
            == [line.replace("assert ", "", 1)
                for line in re.findall(r"^\s*assert check_\w+\(.*\)$", source_text, re.M)])
    # The rest is kept: the title, the setup cell, and every exercise, numbered in order.
    assert student.cells[0].source == source.cells[0].source
    assert student.cells[1].source == source.cells[1].source
    n_exercises = source_text.count("{exercise}")
    numbers = re.findall(r"^\*\*Exercise (\d+)", text, re.M)
    assert numbers == [str(i + 1) for i in range(n_exercises)]


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_student_copy_runs_and_reports_not_attempted(chapter):
    """Executed top to bottom, as a student would on receiving it: no cell fails, and every
    checker says the exercise is not attempted yet. This is the only run of the copies
    (nbval does not collect exercises/: see test_student_copies_are_run_once)."""
    from nbclient import NotebookClient

    nb = nbformat.read(EXERCISES / chapter.name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXERCISES)}}).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert not [o for o in cell.outputs if o.output_type == "error"]
        calls = re.findall(r"^(check_\w+)\(", cell.source, re.M)
        if calls:
            printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert printed.count("not attempted yet") == len(calls), printed
            assert not [o for o in cell.outputs if o.output_type == "execute_result"], \
                "the verdict is shown once, not again as the cell's result"


# The chapters' exercises --------------------------------------------------------------------


@pytest.mark.parametrize("chapter", EXERCISE_CHAPTERS, ids=_ids(EXERCISE_CHAPTERS))
def test_every_exercise_has_code_a_check_and_a_folded_solution(chapter):
    nb = nbformat.read(chapter, as_version=4)
    text = "\n".join(cell.source for cell in nb.cells)
    labels = re.findall(r"\{exercise\}.*\n:label: (\S+)", text)
    assert labels and len(labels) == len(set(labels))
    solutions = dict(re.findall(r"\{solution\} (\S+)\n:class: (.+)", text))
    for label in labels:
        assert label in solutions, f"exercise {label} has no solution directive"
        assert "dropdown" in solutions[label].split(), f"the solution of {label} is not folded"
    assert text.count(make_student.BEGIN) >= len(labels)
    assert len(re.findall(r"^assert check_\w+\(\w+\)$", text, re.M)) >= len(labels)


# The generator refuses what it cannot strip cleanly ------------------------------------------


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), *cells]
    return nb


@pytest.mark.parametrize("body, problem, line", [
    ("def f():\n    x = 1\n    ### END SOLUTION\n", "without a '### BEGIN SOLUTION' before it", 3),
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n",
     "without an '### END SOLUTION' after it", 2),
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    return 1\n"
     "    ### END SOLUTION\n", "inside the region opened at line 2", 3),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "a solution region at the top level", 1),
], ids=["end-without-begin", "begin-without-end", "nested", "top-level"])
def test_unbalanced_markers_fail_with_file_cell_and_line(tmp_path, capsys, body, problem, line):
    source_dir, out_dir = tmp_path / "chapters", tmp_path / "exercises"
    source_dir.mkdir()
    good = _notebook(nbformat.v4.new_code_cell("def g():\n    ### BEGIN SOLUTION\n    return 2\n"
                                               "    ### END SOLUTION"))
    nbformat.write(good, source_dir / "01_good.ipynb")
    nbformat.write(_notebook(nbformat.v4.new_code_cell("import torch"),
                             nbformat.v4.new_code_cell(body)), source_dir / "02_broken.ipynb")

    status = make_student.main(["--source", str(source_dir), "--out", str(out_dir)])
    error = capsys.readouterr().err
    assert status == 1
    assert "02_broken.ipynb, cell 2 (counting from 0" in error
    assert f"line {line}" in error and problem in error
    assert not out_dir.exists(), "nothing is written when a notebook cannot be converted"
    with pytest.raises(make_student.MarkerError, match=re.escape(problem)):
        make_student.student_copies(source_dir)


def test_solution_directive_must_be_a_cell_of_its_own():
    nb = _notebook(nbformat.v4.new_markdown_cell(
        "Some text.\n\n```{solution} ex\n:class: dropdown\n\nThe answer.\n```"))
    with pytest.raises(make_student.MarkerError, match="Markdown cell of its own"):
        make_student.student_notebook(nb, "x.ipynb")


def test_conversion_of_a_small_notebook():
    exercise = "```{exercise} Warm-up\n:label: ex-a\n\nWrite $f$.\n```"
    code = "def f(x):\n    y = 2\n    ### BEGIN SOLUTION\n    return x * y\n    ### END SOLUTION"
    nb = _notebook(nbformat.v4.new_markdown_cell(exercise),
                   nbformat.v4.new_code_cell(code, metadata={"tags": ["hide-input"]}),
                   nbformat.v4.new_code_cell("assert check_f(f)"),
                   nbformat.v4.new_markdown_cell(
                       "```{solution} ex-a\n:class: dropdown\n\nx·2\n```"),
                   nbformat.v4.new_code_cell("assert not check_f(g)",
                                             metadata={"tags": ["instructor"]}))
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="old output")]
    nb.cells[2].execution_count = 3
    student = make_student.student_notebook(nb, "x.ipynb")
    assert [c.source for c in student.cells] == [
        "# Title",
        "**Exercise 1 (Warm-up)**\n\nWrite $f$.",
        "def f(x):\n    y = 2\n    # YOUR CODE HERE\n    raise NotImplementedError()",
        "check_f(f)",
    ]
    assert student.cells[3].outputs == [] and student.cells[3].execution_count is None
    assert "tags" not in student.cells[2].metadata  # the stub is not folded away
    assert len(nb.cells) == 6 and "### BEGIN SOLUTION" in nb.cells[2].source  # source untouched


# Not in the book, but run by the tests --------------------------------------------------------


def test_student_copies_are_not_part_of_the_book():
    cfg = config()
    assert cfg["only_build_toc_files"] is True
    assert "exercises" in cfg["exclude_patterns"]
    assert not any(d.startswith("exercises/") for d in toc_docnames())
    assert "sphinx_exercise" in cfg["sphinx"]["extra_extensions"]


def test_student_copies_are_run_once():
    """Every copy in exercises/ is executed by test_student_copy_runs_and_reports_not_attempted,
    and by nothing else: nbval, which runs the notebooks under pytest's testpaths, is not
    pointed at exercises/."""
    import tomllib

    pytest_config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_config = pytest_config["tool"]["pytest"]["ini_options"]
    collected = [ROOT / path for path in pytest_config["testpaths"]]
    assert not any(EXERCISES.is_relative_to(path) or path.is_relative_to(EXERCISES)
                   for path in collected), f"nbval would run exercises/ again: {collected}"
    assert "exercises" not in pytest_config["addopts"]

    (parametrize,) = [mark for mark in test_student_copy_runs_and_reports_not_attempted.pytestmark
                      if mark.name == "parametrize"]
    run = sorted(EXERCISES / chapter.name for chapter in parametrize.args[1])
    assert run == sorted(EXERCISES.glob("*.ipynb")), "a student copy is not run"
    assert len(run) == len(set(run)), "a student copy is run twice"


@pytest.mark.book
@pytest.mark.parametrize("chapter", EXERCISE_CHAPTERS, ids=_ids(EXERCISE_CHAPTERS))
def test_book_numbers_the_exercises_and_folds_the_solutions(chapter):
    html = ensure_built_book()
    page = (html / "chapters" / f"{chapter.stem}.html").read_text(encoding="utf-8")
    n = "\n".join(c.source for c in nbformat.read(chapter, as_version=4).cells).count("{exercise}")
    for i in range(1, n + 1):  # "Exercise 3", or "Exercise 2.3" in a numbered chapter
        number = rf'<span class="caption-number">Exercise (?:[\d.]+\.)?{i} </span>'
        assert re.search(number, page), f"no Exercise {i} on the page"
    assert len(re.findall(r'class="solution dropdown admonition"', page)) == n
    # The code cells with the reference solutions are folded too (tagged hide-input).
    assert page.count('<details class="admonition hide above-input"') >= n
    assert make_student.BEGIN in page
    assert not (html / "exercises").exists()
