"""Checkers for the core of chapter 6 (``chapters/06_modern_decoder.ipynb``), written by the
learner where the chapter builds it: the SwiGLU feed-forward network, the pre-norm decoder
block, and the whole decoder-only model from its weights.

The references are written out independently of the library, in float64, from weights named
as in the library's ``Decoder(config).state_dict()`` (RMSNorm, split-half RoPE with tables
computed here, key/value heads repeated in place, causal scores scaled by 1/√D, SwiGLU); the
whole model's equals :class:`~transformer_lib.decoder.Decoder` with those weights loaded."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.decoder import DecoderConfig

# The framework's ready-made pieces of a decoder block.
_READY_MADE = ("torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.rms_norm",
               "torch.nn.RMSNorm", "torch.nn.MultiheadAttention", "transformers.*")
_PIECES = ("rms_norm", "apply_rope", "scaled_dot_product_attention")  # chapters 4, 5 and 1

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "swiglu": Rules(refuse=("transformers.*",)),
    "decoder_block": Rules(allow=_PIECES, refuse=_READY_MADE),
    "decoder_logits": Rules(allow=_PIECES, refuse=_READY_MADE),
}

# The config handed to the student's function is read, not run; its one derived size, the
# head dim, is a property, which the student's code may read too.
given(DecoderConfig.head_dim.fget)

_TOL = dict(atol=1e-4, rtol=1e-4)  # float32 work against a float64 reference


# The pieces, in float64 -------------------------------------------------------------------------


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x²) + eps) · weight."""
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * weight


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": lambda t: t / (1 + (-t).exp()),
    "relu": lambda t: t.clamp_min(0),
    "gelu": lambda t: 0.5 * t * (1 + torch.erf(t / 2 ** 0.5)),
    "sigmoid": lambda t: 1 / (1 + (-t).exp()),
    "none": lambda t: t,
}


def _swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, *, act: str = "silu",
            on: str = "gate", up: bool = True) -> Tensor:
    """The reference (the defaults), in float64, and the mistakes: another activation
    ``act``, the activation ``on`` the up projection, the up projection left out (``up``)."""
    gate, lifted = x.double() @ w_gate.double().T, x.double() @ w_up.double().T  # (..., F)
    if on == "up":
        gate, lifted = lifted, gate
    hidden = _ACTIVATIONS[act](gate) * (lifted if up else 1.0)
    return (hidden @ w_down.double().T).to(x.dtype)  # (..., C)


