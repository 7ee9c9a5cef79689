"""The scripts in tools/: the book build's failure summary, and where the scripts live.

tools/ is on pytest's pythonpath (pyproject.toml), so the scripts are imported by name here,
and each must also run as ``python tools/<script>.py``.
"""
from __future__ import annotations

import subprocess
import sys

import chapter_mutants
import page_stats
import pytest

import build_book
from book_support import ROOT, chapter_pages

ESC = "\x1b"

# A shortened log of a failed build, as jupyter-book writes it (colour codes included).
FAILED_LOG = f"""\
Running Jupyter-Book v1.0.4.post1
{ESC}[01mreading sources... {ESC}[39;49;00m[ 22%] {ESC}[35mchapters/01_attention{ESC}[39;49;00m
/work/book/chapters/01_attention.ipynb: Executing notebook using local CWD [mystnb]
[IPKernelApp] WARNING | Kernel is running over TCP without encryption.
{ESC}[91m/work/book/intro.md:12: WARNING: undefined label: 'ch-missing'{ESC}[39;49;00m
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/nbclient/client.py", line 918, in _check_raise_for_error
    raise CellExecutionError.from_cell_and_msg(cell, exec_reply_content)
nbclient.exceptions.CellExecutionError: An error occurred while executing the following cell:
------------------
assert torch.allclose(ours, reference)
------------------

{ESC}[31mAssertionError{ESC}[39m: ours and the reference differ

The above exception was the direct cause of the following exception:

  File "/venv/lib/python3.11/site-packages/myst_nb/core/execute/direct.py", line 51, in start_client
    raise ExecutionError(str(self.path)) from result.err
myst_nb.core.execute.base.ExecutionError: /work/book/chapters/01_attention.ipynb
RuntimeError:
There was an error in building your book. Look above for the cause.
"""


def _section(summary: str, title: str) -> list[str]:
    """The lines of the summary between the header ``---- title ----`` and the next header."""
    lines = summary.splitlines()
    start = lines.index(f"---- {title} ----") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("---- ")), len(lines))
    return lines[start:end]


def test_failure_summary_shows_warnings_the_failed_cell_and_the_log(tmp_path):
    log_path = tmp_path / "book.log"
    summary = build_book.failure_summary(FAILED_LOG, log_path, tmp_path / "reports")

    assert _section(summary, "Sphinx warnings and errors") == [
        "/work/book/intro.md:12: WARNING: undefined label: 'ch-missing'"]  # no colour codes
    assert "IPKernelApp" not in "\n".join(_section(summary, "Sphinx warnings and errors"))

    failed = _section(summary, "notebook that failed, the cell and its error")
    assert failed[0] == "Notebook: /work/book/chapters/01_attention.ipynb"
    assert failed[1].startswith("nbclient.exceptions.CellExecutionError: An error occurred")
    assert "assert torch.allclose(ours, reference)" in failed
    assert "AssertionError: ours and the reference differ" in failed
    assert not any(line.startswith("The above exception") for line in failed)

    tail = _section(summary, "end of the log")
    assert tail[-1] == f"Book build FAILED; full log: {log_path.resolve()}"
    assert "There was an error in building your book. Look above for the cause." in tail
    assert "Execution reports" not in summary  # no reports folder was written


