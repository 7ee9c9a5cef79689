"""Checkers for the exercises of chapter 1, attention (``chapters/01_attention.ipynb``): a
causal mask after a cached prefix, a masked softmax, and the softmax's Jacobian."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import causal_mask
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _Failure,
    _generator,
    _no_weight_on_blocked,
    _rows_sum_to_one,
    _run,
)
from transformer_lib.checks._reference import _mask_mistakes, _masked_softmax

# A causal mask with a cached prefix ----------------------------------------------------------


def check_causal_mask(causal_mask_fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check ``causal_mask(T, S)``, a boolean ``(T, S)`` mask (True = may attend) whose T
    queries are the last T of S positions, against :func:`transformer_lib.attention.causal_mask`."""

    def case(T: int, S: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(causal_mask_fn, [T, S], ["T", "S"])
            want = causal_mask(T, S)  # (T, S)
            if isinstance(got, Tensor) and got.dtype != torch.bool and got.shape == want.shape:
                raise _Failure(f"the mask should be boolean (True = may attend), got {got.dtype}",
                               "compare positions (cols <= rows) or call .bool()")
            ones = torch.ones(T, S, dtype=torch.bool)  # (T, S)
            _compare(got, want, "the mask", letters="(T, S)", axes=("query", "key"),
                     mistakes=[
                         (ones.tril(), "the queries are the *last* T of the S positions (a "
                                       "cached prefix of S - T comes first): shift the diagonal "
                                       "by S - T, e.g. .tril(diagonal=S - T)"),
                         (ones.triu(S - T), "this is upper-triangular: a query sees the keys "
                                            "*before* it (and itself), the lower triangle"),
                         (ones.tril(S - T - 1), "off by one: a query may attend to itself, so "
                                                "the diagonal belongs to the allowed keys (<=, "
                                                "not <)"),
                         (~want, "True means *may attend*: this mask is inverted"),
                     ],
                     shape_hints={(T, T): "one column per key, cached prefix included: "
                                          "(T, S), not (T, T)",
                                  (S, S): "one row per query: (T, S); only the last T "
                                          "positions ask"})
        return run

    return _run("causal_mask", causal_mask_fn, [
        ("T = S = 4: plain self-attention", case(4, 4)),
        ("T = 3 new queries after a prefix of 4 (S = 7)", case(3, 7)),
        ("one new query (T = 1, S = 5): decoding step", case(1, 5)),
    ])


# A masked softmax ----------------------------------------------------------------------------


def check_masked_softmax(masked_softmax: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check ``masked_softmax(scores, mask)``: a softmax over the last axis in which keys where
    ``mask`` is False get weight 0, visible weights sum to 1, and a row with no visible key
    gets zeros rather than NaN. ``mask`` broadcasts against ``scores``."""
    g = _generator()
    scores = 2 * torch.randn(4, 6, generator=g)  # (T, S)
    causal = causal_mask(4, 6)  # (T, S)
    s4 = 2 * torch.randn(2, 3, 4, 6, generator=g)  # (B, H, T, S)
    padding = torch.ones(2, 1, 1, 6, dtype=torch.bool)  # (B, 1, 1, S)
    padding[1, ..., 4:] = False
    empty = causal.clone()
    empty[2] = False  # query 2 sees nothing

    def case(s: Tensor, m: Tensor, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(masked_softmax, [s, m], ["scores", "mask"])
            _compare(got, _masked_softmax(s, m), "the weights", nan_hint=nan_hint,
                     properties=[_no_weight_on_blocked(m), _rows_sum_to_one(m)],
                     mistakes=_mask_mistakes(s, m))
        return run

    return _run("masked_softmax", masked_softmax, [
        ("scores (4, 6), causal mask with a prefix of 2", case(scores, causal)),
        ("scores (2, 3, 4, 6), padding mask (2, 1, 1, 6)", case(s4, padding)),
        ("large scores (times 500)", case(500 * scores, causal)),
        ("a row with no visible key gets zeros, not NaN",
         case(scores, empty, "row 2 has no visible key: its softmax is 0 / 0 = NaN; give such "
                             "rows zero weights with mask.any(dim=-1, keepdim=True)")),
    ])


# The softmax's Jacobian ----------------------------------------------------------------------


def check_softmax_jacobian(softmax_jacobian: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``softmax_jacobian(x)`` for a vector ``x (n,)``: the ``(n, n)`` matrix
    ``J[i, j] = ∂ softmax(x)_i / ∂ x_j = p_i (δ_ij − p_j)``, against autograd."""
    g = _generator()

    def case(x: Tensor, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(softmax_jacobian, [x], ["x"])
            want = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, 0), x)  # (n, n)
            p = torch.softmax(x, 0)  # (n,)
            _compare(got, want, "the Jacobian", letters="(n, n)", axes=("output", "input"),
                     nan_hint=nan_hint, mistakes=[
                         (torch.diag(p), "only diag(p): every output also depends on the other "
                                         "inputs through the sum, so subtract p pᵀ"),
                         (torch.diag(p * (1 - p)), "only the diagonal p_i (1 − p_i) is right: the "
                                                   "off-diagonal entries are −p_i p_j"),
                         (torch.outer(p, p) - torch.diag(p), "the sign is flipped: "
                                                             "J = diag(p) − p pᵀ"),
                     ])
        return run

    x = torch.randn(6, generator=g)
    return _run("softmax_jacobian", softmax_jacobian, [
        ("x = [2, 1, 0]", case(torch.tensor([2.0, 1.0, 0.0]))),
        ("random x of size 6", case(x)),
        ("saturated: x = [8, -8]", case(torch.tensor([8.0, -8.0]))),
        ("large scores: x + 1000", case(x + 1000, "exp(1000) overflows: compute p with a "
                                                  "softmax that subtracts the maximum")),
    ])
