"""Reference solutions of Chapter 6 (chapters/06_modern_decoder.ipynb), by checker name."""
from __future__ import annotations

from transformer_lib.attention import causal_mask, repeat_kv, scaled_dot_product_attention  # noqa: E501
from transformer_lib.positional import apply_rope


def decoder_param_count(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                        tie_embeddings):
    head_dim = d_model // n_heads
    kv_width = n_kv_heads * head_dim
    attention = 2 * d_model * d_model + 2 * d_model * kv_width  # q, o; k, v
    swiglu = 3 * d_model * d_ff  # gate, up, down
    block = attention + swiglu + 2 * d_model  # and its two RMSNorm weights
    embeddings = vocab_size * d_model * (1 if tie_embeddings else 2)
    return embeddings + n_layers * block + d_model  # + the final RMSNorm


def gqa_to_mha(state_dict, n_heads, n_kv_heads):
    n_rep = n_heads // n_kv_heads
    converted = {}
    for name, tensor in state_dict.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            C = tensor.shape[1]
            per_head = tensor.reshape(n_kv_heads, -1, C)  # (H_kv, D, C)
            tensor = per_head.repeat_interleave(n_rep, dim=0).reshape(-1, C)  # (H * D, C)
        converted[name] = tensor.clone()
    return converted


def qk_norm_attention(x, attn, q_norm, k_norm, cos, sin):
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H
    q = attn.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    q = apply_rope(q_norm(q), cos, sin)  # norm over each head's D channels, then rotate
    k = apply_rope(k_norm(k), cos, sin)
    k = repeat_kv(k, H // H_kv)  # (B, H, T, D)
    v = repeat_kv(v, H // H_kv)  # (B, H, T, D)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))  # (B, H, T, D)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


SOLUTIONS = {
    "check_decoder_param_count": decoder_param_count,
    "check_gqa_to_mha": gqa_to_mha,
    "check_qk_norm_attention": qk_norm_attention,
}
