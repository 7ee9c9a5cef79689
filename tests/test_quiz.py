"""The self-check quizzes (_ext/quiz.py): the ``{quiz}`` directive read and drawn by Sphinx
in a tiny book of one notebook, its errors, and the rule for a numeric answer."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import quiz  # noqa: E402  (the book's Sphinx extension, not a package)

GLUE = "application/papermill.record/text/plain"

CHOICE = r"""```{quiz}
:answer: 2

**1.** What weights does the softmax give the scores $[0, 0]$?

- $[1, 0]$

  That is an argmax: the softmax shares the weight.
- $[0.5, 0.5]$

  Right: equal scores share the weight equally.
```"""

NUMBER = r"""```{quiz}
:key: quiz_half
:digits: 2

How much weight does each of two equal scores get?

- 1

  That is the sum of both.
```"""


def _notebook(cells: list[str], glued: dict[str, float]) -> dict:
    code = {"cell_type": "code", "execution_count": 1, "id": "keys", "metadata": {},
            "source": "glue(...)",
            "outputs": [{"output_type": "display_data", "data": {GLUE: repr(value)},
                         "metadata": {"scrapbook": {"name": name,
                                                    "mime_prefix": GLUE[:-len("text/plain")]}}}
                        for name, value in glued.items()]}
    markdown = [{"cell_type": "markdown", "id": f"m{i}", "metadata": {}, "source": text}
                for i, text in enumerate(["# Page", *cells])]
    return {"cells": [*markdown, code], "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}


def build(tmp_path: Path, cells: list[str], glued: dict[str, float] | None = None,
          builder: str = "html") -> str:
    """Build a book of one notebook holding ``cells``; the page's HTML (or raise)."""
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / '_ext')!r})\n"
        "extensions = ['myst_nb', 'quiz']\nnb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['dollarmath']\n", encoding="utf-8")
    (src / "index.ipynb").write_text(json.dumps(_notebook(cells, glued or {})),
                                     encoding="utf-8")
    out = tmp_path / "out"
    app = Sphinx(str(src), str(src), str(out), str(tmp_path / "doctrees"), builder,
                 status=None, warning=None, freshenv=True)
    app.build()
    return (out / "index.html").read_text(encoding="utf-8") if builder == "html" else ""


def test_choice_quiz_is_a_form_with_feedback_per_answer(tmp_path):
    page = build(tmp_path, [CHOICE])
    form = re.search(r'<form class="quiz quiz-choice".*?</form>', page, re.S).group(0)
    assert 'data-answer="2"' in form and 'data-msg-check="Check"' in form
    assert form.count('type="radio"') == 2
    assert len(re.findall(r'<label for="quiz-1-\d">', form)) == 2
    assert 'role="radiogroup"' in form and 'aria-live="polite"' in form
    explains = re.findall(r'<div class="quiz-explain" data-choice="(\d)" hidden>(.*?)</div>',
                          form, re.S)
    assert [n for n, _ in explains] == ["1", "2"]
    assert "argmax" in explains[0][1] and "share the weight equally" in explains[1][1]
    # The choice's paragraph is the label's content, without a <p> inside the <label>.
    assert "<label" in form and not re.search(r"<label[^>]*><p>", form)
    assert "quiz.js" in page and "quiz.css" in page


def test_numeric_quiz_takes_its_key_from_the_glued_value(tmp_path):
    page = build(tmp_path, [NUMBER], {"quiz_half": 0.5})
    form = re.search(r'<form class="quiz quiz-number".*?</form>', page, re.S).group(0)
    assert 'data-key="0.5"' in form and 'data-shown="0.50"' in form
    assert 'data-key-name="quiz_half"' in form
    tolerance = float(re.search(r'data-tolerance="([^"]+)"', form).group(1))
    assert tolerance == pytest.approx(0.005)
    assert 'data-value="1.0"' in form and 'inputmode="decimal"' in form


@pytest.mark.parametrize("text, problem", [
    (CHOICE.replace(":answer: 2\n", ""), "no right answer"),
    (CHOICE.replace(":answer: 2", ":answer: 3"), ":answer: 3 but the quiz has only 2"),
    (CHOICE.replace("\n  That is an argmax: the softmax shares the weight.\n", ""),
     "choice 1 has no feedback"),
    (NUMBER.replace("- 1\n", "- one\n"), "must be a number"),
    (CHOICE.replace(":answer: 2", ":answer: 2\n:key: quiz_half"), "not both"),
])
def test_a_quiz_without_a_right_answer_names_the_page_and_the_quiz(tmp_path, text, problem):
    with pytest.raises(quiz.QuizError, match=re.escape(problem)) as error:
        build(tmp_path, [CHOICE, text], {"quiz_half": 0.5})
    assert "index: quiz 2 (" in str(error.value)


