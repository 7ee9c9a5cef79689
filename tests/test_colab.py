"""The chapters in a Colab-like runtime: Colab's preinstalled versions, ipywidgets 7.7.1 already
imported by the kernel, transformer_lib missing until the setup cell installs it.

One environment is built once with Colab's versions (published pip freeze, 2026-08; Python and
torch are those available here: torch 2.13.0 from its local CPU wheel). Of each notebook the
smoke subset then runs (``notebook_smoke.py``: the setup cell, the imports, every explorer cell
and the cells it needs; the book build and nbval already execute every cell), as in a fresh
Colab runtime: the kernel imports ipywidgets at start (an IPython startup file), the setup cell
installs the library from a copy of this checkout (``TRANSFORMER_LIB_SOURCE``), and after the
notebook a probe cell moves every explorer control in the kernel. Between notebooks the library
is uninstalled again. For each notebook the test asserts: every cell of the subset ran;
``pip freeze`` shows no preinstalled package changed; every widget model the notebook created
is one that ipywidgets 7.7.1 provides (Colab's front end draws only those); every explorer has
controls, and every control changes a picture through the kernel. It also reports how long the
setup cell took.

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


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_a_colab_like_runtime(colab, notebook, capsys):
    python, env, baseline, models_7x, root = colab
    chapter = nbformat.read(notebook, as_version=4)
    smoke, executed = root / f"smoke-{notebook.name}", root / f"executed-{notebook.name}"
    nbformat.write(smoke_notebook(chapter), smoke)
    try:
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

        after = _freeze(python, env)
        assert after.pop("transformer-lib", None), "the setup cell installed the library"
        changed = {n: (baseline.get(n), after.get(n)) for n in baseline.keys() | after.keys()
                   if baseline.get(n) != after.get(n)}
        assert not changed, f"the setup cell changed preinstalled packages: {changed}"

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

        setup = code[0]  # the setup cell (the title is Markdown)
        timing = setup.metadata.get("execution", {})
        with capsys.disabled():
            seconds = "?"
            if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
                from datetime import datetime
                start = datetime.fromisoformat(timing["iopub.execute_input"].rstrip("Z"))
                end = datetime.fromisoformat(timing["shell.execute_reply"].rstrip("Z"))
                seconds = f"{(end - start).total_seconds():.1f}"
            print(f"\n{notebook.name}: {len(code) - 1} cells of the smoke subset; setup cell "
                  f"{seconds} s; {len(state)} widget models; {len(moved)} controls moved")
    finally:
        subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", "transformer_lib"],
                       env=env, capture_output=True)
