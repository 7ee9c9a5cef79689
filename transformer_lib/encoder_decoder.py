"""The 2017 Transformer: a post-norm encoder–decoder (Vaswani et al., "Attention Is All You Need").

Reads top to bottom: layers -> stack -> config -> model -> greedy decoding -> Noam schedule
-> label smoothing. Names follow the paper (``d_model``, ``d_ff``, ``n_heads``).

Every sublayer is wrapped as x <- LayerNorm(x + Dropout(Sublayer(x))) (post-norm, the paper),
or, with ``norm_first=True``, as x <- x + Dropout(Sublayer(LayerNorm(x))) (pre-norm, as
``torch.nn.Transformer(norm_first=True)`` and today's models do).
Masks are boolean with True = may attend (the opposite of ``torch.nn.Transformer``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.attention import MultiHeadAttention, causal_mask
from transformer_lib.ffn import FeedForward
from transformer_lib.norms import LayerNorm
from transformer_lib.positional import sinusoidal_encoding
from transformer_lib.validation import (
    check_bool,
    check_float,
    check_int,
    check_token_ids,
)


def _sublayer(x: Tensor, norm: LayerNorm, dropout: nn.Dropout, sublayer: Callable[[Tensor], Tensor],
              norm_first: bool) -> Tensor:
    """One residual sublayer: post-norm LN(x + f(x)) or pre-norm x + f(LN(x)), dropout on f."""
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """x = LN(x + SelfAttn(x)); x = LN(x + FFN(x)). Pre-norm: x = x + SelfAttn(LN(x)); ...

    Args:
        d_model: C, the width of the input and the output.
        n_heads: H, attention heads.
        d_ff: the feed-forward network's hidden width.
        dropout: dropout probability on sublayer outputs and attention weights in training.
        eps: the LayerNorms' epsilon.
        norm_first: pre-norm sublayers; False: the paper's post-norm.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_eps: float = 1e-5, norm_first: bool = False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = LayerNorm(d_model, norm_eps)
        self.norm2 = LayerNorm(d_model, norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Run the two sublayers.

        Args:
            x: ``(B, S, C)``.
            mask: optional boolean mask broadcastable to ``(B, H, S, S)``; True = may attend.

        Returns:
            ``(B, S, C)``.
        """
        x = _sublayer(x, self.norm1, self.dropout, lambda h: self.self_attn(h, mask=mask),
                      self.norm_first)
        x = _sublayer(x, self.norm2, self.dropout, self.feed_forward, self.norm_first)
        return x


class DecoderLayer(nn.Module):
    """x = LN(x + CausalSelfAttn(x)); x = LN(x + CrossAttn(x, memory)); x = LN(x + FFN(x)).
    Pre-norm: x = x + CausalSelfAttn(LN(x)); x = x + CrossAttn(LN(x), memory); ...

    Args:
        d_model: C, the width of the input and the output.
        n_heads: H, attention heads.
        d_ff: the feed-forward network's hidden width.
        dropout: dropout probability on sublayer outputs and attention weights in training.
        eps: the LayerNorms' epsilon.
        norm_first: pre-norm sublayers; False: the paper's post-norm.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_eps: float = 1e-5, norm_first: bool = False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = LayerNorm(d_model, norm_eps)
        self.norm2 = LayerNorm(d_model, norm_eps)
        self.norm3 = LayerNorm(d_model, norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        """Run the three sublayers.

        Args:
            x: the decoder's input ``(B, T, C)``.
            memory: the encoder's output ``(B, S, C)``.
            tgt_mask: optional boolean mask broadcastable to ``(B, H, T, T)`` (causal, and
                target padding); True = may attend.
            memory_mask: optional boolean mask broadcastable to ``(B, H, T, S)`` (source
                padding).

        Returns:
            ``(B, T, C)``.
        """
        x = _sublayer(x, self.norm1, self.dropout, lambda h: self.self_attn(h, mask=tgt_mask),
                      self.norm_first)
        x = _sublayer(x, self.norm2, self.dropout,
                      lambda h: self.cross_attn(h, memory, mask=memory_mask), self.norm_first)
        x = _sublayer(x, self.norm3, self.dropout, self.feed_forward, self.norm_first)
        return x


class Stack(nn.Module):
    """Layers applied in turn, then an optional final LayerNorm: the encoder is a stack of
    :class:`EncoderLayer`, the decoder a stack of :class:`DecoderLayer`.

    ``forward(x, *args)`` passes ``x`` ``(B, T, C)`` through every layer with the same
    ``args``: ``(mask)`` for the encoder (``mask`` broadcastable to ``(B, H, S, S)``),
    ``(memory, tgt_mask, memory_mask)`` for the decoder (``memory`` ``(B, S, C)``,
    ``tgt_mask`` broadcastable to ``(B, H, T, T)``, ``memory_mask`` to ``(B, H, T, S)``).
    """

    def __init__(self, layers: list[nn.Module], d_model: int, norm_eps: float = 1e-5,
                 final_norm: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = LayerNorm(d_model, norm_eps) if final_norm else None

    def forward(self, x: Tensor, *args: Tensor | None) -> Tensor:
        """x ``(B, T, C)`` and each layer's other inputs -> ``(B, T, C)``."""
        for layer in self.layers:
            x = layer(x, *args)
        return x if self.norm is None else self.norm(x)


@dataclass
class EncoderDecoderConfig:
    """The sizes and choices of an :class:`EncoderDecoder`; every field is checked for type
    and range when created.

    Apart from the two vocabulary sizes, the defaults are the paper's base model.
    """

    src_vocab_size: int  #: source token ids 0 … src_vocab_size - 1
    tgt_vocab_size: int  #: V: target token ids, and the width of the logits
    d_model: int = 512  #: C: width of every layer's input and output
    n_heads: int = 8  #: H: attention heads; head dim D = d_model // n_heads
    n_layers: int = 6  #: encoder layers (and decoder layers unless n_decoder_layers is given)
    n_decoder_layers: int | None = None  #: decoder layers; None: as many as n_layers
    d_ff: int = 2048  #: hidden width of the ReLU feed-forward network
    dropout: float = 0.1  #: on embeddings + positions, sublayer outputs and attention weights
    max_seq_len: int = 512  #: longest source or target sequence (rows of the sinusoid table)
    norm_eps: float = 1e-5  #: LayerNorm epsilon
    final_norm: bool = False  #: a LayerNorm after each stack, as torch.nn.Transformer adds
    norm_first: bool = False  #: pre-norm sublayers x + f(LN(x)); False: the paper's post-norm

    def __post_init__(self):
        if self.n_decoder_layers is None:
            self.n_decoder_layers = self.n_layers
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_layers",
                     "n_decoder_layers", "d_ff", "max_seq_len"):
            check_int(name, getattr(self, name))
        check_float("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_float("norm_eps", self.norm_eps, low=0.0, low_open=True)
        check_bool("final_norm", self.final_norm)
        check_bool("norm_first", self.norm_first)
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")
        if self.d_model % 2 != 0:
            raise ValueError(f"d_model must be even for sinusoidal positions, got {self.d_model}")


class EncoderDecoder(nn.Module):
    """Token embeddings (scaled by √d_model) + sinusoidal positions -> encoder, decoder -> logits.

    ``config.final_norm=True`` adds a LayerNorm after each stack, as ``torch.nn.Transformer``
    does; the paper's post-norm model has none (every layer already ends in a LayerNorm). A
    pre-norm model (``config.norm_first=True``) needs it: its layers end in a residual sum.
    The last layer, ``lm_head``, maps the decoder's output to logits over the target
    vocabulary (the paper's "learned linear transformation" before the softmax).

    Args:
        config: the model's sizes and choices.
    """

    def __init__(self, config: EncoderDecoderConfig):
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise ValueError(f"config must be an EncoderDecoderConfig, got "
                             f"{type(config).__name__}")
        c = self.config = config
        self.src_vocab_size, self.tgt_vocab_size = c.src_vocab_size, c.tgt_vocab_size
        self.d_model, self.n_heads, self.max_seq_len = c.d_model, c.n_heads, c.max_seq_len
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pos_encoding", sinusoidal_encoding(c.max_seq_len, c.d_model),
                             persistent=False)  # (max_seq_len, C)
        self.dropout = nn.Dropout(c.dropout)
        layer_args = (c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_eps, c.norm_first)
        self.encoder = Stack([EncoderLayer(*layer_args) for _ in range(c.n_layers)],
                             c.d_model, c.norm_eps, c.final_norm)
        self.decoder = Stack([DecoderLayer(*layer_args) for _ in range(c.n_decoder_layers)],
                             c.d_model, c.norm_eps, c.final_norm)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def _embed(self, tokens: Tensor, table: nn.Embedding, name: str) -> Tensor:
        check_token_ids(tokens, table.num_embeddings, name=name)
        T = tokens.shape[1]
        if T > self.max_seq_len:
            raise ValueError(f"{name} length ({T}) exceeds max_seq_len ({self.max_seq_len})")
        x = table(tokens) * math.sqrt(self.d_model)  # (B, T, C)
        return self.dropout(x + self.pos_encoding[:T])  # (B, T, C)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encode the source.

        Args:
            src: source token ids ``(B, S)``.
            src_mask: optional boolean key mask broadcastable to ``(B, H, S, S)``, e.g.
                ``(B, 1, 1, S)`` from :func:`padding_mask`; True = may attend.

        Returns:
            memory ``(B, S, C)``.
        """
        return self.encoder(self._embed(src, self.src_embed, "src"), src_mask)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None,
               tgt_mask: Tensor | None = None) -> Tensor:
        """Decode the target against the memory.

        Args:
            tgt: target token ids ``(B, T)``.
            memory: the encoder's output ``(B, S, C)``.
            src_mask: optional boolean mask broadcastable to ``(B, H, T, S)`` hiding padded
                source positions, e.g. ``(B, 1, 1, S)``.
            tgt_mask: optional boolean mask broadcastable to ``(B, H, T, T)``; None means
                the causal mask :func:`~transformer_lib.attention.causal_mask` ``(T, T)``.

        Returns:
            logits ``(B, T, V)`` over the target vocabulary.
        """
        x = self._embed(tgt, self.tgt_embed, "tgt")
        if tgt_mask is None:
            tgt_mask = causal_mask(tgt.shape[1], device=tgt.device)  # (T, T)
        return self.lm_head(self.decoder(x, memory, tgt_mask, src_mask))  # (B, T, V)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """Teacher forcing: every target position predicts the next one in one pass.

        Args:
            src: source token ids ``(B, S)``.
            tgt: target token ids ``(B, T)``, shifted right (beginning with the BOS id).
            src_mask: as in :meth:`decode`.
            tgt_mask: as in :meth:`decode`.

        Returns:
            logits ``(B, T, V)``.
        """
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_new_tokens: int, bos_id: int,
                      src_mask: Tensor | None = None) -> Tensor:
        """Generate ``max_new_tokens`` tokens after ``bos_id``, each the most likely one.

        The source is encoded once; every step re-runs the decoder on the tokens so far and
        appends the most likely next token. Call ``model.eval()`` first to turn dropout off.

        Args:
            src: source token ids ``(B, S)``.
            max_new_tokens: tokens to generate; ``1 + max_new_tokens <= max_seq_len``.
            bos_id: the token every output starts with.
            src_mask: optional key mask for the source, e.g. ``(B, 1, 1, S)``.

        Returns:
            token ids ``(B, 1 + max_new_tokens)``, ``bos_id`` first.
        """
        if not 0 <= bos_id < self.tgt_vocab_size:
            raise ValueError(f"bos_id must be in [0, {self.tgt_vocab_size - 1}], got {bos_id}")
        if max_new_tokens < 0 or max_new_tokens + 1 > self.max_seq_len:
            raise ValueError(
                f"max_new_tokens must be in [0, {self.max_seq_len - 1}] "
                f"(max_seq_len={self.max_seq_len}), "
                f"got {max_new_tokens}"
            )
        memory = self.encode(src, src_mask)  # (B, S, C)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        for _ in range(max_new_tokens):
            logits = self.decode(out, memory, src_mask)  # (B, t, V)
            next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out = torch.cat([out, next_token], dim=1)  # (B, t + 1)
        return out


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key mask hiding padding.

    Args:
        tokens: token ids ``(B, S)``.
        pad_id: the padding token.

    Returns:
        ``(B, 1, 1, S)`` boolean, True = a real token (may be attended).
    """
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def noam_lambda(d_model: int, warmup: int) -> Callable[[int], float]:
    """The 2017 learning-rate schedule as a multiplier for ``torch.optim.lr_scheduler.LambdaLR``.

    lr(t) = d_model^-0.5 · min(t^-0.5, t · warmup^-1.5): linear warm-up, peak at t = warmup,
    then decay like 1/√t. Step 0 (LambdaLR evaluates it at construction) is treated as step 1.

    LambdaLR *multiplies* the optimizer's base lr by this value: build the optimizer with
    ``lr=1.0`` (or a scale factor). With ``lr=0`` the learning rate stays 0 forever.

    Args:
        d_model: C, the model width.
        warmup: the step of the peak.

    Returns:
        ``lr_lambda(step) -> float``, the multiplier at each step.
    """
    check_int("d_model", d_model)
    check_int("warmup", warmup)

    def lr_lambda(step: int) -> float:
        step = max(step, 1)
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    return lr_lambda


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy against a smoothed target: (1 - ε) on the true token plus ε/V on every token.

    This is the formulation of ``F.cross_entropy(..., label_smoothing=ε)``; the 2017 model
    used ε = 0.1. Positions whose target is ``ignore_index`` (e.g. padding) are left out of
    the mean.

    Args:
        smoothing: ε, in [0, 1).
        ignore_index: the target id left out of the loss.
    """

    def __init__(self, smoothing: float = 0.1, ignore_index: int = -100):
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """The mean smoothed cross-entropy over the positions not ignored.

        Args:
            logits: ``(N, V)`` or ``(B, T, V)``.
            target: token ids ``(N,)`` or ``(B, T)``, the shape of ``logits`` without ``V``.

        Returns:
            the loss, a scalar ``()`` in fp32.
        """
        V = logits.shape[-1]
        if logits.shape[:-1] != target.shape:
            raise ValueError(
                f"logits {tuple(logits.shape)} and target {tuple(target.shape)} do not match"
            )
        logits, target = logits.reshape(-1, V), target.reshape(-1)  # (N, V), (N,)
        keep = target != self.ignore_index  # (N,)
        logits, target = logits[keep], target[keep]
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
        nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # (N,)
        uniform = -log_probs.mean(dim=-1)  # (N,)  cross-entropy with the uniform distribution
        loss = (1.0 - self.smoothing) * nll + self.smoothing * uniform
        return loss.mean()
