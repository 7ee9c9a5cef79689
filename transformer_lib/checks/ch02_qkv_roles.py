"""Checkers for the exercises of chapter 2, the roles of queries, keys and values
(``chapters/02_qkv_roles.ipynb``): teacher-forcing targets for the reversal task, how often a
head looks at the mirrored position, and a change of coordinates that keeps the scores."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _generator,
    _items,
    _run,
)
from transformer_lib.tasks import mirror_alignment as _mirror_alignment

# Teacher forcing for the reversal task -------------------------------------------------------


def check_reversal_targets(reversal_targets: Callable[[Tensor, int], tuple]) -> CheckResult:
    """Check ``reversal_targets(src, bos) -> (tgt_in, tgt_out)``, both ``(B, T)``: the target
    is the reversed source, and the decoder reads it shifted right by one, after ``bos``."""
    g = _generator()

    def case(src: Tensor, bos: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(reversal_targets, [src, bos], ["src", "bos"])
            tgt_in, tgt_out = _items(got, 2, "the pair (tgt_in, tgt_out)")
            want_out = src.flip(1)  # (B, T)
            start = torch.full_like(src[:, :1], bos)  # (B, 1)
            want_in = torch.cat([start, want_out[:, :-1]], dim=1)  # (B, T)
            axes = ("sequence", "step")
            _compare(tgt_out, want_out, "tgt_out", letters="(B, T)", axes=axes,
                     mistakes=[(src, "tgt_out is the source reversed: .flip(1)")])
            _compare(tgt_in, want_in, "tgt_in", letters="(B, T)", axes=axes, mistakes=[
                (want_out, "tgt_in is not shifted: the decoder would read the very token it "
                           "must predict. Put bos first and drop the last target token"),
                (torch.cat([want_out[:, 1:], start], dim=1),  # (B, T)
                 "shifted the wrong way: bos comes first, then the targets without their last"),
                (torch.cat([start, src[:, :-1]], dim=1),  # (B, T)
                 "tgt_in must be built from the reversed source (the targets), not from src"),
                (torch.cat([torch.zeros_like(start), want_out[:, :-1]], dim=1),  # (B, T)
                 f"the start token is the `bos` argument (here {bos}), not a fixed 0"),
            ], shape_hints={(src.shape[0], src.shape[1] + 1):
                            "tgt_in keeps length T: drop the last target token"})
        return run

    return _run("reversal_targets", reversal_targets, [
        ("src (3, 5), bos = 0", case(torch.randint(1, 10, (3, 5), generator=g), 0)),
        ("src (2, 4), bos = 11", case(torch.randint(1, 10, (2, 4), generator=g), 11)),
        ("one token: src (2, 1), bos = 5", case(torch.randint(1, 10, (2, 1), generator=g), 5)),
    ])


# How often a head looks at the mirrored position ---------------------------------------------


def check_mirror_alignment(mirror_alignment: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``mirror_alignment(weights)``: for cross-attention weights ``(n, H, T, S)`` with
    ``S = T``, the fraction of (sequence, step) pairs whose argmax over the keys is the
    mirrored position ``T − 1 − t``, one per head ``(H,)``, against
    :func:`transformer_lib.tasks.mirror_alignment`."""
    g = _generator()
    n, T = 40, 6
    noise = torch.randn(n, 3, T, T, generator=g)  # (n, H, T, S)
    eye = torch.eye(T)
    structured = noise + 2.5 * torch.stack([eye.flip(1), eye, torch.zeros(T, T)])  # per head
    mirrored = torch.arange(T - 1, -1, -1)  # (T,) step t reads source T-1-t

    def case(w: Tensor) -> Callable[[], None]:
        def run() -> None:
            got = _call(mirror_alignment, [w], ["weights"])
            H = w.shape[1]
            _compare(got, _mirror_alignment(w), "the fractions", letters="(H,)", axes=("head",),
                     mistakes=[
                         ((w.argmax(-1) == torch.arange(T)).float().mean(dim=(0, 2)),
                          "compared with the diagonal (position t): step t copies the mirrored "
                          "source position T − 1 − t"),
                         ((w.argmax(-2) == mirrored).float().mean(dim=(0, 2)),
                          "the argmax ran over the queries (dim=-2): take it over the keys "
                          "(dim=-1), one per query"),
                         ((w.argmax(-1) == mirrored).float().sum(dim=(0, 2)),
                          "these are counts: divide by the number of (sequence, step) pairs, "
                          "or take .float().mean(dim=(0, 2))"),
                     ],
                     shape_hints={(): "one fraction per head: average over sequences and "
                                      "steps only, dims (0, 2)",
                                  (H, T): "average over the steps too: dims (0, 2)",
                                  (n, H): "average over the sequences too: dims (0, 2)"})
        return run

    return _run("mirror_alignment", mirror_alignment, [
        ("3 heads: mirrored, diagonal, random", case(torch.softmax(structured, -1))),
        ("random weights (40, 3, 6, 6)", case(torch.softmax(noise, -1))),
        ("one head, one step: T = 1", case(torch.ones(5, 1, 1, 1))),
    ])


# A change of coordinates that keeps the scores -----------------------------------------------


def check_transform_qk(transform_qk: Callable[[Tensor, Tensor, Tensor], tuple]) -> CheckResult:
    """Check ``transform_qk(Q, K, R) -> (Q R, K R⁻ᵀ)``: new queries and keys, ``(..., T, D)``
    and ``(..., S, D)``, with the same scores ``Q Kᵀ`` for any invertible ``R (D, D)``."""
    g = _generator()

    def case(q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> Callable[[], None]:
        D = q_shape[-1]
        Q = torch.randn(*q_shape, generator=g, dtype=torch.float64)  # (..., T, D)
        K = torch.randn(*k_shape, generator=g, dtype=torch.float64)  # (..., S, D)
        R = torch.eye(D, dtype=torch.float64) + 0.4 * torch.randn(D, D, generator=g,
                                                                  dtype=torch.float64)

        def run() -> None:
            got = _call(transform_qk, [Q, K, R], ["Q", "K", "R"])
            q2, k2 = _items(got, 2, "the pair (Q', K')")
            R_inv = torch.linalg.inv(R)  # (D, D)
            _compare(q2, Q @ R, "Q'", mistakes=[(Q @ R.T, "Q' = Q R, not Q Rᵀ")])

            def same_scores(k: Tensor) -> str | None:
                if not torch.allclose(Q @ R @ k.transpose(-2, -1), Q @ K.transpose(-2, -1),
                                      atol=1e-6):  # (..., T, S) both
                    return "the scores Q' K'ᵀ differ from Q Kᵀ"
                return None

            _compare(k2, K @ R_inv.T, "K'", properties=[same_scores], mistakes=[
                (K @ R_inv, "K' uses R⁻¹ where it needs R⁻ᵀ: (Q R)(K R⁻¹)ᵀ = Q R R⁻ᵀ Kᵀ, "
                            "which is Q Kᵀ only for a symmetric R. Transpose the inverse"),
                (K @ R, "the same R on both sides gives Q R Rᵀ Kᵀ, which is Q Kᵀ only for a "
                        "rotation (an orthogonal R): undo R in the keys with R⁻ᵀ"),
            ])
        return run

    return _run("transform_qk", transform_qk, [
        ("Q (5, 4), K (7, 4)", case((5, 4), (7, 4))),
        ("batched: Q (2, 3, 5, 8), K (2, 3, 6, 8)", case((2, 3, 5, 8), (2, 3, 6, 8))),
    ])
