"""The checkers of the exercises in chapters 1 to 3: each passes the reference solution, names
the usual mistakes, reports an untouched stub as not attempted yet and never raises."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import run_check
from transformer_lib.checks import (
    CheckResult,
    check_causal_mask,
    check_head_weight,
    check_masked_softmax,
    check_mha_param_count,
    check_mirror_alignment,
    check_multi_head,
    check_reversal_targets,
    check_softmax_jacobian,
    check_transform_qk,
)

# Reference solutions, as in the chapters ---------------------------------------------------


def causal_mask(T, S):
    rows = torch.arange(T)[:, None] + (S - T)
    return torch.arange(S)[None, :] <= rows


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def softmax_jacobian(x):
    p = torch.softmax(x, dim=0)
    return torch.diag(p) - torch.outer(p, p)


def reversal_targets(src, bos):
    tgt_out = src.flip(1)
    start = torch.full_like(src[:, :1], bos)
    return torch.cat([start, tgt_out[:, :-1]], dim=1), tgt_out


def mirror_alignment(weights):
    T = weights.shape[-2]
    hits = weights.argmax(dim=-1) == torch.arange(T - 1, -1, -1)
    return hits.float().mean(dim=(0, 2))


def transform_qk(Q, K, R):
    return Q @ R, K @ torch.linalg.inv(R).T


def mha_param_count(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def head_weight(weight, n_heads, h):
    D = weight.shape[0] // n_heads
    return weight[h * D:(h + 1) * D]


def multi_head(x, w_q, w_k, w_v, w_o, n_heads, mask=None, *, split_ok=True, merge_ok=True,
               scale=None, transpose_w=True):
    B, T, C = x.shape
    D = C // n_heads

    def proj(t, w):
        return t @ (w.T if transpose_w else w)

    def split(t):
        if split_ok:
            return t.view(B, T, n_heads, D).transpose(1, 2)
        return t.view(B, n_heads, T, D)

    q, k, v = split(proj(x, w_q)), split(proj(x, w_k)), split(proj(x, w_v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(scale or D)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    out = out.transpose(1, 2).reshape(B, T, C) if merge_ok else out.reshape(B, T, C)
    return proj(out, w_o)


REFERENCES = [
    (check_causal_mask, causal_mask),
    (check_masked_softmax, masked_softmax),
    (check_softmax_jacobian, softmax_jacobian),
    (check_reversal_targets, reversal_targets),
    (check_mirror_alignment, mirror_alignment),
    (check_transform_qk, transform_qk),
    (check_mha_param_count, mha_param_count),
    (check_head_weight, head_weight),
    (check_multi_head, multi_head),
]
CHECK_IDS = [check.__name__ for check, _ in REFERENCES]
TENSOR_CHECKS = [r for r in REFERENCES if r[0] is not check_mha_param_count]


def _naive_jacobian(x):
    e = x.exp()
    p = e / e.sum()
    return torch.diag(p) - torch.outer(p, p)


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
    (check_softmax_jacobian, lambda x: torch.diag(torch.softmax(x, 0)),
     ["wrong values in the Jacobian", "subtract p pᵀ"]),
    (check_softmax_jacobian, lambda x: -softmax_jacobian(x), ["the sign is flipped"]),
    (check_softmax_jacobian, _naive_jacobian,
     ["large scores: x + 1000: NaN appeared", "subtracts the maximum"]),
    (check_reversal_targets, lambda src, bos: (src.flip(1), src.flip(1)),
     ["wrong values in tgt_in", "is not shifted"]),
    (check_reversal_targets, lambda src, bos: reversal_targets(src, 0),
     ["1 of 3 checks passed", "the `bos` argument (here 11)"]),
    (check_reversal_targets, lambda src, bos: (reversal_targets(src, bos)[0], src),
     ["wrong values in tgt_out", ".flip(1)"]),
    (check_reversal_targets, lambda src, bos: reversal_targets(src, bos)[1],
     ["return the pair (tgt_in, tgt_out)"]),
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
    (check_mha_param_count, lambda C, H, bias=True: H * mha_param_count(C, H, bias),
     ["1 of 3 checks passed", "expected 16640 parameters, got 133120", "does not depend on "
      "n_heads"]),
    (check_mha_param_count, lambda C, H, bias=True: 3 * C * C + 3 * C,
     ["the output projection W_O counts too"]),
    (check_mha_param_count, lambda C, H, bias=True: 4 * C * C + 4 * C,
     ["2 of 3 checks passed", "with bias=False the projections have no bias vectors"]),
    (check_mha_param_count, lambda C, H, bias=True: "16640",
     ["expected a whole number of parameters"]),
    (check_head_weight, lambda w, H, h: w[:, h * (w.shape[0] // H):(h + 1) * (w.shape[0] // H)],
     ["wrong shape for the head's weight", "take rows, not columns"]),
    (check_head_weight, lambda w, H, h: w[h::H], ["not every H-th row"]),
    (check_head_weight, lambda w, H, h: head_weight(w, H, h - 1) if h else head_weight(w, H, 1),
     ["heads are counted from 0"]),
    (check_multi_head, lambda *a: multi_head(*a, split_ok=False),
     ["wrong values in the output", "reshape straight to (B, H, T, D)"]),
    (check_multi_head, lambda *a: multi_head(*a, merge_ok=False),
     ["merged without the transpose"]),
    (check_multi_head, lambda x, *a: multi_head(x, *a, scale=x.shape[-1]),
     ["divided by √C", "√D = √4"]),
    (check_multi_head, lambda *a: multi_head(*a, transpose_w=False),
     ["nn.Linear computes x Wᵀ"]),
]




@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_reference_solution_passes(check, solution, capsys):
    result, printed = run_check(check, solution, capsys)
    assert result and result.attempted and result.failures == []
    assert "checks passed." in printed.splitlines()[0] and "✗" not in printed


@pytest.mark.parametrize("check, wrong, fragments", WRONG,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_wrong_solution_is_rejected_with_the_reason(check, wrong, fragments, capsys):
    result, printed = run_check(check, wrong, capsys)
    assert not result and result.attempted and result.failures
    for fragment in fragments:
        assert fragment in printed, f"{fragment!r} not in:\n{printed}"


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_every_checker_knows_at_least_two_mistakes(check, solution):
    assert sum(c is check for c, _, _ in WRONG) >= 2


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_untouched_stub_is_not_attempted_yet(check, solution, capsys):
    def stub(*args):
        # YOUR CODE HERE
        raise NotImplementedError()

    result, printed = run_check(check, stub, capsys)
    assert not result and not result.attempted
    assert "not attempted yet" in printed and "`stub` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_raising_solution_gets_a_one_line_summary(check, solution, capsys):
    message = "index 7 is out of bounds\nsecond line of detail"

    def broken(*args):
        raise IndexError(message)

    result, printed = run_check(check, broken, capsys)
    assert not result and result.attempted
    assert "raised IndexError: index 7 is out of bounds" in printed
    assert "second line" not in printed


@pytest.mark.parametrize("check, solution", TENSOR_CHECKS, ids=[c.__name__ for c, _ in TENSOR_CHECKS])
def test_nan_producing_solution_is_reported(check, solution, capsys):
    def nan_everywhere(*args):
        out = solution(*args)
        if isinstance(out, tuple):
            return tuple(torch.full_like(t, float("nan"), dtype=torch.float64) for t in out)
        return torch.full_like(out, float("nan"), dtype=torch.float32)

    result, printed = run_check(check, nan_everywhere, capsys)
    assert not result and "✗" in printed


@pytest.mark.parametrize("value", [None, "a string", 3, (1, 2), [torch.zeros(1)]],
                         ids=["None", "str", "int", "tuple", "list"])
@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_odd_return_values_never_escape(check, solution, value, capsys):
    result, printed = run_check(check, lambda *args: value, capsys)
    assert not result and "✗" in printed


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_checking_leaves_the_global_random_state_alone(check, solution, capsys):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    check(solution)
    assert torch.equal(state, torch.get_rng_state())
