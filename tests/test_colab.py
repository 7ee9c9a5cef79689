"""The chapters in a Colab-like runtime: Colab's preinstalled versions, ipywidgets 7.7.1 already
imported by the kernel, transformer_lib missing until the setup cell installs it.

One environment is built once with Colab's versions (published pip freeze, 2026-08; Python and
torch are those available here: torch 2.13.0 from its local CPU wheel). Of each notebook the
smoke subset then runs (``notebook_smoke.py``: the setup cell, the imports, every explorer cell
and the cells it needs; the book build and nbval already execute every cell), as in a fresh
Colab runtime: the kernel imports ipywidgets at start (an IPython startup file), the setup cell
installs the library from a copy of this checkout (``TRANSFORMER_LIB_SOURCE``), and after the
notebook a probe cell moves every explorer control in the kernel. The setup cell's own install
is tested once, on chapter 0, in the runtime without the library (it is the same cell in every
notebook: ``tests/test_publishing.py`` and ``tools/setup_cell.py`` keep it so); the library
then stays installed, and every notebook runs with it, its setup cell finding it there. For
each notebook the test asserts: every cell of the subset ran; ``pip freeze`` shows no
preinstalled package changed; every widget model the notebook created is one that ipywidgets
7.7.1 provides (Colab's front end draws only those); every explorer has controls, and every
control changes a picture through the kernel. It also reports how long the setup cell took.

Slow (about two minutes, most of it building the environment): marked ``slow``; CI runs it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv

import nbformat
import pytest

from book_support import ROOT, setup_cell
from notebook_smoke import explorer_cells, smoke_notebook

pytestmark = pytest.mark.slow

NOTEBOOKS = [*sorted((ROOT / "chapters").glob("*.ipynb")),
             *sorted((ROOT / "appendix").glob("*.ipynb"))]

# Colab's preinstalled versions that the course touches (its pip freeze, 2026-08).
COLAB = {
    "numpy": "2.1.3", "matplotlib": "3.10.0", "pillow": "11.3.0",
    "ipywidgets": "7.7.1", "widgetsnbextension": "3.6.10", "jupyterlab-widgets": "3.0.16",
    "ipykernel": "6.17.1", "ipython": "7.34.0", "traitlets": "5.7.1",
    "jupyter-client": "7.4.9", "transformers": "5.15.0", "tokenizers": "0.22.2",
    "safetensors": "0.8.0", "huggingface-hub": "1.27.0", "tqdm": "4.67.3",
    "nbclient": "0.10.4", "nbformat": "5.11.1",
}

# Runs in the kernel after the notebook: move every explorer control, report what changed.
PROBE = r'''
import json as _json
import ipywidgets as _widgets

def _pictures(box):
    found, todo = [], [box]
    while todo:
        w = todo.pop()
        if isinstance(w, _widgets.Image):
            found.append(bytes(w.value))
        elif isinstance(w, _widgets.HTML) and "explorer-frame" in w._dom_classes:
            found.append(w.value)  # a text frame (transformer_lib.widgets.frames.FRAME_CLASS)
        todo.extend(getattr(w, "children", ()))
    return found

_report = []
for _box in list(_widgets.Widget.widgets.values()):
    _controls = getattr(_box, "controls", None)
    if not isinstance(_controls, dict):
        continue
    for _name, _control in _controls.items():
        _before = _pictures(_box)
        if hasattr(_control, "options") and not hasattr(_control, "max"):
            _control.index = (_control.index + 1) % len(_control.options)
        else:
            _control.value = _control.max if _control.value != _control.max else _control.min
        _report.append({"control": _name, "changed": _pictures(_box) != _before})
print("PROBE " + _json.dumps(_report))
'''

RUNNER = r'''
import json, sys, time
import nbformat
from nbclient import NotebookClient

path, out, probe, folder = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell(open(probe).read()))
client = NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                        allow_errors=True, resources={"metadata": {"path": folder}})
client.execute()
nbformat.write(nb, out)
'''


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _freeze(python: str, env: dict) -> dict[str, str]:
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], env=env,
                            capture_output=True, text=True, check=True).stdout
    return {_normalise(p["name"]): p["version"] for p in json.loads(listed)}


def _torch_pin() -> str:
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("torch=="):
            return line.strip()
    raise AssertionError("requirements.txt pins no torch")


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A Colab-like environment, built once: ``(python, env, baseline freeze, 7.x models)``."""
    root = tmp_path_factory.mktemp("colab")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    ipython_dir = root / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    # Colab's kernel has ipywidgets imported before the first cell runs.
    (startup / "00-colab.py").write_text("import ipywidgets\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "IPYTHON"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1",
               PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               JUPYTER_DATA_DIR=str(root / "jupyter"), IPYTHONDIR=str(ipython_dir))
    pins = [_torch_pin()] + [f"{name}=={version}" for name, version in COLAB.items()]
    pip = subprocess.run([python, "-m", "pip", "install", "--quiet", *pins], env=env,
                         capture_output=True, text=True)
    assert pip.returncode == 0, f"could not build the Colab-like environment:\n{pip.stderr[-4000:]}"
    baseline = _freeze(python, env)
    assert "transformer-lib" not in baseline
    assert all(baseline[name] == version for name, version in COLAB.items())
    models = subprocess.run([python, "-c", (
        "import json, ipywidgets as w\n"
        "def walk(c):\n"
        "    yield c\n"
        "    for s in c.__subclasses__():\n"
        "        yield from walk(s)\n"
        "print(json.dumps(sorted({(c._model_module.default_value, c._model_module_version"
        ".default_value, c._model_name.default_value) for c in walk(w.Widget)})))")],
        env=env, capture_output=True, text=True, check=True).stdout
    source = root / "checkout"  # what `git+URL` would fetch: the package and its metadata
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "transformer_lib", source / "transformer_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env[setup_cell.SOURCE_VARIABLE] = str(source)
    (root / "probe.py").write_text(PROBE, encoding="utf-8")
    yield python, env, baseline, {tuple(m) for m in json.loads(models)}, root