def test_failure_summary_names_the_reports_folder_when_there_is_one(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    summary = build_book.failure_summary(FAILED_LOG, tmp_path / "book.log", reports)
    assert summary.splitlines()[-1] == f"Execution reports: {reports.resolve()}"


def test_failure_summary_of_a_build_that_only_warned(tmp_path):
    log = "\n".join(["[IPKernelApp] WARNING | Kernel is running over TCP without encryption."]
                    + [f"/book/x.md:{i}: WARNING: warning {i}" for i in range(50)]
                    + ["build finished with problems, 50 warnings."])
    summary = build_book.failure_summary(log, tmp_path / "book.log", tmp_path / "reports")
    warnings = _section(summary, "Sphinx warnings and errors")
    assert warnings == [f"/book/x.md:{i}: WARNING: warning {i}"
                        for i in range(build_book.MAX_WARNINGS)]
    assert _section(summary, "notebook that failed, the cell and its error") == []


def test_ext_holds_only_the_books_sphinx_extensions():
    from i18n import editions

    # Every edition loads the same extensions, the language-specific ones included (they act
    # on the edition's entry of book_languages): tools/i18n/editions.py.
    in_ext = sorted(p.stem for p in (ROOT / "_ext").glob("*.py"))
    for kind in editions.kinds():
        local = editions.edition_config(kind)["sphinx"]["local_extensions"]
        assert in_ext == sorted(name for name, folder in local.items()
                                if folder == str(ROOT / "_ext")), kind


_I18N_COMMANDS = ("config", "messages", "notebooks", "fonts")


@pytest.mark.parametrize("script", [*sorted(p.name for p in (ROOT / "tools").glob("*.py")),
                                    *(f"i18n {command}" for command in _I18N_COMMANDS), "i18n"])
def test_tool_runs_as_a_script(script):
    result = subprocess.run([sys.executable, *f"tools/{script}".split(), "--help"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def test_i18n_names_a_command_it_does_not_have():
    result = subprocess.run([sys.executable, "tools/i18n", "translate"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "config,messages,notebooks,fonts" in result.stderr


# The setup cell ------------------------------------------------------------------------------


def _run_setup_cell(monkeypatch, pip_result, versions_before, versions_after):
    """Execute the setup cell's source as a notebook would, with the library missing, pip
    replaced by ``pip_result`` and the installed versions by the two dicts."""
    import importlib.metadata
    import importlib.util
    import types

    import setup_cell

    calls = iter([versions_before, versions_after])

    def distributions():
        versions = next(calls)
        return [types.SimpleNamespace(metadata={"Name": n}, version=v) for n, v in versions.items()]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(importlib.metadata, "distributions", distributions)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pip_result)
    exec(compile(setup_cell.setup_cell_source(), "<setup cell>", "exec"), {})


def test_setup_cell_prints_pip_output_when_the_install_fails(monkeypatch, capsys):
    failed = subprocess.CompletedProcess([], 1, stdout="Collecting transformer_lib",
                                         stderr="ERROR: No matching distribution found")
    with pytest.raises(RuntimeError, match="pip could not install"):
        _run_setup_cell(monkeypatch, failed, {"numpy": "2.1.3"}, {"numpy": "2.1.3"})
    printed = capsys.readouterr().out
    assert "ERROR: No matching distribution found" in printed and "Collecting" in printed


def test_setup_cell_asks_for_a_restart_when_an_imported_package_changed(monkeypatch, capsys):
    ok = subprocess.CompletedProcess([], 0, stdout="", stderr="")
    before = {"numpy": "2.1.3", "not-imported-anywhere": "1.0"}
    _run_setup_cell(monkeypatch, ok, before, {"numpy": "2.4.6", "not-imported-anywhere": "2.0",
                                              "transformer-lib": "0.1.0"})
    printed = capsys.readouterr().out
    assert "Restart the runtime" in printed and "numpy 2.1.3 -> 2.4.6" in printed
    assert "not-imported-anywhere" not in printed  # not imported: no restart needed for it
    _run_setup_cell(monkeypatch, ok, before, {**before, "transformer-lib": "0.1.0"})
    assert capsys.readouterr().out == ""  # the library alone was added: nothing to say


def test_setup_cell_is_written_to_run_in_the_book_without_being_shown():
    """``remove-cell``: myst-nb executes the cell and shows neither its code nor its output;
    Colab and Jupyter ignore the tag, so the cell stays in front of readers there. ``--check``
    (``problems``) rejects a setup cell with any other tags, e.g. the old ``hide-output``."""
    import nbformat

    import setup_cell

    source = setup_cell.setup_cell_source()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A page"),
                                         nbformat.v4.new_code_cell("import torch")])
    assert setup_cell.problems(nb, source) == ["cell 1 must be the setup cell"]
    setup_cell.fix(nb, source)
    assert nb.cells[1].metadata["tags"] == ["remove-cell"] and nb.cells[1].source == source
    assert nb.cells[2].source == "import torch"  # inserted before the imports
    assert setup_cell.problems(nb, source) == []
    nb.cells[1].metadata["tags"] = ["hide-output"]  # shown in the book: not allowed
    assert setup_cell.problems(nb, source) == [
        "the setup cell must be tagged exactly ['remove-cell']"]
    setup_cell.fix(nb, source)  # --write repairs it in place
    assert nb.cells[1].metadata["tags"] == ["remove-cell"] and len(nb.cells) == 3


def test_the_grader_runs_a_notebook_again_when_its_grading_cell_did_not_run(monkeypatch):
    import grade

    calls = []
    passed = {"f": {"result": "pass", "report": "f: passed"}}

    def flaky(*args):
        calls.append(args)
        if len(calls) == 1:  # e.g. a kernel that failed to start
            return grade.Run(grade.Status.NOT_GRADED, detail="RuntimeError: Kernel died")
        return grade.Run(grade.Status.OK, passed)

    monkeypatch.setattr(grade, "_run_one", flaky)
    assert grade._run_with_retry("nb.ipynb", None, 10, ROOT, []) == grade.Run(
        grade.Status.OK, passed)
    assert len(calls) == 2

    calls.clear()
    monkeypatch.setattr(grade, "_run_one",
                        lambda *args: (calls.append(1), grade.Run(grade.Status.TIME_LIMIT))[1])
    assert grade._run_with_retry("nb.ipynb", None, 10, ROOT, []).status is grade.Status.TIME_LIMIT
    assert len(calls) == 1  # a time limit is the notebook's own: not run again


def test_page_stats_counts_prose_and_leaves_code_and_math_out():
    markdown = ("## A section\n\nTwo words.\n\n```python\nx = many + words + here\n```\n\n"
                "$$\na + b\n$$\n\n```{exercise} Core: three more\n:label: x-ex-y\n\nFour more words here.\n```")
    # "A section", "Two words", the exercise's title and its text: 2 + 2 + 3 + 4
    assert page_stats.prose_words(markdown) == 11


@pytest.mark.parametrize("stem", [p for pages in chapter_pages().values() for p in pages
                                  if p not in page_stats.WHOLE])
def test_every_page_is_one_sitting_with_its_own_opening(stem):
    """A page's prose stays near 4,500 words (a little slack for an edit), it opens with
    what the reader will be able to do, and it has an exercise on its own material."""
    page = page_stats.measure(ROOT / "chapters" / f"{stem}.ipynb")
    assert page.words <= 4800, f"{stem}: {page.words} words; split it (CONTRIBUTING.md)"
    assert page.opening, f"{stem} has no 'After this page you can' list"
    assert page.exercises, f"{stem} has no exercise"


@pytest.mark.parametrize("mutant", chapter_mutants.MUTANTS, ids=lambda m: m.name)
def test_each_chapter_mutant_still_applies_to_the_library(mutant, tmp_path):
    """A planted bug whose text left the source would no longer plant anything: each edit
    must match exactly once in its file, change it, and name pages that exist."""
    library = tmp_path / "transformer_lib"
    (library / mutant.file).parent.mkdir(parents=True)
    original = (ROOT / "transformer_lib" / mutant.file).read_text(encoding="utf-8")
    (library / mutant.file).write_text(original, encoding="utf-8")
    chapter_mutants.apply(mutant, library)
    assert (library / mutant.file).read_text(encoding="utf-8") != original
    assert all((ROOT / "chapters" / f"{page}.ipynb").exists() for page in mutant.pages)


def test_a_chapter_mutant_that_does_not_match_is_refused(tmp_path):
    mutant = chapter_mutants.Mutant("x", "nothing", "a.py", "absent", "y", ("00_setup",))
    (tmp_path / "a.py").write_text("present\n", encoding="utf-8")
    with pytest.raises(ValueError, match="occurs 0 times"):
        chapter_mutants.apply(mutant, tmp_path)
