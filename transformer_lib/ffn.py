"""Position-wise feed-forward networks: the 2017 ReLU FFN and SwiGLU."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.validation import check_positive


def _check_sizes(d_model: int, d_ff: int) -> None:
    check_positive(d_model=d_model, d_ff=d_ff)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Vaswani et al., 2017), with dropout inside."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        _check_sizes(d_model, d_ff)
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., C)`` -> ``(..., C)``."""
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class SwiGLU(nn.Module):
    """SwiGLU(x) = (SiLU(x W_gate) ⊙ x W_up) W_down (Shazeer, 2020), no biases.

    Three matrices, about 3·C·d_ff parameters; with d_ff = 8/3·C this matches the
    two-matrix FFN of width 4·C.
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        _check_sizes(d_model, d_ff)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., C)`` -> ``(..., C)``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