def _uninstall(python: str, env: dict) -> None:
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", "transformer_lib"],
                   env=env, capture_output=True)


def _run_smoke(colab, notebook, name: str):
    """Run the smoke subset of ``notebook`` and the probe; the executed notebook's code cells."""
    python, env, _, _, root = colab
    smoke, executed = root / f"{name}-{notebook.name}", root / f"executed-{name}-{notebook.name}"
    nbformat.write(smoke_notebook(nbformat.read(notebook, as_version=4)), smoke)
    run = subprocess.run([python, "-c", RUNNER, str(smoke), str(executed),
                          str(root / "probe.py"), str(notebook.parent)], env=env, cwd=root,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"the runner failed:\n{run.stderr[-6000:]}"
    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(code)
              for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, f"cells raised in the Colab-like runtime: {errors}"
    assert all(c.execution_count is not None for c in code)
    return nb, code


def _assert_only_the_library_was_added(colab):
    python, env, baseline, _, _ = colab
    after = _freeze(python, env)
    assert after.pop("transformer-lib", None), "the library is installed"
    changed = {n: (baseline.get(n), after.get(n)) for n in baseline.keys() | after.keys()
               if baseline.get(n) != after.get(n)}
    assert not changed, f"the setup cell changed preinstalled packages: {changed}"


def _setup_seconds(setup) -> str:
    timing = setup.metadata.get("execution", {})
    if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
        from datetime import datetime
        start = datetime.fromisoformat(timing["iopub.execute_input"].rstrip("Z"))
        end = datetime.fromisoformat(timing["shell.execute_reply"].rstrip("Z"))
        return f"{(end - start).total_seconds():.1f}"
    return "?"


def test_the_setup_cell_installs_the_library_in_a_colab_like_runtime(colab, capsys):
    """The one install of the module: a runtime without the library, chapter 0's smoke subset
    (its setup cell installs the library, then the chapter imports it)."""
    python, env = colab[:2]
    _uninstall(python, env)
    assert "transformer-lib" not in _freeze(python, env)
    _, code = _run_smoke(colab, ROOT / "chapters" / "00_setup.ipynb", "install")
    _assert_only_the_library_was_added(colab)
    setup = code[0]
    assert "pip" not in "".join(o.get("text", "") for o in setup.outputs), setup.outputs
    with capsys.disabled():
        print(f"\nthe setup cell installed the library in {_setup_seconds(setup)} s")


@pytest.fixture(scope="module")
def colab_with_library(colab):
    """The Colab-like runtime with the library installed as the setup cell installs it."""
    python, env = colab[:2]
    if "transformer-lib" not in _freeze(python, env):
        pip = subprocess.run([python, "-m", "pip", "install", "--quiet",
                              env[setup_cell.SOURCE_VARIABLE]], env=env, capture_output=True,
                             text=True)
        assert pip.returncode == 0, pip.stderr[-4000:]
    return colab


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_a_colab_like_runtime(colab_with_library, notebook, capsys):
    colab = colab_with_library
    chapter = nbformat.read(notebook, as_version=4)
    nb, code = _run_smoke(colab, notebook, "smoke")
    _assert_only_the_library_was_added(colab)
    models_7x = colab[3]

    state = nb.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    used = {(m["model_module"], m["model_module_version"], m["model_name"])
            for m in state.values()}
    assert not used - models_7x, f"models ipywidgets 7.7.1 lacks: {sorted(used - models_7x)}"

    probe = [line for o in code[-1].outputs for line in o.get("text", "").splitlines()
             if line.startswith("PROBE ")]
    moved = json.loads(probe[0][len("PROBE "):])
    assert bool(moved) == bool(explorer_cells(chapter)), "explorers without controls"
    assert all(m["changed"] for m in moved), f"controls that changed no picture: {moved}"

    with capsys.disabled():
        print(f"\n{notebook.name}: {len(code) - 1} cells of the smoke subset; setup cell "
              f"{_setup_seconds(code[0])} s; {len(state)} widget models; "
              f"{len(moved)} controls moved")
