"""CONTRIBUTING.md against the code: the API overview describes every name a notebook imports,
and every name, signature and path it writes exists; every exercise checker is listed; the
layers are the ones tests/test_layering.py enforces; the markers are the registered ones and
`make check` leaves each out; the version agrees in its three places."""
from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import keyword
import re
import tomllib
from pathlib import Path

import pytest

import transformer_lib
from transformer_lib import checks

import test_layering
from notebook_imports import import_nodes

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "CONTRIBUTING.md"
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "appendix").glob("*.ipynb"))
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def section(title: str, text: str | None = None) -> str:
    """The body of the ``## title`` section of CONTRIBUTING.md (or of ``text``)."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"CONTRIBUTING.md has no section '## {title}'"
    return found.group(1)


def module_sections(overview: str) -> dict[str, str]:
    """The API overview's text by module: each ``- `transformer_lib.x` ...`` bullet with its
    sub-bullets and continuation lines."""
    parts = re.split(r"^- `(transformer_lib(?:\.\w+)*)`", overview, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def spans(text: str) -> list[str]:
    """The inline code spans of Markdown text (single backticks; fences are not inline)."""
    return re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)", text)


# ---- what the notebooks import is described ------------------------------------------------

def _imported_names(path: Path) -> set[tuple[str, str]]:
    """(module, name) for every ``from transformer_lib.x import name`` in a notebook."""
    found = set()
    for node in import_nodes(path):
        if (isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("transformer_lib.")):
            found |= {(node.module, alias.name) for alias in node.names}
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_api_overview_lists_what_the_notebook_imports(notebook):
    sections = module_sections(section("API overview"))
    missing = []
    for module, name in sorted(_imported_names(notebook)):
        text = sections.get(module)
        if module == "transformer_lib.checks":
            ok = text is not None and name in section("Checkers") + text
        else:
            ok = text is not None and re.search(rf"`{re.escape(name)}\b", text)
        if not ok:
            missing.append(f"{module}.{name}")
    assert not missing, f"CONTRIBUTING.md's API overview does not describe {missing}"


# ---- every name and signature of the API overview exists ------------------------------------

_SHAPE = re.compile(r"^[A-Z](_kv|[a-z])?$")  # B, T, H_kv, Dk: shape letters, not names


def _resolve(module, dotted: str):
    """``module.a.b`` for ``dotted`` "a.b", or None."""
    obj = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj


def _source(module) -> str:
    """The source of a module, or of every file of a package."""
    path = Path(module.__file__)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def _arguments(text: str) -> list[str] | None:
    """The parameter names written between the first parentheses of a call, "..." kept; None
    when the parentheses do not close in ``text``."""
    depth, start = 0, text.index("(")
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            inner = text[start + 1:i]
            break
    else:
        return None
    pieces, depth, current = [], 0, ""
    for char in inner:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            pieces.append(current)
            current = ""
        else:
            current += char
    pieces.append(current)
    names = []
    for piece in (p.strip() for p in pieces):
        if piece in ("...", "…"):
            names.append("...")
        elif piece and piece != "*":
            names.append(re.match(r"\**(\w+)", piece).group(1))
    return names


def _signature_problems(obj, written: list[str], label: str) -> list[str]:
    """What is wrong with a signature as written: a parameter the code does not have, or,
    when the written one has no "...", a parameter of the code left out."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    real = [name for name in params if name not in ("self", "cls")]
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    problems = [f"{label}: no parameter {name!r} (it has {real})"
                for name in written if name != "..." and name not in real and not var_keyword]
    if "..." not in written and getattr(obj, "__module__", "").startswith("transformer_lib"):
        left_out = [name for name in real if name not in written]
        if left_out:
            problems.append(f"{label}: leaves out {left_out} (write them, or '...')")
    return problems


def _path_problem(text: str) -> str | None:
    """For a span that is a path: None if it exists (in the repository, or among the library's
    data files), else the problem."""
    if "<" in text or "NN" in text:
        return None  # a pattern, e.g. tests/test_<module>.py
    candidates = [ROOT / text, ROOT / "transformer_lib" / "data" / text]
    return None if any(p.exists() for p in candidates) else f"{text}: no such file"


def api_problems(module_name: str, text: str) -> list[str]:
    """Every name in the module's part of the overview that the module does not have."""
    module = importlib.import_module(module_name)
    source = _source(module)
    problems = []
    for span in spans(text):
        span = span.strip().lstrip(".")
        if re.fullmatch(r"[\w./-]+\.(py|pt|json|md|txt|toml|yml|ipynb)|[\w.-]+/[\w./-]*", span):
            problems.append(_path_problem(span))
            continue
        head = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", span)
        if not head or keyword.iskeyword(head.group(0).split(".")[0]):
            continue  # a literal, a shape, a statement
        name = head.group(0)
        if span[len(name):].startswith("("):
            obj = _resolve(module, name)
            if name.startswith("transformer_lib."):
                obj = importlib.import_module(name)
            if obj is None:
                problems.append(f"{module_name}: {name}(...) does not exist")
                continue
            written = _arguments(span)
            if written is not None:
                problems += _signature_problems(obj, written, f"{module_name}.{name}")
            continue
        for word in re.findall(r"[A-Za-z_][\w.]*", span):
            word = word.rstrip(".")
            if (_SHAPE.match(word) or hasattr(builtins, word) or keyword.iskeyword(word)
                    or word.startswith("transformer_lib")):
                continue
            if _resolve(module, word) is None and not re.search(rf"\b{re.escape(word)}\b",
                                                                source):
                problems.append(f"{module_name}: {word} is not in the module")
    return [p for p in problems if p]


