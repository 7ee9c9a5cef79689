"""Reference solutions of Chapter 2 (chapters/02_qkv_roles.ipynb), by checker name."""
from __future__ import annotations

import torch


def teacher_forcing(tgt, bos, pad):
    start = torch.full_like(tgt[:, :1], bos)  # (B, 1)
    dec_in = torch.cat([start, tgt[:, :-1]], dim=1)  # (B, T)
    labels = tgt.masked_fill(tgt == pad, -100)  # (B, T)
    return dec_in, labels


def head_bilinear_forms(q_weight, k_weight, n_heads):
    H, C = n_heads, q_weight.shape[1]
    W_Q = q_weight.view(H, C // H, C)  # (H, D, C)
    W_K = k_weight.view(H, C // H, C)  # (H, D, C)
    return W_Q.transpose(1, 2) @ W_K  # (H, C, C)


def first_future_leak(decode, tgt):
    base = decode(tgt)  # (B, T, V)
    T, V = tgt.shape[1], base.shape[-1]
    first = -1
    for j in range(1, T):
        changed = tgt.clone()
        changed[:, j] = (tgt[:, j] + 1) % V
        moved = (decode(changed)[:, :j] != base[:, :j]).any(dim=(0, 2))  # (j,)
        if moved.any():
            t = int(moved.nonzero()[0])
            first = t if first == -1 else min(first, t)
    return first


SOLUTIONS = {
    "check_teacher_forcing": teacher_forcing,
    "check_head_bilinear_forms": head_bilinear_forms,
    "check_first_future_leak": first_future_leak,
}
