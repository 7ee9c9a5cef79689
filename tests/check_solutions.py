"""One reference solution per exercise checker, as the chapters write them, by checker name.

``tests/test_checks_contract.py`` runs every checker of ``transformer_lib.checks`` on its
solution here (and on broken versions of it); a new checker needs its solution in
``SOLUTIONS`` and nothing else to be covered.
"""
from __future__ import annotations

import torch

# The setup chapter (chapters/00_setup.ipynb) -------------------------------------------------


def mha_shapes(B, T, S, C, H, H_kv):
    D = C // H
    return (B, T, C), (B, H, T, S), (H_kv * D, C)


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


# Chapter 1 (chapters/01_attention.ipynb) -----------------------------------------------------


def causal_mask(T, S):
    rows = torch.arange(T)[:, None] + (S - T)  # (T, 1)
    return torch.arange(S)[None, :] <= rows  # (T, S)


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def softmax_jacobian(x):
    p = torch.softmax(x, dim=0)
    return torch.diag(p) - torch.outer(p, p)  # (n, n)


# Chapter 2 (chapters/02_qkv_roles.ipynb) -----------------------------------------------------


def reversal_targets(src, bos):
    tgt_out = src.flip(1)  # (B, T)
    start = torch.full_like(src[:, :1], bos)  # (B, 1)
    return torch.cat([start, tgt_out[:, :-1]], dim=1), tgt_out  # (B, T) each


def mirror_alignment(weights):
    T = weights.shape[-2]
    hits = weights.argmax(dim=-1) == torch.arange(T - 1, -1, -1)  # (n, H, T)
    return hits.float().mean(dim=(0, 2))  # (H,)


def transform_qk(Q, K, R):
    return Q @ R, K @ torch.linalg.inv(R).T


# Chapter 3 (chapters/03_multi_head.ipynb) ----------------------------------------------------


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


SOLUTIONS = {
    "check_mha_shapes": mha_shapes,
    "check_softmax": softmax,
    "check_attention": attention,
    "check_repeat_kv": repeat_kv,
    "check_split_heads": split_heads,
    "check_merge_heads": merge_heads,
    "check_causal_mask": causal_mask,
    "check_masked_softmax": masked_softmax,
    "check_softmax_jacobian": softmax_jacobian,
    "check_reversal_targets": reversal_targets,
    "check_mirror_alignment": mirror_alignment,
    "check_transform_qk": transform_qk,
    "check_mha_param_count": mha_param_count,
    "check_head_weight": head_weight,
    "check_multi_head": multi_head,
}
