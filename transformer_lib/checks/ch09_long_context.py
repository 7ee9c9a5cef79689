"""Checker for the exercise of chapter 9's last page (``chapters/09c_long_context.ipynb``):
causal attention over a sequence split between devices, each holding one block of keys and
values at a time (ring attention), with the blocks merged through their log-sum-exp.

The reference is written out here, one device after another, independently of the chapter's
cell; each known mistake is the reference with one thing changed. While the student's
function runs, the shape of every tensor it creates is recorded (chapter 8's
``_NewTensors``): a query-by-key tensor wider than one device's block of keys fails, since no
device ever holds more."""
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
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.checks.ch08_fast_attention import _NewTensors, _too_large

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "ring_causal_attention": Rules(
        refuse=("torch.nn.functional.scaled_dot_product_attention",)),
}


def _ring(q: Tensor, k: Tensor, v: Tensor, owner: Tensor, *,
          mistake: str | None = None) -> Tensor:
    """The reference (``mistake=None``) and the known mistakes: device d holds the queries
    at the positions ``owner == d`` and, at step s, the key/value block of device d − s."""
    T, D = q.shape
    n = int(owner.max()) + 1
    positions = [torch.nonzero(owner == d).flatten() for d in range(n)]  # each (T_d,)
    scale = 1.0 if mistake == "no_scale" else 1 / math.sqrt(D)
    outs = []
    for d in range(n):
        rows = positions[d]
        acc = torch.zeros(len(rows), v.shape[-1], dtype=q.dtype)  # (T_d, Dv)
        lse = torch.full((len(rows),), -math.inf, dtype=q.dtype)  # (T_d,)
        for step in range(n):
            cols = positions[(d - step) % n]  # the block device d holds at this step
            scores = (q[rows] @ k[cols].T) * scale  # (T_d, T_j)
            if mistake == "local_mask":
                visible = torch.ones(len(rows), len(cols), dtype=torch.bool).tril()
            else:
                visible = rows[:, None] >= cols[None, :]  # (T_d, T_j): absolute positions
            if mistake != "no_mask":
                scores = scores.masked_fill(~visible, -math.inf)
            block_lse = scores.logsumexp(dim=-1)  # (T_d,): -inf where no key is visible
            if mistake == "blocks_added":
                weights = torch.softmax(scores, dim=-1).nan_to_num()  # each block on its own
                acc, lse = acc + weights @ v[cols], torch.logaddexp(lse, block_lse)
                continue
            both = torch.logaddexp(lse, block_lse)  # (T_d,)
            acc = ((lse - both).exp()[:, None] * acc
                   + (scores - both[:, None]).exp() @ v[cols])  # (T_d, Dv)
            lse = both
        outs.append(acc)
    if mistake == "device_order":
        return torch.cat(outs)  # rows in the order of the devices, not of the positions
    out = torch.empty(T, v.shape[-1], dtype=q.dtype)
    for rows, acc in zip(positions, outs):
        out[rows] = acc
    return out


_RING_HINTS = {
    "no_mask": say("every position saw every key: each query may see only the keys at or "
                   "before its own position; mask each tile by the positions it holds"),
    "local_mask": say("the mask of a tile compares the positions it holds, not its rows and "
                      "columns: rows[:, None] >= cols[None, :] with the absolute positions, "
                      "not torch.tril of the tile (a tile can be all visible, partly visible "
                      "or all hidden)"),
    "blocks_added": say("each block's output was normalised on its own and the blocks added: "
                        "weight the running output and the block's by exp(lse − lse_both), "
                        "with lse_both = logaddexp(lse, lse_block)"),
    "no_scale": say("the scores are q · k / √D"),
    "device_order": say("the rows came back in the order of the devices: put each device's "
                        "rows back at its own positions (out[positions] = ...)"),
}


