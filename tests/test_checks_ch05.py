"""Chapter 5's checkers (``transformer_lib/checks/ch05_positions.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks import (
    ch05_positions,
    check_rope_cached_attention,
    check_rope_interleaved,
    check_sinusoid_shift_matrix,
)
from transformer_lib.positional import apply_rope

from chapter_solutions import references
from conftest import mistake_tests

rope_cached_attention, rope_interleaved, sinusoid_shift_matrix = references(
    "05_positional", "rope_cached_attention", "rope_interleaved", "sinusoid_shift_matrix")


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


def interleaved_tiled_tables(x, cos, sin):
    """The classic bug: the tables side by side (cat) where each column must repeat."""
    swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * torch.cat([cos, cos], -1) + swapped * torch.cat([sin, sin], -1)


def interleaved_not_put_back(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


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
    (check_rope_interleaved, lambda x, cos, sin: apply_rope(x, cos, sin, "half"),
     ["0 of 3 checks passed", "should be split-half RoPE of the reordered input",
      "the split-half pairing"]),
    (check_rope_interleaved, lambda x, cos, sin: rope_interleaved(x, cos, -sin),
     ["the pairs turn the wrong way"]),
    (check_rope_interleaved, interleaved_not_put_back, ["back into channels 2i and 2i+1"]),
    (check_rope_interleaved, interleaved_tiled_tables, ["repeat each column twice"]),
    (check_rope_interleaved, lambda x, cos, sin: rope_interleaved(x, cos, sin).float(),
     ["2 of 3 checks passed", "wrong dtype for the output"]),
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


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch05_positions))
