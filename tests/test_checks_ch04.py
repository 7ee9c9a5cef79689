"""Chapter 4's checkers (``transformer_lib/checks/ch04_normalisation.py`` and, for the core
the learner writes, ``ch04_norms.py`` and ``ch04_training_step.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in ``test_checks_contract.py``."""
from __future__ import annotations

import copy

import pytest
import torch

from transformer_lib.checks import (
    ch04_normalisation,
    ch04_norms,
    ch04_training_step,
    check_deepnorm_gradient_profile,
    check_layer_norm,
    check_noam_for_base_lr,
    check_rezero_encoder_layer,
    check_rms_norm,
    check_training_step,
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


# The 2017 training step (the core exercise after label smoothing) -------------------------------

training_step, = references("04_normalisation", "training_step")


def step_with(*, bias="t+1", noam_step=lambda t: max(t, 1), d_factor=True, eps_inside=False,
              others="V", mean_over_all=False, zero=True, use_scale=True, beta2=None,
              fixed_betas=None, fixed_smoothing=None, loss_after=False, as_tensor=False,
              autograd=False, in_place=True):
    """training_step with one of the usual mistakes, written as a student would (the loss in
    float32, as LabelSmoothingLoss takes it); ``autograd``: the gradients from
    torch.autograd.grad instead of backward() (not a mistake); ``in_place=False``: the new
    values bound to a name, the model's parameters left as they were."""

    def step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
             betas=(0.9, 0.98), eps=1e-9):
        betas = betas if fixed_betas is None else fixed_betas
        smoothing = smoothing if fixed_smoothing is None else fixed_smoothing
        params = list(model.parameters())
        if zero:
            model.zero_grad()

        def loss_of():
            logits = model(src, tgt_in)  # (B, T, V)
            V = logits.shape[-1]
            log_p = torch.log_softmax(logits.reshape(-1, V).float(), dim=-1)  # (N, V)
            labels = tgt_out.reshape(-1)  # (N,)
            kept = labels != -100
            one_hot = torch.zeros_like(log_p).scatter_(1, torch.where(kept, labels, 0)[:, None],
                                                       1.0)
            spread = smoothing / V if others == "V" else smoothing / (V - 1) * (1 - one_hot)
            per_position = -(((1 - smoothing) * one_hot + spread) * log_p).sum(-1) * kept
            return per_position.sum() / (labels.numel() if mean_over_all else kept.sum())

        loss = loss_of()
        if autograd:
            grads = torch.autograd.grad(loss, params)
        else:
            loss.backward()
            grads = [p.grad for p in params]
        t = state.setdefault("t", 0)
        state.setdefault("m", [torch.zeros_like(p) for p in params])
        state.setdefault("v", [torch.zeros_like(p) for p in params])
        beta1, beta2_ = betas[0], betas[1] if beta2 is None else beta2
        s = noam_step(t)
        rate = min(s ** -0.5, s * warmup ** -1.5) * (model.config.d_model ** -0.5 if d_factor
                                                     else 1.0)
        rate *= lr_scale if use_scale else 1.0
        n = {"t+1": t + 1, "max(t,1)": max(t, 1), "t": t, "none": None}[bias]
        with torch.no_grad():
            for p, g, m, v in zip(params, grads, state["m"], state["v"]):
                m.mul_(beta1).add_((1 - beta1) * g)
                v.mul_(beta2_).add_((1 - beta2_) * g ** 2)
                m_hat = m if n is None else m / (1 - beta1 ** n)
                v_hat = v if n is None else v / (1 - beta2_ ** n)
                root = torch.sqrt(v_hat + eps) if eps_inside else torch.sqrt(v_hat) + eps
                if in_place:
                    p -= rate * m_hat / root
                else:
                    p = p - rate * m_hat / root  # the mistake: a new tensor, not the model's
        state["t"] = t + 1
        if loss_after:
            with torch.no_grad():
                loss = loss_of()
        return loss.detach() if as_tensor else loss.item()

    return step


STEP_WRONG = [
    (check_training_step, step_with(bias="none"),
     ["0 of 2 checks passed", "after update t = 0", "Adam's moments start at 0"]),
    (check_training_step, step_with(bias="max(t,1)"),
     ["after update t = 1", "the bias correction of update t uses t + 1"]),
    (check_training_step, step_with(bias="t"),
     ["NaN or inf appeared in the parameter", "1 - β^0 = 0"]),
    (check_training_step, step_with(noam_step=lambda t: t + 1),
     ["after update t = 1", "the Noam rate is one update late"]),
    (check_training_step, step_with(d_factor=False), ["the factor d_model^-0.5"]),
    (check_training_step, step_with(eps_inside=True), ["ε goes after the square root"]),
    (check_training_step, step_with(others="V-1"),
     ["wrong value for the loss returned by update t = 0", "tensor2tensor's smoothing"]),
    (check_training_step, step_with(mean_over_all=True),
     ["the positions labelled -100 were counted in the mean"]),
    (check_training_step, step_with(zero=False),
     ["after update t = 1", "backward() accumulates into .grad"]),
    (check_training_step, step_with(use_scale=False),
     ["1 of 2 checks passed", "lr_scale was ignored"]),
    (check_training_step, step_with(beta2=0.999),
     ["β2 = 0.999 is PyTorch's default", "(β2 = 0.98 here)", "(β2 = 0.95 here)"]),
    (check_training_step, step_with(fixed_betas=(0.9, 0.98)),
     ["1 of 2 checks passed", "the betas given, (0.8, 0.95), were not used"]),
    (check_training_step, step_with(fixed_smoothing=0.1),
     ["1 of 2 checks passed", "the smoothing given, 0.2, was not used"]),
    (check_training_step, step_with(loss_after=True),
     ["return the loss computed before the update"]),
    (check_training_step, step_with(as_tensor=True),
     ["is a tensor of shape (), not a Python float", "return loss.item()"]),
    (check_training_step, step_with(in_place=False),
     ["update t = 0 left every parameter as it was", "in place"]),
]

