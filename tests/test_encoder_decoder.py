import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.encoder_decoder import (
    EncoderDecoder,
    EncoderDecoderConfig,
    LabelSmoothingLoss,
    noam_lambda,
    padding_mask,
)

from conftest import randomize_


def small_config(**kw) -> EncoderDecoderConfig:
    args = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_seq_len=32)
    args.update(kw)
    return EncoderDecoderConfig(12, 14, **args)


def small_model(**kw) -> EncoderDecoder:
    return randomize_(EncoderDecoder(small_config(**kw)), std=0.1).eval()


def test_forward_shapes_and_stacks():
    model = small_model()
    src, tgt = torch.randint(0, 12, (3, 7)), torch.randint(0, 14, (3, 5))
    assert model(src, tgt).shape == (3, 5, 14)
    memory = model.encode(src)
    assert memory.shape == (3, 7, 32)
    assert torch.allclose(model.decode(tgt, memory), model(src, tgt))
    assert model.encoder.norm is None and model.decoder.norm is None  # the paper: no final norm


def test_layers_are_post_norm():
    # Post-norm: each sublayer output goes through LayerNorm, so with unit norm weights and
    # zero biases every position of a layer's output has mean 0 and variance 1.
    model = EncoderDecoder(small_config(n_layers=1)).eval()
    out = model.encode(torch.randint(0, 12, (2, 6)))
    assert torch.allclose(out.mean(-1), torch.zeros(2, 6), atol=1e-5)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3)


def test_pre_norm_layers_keep_an_identity_path():
    """Pre-norm: x + f(LN(x)); with every sublayer's output projection zeroed, a layer is the
    identity, where a post-norm layer would still normalise its input."""
    model = small_model(norm_first=True)
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.self_attn.o_proj.bias.zero_()
            layer.feed_forward.w_2.weight.zero_()
            layer.feed_forward.w_2.bias.zero_()
    x = 3.0 * torch.randn(2, 5, 32) + 1.0  # (B, S, C), far from normalised
    torch.testing.assert_close(model.encoder.layers[0](x), x)
    post = small_model()
    assert not torch.allclose(post.encoder.layers[0](x), x, atol=1e-1)


def test_decoder_is_causal():
    model = small_model()
    src, tgt = torch.randint(0, 12, (2, 7)), torch.randint(0, 14, (2, 6))
    changed = tgt.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 14
    a, b = model(src, tgt), model(src, changed)
    assert torch.equal(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_padding_mask_hides_padded_source_tokens():
    model = small_model()
    src, tgt = torch.randint(1, 12, (2, 7)), torch.randint(0, 14, (2, 4))
    src[:, 5:] = 0  # pad id 0
    other = src.clone()
    other[:, 5:] = 3  # what sits at padded positions must not matter
    mask = padding_mask(src, pad_id=0)
    assert mask.shape == (2, 1, 1, 7)
    assert torch.allclose(model(src, tgt, src_mask=mask), model(other, tgt, src_mask=mask), atol=1e-6)
    assert not torch.allclose(model(src, tgt), model(other, tgt), atol=1e-3)


def test_greedy_decode_matches_step_by_step_argmax():
    model = small_model()
    src = torch.randint(0, 12, (2, 6))
    out = model.greedy_decode(src, 5, bos_id=0)
    assert out.shape == (2, 6) and (out[:, 0] == 0).all()
    for t in range(1, 6):
        assert torch.equal(out[:, t], model(src, out[:, :t])[:, -1].argmax(-1))


def test_embeddings_are_scaled_and_positions_added():
    model = small_model()
    tokens = torch.randint(0, 12, (1, 5))
    expected = model.src_embed(tokens) * math.sqrt(32) + model.pos_encoding[:5]
    assert torch.allclose(model._embed(tokens, model.src_embed, "src"), expected)


# ---- Noam schedule (claims C16, C17) --------------------------------------------------------

def test_noam_lambda_matches_formula_and_peaks_at_warmup():
    f = noam_lambda(512, 4000)
    for t in (1, 10, 3999, 4000, 4001, 100000):
        assert math.isclose(f(t), 512 ** -0.5 * min(t ** -0.5, t * 4000 ** -1.5))
    values = [f(t) for t in range(1, 20000)]
    assert values.index(max(values)) + 1 == 4000
    assert f(0) == f(1) > 0  # LambdaLR calls it with step 0 at construction


def test_noam_with_lambda_lr_follows_the_schedule():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam_lambda(64, 10))
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    f = noam_lambda(64, 10)
    assert all(math.isclose(lr, f(t)) for t, lr in enumerate(lrs))


