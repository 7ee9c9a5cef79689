"""Position-wise feed-forward networks: the 2017 ReLU FFN and SwiGLU."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.validation import check_bool, check_positive


def _check_sizes(d_model: int, d_ff: int) -> None:
    check_positive(d_model=d_model, d_ff=d_ff)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Vaswani et al., 2017), with dropout inside.

    ``bias=False`` drops b_1 and b_2, for a comparison with the bias-free SwiGLU at the same
    number of parameters (2·C·d_ff against 3·C·d_ff: widths in the ratio 3 : 2).

    Args:
        d_model: C, the width of the input and the output.
        d_ff: the hidden width.
        dropout: dropout probability on the hidden activations in training.
        bias: whether the two linear layers have biases.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        _check_sizes(d_model, d_ff)
        check_bool("bias", bias)
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the network to every position.

        Args:
            x: ``(..., C)``.

        Returns:
            ``(..., C)``.
        """
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class SwiGLU(nn.Module):
    """SwiGLU(x) = (SiLU(x W_gate) ⊙ x W_up) W_down (Shazeer, 2020), no biases.

    Three matrices, about 3·C·d_ff parameters; with d_ff = 8/3·C this matches the
    two-matrix FFN of width 4·C.

    Args:
        d_model: C, the width of the input and the output.
        d_ff: the hidden width.
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        _check_sizes(d_model, d_ff)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the network to every position.

        Args:
            x: ``(..., C)``.

        Returns:
            ``(..., C)``.
        """
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
