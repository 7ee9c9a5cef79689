"""Checkers for the exercises of chapter 4, normalisation and training stability
(``chapters/04_normalisation.ipynb``): a Noam multiplier that makes ``LambdaLR`` give the
paper's rate whatever the optimizer's base rate, RMSNorm that survives fp16 and bf16 inputs,
and a pre-norm decoder layer with its bugs fixed."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import causal_mask
from transformer_lib.checks._harness import (
    CheckResult,
    _as_number,
    _call,
    _compare,
    _compare_number,
    _describe,
    _expect_value_error,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.encoder_decoder import DecoderLayer

# A Noam multiplier for a given base rate -----------------------------------------------------


def _noam(d_model: int, warmup: int, step: int) -> float:
    """The paper's rate at ``step`` (step 0, where LambdaLR starts, counts as step 1)."""
    t = max(step, 1)
    return d_model ** -0.5 * min(t ** -0.5, t * warmup ** -1.5)


def _rate_mistakes(d_model: int, warmup: int, base_lr: float, step: int
                   ) -> list[tuple[float, str]]:
    """Rates (base_lr × factor) that the usual mistakes give at ``step``, with their hints."""
    t = max(step, 1)
    right = _noam(d_model, warmup, step)
    return [
        (base_lr * right,
         "LambdaLR multiplies the optimizer's lr by your factor, so the factor must be the "
         "paper's rate divided by base_lr"),
        (base_lr * base_lr * right,
         "the factor was multiplied by base_lr; LambdaLR multiplies by base_lr once more: "
         "divide instead"),
        (min(t ** -0.5, t * warmup ** -1.5),
         "the paper's rate starts with the factor d_model^-0.5"),
        (d_model ** -0.5 * min(t ** -0.5, t * warmup ** -0.5),
         "the rise is t · warmup^-1.5, so that the two branches meet at t = warmup"),
        (_noam(d_model, warmup, t + 1),
         "one step off: LambdaLR passes the number of scheduler steps taken so far, and that "
         "number is the paper's step (step 0, at creation, counts as step 1)"),
    ]


def _factor(fn: Callable[[int], float], step: int) -> float:
    """The student's factor at ``step``, as a float; _Failure otherwise."""
    try:
        got = _call(fn, [step], ["step"])
    except _Failure as failure:
        hint = ("LambdaLR calls the function with step 0 as soon as it is created: count "
                "step 0 as step 1" if step == 0 else failure.hint)
        raise _Failure(f"the returned function, at step {step}, {failure.message}",
                       hint) from None
    return _as_number(got, f"the factor at step {step}")


def _multiplier(noam_for_base_lr: Callable, d_model: int, warmup: int, base_lr: float
                ) -> Callable[[int], float]:
    fn = _call(noam_for_base_lr, [d_model, warmup, base_lr], ["d_model", "warmup", "base_lr"])
    if not callable(fn):
        raise _Failure(f"returned {_describe(fn)}: return the function of the step that "
                       "LambdaLR will call")
    return fn


def check_noam_for_base_lr(noam_for_base_lr: Callable[[int, int, float], Callable]
                           ) -> CheckResult:
    """Check ``noam_for_base_lr(d_model, warmup, base_lr)``: a function of the step such that
    ``LambdaLR`` on an optimizer built with ``lr=base_lr`` gives the paper's rate
    d_model^-0.5 · min(t^-0.5, t · warmup^-1.5) at step t (step 0 counts as step 1); a
    ``base_lr`` of 0 raises a ValueError that names ``base_lr``."""

    def at_steps(d_model: int, warmup: int, base_lr: float, steps: list[int]
                 ) -> Callable[[], None]:
        def run() -> None:
            fn = _multiplier(noam_for_base_lr, d_model, warmup, base_lr)
            for step in steps:
                rate = base_lr * _factor(fn, step)
                _compare_number(rate, _noam(d_model, warmup, step),
                                f"the rate at step {step} (base_lr × your factor)",
                                mistakes=_rate_mistakes(d_model, warmup, base_lr, step))
        return run

    def with_lambda_lr(d_model: int, warmup: int, base_lr: float, n: int
                       ) -> Callable[[], None]:
        def run() -> None:
            fn = _multiplier(noam_for_base_lr, d_model, warmup, base_lr)
            _factor(fn, 0)  # the first call LambdaLR makes, with its own message
            param = torch.nn.Parameter(torch.zeros(1))
            optimizer = torch.optim.SGD([param], lr=base_lr)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
            for step in range(n):
                reported = optimizer.param_groups[0]["lr"]
                _compare_number(reported, _noam(d_model, warmup, step),
                                f"the rate the optimizer reports at step {step}",
                                mistakes=_rate_mistakes(d_model, warmup, base_lr, step))
                optimizer.step()
                scheduler.step()
        return run

    def zero_base() -> None:
        _expect_value_error(noam_for_base_lr, [512, 4000, 0.0],
                            "with base_lr = 0 the optimizer's rate is 0 × factor = 0 whatever "
                            "the factor", must_name=["base_lr"])

    return _run("noam_for_base_lr", noam_for_base_lr, [
        ("d_model 512, warmup 4000, base_lr 1e-3: steps 0 to 100000",
         at_steps(512, 4000, 1e-3, [0, 1, 2, 100, 3999, 4000, 4001, 20000, 100000])),
        ("d_model 64, warmup 10, base_lr 0.5: the rates LambdaLR reports for 40 steps",
         with_lambda_lr(64, 10, 0.5, 40)),
        ("d_model 128, warmup 50, base_lr 3.0: the rates LambdaLR reports for 120 steps",
         with_lambda_lr(128, 50, 3.0, 120)),
        ("base_lr 0 raises a ValueError", zero_base),
    ])


