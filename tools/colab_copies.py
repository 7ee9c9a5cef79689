"""Colab copies of the chapters: the same notebooks with the book's MyST markup written as
Markdown that Jupyter and Colab render.

    python tools/colab_copies.py           # write colab/chapters/ and colab/<folder>/chapters/
    python tools/colab_copies.py --check   # exit 1 and name the copies that are out of date

The pages are written in MyST: directives (```` ```{exercise} ````), roles (``{doc}`...` ``),
targets (``(label)=``) and links to labels (``[text](#label)``), which Jupyter and Colab show
as raw text. For every edition of ``book_languages`` (``_config.yml``) this writes
``colab/<folder>/chapters/<page>.ipynb`` from ``<folder>/chapters/<page>.ipynb``
(``colab/chapters/`` from ``chapters/`` for the source language), and the Colab button of
each chapter's page opens that copy (``open_colab_copies`` in ``_ext/book_fixes.py``). In the
Markdown cells:

- an admonition (``{admonition} Title``, ``{note}``, ``{tip}``, ...) becomes a blockquote
  whose first line is its title in bold, ``> **Title**``; one folded in the book (``:class:
  dropdown``: the self-check answers) becomes ``<details>`` with the title as its summary,
  so that Colab folds it too;
- ``{exercise}`` becomes a heading, ``### Exercise 1.4 (title)``, numbered as the book
  numbers it (the chapter's number in ``_toc.yml``, counted over the chapter's pages) and
  worded as the edition's entry says (``exercise``), then the exercise's text;
- ``{quiz}`` becomes its question and its choices as a list, then ``<details>`` with the
  right answer (for a numeric quiz: the name of its key, which a code cell computes) and the
  feedback of every foreseen answer;
- ``{solution}`` becomes ``<details>`` whose summary names the exercise, as the book's
  folded block does ("Solution to Exercise 1.4 (title)", in sphinx-exercise's words for the
  language);
- ``{figure}`` and ``{image}`` become ``![alt](url)``, a figure's caption an italic line
  under it. An image's relative path becomes the file's address on raw.githubusercontent.com
  at ``repository.branch``: Colab opens the notebook from GitHub, where the book's
  ``_images/`` do not exist;
- ``{math}`` (directive and role) becomes ``$$ ... $$`` and ``$...$``, ``{code-block}`` a
  fenced block, ``{margin}``, ``{sidebar}``, ``{epigraph}`` and ``{topic}`` blockquotes;
- ``{doc}``, ``{ref}``, ``{numref}``, a link to a label (``[text](#label)``: the citations,
  the API reference's names) and a link to another page (``[text](01b_masks_and_cost.ipynb)``)
  become links to that page of the published book (``html.baseurl``, with the edition's
  folder), with the role's text or else the target's title; a link to any other file of the
  repository becomes its address on GitHub; ``{term}`` becomes its text and ``{eq}`` the
  formula's label in parentheses, linked to it;
- ``(label)=`` lines and the ``(label)`` after a display formula's closing ``$$`` are taken
  out.

A glued value (``{glue}``) cannot be written: the notebooks are stored without outputs, so a
copy has no value to show (write the number in the text, or print it). A directive or role
not named above, or a link to a label or page that the book does not have, stops the script
with the notebook and the cell, before anything is written.

Every code cell is kept as it is, tags, outputs and metadata included: a Colab reader runs
the notebook top to bottom, so the cells the book runs without showing them (the setup cell,
the reference solutions and their checks, tagged ``remove-cell``) run there too. A Markdown
cell tagged ``remove-cell`` is for the web page alone and is left out.

The copies are committed: ``make student``, ``make locales`` and ``make book`` (outside CI)
rewrite them, and ``tests/test_colab_copies.py`` fails when one is stale.
"""
from __future__ import annotations

import argparse
import gettext
import html
import importlib.util
import json
import posixpath
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import quizzes
import yaml

from i18n import languages as book_languages
from i18n.languages import Language
from i18n.notebooks import translations
from setup_cell import repository

