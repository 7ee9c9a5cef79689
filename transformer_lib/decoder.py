"""A modern decoder-only Transformer: RMSNorm + RoPE + GQA + SwiGLU, pre-norm, KV cache.

Reads top to bottom: config -> block -> model -> generate. The KV cache is
:class:`transformer_lib.cache.KVCache`.
Parameter names follow Hugging Face's Llama (``embed_tokens``, ``q_proj`` … ``o_proj``,
``gate_proj``/``up_proj``/``down_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``norm``, ``lm_head``), so a Llama state dict maps onto it one to one.
``DecoderConfig.attn_implementation`` picks how attention is computed, by name from
:data:`transformer_lib.attention.ATTENTION_FUNCTIONS`: ``"eager"``, the reference written out,
``"sdpa"``, PyTorch's fused kernel, or ``"tiled"``, key tiles with an online softmax; all three
compute the same function. The model never builds a mask: every layer is told ``causal=True``.
``DecoderConfig.positions`` picks how positions enter, for comparisons: ``"rope"`` (the
default and the modern choice), the 2017 ``"sinusoidal"`` table or a ``"learned"`` table
(GPT-2's ``wpe``) added to the token embeddings, or ``"none"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.attention import ATTN_IMPLEMENTATIONS, MultiHeadAttention
from transformer_lib.cache import KVCache, cache_length
from transformer_lib.ffn import SwiGLU
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import PAIRINGS, rope_cos_sin, sinusoidal_encoding
from transformer_lib.sampling import check_sampling, sample_next_token
from transformer_lib.validation import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_positive,
    check_token_ids,
)

__all__ = ["DecoderConfig", "DecoderBlock", "Decoder", "POSITIONS", "init_weights"]

#: How positions enter the model: rotations of q and k in every layer, a table added to the
#: token embeddings (fixed sinusoids or learned rows), or not at all.
POSITIONS = ("rope", "sinusoidal", "learned", "none")


@dataclass
class DecoderConfig:
    """The sizes and choices of a :class:`Decoder`; every field is checked for type and range
    when created."""

    vocab_size: int = 64  #: V: number of token ids
    d_model: int = 64  #: C: width of the residual stream
    n_layers: int = 2  #: number of decoder blocks
    n_heads: int = 4  #: H: query heads; head dim D = d_model // n_heads
    n_kv_heads: int = 2  #: H_kv: key/value heads (= n_heads: MHA, 1: MQA, between: GQA)
    d_ff: int = 172  #: hidden width of SwiGLU (about 8/3 * d_model)
    max_seq_len: int = 128  #: longest sequence (prompt + generated); size of the KV cache
    rope_theta: float = 10000.0  #: RoPE base θ
    norm_eps: float = 1e-6  #: RMSNorm epsilon
    tie_embeddings: bool = False  #: share the embedding matrix with the output layer
    rope_pairing: str = "half"  #: "half" (GPT-NeoX/HF) or "interleaved" (RoFormer/Meta)
    #: "eager" = the readable reference (the only entry that forms the weights);
    #: "sdpa" = torch.nn.functional.scaled_dot_product_attention, fused, same numbers;
    #: "tiled" = key tiles with an online softmax (see ATTENTION_FUNCTIONS)
    attn_implementation: str = "eager"
    positions: str = "rope"  #: one of POSITIONS; the rope_* fields matter only for "rope"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                     "max_seq_len"):
            check_int(name, getattr(self, name))
        check_float("rope_theta", self.rope_theta, low=1.0, low_open=True)  # as rope_cos_sin
        check_float("norm_eps", self.norm_eps, low=0.0, low_open=True)
        check_bool("tie_embeddings", self.tie_embeddings)
        check_choice("rope_pairing", self.rope_pairing, PAIRINGS)
        check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        check_choice("positions", self.positions, POSITIONS)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
            )
        if self.positions == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"the sinusoidal table needs an even d_model, got {self.d_model}")
        if self.positions == "rope" and self.head_dim % 2 != 0:
            raise ValueError(
                f"RoPE needs an even head dim, got d_model // n_heads = "
                f"{self.d_model} // {self.n_heads} = {self.head_dim}"
            )

    @property
    def head_dim(self) -> int:
        """D, channels per head: ``d_model // n_heads``."""
        return self.d_model // self.n_heads


