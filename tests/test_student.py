"""Exercises and their student copies (``make student``, ``tools/make_student.py``).

The chapters hold the exercises with their solutions; ``exercises/`` holds the committed
student copies. These tests check that the copies are current; that no line of a solution
or of a self-check answer reaches them; that every exercise follows the four-cell pattern
(task, hidden reference, hidden check, folded solution whose code is kept equal to the
reference); that what a copy adds (stubs, checks, the cells using them) runs and reports
every exercise as not attempted yet; that the generator refuses what it cannot strip
cleanly; and that the book numbers the exercises, shows the reference code only in the folded solutions and no checker verdict.
"""
from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize
from html.parser import HTMLParser

import nbformat
import pytest

import make_student  # tools/make_student.py
import setup_cell  # tools/setup_cell.py
from book_support import ROOT, config, ensure_built_book, toc_docnames
from notebook_smoke import exercise_cells, smoke_notebook

CHAPTERS = ROOT / "chapters"
EXERCISES = ROOT / "exercises"
CHAPTER_PATHS = sorted(CHAPTERS.glob("*.ipynb"))
EXERCISE_CHAPTERS = [p for p in CHAPTER_PATHS
                     if "{exercise}" in p.read_text(encoding="utf-8")]

LEAK_MIN = 25  # a solution or answer line this long (stripped) must not reach a student copy
DIFFICULTIES = ("Warm-up:", "Core:", "Challenge:")
HIDDEN = "remove-cell"  # the tag of an exercise's reference cell and of its check cell
_MARKERS = (make_student.BEGIN, make_student.END)
_FENCE_OR_OPTION = re.compile(r"^(`{3,}|~{3,}|:{3,}).*$|^:[\w-]+:")
_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{([\w-]+)\}\s*(.*)$")
_CHECK_LINE = re.compile(r"^assert check_\w+\(\w+\)$")


def _ids(paths):
    return [p.name for p in paths]


def _read(path):
    return nbformat.read(path, as_version=4)


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


# What counts as a solution ----------------------------------------------------------------


def _is_solution_cell(cell) -> bool:
    """A Markdown cell that opens with a ``{solution}`` directive."""
    if cell.cell_type != "markdown" or not cell.source.strip():
        return False
    opening = _DIRECTIVE.match(cell.source.strip().split("\n")[0])
    return bool(opening) and opening.group(2) == "solution"


