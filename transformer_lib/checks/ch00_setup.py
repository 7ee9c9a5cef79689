"""Checkers for the exercises of the setup chapter (``chapters/00_setup.ipynb``): the shapes of
a multi-head layer, softmax, scaled dot-product attention, ``repeat_kv``, and splitting and
merging heads."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_lib.checks._harness import (
    ATT_AXES,
    SEED,
    CheckResult,
    Property,
    _call,
    _compare,
    _describe,
    _expect_value_error,
    _Failure,
    _first,
    _generator,
    _items,
    _no_weight_on_blocked,
    _rows_sum_to_one,
    _run,
)
from transformer_lib.checks._reference import _mask_mistakes, _merge_heads, _split_heads

# Shapes of a multi-head attention layer ---------------------------------------------------


def check_mha_shapes(mha_shapes: Callable[..., tuple]) -> CheckResult:
    """Check ``mha_shapes(B, T, S, C, H, H_kv) -> (out, last_weights, k_proj.weight)`` shapes
    against a :class:`transformer_lib.attention.MultiHeadAttention` run on ``x (B, T, C)``
    attending to a memory ``(B, S, C)``: multi-head, grouped-query and multi-query layers."""

    def case(B: int, T: int, S: int, C: int, H: int, H_kv: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(mha_shapes, [B, T, S, C, H, H_kv], ["B", "T", "S", "C", "H", "H_kv"])
            got = _items(got, 3, "three shapes, those of the output, of last_weights and of "
                                 "k_proj.weight")
            with torch.random.fork_rng(devices=[]):  # the layer's init leaves no trace
                torch.manual_seed(SEED)
                mha = MultiHeadAttention(C, H, H_kv)
                with torch.no_grad():
                    out = mha(torch.randn(B, T, C), torch.randn(B, S, C))
            D = C // H
            expected = {
                "the output": (tuple(out.shape), {
                    (B, S, C): "the output has one row per query: T, whatever S is",
                    (B, H, T, D): "o_proj merges the heads back: (B, T, C)",
                    (B, T, H, D): "o_proj merges the heads back: (B, T, C)",
                }),
                "last_weights": (tuple(mha.last_weights.shape), {
                    (B, H, S, T): "one row per query and one column per key: (B, H, T, S)",
                    (B, H_kv, T, S): "every query head has its own weights: H of them, not "
                                     "H_kv (the key/value heads are repeated before attention)",
                    (B, T, S): "there is one set of weights per head: (B, H, T, S)",
                }),
                "k_proj.weight": (tuple(mha.k_proj.weight.shape), {
                    (C, H_kv * D): "nn.Linear stores its weight as (out_features, in_features)",
                    (H * D, C): f"k_proj makes only the H_kv = {H_kv} key/value head(s), of width "
                                f"D = {D}: (H_kv · D, C)",
                }),
            }
            for (what, (want, hints)), shape in zip(expected.items(), got):
                try:
                    shape = tuple(int(n) for n in shape)
                except (TypeError, ValueError):
                    raise _Failure(f"the shape of {what} should be a tuple of ints, "
                                   f"got {_describe(shape)}") from None
                if shape != want:
                    raise _Failure(f"wrong shape of {what}: expected {want}, got {shape}",
                                   hints.get(shape))
        return run

    return _run("mha_shapes", mha_shapes, [
        ("grouped-query: B=2, T=10, S=4, C=48, H=6, H_kv=3", case(2, 10, 4, 48, 6, 3)),
        ("multi-head: B=1, T=5, S=5, C=32, H=4, H_kv=4", case(1, 5, 5, 32, 4, 4)),
        ("multi-query: B=3, T=7, S=9, C=64, H=8, H_kv=1", case(3, 7, 9, 64, 8, 1)),
    ])


# Softmax ----------------------------------------------------------------------------------


def _sums_to_one(dim: int) -> Property:
    def prop(g: Tensor) -> str | None:
        sums = g.sum(dim=dim)
        bad = (sums - 1).abs() > 1e-4
        if bad.any():
            idx = _first(bad)
            return (f"the values along dim={dim} do not sum to 1: the slice at {idx} sums "
                    f"to {sums[idx].item():.4g}")
        return None
    return prop


def check_softmax(softmax: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``softmax(x, dim)`` against ``torch.softmax``.

    Random inputs along the last, the first and a middle dimension; inputs of magnitude 1000,
    which overflow (or underflow) a softmax that does not subtract the maximum first; and
    ``-inf`` entries, the blocked scores of a mask, which must get probability 0."""
    g = _generator()
    x = 3 * torch.randn(4, 7, generator=g)  # (4, 7)
    blocked = x.clone()
    blocked[:, 1::3] = float("-inf")  # a few blocked scores in every row, never a whole row
    overflow = ("exp(1000) overflows to inf, and inf / inf is NaN: subtract the maximum along "
                "`dim` first; softmax(x) = softmax(x - max(x)) and the largest exp is then 1")
    underflow = ("exp(-1000) underflows to 0, and 0 / 0 is NaN: subtract the maximum along "
                 "`dim` first; the largest exp is then 1")

    def case(x: Tensor, dim: int, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(softmax, [x, dim], ["x", "dim"])
            wrong_dims = [(torch.softmax(x, d),
                           f"these values sum to 1 along dim={d}: normalise along the `dim` "
                           f"argument (here {dim}), not a fixed dimension")
                          for d in range(x.dim()) if d != dim % x.dim()]
            whole = torch.softmax(x.flatten(), 0).view_as(x)
            _compare(got, torch.softmax(x, dim), "the output", nan_hint=nan_hint,
                     properties=[_sums_to_one(dim)],
                     mistakes=[*wrong_dims,
                               (whole, "you normalised over the whole tensor: divide by the sum "
                                       "along `dim` only (.sum(dim=dim, keepdim=True))")])
        return run

    return _run("softmax", softmax, [
        ("random scores (4, 7), dim=-1", case(x, -1)),
        ("dim=0 of a (5, 3) tensor", case(torch.randn(5, 3, generator=g), 0)),
        ("dim=1 of a (2, 3, 5) tensor", case(torch.randn(2, 3, 5, generator=g), 1)),
        ("large scores: x + 1000", case(x + 1000, -1, overflow)),
        ("very negative scores: x - 1000", case(x - 1000, -1, underflow)),
        ("-inf entries (blocked scores) get probability 0", case(blocked, -1)),
    ])


# Scaled dot-product attention -------------------------------------------------------------


def _attention_mistakes(q: Tensor, k: Tensor, mask: Tensor | None) -> list[tuple[Tensor, str]]:
    """Weights ``(B, H, T, S)`` of common wrong attention implementations, with their hints:
    the scaling and the softmax's axis here, the mask from :func:`_mask_mistakes`."""
    D = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (B, H, T, S)
    scores = raw / math.sqrt(D)

    def naive(s: Tensor, dim: int = -1) -> Tensor:
        return torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=dim)

    wrong = [
        (naive(raw), f"the weights match scores that were not scaled: divide q·kᵀ by √D "
                     f"(√{D} = {math.sqrt(D):.3g}) before the softmax"),
        (naive(raw / D), f"the weights match scores divided by D = {D}: divide by √D "
                         f"(√{D} = {math.sqrt(D):.3g}) instead"),
        (naive(scores, dim=-2), "the softmax ran over the queries (dim=-2): each query's "
                                "weights over the keys must sum to 1, so use dim=-1"),
    ]
    return wrong if mask is None else wrong + _mask_mistakes(scores, mask)


