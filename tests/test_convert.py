"""Our models against independent implementations: Hugging Face Llama and torch.nn.Transformer."""
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from transformer_lib.attention import causal_mask
from transformer_lib.convert import _rope_theta, decoder_from_hf_llama, encoder_decoder_from_torch
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.positional import interleaved_to_half

from conftest import randomize_, require

LOGIT_TOL = 1e-4  # fp32, logits of size ~1 after a few layers of different summation orders


def hf_llama(n_heads=4, n_kv_heads=2, tie=False, theta=500000.0, vocab=96, layers=2):
    transformers = require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, max_position_embeddings=96,
        rope_theta=theta, rms_norm_eps=1e-5, tie_word_embeddings=tie,
    )
    model = transformers.LlamaForCausalLM(config)
    return randomize_(model, std=0.1).eval()


# RoPE scalings of Hugging Face's configs that Decoder does not model: each changes the
# frequencies, so a converted model would run plain RoPE and give other logits.
SCALED_ROPE = {
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},  # Llama 3.1 - 3.3
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 4096},
}


@pytest.mark.reference_input  # a Hugging Face config as input; no comparison
@pytest.mark.parametrize("rope_type", SCALED_ROPE)
def test_scaled_rope_is_refused_in_transformers_5_configs(rope_type):
    """transformers 5 keeps θ and the RoPE type together in ``rope_parameters``."""
    transformers = require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=16384,
        rope_parameters={"rope_type": rope_type, "rope_theta": 5e5, **SCALED_ROPE[rope_type]})
    with pytest.raises(ValueError, match=f"only the default RoPE is supported, got "
                                         f"rope_type='{rope_type}'"):
        _rope_theta(config)
    if rope_type == "llama3":  # and through the public entry, before a weight is copied
        with pytest.raises(ValueError, match="rope_type='llama3'"):
            decoder_from_hf_llama(transformers.LlamaForCausalLM(config))


@pytest.mark.parametrize("rope_type", SCALED_ROPE)
@pytest.mark.parametrize("key", ["rope_type", "type"])  # early 4.x configs said "type"
def test_scaled_rope_is_refused_in_transformers_4_configs(rope_type, key):
    """transformers 4 keeps θ in ``rope_theta`` and the scaling apart, in ``rope_scaling``."""
    v4 = SimpleNamespace(rope_theta=5e5, rope_scaling={key: rope_type, **SCALED_ROPE[rope_type]})
    with pytest.raises(ValueError, match=f"rope_type='{rope_type}' in config.rope_scaling"):
        _rope_theta(v4)


@pytest.mark.reference_input  # a Hugging Face config as input; no comparison
def test_plain_rope_passes_in_both_config_generations():
    transformers = require("transformers")
    assert _rope_theta(transformers.LlamaConfig(rope_theta=5e5)) == 5e5
    assert _rope_theta(transformers.LlamaConfig(
        rope_parameters={"rope_type": "default", "rope_theta": 2e4})) == 2e4
    assert _rope_theta(SimpleNamespace(rope_theta=5e5, rope_scaling=None)) == 5e5
    assert _rope_theta(SimpleNamespace(rope_theta=5e5)) == 5e5  # a 4.x config from before it
    assert _rope_theta(SimpleNamespace(rope_theta=3e4, rope_scaling={"rope_type": "default"})) \
        == 3e4
    with pytest.raises(ValueError, match="could not find rope_theta"):
        _rope_theta(SimpleNamespace(rope_scaling=None))


@pytest.mark.equality
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa", "tiled"])
@pytest.mark.parametrize("n_heads, n_kv_heads, tie", [(4, 4, False), (4, 2, True), (8, 2, False), (8, 1, True)])
def test_decoder_matches_hf_llama(n_heads, n_kv_heads, tie, attn_implementation, ledger):
    hf = hf_llama(n_heads, n_kv_heads, tie)
    ours = decoder_from_hf_llama(hf, attn_implementation=attn_implementation).eval()
    c = ours.config
    assert c.attn_implementation == attn_implementation
    assert (c.n_heads, c.n_kv_heads, c.tie_embeddings, c.rope_theta, c.norm_eps) == (
        n_heads, n_kv_heads, tie, 500000.0, 1e-5)
    assert (ours.lm_head.weight is ours.embed_tokens.weight) == tie
    tokens = torch.randint(0, 96, (2, 40))
    with torch.no_grad():
        expected = hf(tokens).logits
    ledger.check(f"decoder logits, {n_heads}/{n_kv_heads} heads, {attn_implementation}",
                 ledger.hf("LlamaForCausalLM"), ours(tokens), expected, tol=LOGIT_TOL)


@pytest.mark.equality
def test_greedy_tokens_match_hf_generate(ledger):
    hf = hf_llama(8, 2)
    ours = decoder_from_hf_llama(hf).eval()
    prompt = torch.randint(0, 96, (2, 8))
    expected = hf.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24,
                           attention_mask=torch.ones_like(prompt), pad_token_id=0)
    ledger.check("greedy tokens, 24 new", ledger.hf("LlamaForCausalLM.generate"),
                 ours.generate(prompt, 24), expected, tol=0)


