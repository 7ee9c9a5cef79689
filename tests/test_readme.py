"""The README documents what the chapters use: every name a notebook imports from
``transformer_lib`` appears in the README's API overview."""
import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "appendix").glob("*.ipynb"))


def _imported_names(path: Path) -> set[tuple[str, str]]:
    """(module, name) for every ``from transformer_lib.x import name`` in a notebook."""
    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("!", "%")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lib."):
                found |= {(node.module, alias.name) for alias in node.names}
    return found


def _api_overview() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"^## API overview\n(.*?)^## ", readme, re.S | re.M).group(1)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_api_overview_lists_what_the_notebook_imports(notebook):
    overview = _api_overview()
    missing = []
    for module, name in sorted(_imported_names(notebook)):
        section = re.search(rf"^- `{re.escape(module)}`.*?(?=^- `transformer_lib|\Z)",
                            overview, re.S | re.M)
        if module == "transformer_lib.checks":
            ok = section is not None  # one checker per exercise: listed under "For instructors"
        else:
            ok = section is not None and re.search(rf"`{re.escape(name)}\b", section.group(0))
        if not ok:
            missing.append(f"{module}.{name}")
    assert not missing, f"README's API overview does not list {missing}"