ROOT = Path(__file__).resolve().parent.parent
FOLDER = "colab"  # the copies' folder: COLAB_FOLDER in _ext/book_fixes.py
REMOVE_TAG = "remove-cell"
EXERCISE_LEVEL = "###"  # an exercise's heading sits under its page's "## Exercises"
# The admonitions that have a directive of their own, in Sphinx's words (its catalog has them
# in the other languages).
ADMONITIONS = {"attention": "Attention", "caution": "Caution", "danger": "Danger",
               "error": "Error", "hint": "Hint", "important": "Important", "note": "Note",
               "seealso": "See also", "tip": "Tip", "warning": "Warning"}
ASIDES = ("margin", "sidebar", "epigraph", "topic", "pull-quote")  # shown as blockquotes
HTML_ROLES = ("sub", "sup", "kbd")  # a role that is one HTML element of its name

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}"
                   r"[ \t]*(?P<argument>.*)$")
_CODE_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
# A target, ``(label)=``, on a line of its own or as the first line of a list item.
_TARGET = re.compile(r"^([ \t]*(?:(?:[-*+]|\d+[.)])[ \t]+)?)\(([^()\s]+)\)=[ \t]*$", re.M)
# A numbered display formula's closing line (dollarmath): ``$$ (label)``.
_EQUATION = re.compile(r"^([ \t]*\$\$)[ \t]*\(([^()\s]+)\)[ \t]*$", re.M)
_OPTION = re.compile(r"^[ \t]*:([\w-]+):[ \t]*(.*)$")
_LABEL_OPTION = re.compile(r"^[ \t]*:(?:label|name):[ \t]*(\S+)", re.M)
_AUTOMODULE = re.compile(r"automodule(?:::|\})[ \t]+([\w.]+)")
# Inline: a code span (left as it is), a role, or a link or image.
_INLINE = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?<!`)(?P=ticks)(?!`))"
    r"|\{(?P<role>[\w:+-]+)\}`(?P<content>[^`]*)`"
    r"|(?P<image>!?)\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\((?P<href>[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)\)", re.S)
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)  # `text <target>`
_SCHEME = re.compile(r"^[a-z][\w+.-]*:", re.I)  # https:, mailto:, ...


class ColabError(ValueError):
    """MyST markup that a Colab copy cannot show."""


# ---- the book ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Book:
    """What the copies need to know about the whole book.

    Attributes:
        url: ``repository.url``, ``https://github.com/<owner>/<repo>``.
        branch: ``repository.branch``.
        baseurl: ``html.baseurl``, ending in ``/``.
        pages: every page of ``_toc.yml`` in reading order, each ``(page, chapter)``: its path
            without suffix and its chapter's number (``"4"``), or None in an unnumbered part.
        labels: every label a page defines (``(label)=``, ``:label:``, ``:name:``) -> the page.
        equations: the label of every numbered display formula -> its page.
        modules: every module the API reference documents -> its page.
        titles: every page -> its title (its first ``#`` heading).
    """

    url: str
    branch: str
    baseurl: str
    pages: tuple[tuple[str, str | None], ...]
    labels: dict[str, str] = field(default_factory=dict)
    equations: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)

    def file_url(self, path: str, raw: bool = False) -> str:
        """The address of the repository's file ``path`` on GitHub at the branch; ``raw``:
        the file itself (an image), not its page."""
        slug = self.url.removeprefix("https://github.com/")
        if raw:
            return f"https://raw.githubusercontent.com/{slug}/{self.branch}/{path}"
        return f"{self.url}/blob/{self.branch}/{path}"


def _toc_files(entry: dict) -> list[str]:
    """The page of a table-of-contents entry, then those of its sections, in order."""
    return [entry["file"], *[f for s in entry.get("sections", []) for f in _toc_files(s)]]


def toc_pages(toc: dict) -> list[tuple[str, str | None]]:
    """Every page of ``_toc.yml`` in reading order, with its chapter's number.

    The chapters of the numbered parts are numbered on from one part to the next, as the
    book numbers them; a chapter's sections share its number; an unnumbered part's pages
    get None.
    """
    pages: list[tuple[str, str | None]] = [(toc["root"], None)]
    number = 0
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            number += bool(part.get("numbered"))
            found = str(number) if part.get("numbered") else None
            pages += [(page, found) for page in _toc_files(chapter)]
    return pages


