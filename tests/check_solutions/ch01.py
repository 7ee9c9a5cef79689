"""Reference solutions of Chapter 1 (chapters/01_attention.ipynb), by checker name."""
from __future__ import annotations

import torch


def causal_mask(T, S):
    rows = torch.arange(T)[:, None] + (S - T)  # (T, 1)
    return torch.arange(S)[None, :] <= rows  # (T, S)


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def softmax_jacobian(x):
    p = torch.softmax(x, dim=0)
    return torch.diag(p) - torch.outer(p, p)  # (n, n)


SOLUTIONS = {
    "check_causal_mask": causal_mask,
    "check_masked_softmax": masked_softmax,
    "check_softmax_jacobian": softmax_jacobian,
}