class DecoderBlock(nn.Module):
    """x = x + Attn(RMSNorm(x)); x = x + SwiGLU(RMSNorm(x)).

    Args:
        config: the model's sizes and choices.
        layer_idx: the block's place in the model (its slot in a
            :class:`~transformer_lib.cache.KVCache`).
    """

    def __init__(self, config: DecoderConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads,
                                            bias=False, layer_idx=layer_idx,
                                            attn_implementation=config.attn_implementation)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.d_ff)
        self.rope_pairing = config.rope_pairing

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                cache: KVCache | None = None, *, causal: bool = True,
                mask: Tensor | None = None) -> Tensor:
        """Run the attention and the feed-forward sublayers.

        ``cache``, ``causal`` and ``mask`` go to the attention
        (:meth:`~transformer_lib.attention.MultiHeadAttention.forward`).

        Args:
            x: ``(B, T, C)``.
            rope: ``(cos, sin)``, ``(T, D/2)`` each, or None for a model whose positions are
                not rotations.
            cache: optional KV cache; the block writes its keys and values into its slot.
            causal: the T positions are the last of the keys and see no later one; False lets
                every position see every other.
            mask: optional boolean mask broadcastable to ``(B, H, T, S)``; True = may attend.

        Returns:
            ``(B, T, C)``.
        """
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, mask=mask, rope=rope, rope_pairing=self.rope_pairing,
                               kv_cache=cache, causal=causal)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