def markdown_cells(path: Path) -> list[str]:
    """The text of every Markdown cell of a notebook; a Markdown file's text."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def source_of(page: str, root: Path = ROOT) -> Path:
    """The source file of a page of the book (``.ipynb`` or ``.md``)."""
    for suffix in (".ipynb", ".md"):
        if (root / f"{page}{suffix}").exists():
            return root / f"{page}{suffix}"
    raise ColabError(f"_toc.yml lists {page}, which has no .ipynb or .md file")


def read_book(root: Path = ROOT) -> Book:
    """The book's addresses, pages, labels, titles and documented modules, from
    ``_config.yml``, ``_toc.yml`` and the pages' sources."""
    url, branch = repository(root / "_config.yml")
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    book = Book(url, branch, config["html"]["baseurl"].rstrip("/") + "/", tuple(toc_pages(toc)))
    for page, _ in book.pages:  # fill in the book's tables
        text = "\n\n".join(markdown_cells(source_of(page, root)))
        heading = re.search(r"^# (.+)$", text, re.M)
        book.titles[page] = heading.group(1).strip() if heading else page
        for label in [m[1] for m in _TARGET.findall(text)] + _LABEL_OPTION.findall(text):
            book.labels.setdefault(label, page)
        for _, label in _EQUATION.findall(text):
            book.equations.setdefault(label, page)
        for module in _AUTOMODULE.findall(text):
            book.modules.setdefault(module, page)
    return book


# ---- an edition --------------------------------------------------------------------------

def _catalog(package: str, folder: str, domain: str, code: str) -> gettext.NullTranslations:
    """The gettext catalog ``domain`` of an installed package in the language ``code`` (its
    untranslated words where it has none for the language)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ColabError(f"{package} is not installed: its catalog words the copies")
    localedir = Path(spec.origin).parent / folder
    return gettext.translation(domain, localedir, languages=[code], fallback=True)


@dataclass(frozen=True)
class Edition:
    """One edition: its notebooks, its pages' address and its words.

    Attributes:
        book: the book.
        language: the edition's entry of ``book_languages``.
        exercise: the words of an exercise's heading, ``Exercise {number} ({title})``, and of
            one without a title.
        solution_to: the words before the exercise a solution belongs to, ``Solution to``.
        admonitions: ``ADMONITIONS`` in the language.
        quiz: the quiz's words in the language (``UI_STRINGS`` of ``_ext/quiz.py``).
        exercises: every exercise's label -> its number and heading, ``("1.4", "Exercise 1.4
            (title)")`` (``exercise_headings``).
    """

    book: Book
    language: Language
    exercise: tuple[str, str]
    solution_to: str
    admonitions: dict[str, str]
    exercises: dict[str, tuple[str, str]] = field(default_factory=dict)
    quiz: dict[str, str] = field(default_factory=dict)

    @property
    def site(self) -> str:
        """The address of the edition's pages, ending in ``/``."""
        return self.book.baseurl + (f"{self.language.folder}/" if self.language.folder else "")

    @property
    def source_dir(self) -> Path:
        return ROOT / self.language.folder / "chapters"

    @property
    def out_dir(self) -> Path:
        return ROOT / FOLDER / self.language.folder / "chapters"

    def title(self, page: str) -> str:
        """A page's title in the edition's language: its notebook's, or else the English
        title's translation in the page's catalog (the English title where there is none)."""
        notebook = self.source_dir / f"{posixpath.basename(page)}.ipynb"
        if page.startswith("chapters/") and notebook.exists():
            heading = re.search(r"^# (.+)$", markdown_cells(notebook)[0], re.M)
            if heading:
                return heading.group(1).strip()
        english = self.book.titles[page]
        if self.language.folder:
            return dict(translations(page, self.language)).get(english, english)
        return english


def edition(book: Book, language: Language) -> Edition:
    """An edition's words (from its entry, sphinx-exercise's catalog and Sphinx's) and the
    heading of every exercise of its notebooks."""
    exercise_words = _catalog("sphinx_exercise", "translations/locales", "exercise",
                              language.code)
    sphinx_words = _catalog("sphinx", "locale", "sphinx", language.code)
    name = exercise_words.gettext("Exercise")
    found = Edition(
        book, language,
        (language.exercise.get("titled") or name + " {number} ({title})",
         language.exercise.get("heading") or name + " {number}"),
        exercise_words.gettext("Solution to"),
        {key: sphinx_words.gettext(word) for key, word in ADMONITIONS.items()})
    found.exercises.update(exercise_headings(found))
    found.quiz.update(_quiz_extension().words(language.catalogs if language.folder else None))
    return found


