"""Checker for chapter 7's exercise on the distribution a sampler draws the next token from
(``chapters/07_kv_cache.ipynb``): temperature, then top-k, then top-p, renormalised.

The reference here is written out independently of the library, in float64 and without a
sort: each token's rank is counted (the tokens more likely than it, and the equally likely
ones with a smaller id), top-k keeps the ranks below k, and top-p keeps a token while the
probability of the tokens ranked before it, after top-k and renormalised, is below p."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _expect_value_error,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "sampling_probs": Rules(),
}


def _ranks(p: Tensor) -> Tensor:
    """``(B, V)``: 0 for the most likely token of each row, then 1, …; equal probabilities
    in the order of their ids (the smaller id first)."""
    V = p.shape[-1]
    ids = torch.arange(V)
    above = (p[:, None, :] > p[:, :, None]).sum(-1)  # (B, V): tokens more likely than i
    tied = ((p[:, None, :] == p[:, :, None]) & (ids[None, :] < ids[:, None])).sum(-1)
    return above + tied


def _mass_before(p: Tensor, keep: Tensor, rank: Tensor) -> Tensor:
    """``(B, V)``: for each token, the probability of the kept tokens ranked before it, after
    renormalising the kept ones."""
    q = p * keep
    q = q / q.sum(-1, keepdim=True)
    earlier = rank[:, None, :] < rank[:, :, None]  # (B, V, V): token j ranked before i
    return (q[:, None, :] * earlier).sum(-1)


def _sampling(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, *,
              tau: str = "divide", order: str = "k,p", nucleus: str = "before",
              ties: str = "by_id", axis: int = -1, renormalise: bool = True,
              greedy: str = "first") -> Tensor:
    """The reference (the defaults), in float64, and the mistakes (the other arguments)."""
    z = logits.double()
    B, V = z.shape
    if temperature == 0:
        top = z == z.amax(-1, keepdim=True)  # (B, V): the most likely tokens
        ids = torch.arange(V).expand(B, V)
        pick = (ids.masked_fill(~top, V).amin(-1) if greedy == "first"
                else ids.masked_fill(~top, -1).amax(-1))  # (B,)
        return torch.zeros(B, V, dtype=z.dtype).scatter(
            -1, pick[:, None], 1.0).to(logits.dtype)
    scale = {"divide": 1 / temperature, "ignored": 1.0, "multiply": temperature}[tau]
    p = ((z - z.amax(-1, keepdim=True)) * scale).exp()
    p = p / p.sum(-1, keepdim=True)  # (B, V): softmax(z / τ)
    rank = _ranks(p)
    keep = torch.ones(B, V, dtype=torch.bool)

    def cut_k(keep: Tensor) -> Tensor:
        if top_k is None:
            return keep
        if ties == "by_id":
            return keep & (rank < top_k)
        if ties == "topk":  # whichever of equal values torch.topk returns
            chosen = p.topk(top_k, dim=-1).indices  # (B, k)
            return keep & torch.zeros_like(keep).scatter(-1, chosen, True)
        kth = p.masked_fill(rank != top_k - 1, 0.0).amax(-1, keepdim=True)  # (B, 1)
        return keep & (p >= kth)  # every token tied with the k-th kept

    def cut_p(keep: Tensor) -> Tensor:
        if top_p is None:
            return keep
        before = _mass_before(p, keep, rank)
        if nucleus == "before":
            return keep & (before < top_p)
        q = p * keep / (p * keep).sum(-1, keepdim=True)
        return keep & (before + q <= top_p)  # one too few: the token that crosses p dropped

    keep = cut_p(cut_k(keep)) if order == "k,p" else cut_k(cut_p(keep))
    kept = p * keep
    if renormalise:  # 0 / 0 (NaN) where a mistake keeps nothing, as the mistake itself gives
        kept = kept / kept.sum(axis, keepdim=True)
    return kept.to(logits.dtype)


_MISTAKES = [
    (dict(tau="ignored"), say("the temperature changed nothing: dividing the probabilities by τ "
                              "is undone when they are renormalised; divide the logits by τ "
                              "before the softmax")),
    (dict(tau="multiply"), say("the logits were multiplied by τ: divide them, so that τ < 1 "
                               "sharpens the distribution and τ > 1 flattens it")),
    (dict(nucleus="inclusive"), say("top-p kept one token too few: the smallest set whose "
                                    "probability reaches p includes the token that crosses p; keep "
                                    "a token while the probability of the tokens before it is "
                                    "below p")),
    (dict(order="p,k"), say("top-p ran before top-k (or on the probabilities before top-k's "
                            "survivors were renormalised): top-k comes first, and top-p judges "
                            "what top-k left, renormalised")),
    (dict(ties="all"), say("top-k kept every token tied with the k-th: exactly top_k tokens "
                           "survive, and among equal probabilities the smaller ids")),
    (dict(ties="topk"), say("among equal probabilities top-k keeps the smaller ids: torch.topk "
                            "does not promise which of equal values it returns, a stable sort "
                            "keeps them in the order of their ids")),
    (dict(axis=0),
     say("the survivors were renormalised over the wrong axis: each row is one sequence's "
         "distribution over the V tokens, so divide by the sum of its row")),
    (dict(renormalise=False), say("the kept probabilities were not renormalised: divide them by "
                                  "their sum, so that each row sums to 1")),
    (dict(greedy="last"),
     say("among equally likely tokens, greedy decoding takes the smallest id")),
]


def _rows_sum_to_one(got: Tensor) -> str | None:
    sums = got.sum(-1)
    bad = (sums - 1).abs() > 1e-4
    if bad.any():
        b = int(bad.nonzero()[0])
        if sums[b] == 0:
            return say("row {b} keeps no token: top-k and top-p always keep at least the most "
                       "likely token", b=b)
        return say("row {b} of the probabilities sums to {total:.4g}, not 1", b=b,
                   total=sums[b].item())
    return None


def check_sampling_probs(sampling_probs: Callable[..., Tensor]) -> CheckResult:
    """Check ``sampling_probs(logits, temperature, top_k, top_p) -> probs``: for logits
    ``(B, V)``, the distribution ``(B, V)`` (the logits' dtype) that temperature τ
    (``softmax(logits / τ)``; τ = 0: all the probability on the most likely token, the
    smallest id among equals), then top-k (the ``top_k`` most likely tokens; among equals the
    smaller ids) and then top-p (the smallest set of most likely tokens whose probability,
    after top-k and renormalised, reaches ``top_p``) leave, renormalised; None switches a cut
    off. A negative temperature, and ``top_k`` larger than V, raise a ValueError naming the
    values.

    Args:
        sampling_probs: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["logits", "temperature", "top_k", "top_p"]

    def case(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None
             ) -> Callable[[], None]:
        args = [logits, temperature, top_k, top_p]

        def run() -> None:
            got = _call(sampling_probs, args, names)
            want = _sampling(*args)
            mistakes = [(_sampling(*args, **kw), hint) for kw, hint in _MISTAKES]
            atol = 1e-6 if logits.dtype == torch.float32 else 1e-12
            _compare(got, want, say("the probabilities"), letters=say("(B, V)"),
                     axes=("row", "token"), atol=atol, rtol=atol * 10, mistakes=mistakes,
                     properties=[_rows_sum_to_one],
                     nan_hint=say("NaN comes from a division by a temperature of 0 (0 means "
                                  "greedy: all the probability on the most likely token) or from "
                                  "a row where nothing was kept (0 / 0: top-p always keeps the "
                                  "most likely token)"))
        return run

    def from_probs(*rows: list[float]) -> Tensor:
        """Logits whose softmax is each row (up to rounding), a constant added per row."""
        return torch.tensor(rows, dtype=torch.float64).log().float() + 3.0

    def error(logits: Tensor, temperature: float, top_k: int | None, reason: str,
              must_name: list[str]) -> Callable[[], None]:
        def run() -> None:
            _expect_value_error(sampling_probs, [logits, temperature, top_k, None], reason,
                                must_name)
        return run

    wide = torch.randn(4, 50, generator=g) * 2.5  # (B, V)
    return _run("sampling_probs", sampling_probs, [
        (say("temperature 0.7 alone, (B, V) = (3, 10)"),
         case(torch.randn(3, 10, generator=g) * 2, 0.7, None, None)),
        (say("top-k 3 with a tie at the third place: the smaller ids are kept"),
         case(from_probs([0.1, 0.3, 0.15, 0.05, 0.15, 0.25], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]),
              1.0, 3, None)),
        (say("top-p 0.55: the token that crosses 0.55 is kept, ties in the order of the ids"),
         case(from_probs([0.04, 0.5, 0.15, 0.3, 0.01], [0.25, 0.2, 0.25, 0.2, 0.1]),
              1.0, None, 0.55)),
        (say("top-p 0.4 below the largest probability (0.6): one token"),
         case(from_probs([0.3, 0.6, 0.1], [0.2, 0.1, 0.7]), 1.0, None, 0.4)),
        (say("temperature 1.3, top-k 3, top-p 0.7: top-k first, then top-p on what it left"),
         case(from_probs([0.15, 0.3, 0.1, 0.2, 0.25], [0.05, 0.45, 0.2, 0.1, 0.2]),
              1.3, 3, 0.7)),
        (say("temperature 0: greedy, one token per row, the smaller id of a tie"),
         case(torch.tensor([[0.5, 2.0, -1.0, 2.0], [3.0, 1.0, 0.0, -2.0]]), 0.0, None, None)),
        (say("float64 logits (4, 50): temperature 0.8, top-k 20, top-p 0.9"),
         case(wide.double(), 0.8, 20, 0.9)),
        (say("a negative temperature: a ValueError naming it"),
         error(torch.randn(2, 6, generator=g), -0.5, None, say("a temperature must be >= 0"),
               ["-0.5"])),
        (say("top_k 9 for a vocabulary of 6: a ValueError naming both"),
         error(torch.randn(2, 6, generator=g), 1.0, 9, say("top_k must be at most V"), ["9", "6"])),
    ], rules=RULES["sampling_probs"])
