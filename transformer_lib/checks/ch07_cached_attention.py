"""Checkers for the core of chapter 7 (``chapters/07_kv_cache.ipynb``), written by the
learner where the chapter builds it: the write of new keys and values into a preallocated
cache, and one cached step of a grouped-query attention layer on top of it.

The references here are written out independently of the library: the write as a copy into
a clone of the cache, the attention step in float64 from the layer's weights, with the RoPE
angles and rotation computed here (split-half pairing, base 10000), the key/value heads
repeated, the scores scaled by 1/√D and masked bottom-right. Its output equals the layer's
own uncached forward pass over the whole sequence at the new positions
(``tests/test_checks_ch07.py``)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _expect_value_error,
    _Failure,
    _generator,
    _items,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "write_kv": Rules(),
    "cached_forward": Rules(allow=("apply_rope", "causal_mask"), refuse=(
        "torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention")),
}

_CACHE_AXES = ("batch", say("KV head"), "slot", "channel")

# Words of PyTorch's error when two shapes do not broadcast, and the dimensions it may name
# (looked for in its message; not messages of ours).
_SIZE_MISMATCH = " ".join(("must", "match", "the", "size", "of", "tensor"))
_DIMENSION_1, _DIMENSION_3 = " ".join(("dimension", "1")), " ".join(("dimension", "3"))


def _stale(shape: tuple[int, ...], g: torch.Generator) -> Tensor:
    """A preallocated cache whose slots hold values: earlier positions, or what an earlier
    sequence left there (a cache is reused, never cleared)."""
    return torch.randn(*shape, generator=g)


# Writing into a preallocated cache -------------------------------------------------------------


def _written(cache: Tensor, new: Tensor, position: int, *, at: int | None = None,
             to_end: bool = False) -> Tensor:
    """The cache after the write (the defaults) and the mistakes: the new positions written
    ``at`` another slot, or from ``position`` to the end (a slice with no end broadcasts one
    new position over every later slot)."""
    after = cache.clone()
    start = position if at is None else at
    if to_end:
        after[:, :, start:] = new
    else:
        after[:, :, start:start + new.shape[2]] = new
    return after


def _unchanged(after: Tensor, before: Tensor, what: str) -> None:
    if torch.equal(after, before):
        raise _Failure(say("{what} is unchanged after the call", what=what),
                       say("write into the caller's cache, in place: assign to the slots of the "
                           "new positions; a new tensor (torch.cat, a clone) leaves the cache as "
                           "it was"))


def _shares_memory(view: Tensor, cache: Tensor, what: str) -> None:
    if view.untyped_storage().data_ptr() != cache.untyped_storage().data_ptr():
        raise _Failure(say("{what} is a copy, not a view of the cache", what=what),
                       say("return slices of the cache, which share its memory: copying every "
                           "cached position at every step is the cost a preallocated cache avoids"))


def check_write_kv(write_kv: Callable[..., tuple]) -> CheckResult:
    """Check ``write_kv(k_cache, v_cache, k_new, v_new, position) -> (keys, values)``: the
    keys and values ``(B, H_kv, T, D)`` of T new positions written, in place, into slots
    ``position … position + T - 1`` of the preallocated caches ``(B, H_kv, S_max, D)``,
    nothing else changed, and the filled part returned as views ``(B, H_kv, position + T,
    D)``; a ValueError naming position, T and S_max, with nothing written, when
    ``position + T > S_max``.

    Args:
        write_kv: the function to check (the exercise's), called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["k_cache", "v_cache", "k_new", "v_new", "position"]

    def write(k_cache: Tensor, v_cache: Tensor, position: int, T: int) -> None:
        """One call on the caches, every check of what it did."""
        B, H_kv, S_max, D = k_cache.shape
        k_new = torch.randn(B, H_kv, T, D, generator=g)
        v_new = torch.randn(B, H_kv, T, D, generator=g)
        k_before, v_before = k_cache.clone(), v_cache.clone()
        got = _call(write_kv, [k_cache, v_cache, k_new, v_new, position], names,
                    in_place=("k_cache", "v_cache"))
        keys, values = _items(got, 2, say("the pair (keys, values)"))
        end = position + T
        shapes = {}
        for size, hint in (
                (S_max, say("return only the filled part, slots 0 … position + T - 1, not the "
                            "whole preallocated cache")),
                (T, say("return every cached position, the earlier ones and the new ones: slots "
                        "0 … position + T - 1")),
                (end + 1, say("one slot too many: position is the number of positions already "
                              "cached, so the new ones take slots position … position + T - 1")),
                (position, say("the filled part ends after the new positions: position + T "
                               "slots"))):
            if size != end:
                shapes.setdefault((B, H_kv, size, D), hint)
        for got_part, before, new, cache, what in ((keys, k_before, k_new, k_cache, "k"),
                                                   (values, v_before, v_new, v_cache, "v")):
            want = _written(before, new, position)
            slot_hint = say("the new positions went to the wrong slots: position is the number "
                            "of positions already cached, the first free slot, so the T new "
                            "ones take slots position … position + T - 1")
            wrong = []
            if end + 1 <= S_max:
                wrong.append((_written(before, new, position, at=position + 1), slot_hint))
            if position > 0:
                wrong.append((_written(before, new, position, at=position - 1), slot_hint))
            _compare(got_part, want[:, :, :end], "keys" if what == "k" else "values",
                     letters=say("(B, H_kv, position + T, D)"), axes=_CACHE_AXES, atol=0.0,
                     rtol=0.0, mistakes=[(w[:, :, :end], h) for w, h in wrong],
                     shape_hints=shapes)
            _unchanged(cache, before, what + "_cache")
            if T == 1 and end < S_max:
                wrong.append((_written(before, new, position, to_end=True),
                              say("the slots after the new positions changed: write exactly the T "
                                  "slots position … position + T - 1 (a slice with no end fills "
                                  "every later slot with the one new position)")))
            _compare(cache, want, say("{what}_cache after the call", what=what),
                     letters=say("(B, H_kv, S_max, D)"), axes=_CACHE_AXES, atol=0.0, rtol=0.0,
                     mistakes=wrong)
            _shares_memory(got_part, cache, "keys" if what == "k" else "values")

    def case(B: int, H_kv: int, S_max: int, D: int, writes: list[tuple[int, int]]
             ) -> Callable[[], None]:
        def run() -> None:
            k_cache = _stale((B, H_kv, S_max, D), g)
            v_cache = _stale((B, H_kv, S_max, D), g)
            for position, T in writes:
                try:
                    write(k_cache, v_cache, position, T)
                except _Failure as exc:  # the student's ValueError, for a write that fits?
                    if exc.hint is None and type(exc.__context__) is ValueError and (
                            position + T == S_max):
                        raise _Failure(exc.message, say("the last slot still fits: position + T "
                                                        "may equal S_max; raise only when it is "
                                                        "larger")) from None
                    raise
        return run

    def overflow(B: int, H_kv: int, S_max: int, D: int, position: int, T: int
                 ) -> Callable[[], None]:
        def run() -> None:
            k_cache = _stale((B, H_kv, S_max, D), g)
            v_cache = _stale((B, H_kv, S_max, D), g)
            k_before, v_before = k_cache.clone(), v_cache.clone()
            k_new = torch.randn(B, H_kv, T, D, generator=g)
            v_new = torch.randn(B, H_kv, T, D, generator=g)
            _expect_value_error(write_kv, [k_cache, v_cache, k_new, v_new, position],
                                say("{position} cached + {T} new positions do not fit in "
                                    "{S_max} slots", position=position, T=T, S_max=S_max),
                                [str(position), str(T), str(S_max)])
            if not (torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)):
                raise _Failure(say("the cache changed, although the new positions do not fit"),
                               say("check the room first, and raise before writing anything"))
        return run

    return _run("write_kv", write_kv, [
        (say("a prefill: 3 new positions at position 0 of 8 slots, (B, H_kv, D) = (2, 2, 4)"),
         case(2, 2, 8, 4, [(0, 3)])),
        (say("a decode step: 1 new position at position 5 of 8"), case(2, 2, 8, 4, [(5, 1)])),
        (say("a prefill of 4, then 7 decode steps into one cache, up to its last slot (11 "
             "slots, B = 3, H_kv = 1)"),
         case(3, 1, 11, 6, [(0, 4)] + [(p, 1) for p in range(4, 11)])),
        (say("a chunk of 3 that ends in the last slot: position 5 of 8"),
         case(1, 3, 8, 4, [(5, 3)])),
        (say("4 new positions at position 9 of 11 slots: a ValueError, nothing written"),
         overflow(2, 2, 11, 4, 9, 4)),
    ], rules=RULES["write_kv"])