def _angles(T: int, D: int, theta: float, *, freq: str = "2i/D") -> tuple[Tensor, Tensor]:
    """cos and sin ``(T, D/2)`` of positions 0 … T - 1, float64: pair i turns by
    θ^(-2i/D) per position (``freq="i/D"``: the mistake θ^(-i/D)). Positions counted from
    another start are no mistake: RoPE's scores depend on differences of positions only."""
    i = torch.arange(D // 2, dtype=torch.float64)
    inv_freq = theta ** (-(2 * i if freq == "2i/D" else i) / D)  # (D/2,)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos(), angles.sin()


def _turn(x: Tensor, cos: Tensor, sin: Tensor, pairing: str = "half") -> Tensor:
    """RoPE: split-half (channel i with i + D/2) or interleaved (2i with 2i + 1)."""
    if pairing == "half":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _attend(h: Tensor, w: dict[str, Tensor], cos: Tensor, sin: Tensor, H: int, H_kv: int, *,
            rope: str = "qk", mask: bool = True, scale: str = "sqrt", heads: str = "interleave",
            pairing: str = "half") -> Tensor:
    """Causal grouped-query self-attention of ``h`` ``(B, T, C)``, and its mistakes."""
    (B, T, C), D = h.shape, h.shape[-1] // H

    def split(name: str, n: int) -> Tensor:  # (B, n, T, D)
        return (h @ w["self_attn." + name + ".weight"].T).view(B, T, n, D).transpose(1, 2)

    q, k, v = split("q_proj", H), split("k_proj", H_kv), split("v_proj", H_kv)
    q = _turn(q, cos, sin, pairing) if rope != "none" else q
    k = _turn(k, cos, sin, pairing) if rope in ("qk", "qkv") else k
    v = _turn(v, cos, sin, pairing) if rope == "qkv" else v
    rep = H // H_kv  # interleave: query head h reads key/value head h // rep; tile: h % H_kv
    k, v = (t.repeat_interleave(rep, dim=1) if heads == "interleave" else t.repeat(1, rep, 1, 1)
            for t in (k, v))
    scores = q @ k.transpose(-2, -1) * (D ** -0.5 if scale == "sqrt" else 1.0 / D)
    if mask:  # (T, T), causal
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    weights = weights / weights.sum(-1, keepdim=True)  # (B, H, T, T)
    out = (weights @ v).transpose(1, 2).reshape(B, T, C)
    return out @ w["self_attn.o_proj.weight"].T  # (B, T, C)


def _block(x: Tensor, weights: dict[str, Tensor], cos: Tensor, sin: Tensor, H: int,
           H_kv: int, eps: float, *, norm: str = "pre", residual: str = "both",
           norms: str = "in_order", ffn: dict[str, Any] | None = None, **attention: Any
           ) -> Tensor:
    """One pre-norm decoder block in float64 (the defaults) and its mistakes: post-norm, a
    residual left out (``"attn"``, ``"ffn"``), the norm weights swapped, a wrong feed-forward
    network (``ffn``: :func:`_swiglu`'s keywords), :func:`_attend`'s mistakes."""
    w = {k: t.double() for k, t in weights.items()}
    x, cos, sin = x.double(), cos.double(), sin.double()
    n1, n2 = (w["input_layernorm.weight"], w["post_attention_layernorm.weight"])[
        :: -1 if norms == "swapped" else 1]

    def attend(h: Tensor) -> Tensor:
        return _attend(h, w, cos, sin, H, H_kv, **attention)

    def feed_forward(h: Tensor) -> Tensor:
        return _swiglu(h, w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"],
                       w["mlp.down_proj.weight"], **(ffn or {}))

    if norm == "post":  # the 2017 order: the sum, then the norm
        h = _rms(x + attend(x), n1, eps)
        return _rms(h + feed_forward(h), n2, eps)
    h = (0 if residual == "attn" else x) + attend(_rms(x, n1, eps))
    return (0 if residual == "ffn" else h) + feed_forward(_rms(h, n2, eps))


def _logits(tokens: Tensor, weights: dict[str, Tensor], config: DecoderConfig, *,
            theta: float | None = None, freq: str = "2i/D", final_norm: bool = True,
            final_eps: float | None = None, eps: float | None = None,
            head: str = "lm_head", same_layer: bool = False, probs: bool = False,
            **block: Any) -> Tensor:
    """The whole model's logits ``(B, T, V)`` in float64 (the defaults), and its mistakes:
    another RoPE base ``theta`` or frequency formula ``freq``, the final norm left out or
    with another ``final_eps``, another ``eps`` everywhere, the embedding as the output layer
    (``head="embed"``), the first block's weights in every layer, probabilities instead of
    logits; ``block``: :func:`_block`'s mistakes."""
    c = config
    eps = c.norm_eps if eps is None else eps
    x = weights["embed_tokens.weight"].double()[tokens]  # (B, T, C)
    cos, sin = _angles(tokens.shape[1], c.d_model // c.n_heads,
                       c.rope_theta if theta is None else theta, freq=freq)
    for i in range(c.n_layers):
        prefix = "layers.0." if same_layer else "layers." + str(i) + "."
        layer = {k[len(prefix):]: t for k, t in weights.items() if k.startswith(prefix)}
        x = _block(x, layer, cos, sin, c.n_heads, c.n_kv_heads, eps, **block)
    if final_norm:
        x = _rms(x, weights["norm.weight"].double(), eps if final_eps is None else final_eps)
    out = x @ weights[("lm_head" if head == "lm_head" else "embed_tokens") + ".weight"].double().T
    return out.softmax(-1) if probs else out  # (B, T, V)


# Random weights, under the library's names ------------------------------------------------------


def _matrix(rows: int, cols: int, g: torch.Generator, gain: float = 1.0) -> Tensor:
    return gain * cols ** -0.5 * torch.randn(rows, cols, generator=g)


def _norm_weight(C: int, g: torch.Generator) -> Tensor:
    """Around 1, never all ones: a norm forgotten or misplaced cannot hide."""
    return 1.0 + 0.3 * torch.randn(C, generator=g)


def _block_weights(config: DecoderConfig, g: torch.Generator) -> dict[str, Tensor]:
    """Random float32 weights of one block, under the keys of
    ``Decoder(config).layers[i].state_dict()``, in its order."""
    C, F = config.d_model, config.d_ff
    Q, KV = config.n_heads * (C // config.n_heads), config.n_kv_heads * (C // config.n_heads)
    return {"input_layernorm.weight": _norm_weight(C, g),
            "self_attn.q_proj.weight": _matrix(Q, C, g, 1.5),
            "self_attn.k_proj.weight": _matrix(KV, C, g, 1.5),
            "self_attn.v_proj.weight": _matrix(KV, C, g),
            "self_attn.o_proj.weight": _matrix(C, Q, g),
            "post_attention_layernorm.weight": _norm_weight(C, g),
            "mlp.gate_proj.weight": _matrix(F, C, g, 1.5), "mlp.up_proj.weight": _matrix(F, C, g),
            "mlp.down_proj.weight": _matrix(C, F, g)}


def _model_weights(config: DecoderConfig, g: torch.Generator, embed_std: float = 1.0
                   ) -> dict[str, Tensor]:
    """Random float32 weights of a whole model, under the keys of
    ``Decoder(config).state_dict()``, in its order; with ``config.tie_embeddings``
    ``lm_head.weight`` is the same tensor as ``embed_tokens.weight``, as there."""
    V, C = config.vocab_size, config.d_model
    weights = {"embed_tokens.weight": embed_std * torch.randn(V, C, generator=g)}
    for i in range(config.n_layers):
        weights.update({"layers." + str(i) + "." + k: t
                        for k, t in _block_weights(config, g).items()})
    weights["norm.weight"] = _norm_weight(C, g)
    weights["lm_head.weight"] = (weights["embed_tokens.weight"] if config.tie_embeddings
                                 else _matrix(V, C, g))
    return weights


def _unchanged(weights: dict[str, Tensor], kept: dict[str, Tensor]) -> None:
    if weights.keys() != kept.keys() or any(not torch.equal(weights[k], kept[k]) for k in kept):
        raise _Failure(say("changed the weights dict or a tensor in it"),
                       say("read the weights, never write into them: the caller still needs them"))


# SwiGLU -----------------------------------------------------------------------------------------

_SWIGLU_MISTAKES = [
    (dict(on="up"),
     say("SiLU went on the up projection: it belongs on the gate, SiLU(x w_gateᵀ) ⊙ (x w_upᵀ); the "
         "two matrices are not interchangeable")),
    (dict(act="relu"),
     say("this is ReLU: SwiGLU's activation is SiLU, t · sigmoid(t) (torch.nn.functional.silu), "
         "smooth and negative for negative t")),
    (dict(act="gelu"), say("this is GELU (GeGLU): SwiGLU's activation is SiLU, t · sigmoid(t)")),
    (dict(act="sigmoid"),
     say("this is a sigmoid gate (the original GLU): SwiGLU's gate is SiLU, t · sigmoid(t), not "
         "sigmoid(t)")),
    (dict(act="none"), say("no activation: the gate goes through SiLU before the product")),
    (dict(up=False),
     say("the up projection is missing: multiply SiLU(x w_gateᵀ) entry by entry with x w_upᵀ "
         "before w_down")),
]


def check_swiglu(swiglu: Callable[..., Tensor]) -> CheckResult:
    """Check ``swiglu(x, w_gate, w_up, w_down) -> out``: the SwiGLU feed-forward network
    ``(SiLU(x w_gateᵀ) ⊙ x w_upᵀ) w_downᵀ`` of ``x`` ``(..., C)``, with ``w_gate`` and
    ``w_up`` ``(F, C)`` and ``w_down`` ``(C, F)`` in ``nn.Linear``'s (out, in) layout and no
    biases; ``out`` is ``(..., C)``, float32 like the inputs.

    Args:
        swiglu: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["x", "w_gate", "w_up", "w_down"]

    def case(shape: tuple[int, ...], F: int) -> Callable[[], None]:
        def run() -> None:
            C = shape[-1]
            args = [torch.randn(*shape, generator=g), _matrix(F, C, g, 1.5), _matrix(F, C, g),
                    _matrix(C, F, g)]  # x, w_gate, w_up, w_down
            got = _call(swiglu, args, names)
            want = _swiglu(*args)
            wrong = [(_swiglu(*args, **kw), hint) for kw, hint in _SWIGLU_MISTAKES]
            _compare(got, want, say("the output"), letters=say("(..., C)"), mistakes=wrong,
                     shape_hints={(*shape[:-1], F): say(
                         "the hidden layer has F entries; w_down (C, F) takes it back to C: "
                         "multiply by w_downᵀ")},
                     **_TOL)
        return run

    return _run("swiglu", swiglu, [
        (say("x (2, 5, 16), hidden width F = 43 (odd)"), case((2, 5, 16), 43)),
        (say("x (7, 24), two axes, F = 64"), case((7, 24), 64)),
        (say("x (2, 3, 4, 8), four axes, F = 21"), case((2, 3, 4, 8), 21)),
    ], rules=RULES["swiglu"])


# The decoder block ------------------------------------------------------------------------------


def _block_mistakes(config: DecoderConfig, T: int) -> list[tuple[dict[str, Any], str]]:
    """The usual mistakes of a block, with their hints (those that cannot differ from the
    reference on this case are left out)."""
    H, H_kv, D, eps = config.n_heads, config.n_kv_heads, config.head_dim, config.norm_eps
    table: list[tuple[bool, dict[str, Any], str]] = [
        (True, dict(norm="post"),
         say("this is post-norm, the 2017 order: normalise the input of each sublayer and add its "
             "output to the stream, h = x + Attn(RMSNorm₁(x)), out = h + SwiGLU(RMSNorm₂(h))")),
        (True, dict(residual="attn"),
         say("the attention's residual is missing: h = x + Attn(RMSNorm₁(x)), the input added "
             "back")),
        (True, dict(residual="ffn"),
         say("the feed-forward residual is missing: out = h + SwiGLU(RMSNorm₂(h))")),
        (True, dict(norms="swapped"),
         say("the two norms are swapped: input_layernorm.weight goes before the attention, "
             "post_attention_layernorm.weight before the feed-forward network")),
        (True, dict(ffn=dict(on="up")),
         say("the feed-forward network put SiLU on the up projection: fix `swiglu` first "
             "(check_swiglu)")),
        (True, dict(ffn=dict(act="relu")),
         say("the feed-forward network used ReLU, not SiLU: fix `swiglu` first (check_swiglu)")),
        (True, dict(scale="d"),
         say("the scores were divided by D = {D}, not √D: `attention` already divides by √D, so do "
             "not scale q or k yourself as well", D=D)),
        (True, dict(pairing="interleaved"),
         say("that is the interleaved RoPE pairing (2i with 2i + 1): this model pairs channel i "
             "with i + D/2, as `rope_half` does")),
        (eps != 1e-6, dict(eps=1e-6),
         say("the norms ignored config.norm_eps ({eps:g}) and used 1e-6: pass it to rms_norm",
             eps=eps)),
        (T > 1, dict(rope="qkv"),
         say("the values were turned by RoPE too: it turns the queries and the keys only, whose "
             "dot product then depends on the distance")),
        (T > 1, dict(rope="q"),
         say("the keys were not turned: RoPE turns both the queries and the keys, by the angles of "
             "their own positions")),
        (T > 1, dict(rope="none"),
         say("no RoPE: turn the queries and the keys with rope_half(…, cos, sin) after splitting "
             "the heads")),
        (T > 1, dict(mask=False),
         say("no causal mask: position i may attend to positions 0 … i only; pass a (T, T) "
             "lower-triangular boolean mask (True = may attend) to `attention`")),
        (1 < H_kv < H, dict(heads="tile"),
         say("the key/value heads were repeated in the wrong order: query head h reads key/value "
             "head h // (H / H_kv), so repeat each in place (repeat_interleave: kv0, kv0, kv1, "
             "kv1), not the whole set (repeat: kv0, kv1, kv0, kv1)")),
    ]
    return [(kw, hint) for differs, kw, hint in table if differs]


def _config(**sizes: Any) -> DecoderConfig:
    return DecoderConfig(**{"vocab_size": 32, "n_layers": 1, "max_seq_len": 16, **sizes})


def check_decoder_block(decoder_block: Callable[..., Tensor]) -> CheckResult:
    """Check ``decoder_block(x, weights, cos, sin, config) -> out``: one pre-norm decoder
    block, ``h = x + Attn(RMSNorm₁(x))``, ``out = h + SwiGLU(RMSNorm₂(h))``, with causal
    grouped-query self-attention (query head h reads key/value head h // (H / H_kv)) whose
    queries and keys RoPE turns (split-half pairing), on ``x`` ``(B, T, C)``. ``weights``
    holds one block's tensors under the keys of ``Decoder(config).layers[i].state_dict()``,
    ``cos`` and ``sin`` are the ``(T, D/2)`` tables of positions 0 … T - 1, and ``config``
    a :class:`~transformer_lib.decoder.DecoderConfig` (``n_heads``, ``n_kv_heads``,
    ``norm_eps``). ``out`` is ``(B, T, C)``.

    Args:
        decoder_block: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["x", "weights", "cos", "sin", "config"]

    def case(B: int, T: int, config: DecoderConfig, scale: float = 1.0, theta: float = 1e4
             ) -> Callable[[], None]:
        def run() -> None:
            x = scale * torch.randn(B, T, config.d_model, generator=g)
            weights = _block_weights(config, g)
            kept = {k: t.clone() for k, t in weights.items()}
            cos, sin = (t.float() for t in _angles(T, config.head_dim, theta))
            H, H_kv, eps = config.n_heads, config.n_kv_heads, config.norm_eps
            got = _call(decoder_block, [x, weights, cos, sin, config], names)
            _unchanged(weights, kept)
            want = _block(x, weights, cos, sin, H, H_kv, eps).float()
            wrong = [(_block(x, weights, cos, sin, H, H_kv, **{"eps": eps, **kw}), hint)
                     for kw, hint in _block_mistakes(config, T)]
            _compare(got, want, say("the output"), letters=say("(B, T, C)"),
                     axes=("batch", "position", "channel"), mistakes=wrong, **_TOL)
        return run

    return _run("decoder_block", decoder_block, [
        (say("MHA: 2 heads of 8 channels, B = 2, T = 5"), case(
            2, 5, _config(d_model=16, n_heads=2, n_kv_heads=2, d_ff=40))),
        (say("GQA: 4 query heads share 2 KV heads, d_ff = 45 (odd), norm_eps = 0.01 on a small x"),
         case(2, 7, _config(d_model=32, n_heads=4, n_kv_heads=2, d_ff=45, norm_eps=1e-2),
              scale=0.05, theta=500.0)),
        (say("MQA: 4 query heads share 1 KV head, B = 1, T = 6, norm_eps = 1e-5"), case(
            1, 6, _config(d_model=24, n_heads=4, n_kv_heads=1, d_ff=37, norm_eps=1e-5))),
        (say("one position (T = 1), GQA, B = 3"), case(
            3, 1, _config(d_model=16, n_heads=4, n_kv_heads=2, d_ff=24))),
    ], rules=RULES["decoder_block"])


# The whole decoder ------------------------------------------------------------------------------


def _logits_mistakes(config: DecoderConfig, T: int) -> list[tuple[dict[str, Any], str]]:
    """The usual mistakes of the whole model, with their hints."""
    c, eps = config, config.norm_eps
    table: list[tuple[bool, dict[str, Any], str]] = [
        (True, dict(final_norm=False),
         say("the final norm is missing: after the last block comes RMSNorm with norm.weight, then "
             "lm_head")),
        (True, dict(probs=True),
         say("these are probabilities: return the logits, the output of lm_head, without a "
             "softmax")),
        (c.n_layers > 1, dict(same_layer=True),
         say("every layer ran with the weights of layer 0: block i reads the keys "
             "'layers.{{i}}.…'")),
        (not c.tie_embeddings, dict(head="embed"),
         say("the output layer is lm_head.weight: with tie_embeddings False it is a matrix of its "
             "own, not embed_tokens.weight")),
        (eps != 1e-6, dict(final_eps=1e-6),
         say("the final norm ignored config.norm_eps ({eps:g}) and used 1e-6", eps=eps)),
        (eps != 1e-6, dict(eps=1e-6),
         say("the norms ignored config.norm_eps ({eps:g}) and used 1e-6: pass it to every rms_norm",
             eps=eps)),
        (eps != 1e-6, dict(eps=1e-6, final_eps=eps),
         say("the blocks ignored config.norm_eps ({eps:g}) and used 1e-6: run check_decoder_block "
             "first", eps=eps)),
        (T > 1 and c.rope_theta != 10000.0, dict(theta=10000.0),
         say("the RoPE tables used the base 10000: this model's is config.rope_theta = "
             "{rope_theta:g}", rope_theta=c.rope_theta)),
        (T > 1, dict(freq="i/D"),
         say("pair i of the RoPE tables turns by θ^(−2i/D) per position, i = 0 … D/2 − 1, with D "
             "the head size")),
        (T > 1, dict(pairing="interleaved"),
         say("that is the interleaved RoPE pairing: this model pairs channel i with i + D/2")),
        (T > 1, dict(mask=False),
         say("no causal mask in the blocks: run check_decoder_block first")),
    ]
    return [(kw, hint) for differs, kw, hint in table if differs]


def check_decoder_logits(decoder_logits: Callable[..., Tensor]) -> CheckResult:
    """Check ``decoder_logits(tokens, weights, config) -> logits``: the logits ``(B, T, V)``
    of a decoder-only model on the token ids ``tokens`` ``(B, T)``: the embedding, the RoPE
    tables of positions 0 … T - 1 from ``config.rope_theta`` and the head size (split-half
    pairing), ``config.n_layers`` decoder blocks, the final RMSNorm and ``lm_head``.
    ``weights`` holds the model's tensors under the keys of ``Decoder(config).state_dict()``
    (with ``config.tie_embeddings``, ``lm_head.weight`` is the embedding's tensor).

    Args:
        decoder_logits: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["tokens", "weights", "config"]

    def case(B: int, T: int, config: DecoderConfig, embed_std: float = 1.0
             ) -> Callable[[], None]:
        def run() -> None:
            tokens = torch.randint(0, config.vocab_size, (B, T), generator=g)
            weights = _model_weights(config, g, embed_std)
            kept = {k: t.clone() for k, t in weights.items()}
            got = _call(decoder_logits, [tokens, weights, config], names)
            _unchanged(weights, kept)
            want = _logits(tokens, weights, config).float()
            wrong = [(_logits(tokens, weights, config, **kw), hint)
                     for kw, hint in _logits_mistakes(config, T)]
            _compare(got, want, say("the logits"), letters=say("(B, T, V)"),
                     axes=("batch", "position", say("token id")), mistakes=wrong, **_TOL)
        return run

    return _run("decoder_logits", decoder_logits, [
        (say("2 layers, GQA (4 query heads, 2 KV heads), rope_theta = 500, norm_eps = 0.01, "
             "small embeddings, B = 2, T = 9"), case(2, 9, _config(
             vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=45,
             rope_theta=500.0, norm_eps=1e-2), embed_std=0.05)),
        (say("tied embeddings, 1 layer, MHA, B = 1, T = 6"), case(1, 6, _config(
            vocab_size=24, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=40,
            tie_embeddings=True))),
        (say("one token (T = 1), MQA, 2 layers, B = 3"), case(3, 1, _config(
            vocab_size=20, d_model=16, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=24,
            rope_theta=500.0))),
        (say("tied embeddings, 2 layers, GQA, rope_theta = 500, norm_eps = 1e-5, T = 14"), case(
            2, 14, _config(vocab_size=30, d_model=24, n_layers=2, n_heads=6, n_kv_heads=2,
                           d_ff=33, rope_theta=500.0, norm_eps=1e-5, tie_embeddings=True))),
    ], rules=RULES["decoder_logits"])
