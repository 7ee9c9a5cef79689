"""The harness the checkers share (``transformer_lib/checks/_harness.py``): helpers named
when unfinished, each hint once, a fault in a checker reported, the result shown once in a
notebook, numbers compared with their known mistakes, one wording per mask mistake."""
from __future__ import annotations

import math

import pytest
import torch

from transformer_lib.checks import (
    _harness,
    _results,
    ch01_attention,
    check_chunked_causal_attention,
    check_left_padded_causal_mask,
    check_score_scale,
    check_split_qkv,
)

from chapter_solutions import references
from conftest import run_check

chunked_causal_attention, score_scale = references(
    "01_attention", "chunked_causal_attention", "score_scale")
split_qkv, = references("03_multi_head", "split_qkv")


def test_unfinished_helper_is_named(capsys):
    def unfinished_attention(q, k, v, mask=None):
        raise NotImplementedError()

    def chunks_using_it(q, k, v, chunk):
        return unfinished_attention(q, k, v)

    result, printed = run_check(check_chunked_causal_attention, chunks_using_it, capsys)
    assert not result.attempted
    assert "calls `unfinished_attention`, which still raises NotImplementedError" in printed


def test_a_stub_in_the_error_path_is_not_attempted_yet(capsys):
    """The size check that must raise a ValueError follows the same rule as the values."""
    def split_qkv_without_check(qkv, n_heads):
        if qkv.shape[-1] % (3 * n_heads):
            raise NotImplementedError()
        return split_qkv(qkv, n_heads)

    result, printed = run_check(check_split_qkv, split_qkv_without_check, capsys)
    assert not result and not result.attempted
    assert "`split_qkv_without_check` still raises NotImplementedError" in printed
    assert len(printed.strip().splitlines()) == 1


def _float_and(lengths, T, S):
    """A plainly written attempt with a dtype slip: ``&`` on float tensors, for which PyTorch
    itself raises NotImplementedError."""
    real = (torch.arange(S)[None, :] >= S - lengths[:, None]).float()  # float by mistake
    causal = torch.ones(T, S).tril(S - T)
    return real[:, None, None, :] & causal


def _student(source: str, name: str):
    """Define ``name`` from ``source`` in a fresh namespace, as a notebook cell would."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("source", ["file", "exec"])
def test_torchs_not_implemented_error_is_a_failure_not_a_stub(source, capsys):
    """Only the stub's own ``raise NotImplementedError()`` means "not attempted yet"; PyTorch's
    NotImplementedError for a missing dtype kernel is a failure with its one-line reason, so
    the grader records "fail". From a file the raising line is read; from ``exec`` (no source)
    torch's exception is told apart by its message."""
    fn = _float_and if source == "file" else _student(
        "import torch\n"
        "def left_padded_causal_mask(lengths, T, S):\n"
        "    real = (torch.arange(S)[None, :] >= S - lengths[:, None]).float()\n"
        "    return real[:, None, None, :] & torch.ones(T, S).tril(S - T)\n",
        "left_padded_causal_mask")
    result, printed = run_check(check_left_padded_causal_mask, fn, capsys)
    assert result.attempted and not result.passed
    assert "not attempted" not in printed
    assert "raised NotImplementedError: " in printed
    assert all(len(f.splitlines()) == 1 for f in result.failures)
    if source == "file":
        assert "at `return real[:, None, None, :] & causal`" in printed


def test_the_stub_itself_is_not_attempted_from_exec_too(capsys):
    """Without readable source the stub's argument-less exception still reads as the stub."""
    stub = _student("def left_padded_causal_mask(lengths, T, S):\n"
                    "    # YOUR CODE HERE\n    raise NotImplementedError()\n",
                    "left_padded_causal_mask")
    result, printed = run_check(check_left_padded_causal_mask, stub, capsys)
    assert not result.attempted
    assert "not attempted yet" in printed


def test_each_hint_is_printed_once(capsys):
    def chunks_changing_q(q, k, v, chunk):
        return chunked_causal_attention(q.mul_(1.5), k, v, chunk)

    result, printed = run_check(check_chunked_causal_attention, chunks_changing_q, capsys)
    assert printed.count("changed its input `q` in place") == 8
    assert printed.count("Hint: work on new tensors") == 1


def test_a_fault_inside_the_checker_is_reported_not_raised(capsys, monkeypatch):
    def broken_reference(*args, **kwargs):
        raise RuntimeError("reference failed")

    monkeypatch.setattr(ch01_attention, "scaled_dot_product_attention", broken_reference)
    result, printed = run_check(check_chunked_causal_attention, chunked_causal_attention, capsys)
    assert not result
    assert "could not be checked (RuntimeError: reference failed)" in printed


def test_result_in_a_notebook_is_shown_once(capsys, monkeypatch):
    """In the cell that ran the checker the verdict is printed once; displayed in a later
    cell, the result prints it again."""
    monkeypatch.setattr(_results, "_cell_number", lambda: 5)
    result, printed = run_check(check_score_scale, score_scale, capsys)
    result._ipython_display_()
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(_results, "_cell_number", lambda: 6)
    result._ipython_display_()
    assert capsys.readouterr().out.strip() == result.report
    assert str(result) == result.report and repr(result) == "CheckResult(score_scale: passed)"


# Numbers ----------------------------------------------------------------------------------


def _failure(fn, *args, **kwargs) -> _harness._Failure:
    with pytest.raises(_harness._Failure) as caught:
        fn(*args, **kwargs)
    return caught.value


def test_a_number_is_compared_with_its_known_mistakes():
    mistakes = [(8.0, "forgot sigma"), (16.0, "one sigma")]
    _harness._compare_number(32.0 * (1 + 1e-8), 32.0, "the scale", mistakes=mistakes)
    _harness._compare_number(torch.tensor(32.0), 32.0, "the scale")  # a one-element tensor
    wrong = _failure(_harness._compare_number, 16, 32.0, "the scale", mistakes=mistakes)
    assert wrong.message == "wrong value for the scale: expected 32, got 16"
    assert wrong.hint == "one sigma"
    assert _failure(_harness._compare_number, 5.0, 32.0, "the scale").hint is None
    assert "NaN appeared in the scale" in _failure(
        _harness._compare_number, math.nan, 32.0, "the scale").message
    for odd, described in [(True, "type bool"), (None, "None"), ("32", "type str"),
                           (torch.ones(2), "a tensor of shape (2,)")]:
        failure = _failure(_harness._compare_number, odd, 32.0, "the scale")
        assert failure.message.startswith("the scale should be a number, got")
        assert described in failure.message


def test_an_argument_meant_to_change_in_place_is_passed_as_it_is():
    """An exercise that writes into a preallocated cache names the cache in ``in_place``: the
    function gets the checker's own tensor, and its change is not a failure."""
    def write(cache, value):
        cache[1] = value
        return cache

    cache = torch.zeros(3)
    assert _harness._call(write, [cache, 5.0], ["cache", "value"], in_place=("cache",)) is cache
    assert cache.tolist() == [0.0, 5.0, 0.0]
    with pytest.raises(_results._Failure, match="changed its input `cache` in place"):
        _harness._call(write, [torch.zeros(3), 5.0], ["cache", "value"])
