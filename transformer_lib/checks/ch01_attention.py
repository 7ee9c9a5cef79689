"""Checkers for the exercises of chapter 1, attention (``chapters/01_attention.ipynb``): a
causal mask after a cached prefix, a masked softmax, the softmax's Jacobian, a softmax that does
not overflow and masked scaled dot-product attention."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.checks._harness import (
    ATT_AXES,
    CheckResult,
    Property,
    _call,
    _compare,
    _Failure,
    _first,
    _generator,
    _items,
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
