"""Multi-head latent attention (MLA, DeepSeek-V2/V3): a KV cache of compressed latents.

Ordinary multi-head attention caches a key and a value per head: 2·H·D numbers per token and
layer. MLA caches one normalised latent ``c_kv`` of width d_c = ``kv_lora_rank`` per token,
from which every head's key and value are *up-projected* (``kv_b_proj``), plus one small key
``k_rope`` that carries the position (RoPE), shared by all heads: d_c + D_r numbers per token.

Why a separate RoPE part: RoPE rotates keys by their position, and a rotation between the
latent and the key would stop ``W_UK`` from being folded into the query. So the key is
split::

    k_h = [ W_UK,h c_kv  (D_nope channels, no position) ;  RoPE(k_rope)  (D_r, shared) ]
    q_h = [ q_nope,h                                     ;  RoPE(q_rope,h)             ]
    q_h · k_h = q_nope,h · (W_UK,h c_kv) + RoPE(q_rope,h) · RoPE(k_rope).

Two ways to attend over the cache, equal up to rounding::

    explicit: up-project every cached latent to per-head keys and values, then attend;
    absorbed: (W_UK,hᵀ q_nope,h) · c_kv scores the latents directly, and since
              Σ_s w_s W_UV,h c_s = W_UV,h Σ_s w_s c_s, the weights average the latents and
              W_UV,h is applied once per query. Per-head keys/values never exist: at decode
              time this is multi-query attention over a single latent "head".

The absorbed form suits decoding (few queries, a long cache); for a long prefill the explicit
form does fewer operations, since its scores cost D_n + D_r per pair instead of d_c + D_r.

Parameter names are DeepSeek's / Hugging Face's (``q_proj`` or ``q_a_proj``/``q_a_layernorm``/
``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``), so the
state dict of a Hugging Face ``DeepseekV3Attention`` loads one to one. Shape letters: D_n =
``qk_nope_head_dim``, D_r = ``qk_rope_head_dim``, D_v = ``v_head_dim``, d_c = ``kv_lora_rank``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.attention import attention_mask, scaled_dot_product_attention
from transformer_lib.cache import PositionCache, cache_length
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import PAIRINGS, apply_rope, rope_cos_sin
from transformer_lib.validation import (
    check_choice,
    check_float,
    check_int,
    check_positive,
)

__all__ = ["MLAConfig", "MLACache", "MultiHeadLatentAttention"]


@dataclass
class MLAConfig:
    """The sizes of a :class:`MultiHeadLatentAttention` layer; every field is checked for type
    and range when created.

    DeepSeek-V3 uses d_model=7168, n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536.
    """

    d_model: int = 64  #: C: width of the residual stream
    n_heads: int = 4  #: H: attention heads
    kv_lora_rank: int = 32  #: d_c: width of the cached KV latent c_kv
    qk_nope_head_dim: int = 16  #: D_n: per-head query/key channels without position (from c_kv)
    qk_rope_head_dim: int = 8  #: D_r: per-head query / shared key channels rotated by RoPE; even
    v_head_dim: int = 16  #: D_v: per-head value channels
    q_lora_rank: int | None = None  #: width of the query latent; None = queries straight from x
    max_seq_len: int = 128  #: longest sequence (prompt + generated); default cache length
    rope_theta: float = 10000.0  #: RoPE base θ
    rope_pairing: str = "interleaved"  #: DeepSeek's checkpoints: "interleaved"; or "half"
    norm_eps: float = 1e-6  #: epsilon of the two RMSNorms on the latents (HF: rms_norm_eps)

    def __post_init__(self):
        for name in ("d_model", "n_heads", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "max_seq_len"):
            check_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            check_int("q_lora_rank", self.q_lora_rank)
        if self.qk_rope_head_dim % 2 != 0:
            raise ValueError(
                f"RoPE needs an even qk_rope_head_dim, got {self.qk_rope_head_dim}"
            )
        check_float("rope_theta", self.rope_theta, low=1.0, low_open=True)  # as rope_cos_sin
        check_choice("rope_pairing", self.rope_pairing, PAIRINGS)
        check_float("norm_eps", self.norm_eps, low=0.0, low_open=True)

    @property
    def qk_head_dim(self) -> int:
        """D_n + D_r: each head's query and key width; the softmax scale is 1/√(D_n + D_r)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLACache(PositionCache):
    """One layer's MLA cache: the normalised latent and the rotated RoPE key, nothing else.

    ``c_kv`` ``(B, max_seq_len, d_c)`` and ``k_rope`` ``(B, max_seq_len, D_r)``; the first
    ``pos`` positions are filled. It keeps the contract of
    :class:`transformer_lib.cache.PositionCache`: ``update`` writes at ``pos`` and never
    moves it; :meth:`MultiHeadLatentAttention.forward`, which owns the cache (one per layer),
    advances it once, at the end.
    """

    def __init__(self, batch_size: int, max_seq_len: int, kv_lora_rank: int,
                 qk_rope_head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        check_positive(batch_size=batch_size, max_seq_len=max_seq_len,
                       kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
        super().__init__(max_seq_len)
        self.c_kv = torch.zeros(batch_size, max_seq_len, kv_lora_rank, dtype=dtype,
                                device=device)  # (B, max_seq_len, d_c)
        self.k_rope = torch.zeros(batch_size, max_seq_len, qk_rope_head_dim, dtype=dtype,
                                  device=device)  # (B, max_seq_len, D_r)

    @property
    def batch_size(self) -> int:
        """B, the sequences the cache holds."""
        return self.c_kv.shape[0]

    def tensors(self) -> tuple[Tensor, ...]:
        """``c_kv`` and ``k_rope``: B · max_seq_len · (d_c + D_r) numbers."""
        return self.c_kv, self.k_rope

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached position costs in one sequence: (d_c + D_r) · sizeof(dtype)."""
        return self.nbytes // (self.batch_size * self.max_seq_len)

    def update(self, c_kv: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new latents and RoPE keys at ``pos`` and return every cached position.
        Does not advance ``pos``.

        Args:
            c_kv: new KV latents ``(B, T, d_c)``.
            k_rope: new rotated keys ``(B, T, D_r)``, shared by every head.

        Returns:
            ``(c_kv, k_rope)``: ``(B, pos + T, d_c)`` and ``(B, pos + T, D_r)``, views of
            the cache.
        """
        B, _, d_c = self.c_kv.shape
        self.check_shape("c_kv", c_kv, B=B, T=None, d_c=d_c)
        self.check_shape("k_rope", k_rope, B=B, T=c_kv.shape[1], D_r=self.k_rope.shape[2])
        T = c_kv.shape[1]
        self.check_room(T)
        end = self.pos + T
        self.c_kv[:, self.pos:end] = c_kv
        self.k_rope[:, self.pos:end] = k_rope
        return self.c_kv[:, :end], self.k_rope[:, :end]  # (B, end, d_c), (B, end, D_r)


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention through a compressed KV latent with a decoupled RoPE part.

    Args:
        config: the layer's sizes.
    """

    def __init__(self, config: MLAConfig):
        super().__init__()
        self.config = c = config
        H = c.n_heads
        if c.q_lora_rank is None:  # queries straight from x (DeepSeek-V2-Lite)
            self.q_proj = nn.Linear(c.d_model, H * c.qk_head_dim, bias=False)
        else:  # queries through their own normalised latent (not cached; saves training memory)
            self.q_a_proj = nn.Linear(c.d_model, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim, bias=False)
        # One projection gives the latent (d_c) and the single-head RoPE key (D_r) together:
        # "with_mqa" because that key is shared by all heads, as in multi-query attention.
        self.kv_a_proj_with_mqa = nn.Linear(c.d_model, c.kv_lora_rank + c.qk_rope_head_dim,
                                            bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.norm_eps)
        # Up-projection of the latent: rows per head are [W_UK,h (D_n rows); W_UV,h (D_v rows)].
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, c.d_model, bias=False)

    def new_cache(self, batch_size: int, max_seq_len: int | None = None) -> MLACache:
        """An empty :class:`MLACache` for this layer, on its device and dtype.

        Args:
            batch_size: B.
            max_seq_len: the positions it holds, at most the config's (None: the config's).

        Returns:
            The cache.
        """
        c, w = self.config, self.kv_b_proj.weight
        return MLACache(batch_size, cache_length(max_seq_len, c.max_seq_len), c.kv_lora_rank,
                        c.qk_rope_head_dim, dtype=w.dtype, device=w.device)

    def forward(self, x: Tensor, cache: MLACache | None = None, absorb: bool = False) -> Tensor:
        """Causal self-attention of ``x``, continuing after the cached positions if any.

        Args:
            x: ``(B, T, C)``; with a cache, positions ``cache.pos … cache.pos + T - 1``.
            cache: optional :class:`MLACache`; the new latents and RoPE keys are written at
                ``cache.pos``, every cached position is attended, and ``pos`` advances by T
                at the end (this layer owns its cache).
            absorb: False: up-project the latents to per-head keys and values (explicit);
                True: fold W_UK into the queries and W_UV after the weights (absorbed).

        Returns:
            ``(B, T, C)``.
        """
        c = self.config
        if x.dim() != 3 or x.shape[-1] != c.d_model:
            raise ValueError(f"x must have shape (B, T, {c.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        start = 0 if cache is None else cache.pos
        if start + T > c.max_seq_len:
            raise ValueError(f"sequence too long: {start} cached + {T} new positions "
                             f"> max_seq_len ({c.max_seq_len})")
        if cache is not None and cache.batch_size != B:
            raise ValueError(
                f"cache was made for batch size {cache.batch_size}, got x of batch size {B}"
            )
        H, D_n, D_r = c.n_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
        cos, sin = rope_cos_sin(T, D_r, c.rope_theta, offset=start, device=x.device,
                                dtype=x.dtype)  # (T, D_r/2) each

        # Queries: per head a position-free part and a RoPE part.
        if c.q_lora_rank is None:
            q = self.q_proj(x)  # (B, T, H*(D_n+D_r))
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (B, T, H*(D_n+D_r))
        q = q.view(B, T, H, D_n + D_r).transpose(1, 2)  # (B, H, T, D_n+D_r)
        q_nope, q_rope = q.split([D_n, D_r], dim=-1)  # (B, H, T, D_n), (B, H, T, D_r)
        q_rope = apply_rope(q_rope, cos, sin, pairing=c.rope_pairing)  # (B, H, T, D_r)

        # What gets cached: the normalised latent and the rotated single-head RoPE key.
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, D_r], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)  # (B, T, d_c)
        k_rope = apply_rope(k_rope, cos, sin, pairing=c.rope_pairing)  # (B, T, D_r)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)  # (B, S, d_c), (B, S, D_r)
        mask = attention_mask(T, c_kv.shape[1], causal=True, device=x.device)  # (T, S) or None

        attend = self._attend_absorbed if absorb else self._attend_explicit
        out = attend(q_nope, q_rope, c_kv, k_rope, mask)  # (B, H, T, D_v)
        out = out.transpose(1, 2).reshape(B, T, H * c.v_head_dim)  # (B, T, H*D_v)
        if cache is not None:
            cache.advance(T)  # once, at the end: this layer is the cache's model
        return self.o_proj(out)  # (B, T, C)

    def _attend_explicit(self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor,
                         mask: Tensor | None) -> Tensor:
        """Up-project the latents to per-head keys and values, then ordinary attention."""
        c = self.config
        B, H, _, _ = q_nope.shape
        S = c_kv.shape[1]
        D_n, D_r, D_v = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        kv = self.kv_b_proj(c_kv)  # (B, S, H*(D_n+D_v))
        kv = kv.view(B, S, H, D_n + D_v).transpose(1, 2)  # (B, H, S, D_n+D_v)
        k_nope, v = kv.split([D_n, D_v], dim=-1)  # (B, H, S, D_n), (B, H, S, D_v)
        k_rope = k_rope[:, None].expand(B, H, S, D_r)  # (B, H, S, D_r): one key for all heads
        k = torch.cat([k_nope, k_rope], dim=-1)  # (B, H, S, D_n+D_r)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, D_n+D_r)
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask)  # scale 1/√(D_n+D_r)
        return out  # (B, H, T, D_v)

    def _attend_absorbed(self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor,
                         mask: Tensor | None) -> Tensor:
        """Score and average the latents directly; per-head keys and values never exist."""
        c = self.config
        D_n, D_v = c.qk_nope_head_dim, c.v_head_dim
        w = self.kv_b_proj.weight.view(c.n_heads, D_n + D_v, c.kv_lora_rank)  # (H, D_n+D_v, d_c)
        w_uk, w_uv = w.split([D_n, D_v], dim=1)  # (H, D_n, d_c), (H, D_v, d_c)
        q_latent = q_nope @ w_uk  # (B, H, T, d_c): W_UK,hᵀ q_nope,h, a query in latent space
        # Score = q_latent · c_kv + q_rope · k_rope: one dot product over [latent; RoPE key],
        # with a single key/value "head" (B, 1, S, ·) that broadcasts over the H query heads.
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, T, d_c+D_r)
        k = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, S, d_c+D_r)
        # The scale of the full head, 1/√(D_n + D_r), not of d_c + D_r.
        out_latent, _ = scaled_dot_product_attention(q, k, c_kv[:, None], mask,
                                                     scale=c.qk_head_dim ** -0.5)  # (B, H, T, d_c)
        return out_latent @ w_uv.transpose(-2, -1)  # (B, H, T, D_v): W_UV,h applied once
