"""Binder's environment (``binder/``): CPU-only torch, only what a reader needs, and the book
runs in it.

Binder builds its image with ``pip install -r binder/requirements.txt`` from the repository's
root. The slow test does the same in a fresh virtual environment. The PyTorch CPU index line
is left out here, since this machine reaches no such index: the same ``+cpu`` wheel comes
from the local package registry. Then it checks what was installed and runs, with a kernel of
that environment (ipykernel and nbclient, which Binder's base image provides, are added after
the checks), the smoke subset of every notebook (``notebook_smoke.py``: setup cell, imports,
every explorer and the cells it needs; the book build and nbval already execute every cell),
and with it, in a chapter that looks for an optional package (``OPTIONAL``), every cell that
reads a name bound from that package (``notebook_smoke.optional_cells``) and what those cells
need: Binder leaves those packages out, so only here do the chapters' fallback branches run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import venv
from pathlib import Path

import nbformat
import pytest

from book_support import ROOT, setup_cell
from notebook_smoke import explorer_cells, optional_cells, smoke_notebook

BINDER = ROOT / "binder"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NOTEBOOKS = [*CHAPTERS, *sorted((ROOT / "appendix").glob("*.ipynb"))]
# How a chapter looks for a package it can do without (transformers, for a comparison).
OPTIONAL = re.compile(r"except (ModuleNotFoundError|ImportError)\b|find_spec\(\s*[\"']")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Packages only the maintainers need: the book build, the browser and reference tests.
MAINTAINER_ONLY = {"jupyter-book", "sphinx", "sphinx-exercise", "myst-nb", "playwright",
                   "pytest", "nbval", "transformers", "tokenizers", "huggingface-hub",
                   "safetensors"}
SIZE_LIMIT = 1.5e9  # bytes on disk for the environment Binder adds


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _pin(lines: list[str], name: str) -> str:
    found = [line.split("==", 1)[1] for line in lines if line.lower().startswith(f"{name}==")]
    assert len(found) == 1, f"{name} is not pinned once"
    return found[0]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_binder_requirements_are_cpu_only_and_for_readers():
    lines = _lines(BINDER / "requirements.txt")
    assert f"--extra-index-url {CPU_INDEX}" in lines
    root = _lines(ROOT / "requirements.txt")
    torch = _pin(lines, "torch")
    assert torch == _pin(root, "torch") + "+cpu", "the CPU build of the version the course tests"
    for name in ("numpy", "matplotlib"):
        assert _pin(lines, name) == _pin(root, name)
    assert "." in lines, "the course library, from the repository"
    names = {_normalise(re.split(r"[=<>~ ]", line)[0]) for line in lines
             if not line.startswith("-") and line != "."}
    assert names == {"torch", "numpy", "matplotlib", "ipywidgets"}
    assert _lines(BINDER / "runtime.txt") == ["python-3.11"]


def needs_optional_package(notebook: Path) -> bool:
    """Whether a notebook's code (the setup cell aside) looks for an optional package."""
    return any(OPTIONAL.search(cell.source)
               for cell in nbformat.read(notebook, as_version=4).cells
               if cell.cell_type == "code" and not setup_cell.is_setup_cell(cell))


def test_the_chapters_with_an_optional_package_are_found():
    """Their fallback branches run in Binder's environment; the search must find the known
    ones, and in each the cells that take the fallback branch."""
    optional = {p.name for p in CHAPTERS if needs_optional_package(p)}
    assert {"06b_testing_and_sampling.ipynb", "08b_measuring_fast_attention.ipynb"} <= optional
    assert "01_attention.ipynb" not in optional
    for chapter in CHAPTERS:
        cells = optional_cells(nbformat.read(chapter, as_version=4))
        assert bool(cells) == (chapter.name in optional), (chapter.name, cells)


def _size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.slow
def test_binder_environment_is_small_and_runs_the_book(tmp_path: Path, capsys):
    env_dir = tmp_path / "binder-venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "IPYTHON"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1",
               PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               JUPYTER_DATA_DIR=str(tmp_path / "jupyter"))
    local = tmp_path / "requirements.txt"  # the same file without the unreachable index
    local.write_text("\n".join(line for line in _lines(BINDER / "requirements.txt")
                               if not line.startswith("--extra-index-url")) + "\n")
    pip = subprocess.run([python, "-m", "pip", "install", "--quiet", "-r", str(local)],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert pip.returncode == 0, f"pip failed:\n{pip.stderr[-4000:]}"

    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], env=env,
                            capture_output=True, text=True, check=True).stdout
    installed = {_normalise(p["name"]): p["version"] for p in json.loads(listed)}
    cuda = sorted(n for n in installed if n.startswith("nvidia") or "cuda" in n or n == "triton")
    assert not cuda, f"CUDA packages in Binder's environment: {cuda}"
    assert not MAINTAINER_ONLY & installed.keys(), MAINTAINER_ONLY & installed.keys()
    assert installed["torch"].endswith("+cpu")
    assert "transformer-lib" in installed
    size = _size(env_dir)
    with capsys.disabled():
        print(f"\nBinder environment: {len(installed)} packages, {size / 1e9:.2f} GB on disk")
    assert size < SIZE_LIMIT, f"{size / 1e9:.2f} GB"

    # What Binder's base image brings: a kernel and the machinery that runs notebooks.
    subprocess.run([python, "-m", "pip", "install", "--quiet", "ipykernel", "nbclient"],
                   env=env, check=True, capture_output=True)
    runs = []  # (notebook to run, the folder it runs in)
    fallbacks = []  # the notebooks whose fallback cells run too
    for notebook in NOTEBOOKS:
        nb = nbformat.read(notebook, as_version=4)
        optional = optional_cells(nb)
        fallbacks += [notebook.name] if optional else []
        target = tmp_path / f"smoke-{notebook.name}"
        nbformat.write(smoke_notebook(nb, explorer_cells(nb) + optional), target)
        runs += [str(target), str(notebook.parent)]
    runner = """
import sys, nbformat
from nbclient import NotebookClient
for path, folder in zip(sys.argv[1::2], sys.argv[2::2]):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": folder}}).execute()
    print("ran", path, flush=True)
"""
    result = subprocess.run([python, "-c", runner, *runs], env=env, cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        f"a notebook failed in Binder's environment:\n{result.stderr[-6000:]}")
    assert result.stdout.count("ran ") == len(NOTEBOOKS)
    with capsys.disabled():
        print(f"ran the smoke subset of {len(NOTEBOOKS)} notebooks, with the fallback cells "
              f"of {', '.join(fallbacks)}")
