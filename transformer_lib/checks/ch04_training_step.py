"""Checker for the core exercise of chapter 4 (``chapters/04_normalisation.ipynb``) that puts
the 2017 training recipe together once its three parts are explained: one training step of
the encoder–decoder, with the label-smoothed cross-entropy, Adam with its bias correction and
the Noam learning rate, all written by the learner.

The reference here is written out in float64, independently of the library and of
``torch.optim``; ``tests/test_checks_ch04.py`` shows that it takes the same steps as
``torch.optim.Adam`` with ``LambdaLR(noam_lambda)`` and ``LabelSmoothingLoss``."""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _as_number,
    _call,
    _Failure,
    _generator,
    _matches,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.tasks import reversal_batch, reversal_config

# The framework's optimizers and schedulers, and its ready-made losses.
_READY_MADE = ("torch.optim.*", "torch.nn.functional.cross_entropy",
               "torch.nn.functional.nll_loss", "torch.nn.CrossEntropyLoss", "torch.nn.NLLLoss",
               "torch.nn.functional.kl_div", "torch.nn.KLDivLoss")

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "training_step": Rules(allow=("EncoderDecoder",), refuse=_READY_MADE),
}

_IGNORE = -100  # the label of a position left out of the loss

# Tolerances: the student may take the log-softmax in float32 (the model is float64), as
# LabelSmoothingLoss does. That changes the loss in its 8th digit and each gradient by about
# 1e-9, which Adam's division by √v̂ makes up to 2e-6 in a parameter whose gradient is tiny.
_LOSS_TOL = 1e-5
_PARAM_ATOL, _PARAM_RTOL = 1e-5, 1e-4


# The reference -------------------------------------------------------------------------------


def _noam_rate(d_model: int, warmup: int, t: int, *, shift: int = 0,
               d_factor: bool = True) -> float:
    """The Noam rate of update ``t`` (0, 1, 2, ...), as LambdaLR applies it: t = 0 counts as 1.
    ``shift``, ``d_factor``: mistakes."""
    s = max(t + shift, 1)
    return (d_model ** -0.5 if d_factor else 1.0) * min(s ** -0.5, s * warmup ** -1.5)


def _smoothed_loss(logits: Tensor, labels: Tensor, smoothing: float, *,
                   others: str = "V", mean_over_all: bool = False) -> Tensor:
    """The mean cross-entropy against the target (1 - ε) one-hot + ε/V over the positions whose
    label is not _IGNORE, in float64. Mistakes: ``others="V-1"`` spreads ε/(V-1) over the other
    tokens only (tensor2tensor's form); ``mean_over_all`` divides by every position."""
    V = logits.shape[-1]
    log_p = torch.log_softmax(logits.double().reshape(-1, V), dim=-1)  # (N, V)
    labels = labels.reshape(-1)  # (N,)
    kept = labels != _IGNORE  # (N,)
    one_hot = (torch.arange(V) == labels.clamp(min=0)[:, None]).double()  # (N, V)
    if others == "V":
        target = (1 - smoothing) * one_hot + smoothing / V
    else:
        target = (1 - smoothing) * one_hot + smoothing / (V - 1) * (1 - one_hot)
    per_position = -(target * log_p).sum(dim=-1)  # (N,)
    total = (per_position * kept).sum()
    return total / (labels.numel() if mean_over_all else kept.sum())


