"""Every numeric quiz key of the built book equals the library call that defines it,
recomputed here (the page glued it when the book was executed: _ext/quiz.py)."""
from __future__ import annotations

import html
import re

import pytest
import torch

from transformer_lib.attention import MultiHeadAttention, causal_mask
from transformer_lib.cache import KVCache
from transformer_lib.ffn import FeedForward, SwiGLU
from transformer_lib.positional import rope_frequencies
from transformer_lib.sampling import next_token_probs

from book_support import ensure_built_book

pytestmark = pytest.mark.book


def _unseen_directions() -> float:
    """Directions of a key's input that one head of a 512-wide, 8-head layer cannot see."""
    layer = MultiHeadAttention(d_model=512, n_heads=8)
    w_k = layer.k_proj.weight[: layer.head_dim].T  # (C, D): head 0's W_K
    return 512 - int(torch.linalg.matrix_rank(w_k))


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _swiglu_width() -> float:
    """The SwiGLU width h (d = 1024) whose weights equal a ReLU FFN's of width 4d."""
    return _n_params(FeedForward(1024, 4096, bias=False)) / _n_params(SwiGLU(1024, 1))


def _kv_bytes_per_token() -> int:
    """Cache bytes per token: 24 layers, 4 key/value heads of 64 channels, float16."""
    return KVCache(24, 1, 4, 1, 64, dtype=torch.float16).nbytes


# A numeric quiz's key name (``:key:``) -> the library call that computes it.
KEYS = {
    "quiz_unseen_directions": _unseen_directions,
    # chapter 5b: the angle of pair 1 (D = 8, base 10,000) at offset 41
    "quiz_pair1_angle": lambda: 41 * rope_frequencies(8)[1].item(),
    # chapter 6
    "quiz_swiglu_width": _swiglu_width,
    # chapter 6b: token 0 of the logits [2, 1, 0] at temperature 2
    "quiz_tau2_prob": lambda: next_token_probs(torch.tensor([[2.0, 1.0, 0.0]]),
                                               temperature=2.0)[0, 0].item(),
    # chapter 7: visible entries of the mask of 3 new tokens after 10 cached
    "quiz_visible_pairs": lambda: int(causal_mask(3, 13).sum()),
    # chapter 7b
    "quiz_kv_bytes_per_token": _kv_bytes_per_token,
    # chapter 7c: the likeliest of [0.5, 0.25, 0.15, 0.1] after top-p 0.7
    "quiz_top_p_prob": lambda: next_token_probs(
        torch.tensor([[0.5, 0.25, 0.15, 0.1]]).log(), top_p=0.7)[0, 0].item(),
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