def _quiz_extension():
    """``_ext/quiz.py``, the book's quiz directive, whose words the copies use."""
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        import quiz
    finally:
        sys.path.pop(0)
    return quiz


def render_quiz(directive: Directive, cell: Cell) -> str:
    """A ``{quiz}`` as plain Markdown: its question, its choices as a list (none for a
    number), then, folded, the right answer and the feedback of every foreseen answer."""
    try:
        found = quizzes.parse_body(directive.body)
    except ValueError as exc:
        raise cell.fail(str(exc)) from None
    words = cell.edition.quiz
    question = convert_markdown(found.question, cell)
    shown = [convert_inline(answer, cell) for answer, _ in found.answers]
    if "key" in directive.options:
        head = question
        answer = words["colab_key"].format(key=directive.options["key"])
    else:
        head = question + "\n\n" + "\n".join(f"- {text}" for text in shown)
        number = int(directive.options.get("answer", 0))
        if not 1 <= number <= len(shown):
            raise cell.fail(f"a quiz whose :answer: ({number}) is none of its choices")
        answer = words["colab_choice"].format(number=number, answer=shown[number - 1])
    feedback = "\n".join(f"- **{text}** — " + "\n  ".join(
        convert_markdown(explain, cell).split("\n")) for text, (_, explain)
        in zip(shown, found.answers))
    return head + "\n\n" + details(words["colab_title"], f"{answer}\n\n{feedback}")


def exercise_headings(edition: Edition) -> dict[str, tuple[str, str]]:
    """Every exercise's label -> its number and heading, numbered as the book numbers it.

    In a numbered chapter an exercise is ``<chapter>.<n>``, ``n`` counted over the chapter's
    pages in reading order; elsewhere ``n`` alone, counted on its page.
    """
    counts: dict[str, int] = {}
    found = {}
    for page, chapter in edition.book.pages:
        path = edition.source_dir / f"{posixpath.basename(page)}.ipynb"
        if not page.startswith("chapters/") or not path.exists():
            continue
        for text in markdown_cells(path):
            for block in _blocks(text.split("\n"), path.relative_to(ROOT).as_posix()):
                if isinstance(block, Directive) and block.name == "exercise":
                    key = chapter or page
                    counts[key] = counts.get(key, 0) + 1
                    number = f"{chapter}.{counts[key]}" if chapter else str(counts[key])
                    titled, plain = edition.exercise
                    heading = (titled.format(number=number, title=block.argument)
                               if block.argument else plain.format(number=number))
                    found[block.options.get("label", f"{page}:{number}")] = (number, heading)
    return found


# ---- blocks of a Markdown cell ---------------------------------------------------------

@dataclass
class Directive:
    """A MyST directive: ``name``, its ``argument``, its ``options`` and its body (lines,
    without the directive's indentation)."""

    name: str
    argument: str
    options: dict[str, str]
    body: list[str]
    indent: str = ""


def _closing(lines: list[str], start: int, fence: str, where: str) -> int:
    """The index of the line that closes the fence opened at ``start``: the same character,
    at least as many, alone on the line."""
    pattern = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
    for index in range(start + 1, len(lines)):
        if pattern.match(lines[index]):
            return index
    raise ColabError(f"{where}: the fence {fence!r} opened by {lines[start].strip()!r} is "
                     "never closed")


def _directive(opening: re.Match, lines: list[str]) -> Directive:
    """A directive from its opening line's match and its body's lines."""
    indent = opening.group("indent")
    body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines]
    options = {}
    if body and body[0].strip() == "---":  # options as YAML between two --- lines
        end = body.index("---", 1)
        options = {k: str(v) for k, v in (yaml.safe_load("\n".join(body[1:end])) or {}).items()}
        body = body[end + 1:]
    else:
        while body and _OPTION.match(body[0]):
            key, value = _OPTION.match(body[0]).groups()
            options[key] = value.strip()
            body = body[1:]
    while body and not body[0].strip():
        body = body[1:]
    return Directive(opening.group("name"), opening.group("argument").strip(), options, body,
                     indent)


