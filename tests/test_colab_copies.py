"""The Colab copies (tools/colab_copies.py): committed and fresh, free of MyST markup, the
same code cells as the book's notebooks, links that go to pages and files that exist, and
the Colab button of each chapter pointed at its copy (_ext/book_fixes.py)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import colab_copies
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import book_fixes  # noqa: E402  (the book's Sphinx extension, not a package)

EDITIONS = colab_copies.editions()
COPIES = colab_copies.copies()
# What Jupyter and Colab would show as raw text: a directive's fence, a role, a target line,
# a numbered formula's label.
MYST_LEFT = re.compile(r"^[ \t]*(`{3,}|:{3,})\{[\w:-]+\}|\{[\w:+-]+\}`|^[ \t]*\([^()\s]+\)=\s*$"
                       r"|^[ \t]*\$\$[ \t]*\([^()\s]+\)\s*$", re.M)
# A Markdown link or image, with its target.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)\)")


def _markdown(text: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(text)["cells"]
            if c["cell_type"] == "markdown"]


def _without_code(text: str) -> str:
    """A Markdown cell's text without its fenced code blocks and code spans."""
    text = re.sub(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", "", text, flags=re.M | re.S)
    return re.sub(r"(`+).+?\1", "", text, flags=re.S)


def test_every_copy_is_committed_and_fresh():
    """Every chapter of every edition has its copy, and each is what the script writes now
    (run `make student` after changing a chapter)."""
    assert COPIES, "no Colab copies"
    for each in EDITIONS:
        sources = sorted(p.name for p in each.source_dir.glob("*.ipynb"))
        assert sorted(p.name for p in COPIES if p.parent == each.out_dir) == sources
    assert colab_copies.stale(COPIES) == [], "stale Colab copies: run `make student`"


@pytest.mark.parametrize("path", sorted(COPIES), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_copy_has_no_myst_and_the_same_code(path: Path):
    """No directive, role or target is left for Colab to show as text, and the code cells
    are the book notebook's, in order, as they are."""
    copy = json.loads(COPIES[path])
    source = json.loads((ROOT / path.relative_to(ROOT / colab_copies.FOLDER)).read_text(
        encoding="utf-8"))
    code = [c for c in source["cells"] if c["cell_type"] == "code"]
    assert [c for c in copy["cells"] if c["cell_type"] == "code"] == code
    assert copy["metadata"] == source["metadata"]
    for text in _markdown(COPIES[path]):
        left = MYST_LEFT.findall(_without_code(text))
        assert not left, f"{path.name}: MyST markup left: {left}\n{text[:300]}"


def test_links_go_to_the_book_or_the_repository():
    """A link of a copy is absolute (Colab opens it from GitHub); one to the book names a
    page that the book builds, one to the repository a file that is there."""
    book = colab_copies.read_book()
    repository_files = f"{book.url}/blob/{book.branch}/"
    raw_files = book.file_url("", raw=True)
    seen = {"book": 0, "repository": 0, "image": 0}
    for path, text in COPIES.items():
        for cell in _markdown(text):
            for target in LINK.findall(_without_code(cell)):
                assert re.match(r"https?://", target), f"{path.name}: relative link {target}"
                if target.startswith(book.baseurl):
                    page = target.removeprefix(book.baseurl).split("#")[0]
                    page = re.sub(r"^(zh/)", "", page).removesuffix(".html")
                    assert page in book.titles, f"{path.name}: no page {target}"
                    seen["book"] += 1
                elif target.startswith(repository_files):
                    assert (ROOT / target.removeprefix(repository_files).split("#")[0]).exists()
                    seen["repository"] += 1
                elif target.startswith(raw_files):
                    assert (ROOT / target.removeprefix(raw_files)).is_file(), target
                    seen["image"] += 1
    assert seen["book"] > 0, seen  # the chapters link each other; figures are drawn by code


def test_exercises_are_numbered_as_the_book_numbers_them():
    """Chapter 1's exercises are 1.1, 1.2, ... over its pages, and each solution's summary
    names its exercise; the Chinese copy uses the Chinese words."""
    english, chinese = EDITIONS[0], EDITIONS[1]
    numbers = [n for n, _ in english.exercises.values() if n.startswith("1.")]
    assert numbers == [f"1.{i}" for i in range(1, len(numbers) + 1)] and len(numbers) >= 3
    text = COPIES[english.out_dir / "01_attention.ipynb"]
    headings = re.findall(r"^### Exercise (1\.\d+) ", "\n".join(_markdown(text)), re.M)
    summaries = re.findall(r"<summary>Solution to Exercise (1\.\d+) ", text)
    assert headings[:3] == ["1.1", "1.2", "1.3"] and summaries[:3] == headings[:3]
    zh_text = "\n".join(_markdown(COPIES[chinese.out_dir / "01_attention.ipynb"]))
    assert "### 练习 1.1" in zh_text and "Solution to" not in zh_text


def _edition(folder: str = "") -> colab_copies.Edition:
    return next(e for e in EDITIONS if e.language.folder == folder)


def _convert(text: str) -> str:
    cell = colab_copies.Cell(_edition(), "chapters/01_attention", "test cell")
    return colab_copies.convert_markdown(text, cell)


def test_directives_and_roles_become_markdown():
    """Each kind of markup the pages use, on a small example."""
    assert _convert("```{note}\nKeep the mask.\n```") == "> **Note**\n>\n> Keep the mask."
    folded = _convert("```{admonition} Answer\n:class: dropdown\n$D = 64$\n```")
    assert folded == "<details>\n<summary>Answer</summary>\n\n$D = 64$\n\n</details>"
    assert _convert("(my-label)=\n# Title") == "# Title"
    assert _convert("$$\nx^2\n$$ (eq-x)") == "$$\nx^2\n$$"
    assert _convert("{math}`x^2` and {sub}`i`") == "$x^2$ and <sub>i</sub>"
    book = _edition().book
    doc = _convert("see {doc}`the masks <01b_masks_and_cost>`")
    assert doc == f"see [the masks]({book.baseurl}chapters/01b_masks_and_cost.html)"
    titled = _convert("see {doc}`01b_masks_and_cost`")
    assert book.titles["chapters/01b_masks_and_cost"] in titled
    code = "```python\n{doc}`kept` (x)=\n```"
    assert _convert(code) == code  # code is left as it is


@pytest.mark.parametrize("text, named", [
    ("```{unknown-thing}\nbody\n```", "{unknown-thing}"),
    ("a {unknownrole}`x` b", "{unknownrole}"),
    ("a {glue:text}`value` b", "stored without outputs"),
    ("see {doc}`no_such_page`", "no page of the book"),
    ("see [there](#no-such-label)", "no-such-label"),
    ("```{note}\nnever closed", "never closed"),
])
def test_markup_without_a_translation_stops_the_script(text, named):
    """Markup the script cannot write stops it, naming the cell and the markup, before
    anything is written."""
    with pytest.raises(colab_copies.ColabError, match=re.escape(named)) as error:
        _convert(text)
    assert "test cell" in str(error.value)


def test_the_colab_button_opens_the_copy():
    """The theme's Colab address of a chapter (either edition) becomes its copy's; a page
    without a copy, and any other address, keep theirs."""
    base = "https://colab.research.google.com/github/owner/repo/blob/main/"
    has = {"chapters/01_attention.ipynb", "zh/chapters/01_attention.ipynb"}.__contains__
    assert book_fixes.colab_copy_url(base + "chapters/01_attention.ipynb", has) == (
        base + "colab/chapters/01_attention.ipynb")
    assert book_fixes.colab_copy_url(base + "zh/chapters/01_attention.ipynb", has) == (
        base + "colab/zh/chapters/01_attention.ipynb")
    assert book_fixes.colab_copy_url(base + "appendix/x.ipynb", has) == base + "appendix/x.ipynb"
    binder = "https://mybinder.org/v2/gh/owner/repo/main?urlpath=lab/tree/chapters/01.ipynb"
    assert book_fixes.colab_copy_url(binder, has) == binder
    assert book_fixes.COLAB_FOLDER == colab_copies.FOLDER
