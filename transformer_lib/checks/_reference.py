"""References and known mistakes that checkers of several chapters share.

The head layout of :class:`transformer_lib.attention.MultiHeadAttention` (split and merge), a
masked softmax, and the usual ways of getting the mask wrong, each with its hint.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """The reference: ``(B, T, C) -> (B, H, T, D)``, head h owning channels h·D … h·D + D − 1,
    the layout of :class:`transformer_lib.attention.MultiHeadAttention`."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)


def _merge_heads(x: Tensor) -> Tensor:
    """The reference inverse of :func:`_split_heads`: ``(B, H, T, D) -> (B, T, H·D)``."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis of ``scores`` ``(..., T, S)`` with the keys where ``mask``
    (broadcastable, True = may attend) is False blocked; a row with no visible key gets
    zeros. Returns the weights ``(..., T, S)``."""
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (..., T, S)
    return w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def _mask_mistakes(scores: Tensor, mask: Tensor) -> list[tuple[Tensor, str]]:
    """The weights that the usual mask mistakes give, each with its hint.

    Args:
        scores: the scores ``(..., T, S)``, already scaled.
        mask: boolean, broadcastable to ``scores``; True = may attend.

    Returns:
        ``(wrong weights (..., T, S), hint)`` pairs, the first match wins: the mask applied
        after the softmax, ignored (before "inverted": with large scores both can put all the
        weight on the same blocked key), blocked scores filled with 0, inverted (with or
        without zeros for the rows it leaves empty), and, when a row has no visible key, that
        row made uniform.
    """
    inverted = ("the weights match the mask inverted: True means *may attend*, so the scores "
                "to fill with -inf are where the mask is False (~mask)")
    wrong = [
        (torch.softmax(scores, dim=-1) * mask,
         "the blocked weights were zeroed after the softmax, so the rows no longer sum to 1: "
         "fill the blocked scores with -inf before the softmax"),
        (torch.softmax(scores, dim=-1),
         "the weights match a softmax without the mask: fill the blocked scores with -inf "
         "before the softmax"),
        (torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1),
         "blocked scores were set to 0, but 0 is just another score (e^0 = 1): fill them with "
         "-inf before the softmax"),
        (torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1), inverted),
        (_masked_softmax(scores, ~mask), inverted),
    ]
    if not mask.any(dim=-1).all():
        lowest = torch.finfo(scores.dtype).min  # a finite fill: the row's softmax is uniform
        wrong.append((torch.softmax(scores.masked_fill(~mask, lowest), dim=-1),
                      "a row with no visible key (a query that may attend to nothing) must get "
                      "zero weights, not a uniform average over the blocked keys"))
    return wrong