def test_lambda_lr_pitfall_adam_with_lr_zero_never_learns():
    # LambdaLR multiplies the optimizer's base lr: with lr=0 the learning rate stays 0 forever.
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([p], lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam_lambda(64, 10))
    for _ in range(50):
        opt.zero_grad()
        (p ** 2).sum().backward()
        opt.step()
        sched.step()
        assert opt.param_groups[0]["lr"] == 0.0
    assert torch.equal(p.detach(), torch.ones(4))


# ---- label smoothing (claim C19) ----------------------------------------------------------

@pytest.mark.equality
def test_label_smoothing_matches_torch_cross_entropy(ledger):
    logits, target = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    target[0, :2] = -100
    ours = LabelSmoothingLoss(0.1)(logits, target)
    ref = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), label_smoothing=0.1)
    ledger.check("label-smoothed loss, ε = 0.1, ignored targets",
                 ledger.torch("F.cross_entropy(label_smoothing=0.1)"), ours, ref, tol=1e-6)
    ledger.check("loss, ε = 0", ledger.torch("F.cross_entropy"), LabelSmoothingLoss(0.0)(logits, target),
                 F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1)), tol=1e-6)


@pytest.mark.equality
def test_label_smoothing_is_minimised_by_the_smoothed_distribution(ledger):
    V, eps = 10, 0.1
    target = torch.tensor([3])
    smoothed = torch.full((1, V), eps / V)
    smoothed[0, 3] += 1 - eps
    loss = LabelSmoothingLoss(eps)
    best = loss(smoothed.log(), target)
    confident = torch.full((1, V), -20.0)
    confident[0, 3] = 0.0  # nearly one-hot: penalised by smoothing
    assert loss(confident, target) > best
    entropy = -(smoothed * smoothed.log()).sum()
    ledger.check("loss at the smoothed distribution", "its entropy, by hand", best, entropy,
                 tol=1e-6)


# ---- bad input ---------------------------------------------------------------------------

def test_config_defaults_are_the_base_model_and_layers_follow_it():
    config = EncoderDecoderConfig(100, 120)
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff, config.dropout) == (
        512, 8, 6, 2048, 0.1)
    assert config.n_decoder_layers == 6  # None: as many as the encoder
    model = EncoderDecoder(small_config(n_layers=3, n_decoder_layers=1, d_ff=48))
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 1
    assert model.encoder.layers[0].feed_forward.w_1.out_features == 48
    assert model.lm_head.weight.shape == (14, 32)  # the output layer: (V_tgt, C)
    assert model.config is not None and model.max_seq_len == 32


@pytest.mark.parametrize("kw, message", [
    (dict(d_model=30, n_heads=4), r"d_model \(30\) must be divisible by n_heads \(4\)"),
    (dict(d_model=6, n_heads=2), None),
    (dict(d_model=9, n_heads=3), r"d_model must be even .* got 9"),
    (dict(n_layers=0), r"n_layers must be positive, got 0"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
    (dict(max_seq_len=0), r"max_seq_len must be positive, got 0"),
], ids=["heads", "ok", "odd", "layers", "dropout", "max_seq_len"])
def test_bad_model_sizes_are_rejected(kw, message):
    if message is None:
        EncoderDecoderConfig(10, 10, **kw)
        return
    with pytest.raises(ValueError, match=message):
        EncoderDecoderConfig(10, 10, **kw)


def test_model_needs_a_config():
    with pytest.raises(ValueError, match="config must be an EncoderDecoderConfig, got int"):
        EncoderDecoder(10)


def test_bad_tokens_are_rejected():
    model = small_model()
    with pytest.raises(ValueError, match=r"ids in src must be in \[0, 11\] \(vocab_size=12\), got min 0, max 12"):
        model(torch.tensor([[0, 12]]), torch.tensor([[0]]))
    with pytest.raises(ValueError, match="tgt must be an integer"):
        model(torch.tensor([[0, 1]]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"src length \(33\) exceeds max_seq_len \(32\)"):
        model(torch.zeros(1, 33, dtype=torch.long), torch.tensor([[0]]))


def test_bad_schedule_and_smoothing_are_rejected():
    with pytest.raises(ValueError, match="warmup must be positive, got 0"):
        noam_lambda(512, 0)
    with pytest.raises(ValueError, match="smoothing must be in"):
        LabelSmoothingLoss(1.5)
