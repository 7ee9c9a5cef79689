"""Every numeric quiz key of the built book equals the library call that defines it,
recomputed here (the page glued it when the book was executed: _ext/quiz.py)."""
from __future__ import annotations

import html
import re

import pytest
import torch

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention

from book_support import ensure_built_book

pytestmark = pytest.mark.book


def _unseen_directions() -> float:
    """Directions of a key's input that one head of a 512-wide, 8-head layer cannot see."""
    layer = MultiHeadAttention(d_model=512, n_heads=8)
    w_k = layer.k_proj.weight[: layer.head_dim].T  # (C, D): head 0's W_K
    return 512 - int(torch.linalg.matrix_rank(w_k))


def _score_divisor() -> float:
    """The number a head of a 512-wide, 8-head layer divides its scores by (chapter 0)."""
    D = MultiHeadAttention(d_model=512, n_heads=8).head_dim
    q = torch.ones(1, D, dtype=torch.float64)  # (T, D)
    k = torch.stack([torch.ones(D), torch.zeros(D)]).double()  # (S, D): scores D/s and 0
    _, w = scaled_dot_product_attention(q, k, k)  # (T, S)
    return round(D / torch.log(w[0, 0] / w[0, 1]).item(), 6)


def _cross_weights_kib() -> float:
    """KiB of the fp32 weights of 4-head cross-attention, 6 queries, 10 keys, batch 32."""
    layer = MultiHeadAttention(d_model=512, n_heads=4, keep_weights=True)
    with torch.no_grad():
        layer(torch.zeros(32, 6, 512), torch.zeros(32, 10, 512))
    w = layer.last_weights  # (B, H, T, S)
    return w.numel() * w.element_size() / 1024


def _mqa_parameters() -> int:
    """Parameters of a multi-query layer of width 16 with 4 query heads, biases included."""
    return sum(p.numel() for p in MultiHeadAttention(16, 4, n_kv_heads=1).parameters())


# A numeric quiz's key name (``:key:``) -> the library call that computes it.
KEYS = {
    "quiz_unseen_directions": _unseen_directions,
    "quiz_score_divisor": _score_divisor,
    "quiz_cross_weights_kib": _cross_weights_kib,
    "quiz_mqa_parameters": _mqa_parameters,
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
