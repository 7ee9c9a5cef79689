"""Checkers for the exercises of chapter 4, normalisation and training stability
(``chapters/04_normalisation.ipynb``): a Noam multiplier that makes ``LambdaLR`` give the
paper's rate whatever the optimizer's base rate, a ReZero encoder layer (no norm, a learnt
gate that starts at zero), and the gradient each layer of a DeepNorm stack receives."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from transformer_lib.checks._guard import Rules, given
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
from transformer_lib.checks._messages import say
from transformer_lib.encoder_decoder import EncoderLayer

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "noam_for_base_lr": Rules(),
    "rezero_encoder_layer": Rules(allow=("MultiHeadAttention", "FeedForward")),
    "deepnorm_gradient_profile": Rules(allow=("MultiHeadAttention", "FeedForward", "LayerNorm")),
}

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
         say("LambdaLR multiplies the optimizer's lr by your factor, so the factor must be "
             "the paper's rate divided by base_lr")),
        (base_lr * base_lr * right,
         say("the factor was multiplied by base_lr; LambdaLR multiplies by base_lr once more: "
             "divide instead")),
        (min(t ** -0.5, t * warmup ** -1.5),
         say("the paper's rate starts with the factor d_model^-0.5")),
        (d_model ** -0.5 * min(t ** -0.5, t * warmup ** -0.5),
         say("the rise is t · warmup^-1.5, so that the two branches meet at t = warmup")),
        (_noam(d_model, warmup, t + 1),
         say("one step late: this exercise takes the step LambdaLR passes as the paper's t "
             "and counts only step 0 as 1, max(step, 1), the Annotated Transformer's "
             "convention; step + 1 maps LambdaLR's count from 0 onto the paper's count from 1, "
             "a faithful convention too, but not the one asked for here")),
    ]


def _factor(fn: Callable[[int], float], step: int) -> float:
    """The student's factor at ``step``, as a float; _Failure otherwise."""
    try:
        got = _call(fn, [step], ["step"])
    except _Failure as failure:
        hint = (say("LambdaLR calls the function with step 0 as soon as it is created: count "
                    "step 0 as step 1") if step == 0 else failure.hint)
        raise _Failure(say("the returned function, at step {step}, {message}", step=step,
                           message=failure.message), hint) from None
    return _as_number(got, say("the factor at step {step}", step=step))


def _multiplier(noam_for_base_lr: Callable, d_model: int, warmup: int, base_lr: float
                ) -> Callable[[int], float]:
    fn = _call(noam_for_base_lr, [d_model, warmup, base_lr], ["d_model", "warmup", "base_lr"])
    if not callable(fn):
        raise _Failure(say("returned {got}: return the function of the step that LambdaLR "
                           "will call", got=_describe(fn)))
    return fn


