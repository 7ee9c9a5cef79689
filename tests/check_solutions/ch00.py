"""Reference solutions of the setup chapter (chapters/00_setup.ipynb), by checker name."""
from __future__ import annotations


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


SOLUTIONS = {
    "check_mha_shapes": mha_shapes,
    "check_softmax": softmax,
    "check_attention": attention,
    "check_repeat_kv": repeat_kv,
    "check_split_heads": split_heads,
    "check_merge_heads": merge_heads,
}
