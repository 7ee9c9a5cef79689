"""Each chapter's main path on a CUDA device, compared with the same computation on the CPU.

Marked `gpu`: skipped with the reason "no CUDA device" where there is none (tests/conftest.py).
``TRANSFORMER_LIB_TEST_DEVICE=cpu`` runs them on the CPU instead, to check their logic on a
machine without a GPU (the comparisons are then CPU against CPU).

Most comparisons run in fp64, where the two devices differ only by the order of their sums:
about 1e-15 relative, so 1e-10 leaves room and still fails any real difference. The fp32
comparisons (the fused kernels, the trained checkpoint) accept 1e-4: fp32 sums in another
order differ by about 1e-6, while a wrong mask or scale moves outputs by more than 1e-2.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.flash import flash_attention
from transformer_lib.positional import apply_rope, rope_cos_sin
from transformer_lib.recall import recall, recall_pairs
from transformer_lib.sampling import sample_next_token
from transformer_lib.tasks import reversal_batch, reversal_config
from transformer_lib.text import generate_text, load_text_model
from transformer_lib.variants.linear import (
    delta_rule_chunked,
    delta_rule_recurrent,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    linear_attention,
    linear_attention_recurrent,
)
from transformer_lib.variants.mla import MLAConfig, MultiHeadLatentAttention
from transformer_lib.variants.moe import MoEFeedForward

from conftest import TEST_DEVICE, randomize_

pytestmark = pytest.mark.gpu

DEVICE = torch.device(TEST_DEVICE)
FP64 = dict(atol=1e-10, rtol=0)  # fp64 on two devices: the order of sums only
FP32 = dict(atol=1e-4, rtol=1e-4)  # fp32 on two devices or kernels (module docstring)


def on_device(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEVICE) for t in tensors]


def same(device_result: torch.Tensor, cpu_result: torch.Tensor, tolerance=FP64) -> None:
    """The device's result is on the device and equals the CPU's within ``tolerance``."""
    assert device_result.device.type == DEVICE.type
    torch.testing.assert_close(device_result.cpu(), cpu_result, **tolerance)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


# Chapters 1-3: attention, multi-head attention ----------------------------------------------


def test_attention_weights_and_outputs():
    q, k, v = randn(2, 4, 7, 8), randn(2, 4, 7, 8), randn(2, 4, 7, 5)
    mask = causal_mask(7)  # (T, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    out_d, weights_d = scaled_dot_product_attention(*on_device(q, k, v, mask))
    same(out_d, out)
    same(weights_d, weights)
    same(weights_d.sum(-1), torch.ones(2, 4, 7, dtype=torch.float64))  # rows sum to 1


def test_multi_head_attention_self_and_cross():
    mha = randomize_(MultiHeadAttention(32, 4, 2)).double()  # GQA: 4 query heads, 2 KV heads
    mha_d = copy.deepcopy(mha).to(DEVICE)
    x, memory = randn(2, 9, 32), randn(2, 5, 32)
    with torch.no_grad():
        same(mha_d(*on_device(x), causal=True), mha(x, causal=True))
        same(mha_d(*on_device(x, memory)), mha(x, memory))


# Chapter 4: the 2017 encoder-decoder, trained for a few steps on the reversal task -----------


def _train_reversal_steps(model: EncoderDecoder, device: torch.device, steps: int) -> list[float]:
    config = model.config
    gen = torch.Generator().manual_seed(0)  # the same batches on both devices
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    losses = []
    for _ in range(steps):
        src, tgt_in, tgt_out = reversal_batch(32, 8, config.tgt_vocab_size, gen)  # (B, T) each
        logits = model(src.to(device), tgt_in.to(device))  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, config.tgt_vocab_size),
                               tgt_out.to(device).reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_encoder_decoder_forward_and_training_steps():
    torch.manual_seed(0)
    model = EncoderDecoder(reversal_config()).double()
    model_d = copy.deepcopy(model).to(DEVICE)
    src, tgt_in, _ = reversal_batch(4, 8, model.config.tgt_vocab_size,
                                    torch.Generator().manual_seed(1))
    with torch.no_grad():
        same(model_d(*on_device(src, tgt_in)), model(src, tgt_in))
    losses_d = _train_reversal_steps(model_d, DEVICE, 20)
    losses = _train_reversal_steps(model, torch.device("cpu"), 20)
    assert losses_d[-1] < losses_d[0] - 0.3  # it learns on the device
    # Adam divides by √v: a gradient that is pure rounding could move differently, so the
    # trajectories are compared loosely; the first loss is the same forward pass.
    assert abs(losses_d[0] - losses[0]) < 1e-10
    assert max(abs(a - b) for a, b in zip(losses_d, losses)) < 1e-3


# Chapter 5: RoPE -----------------------------------------------------------------------------


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope_rotates_alike(pairing):
    x = randn(2, 4, 16, 8)  # (B, H, T, D)
    cos, sin = rope_cos_sin(16, 8, dtype=torch.float64)
    cos_d, sin_d = rope_cos_sin(16, 8, device=DEVICE, dtype=torch.float64)
    rotated_d = apply_rope(*on_device(x), cos_d, sin_d, pairing)
    same(rotated_d, apply_rope(x, cos, sin, pairing))
    same(rotated_d.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


# Chapters 6-7: the modern decoder, sampling and the KV cache ---------------------------------


def _decoder() -> tuple[Decoder, Decoder]:
    torch.manual_seed(0)
    model = randomize_(Decoder(DecoderConfig(max_seq_len=64))).double().eval()
    return model, copy.deepcopy(model).to(DEVICE)


def test_decoder_forward_and_greedy_decoding_with_and_without_the_cache():
    model, model_d = _decoder()
    prompt = torch.randint(0, 64, (3, 6))
    with torch.no_grad():
        same(model_d(*on_device(prompt)), model(prompt))
    greedy_d = model_d.generate(*on_device(prompt), 20)  # (B, T + 20)
    assert torch.equal(greedy_d, model_d.generate(*on_device(prompt), 20, use_cache=False))
    assert torch.equal(greedy_d.cpu(), model.generate(prompt, 20))
    cache = model_d.new_cache(3)
    held = [t for t in vars(cache).values() if isinstance(t, torch.Tensor)]
    assert held and all(t.device.type == DEVICE.type for t in held)


def test_sampling_on_the_device_with_a_generator_there():
    _, model_d = _decoder()
    prompt = torch.randint(0, 64, (4, 5), device=DEVICE)

    def sample(seed, use_cache=True):
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        return model_d.generate(prompt, 15, temperature=0.8, top_k=20, top_p=0.95,
                                use_cache=use_cache, generator=gen)

    tokens = sample(0)
    assert tokens.device.type == DEVICE.type and tokens.shape == (4, 20)
    assert torch.equal(tokens, sample(0)) and torch.equal(tokens, sample(0, use_cache=False))
    if DEVICE.type != "cpu":  # a CPU generator for device logits is a named error
        with pytest.raises(ValueError, match="generator is on cpu but the logits are on"):
            sample_next_token(torch.zeros(2, 5, device=DEVICE), generator=torch.Generator())


def test_fused_attention_on_the_device_matches_eager():
    torch.manual_seed(0)
    eager = randomize_(Decoder(DecoderConfig(max_seq_len=64))).eval().to(DEVICE)
    fused = Decoder(DecoderConfig(max_seq_len=64, attn_implementation="sdpa")).eval()
    fused.to(DEVICE).load_state_dict(eager.state_dict())
    tokens = torch.randint(0, 64, (2, 40), device=DEVICE)
    with torch.no_grad():
        same(fused(tokens), eager(tokens).cpu(), FP32)


def test_the_trained_model_writes_on_the_device():
    model, tokenizer, _ = load_text_model()
    model_d = copy.deepcopy(model).to(DEVICE)
    ids = tokenizer.encode("MACBETH.\nWhen shall we three meet again")[None]  # (1, T)
    with torch.no_grad():
        same(model_d(*on_device(ids)), model(ids), FP32)
    greedy = generate_text(model_d, tokenizer, "MACBETH.\n", 30)
    assert greedy == generate_text(model, tokenizer, "MACBETH.\n", 30)
    sampled = generate_text(model_d, tokenizer, "MACBETH.\n", 30, temperature=0.8, top_p=0.9)
    assert sampled.startswith("MACBETH.\n") and len(sampled) == 39
    assert sampled == generate_text(model_d, tokenizer, "MACBETH.\n", 30, temperature=0.8,
                                    top_p=0.9)


# Chapter 8: tiled (flash) attention against PyTorch's fused kernel ---------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_flash_attention_matches_sdpa(dtype):
    q, k, v = (t.to(dtype) for t in (randn(2, 4, 100, 16), randn(2, 4, 100, 16),
                                     randn(2, 4, 100, 16)))
    q, k, v = on_device(q, k, v)
    tiled = flash_attention(q, k, v, causal=True, block_size=32)  # (B, H, T, D)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # T == S: one causal mask
    same(tiled, fused.cpu(), FP64 if dtype == torch.float64 else FP32)


def test_flash_attention_backward_recomputes_on_the_device():
    """The recomputing backward pass on the device: q, k, v gradients equal the CPU's (fp64),
    causal after a prefix, with dropout replayed from the device's generator."""
    q, k, v = randn(2, 3, 40, 16), randn(2, 3, 70, 16), randn(2, 3, 70, 8)
    weights = randn(2, 3, 40, 8)
    grads = {}
    for where in ("device", "cpu"):
        inputs = [(x.to(DEVICE) if where == "device" else x).requires_grad_()
                  for x in (q.clone(), k.clone(), v.clone())]
        out = flash_attention(*inputs, causal=True, block_size=16)
        (out * weights.to(out.device)).sum().backward()
        grads[where] = [x.grad for x in inputs]
    for got, want in zip(grads["device"], grads["cpu"]):
        same(got, want)
    inputs = [x.to(DEVICE).requires_grad_() for x in (q.clone(), k.clone(), v.clone())]

    def dropped(a, b, c):
        torch.manual_seed(3)
        return flash_attention(a, b, c, causal=True, dropout_p=0.3, block_size=16)

    out = dropped(*inputs)
    (out * weights.to(out.device)).sum().backward()
    again = [x.detach().clone().requires_grad_() for x in inputs]
    (dropped(*again) * weights.to(out.device)).sum().backward()
    for first, second in zip(inputs, again):  # the same masks, the same gradients
        assert first.grad.device.type == DEVICE.type
        torch.testing.assert_close(first.grad, second.grad, atol=0, rtol=0)


