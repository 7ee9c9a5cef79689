"""Chapter 2's checkers (``transformer_lib/checks/ch02_qkv_roles.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch
from check_solutions.ch02 import mirror_alignment, reversal_targets
from conftest import mistake_tests

from transformer_lib.checks import (
    ch02_qkv_roles,
    check_mirror_alignment,
    check_reversal_targets,
    check_transform_qk,
)

WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_reversal_targets, lambda src, bos: (src.flip(1), src.flip(1)),
     ["wrong values in tgt_in", "is not shifted"]),
    (check_reversal_targets, lambda src, bos: reversal_targets(src, 0),
     ["1 of 3 checks passed", "the `bos` argument (here 11)"]),
    (check_reversal_targets, lambda src, bos: (reversal_targets(src, bos)[0], src),
     ["wrong values in tgt_out", ".flip(1)"]),
    (check_reversal_targets, lambda src, bos: reversal_targets(src, bos)[1],
     ["return the pair (tgt_in, tgt_out)"]),
    (check_reversal_targets, lambda src, bos: tuple(t.float() for t in reversal_targets(src, bos)),
     ["wrong dtype for tgt_out: expected torch.int64, got torch.float32"]),
    (check_mirror_alignment,
     lambda w: (w.argmax(-1) == torch.arange(w.shape[-2])).float().mean(dim=(0, 2)),
     ["wrong values in the fractions", "compared with the diagonal"]),
    (check_mirror_alignment, lambda w: mirror_alignment(w.transpose(-2, -1)),
     ["argmax ran over the queries"]),
    (check_mirror_alignment, lambda w: mirror_alignment(w).mean(),
     ["wrong shape for the fractions: expected (H,) = (3,), got ()", "one fraction per head"]),
    (check_transform_qk, lambda Q, K, R: (Q @ R, K @ torch.linalg.inv(R)),
     ["the scores Q' K'ᵀ differ", "R⁻¹ where it needs R⁻ᵀ"]),
    (check_transform_qk, lambda Q, K, R: (Q @ R, K @ R), ["the same R on both sides"]),
    (check_transform_qk, lambda Q, K, R: Q @ R, ["return the pair (Q', K')"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch02_qkv_roles))
