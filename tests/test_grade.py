"""The grader (``tools/grade.py``) on a class of submissions built from the chapters and
their student copies: honest, broken and dishonest ones.

Slow (each notebook runs in its own kernel): marked ``slow``; CI runs it."""
from __future__ import annotations

import ast
import csv
import json
import shutil
import subprocess
import sys

import nbformat
import pytest

import _grade_runner  # tools/_grade_runner.py
import grade  # tools/grade.py
from book_support import ROOT
from grade_fixtures import (
    ENDLESS,
    import_hook,
    plant_at_run_time,
    plant_fake_package,
    renamed,
    replaced_checker,
    with_cell,
    wrong,
)

pytestmark = pytest.mark.slow

CHAPTER = ROOT / "chapters" / "00_setup.ipynb"  # the quickest chapter to run
STUDENT = ROOT / "exercises" / "00_setup.ipynb"
OTHER = ROOT / "exercises" / "01_attention.ipynb"
ZH_CHAPTER = ROOT / "zh" / "chapters" / "00_setup.ipynb"
ZH_STUDENT = ROOT / "zh" / "exercises" / "00_setup.ipynb"
WRONG = wrong("mha_shapes")  # what the real checker fails
PLANT_AT_RUN_TIME = plant_at_run_time("mha_shapes")
IMPORT_HOOK = import_hook("mha_shapes")


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
    tampered = with_cell(STUDENT, replaced_checker("mha_shapes", "check_mha_shapes"))
    put("carol", "00_setup.ipynb", tampered)  # replaces the checker, prints a pass
    put("dave", "00_setup.ipynb", with_cell(STUDENT, ENDLESS, index=3))
    put("eve", "00_setup.ipynb", with_cell(CHAPTER, "import os\nos._exit(1)"))
    put("frank", "00_setup.ipynb", text="{ this is not json")
    put("grace", "00_setup.ipynb",
        renamed(nbformat.read(CHAPTER, as_version=4), "mha_shapes", "my_shapes"))
    put("heidi", "submitted/week1/Copy of 01_attention.ipynb", nbformat.read(OTHER, as_version=4))
    by_title = nbformat.read(CHAPTER, as_version=4)  # no metadata: found by its title
    put("ivan", "Copy of 00_setup (1).ipynb", by_title)
    stranger = nbformat.v4.new_notebook()
    stranger.cells = [nbformat.v4.new_markdown_cell("# My holiday notes")]
    put("judy", "notes.ipynb", stranger)
    (folder / "kim").mkdir()  # an empty folder
    # Dishonest: checkers that pass everything, planted in the student's folder and put on
    # sys.path by a cell; written at run time into the kernel's working directory; served by
    # an import hook.
    plant_fake_package(folder / "mallory")
    put("mallory", "00_setup.ipynb", with_cell(
        STUDENT, f"import sys\nsys.path.insert(0, {str(folder / 'mallory')!r})\n{WRONG}"))
    put("nia", "00_setup.ipynb", with_cell(STUDENT, PLANT_AT_RUN_TIME))
    # The Chinese edition's notebooks (zh/): the same code and metadata, the text translated.
    put("lin", "00_setup.ipynb", nbformat.read(ZH_CHAPTER, as_version=4))
    put("mei", "作业.ipynb", nbformat.read(ZH_STUDENT, as_version=4))
    put("trudy", "00_setup.ipynb", with_cell(STUDENT, IMPORT_HOOK))
    out = folder.parent / "gradebook.csv"
    rows = grade.grade(folder, out, jobs=2, timeout=60, progress=False)  # dave waits it out
    with out.open(encoding="utf-8") as f:
        table = {(r["student"], r["notebook"]): r for r in csv.DictReader(f)}
    return rows, table, out


def _row(table, student):
    return next(r for (s, _), r in table.items() if s == student)


def test_full_solution_passes_everything(graded):
    _, table, _ = graded
    row = _row(table, "alice")
    assert row["status"] == "ok" and row["chapter"] == "00_setup"
    assert (row["passed"], row["total"]) == ("1", "1") and row["setup-ex-shapes"] == "pass"


