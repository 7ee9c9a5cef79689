"""Checkers for the exercises at the end of chapter 8, computing attention fast
(``chapters/08_fast_attention.ipynb``): merging the online-softmax statistics of two key
blocks, causal attention in query and key tiles that skips the tiles above the diagonal, and
the combination of partial results over splits of the keys (split-KV decoding) through their
log-sum-exp. The tiled checker also records the shape of every tensor the student's function
creates, so that computing the whole score matrix and counting tiles by formula fails; that
machinery (``_NewTensors``, ``_too_large``) also serves the checker of the tiled
forward the chapter builds, in ``ch08_tiled_attention``."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _compare_number,
    _Failure,
    _fixed_work,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "merge_softmax_stats": Rules(),
    "tiled_causal_attention": Rules(
        allow=("causal_mask",), refuse=("torch.nn.functional.scaled_dot_product_attention",)),
    "combine_splits": Rules(),
}


NEG_INF = float("-inf")  #: the score of a blocked key

# Statistics of a block of scores, the independent reference of all three checkers ------------


def _stats(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(m, l, acc) of one block: the row max of ``scores`` ``(..., T, n)`` (-inf for a row with
    no visible key), Σ exp(s - m) and Σ exp(s - m) v; a row with no visible key gets l = 0 and
    acc = 0. ``values`` is ``(..., n, Dv)``."""
    m = scores.amax(dim=-1, keepdim=True)  # (..., T, 1)
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - base)  # blocked entries: exp(-inf) = 0
    return m, p.sum(dim=-1, keepdim=True), p @ values  # (..., T, 1), (..., T, 1), (..., T, Dv)


# Watching the tensors a tiled function creates (here and in ch08_tiled_attention) ------------


