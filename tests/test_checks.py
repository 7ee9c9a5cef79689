"""The exercise checkers: each passes the reference solution, names the usual mistakes in words
a student can act on, and never raises into the notebook."""
from __future__ import annotations

import pytest
import torch

from conftest import randomize_, run_check
from transformer_lib import checks
from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.checks import (
    CheckResult,
    check_attention,
    check_merge_heads,
    check_mha_shapes,
    check_repeat_kv,
    check_softmax,
    check_split_heads,
)

# Reference solutions, as in chapters/00_setup.ipynb ------------------------------------------


def mha_shapes(B, T, S, C, H, H_kv):
    D = C // H
    return (B, T, C), (B, H, T, S), (H_kv * D, C)


def softmax(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def repeat_kv(x, n_rep):
    B, H_kv, S, D = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)


def split_heads(x, n_heads):
    B, T, C = x.shape
    if C % n_heads != 0:
        raise ValueError(f"C ({C}) must be divisible by n_heads ({n_heads})")
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


REFERENCES = [
    (check_mha_shapes, mha_shapes),
    (check_softmax, softmax),
    (check_attention, attention),
    (check_repeat_kv, repeat_kv),
    (check_split_heads, split_heads),
    (check_merge_heads, merge_heads),
]
CHECK_IDS = [check.__name__ for check, _ in REFERENCES]


# Plausible wrong solutions --------------------------------------------------------------------


def _scores(q, k, scale):
    return q @ k.transpose(-2, -1) / scale


def _masked_softmax(scores, mask, fill=float("-inf")):
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    return torch.softmax(scores, dim=-1)


def attention_without_scale(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, 1.0), mask).nan_to_num()
    return w @ v, w


def attention_scaled_by_d(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1]), mask).nan_to_num()
    return w @ v, w


def attention_masked_after_softmax(q, k, v, mask=None):
    w = torch.softmax(_scores(q, k, q.shape[-1] ** 0.5), dim=-1)
    if mask is not None:
        w = w * mask
    return w @ v, w


def attention_inverted_mask(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), None if mask is None else ~mask)
    return w @ v, w


def attention_ignoring_mask(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), None)
    return w @ v, w


def attention_nan_without_visible_key(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), mask)  # no fix for all-blocked rows
    return w @ v, w


def attention_finite_fill(q, k, v, mask=None):
    w = _masked_softmax(_scores(q, k, q.shape[-1] ** 0.5), mask, fill=-1e9)
    return w @ v, w


