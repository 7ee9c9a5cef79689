"""Checkers for the exercises of chapter 6, the modern decoder
(``chapters/06_modern_decoder.ipynb``): counting a decoder's parameters from its config,
turning a grouped-query checkpoint into a multi-head one, and attention with QK-norm."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
from torch import Tensor

from transformer_lib.attention import MultiHeadAttention, causal_mask, repeat_kv
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.norms import RMSNorm
from transformer_lib.positional import apply_rope, rope_cos_sin

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "decoder_param_count": Rules(),
    "gqa_to_mha": Rules(),
    "qk_norm_attention": Rules(allow=(
        "causal_mask", "repeat_kv", "scaled_dot_product_attention", "RMSNorm", "apply_rope"),
        refuse=("torch.nn.functional.rms_norm",)),
}


@torch.no_grad()
def _random_weights(module: torch.nn.Module, g: torch.Generator, std: float = 0.1):
    """Random values for every weight, from ``g``; norm weights around 1, never all ones."""
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        p.copy_(1.0 + 0.3 * noise if "norm" in name else std * noise)
    return module


def _build(module_type: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``module_type()`` without a trace in the global random state."""
    with torch.random.fork_rng(devices=[]):
        return module_type()


# Counting a decoder's parameters --------------------------------------------------------------

_COUNT_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                 "tie_embeddings")
#: Llama 2 7B's published shape, whose parameter count the counting exercise must reproduce.
LLAMA2_7B = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                 d_ff=11008, tie_embeddings=False)


def _param_count(vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 d_ff: int, tie_embeddings: bool, *, kv_heads: int | None = None,
                 ffn_matrices: int = 3, norms_per_block: int = 2, final_norm: int = 1,
                 output_layers: int | None = None, biases: bool = False) -> int:
    """The parameters of a Decoder of these sizes; the keyword arguments build the usual
    wrong counts (``kv_heads``: the heads k_proj and v_proj are counted with, and so on)."""
    D = d_model // n_heads
    kv = (n_kv_heads if kv_heads is None else kv_heads) * D
    attention = 2 * d_model * d_model + 2 * d_model * kv
    if biases:
        attention += 2 * d_model + 2 * kv
    ffn = ffn_matrices * d_model * d_ff
    if biases:  # one bias vector per linear layer
        ffn += (ffn_matrices - 1) * d_ff + d_model
    block = attention + ffn + norms_per_block * d_model
    outputs = (0 if tie_embeddings else 1) if output_layers is None else output_layers
    return vocab_size * d_model * (1 + outputs) + n_layers * block + final_norm * d_model


def _count_hints(sizes: dict[str, Any]) -> list[tuple[int, str]]:
    """(wrong count, hint) pairs for the usual mistakes; the first match wins."""
    tie = sizes["tie_embeddings"]
    wrong = [
        (_param_count(**sizes, kv_heads=sizes["n_heads"]),
         say("k_proj and v_proj make n_kv_heads · D outputs, not n_heads · D: with grouped-query "
             "attention they are smaller than q_proj")),
        (_param_count(**sizes, ffn_matrices=2),
         say("SwiGLU has three matrices, gate_proj, up_proj and down_proj, not two")),
        (_param_count(**sizes, norms_per_block=0, final_norm=0),
         say("every block has two RMSNorm weight vectors of d_model numbers, and there is a final "
             "RMSNorm after the last block")),
        (_param_count(**sizes, final_norm=0),
         say("the model has one more RMSNorm after the last block (model.norm)")),
        (_param_count(**sizes, norms_per_block=1),
         say("each block has two RMSNorms: one before the attention, one before the SwiGLU")),
        (_param_count(**sizes, biases=True),
         say("the modern decoder has no biases: every nn.Linear is built with bias=False")),
    ]
    if tie:
        wrong.append((_param_count(**sizes, output_layers=1),
                      say("with tie_embeddings the output layer *is* the embedding matrix: count "
                          "it once")))
    else:
        wrong.append((_param_count(**sizes, output_layers=0),
                      say("without tie_embeddings the output layer lm_head is a second "
                          "vocab_size × d_model matrix")))
    return wrong