# One cached step of a grouped-query attention layer -------------------------------------------


def _linear(layer: torch.nn.Linear, x: Tensor) -> Tensor:
    """``layer`` applied in float64."""
    out = x @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def _angles(first: int, T: int, D: int) -> tuple[Tensor, Tensor]:
    """cos and sin ``(T, D/2)`` of the RoPE angles of positions ``first … first + T - 1``,
    float64, base 10000."""
    inv_freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = torch.arange(first, first + T, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos(), angles.sin()


def _turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Split-half RoPE: channel i turns with channel i + D/2."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _heads(attn: MultiHeadAttention, layer: torch.nn.Linear, x: Tensor, n: int) -> Tensor:
    """The projection of ``x`` ``(B, T, C)`` split into ``n`` heads: ``(B, n, T, D)``."""
    B, T, _ = x.shape
    return _linear(layer, x.double()).view(B, T, n, attn.head_dim).transpose(1, 2)


def _keys_of(attn: MultiHeadAttention, x: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """The keys (turned) and values ``(B, H_kv, T, D)`` of positions ``first …``, float64."""
    cos, sin = _angles(first, x.shape[1], attn.head_dim)
    return (_turn(_heads(attn, attn.k_proj, x, attn.n_kv_heads), cos, sin),
            _heads(attn, attn.v_proj, x, attn.n_kv_heads))


def _cached_step(attn: MultiHeadAttention, x: Tensor, k_before: Tensor, v_before: Tensor,
                 position: int, *, rope_at: str = "position", at: int | None = None,
                 store: str = "turned", heads: str = "interleaved", mask: str = "causal",
                 scale: str = "head", span: str = "prefix") -> tuple[Tensor, Tensor, Tensor]:
    """The reference (the defaults), in float64, and the mistakes (the other arguments):
    ``(out, k_cache after, v_cache after)``."""
    B, T, C = x.shape
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    cos, sin = _angles(position if rope_at == "position" else 0, T, D)
    q = _turn(_heads(attn, attn.q_proj, x, H), cos, sin)  # (B, H, T, D)
    raw = _heads(attn, attn.k_proj, x, H_kv)  # (B, H_kv, T, D)
    k = _turn(raw, cos, sin) if store == "turned" else raw
    v = _heads(attn, attn.v_proj, x, H_kv)
    keys, values = k_before.double().clone(), v_before.double().clone()
    slot = position if at is None else at
    keys[:, :, slot:slot + T], values[:, :, slot:slot + T] = k, v
    S = slot + T if span == "prefix" else keys.shape[2]
    K, V = keys[:, :, :S], values[:, :, :S]  # (B, H_kv, S, D)
    rep = H // H_kv
    if heads == "interleaved":  # query head h reads key/value head h // rep
        K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
    else:  # the whole set of heads over again: kv0, kv1, kv0, kv1
        K, V = K.repeat(1, rep, 1, 1), V.repeat(1, rep, 1, 1)
    factor = {"head": D ** -0.5, "none": 1.0, "model": C ** -0.5}[scale]
    scores = q @ K.transpose(-2, -1) * factor  # (B, H, T, S)
    i, j = torch.arange(T)[:, None], torch.arange(S)[None, :]
    visible = {"causal": j <= i + (S - T), "top-left": j <= i,
               "none": torch.ones(T, S, dtype=torch.bool)}[mask]  # (T, S)
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = (scores - scores.amax(-1, keepdim=True)).exp()
    weights = weights / weights.sum(-1, keepdim=True)  # (B, H, T, S)
    out = (weights @ V).transpose(1, 2).reshape(B, T, C)  # (B, T, H * D)
    out = _linear(attn.o_proj, out)  # (B, T, C)
    return out.to(x.dtype), keys.to(k_before.dtype), values.to(v_before.dtype)


def _step_mistakes(H: int, H_kv: int, D: int, C: int, T: int, position: int,
                   S_max: int) -> list[tuple[dict, str]]:
    """The usual mistakes that differ from the reference on this case, with their hints."""
    slot = say("the new keys and values went to the wrong slots: the token at position p "
               "belongs in slot p, so the T new ones in slots position … position + T - 1")
    found = [
        (dict(rope_at="zero"), say("the new tokens were turned as if they stood at position 0: "
                                   "RoPE turns the token at position p by row p of the tables, so "
                                   "the new ones by rows position … position + T - 1")),
        (dict(store="raw"), say("the cache holds the keys without RoPE: it stores each key turned "
                                "at its own position, so turn the new keys before writing them")),
        (dict(mask="top-left"), say("the mask hides the cached prefix: the query at position "
                                    "position + i sees keys 0 … position + i, so the mask (T, S) "
                                    "has position extra visible columns on the left, not the "
                                    "lower triangle of a (T, S) block")),
        (dict(scale="none"), say("divide the scores by √D = √{D}, the width of a head, before "
                                 "the softmax", D=D)),
        (dict(scale="model"), say("the scale is 1/√D with D = {D}, the width of a head, not the "
                                  "model width C = {C}", D=D, C=C)),
        (dict(span="all"), say("the attention read every slot of the cache: the slots after "
                               "position + T - 1 hold stale keys and values of no token; attend "
                               "over the filled part only, slots 0 … position + T - 1")),
    ]
    if T > 1:
        found.append((dict(mask="none"), say("without a mask each new token also sees the new "
                                             "tokens after it: within the chunk the mask is still "
                                             "causal")))
    if 1 < H_kv < H:  # with one key/value head both orders are the same
        found.append((dict(heads="tiled"), say("the key/value heads were repeated in the wrong "
                                               "order: query head h reads key/value head "
                                               "h // (H / H_kv), so each head is repeated H / H_kv "
                                               "times in place (kv0, kv0, kv1, kv1), not the whole "
                                               "set over again (kv0, kv1, kv0, kv1)")))
    if position + 1 + T <= S_max:
        found.append((dict(at=position + 1), slot))
    if position > 0:
        found.append((dict(at=position - 1), slot))
    return found


def check_cached_forward(cached_forward: Callable[..., Tensor]) -> CheckResult:
    """Check ``cached_forward(attn, x, k_cache, v_cache, position, cos, sin) -> out``: one
    cached step of the grouped-query attention layer ``attn`` (a
    :class:`~transformer_lib.attention.MultiHeadAttention`, split-half RoPE) on T new tokens
    ``x`` ``(B, T, C)`` at positions ``position … position + T - 1``, given preallocated
    caches ``(B, H_kv, S_max, D)`` whose slots ``0 … position - 1`` hold the turned keys and
    the values of the earlier positions, and RoPE tables ``(S_max, D/2)``. ``out``
    ``(B, T, C)`` must equal the layer's uncached forward pass over the whole sequence at the
    new positions, and the new keys (turned) and values must be written into slots
    ``position … position + T - 1`` of the caches, in place, nothing else changed.

    Args:
        cached_forward: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()
    names = ["attn", "x", "k_cache", "v_cache", "position", "cos", "sin"]

    def one_call(attn: MultiHeadAttention, x: Tensor, k_cache: Tensor, v_cache: Tensor,
                 position: int, cos: Tensor, sin: Tensor) -> None:
        B, T, C = x.shape
        H, H_kv, D, S_max = attn.n_heads, attn.n_kv_heads, attn.head_dim, k_cache.shape[2]
        k_before, v_before = k_cache.clone(), v_cache.clone()
        with torch.no_grad():
            got = _call(cached_forward, [attn, x, k_cache, v_cache, position, cos, sin], names,
                        in_place=("k_cache", "v_cache"))
            want = _cached_step(attn, x, k_before, v_before, position)
            wrongs = [(_cached_step(attn, x, k_before, v_before, position, **kw), hint)
                      for kw, hint in _step_mistakes(H, H_kv, D, C, T, position, S_max)]
        problems = []  # the caches, then out: the first problem is reported, with the hint
        # of out's if it has one (a key turned at position 0 and a key not turned at all are
        # the same key, but not the same output), else the caches'
        for index, cache, before, what in ((1, k_cache, k_before, "k_cache"),
                                           (2, v_cache, v_before, "v_cache")):
            _unchanged(cache, before, what)
            try:
                _compare(cache, want[index], say("{what} after the call", what=what),
                         letters=say("(B, H_kv, S_max, D)"), axes=_CACHE_AXES,
                         mistakes=[(w[index], hint) for w, hint in wrongs])
            except _Failure as exc:
                problems.append(exc)
        try:
            _compare(got, want[0], "out", letters=say("(B, T, C)"),
                     axes=("batch", say("new token"), "channel"),
                     mistakes=[(w[0], hint) for w, hint in wrongs])
        except _Failure as exc:
            problems.append(exc)
        if problems:
            hint = problems[-1].hint or next((p.hint for p in problems if p.hint), None)
            raise _Failure(problems[0].message, hint)

    def with_hints(run: Callable[[], None], H: int, H_kv: int) -> Callable[[], None]:
        def checked() -> None:
            try:
                run()
            except _Failure as exc:  # shapes that do not broadcast: say which ones
                message = exc.message
                if _SIZE_MISMATCH not in message:
                    raise
                if (_DIMENSION_1 in message and "(" + str(H) + ")" in message
                        and "(" + str(H_kv) + ")" in message):
                    raise _Failure(message, say("the {H} query heads read {H_kv} key/value heads: "
                                                "repeat each key/value head H / H_kv times before "
                                                "the products, so that query head h reads "
                                                "key/value head h // (H / H_kv)",
                                                H=H, H_kv=H_kv)) from None
                if _DIMENSION_3 in message:
                    raise _Failure(message, say("a square (T, T) mask leaves out the cached keys: "
                                                "the scores are (T, position + T)")) from None
                raise
        return checked

    def layer(H: int, H_kv: int, D: int, bias: bool) -> MultiHeadAttention:
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=g)))
            attn = MultiHeadAttention(H * D, H, H_kv, bias=bias).eval()
        with torch.no_grad():
            for p in attn.parameters():
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
        return attn

    def case(B: int, H: int, H_kv: int, D: int, S_max: int, steps: list[tuple[int, int]],
             bias: bool = False) -> Callable[[], None]:
        """Positions 0 … first - 1 cached by the checker, then the student's steps of T tokens
        each (a prefill, a chunk or single tokens), one after the other into the same cache."""
        def run() -> None:
            attn = layer(H, H_kv, D, bias)
            total = sum(T for _, T in steps) + steps[0][0]
            history = torch.randn(B, total, H * D, generator=g)  # every position's input
            k_cache = _stale((B, H_kv, S_max, D), g)  # stale slots: an earlier sequence's
            v_cache = _stale((B, H_kv, S_max, D), g)
            first = steps[0][0]
            with torch.no_grad():  # the caches as the layer left them after positions 0 … first - 1
                k_old, v_old = _keys_of(attn, history[:, :first], 0)
                k_cache[:, :, :first], v_cache[:, :, :first] = k_old.float(), v_old.float()
            cos, sin = (t.float() for t in _angles(0, S_max, D))  # (S_max, D/2) each
            for position, T in steps:
                one_call(attn, history[:, position:position + T], k_cache, v_cache, position,
                         cos, sin)
        return with_hints(run, H, H_kv)

    return _run("cached_forward", cached_forward, [
        (say("a decode step: one token after 5 cached, 4 query heads share 2 KV heads, B = 2"),
         case(2, 4, 2, 4, 8, [(5, 1)])),
        (say("a chunk of 3 after 4 cached, 6 query heads share 2 KV heads, bias"),
         case(1, 6, 2, 4, 9, [(4, 3)], bias=True)),
        (say("a prompt of 4 into an empty cache (the prefill), 2 heads (MHA)"),
         case(2, 2, 2, 8, 6, [(0, 4)])),
        (say("a prefill of 3, then 4 decode steps, the last into the last of 7 slots; 3 query "
             "heads share 1 KV head (MQA)"), case(2, 3, 1, 4, 7, [(0, 3), (3, 1), (4, 1), (5, 1),
                                                            (6, 1)])),
    ], rules=RULES["cached_forward"])
