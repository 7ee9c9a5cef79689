"""Chapter 6's checkers (``transformer_lib/checks/ch06_modern_decoder.py``) name the usual
mistakes in words a student can act on; the reference of the QK-norm exercise is Hugging
Face's Qwen3 attention (norms of D weights) and OLMo 2 attention (norms of H·D weights). The
contract every checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import math

import pytest
import torch

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_lib.checks import (
    ch06_modern_decoder,
    check_decoder_param_count,
    check_gqa_to_mha,
    check_qk_norm_attention,
)
from transformer_lib.checks.ch06_modern_decoder import _qk_norm_attention
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import apply_rope, rope_cos_sin

from chapter_solutions import references
from conftest import mistake_tests, randomize_, require, trusting

decoder_param_count, gqa_to_mha, qk_norm_attention = references(
    "06_modern_decoder", "decoder_param_count", "gqa_to_mha", "qk_norm_attention")


def count_wrong(**mistake):
    """decoder_param_count with one of the usual mistakes."""

    def count(V, C, L, H, H_kv, d_ff, tie):
        D = C // H
        kv = (H if mistake.get("kv_as_h") else H_kv) * D
        attention = 2 * C * C + 2 * C * kv + (2 * C + 2 * kv if mistake.get("biases") else 0)
        ffn = (2 if mistake.get("two_matrices") else 3) * C * d_ff
        ffn += 2 * d_ff + C if mistake.get("biases") else 0
        norms = 0 if mistake.get("no_norms") else 2 * C
        outputs = 2 if (mistake.get("tied_twice") or not tie) else 1
        if mistake.get("forget_lm_head"):
            outputs = 1
        final = 0 if mistake.get("no_norms") or mistake.get("no_final") else C
        return V * C * outputs + L * (attention + ffn + norms) + final

    return count


def tiled(state_dict, n_heads, n_kv_heads):
    """Heads repeated as kv0, kv1, kv0, kv1 instead of kv0, kv0, kv1, kv1."""
    out = {}
    for name, t in state_dict.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.repeat(n_heads // n_kv_heads, 1)
        out[name] = t.clone()
    return out


def rows_repeated(state_dict, n_heads, n_kv_heads):
    out = {}
    for name, t in state_dict.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.repeat_interleave(n_heads // n_kv_heads, dim=0)
        out[name] = t.clone()
    return out


def keys_only(state_dict, n_heads, n_kv_heads):
    converted = gqa_to_mha(state_dict, n_heads, n_kv_heads)
    for name in converted:
        if name.endswith("v_proj.weight"):
            converted[name] = state_dict[name].clone()
    return converted


def in_place(state_dict, n_heads, n_kv_heads):
    converted = gqa_to_mha(state_dict, n_heads, n_kv_heads)
    state_dict.clear()
    state_dict.update(converted)
    return state_dict


def qk_norm_variant(**mistake):
    def attention(x, attn, q_norm, k_norm, cos, sin):
        with trusting(_qk_norm_attention):  # the checker's reference, one thing changed
            return _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, **mistake)

    return attention


def qk_norm_over_channels(x, attn, q_norm, k_norm, cos, sin):
    """RMS statistics over all C channels of the projection, then each head's D weights."""
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H

    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    q = rms(attn.q_proj(x)).view(B, T, H, D).transpose(1, 2) * q_norm.weight[:D]
    k = rms(attn.k_proj(x)).view(B, T, H_kv, D).transpose(1, 2) * k_norm.weight[:D]
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal_mask(T), -math.inf)
    out = torch.softmax(scores, -1) @ v
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))


