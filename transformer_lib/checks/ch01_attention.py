"""Checkers for the exercises of chapter 1, attention (``chapters/01_attention.ipynb``): the
scale for queries and keys of any spread, the mask of a left-padded batch, and causal
attention computed a chunk of queries at a time."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _compare_number,
    _Failure,
    _fixed_work,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "score_scale": Rules(),
    "left_padded_causal_mask": Rules(allow=("causal_mask",)),
    "chunked_causal_attention": Rules(allow=("causal_mask", "scaled_dot_product_attention")),
}


# The scale for queries and keys of variance σ² -------------------------------------------------


def check_score_scale(score_scale: Callable[[int, float], float]) -> CheckResult:
    """Check ``score_scale(d_k, sigma)``: the number to divide ``q · k`` by so that the scores
    have variance 1 when every entry of ``q`` and ``k`` has mean 0 and variance ``sigma²``
    (all independent). That is the standard deviation of ``q · k``, ``sigma² · √d_k``.

    Args:
        score_scale: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(d_k: int, sigma: float) -> Callable[[], None]:
        def run() -> None:
            got = _call(score_scale, [d_k, sigma], ["d_k", "sigma"])
            root = math.sqrt(d_k)
            mistakes = [
                (root, say("σ is missing: √d_k is the answer only for unit variance; with "
                           "entries of variance σ² the scores spread more (or less)")),
                (sigma * root, say("one factor σ is missing: each product q_i k_i has variance "
                                   "E[q_i²] E[k_i²] = σ² · σ² = σ⁴, so its standard deviation "
                                   "is σ²")),
                (d_k * sigma**4, say("that is the variance of q · k; divide by its standard "
                                     "deviation, the square root of the variance")),
                (d_k * sigma**2, say("d_k enters as √d_k: the d_k products add their variances, "
                                     "and the standard deviation is the square root of that "
                                     "sum")),
                (root / sigma**2, say("σ² belongs in the divisor's numerator: larger entries "
                                      "give larger scores, which need a larger divisor")),
            ]
            _compare_number(got, sigma**2 * root, say("the scale"), mistakes=mistakes)
        return run

    return _run("score_scale", score_scale, [
        (say("d_k = 64, σ = 1: the chapter's case"), case(64, 1.0)),
        (say("d_k = 64, σ = 2"), case(64, 2.0)),
        (say("d_k = 9, σ = 0.5"), case(9, 0.5)),
        (say("d_k = 1024, σ = 0.05"), case(1024, 0.05)),
    ], rules=RULES["score_scale"])


# The mask of a left-padded batch ------------------------------------------------------------


def _left_padded(lengths: Tensor, T: int, S: int) -> Tensor:
    """The reference: ``(B, 1, T, S)``, True where the key is a real token (the last
    ``lengths[b]`` of the S positions of sequence b) and not after the query (the queries are
    the last T positions)."""
    real = torch.arange(S)[None, :] >= S - lengths[:, None]  # (B, S)
    return real[:, None, None, :] & causal_mask(T, S)  # (B, 1, T, S)


