"""Checkers for the core of chapter 4 (``chapters/04_normalisation.ipynb``), written by the
learner where the chapter builds it: LayerNorm and RMSNorm as functions, with the dtype rule
(statistics in at least float32, the result in the input's dtype).

The references compute in float64 from the formulas, independently of the library."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import CheckResult, _call, _compare, _generator, _run
from transformer_lib.checks._messages import say

# The framework's norms, in any of their spellings.
_NORMS = ("torch.nn.functional.layer_norm", "torch.layer_norm", "torch.native_layer_norm",
          "torch.nn.LayerNorm", "torch.nn.functional.rms_norm", "torch.rms_norm",
          "torch.nn.RMSNorm", "torch.nn.functional.group_norm",
          "torch.nn.functional.instance_norm", "torch.nn.functional.normalize")

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "layer_norm": Rules(refuse=_NORMS),
    "rms_norm": Rules(refuse=_NORMS),
}


def _layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float, *, unbiased: bool = False,
                eps_outside: bool = False, centre: bool = True, dim: int = -1,
                swap: bool = False) -> Tensor:
    """LayerNorm in float64 (the defaults) and its usual mistakes."""
    h = x.double()
    g, b = (beta, gamma) if swap else (gamma, beta)
    mean = h.mean(dim=dim, keepdim=True) if centre else torch.zeros_like(h)
    var = h.var(dim=dim, keepdim=True, unbiased=unbiased) if centre else (
        h.pow(2).mean(dim=dim, keepdim=True))
    scale = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    return ((h - mean) / scale * g.double() + b.double()).to(x.dtype)


def _rms_norm(x: Tensor, g: Tensor, eps: float, *, centre: bool = False,
              eps_outside: bool = False, dim: int = -1, scale: bool = True) -> Tensor:
    """RMSNorm in float64 (the defaults) and its usual mistakes."""
    h = x.double()
    if centre:
        h = h - h.mean(dim=dim, keepdim=True)
    mean_square = h.pow(2).mean(dim=dim, keepdim=True)
    root = mean_square.sqrt() + eps if eps_outside else (mean_square + eps).sqrt()
    out = h / root * (g.double() if scale else 1.0)
    return out.to(x.dtype)


def _inputs(g: torch.Generator) -> list[tuple[str, Tensor, float]]:
    """(title, x, eps) of every case: shapes, offsets, a tiny spread where eps matters, an
    fp16 channel whose square overflows fp16, and bf16."""
    spread = 3.0 * torch.randn(2, 5, 8, generator=g) + 1.5  # (B, T, C)
    tiny = 1.0 + 1e-3 * torch.randn(3, 16, generator=g, dtype=torch.float64)  # (N, C)
    outlier = torch.randn(4, 64, generator=g)
    outlier[:, 0] = 300.0  # 300² = 90,000 > 65,504: inf in fp16
    return [
        (say("(B, T, C) = (2, 5, 8), an offset of 1.5"), spread, 1e-5),
        (say("one position, C = 3"), torch.tensor([[4.9, 5.0, 5.1]]), 1e-5),
        (say("a spread of 0.001 around 1 (float64): eps matters to LayerNorm"), tiny, 1e-5),
        (say("values of size 0.001 (float64): eps matters to RMSNorm"), tiny - 1.0, 1e-6),
        (say("float16 with one channel at 300: its square overflows fp16"), outlier.half(),
         1e-5),
        (say("bfloat16: the result stays bfloat16"),
         (3.0 * torch.randn(2, 3, 32, generator=g) + 0.5).bfloat16(), 1e-5),
    ]


def _tolerance(x: Tensor) -> float:
    return {torch.float16: 4e-3, torch.bfloat16: 3e-2}.get(x.dtype, 1e-5)


def _fp16_hint() -> str:
    return say("the statistics overflowed: 300² is inf in float16. Compute the mean and the "
               "mean square in float32 (x.float()) and cast only the result back to x's dtype")


def check_layer_norm(layer_norm: Callable[..., Tensor]) -> CheckResult:
    """Check ``layer_norm(x, gamma, beta, eps)``: every position of ``x`` ``(..., C)``
    normalised over its C channels (mean 0, the variance divided by C, ``eps`` added to the
    variance under the root), then scaled by ``gamma`` and shifted by ``beta`` ``(C,)``; the
    statistics in at least float32 and the result in the dtype of ``x``.

    Args:
        layer_norm: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(x: Tensor, eps: float) -> Callable[[], None]:
        C = x.shape[-1]
        gamma = (1.0 + 0.3 * torch.randn(C, generator=g, dtype=torch.float64)).to(x.dtype)
        beta = (0.2 * torch.randn(C, generator=g, dtype=torch.float64)).to(x.dtype)

        def run() -> None:
            got = _call(layer_norm, [x, gamma, beta, eps], ["x", "gamma", "beta", "eps"])
            mistakes = [
                (_layer_norm(x, gamma, beta, eps, unbiased=True),
                 say("the variance was divided by C - 1: LayerNorm divides by C "
                     "(var(unbiased=False), as nn.LayerNorm does)")),
                (_layer_norm(x, gamma, beta, eps, eps_outside=True),
                 say("eps was added after the square root: it goes under it, √(σ² + ε)")),
                (_layer_norm(x, gamma, beta, eps, centre=False),
                 say("the mean was not subtracted: LayerNorm centres each position first")),
                (_layer_norm(x, gamma, beta, eps, swap=True),
                 say("gamma and beta are swapped: gamma scales, beta shifts")),
                (_layer_norm(x, gamma, beta, eps, dim=0) if x.shape[0] > 1 else x,
                 say("the statistics ran over the wrong axis: each position is normalised "
                     "over its own C channels, the last axis")),
            ]
            tol = _tolerance(x)
            _compare(got, _layer_norm(x, gamma, beta, eps), say("the output"),
                     letters=say("(..., C)"), atol=tol, rtol=tol, mistakes=mistakes,
                     nan_hint=_fp16_hint(),
                     properties=[_not_constant(x, beta)])
        return run

    return _run("layer_norm", layer_norm,
                [(title, case(x, eps)) for title, x, eps in _inputs(g)],
                rules=RULES["layer_norm"])


