"""Checkers for the core of chapter 5 (``chapters/05_positional.ipynb``), written by the
learner where the chapter builds it: RoPE's rotation of channel pairs, in the split-half
pairing (channel i with i + D/2) and in the interleaved one (2i with 2i + 1).

The reference turns each pair with its own angle in float64, from angles the checker computes
itself (position times ``10000 ** (-2i / D)``), independently of the library's tables."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import CheckResult, _call, _compare, _generator, _run
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "rope_half": Rules(refuse=("transformers.*",)),
    "rope_interleaved": Rules(refuse=("transformers.*",)),
}

_PAIRINGS = ("half", "interleaved")


def _tables(T: int, D: int, start: int = 0) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles ``m θ_i``, ``(T, D/2)`` each, float32, for positions
    ``start ... start + T - 1``."""
    positions = torch.arange(start, start + T, dtype=torch.float64)  # (T,)
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = positions[:, None] * theta[None, :]  # (T, D/2)
    return angles.cos().float(), angles.sin().float()


def _pairs(D: int, pairing: str) -> tuple[Tensor, Tensor]:
    """The channels holding the first and the second member of each pair."""
    if pairing == "half":
        return torch.arange(D // 2), torch.arange(D // 2, D)
    return torch.arange(0, D, 2), torch.arange(1, D, 2)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, pairing: str, *, turn: float = 1.0,
            swap: bool = False, layout: str | None = None) -> Tensor:
    """The reference rotation (the defaults), in float64, and the mistakes: turning the other
    way (``turn=-1``), cos and sin swapped, the result laid out in the other pairing's channel
    order (``layout``). (A rotation that changes one channel of a pair only is caught by the
    lengths it changes.)"""
    D = x.shape[-1]
    first, second = _pairs(D, pairing)
    c, s = cos.double(), sin.double()
    if swap:
        c, s = s, c
    x1, x2 = x.double()[..., first], x.double()[..., second]  # (..., T, D/2) each
    new1 = x1 * c - turn * x2 * s
    new2 = turn * x1 * s + x2 * c
    out = torch.empty(x.shape, dtype=torch.float64)
    put1, put2 = _pairs(D, layout or pairing)
    out[..., put1], out[..., put2] = new1, new2
    return out.to(x.dtype)


def _keeps_lengths(x: Tensor) -> Callable[[Tensor], str | None]:
    """A rotation keeps the length of every vector."""
    def check(got: Tensor) -> str | None:
        before, after = x.double().norm(dim=-1), got.detach().double().norm(dim=-1)
        worst = ((after - before).abs() / before.clamp_min(1e-12)).max().item()
        if worst > 1e-2:
            return say("a vector's length changed by {worst:.1%}: a rotation keeps lengths, so "
                       "each pair must be turned by cos and sin of one angle, both channels at "
                       "once", worst=worst)
        return None
    return check


def _check_rope(fn: Callable[..., Tensor], name: str, pairing: str) -> CheckResult:
    g = _generator()
    other = "interleaved" if pairing == "half" else "half"
    pair_words = {"half": say("channel i with channel i + D/2"),
                  "interleaved": say("channel 2i with channel 2i + 1")}

    def case(shape: tuple[int, ...], start: int = 0,
             dtype: torch.dtype = torch.float32) -> Callable[[], None]:
        *_, T, D = shape
        x = torch.randn(*shape, generator=g).to(dtype)
        cos, sin = _tables(T, D, start)

        def run() -> None:
            got = _call(fn, [x, cos, sin], ["x", "cos", "sin"])
            mistakes = [
                (_rotate(x, cos, sin, pairing, turn=-1.0),
                 say("the pairs turned the wrong way: the first channel of a pair becomes "
                     "x1·cos − x2·sin and the second x1·sin + x2·cos")),
                (_rotate(x, cos, sin, other),
                 say("that is the {other} pairing; here a pair is {pair}", other=other,
                     pair=pair_words[pairing])),
                (_rotate(x, cos, sin, pairing, swap=True),
                 say("cos and sin are swapped: the angle's cosine multiplies the channel itself")),
            ]
            if D > 2:
                mistakes.append((
                    _rotate(x, cos, sin, pairing, layout=other),
                    say("the rotated pairs came back in the {other} channel order: put each pair "
                        "back where it came from ({pair})", other=other,
                        pair=pair_words[pairing])))
            atol = 2e-2 if dtype == torch.bfloat16 else 1e-5
            _compare(got, _rotate(x, cos, sin, pairing), say("the rotated x"),
                     letters=say("(..., T, D)"), atol=atol, rtol=atol, mistakes=mistakes,
                     properties=[_keeps_lengths(x)] if dtype != torch.bfloat16 else [])
        return run

    return _run(name, fn, [
        (say("(T, D) = (5, 8), positions 0-4"), case((5, 8))),
        (say("(B, H, T, D) = (2, 3, 6, 16), positions 7-12"), case((2, 3, 6, 16), start=7)),
        (say("D = 2: one pair, positions 0-3"), case((4, 2))),
        (say("positions 1000-1003: large angles"), case((1, 4, 32), start=1000)),
        (say("bfloat16 x: the result stays bfloat16"), case((2, 4, 8), dtype=torch.bfloat16)),
    ], rules=RULES[name])


def check_rope_half(rope_half: Callable[..., Tensor]) -> CheckResult:
    """Check ``rope_half(x, cos, sin)``: RoPE in the split-half pairing. ``x`` is
    ``(..., T, D)``; ``cos`` and ``sin`` are ``(T, D/2)``, row t for position t and column i
    for pair i, which is channel i with channel i + D/2. Each pair ``(x1, x2)`` becomes
    ``(x1 cos − x2 sin, x1 sin + x2 cos)`` in the same channels; the result has the shape and
    the dtype of ``x``.

    Args:
        rope_half: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    return _check_rope(rope_half, "rope_half", "half")


def check_rope_interleaved(rope_interleaved: Callable[..., Tensor]) -> CheckResult:
    """Check ``rope_interleaved(x, cos, sin)``: RoPE in the interleaved pairing, where pair i
    is channel 2i with channel 2i + 1; otherwise as :func:`check_rope_half`. The rotated pair
    goes back into channels 2i and 2i + 1.

    Args:
        rope_interleaved: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    return _check_rope(rope_interleaved, "rope_interleaved", "interleaved")
