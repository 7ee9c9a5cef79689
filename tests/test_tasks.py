"""The sequence-reversal task (claim C11): the 2017 model learns it, and its cross-attention
of a one-layer, one-head model lines up with the mirrored source position."""
import pytest
import torch

from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.recording import record_weights
from transformer_lib.tasks import (
    BOS,
    cross_attention_alignment,
    decode_with_cross_attention,
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


@pytest.mark.train
def test_default_training_reaches_99_percent_exact_match(default_model):
    model, history = default_model
    assert not model.training
    assert history["loss"][-1] < history["loss"][0] / 3
    result = evaluate_reversal(model, 1000, 8)
    assert result["exact_match"] >= 0.99, result
    assert result["token_accuracy"] >= result["exact_match"]


@pytest.mark.train
def test_a_length_never_seen_in_training_fails(default_model):
    model, _ = default_model
    assert evaluate_reversal(model, 200, 12)["exact_match"] < 0.5


@pytest.mark.train
def test_one_layer_one_head_attends_to_the_mirrored_position(one_head_model):
    model, _ = one_head_model
    alignment = cross_attention_alignment(model, 200, 8)
    assert alignment.shape == (1, 1)
    assert alignment.item() >= 0.9


@pytest.mark.train
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
    with pytest.raises(ValueError, match=r"seq_len \(64\) must be in \[1, max_seq_len - 1 = 63\]"):
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


@pytest.mark.train
def test_evaluation_and_alignment_leave_the_global_random_state_alone(default_model):
    model, _ = default_model
    state = torch.get_rng_state()
    evaluate_reversal(model, 20, 8)
    cross_attention_alignment(model, 20, 8)
    assert torch.equal(torch.get_rng_state(), state)


# ---- the reversal analysis -----------------------------------------------------------------

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
        with record_weights(model):
            logits = model.decode(out[:, :t + 1], memory)  # (B, t + 1, V)
        assert torch.equal(logits[:, -1].argmax(-1), out[:, t + 1])
        for layer_idx, layer in enumerate(model.decoder.layers):
            step = layer.cross_attn.last_weights[:, :, -1]  # (B, H, S): this step's row
            torch.testing.assert_close(weights[layer_idx, :, :, t], step, atol=1e-6, rtol=0)


# ---- schedules and gradient norms (chapter 4; the ablation is in test_stability.py) -------

def test_no_warmup_schedule_is_the_noam_peak_from_step_one_then_the_same_decay():
    from transformer_lib.encoder_decoder import noam_lambda
    from transformer_lib.tasks import no_warmup_lambda

    noam, flat = noam_lambda(32, 10), no_warmup_lambda(32, 10)
    peak = 32 ** -0.5 * 10 ** -0.5
    assert all(flat(t) == pytest.approx(peak, rel=1e-12) for t in range(0, 11))
    assert all(flat(t) == pytest.approx(noam(t), rel=1e-12) for t in range(10, 200))
    assert noam(5) < peak  # Noam is still rising there
    with pytest.raises(ValueError, match=r"d_model \(32\) and warmup \(0\)"):
        no_warmup_lambda(32, 0)


def test_training_follows_the_schedule_it_is_given():
    from transformer_lib.tasks import no_warmup_lambda

    config = reversal_config(d_ff=32)
    _, noam = train_reversal(config, steps=15, warmup=10, batch_size=8, lr_scale=0.5)
    _, flat = train_reversal(config, steps=15, warmup=10, batch_size=8, lr_scale=0.5,
                             schedule="no-warmup")
    rate = no_warmup_lambda(config.d_model, 10)
    assert flat["lr"] == pytest.approx([0.5 * rate(t) for t in range(15)], rel=1e-12)
    assert flat["lr"][10:] == pytest.approx(noam["lr"][10:], rel=1e-12)  # same decay
    assert flat["lr"][0] > 5 * noam["lr"][0]  # no rise
    assert flat["loss"][0] == noam["loss"][0]  # same model, same first batch
    with pytest.raises(ValueError, match=r"schedule must be one of \('noam', 'no-warmup'\), "
                                         r"got 'cosine'"):
        train_reversal(steps=1, schedule="cosine")


def test_history_records_the_norm_of_each_applied_gradient():
    """The first entry is recomputed independently: the same seeded model and first batch,
    one backward pass, the norm of all gradients together."""
    from transformer_lib.encoder_decoder import EncoderDecoder, LabelSmoothingLoss

    config = reversal_config(d_ff=32)
    _, history = train_reversal(config, steps=4, batch_size=8, seed=5)
    assert len(history["grad_norm"]) == 4
    torch.manual_seed(5)
    model = EncoderDecoder(config).train()
    src, tgt_in, tgt_out = reversal_batch(8, 8, 11, torch.Generator().manual_seed(5))
    LabelSmoothingLoss(0.1)(model(src, tgt_in), tgt_out).backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    assert history["grad_norm"][0] == pytest.approx(expected, rel=1e-5)


@pytest.mark.train
def test_pre_norm_reversal_model_trains_as_well():
    model, history = train_reversal(reversal_config(norm_first=True, final_norm=True),
                                    steps=200, batch_size=128)
    assert model.encoder.layers[0].norm_first and model.encoder.norm is not None
    assert evaluate_reversal(model, 500, 8)["exact_match"] >= 0.95