def test_chinese_notebooks_are_graded_as_their_chapter(graded):
    lin, mei = _row(graded[1], "lin"), _row(graded[1], "mei")
    assert (lin["status"], lin["chapter"], lin["passed"], lin["total"]) == (
        "ok", "00_setup", "1", "1")
    assert (mei["status"], mei["chapter"], mei["passed"]) == ("ok", "00_setup", "0")
    assert mei["setup-ex-shapes"] == "not attempted"


def test_untouched_copy_is_not_attempted(graded):
    row = _row(graded[1], "bob")
    assert row["status"] == "ok" and row["passed"] == "0"
    assert row["setup-ex-shapes"] == "not attempted"


def test_a_copy_that_replaces_the_checker_earns_nothing(graded):
    row = _row(graded[1], "carol")
    assert row["status"] == "ok" and row["passed"] == "0"
    assert row["setup-ex-shapes"] == "fail"  # graded by the real checker: returns None


def test_an_infinite_loop_hits_the_time_limit_and_the_run_goes_on(graded):
    row = _row(graded[1], "dave")
    assert row["status"] == "time limit" and row["setup-ex-shapes"] == "time limit"


def test_a_crash_of_the_kernel_is_reported(graded):
    row = _row(graded[1], "eve")
    assert row["status"] == "kernel died" and row["setup-ex-shapes"] == "kernel died"


@pytest.mark.parametrize("student", ["mallory", "nia"])
def test_a_planted_checkers_package_is_not_imported(graded, student):
    """The fake passes everything; the real checker fails the notebook's ``mha_shapes``."""
    row = _row(graded[1], student)
    assert row["status"] == "ok" and row["passed"] == "0"
    assert row["setup-ex-shapes"] == "fail"


def test_checkers_served_by_an_import_hook_are_tampering(graded):
    rows, table, out = graded
    row = _row(table, "trudy")
    assert row["status"] == "tampered" and row["passed"] == "0"
    assert row["setup-ex-shapes"] == "tampered"
    feedback = (out.parent / "feedback" / "trudy.md").read_text(encoding="utf-8")
    assert "Status: tampered: the checkers were not the installed ones." in feedback
    assert "fake_checks.py, not from the installed library" in feedback
    assert next(r for r in rows if r.student == "trudy").status is grade.Status.TAMPERED


def test_invalid_json_is_not_a_notebook(graded):
    assert _row(graded[1], "frank")["status"] == "not a notebook"


def test_a_renamed_function_is_missing(graded):
    row = _row(graded[1], "grace")
    assert row["status"] == "ok" and row["setup-ex-shapes"] == "missing"


def test_another_chapter_in_a_nested_folder_is_graded_as_that_chapter(graded):
    row = _row(graded[1], "heidi")
    assert row["chapter"] == "01_attention" and row["status"] == "ok"
    assert row["total"] == str(len(grade.chapters()["01_attention"].exercises))
    ids = grade.chapters()["01_attention"].ids.values()
    assert {row[i] for i in ids} == {"not attempted"}


def test_a_renamed_file_is_matched_by_its_title(graded):
    row = _row(graded[1], "ivan")
    assert row["chapter"] == "00_setup" and row["setup-ex-shapes"] == "pass"


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
    dave = (feedback / "dave.md").read_text(encoding="utf-8")
    assert "Status: time limit: the notebook did not finish within the time limit." in dave
    assert "### `mha_shapes`: time limit" in dave


def test_student_copies_are_matched_by_their_metadata():
    nb = nbformat.read(STUDENT, as_version=4)
    nb.cells[0].source = "# Something else entirely"
    assert grade.identify(nb, "homework.ipynb", grade.chapters()) == "00_setup"


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="one folder per student"):
        grade.grade(tmp_path / "nowhere", tmp_path / "g.csv")
    with pytest.raises(ValueError, match=r"--jobs \(0\)"):
        grade.grade(tmp_path, tmp_path / "g.csv", jobs=0)


