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


def softmax(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights  # (B, H, T, Dv), (B, H, T, S)


SOLUTIONS = {
    "check_softmax": softmax,
    "check_attention": attention,
    "check_causal_mask": causal_mask,
    "check_masked_softmax": masked_softmax,
    "check_softmax_jacobian": softmax_jacobian,
}
