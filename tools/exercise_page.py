"""The appendix page that lists the student notebooks, with a link that opens each in Colab.

    python tools/exercise_page.py           # write appendix/exercise_notebooks.md
    python tools/exercise_page.py --check   # exit 1 if the page is out of date

The links are derived from ``repository.url`` and ``repository.branch`` in ``_config.yml``,
like the book's launch buttons and the setup cells, so a fork that changes those two lines and
runs ``make student`` (or ``make book``) hands out links to its own copies. Each notebook's
exercises are read from the student copy (``**Exercise N (title)**`` lines).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

from setup_cell import repository

ROOT = Path(__file__).resolve().parent.parent
STUDENT_DIR = ROOT / "exercises"
PAGE = ROOT / "appendix" / "exercise_notebooks.md"
_EXERCISE = re.compile(r"^\*\*Exercise (\d+) \((.*)\)\*\*", re.M)

_HEAD = """\
# Exercise notebooks

Every chapter ends with graded exercises. The student copies below are the chapters with the
solutions taken out: each exercise's function (or class) is a stub (`raise
NotImplementedError()`), and the cell after it runs a checker that reports "not attempted
yet", what is wrong with an attempt (with a hint for the usual mistakes), or that every check
passed. The self-check answers are left out too. The copies run top to bottom on Colab as they
are: their first cell installs the course library.

| chapter | exercises | open |
|---|---|---|
"""

_TAIL = """
## Handing them out

- **Share the links above.** A student who opens one gets a private copy to run; to keep
  their work they choose *File > Save a copy in Drive*, and to hand it in they download it
  with *File > Download > Download .ipynb* (or share the Drive copy with you).
- **Your own copies.** Fork the course repository, change `repository.url` (and
  `repository.branch`) in `_config.yml` to your fork, run `make student` and commit: the
  links on this page, the book's launch buttons and every notebook's setup cell then point at
  your fork, so the copies you hand out stay as they are while the course changes.
- **Solutions.** The chapters in the book, and their download and Colab buttons, contain the
  solutions (folded on the page). Hand out only the notebooks listed here.
"""


def colab_link(url: str, branch: str, path: str) -> str:
    """The Colab address of ``path`` in the GitHub repository ``url`` at ``branch``."""
    org_repo = url.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{path}"


def page_text(student_dir: Path = STUDENT_DIR, config_path: Path = ROOT / "_config.yml") -> str:
    url, branch = repository(config_path)
    if not url.startswith("https://github.com/"):
        raise ValueError(f"Colab opens notebooks from GitHub; repository.url is {url!r}")
    rows = []
    for path in sorted(student_dir.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        title = nb.cells[0].source.lstrip("# ").splitlines()[0].strip()
        text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
        exercises = "; ".join(f"{n}. {name}" for n, name in _EXERCISE.findall(text)) or "none"
        link = colab_link(url, branch, f"exercises/{path.name}")
        rows.append(f"| {title} | {exercises} | [Open in Colab]({link}) |")
    return _HEAD + "\n".join(rows) + "\n" + _TAIL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    text = page_text()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else None
    if args.check:
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run `make student`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        PAGE.write_text(text, encoding="utf-8")
        print(f"written: {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