def check_left_padded_causal_mask(
        left_padded_causal_mask: Callable[[Tensor, int, int], Tensor]) -> CheckResult:
    """Check ``left_padded_causal_mask(lengths, T, S)``: sequence b of a batch holds
    ``S - lengths[b]`` padding positions and then its real tokens; the queries are the last T
    of the S positions. The boolean ``(B, 1, T, S)`` mask (True = may attend) lets a query
    read a key only if the key is a real token at or before the query's position.

    Args:
        left_padded_causal_mask: the function to check (the exercise's), called on the
            checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(lengths: list[int], T: int, S: int) -> Callable[[], None]:
        def run() -> None:
            lens = torch.tensor(lengths)  # (B,)
            got = _call(left_padded_causal_mask, [lens, T, S], ["lengths", "T", "S"])
            want = _left_padded(lens, T, S)  # (B, 1, T, S)
            B = len(lengths)
            if isinstance(got, Tensor) and got.shape == want.shape and got.dtype != torch.bool:
                raise _Failure(say("the mask should be boolean (True = may attend), got "
                                   "{dtype}", dtype=got.dtype),
                               say("comparisons (<, >=, ...) give booleans; combine them with &"))
            keys = torch.arange(S)  # (S,) key positions
            queries = torch.arange(S - T, S)  # (T,) query positions
            causal = causal_mask(T, S).expand(B, 1, T, S)  # (B, 1, T, S)
            first_real = S - lens[:, None]  # (B, 1)
            padded_query = (queries[None, :] < first_real)[:, None, :, None]  # (B, 1, T, 1)
            own_key = queries[:, None] == keys[None, :]  # (T, S): a query's own position

            def real(rows: Tensor) -> Tensor:  # (B, S) -> (B, 1, T, S), one row per query
                return rows[:, None, None, :].expand(B, 1, T, S)

            mistakes = [
                (real(keys[None, :] < lens[:, None]) & causal,
                 say("this pads on the right: here the padding comes *first*, and the real "
                     "tokens are the last lengths[b] positions, from S - lengths[b] on")),
                (real(keys[None, :] >= first_real) & torch.ones(T, S, dtype=torch.bool).tril(),
                 say("the queries are the *last* T of the S positions (query i sits at "
                     "position S - T + i): shift the diagonal of the causal part by S - T")),
                (real(keys[None, :] >= first_real),
                 say("a query reads keys in its future: combine the padding with the causal "
                     "mask")),
                (causal, say("padding keys are visible: block the first S - lengths[b] keys of "
                             "sequence b")),
                (real(keys[None, :] > first_real) & causal,
                 say("off by one: the first real token of sequence b sits at position "
                     "S - lengths[b], and it is a key like the others")),
                (real(keys[None, :] >= first_real - 1) & causal,
                 say("off by one: one padding position per sequence is visible; the real "
                     "tokens start at position S - lengths[b]")),
                (want | (padded_query & own_key),
                 say("padded queries may read their own padding here: a padded query reads "
                     "nothing at all; the attention function turns such empty rows into "
                     "zeros")),
                (~want, say("True means *may attend*: this mask is inverted")),
            ]
            hints = {  # a later entry wins where two shapes coincide
                (B, 1, S, S): say("one row per query: only the last T positions ask, "
                                  "(B, 1, T, S)"),
                (B, 1, T, T): say("one column per key, the kept earlier positions included: "
                                  "(B, 1, T, S)"),
                (T, S): say("one mask per sequence, since the padding differs: (B, 1, T, S)"),
                (B, S): say("that says which positions are real; the mask says, for every "
                            "query, which keys it may read: (B, 1, T, S)"),
                (B, 1, 1, S): say("this is the key padding alone, one row for every query: "
                                  "combine it with the causal (T, S) mask"),
                (B, T, S): say("add an axis of size 1 for the heads: scores are (B, H, T, S), "
                               "and broadcasting lines shapes up from the right, so a (B, T, S) "
                               "mask would pair sequence b with head b"),
            }
            _compare(got, want, say("the mask"), letters=say("(B, 1, T, S)"),
                     axes=(say("sequence"), say("head"), say("query"), say("key")),
                     mistakes=mistakes,
                     shape_hints=hints)
        return run

    return _run("left_padded_causal_mask", left_padded_causal_mask, [
        (say("a whole prompt: lengths [4, 2, 1], T = S = 4"), case([4, 2, 1], 4, 4)),
        (say("one step of generation: lengths [5, 3], T = 1, S = 5"), case([5, 3], 1, 5)),
        (say("3 new positions: lengths [1, 3, 6, 2], T = 3, S = 6"),
         case([1, 3, 6, 2], 3, 6)),
        (say("no padding: lengths [5, 5], T = 2, S = 5"), case([5, 5], 2, 5)),
    ], rules=RULES["left_padded_causal_mask"])


# Causal attention, a chunk of queries at a time -------------------------------------------


@given
class _WatchWeights(TorchFunctionMode):
    """Records what a function computes that holds the weights of more than ``chunk`` queries
    against all T keys: a floating-point tensor of more than ``limit`` numbers per head (the
    limit is ``chunk · T``, or ``T · D``, the size of q, if that is larger), or a call of
    ``F.scaled_dot_product_attention`` on more than ``chunk`` queries at once."""

    def __init__(self, T: int, chunk: int, heads: int, width: int):
        super().__init__()
        self.T, self.chunk, self.heads = T, chunk, heads
        self.limit = max(chunk * T, T * width)
        self.found: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.found is None and "scaled_dot_product_attention" in getattr(func, "__name__", ""):
            q = args[0] if args else kwargs.get("query")
            if isinstance(q, Tensor) and q.dim() >= 2 and q.shape[-2] > self.chunk:
                self.found = say("F.scaled_dot_product_attention ran on {queries} queries at "
                                 "once (chunk = {chunk})", queries=q.shape[-2], chunk=self.chunk)
        result = func(*args, **kwargs)
        if self.found is None:
            for t in result if isinstance(result, (tuple, list)) else (result,):
                if (isinstance(t, Tensor) and t.is_floating_point() and t.dim() >= 2
                        and t.numel() > self.limit * self.heads):
                    self.found = say("a floating-point tensor of shape {shape} was created: "
                                     "{per_head} numbers per head, more than the weights of "
                                     "{chunk} queries against all {T} keys ({chunk} × {T}); "
                                     "the weights (or scores) of all queries at once, perhaps "
                                     "with keys added", shape=tuple(t.shape),
                                     per_head=t.numel() // self.heads, chunk=self.chunk,
                                     T=self.T)
                    break
        return result


def _chunk_masks(T: int, chunk: int) -> dict[str, Tensor]:
    """``(T, T)`` masks of whole-sequence attention that equal the usual chunking mistakes."""
    i = torch.arange(T)[:, None]  # (T, 1) query positions
    j = torch.arange(T)[None, :]  # (1, T) key positions
    start = (i // chunk) * chunk  # (T, 1) first position of each query's chunk
    end = torch.clamp(start + chunk, max=T)  # (T, 1) one past its last position
    return {
        "block": j < end,
        "local": (j >= start) & (j <= i),
        "both_ways": (j >= start) & (j < end),
        "no_offset": j <= i - start,
        "none": torch.ones(T, T, dtype=torch.bool),
    }


def check_chunked_causal_attention(
        chunked_causal_attention: Callable[[Tensor, Tensor, Tensor, int], Tensor]) -> CheckResult:
    """Check ``chunked_causal_attention(q, k, v, chunk)`` for ``q``, ``k`` ``(..., T, D)`` and
    ``v`` ``(..., T, Dv)``: the output ``(..., T, Dv)`` of causal self-attention, computed at
    most ``chunk`` queries at a time, so that no ``(T, T)`` weights are ever formed.

    Args:
        chunked_causal_attention: the function to check (the exercise's), called on the
            checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def inputs(shape: tuple[int, ...], Dv: int) -> tuple[Tensor, Tensor, Tensor]:
        *lead, T, D = shape
        return (torch.randn(*shape, generator=g), torch.randn(*shape, generator=g),
                torch.randn(*lead, T, Dv, generator=g))

    def case(q: Tensor, k: Tensor, v: Tensor, chunk: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(chunked_causal_attention, [q, k, v, chunk], ["q", "k", "v", "chunk"])
            T, D = q.shape[-2:]
            want, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))  # (..., T, Dv)
            masks = _chunk_masks(T, chunk)

            def out(mask: Tensor, scale: float = 1.0) -> Tensor:
                return scaled_dot_product_attention(q * scale, k, v, mask)[0]  # (..., T, Dv)

            mistakes = [
                (out(masks["block"]), say("queries read the later positions of their own "
                                          "chunk: inside a chunk the mask must still be "
                                          "causal")),
                (out(masks["local"]), say("each chunk reads only its own keys: a query reads "
                                          "every earlier position, those of earlier chunks "
                                          "too")),
                (out(masks["both_ways"]), say("each chunk reads only its own keys, and its "
                                              "future: a query reads every earlier position "
                                              "and no later one")),
                (out(masks["no_offset"]), say("the mask of a chunk ignores where the chunk "
                                              "starts: its first query is position `start`, "
                                              "not 0, so it may read keys 0 … start")),
                (out(masks["none"]), say("no mask: every query reads the whole sequence, its "
                                         "future included")),
                (out(causal_mask(T), math.sqrt(D)),
                 say("the scores were not divided by √D (√{D} = {root:.3g})", D=D,
                     root=math.sqrt(D))),
            ]
            short = T - T % chunk
            query, feature, batch, head = (say("query"), say("feature"), say("batch"),
                                           say("head"))
            axes = {2: (query, feature), 3: (batch, query, feature),
                    4: (batch, head, query, feature)}.get(want.dim())
            _compare(got, want, say("the output"), letters=say("(..., T, Dv)"), axes=axes,
                     mistakes=mistakes,
                     shape_hints={
                         (*want.shape[:-2], short, want.shape[-1]):
                             say("the last, shorter chunk is missing: T = {T} is not a "
                                 "multiple of chunk = {chunk}", T=T, chunk=chunk),
                         (*want.shape[:-2], min(chunk, T), want.shape[-1]):
                             say("only one chunk came back: collect the output of every chunk "
                                 "and join them along the query axis"),
                         (*want.shape[:-1], D): say("the output takes its width from v "
                                                    "(Dv = {Dv}), not from q", Dv=v.shape[-1]),
                     })
        return run

    def watched(q: Tensor, k: Tensor, v: Tensor, chunk: int) -> Callable[[], None]:
        def run() -> None:
            heads = math.prod(q.shape[:-2])
            watch = _WatchWeights(q.shape[-2], chunk, heads, max(q.shape[-1], v.shape[-1]))
            with watch:
                _call(chunked_causal_attention, [q, k, v, chunk], ["q", "k", "v", "chunk"])
            if watch.found:
                raise _Failure(watch.found,
                               say("compute the attention of one chunk of queries at a time, "
                                   "q[..., start:end, :], against the keys it may read, and "
                                   "join the outputs"))
        return run

    def fixed_work() -> None:
        small, large = inputs((2, 8, 4), 4), inputs((2, 16, 4), 4)
        _fixed_work(chunked_causal_attention, [*small, 4], [*large, 8],
                    ["q", "k", "v", "chunk"], say("chunk"),
                    (say("T = 8 in chunks of 4"), say("T = 16 in chunks of 8")))

    q, k, v = inputs((2, 3, 12, 8), 8)
    q10, k10, v10 = inputs((10, 8), 8)
    q5, k5, v5 = inputs((2, 12, 4), 5)
    return _run("chunked_causal_attention", chunked_causal_attention, [
        (say("q, k, v (2, 3, 12, 8) in chunks of 4"), case(q, k, v, 4)),
        (say("T = 10 in chunks of 4: the last chunk has 2 queries; no batch or head axes"),
         case(q10, k10, v10, 4)),
        (say("chunks of 1: one query at a time"), case(q, k, v, 1)),
        (say("chunk = 16, more than T = 12: a single chunk"), case(q, k, v, 16)),
        (say("values of width 5, not 4 (Dv ≠ D), in chunks of 5"), case(q5, k5, v5, 5)),
        (say("at most `chunk` query rows at once: no (T, T) weights"), watched(q, k, v, 4)),
        (say("at most `chunk` query rows at once: T = 12, D = 4, chunks of 3"),
         watched(q5, k5, v5, 3)),
        (say("the work grows with the number of chunks, not with their size"), fixed_work),
    ], rules=RULES["chunked_causal_attention"])
