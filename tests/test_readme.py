"""The README is the course's front page: short, with the commands that exist, links that
resolve, and a chapter table that matches the chapters. The manual (CONTRIBUTING.md) is
checked against the code by test_contributing.py."""
import ast
import re
from pathlib import Path

import nbformat

import test_layering
from book_support import chapter_pages
from notebook_imports import import_nodes

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))  # the capstone, 07d, aside


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_a_front_page():
    text = _text()
    assert len(text.splitlines()) <= 150, "keep the README short: the manual is CONTRIBUTING.md"
    for command in ("make book", "make test", "make check", "make student", "make grade"):
        assert f"`{command}" in text, command
    for target in ("CONTRIBUTING.md", "appendix/instructors.md", "LICENSE", "LICENSE-TEXT",
                   "CHANGELOG.md"):
        assert f"]({target})" in text, f"the README does not link {target}"


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)]+)\)", _text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "no local links found"
    missing = [link for link in local if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, f"the README links files that do not exist: {missing}"


def _title(path: Path) -> str:
    first = nbformat.read(path, as_version=4).cells[0].source
    return first.splitlines()[0].removeprefix("# ").strip()


def _imported_modules(path: Path) -> set[str]:
    """The library modules a notebook imports (``variants`` for ``variants.mla``), the
    checkers and the self-checks' keys (``quiz``) aside: every chapter imports those."""
    found = set()
    for node in import_nodes(path):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""])
        found |= {n.split(".")[1] for n in names if n.startswith("transformer_lib.")}
    return found - {"checks", "quiz"}


def test_chapter_table_lists_every_chapter_with_its_title_and_the_modules_it_imports():
    rows = re.findall(r"^\| (\d+)\. ([^|]+) \| [^|]+ \| ([^|]+) \|$", _text(), re.M)
    assert [int(number) for number, _, _ in rows] == [int(p.name[:2]) for p in CHAPTERS]
    modules = test_layering.CORE | test_layering.MODELS | test_layering.TEACHING
    for (number, title, used), path in zip(rows, CHAPTERS):
        assert title.strip() == _title(path), f"chapter {number}: {title!r}"
        named = set(re.findall(r"`(\w+)`", used))
        assert named <= modules, f"chapter {number}: not library modules: {named - modules}"
        pages = [path.parent / f"{stem}.ipynb" for stem in chapter_pages()[path.stem]]
        imported = set().union(*(_imported_modules(page) for page in pages))
        assert named == imported, (
            f"chapter {number} imports {sorted(imported)} on its pages, the README says "
            f"{sorted(named)}")
