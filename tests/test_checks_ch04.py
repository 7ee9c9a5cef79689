"""Chapter 4's checkers (``transformer_lib/checks/ch04_normalisation.py`` and, for the norms
the learner writes, ``ch04_norms.py``) name the usual mistakes in words a student can act on.
The contract every checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.checks import (
    ch04_normalisation,
    ch04_norms,
    check_deepnorm_gradient_profile,
    check_layer_norm,
    check_noam_for_base_lr,
    check_rezero_encoder_layer,
    check_rms_norm,
)

from chapter_solutions import references
from conftest import mistake_tests

noam_for_base_lr, rezero_encoder_layer, deepnorm_gradient_profile = references(
    "04_normalisation", "noam_for_base_lr", "rezero_encoder_layer", "deepnorm_gradient_profile")


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


def rezero_scaled_sum(layer, x, alpha):
    """alpha multiplies the residual path as well: alpha·(x + f(x))."""
    h = alpha * (x + layer.self_attn(x))
    return alpha * (h + layer.feed_forward(h))


def rezero_without_gate(layer, x, alpha):
    h = x + layer.self_attn(x)
    return h + layer.feed_forward(h)


def rezero_ffn_ungated(layer, x, alpha):
    h = x + alpha * layer.self_attn(x)
    return h + layer.feed_forward(h)


def rezero_ffn_reads_x(layer, x, alpha):
    return x + alpha * layer.self_attn(x) + alpha * layer.feed_forward(x)


def rezero_gate_as_float(layer, x, alpha):
    """The right numbers, but alpha cut out of the graph: it could never learn."""
    a = alpha.detach()
    h = x + a * layer.self_attn(x)
    return h + a * layer.feed_forward(h)


def rezero_by_the_library(layer, x, alpha):
    """The library's layer does the sums: the exercise refuses it."""
    return layer(x)


def deepnorm(layers, x, target, *, alpha=None, on_branch=False, reduction="mean",
             norms_in_profile=True):
    """deepnorm_gradient_profile with one of the usual mistakes."""
    a = (2 * len(layers)) ** 0.25 if alpha is None else alpha
    h = x
    for layer in layers:
        for norm, f in ((layer.norm1, layer.self_attn), (layer.norm2, layer.feed_forward)):
            h = norm(h + a * f(h)) if on_branch else norm(a * h + f(h))
    loss = torch.nn.functional.mse_loss(h, target, reduction=reduction)
    params = [[p for name, p in layer.named_parameters()
               if norms_in_profile or not name.startswith("norm")] for layer in layers]
    grads = torch.autograd.grad(loss, [p for group in params for p in group])
    out, i = [], 0
    for group in params:
        out.append(torch.cat([g.flatten() for g in grads[i:i + len(group)]]).norm())
        i += len(group)
    return torch.stack(out)


def deepnorm_by_the_library(layers, x, target):
    """The layers' own forward: plain post-norm."""
    for layer in layers:
        x = layer(x)
    return x


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_noam_for_base_lr, noam_wrong(divide=False),
     ["1 of 4 checks passed", "expected 1.74693e-07, got 1.74693e-10",
      "divided by base_lr"]),
    (check_noam_for_base_lr, noam_wrong(d_factor=False), ["starts with the factor d_model^-0.5"]),
    (check_noam_for_base_lr, noam_wrong(rise=-0.5), ["t · warmup^-1.5"]),
    (check_noam_for_base_lr, noam_wrong(shift=1),
     ["one step late", "max(step, 1)", "step + 1 maps"]),
    (check_noam_for_base_lr, noam_wrong(guard_zero=False),
     ["at step 0, raised ZeroDivisionError", "count step 0 as step 1"]),
    (check_noam_for_base_lr, noam_wrong(check_base=False),
     ["3 of 4 checks passed", "returned a value of type function instead of raising a "
                           "ValueError"]),
    (check_noam_for_base_lr, lambda d, w, base: 0.001, ["return the function of the step"]),
    (check_rezero_encoder_layer, rezero_scaled_sum,
     ["0 of 4 checks passed", "alpha multiplies the sublayer's output only"]),
    (check_rezero_encoder_layer, rezero_without_gate, ["alpha is missing"]),
    (check_rezero_encoder_layer, rezero_ffn_reads_x,
     ["reads the stream after the attention's update"]),
    (check_rezero_encoder_layer, rezero_gate_as_float,
     ["3 of 4 checks passed", "alpha gets no gradient", "cut it out of the graph"]),
    (check_rezero_encoder_layer, rezero_by_the_library,
     ["0 of 4 checks passed", "EncoderLayer.forward` is not allowed here"]),
    (check_rezero_encoder_layer, rezero_ffn_ungated,
     ["the feed-forward network's output needs alpha too"]),
    (check_deepnorm_gradient_profile, lambda layers, x, t: deepnorm(layers, x, t, alpha=1.0),
     ["that is the plain post-norm stack"]),
    (check_deepnorm_gradient_profile,
     lambda layers, x, t: deepnorm(layers, x, t, alpha=(8 * len(layers)) ** -0.25),
     ["is beta, DeepNorm's gain"]),
    (check_deepnorm_gradient_profile, lambda layers, x, t: deepnorm(layers, x, t, on_branch=True),
     ["alpha multiplies x, the residual"]),
    (check_deepnorm_gradient_profile,
     lambda layers, x, t: deepnorm(layers, x, t, norms_in_profile=False),
     ["the norms' weights and biases included"]),
    (check_deepnorm_gradient_profile, lambda layers, x, t: deepnorm(layers, x, t, reduction="sum"),
     ["not the sum"]),
    (check_deepnorm_gradient_profile, lambda layers, x, t: deepnorm(layers, x, t, alpha=2.0),
     ["0 of 3 checks passed", "wrong values in the gradient norms"]),
    (check_deepnorm_gradient_profile, deepnorm_by_the_library,
     ["0 of 3 checks passed", "this layer's own forward is the plain post-norm layer"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch04_normalisation))