def check_noam_for_base_lr(noam_for_base_lr: Callable[[int, int, float], Callable]
                           ) -> CheckResult:
    """Check ``noam_for_base_lr(d_model, warmup, base_lr)``: a function of the step such that
    ``LambdaLR`` on an optimizer built with ``lr=base_lr`` gives the paper's rate
    d_model^-0.5 · min(t^-0.5, t · warmup^-1.5) at step t (step 0 counts as step 1); a
    ``base_lr`` of 0 raises a ValueError that names ``base_lr``.

    Args:
        noam_for_base_lr: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def at_steps(d_model: int, warmup: int, base_lr: float, steps: list[int]
                 ) -> Callable[[], None]:
        def run() -> None:
            fn = _multiplier(noam_for_base_lr, d_model, warmup, base_lr)
            for step in steps:
                rate = base_lr * _factor(fn, step)
                _compare_number(rate, _noam(d_model, warmup, step),
                                say("the rate at step {step} (base_lr × your factor)",
                                    step=step),
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
                                say("the rate the optimizer reports at step {step}",
                                    step=step),
                                mistakes=_rate_mistakes(d_model, warmup, base_lr, step))
                optimizer.step()
                scheduler.step()
        return run

    def zero_base() -> None:
        _expect_value_error(noam_for_base_lr, [512, 4000, 0.0],
                            say("with base_lr = 0 the optimizer's rate is 0 × factor = 0 "
                                "whatever the factor"), must_name=["base_lr"])

    return _run("noam_for_base_lr", noam_for_base_lr, [
        (say("d_model 512, warmup 4000, base_lr 1e-3: steps 0 to 100000"),
         at_steps(512, 4000, 1e-3, [0, 1, 2, 100, 3999, 4000, 4001, 20000, 100000])),
        (say("d_model 64, warmup 10, base_lr 0.5: the rates LambdaLR reports for 40 steps"),
         with_lambda_lr(64, 10, 0.5, 40)),
        (say("d_model 128, warmup 50, base_lr 3.0: the rates LambdaLR reports for 120 steps"),
         with_lambda_lr(128, 50, 3.0, 120)),
        (say("base_lr 0 raises a ValueError"), zero_base),
    ], rules=RULES["noam_for_base_lr"])


# Layers for the two residual exercises ------------------------------------------------------


def _refuse(message: str) -> Callable[..., Tensor]:
    @given
    def refuse(*args, **kwargs) -> Tensor:
        raise RuntimeError(message)
    return refuse


@given
class _NoNorm(nn.Module):
    """Stands where a ReZero layer has no norm: calling it raises, with the reason."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError(say("ReZero has no norm: this layer's {name} is not there to be "
                               "called; use only layer.self_attn and layer.feed_forward",
                               name=self.name))


def _encoder_layer(g: torch.Generator, d_model: int, n_heads: int) -> EncoderLayer:
    """A post-norm :class:`EncoderLayer` without dropout whose every weight, norms included,
    is drawn from ``g`` (the global random state is untouched)."""
    with torch.random.fork_rng(devices=[]):
        layer = EncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0, norm_first=False)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm") and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.startswith("norm"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return layer.eval()


# A ReZero encoder layer -----------------------------------------------------------------------


def _rezero(layer: EncoderLayer, x: Tensor, alpha: Tensor, *, gate=(True, True),
            scale_sum: bool = False, parallel: bool = False) -> Tensor:
    """The ReZero layer, or one of the usual mistakes."""
    a1 = alpha if gate[0] else 1.0
    a2 = alpha if gate[1] else 1.0
    if scale_sum:
        h = a1 * (x + layer.self_attn(x))
        return a2 * (h + layer.feed_forward(h))
    h = x + a1 * layer.self_attn(x)
    return h + a2 * layer.feed_forward(x if parallel else h)


def _rezero_mistakes(layer: EncoderLayer, x: Tensor, alpha: Tensor
                     ) -> list[tuple[Tensor, str]]:
    return [
        (_rezero(layer, x, alpha, gate=(False, False)),
         say("alpha is missing: each sublayer's output is multiplied by alpha before it is "
             "added")),
        (_rezero(layer, x, alpha, scale_sum=True),
         say("alpha multiplies the sublayer's output only, x + alpha·f(x): the residual path "
             "x is left as it is, so that the layer is the identity at alpha = 0")),
        (_rezero(layer, x, alpha, gate=(True, False)),
         say("the feed-forward network's output needs alpha too: one alpha gates both "
             "sublayers")),
        (_rezero(layer, x, alpha, gate=(False, True)),
         say("the attention's output needs alpha too: one alpha gates both sublayers")),
        (_rezero(layer, x, alpha, parallel=True),
         say("the feed-forward network reads the stream after the attention's update, "
             "h = x + alpha·attn(x), not x")),
    ]


