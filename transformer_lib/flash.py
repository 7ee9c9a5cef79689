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

Memory: the largest intermediate is one block of scores, ``(..., T, block_size)``, so the
memory grows like T · (block_size + Dv), never like T · S: the ``(T, S)`` matrix is never
formed. (A GPU kernel also tiles the queries and keeps each tile in on-chip memory; this
module shows the arithmetic, in plain PyTorch.)
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool, block_size: int) -> None:
    """Raise a ValueError naming the values unless q, k, v fit together."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (..., positions, dim), got {tuple(x.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must have the same leading dims, got {tuple(q.shape[:-2])}, "
            f"{tuple(k.shape[:-2])} and {tuple(v.shape[:-2])}"
        )
    if q.shape[-1] != k.shape[-1] or q.shape[-1] < 1:
        raise ValueError(
            f"q and k must have the same positive head dim, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}"
        )
    T, S = q.shape[-2], k.shape[-2]
    if T < 1 or S < 1:
        raise ValueError(f"flash_attention needs T >= 1 queries and S >= 1 keys, got T={T}, S={S}")
    if causal and S < T:
        raise ValueError(f"causal attention needs S >= T (queries are the last T of the S "
                         f"positions), got T={T}, S={S}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    block_size: int = 64,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √D) v, reading ``block_size`` keys at a time (online softmax).

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``, the same leading dims as ``q``.
        v: values ``(..., S, Dv)``; ``Dv`` may differ from ``D``.
        causal: if True, the T queries are the *last* T of the S positions (bottom-right,
            as :func:`transformer_lib.attention.causal_mask`): query i sees keys
            0 … S - T + i. Needs ``S >= T``.
        block_size: keys per tile; the scores of one tile, ``(..., T, block_size)``, are the
            largest intermediate.
        return_lse: also return the log-sum-exp of each query's scores,
            ``lse = m + log l``, ``(..., T)``: softmax weight j is ``exp(s_j - lse)``, and two
            results over disjoint key sets merge exactly with it.

    Returns:
        ``out`` ``(..., T, Dv)`` in the input dtype; with ``return_lse``, ``(out, lse)``,
        ``lse`` in the accumulation dtype. Half-precision inputs are accumulated in fp32
        (fp64 stays fp64).
    """
    _check_inputs(q, k, v, causal, block_size)
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)  # fp16/bf16 -> fp32; fp64 stays
    q_run = q.to(work) * D ** -0.5  # (..., T, D): rows still running; scaling q once
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
        # Every running row sees key `start` (causal or not), so m_new is finite and
        # exp(m - m_new) is 0 on a row's first tile, never exp(-inf + inf) = NaN.
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., T_run, 1)
        rescale = torch.exp(m - m_new)  # (..., T_run, 1)
        p = torch.exp(s - m_new)  # (..., T_run, Bk), every entry in [0, 1]
        l = rescale * l + p.sum(dim=-1, keepdim=True)  # (..., T_run, 1)
        acc = rescale * acc + p @ v_blk  # (..., T_run, Dv)
        m = m_new
    finished.append((m, l, acc))
    m, l, acc = (torch.cat(parts, dim=-2) for parts in zip(*finished))  # all T rows
    out = (acc / l).to(q.dtype)  # (..., T, Dv)
    if return_lse:
        return out, (m + torch.log(l)).squeeze(-1)  # (..., T)
    return out
