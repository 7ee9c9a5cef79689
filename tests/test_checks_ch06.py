"""Chapter 6's checkers (``transformer_lib/checks/ch06_decoder_pieces.py``, the core, and
``ch06_modern_decoder.py``) name the usual mistakes in words a student can act on; the
reference of the whole decoder is the library's ``Decoder`` with the same weights loaded, and
the reference of the QK-norm exercise is Hugging Face's Qwen3 attention (norms of D weights)
and OLMo 2 attention (norms of H·D weights). The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import math

import pytest
import torch

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_lib.checks import (
    ch06_decoder_pieces,
    ch06_modern_decoder,
    check_decoder_block,
    check_decoder_logits,
    check_decoder_param_count,
    check_gqa_to_mha,
    check_qk_norm_attention,
    check_swiglu,
)
from transformer_lib.checks.ch06_decoder_pieces import (
    _block_weights,
    _config,
    _logits,
    _model_weights,
)
from transformer_lib.checks.ch06_modern_decoder import _qk_norm_attention
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.norms import RMSNorm, rms_norm
from transformer_lib.positional import apply_rope, rope_cos_sin

from chapter_solutions import references
from conftest import mistake_tests, randomize_, require, trusting

decoder_param_count, gqa_to_mha, qk_norm_attention = references(
    "06_modern_decoder", "decoder_param_count", "gqa_to_mha", "qk_norm_attention")


def count_wrong(**mistake):
    """decoder_param_count with one of the usual mistakes."""

    def count(V, C, L, H, H_kv, d_ff, tie):
        D = C // H
        kv = (H if mistake.get("kv_as_h") else H_kv) * D
        attention = 2 * C * C + 2 * C * kv + (2 * C + 2 * kv if mistake.get("biases") else 0)
        ffn = (2 if mistake.get("two_matrices") else 3) * C * d_ff
        ffn += 2 * d_ff + C if mistake.get("biases") else 0
        norms = 0 if mistake.get("no_norms") else 2 * C
        outputs = 2 if (mistake.get("tied_twice") or not tie) else 1
        if mistake.get("forget_lm_head"):
            outputs = 1
        final = 0 if mistake.get("no_norms") or mistake.get("no_final") else C
        return V * C * outputs + L * (attention + ffn + norms) + final

    return count


def tiled(state_dict, n_heads, n_kv_heads):
    """Heads repeated as kv0, kv1, kv0, kv1 instead of kv0, kv0, kv1, kv1."""
    out = {}
    for name, t in state_dict.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.repeat(n_heads // n_kv_heads, 1)
        out[name] = t.clone()
    return out


def rows_repeated(state_dict, n_heads, n_kv_heads):
    out = {}
    for name, t in state_dict.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.repeat_interleave(n_heads // n_kv_heads, dim=0)
        out[name] = t.clone()
    return out


def keys_only(state_dict, n_heads, n_kv_heads):
    converted = gqa_to_mha(state_dict, n_heads, n_kv_heads)
    for name in converted:
        if name.endswith("v_proj.weight"):
            converted[name] = state_dict[name].clone()
    return converted


def in_place(state_dict, n_heads, n_kv_heads):
    converted = gqa_to_mha(state_dict, n_heads, n_kv_heads)
    state_dict.clear()
    state_dict.update(converted)
    return state_dict


def qk_norm_variant(**mistake):
    def attention(x, attn, q_norm, k_norm, cos, sin):
        with trusting(_qk_norm_attention):  # the checker's reference, one thing changed
            return _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, **mistake)

    return attention


def qk_norm_over_channels(x, attn, q_norm, k_norm, cos, sin):
    """RMS statistics over all C channels of the projection, then each head's D weights."""
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H

    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    q = rms(attn.q_proj(x)).view(B, T, H, D).transpose(1, 2) * q_norm.weight[:D]
    k = rms(attn.k_proj(x)).view(B, T, H_kv, D).transpose(1, 2) * k_norm.weight[:D]
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal_mask(T), -math.inf)
    out = torch.softmax(scores, -1) @ v
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))


