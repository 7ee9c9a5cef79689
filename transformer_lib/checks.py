"""Checkers for the exercises: each compares a student's function with the library's reference.

Call a checker with the function to check, e.g. ``check_softmax(softmax)``. It runs the
function on several seeded inputs, edge cases included, prints a short verdict (each check
passed, or what is wrong in words a student can act on) and returns a :class:`CheckResult`,
truthy when every check passed, so a reference notebook can ``assert check_softmax(softmax)``.

A checker never raises. A function that raises gets the exception's one-line summary, and a
stub that still raises ``NotImplementedError`` is "not attempted yet", so a student's notebook
always runs to the end. Inputs come from a private generator: a check leaves the global random
state alone.

One checker per exercise; the machinery they share (calling the student's function safely,
comparing tensors, recognising common mistakes) is the first half of this module.
"""
from __future__ import annotations

import math
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from transformer_lib.attention import (
    MultiHeadAttention,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)

__all__ = [
    "CheckResult",
    "check_mha_shapes",
    "check_softmax",
    "check_attention",
    "check_repeat_kv",
    "check_split_heads",
    "check_merge_heads",
    "check_causal_mask",
    "check_masked_softmax",
    "check_softmax_jacobian",
    "check_reversal_targets",
    "check_mirror_alignment",
    "check_transform_qk",
    "check_mha_param_count",
    "check_head_weight",
    "check_multi_head",
]

# fp32 inputs, and a student may order the operations differently from the reference
# (q / √D before or after the matmul, max subtracted or not): a few ulps of the scores.
ATOL = 1e-5
RTOL = 1e-4
SEED = 0


# Results ----------------------------------------------------------------------------------


def _cell_number() -> int | None:
    """The number of the notebook cell running now (None outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


@dataclass
class CheckResult:
    """What a checker found; truthy when every check passed."""

    exercise: str  # the function checked, e.g. "softmax"
    passed: bool  # every check passed
    attempted: bool  # False while the function is still the stub (raises NotImplementedError)
    report: str  # the verdict, as printed
    failures: list[str] = field(default_factory=list)  # one message per failed check
    _cell: int | None = field(default_factory=lambda: _cell_number(), repr=False, compare=False)

    def _ipython_display_(self) -> None:
        # A check cell ends with the checker's call, whose report is printed just above:
        # in that cell the result shows nothing more. Displayed in a later cell, it prints
        # the report again.
        if self._cell is None or self._cell != _cell_number():
            print(self.report)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.report

    def __repr__(self) -> str:
        state = "passed" if self.passed else "not attempted yet" if not self.attempted else (
            f"{len(self.failures)} check(s) failed")
        return f"CheckResult({self.exercise}: {state})"


class _Failure(Exception):
    """One check failed: ``message`` says what is wrong, ``hint`` (optional) how to fix it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class _NotAttempted(Exception):
    """The function, or one it calls (``where``), still raises NotImplementedError."""

    def __init__(self, where: str | None):
        super().__init__(where)
        self.where = where


Case = tuple[str, Callable[[], None]]  # (what the check does, run it: raises _Failure)


def _run(exercise: str, fn: Any, cases: Sequence[Case]) -> CheckResult:
    """Run every case, print the verdict, return it. Never raises."""
    name = getattr(fn, "__name__", exercise)
    if not callable(fn):
        head = f"{exercise}: expected a function to check, got {_describe(fn)}."
        return _finish(exercise, False, False, [head], [head])
    lines: list[str] = []
    failures: list[str] = []
    hints: set[str] = set()
    for description, run in cases:
        try:
            run()
        except _NotAttempted as exc:
            if exc.where in (None, name, "<lambda>"):
                head = (f"{exercise}: not attempted yet: `{name}` still raises "
                        "NotImplementedError. Replace `# YOUR CODE HERE` and the `raise` line "
                        "with your code, then run this cell again.")
            else:
                head = (f"{exercise}: not attempted yet: `{name}` calls `{exc.where}`, which still "
                        f"raises NotImplementedError. Complete `{exc.where}` first.")
            return _finish(exercise, False, False, [head], [head])
        except _Failure as exc:
            failures.append(f"{description}: {exc.message}")
            lines.append(f"  ✗ {description}: {exc.message}")
            if exc.hint and exc.hint not in hints:  # each hint once
                hints.add(exc.hint)
                lines.append(f"      Hint: {exc.hint}")
        except Exception as exc:  # noqa: BLE001 - whatever happens, the notebook goes on
            message = f"could not be checked ({_one_line(exc)})"
            failures.append(f"{description}: {message}")
            lines.append(f"  ✗ {description}: {message}")
        else:
            lines.append(f"  ✓ {description}")
    n = len(cases)
    if failures:
        head = f"{exercise}: {n - len(failures)} of {n} checks passed."
    else:
        head = f"{exercise}: all {n} checks passed."
    return _finish(exercise, not failures, True, [head, *lines], failures)


def _finish(exercise: str, passed: bool, attempted: bool, lines: list[str],
            failures: list[str]) -> CheckResult:
    report = "\n".join(lines)
    print(report)
    return CheckResult(exercise, passed, attempted, report, failures)


# Calling the student's function -------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)

# Error messages that have a usual cause, and what to do about it.
_ERROR_HINTS = [
    ("view size is not compatible",
     "after a transpose the tensor is no longer contiguous, so .view cannot merge its axes: "
     "use .reshape (or .contiguous().view)"),
    ("must match the size of tensor",
     "two shapes do not broadcast: a reduction such as .sum(dim) or .amax(dim) drops that axis "
     "unless you pass keepdim=True"),
    ("cannot be multiplied",
     "check which axes the matmul contracts: the scores are q @ kᵀ, with k.transpose(-2, -1)"),
    ("batch2 tensor",
     "check which axes the matmul contracts: the scores are q @ kᵀ, with k.transpose(-2, -1)"),
    ("expected scalar type",
     "the two tensors have different dtypes: convert one with .to(other.dtype)"),
]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    summary = type(exc).__name__ + (f": {text[0]}" if text else "")
    return summary if len(summary) <= 200 else summary[:197] + "..."


