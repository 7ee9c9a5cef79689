"""Planted cheats for chapter 6's core exercises (SwiGLU, the decoder block, the whole decoder),
collected by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal
names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

# A correct SwiGLU and block, for the cheats that replace only another part.
_SWIGLU = """
import torch
import torch.nn.functional as F
def swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
"""

_BLOCK = _SWIGLU + """
from transformer_lib.attention import scaled_dot_product_attention as attention
from transformer_lib.norms import rms_norm
from transformer_lib.positional import apply_rope as rope_half
def decoder_block(x, weights, cos, sin, config):
    B, T, C = x.shape
    H, H_kv = config.n_heads, config.n_kv_heads
    D = C // H
    h = rms_norm(x, weights["input_layernorm.weight"], config.norm_eps)
    def split(name, n):
        return (h @ weights[f"self_attn.{name}.weight"].T).view(B, T, n, D).transpose(1, 2)
    q, k, v = split("q_proj", H), split("k_proj", H_kv), split("v_proj", H_kv)
    q, k = rope_half(q, cos, sin), rope_half(k, cos, sin)
    k, v = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)
    out, _ = attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
    x = x + out.transpose(1, 2).reshape(B, T, C) @ weights["self_attn.o_proj.weight"].T
    h = rms_norm(x, weights["post_attention_layernorm.weight"], config.norm_eps)
    return x + swiglu(h, weights["mlp.gate_proj.weight"], weights["mlp.up_proj.weight"],
                      weights["mlp.down_proj.weight"])
"""

CHEATS = [
    # swiglu -------------------------------------------------------------------------------------
    ("check_swiglu", REFERENCE, """
from transformer_lib.checks import ch06_decoder_pieces as c
def swiglu(x, w_gate, w_up, w_down):
    return c._swiglu(x, w_gate, w_up, w_down)
""", "ch06_decoder_pieces._swiglu"),
    ("check_swiglu", LIBRARY, """
import torch
from transformer_lib.ffn import SwiGLU
def swiglu(x, w_gate, w_up, w_down):
    net = SwiGLU(w_gate.shape[1], w_gate.shape[0])
    with torch.no_grad():
        net.gate_proj.weight.copy_(w_gate)
        net.up_proj.weight.copy_(w_up)
        net.down_proj.weight.copy_(w_down)
        return net(x)
""", "ffn.SwiGLU"),
    ("check_swiglu", "the library's forward on a module made without its constructor", """
import torch
from transformer_lib.ffn import SwiGLU
def swiglu(x, w_gate, w_up, w_down):
    net = SwiGLU.__new__(SwiGLU)
    torch.nn.Module.__init__(net)
    for name, w in (("gate_proj", w_gate), ("up_proj", w_up), ("down_proj", w_down)):
        layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        layer.weight.data = w
        setattr(net, name, layer)
    return SwiGLU.forward(net, x)
""", "ffn.SwiGLU.forward"),
    ("check_swiglu", PRIVATE, """
import torch.nn.functional as F
from transformer_lib import ffn
def swiglu(x, w_gate, w_up, w_down):
    ffn._check_sizes(x.shape[-1], w_gate.shape[0])
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
""", "ffn._check_sizes"),
    ("check_swiglu", FRAMEWORK, """
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP
def swiglu(x, w_gate, w_up, w_down):
    F, C = w_gate.shape
    mlp = LlamaMLP(LlamaConfig(hidden_size=C, intermediate_size=F))
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(w_gate)
        mlp.up_proj.weight.copy_(w_up)
        mlp.down_proj.weight.copy_(w_down)
        return mlp(x)
""", "transformers."),
    ("check_swiglu", CHECKER, """
import torch.nn.functional as F
from transformer_lib.checks import check_swiglu
def swiglu(x, w_gate, w_up, w_down):
    check_swiglu(lambda *args: args[0])
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
""", "check_swiglu"),
    # decoder_block ------------------------------------------------------------------------------
    ("check_decoder_block", REFERENCE, """
from transformer_lib.checks import ch06_decoder_pieces as c
def decoder_block(x, weights, cos, sin, config):
    return c._block(x, weights, cos, sin, config.n_heads, config.n_kv_heads,
                    config.norm_eps).to(x.dtype)
""", "ch06_decoder_pieces._block"),
    ("check_decoder_block", LIBRARY, """
import torch
from transformer_lib.decoder import DecoderBlock
def decoder_block(x, weights, cos, sin, config):
    block = DecoderBlock(config)
    block.load_state_dict(weights)
    with torch.no_grad():
        return block(x, (cos, sin))
""", "decoder.DecoderBlock"),
    ("check_decoder_block", "the library's block built on the meta device, loaded with assign", """
import torch
from transformer_lib.decoder import DecoderBlock
def decoder_block(x, weights, cos, sin, config):
    with torch.device("meta"):
        block = DecoderBlock(config)
    block.load_state_dict(weights, assign=True)
    return block(x, (cos, sin))
""", "decoder.DecoderBlock"),
    ("check_decoder_block", "the library's attention layer, its forward called directly", """
import torch
from transformer_lib.attention import MultiHeadAttention
from transformer_lib.norms import rms_norm
def decoder_block(x, weights, cos, sin, config):
    attn = MultiHeadAttention.__new__(MultiHeadAttention)
    return MultiHeadAttention.forward(attn, x, rope=(cos, sin), causal=True)
