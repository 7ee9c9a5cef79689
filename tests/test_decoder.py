import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import ATTN_IMPLEMENTATIONS, causal_mask
from transformer_lib.decoder import Decoder, DecoderConfig, init_weights
from transformer_lib.positional import rope_cos_sin

from conftest import randomize_


def small_config(**overrides) -> DecoderConfig:
    base = dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                max_seq_len=64)
    base.update(overrides)
    return DecoderConfig(**base)


def random_model(dtype=torch.float32, **overrides) -> Decoder:
    model = randomize_(Decoder(small_config(**overrides)), std=0.1)
    return model.to(dtype).eval()


# ---- the four checks of a from-scratch model (claim C29) -------------------------------

def test_changing_token_9_leaves_earlier_logits_exactly_equal():
    model = random_model()
    tokens = torch.randint(0, 64, (2, 16))
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 64  # token 9 (position index 8)
    a, b = model(tokens), model(changed)
    assert (a[:, :8] - b[:, :8]).abs().max().item() == 0.0  # exactly, not approximately
    assert (a[:, 8:] - b[:, 8:]).abs().max().item() > 1e-3  # later positions do see it


@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_kv_cache_decoding_matches_full_forward(dtype, tol, pairing, ledger):
    model = random_model(dtype, rope_pairing=pairing)
    tokens = torch.randint(0, 64, (3, 30))
    full = model(tokens)  # (B, 30, V)
    cache = model.new_cache(3)
    pieces = [model(tokens[:, :10], cache)]  # prefill
    pieces += [model(tokens[:, i:i + 1], cache) for i in range(10, 15)]  # one token at a time
    pieces += [model(tokens[:, 15:19], cache), model(tokens[:, 19:30], cache)]  # chunks
    assert cache.pos == 30
    ledger.check(f"logits decoded with the cache, {pairing} RoPE", "the full forward pass",
                 torch.cat(pieces, dim=1), full, tol=tol)


def test_rope_tables_are_recomputed_in_the_model_dtype():
    """After .double() the RoPE tables are fp64 values, not fp32 values cast up (RoPE's
    relativity itself is tested on the tables in test_positional.py)."""
    model = Decoder(small_config()).double()
    cos, sin = rope_cos_sin(64, 16, dtype=torch.float64)  # (max_seq_len, D/2)
    assert model.rope_cos.dtype == torch.float64
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert not torch.equal(cos.float().double(), cos), "fp32 rounding would show"
    assert "rope_cos" not in model.state_dict()


def test_initial_loss_is_close_to_log_vocab():
    model = Decoder(small_config(vocab_size=64)).eval()  # default init, untrained
    tokens = torch.randint(0, 64, (8, 64))
    logits = model(tokens)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 64), tokens[:, 1:].reshape(-1))
    assert abs(loss.item() - math.log(64)) < 0.1


def test_init_weights_is_the_decoders_own_initialisation():
    """A part built later (text.py's ReLU FFN) gets the model's init: N(0, 0.02) weights,
    zero biases; a norm keeps its ones."""
    torch.manual_seed(0)
    linear, norm = torch.nn.Linear(256, 256), torch.nn.LayerNorm(8)
    torch.nn.init.ones_(norm.bias)
    torch.nn.Sequential(linear, norm).apply(init_weights)
    assert abs(linear.weight.std().item() - 0.02) < 0.001  # 65,536 draws: std within 5 %
    assert torch.equal(linear.bias, torch.zeros(256))
    assert torch.equal(norm.weight, torch.ones(8)) and torch.equal(norm.bias, torch.ones(8))


# ---- one causal rule: the model asks, the attention decides ----------------------------

@pytest.mark.parametrize("implementation", ATTN_IMPLEMENTATIONS)
def test_every_layer_is_asked_for_causal_attention_and_given_no_mask(implementation):
    """Decoder.forward builds no mask and does not look at the implementation: every layer
    gets causal=True and mask=None, for a prefill, a decoding step and a chunk."""
    model = random_model(attn_implementation=implementation)
    seen = []
    for layer in model.layers:
        layer.self_attn.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append((kwargs["causal"], kwargs["mask"])),
            with_kwargs=True)
    cache = model.new_cache(1)
    for size in (5, 1, 3):
        model(torch.randint(0, 64, (1, size)), cache)
    assert seen == [(True, None)] * (3 * 2)


