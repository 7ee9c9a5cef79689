"""Chapter 4's checkers (``transformer_lib/checks/ch04_normalisation.py``) name the usual
mistakes in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.checks import (
    ch04_normalisation,
    check_noam_for_base_lr,
    check_pre_norm_decoder_layer,
    check_stable_rms_norm,
)

from chapter_solutions import references
from conftest import mistake_tests

noam_for_base_lr, pre_norm_decoder_layer, stable_rms_norm = references(
    "04_normalisation", "noam_for_base_lr", "pre_norm_decoder_layer", "stable_rms_norm")


def noam_wrong(*, divide=True, d_factor=True, rise=-1.5, shift=0, guard_zero=True,
               check_base=True):
    """noam_for_base_lr with one of the usual mistakes."""

    def outer(d_model, warmup, base_lr):
        if check_base and base_lr <= 0:
            raise ValueError(f"base_lr must be positive, got {base_lr}")

        def factor(step):
            t = max(step, 1) if guard_zero else step
            t += shift
            rate = min(t ** -0.5, t * warmup ** rise)
            if d_factor:
                rate *= d_model ** -0.5
            return rate / base_lr if divide else rate

        return factor

    return outer


def rms_in_input_dtype(x, weight, eps=1e-6):
    """Everything in x's dtype: the squares overflow fp16."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rms_always_fp32(x, weight, eps=1e-6):
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype)


def rms_returns_fp32(x, weight, eps=1e-6):
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()


def rms_eps_outside(x, weight, eps=1e-6):
    h = x.double()
    return (h / (h.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight.double()).to(x.dtype)


def rms_variance(x, weight, eps=1e-6):
    h = x.double()
    var = h.var(dim=-1, keepdim=True, unbiased=False)
    return (h * torch.rsqrt(var + eps) * weight.double()).to(x.dtype)


def the_buggy_layer(layer, x, memory, tgt_mask):
    """The layer from the exercise, unfixed."""
    h = layer.norm1(x)
    x = h + layer.self_attn(h, mask=tgt_mask)
    h = layer.norm2(x)
    x = x + layer.cross_attn(h, layer.norm2(memory))
    h = layer.norm3(x)
    return x + layer.feed_forward(h)


def residual_still_normed(layer, x, memory, tgt_mask):
    h = layer.norm1(x)
    x = h + layer.self_attn(h, mask=tgt_mask)
    x = x + layer.cross_attn(layer.norm2(x), memory)
    return x + layer.feed_forward(layer.norm3(x))


def memory_still_normed(layer, x, memory, tgt_mask):
    x = x + layer.self_attn(layer.norm1(x), mask=tgt_mask)
    x = x + layer.cross_attn(layer.norm2(x), layer.norm2(memory))
    return x + layer.feed_forward(layer.norm3(x))


def query_from_memory(layer, x, memory, tgt_mask):
    x = x + layer.self_attn(layer.norm1(x), mask=tgt_mask)
    x = memory + layer.cross_attn(memory, layer.norm2(x))
    return x + layer.feed_forward(layer.norm3(x))


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_noam_for_base_lr, noam_wrong(divide=False),
     ["1 of 4 checks passed", "expected 1.74693e-07, got 1.74693e-10",
      "divided by base_lr"]),
    (check_noam_for_base_lr, noam_wrong(d_factor=False), ["starts with the factor d_model^-0.5"]),
    (check_noam_for_base_lr, noam_wrong(rise=-0.5), ["t · warmup^-1.5"]),
    (check_noam_for_base_lr, noam_wrong(shift=1), ["one step off"]),
    (check_noam_for_base_lr, noam_wrong(guard_zero=False),
     ["at step 0, raised ZeroDivisionError", "count step 0 as step 1"]),
    (check_noam_for_base_lr, noam_wrong(check_base=False),
     ["3 of 4 checks passed", "returned a value of type function instead of raising a "
                           "ValueError"]),
    (check_noam_for_base_lr, lambda d, w, base: 0.001, ["return the function of the step"]),
    (check_stable_rms_norm, rms_in_input_dtype,
     ["3 of 5 checks passed", "the square of anything above 256 overflows"]),
    (check_stable_rms_norm, rms_always_fp32, ["4 of 5 checks passed", "keep fp64 in fp64"]),
    (check_stable_rms_norm, rms_returns_fp32,
     ["wrong dtype for the output: expected torch.float16, got torch.float32",
      "keep the dtype of the inputs"]),
    (check_stable_rms_norm, rms_eps_outside, ["eps goes inside the square root"]),
    (check_stable_rms_norm, rms_variance, ["divides by the standard deviation"]),
    (check_stable_rms_norm, lambda x, w, eps: (x * torch.rsqrt(x.float().pow(2).mean(
        dim=-1, keepdim=True) + eps)).to(x.dtype), ["`weight` is missing"]),
    (check_pre_norm_decoder_layer, the_buggy_layer,
     ["0 of 3 checks passed", "both bugs are still there"]),
    (check_pre_norm_decoder_layer, residual_still_normed, ["the identity path is lost"]),
    (check_pre_norm_decoder_layer, memory_still_normed,
     ["the decoder's norms normalise the decoder's own stream only"]),
    (check_pre_norm_decoder_layer, lambda layer, x, memory, mask: layer(x, memory, mask),
     ["that is the post-norm layer"]),
    (check_pre_norm_decoder_layer,
     lambda layer, x, memory, mask: pre_norm_decoder_layer(layer, x, memory, None),
     ["needs the causal mask"]),
    (check_pre_norm_decoder_layer, query_from_memory,
     ["wrong shape for the output: expected (B, T, C) = (2, 5, 16), got (2, 7, 16)",
      "queries come from the decoder's stream"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch04_normalisation))


def test_the_references_pass_for_weights_applied_before_or_after_the_cast(capsys):
    """Both orders of the last two operations are right: scale in fp32 then cast (the
    library), or cast then scale in x's dtype (Hugging Face's Llama)."""
    from transformer_lib.norms import RMSNorm

    def library_order(x, weight, eps=1e-6):
        norm = RMSNorm(x.shape[-1], eps).to(x.dtype)
        with torch.no_grad():
            norm.weight.copy_(weight)
        return norm(x).detach()

    for solution in (stable_rms_norm, library_order):
        assert check_stable_rms_norm(solution)
    assert check_noam_for_base_lr(noam_for_base_lr)
    capsys.readouterr()
