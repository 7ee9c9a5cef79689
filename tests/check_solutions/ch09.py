"""Reference solutions of Chapter 9 (chapters/09_attention_variants.ipynb), by checker name."""
from __future__ import annotations

import torch


def mla_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size, dtype):
    per_token = n_layers * (kv_lora_rank + qk_rope_head_dim)  # one latent and one RoPE key
    return per_token * T * batch_size * torch.empty((), dtype=dtype).element_size()


def gated_delta_step(S, q, k, v, alpha, beta):
    q = q / q.norm(dim=-1, keepdim=True)  # (B, H, Dk)
    k = k / k.norm(dim=-1, keepdim=True)
    a, b = alpha[..., None, None], beta[..., None, None]  # (B, H, 1, 1)
    erased = S - b * (S @ k[..., None]) @ k[..., None, :]  # S (I - β k kᵀ)
    S = a * erased + b * v[..., None] @ k[..., None, :]  # (B, H, Dv, Dk)
    return S, (S @ q[..., None])[..., 0]  # (B, H, Dv)


def moe_forward(x, router, experts, top_k):
    probs = torch.softmax(router(x), dim=-1)  # (N, E)
    top, chosen = probs.topk(top_k, dim=-1)  # (N, k)
    gates = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        if len(token):
            out = out.index_add(0, token, gates[token, slot, None] * expert(x[token]))
    f = torch.bincount(chosen.flatten(), minlength=len(experts)) / chosen.numel()
    return out, len(experts) * (f * probs.mean(dim=0)).sum()


SOLUTIONS = {
    "check_mla_cache_bytes": mla_cache_bytes,
    "check_gated_delta_step": gated_delta_step,
    "check_moe_forward": moe_forward,
}
