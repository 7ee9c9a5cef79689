"""The associative-recall task (``transformer_lib/recall.py``): each memory against a direct
formulation, and the margins that chapter 9 asserts, for seeds 0-4."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_lib.recall import (
    attribute_recall_data,
    load_kv_heads_recall,
    recall,
    recall_accuracy,
    recall_age_sweep,
    recall_by_age,
    recall_pairs,
    recall_sweep,
    retrieval_error,
    shared_kv_recall,
)

N_PAIRS = [2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 256]  # the chapter's sweep
D = 32  # its Dk = Dv


def test_pairs_are_unit_vectors_of_the_right_shapes():
    keys, values = recall_pairs(3, 5, 8, 6, generator=torch.Generator().manual_seed(1))
    assert keys.shape == (3, 5, 8) and values.shape == (3, 5, 6)
    assert keys.dtype == values.dtype == torch.float64
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64))
    torch.testing.assert_close(values.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64))


@pytest.mark.equality
def test_linear_memory_is_the_sum_of_outer_products(ledger):
    keys, values = recall_pairs(2, 7, 5, 4)
    state = torch.einsum("bnv,bnk->bvk", values, keys)  # Σ v kᵀ
    expected = torch.einsum("bvk,bnk->bnv", state, keys)
    ledger.check("linear memory read-out", "Σ v kᵀ by einsum", recall(keys, values, "linear"),
                 expected, tol=1e-12)


@pytest.mark.equality
def test_delta_memory_is_the_delta_rule_written_by_hand(ledger):
    keys, values = recall_pairs(2, 6, 5, 3)
    state = torch.zeros(2, 3, 5, dtype=torch.float64)
    for _ in range(2):  # two passes
        for t in range(6):
            k, v = keys[:, t], values[:, t]
            error = v - torch.einsum("bvk,bk->bv", state, k)
            state = state + torch.einsum("bv,bk->bvk", error, k)  # β = 1
    expected = torch.einsum("bvk,bnk->bnv", state, keys)
    ledger.check("delta memory read-out, 2 passes", "the delta rule by hand",
                 recall(keys, values, "delta", passes=2), expected, tol=1e-12)
    last = recall(keys, values, "delta")[:, -1]  # β = 1: the last key reads its value exactly
    ledger.check("delta memory, the last key", "its value", last, values[:, -1], tol=1e-12)


@pytest.mark.equality
def test_softmax_memory_is_attention_over_the_stored_pairs(ledger):
    keys, values = recall_pairs(2, 9, 4, 3)
    weights = torch.softmax(7.0 * keys @ keys.transpose(1, 2), dim=-1)
    ledger.check("softmax memory read-out", "softmax(7 K Kᵀ) V written out",
                 recall(keys, values, "softmax", scale=7.0), weights @ values, tol=1e-12)


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
    assert accuracy["best fixed state"][at[256]] < 0.2
    assert sweep["state_numbers"] == D * D
    assert sweep["cache_numbers"][at[256]] == 256 * 2 * D


@pytest.mark.equality
def test_gated_memory_is_gated_deltanet_written_by_hand(ledger):
    keys, values = recall_pairs(2, 7, 5, 3)
    state = torch.zeros(2, 3, 5, dtype=torch.float64)
    for t in range(7):  # S = α S (I − k kᵀ) + v kᵀ, β = 1
        k, v = keys[:, t], values[:, t]
        state = 0.8 * state
        error = v - torch.einsum("bvk,bk->bv", state, k)
        state = state + torch.einsum("bv,bk->bvk", error, k)
    expected = torch.einsum("bvk,bnk->bnv", state, keys)
    ledger.check("gated memory read-out, α = 0.8", "gated DeltaNet by hand",
                 recall(keys, values, "gated", alpha=0.8), expected, tol=1e-12)
    ledger.check("gated memory, α = 1", "the delta memory", recall(keys, values, "gated", alpha=1.0),
                 recall(keys, values, "delta"), tol=1e-12)


@pytest.mark.equality
def test_window_memory_is_softmax_over_the_last_pairs_only(ledger):
    keys, values = recall_pairs(2, 9, 4, 3)
    weights = torch.softmax(7.0 * keys @ keys[:, 6:].transpose(1, 2), dim=-1)  # last 3
    ledger.check("window memory, the last 3 pairs", "softmax over the last 3 written out",
                 recall(keys, values, "window", window=3, scale=7.0), weights @ values[:, 6:],
                 tol=1e-12)
    ledger.check("window memory, a window past the pairs", "the softmax memory",
                 recall(keys, values, "window", window=20, scale=7.0),
                 recall(keys, values, "softmax", scale=7.0), tol=1e-12)


def test_recall_by_age_splits_the_pairs():
    values = torch.eye(4, dtype=torch.float64)[None]  # (1, 4, 4)
    outputs = values.clone()
    outputs[0, 0] = torch.tensor([0.0, 2.0, 0.0, 0.0], dtype=torch.float64)  # oldest wrong
    split = recall_by_age(outputs, values, recent=2)
    assert split["recent accuracy"] == 1.0 and split["old accuracy"] == 0.5
    assert split["recent error"] == 0.0
    assert split["old error"] == pytest.approx(5 ** 0.5 / 2)
    with pytest.raises(ValueError, match=r"recent must be in \[1, N\) = \[1, 4\), got 4"):
        recall_by_age(outputs, values, recent=4)
    with pytest.raises(ValueError, match="alpha must be in"):
        recall(*recall_pairs(1, 3, 2, 2), "gated", alpha=1.5)


@pytest.mark.parametrize("seed", range(5))
def test_the_chapters_age_margins_hold_for_seeds_0_to_4(seed):
    """What chapter 9 asserts about forgetting and the window (it runs seed 0)."""
    n_pairs = [32, 64, 128, 256]
    sweep = recall_age_sweep(n_pairs, D, D, seed=seed, recent=16, alpha=0.95, window=16)
    recent, old = sweep["recent accuracy"], sweep["old accuracy"]
    old_error = sweep["old error"]
    assert recent["softmax attention"].min() == old["softmax attention"].min() == 1.0
    assert recent["sliding window"].min() == 1.0 and old["sliding window"].max() < 0.05
    assert (recent["gated delta rule"] < recent["delta rule"]).all()  # forgetting costs
    assert (old["gated delta rule"] < old["delta rule"]).all()
    assert recent["gated delta rule"].min() > 0.8
    assert (old_error["delta rule"][2:] > 1.2).all()  # old pairs read as wrong values
    assert (abs(old_error["gated delta rule"][1:] - 1) < 0.12).all()  # ... or as nothing


# ---- shared key/value heads on multi-attribute recall (chapter 7) -------------------------


def test_attribute_recall_asks_for_the_attributes_of_the_named_item():
    items, queries, targets = attribute_recall_data(
        3, 6, 5, 2, 4, generator=torch.Generator().manual_seed(0))
    assert items.shape == queries.shape == (3, 6, 5 + 8) and targets.shape == (3, 6, 8)
    torch.testing.assert_close(items[..., :5].norm(dim=-1), torch.ones(3, 6))
    assert torch.equal(queries[..., 5:], torch.zeros(3, 6, 8))
    same = (queries[..., None, :5] == items[..., None, :, :5]).all(-1)  # (B, N, N): which item
    assert torch.equal(same.sum(-1), torch.ones(3, 6, dtype=torch.long))  # exactly one
    named = same.long().argmax(-1)  # (B, N)
    assert torch.equal(named.sort(-1).values, torch.arange(6).expand(3, 6))  # each item once
    assert torch.equal(targets, torch.stack([items[b, named[b], 5:] for b in range(3)]))


def test_sharing_key_value_heads_costs_exactly_what_does_not_fit():
    """Four attributes of 12 numbers: MHA recovers them; one KV head of 16 channels keeps at
    most 16 of the 48 directions, and the trained layer comes within 0.02 of that floor."""
    state = torch.random.get_rng_state()
    mha, mqa = (shared_kv_recall(kv, d_attribute=12, steps=200, seed=3) for kv in (4, 1))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global stream untouched
    assert mha["floor"] == 0.0 and mha["error"] < 0.05
    assert mqa["floor"] == pytest.approx(1 - 16 / 48)
    assert mqa["floor"] - 0.01 < mqa["error"] < mqa["floor"] + 0.02
    assert (mha["cache_numbers"], mqa["cache_numbers"]) == (2 * 4 * 16, 2 * 16)
    with pytest.raises(ValueError, match=r"d_attribute \(16\) must be in \[1, head_dim"):
        shared_kv_recall(1, d_attribute=16)


def test_the_recorded_kv_heads_sweep_agrees_with_a_rerun_and_its_floors():
    recorded = load_kv_heads_recall()
    settings = recorded["settings"]
    for row in recorded["results"]:
        width = settings["n_heads"] * row["d_attribute"]
        assert row["floor"] == pytest.approx(max(0.0, 1 - row["n_kv_heads"]
                                                 * settings["head_dim"] / width))
        assert len(row["errors"]) == len(settings["seeds"])
        assert min(row["errors"]) > row["floor"] - 0.01
    row = next(r for r in recorded["results"] if (r["d_attribute"], r["n_kv_heads"]) == (8, 1))
    again = shared_kv_recall(1, d_attribute=8, seed=settings["seeds"][0],
                             steps=settings["steps"], lr=settings["lr"],
                             batch=settings["batch"], n_items=settings["n_items"])
    assert abs(again["error"] - row["errors"][0]) < 0.02
