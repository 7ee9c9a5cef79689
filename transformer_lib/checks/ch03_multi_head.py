"""Checkers for the exercises of chapter 3, multi-head attention
(``chapters/03_multi_head.ipynb``): the parameters of a multi-head layer, one head's slice of a
fused projection, multi-head attention from fused weights, ``repeat_kv`` for grouped-query
attention, and splitting and merging heads."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _expect_value_error,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._reference import _merge_heads, _split_heads

# Parameters of a multi-head layer ------------------------------------------------------------


def check_mha_param_count(mha_param_count: Callable[[int, int, bool], int]) -> CheckResult:
    """Check ``mha_param_count(d_model, n_heads, bias)`` against the number of parameters of
    ``MultiHeadAttention(d_model, n_heads, bias=bias)``."""

    def case(C: int, H: int, bias: bool) -> Callable[[], None]:
        def run() -> None:
            got = _call(mha_param_count, [C, H, bias], ["d_model", "n_heads", "bias"])
            with torch.random.fork_rng(devices=[]):  # the layer's init leaves no trace
                want = sum(p.numel() for p in MultiHeadAttention(C, H, bias=bias).parameters())
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
                raise _Failure(f"expected a whole number of parameters, got {_describe(got)}")
            if got == want:
                return
            D, b = C // H, 4 * C if bias else 0
            hints = {
                H * want: "the count grows with the heads, but the H heads are slices of the "
                          "same four C × C projections: it does not depend on n_heads",
                4 * C * D + b // H: "that is one head's share: all H heads together use the "
                                    "whole C × C matrices",
                3 * C * C + 3 * C * bias: "the output projection W_O counts too: four "
                                          "projections, not three",
                4 * C * C + 4 * C: "with bias=False the projections have no bias vectors",
                4 * C * C: "each projection also has a bias of C numbers when bias=True",
            }
            hints.pop(want, None)
            raise _Failure(f"expected {want} parameters, got {got:g}", hints.get(got))
        return run

    return _run("mha_param_count", mha_param_count, [
        ("d_model 64, 1 head, bias", case(64, 1, True)),
        ("d_model 64, 8 heads, bias", case(64, 8, True)),
        ("d_model 48, 6 heads, no bias", case(48, 6, False)),
    ])


# One head's slice of a fused projection ------------------------------------------------------


def check_head_weight(head_weight: Callable[[Tensor, int, int], Tensor]) -> CheckResult:
    """Check ``head_weight(weight, n_heads, h)``: the ``(D, C)`` block of a fused projection's
    weight ``(C, C)`` (``nn.Linear`` layout) that makes head ``h``'s queries, rows
    ``h·D … h·D + D − 1``."""
    g = _generator()

    def case(C: int, H: int, h: int) -> Callable[[], None]:
        w = torch.randn(C, C, generator=g)  # (C out, C in)

        def run() -> None:
            got = _call(head_weight, [w, H, h], ["weight", "n_heads", "h"])
            D = C // H
            rows = slice(h * D, (h + 1) * D)
            mistakes = [(w[:, rows].T, "nn.Linear stores its weight as (out_features, "
                                       "in_features): a head's outputs are *rows* of it"),
                        (w[h::H], "head h owns D consecutive rows h·D … h·D + D − 1, not "
                                  "every H-th row")]
            if h + 1 < H:
                mistakes.append((w[(h + 1) * D:(h + 2) * D], "heads are counted from 0: "
                                                             "head h starts at row h·D"))
            if h > 0:
                mistakes.append((w[(h - 1) * D:h * D], "heads are counted from 0: head h "
                                                       "starts at row h·D"))
            _compare(got, w[rows], "the head's weight", letters="(D, C)",
                     axes=("row", "column"), mistakes=mistakes,
                     shape_hints={(C, D): "nn.Linear stores its weight as (out_features, "
                                          "in_features): take rows, not columns"})
        return run

    return _run("head_weight", head_weight, [
        ("C = 12, 3 heads, head 1", case(12, 3, 1)),
        ("C = 8, 4 heads, head 3", case(8, 4, 3)),
        ("C = 8, 2 heads, head 0", case(8, 2, 0)),
    ])


# Multi-head attention from fused weights -----------------------------------------------------


def _multi_head(x: Tensor, ws: Sequence[Tensor], H: int, mask: Tensor | None, *,
                split_ok: bool = True, merge_ok: bool = True, scale_by_c: bool = False,
                transpose_w: bool = True) -> Tensor:
    """Multi-head attention without biases, or one of its usual mistakes."""
    B, T, C = x.shape
    D = C // H
    q, k, v = (x @ (w.T if transpose_w else w) for w in ws[:3])  # (B, T, C)

    def split(t: Tensor) -> Tensor:
        return _split_heads(t, H) if split_ok else t.reshape(B, H, T, D)  # (B, H, T, D)

    q, k, v = split(q), split(k), split(v)  # (B, H, T, D)
    if scale_by_c:
        q = q * math.sqrt(D / C)  # scores / √C instead of / √D
    out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, D)
    out = _merge_heads(out) if merge_ok else out.reshape(B, T, C)  # (B, T, C)
    return out @ (ws[3].T if transpose_w else ws[3])  # (B, T, C)


def check_multi_head(multi_head: Callable[..., Tensor]) -> CheckResult:
    """Check ``multi_head(x, w_q, w_k, w_v, w_o, n_heads, mask=None)``, self-attention with
    four fused ``(C, C)`` weights in ``nn.Linear`` layout and no biases, against
    :class:`transformer_lib.attention.MultiHeadAttention` with the same weights."""
    g = _generator()

    def case(B: int, T: int, C: int, H: int, mask: Tensor | None) -> Callable[[], None]:
        x = torch.randn(B, T, C, generator=g)  # (B, T, C)
        ws = [torch.randn(C, C, generator=g) / math.sqrt(C) for _ in range(4)]  # (C, C) each

        def run() -> None:
            got = _call(multi_head, [x, *ws, H, mask],
                        ["x", "w_q", "w_k", "w_v", "w_o", "n_heads", "mask"])
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                layer = MultiHeadAttention(C, H, bias=False)
                for proj, w in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj), ws):
                    proj.weight.copy_(w)
                want = layer(x, mask=mask)  # (B, T, C)
            _compare(got, want, "the output", letters="(B, T, C)",
                     axes=("batch", "position", "channel"), mistakes=[
                         (_multi_head(x, ws, H, mask, split_ok=False),
                          "the heads were split with a reshape straight to (B, H, T, D): "
                          "reshape to (B, T, H, D), then transpose(1, 2)"),
                         (_multi_head(x, ws, H, mask, merge_ok=False),
                          "the heads were merged without the transpose: transpose(1, 2) back "
                          "to (B, T, H, D), then reshape to (B, T, C)"),
                         (_multi_head(x, ws, H, mask, scale_by_c=True),
                          f"the scores were divided by √C: each head divides by its own width, "
                          f"√D = √{C // H}"),
                         (_multi_head(x, ws, H, mask, transpose_w=False),
                          "nn.Linear computes x Wᵀ: multiply by w.T (or use F.linear(x, w))"),
                     ])
        return run

    return _run("multi_head", multi_head, [
        ("x (2, 5, 12), 3 heads, no mask", case(2, 5, 12, 3, None)),
        ("x (1, 6, 8), 2 heads, causal mask", case(1, 6, 8, 2, causal_mask(6))),
        ("x (2, 4, 8), 4 heads of width 2", case(2, 4, 8, 4, None)),
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