def _trajectory(model: EncoderDecoder, batches: list[tuple[Tensor, Tensor, Tensor]], *,
                warmup: int, lr_scale: float, smoothing: float, betas: tuple[float, float],
                eps: float, bias_correction: str = "t+1", noam_shift: int = 0,
                d_factor: bool = True, eps_inside: bool = False, others: str = "V",
                mean_over_all: bool = False, accumulate: bool = False,
                use_scale: bool = True, beta2: float | None = None,
                loss_after: bool = False) -> list[tuple[float, list[Tensor]]]:
    """The reference's training steps on a copy of ``model`` (the defaults), or those of one
    usual mistake (any other keyword): for each batch, the loss the step returns and every
    parameter after the update.

    ``bias_correction``: ``"t+1"`` (right), ``"none"``, or ``"max(t,1)"`` (the Noam count);
    ``noam_shift=1``: the rate of update t + 1; ``d_factor=False``: no d_model^-0.5;
    ``eps_inside``: √(v̂ + ε); ``others``, ``mean_over_all``: see :func:`_smoothed_loss`;
    ``accumulate``: gradients summed over the calls; ``use_scale=False``: lr_scale ignored;
    ``beta2``: another β2; ``loss_after``: the loss of the batch after the update."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    beta1, b2 = betas[0], (betas[1] if beta2 is None else beta2)
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    summed = [torch.zeros_like(p) for p in params]
    steps = []
    for t, (src, tgt_in, tgt_out) in enumerate(batches):
        loss = _smoothed_loss(model(src, tgt_in), tgt_out, smoothing, others=others,
                              mean_over_all=mean_over_all)
        grads = torch.autograd.grad(loss, params)
        rate = ((lr_scale if use_scale else 1.0)
                * _noam_rate(model.config.d_model, warmup, t, shift=noam_shift,
                             d_factor=d_factor))
        n = {"t+1": t + 1, "max(t,1)": max(t, 1)}.get(bias_correction)
        with torch.no_grad():
            for p, g, m, v, s in zip(params, grads, first, second, summed):
                if accumulate:
                    s.add_(g)
                    g = s
                m.mul_(beta1).add_((1 - beta1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                m_hat = m if n is None else m / (1 - beta1 ** n)
                v_hat = v if n is None else v / (1 - b2 ** n)
                root = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
                p.sub_(rate * m_hat / root)
            if loss_after:
                loss = _smoothed_loss(model(src, tgt_in), tgt_out, smoothing)
        steps.append((loss.item(), [p.detach().clone() for p in params]))
    return steps


# The checker -----------------------------------------------------------------------------------


def _model(seed: int) -> EncoderDecoder:
    """A tiny post-norm EncoderDecoder in float64, without dropout, in train mode, seeded (the
    global random state is untouched)."""
    config = reversal_config(n_symbols=6, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             dropout=0.0, max_seq_len=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = EncoderDecoder(config)
    return model.double().train()


def _batches(g: torch.Generator, V: int, n: int, ignored: int) -> list[tuple[Tensor, ...]]:
    """``n`` reversal batches (B, T) = (3, 5), each with ``ignored`` labels set to _IGNORE."""
    batches = []
    for _ in range(n):
        src, tgt_in, tgt_out = reversal_batch(3, 5, V, g)
        flat = tgt_out.flatten()  # (B·T,)
        flat[torch.randperm(flat.numel(), generator=g)[:ignored]] = _IGNORE
        batches.append((src, tgt_in, flat.view_as(tgt_out)))
    return batches


# The cases: (model seed, updates, labels -100 per batch, settings); their descriptions are
# _case_titles(), in the same order.
_CASES = [
    (0, 4, 2, {"warmup": 2, "lr_scale": 1.0, "smoothing": 0.1, "betas": (0.9, 0.98),
               "eps": 1e-9}),
    (1, 3, 3, {"warmup": 3, "lr_scale": 0.5, "smoothing": 0.2, "betas": (0.8, 0.95),
               "eps": 1e-6}),
]


def _case_titles() -> list[str]:
    return [say("warmup 2, the 2017 betas and smoothing: four updates (the rate rises, then "
                "decays), two labels -100 per batch"),
            say("lr_scale 0.5, smoothing 0.2, betas (0.8, 0.95), ε 1e-6, warmup 3: three "
                "updates, three labels -100 per batch")]


def _case_inputs() -> list[tuple[str, EncoderDecoder, list[tuple[Tensor, ...]], dict]]:
    """(description, model, batches, settings) of every case, the batches drawn in order
    from the checker's generator."""
    g = _generator()
    found = []
    for title, (seed, steps, ignored, settings) in zip(_case_titles(), _CASES):
        model = _model(seed)
        found.append((title, model, _batches(g, model.config.tgt_vocab_size, steps, ignored),
                      settings))
    return found


