"""References that checkers of several chapters share: the head layout of
:class:`transformer_lib.attention.MultiHeadAttention`."""
from __future__ import annotations

from torch import Tensor


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """The reference: ``(B, T, C) -> (B, H, T, D)``, head h owning channels h·D … h·D + D − 1,
    the layout of :class:`transformer_lib.attention.MultiHeadAttention`."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)
