"""Reference solutions of Chapter 3 (chapters/03_multi_head.ipynb), by checker name."""
from __future__ import annotations

import torch


def mha_param_count(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def head_weight(weight, n_heads, h):
    D = weight.shape[0] // n_heads
    return weight[h * D:(h + 1) * D]  # (D, C)


def multi_head(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, T, C = x.shape
    D = C // n_heads

    def split(t):
        return t.view(B, T, n_heads, D).transpose(1, 2)  # (B, H, T, D)

    q, k, v = split(x @ w_q.T), split(x @ w_k.T), split(x @ w_v.T)
    scores = q @ k.transpose(-2, -1) / D ** 0.5  # (B, H, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    return out.transpose(1, 2).reshape(B, T, C) @ w_o.T  # (B, T, C)


def repeat_kv(x, n_rep):
    B, H_kv, S, D = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)


def split_heads(x, n_heads):
    B, T, C = x.shape
    if C % n_heads != 0:
        raise ValueError(f"C ({C}) must be divisible by n_heads ({n_heads})")
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)


SOLUTIONS = {
    "check_repeat_kv": repeat_kv,
    "check_split_heads": split_heads,
    "check_merge_heads": merge_heads,
    "check_mha_param_count": mha_param_count,
    "check_head_weight": head_weight,
    "check_multi_head": multi_head,
}