def test_the_runner_on_its_own_ignores_a_package_in_its_working_directory(tmp_path):
    """The kernel starts with '' (its working directory) first on sys.path; the grading cell
    takes it off, so the real checker fails the notebook's wrong function."""
    plant_fake_package(tmp_path)
    notebook = tmp_path / "submitted.ipynb"
    nbformat.write(with_cell(STUDENT, WRONG), notebook)
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, str(grade.RUNNER), str(notebook), "--results", str(results),
         "--library", str(grade.installed_library()), "--timeout", "60",
         "--exercise", "mha_shapes:check_mha_shapes"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    graded = json.loads(results.read_text(encoding="utf-8"))
    assert graded["mha_shapes"]["result"] == "fail", graded


def test_the_grading_cell_calls_the_runners_own_function():
    source = _grade_runner.grading_cell([("f", "check_f")], "/tmp/r.json", "/lib", ["/s"])
    tree = ast.parse(source)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["grade_in_kernel"]
    assert source.rstrip().endswith(
        "grade_in_kernel(globals(), [('f', 'check_f')], '/tmp/r.json', '/lib', ['/s'])")


def test_the_runner_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _grade_runner.main([str(tmp_path / "nb.ipynb"), "--results", "r.json", "--library",
                            str(tmp_path), "--timeout", "9", "--exercise", "f-check_f"])
    assert stop.value.code == 2 and "expected FUNCTION:CHECKER, got 'f-check_f'" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        _grade_runner.main([str(tmp_path / "nb.ipynb"), "--results", "r.json", "--library",
                            str(tmp_path), "--timeout", "9", "--exercise", "f:check_f"])
    assert f"--library {tmp_path} is not a package folder" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_grade_leaves_the_defaults_to_the_grader():
    """One source for JOBS and TIMEOUT: the Makefile passes them on only when set."""
    def command(*settings):
        # --no-print-directory: under `make test` this make is nested and would add
        # "Entering/Leaving directory" lines.
        dry = subprocess.run(["make", "--no-print-directory", "-n", "-o",
                              ".venv/.installed-stamp", "grade", "SUBMISSIONS=subs", *settings],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        return dry.stdout.strip().splitlines()[-1]

    assert "--jobs" not in command() and "--timeout" not in command()
    assert command("JOBS=3", "TIMEOUT=50").endswith("--jobs 3 --timeout 50")
    assert grade.grade.__defaults__[:2] == (grade.DEFAULT_JOBS, grade.DEFAULT_TIMEOUT)


def test_exercises_are_found_by_their_ids_wherever_the_book_has_them(tmp_path):
    """A copy made before a page was split is graded on the exercises it was made with: the
    ids in its metadata find them on the page that holds them now, and the gradebook's
    columns are those ids."""
    import nbformat
    known = grade.chapters()
    attention, capstone = known["01_attention"], known["07d_capstone"]
    nb = nbformat.v4.new_notebook(metadata={"transformer_lib": {
        "chapter": "an_old_page", "exercises": [
            attention.exercise_id("masked_softmax"), capstone.exercise_id("train_lm"),
            "an-exercise-the-book-dropped"]}})
    found = grade.to_grade(nb, grade.identify(nb, "x.ipynb", known), known)
    assert found.id == "01_attention"
    assert found.exercises == [("masked_softmax", "check_masked_softmax"),
                               ("train_lm", "check_train_lm")]
    assert set(found.ids.values()) == {"attention-ex-masked-softmax", "capstone-ex-train"}
    plain = nbformat.v4.new_notebook(metadata={"transformer_lib": {"chapter": "00_setup"}})
    assert grade.to_grade(plain, "00_setup", known) is known["00_setup"]
    row = grade.Row("ann", "x.ipynb", "01_attention",
                    results={"masked_softmax": grade.Result.PASS},
                    ids={"attention-ex-masked-softmax": "masked_softmax"})
    grade.write_gradebook([row], known, tmp_path / "book.csv")
    header, line = (tmp_path / "book.csv").read_text().splitlines()
    columns = header.split(",")
    assert "attention-ex-masked-softmax" in columns and "capstone-ex-train" in columns
    assert line.split(",")[columns.index("attention-ex-masked-softmax")] == "pass"
    assert line.split(",")[3:5] == ["1", "1"]
