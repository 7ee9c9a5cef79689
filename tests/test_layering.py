"""The library's layers, read from its imports (never upward):

core (attention, recording, norms, positional, ffn, cache, validation, flash, sampling,
variants)
-> models (encoder_decoder, decoder, convert)
-> teaching (tasks, stability, text, recall, measure, resources, plotting, widgets, checks).

A core module imports no model or teaching module, a model no teaching module. ``checks`` (the
exercise checkers, one per chapter) is a leaf: no other library module imports it. The sets
below are the one list of layers; the docs are checked against them.
"""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "transformer_lib"
CORE = {"attention", "recording", "norms", "positional", "ffn", "cache", "validation", "flash",
        "sampling", "variants"}
MODELS = {"encoder_decoder", "decoder", "convert"}
TEACHING = {"tasks", "stability", "text", "recall", "measure", "resources", "plotting", "widgets",
            "checks"}
LEAVES = {"checks"}  # teaching modules no other library module may import


def _module_of(path: Path) -> str:
    """The top-level library module a file belongs to: 'checks' for checks/ch01_attention.py."""
    parts = path.relative_to(LIB).with_suffix("").parts
    return parts[0]


def _imported(path: Path) -> set[str]:
    """The library modules a file imports (absolute or relative), by top-level name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside a package of the library
                names.add(_module_of(path))
                continue
            modules = [node.module or ""]
            if modules == ["transformer_lib"]:  # from transformer_lib import widgets
                modules = [f"transformer_lib.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "transformer_lib" and len(parts) > 1:
                names.add(parts[1])
    return names


FILES = sorted(p for p in LIB.rglob("*.py") if p.name != "__init__.py" or p.parent != LIB)


def test_every_module_has_a_layer():
    modules = {_module_of(p) for p in FILES}
    unplaced = modules - (CORE | MODELS | TEACHING)
    assert not unplaced, f"put {sorted(unplaced)} in one of the three layers"
    assert {"attention", "encoder_decoder", "decoder", "tasks", "checks", "plotting",
            "widgets"} <= modules


def test_the_layers_do_not_overlap_and_the_docstring_lists_them():
    assert not (CORE & MODELS or CORE & TEACHING or MODELS & TEACHING)
    words = set(__doc__.replace(",", " ").replace("(", " ").replace(")", " ").split())
    missing = (CORE | MODELS | TEACHING) - words
    assert not missing, f"the module docstring does not list {sorted(missing)}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(LIB)) for p in FILES])
def test_imports_never_go_up_a_layer(path):
    module, imported = _module_of(path), _imported(path)
    if module in CORE:
        assert not imported & (MODELS | TEACHING), f"core module {module} imports {imported}"
    if module in MODELS:
        assert not imported & TEACHING, f"model module {module} imports {imported}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(LIB)) for p in FILES])
def test_nothing_outside_checks_imports_checks(path):
    module = _module_of(path)
    leaves = _imported(path) & LEAVES - {module}
    assert not leaves, f"{path.relative_to(LIB)} imports {sorted(leaves)}, which must stay leaves"


def test_the_reader_catches_an_upward_import(tmp_path):
    fake = LIB / "attention.py"
    source = ("from transformer_lib.tasks import BOS\nimport transformer_lib.widgets as w\n"
              "from transformer_lib import checks\n")
    tree_file = tmp_path / "attention.py"
    tree_file.write_text(source, encoding="utf-8")
    assert _imported(tree_file) == {"tasks", "widgets", "checks"}
    assert _module_of(fake) == "attention"
    assert _module_of(LIB / "plotting" / "style.py") == "plotting"
