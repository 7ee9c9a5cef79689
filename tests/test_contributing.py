"""CONTRIBUTING.md against the code: every path it writes exists; every exercise checker is
listed; the layers are the ones tests/test_layering.py enforces; the markers are the
registered ones and `make check` leaves each out; the version agrees in its three places.
(The API is documented by the book's API reference page, generated from the docstrings;
tests/test_book.py checks that it covers every public name.)"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import transformer_lib
from transformer_lib import checks

import test_layering

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "CONTRIBUTING.md"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def section(title: str, text: str | None = None) -> str:
    """The body of the ``## title`` section of CONTRIBUTING.md (or of ``text``)."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"CONTRIBUTING.md has no section '## {title}'"
    return found.group(1)


def spans(text: str) -> list[str]:
    """The inline code spans of Markdown text (single backticks; fences are not inline)."""
    return re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)", text)


def _path_problem(text: str) -> str | None:
    """For a span that is a path: None if it exists (in the repository, or among the library's
    data files), else the problem."""
    if "<" in text or "NN" in text:
        return None  # a pattern, e.g. tests/test_<module>.py
    candidates = [ROOT / text, ROOT / "transformer_lib" / "data" / text]
    return None if any(p.exists() for p in candidates) else f"{text}: no such file"


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
    assert modules, f"chapter {number} needs a transformer_lib/checks/ch{number}_*.py"
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
