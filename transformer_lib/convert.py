"""Load weights from independent implementations into ours, to prove the two compute the same.

* :func:`decoder_from_hf_llama`: a Hugging Face ``LlamaForCausalLM`` -> our
  :class:`~transformer_lib.decoder.Decoder`.
* :func:`encoder_decoder_from_torch`: a ``torch.nn.Transformer`` -> our
  :class:`~transformer_lib.encoder_decoder.EncoderDecoder`.

Both copy every tensor explicitly and fail loudly on a configuration we do not model.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.norms import LayerNorm


def _rope_type(params) -> str:
    """The RoPE variant a config's RoPE dict names: ``rope_type`` (older configs: ``type``),
    "default" when there is no dict or it names none."""
    params = params or {}
    return params.get("rope_type", params.get("type")) or "default"


def _rope_theta(config) -> float:
    """θ of a Llama config, which must use plain RoPE: a scaled RoPE (``llama3``, ``linear``,
    ``dynamic``, ``yarn``, …) changes the frequencies, and :class:`Decoder` does not model it.

    transformers 5.x keeps both in ``config.rope_parameters`` (``rope_type``, ``rope_theta``);
    transformers 4.x keeps θ in ``config.rope_theta`` and the variant in
    ``config.rope_scaling`` (None for plain RoPE).

    Raises:
        ValueError: the config names a RoPE type other than "default", or has no θ.
    """
    params = getattr(config, "rope_parameters", None) or {}
    for where, found in (("rope_parameters", params),
                         ("rope_scaling", getattr(config, "rope_scaling", None))):
        rope_type = _rope_type(found)
        if rope_type != "default":
            raise ValueError(f"only the default RoPE is supported, got rope_type={rope_type!r} "
                             f"in config.{where}")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("could not find rope_theta in the Llama config")
    return float(theta)


def decoder_from_hf_llama(hf_model, attn_implementation: str = "eager") -> Decoder:
    """Build a :class:`~transformer_lib.decoder.Decoder` with the weights of a
    ``transformers.LlamaForCausalLM``.

    Hugging Face stores q/k weights for split-half RoPE, so the result uses
    ``rope_pairing="half"``. Tied embeddings stay tied. The parameter names are the same on
    both sides except for HF's ``model.`` prefix. ``attn_implementation`` is the decoder's
    (``"eager"``, the readable reference, ``"sdpa"``, the fused path, or ``"tiled"``), whatever
    HF's is.

    Args:
        hf_model: a ``transformers.LlamaForCausalLM`` (any size; its weights' dtype is kept).
        attn_implementation: the attention entry of the result.

    Returns:
        A :class:`~transformer_lib.decoder.Decoder` that computes the same logits
        ``(B, T, V)`` as ``hf_model`` for the same token ids ``(B, T)``.

    Raises:
        ValueError: for a config this decoder cannot express (biases, another activation,
            RoPE scaling, a head dim that does not divide the width).
    """
    cfg = hf_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim * cfg.num_attention_heads != cfg.hidden_size:
        raise ValueError(
            f"head_dim ({head_dim}) * num_attention_heads ({cfg.num_attention_heads}) must equal "
            f"hidden_size ({cfg.hidden_size})"
        )
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ValueError("Llama configs with attention_bias or mlp_bias are not supported")
    if cfg.hidden_act != "silu":
        raise ValueError(f"SwiGLU uses SiLU, got hidden_act={cfg.hidden_act!r}")
    config = DecoderConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.hidden_size,
        n_layers=cfg.num_hidden_layers,
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        d_ff=cfg.intermediate_size,
        max_seq_len=cfg.max_position_embeddings,
        rope_theta=_rope_theta(cfg),
        norm_eps=cfg.rms_norm_eps,
        tie_embeddings=bool(cfg.tie_word_embeddings),
        rope_pairing="half",
        attn_implementation=attn_implementation,
    )
    ref = hf_model.state_dict()
    model = Decoder(config).to(ref["model.embed_tokens.weight"].dtype)
    state = {}
    for name in model.state_dict():
        hf_name = name if name == "lm_head.weight" else "model." + name
        state[name] = ref[hf_name]
    model.load_state_dict(state)
    return model


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention packs W_Q, W_K, W_V into one ``in_proj_weight`` (3C, C)."""
    if theirs.in_proj_weight is None or theirs.in_proj_bias is None:
        raise ValueError(
            "nn.MultiheadAttention with separate kdim/vdim or no bias is not supported")
    wq, wk, wv = theirs.in_proj_weight.chunk(3, dim=0)  # (C, C) each
    bq, bk, bv = theirs.in_proj_bias.chunk(3, dim=0)  # (C,) each
    for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    ours.o_proj.weight.copy_(theirs.out_proj.weight)
    ours.o_proj.bias.copy_(theirs.out_proj.bias)


def _copy_norm(ours: LayerNorm, theirs: nn.LayerNorm) -> None:
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


def _copy_ffn(ours, theirs_layer) -> None:
    ours.w_1.weight.copy_(theirs_layer.linear1.weight)
    ours.w_1.bias.copy_(theirs_layer.linear1.bias)
    ours.w_2.weight.copy_(theirs_layer.linear2.weight)
    ours.w_2.bias.copy_(theirs_layer.linear2.bias)


@torch.no_grad()
def encoder_decoder_from_torch(module: nn.Transformer, src_vocab_size: int = 1,
                               tgt_vocab_size: int = 1) -> EncoderDecoder:
    """Build an :class:`~transformer_lib.encoder_decoder.EncoderDecoder` whose stacks compute
    what ``module`` computes.

    ``nn.Transformer`` has no embeddings, positions or output layer: it maps embedded inputs
    to hidden states. Our ``model.encoder`` and ``model.decoder`` stacks do the same on
    batch-first inputs ``(B, T, C)``. To match it, the result

    * is post-norm or pre-norm as the module is (``norm_first``), with ReLU (another
      activation raises ``ValueError``);
    * has ``final_norm=True``: ``nn.Transformer`` adds a LayerNorm after each stack;
    * uses the module's LayerNorm eps;
    * expects our mask convention (True = may attend): pass ``~mask`` for a boolean
      ``nn.Transformer`` mask, and for a key-padding mask ``~padding[:, None, None, :]``;
    * expects batch-first tensors: with ``batch_first=False`` transpose dims 0 and 1.

    The embeddings and output layer of the result are freshly initialised.

    Args:
        module: the ``torch.nn.Transformer`` to copy (its encoder and decoder layers).
        src_vocab_size: the result's source vocabulary (its embeddings are new).
        tgt_vocab_size: the result's target vocabulary.

    Returns:
        An :class:`~transformer_lib.encoder_decoder.EncoderDecoder` whose
        ``model.encoder(x, mask)`` and ``model.decoder(y, memory, tgt_mask, memory_mask)``
        on ``(B, S, C)`` and ``(B, T, C)`` match the module's stacks.

    Raises:
        ValueError: for an activation other than ReLU, or attention without biases.
    """
    enc_layers, dec_layers = module.encoder.layers, module.decoder.layers
    first = enc_layers[0]
    if not (first.activation is F.relu or isinstance(first.activation, nn.ReLU)):
        raise ValueError("only the ReLU activation is supported")
    attn = first.self_attn
    d_model, n_heads = attn.embed_dim, attn.num_heads
    config = EncoderDecoderConfig(
        src_vocab_size, tgt_vocab_size, d_model=d_model, n_heads=n_heads,
        n_layers=len(enc_layers), n_decoder_layers=len(dec_layers),
        d_ff=first.linear1.out_features, dropout=first.dropout.p, norm_eps=first.norm1.eps,
        final_norm=True, norm_first=first.norm_first,
    )
    model = EncoderDecoder(config)
    for ours, theirs in zip(model.encoder.layers, enc_layers):
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_ffn(ours.feed_forward, theirs)
        _copy_norm(ours.norm1, theirs.norm1)
        _copy_norm(ours.norm2, theirs.norm2)
    for ours, theirs in zip(model.decoder.layers, dec_layers):
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        _copy_ffn(ours.feed_forward, theirs)
        _copy_norm(ours.norm1, theirs.norm1)
        _copy_norm(ours.norm2, theirs.norm2)
        _copy_norm(ours.norm3, theirs.norm3)
    _copy_norm(model.encoder.norm, module.encoder.norm)
    _copy_norm(model.decoder.norm, module.decoder.norm)
    return model
