"""Checkers for the exercises of chapter 3, multi-head attention
(``chapters/03_multi_head.ipynb``): the memory of one attention layer, splitting a fused
GPT-2 style ``c_attn`` output into heads, and converting a fused weight from GPT-2's layout
to the per-head layout."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _expect_value_error,
    _Failure,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "attention_memory": Rules(),
    "split_qkv": Rules(),
    "to_per_head_layout": Rules(),
}


def _roles() -> tuple[str, str, str]:
    """The three blocks of a fused projection, in order, in words."""
    return say("queries"), say("keys"), say("values")


# The memory of one attention layer ----------------------------------------------------------


def _memory_hints(B: int, T: int, C: int, H: int, H_kv: int, nbytes: int) -> dict[int, str]:
    """Wrong byte counts, each with its hint; where two coincide, the later one wins."""
    D = C // H
    weights, kv = B * H * T * T, 2 * B * H_kv * T * D  # numbers in each part
    return {
        nbytes * (B * H * T * T + 2 * B * H * T * D):
            say("keys and values are stored once per key/value head: H_kv · D channels "
                "each, not H · D (the query heads of a group share them)"),
        nbytes * (B * H_kv * T * T + kv):
            say("every query head has its own weights: H tables of T × T, not H_kv (keys "
                "and values are shared by a group of query heads, the weights are not)"),
        nbytes * (B * T * T + kv):
            say("there is one T × T table of weights per head: H of them per sequence"),
        nbytes * (weights + kv // 2):
            say("keys and values are two tensors, (B, H_kv, T, D) each: count both"),
        nbytes * weights:
            say("the keys and values count too: two tensors of shape (B, H_kv, T, D)"),
        nbytes * kv:
            say("the attention weights count too: (B, H, T, T) numbers"),
        weights + kv:
            say("that is a count of numbers: multiply by bytes_per_number to get bytes"),
    }


def check_attention_memory(attention_memory: Callable[..., int]) -> CheckResult:
    """Check ``attention_memory(batch, seq_len, d_model, n_heads, n_kv_heads,
    bytes_per_number)``: the bytes of the attention weights ``(B, H, T, T)`` plus the keys
    and values ``(B, H_kv, T, D)`` of one self-attention layer.

    Args:
        attention_memory: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(B: int, T: int, C: int, H: int, H_kv: int, nbytes: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(attention_memory, [B, T, C, H, H_kv, nbytes],
                        ["batch", "seq_len", "d_model", "n_heads", "n_kv_heads",
                         "bytes_per_number"])
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
                raise _Failure(say("expected a whole number of bytes, got {got}",
                                   got=_describe(got)))
            D = C // H
            want = nbytes * (B * H * T * T + 2 * B * H_kv * T * D)
            if got == want:
                return
            hints = _memory_hints(B, T, C, H, H_kv, nbytes)
            hints.pop(want, None)
            raise _Failure(say("expected {want:,} bytes, got {got:,.0f}", want=want, got=got),
                           hints.get(got))
        return run

    return _run("attention_memory", attention_memory, [
        (say("batch 2, 16 tokens, C = 64, 8 heads, 2 key/value heads, fp32"),
         case(2, 16, 64, 8, 2, 4)),
        (say("batch 1, 128 tokens, C = 512, 8 heads, 8 key/value heads, bf16"),
         case(1, 128, 512, 8, 8, 2)),
        (say("batch 3, 10 tokens, C = 48, 6 heads, 1 key/value head, fp32"),
         case(3, 10, 48, 6, 1, 4)),
    ], rules=RULES["attention_memory"])


# Splitting a fused q, k, v output into heads --------------------------------------------------


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """The reference: ``(B, T, C) -> (B, H, T, D)``, head h owning channels h·D … h·D + D − 1,
    the layout of :class:`transformer_lib.attention.MultiHeadAttention`."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)


def _split_qkv(qkv: Tensor, H: int) -> tuple[Tensor, Tensor, Tensor]:
    """The reference: GPT-2's ``c_attn`` output ``(B, T, 3C)`` = [queries | keys | values],
    each split into heads ``(B, H, T, D)``."""
    C = qkv.shape[-1] // 3
    return tuple(_split_heads(t, H) for t in qkv.split(C, dim=-1))  # 3 x (B, H, T, D)


def _split_qkv_mistakes(qkv: Tensor, H: int) -> list[tuple[tuple[Tensor, ...], str]]:
    """The triples that the usual mistakes give, each with its hint."""
    B, T, three_c = qkv.shape
    C, D = three_c // 3, three_c // (3 * H)
    blocks = qkv.split(C, dim=-1)  # 3 x (B, T, C)
    per_head = qkv.view(B, T, H, 3 * D).transpose(1, 2).split(D, dim=-1)  # 3 x (B, H, T, D)
    by_channel = qkv.view(B, T, C, 3).unbind(dim=-1)  # 3 x (B, T, C), every third channel
    return [
        (per_head, say("this reads the output in the per-head layout, view(B, T, H, 3·D) "
                       "with q, k, v side by side inside each head. GPT-2's c_attn puts all C "
                       "queries first, then all keys, then all values: cut the last axis into "
                       "three blocks of C, then split each block into heads")),
        (tuple(b.reshape(B, H, T, D) for b in blocks),
         say("each block was reshaped straight from (B, T, C) to (B, H, T, D): the shape is "
             "right, but a head now holds pieces of several positions. Reshape to "
             "(B, T, H, D), then transpose(1, 2)")),
        (tuple(_split_heads(b, H) for b in by_channel),
         say("q, k and v were taken channel by channel (every third channel): in c_attn's "
             "output they are three consecutive blocks of C channels")),
        (tuple(b.reshape(B, T, D, H).permute(0, 3, 1, 2) for b in blocks),
         say("head h got every H-th channel of its block; it owns the D consecutive channels "
             "h·D … h·D + D − 1: reshape to (B, T, H, D), not (B, T, D, H)")),
    ]


def check_split_qkv(split_qkv: Callable[[Tensor, int], tuple]) -> CheckResult:
    """Check ``split_qkv(qkv, n_heads) -> (q, k, v)``: ``qkv`` ``(B, T, 3C)`` is the output of
    a fused GPT-2 style projection (all C query channels, then the keys, then the values);
    each of q, k, v comes back ``(B, H, T, D)``, head h owning channels h·D … h·D + D − 1 of
    its block. A last axis that ``3 · n_heads`` does not divide raises a ValueError naming
    its size and ``n_heads``.

    Args:
        split_qkv: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(shape: tuple[int, int, int], H: int) -> Callable[[], None]:
        qkv = torch.randn(*shape, generator=g)  # (B, T, 3C)

        def run() -> None:
            got = _call(split_qkv, [qkv, H], ["qkv", "n_heads"])
            got = _items(got, 3, say("the triple (q, k, v)"))
            B, T, three_c = shape
            C, D = three_c // 3, three_c // (3 * H)
            want = _split_qkv(qkv, H)
            wrong = _split_qkv_mistakes(qkv, H)
            roles = _roles()
            for i, (role, mine, expected) in enumerate(zip("qkv", got, want)):
                # The right heads of another block: q, k and v in the wrong order.
                order = [(other, say("{role} holds the {block}: c_attn's output is queries, "
                                     "then keys, then values, C channels each", role=role,
                                     block=roles[j]))
                         for j, other in enumerate(want) if j != i]
                _compare(mine, expected, role, letters=say("(B, H, T, D)"),
                         axes=(say("batch"), say("head"), say("position"), say("feature")),
                         mistakes=[(w[i], hint) for w, hint in wrong] + order,
                         shape_hints={  # later entries win where two shapes coincide
                             (B, T, C): say("split the block into heads too: (B, H, T, D)"),
                             (B, H, T, 3 * D): say("each head's 3·D channels still hold q, k "
                                                   "and v together: split the last axis"),
                             (B, T, H, D): say("these are the heads before the transpose: move "
                                               "the heads in front of the positions with "
                                               ".transpose(1, 2)"),
                         })
        return run

    def not_divisible() -> None:
        qkv = torch.randn(2, 5, 30, generator=g)  # 3C = 30: C = 10 is not 4 heads
        _expect_value_error(split_qkv, [qkv, 4], say("a last axis of 30 = 3 × 10 cannot be "
                                                     "split into 4 heads"),
                            must_name=["30", "4"])

    return _run("split_qkv", split_qkv, [
        (say("qkv (2, 5, 36): C = 12 in 3 heads of width 4"), case((2, 5, 36), 3)),
        (say("qkv (1, 4, 24): C = 8 in 2 heads of width 4"), case((1, 4, 24), 2)),
        (say("qkv (2, 3, 24): C = 8 in 4 heads of width 2"), case((2, 3, 24), 4)),
        (say("qkv (2, 5, 30) and 4 heads raise a ValueError"), not_divisible),
    ], rules=RULES["split_qkv"])


# Converting a fused weight between the two layouts ------------------------------------------


def _to_per_head(t: Tensor, H: int) -> Tensor:
    """The reference: the rows of a fused ``(3C, ...)`` tensor in GPT-2's order (all
    queries, keys, values) reordered head by head (head 0's q, k, v, then head 1's, …)."""
    D = t.shape[0] // (3 * H)
    return t.reshape(3, H, D, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _block_order(source: Tensor, H: int) -> Callable[[Tensor], str | None]:
    """A property: the output's blocks of D rows are the source's (role, head) blocks in the
    per-head order, head 0's queries, keys, values, then head 1's, and so on."""
    D = source.shape[0] // (3 * H)
    blocks = source.double().reshape(3, H, D, -1)  # (role, head, D, rest)

    def name(role: int, head: int) -> str:
        return say("the {block} of head {head}", block=_roles()[role], head=head)

    def prop(out: Tensor) -> str | None:
        got = out.reshape(H, 3, D, -1)  # (head, role, D, rest) if the layout is right
        for head in range(H):
            for role in range(3):
                piece = got[head, role]
                if torch.allclose(piece, blocks[role, head]):
                    continue
                rows = say("rows {first}–{last}", first=(3 * head + role) * D,
                           last=(3 * head + role + 1) * D - 1)
                held = [(r, h) for r in range(3) for h in range(H)
                        if torch.allclose(piece, blocks[r, h])]
                if not held:
                    return say("{rows} are not one block of D = {D} rows of the input: the "
                               "per-head layout puts {block} there", rows=rows, D=D,
                               block=name(role, head))
                return say("{rows} hold {held}; the per-head layout puts {block} there (head "
                           "0's queries, keys, values, then head 1's, …)", rows=rows,
                           held=name(*held[0]), block=name(role, head))
        return None
    return prop


def check_to_per_head_layout(to_per_head_layout: Callable[[Tensor, int], Tensor]
                             ) -> CheckResult:
    """Check ``to_per_head_layout(t, n_heads)``: ``t`` ``(3C, ...)``, a fused q, k, v weight
    ``(3C, C)`` or bias ``(3C,)`` in ``nn.Linear`` layout and GPT-2's row order (all
    queries, then keys, then values), comes back with the same shape and its rows in the
    per-head order that ``qkv.view(B, T, H, 3·D)`` reads: head 0's queries, keys and values,
    then head 1's, and so on.

    Args:
        to_per_head_layout: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(shape: tuple[int, ...], H: int) -> Callable[[], None]:
        t = torch.randn(*shape, generator=g)  # (3C, C) or (3C,)

        def run() -> None:
            got = _call(to_per_head_layout, [t, H], ["t", "n_heads"])
            three_c, rest = shape[0], tuple(shape[1:])
            C, D = three_c // 3, three_c // (3 * H)
            axes = (say("row"), say("column"))[:len(shape)]
            letters = say("(3C, C)") if len(shape) == 2 else "(3C,)"
            _compare(got, _to_per_head(t, H), say("the output"), letters=letters,
                     axes=axes, properties=[_block_order(t, H)],
                     mistakes=[
                         (t, say("the rows are still in GPT-2's order: a layer that reads "
                                 "view(B, T, H, 3·D) would take head 0's 'keys' and 'values' "
                                 "from the queries of other heads, and attention would run "
                                 "without an error on the wrong numbers")),
                         (t.reshape(H, 3, D, *rest).transpose(0, 1).reshape(shape),
                          say("that is the conversion the other way, from the per-head "
                              "layout to GPT-2's: the input is in GPT-2's order (role first, "
                              "then head)")),
                         (t.reshape(3, C, *rest).transpose(0, 1).reshape(shape),
                          say("q, k and v were interleaved row by row: each head's D rows of "
                              "queries (and of keys, of values) must stay together")),
                     ],
                     shape_hints={
                         (H, 3, D, *rest): say("the rows are in the right order: reshape back "
                                               "to the input's shape"),
                         (3, H, D, *rest): say("reshape back to the input's shape, with the "
                                               "head axis before the role axis"),
                     })
        return run

    return _run("to_per_head_layout", to_per_head_layout, [
        (say("weight (24, 8): C = 8 in 2 heads of width 4"), case((24, 8), 2)),
        (say("bias (36,): C = 12 in 4 heads of width 3"), case((36,), 4)),
        (say("weight (36, 12): C = 12 in 2 heads of width 6"), case((36, 12), 2)),
        (say("weight (48, 16): C = 16 in 4 heads of width 4"), case((48, 16), 4)),
    ], rules=RULES["to_per_head_layout"])