def qk_norm_per_head_only(x, attn, q_norm, k_norm, cos, sin):
    """Qwen3's placement for every model: RMSNorm on (B, H, T, D), whatever its size."""
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H
    q = q_norm(attn.q_proj(x).view(B, T, H, D).transpose(1, 2))
    k = k_norm(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2))
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_decoder_param_count, count_wrong(kv_as_h=True),
     ["2 of 4 checks passed", "n_kv_heads · D outputs, not n_heads · D"]),
    (check_decoder_param_count, count_wrong(two_matrices=True), ["three matrices"]),
    (check_decoder_param_count, count_wrong(no_norms=True),
     ["0 of 4 checks passed", "two RMSNorm weight vectors"]),
    (check_decoder_param_count, count_wrong(no_final=True), ["after the last block", "model.norm"]),
    (check_decoder_param_count, count_wrong(tied_twice=True),
     ["3 of 4 checks passed", "count it once"]),
    (check_decoder_param_count, count_wrong(forget_lm_head=True),
     ["1 of 4 checks passed", "second vocab_size × d_model matrix"]),
    (check_decoder_param_count, count_wrong(biases=True), ["no biases"]),
    (check_decoder_param_count, lambda *sizes: str(decoder_param_count(*sizes)),
     ["expected a whole number of parameters"]),
    (check_gqa_to_mha, tiled,
     ["2 of 4 checks passed", "wrong values in the logits of the converted model",
      "tiled (kv0, kv1, kv0, kv1)"]),
    (check_gqa_to_mha, rows_repeated, ["1 of 4 checks passed", "single rows were repeated"]),
    (check_gqa_to_mha, keys_only, ["v_proj.weight has shape (16, 32)", "convert the values"]),
    (check_gqa_to_mha, in_place, ["changed its input", "build a new dict"]),
    (check_gqa_to_mha, lambda sd, H, H_kv: {k: v for k, v in gqa_to_mha(sd, H, H_kv).items()
                                           if "norm" not in k},
     ["the result lacks", "return every tensor"]),
    (check_gqa_to_mha, lambda sd, H, H_kv: list(gqa_to_mha(sd, H, H_kv).values()),
     ["return a dict of tensors"]),
    (check_qk_norm_attention, qk_norm_variant(order="rope-norm"),
     ["0 of 4 checks passed", "the norm comes before RoPE"]),
    (check_qk_norm_attention, qk_norm_variant(norm_k=False), ["normalise the keys too"]),
    (check_qk_norm_attention, qk_norm_variant(norm_v=True), ["the values stay"]),
    (check_qk_norm_attention, qk_norm_variant(masked=False), ["the attention is causal"]),
    (check_qk_norm_attention, qk_norm_variant(pairing="interleaved"), ["split-half pairing"]),
    (check_qk_norm_attention, qk_norm_over_channels,
     ["0 of 4 checks passed", "position 1", "this case follows Qwen3",
      "over each head's D channels"]),
    (check_qk_norm_attention, qk_norm_per_head_only,
     ["2 of 4 checks passed", "this case follows OLMo 2", "the whole projection"]),
    (check_qk_norm_attention, qk_norm_variant(stats="head"),
     ["2 of 4 checks passed", "this case follows OLMo 2"]),
    (check_qk_norm_attention,  # the library's attention: no QK-norm at all
     lambda x, attn, q_norm, k_norm, cos, sin: attn(x, rope=(cos, sin), causal=True),
     ["0 of 4 checks passed", "MultiHeadAttention.forward` is not allowed here"]),
    (check_qk_norm_attention,
     lambda *args: qk_norm_attention(*args).view(args[0].shape[0], args[0].shape[1],
                                                 args[1].n_heads, -1).transpose(1, 2),
     ["wrong shape for the output", "merge the heads back"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch06_modern_decoder))


@pytest.mark.equality
def test_qk_norm_reference_equals_hugging_face_qwen3_attention(ledger):
    """The checker's reference is the attention of Qwen3: per-head RMSNorm on queries and
    keys, before split-half RoPE, with grouped-query heads (all weights random)."""
    transformers = require("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = transformers.Qwen3Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                      num_hidden_layers=1, vocab_size=16, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = randomize_(Qwen3Attention(config, layer_idx=0)).eval()
    attn = MultiHeadAttention(32, 4, 2, bias=False).eval()
    q_norm, k_norm = RMSNorm(8, eps=1e-6), RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight.copy_(getattr(hf, name).weight)
        q_norm.weight.copy_(hf.q_norm.weight)
        k_norm.weight.copy_(hf.k_norm.weight)
    assert not torch.allclose(q_norm.weight, torch.ones(8))  # randomised: the order matters
    T = 7
    cos, sin = rope_cos_sin(T, 8)  # (T, D/2)
    full = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])  # (1, T, D)
    blocked = torch.full((T, T), -math.inf).triu(1)[None, None]  # (1, 1, T, T) additive
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=full, attention_mask=blocked)
        got = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)
        rope_first = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, order="rope-norm")
    ledger.check("QK-norm attention, per-head norms", ledger.hf("Qwen3Attention"), got, expected,
                 tol=1e-5)
    assert (rope_first - expected).abs().max().item() > 1e-3


