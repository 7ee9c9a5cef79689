"""Reference solutions of Chapter 1 (chapters/01_attention.ipynb), by checker name."""
from __future__ import annotations

import math

import torch

from transformer_lib.attention import causal_mask, scaled_dot_product_attention


def score_scale(d_k, sigma):
    return sigma**2 * math.sqrt(d_k)  # the standard deviation of q·k


def left_padded_causal_mask(lengths, T, S):
    is_real = torch.arange(S)[None, :] >= S - lengths[:, None]  # (B, S)
    return is_real[:, None, None, :] & causal_mask(T, S)  # (B, 1, T, S)


def chunked_causal_attention(q, k, v, chunk):
    T = q.shape[-2]
    pieces = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        out, _ = scaled_dot_product_attention(
            q[..., start:end, :], k[..., :end, :], v[..., :end, :],
            mask=causal_mask(end - start, end),
        )  # (..., end - start, Dv)
        pieces.append(out)
    return torch.cat(pieces, dim=-2)  # (..., T, Dv)


SOLUTIONS = {
    "check_score_scale": score_scale,
    "check_left_padded_causal_mask": left_padded_causal_mask,
    "check_chunked_causal_attention": chunked_causal_attention,
}
