"""Chapter 3's checkers (``transformer_lib/checks/ch03_multi_head.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import math

import torch
from check_solutions.ch03 import head_weight, mha_param_count, split_heads
from conftest import mistake_tests

from transformer_lib.checks import (
    ch03_multi_head,
    check_head_weight,
    check_merge_heads,
    check_mha_param_count,
    check_multi_head,
    check_repeat_kv,
    check_split_heads,
)


def multi_head_wrong(*, split_ok=True, merge_ok=True, scale_by_c=False, transpose_w=True):
    """Multi-head attention from fused weights with one of the usual mistakes."""

    def multi_head(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
        B, T, C = x.shape
        D = C // n_heads

        def proj(t, w):
            return t @ (w.T if transpose_w else w)  # (B, T, C)

        def split(t):
            if split_ok:
                return t.view(B, T, n_heads, D).transpose(1, 2)  # (B, H, T, D)
            return t.view(B, n_heads, T, D)  # (B, H, T, D), heads mixed with positions

        q, k, v = split(proj(x, w_q)), split(proj(x, w_k)), split(proj(x, w_v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C if scale_by_c else D)  # (B, H, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, C) if merge_ok else out.reshape(B, T, C)
        return proj(out, w_o)  # (B, T, C)

    return multi_head


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_mha_param_count, lambda C, H, bias=True: H * mha_param_count(C, H, bias),
     ["1 of 3 checks passed", "expected 16640 parameters, got 133120", "does not depend on "
      "n_heads"]),
    (check_mha_param_count, lambda C, H, bias=True: 3 * C * C + 3 * C,
     ["the output projection W_O counts too"]),
    (check_mha_param_count, lambda C, H, bias=True: 4 * C * C + 4 * C,
     ["2 of 3 checks passed", "with bias=False the projections have no bias vectors"]),
    (check_mha_param_count, lambda C, H, bias=True: "16640",
     ["expected a whole number of parameters"]),
    (check_head_weight, lambda w, H, h: w[:, h * (w.shape[0] // H):(h + 1) * (w.shape[0] // H)],
     ["wrong shape for the head's weight", "take rows, not columns"]),
    (check_head_weight, lambda w, H, h: w[h::H], ["not every H-th row"]),
    (check_head_weight, lambda w, H, h: head_weight(w, H, h - 1) if h else head_weight(w, H, 1),
     ["heads are counted from 0"]),
    (check_multi_head, multi_head_wrong(split_ok=False),
     ["wrong values in the output", "reshape straight to (B, H, T, D)"]),
    (check_multi_head, multi_head_wrong(merge_ok=False), ["merged without the transpose"]),
    (check_multi_head, multi_head_wrong(scale_by_c=True), ["divided by √C", "√D = √4"]),
    (check_multi_head, multi_head_wrong(transpose_w=False), ["nn.Linear computes x Wᵀ"]),
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
    mistake_tests(WRONG, ch03_multi_head))
