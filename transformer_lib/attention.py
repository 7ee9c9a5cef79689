"""Scaled dot-product attention, masks, and multi-head attention (MHA, GQA, MQA).

Shape letters used throughout the library: B batch, T query length, S key length, H query
heads, H_kv key/value heads, D head dim, C model dim (d_model), V vocabulary size.

Mask convention: a boolean mask where **True means "may attend"**. Note that
``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` use the opposite
convention for boolean masks (True = "blocked"); pass ``~mask`` to them.

One attention, three ways to compute it, chosen by name from :data:`ATTENTION_FUNCTIONS`
(as Hugging Face's ``ALL_ATTENTION_FUNCTIONS``). Every entry has the same signature::

    fn(q, k, v, mask=None, *, causal=False, scale=None, dropout_p=0.0, need_weights=False)
        -> (out, weights or None)

with q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` and out
``(B, H, T, Dv)``; grouped key/value heads are handled inside each entry:

* ``"eager"``, :func:`eager_attention`: written out (:func:`scaled_dot_product_attention`),
  the reference; the only entry that forms the weights ``(B, H, T, S)``, returned when
  ``need_weights`` is True;
* ``"sdpa"``, :func:`sdpa_attention`: PyTorch's fused kernel
  ``torch.nn.functional.scaled_dot_product_attention``;
* ``"tiled"``, :func:`tiled_attention`: :func:`transformer_lib.flash.flash_attention`, key
  tiles with an online softmax.

"Causal" means the same in all three: the T queries are the *last* T of the S positions
(bottom-right, right after a cached prefix), combined with any other mask by AND.
:func:`attention_mask` is the one place where that becomes a mask.

A :class:`MultiHeadAttention` layer keeps its last weights only when asked
(``keep_weights=True``, or a model run inside ``with record_weights(model):``), so that a
model holds no ``(B, H, T, S)`` tensor between calls.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.cache import KVCache
from transformer_lib.flash import flash_attention
from transformer_lib.positional import apply_rope
from transformer_lib.validation import (
    check_bool,
    check_choice,
    check_mask,
    check_positive,
    check_qkv,
    compute_dtype,
    zero_rows_without_keys,
)

# ---- the written-out reference and the causal mask -----------------------------------------

def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """The softmax over the last axis of ``scores``, where ``mask`` blocks entries.

    Args:
        scores: ``(..., S)``, any floating dtype.
        mask: optional boolean, broadcastable to ``scores``; True = may attend. A blocked
            entry gets -inf before the softmax, so its weight is exactly 0.

    Returns:
        The weights, shaped and typed like ``scores``: each row with an allowed entry sums to
        1; a row whose entries are all blocked is all 0, not the NaN of a softmax over -inf
        alone. The maximum of each row is subtracted first (inside ``torch.softmax``), so large
        scores do not overflow; half-precision scores are computed in fp32
        (:func:`transformer_lib.validation.compute_dtype`).
    """
    x = scores.to(compute_dtype(scores.dtype))
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(x, dim=-1)
    weights = zero_rows_without_keys(weights, mask, x.shape[-1])  # (-inf, …, -inf) -> 0
    return weights.to(scores.dtype)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √D) v, written out with tensor operations.

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``; leading dims broadcast against ``q``'s.
        v: values ``(..., S, Dv)``; ``Dv`` may differ from ``D``.
        mask: optional boolean mask broadcastable to ``(..., T, S)``; True = may attend.
            Blocked scores are set to -inf *before* the softmax, so they get weight exactly 0.
            A query whose keys are all blocked gets all-zero weights (and a zero output)
            instead of NaN.
        dropout_p: dropout probability on the attention weights (use 0 in eval).
        scale: the factor on the scores; None means ``D ** -0.5``.

    Returns:
        ``(out, weights)``: out ``(..., T, Dv)``, weights ``(..., T, S)``; every row of
        ``weights`` that has at least one visible key sums to 1. Half-precision scores go
        through the softmax in fp32 (:func:`transformer_lib.validation.compute_dtype`).
    """
    check_qkv(q, k, v)
    T, S = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., T, S); scaling q is cheaper than scores
    scores = scores.to(compute_dtype(scores.dtype))  # softmax in at least fp32
    if mask is not None:
        check_mask(mask, T, S, scores.shape[:-2])
    weights = masked_softmax(scores, mask).to(v.dtype)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = weights @ v  # (..., T, Dv)
    return out, weights


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular boolean mask: query i may attend to key j iff j <= i + (S - T).

    With ``S > T`` the T queries are the *last* T positions of the sequence, after a
    cached prefix of ``S - T`` positions (KV-cache decoding). True = may attend.

    Args:
        T: number of queries.
        S: number of keys, ``S >= T``; None means ``S = T``.
        device: where the mask is made.

    Returns:
        ``(T, S)`` boolean tensor.

    Raises:
        ValueError: unless ``1 <= T <= S``.
    """
    S = T if S is None else S
    if T < 1 or S < T:
        raise ValueError(f"causal_mask needs 1 <= T <= S, got T={T}, S={S}")
    rows = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) absolute query positions
    cols = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return cols <= rows  # (T, S)


def attention_mask(T: int, S: int, mask: Tensor | None = None, *, causal: bool = False,
                   device: torch.device | str | None = None) -> Tensor | None:
    """The mask attention applies: ``mask`` AND, with ``causal``, :func:`causal_mask` ``(T, S)``.

    This is where every implementation turns ``causal`` into a mask. A single query
    (T == 1, a decoding step) is the last position and sees every key, so no mask is built
    for it.

    Args:
        T, S: numbers of queries and keys (``S >= T`` with ``causal``).
        mask: optional boolean mask broadcastable to ``(..., T, S)``, e.g. key padding
            ``(B, 1, 1, S)``; True = may attend.
        causal: the T queries are the last T of the S positions and see no later key.
        device: where to build the causal part.

    Returns:
        a boolean mask broadcastable to ``(..., T, S)``, or None when nothing is blocked.

    Raises:
        ValueError: ``mask`` is not boolean or does not broadcast to ``(..., T, S)``.
    """
    if mask is not None:
        check_mask(mask, T, S, mask.shape[:-2])  # a boolean mask, before it meets causal's
    if not causal or T == 1:
        return mask
    bottom_right = causal_mask(T, S, device=device)  # (T, S)
    return bottom_right if mask is None else mask & bottom_right  # (..., T, S)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat each key/value head ``n_rep`` times, for grouped-query attention.

    From ``(B, H_kv, S, D)`` to ``(B, H_kv * n_rep, S, D)``. Heads are *interleaved*
    (kv0, kv0, kv1, kv1, ...), not tiled (kv0, kv1, kv0, kv1): query head h reads
    key/value head ``h // n_rep``.

    Args:
        x: keys or values ``(B, H_kv, S, D)``.
        n_rep: copies of each head, ``H / H_kv`` (1 returns ``x`` itself).

    Returns:
        ``(B, H_kv * n_rep, S, D)``.
    """
    if n_rep < 1:
        raise ValueError(f"n_rep must be >= 1, got {n_rep}")
    if n_rep == 1:
        return x
    B, H_kv, S, D = x.shape
    x = x[:, :, None, :, :].expand(B, H_kv, n_rep, S, D)  # (B, H_kv, n_rep, S, D)
    return x.reshape(B, H_kv * n_rep, S, D)  # (B, H, S, D)