def _tensors(value) -> list[Tensor]:
    """The tensors in a value: itself, or inside (nested) tuples, lists and dict values."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


@given
class _NewTensors(TorchFunctionMode):
    """Records the shape of every tensor a torch function or tensor method creates while the
    block runs; views and in-place results (sharing an argument's storage) are left out."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs or {}))}
        self.shapes += [tuple(t.shape) for t in _tensors(result)
                        if t.untyped_storage().data_ptr() not in given]
        return result


def _too_large(shapes: list[tuple[int, ...]], block_q: int, block_k: int, D: int, Dv: int,
               ndim: int) -> tuple[int, ...] | None:
    """The first shape of a query-by-key tensor (scores, weights or a mask) that spans more
    than ``block_q`` queries or ``block_k`` keys; None if there is none. Query-by-key tensors
    have the dims of q (``ndim``) or are 2-D; those whose last dim is 1, D or Dv (statistics,
    q, k, v, outputs) are not query-by-key tensors, nor are per-row statistics reduced over
    the keys (one dim fewer than q)."""
    for shape in shapes:
        if len(shape) in (ndim, 2) and shape[-1] not in (1, D, Dv) \
                and shape[-2] not in (D, Dv) and (shape[-2] > block_q or shape[-1] > block_k):
            return shape
    return None


# Warm-up: merge the statistics of two key blocks ----------------------------------------------


def _merge(m1, l1, acc1, m2, l2, acc2, *, mistake: str | None = None):
    """The reference (``mistake=None``) and the known mistakes."""
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a1, a2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    if mistake == "old_sum_not_rescaled":
        return m, l1 + a2 * l2, acc1 + a2 * acc2
    if mistake == "sum_not_rescaled":
        return m, l1 + l2, a1 * acc1 + a2 * acc2
    if mistake == "acc_not_rescaled":
        return m, a1 * l1 + a2 * l2, acc1 + acc2
    if mistake == "sign":
        return m, torch.exp(safe - m1) * l1 + torch.exp(safe - m2) * l2, (
            torch.exp(safe - m1) * acc1 + torch.exp(safe - m2) * acc2)
    if mistake == "nan_when_masked":
        b1, b2 = torch.exp(m1 - m), torch.exp(m2 - m)
        return m, b1 * l1 + b2 * l2, b1 * acc1 + b2 * acc2
    if mistake == "normalised":
        l = a1 * l1 + a2 * l2
        return m, l, (a1 * acc1 + a2 * acc2) / l
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


_OVERFLOW = say("exp overflows in float32 above about 88: keep every exponent at most 0 by "
                "subtracting the new maximum before exponentiating")

_MERGE_HINTS = {
    "old_sum_not_rescaled": say("the first block's sums are still relative to its own maximum m1: "
                                "multiply them by exp(m1 - m) too, not only the second block's"),
    "sum_not_rescaled": say("l was added without rescaling: each block's sum of exponentials is "
                            "relative to its own maximum, so l1 and l2 need the factors "
                            "exp(m1 - m) and exp(m2 - m) as acc does"),
    "acc_not_rescaled": say("acc was added without rescaling: acc1 and acc2 need the same factors "
                            "exp(m1 - m) and exp(m2 - m) as l1 and l2"),
    "sign": say("the factors are exp(m_i - m), at most 1: the new maximum m is at least each "
                "block's maximum"),
    "nan_when_masked": say("a row with no visible key in either block has m1 = m2 = -inf, and "
                           "exp(-inf - (-inf)) is NaN: take the factor as 0 where the merged "
                           "maximum is -inf (l and acc stay 0)"),
    "normalised": say("return the unnormalised sum acc; divide by l only once, after the last "
                      "block"),
}


def check_merge_softmax_stats(merge_softmax_stats: Callable[..., tuple]) -> CheckResult:
    """Check ``merge_softmax_stats(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: the online
    softmax statistics of two disjoint blocks of keys merged into those of their union. For a
    block with scores s and values v: ``m`` ``(..., T, 1)`` the row maximum of s (-inf for a
    row that sees no key of the block), ``l`` ``(..., T, 1)`` Σ exp(s - m), ``acc``
    ``(..., T, Dv)`` Σ exp(s - m) v (0 for a row with no visible key).

    Args:
        merge_softmax_stats: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(shape: tuple[int, ...], n1: int, n2: int, Dv: int, *, shift2: float = 0.0,
             scale: float = 1.0, masked1: Tensor | None = None,
             masked2: Tensor | None = None, dtype=torch.float32,
             nan_hint: str = _MERGE_HINTS["nan_when_masked"]) -> Callable[[], None]:
        s1 = scale * torch.randn(*shape, n1, generator=g, dtype=dtype)  # (..., T, n1)
        s2 = scale * torch.randn(*shape, n2, generator=g, dtype=dtype) + shift2
        v = torch.randn(*shape[:-1], n1 + n2, Dv, generator=g, dtype=dtype)  # (..., S, Dv)
        if masked1 is not None:  # rows (…, T) that see no key of block 1
            s1 = s1.masked_fill(masked1[..., None], NEG_INF)
        if masked2 is not None:
            s2 = s2.masked_fill(masked2[..., None], NEG_INF)
        v1, v2 = v[..., :n1, :], v[..., n1:, :]
        args = [*_stats(s1, v1), *_stats(s2, v2)]
        want = _stats(torch.cat([s1, s2], dim=-1), v)  # one block: the union
        wrongs = {k: _merge(*args, mistake=k) for k in _MERGE_HINTS}

        def run() -> None:
            got = _call(merge_softmax_stats, args, ["m1", "l1", "acc1", "m2", "l2", "acc2"])
            got = _items(got, 3, say("the triple (m, l, acc)"))
            for i, (name, letters) in enumerate((("m", say("(..., T, 1)")),
                                                 ("l", say("(..., T, 1)")),
                                                 ("acc", say("(..., T, Dv)")))):
                _compare(got[i], want[i], name, letters=letters, nan_hint=nan_hint,
                         mistakes=[(w[i], _MERGE_HINTS[k]) for k, w in wrongs.items()])
        return run

    rows = torch.tensor([[False, True, False, True, False]])  # (1, T): some rows masked
    return _run("merge_softmax_stats", merge_softmax_stats, [
        (say("two blocks of 4 and 6 keys, 5 queries"), case((1, 5), 4, 6, 3)),
        (say("the second block scores higher (by 5): its maximum wins"),
         case((2, 3, 4), 8, 5, 2, shift2=5.0)),
        (say("scores near 1000: nothing may overflow"),
         case((1, 6), 7, 7, 4, scale=30.0, shift2=1000.0, nan_hint=_OVERFLOW)),
        (say("some rows see no key of the second block (m2 = -inf)"),
         case((1, 5), 3, 4, 2, masked2=rows)),
        (say("a row that sees no key in either block, in float64"),
         case((1, 5), 3, 4, 2, masked1=rows, masked2=rows, dtype=torch.float64)),
    ], rules=RULES["merge_softmax_stats"])


# Core: causal attention in query and key tiles, skipping the future ---------------------------


def _tiles_needed(T: int, S: int, block_q: int, block_k: int) -> int:
    """Tiles (query block, key block) with at least one visible (query, key) pair, the
    queries being the last T of the S positions."""
    offset = S - T
    return sum(1 for i in range(0, T, block_q) for j in range(0, S, block_k)
               if j <= offset + min(i + block_q, T) - 1)


def _causal_reference(q: Tensor, k: Tensor, v: Tensor, *, align: str = "bottom_right",
                      strict: bool = False, no_mask: bool = False) -> Tensor:
    """Causal attention, written out, and its known mistakes."""
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / D ** 0.5  # (..., T, S)
    offset = S - T if align == "bottom_right" else 0
    rows = torch.arange(T)[:, None] + offset
    cols = torch.arange(S)[None, :]
    visible = cols < rows if strict else cols <= rows  # (T, S)
    if not no_mask:
        scores = scores.masked_fill(~visible, NEG_INF)
    weights = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(weights, nan=0.0) @ v  # (..., T, Dv)


_TILE_HINTS = {
    "top_left": say("the mask is aligned to the top left: the T queries are the last T of the S "
                    "positions, so query i sits at position S - T + i and sees keys 0 … S - T + i"),
    "strict": say("each query may see its own position too: key j is visible when j <= S - T + i"),
    "no_mask": say("a tile on the diagonal holds keys after some of its queries: mask them there "
                   "(the tiles that are skipped are only those above the diagonal)"),
}


def check_tiled_causal_attention(tiled_causal_attention: Callable[..., tuple]) -> CheckResult:
    """Check ``tiled_causal_attention(q, k, v, block_q, block_k) -> (out, n_tiles)``: causal
    attention (queries the last T of the S positions) computed in tiles of ``block_q`` queries
    by ``block_k`` keys with an online softmax; ``out`` ``(..., T, Dv)``; ``n_tiles``, the
    number of score tiles computed, counts only tiles with at least one visible pair. No
    query-by-key tensor the function creates may span more than one tile, and the library's
    attention functions and PyTorch's SDPA may not be called.

    Args:
        tiled_causal_attention: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(lead: tuple[int, ...], T: int, S: int, D: int, Dv: int, block_q: int,
             block_k: int, dtype=torch.float32) -> Callable[[], None]:
        q = torch.randn(*lead, T, D, generator=g, dtype=dtype)
        k = torch.randn(*lead, S, D, generator=g, dtype=dtype)
        v = torch.randn(*lead, S, Dv, generator=g, dtype=dtype)
        want = _causal_reference(q, k, v)
        wrongs = [(_causal_reference(q, k, v, **{key: True} if key != "top_left"
                                     else {"align": "top_left"}), hint)
                  for key, hint in _TILE_HINTS.items()]
        tiles = _tiles_needed(T, S, block_q, block_k)
        every = -(-T // block_q) * -(-S // block_k)

        def run() -> None:
            with _NewTensors() as made:
                got = _call(tiled_causal_attention, [q, k, v, block_q, block_k],
                            ["q", "k", "v", "block_q", "block_k"])
            out, n_tiles = _items(got, 2, say("the pair (out, n_tiles)"))
            atol = 1e-12 if dtype == torch.float64 else 1e-5
            _compare(out, want, "out", letters=say("(..., T, Dv)"), atol=atol, rtol=atol,
                     mistakes=wrongs, nan_hint=say("a row of a tile may see none of the "
                                                   "tile's keys: its factor exp(s - m) must come "
                                                   "out 0, not NaN"))
            all_tiles = say("{every} is every tile: the tiles above the diagonal, whose keys "
                            "all come after every query of the tile, are to be skipped, not "
                            "computed and masked", every=every)
            _compare_number(n_tiles, tiles, "n_tiles", rel_tol=0.0,
                            mistakes=[(every, all_tiles)] if every != tiles else [])
            shape = _too_large(made.shapes, block_q, block_k, D, Dv, q.dim())
            if shape is not None:
                raise _Failure(
                    say("created a tensor of shape {shape}, larger than one tile of "
                        "({block_q}, {block_k}) queries by keys", shape=shape, block_q=block_q,
                        block_k=block_k),
                    say("compute each tile of scores from a tile of block_q queries and a tile of "
                        "block_k keys, and its mask from their positions: no scores, weights or "
                        "mask for all T queries or all S keys at once"))
        return run

    def fixed_work() -> None:
        def inputs(T: int, block: int) -> list:
            return [torch.randn(2, T, 4, generator=g), torch.randn(2, T, 4, generator=g),
                    torch.randn(2, T, 4, generator=g), block, block]
        _fixed_work(tiled_causal_attention, inputs(8, 4), inputs(16, 8),
                    ["q", "k", "v", "block_q", "block_k"], "tile",
                    (say("T = S = 8 in tiles of 4 by 4"), say("T = S = 16 in tiles of 8 by 8")))

    return _run("tiled_causal_attention", tiled_causal_attention, [
        (say("T = S = 10, tiles of 4 queries by 3 keys"), case((1, 2), 10, 10, 8, 8, 4, 3)),
        (say("a chunk of 5 queries after 8 cached keys (S = 13), tiles of 2 by 4"),
         case((2,), 5, 13, 4, 6, 2, 4)),
        (say("one query after 9 cached keys (decoding), tiles of 4 by 4"),
         case((1, 1), 1, 10, 8, 8, 4, 4)),
        (say("T = S = 12 in float64, tiles of 5 by 5"),
         case((), 12, 12, 6, 3, 5, 5, torch.float64)),
        (say("blocks larger than the sequence: one tile"), case((2, 1), 6, 7, 4, 4, 8, 16)),
        (say("T = 12 after 3 cached keys, tiles of 4 by 3: nothing larger than a tile"),
         case((2, 1), 12, 15, 5, 7, 4, 3)),
        (say("the work grows with the number of tiles, not with their size"), fixed_work),
    ], rules=RULES["tiled_causal_attention"])


# Challenge: combine the results of key splits through their log-sum-exp ----------------------


def _combine(outs: list[Tensor], lses: list[Tensor], *, mistake: str | None = None
             ) -> tuple[Tensor, Tensor]:
    """The reference (``mistake=None``) and the known mistakes."""
    o, s = torch.stack(outs), torch.stack(lses)  # (n, ..., T, Dv), (n, ..., T)
    if mistake == "mean":
        return o.mean(0), s.mean(0)
    if mistake == "raw_exp":
        w = torch.exp(s)
        return (w[..., None] * o).sum(0) / w.sum(0)[..., None], torch.log(w.sum(0))
    if mistake == "linear":
        w = s / s.sum(0)
        return (w[..., None] * o).sum(0), s.sum(0)
    top = s.amax(dim=0)  # (..., T)
    safe = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(s - (top if mistake == "nan_when_masked" else safe))  # (n, ..., T)
    total = w.sum(0)  # (..., T)
    if mistake == "lse_max":
        lse = top
    else:
        lse = safe + torch.log(total)
        lse = torch.where(torch.isinf(top), top, lse)
    if mistake == "nan_when_masked":
        return (w[..., None] * o).sum(0) / total[..., None], top + torch.log(total)
    out = (w[..., None] * o).sum(0) / torch.where(total > 0, total, 1.0)[..., None]
    return out, lse


_COMBINE_HINTS = {  # the NaN mistake first: in a case with masked rows, it is the cause
    "nan_when_masked": say("a row that sees no key in any split has every lse_i = -inf, and "
                           "exp(-inf - (-inf)) is NaN: give it out = 0 and lse = -inf"),
    "mean": say("each split's output is an average over its own keys only: weight it by its "
                "share of the whole softmax, exp(lse_i - lse), not equally"),
    "raw_exp": say("exp(lse_i) overflows when the scores are large: subtract the largest lse_i "
                   "before taking exponentials"),
    "linear": say("the weight of a split is exp(lse_i - lse), the exponential of its log-sum-exp, "
                  "not proportional to lse_i itself"),
    "lse_max": say("the combined log-sum-exp is log Σ exp(lse_i), not the largest lse_i"),
}


def check_combine_splits(combine_splits: Callable[..., tuple]) -> CheckResult:
    """Check ``combine_splits(outs, lses) -> (out, lse)``: attention over the union of n
    disjoint splits of the keys, from each split's own result. ``outs[i]`` ``(..., T, Dv)`` is
    attention over split i alone (0 for a row that sees none of its keys), ``lses[i]``
    ``(..., T)`` the log-sum-exp of that row's scaled scores over the split (-inf then). Returns
    the attention over all keys ``(..., T, Dv)`` and its log-sum-exp ``(..., T)``.

    Args:
        combine_splits: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(lead: tuple[int, ...], T: int, sizes: tuple[int, ...], D: int, Dv: int, *,
             scale: float = 1.0, blocked: dict[int, Tensor] | None = None,
             dtype=torch.float32) -> Callable[[], None]:
        nan_hint = _COMBINE_HINTS["nan_when_masked" if blocked else "raw_exp"]
        S = sum(sizes)
        q = scale * torch.randn(*lead, T, D, generator=g, dtype=dtype)
        k = torch.randn(*lead, S, D, generator=g, dtype=dtype)
        v = torch.randn(*lead, S, Dv, generator=g, dtype=dtype)
        scores = (q @ k.transpose(-2, -1)) / D ** 0.5  # (..., T, S)
        outs, lses, start = [], [], 0
        for i, n in enumerate(sizes):
            s = scores[..., start:start + n]
            if blocked and i in blocked:  # rows (T,) that see no key of split i
                s = s.masked_fill(blocked[i][:, None], NEG_INF)
                scores = torch.cat([scores[..., :start], s, scores[..., start + n:]], dim=-1)
            m, l, acc = _stats(s, v[..., start:start + n, :])
            outs.append(acc / torch.where(l > 0, l, 1.0))  # (..., T, Dv), 0 where no key
            lses.append((m + torch.log(l)).squeeze(-1))  # (..., T), -inf where no key
            start += n
        m, l, acc = _stats(scores, v)
        want = (acc / torch.where(l > 0, l, 1.0), (m + torch.log(l)).squeeze(-1))
        wrongs = {k: _combine(outs, lses, mistake=k) for k in _COMBINE_HINTS}

        def run() -> None:
            got = _call(combine_splits, [list(outs), list(lses)], ["outs", "lses"])
            got = _items(got, 2, say("the pair (out, lse)"))
            atol = 1e-12 if dtype == torch.float64 else 1e-5
            for i, (name, letters) in enumerate((("out", say("(..., T, Dv)")),
                                                 ("lse", say("(..., T)")))):
                _compare(got[i], want[i], name, letters=letters, atol=atol, rtol=atol,
                         nan_hint=nan_hint,
                         mistakes=[(w[i], _COMBINE_HINTS[k]) for k, w in wrongs.items()])
        return run

    blocked = {0: torch.tensor([True, False, True]), 1: torch.tensor([True, True, False]),
               2: torch.tensor([True, False, False])}  # row 0 sees no key at all
    return _run("combine_splits", combine_splits, [
        (say("one query (decoding), 4 splits of 16, 16, 16 and 7 keys"),
         case((2, 2), 1, (16, 16, 16, 7), 8, 8)),
        (say("5 queries, 2 uneven splits"), case((1,), 5, (3, 9), 4, 6)),
        (say("large scores (log-sum-exp in the hundreds): nothing may overflow"),
         case((1, 1), 2, (8, 8, 8), 16, 4, scale=60.0)),
        (say("rows that see no key of a split, and one that sees none at all, in float64"),
         case((1,), 3, (5, 4, 3), 4, 2, blocked=blocked, dtype=torch.float64)),
    ], rules=RULES["combine_splits"])