@pytest.mark.equality
def test_block_is_causal_unless_told_otherwise(ledger):
    model = random_model(dtype=torch.float64)
    block, T = model.layers[0], 6
    x = torch.randn(2, T, 64, dtype=torch.float64)
    rope = (model.rope_cos[:T], model.rope_sin[:T])  # (T, D/2) each
    causal = block(x, rope)
    explicit = block(x, rope, causal=False, mask=causal_mask(T))
    ledger.check("block output, causal=True", "the same block with an explicit causal mask",
                 causal, explicit, tol=1e-12)
    assert (block(x, rope, causal=False) - causal).abs().max().item() > 1e-3


# ---- structure -------------------------------------------------------------------------

def test_state_dict_uses_hf_names_and_no_rope_tables():
    model = Decoder(small_config(n_layers=1))
    names = set(model.state_dict())
    expected = {"embed_tokens.weight", "norm.weight", "lm_head.weight"} | {
        f"layers.0.{n}.weight" for n in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == expected
    assert model.rope_cos.shape == (64, 8)


def test_gqa_shapes_and_tied_embeddings():
    model = Decoder(small_config(n_heads=8, n_kv_heads=2, tie_embeddings=True))
    attn = model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (2 * 8, 64) and attn.q_proj.weight.shape == (64, 64)
    assert model.lm_head.weight is model.embed_tokens.weight
    untied = Decoder(small_config(n_heads=8, n_kv_heads=2))
    n_tied = sum(p.numel() for p in model.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 64 * 64  # the output matrix V x C is shared


def test_kv_cache_size_formula():
    # Claim C34: bytes = 2 · n_layers · H_kv · D · T · sizeof(dtype) (per sequence).
    model = Decoder(small_config(n_layers=3, n_heads=8, n_kv_heads=2))
    cache = model.new_cache(batch_size=1)
    assert cache.nbytes == 2 * 3 * 2 * 8 * 64 * 4
    mha = Decoder(small_config(n_layers=3, n_heads=8, n_kv_heads=8)).new_cache(1)
    assert mha.nbytes == 4 * cache.nbytes  # 8 -> 2 KV heads quarters the cache


# ---- generation ------------------------------------------------------------------------

@pytest.mark.equality
def test_generate_with_and_without_cache_agree(ledger):
    model = random_model()
    prompt = torch.randint(0, 64, (2, 7))
    with_cache = model.generate(prompt, 20)
    without = model.generate(prompt, 20, use_cache=False)
    assert with_cache.shape == (2, 27)
    assert torch.equal(with_cache[:, :7], prompt)
    ledger.check("greedy tokens with the cache, 20 new", "generate(use_cache=False)", with_cache,
                 without, tol=0)


def test_generate_caches_only_prompt_plus_new_positions(monkeypatch):
    model = random_model()  # config.max_seq_len = 64
    made = []
    new_cache = model.new_cache

    def spy(batch_size, max_seq_len=None):
        made.append(new_cache(batch_size, max_seq_len))
        return made[-1]

    monkeypatch.setattr(model, "new_cache", spy)
    prompt = torch.randint(0, 64, (2, 7))
    out = model.generate(prompt, 5)
    assert torch.equal(out, model.generate(prompt, 5, use_cache=False))
    (cache,) = made
    assert cache.max_seq_len == 7 + 5 and cache.k.shape == (2, 2, 2, 12, 16)
    assert cache.nbytes == 2 * 2 * 2 * 2 * 16 * 12 * 4  # 2 · L · B · H_kv · D · (T + new) · fp32


@pytest.mark.equality
def test_a_short_cache_decodes_like_the_full_forward(ledger):
    model = random_model()
    tokens = torch.randint(0, 64, (2, 9))
    cache = model.new_cache(2, max_seq_len=9)
    pieces = [model(tokens[:, :6], cache), model(tokens[:, 6:8], cache), model(tokens[:, 8:], cache)]
    assert cache.k.shape[3] == 9
    ledger.check("logits decoded with a cache of exactly 9 positions", "the full forward pass",
                 torch.cat(pieces, dim=1), model(tokens), tol=1e-5)  # fp32


def test_greedy_generation_picks_the_argmax():
    model = random_model()
    prompt = torch.randint(0, 64, (2, 5))
    out = model.generate(prompt, 3)
    for t in range(5, 8):
        assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))


