"""Self-check quizzes that answer back: the ``{quiz}`` directive.

A quiz is a question the reader answers in the page, offline and without a kernel: a
multiple choice (radio buttons) or a number (a text field). Each answer the author foresees
has its own feedback, which names the misconception behind it. Its body is MyST, parsed as
the page is (math, roles, ``{glue:text}``), so Sphinx extracts its paragraphs for
translation like any other and a translated edition shows them translated::

    ```{quiz}
    :answer: 1

    **1.** A layer has $C = 1024$ and $H = 16$ heads. By what number does each head
    divide its scores?

    - 8

      Right: $D = 1024 / 16 = 64$, and $\\sqrt{64} = 8$.
    - 32

      That is $\\sqrt{C}$: the scale belongs to one head's width, not the model's.
    ```

The paragraphs before the list are the question; each item of the list is one answer: its
first paragraph is what the reader sees, the rest the feedback for choosing it.

- ``:answer: N``: a multiple choice whose right answer is item N (from 1).
- ``:key: NAME``: a numeric quiz whose key is the value the notebook glued as ``NAME``
  (``myst_nb.glue`` in an executed cell: a library call computes it when the book is built, so
  the key cannot be wrong). Its list items are foreseen wrong numbers and their feedback.
  ``:digits: N`` (default 0) is the number of decimals the question asks for: an answer is
  right when it is within half a unit of that last decimal of the key (``:tolerance: X``
  gives the margin instead), and the key is shown rounded to ``N`` decimals.

A quiz without ``:answer:`` or ``:key:``, with both, with an ``:answer:`` that is no item, a
choice without feedback or a key that is not glued raises a ``QuizError`` that names the page
and the quiz (its number on the page and the start of its question).

The buttons and messages (``UI_STRINGS``) are translated from one catalog per language,
``locales/<code>/LC_MESSAGES/quiz.po`` (``python tools/i18n messages update`` writes it), as
the explorers' words are from ``widgets.po``. The form is drawn by ``_assets/quiz.js`` and
``_assets/quiz.css``, added to the pages that have a quiz. tools/make_student.py keeps the
question and the choices in the student copies, without the key and the feedback;
tools/colab_copies.py writes a quiz as plain Markdown.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

CATALOG = "quiz.po"  # in each language's LC_MESSAGES (tools/i18n/messages.py, QUIZ)
# The quiz's own words, English, as the catalog's messages. ``{answer}`` is the key or the
# right choice's text.
UI_STRINGS = {
    "check": "Check",
    "show": "Show the answer",
    "number": "Your answer (a number)",
    "correct": "Correct.",
    "wrong": "Not quite.",
    "again": "Not quite: try again, or show the answer.",
    "answer": "The answer is {answer}.",
    "choose": "Choose an answer first.",
    "marked": "The right answer is now selected.",
    "nan": "Type a number, such as 0.25.",
    # The Colab copies (tools/colab_copies.py), where the quiz is plain Markdown.
    "colab_title": "Answer",
    "colab_choice": "The answer is choice {number}: {answer}",
    "colab_key": "The answer is the number `{key}`, which the code cell after the questions "
                 "computes with the library: run it to see it.",
}
ASSETS = ("quiz.js", "quiz.css")


class QuizError(ExtensionError):
    """A quiz that cannot be drawn: no right answer, no key, an answer without feedback."""


class quiz(nodes.General, nodes.Element):
    """A quiz: its question's nodes, then one ``quiz_answer`` per item of its list."""


class quiz_answer(nodes.General, nodes.Element):
    """One foreseen answer: its first child is the answer as shown, the rest its feedback."""


def _number(text: str) -> float | None:
    """A number as a reader types it (a comma as the decimal mark is fine), or None."""
    try:
        value = float(text.strip().replace(",", ".").replace("\u2212", "-"))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def tolerance_for(digits: int) -> float:
    """The margin of a numeric answer asked to ``digits`` decimals: half a unit of the last
    decimal, and a little more for the rounding of the key's own digits."""
    return 0.5 * 10.0 ** -digits * (1 + 1e-9)


def is_right(answer: float, key: float, tolerance: float) -> bool:
    """Whether a numeric answer is right (the rule quiz.js applies)."""
    return abs(answer - key) <= tolerance