def _mistakes(settings: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The usual mistakes, as keywords of :func:`_trajectory`, with their hints."""
    return [
        ({"bias_correction": "none"},
         say("Adam's moments start at 0, so for the first updates they are too small: divide "
             "m by 1 - β1^(t+1) and v by 1 - β2^(t+1) (the bias correction)")),
        ({"bias_correction": "max(t,1)"},
         say("the bias correction of update t uses t + 1 (1, 2, 3, ...), while the Noam rate "
             "uses max(t, 1): the two counts differ from the second update on")),
        ({"noam_shift": 1},
         say("the Noam rate is one update late: update t (0, 1, 2, ...) uses noam(max(t, 1)), "
             "as LambdaLR does; t + 1 belongs to the bias correction only")),
        ({"d_factor": False}, say("the Noam rate starts with the factor d_model^-0.5 "
                                  "(model.config.d_model)")),
        ({"eps_inside": True},
         say("ε goes after the square root, √v̂ + ε, as torch.optim.Adam adds it, not under "
             "it")),
        ({"others": "V-1"},
         say("that is tensor2tensor's smoothing, ε/(V-1) on each wrong token; this chapter's "
             "target is (1 - ε) one-hot + ε/V on every token, the true one included")),
        ({"mean_over_all": True},
         say("the positions labelled {ignored} were counted in the mean: divide the sum of the "
             "kept positions' losses by the number of kept positions", ignored=_IGNORE)),
        ({"accumulate": True},
         say("the gradients of the earlier calls were added to this one's: backward() "
             "accumulates into .grad, so zero the gradients (or set them to None) before each "
             "backward")),
        ({"use_scale": False},
         say("lr_scale was ignored: the rate is lr_scale · noam(t)")),
        ({"beta2": 0.999},
         say("β2 = 0.999 is PyTorch's default; use the betas given (β2 = {beta2} here)",
             beta2=settings["betas"][1])),
        ({"betas": (0.9, 0.98)},
         say("the betas given, {betas}, were not used", betas=settings["betas"])),
        ({"smoothing": 0.1},
         say("the smoothing given, {smoothing}, was not used", smoothing=settings["smoothing"])),
        ({"loss_after": True},
         say("return the loss computed before the update, the one the gradients came from")),
    ]


def _nan_hint() -> str:
    return say("Adam's bias correction divides by 1 - β^(t+1): with the count t starting at 0, "
               "1 - β^0 = 0 gives inf and NaN at the first update")


def check_training_step(training_step: Callable[..., float]) -> CheckResult:
    """Check ``training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0,
    smoothing=0.1, betas=(0.9, 0.98), eps=1e-9) -> float``: one update of an
    :class:`~transformer_lib.encoder_decoder.EncoderDecoder` with the label-smoothed
    cross-entropy (target (1 - ε) one-hot + ε/V, positions labelled -100 left out of the
    mean) and Adam written out (bias correction with t + 1, ε after the square root, no weight
    decay) at the rate ``lr_scale · noam(t)``, update t = 0, 1, 2, ... counting as LambdaLR's
    step t; ``state`` keeps the step count and the moments between calls. Returns the loss
    before the update.

    A tiny model in float64 without dropout takes three or four steps on fixed batches; after
    each, the returned loss and every parameter are compared with the reference's.

    Args:
        training_step: the function to check (the exercise's), called on the checker's own
            model and batches.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    def case(model: EncoderDecoder, batches: list[tuple[Tensor, ...]],
             settings: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            want = _trajectory(model, batches, **settings)
            wrong: list[tuple[list, str]] | None = None

            def mistakes() -> list[tuple[list, str]]:
                nonlocal wrong
                if wrong is None:  # only when something is wrong: the passing check is quick
                    wrong = [(_trajectory(model, batches, **{**settings, **change}), hint)
                             for change, hint in _mistakes(settings)]
                return wrong

            student, state = copy.deepcopy(model), {}
            step = functools.partial(training_step, **settings)
            names = [n for n, _ in student.named_parameters()]
            with torch.random.fork_rng(devices=[]):  # whatever the step draws leaves no trace
                for t, (src, tgt_in, tgt_out) in enumerate(batches):
                    before = [p.detach().clone() for p in student.parameters()]
                    got = _call(step, [student, src, tgt_in, tgt_out, state],
                                ["model", "src", "tgt_in", "tgt_out", "state"])
                    _check_loss(got, t, want[t][0],
                                lambda t=t: [(w[t][0], h) for w, h in mistakes()])
                    _check_params(student, names, t, before, want[t][1], mistakes)
        return run

    return _run("training_step", training_step,
                [(title, case(model, batches, settings))
                 for title, model, batches, settings in _case_inputs()],
                rules=RULES["training_step"])


def _check_loss(got: Any, t: int, want: float,
                mistakes: Callable[[], list[tuple[float, str]]]) -> None:
    """The value returned by update ``t``: a Python float equal to the reference's loss
    (``mistakes()``: the losses of the usual mistakes, with their hints)."""
    what = say("the loss returned by update t = {t}", t=t)
    if isinstance(got, Tensor):
        raise _Failure(say("{what} is a tensor of shape {shape}, not a Python float",
                           what=what, shape=tuple(got.shape)),
                       say("return loss.item(): a float, which does not keep the step's graph "
                           "alive"))
    value = _as_number(got, what)
    if value != value:
        raise _Failure(say("NaN appeared in {what} (expected {want:.6g})", what=what, want=want))
    if abs(value - want) <= _LOSS_TOL * abs(want):
        return
    known = next((hint for wrong, hint in mistakes()
                  if abs(value - wrong) <= _LOSS_TOL * abs(wrong)), None)
    raise _Failure(say("wrong value for {what}: expected {want:.6g}, got {value:.6g}",
                       what=what, want=want, value=value), known)


def _check_params(model: EncoderDecoder, names: list[str], t: int, before: list[Tensor],
                  want: list[Tensor], mistakes: Callable[[], list[tuple[list, str]]]) -> None:
    """Every parameter of ``model`` after update ``t`` equals the reference's (``before``: the
    parameters before the update)."""
    got = [p.detach() for p in model.parameters()]
    if len(got) != len(want) or any(a.shape != b.shape or a.dtype != b.dtype
                                    for a, b in zip(got, want)):
        raise _Failure(say("after update t = {t} the model's parameters changed in number, "
                           "shape or dtype", t=t),
                       say("update each parameter in place (p.sub_(...) under torch.no_grad()), "
                           "keeping its shape and dtype"))
    for name, a in zip(names, got):
        if not torch.isfinite(a).all():
            raise _Failure(say("NaN or inf appeared in the parameter `{name}` after update "
                               "t = {t}", name=name, t=t), _nan_hint())
    wrong = [(name, a, b) for name, a, b in zip(names, got, want)
             if not torch.allclose(a, b, rtol=_PARAM_RTOL, atol=_PARAM_ATOL)]
    if not wrong:
        return
    if all(torch.equal(a, b) for a, b in zip(got, before)):
        raise _Failure(say("update t = {t} left every parameter as it was", t=t),
                       say("change the model's own parameter tensors in place under "
                           "torch.no_grad() (p -= ... or p.sub_(...)): `p = p - ...` makes a "
                           "new tensor and leaves the model's as it was"))
    name, a, b = wrong[0]
    flat = torch.cat([p.flatten() for p in got])
    known = next((hint for steps, hint in mistakes()
                  if _matches(flat, torch.cat([p.flatten() for p in steps[t][1]]),
                              _PARAM_ATOL, _PARAM_RTOL)), None)
    raise _Failure(say("after update t = {t}, {wrong} of {n} parameter tensors are wrong, the "
                       "first `{name}` (off by up to {off:.3g})", t=t, wrong=len(wrong),
                       n=len(got), name=name, off=(a - b).abs().max().item()),
                   known)