def check_decoder_param_count(decoder_param_count: Callable[..., int]) -> CheckResult:
    """Check ``decoder_param_count(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
    tie_embeddings)``: the number of parameters of a :class:`~transformer_lib.decoder.Decoder`
    with those sizes, against the model itself (and, for Llama 2 7B, against the count of its
    parts).

    Args:
        decoder_param_count: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(sizes: dict[str, Any], build: bool) -> Callable[[], None]:
        def run() -> None:
            got = _call(decoder_param_count, [sizes[f] for f in _COUNT_FIELDS],
                        list(_COUNT_FIELDS))
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
                raise _Failure(say("expected a whole number of parameters, got {got}",
                                   got=_describe(got)))
            if build:
                model = _build(lambda: Decoder(DecoderConfig(**sizes, max_seq_len=16)))
                want = sum(p.numel() for p in model.parameters())
            else:
                want = _param_count(**sizes)
            if int(got) == want:
                return
            hint = next((h for wrong, h in _count_hints(sizes) if wrong == int(got)
                         and wrong != want), None)
            raise _Failure(say("expected {want:,} parameters, got {got:,}", want=want,
                               got=int(got)), hint)
        return run

    return _run("decoder_param_count", decoder_param_count, [
        (say("V 64, C 64, 2 layers, 4 heads, 2 KV heads, d_ff 172, tied"),
         case(dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172,
                   tie_embeddings=True), True)),
        (say("V 50, C 48, 3 layers, 6 heads, 1 KV head (MQA), d_ff 128, untied"),
         case(dict(vocab_size=50, d_model=48, n_layers=3, n_heads=6, n_kv_heads=1, d_ff=128,
                   tie_embeddings=False), True)),
        (say("V 30, C 32, 1 layer, 4 heads, 4 KV heads (MHA), d_ff 40, untied"),
         case(dict(vocab_size=30, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=40,
                   tie_embeddings=False), True)),
        (say("Llama 2 7B: V 32,000, C 4096, 32 layers, 32 heads, d_ff 11,008, untied"),
         case(LLAMA2_7B, False)),
    ], rules=RULES["decoder_param_count"])


# From a grouped-query checkpoint to a multi-head one --------------------------------------------


def _gqa_to_mha(state: dict[str, Tensor], n_heads: int, n_kv_heads: int,
                how: str = "interleave") -> dict[str, Tensor]:
    """The reference (``how="interleave"``) and the usual wrong conversions: ``"tile"``
    (kv0, kv1, kv0, kv1), ``"rows"`` (each row repeated on its own)."""
    n_rep = n_heads // n_kv_heads
    out = {}
    for name, t in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            rows, C = t.shape
            heads = t.reshape(n_kv_heads, rows // n_kv_heads, C)  # (H_kv, D, C)
            if how == "interleave":
                t = heads.repeat_interleave(n_rep, dim=0).reshape(-1, C)
            elif how == "tile":
                t = heads.repeat(n_rep, 1, 1).reshape(-1, C)
            else:
                t = t.repeat_interleave(n_rep, dim=0)
        out[name] = t.clone()
    return out


def check_gqa_to_mha(gqa_to_mha: Callable[[dict, int, int], dict]) -> CheckResult:
    """Check ``gqa_to_mha(state_dict, n_heads, n_kv_heads)``: from the state dict of a
    :class:`~transformer_lib.decoder.Decoder` with grouped-query attention, a new state dict that a
    Decoder with the same config but ``n_kv_heads = n_heads`` loads strictly and that gives the
    same logits; the input dict and its tensors are left unchanged.

    Args:
        gqa_to_mha: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(n_heads: int, n_kv_heads: int, n_layers: int, tie: bool) -> Callable[[], None]:
        config = DecoderConfig(vocab_size=40, d_model=8 * n_heads, n_layers=n_layers,
                               n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=24,
                               max_seq_len=16, tie_embeddings=tie)
        mha_config = dataclasses.replace(config, n_kv_heads=n_heads)
        gqa = _random_weights(_build(lambda: Decoder(config)), g).eval()
        tokens = torch.randint(0, 40, (2, 12), generator=g)  # (B, T)

        def logits_of(state: dict[str, Tensor]) -> Tensor:
            mha = _build(lambda: Decoder(mha_config)).eval()
            mha.load_state_dict(state)
            with torch.no_grad():
                return mha(tokens)  # (B, T, V)

        def run() -> None:
            original = {k: v.detach().clone() for k, v in gqa.state_dict().items()}
            given = {k: v.clone() for k, v in original.items()}
            got = _call(gqa_to_mha, [given, n_heads, n_kv_heads],
                        ["state_dict", "n_heads", "n_kv_heads"])
            changed = [k for k in original if k not in given
                       or not torch.equal(given[k], original[k])]
            if changed:
                raise _Failure(say("changed its input: {key}", key=changed[0]),
                               say("build a new dict with new tensors; the caller still needs "
                                   "the GQA state dict"))
            if not isinstance(got, dict):
                raise _Failure(say("returned {got}: return a dict of tensors", got=_describe(got)))
            missing = sorted(set(original) - set(got))
            if missing:
                raise _Failure(say("the result lacks {key}", key=missing[0]),
                               say("return every tensor of the state dict, converted or not"))
            layer = "layers.0.self_attn."
            for role in ("k_proj", "v_proj"):
                shape = tuple(got[layer + role + ".weight"].shape)
                want = (config.d_model, config.d_model)
                if shape != want and n_heads != n_kv_heads:
                    hint = (say("convert the values too: v_proj feeds the same repeated heads as "
                                "k_proj") if role == "v_proj" and shape[0] < want[0] else
                            say("convert the keys too: k_proj is repeated like v_proj")
                            if role == "k_proj" and shape[0] < want[0] else
                            say("each of the H_kv heads must appear n_heads / n_kv_heads times"))
                    raise _Failure(say("{role}.weight has shape {shape}, an MHA decoder needs "
                                       "(H·D, C) = {want}", role=role, shape=shape, want=want),
                                   hint)
            try:
                got_logits = logits_of(got)
            except Exception as exc:  # noqa: BLE001 - a state dict that does not load
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise _Failure(say("the MHA decoder could not load the result "
                                   "({error}: {message})", error=type(exc).__name__,
                                   message=first[:160])) from None
            want_logits = logits_of(_gqa_to_mha(original, n_heads, n_kv_heads))
            mistakes = []
            if n_heads // n_kv_heads > 1 and n_kv_heads > 1:
                mistakes.append((logits_of(_gqa_to_mha(original, n_heads, n_kv_heads,
                                                       "tile")),
                                 say("the heads are tiled (kv0, kv1, kv0, kv1): repeat_kv gives "
                                     "query heads 0 … n_rep − 1 to key/value head 0, so each head "
                                     "must be repeated in place (kv0, kv0, kv1, kv1)")))
            if n_heads // n_kv_heads > 1:
                mistakes.append((logits_of(_gqa_to_mha(original, n_heads, n_kv_heads,
                                                       "rows")),
                                 say("single rows were repeated: a head is a block of D "
                                     "consecutive rows, and the whole block must be repeated")))
            _compare(got_logits, want_logits, say("the logits of the converted model"),
                     letters=say("(B, T, V)"), axes=("batch", "position", "token"),
                     mistakes=mistakes)
        return run

    return _run("gqa_to_mha", gqa_to_mha, [
        (say("4 query heads, 2 KV heads, 2 layers, tied embeddings"), case(4, 2, 2, True)),
        (say("6 query heads, 2 KV heads (groups of 3), 1 layer"), case(6, 2, 1, False)),
        (say("4 query heads, 1 KV head (MQA), 2 layers"), case(4, 1, 2, False)),
        (say("3 query heads, 3 KV heads (already MHA), 1 layer"), case(3, 3, 1, True)),
    ], rules=RULES["gqa_to_mha"])


