"""Attention computed tile by tile with an online softmax (the idea of FlashAttention).

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
softmax exactly, up to rounding.

Memory, in the forward pass (inference, or anything under ``torch.no_grad()``): the largest
intermediate is one block of scores, ``(..., T, block_size)``, so the memory grows like
T · (block_size + Dv), never like T · S: the ``(T, S)`` matrix is never formed at once. With
autograd recording, every tile's scores and probabilities are saved for the backward pass,
which then holds more than one ``(T, S)`` matrix's worth (a real FlashAttention kernel saves
only ``lse`` and recomputes the tiles backwards). A GPU kernel also tiles the queries and keeps
each tile in on-chip memory; this module shows the arithmetic, in plain PyTorch.

:func:`flash_attention` is the ``"tiled"`` entry of
:data:`transformer_lib.attention.ATTENTION_FUNCTIONS` (through ``tiled_attention``, which
repeats grouped key/value heads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.validation import check_mask, check_qkv, compute_dtype


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                  block_size: int) -> None:
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
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √D) v, reading ``block_size`` keys at a time (online softmax).

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
        scale: the factor on the scores; None means ``D ** -0.5``.
        dropout_p: dropout probability on the attention weights (each tile's e^{s - m} is
            dropped before it meets v; the normaliser l keeps every key, as
            ``dropout(softmax(s)) @ v`` does). Use 0 in eval.
        block_size: keys per tile; the scores of one tile, ``(..., T, block_size)``, are the
            largest intermediate of the forward pass.
        return_lse: also return the log-sum-exp of each query's scores,
            ``lse = m + log l``, ``(..., T)``: softmax weight j is ``exp(s_j - lse)``, and two
            results over disjoint key sets merge exactly with it (-inf for a query that
            sees no key).

    Returns:
        ``out`` ``(..., T, Dv)`` in the input dtype; with ``return_lse``, ``(out, lse)``,
        ``lse`` in the accumulation dtype. Half-precision inputs are accumulated in fp32
        (fp64 stays fp64).
    """
    _check_inputs(q, k, v, mask, causal, block_size)
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if mask is not None:
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # at least 2-D
        mask = mask.expand(*mask.shape[:-1], S)  # (..., T or 1, S): one column per key
    per_row = mask is not None and mask.shape[-2] != 1  # the mask has a row per query
    work = compute_dtype(q.dtype)  # fp16/bf16 -> fp32; fp32 and fp64 stay
    scale = D ** -0.5 if scale is None else scale
    q_run = q.to(work) * scale  # (..., T, D): rows still running; scaling q once
    m = q_run.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., T, 1) running max
    l = q_run.new_zeros((*q.shape[:-1], 1))  # (..., T, 1) running sum
    acc = q_run.new_zeros((*q.shape[:-1], v.shape[-1]))  # (..., T, Dv) running numerator
    offset = S - T  # with causal, query i sits at position offset + i
    first = 0  # first running row; with causal, rows before it have seen all their keys
    finished = []  # (m, l, acc) of finished rows, in order
    for start in range(0, S, block_size):
        end = min(start + block_size, S)
        if causal and start - offset > first:
            # Rows first … start - offset - 1 see no key from `start` on: set them aside,
            # so the future part of the score matrix is skipped, not computed and masked.
            n = start - offset - first
            finished.append((m[..., :n, :], l[..., :n, :], acc[..., :n, :]))
            m, l, acc, q_run = m[..., n:, :], l[..., n:, :], acc[..., n:, :], q_run[..., n:, :]
            first += n
        k_blk = k[..., start:end, :].to(work)  # (..., Bk, D), Bk = end - start
        v_blk = v[..., start:end, :].to(work)  # (..., Bk, Dv)
        s = q_run @ k_blk.transpose(-2, -1)  # (..., T_run, Bk): one tile of scores
        if causal and end - 1 > offset + first:  # the tile reaches past some row's position
            rows = torch.arange(first, T, device=q.device)[:, None] + offset  # (T_run, 1)
            cols = torch.arange(start, end, device=q.device)[None, :]  # (1, Bk)
            s = s.masked_fill(cols > rows, float("-inf"))  # (..., T_run, Bk)
        if mask is not None:
            tile = mask[..., first:, start:end] if per_row else mask[..., start:end]
            s = s.masked_fill(~tile, float("-inf"))  # (..., T_run, Bk)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., T_run, 1)
        # Without a mask every running row sees key `start` (causal or not), so m_new is
        # finite and exp(m - m_new) is 0 on a row's first tile. With a mask, a row whose keys
        # so far are all blocked has m_new = -inf: shift it by 0 instead, so that its
        # exponentials are exp(-inf) = 0, not exp(-inf + inf) = NaN.
        shift = m_new if mask is None else m_new.masked_fill(m_new == float("-inf"), 0.0)
        rescale = torch.exp(m - shift)  # (..., T_run, 1)
        p = torch.exp(s - shift)  # (..., T_run, Bk), every entry in [0, 1]
        l = rescale * l + p.sum(dim=-1, keepdim=True)  # (..., T_run, 1)
        if dropout_p > 0.0:
            p = F.dropout(p, p=dropout_p, training=True)  # (..., T_run, Bk)
        acc = rescale * acc + p @ v_blk  # (..., T_run, Dv)
        m = m_new
    finished.append((m, l, acc))
    m, l, acc = (torch.cat(parts, dim=-2) for parts in zip(*finished))  # all T rows
    if mask is not None:  # rows that saw no key: l = 0, acc = 0; output 0, lse -inf
        l_safe = l.masked_fill(l == 0, 1.0)  # (..., T, 1)
        out = (acc / l_safe).to(q.dtype)  # (..., T, Dv)
    else:
        out = (acc / l).to(q.dtype)  # (..., T, Dv)
    if return_lse:
        return out, (m + torch.log(l)).squeeze(-1)  # (..., T)
    return out
