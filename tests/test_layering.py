"""The library's import rules are import-linter contracts in pyproject.toml
(``[tool.importlinter]``): core (attention, recording, norms, positional, ffn, cache,
validation, flash, sampling, variants) -> models (encoder_decoder, decoder, convert) ->
teaching (tasks, stability, text, recall, measure, resources, plotting, widgets, quiz,
checks), never upward; ``checks`` a leaf; core and models never import plotting, widgets or checks; and
no import circle between the modules of a package.

Here: the contracts hold (``lint-imports``), every module has a layer (a contract does not ask
that), and the contracts catch an upward import and a circle planted in a copy of the library.
``CORE``, ``MODELS`` and ``TEACHING``, read from the contract, are the one list of layers; the
docs are checked against them.
"""
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "transformer_lib"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = {c["id"]: c for c in tomllib.loads(
    (ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]}


def _layer(text: str) -> set[str]:
    return {name.strip() for name in text.split(":")}


_CHECKS, _TEACHING, _MODELS, _CORE = CONTRACTS["layers"]["layers"]
CORE, MODELS = _layer(_CORE), _layer(_MODELS)
TEACHING = _layer(_TEACHING) | _layer(_CHECKS)


def _lint_imports(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of ``cwd``/pyproject.toml, without a cache."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 3 kept, 0 broken." in run.stdout


def test_every_module_has_one_layer():
    modules = {p.stem if p.is_file() else p.name for p in LIB.iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert not (CORE & MODELS or CORE & TEACHING or MODELS & TEACHING)
    assert modules == CORE | MODELS | TEACHING, (
        f"put {sorted(modules - (CORE | MODELS | TEACHING))} in a layer of pyproject.toml; "
        f"no such module: {sorted((CORE | MODELS | TEACHING) - modules)}")
    forbidden = CONTRACTS["no-figures-below-teaching"]["source_modules"]
    assert {name.removeprefix("transformer_lib.") for name in forbidden} == CORE | MODELS
    words = set(__doc__.replace(",", " ").replace("(", " ").replace(")", " ").split())
    assert CORE | MODELS | TEACHING <= words, "the module docstring lists every layer"


def test_the_contracts_catch_an_upward_import_and_a_circle(tmp_path):
    """In a copy of the library, validation (core) imports resources (teaching), and tasks
    imports stability inside a function, as the lazy re-export of 0.4 did (a circle: stability
    imports tasks): both contracts break."""
    shutil.copytree(LIB, tmp_path / "transformer_lib",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    validation = tmp_path / "transformer_lib" / "validation.py"
    validation.write_text(validation.read_text(encoding="utf-8")
                          + "\nfrom transformer_lib.resources import load_json  # noqa\n",
                          encoding="utf-8")
    tasks = tmp_path / "transformer_lib" / "tasks.py"
    tasks.write_text(tasks.read_text(encoding="utf-8") + (
        "\n\ndef __getattr__(name):\n    from transformer_lib import stability\n\n"
        "    return getattr(stability, name)\n"), encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    run = _lint_imports(tmp_path, env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Contracts: 1 kept, 2 broken." in run.stdout
    assert "transformer_lib.validation -> transformer_lib.resources" in run.stdout
    assert "No cycles are allowed in transformer_lib.\n" in run.stdout
    assert "- .tasks -> .stability (1 import)" in run.stdout
