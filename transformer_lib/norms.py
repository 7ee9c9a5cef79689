"""Layer normalisation (2017 Transformer) and RMSNorm (modern decoders)."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.validation import check_positive, compute_dtype


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm of every position of ``x`` over its last axis, as a function.

    Args:
        x: ``(..., C)``, any floating dtype.
        weight, bias: ``(C,)``, the scale γ and the shift β.
        eps: added to the variance (the biased one: divided by C).

    Returns:
        ``(..., C)`` in the dtype of ``x``. The statistics, the scale and the shift are
        computed in at least fp32 (fp16 and bf16 are promoted; fp64 stays fp64).
    """
    h = x.to(compute_dtype(x.dtype))  # fp16/bf16 -> fp32; fp32 and fp64 stay
    mean = h.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (h - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
    h = (h - mean) * torch.rsqrt(var + eps)
    return (h * weight + bias).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm of every position of ``x`` over its last axis, as a function.

    Args:
        x: ``(..., C)``, any floating dtype.
        weight: ``(C,)``, the scale g.
        eps: added to the mean square.

    Returns:
        ``(..., C)`` in the dtype of ``x``; the mean square and the scale are computed in at
        least fp32 (an fp16 square above 65,504 would be inf).
    """
    h = x.to(compute_dtype(x.dtype))  # fp16/bf16 -> fp32; fp32 and fp64 stay
    mean_square = h.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
    return (h * torch.rsqrt(mean_square + eps) * weight).to(x.dtype)


def _check_sizes(d: int, eps: float) -> None:
    check_positive(d=d)
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias.

    ``var`` is the biased variance (divide by C), as in ``torch.nn.LayerNorm``. Computed in
    at least fp32 (fp64 stays fp64) and cast back to the input dtype.

    Args:
        d: C, the size of the normalised (last) dimension.
        eps: added to the variance.
    """

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        _check_sizes(d, eps)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        """Apply the normalisation to every position.

        Args:
            x: ``(..., C)``.

        Returns:
            ``(..., C)``.
        """
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x²) + eps) * weight. No mean subtraction, no bias.

    The mean square is computed in at least fp32 (fp64 stays fp64) and the result cast
    back to the input dtype. Note that mean(x²) is not the variance unless the mean is 0.

    Args:
        d: C, the size of the normalised (last) dimension.
        eps: added to the mean square.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        _check_sizes(d, eps)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """Apply the normalisation to every position.

        Args:
            x: ``(..., C)``.

        Returns:
            ``(..., C)``.
        """
        return rms_norm(x, self.weight, self.eps)
