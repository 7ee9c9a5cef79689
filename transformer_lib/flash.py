"""Attention computed tile by tile with an online softmax (the idea of FlashAttention), with a
backward pass that recomputes the tiles instead of storing them.

For one query row with scores s_j = q·k_j / √D, attention is Σ_j e^{s_j} v_j / Σ_j e^{s_j}.
Reading the keys in blocks, keep three running quantities per query row:

    m    the largest score seen so far (starts at -inf),
    l    Σ e^{s_j - m} over the keys seen so far (starts at 0),
    acc  Σ e^{s_j - m} v_j over the keys seen so far (starts at 0).

A block of scores s (one row: up to ``block_size`` values) updates them as

    m_new   = max(m, rowmax(s))
    l_new   = e^{m - m_new} · l   + rowsum(e^{s - m_new})
    acc_new = e^{m - m_new} · acc + e^{s - m_new} @ v_block

and after the last block ``out = acc / l``. The factor e^{m - m_new} re-bases the old sums on
the new maximum, so no exponent is ever positive (nothing overflows) and the result is the
softmax exactly, up to rounding. The log-sum-exp of the row, ``lse = m + log l``, is kept too.

Memory of the forward pass: the output ``(..., T, Dv)`` and ``lse`` ``(..., T)`` are allocated
once, and a row's result is written there as soon as it is final (with ``causal``, a query has
seen all its keys once a key tile starts after its position). What else is alive at once is
one tile of scores ``(..., T, block_size)``, its exponentials, and the running sums of the
rows still running: the memory grows like T · (block_size + Dv), never like T · S.

Backward pass (:class:`FlashAttentionFunction`): only q, k, v, the output and ``lse`` are
saved, O(T·D) numbers. ``backward`` walks the same key tiles again, recomputes each tile of
weights exactly as P = exp(s - lse), and accumulates, per tile (FlashAttention's backward):

    dV_blk = Pᵀ dO          dP = dO V_blkᵀ          dS = P ∘ (dP - Δ),  Δ = rowsum(dO ∘ O)
    dQ    += dS K_blk · scale                          dK_blk = dSᵀ Q · scale

(with a gradient flowing into ``lse`` too, Δ becomes Δ - dlse). Dropout: the forward pass
remembers the random generator's state and ``backward`` replays it, drawing the same masks in
the same order, so gradients with ``dropout_p > 0`` are exact as well.

This module shows the arithmetic in plain PyTorch: key tiles only, all query rows at once. A
GPU kernel also tiles the queries and keeps each tile in on-chip memory.
:func:`flash_attention` is the ``"tiled"`` entry of
:data:`transformer_lib.attention.ATTENTION_FUNCTIONS` (through ``tiled_attention``, which
repeats grouped key/value heads).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from transformer_lib.validation import (
    check_mask,
    check_qkv,
    compute_dtype,
    zero_rows_without_keys,
)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                  block_size: int, dropout_p: float) -> None:
    """Raise a ValueError naming the values unless q, k, v (and the mask) fit together."""
    check_qkv(q, k, v)
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must have the same leading dims, got {tuple(q.shape[:-2])}, "
            f"{tuple(k.shape[:-2])} and {tuple(v.shape[:-2])}"
        )
    T, S = q.shape[-2], k.shape[-2]
    if causal and S < T:
        raise ValueError(f"causal attention needs S >= T (queries are the last T of the S "
                         f"positions), got T={T}, S={S}")
    if mask is not None:
        check_mask(mask, T, S, q.shape[:-2])
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")


@dataclass(frozen=True)
class _Tiling:
    """What the forward and the backward pass share: which rows and keys each tile holds."""

    T: int  # queries
    S: int  # keys
    block_size: int  # keys per tile
    causal: bool
    mask: Tensor | None  # (..., T or 1, S), True = may attend
    per_row: bool  # the mask has a row per query

    @property
    def offset(self) -> int:
        """With ``causal``, query i sits at position offset + i."""
        return self.S - self.T

    def tiles(self) -> Iterator[tuple[int, int, int]]:
        """(start, end, first) per key tile: keys start … end - 1, running rows first … T - 1
        (with ``causal``, rows before ``first`` have seen all their keys)."""
        for start in range(0, self.S, self.block_size):
            first = max(start - self.offset, 0) if self.causal else 0
            yield start, min(start + self.block_size, self.S), first

    def scores(self, q_rows: Tensor, k_blk: Tensor, start: int, end: int, first: int) -> Tensor:
        """The tile of scores of rows first … T - 1 against keys start … end - 1, blocked
        entries -inf: ``(..., T - first, end - start)``. ``q_rows`` is already scaled."""
        s = q_rows @ k_blk.transpose(-2, -1)  # (..., T_run, Bk): one tile of scores
        if self.causal and end - 1 > self.offset + first:  # the tile reaches past some row
            rows = torch.arange(first, self.T, device=s.device)[:, None] + self.offset
            cols = torch.arange(start, end, device=s.device)[None, :]  # (1, Bk)
            s = s.masked_fill(cols > rows, float("-inf"))  # (..., T_run, Bk)
        if self.mask is not None:
            m = self.mask
            tile = m[..., first:, start:end] if self.per_row else m[..., start:end]
            s = s.masked_fill(~tile, float("-inf"))  # (..., T_run, Bk)
        return s


def _finish(out: Tensor, lse: Tensor, first: int, m: Tensor, l: Tensor, acc: Tensor) -> None:
    """Write the final output and log-sum-exp of rows first … first + n - 1 into place.

    A row that saw no key (every score blocked) has l = 0 and acc = 0: it is divided by 1,
    not 0, so that no NaN reaches the saved output (the backward pass reads it); its
    log-sum-exp is -inf. :func:`flash_attention` then applies the library's rule for such
    rows, :func:`transformer_lib.validation.zero_rows_without_keys`."""
    n = m.shape[-2]
    l_safe = l.masked_fill(l == 0, 1.0)  # (..., n, 1)
    out[..., first:first + n, :] = (acc / l_safe).to(out.dtype)  # (..., n, Dv)
    lse[..., first:first + n] = (m + torch.log(l)).squeeze(-1)  # (..., n)


def _forward(q: Tensor, k: Tensor, v: Tensor, tiling: _Tiling, scale: float,
             dropout_p: float) -> tuple[Tensor, Tensor]:
    """The online-softmax loop over key tiles: ``(out (..., T, Dv), lse (..., T))``."""
    work = compute_dtype(q.dtype)  # fp16/bf16 -> fp32; fp32 and fp64 stay
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (..., T, Dv), written row by row
    lse = q.new_empty(q.shape[:-1], dtype=work)  # (..., T)
    q_run = q.to(work) * scale  # (..., T, D): rows still running; scaling q once
    m = q_run.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., T, 1) running max
    l = q_run.new_zeros((*q.shape[:-1], 1))  # (..., T, 1) running sum
    acc = q_run.new_zeros((*q.shape[:-1], v.shape[-1]))  # (..., T, Dv) running numerator
    done = 0  # rows before `done` are written to `out`
    for start, end, first in tiling.tiles():
        if first > done:  # rows done … first - 1 see no key from `start` on: write them out,
            n = first - done  # so the future part of the score matrix is skipped
            _finish(out, lse, done, m[..., :n, :], l[..., :n, :], acc[..., :n, :])
            m, l, acc, q_run = m[..., n:, :], l[..., n:, :], acc[..., n:, :], q_run[..., n:, :]
            done = first
        k_blk = k[..., start:end, :].to(work)  # (..., Bk, D), Bk = end - start
        v_blk = v[..., start:end, :].to(work)  # (..., Bk, Dv)
        s = tiling.scores(q_run, k_blk, start, end, first)  # (..., T_run, Bk)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., T_run, 1)
        # Without a mask every running row sees key `start` (causal or not), so m_new is
        # finite and exp(m - m_new) is 0 on a row's first tile. With a mask, a row whose keys
        # so far are all blocked has m_new = -inf: shift it by 0 instead, so that its
        # exponentials are exp(-inf) = 0, not exp(-inf + inf) = NaN.
        shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # (..., T_run, 1)
        rescale = torch.exp(m - shift)  # (..., T_run, 1)
        p = torch.exp(s - shift)  # (..., T_run, Bk), every entry in [0, 1]
        l = rescale * l + p.sum(dim=-1, keepdim=True)  # (..., T_run, 1)
        if dropout_p > 0.0:  # the normaliser l keeps every key: dropout(softmax(s)) @ v
            p = F.dropout(p, p=dropout_p, training=True)  # (..., T_run, Bk)
        acc = rescale * acc + p @ v_blk  # (..., T_run, Dv)
        m = m_new
    _finish(out, lse, done, m, l, acc)
    return out, lse


def _backward(d_out: Tensor, d_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
              lse: Tensor, tiling: _Tiling, scale: float, dropout_p: float
              ) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv by recomputing each key tile's weights from ``lse`` (see the module)."""
    work = compute_dtype(q.dtype)
    q_s = q.to(work) * scale  # (..., T, D)
    d_o = d_out.to(work)  # (..., T, Dv)
    delta = (d_o * out.to(work)).sum(dim=-1, keepdim=True) - d_lse.to(work)[..., None]
    base = lse.masked_fill(lse == float("-inf"), 0.0)[..., None]  # (..., T, 1): no NaN rows
    dq = torch.zeros_like(q_s)  # (..., T, D)
    dk = torch.empty_like(k, dtype=work)  # (..., S, D), written tile by tile
    dv = torch.empty_like(v, dtype=work)  # (..., S, Dv)
    for start, end, first in tiling.tiles():
        k_blk = k[..., start:end, :].to(work)  # (..., Bk, D)
        v_blk = v[..., start:end, :].to(work)  # (..., Bk, Dv)
        s = tiling.scores(q_s[..., first:, :], k_blk, start, end, first)  # (..., T_run, Bk)
        p = torch.exp(s - base[..., first:, :])  # (..., T_run, Bk): the weights, recomputed
        d_o_run = d_o[..., first:, :]  # (..., T_run, Dv)
        dp = d_o_run @ v_blk.transpose(-2, -1)  # (..., T_run, Bk)
        if dropout_p > 0.0:  # the same mask as the forward pass, drawn from the same state
            keep = F.dropout(torch.ones_like(p), p=dropout_p, training=True)  # 0 or 1/(1-p)
            dv[..., start:end, :] = (p * keep).transpose(-2, -1) @ d_o_run  # (..., Bk, Dv)
            dp = dp * keep  # (..., T_run, Bk)
        else:
            dv[..., start:end, :] = p.transpose(-2, -1) @ d_o_run  # (..., Bk, Dv)
        ds = p * (dp - delta[..., first:, :])  # (..., T_run, Bk): gradient of the scores
        dq[..., first:, :] += ds @ k_blk  # (..., T_run, D)
        dk[..., start:end, :] = ds.transpose(-2, -1) @ q_s[..., first:, :]  # (..., Bk, D)
    return (dq * scale).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _rng_state(device: torch.device) -> Tensor:
    """The state of the generator that dropout on ``device`` draws from."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


class FlashAttentionFunction(torch.autograd.Function):
    """Tiled attention whose backward pass recomputes the tiles: it saves q, k, v, the output
    and the log-sum-exp, ``O(T·D)`` numbers, and no ``(T, S)`` tensor or tile.

    ``FlashAttentionFunction.apply(q, k, v, mask, causal, scale, dropout_p, block_size)`` ->
    ``(out, lse)``, with the arguments of :func:`flash_attention` (``scale`` a number). Both
    outputs are differentiable; the mask is not.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                scale: float, dropout_p: float, block_size: int) -> tuple[Tensor, Tensor]:
        tiling = _tiling(q, k, mask, causal, block_size)
        rng = _rng_state(q.device) if dropout_p > 0.0 else None
        out, lse = _forward(q, k, v, tiling, scale, dropout_p)
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.args = (causal, scale, dropout_p, block_size, rng)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor, d_lse: Tensor):
        q, k, v, out, lse, *mask = ctx.saved_tensors
        causal, scale, dropout_p, block_size, rng = ctx.args
        tiling = _tiling(q, k, mask[0] if mask else None, causal, block_size)
        if rng is None:
            grads = _backward(d_out, d_lse, q, k, v, out, lse, tiling, scale, dropout_p)
        else:  # replay the forward pass's random draws, leaving the generator as it was
            cuda = [q.device] if q.device.type == "cuda" else []
            with torch.random.fork_rng(devices=cuda, device_type=q.device.type):
                if cuda:
                    torch.cuda.set_rng_state(rng, q.device)
                else:
                    torch.set_rng_state(rng)
                grads = _backward(d_out, d_lse, q, k, v, out, lse, tiling, scale, dropout_p)
        return (*grads, None, None, None, None, None)