def check_attention(attention: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check ``attention(q, k, v, mask) -> (out, weights)`` against
    :func:`transformer_lib.attention.scaled_dot_product_attention`.

    Without a mask, with a causal ``(T, S)`` mask (True = may attend) broadcast over batch and
    heads, with a padding mask ``(B, 1, 1, S)`` and values of another width, with large scores
    (a softmax that does not subtract the maximum overflows), and with a query that may attend
    to no key at all, which must get zero weights and a zero output rather than NaN."""
    g = _generator()
    B, H, T, S, D = 2, 3, 4, 6, 8
    q = torch.randn(B, H, T, D, generator=g)  # (B, H, T, D)
    k = torch.randn(B, H, S, D, generator=g)  # (B, H, S, D)
    v = torch.randn(B, H, S, D, generator=g)  # (B, H, S, D)
    v5 = torch.randn(B, H, S, 5, generator=g)  # (B, H, S, Dv) with Dv = 5
    causal = causal_mask(T, S)  # (T, S)
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)  # (B, 1, 1, S)
    padding[1, ..., 3:] = False  # sequence 1 has only 3 real keys
    no_key = causal.clone()
    no_key[1] = False  # query 1 may attend to nothing
    big_q, big_k = 8 * q, 8 * k  # scores up to a few hundred

    def case(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
             nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(attention, [q, k, v, mask], ["q", "k", "v", "mask"])
            out, weights = _items(got, 2, "the pair (out, weights)")
            want_out, want_weights = scaled_dot_product_attention(q, k, v, mask)
            mistakes = _attention_mistakes(q, k, mask)
            properties = [_rows_sum_to_one(mask)]
            if mask is not None:
                properties.insert(0, _no_weight_on_blocked(mask))
            _compare(weights, want_weights, "the weights", letters="(B, H, T, S)",
                     axes=ATT_AXES, nan_hint=nan_hint, properties=properties,
                     mistakes=mistakes)
            out_mistakes = [(w @ v, h) for w, h in mistakes]  # (B, H, T, Dv)
            if k.shape == v.shape:
                out_mistakes.append((want_weights @ k, "out is weights @ v, not weights @ k"))
            _compare(out, want_out, "the output", letters="(B, H, T, Dv)",
                     axes=("batch", "head", "query", "feature"), nan_hint=nan_hint,
                     mistakes=out_mistakes,
                     shape_hints={(*want_out.shape[:-1], k.shape[-1]):
                                  f"out = weights @ v takes its last size from v "
                                  f"(Dv = {v.shape[-1]})"} if k.shape != v.shape else None)
        return run

    stability = ("the scores are large here (up to about "
                 f"{(big_q @ big_k.transpose(-2, -1)).abs().max().item() / math.sqrt(D):.0f}): "
                 "exp overflows to inf; use a softmax that subtracts the maximum (yours from the "
                 "exercise above, or torch.softmax)")
    no_visible_key = ("query 1 may attend to no key (its mask row is all False): a softmax over "
                      "a row of -inf is 0 / 0 = NaN. Give such rows zero weights, e.g. "
                      "weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)")
    return _run("attention", attention, [
        (f"no mask: q {tuple(q.shape)}, k and v {tuple(k.shape)}", case(q, k, v, None)),
        (f"causal mask {tuple(causal.shape)}, broadcast over batch and heads",
         case(q, k, v, causal)),
        (f"padding mask {tuple(padding.shape)}, values of width 5", case(q, k, v5, padding)),
        ("large scores (q and k times 8)", case(big_q, big_k, v, causal, stability)),
        ("a query that may attend to no key gets zero weights, not NaN",
         case(q, k, v, no_key, no_visible_key)),
    ])


# Grouped-query attention: repeat_kv ---------------------------------------------------------


def check_repeat_kv(repeat_kv_fn: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``repeat_kv(x, n_rep)``, ``(B, H_kv, S, D) -> (B, H_kv * n_rep, S, D)``, against
    :func:`transformer_lib.attention.repeat_kv`: heads interleaved (kv0, kv0, kv1, kv1, …),
    so that query head h reads key/value head h // n_rep."""
    g = _generator()

    def case(shape: tuple[int, int, int, int], n_rep: int) -> Callable[[], None]:
        x = torch.randn(*shape, generator=g)  # (B, H_kv, S, D)

        def run() -> None:
            got = _call(repeat_kv_fn, [x, n_rep], ["x", "n_rep"])
            B, H_kv, S, D = shape

            def head_order(out: Tensor) -> str | None:
                held = []
                for h in range(out.shape[1]):
                    same = [j for j in range(H_kv) if torch.allclose(out[:, h], x[:, j].double())]
                    held.append(str(same[0]) if same else "?")
                want = [str(h // n_rep) for h in range(H_kv * n_rep)]
                if held != want:
                    return (f"output heads hold key/value heads [{', '.join(held)}]; expected "
                            f"[{', '.join(want)}] (query head h reads key/value head h // n_rep)")
                return None

            _compare(got, repeat_kv(x, n_rep), "the output", letters="(B, H_kv·n_rep, S, D)",
                     axes=("batch", "head", "position", "feature"), properties=[head_order],
                     mistakes=[(x.repeat(1, n_rep, 1, 1),  # (B, n_rep·H_kv, S, D)
                                "the heads are tiled (kv0, kv1, kv0, kv1, …): repeat each head in "
                                "place instead (kv0, kv0, kv1, kv1, …), so that the n_rep query "
                                "heads of a group, which sit next to each other, share it")],
                     shape_hints={  # later entries win where two shapes coincide
                         (B, H_kv, S * n_rep, D): "you repeated the positions (dim 2); repeat "
                                                  "the heads (dim 1)",
                         (B, n_rep, H_kv, S, D): "merge the two head axes, with the repeats "
                                                 "inside each key/value head: (B, H_kv, n_rep, "
                                                 "S, D), then reshape",
                         (B, H_kv, n_rep, S, D): "merge the two head axes: reshape to "
                                                 "(B, H_kv * n_rep, S, D)",
                     })
        return run

    return _run("repeat_kv", repeat_kv_fn, [
        ("2 key/value heads, n_rep = 2, x (2, 2, 3, 4)", case((2, 2, 3, 4), 2)),
        ("3 key/value heads, n_rep = 4, x (1, 3, 5, 2)", case((1, 3, 5, 2), 4)),
        ("multi-query: 1 key/value head, n_rep = 4", case((2, 1, 3, 4), 4)),
        ("n_rep = 1 gives x back", case((2, 4, 3, 2), 1)),
    ])


# Multi-head attention: split and merge heads ------------------------------------------------


def check_split_heads(split_heads: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``split_heads(x, n_heads)``, ``(B, T, C) -> (B, H, T, D)`` with ``D = C / H``:
    head h of position t holds channels h·D … h·D + D − 1 of x[:, t]. A ``C`` that ``n_heads``
    does not divide must raise a ValueError that names both sizes."""
    g = _generator()

    def case(shape: tuple[int, int, int], H: int) -> Callable[[], None]:
        x = torch.randn(*shape, generator=g)  # (B, T, C)

        def run() -> None:
            got = _call(split_heads, [x, H], ["x", "n_heads"])
            B, T, C = shape
            D = C // H
            _compare(got, _split_heads(x, H), "the output", letters="(B, H, T, D)",
                     axes=("batch", "head", "position", "feature"),
                     mistakes=[
                         (x.reshape(B, H, T, D),  # (B, H, T, D), heads mixed with positions
                          "this is x reshaped straight from (B, T, C) to (B, H, T, D): the shape "
                          "is right, but a head now holds pieces of several positions. Reshape "
                          "to (B, T, H, D) first, then transpose(1, 2)"),
                         (x.reshape(B, T, D, H).permute(0, 3, 1, 2),  # (B, H, T, D), strided
                          "head h got every H-th channel (h, h + H, …); it must own the D "
                          "consecutive channels h·D … h·D + D − 1: reshape to (B, T, H, D), not "
                          "(B, T, D, H)"),
                     ],
                     shape_hints={(B, T, H, D): "these are the heads before the transpose: move "
                                                "the heads in front of the positions with "
                                                ".transpose(1, 2)"})
        return run

    def not_divisible() -> None:
        x = torch.randn(2, 5, 10, generator=g)  # (B, T, C) with C = 10
        _expect_value_error(split_heads, [x, 3], "C = 10 cannot be split into 3 heads",
                            must_name=["10", "3"])

    return _run("split_heads", split_heads, [
        ("x (2, 5, 12) into 3 heads of width 4", case((2, 5, 12), 3)),
        ("x (1, 4, 8) into 2 heads of width 4", case((1, 4, 8), 2)),
        ("one head: x (2, 3, 6)", case((2, 3, 6), 1)),
        ("C = 10 and n_heads = 3 raise a ValueError", not_divisible),
    ])


def check_merge_heads(merge_heads: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``merge_heads(x)``, ``(B, H, T, D) -> (B, T, H·D)``, the inverse of
    ``split_heads``: ``merge_heads(split_heads(x, H)) == x``, non-contiguous inputs (the
    output of a transpose, as attention produces them) included."""
    g = _generator()

    def case(x: Tensor) -> Callable[[], None]:
        def run() -> None:
            got = _call(merge_heads, [x], ["x"])
            B, H, T, D = x.shape
            _compare(got, _merge_heads(x), "the output", letters="(B, T, H·D)",
                     axes=("batch", "position", "channel"),
                     mistakes=[
                         (x.reshape(B, T, H * D),  # (B, T, C), heads mixed with positions
                          "reshaping (B, H, T, D) straight to (B, T, C) mixes heads and "
                          "positions: transpose(1, 2) to (B, T, H, D) first, then reshape"),
                         (x.permute(0, 2, 3, 1).reshape(B, T, H * D),  # (B, T, C) via (B, T, D, H)
                          "the channels of each head must stay together: go through "
                          "(B, T, H, D), not (B, T, D, H)"),
                     ],
                     shape_hints={(B, T, H, D): "the heads are in place, now merge the last two "
                                                "axes: .reshape(B, T, H * D)"})
        return run

    y = torch.randn(1, 6, 8, generator=g)  # (B, T, C)
    return _run("merge_heads", merge_heads, [
        ("x (2, 3, 5, 4) to (2, 5, 12)", case(torch.randn(2, 3, 5, 4, generator=g))),
        ("a non-contiguous input, as split_heads returns it",
         case(_split_heads(y, 2))),  # (B, H, T, D), a transposed view
        ("one head: x (2, 1, 3, 6)", case(torch.randn(2, 1, 3, 6, generator=g))),
    ])
