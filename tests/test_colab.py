"""The first chapter in a fresh environment, as on Colab: transformer_lib is not installed.

A clean virtual environment gets what Colab already has (torch, numpy, matplotlib,
ipywidgets, a Jupyter kernel) but not the course library. The notebook is executed there with
its setup cell pointed at a copy of this checkout (``TRANSFORMER_LIB_SOURCE``), so the cell
must install the library and every later cell must run.

Slow by nature (about a minute on two cores, mostly installing torch from its local wheel):
it is marked ``slow``; ``pytest -m "not slow"`` leaves it out.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from book_support import ROOT, setup_cell

pytestmark = pytest.mark.slow

NOTEBOOK = ROOT / "chapters" / "00_setup.ipynb"

# What Colab brings, pinned like requirements.txt (torch 2.13.0 installs from a local wheel).
_REQUIREMENT_NAMES = ("torch", "numpy", "matplotlib", "ipywidgets", "ipykernel")
_EXTRA = ["nbclient", "nbformat"]  # to run the notebook, as Colab's own machinery would


def _pinned_requirements() -> list[str]:
    pins = []
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        name = line.split("==")[0].strip().lower()
        if "==" in line and name in _REQUIREMENT_NAMES:
            pins.append(line.strip())
    assert len(pins) == len(_REQUIREMENT_NAMES), f"requirements.txt lacks one of {_REQUIREMENT_NAMES}"
    return pins


def _copy_library_source(dest: Path) -> Path:
    """What `git+URL` would fetch, minus everything but the package: pyproject, README, code."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "transformer_lib", dest / "transformer_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "IPYTHON"))}
    env.update(extra)
    return env


def test_setup_notebook_installs_the_library_in_a_fresh_environment(tmp_path: Path):
    env_dir = tmp_path / "colab-venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = _clean_env(PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                     PIP_DISABLE_PIP_VERSION_CHECK="1",
                     JUPYTER_DATA_DIR=str(tmp_path / "jupyter"))  # no user kernelspecs

    pip = subprocess.run([python, "-m", "pip", "install", "--quiet", *_pinned_requirements(), *_EXTRA],
                         env=env, cwd=tmp_path, capture_output=True, text=True)
    assert pip.returncode == 0, f"pip could not set up the fresh environment:\n{pip.stderr[-4000:]}"
    probe = subprocess.run([python, "-c", "import transformer_lib"], env=env, cwd=tmp_path,
                           capture_output=True)
    assert probe.returncode != 0, "the fresh environment must not have transformer_lib yet"

    source = _copy_library_source(tmp_path / "checkout")
    executed = tmp_path / "executed.ipynb"
    runner = f"""
import nbformat
from nbclient import NotebookClient
nb = nbformat.read({str(NOTEBOOK)!r}, as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={{"metadata": {{"path": {str(NOTEBOOK.parent)!r}}}}}).execute()
nbformat.write(nb, {str(executed)!r})
"""
    result = subprocess.run([python, "-c", runner], env={**env, setup_cell.SOURCE_VARIABLE: str(source)},
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, f"the notebook failed in the fresh environment:\n{result.stderr[-6000:]}"

    # The setup cell installed the library (into the fresh environment, from the copy) ...
    where = subprocess.run([python, "-c", "import transformer_lib; print(transformer_lib.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where
    # ... and every cell ran, up to the last code cell.
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