# Chapter 9: linear attention and DeltaNet, MLA, MoE, associative recall ----------------------


def test_linear_attention_and_delta_rules_chunked_equal_recurrent():
    B, H, T, D = 2, 2, 37, 8  # T not a multiple of the chunk
    q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, D)
    beta, alpha = torch.rand(B, H, T, dtype=torch.float64), 0.5 + 0.5 * torch.rand(
        B, H, T, dtype=torch.float64)
    qd, kd, vd, beta_d, alpha_d = on_device(q, k, v, beta, alpha)
    out_d, _ = linear_attention_recurrent(qd, kd, vd)
    same(linear_attention(qd, kd, vd), out_d.cpu())
    same(out_d, linear_attention_recurrent(q, k, v)[0])
    for chunked, recurrent, gates in (
            (delta_rule_chunked, delta_rule_recurrent, ()),
            (gated_delta_rule_chunked, gated_delta_rule_recurrent, (alpha,))):
        gates_d = on_device(*gates)
        out_c, state_c = chunked(qd, kd, vd, *gates_d, beta_d, chunk_size=16)
        out_r, state_r = recurrent(qd, kd, vd, *gates_d, beta_d)
        same(out_c, out_r.cpu())
        same(state_c, state_r.cpu())
        same(out_r, recurrent(q, k, v, *gates, beta)[0])


