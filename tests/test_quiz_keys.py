"""Every numeric quiz key of the built book equals the library call that defines it,
recomputed here (the page glued it when the book was executed: _ext/quiz.py)."""
from __future__ import annotations

import html
import math
import re

import pytest
import torch

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    masked_softmax,
    scaled_dot_product_attention,
)
from transformer_lib.cache import KVCache
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.encoder_decoder import LabelSmoothingLoss, noam_lambda
from transformer_lib.ffn import FeedForward, SwiGLU
from transformer_lib.flash import flash_attention
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import rope_frequencies, sinusoidal_encoding
from transformer_lib.sampling import next_token_probs
from transformer_lib.variants.linear import gated_delta_rule_recurrent
from transformer_lib.variants.mla import MLAConfig, MultiHeadLatentAttention

from book_support import ensure_built_book

pytestmark = pytest.mark.book


def _unseen_directions() -> float:
    """Directions of a key's input that one head of a 512-wide, 8-head layer cannot see."""
    layer = MultiHeadAttention(d_model=512, n_heads=8)
    w_k = layer.k_proj.weight[: layer.head_dim].T  # (C, D): head 0's W_K
    return 512 - int(torch.linalg.matrix_rank(w_k))


def _setup_score_divisor() -> float:
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


def _rms_norm_channel() -> float:
    """RMSNorm (unit gain) of the channels [3, 5, 7, 5]: the third channel."""
    return RMSNorm(4)(torch.tensor([[3.0, 5.0, 7.0, 5.0]]))[0, 2].item()


def _noam_rate_16000() -> float:
    """The Noam rate at step 16,000 for d_model 512 and 4,000 warmup steps, in 1e-4."""
    return noam_lambda(512, 4000)(16_000) * 1e4


def _smoothing_floor() -> float:
    """The lowest LabelSmoothingLoss(0.1) over 11 tokens: the loss of predicting q."""
    q = torch.full((1, 11), 0.1 / 11)  # (N, V)
    q[0, 0] += 0.9
    return LabelSmoothingLoss(0.1)(q.log(), torch.tensor([0])).item()


def _longest_wavelength() -> float:
    """The longest wavelength of the sinusoidal encoding for d = 128, in 1,000 positions."""
    pe = sinusoidal_encoding(2, 128)  # (T, d)
    return 2 * math.pi / math.atan2(pe[1, 126].item(), pe[1, 127].item()) / 1000


def _score_divisor() -> float:
    """What each head of a 1024-wide, 16-head layer divides its scores by: sqrt(D)."""
    return MultiHeadAttention(d_model=1024, n_heads=16).head_dim ** 0.5


def _cross_weights() -> int:
    """The numbers in a cross-attention's weights, decoder 6 and source 9, batch 3, 8 heads."""
    layer = MultiHeadAttention(d_model=16, n_heads=8, keep_weights=True)
    layer(torch.randn(3, 6, 16), context=torch.randn(3, 9, 16))
    return layer.last_weights.numel()  # (B, H, T, S)


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _swiglu_width() -> float:
    """The SwiGLU width h (d = 1024) whose weights equal a ReLU FFN's of width 4d."""
    return _n_params(FeedForward(1024, 4096, bias=False)) / _n_params(SwiGLU(1024, 1))


def _kv_bytes_per_token() -> int:
    """Cache bytes per token: 24 layers, 4 key/value heads of 64 channels, float16."""
    return KVCache(24, 1, 4, 1, 64, dtype=torch.float16).nbytes


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


# Page -> its numeric quizzes' key names (``:key:``) -> the library call that computes each.
KEYS = {
    "00_setup": {"quiz_score_divisor": _setup_score_divisor},
    "01_attention": {
        "quiz_score_divisor": _score_divisor,
        "quiz_softmax_weight": lambda: masked_softmax(torch.tensor([3.0, 3.0, 0.0]))[0].item(),
    },
    "01b_masks_and_cost": {"quiz_predictions": lambda: int(causal_mask(5).any(dim=-1).sum())},
    "02_qkv_roles": {"quiz_unseen_directions": _unseen_directions},
    "02b_encoder_decoder": {"quiz_cross_weights": _cross_weights},
    "03_multi_head": {"quiz_cross_weights_kib": _cross_weights_kib},
    "03b_what_heads_learn": {"quiz_mqa_parameters": _mqa_parameters},
    "04_normalisation": {"quiz_rms_norm_channel": _rms_norm_channel},
    "04b_training_recipe": {
        "quiz_noam_rate_16000": _noam_rate_16000,
        "quiz_smoothing_floor": _smoothing_floor,
    },
    "05_positional": {"quiz_longest_wavelength": _longest_wavelength},
    # the angle of pair 1 (D = 8, base 10,000) at offset 41
    "05b_rope_in_practice": {"quiz_pair1_angle": lambda: 41 * rope_frequencies(8)[1].item()},
    "06_modern_decoder": {"quiz_swiglu_width": _swiglu_width},
    # token 0 of the logits [2, 1, 0] at temperature 2
    "06b_testing_and_sampling": {"quiz_tau2_prob": lambda: next_token_probs(
        torch.tensor([[2.0, 1.0, 0.0]]), temperature=2.0)[0, 0].item()},
    # visible entries of the mask of 3 new tokens after 10 cached
    "07_kv_cache": {"quiz_visible_pairs": lambda: int(causal_mask(3, 13).sum())},
    "07b_serving": {"quiz_kv_bytes_per_token": _kv_bytes_per_token},
    # the likeliest of [0.5, 0.25, 0.15, 0.1] after top-p 0.7
    "07c_speculative_decoding": {"quiz_top_p_prob": lambda: next_token_probs(
        torch.tensor([[0.5, 0.25, 0.15, 0.1]]).log(), top_p=0.7)[0, 0].item()},
    "08_fast_attention": {"quiz_tile_megabytes": _tile_megabytes},
    "08b_measuring_fast_attention": {"quiz_flash_saved_bytes": _flash_saved_bytes},
    "09_attention_variants": {"quiz_gqa_over_mla": _gqa_over_mla},
    "09b_linear_attention": {"quiz_gated_fraction": _gated_fraction},
    "09c_long_context": {"quiz_window_cache_megabytes": _window_cache_megabytes},
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
        calls = KEYS.get(page, {})
        assert name in calls, f"{page}: add the library call of {name!r} to KEYS[{page!r}]"
        expected = float(calls[name]())
        assert float(attributes["data-key"]) == pytest.approx(expected, rel=1e-6, abs=1e-9), (
            page, name)


def test_the_chinese_edition_has_the_same_keys():
    root = ensure_built_book()
    english = numeric_quizzes(root)
    chinese = numeric_quizzes(root / "zh")
    assert [(p, a["data-key-name"], a["data-key"]) for p, a in english] == [
        (p, a["data-key-name"], a["data-key"]) for p, a in chinese]