def attention_unstable_softmax(q, k, v, mask=None):
    s = _scores(q, k, q.shape[-1] ** 0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = s.exp()
    w = (e / e.sum(dim=-1, keepdim=True))
    if mask is not None:
        w = w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return w @ v, w


def attention_reads_keys(q, k, v, mask=None):
    out, w = attention(q, k, v, mask)
    return w @ k, w


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, S, T), (H_kv * C // H, C)),
     ["wrong shape of last_weights", "one row per query and one column per key"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H_kv, T, S), (H_kv * C // H, C)),
     ["every query head has its own weights"]),
    (check_mha_shapes, lambda B, T, S, C, H, H_kv: ((B, T, C), (B, H, T, S), (C, H_kv * C // H)),
     ["wrong shape of k_proj.weight", "(out_features, in_features)"]),
    (check_softmax, lambda x, dim=-1: x.exp() / x.exp().sum(dim=dim, keepdim=True),
     ["large scores: x + 1000: NaN appeared", "subtract the maximum", "underflows to 0"]),
    (check_softmax, lambda x, dim=-1: softmax(x, -1),
     ["do not sum to 1", "normalise along the `dim` argument (here 0)"]),
    (check_softmax, lambda x, dim=-1: torch.softmax(x.flatten(), 0).view_as(x),
     ["normalised over the whole tensor"]),
    (check_softmax, lambda x, dim=-1: (x.exp() / x.exp().sum(dim=dim)),
     ["raised RuntimeError", "keepdim=True"]),
    (check_softmax, lambda x, dim=-1: softmax(x.sub_(x.amax(dim=dim, keepdim=True)), dim),
     ["changed its input `x` in place"]),
    (check_attention, attention_without_scale,
     ["wrong values in the weights", "not scaled: divide q·kᵀ by √D (√8 = 2.83)"]),
    (check_attention, attention_scaled_by_d, ["scores divided by D = 8"]),
    (check_attention, attention_masked_after_softmax,
     ["rows do not sum to 1", "zeroed after the softmax", "fill the blocked scores with -inf"]),
    (check_attention, attention_inverted_mask, ["NaN appeared", "the mask inverted"]),
    (check_attention, attention_ignoring_mask,
     ["masked positions receive weight", "attention without the mask"]),
    (check_attention, attention_nan_without_visible_key,
     ["4 of 5 checks passed", "NaN appeared in the weights at batch 0, head 0, query 1",
      "may attend to no key"]),
    (check_attention, attention_finite_fill,
     ["4 of 5 checks passed", "masked positions receive weight", "uniform average"]),
    (check_attention, attention_unstable_softmax,
     ["large scores (q and k times 8): NaN appeared", "exp overflows"]),
    (check_attention, attention_reads_keys, ["wrong values in the output", "not weights @ k"]),
    (check_attention, lambda q, k, v, mask=None: attention(q, k, v, mask)[0],
     ["return the pair (out, weights)"]),
    (check_repeat_kv, lambda x, n_rep: x.repeat(1, n_rep, 1, 1),
     ["output heads hold key/value heads [0, 1, 0, 1]; expected [0, 0, 1, 1]", "tiled"]),
    (check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=2),
     ["wrong shape", "you repeated the positions (dim 2)"]),
    (check_repeat_kv, lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1),
     ["wrong shape", "merge the two head axes"]),
    (check_split_heads, lambda x, n_heads: x.view(x.shape[0], n_heads, x.shape[1], -1),
     ["wrong values in the output", "reshaped straight from (B, T, C) to (B, H, T, D)",
      "then transpose(1, 2)", "instead of a ValueError"]),
    (check_split_heads, lambda x, n_heads: split_heads(x, n_heads).transpose(1, 2),
     ["wrong shape for the output: expected (B, H, T, D) = (2, 3, 5, 4), got (2, 5, 3, 4)",
      ".transpose(1, 2)"]),
    (check_split_heads,
     lambda x, n_heads: split_heads(x, x.shape[-1] // n_heads).permute(0, 3, 2, 1),
     ["every H-th channel"]),
    (check_split_heads, lambda x, n_heads: split_heads(x, n_heads) if x.shape[-1] % n_heads == 0
     else (_ for _ in ()).throw(ValueError("bad sizes")),
     ["3 of 4 checks passed", "does not give the sizes 10, 3"]),
    (check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1),
     ["wrong values in the output", "mixes heads and positions"]),
    (check_merge_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
     ["raised RuntimeError: view size is not compatible", "use .reshape"]),
    (check_merge_heads, lambda x: x.transpose(1, 2),
     ["wrong shape", "merge the last two axes"]),
]




# Tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_reference_solution_passes(check, solution, capsys):
    result, printed = run_check(check, solution, capsys)
    assert result and result.passed and result.attempted and result.failures == []
    assert "checks passed." in printed.splitlines()[0] and "✗" not in printed
    assert repr(result).endswith(": passed)")


