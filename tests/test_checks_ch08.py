"""Chapter 8's checkers (``transformer_lib/checks/ch08_fast_attention.py`` and, for the tiled
forward the learner writes where the chapter builds it, ``ch08_tiled_attention.py``) name the
usual mistakes in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.checks import (
    ch08_fast_attention,
    ch08_tiled_attention,
    check_combine_splits,
    check_merge_softmax_stats,
    check_tiled_attention,
    check_tiled_causal_attention,
)
from transformer_lib.flash import flash_attention

from chapter_solutions import references
from conftest import mistake_tests

SDPA = "F.scaled_dot_product_attention"

combine_splits, merge_softmax_stats, tiled_attention, tiled_causal_attention = references(
    "08_fast_attention", "combine_splits", "merge_softmax_stats", "tiled_attention",
    "tiled_causal_attention")


def key_tiles_with(mistake):
    """tiled_attention (keys a tile at a time, all queries at once) with one of the usual
    mistakes."""

    def attention(q, k, v, block):
        D, Dv, S = q.shape[-1], v.shape[-1], k.shape[-2]
        scale = {"no_scale": 1.0, "dv_scale": Dv ** -0.5}.get(mistake, D ** -0.5)
        m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        a = torch.zeros(*q.shape[:-1], Dv, dtype=q.dtype)
        stop = S - S % block if mistake == "short_tile_dropped" and S > block else S
        for start in range(0, stop, block):
            s = (q @ k[..., start:start + block, :].transpose(-2, -1)) * scale
            if mistake == "raw_exp":  # no maximum subtracted: overflows for large scores
                e = torch.exp(s)
                l, a = l + e.sum(-1, keepdim=True), a + e @ v[..., start:start + block, :]
                continue
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            fade, e = torch.exp(m - new), torch.exp(s - new)
            l_new = (1.0 if mistake == "l_not_rescaled" else fade) * l + e.sum(-1, keepdim=True)
            if mistake == "divided_in_loop":
                a = (fade * a + e @ v[..., start:start + block, :]) / l_new
            else:
                a = (1.0 if mistake == "acc_not_rescaled" else fade) * a \
                    + e @ v[..., start:start + block, :]
            m, l = new, l_new
        return a if mistake == "divided_in_loop" else a / l

    return attention


def whole_matrix(q, k, v, block):
    """The right answer from the whole (T, S) score matrix, softmax written out."""
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)) @ v


def one_query_at_a_time(q, k, v, block):
    """Key tiles, but a loop over the queries: no tensor wider than a tile, work grows with T."""
    rows = [tiled_attention(q[..., t:t + 1, :], k, v, block) for t in range(q.shape[-2])]
    return torch.cat(rows, dim=-2)


def transposed_tiles(q, k, v, block):
    """A correct solution whose tiles are (..., block, T): keys by queries."""
    scale = q.shape[-1] ** -0.5
    m = torch.full((*q.shape[:-2], 1, q.shape[-2]), float("-inf"), dtype=q.dtype)  # (..., 1, T)
    l, a = torch.zeros_like(m), torch.zeros(*q.shape[:-2], v.shape[-1], q.shape[-2],
                                            dtype=q.dtype)  # (..., Dv, T)
    for start in range(0, k.shape[-2], block):
        s = (k[..., start:start + block, :] @ q.transpose(-2, -1)) * scale  # (..., n, T)
        new = torch.maximum(m, s.amax(-2, keepdim=True))
        fade, e = torch.exp(m - new), torch.exp(s - new)
        l = fade * l + e.sum(-2, keepdim=True)
        a = fade * a + v[..., start:start + block, :].transpose(-2, -1) @ e
        m = new
    return (a / l).transpose(-2, -1)


def test_a_tiled_forward_with_transposed_tiles_passes(capsys):
    """A tile of keys by queries, (..., block, T), is a tile too."""
    assert check_tiled_attention(transposed_tiles)
    assert "all 7 checks passed" in capsys.readouterr().out


def merge_with(mistake):
    """merge_softmax_stats with one of the usual mistakes."""

    def merge(m1, l1, acc1, m2, l2, acc2):
        m = torch.maximum(m1, m2)
        if mistake == "nan":  # exp(-inf - (-inf)) for a row that saw no key
            w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
        else:
            base = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            w1, w2 = torch.exp(m1 - base), torch.exp(m2 - base)
        if mistake == "old_not_rescaled":
            return m, l1 + w2 * l2, acc1 + w2 * acc2
        if mistake == "sum_not_rescaled":  # the new max used on acc only
            return m, l1 + l2, w1 * acc1 + w2 * acc2
        if mistake == "acc_not_rescaled":
            return m, w1 * l1 + w2 * l2, acc1 + acc2
        if mistake == "divided":  # normalised before the last block
            l = w1 * l1 + w2 * l2
            return m, l, (w1 * acc1 + w2 * acc2) / l
        if mistake == "sign":
            w1, w2 = 1 / w1, 1 / w2
        if mistake == "raw":  # exp of the raw maxima: overflows for large scores
            w1, w2 = torch.exp(m1) / torch.exp(m), torch.exp(m2) / torch.exp(m)
        return m, w1 * l1 + w2 * l2, w1 * acc1 + w2 * acc2

    return merge


def tiles_with(*, top_left=False, skip=True, strict=False, mask=True, reverse=False):
    """tiled_causal_attention with one of the usual mistakes."""

    def attention(q, k, v, block_q, block_k):
        T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
        offset = 0 if top_left else S - T
        outs, n_tiles = [], 0
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            qt = q[..., i0:i1, :] / D ** 0.5
            m = torch.full((*qt.shape[:-1], 1), float("-inf"), dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(*qt.shape[:-1], v.shape[-1], dtype=q.dtype)
            starts = list(range(0, min(offset + i1, S) if skip else S, block_k))
            for j0 in reversed(starts) if reverse else starts:
                j1 = min(j0 + block_k, S)
                s = qt @ k[..., j0:j1, :].transpose(-2, -1)
                rows = torch.arange(i0, i1)[:, None] + offset
                cols = torch.arange(j0, j1)[None, :]
                if mask:
                    s = s.masked_fill(cols >= rows if strict else cols > rows, float("-inf"))
                n_tiles += 1
                new = torch.maximum(m, s.amax(-1, keepdim=True))
                l = torch.exp(m - new) * l + torch.exp(s - new).sum(-1, keepdim=True)
                acc = torch.exp(m - new) * acc + torch.exp(s - new) @ v[..., j0:j1, :]
                m = new
            outs.append(acc / l)
        return torch.cat(outs, dim=-2), n_tiles

    return attention


def tile_count(T, S, block_q, block_k):
    """The number of tiles with a visible pair, by formula (what a shortcut would return)."""
    return sum(1 for i0 in range(0, T, block_q) for j0 in range(0, S, block_k)
               if j0 <= S - T + min(i0 + block_q, T) - 1)


def untiled(route):
    """Right values and count, computed without query-by-key tiles: the whole masked score
    matrix ("whole"), key tiles over all T queries ("key_tiles"), or a library call."""

    def attention(q, k, v, block_q, block_k):
        T, S = q.shape[-2], k.shape[-2]
        n_tiles = tile_count(T, S, block_q, block_k)
        if route == "flash":
            return flash_attention(q, k, v, causal=True, block_size=block_k), n_tiles
        if route == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S)), n_tiles
        if route == "library_sdpa":
            return scaled_dot_product_attention(q, k, v, causal_mask(T, S))[0], n_tiles
        if route == "key_tiles":  # all T rows at once against each key tile
            return tiles_with()(q, k, v, T, block_k)[0], n_tiles
        scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~causal_mask(T, S), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v, n_tiles

    return attention


def tiles_with_row_vectors(q, k, v, block_q, block_k):
    """A correct tiled solution in another style: row statistics without keepdim, a
    preallocated output, masks with torch.where, q scaled once as a whole."""
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    q = q * D ** -0.5  # (..., T, D)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)  # (..., T, Dv)
    n_tiles = 0
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        m = torch.full(q[..., i0:i1, 0].shape, float("-inf"), dtype=q.dtype)  # (..., bq)
        l, acc = torch.zeros_like(m), torch.zeros_like(out[..., i0:i1, :])
        for j0 in range(0, S - T + i1, block_k):
            j1 = min(j0 + block_k, S)
            s = torch.einsum("...qd,...kd->...qk", q[..., i0:i1, :], k[..., j0:j1, :])
            visible = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None] + S - T
            s = torch.where(visible, s, float("-inf"))
            new = torch.maximum(m, s.amax(dim=-1))  # (..., bq)
            p = torch.exp(s - new[..., None])
            l = torch.exp(m - new) * l + p.sum(dim=-1)
            acc = torch.exp(m - new)[..., None] * acc + p @ v[..., j0:j1, :]
            m, n_tiles = new, n_tiles + 1
        out[..., i0:i1, :] = acc / l[..., None]
    return out, n_tiles


def test_a_tiled_solution_in_another_style_passes(capsys):
    """The tile-size watch does not mistake row statistics, q scaled whole, a preallocated
    output or 2-D masks for query-by-key tensors."""
    assert check_tiled_causal_attention(tiles_with_row_vectors)
    assert "all 7 checks passed" in capsys.readouterr().out


def combine_with(mistake):
    """combine_splits with one of the usual mistakes."""

    def combine(outs, lses):
        o, s = torch.stack(outs), torch.stack(lses)
        if mistake == "mean":
            return o.mean(0), torch.logsumexp(s, 0)
        if mistake == "raw_exp":  # overflows for large scores
            w = torch.exp(s)
            return (w[..., None] * o).sum(0) / w.sum(0)[..., None], torch.log(w.sum(0))
        if mistake == "lse_max":
            w = torch.softmax(s, 0)
            return (w[..., None] * o).sum(0), s.amax(0)
        if mistake == "nan":  # exp(-inf - (-inf)) where no split saw a key
            lse = torch.logsumexp(s, 0)
            return (torch.exp(s - lse)[..., None] * o).sum(0), lse
        return combine_splits(outs, lses)

    return combine


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_merge_softmax_stats, merge_with("old_not_rescaled"),
     ["wrong values in l", "multiply them by exp(m1 - m) too"]),
    (check_merge_softmax_stats, merge_with("sum_not_rescaled"),
     ["wrong values in l", "l was added without rescaling"]),
    (check_merge_softmax_stats, merge_with("acc_not_rescaled"),
     ["wrong values in acc", "acc was added without rescaling"]),
    (check_merge_softmax_stats, merge_with("nan"),
     ["4 of 5 checks passed", "NaN appeared in l", "exp(-inf - (-inf)) is NaN"]),
    (check_merge_softmax_stats, merge_with("divided"),
     ["wrong values in acc", "divide by l only once, after the last block"]),
    (check_merge_softmax_stats, merge_with("sign"), ["the factors are exp(m_i - m), at most 1"]),
    (check_merge_softmax_stats, merge_with("raw"),
     ["scores near 1000: nothing may overflow: NaN appeared", "exp overflows in float32"]),
    (check_merge_softmax_stats, lambda *args: merge_softmax_stats(*args)[1:],
     ["return the triple (m, l, acc)"]),
    (check_tiled_causal_attention, tiles_with(top_left=True),
     ["3 of 7 checks passed", "the mask is aligned to the top left"]),
    (check_tiled_causal_attention, tiles_with(skip=False),
     ["wrong value for n_tiles: expected 9, got 12", "12 is every tile",
      "are to be skipped, not computed and masked"]),
    (check_tiled_causal_attention, tiles_with(strict=True),
     ["each query may see its own position too"]),
    (check_tiled_causal_attention, tiles_with(mask=False),
     ["a tile on the diagonal holds keys after some of its queries"]),
    (check_tiled_causal_attention, tiles_with(reverse=True),
     ["NaN appeared in out", "must come out 0, not NaN"]),
    (check_tiled_causal_attention, lambda *args: tiled_causal_attention(*args)[0],
     ["return the pair (out, n_tiles)"]),
    (check_tiled_causal_attention, untiled("whole"),
     ["2 of 7 checks passed", "larger than one tile of (4, 3) queries by keys",
      "no scores, weights or mask for all T queries or all S keys at once"]),
    (check_tiled_causal_attention, untiled("key_tiles"),
     ["created a tensor of shape (2, 1, 12, 3)", "compute each tile of scores from a tile"]),
    (check_tiled_causal_attention, untiled("flash"),
     ["0 of 7 checks passed", ".flash_attention` is not allowed here",
      "write the rest with tensor operations"]),
    (check_tiled_causal_attention, untiled("sdpa"),
     ["`torch.nn.functional.scaled_dot_product_attention` is not allowed here"]),
    (check_tiled_causal_attention, untiled("library_sdpa"),
     ["attention.scaled_dot_product_attention` is not allowed here"]),
    (check_combine_splits, combine_with("mean"),
     ["wrong values in out", "weight it by its share of the whole softmax"]),
    (check_combine_splits, combine_with("raw_exp"),
     ["2 of 4 checks passed", "NaN appeared in out", "subtract the largest lse_i"]),
    (check_combine_splits, combine_with("lse_max"),
     ["wrong values in lse", "not the largest lse_i"]),
    (check_combine_splits, combine_with("nan"),
     ["3 of 4 checks passed", "NaN appeared in out", "give it out = 0 and lse = -inf"]),
]


@pytest.mark.equality
def test_the_references_agree_with_pytorch(ledger):
    """The checkers' reference statistics give PyTorch's attention: the tiled reference with a
    bottom-right mask, and the split statistics merged back into the whole."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 5, 8, generator=g), torch.randn(2, 13, 8, generator=g), \
        torch.randn(2, 13, 3, generator=g)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5, 13))
    ledger.check("the checker's causal reference", ledger.torch(SDPA + ", bottom-right mask"),
                 ch08_fast_attention._causal_reference(q, k, v), want, tol=1e-5)
    out, n_tiles = tiled_causal_attention(q, k, v, 2, 4)
    ledger.check("the tiled causal solution", ledger.torch(SDPA + ", bottom-right mask"), out,
                 want, tol=1e-5)
    # query tiles end at positions 9, 11, 12; key tiles start at 0, 4, 8, 12: the last one is
    # skipped for the first two query tiles
    assert n_tiles == ch08_fast_attention._tiles_needed(5, 13, 2, 4) == 3 * 4 - 2
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5
    whole = ch08_fast_attention._stats(scores, v)
    halves = [ch08_fast_attention._stats(scores[..., a:b], v[..., a:b, :])
              for a, b in ((0, 6), (6, 13))]
    merged = merge_softmax_stats(*halves[0], *halves[1])
    for name, got, expected in zip(("m", "l", "acc"), merged, whole):
        ledger.check(f"merged softmax statistic {name}", "the statistic of all the keys", got,
                     expected, tol=1e-5)
    ledger.check("merged statistics, acc / l", ledger.torch(SDPA), merged[2] / merged[1],
                 F.scaled_dot_product_attention(q, k, v), tol=1e-5)
    outs = [acc / l for _, l, acc in halves]
    lses = [(m + l.log()).squeeze(-1) for m, l, _ in halves]
    out, lse = combine_splits(outs, lses)
    ledger.check("two splits combined", ledger.torch(SDPA), out,
                 F.scaled_dot_product_attention(q, k, v), tol=1e-5)
    ledger.check("two splits' log-sum-exp combined", ledger.torch("logsumexp"), lse,
                 torch.logsumexp(scores, dim=-1), tol=1e-5)


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch08_fast_attention))

