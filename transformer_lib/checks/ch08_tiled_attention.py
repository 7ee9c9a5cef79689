"""Checker for the core of chapter 8 (``chapters/08_fast_attention.ipynb``), written by the
learner where the chapter builds it: attention over tiles of keys with the online softmax,
all queries at once.

The reference is attention from the whole score matrix in float64, written out here; the
known mistakes run the tile loop with one step wrong. While the student's function runs, the
shape of every tensor it creates is recorded with the machinery of ``ch08_fast_attention``
(its ``_NewTensors``): a query-by-key tensor with
more than ``block`` keys fails, whichever way round it is laid out."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _Failure,
    _fixed_work,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.checks.ch01_softmax_attention import _SOFTMAXES
from transformer_lib.checks.ch08_fast_attention import NEG_INF, _NewTensors, _too_large

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "tiled_attention": Rules(
        refuse=(*_SOFTMAXES, "torch.nn.functional.scaled_dot_product_attention")),
}


def _keys_in_tiles(q: Tensor, k: Tensor, v: Tensor, block: int, *, scale: float | None = None,
                   mistake: str | None = None) -> Tensor:
    """The online softmax over key tiles of ``block``, in float64, with one of the known
    mistakes (``mistake=None`` is the loop done right). The reference itself is
    :func:`_full_attention`."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = k.shape[-2]
    m = q64.new_full((*q.shape[:-1], 1), NEG_INF)  # (..., T, 1)
    l = q64.new_zeros((*q.shape[:-1], 1))  # (..., T, 1)
    acc = q64.new_zeros((*q.shape[:-1], v.shape[-1]))  # (..., T, Dv)
    stop = S - S % block if mistake == "short_tile_dropped" else S
    for start in range(0, stop, block):
        s = (q64 @ k64[..., start:start + block, :].transpose(-2, -1)) * scale  # (..., T, n)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        fade = torch.exp(m - m_new)  # (..., T, 1)
        e = torch.exp(s - m_new)  # (..., T, n)
        l_new = (1.0 if mistake in ("l_not_rescaled", "none_rescaled") else fade) * l \
            + e.sum(dim=-1, keepdim=True)
        if mistake == "divided_in_loop":  # acc kept normalised, the old l forgotten
            acc = (fade * acc + e @ v64[..., start:start + block, :]) / l_new
        else:
            acc = (1.0 if mistake in ("acc_not_rescaled", "none_rescaled") else fade) * acc \
                + e @ v64[..., start:start + block, :]
        m, l = m_new, l_new
    out = acc if mistake == "divided_in_loop" else acc / l
    return out.to(q.dtype)  # (..., T, Dv)


