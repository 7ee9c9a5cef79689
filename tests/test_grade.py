"""The grader (``tools/grade.py``) on a class of submissions built from the chapters and
their student copies: honest, broken and dishonest ones.

Slow (each notebook runs in its own kernel): marked ``slow``; CI runs it."""
from __future__ import annotations

import csv

import nbformat
import pytest

import grade  # tools/grade.py
from book_support import ROOT

pytestmark = pytest.mark.slow

CHAPTER = ROOT / "chapters" / "00_setup.ipynb"  # the quickest chapter to run
STUDENT = ROOT / "exercises" / "00_setup.ipynb"
OTHER = ROOT / "exercises" / "01_attention.ipynb"


def _with_cell(source_nb, code: str, index: int | None = None):
    nb = nbformat.read(source_nb, as_version=4)
    cell = nbformat.v4.new_code_cell(code)
    nb.cells.insert(len(nb.cells) if index is None else index, cell)
    return nb


def _renamed(nb, old: str, new: str):
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = cell.source.replace(f"def {old}(", f"def {new}(")
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")

    def put(student: str, name: str, nb=None, text: str | None = None):
        target = folder / student / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            target.write_text(text, encoding="utf-8")
        else:
            nbformat.write(nb, target)

    put("alice", "00_setup.ipynb", nbformat.read(CHAPTER, as_version=4))  # full solution
    put("bob", "00_setup.ipynb", nbformat.read(STUDENT, as_version=4))  # untouched copy
    tampered = _with_cell(STUDENT, (
        "import transformer_lib.checks as checks\n"
        "checks.check_mha_shapes = lambda f: True\n"
        "def mha_shapes(*args):\n    return None\n"
        "print('mha_shapes: all 3 checks passed.')"))
    put("carol", "00_setup.ipynb", tampered)  # replaces the checker, prints a pass
    put("dave", "00_setup.ipynb", _with_cell(STUDENT, "while True:\n    pass", index=3))
    put("eve", "00_setup.ipynb", _with_cell(CHAPTER, "import os\nos._exit(1)"))
    put("frank", "00_setup.ipynb", text="{ this is not json")
    put("grace", "00_setup.ipynb",
        _renamed(nbformat.read(CHAPTER, as_version=4), "mha_shapes", "my_shapes"))
    put("heidi", "submitted/week1/Copy of 01_attention.ipynb", nbformat.read(OTHER, as_version=4))
    renamed = nbformat.read(CHAPTER, as_version=4)  # no metadata: found by its title
    put("ivan", "Copy of 00_setup (1).ipynb", renamed)
    stranger = nbformat.v4.new_notebook()
    stranger.cells = [nbformat.v4.new_markdown_cell("# My holiday notes")]
    put("judy", "notes.ipynb", stranger)
    (folder / "kim").mkdir()  # an empty folder
    out = folder.parent / "gradebook.csv"
    rows = grade.grade(folder, out, jobs=2, timeout=90, progress=False)
    with out.open(encoding="utf-8") as f:
        table = {(r["student"], r["notebook"]): r for r in csv.DictReader(f)}
    return rows, table, out


def _row(table, student):
    return next(r for (s, _), r in table.items() if s == student)


def test_full_solution_passes_everything(graded):
    _, table, _ = graded
    row = _row(table, "alice")
    assert row["status"] == "ok" and row["chapter"] == "00_setup"
    assert (row["passed"], row["total"]) == ("1", "1") and row["00_setup:mha_shapes"] == "pass"


def test_untouched_copy_is_not_attempted(graded):
    row = _row(graded[1], "bob")
    assert row["status"] == "ok" and row["passed"] == "0"
    assert row["00_setup:mha_shapes"] == "not attempted"


def test_a_copy_that_replaces_the_checker_earns_nothing(graded):
    row = _row(graded[1], "carol")
    assert row["status"] == "ok" and row["passed"] == "0"
    assert row["00_setup:mha_shapes"] == "fail"  # graded by the real checker: returns None


def test_an_infinite_loop_hits_the_time_limit_and_the_run_goes_on(graded):
    row = _row(graded[1], "dave")
    assert row["status"] == "time limit" and row["00_setup:mha_shapes"] == "missing"


def test_a_crash_of_the_kernel_is_reported(graded):
    assert _row(graded[1], "eve")["status"] == "kernel died"


def test_invalid_json_is_not_a_notebook(graded):
    assert _row(graded[1], "frank")["status"] == "not a notebook"


def test_a_renamed_function_is_missing(graded):
    row = _row(graded[1], "grace")
    assert row["status"] == "ok" and row["00_setup:mha_shapes"] == "missing"


def test_another_chapter_in_a_nested_folder_is_graded_as_that_chapter(graded):
    row = _row(graded[1], "heidi")
    assert row["chapter"] == "01_attention" and row["status"] == "ok"
    assert row["total"] == str(len(grade.chapters()["01_attention"].exercises))
    assert set(v for k, v in row.items() if k.startswith("01_attention:")) == {"not attempted"}


def test_a_renamed_file_is_matched_by_its_title(graded):
    row = _row(graded[1], "ivan")
    assert row["chapter"] == "00_setup" and row["00_setup:mha_shapes"] == "pass"


def test_unknown_chapter_and_empty_folder_get_their_status(graded):
    assert _row(graded[1], "judy")["status"] == "unknown chapter"
    assert _row(graded[1], "kim")["status"] == "no notebook"


def test_feedback_files_hold_the_checkers_reports(graded):
    _, _, out = graded
    feedback = out.parent / "feedback"
    bob = (feedback / "bob.md").read_text(encoding="utf-8")
    assert "not attempted yet" in bob and "0 of 1 exercises passed" in bob
    alice = (feedback / "alice.md").read_text(encoding="utf-8")
    assert "all 3 checks passed" in alice
    assert "time limit" in (feedback / "dave.md").read_text(encoding="utf-8")


def test_student_copies_are_matched_by_their_metadata():
    nb = nbformat.read(STUDENT, as_version=4)
    nb.cells[0].source = "# Something else entirely"
    assert grade.identify(nb, "homework.ipynb", grade.chapters()) == "00_setup"


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="one folder per student"):
        grade.grade(tmp_path / "nowhere", tmp_path / "g.csv")
    with pytest.raises(ValueError, match=r"--jobs \(0\)"):
        grade.grade(tmp_path, tmp_path / "g.csv", jobs=0)
