"""The sequence-reversal task (claim C11): the 2017 model learns it, and its cross-attention
of a one-layer, one-head model lines up with the mirrored source position."""
import pytest
import torch

from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.tasks import (
    BOS,
    cross_attention_alignment,
    decode_with_cross_attention,
    eval_mode,
    evaluate_reversal,
    mirror_alignment,
    reversal_batch,
    reversal_config,
    train_reversal,
)


@pytest.fixture(scope="module")
def default_model():
    return train_reversal()


@pytest.fixture(scope="module")
def one_head_model():
    return train_reversal(reversal_config(n_layers=1, n_heads=1))


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
    _, h = train_reversal(reversal_config(d_ff=32), steps=30, warmup=10)
    peak = max(range(30), key=lambda i: h["lr"][i])
    assert h["step"][peak] == 10


def test_bad_task_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        reversal_batch(0, 5, 11)
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        train_reversal(steps=0)
    with pytest.raises(ValueError, match=r"src_vocab_size=11, tgt_vocab_size=12"):
        train_reversal(reversal_config(tgt_vocab_size=12))
    with pytest.raises(ValueError, match=r"seq_len \(64\) must be in \[1, max_len - 1 = 63\]"):
        train_reversal(seq_len=64)
    with pytest.raises(ValueError, match=r"unknown EncoderDecoderConfig fields: \['heads'\]"):
        reversal_config(heads=3)
    with pytest.raises(ValueError, match=r"n_symbols must be positive, got 0"):
        reversal_config(n_symbols=0)


# ---- the global random state -------------------------------------------------------------

def test_training_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    train_reversal(reversal_config(dropout=0.1), steps=3, batch_size=8)  # dropout draws too
    assert torch.equal(torch.get_rng_state(), state)


def test_training_is_the_same_whatever_the_global_state():
    torch.manual_seed(1)
    model_a, a = train_reversal(steps=3, batch_size=8)
    torch.manual_seed(2)
    torch.rand(5)
    model_b, b = train_reversal(steps=3, batch_size=8)
    assert a["loss"] == b["loss"]
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))


def test_evaluation_and_alignment_leave_the_global_random_state_alone(default_model):
    model, _ = default_model
    state = torch.get_rng_state()
    evaluate_reversal(model, 20, 8)
    cross_attention_alignment(model, 20, 8)
    assert torch.equal(torch.get_rng_state(), state)


# ---- the reversal analysis -----------------------------------------------------------------

def test_eval_mode_restores_the_mode_it_found():
    model = torch.nn.Dropout(0.5)
    for training in (True, False):
        model.train(training)
        with eval_mode(model) as inside:
            assert inside is model and not model.training
        assert model.training is training
    model.train()
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("an error inside the block")
    assert model.training


def test_mirror_alignment_counts_argmax_on_the_anti_diagonal():
    T = 4
    eye = torch.eye(T)
    mirrored, diagonal = eye.flip(1), eye  # (T, T)
    half = mirrored.clone()
    half[:2] = diagonal[:2]  # steps 0, 1 look at the diagonal, steps 2, 3 at the mirror
    weights = torch.stack([mirrored, diagonal, half])[None].expand(5, 3, T, T)  # (n, H, T, T)
    expected = torch.tensor([1.0, 0.0, 0.5])
    torch.testing.assert_close(mirror_alignment(weights), expected)
    stacked = torch.stack([weights, weights.flip(1)])  # (L, n, H, T, T): leading axes kept
    torch.testing.assert_close(mirror_alignment(stacked), torch.stack([expected, expected.flip(0)]))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, H, T, T\), got \(2, 3, 4, 5\)"):
        mirror_alignment(torch.ones(2, 3, 4, 5))


@torch.no_grad()
def test_decode_with_cross_attention_rows_are_the_greedy_steps():
    """Row t of the returned weights is the cross-attention of the step that emitted token
    t + 1, computed here independently by running the decoder one step at a time."""
    torch.manual_seed(0)
    model = EncoderDecoder(reversal_config(dropout=0.1)).train()  # untrained; dropout on
    src = torch.randint(1, 11, (3, 5))
    out, weights = decode_with_cross_attention(model, src)
    assert model.training, "the mode is restored"
    assert out.shape == (3, 6) and weights.shape == (2, 3, 2, 5, 5)  # (L, B, H, T, S)
    model.eval()
    assert torch.equal(out, model.greedy_decode(src, 5, BOS))
    memory = model.encode(src)
    for t in range(5):
        logits = model.decode(out[:, :t + 1], memory)  # (B, t + 1, V)
        assert torch.equal(logits[:, -1].argmax(-1), out[:, t + 1])
        for layer_idx, layer in enumerate(model.decoder.layers):
            step = layer.cross_attn.last_weights[:, :, -1]  # (B, H, S): this step's row
            torch.testing.assert_close(weights[layer_idx, :, :, t], step, atol=1e-6, rtol=0)