def _full_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ / √D) v from the whole score matrix, in float64: the reference."""
    scores = (q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5  # (..., T, S)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return ((e / e.sum(dim=-1, keepdim=True)) @ v.double()).to(q.dtype)  # (..., T, Dv)


_KEY_TILE_HINTS = {
    "acc_not_rescaled": say("the running sum a was not rescaled when the maximum grew: multiply "
                            "it by exp(m - m_new), as l, before adding the new tile"),
    "l_not_rescaled": say("the running sum l was not rescaled when the maximum grew: multiply it "
                          "by exp(m - m_new), as a, before adding the new tile"),
    "none_rescaled": say("l and a were not rescaled when the maximum grew: both sums are relative "
                         "to the old maximum m, so multiply them by exp(m - m_new) before adding "
                         "the new tile"),
    "no_scale": say("divide the scores by √D before the online softmax"),
    "divided_in_loop": say("a was divided by l inside the loop and then rescaled as if it were "
                           "still a sum: keep a unnormalised and divide by l once, after the last "
                           "tile"),
    "short_tile_dropped": say("the last, shorter tile of keys is missing: range(0, S, block) "
                              "reaches it, and slicing past the end gives the shorter tile"),
}


def _wider_than_a_key_tile(shapes: list[tuple[int, ...]], T: int, block: int, D: int, Dv: int,
                           ndim: int) -> tuple[int, ...] | None:
    """The first shape of a query-by-key tensor (scores, weights) with more than ``block``
    keys: :func:`_too_large` with tiles of all T queries by ``block`` keys, in either
    orientation (``(..., T, block)`` or its transpose ``(..., block, T)``)."""
    for shape in shapes:
        if _too_large([shape], T, block, D, Dv, ndim) and _too_large([shape], block, T, D, Dv,
                                                                      ndim):
            return shape
    return None


def check_tiled_attention(tiled_attention: Callable[..., Tensor]) -> CheckResult:
    """Check ``tiled_attention(q, k, v, block) -> out``: softmax(q kᵀ / √D) v for q
    ``(..., T, D)``, k ``(..., S, D)``, v ``(..., S, Dv)``, read ``block`` keys at a time with
    the online softmax, all T queries at once; ``out`` ``(..., T, Dv)`` in the dtype of the
    inputs. The invariant: no query-by-key tensor the function creates (scores, their
    exponentials) holds more than ``block`` keys, so the largest is one tile ``(..., T,
    block)``; and the work (the number of PyTorch operations) grows with the number of key
    tiles, not with T. PyTorch's softmax and SDPA, and the library, may not be called.

    Args:
        tiled_attention: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(lead: tuple[int, ...], T: int, S: int, D: int, Dv: int, block: int, *,
             dtype=torch.float32, spread: float = 1.0) -> Callable[[], None]:
        q = spread * torch.randn(*lead, T, D, generator=g, dtype=dtype)
        k = torch.randn(*lead, S, D, generator=g, dtype=dtype)
        v = torch.randn(*lead, S, Dv, generator=g, dtype=dtype)
        want = _full_attention(q, k, v)
        wrongs = {key: _keys_in_tiles(q, k, v, block, mistake=key) for key in _KEY_TILE_HINTS
                  if key not in ("no_scale", "short_tile_dropped") or (
                      key == "short_tile_dropped" and S % block and S > block)}
        wrongs["no_scale"] = _keys_in_tiles(q, k, v, block, scale=1.0)
        mistakes = [(wrongs[key], hint) for key, hint in _KEY_TILE_HINTS.items()
                    if key in wrongs]
        if Dv != D:
            mistakes.append((_keys_in_tiles(q, k, v, block, scale=Dv ** -0.5),
                             say("the scale is 1/√D with D = {D}, the width of q and k, not of v "
                                 "(Dv = {Dv})", D=D, Dv=Dv)))

        def run() -> None:
            with _NewTensors() as made:
                out = _call(tiled_attention, [q, k, v, block], ["q", "k", "v", "block"])
            atol = 1e-12 if dtype == torch.float64 else 1e-5
            _compare(out, want, "out", letters=say("(..., T, Dv)"), atol=atol, rtol=atol,
                     mistakes=mistakes,
                     shape_hints={(*lead, T, D): say("out takes its width from v (Dv = {Dv}), "
                                                     "not from q (D = {D})", Dv=Dv, D=D)},
                     nan_hint=say("exp of a score overflows in float32 above about 88: subtract "
                                  "the running maximum before exponentiating, so that no exponent "
                                  "is positive"))
            shape = _wider_than_a_key_tile(made.shapes, T, block, D, Dv, q.dim())
            if shape is not None:
                raise _Failure(
                    say("created a tensor of shape {shape}, more than one tile of {block} keys "
                        "for the {T} queries", shape=shape, block=block, T=T),
                    say("compute the scores of one tile of keys at a time, q @ k_tileᵀ of shape "
                        "(..., T, block), and fold it into the running m, l and a: no scores or "
                        "weights for all S keys at once"))
        return run

    def fixed_work() -> None:
        def inputs(T: int) -> list:
            return [torch.randn(2, T, 4, generator=g), torch.randn(2, 8, 4, generator=g),
                    torch.randn(2, 8, 4, generator=g), 4]
        _fixed_work(tiled_attention, inputs(6), inputs(12), ["q", "k", "v", "block"],
                    "tile", (say("6 queries, 8 keys in tiles of 4"),
                             say("12 queries, 8 keys in tiles of 4")))

    return _run("tiled_attention", tiled_attention, [
        (say("(B, H) = (2, 3), T = 5, S = 37 in tiles of 8: the last tile holds 5 keys"),
         case((2, 3), 5, 37, 8, 8, 8)),
        (say("one query against 20 keys in tiles of 6"), case((3,), 1, 20, 16, 16, 6)),
        (say("values of another width: D = 12, Dv = 5, 30 keys in tiles of 8"),
         case((2,), 7, 30, 12, 5, 8)),
        (say("float64, T = 9, S = 40 in tiles of 16"), case((2, 2), 9, 40, 6, 3, 16,
                                                            dtype=torch.float64)),
        (say("a tile larger than the sequence: 6 keys in tiles of 16"), case((1,), 4, 6, 8, 8, 16)),
        (say("q scaled by 30, scores over 100: nothing may overflow"),
         case((2,), 6, 48, 8, 4, 16, spread=30.0)),
        (say("all the queries at once: the work does not grow with T"), fixed_work),
    ], rules=RULES["tiled_attention"])
