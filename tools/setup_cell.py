"""The setup cell that opens every notebook of the book, derived from ``_config.yml``.

On Colab (or any Python where ``transformer_lib`` is missing) the cell pip-installs the
library from the repository named in ``_config.yml`` (``repository.url`` and ``.branch``);
where the library is importable it does nothing. The library's dependency ranges admit what
Colab preinstalls, so pip installs the library alone; if pip fails, the cell prints pip's
output; if pip changed a package that the kernel had already imported, the cell says so and
asks the reader to restart the runtime. ``TRANSFORMER_LIB_SOURCE`` overrides what
is installed (a local path, a wheel, another ``git+`` URL): the tests use it to install the
local checkout.

Every notebook under ``chapters/`` and ``appendix/`` has a title cell (Markdown) first and
this setup cell second, tagged ``remove-cell``: the book executes it but shows neither its code
nor its output (readers of the book have the library already), while Colab and Jupyter ignore
the tag, so the cell stays visible there and in the student copies, where it does its job.

    python tools/setup_cell.py --check   # exit 1 and list the notebooks that disagree
    python tools/setup_cell.py --write   # rewrite (or insert) the setup cell where needed

``make book`` runs ``--write`` (outside CI), so changing the repository in ``_config.yml`` and
rebuilding is all it takes to move the course's notebooks to a new home. The same line gives
the book's address on GitHub Pages (``pages_url``), which ``html.baseurl`` must equal
(``tools/release.py check``).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIRS = ("chapters", "appendix")
SOURCE_VARIABLE = "TRANSFORMER_LIB_SOURCE"
TAGS = ["remove-cell"]

_TEMPLATE = '''\
# Setup: install the course library where it is missing (on Colab, for example).
# Where transformer_lib is already importable this cell does nothing.
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("transformer_lib") is None:
    source = os.environ.get(
        "{variable}",
        "{default}",
    )
    before = {{d.metadata["Name"]: d.version for d in metadata.distributions()}}
    pip = subprocess.run([sys.executable, "-m", "pip", "install", source],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        print(pip.stdout[-3000:], pip.stderr[-3000:], sep="\\n")
        raise RuntimeError(f"pip could not install {{source}}: its output is above")
    importlib.invalidate_caches()
    after = {{d.metadata["Name"]: d.version for d in metadata.distributions()}}
    changed = [f"{{name}} {{before[name]}} -> {{after.get(name)}}" for name in before
               if after.get(name) != before[name]
               and name.lower().replace("-", "_") in sys.modules]
    if changed:
        print("Restart the runtime (Runtime > Restart session) and run the notebook",
              "again: pip changed packages that were already imported:", *changed,
              sep="\\n")'''


def repository(config_path: Path = ROOT / "_config.yml") -> tuple[str, str]:
    """``(url, branch)`` of the course repository, as ``_config.yml`` names them."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    url = str(repo.get("url", "")).rstrip("/")
    if not url.startswith("https://"):
        raise ValueError(f"repository.url in {config_path} must be an https URL, got {url!r}")
    return url, str(repo.get("branch") or "main")


def pages_url(url: str) -> str:
    """The address where GitHub Pages serves the book of the GitHub repository ``url``.

    Args:
        url: ``https://github.com/<owner>/<repo>`` (``repository.url``).

    Returns:
        ``https://<owner>.github.io/<repo>/`` (the owner in lower case, as Pages writes it),
        or ``https://<owner>.github.io/`` for the repository named ``<owner>.github.io``.

    Raises:
        ValueError: ``url`` is not the address of a GitHub repository."""
    found = re.fullmatch(r"https://github\.com/([A-Za-z0-9-]+)/([\w.-]+?)(?:\.git)?/?", url)
    if not found:
        raise ValueError(f"not the address of a GitHub repository: {url!r}")
    owner, name = found.group(1).lower(), found.group(2)
    site = f"https://{owner}.github.io/"
    return site if name.lower() == f"{owner}.github.io" else f"{site}{name}/"


def install_source(url: str, branch: str) -> str:
    """What ``pip install`` gets by default: the repository at ``branch``."""
    return f"git+{url}@{branch}"


def setup_cell_source(config_path: Path = ROOT / "_config.yml", ref: str | None = None) -> str:
    """The setup cell; it installs the repository at ``ref`` (a tag or commit) if given, else
    at ``repository.branch`` (the book's notebooks follow the branch; student copies are
    pinned to the library version they were made with)."""
    url, branch = repository(config_path)
    return _TEMPLATE.format(variable=SOURCE_VARIABLE, default=install_source(url, ref or branch))


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook of the book (checkpoints excluded), sorted."""
    found = []
    for folder in NOTEBOOK_DIRS:
        found += [p for p in (root / folder).rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts]
    return sorted(found)


def is_setup_cell(cell) -> bool:
    return cell.cell_type == "code" and SOURCE_VARIABLE in cell.source


def problems(nb, expected_source: str) -> list[str]:
    """What is wrong with the notebook's title and setup cells (empty when all is well)."""
    cells = nb.cells
    found = []
    title = cells[0].source.lstrip() if cells and cells[0].cell_type == "markdown" else ""
    if not title.startswith("# "):
        found.append("cell 0 must be a Markdown cell that starts with the page title ('# ...')")
    if len(cells) < 2 or not is_setup_cell(cells[1]):
        found.append("cell 1 must be the setup cell")
        return found
    if cells[1].source != expected_source:
        found.append("the setup cell differs from the one _config.yml gives")
    if cells[1].metadata.get("tags", []) != TAGS:
        found.append(f"the setup cell must be tagged exactly {TAGS}")
    return found


def fix(nb, expected_source: str) -> None:
    """Put the expected setup cell at index 1 (replacing an old setup cell there)."""
    cell = nbformat.v4.new_code_cell(expected_source, metadata={"tags": list(TAGS)})
    if len(nb.cells) > 1 and is_setup_cell(nb.cells[1]):
        cell.id = nb.cells[1].get("id", cell.id)
        nb.cells[1] = cell
    else:
        nb.cells.insert(1, cell)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report notebooks that disagree")
    mode.add_argument("--write", action="store_true", help="rewrite the setup cells")
    args = parser.parse_args(argv)

    expected = setup_cell_source()
    status = 0
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        issues = problems(nb, expected)
        if not issues:
            continue
        rel = path.relative_to(ROOT)
        if args.write and not any(i.startswith("cell 0") for i in issues):
            fix(nb, expected)
            nbformat.write(nb, path)
            print(f"setup cell rewritten: {rel}")
        else:
            status = 1
            for issue in issues:
                print(f"{rel}: {issue}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