def check_rezero_encoder_layer(rezero_encoder_layer: Callable[[EncoderLayer, Tensor, Tensor],
                                                              Tensor]) -> CheckResult:
    """Check ``rezero_encoder_layer(layer, x, alpha) -> (B, T, C)``: h = x + alpha·attn(x),
    then h + alpha·ffn(h), from ``layer.self_attn`` and ``layer.feed_forward`` (the layers it
    is given have no usable norm); the identity at alpha = 0, and alpha (a 0-d tensor that
    requires grad) gets its gradient.

    Args:
        rezero_encoder_layer: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def inputs(B: int, T: int, C: int, H: int, alpha: float
               ) -> tuple[EncoderLayer, Tensor, Tensor]:
        layer = _encoder_layer(g, C, H)
        layer.norm1, layer.norm2 = _NoNorm("norm1"), _NoNorm("norm2")
        x = torch.randn(B, T, C, generator=g)  # (B, T, C)
        return layer, x, torch.tensor(alpha, requires_grad=True)

    def output(B: int, T: int, C: int, H: int, alpha: float) -> Callable[[], None]:
        layer, x, a = inputs(B, T, C, H, alpha)

        def run() -> None:
            got = _call(rezero_encoder_layer, [layer, x, a], ["layer", "x", "alpha"])
            with torch.no_grad():
                want = _rezero(layer, x, a)
                mistakes = _rezero_mistakes(layer, x, a)
            _compare(got, want, say("the output"), letters=say("(B, T, C)"),
                     axes=(say("batch"), say("position"), say("channel")), mistakes=mistakes)
        return run

    def identity_at_zero() -> None:
        layer, x, a = inputs(2, 4, 8, 2, 0.0)
        got = _call(rezero_encoder_layer, [layer, x, a], ["layer", "x", "alpha"])
        _compare(got, x, say("the output at alpha = 0"), letters=say("(B, T, C)"), atol=0.0,
                 rtol=0.0,
                 mistakes=[(torch.zeros_like(x), say("at alpha = 0 the output is 0: alpha "
                                                     "multiplies the residual path too; it "
                                                     "should gate f(x) only"))])

    def alpha_learns() -> None:
        layer, x, a = inputs(2, 3, 8, 1, 0.5)
        r = torch.randn(x.shape, generator=g)  # (B, T, C): a fixed direction for the loss
        got = _call(rezero_encoder_layer, [layer, x, a], ["layer", "x", "alpha"])
        want = torch.autograd.grad((_rezero(layer, x, a) * r).sum(), a)[0]
        no_grad = _Failure(say("alpha gets no gradient from the output"),
                           say("keep alpha a tensor in the computation: float(alpha), "
                               "alpha.item() or alpha.detach() cut it out of the graph, "
                               "so it could never learn"))
        if not isinstance(got, Tensor) or got.shape != x.shape:
            raise _Failure(say("returned {got}, expected a tensor of shape {shape}",
                               got=_describe(got), shape=tuple(x.shape)))
        if not got.requires_grad:
            raise no_grad
        grad = torch.autograd.grad((got * r).sum(), a, allow_unused=True)[0]
        if grad is None:
            raise no_grad
        _compare(grad, want, say("the gradient of (output · r).sum() with respect to alpha"),
                 atol=1e-4, rtol=1e-4)

    return _run("rezero_encoder_layer", rezero_encoder_layer, [
        (say("B 2, T 5, C 16, 2 heads, alpha 0.37"), output(2, 5, 16, 2, 0.37)),
        (say("B 1, T 3, C 8, 1 head, alpha -0.8"), output(1, 3, 8, 1, -0.8)),
        (say("alpha 0: the layer is exactly the identity"), identity_at_zero),
        (say("alpha gets its gradient (it is learnt)"), alpha_learns),
    ], rules=RULES["rezero_encoder_layer"])


# The gradient profile of a DeepNorm stack -------------------------------------------------------


def _profile(layers: list[EncoderLayer], x: Tensor, target: Tensor, *, alpha: float,
             gate_branch: bool = False, only_sublayers: bool = False,
             summed: bool = False) -> Tensor:
    """The gradient norm of each layer's parameters for the DeepNorm stack (or a mistake)."""
    h = x
    for layer in layers:
        for norm, f in ((layer.norm1, layer.self_attn), (layer.norm2, layer.feed_forward)):
            h = norm(h + alpha * f(h)) if gate_branch else norm(alpha * h + f(h))
    loss = ((h - target) ** 2).sum() if summed else ((h - target) ** 2).mean()
    params = [[p for name, p in layer.named_parameters()
               if not (only_sublayers and name.startswith("norm"))] for layer in layers]
    grads = torch.autograd.grad(loss, [p for group in params for p in group])
    norms, i = [], 0
    for group in params:
        norms.append(torch.cat([gr.flatten() for gr in grads[i:i + len(group)]]).norm())
        i += len(group)
    return torch.stack(norms)  # (N,)


