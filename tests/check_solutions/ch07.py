"""Reference solutions of Chapter 7 (chapters/07_kv_cache.ipynb), by checker name."""
from __future__ import annotations

import torch

from transformer_lib.attention import causal_mask, repeat_kv, scaled_dot_product_attention
from transformer_lib.positional import apply_rope


def max_context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size, dtype):
    head_dim = d_model // n_heads
    value_bytes = torch.empty((), dtype=dtype).element_size()
    per_position = 2 * n_layers * n_kv_heads * head_dim * value_bytes  # keys and values
    return budget_bytes // (per_position * batch_size)


def cached_attention_step(attn, x, k_cache, v_cache, cos, sin):
    B, T, C = x.shape
    P = k_cache.shape[2]  # positions already cached
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    rows = cos[P:P + T], sin[P:P + T]  # (T, D/2) each: the new positions' angles
    q = apply_rope(attn.q_proj(x).view(B, T, H, D).transpose(1, 2), *rows)  # (B, H, T, D)
    k = apply_rope(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2), *rows)
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    k_cache = torch.cat([k_cache, k], dim=2)  # (B, H_kv, P + T, D)
    v_cache = torch.cat([v_cache, v], dim=2)
    mask = causal_mask(T, P + T)  # (T, P + T): query i sits at position P + i
    out, _ = scaled_dot_product_attention(q, repeat_kv(k_cache, attn.n_rep),
                                          repeat_kv(v_cache, attn.n_rep), mask)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C)), k_cache, v_cache


def speculative_step(model, cache, pending, draft):
    start, k = cache.pos, draft.shape[1]
    logits = model(torch.cat([pending, draft], dim=1), cache)  # (1, k + 1, V)
    choice = logits.argmax(dim=-1)  # (1, k + 1): the model's token after each position
    n = 0
    while n < k and draft[0, n] == choice[0, n]:
        n += 1
    cache.pos = start + 1 + n  # keep the pending token and the accepted ones
    return torch.cat([draft[:, :n], choice[:, n:n + 1]], dim=1)


SOLUTIONS = {
    "check_max_context": max_context,
    "check_cached_attention_step": cached_attention_step,
    "check_speculative_step": speculative_step,
}
