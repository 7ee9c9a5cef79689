"""The setup chapter's checkers (``transformer_lib/checks/ch00_setup.py``) name the usual
mistakes in words a student can act on. The contract every checker keeps (reference passes,
stubs, exceptions, NaN) is in ``test_checks_contract.py``."""
from __future__ import annotations

from transformer_lib.checks import (
    ch00_setup,
    check_mha_shapes,
)

from conftest import mistake_tests

WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, S, T), (H_kv * C // H, C)),
     ["wrong shape of last_weights", "one row per query and one column per key"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H_kv, T, S), (H_kv * C // H, C)),
     ["every query head has its own weights"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, T, S), (C, H_kv * C // H)),
     ["wrong shape of k_proj.weight", "(out_features, in_features)"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, T, S)),
     ["return three shapes, those of the output, of last_weights and of k_proj.weight"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch00_setup))
