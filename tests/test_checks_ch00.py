"""The setup chapter's checkers (``transformer_lib/checks/ch00_setup.py``) name the usual
mistakes in words a student can act on. The contract every checker keeps (reference passes,
stubs, exceptions, NaN) is in ``test_checks_contract.py``."""
from __future__ import annotations

import torch
from check_solutions.ch00 import attention, softmax, split_heads
from conftest import mistake_tests

from transformer_lib.checks import (
    ch00_setup,
    check_attention,
    check_merge_heads,
    check_mha_shapes,
    check_repeat_kv,
    check_softmax,
    check_split_heads,
)

# Plausible wrong solutions --------------------------------------------------------------------


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
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, S, T), (H_kv * C // H, C)),
     ["wrong shape of last_weights", "one row per query and one column per key"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H_kv, T, S), (H_kv * C // H, C)),
     ["every query head has its own weights"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, T, S), (C, H_kv * C // H)),
     ["wrong shape of k_proj.weight", "(out_features, in_features)"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, T, S)),
     ["return three shapes, those of the output, of last_weights and of k_proj.weight"]),
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
    (check_repeat_kv, lambda x, n_rep: x.repeat(1, n_rep, 1, 1),
     ["output heads hold key/value heads [0, 1, 0, 1]; expected [0, 0, 1, 1]", "tiled"]),
    (check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=2),
     ["wrong shape", "you repeated the positions (dim 2)"]),
    (check_repeat_kv, lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1),
     ["wrong shape", "merge the two head axes"]),
    (check_split_heads, lambda x, n_heads: x.view(x.shape[0], n_heads, x.shape[1], -1),
     ["wrong values in the output", "reshaped straight from (B, T, C) to (B, H, T, D)",
      "then transpose(1, 2)", "instead of a ValueError"]),
    (check_split_heads, lambda x, n_heads: split_heads(x, n_heads).transpose(1, 2),
     ["wrong shape for the output: expected (B, H, T, D) = (2, 3, 5, 4), got (2, 5, 3, 4)",
      ".transpose(1, 2)"]),
    (check_split_heads,
     lambda x, n_heads: split_heads(x, x.shape[-1] // n_heads).permute(0, 3, 2, 1),
     ["every H-th channel"]),
    (check_split_heads, lambda x, n_heads: split_heads(x, n_heads) if x.shape[-1] % n_heads == 0
     else (_ for _ in ()).throw(ValueError("bad sizes")),
     ["3 of 4 checks passed", "does not give the sizes 10, 3"]),
    (check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1),
     ["wrong values in the output", "mixes heads and positions"]),
    (check_merge_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
     ["raised RuntimeError: view size is not compatible", "use .reshape"]),
    (check_merge_heads, lambda x: x.transpose(1, 2),
     ["wrong shape", "merge the last two axes"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch00_setup))