def _summary(question: list[nodes.Node]) -> str:
    text = " ".join(node.astext() for node in question).split()
    return " ".join(text)[:50]


class QuizDirective(SphinxDirective):
    """``{quiz}``: see the module's docstring."""

    has_content = True
    option_spec = {
        "answer": directives.positive_int,
        "key": directives.unchanged_required,
        "digits": directives.nonnegative_int,
        "tolerance": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        number = self.env.new_serialno("quiz") + 1
        node = quiz()
        self.set_source_info(node)
        parsed = nodes.Element()
        self.state.nested_parse(self.content, self.content_offset, parsed)
        lists = [i for i, child in enumerate(parsed.children)
                 if isinstance(child, (nodes.bullet_list, nodes.enumerated_list))]
        question = parsed.children[:lists[-1]] if lists else list(parsed.children)
        where = f"{self.env.docname}: quiz {number} ({_summary(question)!r})"

        def fail(problem: str) -> QuizError:
            return QuizError(f"{where}, line {self.lineno}: {problem}")

        if not lists or not question:
            raise fail("a quiz is its question, then a list of its answers")
        items = parsed.children[lists[-1]]
        node["number"] = number
        node["where"] = where
        node += question
        for item in items.children:
            answer = quiz_answer()
            answer.source, answer.line = item.source, item.line
            answer += item.children
            node += answer
        answers = node.children[len(question):]
        if "answer" in self.options and "key" in self.options:
            raise fail("give :answer: (a choice) or :key: (a number), not both")
        if "answer" in self.options:
            node["kind"] = "choice"
            node["answer"] = self.options["answer"]
            if node["answer"] > len(answers):
                raise fail(f":answer: {node['answer']} but the quiz has only "
                           f"{len(answers)} choices")
            for index, answer in enumerate(answers, start=1):
                if len(answer.children) < 2:
                    raise fail(f"choice {index} has no feedback (a paragraph under it)")
        elif "key" in self.options:
            node["kind"] = "number"
            for index, answer in enumerate(answers, start=1):
                value = _number(answer.children[0].astext()) if answer.children else None
                if value is None or len(answer.children) < 2:
                    raise fail(f"answer {index} of a numeric quiz must be a number, then its "
                               "feedback")
                answer["value"] = value
            self._numeric_key(node, fail)
        else:
            raise fail("no right answer: give :answer: N (the right choice) or :key: NAME "
                       "(the glued value of a numeric quiz)")
        return [node]

    def _numeric_key(self, node: quiz, fail) -> None:
        digits = self.options.get("digits", 0)
        node["key_name"] = self.options["key"]
        node["digits"] = digits
        tolerance = tolerance_for(digits)
        if "tolerance" in self.options:
            given = _number(self.options["tolerance"])
            if given is None or given < 0:
                raise fail(f":tolerance: must be a number >= 0, not "
                           f"{self.options['tolerance']!r}")
            tolerance = given
        node["tolerance"] = tolerance
        if self.env.app.builder.name == "gettext":  # extraction: nothing was executed
            node["key"] = float("nan")
            return
        from myst_nb.core.variables import RetrievalError
        from myst_nb.ext.glue.utils import retrieve_glue_data

        try:
            data = retrieve_glue_data(self.state.document, node["key_name"])
        except RetrievalError:
            raise fail(f":key: {node['key_name']!r} is not glued in this notebook: glue it "
                       "in an executed cell (myst_nb.glue)") from None
        key = _number(str(data.data.get("text/plain", "")).strip("'\""))
        if key is None:
            raise fail(f"the glued value {node['key_name']!r} is not a number: "
                       f"{data.data.get('text/plain')!r}")
        node["key"] = key


# ---- HTML -------------------------------------------------------------------------------

def _words(translator: Any) -> dict[str, str]:
    app = translator.builder.app
    found = getattr(app, "quiz_translations", {})
    return {name: found.get(text, text) for name, text in UI_STRINGS.items()}


def _inline(translator: Any, node: nodes.Node) -> None:
    """Write a paragraph's content without its ``<p>`` (for a ``<label>``)."""
    children = node.children if isinstance(node, nodes.paragraph) else [node]
    for child in children:
        child.walkabout(translator)


def _shown_key(node: quiz) -> str:
    return f"{node['key']:.{node['digits']}f}"


def visit_quiz_html(translator: Any, node: quiz) -> None:
    words = _words(translator)
    ident = f"quiz-{node['number']}"
    question = [child for child in node.children if not isinstance(child, quiz_answer)]
    answers = [child for child in node.children if isinstance(child, quiz_answer)]
    attributes = {"class": f"quiz quiz-{node['kind']}", "id": ident,
                  "aria-labelledby": f"{ident}-question", "data-kind": node["kind"],
                  **{f"data-msg-{name}": text for name, text in words.items()
                     if not name.startswith("colab_")}}
    if node["kind"] == "choice":
        attributes["data-answer"] = str(node["answer"])
    else:
        attributes.update({"data-key-name": node["key_name"], "data-key": repr(node["key"]),
                           "data-tolerance":
                           repr(node["tolerance"]), "data-shown": _shown_key(node)})
    body = translator.body
    body.append("<form " + " ".join(f'{name}="{html.escape(value)}"'
                                    for name, value in attributes.items()) + ">\n")
    body.append(f'<div class="quiz-question" id="{ident}-question">\n')
    for child in question:
        child.walkabout(translator)
    body.append("</div>\n")
    if node["kind"] == "choice":
        body.append(f'<div class="quiz-choices" role="radiogroup" '
                    f'aria-labelledby="{ident}-question">\n')
        for index, answer in enumerate(answers, start=1):
            choice = f"{ident}-{index}"
            body.append(f'<div class="quiz-choice"><input type="radio" name="{ident}" '
                        f'id="{choice}" value="{index}" /><label for="{choice}">')
            _inline(translator, answer.children[0])
            body.append("</label></div>\n")
        body.append("</div>\n")
    else:
        body.append(f'<div class="quiz-number"><label for="{ident}-value">'
                    f'{html.escape(words["number"])}</label> <input type="text" '
                    f'inputmode="decimal" autocomplete="off" id="{ident}-value" '
                    f'name="{ident}" /></div>\n')
    body.append(f'<div class="quiz-buttons"><button type="submit" class="quiz-check">'
                f'{html.escape(words["check"])}</button> <button type="button" '
                f'class="quiz-show">{html.escape(words["show"])}</button></div>\n')
    body.append('<div class="quiz-feedback" role="status" aria-live="polite">'
                '<p class="quiz-verdict"></p>\n')
    for index, answer in enumerate(answers, start=1):
        value = f' data-value="{answer["value"]!r}"' if "value" in answer else ""
        body.append(f'<div class="quiz-explain" data-choice="{index}"{value} hidden>\n')
        for child in answer.children[1:]:
            child.walkabout(translator)
        body.append("</div>\n")
    body.append("</div>\n</form>\n")
    raise nodes.SkipNode


def _skip(translator: Any, node: nodes.Node) -> None:
    raise nodes.SkipNode


def add_assets(app: Sphinx, pagename: str, templatename: str, context: dict,
               doctree: Any) -> None:
    """The quiz's script and styles, on the pages that have a quiz."""
    if doctree is not None and next(iter(doctree.findall(quiz)), None) is not None:
        app.add_js_file("quiz.js", loading_method="defer")
        app.add_css_file("quiz.css")


# ---- translations -----------------------------------------------------------------------

def words(catalogs: Path | None) -> dict[str, str]:
    """``UI_STRINGS`` in a language, from its folder of catalogs (``locales/<code>/
    LC_MESSAGES``); English where there is no translation, or no folder."""
    from i18n_editions import load_catalog

    found = load_catalog(catalogs / CATALOG) if catalogs is not None else {}
    return {name: found.get(text, text) for name, text in UI_STRINGS.items()}


def _load(app: Sphinx) -> None:
    """This edition's translations of the quiz's words (none in the source edition)."""
    from i18n_editions import edition_catalog

    app.quiz_translations = edition_catalog(app, CATALOG)


def setup(app: Sphinx) -> dict:
    app.setup_extension("i18n_editions")  # the list of languages
    app.add_node(quiz, html=(visit_quiz_html, None), latex=(_skip, None),
                 text=(_skip, None), man=(_skip, None), texinfo=(_skip, None))
    app.add_node(quiz_answer)
    app.add_directive("quiz", QuizDirective)
    app.connect("builder-inited", _load)
    app.connect("html-page-context", add_assets)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