@pytest.mark.parametrize("check, wrong, fragments", WRONG,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_wrong_solution_is_rejected_with_the_reason(check, wrong, fragments, capsys):
    result, printed = run_check(check, wrong, capsys)
    assert not result and result.attempted and result.failures
    for fragment in fragments:
        assert fragment in printed, f"{fragment!r} not in:\n{printed}"


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_untouched_stub_is_not_attempted_yet(check, solution, capsys):
    def stub(*args):
        # YOUR CODE HERE
        raise NotImplementedError()

    result, printed = run_check(check, stub, capsys)
    assert not result and not result.attempted
    assert "not attempted yet" in printed and "`stub` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1, "one line, not one per check"


def test_unfinished_helper_is_named(capsys):
    def unfinished_softmax(x, dim=-1):
        raise NotImplementedError()

    def attention_using_it(q, k, v, mask=None):
        w = unfinished_softmax(q @ k.transpose(-2, -1))
        return w @ v, w

    result, printed = run_check(check_attention, attention_using_it, capsys)
    assert not result.attempted
    assert "calls `unfinished_softmax`, which still raises NotImplementedError" in printed


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_raising_solution_gets_a_one_line_summary(check, solution, capsys):
    message = "index 7 is out of bounds\nsecond line of detail"

    def broken(*args):
        raise IndexError(message)

    result, printed = run_check(check, broken, capsys)
    assert not result and result.attempted
    assert "raised IndexError: index 7 is out of bounds at `raise IndexError(message)`" in printed
    assert "second line" not in printed


@pytest.mark.parametrize("check, solution", REFERENCES[1:], ids=CHECK_IDS[1:])
def test_nan_producing_solution_is_reported(check, solution, capsys):
    def nan_everywhere(*args):
        out = solution(*args)
        if isinstance(out, tuple):
            return tuple(torch.full_like(t, float("nan")) for t in out)
        return torch.full_like(out, float("nan"))

    result, printed = run_check(check, nan_everywhere, capsys)
    assert not result
    assert "NaN appeared in " in printed


@pytest.mark.parametrize("value", [None, "a string", 3, (1, 2), [torch.zeros(1)]],
                         ids=["None", "str", "int", "tuple", "list"])
@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_odd_return_values_never_escape(check, solution, value, capsys):
    result, printed = run_check(check, lambda *args: value, capsys)
    assert not result and "✗" in printed


def test_not_a_function(capsys):
    result, printed = run_check(check_softmax, 42, capsys)
    assert not result
    assert "expected a function to check, got a value of type int" in printed


def test_a_fault_inside_the_checker_is_reported_not_raised(capsys, monkeypatch):
    def broken_reference(*args, **kwargs):
        raise RuntimeError("reference failed")

    monkeypatch.setattr(checks, "scaled_dot_product_attention", broken_reference)
    result, printed = run_check(check_attention, attention, capsys)
    assert not result
    assert "could not be checked (RuntimeError: reference failed)" in printed


@pytest.mark.parametrize("check, solution", REFERENCES, ids=CHECK_IDS)
def test_checking_leaves_the_global_random_state_alone(check, solution, capsys):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    check(solution)
    assert torch.equal(state, torch.get_rng_state())


def test_each_hint_is_printed_once(capsys):
    result, printed = run_check(check_softmax, lambda x, dim=-1: softmax(x.sub_(0.5), dim), capsys)
    assert printed.count("changed its input `x` in place") == 6
    assert printed.count("Hint: work on new tensors") == 1


@torch.no_grad()
def test_reference_heads_follow_multi_head_attention():
    """The layout that check_split_heads and check_merge_heads expect is the one
    MultiHeadAttention uses: with identity projections, the layer is merge(sdpa(split(x)))."""
    B, T, C, H = 2, 5, 12, 3
    mha = randomize_(MultiHeadAttention(C, H))
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj):
        proj.weight.copy_(torch.eye(C))
        proj.bias.zero_()
    x = torch.randn(B, T, C)
    heads = checks._split_heads(x, H)  # (B, H, T, D)
    out, _ = scaled_dot_product_attention(heads, heads, heads)
    torch.testing.assert_close(mha(x), checks._merge_heads(out), atol=1e-6, rtol=1e-6)
    assert torch.equal(checks._merge_heads(heads), x)


def test_result_in_a_notebook_is_shown_once(capsys, monkeypatch):
    """In the cell that ran the checker the verdict is printed once; displayed in a later
    cell, the result prints it again."""
    monkeypatch.setattr(checks, "_cell_number", lambda: 5)
    result, printed = run_check(check_softmax, softmax, capsys)
    result._ipython_display_()
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(checks, "_cell_number", lambda: 6)
    result._ipython_display_()
    assert capsys.readouterr().out.strip() == result.report
    assert str(result) == result.report and repr(result) == "CheckResult(softmax: passed)"
