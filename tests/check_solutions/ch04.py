"""Reference solutions of Chapter 4 (chapters/04_normalisation.ipynb), by checker name."""
from __future__ import annotations

import torch


def noam_for_base_lr(d_model, warmup, base_lr):
    if base_lr <= 0:
        raise ValueError(f"base_lr must be positive, got {base_lr}: LambdaLR multiplies "
                         "it by the factor")

    def factor(step):
        t = max(step, 1)  # LambdaLR starts at step 0; the paper counts from 1
        rate = d_model ** -0.5 * min(t ** -0.5, t * warmup ** -1.5)
        return rate / base_lr

    return factor


def stable_rms_norm(x, weight, eps=1e-6):
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(wide)
    inv_rms = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return (h * inv_rms).to(x.dtype) * weight


def pre_norm_decoder_layer(layer, x, memory, tgt_mask):
    x = x + layer.self_attn(layer.norm1(x), mask=tgt_mask)
    x = x + layer.cross_attn(layer.norm2(x), memory)
    x = x + layer.feed_forward(layer.norm3(x))
    return x


SOLUTIONS = {
    "check_noam_for_base_lr": noam_for_base_lr,
    "check_stable_rms_norm": stable_rms_norm,
    "check_pre_norm_decoder_layer": pre_norm_decoder_layer,
}