""", "attention.MultiHeadAttention.forward"),
    ("check_decoder_block", "the library's grouped heads and mask", _SWIGLU + """
from transformer_lib.attention import causal_mask, repeat_kv
def decoder_block(x, weights, cos, sin, config):
    repeat_kv(x[None], 1)
    return x + causal_mask(x.shape[1]).sum()
""", "attention.repeat_kv"),
    ("check_decoder_block", PRIVATE, _SWIGLU + """
from transformer_lib import attention as A
def decoder_block(x, weights, cos, sin, config):
    A._heads_per_kv_head(x[None], x[None], x[None])
    return x
""", "attention._heads_per_kv_head"),
    ("check_decoder_block", FRAMEWORK, _BLOCK.replace(
        "    out, _ = attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())",
        "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)"),
     "torch.nn.functional.scaled_dot_product_attention"),
    ("check_decoder_block", "the framework's RMSNorm", _BLOCK.replace(
        'h = rms_norm(x, weights["input_layernorm.weight"], config.norm_eps)',
        'h = torch.nn.functional.rms_norm(x, x.shape[-1:], '
        'weights["input_layernorm.weight"], config.norm_eps)'),
     "torch.nn.functional.rms_norm"),
    ("check_decoder_block", "the framework's RMSNorm module", _BLOCK.replace(
        'h = rms_norm(x, weights["input_layernorm.weight"], config.norm_eps)',
        'h = torch.nn.RMSNorm(x.shape[-1], eps=config.norm_eps)(x)'),
     "torch.nn.RMSNorm"),
    ("check_decoder_block", "Hugging Face's Llama layer", _SWIGLU + """
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
def decoder_block(x, weights, cos, sin, config):
    layer = LlamaDecoderLayer(LlamaConfig(hidden_size=config.d_model), 0)
    return x
""", "transformers."),
    ("check_decoder_block", CHECKER, _SWIGLU + """
from transformer_lib.checks import check_decoder_block
def decoder_block(x, weights, cos, sin, config):
    check_decoder_block(lambda x, *rest: x)
    return x
""", "check_decoder_block"),
    # decoder_logits -----------------------------------------------------------------------------
    ("check_decoder_logits", REFERENCE, """
from transformer_lib.checks import ch06_decoder_pieces as c
def decoder_logits(tokens, weights, config):
    return c._logits(tokens, weights, config).float()
""", "ch06_decoder_pieces._logits"),
    ("check_decoder_logits", LIBRARY, """
import torch
from transformer_lib.decoder import Decoder
def decoder_logits(tokens, weights, config):
    model = Decoder(config)
    model.load_state_dict(weights)
    with torch.no_grad():
        return model(tokens)
""", "decoder.Decoder"),
    ("check_decoder_logits", "the library's Decoder on the meta device, loaded with assign", """
import torch
from transformer_lib.decoder import Decoder
def decoder_logits(tokens, weights, config):
    with torch.device("meta"):
        model = Decoder(config)
    model.load_state_dict(weights, assign=True)
    return model(tokens)
""", "decoder.Decoder"),
    ("check_decoder_logits", "Decoder.forward through nn.Module.__call__, fetched by getattr", """
import torch
from transformer_lib import decoder
def decoder_logits(tokens, weights, config):
    cls = getattr(decoder, "Dec" + "oder")
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    call = getattr(torch.nn.Module, "__call__")
    return call(model, tokens)
""", "decoder.Decoder.forward"),
    ("check_decoder_logits", "the library's RoPE tables", _BLOCK + """
from transformer_lib.positional import rope_cos_sin
def decoder_logits(tokens, weights, config):
    cos, sin = rope_cos_sin(tokens.shape[1], config.head_dim, config.rope_theta)
    return cos
""", "positional.rope_cos_sin"),
    ("check_decoder_logits", PRIVATE, _BLOCK + """
from transformer_lib import decoder
def decoder_logits(tokens, weights, config):
    decoder.Decoder._position_tables(None)
    return tokens
""", "decoder.Decoder._position_tables"),
    ("check_decoder_logits", FRAMEWORK, _BLOCK.replace(
        "    out, _ = attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())",
        "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)")
     + """
def decoder_logits(tokens, weights, config):
    T, D = tokens.shape[1], config.d_model // config.n_heads
    inv = config.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv
    cos, sin = angles.cos().float(), angles.sin().float()
    x = weights["embed_tokens.weight"][tokens]
    for i in range(config.n_layers):
        p = f"layers.{i}."
        x = decoder_block(x, {k[len(p):]: w for k, w in weights.items() if k.startswith(p)},
                          cos, sin, config)
    x = rms_norm(x, weights["norm.weight"], config.norm_eps)
    return x @ weights["lm_head.weight"].T
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_decoder_logits", "Hugging Face's Llama model", """
from transformers import LlamaConfig, LlamaForCausalLM
def decoder_logits(tokens, weights, config):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=config.vocab_size,
                                         hidden_size=config.d_model))
    return tokens
""", "transformers."),
    ("check_decoder_logits", CHECKER, """
from transformer_lib.checks import check_decoder_logits
def decoder_logits(tokens, weights, config):
    check_decoder_logits(lambda tokens, *rest: tokens)
    return tokens
""", "check_decoder_logits"),
]
