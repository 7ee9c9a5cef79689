"""Checkers for the exercises of chapter 2, the roles of queries, keys and values
(``chapters/02_qkv_roles.ipynb``): the decoder's inputs and labels under teacher forcing with
padding, the bilinear form of each head of a layer, and a test that finds where a decoder
sees the future."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _Failure,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "teacher_forcing": Rules(),
    "head_bilinear_forms": Rules(),
    "first_future_leak": Rules(),
}


IGNORE_INDEX = -100  #: the label that LabelSmoothingLoss and F.cross_entropy leave out

# Teacher forcing with padding ----------------------------------------------------------------


def _padded_targets(lengths: list[int], T: int, pad: int, g: torch.Generator) -> Tensor:
    """``(B, T)`` target sequences of symbols 1 … 9, row b real for ``lengths[b]`` tokens and
    padded with ``pad`` after them."""
    tgt = torch.randint(1, 10, (len(lengths), T), generator=g)  # (B, T)
    real = torch.arange(T) < torch.tensor(lengths)[:, None]  # (B, T)
    return tgt.masked_fill(~real, pad)


def check_teacher_forcing(teacher_forcing: Callable[[Tensor, int, int], tuple]) -> CheckResult:
    """Check ``teacher_forcing(tgt, bos, pad) -> (dec_in, labels)``, both ``(B, T)``: the
    decoder reads ``bos`` and then the targets shifted right by one; the labels are the
    targets, with -100 wherever ``tgt`` is padding.

    Args:
        teacher_forcing: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(tgt: Tensor, bos: int, pad: int) -> Callable[[], None]:
        def run() -> None:
            got = _call(teacher_forcing, [tgt, bos, pad], ["tgt", "bos", "pad"])
            dec_in, labels = _items(got, 2, say("the pair (dec_in, labels)"))
            start = torch.full_like(tgt[:, :1], bos)  # (B, 1)
            want_in = torch.cat([start, tgt[:, :-1]], dim=1)  # (B, T)
            want_labels = tgt.masked_fill(tgt == pad, IGNORE_INDEX)  # (B, T)
            axes = (say("sequence"), say("step"))
            longer = {(tgt.shape[0], tgt.shape[1] + 1):
                      say("keep length T: the last target token is never read, drop it from "
                          "dec_in")}
            _compare(dec_in, want_in, "dec_in", letters=say("(B, T)"), axes=axes, mistakes=[
                (tgt, say("dec_in is not shifted: the decoder would read the very token it "
                          "must predict. Put bos first and drop the last target token")),
                (torch.cat([tgt[:, 1:], start], dim=1),  # (B, T)
                 say("shifted the wrong way: bos comes first, then the targets without their "
                     "last")),
                (torch.cat([torch.zeros_like(start), tgt[:, :-1]], dim=1),  # (B, T)
                 say("the start token is the `bos` argument (here {bos}), not a fixed 0",
                     bos=bos)),
                (want_in.masked_fill(want_in == pad, IGNORE_INDEX),
                 say("-100 belongs in the labels only: dec_in holds token ids for the "
                     "embedding, and -100 is none. Keep the pad id in dec_in")),
            ], shape_hints=longer)
            _compare(labels, want_labels, "labels", letters=say("(B, T)"), axes=axes, mistakes=[
                (tgt, say("the padding positions still hold the pad id, so the loss would "
                          "train the model to predict padding: put -100 there (the "
                          "ignore_index)")),
                (want_in, say("the labels are the targets themselves, not the shifted decoder "
                              "input: step t reads tokens 0 … t - 1 and predicts token t")),
                (tgt.masked_fill(tgt == pad, 0),
                 say("0 is a token id like any other, so the loss would still count those "
                     "positions: use -100, the index the loss ignores")),
            ], shape_hints=longer)
        return run

    return _run("teacher_forcing", teacher_forcing, [
        (say("no padding: tgt (3, 5), bos = 0, pad = 10"),
         case(_padded_targets([5, 5, 5], 5, 10, g), 0, 10)),
        (say("padded: lengths 6, 4, 2, bos = 11, pad = 10"),
         case(_padded_targets([6, 4, 2], 6, 10, g), 11, 10)),
        (say("pad = 0, bos = 1, lengths 3, 1"), case(_padded_targets([3, 1], 4, 0, g), 1, 0)),
        (say("one token: tgt (2, 1), bos = 5, pad = 0"),
         case(_padded_targets([1, 1], 1, 0, g), 5, 0)),
    ], rules=RULES["teacher_forcing"])


# The bilinear form of each head ---------------------------------------------------------------


def _head_forms(q_weight: Tensor, k_weight: Tensor, n_heads: int) -> Tensor:
    """The reference: ``(H, C, C)``, head h's ``W_Q,h W_K,hᵀ`` with ``nn.Linear`` weights
    ``(C, C)`` stored as (out, in) and head h owning output rows h·D … h·D + D − 1."""
    C = q_weight.shape[1]
    D = q_weight.shape[0] // n_heads
    Wq = q_weight.view(n_heads, D, C)  # (H, D, C)
    Wk = k_weight.view(n_heads, D, C)  # (H, D, C)
    return Wq.transpose(1, 2) @ Wk  # (H, C, C)