# RMSNorm that survives low precision ---------------------------------------------------------

# (atol, rtol) per dtype: a few units in the last place of the output. Values are O(1).
_TOLERANCES = {torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.6e-2, 1.6e-2),
               torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-10)}


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm computed in fp64, cast to x's dtype."""
    h = x.double()
    out = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.double()
    return out.to(x.dtype)


def _rms_mistakes(x: Tensor, weight: Tensor, eps: float) -> list[tuple[Tensor, str]]:
    """Outputs of the usual mistakes, each with its hint."""
    h = x.double()
    mean_square = h.pow(2).mean(dim=-1, keepdim=True)
    naive = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight  # x's dtype
    centred = h - h.mean(dim=-1, keepdim=True)
    mistakes = [
        (naive, "in fp16 the square of anything above 256 overflows (the largest fp16 number "
                "is 65504), the mean square becomes inf and the output 0: compute the mean "
                "square in fp32, then cast the result back to x's dtype"),
        ((h * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
          * weight.double()).to(x.dtype),
         "that divides by the standard deviation: RMSNorm divides by the root mean square of "
         "x itself, mean(x²), with no mean subtracted"),
        ((h * torch.rsqrt(mean_square + eps)).to(x.dtype),
         "the learned scale `weight` is missing"),
        ((h / (mean_square.sqrt() + eps) * weight.double()).to(x.dtype),
         "eps goes inside the square root: x / sqrt(mean(x²) + eps)"),
        ((h * torch.rsqrt(h.pow(2).sum(dim=-1, keepdim=True) + eps)
          * weight.double()).to(x.dtype),
         "that is the root of the sum of squares: RMSNorm uses their mean over the C "
         "channels"),
    ]
    if x.dtype == torch.float64:
        f32 = x.float()
        mistakes.append(((f32 * torch.rsqrt(f32.pow(2).mean(dim=-1, keepdim=True) + eps)
                          * weight.float()).double(),
                         "fp64 input was computed in fp32: use fp32 for fp16, bf16 and fp32 "
                         "inputs, and keep fp64 in fp64"))
    return mistakes


def check_stable_rms_norm(stable_rms_norm: Callable[[Tensor, Tensor, float], Tensor]
                          ) -> CheckResult:
    """Check ``stable_rms_norm(x, weight, eps) -> (..., C)``: RMSNorm over the last axis of
    ``x`` (any float dtype), scaled by ``weight`` ``(C,)`` of x's dtype, the mean square
    computed in fp32 (fp64 for fp64 inputs) and the result returned in x's dtype."""
    g = _generator()

    def case(shape: tuple[int, ...], dtype: torch.dtype, eps: float, scale: float = 1.0,
             outlier: float | None = None, offset: float = 0.0) -> Callable[[], None]:
        x = scale * torch.randn(*shape, generator=g) + offset
        if outlier is not None:
            x[..., 0] = outlier  # one large channel, as large trained models have
        x = x.to(dtype)
        weight = (1.0 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)

        def run() -> None:
            got = _call(stable_rms_norm, [x, weight, eps], ["x", "weight", "eps"])
            atol, rtol = _TOLERANCES[dtype]
            letters = "(B, T, C)" if len(shape) == 3 else "(N, C)"
            _compare(got, _rms_reference(x, weight, eps), "the output", letters=letters,
                     atol=atol, rtol=rtol, mistakes=_rms_mistakes(x, weight, eps),
                     nan_hint="compute the mean square in fp32: in fp16 it overflows to inf")
        return run

    return _run("stable_rms_norm", stable_rms_norm, [
        ("fp32 (2, 5, 16), mean 3, eps 1e-6", case((2, 5, 16), torch.float32, 1e-6,
                                                   offset=3.0)),
        ("fp16 (4, 64) with one channel at 300, eps 1e-6",
         case((4, 64), torch.float16, 1e-6, outlier=300.0)),
        ("bf16 (2, 3, 256) with one channel at 3000, eps 1e-5",
         case((2, 3, 256), torch.bfloat16, 1e-5, scale=2.0, outlier=3000.0)),
        ("fp16 (3, 32) of size 100, eps 1e-5", case((3, 32), torch.float16, 1e-5,
                                                    scale=100.0)),
        ("fp64 (2, 4, 8), eps 1e-6, checked to 1e-12", case((2, 4, 8), torch.float64, 1e-6,
                                                             scale=5.0, offset=1.0)),
    ])