def _heads_per_kv_head(q: Tensor, k: Tensor, v: Tensor) -> int:
    """H / H_kv for q ``(B, H, T, D)`` and k, v ``(B, H_kv, S, ·)``; ValueError otherwise."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k and v must have 4 dimensions (B, H, T, D), (B, H_kv, S, D), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    H, H_kv = q.shape[1], k.shape[1]
    if v.shape[1] != H_kv:
        raise ValueError(f"k and v must have the same number of heads, got {H_kv} and "
                         f"{v.shape[1]}")
    if H % H_kv != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_kv})")
    return H // H_kv


# ---- the three entries of ATTENTION_FUNCTIONS ----------------------------------------------

def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                    causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                    need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """The reference: :func:`repeat_kv`, then :func:`scaled_dot_product_attention`.

    Args:
        q: queries ``(B, H, T, D)``.
        k, v: keys ``(B, H_kv, S, D)`` and values ``(B, H_kv, S, Dv)``, ``H`` a multiple of
            ``H_kv`` (query head h reads key/value head ``h // (H / H_kv)``).
        mask: optional boolean mask broadcastable to ``(B, H, T, S)``; True = may attend.
        causal: the T queries are the last T of the S positions (:func:`attention_mask`).
        scale: the factor on the scores; None means ``D ** -0.5``.
        dropout_p: dropout probability on the attention weights (use 0 in eval).
        need_weights: return the weights ``(B, H, T, S)`` too.

    Returns:
        ``(out, weights)``: out ``(B, H, T, Dv)``; weights ``(B, H, T, S)`` if
        ``need_weights``, else None.
    """
    n_rep = _heads_per_kv_head(q, k, v)
    mask = attention_mask(q.shape[-2], k.shape[-2], mask, causal=causal, device=q.device)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D), (B, H, S, Dv)
    out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p, scale)  # (B, H, T, Dv)
    return out, (weights if need_weights else None)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                   causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                   need_weights: bool = False) -> tuple[Tensor, None]:
    """The fused path: ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), with the
    causal mask aligned bottom-right as everywhere in this library.

    SDPA's own ``is_causal=True`` lets query i see keys j <= i: its triangle is aligned to the
    *top left*, which is right only when T == S. After a cached prefix (S > T) query i sits at
    position S - T + i, so the kernel gets the mask of :func:`attention_mask` instead. For a
    square causal pass with no other mask the two coincide, and ``is_causal=True`` lets the
    kernel skip the blocks above the diagonal. A query whose keys are all blocked gets a zero
    output, as with the other entries (whatever this PyTorch's SDPA returns for it). The
    kernel never forms the weights, so ``need_weights`` is accepted and None returned.

    Args:
        q, k, v, mask, causal, scale, dropout_p, need_weights: as in :func:`eager_attention`:
            q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)``, mask
            broadcastable to ``(B, H, T, S)``.

    Returns:
        ``(out, None)``, out ``(B, H, T, Dv)``.
    """
    n_rep = _heads_per_kv_head(q, k, v)
    check_qkv(q, k, v)
    T, S = q.shape[-2], k.shape[-2]
    if mask is not None:
        check_mask(mask, T, S, q.shape[:-2])
    if causal and mask is None and T == S > 1:
        attn_mask, is_causal = None, True  # square: top-left and bottom-right coincide
    else:
        attn_mask = attention_mask(T, S, mask, causal=causal, device=q.device)  # (..., T, S)
        is_causal = False
    # enable_gqa: the kernel reads each key/value head n_rep times, with no repeat_kv copy
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale,
                                         enable_gqa=n_rep > 1)  # (B, H, T, Dv)
    # A query that sees no key (mask AND causal block its row) gets 0, whatever the kernel gives.
    return zero_rows_without_keys(out, mask, S, causal=causal), None


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                    causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                    need_weights: bool = False) -> tuple[Tensor, None]:
    """Key tiles with an online softmax: :func:`transformer_lib.flash.flash_attention`
    (64 keys per tile), after :func:`repeat_kv`. It skips the key tiles a causal query
    cannot see and never forms the weights, so ``need_weights`` is accepted and None
    returned.

    Args:
        q, k, v, mask, causal, scale, dropout_p, need_weights: as in :func:`eager_attention`:
            q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)``, mask
            broadcastable to ``(B, H, T, S)``.

    Returns:
        ``(out, None)``, out ``(B, H, T, Dv)``.
    """
    n_rep = _heads_per_kv_head(q, k, v)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D), (B, H, S, Dv)
    out = flash_attention(q, k, v, mask=mask, causal=causal, scale=scale,
                          dropout_p=dropout_p)  # (B, H, T, Dv)
    return out, None


#: The signature every attention entry shares: ``fn(q, k, v, mask=None, *, causal=False,
#: scale=None, dropout_p=0.0, need_weights=False) -> (out, weights or None)``.
AttentionFunction = Callable[..., tuple[Tensor, "Tensor | None"]]

#: The attention entries by name (``attn_implementation``): ``"eager"``, ``"sdpa"``, ``"tiled"``.
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {
    "eager": eager_attention,  # the reference, written out; forms the weights
    "sdpa": sdpa_attention,  # PyTorch's fused kernel
    "tiled": tiled_attention,  # key tiles with an online softmax (flash.py)
}
ATTN_IMPLEMENTATIONS = tuple(ATTENTION_FUNCTIONS)  #: the names: ("eager", "sdpa", "tiled")


# ---- the layer -----------------------------------------------------------------------------

class MultiHeadAttention(nn.Module):
    """Multi-head attention with one projection per role and a reshape into heads.

    ``n_kv_heads`` < ``n_heads`` gives grouped-query attention (GQA); ``n_kv_heads = 1``
    gives multi-query attention (MQA); ``None`` means ordinary multi-head attention.

    ``forward(x)`` is self-attention; ``forward(x, context)`` is cross-attention (queries
    from ``x``, keys and values from ``context``). ``layer_idx`` is the layer's place in its
    model: which slot of a :class:`~transformer_lib.cache.KVCache` it uses.

    ``attn_implementation`` names the entry of :data:`ATTENTION_FUNCTIONS` that computes the
    weighted sum: ``"eager"`` (default, the reference), ``"sdpa"`` (PyTorch's fused kernel)
    or ``"tiled"`` (online softmax over key tiles); all three compute the same function.

    ``keep_weights=True`` keeps the attention weights ``(B, H, T, S)`` of the last forward
    pass, detached, in :attr:`last_weights` (for plots); by default nothing is kept, so a
    model holds no ``(B, H, T, S)`` tensor between calls.
    :func:`~transformer_lib.recording.record_weights` turns it on
    for every layer of a model for the length of a ``with`` block. Only ``"eager"`` forms
    the weights.

    Args:
        d_model: C, the width of the input and the output.
        n_heads: H, query heads; head dim ``D = d_model // n_heads``.
        n_kv_heads: H_kv, key/value heads (a divisor of ``n_heads``); None means ``n_heads``.
        bias: whether the four projections have biases.
        dropout: dropout probability on the attention weights in training.
        layer_idx: the layer's slot in a :class:`~transformer_lib.cache.KVCache`.
        attn_implementation: ``"eager"``, ``"sdpa"`` or ``"tiled"``.
        keep_weights: keep the last weights ``(B, H, T, S)`` in :attr:`last_weights`.
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
        keep_weights: bool = False,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_positive(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
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
        check_choice("attn_implementation", attn_implementation, ATTN_IMPLEMENTATIONS)
        check_bool("keep_weights", keep_weights)
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.n_rep = n_heads // n_kv_heads  # query heads per key/value head
        self.dropout = dropout
        self.layer_idx = layer_idx
        self.attn_implementation = attn_implementation
        self.keep_weights = keep_weights  # keep the last weights (B, H, T, S) for plots
        kv_dim = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)
        self._last_weights: Tensor | None = None

    @property
    def last_weights(self) -> Tensor:
        """The attention weights ``(B, H, T, S)`` of the last forward pass, if it kept them.

        Raises:
            RuntimeError: nothing was kept; the message says how to ask for the weights.
        """
        if self._last_weights is not None:
            return self._last_weights
        if self.attn_implementation != "eager":
            raise RuntimeError(
                f"last_weights is not kept with attn_implementation={self.attn_implementation!r}: "
                "that path never forms the weights; use attn_implementation='eager' with "
                "keep_weights=True"
            )
        if self.keep_weights:
            raise RuntimeError("no attention weights yet: run a forward pass first")
        raise RuntimeError(
            "no attention weights were kept: build the layer with "
            "MultiHeadAttention(..., keep_weights=True), or run the model inside "
            "`with record_weights(model): ...` (from transformer_lib.recording)"
        )

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
        attend = ATTENTION_FUNCTIONS[self.attn_implementation]
        out, weights = attend(q, k, v, mask, causal=causal,
                              dropout_p=self.dropout if self.training else 0.0,
                              need_weights=self.keep_weights)  # (B, H, T, D)
        if weights is not None:
            self._last_weights = weights.detach()  # (B, H, T, S), kept on request
        elif self._last_weights is not None:
            self._last_weights = None  # the old ones go too: nothing (B, H, T, S) outlives a call
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, H*D) = (B, T, C)
        return self.o_proj(out)
