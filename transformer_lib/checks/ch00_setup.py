"""Checkers for the exercises of the setup chapter (``chapters/00_setup.ipynb``): the shapes of
a multi-head layer."""
from __future__ import annotations

from typing import Callable

import torch

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    SEED,
    CheckResult,
    _call,
    _describe,
    _Failure,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "mha_shapes": Rules(),
}


# Shapes of a multi-head attention layer ---------------------------------------------------


def check_mha_shapes(mha_shapes: Callable[..., tuple]) -> CheckResult:
    """Check ``mha_shapes(B, T, S, C, H, H_kv) -> (out, last_weights, k_proj.weight)`` shapes
    against a :class:`transformer_lib.attention.MultiHeadAttention` built with
    ``keep_weights=True`` and run on ``x (B, T, C)`` attending to a memory ``(B, S, C)``:
    multi-head, grouped-query and multi-query layers.

    Args:
        mha_shapes: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(B: int, T: int, S: int, C: int, H: int, H_kv: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(mha_shapes, [B, T, S, C, H, H_kv], ["B", "T", "S", "C", "H", "H_kv"])
            got = _items(got, 3, say("three shapes, those of the output, of last_weights and of "
                                     "k_proj.weight"))
            with torch.random.fork_rng(devices=[]):  # the layer's init leaves no trace
                torch.manual_seed(SEED)
                mha = MultiHeadAttention(C, H, H_kv, keep_weights=True)
                with torch.no_grad():
                    out = mha(torch.randn(B, T, C), torch.randn(B, S, C))
            D = C // H
            expected = {
                say("the output"): (tuple(out.shape), {
                    (B, S, C): say("the output has one row per query: T, whatever S is"),
                    (B, H, T, D): say("o_proj merges the heads back: (B, T, C)"),
                    (B, T, H, D): say("o_proj merges the heads back: (B, T, C)"),
                }),
                "last_weights": (tuple(mha.last_weights.shape), {
                    (B, H, S, T): say("one row per query and one column per key: (B, H, T, S)"),
                    (B, H_kv, T, S): say("every query head has its own weights: H of them, "
                                         "not H_kv (the key/value heads are repeated before "
                                         "attention)"),
                    (B, T, S): say("there is one set of weights per head: (B, H, T, S)"),
                }),
                "k_proj.weight": (tuple(mha.k_proj.weight.shape), {
                    (C, H_kv * D): say("nn.Linear stores its weight as (out_features, "
                                       "in_features)"),
                    (H * D, C): say("k_proj makes only the H_kv = {H_kv} key/value head(s), of "
                                    "width D = {D}: (H_kv · D, C)", H_kv=H_kv, D=D),
                }),
            }
            for (what, (want, hints)), shape in zip(expected.items(), got):
                try:
                    shape = tuple(int(n) for n in shape)
                except (TypeError, ValueError):
                    raise _Failure(say("the shape of {what} should be a tuple of ints, got "
                                       "{got}", what=what, got=_describe(shape))) from None
                if shape != want:
                    raise _Failure(say("wrong shape of {what}: expected {want}, got {shape}",
                                       what=what, want=want, shape=shape),
                                   hints.get(shape))
        return run

    return _run("mha_shapes", mha_shapes, [
        (say("grouped-query: B=2, T=10, S=4, C=48, H=6, H_kv=3"), case(2, 10, 4, 48, 6, 3)),
        (say("multi-head: B=1, T=5, S=5, C=32, H=4, H_kv=4"), case(1, 5, 5, 32, 4, 4)),
        (say("multi-query: B=3, T=7, S=9, C=64, H=8, H_kv=1"), case(3, 7, 9, 64, 8, 1)),
    ], rules=RULES["mha_shapes"])