@pytest.mark.equality
def test_kv_cache_matches_hf_incremental_decoding(ledger):
    hf = hf_llama(8, 2)
    ours = decoder_from_hf_llama(hf).eval()
    tokens = torch.randint(0, 96, (2, 20))
    cache = ours.new_cache(2)
    # Newer transformers name the cache `cache` (argument and output), older `past_key_values`.
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = hf(tokens[:, :12], use_cache=True)
        past, theirs = getattr(out, name), [out.logits]
        for t in range(12, 20):
            out = hf(tokens[:, t:t + 1], use_cache=True, **{name: past})
            past = getattr(out, name)
            theirs.append(out.logits)
    mine = [ours(tokens[:, :12], cache)] + [ours(tokens[:, t:t + 1], cache) for t in range(12, 20)]
    ledger.check("cached decoding logits, 12 + 8 steps", ledger.hf("LlamaForCausalLM with its cache"),
                 torch.cat(mine, 1), torch.cat(theirs, 1), tol=LOGIT_TOL)
    # The cached keys are the same numbers too (before GQA expansion: H_kv heads).
    hf_keys = past.layers[0].keys if hasattr(past, "layers") else past.key_cache[0]
    ledger.check("cached keys of layer 0", ledger.hf("LlamaForCausalLM's cache"),
                 cache.k[0, :, :, :20], hf_keys, tol=1e-5)


@pytest.mark.equality
def test_interleaved_model_equals_half_model_with_permuted_weights(ledger):
    # Claim C24: same function, different RoPE pairing, q/k rows permuted as in HF's conversion.
    config = DecoderConfig(vocab_size=50, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                           d_ff=96, max_seq_len=32, rope_pairing="interleaved")
    inter = randomize_(Decoder(config), std=0.1).eval()
    half = Decoder(DecoderConfig(**{**config.__dict__, "rope_pairing": "half"})).eval()
    state = inter.state_dict()
    for name in state:
        if name.endswith("q_proj.weight"):
            state[name] = interleaved_to_half(state[name], config.n_heads)
        elif name.endswith("k_proj.weight"):
            state[name] = interleaved_to_half(state[name], config.n_kv_heads)
    half.load_state_dict(state)
    tokens = torch.randint(0, 50, (2, 32))
    ledger.check("logits, interleaved pairing vs half with permuted q/k rows",
                 "the same model with rope_pairing='half'", half(tokens), inter(tokens), tol=1e-5)
    # Loading the same weights without the permutation is a different model.
    unpermuted = Decoder(half.config).eval()
    unpermuted.load_state_dict(inter.state_dict())
    assert (unpermuted(tokens) - inter(tokens)).abs().max().item() > 1e-2


@pytest.mark.equality
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_decoder_matches_nn_transformer(batch_first, norm_first, ledger):
    ref = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=3,
                         dim_feedforward=48, dropout=0.0, batch_first=batch_first,
                         norm_first=norm_first)
    ref = randomize_(ref).eval()
    ours = encoder_decoder_from_torch(ref).eval()
    assert ours.config.norm_first is norm_first
    assert len(ours.encoder.layers) == 2 and len(ours.decoder.layers) == 3
    src, tgt = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True  # torch convention: True = padding
    causal = nn.Transformer.generate_square_subsequent_mask(5)  # float mask, -inf = blocked
    args = (src, tgt) if batch_first else (src.transpose(0, 1), tgt.transpose(0, 1))
    with torch.no_grad():
        expected = ref(*args, tgt_mask=causal, src_key_padding_mask=pad,
                       memory_key_padding_mask=pad, tgt_is_causal=True)
    if not batch_first:
        expected = expected.transpose(0, 1)
    keep = ~pad[:, None, None, :]  # ours: True = may attend, (B, 1, 1, S)
    memory = ours.encoder(src, keep)
    got = ours.decoder(tgt, memory, causal_mask(5), keep)
    ledger.check("encoder-decoder output with padding and causal masks",
                 ledger.torch("nn.Transformer"), got, expected, tol=1e-5)


@pytest.mark.differs
def test_nn_transformer_without_final_norm_would_not_match():
    # nn.Transformer adds a LayerNorm after each stack: dropping it changes the output.
    ref = randomize_(nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                    dim_feedforward=32, dropout=0.0, batch_first=True)).eval()
    ours = encoder_decoder_from_torch(ref).eval()
    src, tgt = torch.randn(1, 4, 16), torch.randn(1, 3, 16)
    with torch.no_grad():
        expected = ref(src, tgt)
    ours.decoder.norm = None
    got = ours.decoder(tgt, ours.encoder(src))
    assert (got - expected).abs().max().item() > 1e-2


def test_pre_norm_and_post_norm_differ():
    """The same weights through the two orders of sublayer and norm give other outputs, so
    the pre-norm comparison above cannot pass by accident."""
    ref = randomize_(nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1,
                                    num_decoder_layers=1, dim_feedforward=32, dropout=0.0,
                                    batch_first=True, norm_first=True)).eval()
    pre = encoder_decoder_from_torch(ref).eval()
    post = encoder_decoder_from_torch(ref).eval()
    for layer in [*post.encoder.layers, *post.decoder.layers]:
        layer.norm_first = False
    src = torch.randn(1, 4, 16)
    assert (pre.encoder(src) - post.encoder(src)).abs().max().item() > 1e-2


def test_gelu_nn_transformer_is_rejected():
    ref = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                         activation="gelu")
    with pytest.raises(ValueError, match="ReLU"):
        encoder_decoder_from_torch(ref)