def _blocks(lines: list[str], where: str) -> list[str | list[str] | Directive]:
    """A cell's lines cut into blocks: a directive, a code block (a list of its lines, kept as
    they are) or one line of prose (a ``str``)."""
    blocks: list[str | list[str] | Directive] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        opening, code = _OPEN.match(line), _CODE_FENCE.match(line)
        if opening or code:
            end = _closing(lines, index, (opening or code).group(2 if opening else 1), where)
            blocks.append(_directive(opening, lines[index + 1:end]) if opening
                          else lines[index:end + 1])
            index = end + 1
        else:
            blocks.append(line)
            index += 1
    return blocks


# ---- a Markdown cell, converted ----------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """Where a Markdown cell is: its edition, its page and, for messages, the notebook and the
    cell's index."""

    edition: Edition
    page: str
    where: str

    def fail(self, message: str) -> ColabError:
        return ColabError(f"{self.where}: {message}")


def convert_markdown(text: str, cell: Cell) -> str:
    """A Markdown cell's text with its MyST markup written as plain Markdown (see the module's
    docstring); a text without any comes back unchanged."""
    out: list[str] = []
    prose: list[str] = []
    for block in _blocks(text.split("\n"), cell.where):
        if isinstance(block, str):
            target = _TARGET.match(block)
            if not target or target.group(1).strip():  # a list item keeps its marker
                prose.append(_EQUATION.sub(r"\1", _TARGET.sub(r"\1", block).rstrip()))
            continue
        if prose:
            out.append(convert_inline("\n".join(prose), cell))
            prose = []
        if isinstance(block, Directive):
            rendered = render_directive(block, cell)
            out.append("\n".join(block.indent + line if line else line
                                 for line in rendered.split("\n")))
        else:
            out += block
    if prose:
        out.append(convert_inline("\n".join(prose), cell))
    return "\n".join(out).strip("\n") if text == text.strip("\n") else "\n".join(out)


def render_directive(directive: Directive, cell: Cell) -> str:
    """One directive as plain Markdown."""
    name, argument, options = directive.name, directive.argument, directive.options
    body = "\n".join(directive.body).strip("\n")
    edition = cell.edition
    if name in ("math", "code-block", "code", "sourcecode"):
        return (f"$$\n{body}\n$$" if name == "math"
                else f"{_fence_for(body)}{argument}\n{body}\n{_fence_for(body)}")
    if name.startswith("glue"):
        raise cell.fail(f"{{{name}}} shows a value of the executed notebook, and the "
                        "notebooks are stored without outputs: write the value in the text")
    if name == "quiz":
        return render_quiz(directive, cell)
    body = convert_markdown(body, cell)
    if name == "exercise":
        if options.get("label") not in edition.exercises:
            raise cell.fail(f"an exercise without a :label: ({argument!r})")
        heading = edition.exercises[options["label"]][1]
        return f"{EXERCISE_LEVEL} {convert_inline(heading, cell)}\n\n{body}"
    if name == "solution":
        if argument not in edition.exercises:
            raise cell.fail(f"a solution of {argument!r}, which is no exercise's label")
        return details(f"{edition.solution_to} {edition.exercises[argument][1]}", body)
    if name in ("figure", "image"):
        return figure(argument, options, body if name == "figure" else "", cell)
    if name == "admonition" or name in ADMONITIONS:
        title = convert_inline(argument, cell) if name == "admonition" else (
            edition.admonitions[name])
        if name != "admonition" and argument:  # the argument of {note} is its first line
            body = f"{convert_inline(argument, cell)}\n{body}".strip("\n")
        folded = {"dropdown", "toggle"} & set(options.get("class", "").split())
        return details(title, body) if folded else blockquote(title, body)
    if name in ASIDES:
        return blockquote(convert_inline(argument, cell), body)
    raise cell.fail(f"no plain Markdown for the directive {{{name}}}: add it to "
                    "tools/colab_copies.py")


