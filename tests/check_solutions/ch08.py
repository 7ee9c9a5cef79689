"""Reference solutions of Chapter 8 (chapters/08_fast_attention.ipynb), by checker name."""
from __future__ import annotations

import torch


def merge_softmax_stats(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)  # (..., T, 1): the maximum over both blocks
    seen = torch.isfinite(m)  # False for a row that sees no key in either block
    base = torch.where(seen, m, torch.zeros_like(m))  # never -inf - (-inf)
    w1, w2 = torch.exp(m1 - base), torch.exp(m2 - base)  # at most 1; 0 where m_i = -inf
    return m, w1 * l1 + w2 * l2, w1 * acc1 + w2 * acc2


def tiled_causal_attention(q, k, v, block_q, block_k):
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    offset = S - T  # query i sits at position offset + i
    outs, n_tiles = [], 0
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_tile = q[..., i0:i1, :] * D ** -0.5  # (..., bq, D)
        m = q_tile.new_full((*q_tile.shape[:-1], 1), float("-inf"))  # (..., bq, 1)
        l = torch.zeros_like(m)  # (..., bq, 1)
        acc = q_tile.new_zeros((*q_tile.shape[:-1], v.shape[-1]))  # (..., bq, Dv)
        at = torch.arange(i0, i1)[:, None] + offset  # (bq, 1): the queries' positions
        for j0 in range(0, offset + i1, block_k):  # no tile after the tile's last query
            j1 = min(j0 + block_k, S)
            s = q_tile @ k[..., j0:j1, :].transpose(-2, -1)  # (..., bq, bk)
            s = s.masked_fill(torch.arange(j0, j1)[None, :] > at, float("-inf"))
            n_tiles += 1
            m_tile = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # finite: key 0 first
            fade = torch.exp(m - m_tile)  # (..., bq, 1)
            p = torch.exp(s - m_tile)  # (..., bq, bk)
            l = fade * l + p.sum(dim=-1, keepdim=True)
            acc = fade * acc + p @ v[..., j0:j1, :]  # (..., bq, Dv)
            m = m_tile
        outs.append(acc / l)
    return torch.cat(outs, dim=-2), n_tiles  # (..., T, Dv)


def combine_splits(outs, lses):
    lse_all = torch.stack(lses)  # (n, ..., T)
    top = lse_all.amax(dim=0)  # (..., T)
    base = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # -inf rows: 0
    share = torch.exp(lse_all - base)  # (n, ..., T): each split's softmax mass, rescaled
    total = share.sum(dim=0)  # (..., T)
    out = (share[..., None] * torch.stack(outs)).sum(dim=0)  # (..., T, Dv)
    out = out / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return out, base + torch.log(total)  # log(0) = -inf where no key was seen


SOLUTIONS = {
    "check_merge_softmax_stats": merge_softmax_stats,
    "check_tiled_causal_attention": tiled_causal_attention,
    "check_combine_splits": combine_splits,
}