# A pre-norm decoder layer, fixed ---------------------------------------------------------------


def _decoder_layer(g: torch.Generator, d_model: int, n_heads: int, d_ff: int) -> DecoderLayer:
    """A post-norm :class:`DecoderLayer` without dropout whose every weight, norms included,
    is drawn from ``g`` (the global random state is untouched)."""
    with torch.random.fork_rng(devices=[]):
        layer = DecoderLayer(d_model, n_heads, d_ff, dropout=0.0, norm_first=False)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm") and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return layer.eval()


def _pre_norm_mistakes(layer: DecoderLayer, x: Tensor, memory: Tensor, mask: Tensor
                       ) -> list[tuple[Tensor, str]]:
    """Outputs of the usual mistakes, each with its hint."""
    n1, n2, n3 = layer.norm1, layer.norm2, layer.norm3
    attn, cross, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward

    def stack(x: Tensor, *, residual_normed: bool = False, memory_normed: bool = False,
              use_mask: bool = True, norms=(n1, n2, n3)) -> Tensor:
        a, b, c = norms
        h = a(x)
        x = (h if residual_normed else x) + attn(h, mask=mask if use_mask else None)
        x = x + cross(b(x), b(memory) if memory_normed else memory)
        return x + ffn(c(x))

    return [
        (stack(x, residual_normed=True, memory_normed=True),
         "both bugs are still there (see the two hints below)"),
        (stack(x, residual_normed=True),
         "the first sublayer adds its output to norm1(x) instead of x: the residual stream "
         "must carry x itself, x + f(norm(x)), or the identity path is lost"),
        (stack(x, memory_normed=True),
         "the memory goes into cross-attention as the encoder made it: the decoder's norms "
         "normalise the decoder's own stream only"),
        (layer(x, memory, mask),
         "that is the post-norm layer (norm after each residual sum), which is what this "
         "layer's own forward computes"),
        (stack(x, use_mask=False),
         "self-attention needs the causal mask tgt_mask"),
        (stack(x, norms=(n1, n1, n1)),
         "each sublayer has its own norm: norm1 before self-attention, norm2 before "
         "cross-attention, norm3 before the feed-forward network"),
    ]


def check_pre_norm_decoder_layer(pre_norm_decoder_layer: Callable[..., Tensor]
                                 ) -> CheckResult:
    """Check ``pre_norm_decoder_layer(layer, x, memory, tgt_mask) -> (B, T, C)``: the pre-norm
    decoder layer x + f(norm(x)) for its three sublayers, built from the submodules of
    ``layer`` (a :class:`DecoderLayer`, here a post-norm one, without dropout); the result
    must equal ``DecoderLayer(..., norm_first=True)`` with the same weights."""
    g = _generator()

    def case(B: int, T: int, S: int, d_model: int, n_heads: int) -> Callable[[], None]:
        layer = _decoder_layer(g, d_model, n_heads, 2 * d_model)
        with torch.random.fork_rng(devices=[]):
            reference = DecoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0,
                                     norm_first=True)
        reference.load_state_dict(layer.state_dict())
        reference.eval()
        x = torch.randn(B, T, d_model, generator=g)  # (B, T, C)
        memory = torch.randn(B, S, d_model, generator=g)  # (B, S, C)
        mask = causal_mask(T)  # (T, T)

        def run() -> None:
            with torch.no_grad():
                got = _call(pre_norm_decoder_layer, [layer, x, memory, mask],
                            ["layer", "x", "memory", "tgt_mask"])
                want = reference(x, memory, mask)
                mistakes = _pre_norm_mistakes(layer, x, memory, mask)
            _compare(got, want, "the output", letters="(B, T, C)",
                     axes=("batch", "position", "channel"), mistakes=mistakes,
                     shape_hints={(B, S, d_model): "cross-attention's queries come from the "
                                  "decoder's stream (B, T, C); the memory gives its keys "
                                  "and values"})
        return run

    return _run("pre_norm_decoder_layer", pre_norm_decoder_layer, [
        ("B 2, T 5, S 7, C 16, 2 heads", case(2, 5, 7, 16, 2)),
        ("B 3, T 4, S 4, C 8, 1 head", case(3, 4, 4, 8, 1)),
        ("B 1, T 6, S 3, C 24, 4 heads", case(1, 6, 3, 24, 4)),
    ])
