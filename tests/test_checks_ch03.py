"""Chapter 3's checkers (``transformer_lib/checks/ch03_multi_head.py`` and, for the layer the
learner writes, ``ch03_attention_layer.py``) name the usual mistakes in words a student can act
on. The contract every checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import torch
from torch import nn

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.checks import (
    ch03_attention_layer,
    ch03_multi_head,
    check_attention_memory,
    check_grouped_query_attention,
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


# Plausible wrong layers (the core exercise): the chapter's class with one thing changed -----------

(GroupedQueryAttention,) = references("03_multi_head", "GroupedQueryAttention")


def layer_wrong(*, kv="blocks", split="right", scale="head", mask_to="heads", merge="right"):
    """The chapter's layer whose forward makes one of the usual mistakes."""

    def forward(self, x, mask=None):
        B, T, C = x.shape
        H, H_kv, D = self.n_heads, self.n_kv_heads, self.head_dim
        n_rep = H // H_kv

        def heads(t, n):  # (B, T, n * D) -> n heads
            if split == "view":
                return t.view(B, n, T, D)  # the memory re-read: rows are not positions
            if split == "no transpose":
                return t.view(B, T, n, D)  # (B, T, n, D)
            return t.view(B, T, n, D).transpose(1, 2)  # (B, n, T, D)

        q = heads(self.q_proj(x), H)
        k, v = heads(self.k_proj(x), H_kv), heads(self.v_proj(x), H_kv)
        axis = 2 if split == "no transpose" else 1
        if mask_to == "groups":  # no copies: the query heads of a group side by side
            q = q.view(B, H_kv, n_rep, T, D)  # (B, H_kv, n_rep, T, D)
            k, v = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, T, D)
        elif kv == "tiled":
            sizes = [1, 1, 1, 1]
            sizes[axis] = n_rep
            k, v = k.repeat(*sizes), v.repeat(*sizes)  # kv 0, kv 1, kv 0, kv 1, ...
        else:
            k, v = k.repeat_interleave(n_rep, dim=axis), v.repeat_interleave(n_rep, dim=axis)
        factor = {"head": D ** -0.5, "none": 1.0, "model": C ** -0.5}[scale]
        scores = q @ k.transpose(-2, -1) * factor
        if mask is not None and mask_to != "nowhere":
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        if mask_to == "groups":
            out = out.reshape(B, H, T, D)
        if split == "no transpose" or merge == "no transpose":
            out = out.reshape(B, T, C)
        elif merge == "stacked":
            out = torch.stack(out.unbind(1), dim=-1).reshape(B, T, C)  # (B, T, D, H)
        else:
            out = out.transpose(1, 2).reshape(B, T, C)
        return self.o_proj(out)

    return type("GroupedQueryAttention", (GroupedQueryAttention,), {"forward": forward})


class FusedQKV(nn.Module):
    """One projection for queries, keys and values, as GPT-2 has: other keys."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        self.inner = GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias)
        kv = self.inner.k_proj.out_features
        self.qkv_proj = nn.Linear(d_model, d_model + 2 * kv, bias=bias)
        self.o_proj = self.inner.o_proj

    def forward(self, x, mask=None):
        return self.inner(x, mask)


class FullWidthKeys(GroupedQueryAttention):
    """k_proj and v_proj with C outputs whatever n_kv_heads is."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__(d_model, n_heads, None, bias)


class AlwaysBiased(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__(d_model, n_heads, n_kv_heads, True)


class CausalBuffer(GroupedQueryAttention):
    """nanoGPT's habit: the causal mask kept as a (saved) buffer."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__(d_model, n_heads, n_kv_heads, bias)
        self.register_buffer("bias", torch.ones(8, 8, dtype=torch.bool).tril())


class Unchecked(nn.Module):
    """The sizes never checked: 20 channels in 3 heads of 6, and so on."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        kv = n_kv_heads * self.head_dim
        self.q_proj, self.o_proj = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)
        self.k_proj, self.v_proj = nn.Linear(d_model, kv, bias), nn.Linear(d_model, kv, bias)

    forward = GroupedQueryAttention.forward


class InFloat32(GroupedQueryAttention):
    def forward(self, x, mask=None):
        return super().forward(x, mask).float()


CORE_WRONG = [
    (check_grouped_query_attention, layer_wrong(kv="tiled"),
     ["3 of 6 checks passed", "query head h must read key/value head h // 3",
      "yours reads head h % 2"]),
    (check_grouped_query_attention, layer_wrong(split="view"),
     ["cut with view(B, H, T, D) straight from (B, T, C)"]),
    (check_grouped_query_attention, layer_wrong(split="no transpose"),
     ["the heads were not moved in front of the positions"]),
    (check_grouped_query_attention, layer_wrong(scale="none"),
     ["divide the scores by √D = √4"]),
    (check_grouped_query_attention, layer_wrong(scale="model"),
     ["not 1/√C with the layer's width C = 16"]),
    (check_grouped_query_attention, layer_wrong(mask_to="groups"),
     ["4 of 6 checks passed", "sequence b's mask was applied to key/value group b"]),
    (check_grouped_query_attention, layer_wrong(mask_to="nowhere"),
     ["the mask was not applied"]),
    (check_grouped_query_attention, layer_wrong(merge="no transpose"),
     ["merged with reshape(B, T, C) straight from (B, H, T, D)"]),
    (check_grouped_query_attention, layer_wrong(merge="stacked"),
     ["the heads' channels are interleaved"]),
    (check_grouped_query_attention, FusedQKV,
     ["it lacks `q_proj.weight`, `q_proj.bias`, `k_proj.weight`",
      "it has `inner.q_proj.weight`", "`qkv_proj.weight`, `qkv_proj.bias`, which the library's",
      "name the four projections as the library does"]),
    (check_grouped_query_attention, FullWidthKeys,
     ["`k_proj.weight` has shape (16, 16); in the library's layer it is (4, 16)",
      "H_kv · D = 1 · 4 = 4 outputs"]),
    (check_grouped_query_attention, AlwaysBiased,
     ["5 of 6 checks passed", "it has `q_proj.bias`, `k_proj.bias`, `v_proj.bias`, "
      "`o_proj.bias`, which", "with bias=False the projections have no bias"]),
    (check_grouped_query_attention, CausalBuffer,
     ["it has `bias`, which the library's layer does not", "persistent=False"]),
    (check_grouped_query_attention, Unchecked,
     ["5 of 6 checks passed", "instead of raising a ValueError"]),
    (check_grouped_query_attention, InFloat32,
     ["wrong dtype for the output: expected torch.float64, got torch.float32"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch03_attention_layer))