# Attention with QK-norm ----------------------------------------------------------------------

# Words of PyTorch's error when two shapes do not broadcast (not a message of ours).
_SIZE_MISMATCH = " ".join(("must", "match", "the", "size", "of", "tensor"))


def _normaliser(norm: RMSNorm, D: int, stats: str) -> Callable[[Tensor], Tensor]:
    """``norm`` applied to ``(B, h, T, D)`` heads: its weight has D entries (one vector for
    every head, Qwen3) or h·D (one per channel of the projection, OLMo 2); the mean square is
    taken over each head's D channels (``stats="head"``) or over all h·D channels of a
    position (``"whole"``)."""
    weight = norm.weight if norm.weight.numel() == D else norm.weight.view(-1, 1, D)  # (h, 1, D)

    def apply(t: Tensor) -> Tensor:  # (B, h, T, D)
        dims = -1 if stats == "head" else (1, 3)
        mean_square = t.float().pow(2).mean(dim=dims, keepdim=True)  # (B, h or 1, T, 1)
        return (t.float() * torch.rsqrt(mean_square + norm.eps)).to(t.dtype) * weight

    return apply


def _qk_norm_attention(x: Tensor, attn: MultiHeadAttention, q_norm: RMSNorm, k_norm: RMSNorm,
                       cos: Tensor, sin: Tensor, *, order: str = "norm-rope",
                       norm_k: bool = True, norm_v: bool = False, masked: bool = True,
                       pairing: str = "half", stats: str | None = None) -> Tensor:
    """The reference (defaults) and the usual mistakes, selected by the keyword arguments.
    Norms of D weights normalise each head (Qwen3, Gemma 3); norms of H·D and H_kv·D weights
    the whole projection of a position (OLMo 2); ``stats`` forces one statistic."""
    B, T, C = x.shape
    H, H_kv = attn.n_heads, attn.n_kv_heads
    D = C // H
    stats = stats or ("head" if q_norm.weight.numel() == D else "whole")
    q = attn.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    q_n, k_norm_fn = _normaliser(q_norm, D, stats), _normaliser(k_norm, D, stats)
    k_n = k_norm_fn if norm_k else (lambda t: t)
    if order == "norm-rope":
        q = apply_rope(q_n(q), cos, sin, pairing)
        k = apply_rope(k_n(k), cos, sin, pairing)
    else:
        q = q_n(apply_rope(q, cos, sin, pairing))
        k = k_n(apply_rope(k, cos, sin, pairing))
    if norm_v:
        v = k_norm_fn(v)
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    if masked:
        scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


