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