def _student_line(exc: BaseException) -> str | None:
    """The line of the student's code where ``exc`` was raised (not torch's, not ours)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__]
    return frames[-1].line.strip() if frames and frames[-1].line else None


def _call(fn: Callable, args: Sequence[Any], names: Sequence[str]) -> Any:
    """``fn(*args)`` on copies of the tensor arguments.

    Raises _NotAttempted for NotImplementedError, _Failure for any other exception and for an
    argument changed in place."""
    inputs = [a.clone() if isinstance(a, Tensor) else a for a in args]
    try:
        result = fn(*inputs)
    except NotImplementedError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        raise _NotAttempted(frames[-1].name if frames else None) from None
    except Exception as exc:  # noqa: BLE001 - reported, never raised into the notebook
        line = _student_line(exc)
        where = f" at `{line}`" if line else ""
        hint = next((h for pattern, h in _ERROR_HINTS if pattern in str(exc)), None)
        raise _Failure(f"raised {_one_line(exc)}{where}", hint) from None
    for arg, original, name in zip(inputs, args, names):
        if isinstance(arg, Tensor) and not torch.equal(arg, original):
            raise _Failure(f"changed its input `{name}` in place",
                           "work on new tensors: write `x = x - m` rather than `x -= m` or "
                           "`x.sub_(m)`; the caller still needs its tensor")
    return result


def _expect_value_error(fn: Callable, args: Sequence[Any], reason: str,
                        must_name: Sequence[str]) -> None:
    """``fn(*args)`` must raise a ValueError whose message names ``must_name``."""
    try:
        result = fn(*args)
    except NotImplementedError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        raise _NotAttempted(frames[-1].name if frames else None) from None
    except ValueError as exc:
        missing = [v for v in must_name if v not in str(exc)]
        if missing:
            raise _Failure(f"raised a ValueError, but its message ({str(exc)!r}) does not give "
                           f"the sizes {', '.join(must_name)}",
                           "say what is wrong with which values, e.g. "
                           "\"C (10) must be divisible by n_heads (3)\"") from None
        return
    except Exception as exc:  # noqa: BLE001
        raise _Failure(f"raised {_one_line(exc)} instead of a ValueError",
                       f"check the sizes first: {reason}; raise a ValueError that says "
                       "so") from None
    raise _Failure(f"returned {_describe(result)} instead of raising a ValueError ({reason})")


def _describe(value: Any) -> str:
    if value is None:
        return "None (is a `return` missing?)"
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a value of type {type(value).__name__}"


# Comparing tensors --------------------------------------------------------------------------


def _where(idx: Sequence[int], axes: Sequence[str] | None) -> str:
    idx = [int(i) for i in idx]
    if axes and len(axes) == len(idx):
        return ", ".join(f"{a} {i}" for a, i in zip(axes, idx))
    return f"position {tuple(idx)}"


def _first(mask: Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def _matches(got: Tensor, candidate: Tensor, atol: float, rtol: float) -> bool:
    """``got`` equals a known wrong answer: close wherever both are finite, and non-finite
    only where the wrong answer is too."""
    if got.shape != candidate.shape:
        return False
    g, c = got.detach().double(), candidate.detach().double()
    finite = torch.isfinite(g) & torch.isfinite(c)
    if not finite.any() or (~torch.isfinite(g) & torch.isfinite(c)).any():
        return False
    return torch.allclose(g[finite], c[finite], atol=atol, rtol=rtol)


def _compare(got: Any, expected: Tensor, what: str, *, letters: str | None = None,
             axes: Sequence[str] | None = None, atol: float = ATOL, rtol: float = RTOL,
             nan_hint: str | None = None,
             properties: Sequence[Callable[[Tensor], str | None]] = (),
             mistakes: Sequence[tuple[Tensor, str]] = (),
             shape_hints: dict[tuple[int, ...], str] | None = None) -> None:
    """Raise _Failure for the first thing wrong with ``got``.

    In order: not a tensor, shape, dtype, NaN or inf, each of ``properties`` (a function
    returning a message or None), values. ``mistakes`` are (wrong answer, hint) pairs: when
    ``got`` matches one, its hint says what went wrong."""
    if not isinstance(got, Tensor):
        raise _Failure(f"{what} should be a tensor, got {_describe(got)}")
    if tuple(got.shape) != tuple(expected.shape):
        named = f"{letters} = " if letters else ""
        hint = (shape_hints or {}).get(tuple(got.shape))
        raise _Failure(f"wrong shape for {what}: expected {named}{tuple(expected.shape)}, "
                       f"got {tuple(got.shape)}", hint)
    if got.dtype != expected.dtype:
        raise _Failure(f"wrong dtype for {what}: expected {expected.dtype}, got {got.dtype}",
                       "keep the dtype of the inputs")
    g, e = got.detach().double(), expected.double()
    problem, hint = None, None
    for bad, name in ((torch.isnan(g) & ~torch.isnan(e), "NaN"),
                      (torch.isinf(g) & ~torch.isinf(e), "inf")):
        if bad.any():
            idx = _first(bad)
            problem = (f"{name} appeared in {what} at {_where(idx, axes)} "
                       f"(expected {e[idx].item():.4g})")
            hint = nan_hint
            break
    for prop in properties if problem is None else ():
        problem = prop(g)
        if problem:
            break
    if problem is None:
        close = torch.isclose(g, e, rtol=rtol, atol=atol)
        if not close.all():
            idx = _first(~close)
            problem = (f"wrong values in {what} at {_where(idx, axes)}: expected "
                       f"{e[idx].item():.4g}, got {g[idx].item():.4g} "
                       f"({int((~close).sum())} of {close.numel()} entries wrong)")
    if problem is not None:
        known = next((h for wrong, h in mistakes if _matches(got, wrong, atol, rtol)), None)
        raise _Failure(problem, known or hint)


def _generator(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Shapes of a multi-head attention layer ---------------------------------------------------


def check_mha_shapes(mha_shapes: Callable[..., tuple]) -> CheckResult:
    """Check ``mha_shapes(B, T, S, C, H, H_kv) -> (out, last_weights, k_proj.weight)`` shapes
    against a :class:`transformer_lib.attention.MultiHeadAttention` run on ``x (B, T, C)``
    attending to a memory ``(B, S, C)``: multi-head, grouped-query and multi-query layers."""

    def case(B: int, T: int, S: int, C: int, H: int, H_kv: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(mha_shapes, [B, T, S, C, H, H_kv], ["B", "T", "S", "C", "H", "H_kv"])
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                raise _Failure(f"returned {_describe(got)}: return three shapes, those of the "
                               "output, of last_weights and of k_proj.weight")
            with torch.random.fork_rng(devices=[]):  # the layer's init leaves no trace
                torch.manual_seed(SEED)
                mha = MultiHeadAttention(C, H, H_kv)
                with torch.no_grad():
                    out = mha(torch.randn(B, T, C), torch.randn(B, S, C))
            D = C // H
            expected = {
                "the output": (tuple(out.shape), {
                    (B, S, C): "the output has one row per query: T, whatever S is",
                    (B, H, T, D): "o_proj merges the heads back: (B, T, C)",
                    (B, T, H, D): "o_proj merges the heads back: (B, T, C)",
                }),
                "last_weights": (tuple(mha.last_weights.shape), {
                    (B, H, S, T): "one row per query and one column per key: (B, H, T, S)",
                    (B, H_kv, T, S): "every query head has its own weights: H of them, not "
                                     "H_kv (the key/value heads are repeated before attention)",
                    (B, T, S): "there is one set of weights per head: (B, H, T, S)",
                }),
                "k_proj.weight": (tuple(mha.k_proj.weight.shape), {
                    (C, H_kv * D): "nn.Linear stores its weight as (out_features, in_features)",
                    (H * D, C): f"k_proj makes only the H_kv = {H_kv} key/value head(s), of width "
                                f"D = {D}: (H_kv · D, C)",
                }),
            }
            for (what, (want, hints)), shape in zip(expected.items(), got):
                try:
                    shape = tuple(int(n) for n in shape)
                except (TypeError, ValueError):
                    raise _Failure(f"the shape of {what} should be a tuple of ints, "
                                   f"got {_describe(shape)}") from None
                if shape != want:
                    raise _Failure(f"wrong shape of {what}: expected {want}, got {shape}",
                                   hints.get(shape))
        return run

    return _run("mha_shapes", mha_shapes, [
        ("grouped-query: B=2, T=10, S=4, C=48, H=6, H_kv=3", case(2, 10, 4, 48, 6, 3)),
        ("multi-head: B=1, T=5, S=5, C=32, H=4, H_kv=4", case(1, 5, 5, 32, 4, 4)),
        ("multi-query: B=3, T=7, S=9, C=64, H=8, H_kv=1", case(3, 7, 9, 64, 8, 1)),
    ])


# Softmax ----------------------------------------------------------------------------------


def _sums_to_one(dim: int) -> Callable[[Tensor], str | None]:
    def prop(g: Tensor) -> str | None:
        sums = g.sum(dim=dim)
        bad = (sums - 1).abs() > 1e-4
        if bad.any():
            idx = _first(bad)
            return (f"the values along dim={dim} do not sum to 1: the slice at {idx} sums "
                    f"to {sums[idx].item():.4g}")
        return None
    return prop


def check_softmax(softmax: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``softmax(x, dim)`` against ``torch.softmax``.

    Random inputs along the last, the first and a middle dimension; inputs of magnitude 1000,
    which overflow (or underflow) a softmax that does not subtract the maximum first; and
    ``-inf`` entries, the blocked scores of a mask, which must get probability 0."""
    g = _generator()
    x = 3 * torch.randn(4, 7, generator=g)  # (4, 7)
    blocked = x.clone()
    blocked[:, 1::3] = float("-inf")  # a few blocked scores in every row, never a whole row
    overflow = ("exp(1000) overflows to inf, and inf / inf is NaN: subtract the maximum along "
                "`dim` first; softmax(x) = softmax(x - max(x)) and the largest exp is then 1")
    underflow = ("exp(-1000) underflows to 0, and 0 / 0 is NaN: subtract the maximum along "
                 "`dim` first; the largest exp is then 1")

    def case(x: Tensor, dim: int, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(softmax, [x, dim], ["x", "dim"])
            wrong_dims = [(torch.softmax(x, d),
                           f"these values sum to 1 along dim={d}: normalise along the `dim` "
                           f"argument (here {dim}), not a fixed dimension")
                          for d in range(x.dim()) if d != dim % x.dim()]
            whole = torch.softmax(x.flatten(), 0).view_as(x)
            _compare(got, torch.softmax(x, dim), "the output", nan_hint=nan_hint,
                     properties=[_sums_to_one(dim)],
                     mistakes=[*wrong_dims,
                               (whole, "you normalised over the whole tensor: divide by the sum "
                                       "along `dim` only (.sum(dim=dim, keepdim=True))")])
        return run

    return _run("softmax", softmax, [
        ("random scores (4, 7), dim=-1", case(x, -1)),
        ("dim=0 of a (5, 3) tensor", case(torch.randn(5, 3, generator=g), 0)),
        ("dim=1 of a (2, 3, 5) tensor", case(torch.randn(2, 3, 5, generator=g), 1)),
        ("large scores: x + 1000", case(x + 1000, -1, overflow)),
        ("very negative scores: x - 1000", case(x - 1000, -1, underflow)),
        ("-inf entries (blocked scores) get probability 0", case(blocked, -1)),
    ])


# Scaled dot-product attention -------------------------------------------------------------

_ATT_AXES = ("batch", "head", "query", "key")


def _no_weight_on_blocked(mask: Tensor) -> Callable[[Tensor], str | None]:
    def prop(w: Tensor) -> str | None:
        leak = ~mask.expand_as(w) & (w.abs() > 1e-6)
        if leak.any():
            idx = _first(leak)
            return (f"masked positions receive weight: {_where(idx, _ATT_AXES)} has weight "
                    f"{w[idx].item():.3g}, but the mask blocks it (False = may not attend)")
        return None
    return prop


def _rows_sum_to_one(mask: Tensor | None) -> Callable[[Tensor], str | None]:
    def prop(w: Tensor) -> str | None:
        sums = w.sum(dim=-1)  # (B, H, T)
        visible = torch.ones_like(sums, dtype=torch.bool) if mask is None else \
            mask.any(dim=-1).expand_as(sums)  # rows with at least one key to attend to
        bad = visible & ((sums - 1).abs() > 1e-4)
        if bad.any():
            idx = _first(bad)
            return (f"rows do not sum to 1: the weights of {_where(idx, _ATT_AXES[:-1])} "
                    f"sum to {sums[idx].item():.4g}")
        return None
    return prop


def _attention_mistakes(q: Tensor, k: Tensor, mask: Tensor | None) -> list[tuple[Tensor, str]]:
    """Weights ``(B, H, T, S)`` of common wrong attention implementations, with their hints."""
    D = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (B, H, T, S)
    scores = raw / math.sqrt(D)

    def naive(s: Tensor, m: Tensor | None, dim: int = -1) -> Tensor:
        return torch.softmax(s if m is None else s.masked_fill(~m, float("-inf")), dim=dim)

    wrong = [
        (naive(raw, mask), f"the weights match scores that were not scaled: divide q·kᵀ by √D "
                           f"(√{D} = {math.sqrt(D):.3g}) before the softmax"),
        (naive(raw / D, mask), f"the weights match scores divided by D = {D}: divide by √D "
                               f"(√{D} = {math.sqrt(D):.3g}) instead"),
        (naive(scores, mask, dim=-2), "the softmax ran over the queries (dim=-2): each query's "
                                      "weights over the keys must sum to 1, so use dim=-1"),
    ]
    if mask is not None:
        wrong += [
            (torch.softmax(scores, dim=-1) * mask,
             "the blocked weights were zeroed after the softmax, so the rows no longer sum to 1: "
             "fill the blocked scores with -inf before the softmax"),
            (naive(scores, ~mask),
             "the weights match the mask inverted: True means *may attend*, so the scores to "
             "fill with -inf are where the mask is False (~mask)"),
            (naive(scores, None),
             "the weights match attention without the mask: fill the blocked scores with -inf "
             "before the softmax"),
        ]
        if not mask.any(dim=-1).all():
            finite = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), -1)
            wrong.append((finite, "a query with no visible key must get zero weights, not a "
                                  "uniform average over the blocked keys"))
    return wrong


