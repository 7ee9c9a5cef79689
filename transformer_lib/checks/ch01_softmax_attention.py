"""Checkers for the core of chapter 1 (``chapters/01_attention.ipynb``), written by the
learner where the chapter builds it: the masked softmax, and scaled dot-product attention on
top of it.

The references here are written out independently of the library: the softmax as
``exp(z - max) / sum`` in float64, blocked entries dropped from both, PyTorch's
``F.scaled_dot_product_attention`` as a second opinion in the tests."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

# The framework's softmax, reached in any of its spellings.
_SOFTMAXES = ("torch.softmax", "torch.Tensor.softmax", "torch.nn.functional.softmax",
              "torch.log_softmax", "torch.Tensor.log_softmax",
              "torch.nn.functional.log_softmax", "torch.special.softmax", "torch.nn.Softmax")

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "masked_softmax": Rules(refuse=_SOFTMAXES),
    "attention": Rules(refuse=(*_SOFTMAXES, "torch.nn.functional.scaled_dot_product_attention",
                               "torch.nn.MultiheadAttention")),
}


# The masked softmax -----------------------------------------------------------------------------


def _softmax(scores: Tensor, mask: Tensor | None, *, fill: float = -math.inf,
             after: bool = False, dim: int = -1) -> Tensor:
    """The reference (the defaults), computed in float64, and the mistakes: blocked scores
    set to ``fill`` instead of -inf, the weights zeroed ``after`` the softmax without
    renormalising, the softmax over another axis ``dim``."""
    z = scores.double()
    allowed = torch.ones_like(z, dtype=torch.bool) if mask is None else mask.expand(z.shape)
    if not after:
        z = z.masked_fill(~allowed, fill)
    m = z.amax(dim=dim, keepdim=True)
    e = (z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))).exp()
    total = e.sum(dim=dim, keepdim=True)
    weights = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)
    if after:
        weights = weights * allowed
    return weights.to(scores.dtype)


def _rows_sum_to_one(mask: Tensor | None) -> Callable[[Tensor], str | None]:
    def check(got: Tensor) -> str | None:
        sums = got.sum(dim=-1)
        visible = torch.ones_like(sums, dtype=torch.bool) if mask is None else (
            mask.expand(got.shape).any(dim=-1))
        bad = visible & ((sums - 1).abs() > 1e-3)
        if bad.any():
            index = tuple(int(i) for i in bad.nonzero()[0])
            return say("row {index} of the weights sums to {total:.4g}, not 1: a softmax "
                       "divides by the sum of its own row", index=index,
                       total=sums[index].item())
        return None
    return check


def check_masked_softmax(masked_softmax: Callable[..., Tensor]) -> CheckResult:
    """Check ``masked_softmax(scores, mask=None)``: the softmax over the last axis of
    ``scores`` ``(..., S)``; where the boolean ``mask`` (broadcastable, True = may attend) is
    False the weight is exactly 0, a row with no allowed entry is all 0 (not NaN), large
    scores do not overflow, and the result has the dtype of ``scores``.

    Args:
        masked_softmax: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(scores: Tensor, mask: Tensor | None) -> Callable[[], None]:
        def run() -> None:
            args = [scores] if mask is None else [scores, mask]
            names = ["scores"] if mask is None else ["scores", "mask"]
            got = _call(masked_softmax, args, names)
            want = _softmax(scores, mask)
            mistakes = [
                (_softmax(scores, mask, fill=0.0),
                 say("a blocked score set to 0 is still a score: exp(0) = 1 gives the blocked "
                     "key a share; set it to -inf before the softmax")),
                (_softmax(scores, mask, after=True),
                 say("zeroing the blocked weights after the softmax leaves each row summing to "
                     "less than 1: block the scores (-inf) before it, or divide by the new sum")),
                (_softmax(scores, mask, dim=-2) if scores.dim() >= 2 else scores,
                 say("the softmax ran over the wrong axis: each query's weights are a row, the "
                     "last axis")),
            ]
            atol = 1e-3 if scores.dtype in (torch.float16, torch.bfloat16) else 1e-6
            _compare(got, want, say("the weights"), letters=say("(..., S)"), atol=atol,
                     rtol=atol, mistakes=mistakes, properties=[_rows_sum_to_one(mask)],
                     nan_hint=say("NaN comes from exp(large) overflowing (subtract each row's "
                                  "maximum first) or from a row whose entries are all blocked "
                                  "(0 / 0: give such a row zeros)"))
        return run

    scores = torch.randn(2, 3, 4, 6, generator=g)  # (B, H, T, S)
    padding = torch.rand(2, 1, 1, 6, generator=g) > 0.3  # (B, 1, 1, S) keys of each sequence
    padding[..., 0] = True
    blocked_rows = torch.rand(4, 6, generator=g) > 0.5  # (T, S)
    blocked_rows[1] = False  # a query that sees no key
    big = 1000.0 * torch.randn(3, 5, generator=g)
    return _run("masked_softmax", masked_softmax, [
        (say("no mask: (B, H, T, S) = (2, 3, 4, 6)"), case(scores, None)),
        (say("a padding mask (B, 1, 1, S) broadcast over heads and queries"),
         case(scores, padding)),
        (say("a query whose keys are all blocked gets zeros, not NaN"),
         case(torch.randn(4, 6, generator=g), blocked_rows)),
        (say("scores in the thousands: no overflow"), case(big, None)),
        (say("bfloat16 scores: the weights stay bfloat16"),
         case(torch.randn(3, 8, generator=g).bfloat16(), torch.rand(3, 8, generator=g) > 0.2)),
    ], rules=RULES["masked_softmax"])