def qk_norm_per_head_only(x, attn, q_norm, k_norm, cos, sin):
    """Qwen3's placement for every model: RMSNorm on (B, H, T, D), whatever its size."""
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H
    q = q_norm(attn.q_proj(x).view(B, T, H, D).transpose(1, 2))
    k = k_norm(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2))
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_decoder_param_count, count_wrong(kv_as_h=True),
     ["2 of 4 checks passed", "n_kv_heads · D outputs, not n_heads · D"]),
    (check_decoder_param_count, count_wrong(two_matrices=True), ["three matrices"]),
    (check_decoder_param_count, count_wrong(no_norms=True),
     ["0 of 4 checks passed", "two RMSNorm weight vectors"]),
    (check_decoder_param_count, count_wrong(no_final=True), ["after the last block", "model.norm"]),
    (check_decoder_param_count, count_wrong(tied_twice=True),
     ["3 of 4 checks passed", "count it once"]),
    (check_decoder_param_count, count_wrong(forget_lm_head=True),
     ["1 of 4 checks passed", "second vocab_size × d_model matrix"]),
    (check_decoder_param_count, count_wrong(biases=True), ["no biases"]),
    (check_decoder_param_count, lambda *sizes: str(decoder_param_count(*sizes)),
     ["expected a whole number of parameters"]),
    (check_gqa_to_mha, tiled,
     ["2 of 4 checks passed", "wrong values in the logits of the converted model",
      "tiled (kv0, kv1, kv0, kv1)"]),
    (check_gqa_to_mha, rows_repeated, ["1 of 4 checks passed", "single rows were repeated"]),
    (check_gqa_to_mha, keys_only, ["v_proj.weight has shape (16, 32)", "convert the values"]),
    (check_gqa_to_mha, in_place, ["changed its input", "build a new dict"]),
    (check_gqa_to_mha, lambda sd, H, H_kv: {k: v for k, v in gqa_to_mha(sd, H, H_kv).items()
                                           if "norm" not in k},
     ["the result lacks", "return every tensor"]),
    (check_gqa_to_mha, lambda sd, H, H_kv: list(gqa_to_mha(sd, H, H_kv).values()),
     ["return a dict of tensors"]),
    (check_qk_norm_attention, qk_norm_variant(order="rope-norm"),
     ["0 of 4 checks passed", "the norm comes before RoPE"]),
    (check_qk_norm_attention, qk_norm_variant(norm_k=False), ["normalise the keys too"]),
    (check_qk_norm_attention, qk_norm_variant(norm_v=True), ["the values stay"]),
    (check_qk_norm_attention, qk_norm_variant(masked=False), ["the attention is causal"]),
    (check_qk_norm_attention, qk_norm_variant(pairing="interleaved"), ["split-half pairing"]),
    (check_qk_norm_attention, qk_norm_over_channels,
     ["0 of 4 checks passed", "position 1", "this case follows Qwen3",
      "over each head's D channels"]),
    (check_qk_norm_attention, qk_norm_per_head_only,
     ["2 of 4 checks passed", "this case follows OLMo 2", "the whole projection"]),
    (check_qk_norm_attention, qk_norm_variant(stats="head"),
     ["2 of 4 checks passed", "this case follows OLMo 2"]),
    (check_qk_norm_attention,  # the library's attention: no QK-norm at all
     lambda x, attn, q_norm, k_norm, cos, sin: attn(x, rope=(cos, sin), causal=True),
     ["0 of 4 checks passed", "MultiHeadAttention.forward` is not allowed here"]),
    (check_qk_norm_attention,
     lambda *args: qk_norm_attention(*args).view(args[0].shape[0], args[0].shape[1],
                                                 args[1].n_heads, -1).transpose(1, 2),
     ["wrong shape for the output", "merge the heads back"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch06_modern_decoder))


@pytest.mark.equality
def test_qk_norm_reference_equals_hugging_face_qwen3_attention(ledger):
    """The checker's reference is the attention of Qwen3: per-head RMSNorm on queries and
    keys, before split-half RoPE, with grouped-query heads (all weights random)."""
    transformers = require("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = transformers.Qwen3Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                      num_hidden_layers=1, vocab_size=16, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = randomize_(Qwen3Attention(config, layer_idx=0)).eval()
    attn = MultiHeadAttention(32, 4, 2, bias=False).eval()
    q_norm, k_norm = RMSNorm(8, eps=1e-6), RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight.copy_(getattr(hf, name).weight)
        q_norm.weight.copy_(hf.q_norm.weight)
        k_norm.weight.copy_(hf.k_norm.weight)
    assert not torch.allclose(q_norm.weight, torch.ones(8))  # randomised: the order matters
    T = 7
    cos, sin = rope_cos_sin(T, 8)  # (T, D/2)
    full = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])  # (1, T, D)
    blocked = torch.full((T, T), -math.inf).triu(1)[None, None]  # (1, 1, T, T) additive
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=full, attention_mask=blocked)
        got = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)
        rope_first = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, order="rope-norm")
    ledger.check("QK-norm attention, per-head norms", ledger.hf("Qwen3Attention"), got, expected,
                 tol=1e-5)
    assert (rope_first - expected).abs().max().item() > 1e-3


@pytest.mark.equality
def test_qk_norm_reference_with_whole_width_norms_equals_hugging_face_olmo2_attention(ledger):
    """With norms of H·D and H_kv·D weights the checker's reference is OLMo 2's attention:
    RMSNorm over the whole projection of a position, then the split into heads, then RoPE."""
    transformers = require("transformers")
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    config = transformers.Olmo2Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64,
                                      num_hidden_layers=1, vocab_size=16, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = randomize_(Olmo2Attention(config, layer_idx=0)).eval()
    attn = MultiHeadAttention(32, 4, 2, bias=False).eval()
    q_norm, k_norm = RMSNorm(32, eps=1e-6), RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight.copy_(getattr(hf, name).weight)
        q_norm.weight.copy_(hf.q_norm.weight)
        k_norm.weight.copy_(hf.k_norm.weight)
    assert not torch.allclose(q_norm.weight, torch.ones(32))
    T = 7
    cos, sin = rope_cos_sin(T, 8)  # (T, D/2)
    full = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])  # (1, T, D)
    blocked = torch.full((T, T), -math.inf).triu(1)[None, None]  # (1, 1, T, T) additive
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=full, attention_mask=blocked)
        got = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)
        per_head = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, stats="head")
    ledger.check("QK-norm attention, whole-width norms", ledger.hf("Olmo2Attention"), got,
                 expected, tol=1e-5)
    assert (per_head - expected).abs().max().item() > 1e-3