@pytest.mark.equality
def test_qk_norm_reference_with_whole_width_norms_equals_hugging_face_olmo2_attention(ledger):
    """With norms of H·D and H_kv·D weights the checker's reference is OLMo 2's attention:
    RMSNorm over the whole projection of a position, then the split into heads, then RoPE."""
    transformers = require("transformers")
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    config = transformers.Olmo2Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64,
                                      num_hidden_layers=1, vocab_size=16, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = randomize_(Olmo2Attention(config, layer_idx=0)).eval()
    attn = MultiHeadAttention(32, 4, 2, bias=False).eval()
    q_norm, k_norm = RMSNorm(32, eps=1e-6), RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight.copy_(getattr(hf, name).weight)
        q_norm.weight.copy_(hf.q_norm.weight)
        k_norm.weight.copy_(hf.k_norm.weight)
    assert not torch.allclose(q_norm.weight, torch.ones(32))
    T = 7
    cos, sin = rope_cos_sin(T, 8)  # (T, D/2)
    full = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])  # (1, T, D)
    blocked = torch.full((T, T), -math.inf).triu(1)[None, None]  # (1, 1, T, T) additive
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=full, attention_mask=blocked)
        got = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)
        per_head = _qk_norm_attention(x, attn, q_norm, k_norm, cos, sin, stats="head")
    ledger.check("QK-norm attention, whole-width norms", ledger.hf("Olmo2Attention"), got,
                 expected, tol=1e-5)
    assert (per_head - expected).abs().max().item() > 1e-3


# The core: SwiGLU, the decoder block, the whole decoder ---------------------------------------

swiglu, decoder_block, decoder_logits = references(
    "06_modern_decoder", "swiglu", "decoder_block", "decoder_logits")