def test_mla_explicit_and_absorbed():
    layer = randomize_(MultiHeadLatentAttention(MLAConfig(q_lora_rank=24))).double()
    layer_d = copy.deepcopy(layer).to(DEVICE)
    x = randn(2, 10, 64)
    with torch.no_grad():
        explicit_d = layer_d(*on_device(x))
        same(explicit_d, layer(x))
        same(layer_d(*on_device(x), absorb=True), explicit_d.cpu())


def test_moe_routes_alike():
    moe = randomize_(MoEFeedForward(32, 64, n_experts=4, top_k=2)).double()
    moe_d = copy.deepcopy(moe).to(DEVICE)
    x = randn(2, 12, 32)
    with torch.no_grad():
        out, aux = moe(x)
        out_d, aux_d = moe_d(*on_device(x))
    same(out_d, out)
    same(aux_d, aux)


@pytest.mark.parametrize("n_pairs", [8, 24])  # fewer and more pairs than Dk = 16
def test_recall_memories(n_pairs):
    keys, values = recall_pairs(3, n_pairs, 16, 16, generator=torch.Generator().manual_seed(0))
    for method, kwargs in (("softmax", {}), ("linear", {}), ("delta", {"passes": 2}),
                           ("least_squares", {})):
        same(recall(*on_device(keys, values), method, **kwargs),
             recall(keys, values, method, **kwargs), dict(atol=1e-8, rtol=0))


# The exercises' structure checks --------------------------------------------------------------


def _on_device_then_back(chunked: bool):
    """A chapter-1 exercise 1.3 submission that does its work on the device: one chunk of
    queries at a time (``chunked``), or all queries at once."""

    def submission(q, k, v, chunk):
        qd, kd, vd = on_device(q, k, v)
        T = q.shape[-2]
        if not chunked:
            return scaled_dot_product_attention(qd, kd, vd, causal_mask(T).to(DEVICE))[0].cpu()
        pieces = []
        for start in range(0, T, chunk):
            end = min(start + chunk, T)
            mask = causal_mask(end - start, end).to(DEVICE)
            pieces.append(scaled_dot_product_attention(
                qd[..., start:end, :], kd[..., :end, :], vd[..., :end, :], mask)[0])
        return torch.cat(pieces, dim=-2).cpu()

    submission.__name__ = "chunked_causal_attention"
    return submission


def test_the_structure_checks_see_work_done_on_the_device(capsys):
    """The checkers watch what the student's code computes through torch function modes: a
    submission that moves the inputs to the GPU is watched there too. The whole-sequence
    weights are found on the device, and chunked work passes."""
    from transformer_lib.checks import check_chunked_causal_attention

    assert check_chunked_causal_attention(_on_device_then_back(chunked=True))
    capsys.readouterr()
    assert not check_chunked_causal_attention(_on_device_then_back(chunked=False))
    report = capsys.readouterr().out
    assert "a floating-point tensor of shape (2, 3, 12, 12) was created" in report
