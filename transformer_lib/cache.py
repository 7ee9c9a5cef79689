"""The KV cache: keys and values of earlier positions, kept so that decoding one new token
does not recompute them.

It sits beside ``attention.py`` in the core of the library: :class:`MultiHeadAttention`
writes into it and reads from it; :class:`transformer_lib.decoder.Decoder` creates it and
advances it once per forward pass.
"""
from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys and values of every layer, for ``max_seq_len`` positions.

    ``k`` and ``v`` have shape ``(n_layers, B, H_kv, max_seq_len, D)``; the first ``pos``
    positions are filled. Each layer writes its new keys/values at ``pos`` and reads
    ``0 … pos + T - 1``; the model advances ``pos`` once per forward, after the layer loop.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_seq_len: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        sizes = {"n_layers": n_layers, "batch_size": batch_size, "n_kv_heads": n_kv_heads,
                 "max_seq_len": max_seq_len, "head_dim": head_dim}
        bad = {name: value for name, value in sizes.items() if value < 1}
        if bad:
            raise ValueError("KVCache sizes must be positive, got "
                             + ", ".join(f"{name}={value}" for name, value in bad.items()))
        shape = (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, max_seq_len, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, max_seq_len, D)
        self.max_seq_len = max_seq_len
        self.pos = 0

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache: 2 · n_layers · H_kv · D · max_seq_len · B · sizeof(dtype)."""
        return self.k.nbytes + self.v.nbytes

    def check_room(self, T: int) -> None:
        """Raise a ValueError unless ``T`` more positions fit after the ``pos`` cached ones."""
        if self.pos + T > self.max_seq_len:
            raise ValueError(
                f"KV cache overflow: {self.pos} cached + {T} new positions "
                f"> max_seq_len ({self.max_seq_len})"
            )

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k, v`` ``(B, H_kv, T, D)`` at ``pos`` in layer ``layer_idx``'s slot and
        return all its cached keys/values ``(B, H_kv, pos + T, D)``. Does not advance ``pos``."""
        if not 0 <= layer_idx < self.n_layers:
            raise ValueError(f"layer_idx must be in [0, {self.n_layers - 1}], got {layer_idx}")
        T = k.shape[2]
        self.check_room(T)
        end = self.pos + T
        self.k[layer_idx, :, :, self.pos:end] = k
        self.v[layer_idx, :, :, self.pos:end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, T: int) -> None:
        """Mark ``T`` more positions as filled (the model calls it once per forward)."""
        self.check_room(T)
        self.pos += T

    def reset(self) -> None:
        """Forget every cached position (the memory is kept for the next sequence)."""
        self.pos = 0
