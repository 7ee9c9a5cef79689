"""Chapter 5's checkers (``transformer_lib/checks/ch05_positions.py`` and, for the RoPE
rotation the learner writes, ``ch05_rope.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks import (
    ch05_positions,
    ch05_rope,
    check_ntk_rope_tables,
    check_rope_cached_attention,
    check_rope_half,
    check_rope_interleaved,
    check_sinusoid_shift_matrix,
)
from transformer_lib.positional import apply_rope, rope_cos_sin, rope_frequencies

from chapter_solutions import references
from conftest import mistake_tests

ntk_rope_tables, rope_cached_attention, sinusoid_shift_matrix = references(
    "05_positional", "ntk_rope_tables", "rope_cached_attention", "sinusoid_shift_matrix")


def shift_matrix_with(*, exponent=2.0, sign=1.0, use_k=True, dtype=torch.float64):
    """sinusoid_shift_matrix with one of the usual mistakes."""

    def shift(k, d):
        steps = (k if use_k else 1) * 10000.0 ** (-exponent * torch.arange(d // 2) / d)
        m = torch.zeros(d, d, dtype=torch.float64)
        for i, a in enumerate(steps.tolist()):
            c, s = torch.cos(torch.tensor(a)), sign * torch.sin(torch.tensor(a))
            m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]])
        return m.to(dtype)

    return shift


def tables_with(*, base_power=None, lower=False, divide_positions=False, swap=False,
                tile=False):
    """ntk_rope_tables with one of the usual mistakes, written as a student would."""

    def tables(T, head_dim, factor, theta=10000.0):
        power = head_dim / (head_dim - 2) if base_power is None else base_power
        power = -power if lower else power
        speed = rope_frequencies(head_dim, theta * factor ** power)  # (D/2,)
        pos = torch.arange(T, dtype=torch.float64) / (factor if divide_positions else 1.0)
        angles = pos[:, None] * speed  # (T, D/2)
        if tile:
            angles = torch.cat([angles, angles], dim=-1)  # (T, D): Hugging Face's layout
        cos, sin = angles.cos().float(), angles.sin().float()
        return (sin, cos) if swap else (cos, sin)

    return tables


def ntk_by_the_library(T, head_dim, factor, theta=10000.0):
    """The right tables, but from the library's rope_cos_sin: the exercise forbids it."""
    return rope_cos_sin(T, head_dim, theta * factor ** (head_dim / (head_dim - 2)))


def step_with(*, at_zero=False, rotate_v=False, store_raw=False, rotate_cache=False):
    """rope_cached_attention with one of the usual mistakes."""

    def step(q, k, v, k_cache, v_cache, cos, sin):
        pos = 0 if at_zero else k_cache.shape[-2]
        c, s = cos[pos:pos + 1], sin[pos:pos + 1]
        P = k_cache.shape[-2]
        old = apply_rope(k_cache, cos[:P], sin[:P]) if rotate_cache else k_cache
        keys = torch.cat([old, apply_rope(k, c, s)], dim=-2)
        values = torch.cat([v_cache, apply_rope(v, c, s) if rotate_v else v], dim=-2)
        out, _ = scaled_dot_product_attention(apply_rope(q, c, s), keys, values)
        return out, (torch.cat([old, k], dim=-2) if store_raw else keys), values

    return step


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_sinusoid_shift_matrix, shift_matrix_with(sign=-1.0),
     ["1 of 4 checks passed", "M @ PE(pos) differs from PE(pos + k) at pos = 0",
      "moves the encoding k positions back"]),
    (check_sinusoid_shift_matrix, shift_matrix_with(exponent=1.0),
     ["the exponent is 2i/d"]),
    (check_sinusoid_shift_matrix, shift_matrix_with(use_k=False),
     ["1 of 4 checks passed", "this is the matrix for one step"]),
    (check_sinusoid_shift_matrix, lambda k, d: sinusoid_shift_matrix(k, d)[: d // 2],
     ["wrong shape for M_k: expected (d, d) = (8, 8), got (4, 8)"]),
    (check_ntk_rope_tables, tables_with(divide_positions=True),
     ["1 of 4 checks passed", "this is position interpolation"]),
    (check_ntk_rope_tables, tables_with(base_power=1.0),
     ["the slowest pair (the last column) turns", "raise factor to the power D/(D-2)"]),
    (check_ntk_rope_tables, tables_with(lower=True),
     ["the pairs turn faster than with theta"]),
    (check_ntk_rope_tables, tables_with(swap=True),
     ["0 of 4 checks passed", "cos and sin are swapped"]),
    (check_ntk_rope_tables, tables_with(tile=True),
     ["wrong shape for cos", "one column per channel pair"]),
    (check_ntk_rope_tables, ntk_by_the_library,
     ["0 of 4 checks passed", ".rope_cos_sin` is not allowed here"]),
    (check_rope_cached_attention, step_with(at_zero=True),
     ["1 of 3 checks passed", "wrong values in out", "as if it sat at position 0"]),
    (check_rope_cached_attention, step_with(rotate_v=True),
     ["1 of 3 checks passed", "the value was rotated"]),  # at position 0 nothing turns
    (check_rope_cached_attention, step_with(store_raw=True),
     ["wrong values in keys", "went into the cache unrotated"]),
    (check_rope_cached_attention, step_with(rotate_cache=True),
     ["rotated a second time"]),
    (check_rope_cached_attention,
     lambda *args: rope_cached_attention(*args)[0],
     ["return the triple (out, keys, values)"]),
    (check_rope_cached_attention,
     lambda q, k, v, kc, vc, cos, sin: (rope_cached_attention(q, k, v, kc, vc, cos, sin)[0],
                                        kc, vc),
     ["wrong shape for keys", "P + 1 positions"]),
]


