"""Every word a checker shows goes through one function, ``checks._messages.say``, as a
template with named placeholders, so that an edition in another language can translate the
checkers by adding a catalog (``checks._messages.CATALOG``).

Read from the checkers' source: a sentence (a string literal with a letter and a space that is
not a docstring) appears only as the template of a ``say`` call; no f-string, ``%`` or
``str.format`` builds text; each template's placeholders are named, and are exactly the
keywords its call passes. Then a catalog entry changes what a checker prints."""
from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest
import torch

from transformer_lib.checks import _messages

from book_support import ROOT

CHECKS = sorted((ROOT / "transformer_lib" / "checks").glob("*.py"))
SENTENCE = re.compile(r"[A-Za-z].* |.* .*[A-Za-z]")  # a letter and a space


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of the module, its classes and its functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _is_say(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id == "say")
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "say"))


def _templates(tree: ast.Module) -> dict[int, ast.Call]:
    """The id of each ``say`` call's template node -> the call."""
    return {id(call.args[0]): call for call in ast.walk(tree)
            if _is_say(call) and call.args and isinstance(call.args[0], ast.Constant)}


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


@pytest.mark.parametrize("path", CHECKS, ids=[p.name for p in CHECKS])
def test_no_text_is_built_outside_say(path):
    tree = _tree(path)
    built = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            built.append(f"{_where(path, node)}: an f-string")
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
              and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)):
            built.append(f"{_where(path, node)}: % formatting")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("format", "format_map")
              and isinstance(node.func.value, ast.Constant)):
            built.append(f"{_where(path, node)}: str.format")
    assert not built, "build messages with say(template, name=value):\n" + "\n".join(built)


@pytest.mark.parametrize("path", CHECKS, ids=[p.name for p in CHECKS])
def test_every_sentence_is_the_template_of_a_say_call(path):
    tree = _tree(path)
    allowed = _docstrings(tree) | set(_templates(tree))
    loose = [f"{_where(path, node)}: {node.value[:60]!r}" for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and SENTENCE.search(node.value) and id(node) not in allowed]
    assert not loose, "sentences outside say(...):\n" + "\n".join(loose)


@pytest.mark.parametrize("path", CHECKS, ids=[p.name for p in CHECKS])
def test_every_template_names_exactly_the_values_it_is_given(path):
    wrong = []
    for node in ast.walk(_tree(path)):
        if not _is_say(node):
            continue
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) \
                or not isinstance(node.args[0].value, str):
            wrong.append(f"{_where(path, node)}: the template is not one string literal")
            continue
        if any(k.arg is None for k in node.keywords):
            wrong.append(f"{_where(path, node)}: **values: name each value")
            continue
        fields = [f for _, f, _, _ in string.Formatter().parse(node.args[0].value)
                  if f is not None]
        names = {re.split(r"[.\[]", f, maxsplit=1)[0] for f in fields}
        if any(not n.isidentifier() for n in names):
            wrong.append(f"{_where(path, node)}: unnamed placeholder in "
                         f"{node.args[0].value!r}")
        elif names != {k.arg for k in node.keywords}:
            wrong.append(f"{_where(path, node)}: placeholders {sorted(names)}, keywords "
                         f"{sorted(k.arg for k in node.keywords)}")
    assert not wrong, "\n".join(wrong)


def test_say_fills_the_placeholders_and_a_catalog_translates(monkeypatch):
    assert _messages.say("row {row} sums to {total:.2f}, not 1", row=(0,), total=0.5) == \
        "row (0,) sums to 0.50, not 1"
    monkeypatch.setitem(_messages.CATALOG, "row {row} sums to {total:.2f}, not 1",
                        "第 {row} 行之和为 {total:.2f}，不是 1")
    assert _messages.say("row {row} sums to {total:.2f}, not 1", row=(0,), total=0.5) == \
        "第 (0,) 行之和为 0.50，不是 1"


def test_a_catalog_entry_changes_what_a_checker_prints(monkeypatch, capsys):
    from transformer_lib.checks import check_masked_softmax

    def masked_softmax(scores, mask=None):
        return torch.zeros_like(scores)  # wrong: every check that compares values fails

    english = check_masked_softmax(masked_softmax).report
    monkeypatch.setitem(_messages.CATALOG, "{exercise}: {passed} of {n} checks passed.",
                        "{exercise}：{n} 项检查通过了 {passed} 项。")
    translated = check_masked_softmax(masked_softmax).report
    capsys.readouterr()
    assert english.splitlines()[0].endswith("checks passed.")
    assert translated.splitlines()[0].startswith("masked_softmax：")
    assert translated.splitlines()[1:] == english.splitlines()[1:]
