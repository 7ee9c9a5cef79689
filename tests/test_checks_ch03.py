"""Chapter 3's checkers (``transformer_lib/checks/ch03_multi_head.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.checks import (
    ch03_multi_head,
    check_attention_memory,
    check_split_qkv,
    check_to_per_head_layout,
)

from chapter_solutions import references
from conftest import mistake_tests, randomize_

split_qkv, to_per_head_layout = references("03_multi_head", "split_qkv", "to_per_head_layout")


def memory_wrong(*, weight_heads="H", kv_heads="H_kv", kv_tensors=2, bytes_too=True):
    """attention_memory with one of the usual mistakes."""

    def attention_memory(B, T, C, H, H_kv, nbytes):
        heads = {"H": H, "H_kv": H_kv, "1": 1}
        D = C // H
        numbers = (B * heads[weight_heads] * T * T
                   + kv_tensors * B * heads[kv_heads] * T * D)
        return numbers * (nbytes if bytes_too else 1)

    return attention_memory


def split_qkv_per_head(qkv, n_heads):
    """The per-head layout read from GPT-2's output: view(B, T, H, 3·D), then split."""
    B, T, three_c = qkv.shape
    return qkv.view(B, T, n_heads, three_c // n_heads).transpose(1, 2).chunk(3, dim=-1)


def split_qkv_reshape_straight(qkv, n_heads):
    B, T, three_c = qkv.shape
    return tuple(t.reshape(B, n_heads, T, -1) for t in qkv.split(three_c // 3, dim=-1))


def split_qkv_checked_silently(qkv, n_heads):
    if qkv.shape[-1] % (3 * n_heads):
        raise ValueError("bad sizes")
    return split_qkv(qkv, n_heads)


def per_head_two_dims_only(t, n_heads):
    """Right for a weight (3C, C), but a bias (3C,) has no second axis."""
    D = t.shape[0] // (3 * n_heads)
    return t.reshape(3, n_heads, D, t.shape[1]).transpose(0, 1).reshape(t.shape)


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_attention_memory, memory_wrong(weight_heads="H_kv"),
     ["1 of 3 checks passed", "expected 20,480 bytes, got 8,192",
      "every query head has its own weights"]),
    (check_attention_memory, memory_wrong(kv_heads="H"),
     ["1 of 3 checks passed", "once per key/value head"]),
    (check_attention_memory, memory_wrong(kv_tensors=1), ["count both"]),
    (check_attention_memory, memory_wrong(weight_heads="1"), ["one T × T table of weights"]),
    (check_attention_memory, memory_wrong(bytes_too=False),
     ["0 of 3 checks passed", "multiply by bytes_per_number"]),
    (check_attention_memory, lambda *args: "20480", ["expected a whole number of bytes"]),
    (check_split_qkv, split_qkv_per_head,
     ["wrong values in q", "per-head layout", "three blocks of C",
      "instead of a ValueError"]),
    (check_split_qkv, split_qkv_reshape_straight,
     ["reshaped straight from (B, T, C) to (B, H, T, D)"]),
    (check_split_qkv, lambda qkv, H: tuple(t.transpose(1, 2) for t in split_qkv(qkv, H)),
     ["wrong shape for q: expected (B, H, T, D) = (2, 3, 5, 4), got (2, 5, 3, 4)",
      ".transpose(1, 2)"]),
    (check_split_qkv, lambda qkv, H: (lambda q, k, v: (q, v, k))(*split_qkv(qkv, H)),
     ["wrong values in k", "k holds the values"]),
    (check_split_qkv, lambda qkv, H: split_qkv(qkv, H)[:2], ["return the triple (q, k, v)"]),
    (check_split_qkv, split_qkv_checked_silently,
     ["3 of 4 checks passed", "does not give the sizes 30, 4"]),
    (check_to_per_head_layout, lambda t, H: t.clone(),
     ["rows 4–7 hold the queries of head 1; the per-head layout puts the keys of head 0 there",
      "still in GPT-2's order"]),
    (check_to_per_head_layout,
     lambda t, H: t.reshape(H, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape),
     ["the conversion the other way"]),
    (check_to_per_head_layout,
     lambda t, H: t.reshape(3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape),
     ["are not one block of D = 4 rows", "interleaved row by row"]),
    (check_to_per_head_layout,
     lambda t, H: to_per_head_layout(t, H).reshape(H, 3, -1, *t.shape[1:]),
     ["wrong shape for the output", "reshape back to the input's shape"]),
    (check_to_per_head_layout, per_head_two_dims_only, ["3 of 4 checks passed", "raised"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch03_multi_head))


@torch.no_grad()
def test_reference_heads_follow_multi_head_attention():
    """The head layout the checkers expect (``_split_heads``, used by check_split_qkv) is the
    one MultiHeadAttention uses: with identity projections, the layer is
    merge(sdpa(split(x)))."""
    B, T, C, H = 2, 5, 12, 3
    mha = randomize_(MultiHeadAttention(C, H))
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj):
        proj.weight.copy_(torch.eye(C))
        proj.bias.zero_()
    x = torch.randn(B, T, C)
    heads = ch03_multi_head._split_heads(x, H)  # (B, H, T, D)
    out, _ = scaled_dot_product_attention(heads, heads, heads)
    merged = out.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
    torch.testing.assert_close(mha(x), merged, atol=1e-6, rtol=1e-6)
    assert torch.equal(heads.transpose(1, 2).reshape(B, T, C), x)