test_step_mistake_is_rejected_with_the_reason, test_the_step_checker_knows_two_mistakes = (
    mistake_tests(STEP_WRONG, ch04_training_step))


def test_the_training_step_solution_passes(capsys):
    assert check_training_step(training_step)
    assert check_training_step(step_with())  # the loss in float32, as LabelSmoothingLoss
    capsys.readouterr()


def _framework_steps(model, batches, settings, loss_fn):
    """The losses and the parameters after each update of torch.optim.Adam with
    LambdaLR(noam_lambda) on ``model``, whose loss is ``loss_fn(logits, labels)``."""
    from transformer_lib.encoder_decoder import noam_lambda

    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr_scale"],
                                 betas=settings["betas"], eps=settings["eps"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, noam_lambda(model.config.d_model, settings["warmup"]))
    steps = []
    for src, tgt_in, tgt_out in batches:
        loss = loss_fn(model(src, tgt_in), tgt_out)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        steps.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
    return steps


@pytest.mark.parametrize("case", range(len(ch04_training_step._CASES)))
def test_the_reference_takes_the_steps_of_torch_optim(case):
    """The checker's private reference takes the steps of torch.optim.Adam +
    LambdaLR(noam_lambda) on each of the checker's cases (its model, batches and settings):
    with F.cross_entropy's label smoothing in float64 to float64 rounding (amplified by Adam
    where a gradient is almost 0), and with LabelSmoothingLoss (which takes the log-softmax
    in float32) within the checker's tolerances."""
    from transformer_lib.encoder_decoder import LabelSmoothingLoss

    c = ch04_training_step
    _, model, batches, settings = c._case_inputs()[case]
    want = c._trajectory(model, batches, **settings)

    def cross_entropy(logits, labels):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                 label_smoothing=settings["smoothing"])

    exact = _framework_steps(copy.deepcopy(model), batches, settings, cross_entropy)
    library = _framework_steps(copy.deepcopy(model), batches, settings,
                               LabelSmoothingLoss(settings["smoothing"]))
    assert len(want) == len(exact) == len(library) == len(batches) >= 3
    for (loss, params), (loss64, params64), (loss32, params32) in zip(want, exact, library):
        assert loss64 == pytest.approx(loss, rel=1e-12)
        assert loss32 == pytest.approx(loss, rel=c._LOSS_TOL)
        for p, p64, p32 in zip(params, params64, params32):
            torch.testing.assert_close(p64, p, rtol=1e-8, atol=1e-8)
            torch.testing.assert_close(p32, p, rtol=c._PARAM_RTOL, atol=c._PARAM_ATOL)


def _using(loss_line: str, optimizer: bool = False) -> str:
    """The chapter's solution with its loss (or its whole update) done by the framework."""
    update = """
    opt = state.setdefault("opt", torch.optim.SGD(model.parameters(), lr=0.1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()
""" if optimizer else """
    model.zero_grad()
    loss.backward()
    return loss.item()
"""
    return f"""
import torch
import torch.nn.functional as F
from torch import nn
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    logits = model(src, tgt_in).flatten(0, 1)
    labels = tgt_out.flatten()
    log_p = torch.log_softmax(logits, dim=-1)
    kept = labels != -100
    q = torch.full_like(log_p[kept], smoothing / log_p.shape[-1])
    {loss_line}
""" + update


REFUSED = [
    ("torch.optim.*", _using("loss = logits.sum()", optimizer=True), "torch.optim.sgd.SGD"),
    ("torch.nn.functional.cross_entropy",
     _using("loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)"),
     "torch.nn.functional.cross_entropy"),
    ("torch.nn.functional.nll_loss", _using("loss = F.nll_loss(log_p, labels)"),
     "torch.nn.functional.nll_loss"),
    ("torch.nn.CrossEntropyLoss",
     _using("loss = nn.CrossEntropyLoss(label_smoothing=smoothing)(logits, labels)"),
     "torch.nn.CrossEntropyLoss"),
    ("torch.nn.NLLLoss", _using("loss = nn.NLLLoss()(log_p, labels)"), "torch.nn.NLLLoss"),
    ("torch.nn.functional.kl_div",
     _using("loss = F.kl_div(log_p[kept], q, reduction='batchmean')"),
     "torch.nn.functional.kl_div"),
    ("torch.nn.KLDivLoss", _using("loss = nn.KLDivLoss(reduction='batchmean')(log_p[kept], q)"),
     "torch.nn.KLDivLoss"),
]


@pytest.mark.parametrize("name, source, refused", REFUSED, ids=[r[0] for r in REFUSED])
def test_each_refused_name_refuses_what_it_names(name, source, refused, capsys):
    assert name in ch04_training_step.RULES["training_step"].refuse
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    result = check_training_step(namespace["training_step"])
    printed = capsys.readouterr().out
    assert not result and result.attempted
    assert f"`{refused}" in printed and "is not allowed here" in printed, printed


def test_backward_and_autograd_work_under_the_guard(capsys):
    """The solution's loss.backward() passes, and so does a step that takes its gradients
    with torch.autograd.grad."""
    assert check_training_step(training_step)
    assert check_training_step(step_with(autograd=True))
    capsys.readouterr()