def init_weights(module: nn.Module) -> None:
    """Initialise one module as :class:`Decoder` initialises its own: every ``nn.Linear`` and
    ``nn.Embedding`` weight from N(0, 0.02) and biases to 0 (small, as GPT-2 and Llama: an
    untrained model predicts nearly uniformly); other modules are left as they are.

    Apply it to a whole model or to a part built later: ``new_mlp.apply(init_weights)``.

    Args:
        module: any module (``nn.Module.apply`` calls it on every submodule).
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


class Decoder(nn.Module):
    """Decoder-only language model returning logits for every position.

    Token embeddings, then ``config.n_layers`` :class:`DecoderBlock` s, a final RMSNorm and
    ``lm_head`` (tied to the embeddings with ``config.tie_embeddings``).

    Args:
        config: the model's sizes and choices.
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList([DecoderBlock(config, i) for i in range(config.n_layers)])
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if config.positions == "learned":  # one trained row per position (GPT-2's wpe)
            self.embed_positions = nn.Embedding(config.max_seq_len, config.d_model)
        self._register_position_tables()
        self.apply(init_weights)

    def _position_tables(self, device=None, dtype=None) -> dict[str, Tensor]:
        """The fixed tables ``config.positions`` needs, computed in fp64 and rounded once."""
        c = self.config
        if c.positions == "rope":
            cos, sin = rope_cos_sin(c.max_seq_len, c.head_dim, c.rope_theta, device=device,
                                    dtype=dtype or torch.float32)
            return {"rope_cos": cos, "rope_sin": sin}  # (max_seq_len, D/2) each
        if c.positions == "sinusoidal":
            table = sinusoidal_encoding(c.max_seq_len, c.d_model).double()  # (max_seq_len, C)
            return {"position_table": table.to(device=device, dtype=dtype or torch.float32)}
        return {}

    def _register_position_tables(self) -> None:
        for name, table in self._position_tables().items():
            self.register_buffer(name, table, persistent=False)

    def _apply(self, fn, recurse=True):
        # After .to(dtype)/.double()/.cuda(), recompute the fixed position tables in the new
        # dtype (from fp64 angles) instead of up-casting rounded fp32 values.
        super()._apply(fn, recurse)
        w = self.embed_tokens.weight
        for name, table in self._position_tables(w.device, w.dtype).items():
            setattr(self, name, table)
        return self

    def _check_tokens(self, tokens: Tensor, cache: KVCache | None = None) -> None:
        check_token_ids(tokens, self.config.vocab_size)
        start, T = (0 if cache is None else cache.pos), tokens.shape[1]
        if start + T > self.config.max_seq_len:
            raise ValueError(
                f"sequence too long: {start} cached + {T} new positions "
                f"> max_seq_len ({self.config.max_seq_len})"
            )
        if cache is not None:
            cache.check_room(T)
            if cache.batch_size != tokens.shape[0]:
                raise ValueError(f"cache was made for batch size {cache.batch_size}, "
                                 f"got tokens of batch size {tokens.shape[0]}")

    def new_cache(self, batch_size: int, max_seq_len: int | None = None) -> KVCache:
        """An empty KV cache for ``batch_size`` sequences, on this model's device and dtype.

        Args:
            batch_size: number of sequences B.
            max_seq_len: positions it holds (prompt + generated), at most the config's,
                which it defaults to; its memory grows linearly with it.

        Returns:
            a :class:`~transformer_lib.cache.KVCache` with ``k``, ``v`` of shape
            ``(n_layers, B, H_kv, max_seq_len, D)``.
        """
        c, w = self.config, self.embed_tokens.weight
        check_positive(batch_size=batch_size)
        length = cache_length(max_seq_len, c.max_seq_len)
        return KVCache(c.n_layers, batch_size, c.n_kv_heads, length, c.head_dim,
                       dtype=w.dtype, device=w.device)

    def forward(self, tokens: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits for every position.

        Args:
            tokens: ``(B, T)`` LongTensor of token ids.
            cache: optional KV cache; the tokens are then positions ``cache.pos … cache.pos+T-1``
                and attend to every cached position before them.

        Returns:
            ``(B, T, V)`` logits.
        """
        self._check_tokens(tokens, cache)
        start, T = (0 if cache is None else cache.pos), tokens.shape[1]
        # Query i sits at absolute position start + i; keys run 0 … start + T - 1. Each
        # layer's attention is causal, aligned to the last key (no mask is built here).
        x = self.embed_tokens(tokens)  # (B, T, C)
        rope = None
        positions = self.config.positions
        if positions == "rope":
            rope = (self.rope_cos[start:start + T], self.rope_sin[start:start + T])  # (T, D/2)
        elif positions == "sinusoidal":
            x = x + self.position_table[start:start + T]  # (B, T, C) + (T, C)
        elif positions == "learned":
            x = x + self.embed_positions.weight[start:start + T]  # (B, T, C) + (T, C)
        for layer in self.layers:
            x = layer(x, rope, cache)
        if cache is not None:
            cache.advance(T)  # once per forward, after the layer loop
        return self.lm_head(self.norm(x))  # (B, T, V)

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, use_cache: bool = True,
                 generator: torch.Generator | None = None, top_p: float | None = None) -> Tensor:
        """Append ``max_new_tokens`` tokens to ``tokens``.

        Each new token comes from :func:`~transformer_lib.sampling.sample_next_token`:
        ``temperature = 0`` is greedy decoding; otherwise a draw from softmax(logits /
        temperature), restricted to the ``top_k`` most likely tokens and then to the nucleus
        of probability ``top_p`` if given. With ``use_cache`` the prompt is prefilled once and
        each step feeds one token; without it every step recomputes the prefix. The cache
        holds only the ``T + max_new_tokens`` positions this call fills.

        Args:
            tokens: ``(B, T)`` prompt ids.
            max_new_tokens: tokens to append (0 returns ``tokens``).
            temperature, top_k, top_p: the sampling rule, checked before any work.
            use_cache: decode with a KV cache (same tokens, less work).
            generator: the random stream of the draws, on the model's device.

        Returns:
            ``(B, T + max_new_tokens)`` ids: the prompt, then the new tokens.
        """
        check_int("max_new_tokens", max_new_tokens, low=0)
        check_sampling(temperature, top_k, top_p, self.config.vocab_size)
        self._check_tokens(tokens)
        total = tokens.shape[1] + max_new_tokens
        if total > self.config.max_seq_len:
            raise ValueError(
                f"prompt length ({tokens.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} "
                f"> max_seq_len ({self.config.max_seq_len})"
            )
        if max_new_tokens == 0:
            return tokens
        # Cache only the positions this call fills, not all of config.max_seq_len.
        cache = self.new_cache(tokens.shape[0], total) if use_cache else None
        logits = self(tokens, cache)  # prefill: (B, T, V)
        for step in range(max_new_tokens):
            next_token = sample_next_token(logits[:, -1], temperature=temperature, top_k=top_k,
                                           top_p=top_p, generator=generator)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + step + 1)
            if step == max_new_tokens - 1:
                break
            logits = self(next_token, cache) if use_cache else self(tokens)
        return tokens