def test_the_references_pass(capsys):
    assert check_noam_for_base_lr(noam_for_base_lr)
    assert check_rezero_encoder_layer(rezero_encoder_layer)
    assert check_deepnorm_gradient_profile(deepnorm_gradient_profile)
    capsys.readouterr()


def test_the_checkers_leave_the_library_layers_as_they_were(capsys):
    """The norms the ReZero checker removes and the forward the DeepNorm checker refuses
    belong to the checker's own layers: the library's EncoderLayer still works."""
    from transformer_lib.encoder_decoder import EncoderLayer

    check_rezero_encoder_layer(rezero_by_the_library)
    check_deepnorm_gradient_profile(deepnorm_by_the_library)
    capsys.readouterr()
    layer = EncoderLayer(8, 2, 16, dropout=0.0)
    assert layer(torch.randn(1, 3, 8)).shape == (1, 3, 8)


# Plausible wrong norms (the core exercises) ------------------------------------------------------

layer_norm, rms_norm = references("04_normalisation", "layer_norm", "rms_norm")


def _in_fp32(norm):
    """The statistics in float32 for half-precision inputs, the result in x's dtype."""
    def wrapped(x, *args):
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return norm(h, *(a.to(h.dtype) if torch.is_tensor(a) else a for a in args)).to(x.dtype)
    return wrapped


def ln_with(*, correction=0, eps_outside=False, centre=True, dim=-1, swap=False):
    """layer_norm with one of the usual mistakes, written as a student would."""
    @_in_fp32
    def norm(x, gamma, beta, eps=1e-5):
        if swap:
            gamma, beta = beta, gamma
        mu = x.mean(dim=dim, keepdim=True) if centre else 0.0
        var = ((x - mu) ** 2).sum(dim=dim, keepdim=True) / (x.shape[dim] - correction)
        root = torch.sqrt(var) + eps if eps_outside else torch.sqrt(var + eps)
        return gamma * (x - mu) / root + beta
    return norm


def rms_with(*, centre=False, eps_outside=False, scale=True, dim=-1):
    """rms_norm with one of the usual mistakes, written as a student would."""
    @_in_fp32
    def norm(x, g, eps=1e-6):
        h = x - x.mean(dim=dim, keepdim=True) if centre else x
        ms = (h * h).mean(dim=dim, keepdim=True)
        root = torch.sqrt(ms) + eps if eps_outside else torch.sqrt(ms + eps)
        return (g if scale else 1.0) * h / root
    return norm


def ln_in_half(x, gamma, beta, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta


def rms_in_half(x, g, eps=1e-6):
    return g * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


CORE_WRONG = [
    (check_layer_norm, ln_with(correction=1), ["divided by C - 1"]),
    (check_layer_norm, ln_with(eps_outside=True), ["eps was added after the square root"]),
    (check_layer_norm, ln_with(centre=False), ["the mean was not subtracted"]),
    (check_layer_norm, ln_with(swap=True), ["gamma and beta are swapped"]),
    (check_layer_norm, ln_with(dim=0), ["the statistics ran over the wrong axis"]),
    (check_layer_norm, ln_in_half, ["5 of 6 checks passed", "300² is inf in float16"]),
    (check_layer_norm, lambda x, gamma, beta, eps=1e-5: layer_norm(x.float(), gamma.float(),
                                                                   beta.float(), eps),
     ["expected torch.float16, got torch.float32"]),
    (check_rms_norm, rms_with(centre=True), ["RMSNorm subtracts no mean"]),
    (check_rms_norm, rms_with(eps_outside=True), ["eps was added after the square root"]),
    (check_rms_norm, rms_with(scale=False), ["the learned scale g was not applied"]),
    (check_rms_norm, rms_with(dim=0), ["the mean square ran over the wrong axis"]),
    (check_rms_norm, rms_in_half, ["5 of 6 checks passed", "300² is inf in float16"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch04_norms))