def check_qk_norm_attention(qk_norm_attention: Callable[..., Tensor]) -> CheckResult:
    """Check ``qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)``: causal grouped-query
    self-attention of ``x`` ``(B, T, C)`` through ``attn`` (a bias-free
    :class:`~transformer_lib.attention.MultiHeadAttention`), queries and keys RMS-normalised by
    ``q_norm`` and ``k_norm`` after the projections and before split-half RoPE: over each head's D
    channels when the norms have D weights (Qwen3, Gemma 3), over the whole projection of a
    position when they have H·D and H_kv·D (OLMo 2); returns ``(B, T, C)``.

    Args:
        qk_norm_attention: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(B: int, T: int, C: int, H: int, H_kv: int, whole: bool) -> Callable[[], None]:
        D = C // H
        attn = _random_weights(_build(lambda: MultiHeadAttention(C, H, H_kv, bias=False)),
                               g, std=0.3)
        q_norm = _build(lambda: RMSNorm(H * D if whole else D))
        k_norm = _build(lambda: RMSNorm(H_kv * D if whole else D))
        for norm in (q_norm, k_norm):  # random around 1, never all ones
            with torch.no_grad():
                norm.weight.copy_(1.0 + 0.5 * torch.randn(norm.weight.shape, generator=g))
        x = torch.randn(B, T, C, generator=g)  # (B, T, C)
        cos, sin = rope_cos_sin(T, D, offset=3)  # (T, D/2): positions 3 … T + 2
        if whole:
            statistic = say("q_norm has H·D weights, so this case follows OLMo 2: the mean square "
                            "is taken over the whole projection of a position (all heads "
                            "together, before splitting it into heads), not over each head")
        else:
            statistic = say("this case follows Qwen3 (q_norm has D weights): per head, the mean "
                            "square over each head's D channels (RMSNorm(D) on the (B, H, T, D) "
                            "tensor), not over all C channels of a position")

        def run() -> None:
            with torch.no_grad():
                try:
                    got = _call(qk_norm_attention, [x, attn, q_norm, k_norm, cos, sin],
                                ["x", "attn", "q_norm", "k_norm", "cos", "sin"])
                except _Failure as exc:  # RMSNorm(H·D) on (B, H, T, D): a per-head answer
                    if whole and _SIZE_MISMATCH in exc.message:
                        raise _Failure(exc.message, statistic) from None
                    raise
                args = (x, attn, q_norm, k_norm, cos, sin)
                want = _qk_norm_attention(*args)
                mistakes = [
                    (_qk_norm_attention(*args, order="rope-norm"),
                     say("the norm comes before RoPE: normalise the projected queries and keys, "
                         "then rotate them (with these non-uniform norm weights the two orders "
                         "differ)")),
                    (_qk_norm_attention(*args, norm_k=False),
                     say("normalise the keys too, with k_norm: QK-norm bounds the scores only "
                         "when both sides are normalised")),
                    (_qk_norm_attention(*args, norm_v=True),
                     say("only queries and keys are normalised; the values stay as v_proj makes "
                         "them")),
                    (_qk_norm_attention(*args, masked=False),
                     say("the attention is causal: mask the scores of later positions with -inf "
                         "before the softmax")),
                    (_qk_norm_attention(*args, stats="head" if whole else "whole"), statistic),
                    (_qk_norm_attention(*args, pairing="interleaved"),
                     say("use the split-half pairing (channel i with i + D/2), as apply_rope does "
                         "by default")),
                ]
            _compare(got, want, say("the output"), letters=say("(B, T, C)"),
                     axes=("batch", "position", "channel"), mistakes=mistakes,
                     shape_hints={(B, H, T, D): say("merge the heads back and apply o_proj: "
                                                    "transpose(1, 2).reshape(B, T, C)")})
        return run

    return _run("qk_norm_attention", qk_norm_attention, [
        (say("per head (Qwen3): B 2, T 6, C 32, 4 heads, 2 KV heads"), case(2, 6, 32, 4, 2, False)),
        (say("per head (Qwen3): B 1, T 9, C 24, 3 heads, 1 KV head"), case(1, 9, 24, 3, 1, False)),
        (say("whole projection (OLMo 2): B 2, T 5, C 32, 4 heads, 2 KV heads"),
         case(2, 5, 32, 4, 2, True)),
        (say("whole projection (OLMo 2): B 1, T 7, C 24, 3 heads, 3 KV heads"),
         case(1, 7, 24, 3, 3, True)),
    ], rules=RULES["qk_norm_attention"])