def _fence_for(body: str) -> str:
    """A backtick fence longer than every run of backticks in ``body``."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    return "`" * max(3, longest + 1)


def details(summary: str, body: str) -> str:
    """A block that Colab folds: ``<details>`` with ``summary``, whose inline code is kept.

    The blank lines around the body let Jupyter and Colab read it as Markdown."""
    parts = re.split(r"(`+)(.+?)\1", summary)  # text, ticks, code, text, ...
    shown = "".join(f"<code>{html.escape(part)}</code>" if index % 3 == 2
                    else "" if index % 3 == 1 else html.escape(part, quote=False)
                    for index, part in enumerate(parts))
    return f"<details>\n<summary>{shown}</summary>\n\n{body}\n\n</details>"


def blockquote(title: str, body: str) -> str:
    """A blockquote whose first line is ``title`` in bold (none when empty), then ``body``."""
    lines = ([f"**{title}**", ""] if title else []) + body.split("\n")
    return "\n".join(f"> {line}" if line else ">" for line in lines)


def figure(path: str, options: dict[str, str], body: str, cell: Cell) -> str:
    """A figure or image: ``![alt](url)``, then a figure's caption (its body's first
    paragraph) in italics and the rest of its body (its legend)."""
    caption, _, legend = body.partition("\n\n")
    caption = " ".join(caption.split())
    alt = options.get("alt") or re.sub(r"[*_`$]", "", caption)
    image = f"![{alt}]({link_target(path, cell, image=True)})"
    return "\n\n".join(p for p in (image, f"*{caption}*" if caption else "", legend) if p)


# ---- inline markup -----------------------------------------------------------------------

def convert_inline(text: str, cell: Cell) -> str:
    """Roles and links of a run of prose written as plain Markdown; code spans as they are."""
    return _INLINE.sub(lambda match: _inline(match, cell), text)


def _inline(match: re.Match, cell: Cell) -> str:
    if match.group("code"):
        return match.group(0)
    if match.group("role"):
        return role(match.group("role"), match.group("content"), cell)
    href = match.group("href")
    if _SCHEME.match(href):
        return match.group(0)
    image = match.group("image")
    return f"{image}[{match.group('text')}]({link_target(href, cell, image=bool(image))})"


def role(name: str, content: str, cell: Cell) -> str:
    """One role as plain Markdown: a link to the book, its text, or a formula."""
    explicit = _EXPLICIT.match(content)
    text, target = (explicit.group("text"), explicit.group("target")) if explicit else (
        "", content)
    if name == "doc":
        page = _page(target, cell)
        return f"[{text or cell.edition.title(page)}]({cell.edition.site}{page}.html)"
    if name in ("ref", "numref"):  # the number of an exercise is known, of a figure not
        number, heading = cell.edition.exercises.get(target, ("", ""))
        shown = " ".join(text.replace("%s", number).replace("{number}", number).split())
        shown = shown or heading or cell.edition.title(_label_page(target, cell))
        return f"[{shown}]({link_target('#' + target, cell)})"
    if name == "eq":
        page = cell.edition.book.equations.get(target)
        if page is None:
            raise cell.fail(f"{{eq}} of {target!r}, which no display formula is labelled")
        return f"[({target})]({cell.edition.site}{page}.html#equation-{target})"
    if name == "term":
        return text or content
    if name == "abbr":  # {abbr}`MQA (multi-query attention)`
        return re.sub(r"\s*\(.*\)$", "", content)
    if name == "math":
        return f"${content}$"
    if name in HTML_ROLES:
        return f"<{name}>{html.escape(content)}</{name}>"
    if name.startswith("glue"):
        raise cell.fail(f"{{{name}}}`{content}` shows a value of the executed notebook, and "
                        "the notebooks are stored without outputs: write the value in the text")
    raise cell.fail(f"no plain Markdown for the role {{{name}}}: add it to "
                    "tools/colab_copies.py")


def _page(target: str, cell: Cell) -> str:
    """The page a path names (``../chapters/08_fast_attention``, ``x.ipynb``, ``/intro``),
    seen from the cell's page; a ``ColabError`` if the book has no such page."""
    path = target.lstrip("/") if target.startswith("/") else posixpath.normpath(
        posixpath.join(posixpath.dirname(cell.page), target))
    page = re.sub(r"\.(ipynb|md)$", "", path)
    if page not in cell.edition.book.titles:
        raise cell.fail(f"a link to {target!r}, which is no page of the book")
    return page