SECTIONS = module_sections(section("API overview"))


@pytest.mark.parametrize("module", sorted(SECTIONS))
def test_api_overview_names_and_signatures_exist(module):
    problems = api_problems(module, SECTIONS[module])
    assert not problems, "\n".join(problems)


def test_api_overview_covers_every_module_of_the_library():
    described = {name.split(".")[1] for name in SECTIONS}
    layers = test_layering.CORE | test_layering.MODELS | test_layering.TEACHING
    assert layers <= described, f"not in the API overview: {sorted(layers - described)}"


def test_the_signature_check_catches_drift():
    """A parameter renamed or left out, a name removed, a missing file: each is reported."""
    text = ("`Decoder.generate(tokens, max_new_tokens, temperature=0.0, top_k=None, "
            "use_cache=True, generator=None, top_q=None)`, `Decoder.forward(tokens)`, "
            "`DecoderGone`, `transformer_lib/data/nothing.pt`, `Decoder.new_cache(...)`")
    problems = "\n".join(api_problems("transformer_lib.decoder", text))
    assert "no parameter 'top_q'" in problems and "leaves out ['top_p']" in problems
    assert "leaves out ['cache']" in problems
    assert "DecoderGone is not in the module" in problems
    assert "nothing.pt: no such file" in problems
    assert "new_cache" not in problems


# ---- checkers, chapters with exercises, layers ----------------------------------------------

def test_every_checker_is_listed_with_its_module():
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.*) \|$", section("Checkers"), re.M)
    listed = {name: module for _, module, names in rows for name in re.findall(r"`(\w+)`", names)}
    exported = {name for name in checks.__all__ if name.startswith("check_")}
    assert set(listed) == exported, (f"not listed: {sorted(exported - set(listed))}; "
                                     f"listed but not exported: {sorted(set(listed) - exported)}")
    for name, module in listed.items():
        assert getattr(checks, name).__module__ == f"transformer_lib.checks.{module}", name


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_a_chapter_with_exercises_has_checkers_and_their_tests(chapter):
    source = chapter.read_text(encoding="utf-8")
    if "{exercise}" not in source:
        pytest.skip(f"{chapter.name} has no exercises")
    number = chapter.name[:2]
    modules = sorted((ROOT / "transformer_lib" / "checks").glob(f"ch{number}_*.py"))
    assert len(modules) == 1, f"chapter {number} needs one transformer_lib/checks/ch{number}_*.py"
    assert (ROOT / "tests" / f"test_checks_ch{number}.py").exists(), (
        f"chapter {number} has exercises but no tests/test_checks_ch{number}.py")


def test_the_layers_are_the_ones_the_layering_test_enforces():
    text = section("The library")
    found = {}
    for layer, names in re.findall(r"^\d\. \*(\w+)\*: (.*?)(?=^\d\. |^\S|\Z)", text, re.S | re.M):
        found[layer] = {n for n in re.findall(r"`(\w+)`", names.split(". A ")[0])}
    assert found == {"core": test_layering.CORE, "models": test_layering.MODELS,
                     "teaching": test_layering.TEACHING}
    library = ROOT / "transformer_lib"
    for name in set().union(*found.values()):
        assert (library / f"{name}.py").exists() or (library / name / "__init__.py").exists(), name


# ---- markers, commands, paths, version ----------------------------------------------------

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_markers_are_the_registered_ones_and_make_check_leaves_each_out():
    registered = {line.split(":")[0] for line in
                  _pyproject()["tool"]["pytest"]["ini_options"]["markers"]}
    described = set(re.findall(r"^\| `(\w+)` \|", section("The loop"), re.M))
    assert described == registered
    (quick,) = re.findall(r"^QUICK\s*:=(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert set(re.findall(r"not (\w+)", quick)) == registered
    assert quick.strip() in " ".join(section("The loop").split())


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_every_make_command_named_exists(doc):
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", (ROOT / doc).read_text(encoding="utf-8")))
    assert named and named <= _make_targets(), f"no such target: {sorted(named - _make_targets())}"


def test_every_path_the_manual_names_exists():
    """Paths under _build/ are what `make book` generates: a fresh clone has none of them."""
    text = DOC.read_text(encoding="utf-8")
    paths = {s for s in spans(text) if re.fullmatch(r"[\w.-]+/[\w./<>-]*|[\w-]+\.(md|toml|yml|txt)", s)
             and not s.startswith("_build/")}
    problems = [p for p in map(_path_problem, sorted(paths)) if p]
    assert len(paths) > 20 and not problems, problems


def test_every_test_file_is_a_module_test_or_on_the_map():
    text = section("Tests")
    modules = {p.stem for p in (ROOT / "transformer_lib").glob("*.py")}
    modules |= {p.name for p in (ROOT / "transformer_lib").iterdir() if p.is_dir()}
    modules |= {f"variants_{p.stem}" for p in (ROOT / "transformer_lib" / "variants").glob("*.py")}
    unmapped = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        chapter_checks = re.fullmatch(r"checks_ch\d\d", name) and "test_checks_chNN.py" in text
        if name not in modules and path.name not in text and not chapter_checks:
            unmapped.append(path.name)
    assert not unmapped, f"say what these test in CONTRIBUTING.md's '## Tests': {unmapped}"


def test_the_version_agrees_in_pyproject_the_package_and_the_changelog():
    version = _pyproject()["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    (latest,) = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.M)[:1]
    assert transformer_lib.__version__ == version == latest
