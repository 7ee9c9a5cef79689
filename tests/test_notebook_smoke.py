"""The smoke subset of a notebook (``tests/notebook_smoke.py``), which the Colab-like and Binder
tests execute in their environments: the setup cell, the imports, every explorer and the cells
it needs, found from what each cell binds and uses."""
from __future__ import annotations

import nbformat
import pytest

from book_support import ROOT, chapter_pages
from notebook_smoke import cell_names, exercise_cells, explorer_cells, smoke_cells, smoke_notebook
from setup_cell import is_setup_cell

NOTEBOOKS = [*sorted((ROOT / "chapters").glob("*.ipynb")),
             *sorted((ROOT / "appendix").glob("*.ipynb"))]


def _notebook(*sources: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A page")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in sources]
    return nb


def test_what_a_cell_binds_and_needs():
    binds, needs = cell_names(
        "import numpy as np\n"
        "def f(x, *rest, k=default):\n"
        "    return x + offset + sum(i for i in rest) + np.pi\n"
        "n = n + 1\n"
        "squares = [j * j for j in range(size)]\n"
        "class C(Base):\n"
        "    width = 2\n"
        "y = f(1)\n")
    assert binds == {"np", "f", "n", "squares", "C", "y"}
    assert needs == {"default", "offset", "n", "size", "Base"}  # n: read before it is bound
    assert cell_names("total += 1")[1] == {"total"}  # read, then bound
    # Annotations are read when the function is defined.
    assert cell_names("def g(m: Model, *a: Extra) -> Out:\n    return m")[1] == {
        "Model", "Extra", "Out"}
    assert cell_names("%matplotlib inline") == (set(), set())  # IPython syntax: nothing
    # Inside a block, a name bound before it is read needs no earlier cell; in one branch
    # only, it is bound after the block (as if that branch ran); read first, it is needed.
    binds, needs = cell_names(
        "if ready:\n    import lib\n    model = lib.Model()\n    out = model(x)\n"
        "else:\n    model = None\n"
        "for step in range(steps):\n    if step > 0:\n        total = total + step\n"
        "try:\n    import extra\nexcept ImportError as error:\n    print(error, extra)\n"
        "with opened(path) as f:\n    text = f.read()\n")
    assert binds == {"lib", "model", "out", "step", "total", "extra", "error", "f", "text"}
    assert needs == {"ready", "x", "steps", "total", "opened", "path", "extra"}


def test_an_explorer_keeps_the_cells_it_needs_and_no_others():
    nb = _notebook(
        "import torch\nfrom transformer_lib.widgets import attention_explorer",  # 1: imports
        "steps = 100",  # 2
        "model = torch.nn.Linear(steps, 2)\nfig = None",  # 3: binds model
        "fig = steps  # an unrelated cell",  # 4
        "attention_explorer(model)")  # 5: the explorer
    assert explorer_cells(nb) == [5]
    assert smoke_cells(nb) == [1, 2, 3, 5]


def test_a_student_copy_keeps_its_stubs_checks_and_their_users():
    nb = _notebook(
        "import torch\nfrom transformer_lib.checks import check_double",  # 1: imports
        "x = torch.ones(3)",  # 2
        "plot = x * 0  # an unrelated cell",  # 3
        "def double(t):\n    # YOUR CODE HERE\n    raise NotImplementedError",  # 4: the stub
        "check_double(double)",  # 5: its check
        "print(double(x))",  # 6: a later cell that uses the stub's name
        "print(plot)")  # 7
    assert exercise_cells(nb) == [4, 5, 6]
    assert smoke_cells(nb, exercise_cells(nb)) == [1, 2, 4, 5, 6]


def test_a_name_no_earlier_cell_binds_keeps_every_cell_before_it():
    nb = _notebook("import math", "a = 1", "exec('b = 2')", "b += a", "import ipywidgets\n"
                   "ipywidgets.IntSlider(b)")
    assert smoke_cells(nb) == [1, 2, 3, 4, 5]  # b comes from exec: untraceable


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_the_smoke_subset_of_every_notebook(notebook):
    nb = nbformat.read(notebook, as_version=4)
    smoke = smoke_notebook(nb)
    kept = smoke_cells(nb)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert is_setup_cell(smoke.cells[0]) and kept[:2] == code[:2]  # setup cell, imports
    assert set(explorer_cells(nb)) <= set(kept)
    assert [c.source for c in smoke.cells] == [nb.cells[i].source for i in kept]
    defined = set().union(*(cell_names(c.source)[0] for c in smoke.cells))
    for cell in smoke.cells:  # every name a kept cell needs is bound by a kept cell
        binds, needs = cell_names(cell.source)
        assert not needs - defined - {"__builtins__"}, (cell.source[:80], needs - defined)


def test_the_book_has_explorers_and_they_are_in_the_smoke_subset():
    found = {p.stem: explorer_cells(nbformat.read(p, as_version=4)) for p in NOTEBOOKS}
    chapters = {name: pages for name, pages in chapter_pages().items() if name != "00_setup"}
    assert len(chapters) == 9, chapters  # each chapter has one, on one of its pages
    assert all(any(found[page] for page in pages) for pages in chapters.values()), found
    chapter_2 = nbformat.read(ROOT / "chapters" / "02b_encoder_decoder.ipynb", as_version=4)
    trains = [i for i in smoke_cells(chapter_2)
              if "train_reversal(" in chapter_2.cells[i].source]
    assert trains, "the explorer's model is trained in the smoke subset of chapter 2"