def test_a_float32_shift_matrix_passes(capsys):
    assert check_sinusoid_shift_matrix(shift_matrix_with(dtype=torch.float32))


def test_ntk_tables_in_float64_pass_and_match_the_slowest_pair_by_hand(capsys):
    def in_float64(T, head_dim, factor, theta=10000.0):
        return tuple(t.double() for t in ntk_rope_tables(T, head_dim, factor, theta))

    assert check_ntk_rope_tables(in_float64)
    # By hand, for the chapter's sizes (D = 8, factor 4): the base is 10000 * 4^(8/6), the
    # fastest pair still turns 1 rad per position, the slowest 0.001 / 4.
    cos, sin = ntk_rope_tables(3, 8, 4.0)
    step = torch.atan2(sin[1].double(), cos[1].double())
    assert abs(step[0].item() - 1.0) < 1e-6
    assert abs(step[-1].item() - 0.001 / 4) < 1e-8


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch05_positions))


# Plausible wrong RoPE rotations (the core exercises) --------------------------------------------

rope_half, rope_interleaved = references("05_positional", "rope_half", "rope_interleaved")


def _halves(x):
    return x.chunk(2, dim=-1)


def _evens_odds(x):
    return x[..., 0::2], x[..., 1::2]


def _interleave(a, b):
    return torch.stack([a, b], dim=-1).flatten(-2)


def rotation_with(split, join, *, turn=1.0, swap=False, first_only=False):
    """A RoPE rotation with one of the usual mistakes, written as a student would."""

    def rope(x, cos, sin):
        cos, sin = (sin, cos) if swap else (cos, sin)
        x1, x2 = split(x)
        new1 = x1 * cos - turn * x2 * sin
        new2 = x2 if first_only else turn * x1 * sin + x2 * cos
        return join(new1, new2).to(x.dtype)

    return rope


def _cat(a, b):
    return torch.cat([a, b], dim=-1)


CORE_WRONG = [
    (check_rope_half, rotation_with(_halves, _cat, turn=-1.0), ["turned the wrong way"]),
    (check_rope_half, rotation_with(_evens_odds, _interleave),
     ["that is the interleaved pairing", "channel i with channel i + D/2"]),
    (check_rope_half, rotation_with(_halves, _cat, swap=True), ["cos and sin are swapped"]),
    (check_rope_half, rotation_with(_halves, _interleave),
     ["came back in the interleaved channel order"]),
    (check_rope_half, rotation_with(_halves, _cat, first_only=True),
     ["a vector's length changed", "both channels at once"]),
    (check_rope_half, lambda x, cos, sin: rope_half(x.float(), cos, sin),
     ["expected torch.bfloat16, got torch.float32"]),
    (check_rope_interleaved, rotation_with(_halves, _cat),
     ["that is the half pairing", "channel 2i with channel 2i + 1"]),
    (check_rope_interleaved, rotation_with(_evens_odds, _cat),
     ["came back in the half channel order"]),
    (check_rope_interleaved, rotation_with(_evens_odds, _interleave, turn=-1.0),
     ["turned the wrong way"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch05_rope))
