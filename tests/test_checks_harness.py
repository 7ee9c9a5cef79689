"""The harness the checkers share (``transformer_lib/checks/_harness.py``) and the references
and mask mistakes of ``_reference.py``: helpers named when unfinished, each hint once, a fault
in a checker reported, the result shown once in a notebook, one wording per mask mistake."""
from __future__ import annotations

import pytest
import torch
from check_solutions.ch01 import attention, softmax
from check_solutions.ch03 import split_heads
from conftest import randomize_, run_check

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.checks import (
    _harness,
    _reference,
    ch01_attention,
    check_attention,
    check_masked_softmax,
    check_softmax,
    check_split_heads,
)


def test_unfinished_helper_is_named(capsys):
    def unfinished_softmax(x, dim=-1):
        raise NotImplementedError()

    def attention_using_it(q, k, v, mask=None):
        w = unfinished_softmax(q @ k.transpose(-2, -1))
        return w @ v, w

    result, printed = run_check(check_attention, attention_using_it, capsys)
    assert not result.attempted
    assert "calls `unfinished_softmax`, which still raises NotImplementedError" in printed


def test_a_stub_in_the_error_path_is_not_attempted_yet(capsys):
    """The size check that must raise a ValueError follows the same rule as the values."""
    def split_heads_without_check(x, n_heads):
        if x.shape[-1] % n_heads:
            raise NotImplementedError()
        return split_heads(x, n_heads)

    result, printed = run_check(check_split_heads, split_heads_without_check, capsys)
    assert not result and not result.attempted
    assert "`split_heads_without_check` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1


def test_each_hint_is_printed_once(capsys):
    result, printed = run_check(check_softmax, lambda x, dim=-1: softmax(x.sub_(0.5), dim), capsys)
    assert printed.count("changed its input `x` in place") == 6
    assert printed.count("Hint: work on new tensors") == 1


def test_a_fault_inside_the_checker_is_reported_not_raised(capsys, monkeypatch):
    def broken_reference(*args, **kwargs):
        raise RuntimeError("reference failed")

    monkeypatch.setattr(ch01_attention, "scaled_dot_product_attention", broken_reference)
    result, printed = run_check(check_attention, attention, capsys)
    assert not result
    assert "could not be checked (RuntimeError: reference failed)" in printed


def test_result_in_a_notebook_is_shown_once(capsys, monkeypatch):
    """In the cell that ran the checker the verdict is printed once; displayed in a later
    cell, the result prints it again."""
    monkeypatch.setattr(_harness, "_cell_number", lambda: 5)
    result, printed = run_check(check_softmax, softmax, capsys)
    result._ipython_display_()
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(_harness, "_cell_number", lambda: 6)
    result._ipython_display_()
    assert capsys.readouterr().out.strip() == result.report
    assert str(result) == result.report and repr(result) == "CheckResult(softmax: passed)"


@torch.no_grad()
def test_reference_heads_follow_multi_head_attention():
    """The layout that check_split_heads, check_merge_heads and check_multi_head expect is the
    one MultiHeadAttention uses: with identity projections, the layer is
    merge(sdpa(split(x)))."""
    B, T, C, H = 2, 5, 12, 3
    mha = randomize_(MultiHeadAttention(C, H))
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj):
        proj.weight.copy_(torch.eye(C))
        proj.bias.zero_()
    x = torch.randn(B, T, C)
    heads = _reference._split_heads(x, H)  # (B, H, T, D)
    out, _ = scaled_dot_product_attention(heads, heads, heads)
    torch.testing.assert_close(mha(x), _reference._merge_heads(out), atol=1e-6, rtol=1e-6)
    assert torch.equal(_reference._merge_heads(heads), x)


# One wording per mask mistake ----------------------------------------------------------------

MASK_MISTAKES = {
    "applied after the softmax": lambda s, m: torch.softmax(s, -1) * m,
    "inverted": lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), -1),
    "blocked scores set to 0": lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), -1),
    "ignored": lambda s, m: torch.softmax(s, -1),
    "empty row uniform": lambda s, m: torch.softmax(
        s.masked_fill(~m, torch.finfo(s.dtype).min), -1),
}


def _hints(report: str) -> set[str]:
    return {line.strip().removeprefix("Hint: ") for line in report.splitlines()
            if line.strip().startswith("Hint: ")}


@pytest.mark.parametrize("mistake", MASK_MISTAKES, ids=list(MASK_MISTAKES))
def test_a_mask_mistake_gets_the_same_hint_in_both_checkers(mistake, capsys):
    """check_attention and check_masked_softmax name each mask mistake with the one hint
    that _mask_mistakes gives it."""
    masked_softmax = MASK_MISTAKES[mistake]

    def attention_with_it(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, T, S)
        w = torch.softmax(scores, -1) if mask is None else masked_softmax(scores, mask)
        return w @ v, w

    scores = torch.randn(2, 3)  # (T, S), its second row with no visible key
    mask = torch.tensor([[True, False, True], [False, False, False]])
    all_mask_hints = {hint for _, hint in _reference._mask_mistakes(scores, mask)}
    assert len(all_mask_hints) == len(MASK_MISTAKES)
    in_softmax = _hints(run_check(check_masked_softmax, masked_softmax, capsys)[0].report)
    in_attention = _hints(run_check(check_attention, attention_with_it, capsys)[0].report)
    assert len(in_softmax & all_mask_hints) == 1
    assert in_softmax & all_mask_hints == in_attention & all_mask_hints
