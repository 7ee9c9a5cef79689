"""Checkers for the exercises of chapter 3, multi-head attention
(``chapters/03_multi_head.ipynb``): the parameters of a multi-head layer, one head's slice of a
fused projection, and multi-head attention from fused weights."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
)
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
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
