"""Chapter 1's checkers (``transformer_lib/checks/ch01_attention.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch
from check_solutions.ch01 import attention, causal_mask, softmax, softmax_jacobian
from conftest import mistake_tests

from transformer_lib.checks import (
    ch01_attention,
    check_attention,
    check_causal_mask,
    check_masked_softmax,
    check_softmax,
    check_softmax_jacobian,
)


def _naive_jacobian(x):
    e = x.exp()
    p = e / e.sum()
    return torch.diag(p) - torch.outer(p, p)  # (n, n)


# Plausible wrong solutions of softmax and attention --------------------------------------------------------------------


def _scores(q, k, scale):
    return q @ k.transpose(-2, -1) / scale  # (B, H, T, S)


def _masked_softmax(scores, mask, fill=float("-inf")):
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    return torch.softmax(scores, dim=-1)


def attention_without_scale(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, 1.0), mask).nan_to_num()
    return w @ v, w


def attention_scaled_by_d(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1]), mask).nan_to_num()
    return w @ v, w


def attention_masked_after_softmax(q, k, v, mask=None):
    w = torch.softmax(_scores(q, k, q.shape[-1] ** 0.5), dim=-1)
    if mask is not None:
        w = w * mask
    return w @ v, w


def attention_inverted_mask(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), None if mask is None else ~mask)
    return w @ v, w


def attention_ignoring_mask(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), None)
    return w @ v, w


def attention_nan_without_visible_key(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), mask)  # no fix for all-blocked rows
    return w @ v, w


def attention_finite_fill(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), mask, fill=-1e9)
    return w @ v, w


def attention_unstable_softmax(q, k, v, mask=None):
    s = _scores(q, k, q.shape[-1] ** 0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = s.exp()
    w = (e / e.sum(dim=-1, keepdim=True))
    if mask is not None:
        w = w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return w @ v, w


def attention_reads_keys(q, k, v, mask=None):
    out, w = attention(q, k, v, mask)
    return w @ k, w


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(),
     ["1 of 3 checks passed", "wrong values in the mask", "shift the diagonal by S - T"]),
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T),
     ["upper-triangular"]),
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1),
     ["off by one", "the diagonal belongs"]),
    (check_causal_mask, lambda T, S: torch.ones(T, T, dtype=torch.bool).tril(),
     ["wrong shape for the mask: expected (T, S) = (3, 7), got (3, 3)", "not (T, T)"]),
    (check_causal_mask, lambda T, S: causal_mask(T, S).float(), ["should be boolean"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), -1),
     ["masked positions receive weight", "0 is just another score"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s, -1) * m,
     ["rows do not sum to 1", "zeroed after the softmax"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1),
     ["3 of 4 checks passed", "NaN appeared in the weights", "mask.any(dim=-1, keepdim=True)"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1),
     ["3 of 4 checks passed", "uniform average"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), -1),
     ["the mask inverted"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s, -1),
     ["masked positions receive weight", "a softmax without the mask"]),
    (check_softmax_jacobian, lambda x: torch.diag(torch.softmax(x, 0)),
     ["wrong values in the Jacobian", "subtract p pᵀ"]),
    (check_softmax_jacobian, lambda x: -softmax_jacobian(x), ["the sign is flipped"]),
    (check_softmax_jacobian, _naive_jacobian,
     ["large scores: x + 1000: NaN appeared", "subtracts the maximum"]),
    (check_softmax, lambda x, dim=-1: x.exp() / x.exp().sum(dim=dim, keepdim=True),
     ["large scores: x + 1000: NaN appeared", "subtract the maximum", "underflows to 0"]),
    (check_softmax, lambda x, dim=-1: softmax(x, -1),
     ["do not sum to 1", "normalise along the `dim` argument (here 0)"]),
    (check_softmax, lambda x, dim=-1: torch.softmax(x.flatten(), 0).view_as(x),
     ["normalised over the whole tensor"]),
    (check_softmax, lambda x, dim=-1: (x.exp() / x.exp().sum(dim=dim)),
     ["raised RuntimeError", "keepdim=True"]),
    (check_softmax, lambda x, dim=-1: softmax(x.sub_(x.amax(dim=dim, keepdim=True)), dim),
     ["changed its input `x` in place"]),
    (check_attention, attention_without_scale,
     ["wrong values in the weights", "not scaled: divide q·kᵀ by √D (√8 = 2.83)"]),
    (check_attention, attention_scaled_by_d, ["scores divided by D = 8"]),
    (check_attention, attention_masked_after_softmax,
     ["rows do not sum to 1", "zeroed after the softmax", "fill the blocked scores with -inf"]),
    (check_attention, attention_inverted_mask, ["NaN appeared", "the mask inverted"]),
    (check_attention, attention_ignoring_mask,
     ["masked positions receive weight", "a softmax without the mask"]),
    (check_attention, attention_nan_without_visible_key,
     ["4 of 5 checks passed", "NaN appeared in the weights at batch 0, head 0, query 1",
      "may attend to no key"]),
    (check_attention, attention_finite_fill,
     ["4 of 5 checks passed", "masked positions receive weight", "uniform average"]),
    (check_attention, attention_unstable_softmax,
     ["large scores (q and k times 8): NaN appeared", "exp overflows"]),
    (check_attention, attention_reads_keys, ["wrong values in the output", "not weights @ k"]),
    (check_attention, lambda q, k, v, mask=None: attention(q, k, v, mask)[0],
     ["return the pair (out, weights)"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch01_attention))