def check_rms_norm(rms_norm: Callable[..., Tensor]) -> CheckResult:
    """Check ``rms_norm(x, g, eps)``: every position of ``x`` ``(..., C)`` divided by the
    root of its mean square plus ``eps`` (no mean subtracted, no shift) and scaled by ``g``
    ``(C,)``; the mean square in at least float32 and the result in the dtype of ``x``.

    Args:
        rms_norm: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    gen = _generator()

    def case(x: Tensor, eps: float) -> Callable[[], None]:
        C = x.shape[-1]
        weight = (1.0 + 0.3 * torch.randn(C, generator=gen, dtype=torch.float64)).to(x.dtype)

        def run() -> None:
            got = _call(rms_norm, [x, weight, eps], ["x", "g", "eps"])
            mistakes = [
                (_rms_norm(x, weight, eps, centre=True),
                 say("that divides by the standard deviation: RMSNorm subtracts no mean, it "
                     "divides by the root of the mean square")),
                (_rms_norm(x, weight, eps, eps_outside=True),
                 say("eps was added after the square root: it goes under it, "
                     "√(mean(x²) + ε)")),
                (_rms_norm(x, weight, eps, scale=False),
                 say("the learned scale g was not applied: multiply the normalised x by g")),
                (_rms_norm(x, weight, eps, dim=0) if x.shape[0] > 1 else x,
                 say("the mean square ran over the wrong axis: each position over its own C "
                     "channels, the last axis")),
            ]
            tol = _tolerance(x)
            _compare(got, _rms_norm(x, weight, eps), say("the output"),
                     letters=say("(..., C)"), atol=tol, rtol=tol, mistakes=mistakes,
                     nan_hint=_fp16_hint(),
                     properties=[_not_constant(x, torch.zeros_like(weight))])
        return run

    return _run("rms_norm", rms_norm,
                [(title, case(x, eps)) for title, x, eps in _inputs(gen)],
                rules=RULES["rms_norm"])


def _not_constant(x: Tensor, shift: Tensor) -> Callable[[Tensor], str | None]:
    """A position whose output is only the shift (0 for RMSNorm, beta for LayerNorm) was
    divided by an infinite statistic: an overflow in float16."""
    def check(got: Tensor) -> str | None:
        if x.dtype != torch.float16 or got.shape != x.shape:
            return None
        lost = (got.detach() == shift).all(dim=-1) & (x != 0).any(dim=-1)
        return _fp16_hint() if lost.any() else None
    return check