def _label_page(label: str, cell: Cell) -> str:
    """The page that defines ``label``: a target, an exercise, a figure, or a name of the
    library documented by the API reference (the longest module that it starts with)."""
    book = cell.edition.book
    if label in book.labels:
        return book.labels[label]
    modules = [m for m in book.modules if label == m or label.startswith(m + ".")]
    if modules:
        return book.modules[max(modules, key=len)]
    raise cell.fail(f"a link to the label {label!r}, which no page of the book defines")


def link_target(href: str, cell: Cell, image: bool = False) -> str:
    """Where a link of the page should go from Colab.

    A label (``#label``) and another page of the book go to the published book; an image to
    its file on raw.githubusercontent.com; any other file of the repository to its page on
    GitHub. An address with a scheme (``https:``) is kept.
    """
    if _SCHEME.match(href):
        return href
    edition = cell.edition
    if href.startswith("#"):
        label = href[1:]
        return f"{edition.site}{_label_page(label, cell)}.html#{label}"
    path, _, fragment = href.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(cell.page), path))
    if image:
        return edition.book.file_url(resolved, raw=True)
    if re.sub(r"\.(ipynb|md)$", "", resolved) in edition.book.titles:
        page = _page(path, cell)
        return f"{edition.site}{page}.html" + (f"#{fragment}" if fragment else "")
    if not (ROOT / resolved).exists():
        raise cell.fail(f"a link to {href!r}, which is no file of the repository")
    return edition.book.file_url(resolved)


# ---- the copies --------------------------------------------------------------------------

def colab_notebook(path: Path, edition: Edition) -> str:
    """The text of the Colab copy of the notebook at ``path`` (a page of ``edition``): its
    Markdown cells converted, those tagged ``remove-cell`` left out, every other cell and the
    notebook's metadata as they are; written as the translated notebooks are (JSON, indent
    1, UTF-8, a final line break)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    page = f"chapters/{path.stem}"
    cells = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "markdown":
            if REMOVE_TAG in cell.get("metadata", {}).get("tags", []):
                continue
            text = "".join(cell["source"])
            where = Cell(edition, page, f"{path.relative_to(ROOT).as_posix()}, cell {index}")
            converted = convert_markdown(text, where)
            if converted != text:
                cell = {**cell, "source": converted.splitlines(keepends=True)}
        cells.append(cell)
    notebook["cells"] = cells
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def editions() -> list[Edition]:
    """Every edition of ``book_languages``, the source first."""
    book = read_book()
    return [edition(book, language) for language in book_languages.languages()]


def copies() -> dict[Path, str]:
    """Every Colab copy, ``colab/<folder>/chapters/<page>.ipynb`` -> its text."""
    found = {}
    for each in editions():
        for path in sorted(each.source_dir.glob("*.ipynb")):
            found[each.out_dir / path.name] = colab_notebook(path, each)
    return found


def stale(found: dict[Path, str] | None = None) -> list[Path]:
    """The copies that are missing or out of date, and those whose page is gone."""
    found = copies() if found is None else found
    out = [path for path, text in found.items()
           if not path.exists() or path.read_text(encoding="utf-8") != text]
    return out + sorted(p for p in (ROOT / FOLDER).rglob("*.ipynb") if p not in found)


def write() -> list[Path]:
    """Write every copy that changed and remove those whose page is gone; every notebook
    converts before anything is written. Returns the files written or removed."""
    found = copies()
    changed = stale(found)
    for path in changed:
        if path in found:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(found[path], encoding="utf-8")
        else:
            path.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a copy is missing or out of date")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        changed = stale() if args.check else write()
    except ColabError as exc:
        print(f"colab_copies: {exc}", file=sys.stderr)
        return 1
    names = [path.relative_to(ROOT).as_posix() for path in changed]
    if args.check:
        for name in names:
            print(f"{name} is out of date: run `make student`", file=sys.stderr)
        return 1 if names else 0
    print(f"Colab copies in {FOLDER}/: {len(names)} changed"
          f"{': ' + ', '.join(names) if names else ''} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