def _tiling(q: Tensor, k: Tensor, mask: Tensor | None, causal: bool, block_size: int
            ) -> _Tiling:
    """The tiles of q ``(..., T, D)`` against k ``(..., S, D)``, the mask made at least 2-D."""
    T, S = q.shape[-2], k.shape[-2]
    if mask is not None:
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # at least 2-D
        mask = mask.expand(*mask.shape[:-1], S)  # (..., T or 1, S): one column per key
    per_row = mask is not None and mask.shape[-2] != 1  # the mask has a row per query
    return _Tiling(T, S, block_size, causal, mask, per_row)


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_size: int = 64,
    return_lse: bool = False,
    recompute: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √D) v, reading ``block_size`` keys at a time (online softmax).

    Under autograd it runs as :class:`FlashAttentionFunction`: the backward pass saves only
    q, k, v, the output and the log-sum-exp, and recomputes the tiles.

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``, the same leading dims as ``q``.
        v: values ``(..., S, Dv)``; ``Dv`` may differ from ``D``.
        mask: optional boolean mask broadcastable to ``(..., T, S)``, True = may attend
            (e.g. a key-padding mask ``(B, 1, 1, S)``); it is read one key tile at a time.
            A query whose keys are all blocked gets a zero output, as in
            :func:`transformer_lib.attention.scaled_dot_product_attention`.
        causal: if True, the T queries are the *last* T of the S positions (bottom-right,
            as :func:`transformer_lib.attention.causal_mask`): query i sees keys
            0 … S - T + i. Needs ``S >= T``. Combined with ``mask`` (AND) if both are given.
            Rows are finished, and their key tiles skipped, once a tile starts after them.
        scale: the factor on the scores; None means ``D ** -0.5``.
        dropout_p: dropout probability on the attention weights (each tile's e^{s - m} is
            dropped before it meets v; the normaliser l keeps every key, as
            ``dropout(softmax(s)) @ v`` does), drawn from PyTorch's global generator; the
            backward pass replays the same draws. Use 0 in eval.
        block_size: keys per tile; the scores of one tile, ``(..., T, block_size)``, are the
            largest intermediate.
        return_lse: also return the log-sum-exp of each query's scores,
            ``lse = m + log l``, ``(..., T)``: softmax weight j is ``exp(s_j - lse)``, and two
            results over disjoint key sets merge exactly with it (-inf for a query that
            sees no key).
        recompute: under autograd, run as :class:`FlashAttentionFunction`, whose backward
            pass recomputes the tiles (the default). False lets autograd record the loop
            itself, which then keeps every tile's exponentials for the backward pass, more
            than one ``(T, S)`` matrix: what a tiled forward pass saves without a backward
            pass of its own, for comparison.

    Returns:
        ``out`` ``(..., T, Dv)`` in the input dtype; with ``return_lse``, ``(out, lse)``,
        ``lse`` in the accumulation dtype. Half-precision inputs are accumulated in fp32
        (fp64 stays fp64).
    """
    _check_inputs(q, k, v, mask, causal, block_size, dropout_p)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if recompute and torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = FlashAttentionFunction.apply(q, k, v, mask, causal, scale, dropout_p,
                                                block_size)
    else:  # nothing to differentiate, or autograd differentiates the loop: the loop alone
        out, lse = _forward(q, k, v, _tiling(q, k, mask, causal, block_size), scale,
                            dropout_p)
    out = zero_rows_without_keys(out, mask, k.shape[-2], causal=causal)  # (..., T, Dv)
    return (out, lse) if return_lse else out