def test_a_numeric_quiz_whose_key_is_not_glued_names_the_page_and_the_quiz(tmp_path):
    with pytest.raises(quiz.QuizError, match=r"index: quiz 1 \('How much weight.*"
                       r":key: 'quiz_half' is not glued"):
        build(tmp_path, [NUMBER])


def test_extraction_needs_no_executed_key(tmp_path):
    build(tmp_path, [NUMBER], builder="gettext")  # nothing executed: no key, no error
    catalog = (tmp_path / "out" / "index.pot").read_text(encoding="utf-8")
    for message in ("How much weight does each of two equal scores get?",
                    "That is the sum of both."):
        assert f'msgid "{message}"' in catalog


@pytest.mark.parametrize("answer, right", [(0.5, True), (0.504, True), (0.496, True),
                                           (0.506, False), (0.49, False)])
def test_a_numeric_answer_is_right_within_half_a_unit_of_the_last_decimal(answer, right):
    assert quiz.is_right(answer, 0.5, quiz.tolerance_for(2)) is right


def test_an_integer_answer_must_be_exact():
    tolerance = quiz.tolerance_for(0)
    assert quiz.is_right(448, 448, tolerance) and not quiz.is_right(447, 448, tolerance)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _chapters_with_quizzes() -> dict[str, list]:
    import quizzes

    return quizzes.chapter_quizzes()


@pytest.mark.parametrize("folder", ["exercises", "zh/exercises"])
def test_student_copies_keep_questions_and_choices_without_keys(folder):
    for page, found in _chapters_with_quizzes().items():
        cells = _cells(ROOT / folder / f"{page}.ipynb")
        markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert "{quiz}" not in markdown and ":answer:" not in markdown, page
        assert not any("quiz-keys" in c["metadata"].get("tags", []) for c in cells), page
        assert "quiz_key(" not in "\n".join("".join(c["source"]) for c in cells), page
        if folder == "exercises":
            flat = " ".join(markdown.split())  # a choice may wrap over indented lines
            for quiz_ in found:
                assert quiz_.question in markdown, page
                for shown, feedback in quiz_.answers:
                    assert feedback.split("\n")[0] not in markdown, (page, feedback)
                    if not quiz_.numeric:
                        assert " ".join(f"- {shown}".split()) in flat, (page, shown)


def test_a_chapter_with_quizzes_has_a_numeric_one_and_its_keys_cell():
    for page, found in _chapters_with_quizzes().items():
        assert any(quiz_.numeric for quiz_ in found), f"{page}: no numeric quiz"
        cells = _cells(ROOT / "chapters" / f"{page}.ipynb")
        keys = [c for c in cells if "quiz-keys" in c["metadata"].get("tags", [])]
        assert len(keys) == 1 and "remove-cell" in keys[0]["metadata"]["tags"], page
        for quiz_ in found:
            if quiz_.numeric:
                assert f'quiz_key("{quiz_.options["key"]}"' in "".join(keys[0]["source"]), page


@pytest.mark.parametrize("folder", ["colab/chapters", "colab/zh/chapters"])
def test_colab_copies_fold_the_answer_and_the_feedback(folder):
    for page, found in _chapters_with_quizzes().items():
        text = "\n".join("".join(c["source"]) for c in _cells(ROOT / folder / f"{page}.ipynb")
                         if c["cell_type"] == "markdown")
        assert "{quiz}" not in text
        assert text.count("<details>") >= 2 * len(found), page  # the quiz's and the answer's
        if folder == "colab/chapters":
            for quiz_ in found:
                if quiz_.numeric:
                    assert f"`{quiz_.options['key']}`" in text
                else:
                    assert "The answer is choice " + quiz_.options["answer"] in text


def test_quiz_key_glues_in_the_book_prints_elsewhere_and_refuses_a_bad_key(monkeypatch, capsys):
    """transformer_lib.quiz.quiz_key: glued where myst_nb is (the book build), printed where
    it is not (Jupyter, Colab), and a key that no quiz could use is a clear ValueError."""
    import sys
    import types

    from transformer_lib.quiz import quiz_key

    glued = []
    fake = types.ModuleType("myst_nb")
    fake.glue = lambda name, value, display=True: glued.append((name, value, display))
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    assert quiz_key("quiz_half", 0.5) == 0.5
    assert glued == [("quiz_half", 0.5, False)] and capsys.readouterr().out == ""
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # not installed
    assert quiz_key("quiz_bytes", 24576) == 24576
    assert capsys.readouterr().out == "quiz_bytes = 24576\n" and len(glued) == 1
    for name, value, words in (("quiz half", 1.0, "identifier"), ("quiz_nan", float("nan"),
                               "finite"), ("quiz_text", "3", "finite"), ("quiz_bool", True,
                               "finite")):
        with pytest.raises(ValueError, match=words):
            quiz_key(name, value)