def _profile_mistakes(layers: list[EncoderLayer], x: Tensor, target: Tensor
                      ) -> list[tuple[Tensor, str]]:
    n = len(layers)
    alpha = (2 * n) ** 0.25
    return [
        (_profile(layers, x, target, alpha=1.0),
         say("that is the plain post-norm stack: DeepNorm multiplies the residual x by "
             "alpha = (2N)^(1/4) before the sublayer's output is added, LN(alpha·x + f(x))")),
        (_profile(layers, x, target, alpha=(8 * n) ** -0.25),
         say("alpha = (2N)^(1/4) is larger than 1: it up-weights the residual; (8N)^(-1/4) "
             "is beta, DeepNorm's gain for the initial weights")),
        (_profile(layers, x, target, alpha=alpha, gate_branch=True),
         say("alpha multiplies x, the residual, not the sublayer's output: "
             "LN(alpha·x + f(x))")),
        (_profile(layers, x, target, alpha=alpha, only_sublayers=True),
         say("each layer's gradient norm covers all its parameters, the norms' weights and "
             "biases included")),
        (_profile(layers, x, target, alpha=alpha, summed=True),
         say("the loss is the mean squared error over every entry, "
             "((y - target)**2).mean(), not the sum")),
    ]


def check_deepnorm_gradient_profile(deepnorm_gradient_profile: Callable[..., Tensor]
                                    ) -> CheckResult:
    """Check ``deepnorm_gradient_profile(layers, x, target) -> (N,)``: run ``x`` ``(B, T, C)``
    through the N post-norm layers in DeepNorm form, x <- LN(alpha·x + f(x)) with
    alpha = (2N)^(1/4) for both sublayers of every layer, take the mean squared error against
    ``target`` and return the norm of the gradient of each layer's parameters. The layers'
    own ``forward`` (the plain post-norm layer) raises.

    Args:
        deepnorm_gradient_profile: the function to check (the exercise's), called on the
            checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(n_layers: int, B: int, T: int, C: int, H: int) -> Callable[[], None]:
        layers = nn.ModuleList(_encoder_layer(g, C, H) for _ in range(n_layers))
        for layer in layers:
            layer.forward = _refuse(
                say("this layer's own forward is the plain post-norm layer: build "
                    "DeepNorm's sum from layer.norm1, layer.self_attn, layer.norm2 and "
                    "layer.feed_forward"))
        x = torch.randn(B, T, C, generator=g)  # (B, T, C)
        target = torch.randn(B, T, C, generator=g)  # (B, T, C)

        def run() -> None:
            for p in layers.parameters():
                p.grad = None
            got = _call(deepnorm_gradient_profile, [layers, x, target],
                        ["layers", "x", "target"])
            want = _profile(list(layers), x, target, alpha=(2 * n_layers) ** 0.25)
            mistakes = _profile_mistakes(list(layers), x, target)
            _compare(got, want, say("the gradient norms"), letters="(N,)",
                     axes=(say("layer"),),
                     mistakes=mistakes, atol=1e-5, rtol=1e-4)
        return run

    return _run("deepnorm_gradient_profile", deepnorm_gradient_profile, [
        (say("1 layer, B 2, T 4, C 8, 2 heads"), case(1, 2, 4, 8, 2)),
        (say("3 layers, B 2, T 5, C 16, 2 heads"), case(3, 2, 5, 16, 2)),
        (say("6 layers, B 1, T 6, C 8, 1 head"), case(6, 1, 6, 8, 1)),
    ], rules=RULES["deepnorm_gradient_profile"])