def _zigzag(T: int, n_devices: int) -> Tensor:
    """The balanced split of causal attention: ``T`` positions in ``2 n_devices`` equal
    chunks, device d holding chunks d and 2 n_devices − 1 − d. Returns ``(T,)``, the device
    of each position."""
    if T % (2 * n_devices):
        raise ValueError(say("the zigzag split needs T divisible by 2 * n_devices, got T={T}, "
                             "n_devices={n}", T=T, n=n_devices))
    chunk = torch.arange(T) // (T // (2 * n_devices))  # (T,): chunk index 0 … 2n − 1
    return torch.minimum(chunk, 2 * n_devices - 1 - chunk)


def check_ring_causal_attention(ring_causal_attention: Callable[..., Tensor]) -> CheckResult:
    """Check ``ring_causal_attention(q, k, v, owner) -> out``: causal softmax(q kᵀ / √D) v for
    q, k ``(T, D)`` and v ``(T, Dv)``, computed as n devices would: ``owner`` ``(T,)`` gives the
    device (0 … n − 1) of each position; device d holds the queries of its positions and one
    block of keys and values at a time (its own first, then the others around the ring), and
    merges the blocks through their log-sum-exp. ``out`` ``(T, Dv)``, row t for position t.
    The invariant: no query-by-key tensor the function creates spans more keys or queries
    than one device holds. PyTorch's SDPA and the library may not be called.

    Args:
        ring_causal_attention: the function to check (the exercise's), called on the
            checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(owner: Tensor, D: int, Dv: int, *, dtype=torch.float64,
             spread: float = 1.0) -> Callable[[], None]:
        T = len(owner)
        q = spread * torch.randn(T, D, generator=g, dtype=dtype)
        k, v = torch.randn(T, D, generator=g, dtype=dtype), torch.randn(T, Dv, generator=g,
                                                                         dtype=dtype)
        want = _ring(q, k, v, owner)
        mistakes = [(_ring(q, k, v, owner, mistake=key), hint)
                    for key, hint in _RING_HINTS.items()]
        largest = int(torch.bincount(owner).max())

        def run() -> None:
            with _NewTensors() as made:
                out = _call(ring_causal_attention, [q, k, v, owner], ["q", "k", "v", "owner"])
            atol = 1e-12 if dtype == torch.float64 else 1e-5
            _compare(out, want, "out", letters=say("(T, Dv)"), axes=("position", "channel"),
                     atol=atol, rtol=atol, mistakes=mistakes,
                     nan_hint=say("a query can have no visible key in a block (all of the "
                                  "block lies after it): its softmax over the block is NaN; "
                                  "merge with the block's log-sum-exp, which is −inf there, "
                                  "or skip the rows that see nothing"))
            shape = _too_large(made.shapes, largest, largest, D, Dv, 2)
            if shape is not None:
                raise _Failure(
                    say("created a tensor of shape {shape}, wider than one device's {m} "
                        "positions", shape=shape, m=largest),
                    say("work as the devices do: the scores and the mask of one device's "
                        "queries against the one block of keys it holds, (T_d, T_j), never "
                        "against the whole sequence"))
        return run

    contiguous = torch.arange(16) // 4  # 4 devices, positions 0–3, 4–7, …
    shuffled = torch.randperm(21, generator=g) % 3  # 3 devices, 7 positions each, interleaved
    uneven = torch.tensor([2, 0, 0, 1, 2, 2, 1, 0, 2, 2, 1, 2])  # 3, 3 and 6 positions
    return _run("ring_causal_attention", ring_causal_attention, [
        (say("4 devices, each a contiguous block of 4 positions, D = 8"),
         case(contiguous, 8, 8)),
        (say("the zigzag split: 24 positions, 3 devices each holding chunks d and 5 − d"),
         case(_zigzag(24, 3), 6, 6)),
        (say("positions dealt to 3 devices at random, values of another width (Dv = 5)"),
         case(shuffled, 10, 5)),
        (say("devices of unequal size (3, 3 and 6 positions)"), case(uneven, 5, 4)),
        (say("one device holding all 9 positions"), case(torch.zeros(9, dtype=torch.long), 4, 3)),
        (say("float32, q scaled by 30 (scores over 100): nothing may overflow"),
         case(contiguous, 8, 3, dtype=torch.float32, spread=30.0)),
    ], rules=RULES["ring_causal_attention"])
