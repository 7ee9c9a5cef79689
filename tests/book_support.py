"""What the book tests share: the book's configuration, its pages, and a fresh build of it."""
from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest
import yaml

# tools/build_book.py and tools/setup_cell.py (tools/ is on pytest's pythonpath: pyproject.toml)
import build_book
import setup_cell

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
LOCK = ROOT / "_build" / ".build-lock"  # held while a test checks or rebuilds the book
BOOK_LOG = build_book.LOG  # the whole output of the last build
BOOK_OK = build_book.OK  # written by the build (`make book`) when it succeeds

# What a build depends on: if any of it is newer than the last successful build, that is stale.
# `make book` rewrites the setup cells with tools/setup_cell.py and builds with
# tools/build_book.py (the translated editions' configs: tools/i18n, their catalogs: locales);
# _ext holds the book's Sphinx extensions.
_SOURCES = ["_config.yml", "_toc.yml", "intro.md", "chapters", "appendix", "_assets", "_ext",
            "tools/setup_cell.py", "tools/build_book.py", "tools/release.py", "transformer_lib",
            "tools/i18n", "locales"]


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def toc_docnames() -> list[str]:
    """Every page of the table of contents, root first, as paths without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return names


def chapter_pages() -> dict[str, list[str]]:
    """Each chapter's pages, as file stems: the chapter's own page first, then the pages the
    table of contents lists under it (``04_normalisation``: ``04b_training_recipe``)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    found = {}
    for part in toc.get("parts", []):
        for entry in part.get("chapters") or []:
            if entry.get("file", "").startswith("chapters/"):
                stems = [entry["file"], *(s["file"] for s in entry.get("sections") or [])]
                found[stems[0].split("/")[-1]] = [s.split("/")[-1] for s in stems]
    return found


def source_of(docname: str) -> Path:
    """The file a page is built from (``.ipynb`` or ``.md``)."""
    for suffix in (".ipynb", ".md"):
        path = ROOT / f"{docname}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"no .ipynb or .md for the toc entry {docname!r}")


def notebook_docnames() -> list[str]:
    return [d for d in toc_docnames() if source_of(d).suffix == ".ipynb"]


def launch_urls(docname: str) -> dict[str, str]:
    """The Colab, Binder and repository links a notebook page must carry: Colab opens the
    page's Colab copy where there is one (tools/colab_copies.py), Binder the notebook itself."""
    url, branch = setup_cell.repository()
    org_repo = url.removeprefix("https://github.com/")
    colab = f"colab/{docname}.ipynb" if (ROOT / "colab" / f"{docname}.ipynb").is_file() else (
        f"{docname}.ipynb")
    return {
        "colab": f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{colab}",
        "binder": f"https://mybinder.org/v2/gh/{org_repo}/{branch}?urlpath=lab/tree/{docname}.ipynb",
        "repository": url,
    }


def _newest_source_mtime() -> float:
    newest = 0.0
    for name in _SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            if "__pycache__" in f.parts or ".ipynb_checkpoints" in f.parts:
                continue
            newest = max(newest, f.stat().st_mtime)
    return newest


def ensure_built_book() -> Path:
    """``_build/html``, built now with ``make book`` if it is missing or older than its sources.

    ``make test`` builds the book just before pytest, so there this reuses that build. The tests
    run in parallel worker processes (pytest-xdist): a lock file makes one worker build while
    the others wait and then find the build fresh.

    With ``BOOK_HTML`` set to a folder (a build made elsewhere, e.g. with
    ``jupyter-book build . --path-output DIR``: ``DIR/_build/html``), that folder is used as it
    is: nothing is built or checked for staleness."""
    override = os.environ.get("BOOK_HTML")
    if override:
        html = Path(override)
        if not (html / "index.html").exists():
            pytest.fail(f"BOOK_HTML={override} holds no built book (no index.html)")
        return html
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = (HTML / "index.html").exists() and BOOK_OK.exists() \
            and BOOK_OK.stat().st_mtime >= _newest_source_mtime()
        if not fresh:
            result = subprocess.run(["make", "-s", "book"], cwd=ROOT, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.fail(f"the book does not build (log: {BOOK_LOG}):\n{result.stdout[-4000:]}")
    return HTML


def in_ci() -> bool:
    return bool(os.environ.get("CI"))