# The tiled forward (keys a tile at a time, all queries at once), the chapter's first core ------

CORE_WRONG = [
    (check_tiled_attention, key_tiles_with("acc_not_rescaled"),
     ["wrong values in out", "the running sum a was not rescaled when the maximum grew"]),
    (check_tiled_attention, key_tiles_with("l_not_rescaled"),
     ["wrong values in out", "the running sum l was not rescaled when the maximum grew"]),
    (check_tiled_attention, key_tiles_with("divided_in_loop"),
     ["wrong values in out", "keep a unnormalised and divide by l once"]),
    (check_tiled_attention, key_tiles_with("no_scale"),
     ["wrong values in out", "divide the scores by √D"]),
    (check_tiled_attention, key_tiles_with("dv_scale"),
     ["4 of 7 checks passed", "the scale is 1/√D with D = 12", "not of v (Dv = 5)"]),
    (check_tiled_attention, key_tiles_with("short_tile_dropped"),
     ["the last, shorter tile of keys is missing"]),
    (check_tiled_attention, key_tiles_with("raw_exp"),
     ["6 of 7 checks passed", "scores over 100: nothing may overflow: NaN appeared in out",
      "subtract the running maximum before exponentiating"]),
    (check_tiled_attention, lambda q, k, v, block: tiled_attention(q, k, v, block).double(),
     ["wrong dtype for out: expected torch.float32, got torch.float64"]),
    (check_tiled_attention, whole_matrix,
     ["created a tensor of shape (2, 3, 5, 37), more than one tile of 8 keys for the 5 "
      "queries", "no scores or weights for all S keys at once"]),
    (check_tiled_attention, one_query_at_a_time,
     ["6 of 7 checks passed", "the work grows with the size of a tile"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch08_tiled_attention))
