"""Every numeric quiz key of the built book equals the library call that defines it,
recomputed here (the page glued it when the book was executed: _ext/quiz.py)."""
from __future__ import annotations

import html
import re

import pytest
import torch

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.cache import KVCache
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.flash import flash_attention
from transformer_lib.variants.linear import gated_delta_rule_recurrent
from transformer_lib.variants.mla import MLAConfig, MultiHeadLatentAttention

from book_support import ensure_built_book

pytestmark = pytest.mark.book


def _unseen_directions() -> float:
    """Directions of a key's input that one head of a 512-wide, 8-head layer cannot see."""
    layer = MultiHeadAttention(d_model=512, n_heads=8)
    w_k = layer.k_proj.weight[: layer.head_dim].T  # (C, D): head 0's W_K
    return 512 - int(torch.linalg.matrix_rank(w_k))


def _tile_megabytes() -> float:
    """MB of one tile of scores: 16,384 queries against 128 keys of 64 channels, float32."""
    q = torch.empty(1, 1, 16384, 64, device="meta")
    k = torch.empty(1, 1, 128, 64, device="meta")
    _, tile = scaled_dot_product_attention(q, k, k)  # (1, 1, 16384, 128) weights
    return tile.nbytes / 1e6


def _flash_saved_bytes() -> float:
    """Bytes flash_attention keeps for its backward pass beyond q, k, v (T = S = 1024,
    D = Dv = 128, float32)."""
    q, k, v = (torch.randn(1, 1, 1024, 128).requires_grad_() for _ in range(3))
    with torch.enable_grad():
        out = flash_attention(q, k, v)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    return sum(t.nbytes for t in out.grad_fn.saved_tensors
               if t.untyped_storage().data_ptr() not in inputs)


def _gqa_over_mla() -> float:
    """Cache bytes per token and layer: GQA (32 heads of 128, 8 KV heads) over MLA
    (d_c = 512, D_R = 64)."""
    positions = 4096
    gqa = DecoderConfig(vocab_size=32000, d_model=4096, n_layers=1, n_heads=32,
                        n_kv_heads=8, d_ff=4 * 4096, max_seq_len=positions)
    mla = MLAConfig(d_model=4096, n_heads=32, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128, max_seq_len=positions)
    with torch.device("meta"):
        gqa_bytes = Decoder(gqa).new_cache(1).nbytes // positions
        mla_bytes = MultiHeadLatentAttention(mla).new_cache(1).bytes_per_token
    return gqa_bytes / mla_bytes


def _gated_fraction() -> float:
    """What Gated DeltaNet (beta = 1, alpha = 0.9) returns for the key e_0 after 10 more
    tokens with keys orthogonal to it, as a multiple of the value written with e_0."""
    keys = torch.zeros(1, 1, 11, 8, dtype=torch.float64)
    keys[..., 0, 0] = 1.0
    keys[..., 1:, 1:] = torch.randn(10, 7, dtype=torch.float64)
    values = torch.randn(1, 1, 11, 4, dtype=torch.float64)
    _, state = gated_delta_rule_recurrent(
        keys, keys, values, torch.full((1, 1, 11), 0.9, dtype=torch.float64),
        torch.ones(1, 1, 11, dtype=torch.float64))
    v0 = values[0, 0, 0]
    return float(state[0, 0, :, 0] @ v0 / (v0 @ v0))


def _window_cache_megabytes() -> float:
    """MB of a KV cache of 48 layers, 8 KV heads of 128, bfloat16, 1,024 positions kept."""
    cache = KVCache(48, 1, 8, 1024, 128, dtype=torch.bfloat16, device="meta")
    return cache.nbytes / 1e6


# A numeric quiz's key name (``:key:``) -> the library call that computes it.
KEYS = {
    "quiz_unseen_directions": _unseen_directions,
    "quiz_tile_megabytes": _tile_megabytes,
    "quiz_flash_saved_bytes": _flash_saved_bytes,
    "quiz_gqa_over_mla": _gqa_over_mla,
    "quiz_gated_fraction": _gated_fraction,
    "quiz_window_cache_megabytes": _window_cache_megabytes,
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
