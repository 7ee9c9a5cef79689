"""Multi-head latent attention (MLA, DeepSeek-V2/V3): a KV cache of compressed latents.

Ordinary multi-head attention caches a key and a value per head: 2·H·D numbers per token and
layer. MLA caches one normalised latent ``c_kv`` of width d_c = ``kv_lora_rank`` per token,
from which every head's key and value are *up-projected* (``kv_b_proj``), plus one small key
``k_rope`` that carries the position (RoPE), shared by all heads: d_c + D_r numbers per token.

Why a separate RoPE part: RoPE rotates keys by their position, and a rotation between the
latent and the key would stop ``W_UK`` from being folded into the query. So the key is split:
    k_h = [ W_UK,h c_kv  (D_nope channels, no position) ;  RoPE(k_rope)  (D_r, shared) ]
    q_h = [ q_nope,h                                     ;  RoPE(q_rope,h)             ]
    q_h · k_h = q_nope,h · (W_UK,h c_kv) + RoPE(q_rope,h) · RoPE(k_rope).

Two ways to attend over the cache, equal up to rounding:
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

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import PAIRINGS, apply_rope, rope_cos_sin
from transformer_lib.validation import check_positive

__all__ = ["MLAConfig", "MLACache", "MultiHeadLatentAttention"]


@dataclass
class MLAConfig:
    """The sizes of a :class:`MultiHeadLatentAttention` layer; checked when created.

    DeepSeek-V3 uses d_model=7168, n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536.
    """

    d_model: int = 64  # C: width of the residual stream
    n_heads: int = 4  # H: attention heads
    kv_lora_rank: int = 32  # d_c: width of the cached KV latent c_kv
    qk_nope_head_dim: int = 16  # D_n: per-head query/key channels without position (from c_kv)
    qk_rope_head_dim: int = 8  # D_r: per-head query / shared key channels rotated by RoPE; even
    v_head_dim: int = 16  # D_v: per-head value channels
    q_lora_rank: int | None = None  # width of the query latent; None = queries straight from x
    max_seq_len: int = 128  # longest sequence (prompt + generated); default cache length
    rope_theta: float = 10000.0  # RoPE base θ
    rope_pairing: str = "interleaved"  # DeepSeek's checkpoints: "interleaved"; or "half"
    rms_norm_eps: float = 1e-6  # epsilon of the two RMSNorms on the latents

    def __post_init__(self):
        check_positive(d_model=self.d_model, n_heads=self.n_heads,
                       kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
                       qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
                       max_seq_len=self.max_seq_len)
        if self.q_lora_rank is not None:
            check_positive(q_lora_rank=self.q_lora_rank)
        if self.qk_rope_head_dim % 2 != 0:
            raise ValueError(
                f"RoPE needs an even qk_rope_head_dim, got {self.qk_rope_head_dim}"
            )
        if self.rope_theta <= 1.0:
            raise ValueError(f"rope_theta must be > 1, got {self.rope_theta}")
        if self.rope_pairing not in PAIRINGS:
            raise ValueError(f"rope_pairing must be one of {PAIRINGS}, got {self.rope_pairing!r}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")

    @property
    def qk_head_dim(self) -> int:
        """D_n + D_r: each head's query and key width; the softmax scale is 1/√(D_n + D_r)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLACache:
    """One layer's MLA cache: the normalised latent and the rotated RoPE key, nothing else.

    ``c_kv`` ``(B, max_seq_len, d_c)`` and ``k_rope`` ``(B, max_seq_len, D_r)``; the first
    ``pos`` positions are filled. :meth:`MultiHeadLatentAttention.forward` writes the new
    positions and advances ``pos`` (one cache per layer).
    """

    def __init__(self, batch_size: int, max_seq_len: int, kv_lora_rank: int,
                 qk_rope_head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        check_positive(batch_size=batch_size, max_seq_len=max_seq_len,
                       kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
        self.c_kv = torch.zeros(batch_size, max_seq_len, kv_lora_rank, dtype=dtype,
                                device=device)  # (B, max_seq_len, d_c)
        self.k_rope = torch.zeros(batch_size, max_seq_len, qk_rope_head_dim, dtype=dtype,
                                  device=device)  # (B, max_seq_len, D_r)
        self.max_seq_len = max_seq_len
        self.pos = 0

    @property
    def batch_size(self) -> int:
        return self.c_kv.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held: B · max_seq_len · (d_c + D_r) · sizeof(dtype)."""
        return self.c_kv.nbytes + self.k_rope.nbytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached position costs in one sequence: (d_c + D_r) · sizeof(dtype)."""
        return self.nbytes // (self.batch_size * self.max_seq_len)

    def update(self, c_kv: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``c_kv`` ``(B, T, d_c)`` and ``k_rope`` ``(B, T, D_r)`` at ``pos``, advance
        ``pos`` by T, and return every cached position: ``(B, pos + T, d_c)`` and
        ``(B, pos + T, D_r)``."""
        if c_kv.shape[0] != self.batch_size:
            raise ValueError(
                f"cache was made for batch size {self.batch_size}, got batch size {c_kv.shape[0]}"
            )
        if c_kv.shape[2] != self.c_kv.shape[2] or k_rope.shape[2] != self.k_rope.shape[2]:
            raise ValueError(
                f"cache holds latents of width {self.c_kv.shape[2]} and RoPE keys of width "
                f"{self.k_rope.shape[2]}, got {c_kv.shape[2]} and {k_rope.shape[2]}"
            )
        T = c_kv.shape[1]
        if self.pos + T > self.max_seq_len:
            raise ValueError(
                f"MLA cache overflow: {self.pos} cached + {T} new positions "
                f"> max_seq_len ({self.max_seq_len})"
            )
        end = self.pos + T
        self.c_kv[:, self.pos:end] = c_kv
        self.k_rope[:, self.pos:end] = k_rope
        self.pos = end
        return self.c_kv[:, :end], self.k_rope[:, :end]

    def reset(self) -> None:
        """Forget every cached position (the memory is kept for the next sequence)."""
        self.pos = 0


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention through a compressed KV latent with a decoupled RoPE part."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        self.config = c = config
        H = c.n_heads
        if c.q_lora_rank is None:  # queries straight from x (DeepSeek-V2-Lite)
            self.q_proj = nn.Linear(c.d_model, H * c.qk_head_dim, bias=False)
        else:  # queries through their own normalised latent (not cached; saves training memory)
            self.q_a_proj = nn.Linear(c.d_model, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim, bias=False)
        # One projection gives the latent (d_c) and the single-head RoPE key (D_r) together:
        # "with_mqa" because that key is shared by all heads, as in multi-query attention.
        self.kv_a_proj_with_mqa = nn.Linear(c.d_model, c.kv_lora_rank + c.qk_rope_head_dim,
                                            bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        # Up-projection of the latent: rows per head are [W_UK,h (D_n rows); W_UV,h (D_v rows)].
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, c.d_model, bias=False)

    def new_cache(self, batch_size: int, max_seq_len: int | None = None) -> MLACache:
        """An empty :class:`MLACache` for this layer, on its device and dtype; ``max_seq_len``
        (at most the config's, which it defaults to) is the number of positions it holds."""
        c, w = self.config, self.kv_b_proj.weight
        max_seq_len = c.max_seq_len if max_seq_len is None else max_seq_len
        if not 1 <= max_seq_len <= c.max_seq_len:
            raise ValueError(
                f"max_seq_len must be in [1, {c.max_seq_len}] (the config's), got {max_seq_len}"
            )
        return MLACache(batch_size, max_seq_len, c.kv_lora_rank, c.qk_rope_head_dim,
                        dtype=w.dtype, device=w.device)

    def forward(self, x: Tensor, cache: MLACache | None = None, absorb: bool = False) -> Tensor:
        """Causal self-attention of ``x``, continuing after the cached positions if any.

        Args:
            x: ``(B, T, C)``; with a cache, positions ``cache.pos … cache.pos + T - 1``.
            cache: optional :class:`MLACache`; the new latents and RoPE keys are appended
                (``pos`` advances by T) and every cached position is attended.
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
        mask = causal_mask(T, c_kv.shape[1], device=x.device)  # (T, S)

        attend = self._attend_absorbed if absorb else self._attend_explicit
        out = attend(q_nope, q_rope, c_kv, k_rope, mask)  # (B, H, T, D_v)
        out = out.transpose(1, 2).reshape(B, T, H * c.v_head_dim)  # (B, T, H*D_v)
        return self.o_proj(out)  # (B, T, C)

    def _attend_explicit(self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor,
                         mask: Tensor) -> Tensor:
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
                         mask: Tensor) -> Tensor:
        """Score and average the latents directly; per-head keys and values never exist."""
        c = self.config
        D_n, D_v = c.qk_nope_head_dim, c.v_head_dim
        w = self.kv_b_proj.weight.view(c.n_heads, D_n + D_v, c.kv_lora_rank)  # (H, D_n+D_v, d_c)
        w_uk, w_uv = w.split([D_n, D_v], dim=1)  # (H, D_n, d_c), (H, D_v, d_c)
        q_latent = q_nope @ w_uk  # (B, H, T, d_c): W_UK,hᵀ q_nope,h, a query in latent space
        c_kv, k_rope = c_kv[:, None], k_rope[:, None]  # (B, 1, S, d_c), (B, 1, S, D_r): one "head"
        scores = (q_latent @ c_kv.transpose(-2, -1)  # (B, H, T, S)
                  + q_rope @ k_rope.transpose(-2, -1))  # (B, H, T, S)
        scores = scores / math.sqrt(c.qk_head_dim)  # the scale of the full head, not of d_c
        if scores.dtype in (torch.float16, torch.bfloat16):
            scores = scores.float()  # softmax in at least fp32 (fp64 stays fp64)
        scores = scores.masked_fill(~mask, float("-inf"))  # causal: every row keeps a key
        weights = torch.softmax(scores, dim=-1).to(c_kv.dtype)  # (B, H, T, S)
        out_latent = weights @ c_kv  # (B, H, T, d_c): a weighted average of the latents
        return out_latent @ w_uv.transpose(-2, -1)  # (B, H, T, D_v): W_UV,h applied once
