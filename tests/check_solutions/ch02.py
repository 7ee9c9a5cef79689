"""Reference solutions of Chapter 2 (chapters/02_qkv_roles.ipynb), by checker name."""
from __future__ import annotations

import torch


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


SOLUTIONS = {
    "check_reversal_targets": reversal_targets,
    "check_mirror_alignment": mirror_alignment,
    "check_transform_qk": transform_qk,
}