_ACT = {"silu": torch.nn.functional.silu, "relu": torch.relu,
        "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid, "none": lambda t: t}


def swiglu_wrong(act="silu", on="gate", up=True, hidden=False):
    """A SwiGLU as a student might write it, with one mistake."""
    def wrong(x, w_gate, w_up, w_down):
        gate, lifted = x @ w_gate.T, x @ w_up.T
        if on == "up":
            gate, lifted = lifted, gate
        h = _ACT[act](gate) * (lifted if up else 1.0)  # (..., F)
        return h if hidden else h @ w_down.T
    return wrong


def block_wrong(norm="pre", residual="both", norms="in order", ffn=swiglu, rope="qk",
                mask=True, prescale=False, heads="interleave", eps=None, pairing="half"):
    """A decoder block as a student might write it (the library's pieces, as the chapter
    binds them), with one mistake."""
    def wrong(x, weights, cos, sin, config):
        B, T, C = x.shape
        H, H_kv = config.n_heads, config.n_kv_heads
        D = C // H
        e = config.norm_eps if eps is None else eps
        n1, n2 = weights["input_layernorm.weight"], weights["post_attention_layernorm.weight"]
        if norms == "swapped":
            n1, n2 = n2, n1

        def turn(t):
            return apply_rope(t, cos, sin, pairing=pairing)

        def attend(h):
            def split(name, n):
                return (h @ weights[f"self_attn.{name}.weight"].T).view(B, T, n, D).transpose(1, 2)
            q, k, v = split("q_proj", H), split("k_proj", H_kv), split("v_proj", H_kv)
            if rope != "none":
                q = turn(q)
            if rope in ("qk", "qkv"):
                k = turn(k)
            if rope == "qkv":
                v = turn(v)
            if prescale:
                q = q / math.sqrt(D)
            if heads == "interleave":
                k, v = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)
            else:
                k, v = k.repeat(1, H // H_kv, 1, 1), v.repeat(1, H // H_kv, 1, 1)
            causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
            out, _ = scaled_dot_product_attention(q, k, v, causal if mask else None)
            return out.transpose(1, 2).reshape(B, T, C) @ weights["self_attn.o_proj.weight"].T

        def mlp(h):
            return ffn(h, weights["mlp.gate_proj.weight"], weights["mlp.up_proj.weight"],
                       weights["mlp.down_proj.weight"])

        if norm == "post":
            h = rms_norm(x + attend(x), n1, e)
            return rms_norm(h + mlp(h), n2, e)
        h = (0 if residual == "attn" else x) + attend(rms_norm(x, n1, e))
        return (0 if residual == "ffn" else h) + mlp(rms_norm(h, n2, e))
    return wrong


def logits_wrong(theta=None, freq="2i/D", final_norm=True, final_eps=None,
                 head="lm_head", same_layer=False, probs=False, block=decoder_block):
    """A whole decoder as a student might write it, with one mistake."""
    def wrong(tokens, weights, config):
        T, D = tokens.shape[1], config.d_model // config.n_heads
        i = torch.arange(D // 2, dtype=torch.float64)
        inv_freq = (config.rope_theta if theta is None else theta) ** (
            -(2 * i if freq == "2i/D" else i) / D)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
        cos, sin = angles.cos().float(), angles.sin().float()
        x = weights["embed_tokens.weight"][tokens]
        for n in range(config.n_layers):
            prefix = "layers.0." if same_layer else f"layers.{n}."
            layer = {k[len(prefix):]: w for k, w in weights.items() if k.startswith(prefix)}
            x = block(x, layer, cos, sin, config)
        if final_norm:
            x = rms_norm(x, weights["norm.weight"],
                         config.norm_eps if final_eps is None else final_eps)
        out = x @ weights["lm_head.weight" if head == "lm_head" else "embed_tokens.weight"].T
        return out.softmax(-1) if probs else out
    return wrong


def scribbles_on_the_weights(tokens, weights, config):
    weights["norm.weight"].mul_(2.0)
    return decoder_logits(tokens, weights, config)


CORE_WRONG = [
    (check_swiglu, swiglu_wrong(on="up"), ["0 of 3 checks passed", "SiLU went on the up"]),
    (check_swiglu, swiglu_wrong(act="relu"), ["this is ReLU"]),
    (check_swiglu, swiglu_wrong(act="gelu"), ["this is GELU (GeGLU)"]),
    (check_swiglu, swiglu_wrong(act="sigmoid"), ["a sigmoid gate (the original GLU)"]),
    (check_swiglu, swiglu_wrong(act="none"), ["no activation"]),
    (check_swiglu, swiglu_wrong(up=False), ["the up projection is missing"]),
    (check_swiglu, swiglu_wrong(hidden=True),
     ["wrong shape for the output: expected (..., C) = (2, 5, 16), got (2, 5, 43)",
      "multiply by w_downᵀ"]),
    (check_decoder_block, block_wrong(norm="post"), ["0 of 4 checks passed", "post-norm"]),
    (check_decoder_block, block_wrong(residual="attn"), ["the attention's residual"]),
    (check_decoder_block, block_wrong(residual="ffn"), ["the feed-forward residual"]),
    (check_decoder_block, block_wrong(norms="swapped"), ["the two norms are swapped"]),
    (check_decoder_block, block_wrong(ffn=swiglu_wrong(on="up")),
     ["SiLU on the up projection: fix `swiglu` first"]),
    (check_decoder_block, block_wrong(ffn=swiglu_wrong(act="relu")),
     ["used ReLU, not SiLU"]),
    (check_decoder_block, block_wrong(rope="qkv"),
     ["1 of 4 checks passed", "the values were turned by RoPE too"]),
    (check_decoder_block, block_wrong(rope="q"), ["the keys were not turned"]),
    (check_decoder_block, block_wrong(rope="none"), ["no RoPE"]),
    (check_decoder_block, block_wrong(mask=False), ["1 of 4 checks passed", "no causal mask"]),
    (check_decoder_block, block_wrong(prescale=True),
     ["1 of 4 checks passed", "divided by D = 8, not √D", "divided by D = 6, not √D"]),
    (check_decoder_block, block_wrong(heads="tile"),
     ["2 of 4 checks passed", "repeat_interleave: kv0, kv0, kv1, kv1"]),
    (check_decoder_block, block_wrong(eps=1e-6),
     ["3 of 4 checks passed", "ignored config.norm_eps (0.01) and used 1e-6"]),
    (check_decoder_block, block_wrong(pairing="interleaved"),
     ["1 of 4 checks passed", "the interleaved RoPE pairing"]),
    (check_decoder_logits, logits_wrong(theta=10000.0),
     ["2 of 4 checks passed", "this model's is config.rope_theta = 500"]),
    (check_decoder_logits, logits_wrong(freq="i/D"), ["1 of 4 checks passed", "θ^(−2i/D)"]),
    (check_decoder_logits, logits_wrong(final_norm=False),
     ["0 of 4 checks passed", "the final norm is missing"]),
    (check_decoder_logits, logits_wrong(final_eps=1e-6),
     ["the final norm ignored config.norm_eps (0.01)"]),
    (check_decoder_logits, logits_wrong(block=block_wrong(eps=1e-6), final_eps=1e-6),
     ["3 of 4 checks passed", "pass it to every rms_norm"]),
    (check_decoder_logits, logits_wrong(block=block_wrong(eps=1e-6)),
     ["the blocks ignored config.norm_eps (0.01)"]),
    (check_decoder_logits, logits_wrong(head="embed"),
     ["2 of 4 checks passed", "not embed_tokens.weight"]),
    (check_decoder_logits, logits_wrong(same_layer=True), ["the weights of layer 0"]),
    (check_decoder_logits, logits_wrong(probs=True), ["these are probabilities"]),
    (check_decoder_logits, logits_wrong(block=block_wrong(pairing="interleaved")),
     ["the interleaved RoPE pairing"]),
    (check_decoder_logits, logits_wrong(block=block_wrong(mask=False)),
     ["run check_decoder_block first"]),
    (check_decoder_logits, scribbles_on_the_weights, ["changed the weights dict"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch06_decoder_pieces))

_CONFIGS = [
    DecoderConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=45,
                  rope_theta=500.0, norm_eps=1e-2),
    DecoderConfig(vocab_size=24, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=40,
                  tie_embeddings=True),
    DecoderConfig(vocab_size=20, d_model=24, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=37),
]


@pytest.mark.parametrize("config", _CONFIGS, ids=["GQA", "tied MHA", "MQA"])
def test_the_checker_names_the_weights_as_the_library_does(config):
    g = torch.Generator().manual_seed(0)
    model = Decoder(config)
    assert list(_model_weights(config, g)) == list(model.state_dict())
    assert list(_block_weights(config, g)) == list(model.layers[0].state_dict())
    for name, tensor in _model_weights(config, g).items():
        assert tensor.shape == model.state_dict()[name].shape, name


@pytest.mark.parametrize("config", _CONFIGS, ids=["GQA", "tied MHA", "MQA"])
def test_the_reference_decoder_equals_the_library_decoder(config):
    """The checker's float64 reference, from the weights alone, is the library's Decoder with
    the same weights loaded (strict), in float64: the model the exercise asks for is the
    model the rest of the book runs."""
    g = torch.Generator().manual_seed(1)
    weights = _model_weights(config, g, embed_std=0.05)
    model = Decoder(config).double().eval()
    model.load_state_dict({k: t.double() for k, t in weights.items()})
    if config.tie_embeddings:
        assert model.lm_head.weight is model.embed_tokens.weight
    tokens = torch.randint(0, config.vocab_size, (2, 11), generator=g)
    with torch.no_grad():
        expected = model(tokens)
    got = _logits(tokens, weights, config)
    assert got.dtype == expected.dtype == torch.float64
    assert (got - expected).abs().max().item() < 1e-12
    wrong_theta = _logits(tokens, weights, config, theta=config.rope_theta * 2)
    assert (wrong_theta - expected).abs().max().item() > 1e-3  # the comparison can fail


def test_the_chapter_solution_equals_the_library_decoder():
    """The chapter's three functions, together, compute the library's Decoder in float32."""
    config = _config(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=45,
                     rope_theta=500.0, norm_eps=1e-2)
    g = torch.Generator().manual_seed(2)
    weights = _model_weights(config, g)
    model = Decoder(config).eval()
    model.load_state_dict(weights)
    tokens = torch.randint(0, config.vocab_size, (2, 9), generator=g)
    with torch.no_grad():
        assert torch.allclose(decoder_logits(tokens, weights, config), model(tokens),
                              atol=1e-5, rtol=1e-5)
