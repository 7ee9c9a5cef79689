"""Chapter 1's checkers (``transformer_lib/checks/ch01_attention.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch
from check_solutions.ch01 import causal_mask, softmax_jacobian
from conftest import mistake_tests

from transformer_lib.checks import (
    ch01_attention,
    check_causal_mask,
    check_masked_softmax,
    check_softmax_jacobian,
)


def _naive_jacobian(x):
    e = x.exp()
    p = e / e.sum()
    return torch.diag(p) - torch.outer(p, p)  # (n, n)


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(),
     ["1 of 3 checks passed", "wrong values in the mask", "shift the diagonal by S - T"]),
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T),
     ["upper-triangular"]),
    (check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1),
     ["off by one", "the diagonal belongs"]),
    (check_causal_mask, lambda T, S: torch.ones(T, T, dtype=torch.bool).tril(),
     ["wrong shape for the mask: expected (T, S) = (3, 7), got (3, 3)", "not (T, T)"]),
    (check_causal_mask, lambda T, S: causal_mask(T, S).float(), ["should be boolean"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), -1),
     ["masked positions receive weight", "0 is just another score"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s, -1) * m,
     ["rows do not sum to 1", "zeroed after the softmax"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1),
     ["3 of 4 checks passed", "NaN appeared in the weights", "mask.any(dim=-1, keepdim=True)"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1),
     ["3 of 4 checks passed", "uniform average"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), -1),
     ["the mask inverted"]),
    (check_masked_softmax, lambda s, m: torch.softmax(s, -1),
     ["masked positions receive weight", "a softmax without the mask"]),
    (check_softmax_jacobian, lambda x: torch.diag(torch.softmax(x, 0)),
     ["wrong values in the Jacobian", "subtract p pᵀ"]),
    (check_softmax_jacobian, lambda x: -softmax_jacobian(x), ["the sign is flipped"]),
    (check_softmax_jacobian, _naive_jacobian,
     ["large scores: x + 1000: NaN appeared", "subtracts the maximum"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch01_attention))
