"""Input checks that both models share, so that bad input gets the same clear ValueError."""
from __future__ import annotations

import torch
from torch import Tensor


def check_token_ids(tokens: Tensor, vocab_size: int, *, name: str = "tokens") -> None:
    """Raise a ValueError unless ``tokens`` is a ``(B, T)`` integer tensor of ids in
    ``[0, vocab_size - 1]`` with ``T >= 1``; the message names ``name`` and the values."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        dtype = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be an integer (Long) tensor of token ids, got {dtype}")
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"{name} must have shape (B, T) with T >= 1, got {tuple(tokens.shape)}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"ids in {name} must be in [0, {vocab_size - 1}] "
                         f"(vocab_size={vocab_size}), got min {lo}, max {hi}")


def check_positive(**sizes: int) -> None:
    """Raise a ValueError naming every size that is not positive, e.g.
    ``check_positive(d_model=0, n_heads=4)``: "d_model must be positive, got 0"."""
    bad = [f"{name} must be positive, got {value}" for name, value in sizes.items() if value < 1]
    if bad:
        raise ValueError("; ".join(bad))
