"""Reference solutions of Chapter 5 (chapters/05_positional.ipynb), by checker name."""
from __future__ import annotations

import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.positional import apply_rope


def sinusoid_shift_matrix(k, d):
    pairs = torch.arange(d // 2, dtype=torch.float64)
    step = k * 10000.0 ** (-2 * pairs / d)  # (d/2,): the angle pair i turns by
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, a in enumerate(step.tolist()):
        c, s = torch.cos(torch.tensor(a)), torch.sin(torch.tensor(a))
        m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    return m


def rope_interleaved(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    first, second = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each
    turned = torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return turned.flatten(-2)  # (..., T, D/2, 2) -> (..., T, D)


def rope_cached_attention(q, k, v, k_cache, v_cache, cos, sin):
    pos = k_cache.shape[-2]  # the new token's position
    angles = cos[pos:pos + 1], sin[pos:pos + 1]  # (1, D/2) each
    keys = torch.cat([k_cache, apply_rope(k, *angles)], dim=-2)  # (B, H, P + 1, D)
    values = torch.cat([v_cache, v], dim=-2)  # (B, H, P + 1, D)
    out, _ = scaled_dot_product_attention(apply_rope(q, *angles), keys, values)
    return out, keys, values


SOLUTIONS = {
    "check_sinusoid_shift_matrix": sinusoid_shift_matrix,
    "check_rope_interleaved": rope_interleaved,
    "check_rope_cached_attention": rope_cached_attention,
}