# Scaled dot-product attention -------------------------------------------------------------------


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *,
               scale: float | None = None, dim: int = -1, mask_after: bool = False,
               transpose_v: bool = False) -> tuple[Tensor, Tensor]:
    """The reference (the defaults), in float64, and the mistakes (the others)."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q64 @ k64.transpose(-2, -1)) * scale  # (..., T, S)
    if mask_after:
        weights = _softmax(scores, None) * (mask if mask is not None else 1)
    elif dim == -1:
        weights = _softmax(scores, mask)
    else:
        weights = _softmax(scores, mask, dim=dim)
    out = weights @ v64  # (..., T, Dv)
    return out.to(q.dtype), weights.to(q.dtype)


def check_attention(attention: Callable[..., tuple]) -> CheckResult:
    """Check ``attention(q, k, v, mask=None) -> (out, weights)``: scaled dot-product attention
    for q ``(..., T, D)``, k ``(..., S, D)``, v ``(..., S, Dv)`` and an optional boolean mask
    broadcastable to ``(..., T, S)`` (True = may attend). ``weights`` ``(..., T, S)`` is the
    masked softmax of ``q kᵀ / √D`` (a query that sees no key gets zeros) and ``out``
    ``(..., T, Dv)`` is ``weights @ v``.

    Args:
        attention: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(lead: tuple[int, ...], T: int, S: int, D: int, Dv: int,
             mask: Tensor | None = None) -> Callable[[], None]:
        q = torch.randn(*lead, T, D, generator=g)
        k = torch.randn(*lead, S, D, generator=g)
        v = torch.randn(*lead, S, Dv, generator=g)

        def run() -> None:
            args = [q, k, v] if mask is None else [q, k, v, mask]
            names = ["q", "k", "v", "mask"][:len(args)]
            out, weights = _items(_call(attention, args, names), 2,
                                  say("the pair (out, weights)"))
            want_out, want_weights = _attention(q, k, v, mask)
            wrong = {
                "√Dv": _attention(q, k, v, mask, scale=1 / math.sqrt(Dv)),
                "unscaled": _attention(q, k, v, mask, scale=1.0),
                "√S": _attention(q, k, v, mask, scale=1 / math.sqrt(S)),
                "queries": _attention(q, k, v, mask, dim=-2),
                "after": _attention(q, k, v, mask, mask_after=True),
            }
            hints = {
                "√Dv": say("the scale is 1/√D with D = {D}, the width of q and k, not of v "
                           "(Dv = {Dv})", D=D, Dv=Dv),
                "unscaled": say("divide the scores by √D = √{D} before the softmax", D=D),
                "√S": say("the scale is 1/√D, the width of q and k ({D}), not the number of "
                          "keys", D=D),
                "queries": say("the softmax ran over the queries: each query's weights over "
                               "the keys (the last axis) must sum to 1"),
                "after": say("the mask was applied after the softmax: block the scores with "
                             "-inf first, so that the allowed weights still sum to 1"),
            }
            _compare(weights, want_weights, say("the weights"), letters=say("(..., T, S)"),
                     mistakes=[(wrong[key][1], hints[key]) for key in wrong if
                               key != "√Dv" or Dv != D],
                     shape_hints={(*lead, S, T): say("the weights are (..., T, S): q @ kᵀ, one "
                                                     "row per query")})
            _compare(out, want_out, "out", letters=say("(..., T, Dv)"),
                     mistakes=[(wrong[key][0], hints[key]) for key in wrong if
                               key != "√Dv" or Dv != D],
                     shape_hints={(*lead, T, D): say("out takes its width from v (Dv = {Dv}), "
                                                     "not from q (D = {D})", Dv=Dv, D=D)})
        return run

    padded = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    padded[1, ..., 5:] = False  # the second sequence's last two keys are padding
    blind = torch.ones(5, 5, dtype=torch.bool).tril()
    blind[2] = False  # query 2 sees no key
    return _run("attention", attention, [
        (say("(T, D) = (3, 4), (S, Dv) = (5, 6), no mask"), case((), 3, 5, 4, 6)),
        (say("(B, H, T, D) = (2, 4, 7, 8) with a padding mask"),
         case((2, 4), 7, 7, 8, 8, padded)),
        (say("a causal mask where query 2 sees no key: its output is 0"),
         case((3,), 5, 5, 16, 5, blind)),
        (say("one query against 9 keys, D = 64"), case((1,), 1, 9, 64, 3)),
    ], rules=RULES["attention"])
