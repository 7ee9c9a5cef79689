"""The checker of chapter 9's last page (``transformer_lib/checks/ch09_long_context.py``) names
the usual mistakes of causal ring attention in words a student can act on. The contract every
checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import math

import torch

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.checks import ch09_long_context, check_ring_causal_attention

from chapter_solutions import references
from conftest import mistake_tests

(ring_causal_attention,) = references("09c_long_context", "ring_causal_attention")


def ring_with(*, mask="positions", merge="logsumexp", scale=True, order="positions",
              softmax_nan=False):
    """ring_causal_attention with one of the usual mistakes, written as a student would."""

    def ring(q, k, v, owner):
        T, D = q.shape
        n = int(owner.max()) + 1
        positions = [torch.nonzero(owner == d).flatten() for d in range(n)]
        outs = []
        for d in range(n):
            rows = positions[d]
            acc = torch.zeros(len(rows), v.shape[-1], dtype=q.dtype)
            lse = torch.full((len(rows),), -math.inf, dtype=q.dtype)
            for step in range(n):
                cols = positions[(d - step) % n]
                scores = q[rows] @ k[cols].T / (math.sqrt(D) if scale else 1.0)
                if mask == "positions":
                    visible = rows[:, None] >= cols[None, :]
                elif mask == "tile":
                    visible = torch.ones(len(rows), len(cols), dtype=torch.bool).tril()
                else:
                    visible = torch.ones(len(rows), len(cols), dtype=torch.bool)
                scores = scores.masked_fill(~visible, -math.inf)
                block_lse = scores.logsumexp(-1)
                if merge == "added":
                    acc = acc + torch.softmax(scores, -1).nan_to_num() @ v[cols]
                    continue
                both = torch.logaddexp(lse, block_lse)
                if softmax_nan:  # the block's softmax, then reweighted: NaN on hidden rows
                    block = torch.softmax(scores, -1) @ v[cols]
                    acc = ((lse - both).exp()[:, None] * acc
                           + (block_lse - both).exp()[:, None] * block)
                else:
                    acc = ((lse - both).exp()[:, None] * acc
                           + (scores - both[:, None]).exp() @ v[cols])
                lse = both
            outs.append(acc)
        if order == "devices":
            return torch.cat(outs)
        out = torch.empty(T, v.shape[-1], dtype=q.dtype)
        for rows, acc in zip(positions, outs):
            out[rows] = acc
        return out

    return ring


def whole_sequence(q, k, v, owner):
    """Right values, from the whole (T, T) score matrix at once: no device holds that."""
    T, D = q.shape
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax((q @ k.T / math.sqrt(D)).masked_fill(~visible, -math.inf), -1) @ v


WRONG = [
    (check_ring_causal_attention, ring_with(mask="none"),
     ["wrong values in out", "each query may see only the keys at or before its own position"]),
    (check_ring_causal_attention, ring_with(mask="tile"),
     ["not torch.tril of the tile"]),
    (check_ring_causal_attention, ring_with(merge="added"),
     ["normalised on its own and the blocks added"]),
    (check_ring_causal_attention, ring_with(scale=False), ["the scores are q · k / √D"]),
    (check_ring_causal_attention, ring_with(order="devices"),
     ["the rows came back in the order of the devices"]),
    (check_ring_causal_attention, ring_with(softmax_nan=True),
     ["NaN appeared in out", "its softmax over the block is NaN"]),
    (check_ring_causal_attention, whole_sequence,
     ["created a tensor of shape (16, 16), wider than one device's 4 positions"]),
    (check_ring_causal_attention,
     lambda q, k, v, owner: scaled_dot_product_attention(
         q, k, v, torch.ones(len(q), len(q), dtype=torch.bool).tril())[0],
     [".scaled_dot_product_attention` is not allowed here"]),
]


def test_the_ring_reference_is_causal_attention():
    """The checker's reference and the reference solution equal the library's causal
    attention in float64 on contiguous, zigzag and random splits."""
    T, D = 24, 6
    q, k, v = (torch.randn(T, D, dtype=torch.float64) for _ in range(3))
    want, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))
    for owner in (torch.arange(T) // 6, ch09_long_context._zigzag(T, 3),
                  torch.randperm(T) % 4):
        for ring in (ch09_long_context._ring, ring_causal_attention, ring_with()):
            torch.testing.assert_close(ring(q, k, v, owner), want, atol=1e-12, rtol=0)


def test_the_zigzag_split_balances_causal_work():
    """Each device of the zigzag split sees the same number of (query, key) pairs, and its
    two chunks are d and 2n - 1 - d."""
    owner = ch09_long_context._zigzag(48, 4)
    pairs = [int((torch.nonzero(owner == d).flatten() + 1).sum()) for d in range(4)]
    assert pairs == [48 * 49 // 2 // 4] * 4
    assert owner.view(8, 6)[:, 0].tolist() == [0, 1, 2, 3, 3, 2, 1, 0]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch09_long_context))