def test_sampling_is_seeded_and_respects_top_k():
    model = random_model()
    prompt = torch.randint(0, 64, (4, 5))
    a = model.generate(prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    one = model.generate(prompt, 10, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(2))
    assert torch.equal(one, model.generate(prompt, 10))  # top-1 sampling is greedy


# ---- bad input ----------------------------------------------------------------------------

def test_config_rejects_heads_not_dividing_d_model():
    with pytest.raises(ValueError, match=r"d_model \(60\) must be divisible by n_heads \(8\)"):
        DecoderConfig(d_model=60, n_heads=8, n_kv_heads=2)


def test_config_rejects_kv_heads_not_dividing_heads():
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"):
        DecoderConfig(n_heads=4, n_kv_heads=3)


def test_config_rejects_odd_head_dim():
    with pytest.raises(ValueError, match=r"even head dim, got d_model // n_heads = 36 // 4 = 9"):
        DecoderConfig(d_model=36, n_heads=4, n_kv_heads=2)


def test_config_rejects_unknown_pairing():
    with pytest.raises(ValueError, match="rope_pairing must be one of .* got 'adjacent'"):
        DecoderConfig(rope_pairing="adjacent")


def test_sequence_past_max_seq_len_is_rejected():
    model = Decoder(small_config(max_seq_len=16))
    with pytest.raises(ValueError, match=r"0 cached \+ 17 new positions > max_seq_len \(16\)"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_generation_past_max_seq_len_is_rejected():
    model = Decoder(small_config(max_seq_len=16))
    with pytest.raises(ValueError, match=r"prompt length \(10\) \+ max_new_tokens \(7\) = 17 > max_seq_len \(16\)"):
        model.generate(torch.zeros(1, 10, dtype=torch.long), 7)


def test_cache_overflow_is_rejected():
    model = Decoder(small_config(max_seq_len=16))
    cache = model.new_cache(1)
    model(torch.zeros(1, 12, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"12 cached \+ 5 new positions > max_seq_len \(16\)"):
        model(torch.zeros(1, 5, dtype=torch.long), cache)
    assert cache.pos == 12  # a rejected call leaves the cache as it was


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_forward_past_a_short_cache_is_rejected(implementation):
    model = Decoder(small_config(max_seq_len=16, attn_implementation=implementation))
    cache = model.new_cache(1, max_seq_len=6)
    model(torch.zeros(1, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"4 cached \+ 3 new positions > the cache's max_seq_len \(6\)"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    assert cache.pos == 4  # a rejected call leaves the cache as it was
    model(torch.zeros(1, 2, dtype=torch.long), cache)  # what still fits is accepted
    assert cache.pos == 6


@pytest.mark.parametrize("length", [0, 17])
def test_new_cache_length_outside_the_config_is_rejected(length):
    model = Decoder(small_config(max_seq_len=16))
    with pytest.raises(ValueError, match=rf"max_seq_len must be in \[1, 16\] \(the config's\), got {length}"):
        model.new_cache(1, max_seq_len=length)


def test_token_ids_outside_vocab_are_rejected():
    model = Decoder(small_config(vocab_size=64))
    with pytest.raises(ValueError, match=r"ids in tokens must be in \[0, 63\] \(vocab_size=64\), got min 0, max 64"):
        model(torch.tensor([[0, 64]]))
    with pytest.raises(ValueError, match="got min -1"):
        model(torch.tensor([[-1, 3]]))


def test_float_tokens_are_rejected():
    model = Decoder(small_config())
    with pytest.raises(ValueError, match="integer .* got torch.float32"):
        model(torch.zeros(1, 4))


def test_cache_batch_mismatch_is_rejected():
    model = Decoder(small_config())
    with pytest.raises(ValueError, match="batch size 2, got tokens of batch size 3"):
        model(torch.zeros(3, 4, dtype=torch.long), model.new_cache(2))


def test_bad_sampling_arguments_are_rejected():
    model = Decoder(small_config())
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must be >= 0, got -1"):
        model.generate(prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 64\], got 0"):
        model.generate(prompt, 2, temperature=1.0, top_k=0)
