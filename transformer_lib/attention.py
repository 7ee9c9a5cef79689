"""Scaled dot-product attention, masks, and multi-head attention (MHA, GQA, MQA).

Shape letters used throughout the library:
    B batch, T query length, S key length, H query heads, H_kv key/value heads,
    D head dim, C model dim (d_model), V vocabulary size.

Mask convention: a boolean mask where **True means "may attend"**. Note that
``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` use the opposite
convention for boolean masks (True = "blocked"); pass ``~mask`` to them.

Two implementations of the same attention: :func:`scaled_dot_product_attention`, written
out (``"eager"``, the reference), and :func:`sdpa_attention`, PyTorch's fused kernel
``torch.nn.functional.scaled_dot_product_attention`` (``"sdpa"``), which never returns the
weights. "Causal" means the same in both: the T queries are the *last* T of the S positions.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.cache import KVCache
from transformer_lib.positional import apply_rope

ATTN_IMPLEMENTATIONS = ("eager", "sdpa")  # the reference, written out; PyTorch's fused kernel
_SDPA_HAS_GQA = torch.__version__ >= "2.5"  # F.scaled_dot_product_attention(enable_gqa=...)


def _check_mask(mask: Tensor, T: int, S: int, batch_shape: torch.Size) -> None:
    """Raise a ValueError unless ``mask`` is boolean and broadcasts to (..., T, S)."""
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a boolean tensor (True = may attend), got dtype {mask.dtype}"
        )
    target = (*batch_shape, T, S)
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), target)
    except RuntimeError:
        broadcast = None
    if broadcast != target:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {target}"
        )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √D) v, written out with tensor operations.

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``.
        v: values ``(..., S, Dv)``; ``Dv`` may differ from ``D``.
        mask: optional boolean mask broadcastable to ``(..., T, S)``; True = may attend.
            Blocked scores are set to -inf *before* the softmax, so they get weight exactly 0.
            A query whose keys are all blocked gets all-zero weights (and a zero output)
            instead of NaN.
        dropout_p: dropout probability on the attention weights (use 0 in eval).

    Returns:
        ``(out, weights)``: out ``(..., T, Dv)``, weights ``(..., T, S)``; every row of
        ``weights`` that has at least one visible key sums to 1.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}"
        )
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = (q * D ** -0.5) @ k.transpose(-2, -1)  # (..., T, S); scaling q is cheaper than scores
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()  # softmax in at least fp32 (fp64 stays fp64)
    if mask is not None:
        _check_mask(mask, T, S, scores.shape[:-2])
        scores.masked_fill_(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    if mask is not None:
        # A row with no visible key is NaN after softmax(-inf, ..., -inf): make it 0.
        has_key = mask.any(dim=-1, keepdim=True)  # broadcastable to (..., T, 1)
        if not bool(has_key.all()):
            weights = weights.masked_fill(~has_key, 0.0)
    weights = weights.to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = weights @ v  # (..., T, Dv)
    return out, weights


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular boolean mask: query i may attend to key j iff j <= i + (S - T).

    With ``S > T`` the T queries are the *last* T positions of the sequence, after a
    cached prefix of ``S - T`` positions (KV-cache decoding). True = may attend.

    Returns:
        ``(T, S)`` boolean tensor.
    """
    S = T if S is None else S
    if T < 1 or S < T:
        raise ValueError(f"causal_mask needs 1 <= T <= S, got T={T}, S={S}")
    rows = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) absolute query positions
    cols = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return cols <= rows  # (T, S)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat each key/value head ``n_rep`` times, for grouped-query attention.

    From ``(B, H_kv, S, D)`` to ``(B, H_kv * n_rep, S, D)``. Heads are *interleaved*
    (kv0, kv0, kv1, kv1, ...), not tiled (kv0, kv1, kv0, kv1): query head h reads
    key/value head ``h // n_rep``.
    """
    if n_rep < 1:
        raise ValueError(f"n_rep must be >= 1, got {n_rep}")
    if n_rep == 1:
        return x
    B, H_kv, S, D = x.shape
    x = x[:, :, None, :, :].expand(B, H_kv, n_rep, S, D)  # (B, H_kv, n_rep, S, D)
    return x.reshape(B, H_kv * n_rep, S, D)  # (B, H, S, D)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The fused path: ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), with the
    causal mask aligned bottom-right as everywhere in this library.

    SDPA's own ``is_causal=True`` lets query i see keys j <= i: its triangle is aligned to the
    *top left*, which is right only when T == S. After a cached prefix (S > T) query i sits at
    position S - T + i, so the mask must be :func:`causal_mask` ``(T, S)``. Hence three cases
    for ``causal=True``:

    * T == 1: one query at the last position sees every key; no mask at all;
    * T == S (no cached prefix) and no other mask: ``is_causal=True``, which lets the kernel
      skip the blocks above the diagonal;
    * otherwise (a chunk after a cached prefix): an explicit boolean mask.

    Args:
        q: queries ``(B, H, T, D)``.
        k, v: keys and values ``(B, H_kv, S, D)``, ``H`` a multiple of ``H_kv`` (grouped-query
            attention: query head h reads key/value head ``h // (H / H_kv)``, as in
            :func:`repeat_kv`).
        mask: optional boolean mask broadcastable to ``(B, H, T, S)``; True = may attend.
        causal: the T queries are the last T of the S positions and see no later key.
        dropout_p: dropout probability on the attention weights (use 0 in eval).

    Returns:
        ``(B, H, T, D)``.
    """
    H, H_kv, T, S = q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2]
    if H % H_kv != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_kv})")
    is_causal = False
    if causal and T > 1:
        if T == S and mask is None:
            is_causal = True  # square: top-left and bottom-right alignment coincide
        else:
            bottom_right = causal_mask(T, S, device=q.device)  # (T, S)
            mask = bottom_right if mask is None else mask & bottom_right
    if mask is not None:
        _check_mask(mask, T, S, q.shape[:-2])
    n_rep = H // H_kv  # query heads per key/value head
    gqa = {}
    if n_rep > 1 and _SDPA_HAS_GQA:
        gqa = {"enable_gqa": True}  # the kernel reads each key/value head n_rep times
    elif n_rep > 1:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal, **gqa)  # (B, H, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with one projection per role and a reshape into heads.

    ``n_kv_heads`` < ``n_heads`` gives grouped-query attention (GQA); ``n_kv_heads = 1``
    gives multi-query attention (MQA); ``None`` means ordinary multi-head attention.

    ``forward(x)`` is self-attention; ``forward(x, context)`` is cross-attention (queries
    from ``x``, keys and values from ``context``). The last attention weights
    ``(B, H, T, S)`` are kept in ``self.last_weights`` for plotting. ``layer_idx`` is the
    layer's place in its model: which slot of a :class:`~transformer_lib.cache.KVCache` it uses.

    ``attn_implementation`` chooses how the weighted sum is computed: ``"eager"`` (default)
    with :func:`scaled_dot_product_attention`, the reference; ``"sdpa"`` with
    :func:`sdpa_attention`, PyTorch's fused kernel, which never forms the weights, so
    ``last_weights`` is not available then.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        layer_idx: int = 0,
        attn_implementation: str = "eager",
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model < 1 or n_heads < 1 or n_kv_heads < 1:
            raise ValueError(
                f"d_model ({d_model}), n_heads ({n_heads}) and n_kv_heads ({n_kv_heads}) "
                "must be positive"
            )
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if layer_idx < 0:
            raise ValueError(f"layer_idx must be >= 0, got {layer_idx}")
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, "
                             f"got {attn_implementation!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.n_rep = n_heads // n_kv_heads  # query heads per key/value head
        self.dropout = dropout
        self.layer_idx = layer_idx
        self.attn_implementation = attn_implementation
        kv_dim = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)
        self._last_weights: Tensor | None = None

    @property
    def last_weights(self) -> Tensor | None:
        """The attention weights ``(B, H, T, S)`` of the last forward pass (eager only)."""
        if self.attn_implementation != "eager":
            raise RuntimeError(
                f"last_weights is not kept with attn_implementation={self.attn_implementation!r}: "
                "the fused kernel never forms the weights; use attn_implementation='eager'"
            )
        return self._last_weights

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        rope: tuple[Tensor, Tensor] | None = None,
        rope_pairing: str = "half",
        kv_cache: KVCache | None = None,
        causal: bool = False,
    ) -> Tensor:
        """Attend from ``x`` to ``context`` (or to ``x`` itself).

        Args:
            x: queries' input ``(B, T, C)``.
            context: keys' and values' input ``(B, S, C)``; None means self-attention.
            mask: boolean, broadcastable to ``(B, H, T, S)``; True = may attend.
            rope: optional ``(cos, sin)`` tables ``(T, D/2)`` for the T query positions;
                rotates q and k (never v) with :func:`transformer_lib.positional.apply_rope`.
            rope_pairing: ``"half"`` or ``"interleaved"`` (see ``apply_rope``).
            kv_cache: optional :class:`transformer_lib.cache.KVCache`; the new keys and
                values are written into slot ``self.layer_idx`` at the cache's position, and
                every cached one is attended.
            causal: the T queries are the last T of the key positions (cached ones
                included) and see no later key, as :func:`causal_mask` ``(T, S)``; combined
                with ``mask`` if both are given.

        Returns:
            ``(B, T, C)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (B, T, {self.d_model}), got {tuple(x.shape)}"
            )
        context = x if context is None else context
        if context.dim() != 3 or context.shape[-1] != self.d_model:
            raise ValueError(
                f"context must have shape (B, S, {self.d_model}), got {tuple(context.shape)}"
            )
        B, T, C = x.shape
        S = context.shape[1]
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(context).view(B, S, self.n_kv_heads, self.head_dim)  # (B, S, H_kv, D)
        v = self.v_proj(context).view(B, S, self.n_kv_heads, self.head_dim)  # (B, S, H_kv, D)
        q = q.transpose(1, 2)  # (B, H, T, D)
        k = k.transpose(1, 2)  # (B, H_kv, S, D)
        v = v.transpose(1, 2)  # (B, H_kv, S, D)
        if rope is not None:
            cos, sin = rope
            q = apply_rope(q, cos, sin, pairing=rope_pairing)
            k = apply_rope(k, cos, sin, pairing=rope_pairing)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)  # (B, H_kv, S_cached + S, D)
        p = self.dropout if self.training else 0.0
        if self.attn_implementation == "sdpa":
            out = sdpa_attention(q, k, v, mask, causal=causal, dropout_p=p)  # (B, H, T, D)
        else:
            if causal and T > 1:  # (a single query, the last position, sees every key)
                bottom_right = causal_mask(T, k.shape[2], device=x.device)  # (T, S)
                mask = bottom_right if mask is None else mask & bottom_right
            k = repeat_kv(k, self.n_rep)  # (B, H, S, D)
            v = repeat_kv(v, self.n_rep)  # (B, H, S, D)
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
            self._last_weights = weights.detach()  # (B, H, T, S)
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, H*D) = (B, T, C)
        return self.o_proj(out)
