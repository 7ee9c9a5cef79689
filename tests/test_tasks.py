"""The sequence-reversal task (claim C11): the 2017 model learns it, and its cross-attention
of a one-layer, one-head model lines up with the mirrored source position."""
import pytest
import torch

from transformer_lib.tasks import (
    BOS,
    cross_attention_alignment,
    evaluate_reversal,
    reversal_batch,
    train_reversal,
)


@pytest.fixture(scope="module")
def default_model():
    return train_reversal()


@pytest.fixture(scope="module")
def one_head_model():
    return train_reversal(n_layers=1, n_heads=1)


def test_batch_is_reversed_and_shifted():
    src, tgt_in, tgt_out = reversal_batch(4, 6, 11, torch.Generator().manual_seed(0))
    assert src.shape == tgt_in.shape == tgt_out.shape == (4, 6)
    assert torch.equal(tgt_out, src.flip(1))
    assert (tgt_in[:, 0] == BOS).all() and torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    assert src.min() >= 1 and src.max() <= 10  # symbols only, never BOS


def test_default_training_reaches_99_percent_exact_match(default_model):
    model, history = default_model
    assert not model.training
    assert history["loss"][-1] < history["loss"][0] / 3
    result = evaluate_reversal(model, 1000, 8)
    assert result["exact_match"] >= 0.99, result
    assert result["token_accuracy"] >= result["exact_match"]


def test_a_length_never_seen_in_training_fails(default_model):
    model, _ = default_model
    assert evaluate_reversal(model, 200, 12)["exact_match"] < 0.5


def test_one_layer_one_head_attends_to_the_mirrored_position(one_head_model):
    model, _ = one_head_model
    alignment = cross_attention_alignment(model, 200, 8)
    assert alignment.shape == (1, 1)
    assert alignment.item() >= 0.9


def test_alignment_has_one_entry_per_layer_and_head(default_model):
    model, _ = default_model
    alignment = cross_attention_alignment(model, 50, 8)
    assert alignment.shape == (len(model.decoder.layers), model.n_heads)
    assert ((alignment >= 0) & (alignment <= 1)).all()


def test_training_is_seeded():
    _, a = train_reversal(steps=5, seed=3)
    _, b = train_reversal(steps=5, seed=3)
    _, c = train_reversal(steps=5, seed=4)
    assert a["loss"] == b["loss"] and a["loss"] != c["loss"]


def test_history_records_the_noam_schedule():
    _, h = train_reversal(steps=30, warmup=10, d_model=32, d_ff=32, n_heads=2)
    peak = max(range(30), key=lambda i: h["lr"][i])
    assert h["step"][peak] == 10


def test_bad_task_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        reversal_batch(0, 5, 11)
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        train_reversal(steps=0)