def check_attention(attention: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check ``attention(q, k, v, mask) -> (out, weights)`` against
    :func:`transformer_lib.attention.scaled_dot_product_attention`.

    Without a mask, with a causal ``(T, S)`` mask (True = may attend) broadcast over batch and
    heads, with a padding mask ``(B, 1, 1, S)`` and values of another width, with large scores
    (a softmax that does not subtract the maximum overflows), and with a query that may attend
    to no key at all, which must get zero weights and a zero output rather than NaN."""
    g = _generator()
    B, H, T, S, D = 2, 3, 4, 6, 8
    q = torch.randn(B, H, T, D, generator=g)  # (B, H, T, D)
    k = torch.randn(B, H, S, D, generator=g)  # (B, H, S, D)
    v = torch.randn(B, H, S, D, generator=g)  # (B, H, S, D)
    v5 = torch.randn(B, H, S, 5, generator=g)  # (B, H, S, Dv) with Dv = 5
    causal = causal_mask(T, S)  # (T, S)
    padding = torch.ones(B, 1, 1, S, dtype=torch.bool)  # (B, 1, 1, S)
    padding[1, ..., 3:] = False  # sequence 1 has only 3 real keys
    no_key = causal.clone()
    no_key[1] = False  # query 1 may attend to nothing
    big_q, big_k = 8 * q, 8 * k  # scores up to a few hundred

    def case(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
             nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(attention, [q, k, v, mask], ["q", "k", "v", "mask"])
            if isinstance(got, Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
                raise _Failure(f"returned {_describe(got)}: return the pair (out, weights)")
            out, weights = got
            want_out, want_weights = scaled_dot_product_attention(q, k, v, mask)
            mistakes = _attention_mistakes(q, k, mask)
            properties = [_rows_sum_to_one(mask)]
            if mask is not None:
                properties.insert(0, _no_weight_on_blocked(mask))
            _compare(weights, want_weights, "the weights", letters="(B, H, T, S)",
                     axes=_ATT_AXES, nan_hint=nan_hint, properties=properties,
                     mistakes=mistakes)
            out_mistakes = [(w @ v, h) for w, h in mistakes]
            if k.shape == v.shape:
                out_mistakes.append((want_weights @ k, "out is weights @ v, not weights @ k"))
            _compare(out, want_out, "the output", letters="(B, H, T, Dv)",
                     axes=("batch", "head", "query", "feature"), nan_hint=nan_hint,
                     mistakes=out_mistakes,
                     shape_hints={(*want_out.shape[:-1], k.shape[-1]):
                                  f"out = weights @ v takes its last size from v "
                                  f"(Dv = {v.shape[-1]})"} if k.shape != v.shape else None)
        return run

    stability = ("the scores are large here (up to about "
                 f"{(big_q @ big_k.transpose(-2, -1)).abs().max().item() / math.sqrt(D):.0f}): "
                 "exp overflows to inf; use a softmax that subtracts the maximum (yours from the "
                 "exercise above, or torch.softmax)")
    no_visible_key = ("query 1 may attend to no key (its mask row is all False): a softmax over "
                      "a row of -inf is 0 / 0 = NaN. Give such rows zero weights, e.g. "
                      "weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)")
    return _run("attention", attention, [
        (f"no mask: q {tuple(q.shape)}, k and v {tuple(k.shape)}", case(q, k, v, None)),
        (f"causal mask {tuple(causal.shape)}, broadcast over batch and heads",
         case(q, k, v, causal)),
        (f"padding mask {tuple(padding.shape)}, values of width 5", case(q, k, v5, padding)),
        ("large scores (q and k times 8)", case(big_q, big_k, v, causal, stability)),
        ("a query that may attend to no key gets zero weights, not NaN",
         case(q, k, v, no_key, no_visible_key)),
    ])


# Grouped-query attention: repeat_kv ---------------------------------------------------------


def check_repeat_kv(repeat_kv_fn: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``repeat_kv(x, n_rep)``, ``(B, H_kv, S, D) -> (B, H_kv * n_rep, S, D)``, against
    :func:`transformer_lib.attention.repeat_kv`: heads interleaved (kv0, kv0, kv1, kv1, …),
    so that query head h reads key/value head h // n_rep."""
    g = _generator()

    def case(shape: tuple[int, int, int, int], n_rep: int) -> Callable[[], None]:
        x = torch.randn(*shape, generator=g)  # (B, H_kv, S, D)

        def run() -> None:
            got = _call(repeat_kv_fn, [x, n_rep], ["x", "n_rep"])
            B, H_kv, S, D = shape

            def head_order(out: Tensor) -> str | None:
                held = []
                for h in range(out.shape[1]):
                    same = [j for j in range(H_kv) if torch.allclose(out[:, h], x[:, j].double())]
                    held.append(str(same[0]) if same else "?")
                want = [str(h // n_rep) for h in range(H_kv * n_rep)]
                if held != want:
                    return (f"output heads hold key/value heads [{', '.join(held)}]; expected "
                            f"[{', '.join(want)}] (query head h reads key/value head h // n_rep)")
                return None

            _compare(got, repeat_kv(x, n_rep), "the output", letters="(B, H_kv·n_rep, S, D)",
                     axes=("batch", "head", "position", "feature"), properties=[head_order],
                     mistakes=[(x.repeat(1, n_rep, 1, 1),
                                "the heads are tiled (kv0, kv1, kv0, kv1, …): repeat each head in "
                                "place instead (kv0, kv0, kv1, kv1, …), so that the n_rep query "
                                "heads of a group, which sit next to each other, share it")],
                     shape_hints={  # later entries win where two shapes coincide
                         (B, H_kv, S * n_rep, D): "you repeated the positions (dim 2); repeat "
                                                  "the heads (dim 1)",
                         (B, n_rep, H_kv, S, D): "merge the two head axes, with the repeats "
                                                 "inside each key/value head: (B, H_kv, n_rep, "
                                                 "S, D), then reshape",
                         (B, H_kv, n_rep, S, D): "merge the two head axes: reshape to "
                                                 "(B, H_kv * n_rep, S, D)",
                     })
        return run

    return _run("repeat_kv", repeat_kv_fn, [
        ("2 key/value heads, n_rep = 2, x (2, 2, 3, 4)", case((2, 2, 3, 4), 2)),
        ("3 key/value heads, n_rep = 4, x (1, 3, 5, 2)", case((1, 3, 5, 2), 4)),
        ("multi-query: 1 key/value head, n_rep = 4", case((2, 1, 3, 4), 4)),
        ("n_rep = 1 gives x back", case((2, 4, 3, 2), 1)),
    ])


# Multi-head attention: split and merge heads ------------------------------------------------


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """The reference: ``(B, T, C) -> (B, H, T, D)``, head h owning channels h·D … h·D + D − 1,
    the layout of :class:`transformer_lib.attention.MultiHeadAttention`."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)


def _merge_heads(x: Tensor) -> Tensor:
    """The reference inverse of :func:`_split_heads`: ``(B, H, T, D) -> (B, T, H·D)``."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)


def check_split_heads(split_heads: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``split_heads(x, n_heads)``, ``(B, T, C) -> (B, H, T, D)`` with ``D = C / H``:
    head h of position t holds channels h·D … h·D + D − 1 of x[:, t]. A ``C`` that ``n_heads``
    does not divide must raise a ValueError that names both sizes."""
    g = _generator()

    def case(shape: tuple[int, int, int], H: int) -> Callable[[], None]:
        x = torch.randn(*shape, generator=g)  # (B, T, C)

        def run() -> None:
            got = _call(split_heads, [x, H], ["x", "n_heads"])
            B, T, C = shape
            D = C // H
            _compare(got, _split_heads(x, H), "the output", letters="(B, H, T, D)",
                     axes=("batch", "head", "position", "feature"),
                     mistakes=[
                         (x.reshape(B, H, T, D),
                          "this is x reshaped straight from (B, T, C) to (B, H, T, D): the shape "
                          "is right, but a head now holds pieces of several positions. Reshape "
                          "to (B, T, H, D) first, then transpose(1, 2)"),
                         (x.reshape(B, T, D, H).permute(0, 3, 1, 2),
                          "head h got every H-th channel (h, h + H, …); it must own the D "
                          "consecutive channels h·D … h·D + D − 1: reshape to (B, T, H, D), not "
                          "(B, T, D, H)"),
                     ],
                     shape_hints={(B, T, H, D): "these are the heads before the transpose: move "
                                                "the heads in front of the positions with "
                                                ".transpose(1, 2)"})
        return run

    def not_divisible() -> None:
        x = torch.randn(2, 5, 10, generator=g)  # (B, T, C) with C = 10
        _expect_value_error(split_heads, [x, 3], "C = 10 cannot be split into 3 heads",
                            must_name=["10", "3"])

    return _run("split_heads", split_heads, [
        ("x (2, 5, 12) into 3 heads of width 4", case((2, 5, 12), 3)),
        ("x (1, 4, 8) into 2 heads of width 4", case((1, 4, 8), 2)),
        ("one head: x (2, 3, 6)", case((2, 3, 6), 1)),
        ("C = 10 and n_heads = 3 raise a ValueError", not_divisible),
    ])


def check_merge_heads(merge_heads: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``merge_heads(x)``, ``(B, H, T, D) -> (B, T, H·D)``, the inverse of
    ``split_heads``: ``merge_heads(split_heads(x, H)) == x``, non-contiguous inputs (the
    output of a transpose, as attention produces them) included."""
    g = _generator()

    def case(x: Tensor) -> Callable[[], None]:
        def run() -> None:
            got = _call(merge_heads, [x], ["x"])
            B, H, T, D = x.shape
            _compare(got, _merge_heads(x), "the output", letters="(B, T, H·D)",
                     axes=("batch", "position", "channel"),
                     mistakes=[
                         (x.reshape(B, T, H * D),
                          "reshaping (B, H, T, D) straight to (B, T, C) mixes heads and "
                          "positions: transpose(1, 2) to (B, T, H, D) first, then reshape"),
                         (x.permute(0, 2, 3, 1).reshape(B, T, H * D),
                          "the channels of each head must stay together: go through "
                          "(B, T, H, D), not (B, T, D, H)"),
                     ],
                     shape_hints={(B, T, H, D): "the heads are in place, now merge the last two "
                                                "axes: .reshape(B, T, H * D)"})
        return run

    y = torch.randn(1, 6, 8, generator=g)  # (B, T, C)
    return _run("merge_heads", merge_heads, [
        ("x (2, 3, 5, 4) to (2, 5, 12)", case(torch.randn(2, 3, 5, 4, generator=g))),
        ("a non-contiguous input, as split_heads returns it",
         case(_split_heads(y, 2))),
        ("one head: x (2, 1, 3, 6)", case(torch.randn(2, 1, 3, 6, generator=g))),
    ])


# Chapter 1: a causal mask with a cached prefix ----------------------------------------------


def check_causal_mask(causal_mask_fn: Callable[[int, int], Tensor]) -> CheckResult:
    """Check ``causal_mask(T, S)``, a boolean ``(T, S)`` mask (True = may attend) whose T
    queries are the last T of S positions, against :func:`transformer_lib.attention.causal_mask`."""

    def case(T: int, S: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(causal_mask_fn, [T, S], ["T", "S"])
            want = causal_mask(T, S)  # (T, S)
            if isinstance(got, Tensor) and got.dtype != torch.bool and got.shape == want.shape:
                raise _Failure(f"the mask should be boolean (True = may attend), got {got.dtype}",
                               "compare positions (cols <= rows) or call .bool()")
            ones = torch.ones(T, S, dtype=torch.bool)
            _compare(got, want, "the mask", letters="(T, S)", axes=("query", "key"),
                     mistakes=[
                         (ones.tril(), "the queries are the *last* T of the S positions (a "
                                       "cached prefix of S - T comes first): shift the diagonal "
                                       "by S - T, e.g. .tril(diagonal=S - T)"),
                         (ones.triu(S - T), "this is upper-triangular: a query sees the keys "
                                            "*before* it (and itself), the lower triangle"),
                         (ones.tril(S - T - 1), "off by one: a query may attend to itself, so "
                                                "the diagonal belongs to the allowed keys (<=, "
                                                "not <)"),
                         (~want, "True means *may attend*: this mask is inverted"),
                     ],
                     shape_hints={(T, T): "one column per key, cached prefix included: "
                                          "(T, S), not (T, T)",
                                  (S, S): "one row per query: (T, S); only the last T "
                                          "positions ask"})
        return run

    return _run("causal_mask", causal_mask_fn, [
        ("T = S = 4: plain self-attention", case(4, 4)),
        ("T = 3 new queries after a prefix of 4 (S = 7)", case(3, 7)),
        ("one new query (T = 1, S = 5): decoding step", case(1, 5)),
    ])


# Chapter 1: a masked softmax ----------------------------------------------------------------


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def check_masked_softmax(masked_softmax: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """Check ``masked_softmax(scores, mask)``: a softmax over the last axis in which keys where
    ``mask`` is False get weight 0, visible weights sum to 1, and a row with no visible key
    gets zeros rather than NaN. ``mask`` broadcasts against ``scores``."""
    g = _generator()
    scores = 2 * torch.randn(4, 6, generator=g)  # (T, S)
    causal = causal_mask(4, 6)  # (T, S)
    s4 = 2 * torch.randn(2, 3, 4, 6, generator=g)  # (B, H, T, S)
    padding = torch.ones(2, 1, 1, 6, dtype=torch.bool)  # (B, 1, 1, S)
    padding[1, ..., 4:] = False
    empty = causal.clone()
    empty[2] = False  # query 2 sees nothing

    def case(s: Tensor, m: Tensor, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(masked_softmax, [s, m], ["scores", "mask"])
            mistakes = [
                (torch.softmax(s.masked_fill(~m, 0.0), -1),
                 "blocked scores were set to 0, but 0 is just another score (e^0 = 1): fill "
                 "them with -inf before the softmax"),
                (torch.softmax(s, -1) * m, "the weights were zeroed after the softmax, so the "
                                           "rows no longer sum to 1: fill with -inf before"),
                (_masked_softmax(s, ~m), "True means *may attend*: fill where the mask is "
                                         "False (~mask)"),
            ]
            if not m.any(dim=-1).all():
                mistakes.append((torch.softmax(s.masked_fill(~m, -1e9), -1),
                                 "a row with no visible key must get zero weights, not a "
                                 "uniform average over the blocked keys"))
            _compare(got, _masked_softmax(s, m), "the weights", nan_hint=nan_hint,
                     properties=[_no_weight_on_blocked(m), _rows_sum_to_one(m)],
                     mistakes=mistakes)
        return run

    return _run("masked_softmax", masked_softmax, [
        ("scores (4, 6), causal mask with a prefix of 2", case(scores, causal)),
        ("scores (2, 3, 4, 6), padding mask (2, 1, 1, 6)", case(s4, padding)),
        ("large scores (times 500)", case(500 * scores, causal)),
        ("a row with no visible key gets zeros, not NaN",
         case(scores, empty, "row 2 has no visible key: its softmax is 0 / 0 = NaN; give such "
                             "rows zero weights with mask.any(dim=-1, keepdim=True)")),
    ])


# Chapter 1: the softmax's Jacobian ----------------------------------------------------------


def check_softmax_jacobian(softmax_jacobian: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``softmax_jacobian(x)`` for a vector ``x (n,)``: the ``(n, n)`` matrix
    ``J[i, j] = ∂ softmax(x)_i / ∂ x_j = p_i (δ_ij − p_j)``, against autograd."""
    g = _generator()

    def case(x: Tensor, nan_hint: str | None = None) -> Callable[[], None]:
        def run() -> None:
            got = _call(softmax_jacobian, [x], ["x"])
            want = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, 0), x)
            p = torch.softmax(x, 0)
            _compare(got, want, "the Jacobian", letters="(n, n)", axes=("output", "input"),
                     nan_hint=nan_hint, mistakes=[
                         (torch.diag(p), "only diag(p): every output also depends on the other "
                                         "inputs through the sum, so subtract p pᵀ"),
                         (torch.diag(p * (1 - p)), "only the diagonal p_i (1 − p_i) is right: the "
                                                   "off-diagonal entries are −p_i p_j"),
                         (torch.outer(p, p) - torch.diag(p), "the sign is flipped: "
                                                             "J = diag(p) − p pᵀ"),
                     ])
        return run

    x = torch.randn(6, generator=g)
    return _run("softmax_jacobian", softmax_jacobian, [
        ("x = [2, 1, 0]", case(torch.tensor([2.0, 1.0, 0.0]))),
        ("random x of size 6", case(x)),
        ("saturated: x = [8, -8]", case(torch.tensor([8.0, -8.0]))),
        ("large scores: x + 1000", case(x + 1000, "exp(1000) overflows: compute p with a "
                                                  "softmax that subtracts the maximum")),
    ])


# Chapter 2: teacher forcing for the reversal task -------------------------------------------


def check_reversal_targets(reversal_targets: Callable[[Tensor, int], tuple]) -> CheckResult:
    """Check ``reversal_targets(src, bos) -> (tgt_in, tgt_out)``, both ``(B, T)``: the target
    is the reversed source, and the decoder reads it shifted right by one, after ``bos``."""
    g = _generator()

    def case(src: Tensor, bos: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(reversal_targets, [src, bos], ["src", "bos"])
            if isinstance(got, Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
                raise _Failure(f"returned {_describe(got)}: return the pair (tgt_in, tgt_out)")
            tgt_in, tgt_out = got
            want_out = src.flip(1)  # (B, T)
            start = torch.full_like(src[:, :1], bos)  # (B, 1)
            want_in = torch.cat([start, want_out[:, :-1]], dim=1)  # (B, T)
            axes = ("sequence", "step")
            _compare(tgt_out, want_out, "tgt_out", letters="(B, T)", axes=axes,
                     mistakes=[(src, "tgt_out is the source reversed: .flip(1)")])
            _compare(tgt_in, want_in, "tgt_in", letters="(B, T)", axes=axes, mistakes=[
                (want_out, "tgt_in is not shifted: the decoder would read the very token it "
                           "must predict. Put bos first and drop the last target token"),
                (torch.cat([want_out[:, 1:], start], dim=1),
                 "shifted the wrong way: bos comes first, then the targets without their last"),
                (torch.cat([start, src[:, :-1]], dim=1),
                 "tgt_in must be built from the reversed source (the targets), not from src"),
                (torch.cat([torch.zeros_like(start), want_out[:, :-1]], dim=1),
                 f"the start token is the `bos` argument (here {bos}), not a fixed 0"),
            ], shape_hints={(src.shape[0], src.shape[1] + 1):
                            "tgt_in keeps length T: drop the last target token"})
        return run

    return _run("reversal_targets", reversal_targets, [
        ("src (3, 5), bos = 0", case(torch.randint(1, 10, (3, 5), generator=g), 0)),
        ("src (2, 4), bos = 11", case(torch.randint(1, 10, (2, 4), generator=g), 11)),
        ("one token: src (2, 1), bos = 5", case(torch.randint(1, 10, (2, 1), generator=g), 5)),
    ])


# Chapter 2: how often a head looks at the mirrored position ---------------------------------


def _mirror_alignment(w: Tensor) -> Tensor:
    T = w.shape[-2]
    mirrored = torch.arange(T - 1, -1, -1)  # (T,) step t reads source T-1-t
    return (w.argmax(dim=-1) == mirrored).float().mean(dim=(0, 2))  # (H,)


def check_mirror_alignment(mirror_alignment: Callable[[Tensor], Tensor]) -> CheckResult:
    """Check ``mirror_alignment(weights)``: for cross-attention weights ``(n, H, T, S)`` with
    ``S = T``, the fraction of (sequence, step) pairs whose argmax over the keys is the
    mirrored position ``T − 1 − t``, one per head ``(H,)``."""
    g = _generator()
    n, T = 40, 6
    noise = torch.randn(n, 3, T, T, generator=g)  # (n, H, T, S)
    eye = torch.eye(T)
    structured = noise + 2.5 * torch.stack([eye.flip(1), eye, torch.zeros(T, T)])  # per head
    mirrored = torch.arange(T - 1, -1, -1)

    def case(w: Tensor) -> Callable[[], None]:
        def run() -> None:
            got = _call(mirror_alignment, [w], ["weights"])
            H = w.shape[1]
            _compare(got, _mirror_alignment(w), "the fractions", letters="(H,)", axes=("head",),
                     mistakes=[
                         ((w.argmax(-1) == torch.arange(T)).float().mean(dim=(0, 2)),
                          "compared with the diagonal (position t): step t copies the mirrored "
                          "source position T − 1 − t"),
                         ((w.argmax(-2) == mirrored).float().mean(dim=(0, 2)),
                          "the argmax ran over the queries (dim=-2): take it over the keys "
                          "(dim=-1), one per query"),
                         ((w.argmax(-1) == mirrored).float().sum(dim=(0, 2)),
                          "these are counts: divide by the number of (sequence, step) pairs, "
                          "or take .float().mean(dim=(0, 2))"),
                     ],
                     shape_hints={(): "one fraction per head: average over sequences and "
                                      "steps only, dims (0, 2)",
                                  (H, T): "average over the steps too: dims (0, 2)",
                                  (n, H): "average over the sequences too: dims (0, 2)"})
        return run

    return _run("mirror_alignment", mirror_alignment, [
        ("3 heads: mirrored, diagonal, random", case(torch.softmax(structured, -1))),
        ("random weights (40, 3, 6, 6)", case(torch.softmax(noise, -1))),
        ("one head, one step: T = 1", case(torch.ones(5, 1, 1, 1))),
    ])


# Chapter 2: a change of coordinates that keeps the scores -----------------------------------


def check_transform_qk(transform_qk: Callable[[Tensor, Tensor, Tensor], tuple]) -> CheckResult:
    """Check ``transform_qk(Q, K, R) -> (Q R, K R⁻ᵀ)``: new queries and keys, ``(..., T, D)``
    and ``(..., S, D)``, with the same scores ``Q Kᵀ`` for any invertible ``R (D, D)``."""
    g = _generator()

    def case(q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> Callable[[], None]:
        D = q_shape[-1]
        Q = torch.randn(*q_shape, generator=g, dtype=torch.float64)
        K = torch.randn(*k_shape, generator=g, dtype=torch.float64)
        R = torch.eye(D, dtype=torch.float64) + 0.4 * torch.randn(D, D, generator=g,
                                                                  dtype=torch.float64)

        def run() -> None:
            got = _call(transform_qk, [Q, K, R], ["Q", "K", "R"])
            if isinstance(got, Tensor) or not isinstance(got, (tuple, list)) or len(got) != 2:
                raise _Failure(f"returned {_describe(got)}: return the pair (Q', K')")
            q2, k2 = got
            R_inv = torch.linalg.inv(R)
            _compare(q2, Q @ R, "Q'", mistakes=[(Q @ R.T, "Q' = Q R, not Q Rᵀ")])

            def same_scores(k: Tensor) -> str | None:
                if not torch.allclose(Q @ R @ k.transpose(-2, -1), Q @ K.transpose(-2, -1),
                                      atol=1e-6):
                    return "the scores Q' K'ᵀ differ from Q Kᵀ"
                return None

            _compare(k2, K @ R_inv.T, "K'", properties=[same_scores], mistakes=[
                (K @ R_inv, "K' uses R⁻¹ where it needs R⁻ᵀ: (Q R)(K R⁻¹)ᵀ = Q R R⁻ᵀ Kᵀ, "
                            "which is Q Kᵀ only for a symmetric R. Transpose the inverse"),
                (K @ R, "the same R on both sides gives Q R Rᵀ Kᵀ, which is Q Kᵀ only for a "
                        "rotation (an orthogonal R): undo R in the keys with R⁻ᵀ"),
            ])
        return run

    return _run("transform_qk", transform_qk, [
        ("Q (5, 4), K (7, 4)", case((5, 4), (7, 4))),
        ("batched: Q (2, 3, 5, 8), K (2, 3, 6, 8)", case((2, 3, 5, 8), (2, 3, 6, 8))),
    ])


# Chapter 3: parameters of a multi-head layer -------------------------------------------------


def check_mha_param_count(mha_param_count: Callable[[int, int, bool], int]) -> CheckResult:
    """Check ``mha_param_count(d_model, n_heads, bias)`` against the number of parameters of
    ``MultiHeadAttention(d_model, n_heads, bias=bias)``."""

    def case(C: int, H: int, bias: bool) -> Callable[[], None]:
        def run() -> None:
            got = _call(mha_param_count, [C, H, bias], ["d_model", "n_heads", "bias"])
            with torch.random.fork_rng(devices=[]):  # the layer's init leaves no trace
                want = sum(p.numel() for p in MultiHeadAttention(C, H, bias=bias).parameters())
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
                raise _Failure(f"expected a whole number of parameters, got {_describe(got)}")
            if got == want:
                return
            D, b = C // H, 4 * C if bias else 0
            hints = {
                H * want: "the count grows with the heads, but the H heads are slices of the "
                          "same four C × C projections: it does not depend on n_heads",
                4 * C * D + b // H: "that is one head's share: all H heads together use the "
                                    "whole C × C matrices",
                3 * C * C + 3 * C * bias: "the output projection W_O counts too: four "
                                          "projections, not three",
                4 * C * C + 4 * C: "with bias=False the projections have no bias vectors",
                4 * C * C: "each projection also has a bias of C numbers when bias=True",
            }
            hints.pop(want, None)
            raise _Failure(f"expected {want} parameters, got {got:g}", hints.get(got))
        return run

    return _run("mha_param_count", mha_param_count, [
        ("d_model 64, 1 head, bias", case(64, 1, True)),
        ("d_model 64, 8 heads, bias", case(64, 8, True)),
        ("d_model 48, 6 heads, no bias", case(48, 6, False)),
    ])


# Chapter 3: one head's slice of a fused projection ------------------------------------------


def check_head_weight(head_weight: Callable[[Tensor, int, int], Tensor]) -> CheckResult:
    """Check ``head_weight(weight, n_heads, h)``: the ``(D, C)`` block of a fused projection's
    weight ``(C, C)`` (``nn.Linear`` layout) that makes head ``h``'s queries, rows
    ``h·D … h·D + D − 1``."""
    g = _generator()

    def case(C: int, H: int, h: int) -> Callable[[], None]:
        w = torch.randn(C, C, generator=g)  # (C out, C in)

        def run() -> None:
            got = _call(head_weight, [w, H, h], ["weight", "n_heads", "h"])
            D = C // H
            rows = slice(h * D, (h + 1) * D)
            mistakes = [(w[:, rows].T, "nn.Linear stores its weight as (out_features, "
                                       "in_features): a head's outputs are *rows* of it"),
                        (w[h::H], "head h owns D consecutive rows h·D … h·D + D − 1, not "
                                  "every H-th row")]
            if h + 1 < H:
                mistakes.append((w[(h + 1) * D:(h + 2) * D], "heads are counted from 0: "
                                                             "head h starts at row h·D"))
            if h > 0:
                mistakes.append((w[(h - 1) * D:h * D], "heads are counted from 0: head h "
                                                       "starts at row h·D"))
            _compare(got, w[rows], "the head's weight", letters="(D, C)",
                     axes=("row", "column"), mistakes=mistakes,
                     shape_hints={(C, D): "nn.Linear stores its weight as (out_features, "
                                          "in_features): take rows, not columns"})
        return run

    return _run("head_weight", head_weight, [
        ("C = 12, 3 heads, head 1", case(12, 3, 1)),
        ("C = 8, 4 heads, head 3", case(8, 4, 3)),
        ("C = 8, 2 heads, head 0", case(8, 2, 0)),
    ])


# Chapter 3: multi-head attention from fused weights -----------------------------------------


def _multi_head(x: Tensor, ws: Sequence[Tensor], H: int, mask: Tensor | None, *,
                split_ok: bool = True, merge_ok: bool = True, scale_by_c: bool = False,
                transpose_w: bool = True) -> Tensor:
    """Multi-head attention without biases, or one of its usual mistakes."""
    B, T, C = x.shape
    D = C // H
    q, k, v = (x @ (w.T if transpose_w else w) for w in ws[:3])  # (B, T, C)

    def split(t: Tensor) -> Tensor:
        return _split_heads(t, H) if split_ok else t.reshape(B, H, T, D)

    q, k, v = split(q), split(k), split(v)  # (B, H, T, D)
    if scale_by_c:
        q = q * math.sqrt(D / C)  # scores / √C instead of / √D
    out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, D)
    out = _merge_heads(out) if merge_ok else out.reshape(B, T, C)
    return out @ (ws[3].T if transpose_w else ws[3])  # (B, T, C)


def check_multi_head(multi_head: Callable[..., Tensor]) -> CheckResult:
    """Check ``multi_head(x, w_q, w_k, w_v, w_o, n_heads, mask=None)``, self-attention with
    four fused ``(C, C)`` weights in ``nn.Linear`` layout and no biases, against
    :class:`transformer_lib.attention.MultiHeadAttention` with the same weights."""
    g = _generator()

    def case(B: int, T: int, C: int, H: int, mask: Tensor | None) -> Callable[[], None]:
        x = torch.randn(B, T, C, generator=g)  # (B, T, C)
        ws = [torch.randn(C, C, generator=g) / math.sqrt(C) for _ in range(4)]

        def run() -> None:
            got = _call(multi_head, [x, *ws, H, mask],
                        ["x", "w_q", "w_k", "w_v", "w_o", "n_heads", "mask"])
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                layer = MultiHeadAttention(C, H, bias=False)
                for proj, w in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj), ws):
                    proj.weight.copy_(w)
                want = layer(x, mask=mask)
            _compare(got, want, "the output", letters="(B, T, C)",
                     axes=("batch", "position", "channel"), mistakes=[
                         (_multi_head(x, ws, H, mask, split_ok=False),
                          "the heads were split with a reshape straight to (B, H, T, D): "
                          "reshape to (B, T, H, D), then transpose(1, 2)"),
                         (_multi_head(x, ws, H, mask, merge_ok=False),
                          "the heads were merged without the transpose: transpose(1, 2) back "
                          "to (B, T, H, D), then reshape to (B, T, C)"),
                         (_multi_head(x, ws, H, mask, scale_by_c=True),
                          f"the scores were divided by √C: each head divides by its own width, "
                          f"√D = √{C // H}"),
                         (_multi_head(x, ws, H, mask, transpose_w=False),
                          "nn.Linear computes x Wᵀ: multiply by w.T (or use F.linear(x, w))"),
                     ])
        return run

    return _run("multi_head", multi_head, [
        ("x (2, 5, 12), 3 heads, no mask", case(2, 5, 12, 3, None)),
        ("x (1, 6, 8), 2 heads, causal mask", case(1, 6, 8, 2, causal_mask(6))),
        ("x (2, 4, 8), 4 heads of width 2", case(2, 4, 8, 4, None)),
    ])
