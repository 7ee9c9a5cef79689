"""Caches of earlier positions, kept so that decoding one new token does not recompute them.

They sit beside ``attention.py`` in the core of the library. :class:`PositionCache` is the
contract every cache keeps; :class:`KVCache` holds the keys and values of every layer of a
:class:`transformer_lib.decoder.Decoder`, and
:class:`transformer_lib.variants.mla.MLACache` the compressed latents of one
multi-head latent attention layer.

The contract:

* a cache is preallocated for ``max_seq_len`` positions; the first ``pos`` are filled;
* ``update`` writes the new positions at ``pos``, after checking their shape and that they
  fit (:meth:`PositionCache.check_room`), and returns everything cached so far: it **never
  moves** ``pos``;
* **who advances**: the model, once per forward pass, after its layer loop
  (:meth:`PositionCache.advance`). Every layer of one pass writes at the same positions
  ``pos … pos + T - 1`` and reads ``0 … pos + T - 1``, so ``pos`` must not move while the
  layers run. A layer that owns a cache of its own (multi-head latent attention) is its own
  model and advances at the end of its forward;
* ``reset`` forgets every position and keeps the memory; setting ``pos`` back (e.g. to drop
  rejected draft tokens) makes the positions after it invisible.
"""
from __future__ import annotations

import torch
from torch import Tensor

from transformer_lib.validation import check_positive


def cache_length(max_seq_len: int | None, limit: int) -> int:
    """The length of a new cache: ``max_seq_len``, or ``limit`` (the config's) if None.

    Args:
        max_seq_len: the length asked for, or None.
        limit: the longest the model allows (its config's ``max_seq_len``).

    Returns:
        The number of positions to allocate.

    Raises:
        ValueError: ``max_seq_len`` is not in ``[1, limit]``.
    """
    length = limit if max_seq_len is None else max_seq_len
    if not 1 <= length <= limit:
        raise ValueError(f"max_seq_len must be in [1, {limit}] (the config's), got {length}")
    return length


class PositionCache:
    """What every cache shares: the filled length ``pos``, the room left, and the bytes held.

    A subclass allocates its tensors, lists them in :meth:`tensors`, and writes with an
    ``update`` that calls :meth:`check_shape` and :meth:`check_room` and leaves ``pos`` alone.

    Args:
        max_seq_len: the positions the cache holds.
    """

    def __init__(self, max_seq_len: int):
        check_positive(max_seq_len=max_seq_len)
        self.max_seq_len = max_seq_len
        self.pos = 0  # positions 0 … pos - 1 are filled

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors that hold the cached positions.

        Returns:
            The subclass's tensors, each with ``max_seq_len`` positions.
        """
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache's tensors (all ``max_seq_len`` positions, filled or not)."""
        return sum(t.nbytes for t in self.tensors())

    def check_room(self, T: int) -> None:
        """Raise a ValueError unless ``T`` more positions fit after the ``pos`` cached ones.

        Args:
            T: the number of new positions.
        """
        if self.pos + T > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__} overflow: {self.pos} cached + {T} new positions "
                f"> the cache's max_seq_len ({self.max_seq_len})"
            )

    def check_shape(self, name: str, x: Tensor, **sizes: int | None) -> None:
        """Raise a ValueError unless ``x`` has one dimension per entry of ``sizes``, of that
        size (None: any size), e.g. ``check_shape("k", k, B=2, H_kv=4, T=None, D=16)``:
        "k must have shape (B, H_kv, T, D) = (2, 4, T, 16) for this cache, got (2, 8, 5, 16)".

        Args:
            name: the tensor's name in the message.
            x: the tensor to check.
            **sizes: shape letter -> size (None: any), one per dimension, in order.
        """
        got = tuple(x.shape)
        if len(got) == len(sizes) and all(n is None or n == g for n, g in zip(sizes.values(), got)):
            return
        letters = ", ".join(sizes)
        wanted = ", ".join(letter if n is None else str(n) for letter, n in sizes.items())
        raise ValueError(f"{name} must have shape ({letters}) = ({wanted}) for this cache, "
                         f"got {got}")

    def advance(self, T: int) -> None:
        """Mark ``T`` more positions as filled (the model calls it once per forward pass).

        Args:
            T: the number of positions the pass wrote.
        """
        self.check_room(T)
        self.pos += T

    def reset(self) -> None:
        """Forget every cached position (the memory is kept for the next sequence)."""
        self.pos = 0


class KVCache(PositionCache):
    """Preallocated keys and values of every layer, for ``max_seq_len`` positions.

    ``k`` and ``v`` have shape ``(n_layers, B, H_kv, max_seq_len, D)``; the first ``pos``
    positions are filled. Each layer writes its new keys/values at ``pos`` and reads
    ``0 … pos + T - 1``; the model advances ``pos`` once per forward, after the layer loop.

    One ``pos`` serves the whole batch: every sequence writes at the same slots. Prompts of
    different lengths share a cache when padded on the left, with the padded keys blocked by
    a mask in every forward pass (chapter 7); a position per sequence is not supported.
    Growing a cache with ``torch.cat`` instead would copy every cached position at each step.

    Args:
        n_layers: layers of the model, one slot each.
        batch_size: B.
        n_kv_heads: H_kv.
        max_seq_len: positions held.
        head_dim: D.
        dtype: the dtype of the keys and values.
        device: where the cache is allocated.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_seq_len: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        check_positive(n_layers=n_layers, batch_size=batch_size, n_kv_heads=n_kv_heads,
                       max_seq_len=max_seq_len, head_dim=head_dim)
        super().__init__(max_seq_len)
        shape = (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, max_seq_len, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, max_seq_len, D)

    @property
    def n_layers(self) -> int:
        """The number of layers, one slot each."""
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        """B, the sequences the cache holds."""
        return self.k.shape[1]

    def tensors(self) -> tuple[Tensor, ...]:
        """``k`` and ``v``: 2 · n_layers · B · H_kv · max_seq_len · D numbers."""
        return self.k, self.v

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys and values at ``pos`` in layer ``layer_idx``'s slot and return
        all its cached ones. Does not advance ``pos``.

        Args:
            layer_idx: the layer's slot.
            k: new keys ``(B, H_kv, T, D)``.
            v: new values ``(B, H_kv, T, D)``.

        Returns:
            ``(keys, values)``, each ``(B, H_kv, pos + T, D)``: views of the cache.
        """
        if not 0 <= layer_idx < self.n_layers:
            raise ValueError(f"layer_idx must be in [0, {self.n_layers - 1}], got {layer_idx}")
        _, B, H_kv, _, D = self.k.shape
        T = k.shape[2] if k.dim() == 4 else 0
        if k.shape != (B, H_kv, T, D) or v.shape != (B, H_kv, T, D):  # one quick comparison
            self.check_shape("k", k, B=B, H_kv=H_kv, T=None, D=D)
            self.check_shape("v", v, B=B, H_kv=H_kv, T=T, D=D)
        self.check_room(T)
        end = self.pos + T
        self.k[layer_idx, :, :, self.pos:end] = k
        self.v[layer_idx, :, :, self.pos:end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]  # (B, H_kv, end, D)
