"""Positional information: sinusoidal encodings (2017) and rotary embeddings (RoPE).

RoPE comes in two channel pairings that differ by a permutation of channels:

- ``"half"``: channel i pairs with i + D/2 (GPT-NeoX, Hugging Face Llama);
- ``"interleaved"``: channel 2i pairs with 2i + 1 (RoFormer paper, Meta's original Llama).

The same cos/sin tables serve both. A model trained with one pairing computes the same
function as a model with the other pairing whose W_Q and W_K rows are permuted
(:func:`interleaved_to_half`, :func:`half_to_interleaved`).
"""
from __future__ import annotations

import torch
from torch import Tensor

PAIRINGS = ("half", "interleaved")  #: how RoPE pairs channels: (i, i + D/2) or (2i, 2i + 1)


def sinusoidal_encoding(T: int, d: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Args:
        T: number of positions (0 … T-1).
        d: model dimension, even.

    Returns:
        ``(T, d)`` float32 table; wavelengths run geometrically from 2π to about 10000·2π.
    """
    if T < 1 or d < 2 or d % 2 != 0:
        raise ValueError(f"sinusoidal_encoding needs T >= 1 and an even d >= 2, got T={T}, d={d}")
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = pos * inv_freq  # (T, d/2)
    pe = torch.empty(T, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()


def rope_cos_sin(
    T: int,
    head_dim: int,
    theta: float = 10000.0,
    offset: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotation angles m·θ_i for positions m = offset … offset+T-1.

    θ_i = theta^(-2i / head_dim) for channel pair i = 0 … head_dim/2 - 1
    (:func:`rope_frequencies`). Angles are computed in fp64 and cast to ``dtype``.

    Args:
        T: number of positions.
        head_dim: channels per head D, even.
        theta: the RoPE base, > 1.
        offset: the first position (the cached length when decoding).
        device: where the tables are made.
        dtype: the tables' dtype.

    Returns:
        ``(cos, sin)``, each ``(T, head_dim // 2)``.
    """
    if T < 0 or offset < 0:
        raise ValueError(f"T ({T}) and offset ({offset}) must be non-negative")
    inv_freq = rope_frequencies(head_dim, theta)  # (head_dim/2,) float64; checks both
    pos = torch.arange(offset, offset + T, dtype=torch.float64)  # (T,)
    angles = pos[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, pairing: str = "half") -> Tensor:
    """Rotate every channel pair of ``x`` by its position's angle.

    Args:
        x: ``(..., T, D)`` queries or keys (never values).
        cos, sin: ``(T, D/2)`` from :func:`rope_cos_sin`.
        pairing: ``"half"`` (i with i + D/2) or ``"interleaved"`` (2i with 2i + 1).

    Returns:
        ``(..., T, D)``, same dtype as ``x``.
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    T, D = x.shape[-2], x.shape[-1]
    if D % 2 != 0:
        raise ValueError(f"RoPE needs an even head dim, got {D}")
    if cos.shape != (T, D // 2) or sin.shape != (T, D // 2):
        raise ValueError(
            f"cos and sin must have shape (T, D/2) = ({T}, {D // 2}), "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if pairing == "half":
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]  # (..., T, D/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, D)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, D/2): even and odd channels
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, D/2, 2)
    return out.flatten(-2)  # (..., T, D)


def _permute_rows(w: Tensor, n_heads: int, split: tuple[int, int]) -> Tensor:
    rows = w.shape[0]
    if n_heads < 1 or rows % n_heads != 0 or (rows // n_heads) % 2 != 0:
        raise ValueError(
            f"weight has {rows} rows, which must be n_heads ({n_heads}) times an even head_dim"
        )
    half = rows // n_heads // 2
    a, b = (half, 2) if split == (0, 1) else (2, half)
    w2 = w.reshape(n_heads, a, b, -1)  # (H, a, b, C)
    return w2.transpose(1, 2).reshape(w.shape)  # (H*D, C)


def interleaved_to_half(w: Tensor, n_heads: int) -> Tensor:
    """Permute the rows of a q/k projection from interleaved to split-half RoPE.

    Within each head the output rows become (0, 2, 4, …, 1, 3, 5, …): channel pair
    (2i, 2i+1) of the interleaved model becomes pair (i, i + D/2) of the split-half
    model. This is the permutation applied when Meta's Llama weights are converted for
    Hugging Face.

    Args:
        w: ``(n_heads * D, C)`` weight (or a ``(n_heads * D,)`` bias).
        n_heads: number of heads the rows are grouped into (KV heads for ``k_proj``).

    Returns:
        The permuted weight, the shape of ``w``.
    """
    return _permute_rows(w, n_heads, (0, 1))


def half_to_interleaved(w: Tensor, n_heads: int) -> Tensor:
    """Inverse of :func:`interleaved_to_half`: rows from split-half back to interleaved RoPE.

    Args:
        w: ``(n_heads * D, C)`` weight (or a ``(n_heads * D,)`` bias).
        n_heads: number of heads the rows are grouped into (KV heads for ``k_proj``).

    Returns:
        The permuted weight, the shape of ``w``.
    """
    return _permute_rows(w, n_heads, (1, 0))


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> Tensor:
    """The rotation frequency of each channel pair, θ_i = theta^(-2i / head_dim), in
    radians per position, for i = 0 … head_dim/2 - 1 (the first pairs turn fastest).

    Args:
        head_dim: channels per head D, even.
        theta: the RoPE base, > 1.

    Returns:
        ``(head_dim // 2,)`` float64.
    """
    if head_dim < 2 or head_dim % 2 != 0:
        raise ValueError(f"RoPE needs an even head_dim >= 2, got head_dim={head_dim}")
    if theta <= 1.0:
        raise ValueError(f"theta must be > 1, got {theta}")
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)


def pair_channels(i: int, head_dim: int, pairing: str = "half") -> tuple[int, int]:
    """The two channels that RoPE turns together as pair ``i``.

    Args:
        i: the pair, 0 … head_dim/2 - 1.
        head_dim: channels per head D, even.
        pairing: ``"half"`` or ``"interleaved"`` (see :data:`PAIRINGS`).

    Returns:
        ``(i, i + head_dim/2)`` in the "half" pairing, ``(2i, 2i + 1)`` in the "interleaved"
        one.
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    if head_dim < 2 or head_dim % 2 != 0 or not 0 <= i < head_dim // 2:
        raise ValueError(f"pair i ({i}) must be in [0, head_dim/2 - 1] for an even "
                         f"head_dim >= 2, got head_dim={head_dim}")
    return (i, i + head_dim // 2) if pairing == "half" else (2 * i, 2 * i + 1)
