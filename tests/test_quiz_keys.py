"""Every numeric quiz key of the built book equals the library call that defines it,
recomputed here (the page glued it when the book was executed: _ext/quiz.py)."""
from __future__ import annotations

import html
import re

import pytest
import torch

from transformer_lib.attention import MultiHeadAttention, causal_mask, masked_softmax

from book_support import ensure_built_book

pytestmark = pytest.mark.book


def _unseen_directions() -> float:
    """Directions of a key's input that one head of a 512-wide, 8-head layer cannot see."""
    layer = MultiHeadAttention(d_model=512, n_heads=8)
    w_k = layer.k_proj.weight[: layer.head_dim].T  # (C, D): head 0's W_K
    return 512 - int(torch.linalg.matrix_rank(w_k))


def _score_divisor() -> float:
    """What each head of a 1024-wide, 16-head layer divides its scores by: sqrt(D)."""
    return MultiHeadAttention(d_model=1024, n_heads=16).head_dim ** 0.5


def _cross_weights() -> int:
    """The numbers in a cross-attention's weights, decoder 6 and source 9, batch 3, 8 heads."""
    layer = MultiHeadAttention(d_model=16, n_heads=8, keep_weights=True)
    layer(torch.randn(3, 6, 16), context=torch.randn(3, 9, 16))
    return layer.last_weights.numel()  # (B, H, T, S)


# A numeric quiz's key name (``:key:``) -> the library call that computes it.
KEYS = {
    "quiz_score_divisor": _score_divisor,
    "quiz_softmax_weight": lambda: masked_softmax(torch.tensor([3.0, 3.0, 0.0]))[0].item(),
    "quiz_predictions": lambda: int(causal_mask(5).any(dim=-1).sum()),
    "quiz_unseen_directions": _unseen_directions,
    "quiz_cross_weights": _cross_weights,
}

_FORM = re.compile(r'<form class="quiz quiz-number"[^>]*>')
_ATTRIBUTE = re.compile(r'(data-[\w-]+)="([^"]*)"')


def numeric_quizzes(root) -> list[tuple[str, dict[str, str]]]:
    """(page, attributes) of every numeric quiz of the built edition at ``root``."""
    found = []
    for path in sorted(root.glob("chapters/*.html")):
        for form in _FORM.findall(path.read_text(encoding="utf-8")):
            found.append((path.stem, {k: html.unescape(v) for k, v in _ATTRIBUTE.findall(form)}))
    return found


def test_every_numeric_key_equals_its_library_call():
    root = ensure_built_book()
    found = numeric_quizzes(root)
    assert found, "no numeric quiz in the built book"
    for page, attributes in found:
        name = attributes["data-key-name"]
        assert name in KEYS, f"{page}: add the library call of {name!r} to KEYS"
        expected = float(KEYS[name]())
        assert float(attributes["data-key"]) == pytest.approx(expected, rel=1e-6, abs=1e-9), (
            page, name)


def test_the_chinese_edition_has_the_same_keys():
    root = ensure_built_book()
    english = numeric_quizzes(root)
    chinese = numeric_quizzes(root / "zh")
    assert [(p, a["data-key-name"], a["data-key"]) for p, a in english] == [
        (p, a["data-key-name"], a["data-key"]) for p, a in chinese]
