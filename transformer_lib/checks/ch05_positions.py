"""Checkers for the exercises of chapter 5, positional encodings
(``chapters/05_positional.ipynb``): the matrix that moves a sinusoidal encoding k positions on,
RoPE tables with NTK-aware scaling for longer contexts, and one decoding step with RoPE and a
cache of keys and values."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.positional import apply_rope, rope_cos_sin, sinusoidal_encoding

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "sinusoid_shift_matrix": Rules(),
    "ntk_rope_tables": Rules(allow=("rope_frequencies",)),
    "rope_cached_attention": Rules(allow=("scaled_dot_product_attention", "apply_rope")),
}

# The matrix M_k with PE(pos + k) = M_k PE(pos) -------------------------------------------------


def _shift_matrix(k: int, d: int, *, exponent: float = 2.0, transpose: bool = False) -> Tensor:
    """The reference (and, with other arguments, two mistakes): the ``(d, d)`` float64 matrix
    that turns row ``pos`` of the sinusoidal table into row ``pos + k``. Channel pair
    (2i, 2i+1) holds (sin, cos) of ``pos · ω_i``; adding ``k`` turns it by ``k · ω_i``."""
    i = torch.arange(d // 2, dtype=torch.float64)  # (d/2,)
    angle = k * 10000.0 ** (-exponent * i / d)  # (d/2,)
    c, s = torch.diag(angle.cos()), torch.diag(angle.sin())  # (d/2, d/2) each
    m = torch.zeros(d, d, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = c, s  # sin(a + b) = sin a cos b + cos a sin b
    m[1::2, 0::2], m[1::2, 1::2] = -s, c  # cos(a + b) = cos a cos b - sin a sin b
    return m.T if transpose else m


def _moves_the_table(k: int, d: int) -> Callable[[Tensor], str | None]:
    """A property: ``M @ PE(pos) = PE(pos + k)`` for every row of a 64-row table."""
    pe = sinusoidal_encoding(64 + abs(k), d).double()  # (64 + |k|, d)
    start = max(0, -k)
    before, after = pe[start:start + 64 - abs(k)], pe[start + k:start + k + 64 - abs(k)]

    def prop(m: Tensor) -> str | None:
        moved = before @ m.T  # (N, d): M @ PE(pos) for every pos
        wrong = ~torch.isclose(moved, after, atol=1e-5, rtol=0)
        if not wrong.any():
            return None
        row, channel = (int(i) for i in wrong.nonzero()[0])
        return say("M @ PE(pos) differs from PE(pos + k) at pos = {pos}, channel "
                   "{channel}: {moved:.4g} instead of "
                   "{after:.4g}", pos=start + row, channel=channel,
                   moved=moved[row, channel].item(), after=after[row, channel].item())
    return prop


def check_sinusoid_shift_matrix(sinusoid_shift_matrix: Callable[[int, int], Tensor]
                                ) -> CheckResult:
    """Check ``sinusoid_shift_matrix(k, d)``: the ``(d, d)`` matrix ``M_k`` with
    ``PE(pos + k) = M_k @ PE(pos)`` for every position, where ``PE`` is the sinusoidal table
    of ``transformer_lib.positional.sinusoidal_encoding`` (sin in channel 2i, cos in 2i+1)
    and ``k`` any integer. Any floating dtype is accepted; it is compared in float64.

    Args:
        sinusoid_shift_matrix: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(k: int, d: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(sinusoid_shift_matrix, [k, d], ["k", "d"])
            if isinstance(got, Tensor) and got.is_floating_point():
                got = got.double()  # float32 is fine: the comparison allows its rounding
            mistakes = [
                (_shift_matrix(k, d, transpose=True),
                 say("this matrix moves the encoding k positions back (it is M_{{-k}}): in channel "
                     "pair i, the new sine is sin(pos·ω) cos(k·ω) + cos(pos·ω) sin(k·ω), so the "
                     "entry for the cosine in the sine's row is +sin(k·ω)")),
                (_shift_matrix(k, d, exponent=1.0),
                 say("pair i turns by ω_i = 1 / 10000^(2i/d) per position: the exponent is 2i/d, "
                     "with i counting pairs (or 2i counting channels)")),
                (_shift_matrix(1, d),
                 say("the angle of each block is k·ω_i, not ω_i: this is the matrix for one step")),
            ]
            _compare(got, _shift_matrix(k, d), "M_k", letters=say("(d, d)"), axes=("row", "column"),
                     atol=1e-6, rtol=0, properties=[_moves_the_table(k, d)], mistakes=mistakes)
        return run

    return _run("sinusoid_shift_matrix", sinusoid_shift_matrix, [
        (say("k = 1, d = 8"), case(1, 8)),
        (say("k = 5, d = 16"), case(5, 16)),
        (say("k = 0, d = 4: nothing moves"), case(0, 4)),
        (say("k = -3, d = 12: back three positions"), case(-3, 12)),
    ], rules=RULES["sinusoid_shift_matrix"])


# Longer contexts: RoPE tables with NTK-aware scaling -----------------------------------------


def _ntk_tables(T: int, head_dim: int, factor: float, theta: float, *,
                base_power: float | None = None, position_scale: float = 1.0,
                swap: bool = False) -> tuple[Tensor, Tensor]:
    """The reference (the defaults) and the mistakes (the other arguments): the cosines and
    sines of ``(m · position_scale) · b^(-2i/D)`` with the base ``b = theta · factor^p``,
    ``p = D / (D - 2)`` unless ``base_power`` says otherwise; float32, ``(T, D/2)`` each."""
    power = head_dim / (head_dim - 2) if base_power is None else base_power
    base = theta * factor ** power
    pairs = torch.arange(0, head_dim, 2, dtype=torch.float64)  # (D/2,): 2i
    inv_freq = base ** (-pairs / head_dim)  # (D/2,): radians per position
    pos = torch.arange(T, dtype=torch.float64) * position_scale  # (T,)
    angles = pos[:, None] * inv_freq[None, :]  # (T, 1) * (1, D/2) -> (T, D/2)
    cos, sin = angles.cos().float(), angles.sin().float()
    return (sin, cos) if swap else (cos, sin)


def _pair_speeds(T: int, head_dim: int, factor: float, theta: float
                 ) -> Callable[[Tensor, Tensor], str | None]:
    """A property of the two tables together: the fastest pair turns as in ``rope_cos_sin``
    (1 rad per position) and the slowest ``factor`` times more slowly than there."""
    slow = theta ** (-(head_dim - 2) / head_dim)  # rope_cos_sin's slowest pair, rad/position

    def prop(cos: Tensor, sin: Tensor) -> str | None:
        if T < 2:
            return None
        step = torch.atan2(sin[1].double(), cos[1].double())  # (D/2,): angle at position 1
        if abs(step[0].item() - 1.0) > 1e-5:
            return say("the fastest pair (column 0) turns {step:.4g} rad per position; "
                       "NTK-aware scaling leaves it at 1 rad, as rope_cos_sin does",
                       step=step[0].item())
        if abs(step[-1].item() - slow / factor) > 1e-5 * slow:
            return say("the slowest pair (the last column) turns {step:.4g} rad per "
                       "position; it should turn factor = {factor:g} times more slowly than in "
                       "rope_cos_sin ({slow:.4g} / {factor:g} = {target:.4g})",
                       step=step[-1].item(), factor=factor, slow=slow, target=slow / factor)
        return None
    return prop


def _ntk_mistakes(T: int, head_dim: int, factor: float, theta: float
                  ) -> list[tuple[tuple[Tensor, Tensor], str]]:
    """The tables that the usual mistakes give, each with its hint."""
    p = head_dim / (head_dim - 2)
    return [
        (_ntk_tables(T, head_dim, factor, theta, position_scale=1.0 / factor),
         say("this is position interpolation: every position is divided by factor, so every pair "
             "slows down, the fastest too. NTK-aware scaling keeps the positions and raises the "
             "base")),
        (_ntk_tables(T, head_dim, factor, theta, base_power=1.0),
         say("the base times factor slows the slowest pair only by factor^((D-2)/D): raise factor "
             "to the power D/(D-2), so that its speed theta^(-(D-2)/D) is divided by exactly "
             "factor")),
        (_ntk_tables(T, head_dim, factor, theta, base_power=-p),
         say("the pairs turn faster than with theta: the base must grow (theta times "
             "factor^(D/(D-2))), not shrink")),
        (_ntk_tables(T, head_dim, factor, theta, swap=True),
         say("cos and sin are swapped: return the pair (cos, sin) in this order")),
    ]


def check_ntk_rope_tables(ntk_rope_tables: Callable[..., tuple]) -> CheckResult:
    """Check ``ntk_rope_tables(T, head_dim, factor, theta=10000.0) -> (cos, sin)``: the RoPE
    tables, ``(T, D/2)`` each, for positions 0 … T−1 with NTK-aware scaling. The base is
    raised to ``theta · factor^(D/(D−2))``, so that the fastest pair still turns 1 rad per
    position and the slowest turns ``factor`` times more slowly than with ``theta``. Any
    floating dtype is accepted; the values are compared as float32. The library's
    ``rope_cos_sin`` may not be called: the exercise asks for the tables.

    Args:
        ntk_rope_tables: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(T: int, head_dim: int, factor: float, theta: float | None) -> Callable[[], None]:
        base = 10000.0 if theta is None else theta

        def run() -> None:
            args, names = [T, head_dim, factor], ["T", "head_dim", "factor"]
            if theta is not None:
                args, names = [*args, theta], [*names, "theta"]
            got = _call(ntk_rope_tables, args, names)
            got = _items(got, 2, say("the pair (cos, sin)"))
            got = [g.float() if isinstance(g, Tensor) and g.is_floating_point() else g
                   for g in got]
            want = _ntk_tables(T, head_dim, factor, base)
            wrong = _ntk_mistakes(T, head_dim, factor, base)
            speeds = _pair_speeds(T, head_dim, factor, base)
            sin_ok = isinstance(got[1], Tensor) and got[1].shape == want[1].shape
            for i, name in enumerate(("cos", "sin")):
                both = [lambda cos: speeds(cos, got[1])] if i == 0 and sin_ok else []
                _compare(got[i], want[i], name, letters=say("(T, D/2)"), axes=("position", "pair"),
                         atol=1e-5, rtol=0, properties=both,
                         mistakes=[(w[i], hint) for w, hint in wrong],
                         shape_hints={(T, head_dim): say("{name} has one column per channel pair, "
                                                         "D/2 in all (not the table repeated to D "
                                                         "columns)", name=name)})
        return run

    return _run("ntk_rope_tables", ntk_rope_tables, [
        (say("T = 64, head_dim = 8, factor = 4: the chapter's model on 64 tokens"),
         case(64, 8, 4.0, None)),
        (say("T = 40, head_dim = 16, factor = 2.5, theta = 500,000"), case(40, 16, 2.5, 500_000.0)),
        (say("T = 6, head_dim = 4, factor = 1: the tables of rope_cos_sin"),
         case(6, 4, 1.0, None)),
        (say("T = 100, head_dim = 64, factor = 8"), case(100, 64, 8.0, None)),
    ], rules=RULES["ntk_rope_tables"])


# One decoding step with RoPE and a cache -----------------------------------------------------


def _cached_step(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                 cos: Tensor, sin: Tensor, *, at: int | None = None, rotate_q: bool = True,
                 rotate_k: bool = True, store_rotated: bool = True, rotate_v: bool = False,
                 rotate_cache: bool = False, scale: bool = True
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """The reference (the defaults) and the mistakes (the other arguments): the new token sits
    at position ``at`` (default P, the cache's length); split-half RoPE."""
    P = k_cache.shape[-2]
    at = P if at is None else at
    c, s = cos[at:at + 1], sin[at:at + 1]  # (1, D/2): the new token's angles
    q_r = apply_rope(q, c, s) if rotate_q else q  # (B, H, 1, D)
    k_r = apply_rope(k, c, s) if rotate_k else k  # (B, H, 1, D)
    v_r = apply_rope(v, c, s) if rotate_v else v  # (B, H, 1, D)
    old = apply_rope(k_cache, cos[:P], sin[:P]) if rotate_cache else k_cache  # (B, H, P, D)
    keys = torch.cat([old, k_r], dim=-2)  # (B, H, P + 1, D)
    values = torch.cat([v_cache, v_r], dim=-2)  # (B, H, P + 1, D)
    q_s = q_r if scale else q_r * math.sqrt(q.shape[-1])  # undo the library's 1/√D
    out, _ = scaled_dot_product_attention(q_s, keys, values)  # (B, H, 1, D)
    stored = keys if store_rotated else torch.cat([old, k], dim=-2)
    return out, stored, values


_STORED_RAW = (dict(store_rotated=False),
               say("the new key went into the cache unrotated (row 0 of the tables turns nothing): "
                   "the next steps would compare their queries with a key that never turned; store "
                   "it rotated at its position P"))
_STEP_MISTAKES = [
    (dict(at=0), say("the new token was rotated as if it sat at position 0: it sits at position "
                     "P, after the P cached tokens, so its angles are row P of cos and sin")),
    (dict(rotate_v=True), say("the value was rotated: RoPE turns queries and keys only, the values "
                              "go into the weighted sum as they are")),
    (dict(rotate_q=False), say("the query was not rotated: q and k both turn, so that their score "
                               "depends on the distance between their positions")),
    (dict(rotate_k=False), say("the new key was not rotated: every key turns by its own "
                               "position, the new one too")),
    (dict(rotate_cache=True), say("the cached keys were rotated a second time: the cache already "
                                  "holds them rotated, at their own positions")),
    (dict(scale=False), say("the scores must be divided by √D before the softmax")),
]


def check_rope_cached_attention(rope_cached_attention: Callable[..., tuple]) -> CheckResult:
    """Check ``rope_cached_attention(q, k, v, k_cache, v_cache, cos, sin) -> (out, keys,
    values)``: one decoding step of split-half RoPE attention. ``q, k, v`` ``(B, H, 1, D)``
    are the new token's projections (not rotated); ``k_cache, v_cache`` ``(B, H, P, D)`` hold
    positions 0 … P−1, the keys already rotated at their positions; ``cos, sin`` ``(L, D/2)``
    cover positions 0 … L−1. The new token sits at position P; ``out`` ``(B, H, 1, D)`` is
    its attention over positions 0 … P, and ``keys``, ``values`` ``(B, H, P + 1, D)`` are the
    cache after the step.

    Args:
        rope_cached_attention: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(B: int, H: int, P: int, D: int, L: int) -> Callable[[], None]:
        q, k, v = torch.randn(3, B, H, 1, D, generator=g)  # (B, H, 1, D) each
        history = torch.randn(2, B, H, P, D, generator=g)  # earlier keys and values, raw
        cos, sin = rope_cos_sin(L, D)  # (L, D/2) each
        k_cache = apply_rope(history[0], cos[:P], sin[:P])  # (B, H, P, D): as a cache holds it
        v_cache = history[1]
        args = [q, k, v, k_cache, v_cache, cos, sin]

        def run() -> None:
            got = _call(rope_cached_attention, args,
                        ["q", "k", "v", "k_cache", "v_cache", "cos", "sin"])
            got = _items(got, 3, say("the triple (out, keys, values)"))
            want = _cached_step(*args)
            # For the keys, an unrotated new key is named first: it is also what a rotation
            # at position 0 stores.
            order = {"out": _STEP_MISTAKES, "keys": [_STORED_RAW, *_STEP_MISTAKES],
                     "values": _STEP_MISTAKES}
            axes = ("batch", "head", "position", "channel")
            one, all_ = (B, H, 1, D), (B, H, P + 1, D)
            shape_hints = {
                "out": {all_: say("out is the new token's output only: one position")},
                "keys": {(B, H, P, D): say("keys must hold the new position too: P + 1 positions"),
                         one: say("keys is the whole cache after the step: P + 1 positions")},
                "values": {(B, H, P, D): say("values must hold the new position too: P + 1 "
                                             "positions"),
                           one: say("values is the whole cache after the step: P + 1 positions")},
            }
            for i, (name, letters) in enumerate([("out", say("(B, H, 1, D)")),
                                                 ("keys", say("(B, H, P + 1, D)")),
                                                 ("values", say("(B, H, P + 1, D)"))]):
                _compare(got[i], want[i], name, letters=letters, axes=axes,
                         mistakes=[(_cached_step(*args, **kwargs)[i], hint)
                                   for kwargs, hint in order[name]],
                         shape_hints=shape_hints[name])
        return run

    return _run("rope_cached_attention", rope_cached_attention, [
        (say("batch 2, 2 heads, 5 cached positions, D = 8"), case(2, 2, 5, 8, 16)),
        (say("batch 1, 3 heads, 11 cached positions, D = 4: the tables' last row"),
         case(1, 3, 11, 4, 12)),
        (say("an empty cache: the first token, at position 0"), case(2, 1, 0, 6, 8)),
    ], rules=RULES["rope_cached_attention"])
