"""The associative-recall task (``transformer_lib/recall.py``): each memory against a direct
formulation, and the margins that chapter 9 asserts, for seeds 0-4."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_lib.recall import (
    recall,
    recall_accuracy,
    recall_pairs,
    recall_sweep,
    retrieval_error,
)

N_PAIRS = [2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 256]  # the chapter's sweep
D = 32  # its Dk = Dv


def test_pairs_are_unit_vectors_of_the_right_shapes():
    keys, values = recall_pairs(3, 5, 8, 6, generator=torch.Generator().manual_seed(1))
    assert keys.shape == (3, 5, 8) and values.shape == (3, 5, 6)
    assert keys.dtype == values.dtype == torch.float64
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64))
    torch.testing.assert_close(values.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64))


def test_linear_memory_is_the_sum_of_outer_products():
    keys, values = recall_pairs(2, 7, 5, 4)
    state = torch.einsum("bnv,bnk->bvk", values, keys)  # Σ v kᵀ
    expected = torch.einsum("bvk,bnk->bnv", state, keys)
    torch.testing.assert_close(recall(keys, values, "linear"), expected, atol=1e-12, rtol=0)


def test_delta_memory_is_the_delta_rule_written_by_hand():
    keys, values = recall_pairs(2, 6, 5, 3)
    state = torch.zeros(2, 3, 5, dtype=torch.float64)
    for _ in range(2):  # two passes
        for t in range(6):
            k, v = keys[:, t], values[:, t]
            error = v - torch.einsum("bvk,bk->bv", state, k)
            state = state + torch.einsum("bv,bk->bvk", error, k)  # β = 1
    expected = torch.einsum("bvk,bnk->bnv", state, keys)
    torch.testing.assert_close(recall(keys, values, "delta", passes=2), expected,
                               atol=1e-12, rtol=0)
    last = recall(keys, values, "delta")[:, -1]  # β = 1: the last key reads its value exactly
    torch.testing.assert_close(last, values[:, -1], atol=1e-12, rtol=0)


def test_softmax_memory_is_attention_over_the_stored_pairs():
    keys, values = recall_pairs(2, 9, 4, 3)
    weights = torch.softmax(7.0 * keys @ keys.transpose(1, 2), dim=-1)
    torch.testing.assert_close(recall(keys, values, "softmax", scale=7.0), weights @ values)


def test_the_best_fixed_state_is_exact_up_to_dk_pairs_and_never_beyond():
    keys, values = recall_pairs(4, 8, 8, 5)  # N = Dk
    assert retrieval_error(recall(keys, values, "least_squares"), values) < 1e-10
    keys, values = recall_pairs(4, 9, 8, 5)  # N = Dk + 1: one equation too many
    assert retrieval_error(recall(keys, values, "least_squares"), values) > 1e-3


def test_no_state_beats_the_least_squares_state():
    keys, values = recall_pairs(3, 20, 8, 8)
    best = ((recall(keys, values, "least_squares") - values) ** 2).sum()
    for method in ("linear", "delta"):
        assert ((recall(keys, values, method) - values) ** 2).sum() >= best


def test_accuracy_counts_the_nearest_value():
    values = torch.eye(3, dtype=torch.float64)[None]  # (1, 3, 3)
    outputs = torch.tensor([[[0.9, 0.1, 0.0], [0.0, 0.2, 0.8], [0.0, 0.0, 1.0]]],
                           dtype=torch.float64)
    assert recall_accuracy(outputs, values) == pytest.approx(2 / 3)


def test_bad_input_is_refused():
    keys, values = recall_pairs(1, 4, 3, 3)
    with pytest.raises(ValueError, match="method must be"):
        recall(keys, values, "cache")
    with pytest.raises(ValueError, match="same"):
        recall(keys, values[:, :3], "linear")
    with pytest.raises(ValueError, match="passes"):
        recall(keys, values, "delta", passes=0)
    with pytest.raises(ValueError, match=r"keys must be a \(B, N, D\) tensor .* shape \(4, 3\)"):
        recall(keys[0], values, "linear")
    with pytest.raises(ValueError, match=r"values must be a \(B, N, D\) tensor .* got list"):
        recall(keys, [[0.0]], "softmax")


def test_the_delta_memory_keeps_the_keys_dtype():
    keys, values = recall_pairs(2, 5, 4, 3, dtype=torch.float32)
    out = recall(keys, values, "delta")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[:, -1], values[:, -1], atol=1e-5, rtol=0)  # fp32 rounding


@pytest.mark.parametrize("seed", range(5))
def test_the_chapters_margins_hold_for_seeds_0_to_4(seed):
    """What chapter 9 asserts about its sweep (it runs seed 0)."""
    sweep = recall_sweep(N_PAIRS, D, D, seed=seed)
    error, accuracy = sweep["error"], sweep["accuracy"]
    at = {n: i for i, n in enumerate(N_PAIRS)}
    within = [at[n] for n in N_PAIRS if n <= D]
    beyond = [at[n] for n in N_PAIRS if n >= 2 * D]
    assert error["softmax attention"].max() < 1e-4
    assert accuracy["softmax attention"].min() == 1.0
    assert error["best fixed state"][within].max() < 1e-9
    assert error["best fixed state"][at[40]] > 0.3
    assert (error["linear attention"] > error["delta rule"]).all()
    assert error["linear attention"][at[4]] > 0.2
    crosstalk = np.sqrt((np.array(N_PAIRS) - 1) / D)  # the chapter's sqrt((N - 1) / Dk)
    large = [at[n] for n in N_PAIRS if n >= 16]
    assert (abs(error["linear attention"][large] / crosstalk[large] - 1) < 0.08).all()
    assert error["delta rule, 4 passes"][at[8]] < 0.05
    for name in ("linear attention", "delta rule", "delta rule, 4 passes", "best fixed state"):
        assert error[name][beyond].min() > 0.5
    assert accuracy["best fixed state"][at[128]] < 0.7
    assert sweep["state_numbers"] == D * D
    assert sweep["cache_numbers"][at[256]] == 256 * 2 * D