def _code_without_comment(line: str) -> str:
    """``line`` without its trailing ``#`` comment (the line itself if it does not tokenize)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return line.strip()
    for token in tokens:
        if token.type == tokenize.COMMENT:
            return line.strip()[: token.start[1]].rstrip()
    return line.strip()


def _region_lines(source: str) -> tuple[list[str], list[str]]:
    """The lines of a code cell inside its solution regions, and those outside (the stub)."""
    inside, outside, is_in = [], [], False
    for line in source.split("\n"):
        if line.strip() in _MARKERS:
            is_in = line.strip() == make_student.BEGIN
        elif is_in:
            inside.append(line)
        else:
            outside.append(line)
    return inside, outside


def _python_blocks(markdown: str) -> list[list[str]]:
    """The fenced ``python`` blocks of a Markdown text, each as its list of lines."""
    blocks, current, fence = [], None, None
    for line in markdown.split("\n"):
        if current is None:
            opening = re.match(r"^(`{3,})\s*(python|py|python3)\s*$", line.strip())
            if opening:
                current, fence = [], opening.group(1)
        elif line.strip() == fence:
            blocks.append(current)
            current = None
        else:
            current.append(line)
    return blocks


def secret_lines(nb) -> dict[str, set[str]]:
    """What a student copy of ``nb`` must not contain, stripped, ``LEAK_MIN`` characters or
    more, fence and option lines left out: ``"code"``, the lines inside the solution regions
    (each also without its comment); ``"prose"``, every line of the ``{solution}`` cells (code
    and text) except the lines of the stubs that the copy keeps, and every line of the cells
    tagged ``answer``."""
    stub_lines = set()
    code, prose = set(), set()
    for cell in nb.cells:
        if cell.cell_type == "code" and make_student.BEGIN in cell.source:
            inside, outside = _region_lines(cell.source)
            stub_lines |= {line.strip() for line in outside}
            for line in inside:
                code |= {line.strip(), _code_without_comment(line)}
    for cell in nb.cells:
        if _is_solution_cell(cell) or "answer" in _tags(cell):
            prose |= {line.strip() for line in cell.source.split("\n")
                      if line.strip() not in stub_lines}

    def keep(lines):
        return {line for line in lines
                if len(line) >= LEAK_MIN and not _FENCE_OR_OPTION.match(line)}

    return {"code": keep(code), "prose": keep(prose)}


def leaks(source_nb, student_nb) -> list[str]:
    """Each line of ``student_nb`` that contains a secret line of ``source_nb``, with it."""
    secrets = secret_lines(source_nb)
    every = secrets["code"] | secrets["prose"]
    found = []
    for index, cell in enumerate(student_nb.cells):
        for line in cell.source.split("\n"):
            hits = [secret for secret in every if secret in line]
            if hits:
                found.append(f"cell {index}: {line.strip()!r} holds {hits[0]!r}")
    return found


def docstring_leaks(source_nb, student_nb) -> list[str]:
    """Docstrings of the stubs in ``student_nb`` that hold a line of a solution: one of
    ``LEAK_MIN`` characters or more, or the code of a line of a solution region (12
    characters or more once spaces are taken out)."""
    secrets = secret_lines(source_nb)
    code = set()
    for cell in source_nb.cells:
        if cell.cell_type == "code":
            for line in _region_lines(cell.source)[0]:
                squeezed = re.sub(r"\s+", "", _code_without_comment(line))
                if len(squeezed) >= 12:
                    code.add(squeezed)
    found = []
    for index, cell in enumerate(student_nb.cells):
        if cell.cell_type != "code" or make_student.STUB[0] not in cell.source:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node) or ""
            squeezed = re.sub(r"\s+", "", doc)
            hits = [s for s in secrets["code"] | secrets["prose"] if s in doc]
            hits += [s for s in code if s in squeezed]
            if hits:
                found.append(f"cell {index}, docstring of {node.name}: holds {hits[0]!r}")
    return found


# The pattern of an exercise ---------------------------------------------------------------


def _directive(cell):
    """``(fence, name, argument, options, body)`` of a Markdown cell that is exactly one
    directive, else None."""
    if cell.cell_type != "markdown":
        return None
    lines = cell.source.strip().split("\n")
    opening = _DIRECTIVE.match(lines[0]) if lines else None
    if not opening or len(lines) < 2 or lines[-1].strip() != opening.group(1):
        return None
    options, body = {}, lines[1:-1]
    while body and re.match(r"^:[\w-]+:", body[0]):
        key, _, value = body.pop(0)[1:].partition(":")
        options[key] = value.strip()
    return opening.group(1), opening.group(2), opening.group(3).strip(), options, body


def exercise_problems(nb, name: str = "<notebook>") -> list[str]:
    """What in ``nb`` breaks the four-cell pattern of an exercise (an empty list if nothing):
    the ``{exercise}`` cell, titled by difficulty; its reference cell with the markers and
    its check cell, both tagged ``remove-cell``; its ``{solution}`` cell, folded, whose
    ``python`` block is the reference cell without its two marker lines."""
    problems = []
    placed = set()  # indexes of the cells that belong to an exercise
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or "{exercise}" not in cell.source:
            continue
        where = f"{name}, exercise in cell {i}"
        parsed = _directive(cell)
        if parsed is None or parsed[1] != "exercise":
            problems.append(f"{where}: the cell is not exactly one {{exercise}} directive")
            continue
        _, _, title, options, _ = parsed
        label = options.get("label")
        if not title.startswith(DIFFICULTIES):
            problems.append(f"{where}: the title {title!r} does not start with one of "
                            f"{', '.join(DIFFICULTIES)}")
        if not label:
            problems.append(f"{where}: no :label:")
        if i + 3 >= len(cells):
            problems.append(f"{where}: fewer than three cells follow it")
            continue
        reference, check, solution = cells[i + 1], cells[i + 2], cells[i + 3]
        placed |= {i + 1, i + 2, i + 3}
        if reference.cell_type != "code" or make_student.BEGIN not in reference.source:
            problems.append(f"{where}: the next cell is not the code cell with the markers")
        elif HIDDEN not in _tags(reference):
            problems.append(f"{where}: the reference cell is not tagged {HIDDEN!r}")
        check_lines = [line.strip() for line in check.source.split("\n") if line.strip()]
        if (check.cell_type != "code" or not check_lines
                or not all(_CHECK_LINE.match(line) for line in check_lines)):
            problems.append(f"{where}: the second cell after it is not "
                            "`assert check_<name>(<name>)`")
        elif HIDDEN not in _tags(check):
            problems.append(f"{where}: the check cell is not tagged {HIDDEN!r}")
        parsed = _directive(solution)
        if parsed is None or parsed[1] != "solution" or parsed[2] != label:
            problems.append(f"{where}: the third cell after it is not the "
                            f"{{solution}} {label} directive")
            continue
        fence, _, _, options, body = parsed
        if "dropdown" not in options.get("class", "").split():
            problems.append(f"{where}: the solution has no `:class: dropdown`")
        blocks = _python_blocks("\n".join(body))
        if not blocks:
            problems.append(f"{where}: the solution holds no ```python block")
        elif reference.cell_type == "code":
            if len(fence) <= 3 and fence.startswith("`"):
                problems.append(f"{where}: the solution's fence must be longer than the "
                                "inner ``` of its python block (````{solution} ...)")
            shown = [line.rstrip() for line in blocks[0]]
            expected = [line.rstrip() for line in reference.source.strip("\n").split("\n")
                        if line.strip() not in _MARKERS]
            while shown and not shown[-1]:
                shown.pop()
            if shown != expected:
                first = next((n for n, (a, b) in enumerate(zip(shown, expected)) if a != b),
                             min(len(shown), len(expected)))
                problems.append(f"{where}: the solution's code differs from the reference "
                                f"cell without its markers, from line {first + 1}")
    for i, cell in enumerate(cells):
        if i in placed:
            continue
        if make_student.PASTE_TAG in _tags(cell):  # a capstone's functions of earlier chapters
            if HIDDEN not in _tags(cell) or make_student.BEGIN not in cell.source:
                problems.append(f"{name}, cell {i}: a `{make_student.PASTE_TAG}` cell must hold "
                                f"solution regions and be tagged {HIDDEN!r}")
            continue
        if cell.cell_type == "code" and make_student.BEGIN in cell.source:
            problems.append(f"{name}, cell {i}: a solution region outside an exercise")
        if cell.cell_type == "code" and re.search(r"^\s*assert check_", cell.source, re.M):
            problems.append(f"{name}, cell {i}: a check outside an exercise")
        if _is_solution_cell(cell):
            problems.append(f"{name}, cell {i}: a {{solution}} not right after its exercise")
    return problems


def answer_problems(nb, name: str = "<notebook>") -> list[str]:
    """Dropdowns outside the cells tagged ``answer``, and ``answer`` cells that are not one
    folded ``{admonition}``: an answer that is not tagged would reach the student copy."""
    problems = []
    for i, cell in enumerate(nb.cells):
        tagged = "answer" in _tags(cell)
        if tagged:
            parsed = _directive(cell)
            if (parsed is None or parsed[1] != "admonition"
                    or "dropdown" not in parsed[3].get("class", "").split()):
                problems.append(f"{name}, cell {i}: an `answer` cell must be one "
                                "{admonition} directive with `:class: dropdown`")
            continue
        if cell.cell_type != "markdown" or _is_solution_cell(cell):
            continue
        lines = cell.source.split("\n")
        for n, line in enumerate(lines):
            opening = _DIRECTIVE.match(line.strip())
            if not opening or opening.group(2) in ("exercise", "solution"):
                continue
            options = []
            for following in lines[n + 1:]:
                if not re.match(r"^:[\w-]+:", following.strip()):
                    break
                options.append(following.strip())
            folded = opening.group(2) in ("dropdown", "toggle") or any(
                o.startswith(":class:") and "dropdown" in o.split() for o in options)
            if folded or opening.group(2) == "admonition":
                problems.append(f"{name}, cell {i}: a {{{opening.group(2)}}} in a cell not "
                                "tagged `answer`")
    return problems


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
def test_no_solution_or_answer_line_reaches_the_student_copy(chapter):
    found = leaks(_read(chapter), _read(EXERCISES / chapter.name))
    assert not found, (f"exercises/{chapter.name} gives answers away (write the exercise so "
                       "that its solution is not a cell of the chapter):\n" + "\n".join(found))


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_no_stub_docstring_states_the_solution(chapter):
    found = docstring_leaks(_read(chapter), _read(EXERCISES / chapter.name))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_student_copy_has_stubs_and_plain_checks(chapter):
    source = _read(chapter)
    student = _read(EXERCISES / chapter.name)
    text = "\n".join(cell.source for cell in student.cells)
    source_text = "\n".join(cell.source for cell in source.cells)

    for forbidden in (make_student.BEGIN, make_student.END, "{solution}", "{admonition}",
                      "assert check_"):
        assert forbidden not in text
    assert not any({"instructor", "answer"} & set(_tags(c)) for c in student.cells)
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
    # The stubs and the checks are shown: no tag hides them.
    for cell in student.cells:
        if make_student.STUB[0] in cell.source or re.search(r"^check_\w+\(", cell.source, re.M):
            assert not set(_tags(cell)) & set(make_student.HIDING_TAGS), cell.source[:80]
    # The rest is kept: the title, the setup cell, and every exercise, numbered in order.
    assert student.cells[0].source == source.cells[0].source
    # The setup cell is the book's, pinned to the library version the copy was made with,
    # and the copy says which chapter it is and which exercises, by id (their labels).
    version = make_student.library_version()
    assert student.cells[1].source == setup_cell.setup_cell_source(ref=f"v{version}")
    assert student.cells[1].source != source.cells[1].source
    labels = re.findall(r"\{exercise\}.*\n:label: (\S+)", source_text)
    assert student.metadata["transformer_lib"] == {"chapter": chapter.stem, "version": version,
                                                   "exercises": labels}
    n_exercises = source_text.count("{exercise}")
    numbers = re.findall(r"^\*\*Exercise (\d+)", text, re.M)
    assert numbers == [str(i + 1) for i in range(n_exercises)]


@pytest.mark.parametrize("chapter", EXERCISE_CHAPTERS, ids=_ids(EXERCISE_CHAPTERS))
@pytest.mark.notebook
def test_student_copy_runs_and_reports_not_attempted(chapter):
    """What a student copy adds to its chapter runs, as a student would run it on receiving
    the copy: its stubs, its check cells and every cell that uses a stub's name, with the setup
    cell, the imports and whatever those cells need (``notebook_smoke.exercise_cells``; every
    other cell is the chapter's own, which the book build and nbval execute). No cell fails,
    and every checker says the exercise is not attempted yet. This is the only run of the
    copies (nbval does not collect exercises/: see test_student_copies_are_run_once)."""
    from nbclient import NotebookClient

    copy = _read(EXERCISES / chapter.name)
    seeds = exercise_cells(copy)
    checks = [i for i, c in enumerate(copy.cells)
              if c.cell_type == "code" and re.search(r"^(check_\w+)\(", c.source, re.M)]
    assert checks and set(checks) <= set(seeds), "a check cell would not run"
    nb = smoke_notebook(copy, seeds)
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


# The chapters' exercises and answers -------------------------------------------------------


@pytest.mark.parametrize("chapter", EXERCISE_CHAPTERS, ids=_ids(EXERCISE_CHAPTERS))
def test_every_exercise_follows_the_four_cell_pattern(chapter):
    problems = exercise_problems(_read(chapter), chapter.name)
    assert not problems, "\n".join(problems)


def test_exercise_labels_are_unique_in_the_book():
    labels = [label for path in CHAPTER_PATHS
              for label in re.findall(r"\{exercise\}.*\n:label: (\S+)",
                                      "\n".join(c.source for c in _read(path).cells))]
    assert len(labels) == len(set(labels)), sorted(labels)


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=_ids(CHAPTER_PATHS))
def test_every_folded_answer_sits_in_an_answer_cell(chapter):
    problems = answer_problems(_read(chapter), chapter.name)
    assert not problems, "\n".join(problems)


# The tests above, on small notebooks -------------------------------------------------------


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), *cells]
    return nb


_REFERENCE = ('def double(x):\n    """x times two, same shape."""\n    ### BEGIN SOLUTION\n'
              '    doubled = torch.add(x, x, alpha=1)  # adding is enough, no multiply\n'
              '    return doubled\n    ### END SOLUTION')


def _exercise(title="Warm-up: double it", tags=(HIDDEN,), check_tags=(HIDDEN,),
              fold=None, solution_class="dropdown"):
    shown = "\n".join(line for line in _REFERENCE.split("\n") if line.strip() not in _MARKERS)
    fold = shown if fold is None else fold
    return [
        nbformat.v4.new_markdown_cell(f"```{{exercise}} {title}\n:label: ex-double\n\n"
                                      "Write `double(x)`.\n```"),
        nbformat.v4.new_code_cell(_REFERENCE, metadata={"tags": list(tags)}),
        nbformat.v4.new_code_cell("assert check_double(double)",
                                  metadata={"tags": list(check_tags)}),
        nbformat.v4.new_markdown_cell(f"````{{solution}} ex-double\n:class: {solution_class}\n\n"
                                      f"```python\n{fold}\n```\n\nAdding a tensor to itself "
                                      "doubles every entry of it.\n````"),
    ]


def _answer(text="The answer is forty-two, as everyone knows.", tags=("answer",)):
    return nbformat.v4.new_markdown_cell(
        f"```{{admonition}} Answer\n:class: dropdown\n\n{text}\n```", metadata={"tags": list(tags)})


def test_the_pattern_test_accepts_a_good_exercise_and_names_each_fault():
    assert exercise_problems(_notebook(*_exercise())) == []
    for kwargs, fault in [
        ({"title": "Easy: double it"}, "does not start with one of"),
        ({"tags": ("hide-input",)}, "reference cell is not tagged 'remove-cell'"),
        ({"check_tags": ()}, "check cell is not tagged 'remove-cell'"),
        ({"solution_class": "note"}, "no `:class: dropdown`"),
        ({"fold": "def double(x):\n    return 2 * x"}, "differs from the reference"),
    ]:
        problems = exercise_problems(_notebook(*_exercise(**kwargs)))
        assert len(problems) == 1 and fault in problems[0], (kwargs, problems)
    task, reference, check, solution = _exercise()
    assert "not right after" in exercise_problems(_notebook(task, reference, check,
                                                            _answer(), solution))[-1]


def test_the_leak_test_finds_a_solution_line_anywhere_in_the_copy():
    shown = nbformat.v4.new_code_cell("y = 1")
    nb = _notebook(shown, *_exercise(), nbformat.v4.new_markdown_cell("Question?"), _answer())
    assert leaks(nb, make_student.student_notebook(nb)) == []
    # The reference line shown above the exercise (with another comment), and a line of the
    # answer or of the solution's prose copied into the chapter: each one is found.
    for copied in ("z = 3\ndoubled = torch.add(x, x, alpha=1)  # the same code, another comment",
                   "Note: The answer is forty-two, as everyone knows.",
                   "As shown: Adding a tensor to itself doubles every entry of it."):
        nb.cells[1].source = copied
        found = leaks(nb, make_student.student_notebook(nb))
        assert len(found) == 1 and "cell 1" in found[0], (copied, found)
    # A docstring that states the solution.
    nb.cells[1].source = "y = 1"
    nb.cells[3].source = nb.cells[3].source.replace('x times two, same shape.',
                                                    "Returns doubled = torch.add(x, x, alpha=1).")
    assert docstring_leaks(nb, make_student.student_notebook(nb))


def test_the_answer_test_wants_every_fold_in_an_answer_cell():
    assert answer_problems(_notebook(_answer())) == []
    untagged = answer_problems(_notebook(_answer(tags=())))
    assert len(untagged) == 1 and "not tagged `answer`" in untagged[0]
    note = nbformat.v4.new_markdown_cell("Text.\n\n```{note}\n:class: dropdown\n\nHidden.\n```")
    assert answer_problems(_notebook(note))
    wrong = nbformat.v4.new_markdown_cell("Just text.", metadata={"tags": ["answer"]})
    assert "must be one {admonition}" in answer_problems(_notebook(wrong))[0]


# The generator refuses what it cannot strip cleanly ------------------------------------------


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


def test_answer_tag_on_a_code_cell_is_refused():
    nb = _notebook(nbformat.v4.new_code_cell("x = 42", metadata={"tags": ["answer"]}))
    with pytest.raises(make_student.MarkerError, match=r"x.ipynb, cell 1 .*not for a code cell"):
        make_student.student_notebook(nb, "x.ipynb")


def test_conversion_of_a_small_notebook():
    task, reference, check, solution = _exercise()
    reference.metadata["tags"] = ["remove-cell", "keep-me"]
    check.outputs = [nbformat.v4.new_output("stream", text="old output")]
    check.execution_count = 3
    nb = _notebook(nbformat.v4.new_code_cell("y = 1", metadata={"tags": ["remove-cell"]}),
                   task, reference, check, solution,
                   nbformat.v4.new_markdown_cell("**1.** Why?"), _answer(),
                   nbformat.v4.new_code_cell("assert not check_double(str)",
                                             metadata={"tags": ["instructor", "remove-cell"]}))
    student = make_student.student_notebook(nb, "x.ipynb")
    assert [c.source for c in student.cells] == [
        "# Title",
        "y = 1",
        "**Exercise 1 (Warm-up: double it)**\n\nWrite `double(x)`.",
        'def double(x):\n    """x times two, same shape."""\n    # YOUR CODE HERE\n'
        "    raise NotImplementedError()",
        "check_double(double)",
        "**1.** Why?",
    ]
    # Only the stub and the check are shown; any other hidden cell stays hidden.
    assert student.cells[1].metadata["tags"] == ["remove-cell"]
    assert student.cells[3].metadata["tags"] == ["keep-me"]
    assert "tags" not in student.cells[4].metadata
    assert student.cells[4].outputs == [] and student.cells[4].execution_count is None
    assert len(nb.cells) == 9 and make_student.BEGIN in nb.cells[3].source  # source untouched
    assert nb.cells[3].metadata["tags"] == ["remove-cell", "keep-me"]


_CLASS_REFERENCE = '''class Scaler(torch.nn.Module):
    """Multiplies its input by a factor."""

    def __init__(self, factor: float = 2.0):
        """Keep the factor."""
        ### BEGIN SOLUTION
        super().__init__()
        self.factor = factor  # kept for forward
        ### END SOLUTION

    def forward(self, x):
        """x times the factor, same shape."""
        ### BEGIN SOLUTION
        return torch.mul(x, self.factor)  # a product, not a sum
        ### END SOLUTION'''


def test_a_class_exercise_keeps_its_outline_and_every_method_becomes_the_stub():
    nb = _notebook(nbformat.v4.new_code_cell(_CLASS_REFERENCE, metadata={"tags": [HIDDEN]}),
                   nbformat.v4.new_code_cell("assert check_scaler(Scaler)"))
    student = make_student.student_notebook(nb, "x.ipynb")
    assert student.cells[1].source == (
        'class Scaler(torch.nn.Module):\n    """Multiplies its input by a factor."""\n\n'
        '    def __init__(self, factor: float = 2.0):\n        """Keep the factor."""\n'
        '        # YOUR CODE HERE\n        raise NotImplementedError()\n\n'
        '    def forward(self, x):\n        """x times the factor, same shape."""\n'
        '        # YOUR CODE HERE\n        raise NotImplementedError()')
    assert student.cells[2].source == "check_scaler(Scaler)"
    (exercise,) = make_student.exercises(nb, "x.ipynb")
    assert (exercise.function, exercise.checker, exercise.cell) == ("Scaler", "check_scaler", 1)
    assert "super().__init__()" in exercise.solution and make_student.BEGIN not in exercise.solution
    assert leaks(nb, student) == [] and docstring_leaks(nb, student) == []


@pytest.mark.parametrize("change, problem, line", [
    (("        ### BEGIN SOLUTION\n        super().__init__()",
      "        super().__init__()\n        ### BEGIN SOLUTION"), "must be exactly one solution region", 6),
    (("        self.factor = factor  # kept for forward\n        ### END SOLUTION",
      "        ### END SOLUTION\n        self.factor = factor"), "must be exactly one solution region", 6),
    (("        ### BEGIN SOLUTION\n        super",
      "        # the parent first\n        ### BEGIN SOLUTION\n        super"),
     "must be exactly one solution region", 6),
    (("        ### BEGIN SOLUTION\n        return torch.mul(x, self.factor)  # a product, not a sum\n"
      "        ### END SOLUTION", "        return torch.mul(x, self.factor)"),
     "the body of Scaler.forward after its docstring", 13),
    (('        """x times the factor, same shape."""\n', ""), "Scaler.forward has no docstring", 11),
    (('    """Multiplies its input by a factor."""\n',
      '    """Multiplies its input by a factor."""\n    default = 2.0\n'),
     "holds something other than its docstring and methods", 3),
], ids=["code-before-the-region", "code-after-the-region", "a-comment-before-the-region",
        "a-method-without-a-region", "a-method-without-a-docstring", "a-class-attribute"])
def test_a_class_exercise_whose_code_would_reach_the_copy_is_refused(change, problem, line):
    old, new = change
    assert old in _CLASS_REFERENCE
    nb = _notebook(nbformat.v4.new_code_cell(_CLASS_REFERENCE.replace(old, new)))
    with pytest.raises(make_student.MarkerError, match=rf"x\.ipynb, cell 1 .*line {line}: "
                                                       rf".*{re.escape(problem)}"):
        make_student.student_notebook(nb, "x.ipynb")


# Not in the book, but run by the tests --------------------------------------------------------


def test_student_copies_are_not_part_of_the_book():
    cfg = config()
    assert cfg["only_build_toc_files"] is True
    assert "exercises" in cfg["exclude_patterns"]
    assert not any(d.startswith("exercises/") for d in toc_docnames())
    assert "sphinx_exercise" in cfg["sphinx"]["extra_extensions"]


def test_student_copies_are_run_once():
    """Every copy in exercises/ is executed by test_student_copy_runs_and_reports_not_attempted,
    and by nothing else: nbval, which runs the notebooks in the folders `make test` names
    (NOTEBOOK_DIRS in the Makefile) and pytest's testpaths, is not pointed at exercises/."""
    import tomllib

    pytest_config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_config = pytest_config["tool"]["pytest"]["ini_options"]
    (dirs,) = re.findall(r"^NOTEBOOK_DIRS\s*:=(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert "$(NOTEBOOK_DIRS)" in (ROOT / "Makefile").read_text(), "make test runs no notebook"
    collected = [ROOT / path for path in [*pytest_config["testpaths"], *dirs.split()]]
    assert ROOT / "chapters" in collected, f"nbval would not run the chapters: {collected}"
    assert not any(EXERCISES.is_relative_to(path) or path.is_relative_to(EXERCISES)
                   for path in collected), f"nbval would run exercises/ again: {collected}"
    assert "exercises" not in pytest_config["addopts"]

    (parametrize,) = [mark for mark in test_student_copy_runs_and_reports_not_attempted.pytestmark
                      if mark.name == "parametrize"]
    run = sorted(EXERCISES / chapter.name for chapter in parametrize.args[1])
    # A copy of a page without exercises adds nothing to run: its page runs in nbval.
    with_exercises = sorted(copy for copy in EXERCISES.glob("*.ipynb")
                            if "{exercise}" in (CHAPTERS / copy.name).read_text("utf-8"))
    assert run == with_exercises, "a student copy is not run"
    assert len(run) == len(set(run)), "a student copy is run twice"


# The built page -----------------------------------------------------------------------------


class _Folds(HTMLParser):
    """The text of a page outside its solution folds, and inside each fold its code blocks."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.outside: list[str] = []
        self.folds: list[dict] = []
        self._depth = 0  # open <div>s
        self._fold_depth = None  # the depth at which the open fold started
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        if tag == "div":
            self._depth += 1
            classes = (dict(attrs).get("class") or "").split()
            if self._fold_depth is None and {"solution", "admonition"} <= set(classes):
                self._fold_depth = self._depth
                self.folds.append({"text": [], "code": [], "dropdown": "dropdown" in classes})
        elif tag == "pre" and self._fold_depth is not None:
            self._in_pre = True
            self.folds[-1]["code"].append("")

    def handle_endtag(self, tag):
        if tag == "div":
            if self._fold_depth == self._depth:
                self._fold_depth = None
            self._depth -= 1
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data):
        if self._fold_depth is None:
            self.outside.append(data)
        else:
            self.folds[-1]["text"].append(data)
            if self._in_pre:
                self.folds[-1]["code"][-1] += data


@pytest.mark.book
@pytest.mark.parametrize("chapter", EXERCISE_CHAPTERS, ids=_ids(EXERCISE_CHAPTERS))
def test_book_numbers_the_exercises_and_folds_the_solutions(chapter):
    html = ensure_built_book()
    page = (html / "chapters" / f"{chapter.stem}.html").read_text(encoding="utf-8")
    nb = _read(chapter)
    n = "\n".join(c.source for c in nb.cells).count("{exercise}")
    # "Exercise 3", or "Exercise 2.3" in a numbered chapter; a page under a chapter (the
    # capstone, 07d, and the later pages of a split chapter) goes on counting its chapter's exercises.
    numbers = [int(i) for i in re.findall(
        r'<span class="caption-number">Exercise (?:[\d.]+\.)?(\d+) </span>', page)]
    first = 1 if re.fullmatch(r"\d\d_\D.*", chapter.stem) else (numbers or [1])[0]
    assert numbers == list(range(first, first + n)), numbers
    parsed = _Folds()
    parsed.feed(page)
    assert len(parsed.folds) == n and all(fold["dropdown"] for fold in parsed.folds)
    # Nothing outside the folds gives a solution away: no reference code (the markers),
    # no checker's verdict under the task.
    outside = "".join(parsed.outside)
    assert make_student.BEGIN not in page and make_student.END not in page
    assert "checks passed" not in outside
    # Each fold shows its exercise's reference code, as executed (without the markers).
    references = [cell for cell in nb.cells
                  if cell.cell_type == "code" and make_student.BEGIN in cell.source
                  and make_student.PASTE_TAG not in _tags(cell)]
    assert len(references) == n
    for fold, reference in zip(parsed.folds, references):
        expected = "\n".join(line for line in reference.source.strip("\n").split("\n")
                             if line.strip() not in _MARKERS)
        assert any(code.strip("\n") == expected for code in fold["code"]), \
            f"the fold does not show the reference code:\n{expected[:200]}"
    assert not (html / "exercises").exists()


# The appendix page that hands out the copies --------------------------------------------------


def test_exercise_page_is_up_to_date_and_links_every_copy():
    import exercise_page

    page = (ROOT / "appendix" / "exercise_notebooks.md").read_text(encoding="utf-8")
    assert page == exercise_page.page_text(), "run `make student` (tools/exercise_page.py)"
    url, branch = exercise_page.repository()
    links = re.findall(r"\]\((https://colab\.research\.google\.com/github/[^)]+)\)", page)
    prefix = f"https://colab.research.google.com/github/{url.removeprefix('https://github.com/')}"
    linked = []
    for link in links:
        assert link.startswith(f"{prefix}/blob/{branch}/"), link
        path = link.removeprefix(f"{prefix}/blob/{branch}/")
        assert (ROOT / path).is_file(), f"{link} points at no file of the repository"
        linked.append(path)
    copies = sorted(f"exercises/{p.name}" for p in EXERCISES.glob("*.ipynb"))
    assert sorted(linked) == copies, "one Colab link per student notebook, and no other"
    assert "appendix/exercise_notebooks" in toc_docnames()
    intro = (ROOT / "intro.md").read_text(encoding="utf-8")
    assert "(appendix/exercise_notebooks.md)" in intro, "the intro's instructors point to it"


def test_the_core_track_lists_core_exercises_that_exist():
    """The instructors' page names every exercise of its core track: each is an exercise of
    the chapter it names, titled Core, with a checker that refuses something."""
    from transformer_lib.checks import EXERCISE_RULES
    page = (ROOT / "appendix" / "instructors.md").read_text(encoding="utf-8")
    section = page.split("## The core track", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M)
    assert len(rows) == 17 and "seventeen exercises" in section
    from chapter_solutions import _notebook, chapter_exercises
    levels = {}
    for chapter, listed in chapter_exercises().items():
        cells = _notebook(chapter).cells
        for exercise in listed:
            level = re.search(r"\{exercise\} ([\w-]+):", cells[exercise.cell - 1].source)
            levels[exercise.function] = (int(chapter[:2]), level and level.group(1))
    for number, function in rows:
        assert levels.get(function) == (int(number), "Core"), function
        assert function in EXERCISE_RULES


def test_the_capstone_pastes_each_piece_as_its_chapter_wrote_it():
    """The capstone's ``paste`` cells hold the pieces the earlier chapters ask for, each the
    chapter's own reference cell, unchanged, so the book's capstone runs the solutions the
    book shows; and every function the capstone's solutions call by a piece's name is one."""
    from chapter_solutions import _notebook, chapter_exercises
    written = {e.function: _notebook(chapter).cells[e.cell].source
               for chapter, listed in chapter_exercises().items() if chapter != "07d_capstone"
               for e in listed}
    capstone = _read(CHAPTERS / "07d_capstone.ipynb")
    pasted = {}
    for cell in capstone.cells:
        if make_student.PASTE_TAG in _tags(cell):
            for piece in cell.source.split("\n\n\n"):
                name = re.match(r"(?:def|class) (\w+)", piece).group(1)
                pasted[name] = piece
    assert set(pasted) == {"masked_softmax", "attention", "rms_norm", "rope_half", "swiglu",
                           "decoder_block", "decoder_logits", "sampling_probs"}
    for name, piece in pasted.items():
        assert piece == written[name], f"{name} differs from its chapter's reference"