def check_head_bilinear_forms(head_bilinear_forms: Callable[[Tensor, Tensor, int], Tensor]
                              ) -> CheckResult:
    """Check ``head_bilinear_forms(q_weight, k_weight, n_heads) -> (H, C, C)``: for the
    ``q_proj.weight`` and ``k_proj.weight`` ``(C, C)`` of a layer, the matrix M_h of each head
    with score_h(i, j) = x_i M_h x_jᵀ (no scale, no bias), checked against the scores of a
    :class:`transformer_lib.attention.MultiHeadAttention` without biases.

    Args:
        head_bilinear_forms: the function to check (the exercise's), called on the checker's
            own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(C: int, H: int) -> Callable[[], None]:
        D = C // H
        with torch.random.fork_rng(devices=[]):  # its initialisation leaves no trace
            layer = MultiHeadAttention(C, H, bias=False)
        with torch.no_grad():
            for proj in (layer.q_proj, layer.k_proj):
                proj.weight.copy_(torch.randn(C, C, generator=g) / C**0.5)
        q_weight, k_weight = layer.q_proj.weight.detach(), layer.k_proj.weight.detach()
        x = torch.randn(1, 5, C, generator=g)  # (B, T, C)
        with torch.no_grad():
            q = layer.q_proj(x).view(1, 5, H, D).transpose(1, 2)  # (B, H, T, D)
            k = layer.k_proj(x).view(1, 5, H, D).transpose(1, 2)  # (B, H, T, D)
            scores = (q @ k.transpose(-2, -1))[0]  # (H, T, T), unscaled

        def reproduces_scores(forms: Tensor) -> str | None:
            from_forms = x[0] @ forms.float() @ x[0].T  # (H, T, T)
            if not torch.allclose(from_forms, scores, atol=1e-4, rtol=1e-4):
                bad = (from_forms - scores).abs().amax(dim=(1, 2)).argmax().item()
                return say("x_i M_h x_jᵀ does not give the layer's scores q_i · k_j (head "
                           "{bad} is off)", bad=bad)
            return None

        def run() -> None:
            got = _call(head_bilinear_forms, [q_weight, k_weight, H],
                        ["q_weight", "k_weight", "n_heads"])
            expected = _head_forms(q_weight, k_weight, H)
            rows = say("the D consecutive rows h·D … h·D + D − 1")
            mistakes = [
                (expected.transpose(1, 2),
                 say("each form is transposed: in score(i, j) = x_i M_h x_jᵀ the query's "
                     "input multiplies from the left, so the query weights come first")),
                ((q_weight.T @ k_weight).expand(H, C, C),
                 say("that is the sum of all the heads' forms, one matrix for the whole "
                     "layer: head h owns only {rows} of each weight", rows=rows)),
                (expected / D**0.5, say("leave out the 1/√D scale: the form is the raw q · k")),
            ]
            if H > 1:
                interleaved_q = q_weight.view(D, H, C).transpose(0, 1)  # (H, D, C)
                interleaved_k = k_weight.view(D, H, C).transpose(0, 1)  # (H, D, C)
                mistakes.append((interleaved_q.transpose(1, 2) @ interleaved_k,
                                 say("head h owns {rows}, not every H-th row: split the "
                                     "rows as (H, D), in that order", rows=rows)))
                cols_q = q_weight.view(C, H, D).permute(1, 0, 2)  # (H, C, D): columns
                cols_k = k_weight.view(C, H, D).permute(1, 0, 2)  # (H, C, D)
                mistakes.append((cols_q @ cols_k.transpose(1, 2),
                                 say("nn.Linear stores its weight as (out_features, "
                                     "in_features): a head is a block of output rows "
                                     "({rows}), not of input columns", rows=rows)))
            _compare(got, expected, say("the forms"), letters=say("(H, C, C)"),
                     axes=(say("head"), say("row"), say("column")),
                     properties=[reproduces_scores],
                     mistakes=mistakes,
                     shape_hints={(H, D, D): say("those are (D, D): the form compares two "
                                                 "inputs of C channels, so it is (C, C) per "
                                                 "head; put the transpose on the other "
                                                 "factor"),
                                  (C, C): say("one (C, C) form per head: return (H, C, C)")})
        return run

    return _run("head_bilinear_forms", head_bilinear_forms, [
        (say("C = 8, H = 4 (D = 2)"), case(8, 4)),
        (say("C = 12, H = 3 (D = 4)"), case(12, 3)),
        (say("one head: C = 6, H = 1"), case(6, 1)),
    ], rules=RULES["head_bilinear_forms"])


# Where a decoder sees the future --------------------------------------------------------------


def _toy_decoder(visible: Tensor, vocab_size: int,
                 g: torch.Generator) -> Callable[[Tensor], Tensor]:
    """A deterministic decoder: ids ``(B, T)`` -> logits ``(B, T, V)``, position t summing the
    embeddings of the positions s with ``visible[t, s]`` (each weighted by its position), so
    position t depends on token s exactly where ``visible[t, s]``. Shorter inputs use the
    top-left corner of ``visible``."""
    table = torch.randn(vocab_size, vocab_size, generator=g)  # (V, V)
    n = visible.shape[0]
    weight = visible.float() * (1.0 + 0.1 * torch.arange(n).float())  # (T, T)

    @given
    def decode(tgt: Tensor) -> Tensor:
        if not isinstance(tgt, Tensor) or tgt.dim() != 2 or tgt.dtype != torch.long:
            if isinstance(tgt, Tensor):
                raise ValueError(say("decode takes token ids (B, T) of dtype long, got {got} "
                                     "{dtype}", got=_describe(tgt), dtype=tgt.dtype))
            raise ValueError(say("decode takes token ids (B, T) of dtype long, got {got}",
                                 got=_describe(tgt)))
        T = tgt.shape[1]
        if not 1 <= T <= n or tgt.min() < 0 or tgt.max() >= vocab_size:
            raise ValueError(say("decode takes 1 to {n} positions of ids 0 … {last}, got "
                                 "shape {shape}", n=n, last=vocab_size - 1,
                                 shape=tuple(tgt.shape)))
        return weight[:T, :T] @ table[tgt]  # (T, T) @ (B, T, V) -> (B, T, V)

    return decode


def _leaks(decode: Callable[[Tensor], Tensor], tgt: Tensor) -> list[tuple[int, int]]:
    """Every (t, j) with t < j such that changing token j changes the logits at t."""
    V = decode(tgt).shape[-1]
    base = decode(tgt)  # (B, T, V)
    found = []
    for j in range(tgt.shape[1]):
        changed = tgt.clone()
        changed[:, j] = (tgt[:, j] + 1) % V  # another token at position j
        moved = (decode(changed) - base).abs().amax(dim=(0, 2)) > 0  # (T,)
        found += [(t, j) for t in range(j + 1) if moved[t]]
    return found


def check_first_future_leak(first_future_leak: Callable[[Callable, Tensor], int]) -> CheckResult:
    """Check ``first_future_leak(decode, tgt) -> int``: the smallest position t whose logits
    change when a token after t changes, or -1 if the decoder is causal; tried on small
    decoders with known leaks.

    Args:
        first_future_leak: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    V, T = 7, 8

    def case(extra: list[tuple[int, int]], mask: str = "causal", n: int = T
             ) -> Callable[[], None]:
        visible = {"causal": torch.ones(n, n).tril(), "none": torch.ones(n, n),
                   "off_by_one": torch.ones(n, n).tril(diagonal=1)}[mask].bool()
        for t, s in extra:
            visible[t, s] = True
        decode = _toy_decoder(visible, V, g)
        tgt = torch.randint(0, V, (2, n), generator=g)  # (B, T)

        def run() -> None:
            got = _call(first_future_leak, [decode, tgt], ["decode", "tgt"])
            if isinstance(got, Tensor) and got.numel() == 1 and not got.is_floating_point():
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, int):
                raise _Failure(say("returned {got}: return one int, a position or -1",
                                   got=_describe(got)))
            pairs = _leaks(decode, tgt)
            future = [(t, j) for t, j in pairs if t < j]
            expected = min((t for t, _ in future), default=-1)
            if got == expected:
                return
            described = (say("a causal decoder") if expected == -1
                         else say("position {expected} already sees a later token",
                                  expected=expected))
            # What each usual slip returns on this decoder, with its hint; the first match wins.
            mistakes = [(min((t for t, _ in pairs), default=-1),
                         say("every position may read its own token: after changing token j, "
                             "compare only the positions before j"))]
            if future:
                first_j = min(j for _, j in future)
                mistakes += [
                    (min(t for t, j in future if j == first_j),
                     say("a later token can leak further back: try every position before "
                         "deciding which position is the first")),
                    (min(j for _, j in future),
                     say("that is the position you changed; return the position whose logits "
                         "moved")),
                    (max(t for t, _ in future),
                     say("return the first (smallest) position that sees the future, not the "
                         "last")),
                    (-1, say("this decoder does leak: change each position in turn, not only "
                             "the last, to a token different from the old one")),
                ]
            hint = next((h for value, h in mistakes if value == got), None)
            raise _Failure(say("returned {got}, expected {expected} ({described})", got=got,
                               expected=expected, described=described), hint)
        return run

    return _run("first_future_leak", first_future_leak, [
        (say("a causal decoder"), case([])),
        (say("no mask at all"), case([], "none")),
        (say("mask off by one (t sees t + 1)"), case([], "off_by_one")),
        (say("position 3 sees position 5"), case([(3, 5)])),
        (say("position 1 sees 6, position 3 sees 4"), case([(1, 6), (3, 4)])),
        (say("position 0 sees the last token"), case([(0, 7)])),
        (say("one position: T = 1"), case([], n=1)),
    ], rules=RULES["first_future_leak"])
